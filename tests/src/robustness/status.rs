//! What the EtcdCluster's status said during a run: a sampler reads it every 300 ms (kubectl,
//! through the operator's API, as a user would) and keeps the members each sample called
//! unhealthy and the `Degraded` condition's reason; after a fault, [`told`] says whether the
//! status reported the member the fault hit.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One reading of the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// When it was read (after kubectl answered).
    pub at: Instant,
    /// The members `status.members` called unhealthy.
    pub unhealthy: BTreeSet<String>,
    /// The reason of `Degraded=True`, if set.
    pub degraded: Option<String>,
}

impl Sample {
    /// The sample of a status object read at `at`.
    pub fn of(status: &serde_json::Value, at: Instant) -> Self {
        let unhealthy = status["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["healthy"] != true)
            .filter_map(|m| m["name"].as_str().map(str::to_owned))
            .collect();
        let degraded = crate::kubectl::condition(status, "Degraded")
            .filter(|c| c["status"] == "True")
            .and_then(|c| c["reason"].as_str().map(str::to_owned));
        Self {
            at,
            unhealthy,
            degraded,
        }
    }
}

/// Whether some sample in `[from, to]` called `member` unhealthy.
pub fn told(samples: &[Sample], member: &str, from: Instant, to: Instant) -> bool {
    samples
        .iter()
        .any(|s| s.at >= from && s.at <= to && s.unhealthy.contains(member))
}

/// The `Degraded` reasons the samples in `[from, to]` carried.
pub fn degraded_reasons(samples: &[Sample], from: Instant, to: Instant) -> BTreeSet<String> {
    samples
        .iter()
        .filter(|s| s.at >= from && s.at <= to)
        .filter_map(|s| s.degraded.clone())
        .collect()
}

/// The `Degraded` reasons a failed step sets (the controller's `StepError::reason`): the
/// Warning for such a failure carries the error's own code as its reason and says `<Step>
/// failed: …`, so any failed-step warning tells of them.
pub const STEP_FAILURE_REASONS: [&str; 5] = [
    etcd_operator_controller::outcome::REASON_STEP_FAILED,
    etcd_operator_controller::outcome::REASON_RESTORE_FAILED,
    etcd_operator_controller::outcome::REASON_TLS_HANDSHAKE_FAILED,
    etcd_operator_controller::outcome::REASON_CERTIFICATES_UNAVAILABLE,
    etcd_operator_controller::outcome::REASON_VOLUME_EXPANSION_NOT_ALLOWED,
];

/// A warning as told to people: its reason and its note (an Event's, or a log line's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    /// The reason.
    pub reason: String,
    /// The note or message.
    pub note: String,
}

/// The `Degraded` reasons among `reasons` that no warning in `told` tells of: one with the same
/// reason, or for a failed step's reason any failed-step warning.
pub fn untold<'a>(reasons: &'a BTreeSet<String>, told: &[Told]) -> Vec<&'a String> {
    reasons
        .iter()
        .filter(|reason| {
            !told.iter().any(|t| {
                t.reason == reason.as_str()
                    || (STEP_FAILURE_REASONS.contains(&reason.as_str()) && t.note.contains(" failed: "))
            })
        })
        .collect()
}

/// The Degraded reasons with no Warning Event on EtcdCluster `cluster` among `events` (core/v1
/// or events.k8s.io/v1 objects), one finding each.
pub fn events_missing(
    reasons: &BTreeSet<String>,
    events: &[serde_json::Value],
    cluster: &str,
) -> Vec<String> {
    let told: Vec<Told> = events
        .iter()
        .filter(|e| {
            e["type"] == "Warning"
                && (e["regarding"]["name"] == cluster || e["involvedObject"]["name"] == cluster)
        })
        .map(|e| Told {
            reason: e["reason"].as_str().unwrap_or_default().to_string(),
            note: e["note"]
                .as_str()
                .or_else(|| e["message"].as_str())
                .unwrap_or_default()
                .to_string(),
        })
        .collect();
    untold(reasons, &told)
        .into_iter()
        .map(|reason| {
            format!(
                "the status said Degraded ({reason}) but no Warning Event told of it on {cluster} ({} Events in all)",
                events.len()
            )
        })
        .collect()
}

