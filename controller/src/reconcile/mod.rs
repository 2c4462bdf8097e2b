//! The controller loop: a kube-runtime `Controller` over EtcdClusters with a finalizer. Each
//! reconcile is one pass of a straight pipeline: the [`ValidatedCluster`] view of the object →
//! observe (runtime + etcd) → plan ONE step (pure) → act → write status once (observedGeneration
//! last) → requeue after a delay the step's kind decides. Nothing in a reconcile waits for the
//! world: what is not ready yet is the next reconcile's business.
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
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};

use crate::member_ops::{EtcdClient, MemberOps};
use crate::metrics::{ClusterSample, ControllerMetrics};
use crate::model::ClusterRef;
use crate::outcome::{Outcome, StepError};
use crate::plan::{self, Observed, Step, Thresholds, Timing, WaitReason};
use crate::runtime::{Runtime, RuntimeError};
use crate::status;
use crate::tls::member::Provider;
use crate::validated::RolloutRecord;
use crate::validated::{RollRecord, ValidatedCluster, ValidationError};
use status_write::{STATUS_WRITE_ATTEMPTS, write_status};

/// The finalizer that makes deletion stop members and remove their data first (the API crate's
/// [`etcd_operator_api::CLEANUP_FINALIZER`], which the server also adds at create).
pub const FINALIZER: &str = etcd_operator_api::CLEANUP_FINALIZER;
pub use crate::validated::KEEP_DATA_ANNOTATION;
/// Reconciles run at once (of different clusters; one cluster is never reconciled twice at
/// once). A reconcile takes one step and never waits, so a bound costs a fleet little latency,
/// and it bounds the memory and connections of a burst (a thousand clusters created at once).
pub const MAX_CONCURRENT_RECONCILES: u16 = 32;

