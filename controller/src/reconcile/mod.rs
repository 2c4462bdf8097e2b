//! The controller loop: a kube-runtime `Controller` over EtcdClusters with a finalizer. Each
//! reconcile observes (runtime + etcd), plans one safe step, acts, and repeats a few times while
//! steps are quick; then it writes status (observedGeneration last) and requeues.
//!
//! - [`observe`](self::observe) reads the runtime and etcd and keeps the timing memory;
//! - [`act`](self::act) carries out one step through the runtime and the member operations;
//! - [`status_write`] writes the status, safe against the backup controller's writes.

mod act;
mod events;
mod observe;
mod status_write;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_operator_api::v1alpha2::EtcdCluster;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::watcher;

use crate::member_ops::{EtcdClient, MemberOps};
use crate::metrics::{ClusterSample, ControllerMetrics};
use crate::model::ClusterRef;
use crate::outcome::{Outcome, StepError};
use crate::plan::{self, Desired, Observed, RollRecord, Step, Thresholds, Timing};
use crate::runtime::{ClusterSpecView, Runtime, RuntimeError};
use crate::status;
use status_write::{STATUS_WRITE_ATTEMPTS, write_status};

/// The finalizer that makes deletion stop members and remove their data first.
pub const FINALIZER: &str = "etcd.operator.dev/cleanup";
/// Annotation: `"true"` keeps member data (volumes, data directories) when the cluster is deleted.
pub const KEEP_DATA_ANNOTATION: &str = "etcd.operator.dev/keep-data-on-delete";
/// Steps one reconcile takes before writing status and requeueing.
const MAX_STEPS_PER_RECONCILE: usize = 12;

