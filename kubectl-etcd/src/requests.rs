//! The requests the day-2 subcommands make of the controller, as annotations on the EtcdCluster:
//! which annotation and value, the merge patch that sets it, the checks against the cluster's
//! status that come first (the member exists, votes, TLS is on), and for a quorum recovery what
//! will be lost. Pure.

use etcd_operator_api::status::{CONDITION_AVAILABLE, EtcdClusterStatus, MemberStatus};
use etcd_operator_api::v1alpha2::{
    DEFRAGMENT_ANNOTATION, EtcdCluster, MOVE_LEADER_ANNOTATION, RECOVER_QUORUM_ANNOTATION,
    REPLACE_MEMBER_ANNOTATION, ROTATE_CERTIFICATES_ANNOTATION,
};

/// One annotation to set on the EtcdCluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The annotation key.
    pub key: &'static str,
    /// Its value.
    pub value: String,
    /// What the controller will do, for the line printed after it is set.
    pub effect: String,
}

impl Request {
    /// The JSON merge patch that sets the annotation (and changes nothing else).
    pub fn merge_patch(&self) -> serde_json::Value {
        serde_json::json!({"metadata": {"annotations": {self.key: self.value}}})
    }
}

/// Why a request is not made: the cluster's status says it cannot be met or has no effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The named member is not in `status.members`.
    #[error("etcdcluster {cluster:?} has no member {member:?} (members: {known})")]
    NoSuchMember {
        /// The cluster.
        cluster: String,
        /// The name asked for.
        member: String,
        /// The members status lists.
        known: String,
    },
    /// A leadership move to a learner.
    #[error("member {member:?} of etcdcluster {cluster:?} is a learner: only a voting member can lead")]
    Learner {
        /// The cluster.
        cluster: String,
        /// The member.
        member: String,
    },
    /// Certificate rotation on a cluster without TLS.
    #[error("etcdcluster {cluster:?} uses no TLS (spec.tls is empty): there are no certificates to rotate")]
    NoTls {
        /// The cluster.
        cluster: String,
    },
}

fn members(status: Option<&EtcdClusterStatus>) -> &[MemberStatus] {
    status.and_then(|s| s.members.as_deref()).unwrap_or_default()
}

fn find<'a>(
    cluster: &str,
    status: Option<&'a EtcdClusterStatus>,
    member: &str,
) -> Result<&'a MemberStatus, RequestError> {
    let all = members(status);
    all.iter().find(|m| m.name == member).ok_or_else(|| {
        let known: Vec<&str> = all.iter().map(|m| m.name.as_str()).collect();
        RequestError::NoSuchMember {
            cluster: cluster.to_owned(),
            member: member.to_owned(),
            known: if known.is_empty() {
                "none reported yet".to_owned()
            } else {
                known.join(", ")
            },
        }
    })
}

/// A time to the second, as the controller records defragmentations (and as a person would
/// write one).
fn to_second(t: jiff::Timestamp) -> String {
    jiff::Timestamp::from_second(t.as_second())
        .unwrap_or(t)
        .to_string()
}

/// `defrag`: every member not defragmented since `now` is defragmented.
pub fn defragment(now: jiff::Timestamp) -> Request {
    Request {
        key: DEFRAGMENT_ANNOTATION,
        value: to_second(now),
        effect: "every member will be defragmented, one at a time, followers first".to_owned(),
    }
}

/// `replace-member`: the member must be one status lists.
pub fn replace_member(
    cluster: &str,
    status: Option<&EtcdClusterStatus>,
    member: &str,
) -> Result<Request, RequestError> {
    find(cluster, status, member)?;
    Ok(Request {
        key: REPLACE_MEMBER_ANNOTATION,
        value: member.to_owned(),
        effect: format!("member {member} will be replaced by a fresh member, with quorum kept"),
    })
}

/// `rotate-certs`: the cluster must use TLS on some plane.
pub fn rotate_certificates(
    cluster: &EtcdCluster,
    name: &str,
    now: jiff::Timestamp,
) -> Result<Request, RequestError> {
    let tls = cluster.spec.tls.as_ref();
    if tls.is_none_or(|t| t.client.is_none() && t.peer.is_none()) {
        return Err(RequestError::NoTls {
            cluster: name.to_owned(),
        });
    }
    Ok(Request {
        key: ROTATE_CERTIFICATES_ANNOTATION,
        value: to_second(now),
        effect: "every member will get new certificates and restart on them, one at a time".to_owned(),
    })
}

