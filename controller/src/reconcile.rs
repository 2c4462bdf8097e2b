//! The controller loop: a kube-runtime `Controller` over EtcdClusters with a finalizer. Each
//! reconcile observes (runtime + etcd), plans one safe step, acts, and repeats a few times while
//! steps are quick; then it writes status (observedGeneration last) and requeues.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_operator_api::v1alpha2::EtcdCluster;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::watcher;
use serde_json::json;

use crate::etcd;
use crate::model::{ClusterRef, InitialState, Liveness, is_healthy};
use crate::plan::{self, Desired, Observed, Step, Thresholds, Timing};
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
}

/// What the controller remembers between reconciles (lost on restart, which only delays).
#[derive(Debug, Default)]
struct Memory {
    bootstrap_since: Option<Instant>,
    unhealthy_since: HashMap<String, Instant>,
}

/// Shared by every reconcile.
pub struct Context<R: Runtime> {
    client: kube::Client,
    runtime: R,
    thresholds: Thresholds,
    memory: Mutex<HashMap<String, Memory>>,
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
        }
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
async fn observe<R: Runtime>(cluster: &ClusterRef, ctx: &Context<R>) -> Result<Observed, RuntimeError> {
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

/// Carries out one step.
async fn act<R: Runtime>(
    step: &Step,
    cluster: &ClusterRef,
    spec: &ClusterSpecView,
    observed: &Observed,
    ctx: &Context<R>,
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
        Step::Wait { .. } | Step::Idle => {}
    }
    Ok(())
}

async fn apply<R: Runtime>(
    obj: &EtcdCluster,
    cluster: &ClusterRef,
    api: &Api<EtcdCluster>,
    ctx: &Context<R>,
) -> Result<Action, ReconcileError> {
    let desired = desired(obj, cluster);
    let spec = ClusterSpecView { cluster: obj.clone() };
    let mut outcome = Outcome {
        step: Step::Idle,
        error: None,
    };
    let mut observed = Observed {
        runtime: Vec::new(),
        etcd: None,
        timing: Timing::default(),
    };
    for _ in 0..MAX_STEPS_PER_RECONCILE {
        observed = match observe(cluster, ctx).await {
            Ok(o) => o,
            Err(e) => {
                outcome.error = Some(e.to_string());
                break;
            }
        };
        let mut taken = Vec::new();
        let step = plan::plan(&desired, &observed, &ctx.thresholds, &mut || {
            fresh_name(cluster, &observed, &mut taken)
        });
        tracing::debug!(cluster = %cluster.key(), ?step, "planned");
        let result = act(&step, cluster, &spec, &observed, ctx).await;
        let acted = step.is_action();
        outcome = Outcome {
            step,
            error: result.err(),
        };
        if outcome.error.is_some() || !acted {
            break;
        }
        // Give what was started a moment before looking again.
        if matches!(
            outcome.step,
            Step::Start { .. } | Step::AddLearner { .. } | Step::MoveLeader { .. }
        ) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if let Some(error) = &outcome.error {
        tracing::warn!(cluster = %cluster.key(), %error, "step failed");
    }
    let new_status = status::compute(obj, &observed, &outcome);
    if obj
        .status
        .as_ref()
        .is_none_or(|old| status::differs(old, &new_status))
    {
        // JSON patch `add` replaces the whole status, so fields that went away are removed.
        let patch = json!([{"op": "add", "path": "/status", "value": new_status}]);
        api.patch_status(
            obj.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(patch)
                    .map_err(|e| ReconcileError::PatchStatus(kube::Error::SerdeError(e)))?,
            ),
        )
        .await
        .map_err(ReconcileError::PatchStatus)?;
    }
    Ok(match (&outcome.step, &outcome.error) {
        (_, Some(_)) => Action::requeue(Duration::from_secs(2)),
        // A settled cluster is looked at every 3 s: that bounds how long a dead member goes
        // unnoticed (the local runtime has no process events to wake the controller).
        (Step::Idle, None) => Action::requeue(Duration::from_secs(3)),
        (Step::Wait { .. }, None) => Action::requeue(Duration::from_millis(1000)),
        _ => Action::requeue(Duration::from_millis(300)),
    })
}
