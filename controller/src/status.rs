//! Status of an EtcdCluster from what was observed and decided: members, counts, leader,
//! conditions (`Available`, `Progressing`, `Degraded`, and kstatus's `Ready`, `Reconciling`,
//! `Stalled` derived from them) with stable reasons, upgrade progress, and
//! `observedGeneration`. Conditions of other types (written by other parts of the operator, e.g.
//! `BackupSucceeded`) are kept as they are. Pure.

use etcd_operator_api::status::{
    CONDITION_AVAILABLE, CONDITION_DEGRADED, CONDITION_PROGRESSING, CONDITION_READY, CONDITION_RECONCILING,
    CONDITION_STALLED, ClusterPhase, DowngradePhase, EtcdClusterStatus, MemberStatus, RolloutStatus,
    UpgradePhase, UpgradeStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::model::{is_healthy, quorum};
use crate::plan::{self, Observed, RollRecord, Step};
use crate::validated::{RolloutRecord, ValidatedCluster};
use etcd_operator_api::v1alpha2::EtcdCluster;

pub use crate::outcome::Outcome;

/// The condition types this module writes; every other type in the old status is kept.
const OWNED_CONDITIONS: [&str; 7] = [
    CONDITION_AVAILABLE,
    etcd_operator_api::status::CONDITION_MANAGED,
    CONDITION_PROGRESSING,
    CONDITION_DEGRADED,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
];

/// `Degraded` reasons no amount of waiting clears: a person must act (change the spec, raise
/// the quota, delete data, ask for a recovery). They make the cluster `Stalled` (kstatus:
/// Failed), as do failed steps that [`StepError::needs_a_person`](crate::outcome::StepError)
/// and a replacement awaiting its request.
const NEEDS_A_PERSON: [&str; 7] = [
    "UpgradeHalted",
    "VolumeExpansionNotAllowed",
    "RolloutHalted",
    "CorruptAlarm",
    "NoSpace",
    "DataLost",
    "RecoveryImpossible",
];

/// kstatus's conditions from the cluster's own (sigs.k8s.io/cli-utils kstatus, which Flux's
/// health checks and `dependsOn` use): `Ready` True only when the cluster is available,
/// nothing is in progress and nothing degraded; `Stalled` True when a person must act;
/// `Reconciling` True otherwise while not Ready (not while paused: nothing is being done; a
/// paused cluster is Ready when it serves).
fn kstatus_conditions(
    paused: bool,
    (available, available_reason, available_message): (bool, &str, &str),
    (progressing, progress_reason, progress_message): (bool, &str, &str),
    degraded: Option<(&str, &str)>,
    stalled: Option<(&str, &str)>,
    generation: Option<i64>,
) -> [Condition; 3] {
    let (ready, why, message) = if paused {
        // The user's choice, not a state to wait out: ready when it serves (a health check
        // must not wait for a cluster someone paused on purpose).
        match (available, degraded) {
            (false, _) => (false, available_reason, available_message),
            (true, Some((reason, message))) => (false, reason, message),
            (true, None) => (
                true,
                "Paused",
                "spec.paused is true: no changes are made; the cluster serves",
            ),
        }
    } else if let Some((reason, message)) = stalled {
        (false, reason, message)
    } else if !available {
        (false, available_reason, available_message)
    } else if progressing {
        (false, progress_reason, progress_message)
    } else if let Some((reason, message)) = degraded {
        (false, reason, message)
    } else {
        (true, "Reconciled", "the cluster is available at its spec")
    };
    let reconciling = !ready && !paused && stalled.is_none();
    [
        condition(CONDITION_READY, ready, why, message.to_owned(), generation),
        condition(
            CONDITION_RECONCILING,
            reconciling,
            if reconciling { why } else { "Idle" },
            if reconciling {
                message.to_owned()
            } else {
                "nothing in progress".to_owned()
            },
            generation,
        ),
        match stalled {
            Some((reason, message)) => {
                condition(CONDITION_STALLED, true, reason, message.to_owned(), generation)
            }
            None => condition(
                CONDITION_STALLED,
                false,
                "NothingBlocks",
                "nothing needs a person".into(),
                generation,
            ),
        },
    ]
}

/// `status.upgrade` for the roll to `version`; `None` for a record of another version (the spec
/// moved on: that roll no longer applies).
fn upgrade_status(
    roll: &RollRecord,
    version: &str,
    observed: &Observed,
    step: &Step,
    previous: Option<&UpgradeStatus>,
) -> Option<UpgradeStatus> {
    if roll.target != version {
        return None;
    }
    let phase = if roll.halted.is_some() {
        UpgradePhase::Halted
    } else if roll.complete || plan::roll_finished(version, observed) {
        UpgradePhase::Complete
    } else {
        UpgradePhase::Rolling
    };
    let (updated, total) = match &observed.etcd {
        Some(view) => (
            i32::try_from(
                view.members
                    .iter()
                    .filter(|m| plan::runs_version(view, m, version))
                    .count(),
            )
            .ok(),
            i32::try_from(view.members.len()).ok(),
        ),
        None => (
            previous.and_then(|p| p.updated_members),
            previous.and_then(|p| p.total_members),
        ),
    };
    let current = match (&phase, step) {
        (UpgradePhase::Halted, _) => roll.failed_member.clone(),
        (UpgradePhase::Complete, _) => None,
        (_, Step::ChangeVersion { name, .. }) => Some(name.clone()),
        _ => observed
            .runtime
            .iter()
            .find(|r| {
                r.config.as_ref().is_some_and(|c| {
                    c.version == version && c.previous_version.as_deref().is_some_and(|p| p != version)
                }) && observed.etcd.as_ref().is_none_or(|view| {
                    !view
                        .members
                        .iter()
                        .any(|m| m.peer_urls.contains(&r.peer_url) && plan::runs_version(view, m, version))
                })
            })
            .map(|r| r.name.clone()),
    };
    let downgrade = downgrade_phase(roll, &phase, observed, previous);
    Some(UpgradeStatus {
        from_version: Some(roll.from.clone()).filter(|f| !f.is_empty()),
        target_version: Some(roll.target.clone()),
        phase: Some(phase),
        snapshot: roll.snapshot.clone(),
        updated_members: updated,
        total_members: total,
        current_member: current,
        message: roll.halted.clone(),
        downgrade,
    })
}

/// Where the etcd downgrade of a roll to an older minor stands (`None` for any other roll): from
/// the storage versions the members report; the previous value when etcd did not answer.
fn downgrade_phase(
    roll: &RollRecord,
    phase: &UpgradePhase,
    observed: &Observed,
    previous: Option<&UpgradeStatus>,
) -> Option<DowngradePhase> {
    let minor = |v: &str| plan::version_key(v).get(..2).map(<[u64]>::to_vec);
    let target = minor(&roll.target)?;
    if minor(&roll.from).is_none_or(|from| from <= target) {
        return None;
    }
    if *phase == UpgradePhase::Complete {
        return Some(DowngradePhase::Complete);
    }
    let Some(view) = &observed.etcd else {
        return previous.and_then(|p| p.downgrade.clone());
    };
    let newer_storage = view.voters().any(|v| {
        v.status
            .as_ref()
            .and_then(|s| s.storage_version.as_deref())
            .and_then(minor)
            .is_some_and(|m| m > target)
    });
    Some(if newer_storage {
        DowngradePhase::Enabling
    } else {
        DowngradePhase::StorageDowngraded
    })
}

/// `status.rollout` for the rollout to `hash`; `None` for a record of another template (the
/// spec moved on: that rollout no longer applies).
fn rollout_status(record: &RolloutRecord, hash: &str, observed: &Observed) -> Option<RolloutStatus> {
    if record.target != hash {
        return None;
    }
    let phase = if record.halted.is_some() {
        UpgradePhase::Halted
    } else if record.complete {
        UpgradePhase::Complete
    } else {
        UpgradePhase::Rolling
    };
    let healthy = |r: &crate::model::RuntimeMember| {
        observed
            .etcd
            .as_ref()
            .and_then(|v| v.by_peer_url(&r.peer_url))
            .is_some_and(is_healthy)
    };
    let updated = observed
        .runtime
        .iter()
        .filter(|r| r.template_hash.as_ref().is_none_or(|h| h == hash) && healthy(r))
        .count();
    Some(RolloutStatus {
        template_hash: Some(record.target.clone()),
        phase: Some(phase.clone()),
        updated_members: i32::try_from(updated).ok(),
        total_members: i32::try_from(observed.runtime.len()).ok(),
        current_member: if phase == UpgradePhase::Complete {
            None
        } else {
            record.current_member.clone()
        },
        message: record.halted.clone(),
    })
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
        // Planned before the leader is removed, restarted (roll, renewal) or defragmented.
        Step::MoveLeader { from, to } => (
            "MovingLeader",
            format!("moving leadership from member {from:x} to {to:x} before working on the leader"),
        ),
        Step::RemoveFromEtcd { name, reason, .. } => ("RemovingMember", format!("removing {name}: {reason}")),
        Step::AnnounceReplacement {
            name,
            cause,
            awaiting_request,
            ..
        } => (
            "ReplacementPending",
            plan::replacement_note(name, cause, *awaiting_request),
        ),
        Step::DeleteRuntimeMember { name, reason } => {
            ("RemovingMember", format!("deleting {name}: {reason}"))
        }
        Step::WipeBootstrap { reason } => ("RetryingBootstrap", reason.clone()),
        Step::SnapshotBeforeUpgrade { from, to } => (
            "Upgrading",
            format!("taking a snapshot before the roll from etcd {from} to {to}"),
        ),
        Step::ChangeVersion { name, from, to } => (
            "Upgrading",
            format!("restarting member {name} on etcd {to} (was {from})"),
        ),
        Step::RecoverQuorum { survivor, lost, .. } => (
            "RecoveringQuorum",
            format!(
                "rebuilding the cluster from member {survivor} as asked; data of {} given up",
                if lost.is_empty() {
                    "no member".to_owned()
                } else {
                    lost.join(", ")
                }
            ),
        ),
        Step::ReclaimSpace { alarms } => (
            "ReclaimingSpace",
            format!(
                "NOSPACE alarm on {} member(s): compacting, defragmenting one member at a time, then disarming",
                alarms.len()
            ),
        ),
        Step::Defragment { name, trigger, .. } => (
            "Defragmenting",
            format!("defragmenting member {name} ({trigger})"),
        ),
        Step::RenewCertificates { name, reason } => (
            "RotatingCertificates",
            format!("restarting member {name} on new certificates: {reason}"),
        ),
        Step::EnableDowngrade { version } => (
            "Downgrading",
            format!(
                "enabling etcd's downgrade to {version}: the cluster and storage versions go down before members restart on {version}"
            ),
        ),
        Step::AdvanceAuthority { to, reason, .. } => (
            "RotatingCertificateAuthority",
            format!(
                "{reason}; {}",
                match to {
                    crate::tls::authority::AuthorityPhase::Trusting =>
                        "phase 1 of 3: every member restarts trusting the old and the new CA",
                    crate::tls::authority::AuthorityPhase::Reissuing =>
                        "phase 2 of 3: every member restarts on certificates of the new CA",
                    crate::tls::authority::AuthorityPhase::Steady =>
                        "phase 3 of 3: every member restarts trusting only the new CA",
                }
            ),
        ),
        Step::RollBack { name, to, reason, .. } => (
            "UpgradeRolledBack",
            format!("{reason}; starting {name} again on etcd {to}"),
        ),
        Step::HaltUpgrade { reason, .. } => ("UpgradeHalted", reason.clone()),
        Step::RollTemplate { name, .. } => (
            "RollingTemplate",
            format!("re-creating member {name} on the changed member template (its data kept)"),
        ),
        Step::HaltRollout { reason, .. } => ("RolloutHalted", reason.clone()),
        Step::ExpandVolume { name, from, to } => (
            "ExpandingVolumes",
            format!(
                "growing the volume of member {name} from {} MiB to {} MiB",
                from >> 20,
                to >> 20
            ),
        ),
        Step::FinishVolumeResize { name } => (
            "ExpandingVolumes",
            format!("restarting member {name} so that its grown volume's filesystem is resized"),
        ),
        Step::Wait { reason } => ("Waiting", reason.to_string()),
        Step::Idle => ("Reconciled", "the cluster matches the spec".into()),
    }
}