/// `move-leader`: `None` when the member leads already; an error when it is no voting member.
/// The value carries the time so that asking for the same member again is a new request.
pub fn move_leader(
    cluster: &str,
    status: Option<&EtcdClusterStatus>,
    member: &str,
    now: jiff::Timestamp,
) -> Result<Option<Request>, RequestError> {
    let m = find(cluster, status, member)?;
    if m.learner == Some(true) {
        return Err(RequestError::Learner {
            cluster: cluster.to_owned(),
            member: member.to_owned(),
        });
    }
    if m.leader == Some(true) {
        return Ok(None);
    }
    Ok(Some(Request {
        key: MOVE_LEADER_ANNOTATION,
        value: format!("{member}@{}", now.as_second()),
        effect: format!("leadership will move to {member} once every voting member is healthy"),
    }))
}

/// What a quorum recovery will do, shown before it is confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// The annotation to set.
    pub request: Request,
    /// The survivor, when named (`None`: the operator picks the running member that applied the
    /// most).
    pub survivor: Option<String>,
    /// The members whose data is given up (with `auto`: all but the one the operator picks).
    pub lost: Vec<String>,
    /// The cluster is `Available` (has quorum): the operator ignores the request while it has.
    pub has_quorum: bool,
}

impl RecoveryPlan {
    /// What is shown before asking.
    pub fn describe(&self, cluster: &str) -> String {
        let mut out = match &self.survivor {
            Some(s) => format!(
                "Recovering quorum of etcdcluster {cluster:?} rebuilds it from member {s} alone (--force-new-cluster).\n"
            ),
            None => format!(
                "Recovering quorum of etcdcluster {cluster:?} rebuilds it from one member alone (--force-new-cluster): \
                 the running member that applied the most of the log, picked by the operator.\n"
            ),
        };
        if self.lost.is_empty() {
            out.push_str("No other member is listed in status: nothing else is given up.\n");
        } else {
            let what = if self.survivor.is_some() {
                "These members are removed and their data given up (set aside, not deleted)"
            } else {
                "All but the chosen one of these members are removed and their data given up (set aside, not deleted)"
            };
            out.push_str(&format!("{what}; writes that only they had are lost:\n"));
            for m in &self.lost {
                out.push_str(&format!("  - {m}\n"));
            }
        }
        out.push_str("Fresh members then join as learners until spec.replicas is reached again.\n");
        out
    }
}

/// `recover-quorum`: the plan, or an error when the named survivor is no member.
pub fn recover_quorum(
    cluster: &str,
    status: Option<&EtcdClusterStatus>,
    survivor: Option<&str>,
) -> Result<RecoveryPlan, RequestError> {
    if let Some(s) = survivor {
        find(cluster, status, s)?;
    }
    let lost = members(status)
        .iter()
        .map(|m| m.name.clone())
        .filter(|m| Some(m.as_str()) != survivor)
        .collect();
    let has_quorum = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_AVAILABLE))
        .is_some_and(|c| c.status == "True");
    Ok(RecoveryPlan {
        request: Request {
            key: RECOVER_QUORUM_ANNOTATION,
            value: survivor.unwrap_or("auto").to_owned(),
            effect: "the cluster will be rebuilt from the survivor".to_owned(),
        },
        survivor: survivor.map(str::to_owned),
        lost,
        has_quorum,
    })
}

/// How a disruptive request is confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// Go ahead (`--yes`).
    Given,
    /// Ask on the terminal.
    Ask,
    /// Refuse: no `--yes` and no terminal to ask on.
    NoTerminal,
}

/// Whether to go ahead, ask, or refuse.
pub fn confirmation(yes: bool, stdin_is_terminal: bool) -> Confirmation {
    match (yes, stdin_is_terminal) {
        (true, _) => Confirmation::Given,
        (false, true) => Confirmation::Ask,
        (false, false) => Confirmation::NoTerminal,
    }
}

