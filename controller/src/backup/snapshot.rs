//! Taking a snapshot: pick a healthy member (a follower when there is one, so the leader keeps
//! its bandwidth), stream etcd's `Snapshot` RPC into memory while hashing it, and check it.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use sha2::{Digest, Sha256};

use super::policy::{self, SnapshotCheckError};
use crate::model::is_healthy;

/// How long connecting to a member may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a whole snapshot may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(600);

/// A snapshot in memory.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The database file as `etcdutl snapshot restore` reads it (with etcd's trailing hash).
    pub data: bytes::Bytes,
    /// SHA-256 of `data`, lowercase hex.
    pub sha256: String,
    /// The revision of the member when the snapshot began (the snapshot holds at least this).
    pub revision: i64,
    /// The member it was taken from.
    pub endpoint: String,
    /// When it was taken.
    pub taken: chrono::DateTime<chrono::Utc>,
}

/// Taking a snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// No member answered as healthy.
    #[error("no healthy member to take a snapshot from (asked {asked:?})")]
    NoHealthyMember {
        /// The endpoints asked.
        asked: Vec<String>,
    },
    /// etcd failed while streaming.
    #[error("snapshot from {endpoint}: {source}")]
    Etcd {
        /// The member.
        endpoint: String,
        /// Cause.
        #[source]
        source: etcd_client::Error,
    },
    /// The stream did not finish in time.
    #[error("snapshot from {endpoint} did not finish within {after:?}")]
    Timeout {
        /// The member.
        endpoint: String,
        /// The limit.
        after: Duration,
    },
    /// The snapshot failed its integrity check.
    #[error("snapshot from {endpoint} is corrupt: {source}")]
    Corrupt {
        /// The member.
        endpoint: String,
        /// What is wrong.
        #[source]
        source: SnapshotCheckError,
    },
}

/// The members to try, best first: healthy followers, then the healthy leader. Uses the member
/// list etcd reports (asked at `endpoints`), so a stale status cannot send us to a dead member.
pub async fn candidates(endpoints: &[String]) -> Vec<String> {
    let Some(view) = crate::etcd::observe(endpoints).await else {
        return Vec::new();
    };
    let mut healthy: Vec<(bool, String)> = view
        .voters()
        .filter(|m| is_healthy(m))
        .filter_map(|m| Some((m.id == view.leader, m.client_urls.first()?.clone())))
        .collect();
    // Followers (false) sort before the leader (true).
    healthy.sort();
    healthy.into_iter().map(|(_, url)| url).collect()
}

async fn connect(endpoint: &str) -> Result<Client, SnapshotError> {
    let options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
    Client::connect([endpoint], Some(options))
        .await
        .map_err(|source| SnapshotError::Etcd {
            endpoint: endpoint.to_owned(),
            source,
        })
}

/// Streams a snapshot from one member and checks it.
pub async fn take_from(endpoint: &str) -> Result<Snapshot, SnapshotError> {
    let etcd = |source| SnapshotError::Etcd {
        endpoint: endpoint.to_owned(),
        source,
    };
    let work = async {
        let mut client = connect(endpoint).await?;
        let taken = chrono::Utc::now();
        // The revision first: the snapshot that follows contains at least this revision.
        let head = client
            .get("\0", Some(GetOptions::new().with_count_only()))
            .await
            .map_err(etcd)?;
        let revision = head.header().map(|h| h.revision()).unwrap_or_default();
        let mut stream = client.maintenance_client().snapshot().await.map_err(etcd)?;
        let mut data = Vec::new();
        let mut hasher = Sha256::new();
        while let Some(chunk) = stream.message().await.map_err(etcd)? {
            hasher.update(chunk.blob());
            data.extend_from_slice(chunk.blob());
        }
        policy::check_snapshot(&data).map_err(|source| SnapshotError::Corrupt {
            endpoint: endpoint.to_owned(),
            source,
        })?;
        Ok(Snapshot {
            data: bytes::Bytes::from(data),
            sha256: hex::encode(hasher.finalize()),
            revision,
            endpoint: endpoint.to_owned(),
            taken,
        })
    };
    match tokio::time::timeout(SNAPSHOT_TIMEOUT, work).await {
        Ok(result) => result,
        Err(_) => Err(SnapshotError::Timeout {
            endpoint: endpoint.to_owned(),
            after: SNAPSHOT_TIMEOUT,
        }),
    }
}

/// Takes a snapshot from the best healthy member among those `endpoints` lead to, trying the
/// next one when a member fails.
pub async fn take(endpoints: &[String]) -> Result<Snapshot, SnapshotError> {
    let candidates = candidates(endpoints).await;
    let mut last = SnapshotError::NoHealthyMember {
        asked: endpoints.to_vec(),
    };
    for endpoint in candidates {
        match take_from(&endpoint).await {
            Ok(snapshot) => return Ok(snapshot),
            Err(e) => {
                tracing::warn!(%endpoint, error = %e, "snapshot failed; trying another member");
                last = e;
            }
        }
    }
    Err(last)
}
