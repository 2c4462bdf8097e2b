//! The controller loop: a kube-runtime `Controller` over EtcdClusters with a finalizer. Each
//! reconcile observes (runtime + etcd), plans one safe step, acts, and repeats a few times while
//! steps are quick; then it writes status (observedGeneration last) and requeues.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_operator_api::status::EtcdClusterStatus;
use etcd_operator_api::v1alpha2::EtcdCluster;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::watcher;

use crate::etcd;
use crate::model::{ClusterRef, InitialState, Liveness, is_healthy};
use crate::plan::{self, Desired, Observed, RollRecord, Step, Thresholds, Timing};
use crate::runtime::{ClusterSpecView, Runtime, RuntimeError};
use crate::status::{self, Outcome};

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
    #[error("patch status: it changed under each of {STATUS_WRITE_ATTEMPTS} attempts: {0}")]
    StatusConflict(#[source] Box<kube::Error>),
}

/// What the controller remembers between reconciles (lost on restart, which only delays).
#[derive(Debug, Default)]
struct Memory {
    bootstrap_since: Option<Instant>,
    unhealthy_since: HashMap<String, Instant>,
    /// Since when each member restarted on a new version has waited to be verified on it.
    version_wait_since: HashMap<String, Instant>,
    /// The roll as this process last left it: newer than the watched object's status until the
    /// status patch comes back through the watch.
    roll: Option<RollRecord>,
}

/// Shared by every reconcile.
pub struct Context<R: Runtime> {
    client: kube::Client,
    runtime: R,
    thresholds: Thresholds,
    memory: Mutex<HashMap<String, Memory>>,
    /// S3 keys for sending the pre-upgrade snapshot to the backup destination.
    backup_credentials: crate::backup::Credentials,
}

impl<R: Runtime> std::fmt::Debug for Context<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("thresholds", &self.thresholds)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> Context<R> {
    /// A context for [`run`].
    pub fn new(client: kube::Client, runtime: R, thresholds: Thresholds) -> Self {
        Self {
            client,
            runtime,
            thresholds,
            memory: Mutex::new(HashMap::new()),
            backup_credentials: crate::backup::Credentials::Environment { file: None },
        }
    }