/// A reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The object cannot be resolved into a [`ValidatedCluster`].
    #[error("resolve the EtcdCluster")]
    Invalid(#[source] ValidationError),
    /// Adding or removing the finalizer, or the wrapped reconcile, failed.
    #[error("finalizer")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
    /// The runtime failed during cleanup.
    #[error("clean up members")]
    Cleanup(#[source] RuntimeError),
    /// Writing status failed.
    #[error("patch status")]
    PatchStatus(#[source] kube::Error),
    /// Reading the status again after a conflicting write failed.
    #[error("read status after a conflict")]
    ReadStatus(#[source] kube::Error),
    /// The status kept changing under every write attempt.
    #[error("patch status: it changed under each of {attempts} attempts", attempts = STATUS_WRITE_ATTEMPTS)]
    StatusConflict(#[source] Box<kube::Error>),
}

impl ReconcileError {
    /// Whether the reconcile waits for the world rather than failed: a deletion whose members
    /// are still stopping. Looked at again soon, without backing off.
    pub fn is_waiting(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        match self {
            Self::Cleanup(RuntimeError::Waiting { .. }) => true,
            Self::Finalizer(e) => match e.as_ref() {
                F::ApplyFailed(inner) | F::CleanupFailed(inner) => inner.is_waiting(),
                _ => false,
            },
            _ => false,
        }
    }

    /// The stable code of the failure (CamelCase), for logs and metrics.
    pub fn code(&self) -> &'static str {
        use kube::runtime::finalizer::Error as F;
        match self {
            Self::Invalid(ValidationError::MissingMetadata(_)) => "MissingMetadata",
            Self::Invalid(ValidationError::DefragmentationSchedule { .. })
            | Self::Invalid(ValidationError::DefragmentRequest { .. }) => "InvalidSpec",
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
    /// The template rollout as this process last left it (same reason as `roll`).
    rollout: Option<RolloutRecord>,
    /// The maintenance record as this process last left it (same reason as `roll`).
    maintenance: Option<etcd_operator_api::status::MaintenanceStatus>,
    /// Reconciles or steps that failed in a row (the retry backs off with it).
    failures: u32,
    /// A quorum recovery under way (its step answered that it waits, e.g. for the survivor's Pod
    /// to stop): carried on as planned, since its survivor may not answer meanwhile.
    recovering: Option<Step>,
    /// The last quorum recovery this process carried out, as recorded in the status it wrote:
    /// until that status comes back through the watch, a reconcile on the older object must
    /// neither answer the same request again (rebuilding a cluster that was just rebuilt) nor
    /// write the older status's record back over it.
    recovered: Option<etcd_operator_api::status::RecoveryStatus>,
}

impl Memory {
    /// `name` was started (again): the next look that finds it gone counts a new exit, and its
    /// restart back-off counts from then.
    fn started_again(&mut self, name: &str) {
        if let Some(failing) = self.failed_starts.get_mut(name) {
            failing.was_gone = false;
            failing.gone_since = None;
        }
    }

    /// Whether nothing is remembered: the entry can go (a paused or settled cluster without
    /// members holds no memory at all, so a fleet of them costs no table entries).
    fn is_empty(&self) -> bool {
        let Memory {
            bootstrap_since,
            unhealthy_since,
            failed_starts,
            progress,
            announced,
            version_wait_since,
            roll,
            rollout,
            maintenance,
            failures,
            recovering,
            recovered,
        } = self;
        bootstrap_since.is_none()
            && unhealthy_since.is_empty()
            && failed_starts.is_empty()
            && progress.is_empty()
            && announced.is_empty()
            && version_wait_since.is_empty()
            && roll.is_none()
            && rollout.is_none()
            && maintenance.is_none()
            && *failures == 0
            && recovering.is_none()
            && recovered.is_none()
    }
}

/// Per cluster (`<namespace>/<name>`), what the controller remembers. Boxed: `Memory` is close to
/// a kilobyte inline, and a table sized for a fleet would hold that in every slot, used or not.
type Memories = HashMap<String, Box<Memory>>;

/// Drops `key`'s entry when it remembers nothing.
fn drop_if_empty(all: &mut Memories, key: &str) {
    if all.get(key).is_some_and(|m| m.is_empty()) {
        all.remove(key);
        crate::sparse::shrink_when_sparse(all);
    }
}

/// The template rollout after a step: started (or moved on) by a member re-created on the
/// template, halted by [`Step::HaltRollout`], complete once every member runs the template and
/// is healthy. A record of another template is dropped once a member is re-created on this one.
fn rollout_after(
    record: Option<RolloutRecord>,
    hash: Option<&str>,
    step: &Step,
    result: &Result<act::Acted, StepError>,
    observed: &Observed,
) -> Option<RolloutRecord> {
    let hash = hash?;
    let mut record = record.filter(|r| r.target == hash);
    match (step, result) {
        (Step::RollTemplate { name, .. }, _) => {
            let r = record.get_or_insert_with(|| RolloutRecord {
                target: hash.to_owned(),
                ..RolloutRecord::default()
            });
            r.current_member = Some(name.clone());
            r.complete = false;
        }
        // A memory-backed member on another template is replaced rather than re-created.
        (Step::RemoveFromEtcd { name, .. }, Ok(_))
            if observed
                .runtime
                .iter()
                .any(|r| &r.name == name && r.template_hash.as_deref().is_some_and(|h| h != hash)) =>
        {
            let r = record.get_or_insert_with(|| RolloutRecord {
                target: hash.to_owned(),
                ..RolloutRecord::default()
            });
            r.current_member = Some(name.clone());
            r.complete = false;
        }
        (Step::HaltRollout { name, reason }, _) => {
            let r = record.get_or_insert_with(|| RolloutRecord {
                target: hash.to_owned(),
                ..RolloutRecord::default()
            });
            r.current_member = Some(name.clone());
            r.halted = Some(reason.clone());
        }
        _ => {}
    }
    if let Some(r) = record.as_mut()
        && r.halted.is_none()
        && !r.complete
        && plan::rollout_finished(hash, observed)
    {
        r.complete = true;
        r.current_member = None;
    }
    record
}

/// See [`Memory::failed_starts`].
#[derive(Debug, Default, Clone, Copy)]
struct FailedStarts {
    count: u32,
    was_gone: bool,
    restarts: u32,
    /// When the look that first found it gone after its last start was (what the restart
    /// back-off counts from).
    gone_since: Option<Instant>,
}

/// Shared by every reconcile.
pub struct Context<R: Runtime, M: MemberOps = EtcdClient> {
    client: kube::Client,
    runtime: R,
    /// How the controller talks to the members.
    members: M,
    thresholds: Thresholds,
    memory: Mutex<Memories>,
    /// S3 keys for sending the pre-upgrade snapshot to the backup destination.
    backup_credentials: crate::backup::Credentials,
    /// Where reconciles, steps and the observed clusters are recorded.
    metrics: ControllerMetrics,
    /// Which clusters are this replica's (default: all).
    shards: crate::shard::ShardOwnership,
    /// The namespaces whose clusters are managed (every namespace when empty): a
    /// namespace-scoped install's Roles grant nothing elsewhere.
    namespaces: Vec<String>,
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
            namespaces: Vec::new(),
        }
    }

    /// Manages only the clusters in `namespaces` (empty: every namespace). A cluster elsewhere
    /// is stored by the API as any other; the controller says on it that it is not managed
    /// (a status condition and a Warning Event) and creates nothing for it.
    #[must_use]
    pub fn with_namespaces(mut self, namespaces: Vec<String>) -> Self {
        self.namespaces = namespaces;
        self
    }

    fn manages(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
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
            crate::sparse::shrink_when_sparse(&mut memory);
        }
    }

    /// Counts a failure of the cluster's reconcile or step; the delay before the next try.
    fn failed(&self, key: &str) -> Duration {
        let failures = self.memory.lock().map_or(1, |mut all| {
            let memory = all.entry(key.to_owned()).or_default();
            memory.failures = memory.failures.saturating_add(1);
            memory.failures
        });
        backoff(failures, rand::random())
    }

    /// The cluster's reconcile went through: the next failure starts the backoff again.
    fn succeeded(&self, key: &str) {
        if let Ok(mut all) = self.memory.lock()
            && let Some(memory) = all.get_mut(key)
        {
            memory.failures = 0;
            drop_if_empty(&mut all, key);
        }
    }

    /// The quorum recovery under way for the cluster, while its request still stands and the
    /// cluster is not paused.
    fn recovering(&self, key: &str, view: &ValidatedCluster) -> Option<Step> {
        if view.paused {
            return None;
        }
        let all = self.memory.lock().ok()?;
        all.get(key)?.recovering.clone().filter(|step| {
            matches!(step, Step::RecoverQuorum { request, .. } if view.recover_quorum.as_ref() == Some(request))
        })
    }

    /// Whether this process already answered the quorum recovery `view` asks for (its status
    /// may not have come back through the watch yet).
    fn recovery_answered(&self, key: &str, view: &ValidatedCluster) -> bool {
        let Some(request) = view.recover_quorum.as_ref() else {
            return false;
        };
        self.memory
            .lock()
            .ok()
            .and_then(|all| all.get(key)?.recovered.as_ref().map(|r| &r.request == request))
            .unwrap_or(false)
    }

    /// Reaches backup destinations with these credentials (default: the environment).
    pub fn with_backup_credentials(mut self, credentials: crate::backup::Credentials) -> Self {
        self.backup_credentials = credentials;
        self
    }
}

/// Runs the controller until `shutdown` resolves, on a watch of its own.
pub async fn run<R: Runtime, M: MemberOps>(
    ctx: Context<R, M>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<EtcdCluster> = Api::all(ctx.client.clone());
    run_on(ctx, crate::cluster_watch::controller(api), shutdown).await;
}

/// Runs the controller on `clusters` (a [`crate::cluster_watch::shared`] watch) until
/// `shutdown` resolves.
pub async fn run_on<R: Runtime, M: MemberOps>(
    ctx: Context<R, M>,
    clusters: kube::runtime::Controller<EtcdCluster>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let controller = clusters
        .with_config(kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
        .reconcile_all_on(ctx.shards.changes());
    ctx.runtime
        .watch_children(controller)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(ctx))
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(cluster = %obj.name, "reconciled"),
                Err(error) => {
                    tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "reconcile failed")
                }
            }
        })
        .await;
}