/// The new status. `previous` keeps transition times of unchanged conditions, the cluster ID
/// when etcd did not answer, and the last backup.
pub fn compute(spec: &ValidatedCluster, observed: &Observed, outcome: &Outcome) -> EtcdClusterStatus {
    let none = EtcdClusterStatus::default();
    let previous = spec.status.as_ref().unwrap_or(&none);
    let generation = spec.generation;
    let name = spec.cluster.name.clone();
    let paused = spec.paused;
    let mut status = EtcdClusterStatus {
        selector: Some(etcd_operator_api::naming::selector(&name)),
        last_backup: previous.last_backup.clone(),
        recovery: match (&outcome.step, &outcome.error) {
            (
                Step::RecoverQuorum {
                    survivor,
                    lost,
                    applied_index,
                    request,
                },
                None,
            ) => Some(Box::new(etcd_operator_api::status::RecoveryStatus {
                request: request.clone(),
                survivor: survivor.clone(),
                lost_members: lost.clone(),
                survivor_applied_index: applied_index.and_then(|i| i64::try_from(i).ok()),
                time: Some(Time(
                    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
                        .unwrap_or_else(|_| jiff::Timestamp::now()),
                )),
            })),
            _ => previous.recovery.clone(),
        },
        cluster_id: previous.cluster_id.clone(),
        maintenance: outcome
            .maintenance
            .clone()
            .map(Box::new)
            .or_else(|| previous.maintenance.clone()),
        ..Default::default()
    };
    let version = spec.version.clone();
    status.upgrade = outcome
        .roll
        .as_ref()
        .and_then(|roll| {
            upgrade_status(
                roll,
                &version,
                observed,
                &outcome.step,
                previous.upgrade.as_deref(),
            )
        })
        .map(Box::new);
    status.rollout = match (&outcome.rollout, &spec.template_hash) {
        (Some(record), Some(hash)) => rollout_status(record, hash, observed).map(Box::new),
        _ => None,
    };
    let rolling = status
        .upgrade
        .as_ref()
        .is_some_and(|u| u.phase == Some(UpgradePhase::Rolling))
        || status
            .rollout
            .as_ref()
            .is_some_and(|r| r.phase == Some(UpgradePhase::Rolling));

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
                        db_size: m.status.as_ref().and_then(|s| i64::try_from(s.db_size).ok()),
                        db_size_in_use: m
                            .status
                            .as_ref()
                            .and_then(|s| i64::try_from(s.db_size_in_use).ok()),
                        alarms: {
                            let alarms: Vec<String> = view
                                .alarms
                                .iter()
                                .filter(|a| a.member == m.id)
                                .map(|a| a.alarm.as_str().to_owned())
                                .collect();
                            (!alarms.is_empty()).then_some(alarms)
                        },
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
            if view
                .alarms
                .iter()
                .any(|a| a.alarm == crate::model::AlarmKind::NoSpace)
            {
                degraded = Some((
                    "NoSpaceAlarm",
                    "etcd raised NOSPACE and refuses writes: the backend quota is exceeded; the operator compacts, defragments and disarms it".into(),
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
    let halted = status
        .upgrade
        .as_ref()
        .filter(|u| u.phase == Some(UpgradePhase::Halted))
        .and_then(|u| u.message.clone());
    let rollout_halted = status
        .rollout
        .as_ref()
        .filter(|r| r.phase == Some(UpgradePhase::Halted))
        .map(|r| r.message.clone().unwrap_or_default());
    // A step under way (a process stopping, a certificate being issued) is progress, not a
    // degradation: the Progressing condition says what it waits for.
    if let Some(error) = outcome.error.as_ref().filter(|e| !e.is_waiting()) {
        degraded = Some((error.reason(), etcd_operator_api::report::chain(error)));
    } else if let Some(message) = halted {
        degraded = Some((
            "UpgradeHalted",
            format!(
                "the roll to etcd {version} halted: {message}; no further member is touched until spec.version changes"
            ),
        ));
    } else if let Some(message) = rollout_halted {
        degraded = Some((
            "RolloutHalted",
            format!(
                "the rollout of the changed member template halted: {message}; no further member is re-created until the template (spec.podTemplate, spec.repository, spec.maintenance) changes again"
            ),
        ));
    } else if let Step::Wait { reason } = &outcome.step
        && reason.degrades()
    {
        degraded = Some((reason.code(), reason.to_string()));
    } else if let Step::AnnounceReplacement { .. } = &outcome.step {
        degraded = Some(("ReplacementPending", step_reason(&outcome.step).1));
    } else if !observed.timing.announced.is_empty() {
        // Announced in an earlier round and not done yet (waiting for the request, or for the
        // next round to remove it).
        let notes: Vec<&str> = observed
            .timing
            .announced
            .iter()
            .map(|(_, n)| n.as_str())
            .collect();
        degraded = Some(("ReplacementPending", notes.join("; ")));
    }

    let (progress_reason, progress_message) = step_reason(&outcome.step);
    let progressing = (!matches!(outcome.step, Step::Idle) || rolling) && !paused;
    // What needs a person, by the kind of the problem (never its text).
    let stalled: Option<(&str, String)> = match (&outcome.error, &outcome.step) {
        (Some(error), _) if error.needs_a_person() => {
            Some((error.code(), etcd_operator_api::report::chain(error)))
        }
        (
            None,
            Step::Wait {
                reason: reason @ plan::WaitReason::ReplacementAwaitingRequest { .. },
            },
        ) => Some(("ReplacementAwaitingRequest", reason.to_string())),
        _ => degraded
            .as_ref()
            .filter(|(reason, _)| NEEDS_A_PERSON.contains(reason))
            .map(|(reason, message)| (*reason, message.clone())),
    };
    let kstatus = kstatus_conditions(
        paused,
        (available, available_reason, &available_message),
        (progressing, progress_reason, &progress_message),
        degraded.as_ref().map(|(r, m)| (*r, m.as_str())),
        stalled.as_ref().map(|(r, m)| (*r, m.as_str())),
        generation,
    );
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
    conditions.extend(kstatus);
    // Keep the transition time of a condition whose status did not change.
    for c in &mut conditions {
        if let Some(old) = previous.conditions.iter().flatten().find(|o| o.type_ == c.type_)
            && old.status == c.status
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
    }
    // Conditions other parts of the operator own (e.g. `BackupSucceeded`) are kept unchanged.
    conditions.extend(
        previous
            .conditions
            .iter()
            .flatten()
            .filter(|c| !OWNED_CONDITIONS.contains(&c.type_.as_str()))
            .cloned(),
    );
    status.conditions = Some(conditions);
    status.phase = Some(if paused {
        ClusterPhase::Paused
    } else if observed.etcd.is_none() && previous.cluster_id.is_none() {
        ClusterPhase::Creating
    } else if !available && previous.cluster_id.is_some() && observed.etcd.is_none() {
        ClusterPhase::Failed
    } else if rolling {
        ClusterPhase::Upgrading
    } else if progressing {
        ClusterPhase::Scaling
    } else {
        ClusterPhase::Running
    });
    // Written last: the status above describes this generation.
    status.observed_generation = generation;
    status
}

/// The status a new cluster starts with, written by the API server at create when the
/// controller in the same deployment manages the cluster: what the controller's first reconcile
/// computes while nothing runs for the cluster yet (no member, no answer from etcd), with the
/// step the planner takes on that view. When the first reconcile arrives at the same status it
/// writes nothing, so a new cluster costs one write less and shows its phase and conditions from
/// the start (as kube-apiserver gives a new Pod its `Pending` phase). `None` for a cluster the
/// first reconcile must look into first: one that does not validate, or that asks for a restore
/// (the snapshot is resolved before anything is said); the server then leaves
/// `observedGeneration: 0` (not looked at yet).
pub fn initial(obj: &EtcdCluster, thresholds: &plan::Thresholds) -> Option<EtcdClusterStatus> {
    if obj
        .status
        .as_ref()
        .is_some_and(|s| s.observed_generation.unwrap_or(0) > 0)
    {
        // Not new: this is the controller's to say.
        return None;
    }
    let view = ValidatedCluster::new(obj).ok()?;
    if view.restore_request.is_some() {
        return None;
    }
    let observed = Observed {
        runtime: Vec::new(),
        etcd: None,
        timing: plan::Timing::default(),
        authority: None,
    };
    // The names the planner would give new members appear in no status message of a step taken
    // on an empty view (a bootstrap says how many); placeholders keep them apart.
    let mut n = 0_usize;
    let step = plan::plan(&view, &observed, thresholds, &mut || {
        n += 1;
        format!("member-{n}")
    });
    let outcome = Outcome {
        step,
        ..Outcome::idle()
    };
    Some(compute(&view, &observed, &outcome))
}

/// Whether two statuses differ in anything but condition timestamps.
/// Field by field, without copying either (it runs in every reconcile); the destructuring names
/// every field, so a field added to the status cannot be left out.
pub fn differs(a: &EtcdClusterStatus, b: &EtcdClusterStatus) -> bool {
    let EtcdClusterStatus {
        phase,
        conditions,
        observed_generation,
        replicas,
        ready_replicas,
        members,
        cluster_id,
        leader,
        current_version,
        client_endpoints,
        selector,
        last_backup,
        upgrade,
        rollout,
        recovery,
        maintenance,
    } = a;
    let same_conditions = match (conditions, &b.conditions) {
        (Some(x), Some(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|(c, d)| {
                    let Condition {
                        type_,
                        status,
                        reason,
                        message,
                        observed_generation,
                        last_transition_time: _,
                    } = c;
                    *type_ == d.type_
                        && *status == d.status
                        && *reason == d.reason
                        && *message == d.message
                        && *observed_generation == d.observed_generation
                })
        }
        (None, None) => true,
        _ => false,
    };
    !(same_conditions
        && *phase == b.phase
        && *observed_generation == b.observed_generation
        && *replicas == b.replicas
        && *ready_replicas == b.ready_replicas
        && *members == b.members
        && *cluster_id == b.cluster_id
        && *leader == b.leader
        && *current_version == b.current_version
        && *client_endpoints == b.client_endpoints
        && *selector == b.selector
        && *last_backup == b.last_backup
        && *upgrade == b.upgrade
        && *rollout == b.rollout
        && *recovery == b.recovery
        && *maintenance == b.maintenance)
}

/// `ours` on top of the freshest stored status: what other writers own there (`lastBackup`, and
/// conditions of types this module does not write) is taken from `fresh`, everything else from
/// `ours`. Applied before every status write so a write made since `ours` was computed survives.
pub fn rebase(ours: &EtcdClusterStatus, fresh: Option<&EtcdClusterStatus>) -> EtcdClusterStatus {
    let Some(fresh) = fresh else {
        return ours.clone();
    };
    let mut status = ours.clone();
    status.last_backup = fresh.last_backup.clone();
    let mut conditions: Vec<Condition> = ours
        .conditions
        .iter()
        .flatten()
        .filter(|c| OWNED_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    conditions.extend(
        fresh
            .conditions
            .iter()
            .flatten()
            .filter(|c| !OWNED_CONDITIONS.contains(&c.type_.as_str()))
            .cloned(),
    );
    status.conditions = Some(conditions);
    status
}

/// The JSON patch that writes `status` whole, but only onto the object at `resource_version`:
/// the API server answers 409 Conflict when the object changed since (e.g. the backup controller
/// wrote `lastBackup`), instead of the write silently dropping that change.
pub fn status_patch(status: &EtcdClusterStatus, resource_version: &str) -> serde_json::Value {
    serde_json::json!([
        {"op": "add", "path": "/metadata/resourceVersion", "value": resource_version},
        // `add` replaces the whole status, so fields that went away are removed.
        {"op": "add", "path": "/status", "value": status},
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::compute`] for a plain object.
    fn compute(cluster: &EtcdCluster, observed: &Observed, outcome: &Outcome) -> EtcdClusterStatus {
        super::compute(&ValidatedCluster::for_test(cluster.clone()), observed, outcome)
    }
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
                ..Default::default()
            }),
        }
    }

    fn cluster() -> EtcdCluster {
        let mut c = EtcdCluster::default();
        c.metadata.name = Some("demo".into());
        c.metadata.generation = Some(4);
        c
    }

    /// (status, reason) of `Ready`, `Reconciling`, `Stalled`.
    fn kstatus(s: &EtcdClusterStatus) -> [(&str, &str); 3] {
        ["Ready", "Reconciling", "Stalled"].map(|t| {
            let c = get(s, t);
            (c.status.as_str(), c.reason.as_str())
        })
    }

    #[test]
    fn kstatus_conditions_while_forming_and_paused() {
        let nothing = Observed {
            authority: None,
            runtime: vec![],
            etcd: None,
            timing: Timing::default(),
        };
        let forming = Outcome {
            step: Step::ReserveForBootstrap {
                names: vec!["a".into()],
            },
            error: None,
            roll: None,
            rollout: None,
            maintenance: None,
        };
        let s = compute(&cluster(), &nothing, &forming);
        assert_eq!(
            kstatus(&s),
            [
                ("False", "Bootstrapping"),
                ("True", "Bootstrapping"),
                ("False", "NothingBlocks")
            ]
        );
        let mut paused = cluster();
        paused.spec.paused = Some(true);
        // Paused before it formed: not ready (nothing serves), but nobody is working on it.
        let s = compute(&paused, &nothing, &Outcome::idle());
        assert_eq!(
            kstatus(&s),
            [
                ("False", "Bootstrapping"),
                ("False", "Idle"),
                ("False", "NothingBlocks")
            ]
        );
        // Paused while serving: ready, so health checks do not wait on a deliberate pause.
        let serving = Observed {
            authority: None,
            runtime: vec![],
            etcd: Some(EtcdView {
                cluster_id: 1,
                members: vec![member(1, "a", true)],
                leader: 1,
                alarms: Vec::new(),
            }),
            timing: Timing::default(),
        };
        let held = compute(&paused, &serving, &Outcome::idle());
        assert_eq!(
            kstatus(&held),
            [("True", "Paused"), ("False", "Idle"), ("False", "NothingBlocks")]
        );
        // Written again unchanged, a condition keeps its transition time.
        let mut again = paused.clone();
        again.status = Some(s.clone());
        let later = compute(&again, &nothing, &Outcome::idle());
        assert_eq!(
            get(&later, "Ready").last_transition_time,
            get(&s, "Ready").last_transition_time
        );
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
            authority: None,
            runtime: vec![],
            etcd: Some(EtcdView {
                cluster_id: 0xabc,
                members: vec![member(1, "a", true), member(2, "b", true), member(3, "c", true)],
                leader: 1,
                alarms: Vec::new(),
            }),
            timing: Timing::default(),
        };
        let s = compute(
            &cluster(),
            &observed,
            &Outcome {
                step: Step::Idle,
                error: None,
                roll: None,
                rollout: None,
                maintenance: None,
            },
        );
        assert_eq!(get(&s, "Available").status, "True");
        assert_eq!(get(&s, "Progressing").status, "False");
        assert_eq!(get(&s, "Degraded").status, "False");
        assert_eq!(
            kstatus(&s),
            [
                ("True", "Reconciled"),
                ("False", "Idle"),
                ("False", "NothingBlocks")
            ]
        );
        assert_eq!(get(&s, "Ready").observed_generation, Some(4));
        assert_eq!(s.ready_replicas, Some(3));
        assert_eq!(s.leader.as_deref(), Some("a"));
        assert_eq!(s.cluster_id.as_deref(), Some("abc"));
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(s.client_endpoints.as_ref().map(Vec::len), Some(3));
        assert_eq!(s.phase, Some(ClusterPhase::Running));
    }

    #[test]
    fn a_pending_replacement_is_degraded_with_its_own_reason_until_done() {
        let mut observed = Observed {
            authority: None,
            runtime: vec![],
            etcd: Some(EtcdView {
                cluster_id: 1,
                members: vec![member(1, "a", true), member(2, "b", true), member(3, "c", false)],
                leader: 1,
                alarms: Vec::new(),
            }),
            timing: Timing::default(),
        };
        let cause = crate::plan::ReplacementCause::DataGone {
            reason: "its data directory is gone".into(),
        };
        let announce = Outcome {
            step: Step::AnnounceReplacement {
                id: 3,
                name: "c".into(),
                cause: cause.clone(),
                awaiting_request: false,
            },
            error: None,
            roll: None,
            rollout: None,
            maintenance: None,
        };
        let s = compute(&cluster(), &observed, &announce);
        assert_eq!(get(&s, "Progressing").reason, "ReplacementPending");
        // Automatic: the controller is on it.
        assert_eq!(
            kstatus(&s),
            [
                ("False", "ReplacementPending"),
                ("True", "ReplacementPending"),
                ("False", "NothingBlocks")
            ]
        );
        let degraded = get(&s, "Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "ReplacementPending")
        );
        assert!(
            degraded.message.contains("member c will be replaced"),
            "{}",
            degraded.message
        );
        // A later round (announced, something else planned) still says so.
        observed.timing.announced = vec![("c".into(), crate::plan::replacement_note("c", &cause, false))];
        let s = compute(&cluster(), &observed, &Outcome::idle());
        assert_eq!(get(&s, "Degraded").reason, "ReplacementPending");
        // Manual: the wait says how to ask.
        let wait = Outcome {
            step: Step::Wait {
                reason: crate::plan::WaitReason::ReplacementAwaitingRequest {
                    name: "c".into(),
                    cause,
                },
            },
            error: None,
            roll: None,
            rollout: None,
            maintenance: None,
        };
        let s = compute(&cluster(), &observed, &wait);
        assert_eq!(get(&s, "Degraded").reason, "ReplacementPending");
        // Manual: stalled until someone asks, and says how.
        assert_eq!(
            kstatus(&s),
            [
                ("False", "ReplacementAwaitingRequest"),
                ("False", "Idle"),
                ("True", "ReplacementAwaitingRequest")
            ]
        );
        assert!(
            get(&s, "Stalled")
                .message
                .contains("etcd.operator.dev/replace-member=c")
        );
        assert!(
            get(&s, "Degraded")
                .message
                .contains("etcd.operator.dev/replace-member=c")
        );
        // Done: nothing announced any more.
        observed.timing.announced.clear();
        let s = compute(&cluster(), &observed, &Outcome::idle());
        assert_eq!(get(&s, "Degraded").reason, "MembersUnhealthy");
    }

    #[test]
    fn lost_quorum_is_degraded_and_unavailable() {
        let observed = Observed {
            authority: None,
            runtime: vec![],
            etcd: Some(EtcdView {
                cluster_id: 1,
                members: vec![member(1, "a", true), member(2, "b", false), member(3, "c", false)],
                leader: 1,
                alarms: Vec::new(),
            }),
            timing: Timing::default(),
        };
        let s = compute(
            &cluster(),
            &observed,
            &Outcome {
                step: Step::Wait {
                    reason: crate::plan::WaitReason::ReplacementWouldCostQuorum {
                        dead: "member b has been unhealthy for 120s".into(),
                    },
                },
                error: None,
                roll: None,
                rollout: None,
                maintenance: None,
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
                error: Some(crate::outcome::StepError::LeaderUnreachable { id: 1 }),
                roll: None,
                rollout: None,
                maintenance: None,
            },
        );
        assert_eq!(get(&failed, "Degraded").reason, "StepFailed");
        // A member's process stopping during a roll is progress, not a failure.
        let under_way = compute(
            &cluster(),
            &observed,
            &Outcome {
                step: Step::RollTemplate {
                    name: "m".into(),
                    from: None,
                    to: "h".into(),
                },
                error: Some(crate::outcome::StepError::Runtime(
                    crate::runtime::RuntimeError::Waiting {
                        member: "m".into(),
                        detail: "its etcd process (pid 7) is stopping".into(),
                    },
                )),
                roll: None,
                rollout: None,
                maintenance: None,
            },
        );
        // Degraded says what is observed (two members down here), not the step's wait.
        assert_eq!(get(&under_way, "Degraded").reason, "MembersUnhealthy");
        assert!(!get(&under_way, "Degraded").message.contains("stopping"));
        assert_eq!(get(&under_way, "Progressing").status, "True");
        let restore = crate::runtime::RuntimeError::Restore {
            member: "m".into(),
            source: Box::new(crate::restore::RestoreError::Source(
                "EtcdBackup b1 was not found".into(),
            )),
        };
        let refused = compute(
            &cluster(),
            &observed,
            &Outcome {
                step: Step::Idle,
                error: Some(crate::outcome::StepError::Runtime(restore)),
                roll: None,
                rollout: None,
                maintenance: None,
            },
        );
        assert_eq!(get(&refused, "Degraded").reason, "RestoreFailed");
        assert!(get(&refused, "Degraded").message.contains("b1 was not found"));
        // A backup that is not there (yet) may come: retried, not stalled. A snapshot that is
        // not the one backed up never gets better: stalled.
        assert_eq!(get(&refused, "Stalled").status, "False");
        assert_eq!(get(&refused, "Reconciling").status, "True");
        let tampered = crate::runtime::RuntimeError::Restore {
            member: "m".into(),
            source: Box::new(crate::restore::RestoreError::ChecksumMismatch {
                location: "s3://b/k".into(),
                expected: "aa".into(),
                actual: "bb".into(),
            }),
        };
        let stalled = compute(
            &cluster(),
            &observed,
            &Outcome {
                step: Step::Idle,
                error: Some(crate::outcome::StepError::Runtime(tampered)),
                roll: None,
                rollout: None,
                maintenance: None,
            },
        );
        assert_eq!(
            kstatus(&stalled),
            [
                ("False", "RestoreFailed"),
                ("False", "Idle"),
                ("True", "RestoreFailed")
            ]
        );
        // Retried, so not stalled; Ready names the bigger problem first: no quorum.
        assert_eq!(
            kstatus(&failed),
            [
                ("False", "NoQuorum"),
                ("True", "NoQuorum"),
                ("False", "NothingBlocks")
            ]
        );
    }

    #[test]
    fn the_degraded_reason_comes_from_the_wait_reasons_type_not_its_text() {
        let mut formed = cluster();
        formed.status = Some(EtcdClusterStatus {
            cluster_id: Some("abc".into()),
            ..Default::default()
        });
        let silent = Observed {
            authority: None,
            runtime: vec![],
            etcd: None,
            timing: Timing::default(),
        };
        let wait = |reason| Outcome {
            step: Step::Wait { reason },
            ..Outcome::idle()
        };
        let lost = compute(&formed, &silent, &wait(crate::plan::WaitReason::QuorumLost));
        assert_eq!(get(&lost, "Degraded").reason, "NoQuorum");
        assert!(get(&lost, "Degraded").message.contains("lost quorum"));
        let gone = compute(&formed, &silent, &wait(crate::plan::WaitReason::DataLost));
        assert_eq!(get(&gone, "Degraded").reason, "DataLost");
        // A wait whose message mentions quorum but that puts nothing at risk degrades nothing.
        let healthy = Observed {
            authority: None,
            runtime: vec![],
            etcd: Some(EtcdView {
                cluster_id: 1,
                members: vec![member(1, "a", true), member(2, "b", true), member(3, "c", true)],
                leader: 1,
                alarms: Vec::new(),
            }),
            timing: Timing::default(),
        };
        let catching_up = compute(
            &cluster(),
            &healthy,
            &wait(crate::plan::WaitReason::LearnerCatchingUp {
                name: "quorum-1".into(),
            }),
        );
        assert_eq!(get(&catching_up, "Degraded").status, "False");
        assert_eq!(get(&catching_up, "Progressing").reason, "Waiting");
    }

    #[test]
    fn transition_times_survive_unchanged_conditions() {
        let observed = Observed {
            authority: None,
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
                roll: None,
                rollout: None,
                maintenance: None,
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
                roll: None,
                rollout: None,
                maintenance: None,
            },
        );
        assert_eq!(
            get(&second, "Available").last_transition_time,
            Time(jiff::Timestamp::UNIX_EPOCH)
        );
        assert!(!differs(&first, &second));
        assert_eq!(second.phase, Some(ClusterPhase::Creating));
    }

    fn three_on(version: &str) -> Observed {
        let mut members = vec![member(1, "a", true), member(2, "b", true), member(3, "c", true)];
        for m in &mut members {
            if let Some(s) = m.status.as_mut() {
                s.version = version.into();
            }
        }
        Observed {
            authority: None,
            runtime: vec![],
            etcd: Some(EtcdView {
                cluster_id: 1,
                members,
                leader: 1,
                alarms: Vec::new(),
            }),
            timing: Timing::default(),
        }
    }

    #[test]
    fn a_defragmentation_is_progress_and_its_record_is_kept_across_reconciles() {
        let step = Step::Defragment {
            name: "b".into(),
            id: 2,
            trigger: crate::plan::DefragTrigger::Fragmentation,
            db_size: 10,
            db_size_in_use: 2,
        };
        let now = chrono::Utc::now();
        let record =
            crate::maintenance::record(None, "b", crate::plan::DefragTrigger::Fragmentation, 10, 2, now);
        let s = compute(
            &cluster(),
            &three_on("3.5.1"),
            &Outcome {
                step,
                maintenance: Some(record.clone()),
                ..Outcome::idle()
            },
        );
        let progressing = get(&s, "Progressing");
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("True", "Defragmenting")
        );
        assert!(
            progressing.message.contains("member b"),
            "{}",
            progressing.message
        );
        assert_eq!(s.maintenance.as_deref(), Some(&record));
        // A later reconcile that did not touch it keeps the record.
        let mut c = cluster();
        c.status = Some(s);
        let later = compute(&c, &three_on("3.5.1"), &Outcome::idle());
        assert_eq!(later.maintenance, Some(Box::new(record)));
    }

    #[test]
    fn conditions_of_other_owners_are_kept() {
        let mut c = cluster();
        let backup = Condition {
            type_: "BackupSucceeded".into(),
            status: "False".into(),
            reason: "UploadFailed".into(),
            message: "s3: denied".into(),
            observed_generation: Some(3),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        };
        c.status = Some(EtcdClusterStatus {
            conditions: Some(vec![
                condition(CONDITION_AVAILABLE, false, "NoQuorum", "x".into(), Some(3)),
                backup.clone(),
            ]),
            ..Default::default()
        });
        let s = compute(
            &c,
            &three_on("3.5.1"),
            &Outcome {
                step: Step::Idle,
                error: None,
                roll: None,
                rollout: None,
                maintenance: None,
            },
        );
        assert_eq!(get(&s, "BackupSucceeded"), &backup);
        assert_eq!(get(&s, "Available").status, "True");
        let types: Vec<&str> = s.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                "Available",
                "Progressing",
                "Degraded",
                "Ready",
                "Reconciling",
                "Stalled",
                "BackupSucceeded"
            ]
        );
    }

    #[test]
    fn a_template_rollout_shows_progress_and_a_halt_needs_a_person() {
        let mut view = ValidatedCluster::for_test(cluster());
        view.template_hash = Some("new".into());
        let mut observed = three_on("3.5.1");
        observed.runtime = [("a", "new"), ("b", "old"), ("c", "old")]
            .iter()
            .map(|(n, h)| crate::model::RuntimeMember {
                name: (*n).into(),
                peer_url: format!("http://{n}:2380"),
                client_url: format!("http://{n}:2379"),
                config: None,
                liveness: crate::model::Liveness::Running,
                certificates: None,
                restarts: 0,
                template_hash: Some((*h).into()),
                volume: None,
                created: None,
            })
            .collect();
        let record = RolloutRecord {
            target: "new".into(),
            current_member: Some("a".into()),
            ..RolloutRecord::default()
        };
        let outcome = |step: Step, record: &RolloutRecord| Outcome {
            step,
            error: None,
            roll: None,
            rollout: Some(record.clone()),
            maintenance: None,
        };
        let s = super::compute(
            &view,
            &observed,
            &outcome(
                Step::RollTemplate {
                    name: "b".into(),
                    from: Some("old".into()),
                    to: "new".into(),
                },
                &record,
            ),
        );
        let r = s.rollout.clone().unwrap();
        assert_eq!(r.phase, Some(UpgradePhase::Rolling));
        assert_eq!(r.template_hash.as_deref(), Some("new"));
        assert_eq!((r.updated_members, r.total_members), (Some(1), Some(3)));
        assert_eq!(get(&s, "Progressing").reason, "RollingTemplate");
        assert_eq!(s.phase, Some(ClusterPhase::Upgrading));
        assert_eq!(RolloutRecord::from_status(Some(&s)), Some(record.clone()));

        // Halted: Degraded and Stalled with the reason, until the template changes.
        let halted = RolloutRecord {
            halted: Some("member a did not become healthy".into()),
            ..record.clone()
        };
        let s = super::compute(&view, &observed, &outcome(Step::Idle, &halted));
        assert_eq!(s.rollout.as_ref().unwrap().phase, Some(UpgradePhase::Halted));
        assert_eq!(get(&s, "Degraded").reason, "RolloutHalted");
        assert_eq!(get(&s, "Stalled").status, "True");
        assert_eq!(RolloutRecord::from_status(Some(&s)), Some(halted.clone()));
        // A record of another template is not reported.
        view.template_hash = Some("newer".into());
        assert_eq!(
            super::compute(&view, &observed, &outcome(Step::Idle, &halted)).rollout,
            None
        );
    }

    #[test]
    fn a_roll_shows_progress_then_completes() {
        let mut c = cluster();
        c.spec.version = Some("3.5.1".into());
        let roll = RollRecord {
            from: "3.5.0".into(),
            target: "3.5.1".into(),
            snapshot: Some("/s/pre-upgrade-3.5.0-to-3.5.1-9.db".into()),
            ..Default::default()
        };
        let mut observed = three_on("3.5.0");
        if let Some(v) = observed.etcd.as_mut()
            && let Some(s) = v.members[0].status.as_mut()
        {
            s.version = "3.5.1".into();
        }
        let s = compute(
            &c,
            &observed,
            &Outcome {
                step: Step::ChangeVersion {
                    name: "b".into(),
                    from: "3.5.0".into(),
                    to: "3.5.1".into(),
                },
                error: None,
                roll: Some(roll.clone()),
                rollout: None,
                maintenance: None,
            },
        );
        let u = s.upgrade.clone().unwrap();
        assert_eq!(u.phase, Some(UpgradePhase::Rolling));
        assert_eq!((u.updated_members, u.total_members), (Some(1), Some(3)));
        assert_eq!(u.current_member.as_deref(), Some("b"));
        assert_eq!(u.snapshot, roll.snapshot);
        assert_eq!(s.phase, Some(ClusterPhase::Upgrading));
        assert_eq!(get(&s, "Progressing").reason, "Upgrading");
        assert_eq!(s.current_version.as_deref(), Some("3.5.0"));
        assert_eq!(RollRecord::from_status(Some(&s)), Some(roll.clone()));

        let done = compute(
            &c,
            &three_on("3.5.1"),
            &Outcome {
                step: Step::Idle,
                error: None,
                roll: Some(roll),
                rollout: None,
                maintenance: None,
            },
        );
        let u = done.upgrade.clone().unwrap();
        assert_eq!(u.phase, Some(UpgradePhase::Complete));
        assert_eq!(u.updated_members, Some(3));
        assert_eq!(done.phase, Some(ClusterPhase::Running));
        assert!(RollRecord::from_status(Some(&done)).unwrap().complete);
    }

    #[test]
    fn a_halted_roll_is_degraded_until_the_spec_moves_on() {
        let mut c = cluster();
        c.spec.version = Some("3.5.2".into());
        let roll = RollRecord {
            from: "3.5.1".into(),
            target: "3.5.2".into(),
            snapshot: None,
            halted: Some("member a did not become healthy on etcd 3.5.2 within 20s".into()),
            failed_member: Some("a".into()),
            complete: false,
        };
        let outcome = Outcome {
            step: Step::Idle,
            error: None,
            roll: Some(roll.clone()),
            rollout: None,
            maintenance: None,
        };
        let s = compute(&c, &three_on("3.5.1"), &outcome);
        let degraded = get(&s, "Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "UpgradeHalted")
        );
        assert!(degraded.message.contains("within 20s"), "{}", degraded.message);
        assert_eq!(get(&s, "Available").status, "True");
        assert_eq!(
            kstatus(&s),
            [
                ("False", "UpgradeHalted"),
                ("False", "Idle"),
                ("True", "UpgradeHalted")
            ]
        );
        let u = s.upgrade.clone().unwrap();
        assert_eq!(u.phase, Some(UpgradePhase::Halted));
        assert_eq!(u.current_member.as_deref(), Some("a"));
        assert_eq!(RollRecord::from_status(Some(&s)), Some(roll));
        // spec.version changed: the old roll no longer applies.
        c.spec.version = Some("3.5.1".into());
        let s = compute(&c, &three_on("3.5.1"), &outcome);
        assert_eq!(s.upgrade, None);
        assert_eq!(get(&s, "Degraded").status, "False");
        assert_eq!(get(&s, "Ready").status, "True");
    }

    fn backup_condition(status: &str) -> Condition {
        Condition {
            type_: "BackupSucceeded".into(),
            status: status.into(),
            reason: "Stored".into(),
            message: "snapshot stored".into(),
            observed_generation: Some(3),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn last_backup(revision: i64) -> etcd_operator_api::status::BackupStatus {
        etcd_operator_api::status::BackupStatus {
            revision: Some(revision),
            location: Some(format!("s3://b/demo-{revision}.db")),
            ..Default::default()
        }
    }

    #[test]
    fn rebase_takes_what_others_own_from_the_fresh_status_and_the_rest_from_ours() {
        let c = cluster();
        // Ours was computed from an object whose last backup was revision 5 and failing.
        let mut old = c.clone();
        old.status = Some(EtcdClusterStatus {
            last_backup: Some(Box::new(last_backup(5))),
            conditions: Some(vec![backup_condition("False")]),
            ..Default::default()
        });
        let ours = compute(
            &old,
            &three_on("3.5.1"),
            &Outcome {
                step: Step::Idle,
                error: None,
                roll: None,
                rollout: None,
                maintenance: None,
            },
        );
        // Meanwhile the backup controller recorded revision 9 and succeeded; and the stored
        // status says something stale about our own conditions.
        let fresh = EtcdClusterStatus {
            last_backup: Some(Box::new(last_backup(9))),
            ready_replicas: Some(0),
            conditions: Some(vec![
                condition(CONDITION_AVAILABLE, false, "NoQuorum", "stale".into(), Some(2)),
                backup_condition("True"),
            ]),
            ..Default::default()
        };
        let s = rebase(&ours, Some(&fresh));
        assert_eq!(s.last_backup, Some(Box::new(last_backup(9))));
        assert_eq!(get(&s, "BackupSucceeded"), &backup_condition("True"));
        assert_eq!(get(&s, "Available"), get(&ours, "Available"));
        assert_eq!(s.ready_replicas, ours.ready_replicas);
        assert_eq!(s.members, ours.members);
        let types: Vec<&str> = s.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                "Available",
                "Progressing",
                "Degraded",
                "Ready",
                "Reconciling",
                "Stalled",
                "BackupSucceeded"
            ]
        );
        // Nothing stored yet: ours as is.
        assert_eq!(rebase(&ours, None), ours);
        // A foreign condition that went away in the fresh status stays away.
        let gone = rebase(&ours, Some(&EtcdClusterStatus::default()));
        assert!(
            gone.conditions
                .iter()
                .flatten()
                .all(|c| c.type_ != "BackupSucceeded")
        );
        assert_eq!(gone.last_backup, None);
    }

    #[test]
    fn the_status_patch_is_conditional_on_the_resource_version_and_replaces_the_status() {
        let status = EtcdClusterStatus {
            ready_replicas: Some(3),
            last_backup: Some(Box::new(last_backup(9))),
            ..Default::default()
        };
        let patch = status_patch(&status, "42");
        assert_eq!(
            patch,
            serde_json::json!([
                {"op": "add", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/status", "value": serde_json::to_value(&status).unwrap()},
            ])
        );
        assert_eq!(patch[1]["value"]["lastBackup"]["revision"], 9);
    }

    /// A cluster as the API server hands it to [`initial`] at create: defaulted, with identity
    /// metadata and the `observedGeneration: 0` the server sets.
    fn created(spec: serde_json::Value) -> EtcdCluster {
        let mut c: EtcdCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "etcd.operator.dev/v1alpha2",
            "kind": "EtcdCluster",
            "metadata": {"name": "fresh", "namespace": "prod", "uid": "u-1", "generation": 1},
            "spec": spec,
            "status": {"observedGeneration": 0},
        }))
        .unwrap();
        etcd_operator_api::defaults::apply_v1alpha2(&mut c);
        c
    }

    /// The first reconcile's status for `obj` once it carries `status`, after `step` on an empty
    /// view: what the controller compares with the stored status before it writes.
    fn first_reconcile(mut obj: EtcdCluster, status: &EtcdClusterStatus, step: Step) -> EtcdClusterStatus {
        obj.status = Some(status.clone());
        let observed = Observed {
            runtime: Vec::new(),
            etcd: None,
            timing: Timing::default(),
            authority: None,
        };
        super::compute(
            &ValidatedCluster::new(&obj).unwrap(),
            &observed,
            &Outcome {
                step,
                ..Outcome::idle()
            },
        )
    }

    #[test]
    fn a_new_paused_cluster_starts_with_the_status_its_first_reconcile_computes() {
        let obj = created(serde_json::json!({"replicas": 3, "version": "3.5.1", "paused": true}));
        let status = initial(&obj, &plan::Thresholds::default()).expect("a status for a new cluster");
        assert_eq!(status.phase, Some(ClusterPhase::Paused));
        assert_eq!(status.observed_generation, Some(1));
        assert_eq!(get(&status, CONDITION_PROGRESSING).reason, "Paused");
        assert_eq!(get(&status, CONDITION_AVAILABLE).reason, "Bootstrapping");
        let again = first_reconcile(
            obj,
            &status,
            Step::Wait {
                reason: plan::WaitReason::Paused,
            },
        );
        assert!(!differs(&status, &again), "{status:#?}\n{again:#?}");
    }

    #[test]
    fn a_new_cluster_starts_bootstrapping_and_the_first_reservation_writes_nothing_new() {
        let obj = created(serde_json::json!({"replicas": 3, "version": "3.5.1"}));
        let status = initial(&obj, &plan::Thresholds::default()).expect("a status for a new cluster");
        assert_eq!(status.phase, Some(ClusterPhase::Creating));
        assert_eq!(status.replicas, Some(0));
        let progressing = get(&status, CONDITION_PROGRESSING);
        assert_eq!(
            (
                progressing.status.as_str(),
                progressing.reason.as_str(),
                progressing.message.as_str()
            ),
            ("True", "Bootstrapping", "creating 3 members")
        );
        assert_eq!(get(&status, CONDITION_READY).status, "False");
        // The controller reserves members under its own names: the same status.
        let names = vec![
            "fresh-a1".to_owned(),
            "fresh-b2".to_owned(),
            "fresh-c3".to_owned(),
        ];
        let again = first_reconcile(obj.clone(), &status, Step::ReserveForBootstrap { names });
        assert!(!differs(&status, &again), "{status:#?}\n{again:#?}");
        // Its next step does say something new, and is written.
        let next = first_reconcile(obj, &status, Step::Start { members: Vec::new() });
        assert!(differs(&status, &next));
    }

    #[test]
    fn no_initial_status_for_a_restore_an_invalid_object_or_one_already_looked_at() {
        let thresholds = plan::Thresholds::default();
        let restore = created(serde_json::json!({
            "replicas": 1, "version": "3.5.1", "bootstrap": {"restore": {"backupName": "nightly"}}
        }));
        assert!(ValidatedCluster::new(&restore).unwrap().restore_request.is_some());
        assert_eq!(initial(&restore, &thresholds), None);
        let mut nameless = created(serde_json::json!({"replicas": 1}));
        nameless.metadata.uid = None;
        assert_eq!(initial(&nameless, &thresholds), None);
        let mut seen = created(serde_json::json!({"replicas": 1}));
        seen.status = Some(EtcdClusterStatus {
            observed_generation: Some(1),
            ..Default::default()
        });
        assert_eq!(initial(&seen, &thresholds), None);
        // Without any status (not through the server's create) it is new too.
        let mut bare = created(serde_json::json!({"replicas": 1}));
        bare.status = None;
        assert!(initial(&bare, &thresholds).is_some());
    }

    /// A status with every field set, each to something a change can be told from.
    fn everything() -> EtcdClusterStatus {
        serde_json::from_value(serde_json::json!({
            "phase": "Running", "observedGeneration": 3, "replicas": 3, "readyReplicas": 3,
            "members": [{"name": "a", "id": "1"}], "clusterID": "c", "leader": "a",
            "currentVersion": "3.5.1", "clientEndpoints": ["http://a:2379"], "selector": "s",
            "lastBackup": {"revision": 1}, "upgrade": {"phase": "Rolling"},
            "rollout": {"phase": "Rolling"}, "recovery": {"request": "q"},
            "maintenance": {"lastDefragmentation": "2026-01-01T00:00:00Z"},
            "conditions": [{"type": "Available", "status": "True", "reason": "R", "message": "m",
                            "observedGeneration": 3, "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }))
        .unwrap()
    }

    /// One change to a status, named in the test's table.
    type Change = Box<dyn Fn(&mut EtcdClusterStatus)>;

    #[test]
    fn statuses_differ_in_any_field_but_a_conditions_transition_time() {
        let base = everything();
        assert!(!differs(&base, &base.clone()));
        let mut later = base.clone();
        later.conditions.as_mut().unwrap()[0].last_transition_time =
            Time("2026-02-01T00:00:00Z".parse().unwrap());
        assert!(!differs(&base, &later));
        let changes: Vec<(&str, Change)> = vec![
            ("phase", Box::new(|s| s.phase = Some(ClusterPhase::Failed))),
            (
                "observedGeneration",
                Box::new(|s| s.observed_generation = Some(4)),
            ),
            ("replicas", Box::new(|s| s.replicas = Some(2))),
            ("readyReplicas", Box::new(|s| s.ready_replicas = None)),
            ("members", Box::new(|s| s.members = Some(Vec::new()))),
            ("clusterID", Box::new(|s| s.cluster_id = None)),
            ("leader", Box::new(|s| s.leader = Some("b".into()))),
            (
                "currentVersion",
                Box::new(|s| s.current_version = Some("3.5.2".into())),
            ),
            ("clientEndpoints", Box::new(|s| s.client_endpoints = None)),
            ("selector", Box::new(|s| s.selector = None)),
            ("lastBackup", Box::new(|s| s.last_backup = None)),
            ("upgrade", Box::new(|s| s.upgrade = None)),
            ("rollout", Box::new(|s| s.rollout = None)),
            ("recovery", Box::new(|s| s.recovery = None)),
            ("maintenance", Box::new(|s| s.maintenance = None)),
            ("conditions", Box::new(|s| s.conditions = None)),
            (
                "a condition more",
                Box::new(|s| {
                    let extra = s.conditions.as_ref().unwrap()[0].clone();
                    s.conditions.as_mut().unwrap().push(extra);
                }),
            ),
            (
                "type",
                Box::new(|s| s.conditions.as_mut().unwrap()[0].type_ = "Ready".into()),
            ),
            (
                "status",
                Box::new(|s| s.conditions.as_mut().unwrap()[0].status = "False".into()),
            ),
            (
                "reason",
                Box::new(|s| s.conditions.as_mut().unwrap()[0].reason = "S".into()),
            ),
            (
                "message",
                Box::new(|s| s.conditions.as_mut().unwrap()[0].message = "n".into()),
            ),
            (
                "condition's generation",
                Box::new(|s| {
                    s.conditions.as_mut().unwrap()[0].observed_generation = Some(2);
                }),
            ),
        ];
        for (what, change) in changes {
            let mut other = base.clone();
            change(&mut other);
            assert!(differs(&base, &other), "{what}");
            assert!(differs(&other, &base), "{what}");
        }
    }
}
