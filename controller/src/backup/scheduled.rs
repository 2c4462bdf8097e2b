//! The scheduled-backup controller: a kube-runtime `Controller` over EtcdClusters with
//! `spec.backup`. When the schedule says a snapshot is due (the first occurrence after the last
//! one), it takes it, stores it, applies retention, and records `status.lastBackup` and the
//! `BackupSucceeded` condition; a failure sets the condition to `False` with the reason and
//! retries with backoff until the snapshot is taken (a failed run is never skipped).

use std::sync::Arc;
use std::time::Duration;

use etcd_operator_api::status::{CONDITION_BACKUP_SUCCEEDED, EtcdClusterStatus};
use etcd_operator_api::v1alpha2::EtcdCluster;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::{BackupContext, BackupError, BackupRecord, take_and_store};
use crate::backup_policy::{self as policy, from_time, to_time};
use crate::backup_store as store;

/// Status writes retried on a resourceVersion conflict.
const PATCH_ATTEMPTS: usize = 5;

/// Runs the controller on `clusters` (its own watch when `None`) until `shutdown` resolves.
pub async fn run(
    ctx: Arc<BackupContext>,
    clusters: Option<kube::runtime::Controller<EtcdCluster>>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let clusters = clusters.unwrap_or_else(|| crate::cluster_watch::controller(Api::all(ctx.client.clone())));
    clusters
        .reconcile_all_on(ctx.shards.changes())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "scheduled backup reconcile failed");
            }
        })
        .await;
}

fn error_policy(_obj: Arc<EtcdCluster>, error: &BackupError, _ctx: Arc<BackupContext>) -> Action {
    tracing::warn!(error = %etcd_operator_api::report::Chain(error), "scheduled backup: retrying");
    Action::requeue(Duration::from_secs(5))
}

fn until(t: chrono::DateTime<chrono::Utc>) -> Duration {
    (t - chrono::Utc::now())
        .to_std()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_millis(200))
}

async fn reconcile(obj: Arc<EtcdCluster>, ctx: Arc<BackupContext>) -> Result<Action, BackupError> {
    let Ok(view) = crate::validated::ValidatedCluster::new(&obj) else {
        return Ok(Action::await_change());
    };
    let (namespace, name) = (view.cluster.namespace.clone(), view.cluster.name.clone());
    let Some(_shard) = ctx.shards.enter(&namespace, &name) else {
        return Ok(Action::await_change());
    };
    let Some(backup) = view.backup.clone() else {
        ctx.metrics.record_backup(&namespace, &name, None);
        return Ok(Action::await_change());
    };
    if obj.metadata.deletion_timestamp.is_some() {
        ctx.metrics.record_backup(&namespace, &name, None);
        return Ok(Action::await_change());
    }
    if view.paused {
        return Ok(Action::await_change());
    }
    let key = format!("{namespace}/{name}");
    let api: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let cron = match policy::parse_schedule(&backup.schedule) {
        Ok(cron) => cron,
        Err(e) => {
            // Admission rejects such schedules; one stored before the rule changed lands here.
            let message = format!(
                "schedule {:?} is invalid: {}",
                backup.schedule,
                etcd_operator_api::report::Chain(&e)
            );
            patch_status(
                &api,
                &name,
                obj.metadata.generation,
                None,
                false,
                "InvalidSchedule",
                &message,
            )
            .await?;
            return Ok(Action::await_change());
        }
    };
    let status = obj.status.clone().unwrap_or_default();
    let recorded = status
        .last_backup
        .as_ref()
        .and_then(|b| b.time.as_ref())
        .and_then(from_time);
    let remembered = ctx.last_taken.lock().ok().and_then(|m| m.get(&key).copied());
    let last = recorded.max(remembered);
    ctx.metrics.record_backup(&namespace, &name, last);
    let created = obj
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(from_time)
        .unwrap_or_else(chrono::Utc::now);
    let Some(due) = policy::next_due(&cron, last, created) else {
        return Ok(Action::await_change());
    };
    if due > chrono::Utc::now() {
        return Ok(Action::requeue(until(due)));
    }
    if let Some(wait) = ctx.backing_off(&key) {
        return Ok(Action::requeue(wait));
    }
    let endpoints = status.client_endpoints.clone().unwrap_or_default();
    let result = take_and_store(
        &ctx,
        &backup.destination,
        &namespace,
        &name,
        &endpoints,
        policy::scheduled_key,
    )
    .await;
    match result {
        Ok(record) => {
            ctx.succeeded(&key);
            ctx.metrics.record_backup(&namespace, &name, Some(record.taken));
            if let Ok(mut m) = ctx.last_taken.lock() {
                m.insert(key.clone(), record.taken);
            }
            let message = format!(
                "snapshot of revision {} stored at {}",
                record.revision, record.location
            );
            patch_status(
                &api,
                &name,
                obj.metadata.generation,
                Some(&record),
                true,
                "BackupSucceeded",
                &message,
            )
            .await?;
            if let Err(e) = apply_retention(&ctx, &backup, &namespace, &name).await {
                tracing::warn!(cluster = %key, error = %etcd_operator_api::report::Chain(&e), "backup retention failed; retrying after the next snapshot");
            }
            match policy::next_due(&cron, Some(record.taken), created) {
                Some(next) => Ok(Action::requeue(until(next))),
                None => Ok(Action::await_change()),
            }
        }
        Err(error) => {
            let delay = ctx.failed(&key);
            ctx.metrics.backup_failed(error.reason());
            let failures = ctx.failures(&key);
            tracing::warn!(cluster = %key, error = %etcd_operator_api::report::Chain(&error), failures, retry_in = ?delay, "scheduled backup failed");
            let message = format!(
                "{} (attempt {failures}; retrying in {}s)",
                etcd_operator_api::report::Chain(&error),
                delay.as_secs()
            );
            patch_status(
                &api,
                &name,
                obj.metadata.generation,
                None,
                false,
                error.reason(),
                &message,
            )
            .await?;
            Ok(Action::requeue(delay))
        }
    }
}