/// A reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The object lacks a namespace, name or uid.
    #[error("EtcdCluster without {0}")]
    MissingMetadata(&'static str),
    /// Adding or removing the finalizer, or the wrapped reconcile, failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
    /// The runtime failed during cleanup.
    #[error("clean up members: {0}")]
    Cleanup(#[source] RuntimeError),
    /// Writing status failed.
    #[error("patch status: {0}")]
    PatchStatus(#[source] kube::Error),
    /// Reading the status again after a conflicting write failed.
    #[error("read status after a conflict: {0}")]
    ReadStatus(#[source] kube::Error),
    /// The status kept changing under every write attempt.
    #[error("patch status: it changed under each of {attempts} attempts: {0}", attempts = STATUS_WRITE_ATTEMPTS)]
    StatusConflict(#[source] Box<kube::Error>),
}

impl ReconcileError {
    /// The stable code of the failure (CamelCase), for logs and metrics.
    pub fn code(&self) -> &'static str {
        use kube::runtime::finalizer::Error as F;
        match self {
            Self::MissingMetadata(_) => "MissingMetadata",
            Self::Finalizer(e) => match e.as_ref() {
                F::ApplyFailed(inner) | F::CleanupFailed(inner) => inner.code(),
                F::AddFinalizer(_) | F::RemoveFinalizer(_) => "FinalizerPatchFailed",
                _ => "FinalizerFailed",
            },
            Self::Cleanup(_) => "CleanupFailed",
            Self::PatchStatus(_) | Self::ReadStatus(_) | Self::StatusConflict(_) => "StatusWriteFailed",
        }
    }
}

/// What the controller remembers between reconciles (lost on restart, which only delays).
#[derive(Debug, Default)]
struct Memory {
    bootstrap_since: Option<Instant>,
    unhealthy_since: HashMap<String, Instant>,
    /// Per member that is down: how often it failed to stay up since it was last healthy,
    /// whether it was gone when last seen (so each exit counts once), and the runtime's restart
    /// count when last seen (restarts the platform did itself count as failures too).
    failed_starts: HashMap<String, FailedStarts>,
    /// Per member: the highest raft index it was seen to apply, and when it first did.
    progress: HashMap<String, (u64, Instant)>,
    /// Members whose replacement was announced, with what was said.
    announced: HashMap<String, String>,
    /// Since when each member restarted on a new version has waited to be verified on it.
    version_wait_since: HashMap<String, Instant>,
    /// The roll as this process last left it: newer than the watched object's status until the
    /// status patch comes back through the watch.
    roll: Option<RollRecord>,
    /// The maintenance record as this process last left it (same reason as `roll`).
    maintenance: Option<etcd_operator_api::status::MaintenanceStatus>,
}

/// See [`Memory::failed_starts`].
#[derive(Debug, Default, Clone, Copy)]
struct FailedStarts {
    count: u32,
    was_gone: bool,
    restarts: u32,
}

/// Shared by every reconcile.
pub struct Context<R: Runtime, M: MemberOps = EtcdClient> {
    client: kube::Client,
    runtime: R,
    /// How the controller talks to the members.
    members: M,
    thresholds: Thresholds,
    memory: Mutex<HashMap<String, Memory>>,
    /// S3 keys for sending the pre-upgrade snapshot to the backup destination.
    backup_credentials: crate::backup::Credentials,
    /// Where reconciles, steps and the observed clusters are recorded.
    metrics: ControllerMetrics,
    /// Which clusters are this replica's (default: all).
    shards: crate::shard::ShardOwnership,
}

impl<R: Runtime, M: MemberOps> std::fmt::Debug for Context<R, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("thresholds", &self.thresholds)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> Context<R> {
    /// A context for [`run`] that reaches members over plain HTTP.
    pub fn new(client: kube::Client, runtime: R, thresholds: Thresholds) -> Self {
        Context::with_member_ops(client, runtime, thresholds, EtcdClient::default())
    }
}

impl<R: Runtime, M: MemberOps> Context<R, M> {
    /// A context for [`run`] that reaches members through `members`.
    pub fn with_member_ops(client: kube::Client, runtime: R, thresholds: Thresholds, members: M) -> Self {
        Self {
            client,
            runtime,
            members,
            thresholds,
            memory: Mutex::new(HashMap::new()),
            backup_credentials: crate::backup::Credentials::Environment { file: None },
            metrics: ControllerMetrics::default(),
            shards: crate::shard::ShardOwnership::all(),
        }
    }

    /// Reconciles only the clusters of the shards `shards` holds (default: every cluster).
    pub fn with_shards(mut self, shards: crate::shard::ShardOwnership) -> Self {
        self.shards = shards;
        self
    }

    /// Records reconciles, steps and the observed clusters in `metrics` (default: series
    /// registered nowhere).
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Forgets what this process remembered about the cluster (after it was wiped or deleted).
    fn forget(&self, cluster: &ClusterRef) {
        if let Ok(mut memory) = self.memory.lock() {
            memory.remove(&cluster.key());
        }
    }

    /// Reaches backup destinations with these credentials (default: the environment).
    pub fn with_backup_credentials(mut self, credentials: crate::backup::Credentials) -> Self {
        self.backup_credentials = credentials;
        self
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run<R: Runtime, M: MemberOps>(
    ctx: Context<R, M>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<EtcdCluster> = Api::all(ctx.client.clone());
    let controller = Controller::new(api, watcher::Config::default()).reconcile_all_on(ctx.shards.changes());
    ctx.runtime
        .watch_children(controller)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(ctx))
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(cluster = %obj.name, "reconciled"),
                Err(error) => tracing::warn!(%error, "reconcile failed"),
            }
        })
        .await;
}

fn error_policy<R: Runtime, M: MemberOps>(
    _obj: Arc<EtcdCluster>,
    error: &ReconcileError,
    _ctx: Arc<Context<R, M>>,
) -> Action {
    tracing::warn!(%error, "reconcile error; retrying");
    Action::requeue(Duration::from_secs(2))
}

fn cluster_ref(obj: &EtcdCluster) -> Result<ClusterRef, ReconcileError> {
    Ok(ClusterRef {
        namespace: obj
            .metadata
            .namespace
            .clone()
            .ok_or(ReconcileError::MissingMetadata("namespace"))?,
        name: obj
            .metadata
            .name
            .clone()
            .ok_or(ReconcileError::MissingMetadata("name"))?,
        uid: obj
            .metadata
            .uid
            .clone()
            .ok_or(ReconcileError::MissingMetadata("uid"))?,
    })
}

async fn reconcile<R: Runtime, M: MemberOps>(
    obj: Arc<EtcdCluster>,
    ctx: Arc<Context<R, M>>,
) -> Result<Action, ReconcileError> {
    // Another replica's shard: what this one remembered is stale. The guard keeps the shard
    // from being given up while this reconcile runs.
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let name = obj.metadata.name.clone().unwrap_or_default();
    let Some(_shard) = ctx.shards.enter(&namespace, &name) else {
        ctx.metrics.forget_cluster(&namespace, &name);
        ctx.forget(&ClusterRef {
            namespace,
            name,
            uid: String::new(),
        });
        return Ok(Action::await_change());
    };
    let start = Instant::now();
    let result = reconcile_one(obj, &ctx).await;
    ctx.metrics.observe_reconcile(start.elapsed().as_secs_f64());
    if let Err(error) = &result {
        ctx.metrics.reconcile_failed(error.code());
    }
    result
}

async fn reconcile_one<R: Runtime, M: MemberOps>(
    obj: Arc<EtcdCluster>,
    ctx: &Arc<Context<R, M>>,
) -> Result<Action, ReconcileError> {
    let cluster = cluster_ref(&obj)?;
    let api: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &cluster.namespace);
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Event::Apply(obj) => apply(&obj, &cluster, &api, ctx).await,
            Event::Cleanup(obj) => cleanup(&obj, &cluster, ctx).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

async fn cleanup<R: Runtime, M: MemberOps>(
    obj: &EtcdCluster,
    cluster: &ClusterRef,
    ctx: &Context<R, M>,
) -> Result<Action, ReconcileError> {
    let keep = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(KEEP_DATA_ANNOTATION))
        .is_some_and(|v| v == "true");
    tracing::info!(cluster = %cluster.key(), keep_data = keep, "deleting cluster members");
    ctx.runtime
        .teardown(cluster, keep)
        .await
        .map_err(ReconcileError::Cleanup)?;
    ctx.forget(cluster);
    ctx.metrics.forget_cluster(&cluster.namespace, &cluster.name);
    Ok(Action::await_change())
}

