//! Member operations on a running etcd cluster through etcd-client: observe the member list and
//! each member's status, add a learner, promote, remove, move leadership.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, MemberAddOptions};

use crate::model::{EtcdMember, EtcdView, MemberHealth};

/// How long one etcd call may take before the member counts as not answering.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// An etcd membership call failed.
#[derive(Debug, thiserror::Error)]
pub enum MemberOpError {
    /// No endpoint to talk to.
    #[error("{op}: no member endpoint to talk to")]
    NoEndpoint {
        /// The operation.
        op: &'static str,
    },
    /// etcd refused or failed.
    #[error("{op}: {source}")]
    Etcd {
        /// The operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: etcd_client::Error,
    },
    /// The call did not answer in time.
    #[error("{op}: no answer within {after:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The limit.
        after: Duration,
    },
}

impl MemberOpError {
    /// Whether etcd said "not yet" (a learner not caught up, a too-recent member add), which
    /// the reconciler answers by waiting rather than reporting a failure.
    pub fn is_not_ready_yet(&self) -> bool {
        let text = self.to_string();
        text.contains("not in sync with leader")
            || text.contains("unhealthy cluster")
            || text.contains("too many learner")
            || text.contains("re-configuration failed due to not enough started members")
    }
}

async fn connect(endpoints: &[String], op: &'static str) -> Result<Client, MemberOpError> {
    if endpoints.is_empty() {
        return Err(MemberOpError::NoEndpoint { op });
    }
    let options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(CALL_TIMEOUT);
    match tokio::time::timeout(CALL_TIMEOUT, Client::connect(endpoints, Some(options))).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(source)) => Err(MemberOpError::Etcd { op, source }),
        Err(_) => Err(MemberOpError::Timeout {
            op,
            after: CALL_TIMEOUT,
        }),
    }
}

async fn timed<T>(
    op: &'static str,
    fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, MemberOpError> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(MemberOpError::Etcd { op, source }),
        Err(_) => Err(MemberOpError::Timeout {
            op,
            after: CALL_TIMEOUT,
        }),
    }
}

/// The status of one member, asked at its own client URL.
async fn member_status(url: &str) -> Option<(u64, MemberHealth)> {
    let mut client = connect(&[url.to_string()], "status").await.ok()?;
    let status = timed("status", client.status()).await.ok()?;
    let cluster_id = status.header().map(|h| h.cluster_id()).unwrap_or_default();
    Some((
        cluster_id,
        MemberHealth {
            version: status.version().to_string(),
            raft_applied_index: status.raft_applied_index(),
            leader: status.leader(),
            errors: status.errors().to_vec(),
        },
    ))
}

/// The cluster as etcd reports it, asking the given client URLs; `None` when none answers
/// the member list (no member runs, or no quorum).
pub async fn observe(endpoints: &[String]) -> Option<EtcdView> {
    // One endpoint at a time: a member that has just started and does not listen yet must not
    // make the whole cluster look silent.
    let mut list = None;
    for endpoint in endpoints {
        if let Ok(mut client) = connect(std::slice::from_ref(endpoint), "member list").await
            && let Ok(answer) = timed("member list", client.member_list()).await
        {
            list = Some(answer);
            break;
        }
    }
    let list = list?;
    let mut view = EtcdView {
        cluster_id: list.header().map(|h| h.cluster_id()).unwrap_or_default(),
        ..Default::default()
    };
    let statuses = futures::future::join_all(list.members().iter().map(|m| {
        let url = m.client_urls().first().cloned();
        async move {
            match url {
                Some(url) => member_status(&url).await,
                None => None,
            }
        }
    }))
    .await;
    for (m, status) in list.members().iter().zip(statuses) {
        let health = status.map(|(_, h)| h);
        if let Some(h) = &health
            && h.leader != 0
        {
            view.leader = h.leader;
        }
        view.members.push(EtcdMember {
            id: m.id(),
            name: m.name().to_string(),
            peer_urls: m.peer_urls().to_vec(),
            client_urls: m.client_urls().to_vec(),
            learner: m.is_learner(),
            status: health,
        });
    }
    Some(view)
}

