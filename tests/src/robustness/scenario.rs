//! The seeded scenario runner: a local-mode 3-member cluster under the recorded load, faults
//! picked at random one after another, each followed by a wait until the cluster is back at its
//! spec (timed per kind), then every check; the figures it prints are the suite's results.
//!
//! `ROBUSTNESS_SEED` replays a run: the seed picks the faults, their targets, their lengths and
//! each client's operations (the timing of a real cluster is not replayed).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::{Duration, Instant};

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

use super::RobustnessError;
use super::disk::SmallDisks;
use super::faults::{self, FaultKind, Frozen, Membership, PeerProxies};
use super::history::LoadConfig;
use super::operations::{self, OperationKind, SpecState};
use super::recorded::Recorded;
use super::report::{FaultRecord, Report};
use super::spec_changes::{Rig, membership_as_expected, run_phase};
use crate::LocalOperator;

/// The environment variable that fixes the seed.
pub const SEED_ENV: &str = "ROBUSTNESS_SEED";

/// The seed of this run: `ROBUSTNESS_SEED` when set (and a number), else one from the clock.
pub fn seed_from_env() -> u64 {
    std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 % 1_000_000_000)
                .unwrap_or_default()
        })
}

/// The environment variable that limits the fault kinds (comma-separated names, e.g.
/// `isolate-leader,kill-follower`); unset: every kind.
pub const KINDS_ENV: &str = "ROBUSTNESS_KINDS";

/// The fault kinds `ROBUSTNESS_KINDS` names (every kind when unset or empty).
pub fn kinds_from_env() -> Result<Vec<FaultKind>, RobustnessError> {
    let Ok(names) = std::env::var(KINDS_ENV) else {
        return Ok(FaultKind::ALL.to_vec());
    };
    let mut kinds = Vec::new();
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match FaultKind::ALL
            .iter()
            .chain(&FaultKind::KUBERNETES)
            .find(|k| k.name() == name)
        {
            Some(kind) => kinds.push(*kind),
            None => {
                return Err(RobustnessError::UnknownKind {
                    name: name.to_string(),
                });
            }
        }
    }
    Ok(if kinds.is_empty() {
        FaultKind::ALL.to_vec()
    } else {
        kinds
    })
}

/// The environment variable that limits the operations (comma-separated names, e.g.
/// `scale,roll`; `none` for none); unset: the variant's own.
pub const OPERATIONS_ENV: &str = "ROBUSTNESS_OPERATIONS";

/// The operations `ROBUSTNESS_OPERATIONS` names; `None` when unset.
pub fn operations_from_env() -> Result<Option<Vec<OperationKind>>, RobustnessError> {
    let Ok(names) = std::env::var(OPERATIONS_ENV) else {
        return Ok(None);
    };
    let mut kinds = Vec::new();
    for name in names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty() && *n != "none")
    {
        match OperationKind::ALL.iter().find(|k| k.name() == name) {
            Some(kind) => kinds.push(*kind),
            None => {
                return Err(RobustnessError::UnknownKind {
                    name: name.to_string(),
                });
            }
        }
    }
    Ok(Some(kinds))
}

/// What a scenario does.
#[derive(Debug, Clone)]
pub struct ScenarioConfig {
    /// Seeds every random choice.
    pub seed: u64,
    /// Faults injected, one after another.
    pub faults: usize,
    /// The kinds to pick from.
    pub kinds: Vec<FaultKind>,
    /// How long a freeze lasts (milliseconds).
    pub freeze_ms: Range<u64>,
    /// Quiet time after a recovery before the next fault (milliseconds).
    pub pause_ms: Range<u64>,
    /// How long a killed operator stays down (milliseconds).
    pub operator_down_ms: Range<u64>,
    /// How long the cluster may take to come back before the run fails.
    pub recovery_timeout: Duration,
    /// The client load.
    pub load: LoadConfig,
    /// The spec changes to pick from.
    pub operations: Vec<OperationKind>,
    /// The share of the rounds that make a spec change (overlapped by a fault) instead of only a
    /// fault, 0 to 1.
    pub operation_share: f64,
}