fn desired(spec: &ClusterSpecView, cluster: &ClusterRef) -> Desired {
    let obj = &spec.cluster;
    Desired {
        replicas: spec.replicas,
        version: spec.version.clone(),
        // Differs per incarnation of a cluster with the same name.
        cluster_token: format!("{}-{}-{}", cluster.namespace, cluster.name, cluster.uid),
        formed_before: obj.status.as_ref().is_some_and(|s| s.cluster_id.is_some()),
        paused: spec.paused,
        roll: status::roll_record(obj.status.as_ref()),
        restore: None,
        certificate_rotation: spec.certificate_rotation.clone(),
        quota_backend_bytes: etcd_operator_api::defaults::effective_maintenance(&obj.spec)
            .quota_backend_bytes,
        defragmentation: {
            let defrag = etcd_operator_api::defaults::effective_defragmentation(&obj.spec);
            plan::DefragPolicy {
                fragmentation_percent: defrag.fragmentation_percent,
                min_reclaimable_bytes: defrag.min_reclaimable_bytes,
            }
        },
        // Each request is answered once: status.recovery records the last one done.
        recover_quorum: spec.recover_quorum.clone().filter(|request| {
            obj.status
                .as_ref()
                .and_then(|s| s.recovery.as_ref())
                .is_none_or(|done| &done.request != request)
        }),
        replacement: spec.replacement,
        replace_member: spec.replace_member.clone(),
    }
}

/// Resolves `spec.bootstrap.restore` of a cluster that never formed: the snapshot its members
/// start from. Reads the named EtcdBackup and, when that has no destination of its own, the
/// destination of the cluster it backed up.
async fn resolve_restore(
    client: &kube::Client,
    namespace: &str,
    spec: &etcd_operator_api::v1alpha2::RestoreSpec,
) -> Result<crate::restore::RestorePlan, crate::restore::RestoreError> {
    let backup = match (&spec.backup_name, &spec.source) {
        (Some(name), None) => crate::restore::read_backup(client, namespace, name).await?,
        _ => None,
    };
    let fallback = match backup.as_ref().filter(|b| b.spec.destination.is_none()) {
        Some(b) => Api::<EtcdCluster>::namespaced(client.clone(), namespace)
            .get_opt(&b.spec.cluster_name)
            .await
            .ok()
            .flatten()
            .and_then(|c| c.spec.backup.map(|policy| policy.destination)),
        None => None,
    };
    crate::restore::plan(spec, backup.as_ref(), fallback.as_ref())
}

