//! What a robustness run found and measured: each fault and each spec change with its recovery
//! time, the recorded history's figures, the findings, and the figures printed at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::faults::FaultKind;
use super::operations::OperationKind;
use super::scenario::SEED_ENV;

/// One fault and what followed.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    /// Its kind.
    pub kind: FaultKind,
    /// What it hit (a member name, `operator`, `backing-etcd`).
    pub target: String,
    /// How long the fault itself lasted (a freeze's length; zero for a kill).
    pub held: Duration,
    /// From the end of the fault (the kill, the thaw, the operator's restart) until the cluster
    /// was back at its spec.
    pub recovery: Duration,
}

/// One phase of a spec change and the fault that overlapped it.
#[derive(Debug, Clone)]
pub struct OperationRecord {
    /// The operation.
    pub kind: OperationKind,
    /// The phase (`scale 3 -> 4`, `roll 3.5.1 -> 3.5.16`, …).
    pub phase: String,
    /// The fault that overlapped it (`kill-operator`, `freeze-follower of robust-x`, …).
    pub fault: String,
    /// For an operator kill: the step whose log line it followed (none: the phase was done
    /// first, and the kill came after it).
    pub after_step: Option<&'static str>,
    /// From the spec change until the phase was done.
    pub took: Duration,
    /// From the end of the fault until the phase was done.
    pub recovery: Duration,
}

/// What a scenario found and measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Every fault, in order.
    pub faults: Vec<FaultRecord>,
    /// Every phase of a spec change, in order.
    pub spec_changes: Vec<OperationRecord>,
    /// Rounds completed (a fault, or a spec change with the faults overlapping its phases).
    pub rounds: usize,
    /// Faults long enough that the status must have called their member unhealthy (a freeze or
    /// an isolation of [`super::scenario::STATUS_MUST_TELL`] or more), and how many it did.
    pub status_checked: usize,
    /// Of those, how many the status told.
    pub status_told: usize,
    /// The `Degraded` reasons the status carried during faults.
    pub degraded_reasons: BTreeSet<String>,
    /// Operations the clients recorded.
    pub operations: usize,
    /// Writes etcd acknowledged.
    pub acknowledged_writes: usize,
    /// Operations with unknown outcome.
    pub unknown_outcomes: usize,
    /// Writes with unknown outcome the watch could not settle (they happened after the last
    /// answer anyone got).
    pub unknown_unsettled: usize,
    /// Events the watch delivered.
    pub watch_events: usize,
    /// Re-established watches.
    pub watch_reconnects: usize,
    /// Keys checked for linearizability, and keys the checker could not decide.
    pub keys_checked: usize,
    /// Keys left undecided by the search budget.
    pub keys_undecided: usize,
    /// Members the operator removed although the fault only paused them.
    pub wrongful_removals: usize,
    /// The checker caught the stale read added to the recorded history as a control.
    pub control_caught: bool,
    /// What happened that no check forbids but a reader should know (a member restarted that no
    /// fault killed).
    pub notes: Vec<String>,
    /// Every failed check, one line each.
    pub findings: Vec<String>,
    /// How long the run took.
    pub elapsed: Duration,
}

/// p-th percentile (nearest rank) of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Report {
    /// Recovery times by kind, sorted.
    pub fn recoveries(&self) -> BTreeMap<FaultKind, Vec<Duration>> {
        let mut by: BTreeMap<FaultKind, Vec<Duration>> = BTreeMap::new();
        for f in &self.faults {
            by.entry(f.kind).or_default().push(f.recovery);
        }
        for v in by.values_mut() {
            v.sort_unstable();
        }
        by
    }

    /// The figures, as printed after a run.
    pub fn figures(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "robustness seed {} ({}={} replays it): {} faults in {:.0}s",
            self.seed,
            SEED_ENV,
            self.seed,
            self.faults.len(),
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "  operations {} (acknowledged writes {}, unknown outcome {}, {} of them unsettled by the watch), watch events {} ({} re-established), keys checked {} (undecided {}, stale-read control caught: {}), wrongful removals {}, long faults the status told {}/{} (Degraded reasons seen: {:?})",
            self.operations,
            self.acknowledged_writes,
            self.unknown_outcomes,
            self.unknown_unsettled,
            self.watch_events,
            self.watch_reconnects,
            self.keys_checked,
            self.keys_undecided,
            self.control_caught,
            self.wrongful_removals,
            self.status_told,
            self.status_checked,
            self.degraded_reasons
        );
        let _ = writeln!(
            out,
            "  {:<22} {:>6} {:>9} {:>9} {:>9}",
            "recovery by kind", "count", "p50", "p99", "max"
        );
        for (kind, times) in self.recoveries() {
            let _ = writeln!(
                out,
                "  {:<22} {:>6} {:>8.2}s {:>8.2}s {:>8.2}s",
                kind.name(),
                times.len(),
                percentile(&times, 50.0).as_secs_f64(),
                percentile(&times, 99.0).as_secs_f64(),
                times.last().copied().unwrap_or_default().as_secs_f64()
            );
        }
        if !self.spec_changes.is_empty() {
            let _ = writeln!(
                out,
                "  {:<26} {:>6} {:>9} {:>9}   overlapping faults",
                "spec change", "count", "took p50", "max"
            );
            let mut by: BTreeMap<&str, Vec<&OperationRecord>> = BTreeMap::new();
            for o in &self.spec_changes {
                by.entry(o.kind.name()).or_default().push(o);
            }
            for (kind, records) in by {
                let mut took: Vec<Duration> = records.iter().map(|r| r.took).collect();
                took.sort_unstable();
                let mut faults: BTreeMap<String, usize> = BTreeMap::new();
                for r in &records {
                    let name = match r.after_step {
                        Some(step) => format!("kill-operator after {step}"),
                        None => r.fault.split(" of ").next().unwrap_or_default().to_string(),
                    };
                    *faults.entry(name).or_default() += 1;
                }
                let faults: Vec<String> = faults.iter().map(|(f, n)| format!("{f} x{n}")).collect();
                let _ = writeln!(
                    out,
                    "  {:<26} {:>6} {:>8.1}s {:>8.1}s   {}",
                    kind,
                    records.len(),
                    percentile(&took, 50.0).as_secs_f64(),
                    took.last().copied().unwrap_or_default().as_secs_f64(),
                    faults.join(", ")
                );
            }
        }
        for note in self.notes.iter().take(20) {
            let _ = writeln!(out, "  note: {note}");
        }
        if self.findings.is_empty() {
            let _ = writeln!(out, "  every check passed");
        } else {
            let _ = writeln!(out, "  {} findings:", self.findings.len());
            for f in self.findings.iter().take(40) {
                let _ = writeln!(out, "    {f}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&d, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&d[..1], 99.0), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn figures_name_the_seed_and_each_kind() {
        let report = Report {
            seed: 42,
            faults: vec![
                FaultRecord {
                    kind: FaultKind::KillLeader,
                    target: "a".into(),
                    held: Duration::ZERO,
                    recovery: Duration::from_millis(1500),
                },
                FaultRecord {
                    kind: FaultKind::KillLeader,
                    target: "b".into(),
                    held: Duration::ZERO,
                    recovery: Duration::from_millis(500),
                },
            ],
            findings: vec!["key robust/0: not linearizable".into()],
            ..Report::default()
        };
        let text = report.figures();
        assert!(text.contains("ROBUSTNESS_SEED=42"), "{text}");
        assert!(text.contains("kill-leader"), "{text}");
        assert!(text.contains("1.50s"), "{text}");
        assert!(text.contains("1 findings"), "{text}");
    }
}
