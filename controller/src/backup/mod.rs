//! Backups: scheduled snapshots of EtcdClusters with retention (`spec.backup`) and one-shot
//! `EtcdBackup`s, each driven by its own kube-runtime `Controller`.
//!
//! - [`crate::backup_policy`] holds the pure rules (names sortable by time, retention, schedule,
//!   backoff, snapshot integrity) and [`crate::backup_store`] opens destinations through
//!   `object_store` (S3-compatible bucket or directory): top-level modules below this one, since
//!   `member_ops`, `validated` and `restore` use them too;
//! - [`snapshot`] picks the member a snapshot comes from (a healthy follower when there is one);
//! - [`scheduled`] is the controller over EtcdClusters with `spec.backup`;
//! - [`oneshot`] is the controller over EtcdBackups.

pub mod oneshot;
pub mod scheduled;
pub mod snapshot;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use etcd_operator_api::v1alpha2::BackupDestination;

use crate::backup_policy as policy;
use crate::backup_store as store;
/// How the backup controllers reach a destination's credentials (the type lives with the stores).
pub use crate::backup_store::Credentials;

/// What a completed backup produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupRecord {
    /// When the snapshot was taken.
    pub taken: chrono::DateTime<chrono::Utc>,
    /// The revision it holds (at least).
    pub revision: i64,
    /// Its size in bytes.
    pub size: i64,
    /// Where it was written (`s3://bucket/key` or a path).
    pub location: String,
    /// The key inside the destination.
    pub key: String,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: String,
}

