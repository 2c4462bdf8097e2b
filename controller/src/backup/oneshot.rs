//! The EtcdBackup controller: a kube-runtime `Controller` over EtcdBackups. A new backup goes
//! `Pending` → `Running` → `Succeeded` (size, revision, location, SHA-256) or, after
//! [`MAX_ATTEMPTS`] failed attempts with backoff, `Failed` with the last error. A finished
//! backup is never taken again.

use std::sync::Arc;
use std::time::Duration;

use etcd_operator_api::backup::{BackupPhase, EtcdBackup, EtcdBackupStatus};
use etcd_operator_api::v1alpha2::EtcdCluster;
use futures::StreamExt;
use kube::api::{Api, Patch};
use kube::runtime::controller::{Action, Controller};
use serde_json::json;

use super::{BackupContext, BackupError, take_and_store};
use crate::backup_policy::{self as policy, from_time, to_time};

/// Attempts before a backup is `Failed`.
pub const MAX_ATTEMPTS: i32 = 5;

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<BackupContext>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<EtcdBackup> = Api::all(ctx.client.clone());
    Controller::new(api, crate::cluster_watch::watch_config())
        .reconcile_all_on(ctx.shards.changes())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "EtcdBackup reconcile failed");
            }
        })
        .await;
}

fn error_policy(_obj: Arc<EtcdBackup>, error: &BackupError, _ctx: Arc<BackupContext>) -> Action {
    tracing::warn!(error = %etcd_operator_api::report::Chain(error), "EtcdBackup: retrying");
    Action::requeue(Duration::from_secs(5))
}

/// What one attempt decided, as the next status (pure, so every branch is unit-tested).
pub fn next_status(
    current: &EtcdBackupStatus,
    outcome: Result<&super::BackupRecord, (&str, String)>,
    now: chrono::DateTime<chrono::Utc>,
) -> EtcdBackupStatus {
    let attempts = current.attempts.unwrap_or(0).saturating_add(1);
    let mut next = EtcdBackupStatus {
        attempts: Some(attempts),
        start_time: current.start_time.clone().or_else(|| Some(to_time(now))),
        ..EtcdBackupStatus::default()
    };
    match outcome {
        Ok(r) => {
            next.phase = Some(BackupPhase::Succeeded);
            next.completion_time = Some(to_time(now));
            next.size = Some(r.size);
            next.revision = Some(r.revision);
            next.location = Some(r.location.clone());
            next.sha256 = Some(r.sha256.clone());
            next.message = Some(format!("snapshot of revision {} stored", r.revision));
        }
        Err((reason, message)) if attempts >= MAX_ATTEMPTS || reason == "NoDestination" => {
            next.phase = Some(BackupPhase::Failed);
            next.completion_time = Some(to_time(now));
            next.message = Some(format!("{reason}: {message}"));
        }
        Err((reason, message)) => {
            next.phase = Some(BackupPhase::Running);
            next.message = Some(format!(
                "{reason}: {message} (attempt {attempts} of {MAX_ATTEMPTS}; retrying)"
            ));
        }
    }
    next
}

/// Whether a backup in this state is left alone: finished, or being deleted.
fn settled(obj: &EtcdBackup) -> bool {
    obj.status
        .as_ref()
        .and_then(|s| s.phase.as_ref())
        .is_some_and(BackupPhase::is_finished)
        || obj.metadata.deletion_timestamp.is_some()
}

