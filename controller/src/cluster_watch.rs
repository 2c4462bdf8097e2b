//! The EtcdCluster watch the controllers run on: a reflector whose store keeps a projection of
//! each object, not the whole object.
//!
//! `metadata.managedFields` (server-side apply's bookkeeping, a tree of field paths per
//! manager) is most of an EtcdCluster's memory once decoded, and no controller reads it; with
//! it, the member controller's and the backup controller's stores held about 20 KiB per
//! cluster (docs/performance.md). Nothing writes an EtcdCluster back from a store (status is
//! patched, finalizers through JSON patches), so the projection never reaches the API.
//!
//! The member controller and the scheduled-backup controller run on one [`shared`] watch and
//! store, not one each: every EtcdCluster is held once.

use etcd_operator_api::v1alpha2::EtcdCluster;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::{WatchStreamExt, reflector, watcher};

/// A `Controller` over every EtcdCluster `api` reaches, as `Controller::new` builds it, with
/// the store's objects projected by [`project`].
pub fn controller(api: Api<EtcdCluster>) -> Controller<EtcdCluster> {
    let (reader, writer) = reflector::store();
    let clusters = reflector::reflector(writer, watcher(api, watcher::Config::default()).modify(project))
        .applied_objects();
    Controller::for_stream(clusters, reader)
}

/// How many events the shared watch holds for a controller that has not taken them yet (past
/// that, the watch waits for it).
const SHARED_BUFFER: usize = 1024;

/// Controllers that share one watch and one store of the EtcdClusters.
pub struct SharedClusters {
    /// A controller for the member reconciler.
    pub members: Controller<EtcdCluster>,
    /// A controller for the scheduled backups.
    pub backups: Controller<EtcdCluster>,
    /// The watch itself: the controllers see nothing unless this runs (until they stop).
    pub watch: std::pin::Pin<Box<dyn futures::Future<Output = ()> + Send>>,
}

impl std::fmt::Debug for SharedClusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedClusters").finish_non_exhaustive()
    }
}

/// One watch of every EtcdCluster `api` reaches, with its store projected by [`project`], and
/// the two controllers that run on it. Both subscribe before the watch starts, so neither misses
/// an object.
pub fn shared(api: Api<EtcdCluster>) -> SharedClusters {
    use futures::StreamExt as _;
    let (reader, writer) = reflector::store_shared(SHARED_BUFFER);
    let subscribe = || {
        writer
            .subscribe()
            .map(|events| Controller::for_shared_stream(events, reader.clone()))
    };
    // A writer made by `store_shared` always has subscribers to give; were it not so, each
    // controller would watch on its own (as before the watch was shared).
    let (Some(members), Some(backups)) = (subscribe(), subscribe()) else {
        return SharedClusters {
            members: controller(api.clone()),
            backups: controller(api),
            watch: Box::pin(std::future::ready(())),
        };
    };
    let watch = watcher(api, watcher::Config::default())
        .modify(project)
        .reflect_shared(writer)
        .for_each(|_| std::future::ready(()));
    SharedClusters {
        members,
        backups,
        watch: Box::pin(watch),
    }
}

/// What the stores keep of an EtcdCluster: everything but `managedFields`.
pub fn project(cluster: &mut EtcdCluster) {
    cluster.metadata.managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    #[test]
    fn the_projection_drops_managed_fields_and_keeps_the_rest() {
        let mut cluster: EtcdCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "etcd.operator.dev/v1alpha2",
            "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "ns", "annotations": {"x": "y"},
                         "finalizers": ["etcd.operator.dev/cleanup"]},
            "spec": {"replicas": 3},
        }))
        .unwrap();
        cluster.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {"f:replicas": {}}}))),
            ..ManagedFieldsEntry::default()
        }]);
        let mut projected = cluster.clone();
        project(&mut projected);
        assert_eq!(projected.metadata.managed_fields, None);
        cluster.metadata.managed_fields = None;
        assert_eq!(projected, cluster);
    }
}
