//! Status of an EtcdCluster from what was observed and decided: members, counts, leader,
//! conditions (`Available`, `Progressing`, `Degraded`) with stable reasons, and
//! `observedGeneration`. Pure.

use etcd_operator_api::status::{
    CONDITION_AVAILABLE, CONDITION_DEGRADED, CONDITION_PROGRESSING, ClusterPhase, EtcdClusterStatus,
    MemberStatus,
};
use etcd_operator_api::v1alpha2::EtcdCluster;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::model::{is_healthy, quorum};
use crate::plan::{Observed, Step};

/// What the reconcile did, for status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The last step planned.
    pub step: Step,
    /// The error the step ran into, if any.
    pub error: Option<String>,
}

fn condition(type_: &str, status: bool, reason: &str, message: String, generation: Option<i64>) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: Time(
            jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
                .unwrap_or_else(|_| jiff::Timestamp::now()),
        ),
    }
}

fn step_reason(step: &Step) -> (&'static str, String) {
    match step {
        Step::ReserveForBootstrap { names } => ("Bootstrapping", format!("creating {} members", names.len())),
        Step::Start { members } => (
            "StartingMembers",
            format!(
                "starting {}",
                members
                    .iter()
                    .map(|m| m.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Step::ReserveForJoin { name } => ("ScalingUp", format!("adding member {name}")),
        Step::AddLearner { name, .. } => ("ScalingUp", format!("adding {name} as a learner")),
        Step::Promote { name, .. } => ("ScalingUp", format!("promoting learner {name}")),
        Step::MoveLeader { .. } => (
            "MovingLeader",
            "moving leadership before removing the leader".into(),
        ),
        Step::RemoveFromEtcd { name, reason, .. } => ("RemovingMember", format!("removing {name}: {reason}")),
        Step::DeleteRuntimeMember { name, reason } => {
            ("RemovingMember", format!("deleting {name}: {reason}"))
        }
        Step::WipeBootstrap { reason } => ("RetryingBootstrap", reason.clone()),
        Step::Wait { reason } => ("Waiting", reason.clone()),
        Step::Idle => ("Reconciled", "the cluster matches the spec".into()),
    }
}

/// The new status. `previous` keeps transition times of unchanged conditions, the cluster ID
/// when etcd did not answer, and the last backup.
pub fn compute(cluster: &EtcdCluster, observed: &Observed, outcome: &Outcome) -> EtcdClusterStatus {
    let previous = cluster.status.clone().unwrap_or_default();
    let generation = cluster.metadata.generation;
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let paused = cluster.spec.paused.unwrap_or(false);
    let mut status = EtcdClusterStatus {
        selector: Some(etcd_operator_api::naming::selector(&name)),
        last_backup: previous.last_backup.clone(),
        cluster_id: previous.cluster_id.clone(),
        ..Default::default()
    };

    let (available, available_reason, available_message);
    let mut degraded: Option<(&str, String)> = None;
    match &observed.etcd {
        Some(view) => {
            let members: Vec<MemberStatus> = view
                .members
                .iter()
                .map(|m| {
                    let runtime_name = observed
                        .runtime
                        .iter()
                        .find(|r| m.peer_urls.contains(&r.peer_url))
                        .map(|r| r.name.clone());
                    MemberStatus {
                        name: if m.name.is_empty() {
                            runtime_name.unwrap_or_default()
                        } else {
                            m.name.clone()
                        },
                        id: Some(format!("{:x}", m.id)),
                        version: m.status.as_ref().map(|s| s.version.clone()),
                        learner: Some(m.learner),
                        leader: Some(m.id == view.leader),
                        healthy: Some(is_healthy(m)),
                    }
                })
                .collect();
            let voters = view.voters().count();
            let healthy = view.healthy_voters();
            status.replicas = i32::try_from(voters).ok();
            status.ready_replicas = i32::try_from(healthy).ok();
            // Recorded only once the cluster elected a leader: from then on it holds data and a
            // failed bootstrap may no longer be wiped.
            if view.leader != 0 {
                status.cluster_id = Some(format!("{:x}", view.cluster_id));
            }
            status.leader = view
                .members
                .iter()
                .find(|m| m.id == view.leader)
                .map(|m| m.name.clone());
            status.current_version = view
                .members
                .iter()
                .filter_map(|m| m.status.as_ref().map(|s| s.version.clone()))
                .min_by(|a, b| {
                    let parse = |v: &str| {
                        v.split('.')
                            .map(|p| p.parse::<u64>().unwrap_or(0))
                            .collect::<Vec<_>>()
                    };
                    parse(a).cmp(&parse(b))
                });
            status.client_endpoints = Some(
                view.voters()
                    .filter_map(|m| m.client_urls.first().cloned())
                    .collect(),
            );
            available = healthy >= quorum(voters) && view.leader != 0;
            (available_reason, available_message) = if available {
                (
                    "QuorumHealthy",
                    format!("{healthy} of {voters} voting members are healthy"),
                )
            } else {
                (
                    "NoQuorum",
                    format!("only {healthy} of {voters} voting members are healthy"),
                )
            };
            if healthy < voters {
                let sick: Vec<String> = members
                    .iter()
                    .filter(|m| m.healthy == Some(false))
                    .map(|m| m.name.clone())
                    .collect();
                degraded = Some((
                    "MembersUnhealthy",
                    format!("unhealthy members: {}", sick.join(", ")),
                ));
            }
            status.members = Some(members);
        }
        None if previous.cluster_id.is_some() => {
            available = false;
            available_reason = "NoQuorum";
            available_message = "no member answers".to_string();
            degraded = Some((
                "NoQuorum",
                "no member answers: the cluster has lost quorum".into(),
            ));
            status.replicas = Some(0);
            status.ready_replicas = Some(0);
        }
        None => {
            available = false;
            available_reason = "Bootstrapping";
            available_message = "the cluster has not formed yet".to_string();
            status.replicas = Some(0);
            status.ready_replicas = Some(0);
        }
    }
    if let Some(error) = &outcome.error {
        degraded = Some(("StepFailed", error.clone()));
    } else if let Step::Wait { reason } = &outcome.step
        && reason.contains("quorum")
    {
        degraded = Some(("QuorumAtRisk", reason.clone()));
    }

    let (progress_reason, progress_message) = step_reason(&outcome.step);
    let progressing = !matches!(outcome.step, Step::Idle) && !paused;
    let mut conditions = vec![
        condition(
            CONDITION_AVAILABLE,
            available,
            available_reason,
            available_message,
            generation,
        ),
        condition(
            CONDITION_PROGRESSING,
            progressing,
            if paused { "Paused" } else { progress_reason },
            progress_message,
            generation,
        ),
        match &degraded {
            Some((reason, message)) => {
                condition(CONDITION_DEGRADED, true, reason, message.clone(), generation)
            }
            None => condition(
                CONDITION_DEGRADED,
                false,
                "Healthy",
                "no problems found".into(),
                generation,
            ),
        },
    ];
    // Keep the transition time of a condition whose status did not change.
    for c in &mut conditions {
        if let Some(old) = previous.conditions.iter().flatten().find(|o| o.type_ == c.type_)
            && old.status == c.status
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
    }
    status.conditions = Some(conditions);
    status.phase = Some(if paused {
        ClusterPhase::Paused
    } else if observed.etcd.is_none() && previous.cluster_id.is_none() {
        ClusterPhase::Creating
    } else if !available && previous.cluster_id.is_some() && observed.etcd.is_none() {
        ClusterPhase::Failed
    } else if progressing {
        ClusterPhase::Scaling
    } else {
        ClusterPhase::Running
    });
    // Written last: the status above describes this generation.
    status.observed_generation = generation;
    status
}

/// Whether two statuses differ in anything but condition timestamps.
pub fn differs(a: &EtcdClusterStatus, b: &EtcdClusterStatus) -> bool {
    let strip = |s: &EtcdClusterStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) != strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EtcdMember, EtcdView, MemberHealth};
    use crate::plan::Timing;

    fn member(id: u64, name: &str, healthy: bool) -> EtcdMember {
        EtcdMember {
            id,
            name: name.into(),
            peer_urls: vec![format!("http://{name}:2380")],
            client_urls: vec![format!("http://{name}:2379")],
            learner: false,
            status: healthy.then(|| MemberHealth {
                version: "3.5.1".into(),
                raft_applied_index: 1,
                leader: 1,
                errors: vec![],
            }),
        }
    }

    fn cluster() -> EtcdCluster {
        let mut c = EtcdCluster::default();
        c.metadata.name = Some("demo".into());
        c.metadata.generation = Some(4);
        c
    }

    fn get<'a>(s: &'a EtcdClusterStatus, t: &str) -> &'a Condition {
        s.conditions
            .as_ref()
            .and_then(|cs| cs.iter().find(|c| c.type_ == t))
            .unwrap()
    }

    #[test]
    fn healthy_cluster_is_available_and_settled() {
        let observed = Observed {
            runtime: vec![],
            etcd: Some(EtcdView {
                cluster_id: 0xabc,
                members: vec![member(1, "a", true), member(2, "b", true), member(3, "c", true)],
                leader: 1,
            }),
            timing: Timing::default(),
        };
        let s = compute(
            &cluster(),
            &observed,
            &Outcome {
                step: Step::Idle,
                error: None,
            },
        );
        assert_eq!(get(&s, "Available").status, "True");
        assert_eq!(get(&s, "Progressing").status, "False");
        assert_eq!(get(&s, "Degraded").status, "False");
        assert_eq!(s.ready_replicas, Some(3));
        assert_eq!(s.leader.as_deref(), Some("a"));
        assert_eq!(s.cluster_id.as_deref(), Some("abc"));
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(s.client_endpoints.as_ref().map(Vec::len), Some(3));
        assert_eq!(s.phase, Some(ClusterPhase::Running));
    }

    #[test]
    fn lost_quorum_is_degraded_and_unavailable() {
        let observed = Observed {
            runtime: vec![],
            etcd: Some(EtcdView {
                cluster_id: 1,
                members: vec![member(1, "a", true), member(2, "b", false), member(3, "c", false)],
                leader: 1,
            }),
            timing: Timing::default(),
        };
        let s = compute(
            &cluster(),
            &observed,
            &Outcome {
                step: Step::Wait {
                    reason: "replacing it would cost quorum".into(),
                },
                error: None,
            },
        );
        assert_eq!(get(&s, "Available").status, "False");
        assert_eq!(get(&s, "Degraded").status, "True");
        assert_eq!(get(&s, "Degraded").reason, "QuorumAtRisk");
        let failed = compute(
            &cluster(),
            &observed,
            &Outcome {
                step: Step::Idle,
                error: Some("member remove: boom".into()),
            },
        );
        assert_eq!(get(&failed, "Degraded").reason, "StepFailed");
    }

    #[test]
    fn transition_times_survive_unchanged_conditions() {
        let observed = Observed {
            runtime: vec![],
            etcd: None,
            timing: Timing::default(),
        };
        let mut c = cluster();
        let first = compute(
            &c,
            &observed,
            &Outcome {
                step: Step::Idle,
                error: None,
            },
        );
        let mut old = first.clone();
        for cond in old.conditions.iter_mut().flatten() {
            cond.last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        }
        c.status = Some(old);
        let second = compute(
            &c,
            &observed,
            &Outcome {
                step: Step::Idle,
                error: None,
            },
        );
        assert_eq!(
            get(&second, "Available").last_transition_time,
            Time(jiff::Timestamp::UNIX_EPOCH)
        );
        assert!(!differs(&first, &second));
        assert_eq!(second.phase, Some(ClusterPhase::Creating));
    }
}