async fn reconcile(obj: Arc<EtcdBackup>, ctx: Arc<BackupContext>) -> Result<Action, BackupError> {
    let (Some(namespace), Some(name)) = (obj.metadata.namespace.clone(), obj.metadata.name.clone()) else {
        return Ok(Action::await_change());
    };
    // Taken by the replica that reconciles the cluster it backs up.
    let Some(_shard) = ctx.shards.enter(&namespace, &obj.spec.cluster_name) else {
        return Ok(Action::await_change());
    };
    if settled(&obj) {
        seed_metric(&obj, &namespace, &ctx).await;
        return Ok(Action::await_change());
    }
    let key = format!("backup:{namespace}/{name}");
    if let Some(wait) = ctx.backing_off(&key) {
        return Ok(Action::requeue(wait));
    }
    let api: Api<EtcdBackup> = Api::namespaced(ctx.client.clone(), &namespace);
    // The watched copy can lag behind this controller's own last write: a reconcile queued by
    // the `Running` write may run after the `Succeeded` one with the cache still saying
    // `Running`, and would take the snapshot a second time. The object as stored decides.
    let obj = match api.get_opt(&name).await {
        Ok(Some(fresh)) => fresh,
        Ok(None) => return Ok(Action::await_change()),
        Err(source) => {
            return Err(BackupError::Read {
                what: format!("EtcdBackup {name}"),
                source,
            });
        }
    };
    if settled(&obj) {
        return Ok(Action::await_change());
    }
    let mut current = obj.status.clone().unwrap_or_default();
    if current.phase != Some(BackupPhase::Running) {
        let running = EtcdBackupStatus {
            phase: Some(BackupPhase::Running),
            start_time: Some(to_time(chrono::Utc::now())),
            ..current.clone()
        };
        write_status(&api, &name, &running).await?;
        current = running;
    }
    let clusters: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let cluster_name = obj.spec.cluster_name.clone();
    let outcome = match clusters.get_opt(&cluster_name).await {
        Err(source) => Err(BackupError::Read {
            what: format!("EtcdCluster {cluster_name}"),
            source,
        }),
        Ok(None) => {
            let s = finish(
                &current,
                Err((
                    "ClusterNotFound",
                    format!("EtcdCluster {namespace}/{cluster_name} does not exist"),
                )),
            );
            let ended = Ended::Failed("ClusterNotFound");
            return retry_or_stop(&api, &name, &ctx, &key, s, (&namespace, &cluster_name), ended).await;
        }
        Ok(Some(cluster)) => {
            let policy = crate::validated::ValidatedCluster::new(&cluster)
                .ok()
                .and_then(|view| view.backup);
            let destination = obj
                .spec
                .destination
                .clone()
                .or_else(|| policy.as_ref().map(|b| b.destination.clone()));
            let Some(destination) = destination else {
                let s = finish(
                    &current,
                    Err((
                        "NoDestination",
                        format!(
                            "spec.destination is unset and EtcdCluster {cluster_name} has no spec.backup.destination"
                        ),
                    )),
                );
                let ended = Ended::Failed("NoDestination");
                return retry_or_stop(&api, &name, &ctx, &key, s, (&namespace, &cluster_name), ended).await;
            };
            let endpoints = cluster
                .status
                .as_ref()
                .and_then(|s| s.client_endpoints.clone())
                .unwrap_or_default();
            let taken = take_and_store(
                &ctx,
                &destination,
                &namespace,
                &cluster_name,
                &endpoints,
                |dir, taken, rev| policy::manual_key(dir, &name, taken, rev),
            )
            .await;
            if taken.is_ok() {
                super::prune_manual_after_snapshot(
                    &ctx.credentials,
                    &destination,
                    &namespace,
                    &cluster_name,
                    policy.as_ref().and_then(|b| b.retention.as_ref()),
                )
                .await;
            }
            taken
        }
    };
    let (status, ended) = match &outcome {
        Ok(record) => (finish(&current, Ok(record)), Ended::Succeeded),
        Err(e) => (
            finish(&current, Err((e.reason(), etcd_operator_api::report::chain(e)))),
            Ended::Failed(e.reason()),
        ),
    };
    retry_or_stop(
        &api,
        &name,
        &ctx,
        &key,
        status,
        (&namespace, &cluster_name),
        ended,
    )
    .await
}