impl ScenarioConfig {
    /// The short variant (`make test`): a handful of faults, freezes of 1–5 s.
    pub fn short(seed: u64) -> Self {
        Self {
            seed,
            faults: 6,
            kinds: FaultKind::ALL.to_vec(),
            freeze_ms: 1000..5000,
            pause_ms: 500..2000,
            operator_down_ms: 0..2000,
            recovery_timeout: Duration::from_secs(60),
            load: LoadConfig {
                seed,
                ..LoadConfig::default()
            },
            operations: Vec::new(),
            operation_share: 0.0,
        }
    }

    /// The short variant of spec changes under faults (`make test`): `rounds` spec changes, each
    /// overlapped by a fault or an operator kill at one of its steps.
    pub fn short_operations(seed: u64, rounds: usize) -> Self {
        Self {
            faults: rounds,
            operations: OperationKind::ALL.to_vec(),
            operation_share: 1.0,
            recovery_timeout: Duration::from_secs(180),
            ..Self::short(seed)
        }
    }

    /// The long variant (`make robustness`): `faults` faults, freezes of 1–15 s.
    pub fn long(seed: u64, faults: usize) -> Self {
        Self {
            faults,
            freeze_ms: 1000..15_000,
            recovery_timeout: Duration::from_secs(180),
            operations: OperationKind::ALL.to_vec(),
            operation_share: 0.25,
            ..Self::short(seed)
        }
    }
}

/// A freeze or isolation at least this long must show in the status: the operator looks at the
/// members every few seconds, and the member is unhealthy (no answer, or no leader) for most of
/// it.
pub const STATUS_MUST_TELL: Duration = Duration::from_secs(7);

/// The name of the cluster a scenario runs.
pub const CLUSTER: &str = "robust";

/// Status of the EtcdCluster (kubectl, run off the async workers).
fn cluster_status(op: &LocalOperator) -> Option<serde_json::Value> {
    tokio::task::block_in_place(|| crate::kubectl::status(op, "ec", CLUSTER).ok())
}

/// Every member answers a status call, all name the same leader, none is a learner, there are
/// `replicas` of them, and the EtcdCluster says it is available with them all healthy.
pub(super) async fn at_spec(op: &LocalOperator, replicas: usize) -> bool {
    let Some(status) = cluster_status(op) else {
        return false;
    };
    if !crate::local_cluster::available(&status, replicas as i64) {
        return false;
    }
    let endpoints = crate::kubectl::client_endpoints(&status);
    let mut leaders = BTreeSet::new();
    for endpoint in &endpoints {
        let options = super::client_options(Duration::from_secs(1));
        let answer = tokio::time::timeout(Duration::from_secs(2), async {
            let mut c = etcd_client::Client::connect([endpoint.as_str()], Some(options))
                .await
                .ok()?;
            c.status().await.ok()
        })
        .await;
        match answer {
            Ok(Some(status)) if status.leader() != 0 => {
                leaders.insert(status.leader());
            }
            _ => return false,
        }
    }
    leaders.len() == 1 && endpoints.len() == replicas
}

/// The operator answers `/readyz` (its backing etcd serves again).
pub(super) fn operator_ready(op: &LocalOperator) -> bool {
    tokio::task::block_in_place(|| crate::kubectl::kubectl(op, &["get", "--raw", "/readyz"], None).is_ok())
}

/// After fault `i` (`kind` of `target`, held for `held`): waits until the cluster is back at its
/// spec ([`wait_at_spec`]), says so, and records the fault in `report`. A cluster that does not
/// come back is a finding, and the error the run stops on.
#[allow(clippy::print_stdout)] // the suite's progress, as the fault loops print it
pub(super) async fn recover(
    op: &LocalOperator,
    report: &mut Report,
    config: &ScenarioConfig,
    (i, kind, target, held): (usize, FaultKind, &str, Duration),
) -> Result<Duration, RobustnessError> {
    let recovery = match wait_at_spec(op, kind, config.recovery_timeout).await {
        Ok(d) => d,
        Err(e) => {
            report.findings.push(format!(
                "fault {i} ({kind} of {target}, seed {}): {}",
                config.seed,
                etcd_operator_api::report::chain(&e)
            ));
            return Err(e);
        }
    };
    println!(
        "robustness: fault {i}: {kind} of {target} (held {:.1}s), back at spec {:.2}s later",
        held.as_secs_f64(),
        recovery.as_secs_f64()
    );
    report.faults.push(FaultRecord {
        kind,
        target: target.to_owned(),
        held,
        recovery,
    });
    report.rounds += 1;
    Ok(recovery)
}