    /// Reaches backup destinations with these credentials (default: the environment).
    pub fn with_backup_credentials(mut self, credentials: crate::backup::Credentials) -> Self {
        self.backup_credentials = credentials;
        self
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run<R: Runtime>(ctx: Context<R>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let api: Api<EtcdCluster> = Api::all(ctx.client.clone());
    Controller::new(api, watcher::Config::default())
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

fn error_policy<R: Runtime>(_obj: Arc<EtcdCluster>, error: &ReconcileError, _ctx: Arc<Context<R>>) -> Action {
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

async fn reconcile<R: Runtime>(
    obj: Arc<EtcdCluster>,
    ctx: Arc<Context<R>>,
) -> Result<Action, ReconcileError> {
    let cluster = cluster_ref(&obj)?;
    let api: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &cluster.namespace);
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Event::Apply(obj) => apply(&obj, &cluster, &api, &ctx).await,
            Event::Cleanup(obj) => cleanup(&obj, &cluster, &ctx).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

async fn cleanup<R: Runtime>(
    obj: &EtcdCluster,
    cluster: &ClusterRef,
    ctx: &Context<R>,
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
    if let Ok(mut memory) = ctx.memory.lock() {
        memory.remove(&cluster.key());
    }
    Ok(Action::await_change())
}

/// Observes the runtime and etcd, and updates the timing memory.
async fn observe<R: Runtime>(
    cluster: &ClusterRef,
    ctx: &Context<R>,
    version: &str,
) -> Result<Observed, RuntimeError> {
    let runtime = ctx.runtime.members(cluster).await?;
    let endpoints: Vec<String> = runtime
        .iter()
        .filter(|r| r.liveness == Liveness::Running)
        .map(|r| r.client_url.clone())
        .collect();
    let etcd = if endpoints.is_empty() {
        None
    } else {
        etcd::observe(&endpoints).await
    };
    let now = Instant::now();
    let mut timing = Timing::default();
    if let Ok(mut all) = ctx.memory.lock() {
        let memory = all.entry(cluster.key()).or_default();
        let formed = etcd.as_ref().is_some_and(|v| v.leader != 0);
        let bootstrapping = runtime.iter().any(|r| {
            r.config
                .as_ref()
                .is_some_and(|c| c.initial_state == InitialState::New)
                && r.liveness == Liveness::Running
        });
        if formed || !bootstrapping {
            memory.bootstrap_since = None;
        } else {
            let since = *memory.bootstrap_since.get_or_insert(now);
            timing.bootstrap_waiting = Some(now - since);
        }
        let mut still_unhealthy = HashMap::new();
        if let Some(view) = &etcd {
            for m in &view.members {
                let Some(r) = runtime.iter().find(|r| m.peer_urls.contains(&r.peer_url)) else {
                    continue;
                };
                let down = matches!(r.liveness, Liveness::Gone { .. })
                    || (r.liveness == Liveness::Running && !is_healthy(m));
                if down {
                    let since = memory.unhealthy_since.get(&r.name).copied().unwrap_or(now);
                    still_unhealthy.insert(r.name.clone(), since);
                    timing.unhealthy_for.push((r.name.clone(), now - since));
                }
            }
        }
        memory.unhealthy_since = still_unhealthy;
        // Members recorded on `version` after a version change that etcd does not yet show
        // healthy, caught up and on it: the roll's health gate clock.
        let mut still_waiting = HashMap::new();
        for r in &runtime {
            let changed = r.config.as_ref().is_some_and(|c| {
                c.version == version && c.previous_version.as_deref().is_some_and(|p| p != version)
            });
            let verified = etcd.as_ref().is_some_and(|view| {
                view.by_peer_url(&r.peer_url)
                    .is_some_and(|m| plan::runs_version(view, m, version))
            });
            if changed && !verified {
                let since = memory.version_wait_since.get(&r.name).copied().unwrap_or(now);
                still_waiting.insert(r.name.clone(), since);
                timing.version_change_waiting.push((r.name.clone(), now - since));
            }
        }
        memory.version_wait_since = still_waiting;
    }
    Ok(Observed {
        runtime,
        etcd,
        timing,
    })
}

fn desired(obj: &EtcdCluster, cluster: &ClusterRef) -> Desired {
    Desired {
        replicas: usize::try_from(
            obj.spec
                .replicas
                .unwrap_or(etcd_operator_api::v1alpha2::DEFAULT_REPLICAS),
        )
        .unwrap_or(1)
        .max(1),
        version: obj
            .spec
            .version
            .clone()
            .unwrap_or_else(|| etcd_operator_api::versions::DEFAULT_ETCD_VERSION.to_string()),
        // Differs per incarnation of a cluster with the same name.
        cluster_token: format!("{}-{}-{}", cluster.namespace, cluster.name, cluster.uid),
        formed_before: obj.status.as_ref().is_some_and(|s| s.cluster_id.is_some()),
        paused: obj.spec.paused.unwrap_or(false),
        roll: status::roll_record(obj.status.as_ref()),
        restore: None,
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

/// Carries out one step.
async fn act<R: Runtime>(
    step: &Step,
    cluster: &ClusterRef,
    spec: &ClusterSpecView,
    observed: &Observed,
    ctx: &Context<R>,
    roll: &mut Option<RollRecord>,
) -> Result<(), String> {
    let running: Vec<String> = observed
        .runtime
        .iter()
        .filter(|r| r.liveness == Liveness::Running)
        .map(|r| r.client_url.clone())
        .collect();
    // Membership calls go to voters: a learner refuses them ("rpc not supported for learner").
    let voters: Vec<String> = match &observed.etcd {
        Some(view) => view
            .voters()
            .filter_map(|m| m.client_urls.first().cloned())
            .filter(|u| running.contains(u))
            .collect(),
        None => running.clone(),
    };
    let endpoints = if voters.is_empty() { running } else { voters };
    match step {
        Step::ReserveForBootstrap { names } => {
            for name in names {
                ctx.runtime
                    .reserve(cluster, spec, name)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Step::ReserveForJoin { name } => {
            ctx.runtime
                .reserve(cluster, spec, name)
                .await
                .map_err(|e| e.to_string())?;
        }
        Step::Start { members } => {
            for (name, config) in members {
                ctx.runtime
                    .start(cluster, spec, name, config)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Step::AddLearner { peer_url, name } => match etcd::add_learner(&endpoints, peer_url).await {
            Ok(id) => {
                tracing::info!(cluster = %cluster.key(), member = %name, id = format!("{id:x}"), "added learner")
            }
            // etcd's strict reconfiguration check: the previous new member joined < 5 s ago.
            Err(e) if e.is_not_ready_yet() => {
                tracing::debug!(member = %name, error = %e, "member add not accepted yet")
            }
            Err(e) => return Err(e.to_string()),
        },
        Step::Promote { id, name } => match etcd::promote(&endpoints, *id).await {
            Ok(()) => tracing::info!(cluster = %cluster.key(), member = %name, "promoted learner"),
            Err(e) if e.is_not_ready_yet() => {
                tracing::debug!(member = %name, error = %e, "learner not ready yet")
            }
            Err(e) => return Err(e.to_string()),
        },
        Step::MoveLeader { from, to } => {
            let leader_url = observed
                .etcd
                .as_ref()
                .and_then(|v| v.members.iter().find(|m| m.id == *from))
                .and_then(|m| m.client_urls.first().cloned())
                .ok_or_else(|| "move leader: the leader has no client URL".to_string())?;
            etcd::move_leader(&leader_url, *to)
                .await
                .map_err(|e| e.to_string())?;
            tracing::info!(cluster = %cluster.key(), from = format!("{from:x}"), to = format!("{to:x}"), "moved leadership");
        }
        Step::RemoveFromEtcd { id, name, reason } => {
            let removed_url = observed
                .etcd
                .as_ref()
                .and_then(|v| v.members.iter().find(|m| m.id == *id))
                .and_then(|m| m.client_urls.first().cloned());
            let others: Vec<String> = endpoints
                .iter()
                .filter(|e| Some(*e) != removed_url.as_ref())
                .cloned()
                .collect();
            etcd::remove(&others, *id).await.map_err(|e| e.to_string())?;
            tracing::info!(cluster = %cluster.key(), member = %name, %reason, "removed member from etcd");
        }
        Step::DeleteRuntimeMember { name, reason } => {
            ctx.runtime
                .remove(cluster, name, false)
                .await
                .map_err(|e| e.to_string())?;
            tracing::info!(cluster = %cluster.key(), member = %name, %reason, "deleted member");
        }
        Step::WipeBootstrap { reason } => {
            tracing::warn!(cluster = %cluster.key(), %reason, "wiping the failed bootstrap to retry it");
            ctx.runtime
                .teardown(cluster, false)
                .await
                .map_err(|e| e.to_string())?;
            if let Ok(mut memory) = ctx.memory.lock() {
                memory.remove(&cluster.key());
            }
        }
        Step::SnapshotBeforeUpgrade { from, to } => {
            let snapshot = pre_upgrade_snapshot(cluster, spec, observed, ctx, from, to).await?;
            *roll = Some(RollRecord {
                from: from.clone(),
                target: to.clone(),
                snapshot: Some(snapshot),
                ..Default::default()
            });
        }
        Step::ChangeVersion { name, from, to } => {
            match ctx.runtime.change_version(cluster, spec, name, to).await {
                Ok(()) => {
                    tracing::info!(cluster = %cluster.key(), member = %name, %from, %to, "restarted member on a new version")
                }
                // Nothing was touched: halt the roll with the reason rather than retry forever.
                Err(e @ RuntimeError::VersionUnavailable { .. }) => {
                    tracing::warn!(cluster = %cluster.key(), member = %name, error = %e, "the roll cannot proceed");
                    if let Some(r) = roll.as_mut() {
                        r.halted = Some(e.to_string());
                        r.failed_member = None;
                    }
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Step::RollBack {
            name,
            from,
            to,
            reason,
        } => {
            tracing::warn!(cluster = %cluster.key(), member = %name, %from, %to, %reason, "rolling the member back and halting the roll");
            ctx.runtime
                .change_version(cluster, spec, name, to)
                .await
                .map_err(|e| e.to_string())?;
            if let Some(r) = roll.as_mut() {
                r.halted = Some(format!("{reason}; it was started again on etcd {to}"));
                r.failed_member = Some(name.clone());
            }
        }
        Step::HaltUpgrade { name, reason } => {
            tracing::warn!(cluster = %cluster.key(), member = %name, %reason, "stopping the member and halting the roll");
            ctx.runtime.stop(cluster, name).await.map_err(|e| e.to_string())?;
            if let Some(r) = roll.as_mut() {
                r.halted = Some(reason.clone());
                r.failed_member = Some(name.clone());
            }
        }
        Step::Wait { .. } | Step::Idle => {}
    }
    Ok(())
}

/// Takes the snapshot before a roll from a healthy member (the leader when it answers) into the
/// runtime's place beside the cluster's data; returns where it went, or why it went nowhere.
async fn pre_upgrade_snapshot<R: Runtime>(
    cluster: &ClusterRef,
    spec: &ClusterSpecView,
    observed: &Observed,
    ctx: &Context<R>,
    from: &str,
    to: &str,
) -> Result<String, String> {
    let destination = spec.cluster.spec.backup.as_ref().map(|b| &b.destination);
    let beside = ctx.runtime.snapshot_dir(cluster);
    if beside.is_none() && destination.is_none() {
        tracing::info!(cluster = %cluster.key(), "no place for a pre-upgrade snapshot: no backup destination, and none beside the data in this runtime");
        return Ok("not taken: this runtime has no place beside the members' data reachable by the operator; configure backups to keep one".into());
    }
    let view = observed
        .etcd
        .as_ref()
        .ok_or_else(|| "snapshot: no member answers".to_string())?;
    let mut sources: Vec<&crate::model::EtcdMember> = view.voters().filter(|m| is_healthy(m)).collect();
    sources.sort_by_key(|m| m.id != view.leader);
    let endpoint = sources
        .iter()
        .find_map(|m| m.client_urls.first())
        .ok_or_else(|| "snapshot: no healthy member to take it from".to_string())?;
    let name = format!("pre-upgrade-{from}-to-{to}");
    let mut kept = Vec::new();
    let mut taken: Option<(bytes::Bytes, i64)> = None;
    if let Some(dir) = beside {
        let saved = etcd::save_snapshot(endpoint, &dir, &name)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(cluster = %cluster.key(), path = %saved.path.display(), revision = saved.revision, size = saved.size, "took the pre-upgrade snapshot");
        if destination.is_some() {
            let data = tokio::fs::read(&saved.path)
                .await
                .map_err(|e| format!("read the pre-upgrade snapshot {}: {e}", saved.path.display()))?;
            taken = Some((bytes::Bytes::from(data), saved.revision));
        }
        kept.push(saved.path.display().to_string());
    }
    if let Some(destination) = destination {
        // The same snapshot goes to the backup destination, among the one-shot backups (which
        // retention never deletes).
        let (data, revision) = match taken {
            Some(t) => t,
            None => {
                let s = crate::backup::snapshot::take_from(endpoint)
                    .await
                    .map_err(|e| e.to_string())?;
                (s.data, s.revision)
            }
        };
        crate::backup::policy::check_snapshot(&data).map_err(|e| format!("pre-upgrade snapshot: {e}"))?;
        let store = crate::backup::store::open(destination, &cluster.namespace, &ctx.backup_credentials)
            .await
            .map_err(|e| format!("send the pre-upgrade snapshot: {e}"))?;
        let dir =
            crate::backup::policy::cluster_dir(store.prefix.as_deref(), &cluster.namespace, &cluster.name);
        let key = crate::backup::policy::manual_key(&dir, &name, chrono::Utc::now(), revision);
        let sha256 = crate::backup::policy::sha256_hex(&data);
        store
            .put_snapshot(&key, data, &sha256)
            .await
            .map_err(|e| format!("send the pre-upgrade snapshot: {e}"))?;
        tracing::info!(cluster = %cluster.key(), location = %store.location(&key), "sent the pre-upgrade snapshot to the backup destination");
        kept.push(store.location(&key));
    }
    Ok(kept.join(" and "))
}

/// How often a status write is tried again after a conflict before the reconcile gives up
/// (and is requeued by the error policy).
const STATUS_WRITE_ATTEMPTS: usize = 4;

/// Writes `ours` as the status, conditional on the resourceVersion it is written onto. Another
/// writer of the same status (the backup controller: `lastBackup` and its condition) may write
/// between our read and our write; the API server then answers 409, and the status is read again
/// and what the other writer owns is taken from it before the next try. Nothing is written when
/// the stored status already says the same.
async fn write_status(
    api: &Api<EtcdCluster>,
    obj: &EtcdCluster,
    ours: &EtcdClusterStatus,
) -> Result<(), ReconcileError> {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let mut stored_status = obj.status.clone();
    let mut resource_version = obj.metadata.resource_version.clone().unwrap_or_default();
    let mut last_conflict = None;
    for _ in 0..STATUS_WRITE_ATTEMPTS {
        let status = status::rebase(ours, stored_status.as_ref());
        if stored_status
            .as_ref()
            .is_some_and(|old| !status::differs(old, &status))
        {
            return Ok(());
        }
        let patch = serde_json::from_value(status::status_patch(&status, &resource_version))
            .map_err(|e| ReconcileError::PatchStatus(kube::Error::SerdeError(e)))?;
        match api
            .patch_status(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(cluster = %name, "status changed since it was read; reading it again");
                last_conflict = Some(kube::Error::Api(e));
                let fresh = api.get_status(name).await.map_err(ReconcileError::ReadStatus)?;
                stored_status = fresh.status;
                resource_version = fresh.metadata.resource_version.unwrap_or_default();
            }
            Err(e) => return Err(ReconcileError::PatchStatus(e)),
        }
    }
    Err(ReconcileError::StatusConflict(Box::new(
        last_conflict
            .unwrap_or_else(|| kube::Error::Service(Box::new(std::io::Error::other("status conflict")))),
    )))
}

async fn apply<R: Runtime>(
    obj: &EtcdCluster,
    cluster: &ClusterRef,
    api: &Api<EtcdCluster>,
    ctx: &Context<R>,
) -> Result<Action, ReconcileError> {
    let mut desired = desired(obj, cluster);
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
                let outcome = Outcome {
                    step: Step::Idle,
                    error: Some(format!("{}: {error}", status::RESTORE_FAILED)),
                    roll: None,
                };
                let observed = Observed {
                    runtime: Vec::new(),
                    etcd: None,
                    timing: Timing::default(),
                };
                write_status(api, obj, &status::compute(obj, &observed, &outcome)).await?;
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
        }
    }
    let spec = ClusterSpecView { cluster: obj.clone() };
    let mut outcome = Outcome {
        step: Step::Idle,
        error: None,
        roll: None,
    };
    let mut observed = Observed {
        runtime: Vec::new(),
        etcd: None,
        timing: Timing::default(),
    };
    for _ in 0..MAX_STEPS_PER_RECONCILE {
        observed = match observe(cluster, ctx, &desired.version).await {
            Ok(o) => o,
            Err(e) => {
                outcome.error = Some(e.to_string());
                break;
            }
        };
        if let Some(roll) = desired.roll.as_mut()
            && roll.is_active_for(&desired.version)
            && plan::roll_finished(&desired.version, &observed)
        {
            tracing::info!(cluster = %cluster.key(), version = %desired.version, "the roll is complete");
            roll.complete = true;
        }
        let mut taken = Vec::new();
        let step = plan::plan(&desired, &observed, &ctx.thresholds, &mut || {
            fresh_name(cluster, &observed, &mut taken)
        });
        tracing::debug!(cluster = %cluster.key(), ?step, "planned");
        let result = act(&step, cluster, &spec, &observed, ctx, &mut desired.roll).await;
        let acted = step.is_action();
        outcome = Outcome {
            step,
            error: result.err(),
            roll: None,
        };
        if outcome.error.is_some() || !acted {
            break;
        }
        // A roll's milestones go to status before anything else happens.
        if matches!(
            outcome.step,
            Step::SnapshotBeforeUpgrade { .. } | Step::RollBack { .. } | Step::HaltUpgrade { .. }
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
        ) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if let Some(error) = &outcome.error {
        tracing::warn!(cluster = %cluster.key(), %error, "step failed");
    }
    outcome.roll = desired.roll.clone();
    let new_status = status::compute(obj, &observed, &outcome);
    if let Ok(mut all) = ctx.memory.lock() {
        all.entry(cluster.key()).or_default().roll = status::roll_record(Some(&new_status));
    }
    write_status(api, obj, &new_status).await?;
    Ok(match (&outcome.step, &outcome.error) {
        (_, Some(_)) => Action::requeue(Duration::from_secs(2)),
        // A settled cluster is looked at every 3 s: that bounds how long a dead member goes
        // unnoticed (the local runtime has no process events to wake the controller).
        (Step::Idle, None) => Action::requeue(Duration::from_secs(3)),
        (Step::Wait { .. }, None) => Action::requeue(Duration::from_millis(1000)),
        _ => Action::requeue(Duration::from_millis(300)),
    })
}

#[cfg(test)]
mod tests {
    //! The status write against a scripted API server (tower-test): the exact requests it makes
    //! when the backup controller wrote in between, and its failure paths.
    // The scripted scenario holds the kube client's request futures; it is awaited once per test.
    #![allow(clippy::large_futures)]

    use super::*;
    use etcd_operator_api::status::BackupStatus;
    use http::{Method, Request, Response, StatusCode};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::client::Body;
    use serde_json::{Value, json};
    use std::pin::pin;
    use tower_test::mock;

    const PATH: &str = "/apis/etcd.operator.dev/v1alpha2/namespaces/prod/etcdclusters/demo/status";

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    fn cluster(resource_version: &str, status: Option<EtcdClusterStatus>) -> EtcdCluster {
        let mut c = EtcdCluster::default();
        c.metadata.name = Some("demo".into());
        c.metadata.namespace = Some("prod".into());
        c.metadata.resource_version = Some(resource_version.into());
        c.status = status;
        c
    }

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Because".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn backup(revision: i64) -> BackupStatus {
        BackupStatus {
            revision: Some(revision),
            ..Default::default()
        }
    }

    /// What the member reconciler computed from the object at resourceVersion 5.
    fn ours() -> EtcdClusterStatus {
        EtcdClusterStatus {
            ready_replicas: Some(3),
            last_backup: Some(backup(4)),
            conditions: Some(vec![
                condition("Available", "True"),
                condition("BackupSucceeded", "False"),
            ]),
            ..Default::default()
        }
    }

    /// What the backup controller wrote after the reconciler read the object (resourceVersion 8).
    fn written_by_backup() -> EtcdCluster {
        cluster(
            "8",
            Some(EtcdClusterStatus {
                ready_replicas: Some(1),
                last_backup: Some(backup(9)),
                conditions: Some(vec![
                    condition("Available", "False"),
                    condition("BackupSucceeded", "True"),
                ]),
                ..Default::default()
            }),
        )
    }

    async fn expect(handle: &mut Handle, method: Method) -> (Value, mock::SendResponse<Response<Body>>) {
        let mut handle = pin!(handle);
        let (request, send) = handle.next_request().await.expect("a request");
        assert_eq!(request.method(), method);
        assert_eq!(request.uri().path(), PATH);
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (body, send)
    }

    fn reply(send: mock::SendResponse<Response<Body>>, code: StatusCode, body: &Value) {
        send.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(body).unwrap()))
                .unwrap(),
        );
    }

    fn conflict() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": "the object has been modified; please apply your changes to the latest version and try again"})
    }

    /// Runs `write_status(obj, ours())` beside `script`.
    async fn run(obj: EtcdCluster, script: impl AsyncFnOnce(&mut Handle)) -> Result<(), ReconcileError> {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<EtcdCluster> = Api::namespaced(kube::Client::new(service, "default"), "prod");
        let write = async move { write_status(&api, &obj, &ours()).await };
        let server = async move {
            script(&mut handle).await;
            let mut handle = pin!(&mut handle);
            if let Some((request, _)) = handle.next_request().await {
                panic!("unexpected request {} {}", request.method(), request.uri());
            }
        };
        let (out, ()) = tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(write, server) })
            .await
            .expect("the write waits for an answer the script does not give");
        out
    }

    #[tokio::test]
    async fn a_backup_written_between_read_and_write_survives() {
        let out = run(cluster("5", None), async |api| {
            let (body, send) = expect(api, Method::PATCH).await;
            assert_eq!(
                body[0],
                json!({"op": "add", "path": "/metadata/resourceVersion", "value": "5"})
            );
            assert_eq!(body[1]["value"]["lastBackup"]["revision"], 4);
            reply(send, StatusCode::CONFLICT, &conflict());
            let (_, send) = expect(api, Method::GET).await;
            reply(
                send,
                StatusCode::OK,
                &serde_json::to_value(written_by_backup()).unwrap(),
            );
            let (body, send) = expect(api, Method::PATCH).await;
            assert_eq!(body[0]["value"], "8");
            let status = &body[1]["value"];
            // The backup controller's fields from the fresh object, ours for the rest.
            assert_eq!(status["lastBackup"]["revision"], 9);
            assert_eq!(status["readyReplicas"], 3);
            let conditions: Vec<(&str, &str)> = status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
                .collect();
            assert_eq!(conditions, [("Available", "True"), ("BackupSucceeded", "True")]);
            reply(
                send,
                StatusCode::OK,
                &serde_json::to_value(cluster("9", None)).unwrap(),
            );
        })
        .await;
        assert!(out.is_ok(), "{out:?}");
    }

    #[tokio::test]
    async fn an_unchanged_status_is_not_written() {
        let stored = status::rebase(&ours(), None);
        let out = run(cluster("5", Some(stored)), async |_| {}).await;
        assert!(out.is_ok(), "{out:?}");
    }

    #[tokio::test]
    async fn a_status_that_keeps_changing_gives_up_after_the_attempts() {
        let out = run(cluster("5", None), async |api| {
            for _ in 0..STATUS_WRITE_ATTEMPTS {
                let (_, send) = expect(api, Method::PATCH).await;
                reply(send, StatusCode::CONFLICT, &conflict());
                let (_, send) = expect(api, Method::GET).await;
                reply(
                    send,
                    StatusCode::OK,
                    &serde_json::to_value(written_by_backup()).unwrap(),
                );
            }
        })
        .await;
        assert!(matches!(out, Err(ReconcileError::StatusConflict(_))), "{out:?}");
    }

    #[tokio::test]
    async fn other_write_and_read_errors_are_returned() {
        let out = run(cluster("5", None), async |api| {
            let (_, send) = expect(api, Method::PATCH).await;
            reply(
                send,
                StatusCode::FORBIDDEN,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "no"}),
            );
        })
        .await;
        assert!(
            matches!(out, Err(ReconcileError::PatchStatus(kube::Error::Api(ref e))) if e.code == 403),
            "{out:?}"
        );
        let out = run(cluster("5", None), async |api| {
            let (_, send) = expect(api, Method::PATCH).await;
            reply(send, StatusCode::CONFLICT, &conflict());
            let (_, send) = expect(api, Method::GET).await;
            reply(
                send,
                StatusCode::NOT_FOUND,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "gone"}),
            );
        })
        .await;
        assert!(
            matches!(out, Err(ReconcileError::ReadStatus(kube::Error::Api(ref e))) if e.code == 404),
            "{out:?}"
        );
    }
}