/// How an attempt ended, for the metrics once the backup is finished.
enum Ended {
    /// The snapshot was stored.
    Succeeded,
    /// It failed for this reason.
    Failed(&'static str),
}

/// A backup that succeeded before this controller started (an operator restart, a new leader)
/// still counts for its cluster's last-success series, while the cluster exists (a deleted
/// cluster's series stays gone).
async fn seed_metric(obj: &EtcdBackup, namespace: &str, ctx: &BackupContext) {
    let Some(completed) = obj
        .status
        .as_ref()
        .filter(|s| s.phase == Some(BackupPhase::Succeeded))
        .and_then(|s| s.completion_time.as_ref())
        .and_then(from_time)
    else {
        return;
    };
    if obj.metadata.deletion_timestamp.is_some() {
        return;
    }
    let cluster = &obj.spec.cluster_name;
    let clusters: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), namespace);
    match clusters.get_opt(cluster).await {
        Ok(Some(_)) => ctx.metrics.record_etcdbackup(namespace, cluster, completed),
        Ok(None) => {}
        Err(error) => {
            tracing::debug!(error = %etcd_operator_api::report::Chain(&error), cluster, "EtcdBackup metric: the cluster could not be read")
        }
    }
}

fn finish(
    current: &EtcdBackupStatus,
    outcome: Result<&super::BackupRecord, (&str, String)>,
) -> EtcdBackupStatus {
    next_status(current, outcome, chrono::Utc::now())
}

async fn retry_or_stop(
    api: &Api<EtcdBackup>,
    name: &str,
    ctx: &BackupContext,
    key: &str,
    status: EtcdBackupStatus,
    (namespace, cluster): (&str, &str),
    ended: Ended,
) -> Result<Action, BackupError> {
    write_status(api, name, &status).await?;
    if status.phase.as_ref().is_some_and(BackupPhase::is_finished) {
        match ended {
            Ended::Succeeded => {
                if let Some(completed) = status.completion_time.as_ref().and_then(from_time) {
                    ctx.metrics.record_etcdbackup(namespace, cluster, completed);
                }
            }
            Ended::Failed(reason) => ctx.metrics.etcdbackup_failed(reason),
        }
        ctx.succeeded(key);
        Ok(Action::await_change())
    } else {
        Ok(Action::requeue(ctx.failed(key)))
    }
}

async fn write_status(
    api: &Api<EtcdBackup>,
    name: &str,
    status: &EtcdBackupStatus,
) -> Result<(), BackupError> {
    // The controller owns the whole status of an EtcdBackup: a merge patch replacing it is safe.
    let patch = json!({"status": status});
    api.patch_status(
        name,
        &crate::resources::status_patch_params(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
    .map_err(BackupError::PatchStatus)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> super::super::BackupRecord {
        super::super::BackupRecord {
            taken: chrono::Utc::now(),
            revision: 7,
            size: 1000,
            location: "/b/x.db".into(),
            key: "x.db".into(),
            sha256: "ff".into(),
        }
    }

    #[test]
    fn success_records_everything() {
        let s = next_status(&EtcdBackupStatus::default(), Ok(&record()), chrono::Utc::now());
        assert_eq!(s.phase, Some(BackupPhase::Succeeded));
        assert_eq!((s.size, s.revision), (Some(1000), Some(7)));
        assert_eq!(s.location.as_deref(), Some("/b/x.db"));
        assert_eq!(s.sha256.as_deref(), Some("ff"));
        assert!(s.start_time.is_some() && s.completion_time.is_some());
    }

    #[test]
    fn failures_retry_until_the_limit_and_a_missing_destination_fails_at_once() {
        let mut s = EtcdBackupStatus::default();
        for attempt in 1..MAX_ATTEMPTS {
            s = next_status(&s, Err(("SnapshotFailed", "boom".into())), chrono::Utc::now());
            assert_eq!(s.phase, Some(BackupPhase::Running), "attempt {attempt}");
        }
        s = next_status(&s, Err(("SnapshotFailed", "boom".into())), chrono::Utc::now());
        assert_eq!(s.phase, Some(BackupPhase::Failed));
        assert_eq!(s.message.as_deref(), Some("SnapshotFailed: boom"));
        let s = next_status(
            &EtcdBackupStatus::default(),
            Err(("NoDestination", "none".into())),
            chrono::Utc::now(),
        );
        assert_eq!(s.phase, Some(BackupPhase::Failed));
    }
}
