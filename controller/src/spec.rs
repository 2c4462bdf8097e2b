//! The one view of an EtcdCluster's spec the controller reads, with the defaults applied once
//! (replicas, version, paused, storage), so the planner, the builders of the runtimes and the
//! status agree on what was asked. Objects reach the controller validated by the API server;
//! this only fills in what the user left out. Pure.

use etcd_operator_api::v1alpha2::{
    DEFAULT_REPLICAS, EtcdCluster, RECOVER_QUORUM_ANNOTATION, REPLACE_MEMBER_ANNOTATION,
    ROTATE_CERTIFICATES_ANNOTATION, StorageSpec,
};
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
    /// The value of the [`ROTATE_CERTIFICATES_ANNOTATION`]: the on-demand rotation member
    /// certificates must have been issued under (`None`: none asked for).
    pub certificate_rotation: Option<String>,
    /// The value of the [`RECOVER_QUORUM_ANNOTATION`]: a quorum recovery asked for.
    pub recover_quorum: Option<String>,
    /// `spec.replacement` with its defaults.
    pub replacement: etcd_operator_api::defaults::EffectiveReplacement,
    /// The value of the [`REPLACE_MEMBER_ANNOTATION`]: the member to replace now.
    pub replace_member: Option<String>,
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
        let certificate_rotation = cluster
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ROTATE_CERTIFICATES_ANNOTATION))
            .filter(|v| !v.is_empty())
            .cloned();
        let annotation = |key: &str| {
            cluster
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let recover_quorum = annotation(RECOVER_QUORUM_ANNOTATION);
        let replace_member = annotation(REPLACE_MEMBER_ANNOTATION);
        let replacement = etcd_operator_api::defaults::effective_replacement(spec);
        Self {
            cluster,
            replicas,
            version,
            paused,
            storage,
            certificate_rotation,
            recover_quorum,
            replacement,
            replace_member,
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

    #[test]
    fn the_rotation_annotation_is_read_and_an_empty_one_asks_for_nothing() {
        assert_eq!(
            ClusterSpecView::new(EtcdCluster::default()).certificate_rotation,
            None
        );
        let mut c = EtcdCluster::default();
        c.metadata.annotations =
            Some([(ROTATE_CERTIFICATES_ANNOTATION.to_owned(), "2026-11-25".to_owned())].into());
        assert_eq!(
            ClusterSpecView::new(c.clone()).certificate_rotation.as_deref(),
            Some("2026-11-25")
        );
        c.metadata.annotations = Some([(ROTATE_CERTIFICATES_ANNOTATION.to_owned(), String::new())].into());
        assert_eq!(ClusterSpecView::new(c).certificate_rotation, None);
    }

    #[test]
    fn the_replacement_policy_and_the_replace_member_annotation_are_read() {
        let view = ClusterSpecView::new(EtcdCluster::default());
        assert!(!view.replacement.manual);
        assert_eq!(view.replace_member, None);
        let mut c = EtcdCluster::default();
        c.spec.replacement = Some(etcd_operator_api::v1alpha2::ReplacementSpec {
            policy: Some(etcd_operator_api::v1alpha2::ReplacementPolicy::Manual),
            unhealthy_after: Some("30s".into()),
            crash_loop_after: None,
        });
        c.metadata.annotations =
            Some([(REPLACE_MEMBER_ANNOTATION.to_owned(), " c-abcde ".to_owned())].into());
        let view = ClusterSpecView::new(c);
        assert!(view.replacement.manual);
        assert_eq!(view.replacement.unhealthy_after.as_secs(), 30);
        assert_eq!(view.replacement.crash_loop_after.as_secs(), 300);
        assert_eq!(view.replace_member.as_deref(), Some("c-abcde"));
    }
}