/// Whether a typed answer confirms (`yes`, any case, surrounding space ignored).
pub fn confirms(answer: &str) -> bool {
    answer.trim().eq_ignore_ascii_case("yes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn now() -> jiff::Timestamp {
        "2026-11-27T01:00:00Z".parse().unwrap()
    }

    fn status(available: bool) -> EtcdClusterStatus {
        let m = |name: &str, leader: bool, learner: bool| MemberStatus {
            name: name.into(),
            leader: Some(leader),
            learner: Some(learner),
            ..Default::default()
        };
        EtcdClusterStatus {
            members: Some(vec![
                m("d-a", true, false),
                m("d-b", false, false),
                m("d-c", false, true),
            ]),
            conditions: Some(vec![Condition {
                type_: "Available".into(),
                status: if available { "True" } else { "False" }.into(),
                reason: "x".into(),
                message: String::new(),
                last_transition_time: Time(now()),
                observed_generation: None,
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn an_annotation_is_set_by_a_merge_patch_of_metadata_alone() {
        let r = defragment(now());
        assert_eq!(
            r.merge_patch(),
            serde_json::json!({"metadata": {"annotations": {"etcd.operator.dev/defragment": "2026-11-27T01:00:00Z"}}})
        );
    }

    #[test]
    fn request_times_are_to_the_second() {
        let t: jiff::Timestamp = "2026-11-27T01:06:38.043918015Z".parse().unwrap();
        assert_eq!(defragment(t).value, "2026-11-27T01:06:38Z");
    }

    #[test]
    fn replace_member_names_a_listed_member_only() {
        let s = status(true);
        let r = replace_member("d", Some(&s), "d-b").unwrap();
        assert_eq!((r.key, r.value.as_str()), (REPLACE_MEMBER_ANNOTATION, "d-b"));
        let e = replace_member("d", Some(&s), "d-x").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"etcdcluster "d" has no member "d-x" (members: d-a, d-b, d-c)"#
        );
        let e = replace_member("d", None, "d-x").unwrap_err();
        assert!(e.to_string().ends_with("(members: none reported yet)"), "{e}");
    }

    #[test]
    fn move_leader_is_for_a_voter_that_does_not_lead_and_each_request_is_new() {
        let s = status(true);
        let r = move_leader("d", Some(&s), "d-b", now()).unwrap().unwrap();
        assert_eq!(
            (r.key, r.value.as_str()),
            (MOVE_LEADER_ANNOTATION, "d-b@1795741200")
        );
        assert_eq!(move_leader("d", Some(&s), "d-a", now()).unwrap(), None);
        assert!(matches!(
            move_leader("d", Some(&s), "d-c", now()),
            Err(RequestError::Learner { .. })
        ));
        assert!(matches!(
            move_leader("d", Some(&s), "nope", now()),
            Err(RequestError::NoSuchMember { .. })
        ));
    }

    #[test]
    fn certificates_are_rotated_only_with_tls() {
        let mut c = EtcdCluster::default();
        assert_eq!(
            rotate_certificates(&c, "d", now()).unwrap_err(),
            RequestError::NoTls { cluster: "d".into() }
        );
        c.spec.tls = Some(Box::new(etcd_operator_api::v1alpha2::TlsSpec {
            client: Some(Default::default()),
            ..Default::default()
        }));
        let r = rotate_certificates(&c, "d", now()).unwrap();
        assert_eq!(
            (r.key, r.value.as_str()),
            (ROTATE_CERTIFICATES_ANNOTATION, "2026-11-27T01:00:00Z")
        );
    }

    #[test]
    fn a_quorum_recovery_shows_the_members_given_up() {
        let s = status(false);
        let plan = recover_quorum("d", Some(&s), Some("d-b")).unwrap();
        assert_eq!(plan.lost, vec!["d-a".to_owned(), "d-c".to_owned()]);
        assert_eq!(plan.request.value, "d-b");
        assert!(!plan.has_quorum);
        let text = plan.describe("d");
        assert!(text.contains("from member d-b alone"), "{text}");
        assert!(text.contains("  - d-a\n  - d-c\n"), "{text}");
        // auto: every member is listed, one of them will survive.
        let plan = recover_quorum("d", Some(&s), None).unwrap();
        assert_eq!(plan.request.value, "auto");
        assert_eq!(plan.lost.len(), 3);
        assert!(plan.describe("d").contains("All but the chosen one"));
        // An Available cluster has quorum.
        assert!(recover_quorum("d", Some(&status(true)), None).unwrap().has_quorum);
        assert!(matches!(
            recover_quorum("d", Some(&s), Some("zz")),
            Err(RequestError::NoSuchMember { .. })
        ));
    }

    #[test]
    fn confirmation_needs_yes_or_a_terminal_and_the_word() {
        assert_eq!(confirmation(true, false), Confirmation::Given);
        assert_eq!(confirmation(true, true), Confirmation::Given);
        assert_eq!(confirmation(false, true), Confirmation::Ask);
        assert_eq!(confirmation(false, false), Confirmation::NoTerminal);
        assert!(confirms(" YES\n"));
        assert!(!confirms("y"));
        assert!(!confirms(""));
    }
}
