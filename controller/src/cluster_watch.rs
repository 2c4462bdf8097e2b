//! The EtcdCluster watch the controllers run on: a reflector whose store keeps a projection of
//! each object, not the whole object.
//!
//! `metadata.managedFields` (server-side apply's bookkeeping, a tree of field paths per
//! manager) is most of an EtcdCluster's memory once decoded, and no controller reads it; with
//! it, the member controller's and the backup controller's stores held about 20 KiB per
//! cluster (docs/performance.md). Nothing writes an EtcdCluster back from a store (status is
//! patched, finalizers through JSON patches), so the projection never reaches the API.

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
