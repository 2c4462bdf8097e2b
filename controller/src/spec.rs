//! The one view of an EtcdCluster's spec the controller reads, with the defaults applied once
//! (replicas, version, paused, storage), so the planner, the builders of the runtimes and the
//! status agree on what was asked. Objects reach the controller validated by the API server;
//! this only fills in what the user left out. Pure.

use etcd_operator_api::v1alpha2::{DEFAULT_REPLICAS, EtcdCluster, StorageSpec};
use etcd_operator_api::versions::DEFAULT_ETCD_VERSION;

/// An EtcdCluster as the controller sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpecView {
    /// The EtcdCluster in the hub version, as stored.
    pub cluster: EtcdCluster,
    /// Voting members wanted (`spec.replicas`, at least 1).
    pub replicas: usize,
    /// The etcd version members run (`spec.version`).
    pub version: String,
    /// `spec.paused`.
    pub paused: bool,
    /// `spec.storage` with its defaults (medium, size).
    pub storage: StorageSpec,
}

impl ClusterSpecView {
    /// The view of `cluster`.
    pub fn new(cluster: EtcdCluster) -> Self {
        let spec = &cluster.spec;
        let replicas = usize::try_from(spec.replicas.unwrap_or(DEFAULT_REPLICAS))
            .unwrap_or(1)
            .max(1);
        let version = spec
            .version
            .clone()
            .unwrap_or_else(|| DEFAULT_ETCD_VERSION.to_string());
        let paused = spec.paused.unwrap_or(false);
        let storage = etcd_operator_api::defaults::effective_storage(spec);
        Self {
            cluster,
            replicas,
            version,
            paused,
            storage,
        }
    }
}

impl From<EtcdCluster> for ClusterSpecView {
    fn from(cluster: EtcdCluster) -> Self {
        Self::new(cluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_api::v1alpha2::StorageMedium;

    #[test]
    fn what_the_user_left_out_is_defaulted_once() {
        let view = ClusterSpecView::new(EtcdCluster::default());
        assert_eq!(view.replicas, usize::try_from(DEFAULT_REPLICAS).unwrap());
        assert_eq!(view.version, DEFAULT_ETCD_VERSION);
        assert!(!view.paused);
        assert_eq!(view.storage.medium, Some(StorageMedium::Disk));

        let mut c = EtcdCluster::default();
        c.spec.replicas = Some(5);
        c.spec.version = Some("3.4.23".into());
        c.spec.paused = Some(true);
        let view = ClusterSpecView::new(c);
        assert_eq!(
            (view.replicas, view.version.as_str(), view.paused),
            (5, "3.4.23", true)
        );
        // Never below one member, whatever reaches the controller.
        let mut zero = EtcdCluster::default();
        zero.spec.replicas = Some(0);
        assert_eq!(ClusterSpecView::new(zero).replicas, 1);
    }
}