/// Adds a member as a learner; returns its ID.
pub async fn add_learner(endpoints: &[String], peer_url: &str) -> Result<u64, MemberOpError> {
    let mut client = connect(endpoints, "member add").await?;
    let resp = timed(
        "member add",
        client.member_add([peer_url], Some(MemberAddOptions::new().with_is_learner())),
    )
    .await?;
    Ok(resp.member().map(|m| m.id()).unwrap_or_default())
}

/// Promotes a learner to a voter.
pub async fn promote(endpoints: &[String], id: u64) -> Result<(), MemberOpError> {
    let mut client = connect(endpoints, "member promote").await?;
    timed("member promote", client.member_promote(id))
        .await
        .map(|_| ())
}

/// Removes a member.
pub async fn remove(endpoints: &[String], id: u64) -> Result<(), MemberOpError> {
    let mut client = connect(endpoints, "member remove").await?;
    timed("member remove", client.member_remove(id)).await.map(|_| ())
}

/// Moves leadership to `to`; must be sent to the leader's own client URL.
pub async fn move_leader(leader_url: &str, to: u64) -> Result<(), MemberOpError> {
    let mut client = connect(&[leader_url.to_string()], "move leader").await?;
    timed("move leader", client.move_leader(to)).await.map(|_| ())
}

/// Taking a snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// etcd refused or failed.
    #[error("snapshot: {0}")]
    Etcd(#[from] MemberOpError),
    /// Writing the file failed.
    #[error("snapshot: write {}: {source}", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The stream did not end in time.
    #[error("snapshot: not complete within {0:?}")]
    Timeout(Duration),
}

/// A snapshot written to a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedSnapshot {
    /// Where it was written.
    pub path: std::path::PathBuf,
    /// The revision of the cluster when it was asked for (the snapshot holds at least this).
    pub revision: i64,
    /// Its size in bytes.
    pub size: u64,
}

/// How long a whole snapshot stream may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

/// Streams a snapshot from the member at `endpoint` (etcd's maintenance API, which 3.4 and 3.5
/// both serve) into `dir/<prefix>-<revision>.db`, written under a temporary name and renamed
/// once complete, so a file with the final name is always a whole snapshot.
pub async fn save_snapshot(
    endpoint: &str,
    dir: &std::path::Path,
    prefix: &str,
) -> Result<SavedSnapshot, SnapshotError> {
    use tokio::io::AsyncWriteExt;

    let mut client = connect(&[endpoint.to_string()], "snapshot").await?;
    let status = timed("snapshot", client.status()).await?;
    let revision = status.header().map(|h| h.revision()).unwrap_or_default();
    let path = dir.join(format!("{prefix}-{revision}.db"));
    let partial = dir.join(format!(".{prefix}-{revision}.db.partial"));
    let write_error = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| SnapshotError::Write { path, source }
    };
    tokio::fs::create_dir_all(dir).await.map_err(write_error(dir))?;
    let copy = async {
        let mut stream = client.snapshot().await.map_err(|source| MemberOpError::Etcd {
            op: "snapshot",
            source,
        })?;
        let mut file = tokio::fs::File::create(&partial)
            .await
            .map_err(write_error(&partial))?;
        let mut size = 0u64;
        while let Some(chunk) = stream.message().await.map_err(|source| MemberOpError::Etcd {
            op: "snapshot",
            source,
        })? {
            file.write_all(chunk.blob())
                .await
                .map_err(write_error(&partial))?;
            size += chunk.blob().len() as u64;
        }
        file.sync_all().await.map_err(write_error(&partial))?;
        Ok::<u64, SnapshotError>(size)
    };
    let size = tokio::time::timeout(SNAPSHOT_TIMEOUT, copy)
        .await
        .map_err(|_| SnapshotError::Timeout(SNAPSHOT_TIMEOUT))??;
    tokio::fs::rename(&partial, &path)
        .await
        .map_err(write_error(&path))?;
    Ok(SavedSnapshot { path, revision, size })
}