fn error_policy<R: Runtime, M: MemberOps>(
    obj: Arc<EtcdCluster>,
    error: &ReconcileError,
    ctx: Arc<Context<R, M>>,
) -> Action {
    if error.is_waiting() {
        tracing::debug!(error = %etcd_operator_api::report::Chain(error), "waiting");
        return Action::requeue(Duration::from_secs(1));
    }
    let delay = ctx.failed(&object_key(&obj));
    tracing::warn!(error = %etcd_operator_api::report::Chain(error), retry_in = ?delay, "reconcile error; retrying");
    Action::requeue(delay)
}

/// `<namespace>/<name>` of an object (the key of [`Context::memory`]).
fn object_key(obj: &EtcdCluster) -> String {
    format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or_default(),
        obj.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The first retry after a failure, and the longest.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(120));

/// How long to wait before the next try after `failures` failures in a row: doubling from
/// [`BACKOFF`]'s first retry up to its longest, each spread by ±20% (`jitter` in `0..1`) so
/// clusters that failed together do not retry together.
fn backoff(failures: u32, jitter: f64) -> Duration {
    let (first, longest) = BACKOFF;
    let doubled = first.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(longest).mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0))
}

/// A settled cluster's next look: the runtime's resync interval spread by ±10% (`jitter` in
/// `0..1`), so clusters created together do not resync together.
fn resync(interval: Duration, jitter: f64) -> Duration {
    interval.mul_f64(0.9 + 0.2 * jitter.clamp(0.0, 1.0))
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
    let view = ValidatedCluster::new(&obj).map_err(ReconcileError::Invalid)?;
    let api: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &view.cluster.namespace);
    if !ctx.manages(&view.cluster.namespace) {
        return not_managed(&obj, &view, &api, ctx).await;
    }
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Event::Apply(obj) => apply(&obj, view, &api, ctx).await,
            Event::Cleanup(_) => cleanup(&view, ctx).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

pub use etcd_operator_api::status::CONDITION_MANAGED;
/// The reason of `Managed=False`.
pub const REASON_NAMESPACE_NOT_WATCHED: &str = "NamespaceNotWatched";

/// A cluster in a namespace this operator does not watch: nothing is created for it (its Roles
/// would not allow it); its status says so (`Managed=False`, and kstatus's `Stalled`), with a
/// Warning Event the first time. No finalizer is added, so deleting it is never held up.
async fn not_managed<R: Runtime, M: MemberOps>(
    obj: &EtcdCluster,
    view: &ValidatedCluster,
    api: &Api<EtcdCluster>,
    ctx: &Context<R, M>,
) -> Result<Action, ReconcileError> {
    let message = format!(
        "this operator manages EtcdClusters only in the namespaces {} (--watch-namespaces); nothing is created for this one: create it in one of them, or add namespace {} to watchNamespaces",
        ctx.namespaces.join(", "),
        view.cluster.namespace
    );
    let previous = view.status.clone().unwrap_or_default();
    let said = previous
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == CONDITION_MANAGED && c.status == "False" && c.message == message);
    if said {
        return Ok(Action::await_change());
    }
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
            .unwrap_or_else(|_| jiff::Timestamp::now()),
    );
    let condition = |type_: &str, status: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: REASON_NAMESPACE_NOT_WATCHED.to_owned(),
        message: message.clone(),
        observed_generation: view.generation,
        last_transition_time: now.clone(),
    };
    let mut conditions: Vec<_> = previous
        .conditions
        .iter()
        .flatten()
        .filter(|c| ![CONDITION_MANAGED, "Ready", "Stalled"].contains(&c.type_.as_str()))
        .cloned()
        .collect();
    conditions.extend([
        condition(CONDITION_MANAGED, "False"),
        condition("Ready", "False"),
        condition("Stalled", "True"),
    ]);
    let status = etcd_operator_api::status::EtcdClusterStatus {
        conditions: Some(conditions),
        observed_generation: view.generation,
        ..previous
    };
    tracing::warn!(cluster = %view.cluster.key(), "not managed: its namespace is not watched");
    write_status(api, obj, &status).await?;
    ctx.runtime
        .warn(&view.cluster, REASON_NAMESPACE_NOT_WATCHED, "Reconcile", &message)
        .await;
    Ok(Action::await_change())
}