/// Waits until the cluster is [`at_spec`] (and, after a fault of the operator's own processes,
/// the operator is ready); how long that took.
async fn wait_at_spec(
    op: &LocalOperator,
    kind: FaultKind,
    timeout: Duration,
) -> Result<Duration, RobustnessError> {
    let began = Instant::now();
    let operator_fault = matches!(kind, FaultKind::KillOperator | FaultKind::KillBackingEtcd);
    while began.elapsed() < timeout {
        if (!operator_fault || operator_ready(op)) && at_spec(op, 3).await {
            return Ok(began.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(RobustnessError::Timeout {
        what: "the cluster back at its spec (3 healthy voters, one leader, Available)".into(),
        timeout,
    })
}

pub(super) fn pick_ms(rng: &mut rand::rngs::StdRng, range: &Range<u64>) -> Duration {
    if range.is_empty() {
        Duration::from_millis(range.start)
    } else {
        Duration::from_millis(rng.random_range(range.clone()))
    }
}

/// The pid of each member's process (members without a running process left out).
fn member_pids(op: &LocalOperator, membership: &Membership) -> BTreeMap<String, u32> {
    membership
        .members
        .values()
        .filter_map(|m| Some((m.clone(), faults::member_pid(op, CLUSTER, m).ok()?)))
        .collect()
}

/// Injects one fault; what it hit and how long it was held.
#[allow(clippy::print_stdout)]
pub(super) async fn inject(
    kind: FaultKind,
    op: &mut LocalOperator,
    proxies: &PeerProxies,
    disks: &SmallDisks,
    membership: &Membership,
    rng: &mut rand::rngs::StdRng,
    config: &ScenarioConfig,
) -> Result<(String, Duration), RobustnessError> {
    let follower = membership
        .followers()
        .choose(rng)
        .map(|s| s.to_string())
        .unwrap_or_default();
    let leader = membership.leader_name().unwrap_or_default().to_string();
    match kind {
        FaultKind::FreezeFollower | FaultKind::FreezeLeader => {
            let member = if kind == FaultKind::FreezeLeader {
                leader
            } else {
                follower
            };
            let pid = faults::member_pid(op, CLUSTER, &member)?;
            let held = pick_ms(rng, &config.freeze_ms);
            let frozen = Frozen::freeze(pid)?;
            tokio::time::sleep(held).await;
            frozen.thaw()?;
            Ok((member, held))
        }
        FaultKind::KillFollower | FaultKind::KillLeader => {
            let member = if kind == FaultKind::KillLeader {
                leader
            } else {
                follower
            };
            faults::sigkill(faults::member_pid(op, CLUSTER, &member)?)?;
            Ok((member, Duration::ZERO))
        }
        FaultKind::KillOperator => {
            let down = pick_ms(rng, &config.operator_down_ms);
            op.crash();
            tokio::time::sleep(down).await;
            op.start_again().await?;
            Ok(("operator".into(), down))
        }
        FaultKind::KillBackingEtcd => {
            faults::sigkill(faults::backing_etcd_pid(op)?)?;
            Ok(("backing-etcd".into(), Duration::ZERO))
        }
        FaultKind::IsolateFollower | FaultKind::IsolateLeader | FaultKind::IsolateLeaderBriefly => {
            let member = if kind == FaultKind::IsolateFollower {
                follower
            } else {
                leader
            };
            let id = membership
                .members
                .iter()
                .find(|(_, name)| **name == member)
                .map(|(id, _)| *id)
                .unwrap_or_default();
            let held = if kind == FaultKind::IsolateLeaderBriefly {
                pick_ms(rng, &(800..2000))
            } else {
                pick_ms(rng, &config.freeze_ms)
            };
            let isolated = proxies.isolate(&member, id);
            let mut seen = None;
            if isolated.is_ok() {
                tokio::time::sleep(held).await;
                // Cut off for more than two election timeouts (1 s), the member must know no
                // leader (a leader steps down without a quorum): proof the partition is real.
                if held >= Duration::from_secs(3)
                    && let Some(url) = membership.client_urls.get(&id)
                {
                    seen = faults::leader_seen_by(url).await;
                }
            }
            proxies.heal();
            isolated?;
            match seen {
                Some(leader) if leader != 0 => Err(RobustnessError::NotIsolated { member, held, leader }),
                _ => Ok((member, held)),
            }
        }
        FaultKind::DiskFullFollower | FaultKind::DiskFullLeader => {
            let member = if kind == FaultKind::DiskFullLeader {
                leader
            } else {
                follower
            };
            let held = pick_ms(rng, &config.freeze_ms);
            let filled = disks.fill(&member);
            if filled.is_ok() {
                tokio::time::sleep(held).await;
            }
            disks.heal(&member)?;
            let filled = filled?;
            println!("robustness: filled {member}'s disk with {} MiB", filled >> 20);
            Ok((member, held))
        }
        FaultKind::DeletePod => Err(RobustnessError::NotInThisRuntime { kind }),
    }
}

/// Puts every member's data on a tmpfs of its own (those not there yet), one at a time, each
/// followed by a wait until the cluster is back at its spec; a note says what it took.
async fn members_onto_tmpfs(
    op: &LocalOperator,
    disks: &SmallDisks,
    endpoints: &[String],
    config: &ScenarioConfig,
    report: &mut Report,
) -> Result<(), RobustnessError> {
    let membership = faults::membership_retrying(endpoints, Duration::from_secs(10)).await?;
    let began = Instant::now();
    let mut moved = Vec::new();
    for member in membership.members.values() {
        if disks.has(member) {
            continue;
        }
        disks.move_onto_tmpfs(op, CLUSTER, member).await?;
        wait_at_spec(op, FaultKind::KillFollower, config.recovery_timeout).await?;
        moved.push(member.clone());
    }
    if !moved.is_empty() {
        report.notes.push(format!(
            "moved {moved:?} onto tmpfs mounts of their own for the full-disk faults ({:.1}s, not counted as a fault)",
            began.elapsed().as_secs_f64()
        ));
    }
    Ok(())
}

/// Runs a scenario on a fresh local-mode operator: brings up the cluster, runs the load and the
/// faults, then the checks. A step that cannot be done (the cluster never comes back) is an
/// error; what the checks find is in the report.
#[allow(clippy::print_stdout)]
pub async fn run(config: ScenarioConfig) -> Result<Report, RobustnessError> {
    let run_began = Instant::now();
    println!(
        "robustness: seed {} (set {}={} to replay), {} faults of {:?}",
        config.seed,
        SEED_ENV,
        config.seed,
        config.faults,
        config.kinds.iter().map(|k| k.name()).collect::<Vec<_>>()
    );
    // Members advertise a peer port of their own, where a fault proxy forwards to the real one.
    let mut op = LocalOperator::start_with(crate::operator::OperatorOptions {
        env: vec![
            ("ETCD_OPERATOR_PEER_PROXY_PORTS".into(), "1".into()),
            // Each reconcile's plan in the kept logs of a failed run.
            (
                "RUST_LOG".into(),
                "info,etcd_operator_controller::reconcile=debug".into(),
            ),
        ],
        args: Vec::new(),
    })
    .await?;
    let outcome = Box::pin(drive(&mut op, &config, run_began)).await;
    let failed = outcome.as_ref().map_or(true, |r| !r.findings.is_empty());
    if failed || std::env::var_os(KEEP_LOGS_ENV).is_some() {
        match keep_logs(&op, config.seed) {
            Ok(dir) => println!(
                "robustness: the operator's and members' logs are kept in {}",
                dir.display()
            ),
            Err(e) => println!(
                "robustness: the logs could not be kept: {}",
                etcd_operator_api::report::chain(&e)
            ),
        }
    }
    drop(op);
    outcome
}

/// The core/v1 Events in the cluster's namespace (asked a few times: the API answers errors
/// while its backing etcd restarts).
fn events(op: &LocalOperator) -> Result<Vec<serde_json::Value>, String> {
    let mut last = String::new();
    for _ in 0..10 {
        match crate::kubectl::kubectl(op, &["get", "events", "-n", "default", "-o", "json"], None) {
            Ok(text) => {
                return serde_json::from_str::<serde_json::Value>(&text)
                    .map(|list| list["items"].as_array().cloned().unwrap_or_default())
                    .map_err(|e| format!("parse the Event list: {e}"));
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(last)
}

/// How long one phase or one fault's injection may take in all before the run stops on it as a
/// finding (its own waits are bounded by `recovery_timeout`; this bounds whatever else it awaits).
pub(super) fn phase_watchdog(config: &ScenarioConfig) -> Duration {
    config.recovery_timeout * 2 + Duration::from_secs(60)
}

/// Set (to anything) to keep the logs of a run that passed too.
pub const KEEP_LOGS_ENV: &str = "ROBUSTNESS_KEEP_LOGS";

/// Copies the operator's logs and every member's etcd log out of the state directory (removed
/// with the operator) into `$TMPDIR/robustness-seed-<seed>-<pid>/`.
fn keep_logs(op: &LocalOperator, seed: u64) -> std::io::Result<std::path::PathBuf> {
    let dest = std::env::temp_dir().join(format!("robustness-seed-{seed}-{}", std::process::id()));
    std::fs::create_dir_all(&dest)?;
    for entry in std::fs::read_dir(op.state_dir())?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("operator-") && name.ends_with(".log") {
            std::fs::copy(entry.path(), dest.join(&name))?;
        }
    }
    let members = crate::local_cluster::cluster_dir(op, CLUSTER);
    for entry in std::fs::read_dir(&members).into_iter().flatten().flatten() {
        let log = entry.path().join("etcd.log");
        if log.is_file() {
            let name = entry.file_name().to_string_lossy().into_owned();
            std::fs::copy(&log, dest.join(format!("{name}.etcd.log")))?;
        }
    }
    Ok(dest)
}

/// The scenario proper on a started operator: the cluster, the load, the faults, the checks.
#[allow(clippy::print_stdout)]
async fn drive(
    op: &mut LocalOperator,
    config: &ScenarioConfig,
    run_began: Instant,
) -> Result<Report, RobustnessError> {
    let config = config.clone();
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed);
    let proxies = PeerProxies::start(crate::local_cluster::cluster_dir(op, CLUSTER));
    tokio::task::block_in_place(|| {
        crate::kubectl::apply(op, &crate::local_cluster::cluster_yaml(CLUSTER, 3))
    })
    .map_err(RobustnessError::Apply)?;
    let status = {
        let began = Instant::now();
        loop {
            if let Some(s) = cluster_status(op)
                && crate::local_cluster::available(&s, 3)
            {
                break s;
            }
            if began.elapsed() > Duration::from_secs(120) {
                return Err(RobustnessError::Timeout {
                    what: format!("3 healthy members at first; operator log:\n{}", op.log_tail()),
                    timeout: Duration::from_secs(120),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let endpoints = crate::kubectl::client_endpoints(&status);
    let initial = faults::membership(&endpoints).await?;
    println!(
        "robustness: cluster up after {:.1}s: members {:?}, leader {}, peer proxies for {:?}",
        run_began.elapsed().as_secs_f64(),
        initial.members.values().collect::<Vec<_>>(),
        initial.leader_name().unwrap_or("?"),
        proxies.members()
    );
    let proxied = proxies.members();
    if let Some(missing) = initial.members.values().find(|m| !proxied.contains(m)) {
        return Err(RobustnessError::NoPeerProxy {
            member: missing.clone(),
        });
    }

    let sampler = super::status::StatusSampler::start(op.kubeconfig(), CLUSTER);
    let recorded = Recorded::start(&endpoints, config.load.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut report = Report {
        seed: config.seed,
        ..Report::default()
    };
    let mut known = initial.clone();
    let mut pids_settled: Option<BTreeMap<String, u32>> = None;
    let mut failure = None;
    let disks = SmallDisks::default();
    let backup_dir = op.state_dir().join("backups");
    let mut spec = SpecState::default();
    // Every round a spec change: each kind in turn, in an order the seed shuffles.
    let mut cycle = Vec::new();
    if config.operation_share >= 1.0 {
        cycle = config.operations.clone();
        cycle.shuffle(&mut rng);
    }
    'rounds: for i in 0..config.faults {
        // (No draw at all without operations, so the seeds of fault-only runs replay as before.)
        let operation = if !cycle.is_empty() {
            cycle.get(i % cycle.len()).copied()
        } else if config.operation_share > 0.0 && rng.random_bool(config.operation_share.min(1.0)) {
            config.operations.choose(&mut rng).copied()
        } else {
            None
        };
        if let Some(kind) = operation {
            for phase in operations::phases(kind, &mut spec, CLUSTER, &backup_dir) {
                let before = match faults::membership_retrying(&endpoints, Duration::from_secs(10)).await {
                    Ok(m) => m,
                    Err(e) => {
                        failure = Some(e);
                        break 'rounds;
                    }
                };
                let mut rig = Rig {
                    op: &mut *op,
                    proxies: &proxies,
                    disks: &disks,
                    endpoints: &endpoints,
                    config: &config,
                };
                // A watchdog: whatever the phase awaits, the run never hangs silently.
                let limit = phase_watchdog(&config);
                let phase_run = tokio::time::timeout(limit, run_phase(&mut rig, kind, &phase, &mut rng));
                let outcome = phase_run.await.unwrap_or_else(|_| {
                    Err(RobustnessError::Timeout {
                        what: format!("{} (the whole phase, fault and wait included)", phase.what),
                        timeout: limit,
                    })
                });
                let record = match outcome {
                    Ok(r) => r,
                    Err(e) => {
                        report.findings.push(format!(
                            "round {i} ({}, seed {}): {}",
                            phase.what,
                            config.seed,
                            etcd_operator_api::report::chain(&e)
                        ));
                        failure = Some(e);
                        break 'rounds;
                    }
                };
                println!(
                    "robustness: round {i}: {} overlapped by {}{}, done {:.1}s after the change, {:.2}s after the fault",
                    record.phase,
                    record.fault,
                    record
                        .after_step
                        .map(|s| format!(" after {s}"))
                        .unwrap_or_default(),
                    record.took.as_secs_f64(),
                    record.recovery.as_secs_f64()
                );
                report.spec_changes.push(record);
                match faults::membership_retrying(&endpoints, Duration::from_secs(10)).await {
                    Ok(after) => {
                        if !membership_as_expected(&before, &after, phase.replicas) {
                            report.findings.push(format!(
                                "round {i} ({}, seed {}): the members changed unexpectedly: {:?} -> {:?}",
                                phase.what, config.seed, before.members, after.members
                            ));
                        }
                        known = after;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break 'rounds;
                    }
                }
            }
            report.rounds += 1;
            // Spec changes restart members on purpose: no note about that.
            pids_settled = None;
            tokio::time::sleep(pick_ms(&mut rng, &config.pause_ms)).await;
            continue;
        }
        let Some(kind) = config.kinds.choose(&mut rng).copied() else {
            break;
        };
        if kind.fills_a_disk() {
            if let Err(e) = members_onto_tmpfs(op, &disks, &endpoints, &config, &mut report).await {
                failure = Some(e);
                break;
            }
            // Moving a member onto its tmpfs restarted it on purpose: no note about that.
            pids_settled = None;
        }
        let membership = match faults::membership_retrying(&endpoints, Duration::from_secs(10)).await {
            Ok(m) => m,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        // Each member's process before the fault: one restarted that the fault did not kill is noted.
        let pids_before = member_pids(op, &membership);
        if let Some(settled) = &pids_settled
            && *settled != pids_before
        {
            report.notes.push(format!(
                "between fault {} and fault {i}, with no fault, member processes changed: {settled:?} -> {pids_before:?}",
                i.saturating_sub(1)
            ));
        }
        let fault_began = Instant::now();
        let limit = phase_watchdog(&config);
        let injected = tokio::time::timeout(
            limit,
            inject(kind, op, &proxies, &disks, &membership, &mut rng, &config),
        )
        .await
        .unwrap_or_else(|_| {
            Err(RobustnessError::Timeout {
                what: format!("injecting {kind}"),
                timeout: limit,
            })
        });
        let (target, held) = match injected {
            Ok(t) => t,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        if let Err(e) = recover(op, &mut report, &config, (i, kind, &target, held)).await {
            failure = Some(e);
            break;
        }
        let samples = sampler.samples();
        let window_end = Instant::now();
        report
            .degraded_reasons
            .extend(super::status::degraded_reasons(&samples, fault_began, window_end));
        let must_tell = matches!(
            kind,
            FaultKind::FreezeFollower
                | FaultKind::FreezeLeader
                | FaultKind::IsolateFollower
                | FaultKind::IsolateLeader
        ) && held >= STATUS_MUST_TELL;
        if must_tell {
            report.status_checked += 1;
            if super::status::told(&samples, &target, fault_began, window_end) {
                report.status_told += 1;
            } else {
                let window: Vec<_> = samples
                    .iter()
                    .filter(|s| s.at >= fault_began && s.at <= window_end)
                    .collect();
                report.findings.push(format!(
                    "fault {i} ({kind} of {target} for {:.1}s, seed {}): the EtcdCluster's status never called {target} unhealthy ({} status samples in the {:.1}s from the fault to the recovery; unhealthy members they named: {:?})",
                    held.as_secs_f64(),
                    config.seed,
                    window.len(),
                    (window_end - fault_began).as_secs_f64(),
                    window.iter().flat_map(|s| s.unhealthy.iter()).collect::<BTreeSet<_>>()
                ));
            }
        }
        let pids_after = member_pids(op, &membership);
        let killed = matches!(kind, FaultKind::KillFollower | FaultKind::KillLeader);
        for (member, pid) in &pids_after {
            if pids_before.get(member) != Some(pid) && !(killed && *member == target) {
                report.notes.push(format!(
                    "fault {i} ({kind} of {target}): the operator restarted {member} ({:?} -> {pid})",
                    pids_before.get(member)
                ));
            }
        }
        pids_settled = Some(pids_after);
        // The member IDs stay as they were: every fault here keeps each member's data, so no member
        // needs replacing; removing one that was only frozen is what the issue forbids outright.
        if let Ok(now) = faults::membership(&endpoints).await
            && now.members != known.members
        {
            let gone: Vec<_> = known
                .members
                .iter()
                .filter(|(id, _)| !now.members.contains_key(id))
                .collect();
            report.findings.push(format!(
                "after fault {i} ({kind} of {target}, seed {}) the members changed: {:?} -> {:?} (removed {gone:?})",
                config.seed, known.members, now.members
            ));
            if kind.only_pauses() {
                report.wrongful_removals += gone.len();
            }
            known = now;
        }
        tokio::time::sleep(pick_ms(&mut rng, &config.pause_ms)).await;
    }

    // The members now (a scale may have replaced one of the first three).
    let endpoints = cluster_status(op)
        .map(|s| crate::kubectl::client_endpoints(&s))
        .filter(|e| !e.is_empty())
        .unwrap_or(endpoints);
    recorded.finish(&endpoints, &mut report).await?;
    // Events tell what the status told: each Degraded reason the status carried during the run
    // is a Warning Event on the EtcdCluster (local mode serves core/v1 Events).
    let samples = sampler.samples();
    if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
        report.degraded_reasons = super::status::degraded_reasons(&samples, first.at, last.at);
    }
    match events(op) {
        Ok(events) => report.findings.extend(super::status::events_missing(
            &report.degraded_reasons,
            &events,
            CLUSTER,
        )),
        Err(e) => report
            .findings
            .push(format!("the Events could not be listed: {e}")),
    }
    report.elapsed = run_began.elapsed();
    if let Some(e) = failure {
        println!("{}", report.figures());
        return Err(e);
    }
    Ok(report)
}
