//! What the API server sets on new EtcdClusters for the controller of this deployment, in the
//! namespaces it manages: the controller's cleanup finalizer and the status its first reconcile
//! computes for a cluster nothing runs for yet (`etcd_operator_controller::status::initial`). The
//! binary joins the two crates here; the API server knows neither the controller nor its status.

use std::sync::Arc;

use etcd_operator_apiserver::registry::controller_init::{ControllerInit, InitialStatus};
use serde_json::Value;

use crate::flags::ControllerArgs;

/// The controller's first status, from the stored form of a new EtcdCluster.
#[derive(Debug, Clone)]
pub struct FirstStatus {
    thresholds: etcd_operator_controller::plan::Thresholds,
}

impl InitialStatus for FirstStatus {
    fn initial_status(&self, stored: &Value) -> Option<Value> {
        // The stored form is the v1alpha2 hub the controller reads (deserialized from the value
        // in place, not from a copy of it); one that does not read as it gets no status here,
        // and the controller says what is wrong when it looks.
        let cluster = match <etcd_operator_api::v1alpha2::EtcdCluster as serde::Deserialize>::deserialize(
            stored,
        ) {
            Ok(cluster) => cluster,
            Err(error) => {
                tracing::debug!(%error, "a new EtcdCluster does not read as the controller's type; no initial status");
                return None;
            }
        };
        let status = etcd_operator_controller::status::initial(&cluster, &self.thresholds)?;
        serde_json::to_value(status).ok()
    }
}

/// What new EtcdClusters get for a controller with `settings`.
pub fn for_controller(settings: &ControllerArgs) -> Arc<[ControllerInit]> {
    Arc::new([
        ControllerInit::cluster_cleanup(settings.namespaces()).with_initial_status(Arc::new(FirstStatus {
            thresholds: settings.thresholds(),
        })),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_apiserver::registry::kind::Kind;
    use serde_json::json;

    fn stored(spec: Value) -> Value {
        let mut obj: etcd_operator_api::v1alpha2::EtcdCluster = serde_json::from_value(json!({
            "apiVersion": "etcd.operator.dev/v1alpha2",
            "kind": "EtcdCluster",
            "metadata": {"name": "fresh", "namespace": "team-a", "uid": "u-1", "generation": 1},
            "spec": spec,
            "status": {"observedGeneration": 0},
        }))
        .unwrap();
        etcd_operator_api::defaults::apply_v1alpha2(&mut obj);
        serde_json::to_value(obj).unwrap()
    }

    #[test]
    fn a_new_cluster_gets_the_finalizer_and_the_controllers_first_status_where_it_is_managed() {
        let settings = ControllerArgs {
            watch_namespaces: vec!["team-a".into()],
            ..ControllerArgs::default()
        };
        let inits = for_controller(&settings);
        assert_eq!(inits.len(), 1);
        assert_eq!(inits[0].finalizer(), etcd_operator_api::CLEANUP_FINALIZER);
        assert!(inits[0].sets_status());
        let mut obj = stored(json!({"replicas": 3, "version": "3.5.1", "paused": true}));
        etcd_operator_apiserver::registry::controller_init::prepare_create(
            &inits,
            Kind::CLUSTER,
            "team-a",
            &mut obj,
        );
        assert_eq!(obj["status"]["phase"], "Paused", "{obj:#}");
        assert_eq!(obj["status"]["observedGeneration"], 1);
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!([etcd_operator_api::CLEANUP_FINALIZER])
        );
        // Elsewhere: nothing.
        let mut obj = stored(json!({"replicas": 3}));
        etcd_operator_apiserver::registry::controller_init::prepare_create(
            &inits,
            Kind::CLUSTER,
            "team-b",
            &mut obj,
        );
        assert_eq!(obj["status"], json!({"observedGeneration": 0}));
    }

    #[test]
    fn an_object_the_controller_cannot_read_keeps_the_strategys_status() {
        let first = FirstStatus {
            thresholds: etcd_operator_controller::plan::Thresholds::default(),
        };
        assert_eq!(
            first.initial_status(&json!({"spec": {"replicas": "three"}})),
            None
        );
        // A restore is resolved by the controller before it says anything.
        let restore = stored(json!({"replicas": 1, "bootstrap": {"restore": {"backupName": "b"}}}));
        assert_eq!(first.initial_status(&restore), None);
    }
}