/// The defragmentation schedule, when there is one that parses (admission refuses others; one
/// stored before the rule changed is ignored with a warning).
fn defrag_schedule(obj: &EtcdCluster, cluster: &ClusterRef) -> Option<croner::Cron> {
    let text = etcd_operator_api::defaults::effective_defragmentation(&obj.spec).schedule?;
    match crate::backup::policy::parse_schedule(&text) {
        Ok(cron) => Some(cron),
        Err(error) => {
            tracing::warn!(cluster = %cluster.key(), schedule = %text, %error, "ignoring the invalid defragmentation schedule");
            None
        }
    }
}

fn fresh_name(cluster: &ClusterRef, observed: &Observed, taken: &mut Vec<String>) -> String {
    loop {
        let name = etcd_operator_api::naming::member_name(
            &cluster.name,
            &etcd_operator_api::naming::member_suffix(rand::random()),
        );
        let used = observed.runtime.iter().any(|r| r.name == name)
            || observed
                .etcd
                .as_ref()
                .is_some_and(|v| v.members.iter().any(|m| m.name == name))
            || taken.contains(&name);
        if !used {
            taken.push(name.clone());
            return name;
        }
    }
}

/// Reports `error` in the status of a cluster whose members cannot be touched yet (its snapshot
/// or its TLS cannot be had) and looks again after `retry`: nothing is observed or started.
async fn refuse_to_start<R: Runtime, M: MemberOps>(
    (api, obj, cluster): (&Api<EtcdCluster>, &EtcdCluster, &ClusterRef),
    spec: &ClusterSpecView,
    error: StepError,
    retry: Duration,
    ctx: &Context<R, M>,
) -> Result<Action, ReconcileError> {
    ctx.metrics.reconcile_failed(error.code());
    let outcome = Outcome {
        error: Some(error),
        ..Outcome::idle()
    };
    let observed = Observed {
        runtime: Vec::new(),
        etcd: None,
        timing: Timing::default(),
    };
    let new_status = status::compute(spec, &observed, &outcome);
    write_status(api, obj, &new_status).await?;
    warn_about(ctx, cluster, obj, &new_status, &outcome).await;
    Ok(Action::requeue(retry))
}

/// Publishes the Warning Events the step's outcome and the status change deserve
/// ([`events::warnings`]).
async fn warn_about<R: Runtime, M: MemberOps>(
    ctx: &Context<R, M>,
    cluster: &ClusterRef,
    obj: &EtcdCluster,
    new_status: &etcd_operator_api::status::EtcdClusterStatus,
    outcome: &Outcome,
) {
    for w in events::warnings(
        obj.status.as_ref(),
        new_status,
        &outcome.step,
        outcome.error.as_ref(),
    ) {
        ctx.runtime.warn(cluster, &w.reason, &w.action, &w.note).await;
    }
}