async fn cleanup<R: Runtime, M: MemberOps>(
    view: &ValidatedCluster,
    ctx: &Context<R, M>,
) -> Result<Action, ReconcileError> {
    let cluster = &view.cluster;
    let keep = view.keep_data_on_delete;
    tracing::info!(cluster = %cluster.key(), keep_data = keep, "deleting cluster members");
    ctx.runtime
        .teardown(cluster, keep)
        .await
        .map_err(ReconcileError::Cleanup)?;
    ctx.forget(cluster);
    ctx.metrics.forget_cluster(&cluster.namespace, &cluster.name);
    Ok(Action::await_change())
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
            .and_then(|c| ValidatedCluster::new(&c).ok()?.backup)
            .map(|policy| policy.destination),
        None => None,
    };
    crate::restore::plan(spec, backup.as_ref(), fallback.as_ref())
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
    (api, obj): (&Api<EtcdCluster>, &EtcdCluster),
    view: &ValidatedCluster,
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
        authority: None,
        runtime: Vec::new(),
        etcd: None,
        timing: Timing::default(),
    };
    let new_status = status::compute(view, &observed, &outcome);
    write_status(api, obj, &new_status).await?;
    warn_about(ctx, view, &new_status, &outcome).await;
    Ok(Action::requeue(retry))
}

/// Publishes the Warning Events the step's outcome and the status change deserve
/// ([`events::warnings`]).
async fn warn_about<R: Runtime, M: MemberOps>(
    ctx: &Context<R, M>,
    view: &ValidatedCluster,
    new_status: &etcd_operator_api::status::EtcdClusterStatus,
    outcome: &Outcome,
) {
    for w in events::warnings(
        view.status.as_ref(),
        new_status,
        &outcome.step,
        outcome.error.as_ref(),
    ) {
        ctx.runtime
            .warn(&view.cluster, &w.reason, &w.action, &w.note)
            .await;
    }
}

/// Why a reconcile asks to be run again, and when. The delay follows from the step: a
/// settled cluster is looked at after the runtime's resync (or its next scheduled
/// defragmentation), a cluster in the middle of a change soon after the step, one that waits
/// (for a member to catch up, a Pod to stop) a little later, and a failed step after a backoff
/// that grows with each failure in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Requeue {
    /// A step was carried out: look at its effect.
    Acted,
    /// Nothing to do until something changes (or the resync, or a schedule).
    Settled,
    /// The plan or the step waits for the world.
    Waiting,
    /// The step failed.
    Failed,
}

impl Requeue {
    fn of(outcome: &Outcome) -> Self {
        match (&outcome.step, &outcome.error) {
            (_, Some(error)) if error.is_waiting() => Self::Waiting,
            (_, Some(_)) => Self::Failed,
            (Step::Idle, None) => Self::Settled,
            // Nothing to wait for while the spec says to change nothing: un-pausing is a spec
            // edit, which comes as a watch event. (At the 1 s of a wait, 10,000 paused clusters
            // kept the controller busy for 29% of a CPU with nothing to do.)
            (
                Step::Wait {
                    reason: WaitReason::Paused,
                },
                None,
            ) => Self::Settled,
            (Step::Wait { .. }, None) => Self::Waiting,
            (_, None) => Self::Acted,
        }
    }
}

/// After a step that starts something (a member, a learner, a leadership move, a restart on a
/// new version or new certificates), the next look waits this long; after other steps, less.
fn after_step(step: &Step) -> Duration {
    match step {
        Step::Start { .. }
        | Step::AddLearner { .. }
        | Step::MoveLeader { .. }
        | Step::ChangeVersion { .. }
        | Step::RenewCertificates { .. } => Duration::from_millis(200),
        _ => Duration::from_millis(50),
    }
}

