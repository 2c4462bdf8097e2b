//! The PodDisruptionBudget that keeps quorum: voluntary disruptions (drains, evictions) may take
//! down a member only while a quorum of members stays ready.
//!
//! It uses an integer `minAvailable` equal to the quorum, not `maxUnavailable`: with an integer
//! `minAvailable` the disruption controller counts the Pods it selects, while `maxUnavailable` (or
//! a percentage) makes it look up the expected count through the `/scale` subresource of the
//! Pods' controller (the EtcdCluster, served by the aggregated API); if that lookup fails it
//! blocks every eviction. A stale integer `minAvailable` errs on the safe side: it can only block
//! evictions, never allow one that costs quorum, as long as it is the quorum of at least as many
//! members as exist.

use etcd_operator_api::naming;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{cluster_labels, owner_reference, quorum, selector_labels};
use crate::model::ClusterRef;

/// `minAvailable` for a cluster of `members` members: their quorum (at least 1).
pub fn pdb_min_available(members: usize) -> i32 {
    i32::try_from(quorum(members.max(1))).unwrap_or(i32::MAX)
}

/// PodDisruptionBudget `<cluster>` over the member Pods, keeping the quorum of `members` members
/// available (pass the larger of the desired and the existing member count).
pub fn build_pdb(cluster: &ClusterRef, members: usize) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(naming::pdb_name(&cluster.name)),
            namespace: Some(cluster.namespace.clone()),
            labels: Some(cluster_labels(cluster)),
            owner_references: Some(vec![owner_reference(cluster)]),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(pdb_min_available(members))),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(cluster)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_available_is_the_quorum() {
        let expected = [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 3),
            (5, 3),
            (6, 4),
            (7, 4),
            (9, 5),
        ];
        for (members, min) in expected {
            assert_eq!(pdb_min_available(members), min, "{members} members");
        }
    }
}