/// Reads the status of one EtcdCluster every 300 ms on a thread of its own until dropped.
#[derive(Debug)]
pub struct StatusSampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatusSampler {
    /// Starts sampling `ec/<cluster>` in the default namespace through `kubeconfig`.
    pub fn start(kubeconfig: PathBuf, cluster: &str) -> Self {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (samples, stop, cluster) = (samples.clone(), stop.clone(), cluster.to_string());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let read = crate::kube::kubectl(Some(&kubeconfig))
                        .ok()
                        .and_then(|mut cmd| cmd.args(["get", "ec", &cluster, "-o", "json"]).output().ok())
                        .filter(|out| out.status.success())
                        .and_then(|out| serde_json::from_slice::<serde_json::Value>(&out.stdout).ok());
                    if let Some(object) = read
                        && let Ok(mut s) = samples.lock()
                    {
                        s.push(Sample::of(&object["status"], Instant::now()));
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            })
        };
        Self {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// The samples so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for StatusSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sample_names_the_unhealthy_members_and_the_degraded_reason() {
        let now = Instant::now();
        let s = Sample::of(
            &json!({
                "members": [{"name": "a", "healthy": true}, {"name": "b", "healthy": false}, {"name": "c"}],
                "conditions": [{"type": "Degraded", "status": "True", "reason": "MembersUnhealthy"}],
            }),
            now,
        );
        assert_eq!(s.unhealthy, ["b".to_string(), "c".to_string()].into());
        assert_eq!(s.degraded.as_deref(), Some("MembersUnhealthy"));
        let healthy = Sample::of(
            &json!({"members": [{"name": "a", "healthy": true}], "conditions": [{"type": "Degraded", "status": "False", "reason": "AsExpected"}]}),
            now,
        );
        assert!(healthy.unhealthy.is_empty() && healthy.degraded.is_none());
    }

    #[test]
    fn a_degraded_reason_is_told_by_its_own_reason_or_for_a_failed_step_by_any_failure() {
        let reasons: BTreeSet<String> = ["MembersUnhealthy".to_string(), "StepFailed".to_string()].into();
        let unhealthy = Told {
            reason: "MembersUnhealthy".into(),
            note: "unhealthy members: a".into(),
        };
        let failed = Told {
            reason: "EtcdTimeout".into(),
            note: "Promote failed: timed out".into(),
        };
        assert!(untold(&reasons, &[unhealthy.clone(), failed.clone()]).is_empty());
        assert_eq!(
            untold(&reasons, std::slice::from_ref(&unhealthy)),
            vec!["StepFailed"]
        );
        // A failed step does not tell of members being unhealthy.
        assert_eq!(untold(&reasons, &[failed]), vec!["MembersUnhealthy"]);
    }

    #[test]
    fn a_degraded_reason_without_its_warning_event_is_a_finding() {
        use serde_json::json;
        let reasons: BTreeSet<String> = ["MembersUnhealthy".to_string()].into();
        let event = json!({"type": "Warning", "reason": "MembersUnhealthy", "regarding": {"name": "c"}});
        assert!(events_missing(&reasons, std::slice::from_ref(&event), "c").is_empty());
        let core = json!({"type": "Warning", "reason": "MembersUnhealthy", "involvedObject": {"name": "c"}});
        assert!(events_missing(&reasons, &[core], "c").is_empty());
        let normal = json!({"type": "Normal", "reason": "MembersUnhealthy", "regarding": {"name": "c"}});
        let elsewhere =
            json!({"type": "Warning", "reason": "MembersUnhealthy", "regarding": {"name": "other"}});
        assert_eq!(events_missing(&reasons, &[normal, elsewhere], "c").len(), 1);
        assert!(events_missing(&Default::default(), &[], "c").is_empty());
    }

    #[test]
    fn told_looks_only_inside_the_window_and_at_the_member() {
        let t0 = Instant::now();
        let at = |ms: u64, who: &[&str]| Sample {
            at: t0 + Duration::from_millis(ms),
            unhealthy: who.iter().map(|w| w.to_string()).collect(),
            degraded: None,
        };
        let samples = vec![at(0, &[]), at(1000, &["b"]), at(2000, &[])];
        let ms = |n| t0 + Duration::from_millis(n);
        assert!(told(&samples, "b", ms(500), ms(1500)));
        assert!(!told(&samples, "a", ms(500), ms(1500)), "another member");
        assert!(!told(&samples, "b", ms(1500), ms(2500)), "after the window");
        assert!(!told(&samples, "b", ms(0), ms(900)), "before it");
        assert!(degraded_reasons(&samples, ms(0), ms(3000)).is_empty());
    }
}