async fn apply<R: Runtime, M: MemberOps>(
    obj: &EtcdCluster,
    mut view: ValidatedCluster,
    api: &Api<EtcdCluster>,
    ctx: &Context<R, M>,
) -> Result<Action, ReconcileError> {
    let cluster = view.cluster.clone();
    let key = cluster.key();
    for ignored in &view.ignored {
        tracing::warn!(cluster = %key, error = %etcd_operator_api::report::Chain(ignored), "ignoring what cannot be resolved");
    }
    // This process's own record is newer than the watched status when it is about this spec.
    if let Ok(all) = ctx.memory.lock()
        && let Some(remembered) = all
            .get(&key)
            .and_then(|m| m.roll.clone())
            .filter(|r| r.target == view.version)
    {
        view.roll = Some(remembered);
    }
    view.template_hash = ctx.runtime.template_hash(&cluster, &view);
    if let Ok(all) = ctx.memory.lock()
        && let Some(remembered) = all
            .get(&key)
            .and_then(|m| m.rollout.clone())
            .filter(|r| view.template_hash.as_ref() == Some(&r.target))
    {
        view.rollout = Some(remembered);
    }
    if let Some(request) = view.restore_request.clone() {
        match resolve_restore(&ctx.client, &cluster.namespace, &request).await {
            Ok(plan) => view.restore = Some(plan),
            Err(error) => {
                // Never bootstrap an empty cluster in place of the restored one asked for.
                tracing::warn!(cluster = %key, error = %etcd_operator_api::report::Chain(&error), "cannot resolve the snapshot to restore");
                let retry = ctx.failed(&key);
                return refuse_to_start((api, obj), &view, StepError::Restore(error), retry, ctx).await;
            }
        }
    }
    // The defragmentation record: the status's, or this process's own when that is newer.
    let remembered = ctx
        .memory
        .lock()
        .ok()
        .and_then(|all| all.get(&key).and_then(|m| m.maintenance.clone()));
    let mut maintenance = crate::maintenance::merge(
        view.status.as_ref().and_then(|s| s.maintenance.as_deref()),
        remembered.as_ref(),
    );
    // A move-leader request this process answered already (its status write may not be back).
    if let Some(done) = maintenance.as_ref().and_then(|m| m.last_leader_transfer.as_ref())
        && view
            .move_leader
            .as_ref()
            .is_some_and(|r| r.request == done.request)
    {
        view.move_leader = None;
    }
    let created = view.created.unwrap_or_else(chrono::Utc::now);
    // The operator's identity toward TLS members; a cluster whose TLS cannot be had here is not
    // touched (nothing may start without the TLS it asks for).
    let client_tls = match ctx.runtime.client_tls(&cluster, &view).await {
        Ok(tls) => tls,
        Err(error) => {
            tracing::warn!(cluster = %key, error = %etcd_operator_api::report::Chain(&error), "cannot set up the cluster's TLS");
            let error = StepError::Runtime(error);
            let retry = if error.is_waiting() {
                Duration::from_secs(1)
            } else {
                ctx.failed(&key)
            };
            return refuse_to_start((api, obj), &view, error, retry, ctx).await;
        }
    };

    // Observe.
    let mut observed = Observed {
        authority: None,
        runtime: Vec::new(),
        etcd: None,
        timing: Timing::default(),
    };
    let seen = match observe::observe(
        &cluster,
        ctx,
        &view.version,
        view.replace_member.as_deref(),
        client_tls.as_ref(),
    )
    .await
    {
        // Where the rotation of the `auto` CAs is (a cluster without them costs no call).
        Ok((mut seen, tls))
            if view.tls.client == Some(Provider::Auto) || view.tls.peer == Some(Provider::Auto) =>
        {
            ctx.runtime.authority(&cluster, &view).await.map(|authority| {
                seen.authority = authority;
                (seen, tls)
            })
        }
        other => other,
    };
    let observed_once = seen.is_ok();
    // Plan one step, and act.
    let mut outcome = match seen {
        Err(e) => Outcome {
            error: Some(e.into()),
            ..Outcome::idle()
        },
        // Members that refuse the operator's certificate (or whose certificates it refuses)
        // have not lost quorum: nothing is planned on that view, and status says why. The one
        // exception: a member whose own certificates expired gets new ones.
        Ok((seen, Some(tls))) => {
            tracing::warn!(cluster = %key, error = %etcd_operator_api::report::Chain(&tls), "the members cannot be reached over TLS");
            observed = seen;
            match plan::renew_expired(&view, &observed) {
                Some(step) => {
                    let mut roll = view.roll.clone();
                    let result = act::act(&step, &cluster, &view, &observed, ctx, &mut roll).await;
                    view.roll = roll;
                    ctx.metrics.stepped(&step);
                    Outcome {
                        step,
                        error: result.err(),
                        roll: None,
                        rollout: None,
                        maintenance: None,
                    }
                }
                None => Outcome {
                    error: Some(StepError::Member(tls)),
                    ..Outcome::idle()
                },
            }
        }
        Ok((seen, None)) => {
            observed = seen;
            if let Some(roll) = view.roll.as_mut()
                && roll.is_active_for(&view.version)
                && plan::roll_finished(&view.version, &observed)
            {
                tracing::info!(cluster = %key, version = %view.version, "the roll is complete");
                roll.complete = true;
            }
            let members: Vec<String> = observed.runtime.iter().map(|r| r.name.clone()).collect();
            let now = chrono::Utc::now();
            if plan::leader_request_answered(&view, observed.etcd.as_ref())
                && let Some(request) = view.move_leader.take()
            {
                tracing::info!(cluster = %key, member = %request.member, "the requested member leads");
                maintenance = Some(crate::maintenance::record_leader_transfer(
                    maintenance.as_ref(),
                    &request,
                    now,
                ));
            }
            let due = crate::maintenance::due(
                view.defrag_schedule.as_ref(),
                view.defragment_request,
                created,
                maintenance.as_ref(),
                &members,
                now,
            );
            observed.timing.defrag_scheduled = due.scheduled;
            observed.timing.defragmented_recently = due.recent;
            observed.timing.defrag_requested = due.requested;
            observed.timing.since_reclaim = crate::maintenance::since_reclaim(maintenance.as_ref(), now);
            let mut taken = Vec::new();
            if ctx.recovery_answered(&key, &view) {
                view.recover_quorum = None;
            }
            let step = match ctx.recovering(&key, &view) {
                Some(step) => step,
                None => plan::plan(&view, &observed, &ctx.thresholds, &mut || {
                    fresh_name(&cluster, &observed, &mut taken)
                }),
            };
            tracing::debug!(cluster = %key, ?step, "planned");
            let mut roll = view.roll.clone();
            let result = act::act(&step, &cluster, &view, &observed, ctx, &mut roll).await;
            view.roll = roll;
            view.rollout = rollout_after(
                view.rollout.take(),
                view.template_hash.as_deref(),
                &step,
                &result,
                &observed,
            );
            ctx.metrics.stepped(&step);
            if let Ok(mut all) = ctx.memory.lock() {
                let memory = all.entry(key.clone()).or_default();
                memory.recovering = match (&step, &result) {
                    (Step::RecoverQuorum { .. }, Err(e)) if e.is_waiting() => Some(step.clone()),
                    _ => None,
                };
                // A member started again is no longer the one seen gone: if the next look finds
                // it gone, it exited again, which counts (even when no look saw it running).
                if let (Step::Start { members }, Ok(_)) = (&step, &result) {
                    for (name, _) in members {
                        memory.started_again(name);
                    }
                }
            }
            match &result {
                // A reclaim goes to status (it holds off the next one, across restarts too).
                Ok(act::Acted::Reclaimed(reclaim)) => {
                    maintenance = Some(crate::maintenance::record_reclaim(
                        maintenance.as_ref(),
                        reclaim.clone(),
                        chrono::Utc::now(),
                    ));
                }
                // Each defragmentation goes to status before the next member's.
                Ok(act::Acted::Done) => {
                    if let Step::Defragment {
                        name,
                        trigger,
                        db_size,
                        db_size_in_use,
                        ..
                    } = &step
                    {
                        maintenance = Some(crate::maintenance::record(
                            maintenance.as_ref(),
                            name,
                            *trigger,
                            *db_size,
                            *db_size_in_use,
                            chrono::Utc::now(),
                        ));
                    }
                }
                Err(_) => {}
            }
            Outcome {
                step,
                error: result.err(),
                roll: None,
                rollout: None,
                maintenance: None,
            }
        }
    };
    match &outcome.error {
        // Under way, not failed: looked at again in a second, not counted as an error.
        Some(error) if error.is_waiting() => {
            tracing::debug!(cluster = %key, step = outcome.step.code(), detail = %etcd_operator_api::report::Chain(error), "step under way");
        }
        Some(error) => {
            tracing::warn!(cluster = %key, error = %etcd_operator_api::report::Chain(error), code = error.code(), "step failed");
            ctx.metrics.reconcile_failed(error.code());
        }
        None => {}
    }
    if observed_once {
        let sample = ClusterSample::of(view.replicas, view.formed_before, &observed);
        ctx.metrics
            .record_cluster(&cluster.namespace, &cluster.name, &sample);
    }

    // Write status once.
    outcome.roll = view.roll.clone();
    outcome.rollout = view.rollout.clone();
    outcome.maintenance = if observed.runtime.is_empty() {
        maintenance
    } else {
        let members: Vec<String> = observed.runtime.iter().map(|r| r.name.clone()).collect();
        crate::maintenance::retain_members(maintenance, &members)
    };
    let mut new_status = status::compute(&view, &observed, &outcome);
    if let Ok(mut all) = ctx.memory.lock() {
        let memory = all.entry(key.clone()).or_default();
        // The recovery record: the one just made, else this process's last one when the watched
        // status does not have it yet.
        match (&outcome.step, &outcome.error) {
            (Step::RecoverQuorum { .. }, None) => memory.recovered = new_status.recovery.as_deref().cloned(),
            _ => {
                if let Some(mine) = &memory.recovered
                    && new_status
                        .recovery
                        .as_ref()
                        .is_none_or(|r| r.request != mine.request)
                    && new_status.recovery.as_ref().and_then(|r| r.time.as_ref()) <= mine.time.as_ref()
                {
                    new_status.recovery = Some(Box::new(mine.clone()));
                }
            }
        }
        memory.roll = RollRecord::from_status(Some(&new_status));
        memory.rollout = RolloutRecord::from_status(Some(&new_status));
        memory.maintenance = new_status.maintenance.as_deref().cloned();
        drop_if_empty(&mut all, &key);
    }
    write_status(api, obj, &new_status).await?;
    warn_about(ctx, &view, &new_status, &outcome).await;

    // Requeue.
    let requeue = Requeue::of(&outcome);
    if requeue != Requeue::Failed {
        ctx.succeeded(&key);
    }
    Ok(match requeue {
        Requeue::Failed => Action::requeue(ctx.failed(&key)),
        Requeue::Waiting => Action::requeue(Duration::from_secs(1)),
        Requeue::Acted => Action::requeue(after_step(&outcome.step)),
        // A settled cluster is looked at again after the runtime's resync interval (spread, so
        // clusters do not resync together): that bounds how long a change nothing reports goes
        // unnoticed; and at the defragmentation schedule's next time.
        Requeue::Settled => settled_look(
            &view,
            observed.runtime.len(),
            ctx.runtime.resync_interval(),
            rand::random(),
            chrono::Utc::now(),
        )
        .map_or_else(Action::await_change, Action::requeue),
    })
}

