//! Spec changes under faults, on the local-mode scenario's cluster: one phase of an operation
//! (see [`super::operations`]) made with kubectl, overlapped by a member fault or an operator
//! kill after one of its steps, then waited for until done; a backup's file checked against its
//! status; the membership compared with what the phase should make of it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::IndexedRandom;

use super::RobustnessError;
use super::disk::SmallDisks;
use super::faults::{self, FaultKind, Membership, PeerProxies};
use super::operations::{self, Change, Done, LogCursor, OperationKind, Phase};
use super::report::OperationRecord;
use super::scenario::{CLUSTER, ScenarioConfig, at_spec, inject, operator_ready, pick_ms};
use crate::LocalOperator;

/// What runs the faults and the operations: the operator and everything around it.
pub(super) struct Rig<'a> {
    pub(super) op: &'a mut LocalOperator,
    pub(super) proxies: &'a PeerProxies,
    pub(super) disks: &'a SmallDisks,
    pub(super) endpoints: &'a [String],
    pub(super) config: &'a ScenarioConfig,
}

/// Runs kubectl off the async workers.
fn kubectl_blocking(
    op: &LocalOperator,
    args: &[&str],
    stdin: Option<&str>,
    what: String,
) -> Result<String, RobustnessError> {
    tokio::task::block_in_place(|| crate::kubectl::kubectl(op, args, stdin)).map_err(|source| {
        RobustnessError::Operation {
            what,
            source: Box::new(source),
        }
    })
}

/// Reads `resource/name` as JSON (none while the API does not answer, e.g. the operator down).
fn get_blocking(op: &LocalOperator, resource: &str, name: &str) -> Option<serde_json::Value> {
    tokio::task::block_in_place(|| crate::kubectl::get(op, resource, name).ok())
}

/// How far a phase's wait got: the step lines seen, the members defragmented.
#[derive(Debug, Default)]
struct PhaseProgress {
    steps: Vec<&'static str>,
    defragmented: BTreeSet<String>,
}

impl PhaseProgress {
    fn read(&mut self, cursor: &mut LogCursor, phase: &Phase) {
        for line in cursor.new_lines() {
            if phase.steps.iter().any(|s| line.contains(s)) {
                self.steps.push(operations::step_name(&line));
            }
            if let Some(member) = operations::defragmented_member(&line) {
                self.defragmented.insert(member);
            }
        }
    }
}

/// Whether `phase` is done: the cluster at its new generation, available with the phase's
/// replicas and whatever the phase adds; a backup `Succeeded` (a failed one is an error).
fn phase_done(op: &LocalOperator, phase: &Phase, progress: &PhaseProgress) -> Result<bool, RobustnessError> {
    match &phase.change {
        Change::Patch { done, .. } => Ok(get_blocking(op, "ec", CLUSTER)
            .is_some_and(|o| operations::phase_done(&o, phase.replicas, done, progress.defragmented.len()))),
        Change::Backup { name, .. } => {
            let Some(backup) = get_blocking(op, "etcdbackup", name) else {
                return Ok(false);
            };
            match backup["status"]["phase"].as_str() {
                Some("Succeeded") => verify_backup(name, &backup["status"]).map(|()| true),
                Some("Failed") => Err(RobustnessError::PhaseFailed {
                    what: format!("backup {name}"),
                    detail: backup["status"]["message"].to_string(),
                }),
                _ => Ok(false),
            }
        }
    }
}

/// A `Succeeded` backup's file is where its status says, of the size and SHA-256 it says.
fn verify_backup(name: &str, status: &serde_json::Value) -> Result<(), RobustnessError> {
    use sha2::Digest as _;
    let failed = |detail: String| RobustnessError::PhaseFailed {
        what: format!("backup {name}"),
        detail,
    };
    let location = status["location"]
        .as_str()
        .ok_or_else(|| failed(format!("no location in {status}")))?;
    let data = std::fs::read(location).map_err(|e| failed(format!("read {location}: {e}")))?;
    let sha = format!("{:x}", sha2::Sha256::digest(&data));
    if status["size"].as_u64() != Some(data.len() as u64) || status["sha256"].as_str() != Some(sha.as_str()) {
        return Err(failed(format!(
            "{location} holds {} bytes with SHA-256 {sha}; the status says {} and {}",
            data.len(),
            status["size"],
            status["sha256"]
        )));
    }
    Ok(())
}

