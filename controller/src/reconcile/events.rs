//! Which Warning Events a reconcile's result deserves (pure): every failed step, with the
//! error's stable code as the reason; and the cluster turning `Degraded`, or `Degraded` for a
//! new reason (an alarm, lost quorum, a halted roll, a wait that puts quorum at risk), once per
//! change rather than on every reconcile.

use etcd_operator_api::status::EtcdClusterStatus;

use crate::outcome::StepError;
use crate::plan::Step;

/// A Warning Event to publish on the EtcdCluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Warning {
    /// Stable, CamelCase reason (an error code or the `Degraded` condition's reason).
    pub reason: String,
    /// What was being done: the step's code, or `Degraded` for a condition change.
    pub action: String,
    /// The human-readable note.
    pub note: String,
}

/// Degraded reasons already announced by an Event of their own when they first appear.
const ANNOUNCED_ELSEWHERE: &[&str] = &["ReplacementPending"];

fn degraded(status: Option<&EtcdClusterStatus>) -> Option<(&str, &str)> {
    status?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Degraded" && c.status == "True")
        .map(|c| (c.reason.as_str(), c.message.as_str()))
}

/// The Warnings for a reconcile that moved the status from `old` to `new`, after `step`
/// (failed with `error` when it did).
pub(super) fn warnings(
    old: Option<&EtcdClusterStatus>,
    new: &EtcdClusterStatus,
    step: &Step,
    error: Option<&StepError>,
) -> Vec<Warning> {
    let mut out = Vec::new();
    // A step under way (a member's process stopping before it starts again, a certificate
    // being issued) has not failed: no Warning, as its Degraded condition is not set either.
    if let Some(error) = error.filter(|e| !e.is_waiting()) {
        out.push(Warning {
            reason: error.code().to_owned(),
            action: step.code().to_owned(),
            note: format!(
                "{} failed: {}",
                step.code(),
                etcd_operator_api::report::Chain(error)
            ),
        });
        // The Degraded condition this failure sets says the same thing.
        return out;
    }
    if let Some((reason, message)) = degraded(Some(new))
        && degraded(old).map(|(r, _)| r) != Some(reason)
        && !ANNOUNCED_ELSEWHERE.contains(&reason)
    {
        out.push(Warning {
            reason: reason.to_owned(),
            action: "Degraded".to_owned(),
            note: message.to_owned(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;
    use crate::member_ops::MemberOpError;
    use crate::plan::WaitReason;

    fn status(degraded: Option<(&str, &str)>) -> EtcdClusterStatus {
        let (status, reason, message) = match degraded {
            Some((reason, message)) => ("True", reason, message),
            None => ("False", "Healthy", "every member is healthy"),
        };
        EtcdClusterStatus {
            conditions: Some(vec![Condition {
                type_: "Degraded".into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                observed_generation: None,
                last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
            }]),
            ..EtcdClusterStatus::default()
        }
    }

    #[test]
    fn a_failed_step_is_one_warning_with_its_code_and_step() {
        let error = StepError::Member(MemberOpError::Timeout {
            op: "member promote",
            after: std::time::Duration::from_secs(3),
        });
        let step = Step::Promote {
            id: 7,
            name: "c".into(),
        };
        let new = status(Some(("StepFailed", "boom")));
        let got = warnings(Some(&status(None)), &new, &step, Some(&error));
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].reason, "EtcdTimeout");
        assert_eq!(got[0].action, "Promote");
        assert!(got[0].note.starts_with("Promote failed: "), "{}", got[0].note);
        // It fails again: warned again (the recorder folds repeats into a series).
        assert_eq!(warnings(Some(&new), &new, &step, Some(&error)).len(), 1);
    }

    /// A roll stopping a member's process before starting it again is not a failure: nothing
    /// to warn about (each member of every roll used to give one "RollTemplate failed").
    #[test]
    fn a_step_under_way_warns_nothing() {
        let error = StepError::Runtime(crate::runtime::RuntimeError::Waiting {
            member: "c-1".into(),
            detail: "its etcd process (pid 7) is stopping".into(),
        });
        assert!(error.is_waiting());
        let step = Step::RollTemplate {
            name: "c-1".into(),
            from: None,
            to: "h".into(),
        };
        let healthy = status(None);
        assert_eq!(warnings(Some(&healthy), &healthy, &step, Some(&error)), vec![]);
    }

    /// The Event says what failed and why, down to etcd's own words, each once.
    #[test]
    fn a_failed_step_warns_with_the_whole_chain_of_causes() {
        let error = StepError::Snapshot(crate::member_ops::SnapshotError::Etcd {
            endpoint: "https://c-1.c:2379".into(),
            source: MemberOpError::Etcd {
                op: "snapshot",
                source: etcd_client::Error::InvalidArgs("the member is shutting down".into()),
            },
        });
        let step = Step::Idle;
        let got = warnings(None, &status(Some(("StepFailed", "x"))), &step, Some(&error));
        assert_eq!(
            got[0].note,
            "Idle failed: take the pre-upgrade snapshot: snapshot from https://c-1.c:2379: etcd snapshot: \
             invalid arguments: the member is shutting down"
        );
    }

    #[test]
    fn turning_degraded_or_degraded_for_a_new_reason_warns_once() {
        let idle = Step::Idle;
        let healthy = status(None);
        let nospace = status(Some(("NoSpaceAlarm", "member a raised NOSPACE")));
        let got = warnings(Some(&healthy), &nospace, &idle, None);
        assert_eq!(
            got,
            vec![Warning {
                reason: "NoSpaceAlarm".into(),
                action: "Degraded".into(),
                note: "member a raised NOSPACE".into(),
            }]
        );
        // A first status that is already degraded warns too.
        assert_eq!(warnings(None, &nospace, &idle, None).len(), 1);
        // The same reason again: nothing new to say.
        assert!(warnings(Some(&nospace), &nospace, &idle, None).is_empty());
        // Another reason: said.
        let corrupt = status(Some(("CorruptAlarm", "member b raised CORRUPT")));
        assert_eq!(
            warnings(Some(&nospace), &corrupt, &idle, None)[0].reason,
            "CorruptAlarm"
        );
        // Healthy again, or never degraded: nothing.
        assert!(warnings(Some(&corrupt), &healthy, &idle, None).is_empty());
        assert!(warnings(Some(&healthy), &healthy, &idle, None).is_empty());
    }

    #[test]
    fn a_pending_replacement_is_left_to_its_own_announcement() {
        let pending = status(Some(("ReplacementPending", "member c will be replaced")));
        let wait = Step::Wait {
            reason: WaitReason::QuorumLost,
        };
        assert!(warnings(Some(&status(None)), &pending, &wait, None).is_empty());
    }
}