/// Taking or storing a backup failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The cluster reports no client endpoint yet.
    #[error("the cluster reports no client endpoints (is it running?)")]
    NoEndpoints,
    /// The snapshot could not be taken.
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    /// The destination could not be opened or written.
    #[error(transparent)]
    Destination(#[from] store::DestinationError),
    /// Streaming the snapshot into the destination failed.
    #[error(transparent)]
    Store(#[from] store::StoreSnapshotError),
    /// Writing status failed.
    #[error("patch status")]
    PatchStatus(#[source] kube::Error),
    /// Reading an object failed.
    #[error("read {what}")]
    Read {
        /// What was read.
        what: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

impl BackupError {
    /// The reason of the condition or status that reports this error (CamelCase).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoEndpoints | Self::Snapshot(snapshot::SnapshotError::NoHealthyMember { .. }) => {
                "NoHealthyMember"
            }
            Self::Snapshot(_) | Self::Store(store::StoreSnapshotError::Snapshot(_)) => "SnapshotFailed",
            Self::Destination(_) | Self::Store(store::StoreSnapshotError::Destination(_)) => {
                "DestinationUnavailable"
            }
            Self::PatchStatus(_) | Self::Read { .. } => "APIError",
        }
    }
}

/// Shared by the backup controllers.
pub struct BackupContext {
    client: kube::Client,
    credentials: Credentials,
    /// How members are reached for snapshots.
    members: crate::member_ops::EtcdClient,
    /// Consecutive failures per cluster or backup (`namespace/name`), for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The last scheduled snapshot per cluster, in case the status we see lags behind our write.
    last_taken: Mutex<HashMap<String, chrono::DateTime<chrono::Utc>>>,
    /// After a failure, no new attempt before this instant (our own status write triggers a
    /// reconcile at once; this keeps the backoff).
    not_before: Mutex<HashMap<String, std::time::Instant>>,
    /// Where the last successful backup of each cluster and the failures are recorded.
    metrics: crate::metrics::ControllerMetrics,
    /// Which clusters are this replica's (default: all); backups follow their cluster.
    shards: crate::shard::ShardOwnership,
}

impl std::fmt::Debug for BackupContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupContext")
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl BackupContext {
    /// A context: `client` reaches the EtcdCluster API; `credentials` says where S3 keys come
    /// from.
    pub fn new(client: kube::Client, credentials: Credentials) -> Self {
        Self {
            client,
            credentials,
            members: crate::member_ops::EtcdClient::default(),
            failures: Mutex::new(HashMap::new()),
            last_taken: Mutex::new(HashMap::new()),
            not_before: Mutex::new(HashMap::new()),
            metrics: crate::metrics::ControllerMetrics::default(),
            shards: crate::shard::ShardOwnership::all(),
        }
    }

    /// Backs up only the clusters of the shards `shards` holds (default: every cluster).
    pub fn with_shards(mut self, shards: crate::shard::ShardOwnership) -> Self {
        self.shards = shards;
        self
    }

    /// Records backups in `metrics` (the member controller's, so that a deleted cluster's
    /// series go with its other ones).
    pub fn with_metrics(mut self, metrics: crate::metrics::ControllerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Reaches members through `members` (shared connections; TLS when it has it).
    pub fn with_member_ops(mut self, members: crate::member_ops::EtcdClient) -> Self {
        self.members = members;
        self
    }

    /// Records a failure; returns the delay before the next attempt (exponential backoff).
    fn failed(&self, key: &str) -> std::time::Duration {
        let n = match self.failures.lock() {
            Ok(mut map) => {
                let n = map.entry(key.to_owned()).or_insert(0);
                *n = n.saturating_add(1);
                *n
            }
            Err(_) => 1,
        };
        let delay = policy::backoff(n);
        if let Ok(mut map) = self.not_before.lock() {
            map.insert(key.to_owned(), std::time::Instant::now() + delay);
        }
        delay
    }

    /// How long to wait before the next attempt, if a backoff is running.
    fn backing_off(&self, key: &str) -> Option<std::time::Duration> {
        let map = self.not_before.lock().ok()?;
        let until = *map.get(key)?;
        until
            .checked_duration_since(std::time::Instant::now())
            .filter(|d| !d.is_zero())
    }

    /// Consecutive failures so far.
    fn failures(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .ok()
            .and_then(|m| m.get(key).copied())
            .unwrap_or(0)
    }

    fn succeeded(&self, key: &str) {
        if let Ok(mut map) = self.failures.lock() {
            map.remove(key);
            crate::sparse::shrink_when_sparse(&mut map);
        }
        if let Ok(mut map) = self.not_before.lock() {
            map.remove(key);
            crate::sparse::shrink_when_sparse(&mut map);
        }
    }
}

/// Runs both backup controllers until `shutdown` resolves.
pub async fn run(ctx: BackupContext, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    run_on(ctx, None, shutdown).await;
}

/// [`run`], the scheduled backups on `clusters` (a [`crate::cluster_watch::shared`] watch).
pub async fn run_on(
    ctx: BackupContext,
    clusters: Option<kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = std::sync::Arc::new(ctx);
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let stop = async move {
        shutdown.await;
        let _ = tx.send(true);
    };
    tokio::join!(
        stop,
        scheduled::run(ctx.clone(), clusters, stopped(rx.clone())),
        oneshot::run(ctx, stopped(rx)),
    );
}

/// Snapshots the cluster at `endpoints` and stores it at `destination` under the key
/// `key_for(dir, taken, revision)`, where `dir` is the cluster's directory in the destination.
pub async fn take_and_store(
    ctx: &BackupContext,
    destination: &BackupDestination,
    namespace: &str,
    cluster: &str,
    endpoints: &[String],
    key_for: impl FnOnce(&str, chrono::DateTime<chrono::Utc>, i64) -> String,
) -> Result<BackupRecord, BackupError> {
    if endpoints.is_empty() {
        return Err(BackupError::NoEndpoints);
    }
    // Open the destination first: an unreachable bucket costs no snapshot.
    let dest = store::open(destination, namespace, &ctx.credentials).await?;
    let stream = snapshot::open(&ctx.members, endpoints).await?;
    let (taken, revision, from) = (stream.taken, stream.revision, stream.endpoint.clone());
    let dir = policy::cluster_dir(dest.prefix.as_deref(), namespace, cluster);
    let key = key_for(&dir, taken, revision);
    let location = dest.location(&key);
    tracing::info!(%namespace, %cluster, %location, revision, %from, "streaming snapshot to the destination");
    let verified = dest.put_snapshot_stream(&key, stream).await?;
    let size = i64::try_from(verified.size).unwrap_or(i64::MAX);
    tracing::info!(%namespace, %cluster, %location, size, revision, %from, "snapshot stored");
    Ok(BackupRecord {
        taken,
        revision,
        size,
        location,
        key,
        sha256: verified.sha256,
    })
}

/// Deletes the manual snapshots (EtcdBackups, pre-upgrade snapshots) under `dir`, the cluster's
/// directory in `dest`, that `retention` no longer keeps — the cluster's `spec.backup.retention`,
/// counted among manual snapshots only; the newest 7 when there is none. Returns the deleted keys.
pub async fn prune_manual(
    dest: &store::Destination,
    dir: &str,
    retention: Option<&etcd_operator_api::v1alpha2::BackupRetention>,
    cluster: &str,
) -> Result<Vec<String>, store::DestinationError> {
    let (max_count, max_age) = policy::retention_limits(retention);
    let keys = dest.list_snapshots(&policy::manual_dir(dir)).await?;
    let expired = policy::expired_manual(&keys, chrono::Utc::now(), max_count, max_age);
    for key in &expired {
        dest.delete_snapshot(key).await?;
        tracing::info!(%cluster, location = %dest.location(key), "retention deleted manual snapshot");
    }
    Ok(expired)
}

/// [`prune_manual`] after a manual snapshot went to `destination`: opens it, and logs a failure
/// instead of failing the snapshot that was taken (the next one, or the next scheduled
/// backup's retention, tries again).
pub async fn prune_manual_after_snapshot(
    credentials: &Credentials,
    destination: &BackupDestination,
    namespace: &str,
    cluster: &str,
    retention: Option<&etcd_operator_api::v1alpha2::BackupRetention>,
) {
    let key = format!("{namespace}/{cluster}");
    let result = match store::open(destination, namespace, credentials).await {
        Ok(dest) => {
            let dir = policy::cluster_dir(dest.prefix.as_deref(), namespace, cluster);
            prune_manual(&dest, &dir, retention, &key).await.map(|_| ())
        }
        Err(e) => Err(e),
    };
    if let Err(error) = result {
        tracing::warn!(cluster = %key, error = %etcd_operator_api::report::Chain(&error), "retention of manual snapshots failed; retried after the next snapshot");
    }
}