async fn apply<R: Runtime, M: MemberOps>(
    obj: &EtcdCluster,
    cluster: &ClusterRef,
    api: &Api<EtcdCluster>,
    ctx: &Context<R, M>,
) -> Result<Action, ReconcileError> {
    let spec = ClusterSpecView::new(obj.clone());
    let mut desired = desired(&spec, cluster);
    // This process's own record is newer than the watched status when it is about this spec.
    if let Ok(all) = ctx.memory.lock()
        && let Some(remembered) = all
            .get(&cluster.key())
            .and_then(|m| m.roll.clone())
            .filter(|r| r.target == desired.version)
    {
        desired.roll = Some(remembered);
    }
    if !desired.formed_before
        && let Some(restore) = obj.spec.bootstrap.as_ref().and_then(|b| b.restore.as_ref())
    {
        match resolve_restore(&ctx.client, &cluster.namespace, restore).await {
            Ok(plan) => desired.restore = Some(plan),
            Err(error) => {
                // Never bootstrap an empty cluster in place of the restored one asked for.
                tracing::warn!(cluster = %cluster.key(), %error, "cannot resolve the snapshot to restore");
                return refuse_to_start(
                    (api, obj, cluster),
                    &spec,
                    StepError::Restore(error),
                    Duration::from_secs(5),
                    ctx,
                )
                .await;
            }
        }
    }
    // The defragmentation record: the status's, or this process's own when that is newer.
    let remembered = ctx
        .memory
        .lock()
        .ok()
        .and_then(|all| all.get(&cluster.key()).and_then(|m| m.maintenance.clone()));
    let mut maintenance = crate::maintenance::merge(
        obj.status.as_ref().and_then(|s| s.maintenance.as_ref()),
        remembered.as_ref(),
    );
    let schedule = defrag_schedule(obj, cluster);
    let created = obj
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(crate::backup::from_time)
        .unwrap_or_else(chrono::Utc::now);
    let mut outcome = Outcome::idle();
    // The operator's identity toward TLS members; a cluster whose TLS cannot be had here is not
    // touched (nothing may start without the TLS it asks for).
    let client_tls = match ctx.runtime.client_tls(cluster, &spec).await {
        Ok(tls) => tls,
        Err(error) => {
            tracing::warn!(cluster = %cluster.key(), %error, "cannot set up the cluster's TLS");
            return refuse_to_start(
                (api, obj, cluster),
                &spec,
                StepError::Runtime(error),
                Duration::from_secs(10),
                ctx,
            )
            .await;
        }
    };
    let mut observed = Observed {
        runtime: Vec::new(),
        etcd: None,
        timing: Timing::default(),
    };
    // Whether `observed` holds a view (the metrics keep the last one when observing failed).
    let mut observed_once = false;
    for _ in 0..MAX_STEPS_PER_RECONCILE {
        match observe::observe(
            cluster,
            ctx,
            &desired.version,
            desired.replace_member.as_deref(),
            client_tls.as_ref(),
        )
        .await
        {
            Ok((seen, None)) => {
                observed = seen;
                observed_once = true;
            }
            // Members that refuse the operator's certificate (or whose certificates it refuses)
            // have not lost quorum: nothing is planned on that view, and status says why.
            // The one exception: a member whose own certificates expired gets new ones.
            Ok((seen, Some(tls))) => {
                tracing::warn!(cluster = %cluster.key(), error = %tls, "the members cannot be reached over TLS");
                observed = seen;
                observed_once = true;
                outcome = match plan::renew_expired(&desired, &observed) {
                    Some(step) => {
                        let result = act::act(&step, cluster, &spec, &observed, ctx, &mut desired.roll).await;
                        ctx.metrics.stepped(&step);
                        Outcome {
                            step,
                            error: result.err(),
                            roll: None,
                            maintenance: None,
                        }
                    }
                    None => Outcome {
                        error: Some(StepError::Member(tls)),
                        ..Outcome::idle()
                    },
                };
                break;
            }
            Err(e) => {
                outcome.error = Some(e.into());
                break;
            }
        }
        if let Some(roll) = desired.roll.as_mut()
            && roll.is_active_for(&desired.version)
            && plan::roll_finished(&desired.version, &observed)
        {
            tracing::info!(cluster = %cluster.key(), version = %desired.version, "the roll is complete");
            roll.complete = true;
        }
        let members: Vec<String> = observed.runtime.iter().map(|r| r.name.clone()).collect();
        let due = crate::maintenance::due(
            schedule.as_ref(),
            created,
            maintenance.as_ref(),
            &members,
            chrono::Utc::now(),
        );
        observed.timing.defrag_scheduled = due.scheduled;
        observed.timing.defragmented_recently = due.recent;
        observed.timing.since_reclaim =
            crate::maintenance::since_reclaim(maintenance.as_ref(), chrono::Utc::now());
        let mut taken = Vec::new();
        let step = plan::plan(&desired, &observed, &ctx.thresholds, &mut || {
            fresh_name(cluster, &observed, &mut taken)
        });
        tracing::debug!(cluster = %cluster.key(), ?step, "planned");
        let result = act::act(&step, cluster, &spec, &observed, ctx, &mut desired.roll).await;
        ctx.metrics.stepped(&step);
        let acted = step.is_action();
        // A reclaim goes to status (it holds off the next one, across restarts too).
        if let Ok(act::Acted::Reclaimed(reclaim)) = &result {
            maintenance = Some(crate::maintenance::record_reclaim(
                maintenance.as_ref(),
                reclaim.clone(),
                chrono::Utc::now(),
            ));
        }
        outcome = Outcome {
            step,
            error: result.err(),
            roll: None,
            maintenance: None,
        };
        if outcome.error.is_some() || !acted {
            break;
        }
        // Each defragmentation goes to status before the next member's.
        if let Step::Defragment {
            name,
            trigger,
            db_size,
            db_size_in_use,
            ..
        } = &outcome.step
        {
            maintenance = Some(crate::maintenance::record(
                maintenance.as_ref(),
                name,
                *trigger,
                *db_size,
                *db_size_in_use,
                chrono::Utc::now(),
            ));
            break;
        }
        // A roll's milestones go to status before anything else happens.
        if matches!(
            outcome.step,
            Step::SnapshotBeforeUpgrade { .. }
                | Step::AnnounceReplacement { .. }
                | Step::RollBack { .. }
                | Step::HaltUpgrade { .. }
                | Step::RecoverQuorum { .. }
        ) || desired
            .roll
            .as_ref()
            .is_some_and(|r| r.halted.is_some() && matches!(outcome.step, Step::ChangeVersion { .. }))
        {
            break;
        }
        // Give what was started a moment before looking again.
        if matches!(
            outcome.step,
            Step::Start { .. }
                | Step::AddLearner { .. }
                | Step::MoveLeader { .. }
                | Step::ChangeVersion { .. }
                | Step::RenewCertificates { .. }
        ) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if let Some(error) = &outcome.error {
        tracing::warn!(cluster = %cluster.key(), %error, code = error.code(), "step failed");
        ctx.metrics.reconcile_failed(error.code());
    }
    if observed_once {
        let sample = ClusterSample::of(spec.replicas, &observed);
        ctx.metrics
            .record_cluster(&cluster.namespace, &cluster.name, &sample);
    }
    outcome.roll = desired.roll.clone();
    outcome.maintenance = if observed.runtime.is_empty() {
        maintenance
    } else {
        let members: Vec<String> = observed.runtime.iter().map(|r| r.name.clone()).collect();
        crate::maintenance::retain_members(maintenance, &members)
    };
    let new_status = status::compute(&spec, &observed, &outcome);
    if let Ok(mut all) = ctx.memory.lock() {
        let memory = all.entry(cluster.key()).or_default();
        memory.roll = status::roll_record(Some(&new_status));
        memory.maintenance = new_status.maintenance.clone();
    }
    write_status(api, obj, &new_status).await?;
    warn_about(ctx, cluster, obj, &new_status, &outcome).await;
    Ok(match (&outcome.step, &outcome.error) {
        (_, Some(_)) => Action::requeue(Duration::from_secs(2)),
        // A settled cluster is looked at again after the runtime's resync interval: that bounds
        // how long a change nothing reports goes unnoticed.
        // (and by the defragmentation schedule's next time).
        (Step::Idle, None) => Action::requeue(
            schedule
                .as_ref()
                .and_then(|cron| crate::maintenance::until_next(cron, chrono::Utc::now()))
                .map_or(ctx.runtime.resync_interval(), |next| {
                    next.max(Duration::from_millis(200))
                        .min(ctx.runtime.resync_interval())
                }),
        ),
        (Step::Wait { .. }, None) => Action::requeue(Duration::from_millis(1000)),
        _ => Action::requeue(Duration::from_millis(300)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_errors_have_stable_codes_through_the_finalizer() {
        use kube::runtime::finalizer::Error as F;
        let wrapped = |e: F<ReconcileError>| ReconcileError::Finalizer(Box::new(e));
        let status =
            || ReconcileError::StatusConflict(Box::new(kube::Error::LinesCodecMaxLineLengthExceeded));
        let cases = [
            (ReconcileError::MissingMetadata("uid"), "MissingMetadata"),
            (status(), "StatusWriteFailed"),
            (wrapped(F::ApplyFailed(status())), "StatusWriteFailed"),
            (
                wrapped(F::CleanupFailed(ReconcileError::Cleanup(
                    RuntimeError::UnknownMember { name: "m".into() },
                ))),
                "CleanupFailed",
            ),
            (wrapped(F::UnnamedObject), "FinalizerFailed"),
        ];
        for (error, code) in cases {
            assert_eq!(error.code(), code, "{error}");
        }
    }
}