/// When a settled cluster is looked at again: after the resync interval (spread, so clusters do
/// not resync together), which bounds how long a change nothing reports goes unnoticed; sooner
/// at the defragmentation schedule's next time.
///
/// `None` (only its next change) for a paused cluster without any member (one paused before it
/// ever started): nothing runs that could change by itself, and every spec edit comes as a
/// watch event (its generation changes, which the watch's digest lets through; one missed while
/// the watch was down comes when it lists again, its digest changed). A timed
/// look would hold an entry in kube-runtime's scheduler per cluster for nothing: 6.8 MB for a
/// fleet of 10,000 (issue 24's heap profile).
fn settled_look(
    view: &ValidatedCluster,
    runtime_members: usize,
    resync_interval: Duration,
    jitter: f64,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    if view.paused && runtime_members == 0 {
        return None;
    }
    let resync = resync(resync_interval, jitter);
    Some(
        view.defrag_schedule
            .as_ref()
            .and_then(|cron| crate::maintenance::until_next(cron, now))
            .map_or(resync, |next| next.max(Duration::from_millis(200)).min(resync)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A context over a fake runtime and fake members, whose API client is never called.
    fn idle_context() -> Context<crate::runtime::fake::FakeRuntime, crate::member_ops::fake::FakeMemberOps> {
        let (service, _handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        Context::with_member_ops(
            kube::Client::new(service, "default"),
            crate::runtime::fake::FakeRuntime::new(Vec::new(), None),
            Thresholds::default(),
            crate::member_ops::fake::FakeMemberOps::new(None),
        )
    }

    /// A cluster that has nothing to remember (paused, settled, no member down) holds no entry:
    /// a fleet of 10,000 such clusters held a 15 MB table of ~900-byte slots (issue 24's heap
    /// profile). One that remembers something keeps it.
    #[tokio::test]
    async fn only_clusters_with_something_to_remember_hold_memory() {
        let ctx = idle_context();
        assert!(Memory::default().is_empty());
        ctx.failed("ns/a");
        assert!(ctx.memory.lock().unwrap().contains_key("ns/a"));
        ctx.succeeded("ns/a");
        assert!(!ctx.memory.lock().unwrap().contains_key("ns/a"));

        ctx.failed("ns/b");
        ctx.memory
            .lock()
            .unwrap()
            .get_mut("ns/b")
            .unwrap()
            .progress
            .insert("m".into(), (7, Instant::now()));
        ctx.succeeded("ns/b");
        let all = ctx.memory.lock().unwrap();
        assert_eq!(
            all.get("ns/b").map(|m| (m.failures, m.progress.len())),
            Some((0, 1))
        );
        // A table slot is a key and a pointer, whatever `Memory` grows to.
        assert!(std::mem::size_of::<(String, Box<Memory>)>() <= 32);
    }

    #[test]
    fn failures_back_off_exponentially_with_jitter_up_to_a_limit() {
        let (first, longest) = BACKOFF;
        // The middle of the jitter is the doubling itself.
        assert_eq!(backoff(1, 0.5), first);
        assert_eq!(backoff(2, 0.5), first * 2);
        assert_eq!(backoff(4, 0.5), first * 8);
        assert_eq!(backoff(30, 0.5), longest);
        assert_eq!(backoff(u32::MAX, 0.5), longest);
        // The jitter spreads each delay by ±20%, never more.
        assert_eq!(backoff(3, 0.0), (first * 4).mul_f64(0.8));
        assert_eq!(backoff(3, 1.0), (first * 4).mul_f64(1.2));
        assert_eq!(backoff(3, 7.0), backoff(3, 1.0));
        // Monotonic in the number of failures, whatever the jitter.
        for n in 1..20 {
            assert!(backoff(n + 1, 0.0) >= backoff(n, 0.0).min(longest.mul_f64(0.8)));
        }
        let spread = resync(Duration::from_secs(100), 0.0)..=resync(Duration::from_secs(100), 1.0);
        assert_eq!(spread, Duration::from_secs(90)..=Duration::from_secs(110));
    }

    #[test]
    fn a_paused_cluster_is_settled_while_other_waits_are_looked_at_again_soon() {
        let with = |step: Step| Outcome {
            step,
            ..Outcome::idle()
        };
        assert_eq!(Requeue::of(&Outcome::idle()), Requeue::Settled);
        assert_eq!(
            Requeue::of(&with(Step::Wait {
                reason: WaitReason::Paused
            })),
            Requeue::Settled
        );
        assert_eq!(
            Requeue::of(&with(Step::Wait {
                reason: WaitReason::UnbackedMemberKeepsQuorum { id: 7 }
            })),
            Requeue::Waiting
        );
    }

    #[test]
    fn a_paused_cluster_without_members_waits_for_a_change_and_every_other_for_the_resync() {
        let now = chrono::Utc::now();
        let three = Duration::from_secs(3);
        let mut view = ValidatedCluster::for_test(EtcdCluster::default());
        assert_eq!(settled_look(&view, 0, three, 0.5, now), Some(three), "not paused");
        assert_eq!(settled_look(&view, 3, three, 0.5, now), Some(three));
        assert_eq!(
            settled_look(&view, 3, three, 0.0, now),
            Some(three.mul_f64(0.9)),
            "spread"
        );
        view.paused = true;
        assert_eq!(
            settled_look(&view, 3, three, 0.5, now),
            Some(three),
            "paused with members: still watched"
        );
        assert_eq!(settled_look(&view, 0, three, 0.5, now), None);
        // A defragmentation schedule's next time comes first for a cluster that runs.
        view.paused = false;
        view.defrag_schedule = Some(crate::backup_policy::parse_schedule("* * * * * *").unwrap());
        assert!(settled_look(&view, 3, three, 0.5, now).is_some_and(|d| d <= Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn a_waiting_quorum_recovery_is_carried_on_while_its_request_stands() {
        let ctx = idle_context();
        let step = Step::RecoverQuorum {
            survivor: "a".into(),
            lost: vec!["b".into()],
            applied_index: Some(7),
            request: "auto".into(),
        };
        let mut view = ValidatedCluster::for_test(EtcdCluster::default());
        view.recover_quorum = Some("auto".into());
        let key = view.cluster.key();
        assert_eq!(ctx.recovering(&key, &view), None);
        ctx.memory
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .recovering = Some(step.clone());
        assert_eq!(ctx.recovering(&key, &view), Some(step));
        // Answered (status.recovery records it), asked anew, or paused: planned afresh.
        view.recover_quorum = None;
        assert_eq!(ctx.recovering(&key, &view), None);
        view.recover_quorum = Some("b".into());
        assert_eq!(ctx.recovering(&key, &view), None);
        view.recover_quorum = Some("auto".into());
        view.paused = true;
        assert_eq!(ctx.recovering(&key, &view), None);
    }

    /// A stale read after the recovery was done (its status not back through the watch yet)
    /// must not rebuild the cluster a second time: the request counts as answered.
    #[tokio::test]
    async fn a_quorum_recovery_this_process_did_is_not_done_again_on_an_older_object() {
        let ctx = idle_context();
        let mut view = ValidatedCluster::for_test(EtcdCluster::default());
        view.recover_quorum = Some("auto".into());
        let key = view.cluster.key();
        assert!(!ctx.recovery_answered(&key, &view));
        ctx.memory
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .recovered = Some(etcd_operator_api::status::RecoveryStatus {
            request: "auto".into(),
            survivor: "a".into(),
            lost_members: vec!["b".into()],
            survivor_applied_index: Some(7),
            time: None,
        });
        assert!(ctx.recovery_answered(&key, &view));
        // A new request is a new recovery.
        view.recover_quorum = Some("b".into());
        assert!(!ctx.recovery_answered(&key, &view));
    }

    #[test]
    fn the_requeue_follows_the_outcome() {
        let step = Step::Promote {
            id: 1,
            name: "a".into(),
        };
        let acted = Outcome {
            step: step.clone(),
            ..Outcome::idle()
        };
        assert_eq!(Requeue::of(&acted), Requeue::Acted);
        assert_eq!(Requeue::of(&Outcome::idle()), Requeue::Settled);
        let waiting = Outcome {
            step: step.clone(),
            error: Some(StepError::Runtime(RuntimeError::Waiting {
                member: "a".into(),
                detail: "its Pod is stopping".into(),
            })),
            ..Outcome::idle()
        };
        assert_eq!(Requeue::of(&waiting), Requeue::Waiting);
        let failed = Outcome {
            step,
            error: Some(StepError::Runtime(RuntimeError::UnknownMember {
                name: "a".into(),
            })),
            ..Outcome::idle()
        };
        assert_eq!(Requeue::of(&failed), Requeue::Failed);
    }

    #[tokio::test]
    async fn the_failure_count_backs_off_and_a_success_resets_it() {
        let ctx = idle_context();
        let (first, _) = BACKOFF;
        assert!(ctx.failed("ns/c") <= first.mul_f64(1.2));
        assert!(ctx.failed("ns/c") >= (first * 2).mul_f64(0.8));
        assert!(ctx.failed("ns/c") >= (first * 4).mul_f64(0.8));
        // Another cluster's failures are its own.
        assert!(ctx.failed("ns/other") <= first.mul_f64(1.2));
        ctx.succeeded("ns/c");
        assert!(ctx.failed("ns/c") <= first.mul_f64(1.2));
    }

    #[test]
    fn reconcile_errors_have_stable_codes_through_the_finalizer() {
        use kube::runtime::finalizer::Error as F;
        let wrapped = |e: F<ReconcileError>| ReconcileError::Finalizer(Box::new(e));
        let status =
            || ReconcileError::StatusConflict(Box::new(kube::Error::LinesCodecMaxLineLengthExceeded));
        let cases = [
            (
                ReconcileError::Invalid(ValidationError::MissingMetadata("uid")),
                "MissingMetadata",
            ),
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
            assert!(!error.is_waiting(), "{error}");
        }
        let stopping = || {
            ReconcileError::Cleanup(RuntimeError::Waiting {
                member: "m".into(),
                detail: "its etcd process is stopping".into(),
            })
        };
        assert!(stopping().is_waiting());
        assert!(wrapped(F::CleanupFailed(stopping())).is_waiting());
    }
}