/// Deletes the snapshots retention no longer keeps.
async fn apply_retention(
    ctx: &BackupContext,
    backup: &etcd_operator_api::v1alpha2::BackupSpec,
    namespace: &str,
    name: &str,
) -> Result<(), BackupError> {
    let (max_count, max_age) = policy::retention_limits(backup.retention.as_ref());
    let dest = store::open(&backup.destination, namespace, &ctx.credentials).await?;
    let dir = policy::cluster_dir(dest.prefix.as_deref(), namespace, name);
    let keys = dest.list_snapshots(&dir).await?;
    for key in policy::expired(&keys, chrono::Utc::now(), max_count, max_age) {
        dest.delete_snapshot(&key).await?;
        tracing::info!(cluster = %format!("{namespace}/{name}"), location = %dest.location(&key), "retention deleted snapshot");
    }
    // The manual snapshots beside them, under the same limits, counted apart.
    super::prune_manual(
        &dest,
        &dir,
        backup.retention.as_ref(),
        &format!("{namespace}/{name}"),
    )
    .await?;
    Ok(())
}

/// The conditions with ours set (its transition time kept when its status did not change).
pub fn with_condition(existing: &[Condition], new: Condition) -> Vec<Condition> {
    let mut out: Vec<Condition> = existing
        .iter()
        .filter(|c| c.type_ != new.type_)
        .cloned()
        .collect();
    let mut new = new;
    if let Some(old) = existing.iter().find(|c| c.type_ == new.type_)
        && old.status == new.status
    {
        new.last_transition_time = old.last_transition_time.clone();
    }
    out.push(new);
    out
}

/// The status merge patch: `lastBackup` (when given) and the full condition list with ours
/// replaced, guarded by the resourceVersion it was computed from (a conflict re-reads).
pub fn status_patch(
    current: &EtcdClusterStatus,
    resource_version: Option<&str>,
    condition: Condition,
    record: Option<&BackupRecord>,
) -> Value {
    let conditions = with_condition(current.conditions.as_deref().unwrap_or_default(), condition);
    let mut status = json!({"conditions": conditions});
    if let Some(r) = record {
        status["lastBackup"] = json!({
            "time": to_time(r.taken),
            "revision": r.revision,
            "size": r.size,
            "location": r.location,
            "sha256": r.sha256,
        });
    }
    json!({"metadata": {"resourceVersion": resource_version}, "status": status})
}

async fn patch_status(
    api: &Api<EtcdCluster>,
    name: &str,
    generation: Option<i64>,
    record: Option<&BackupRecord>,
    ok: bool,
    reason: &str,
    message: &str,
) -> Result<(), BackupError> {
    let condition = Condition {
        type_: CONDITION_BACKUP_SUCCEEDED.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: to_time(chrono::Utc::now()),
    };
    let mut last_error = None;
    for _ in 0..PATCH_ATTEMPTS {
        let current = api.get_status(name).await.map_err(|source| BackupError::Read {
            what: format!("EtcdCluster {name}"),
            source,
        })?;
        let patch = status_patch(
            &current.status.unwrap_or_default(),
            current.metadata.resource_version.as_deref(),
            condition.clone(),
            record,
        );
        match api
            .patch_status(
                name,
                &crate::resources::status_patch_params(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => last_error = Some(kube::Error::Api(e)),
            Err(e) => return Err(BackupError::PatchStatus(e)),
        }
    }
    Err(BackupError::PatchStatus(last_error.unwrap_or_else(|| {
        kube::Error::Service(Box::new(std::io::Error::other("status conflict")))
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(t: &str, s: &str, at: i64) -> Condition {
        Condition {
            type_: t.into(),
            status: s.into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::from_second(at).unwrap(),
            ),
        }
    }

    #[test]
    fn only_our_condition_changes_and_keeps_its_transition_time() {
        let existing = vec![cond("Available", "True", 1), cond("BackupSucceeded", "True", 2)];
        let out = with_condition(&existing, cond("BackupSucceeded", "True", 9));
        assert_eq!(out[0], existing[0]);
        assert_eq!(out[1].last_transition_time.0.as_second(), 2);
        let out = with_condition(&existing, cond("BackupSucceeded", "False", 9));
        assert_eq!(out[1].last_transition_time.0.as_second(), 9);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn the_patch_touches_only_last_backup_and_conditions_under_the_resource_version() {
        let status = EtcdClusterStatus {
            conditions: Some(vec![cond("Available", "True", 1)]),
            replicas: Some(3),
            ..Default::default()
        };
        let record = BackupRecord {
            taken: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            revision: 42,
            size: 4096,
            location: "s3://b/k.db".into(),
            key: "k.db".into(),
            sha256: "ab".into(),
        };
        let patch = status_patch(
            &status,
            Some("17"),
            cond("BackupSucceeded", "True", 5),
            Some(&record),
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "17");
        let keys: Vec<&String> = patch["status"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["conditions", "lastBackup"]);
        assert_eq!(patch["status"]["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(patch["status"]["lastBackup"]["revision"], 42);
        assert_eq!(patch["status"]["lastBackup"]["time"], "2023-11-14T22:13:20Z");
        let failed = status_patch(&status, Some("17"), cond("BackupSucceeded", "False", 5), None);
        assert!(failed["status"].get("lastBackup").is_none());
    }
}