/// One phase of a spec change, overlapped by a fault: either the operator killed after the n-th
/// step line of the phase (n by the seed), or a member fault of a kind from the configuration
/// after 0–2 s. Waits until the phase is done and the cluster is back at its spec.
pub(super) async fn run_phase(
    rig: &mut Rig<'_>,
    kind: OperationKind,
    phase: &Phase,
    rng: &mut rand::rngs::StdRng,
) -> Result<OperationRecord, RobustnessError> {
    let config = rig.config;
    let mut cursor = LogCursor::at_end(rig.op.state_dir().to_path_buf());
    let mut progress = PhaseProgress::default();
    let kill_operator = rng.random_bool(0.5);
    let kill_at = rng.random_range(1..=phase.kill_points.max(1));
    let member_kinds: Vec<FaultKind> = config
        .kinds
        .iter()
        .copied()
        .filter(|k| !k.fills_a_disk())
        .collect();
    let member_fault = member_kinds
        .choose(rng)
        .copied()
        .unwrap_or(FaultKind::FreezeFollower);
    let delay = pick_ms(rng, &(0..2000));
    let kill_delay = pick_ms(rng, &(0..300));
    let down = pick_ms(rng, &(0..1000));
    let began = Instant::now();
    match &phase.change {
        Change::Patch { patch, .. } => {
            kubectl_blocking(
                rig.op,
                &["patch", "ec", CLUSTER, "--type=merge", "-p", patch],
                None,
                format!("patch {CLUSTER} for {}", phase.what),
            )?;
        }
        Change::Backup { manifest, name } => {
            kubectl_blocking(
                rig.op,
                &["apply", "-f", "-"],
                Some(manifest),
                format!("create backup {name}"),
            )?;
        }
    }
    let (fault, after_step) = if kill_operator {
        // Wait for the kill_at-th step line (or the phase done first).
        let mut step = None;
        loop {
            // Done is asked first: every line logged before the phase was done is read.
            let done = phase_done(rig.op, phase, &progress)?;
            progress.read(&mut cursor, phase);
            if let Some(s) = progress.steps.get(kill_at - 1) {
                step = Some(*s);
                break;
            }
            if done {
                break;
            }
            if began.elapsed() > config.recovery_timeout {
                return Err(RobustnessError::Timeout {
                    what: format!("{} to log step {kill_at} of {:?}", phase.what, phase.steps),
                    timeout: config.recovery_timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(kill_delay).await;
        rig.op.crash();
        tokio::time::sleep(down).await;
        rig.op.start_again().await?;
        ("kill-operator".to_string(), Some(step.unwrap_or("phase-done")))
    } else {
        tokio::time::sleep(delay).await;
        // A member that has just been added may have no process yet: try again shortly.
        let mut attempt = 0;
        loop {
            let membership = faults::membership_retrying(rig.endpoints, Duration::from_secs(10)).await?;
            match inject(
                member_fault,
                rig.op,
                rig.proxies,
                rig.disks,
                &membership,
                rng,
                config,
            )
            .await
            {
                Ok((target, _)) => break (format!("{member_fault} of {target}"), None),
                Err(RobustnessError::NoProcess { .. } | RobustnessError::NoPeerProxy { .. })
                    if attempt < 10 =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
    };
    let fault_ended = Instant::now();
    let operator_fault =
        kill_operator || matches!(member_fault, FaultKind::KillOperator | FaultKind::KillBackingEtcd);
    loop {
        progress.read(&mut cursor, phase);
        if phase_done(rig.op, phase, &progress)?
            && (!operator_fault || operator_ready(rig.op))
            && at_spec(rig.op, phase.replicas).await
        {
            break;
        }
        if fault_ended.elapsed() > config.recovery_timeout {
            return Err(RobustnessError::Timeout {
                what: format!(
                    "{} done after {fault} (steps logged: {:?}, defragmented: {:?})",
                    phase.what, progress.steps, progress.defragmented
                ),
                timeout: config.recovery_timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Change::Patch {
        done: Done::Defragmented,
        ..
    } = &phase.change
    {
        kubectl_blocking(
            rig.op,
            &[
                "patch",
                "ec",
                CLUSTER,
                "--type=merge",
                "-p",
                operations::DEFRAGMENT_OFF,
            ],
            None,
            "remove the defragmentation schedule".into(),
        )?;
    }
    let after_step = after_step.map(|s| if s == "phase-done" { "the phase done" } else { s });
    Ok(OperationRecord {
        kind,
        phase: phase.what.clone(),
        fault,
        after_step,
        took: began.elapsed(),
        recovery: fault_ended.elapsed(),
    })
}

/// Whether the membership after `phase` is what the phase makes of `before`: a scale out adds
/// one member and keeps the others, a scale in removes one and keeps the others, anything else
/// keeps every member ID.
pub(super) fn membership_as_expected(before: &Membership, after: &Membership, replicas: usize) -> bool {
    let kept = |a: &Membership, b: &Membership| a.members.keys().all(|id| b.members.contains_key(id));
    match replicas.cmp(&before.members.len()) {
        std::cmp::Ordering::Greater => kept(before, after) && after.members.len() == replicas,
        std::cmp::Ordering::Less => kept(after, before) && after.members.len() == replicas,
        std::cmp::Ordering::Equal => before.members == after.members,
    }
}
