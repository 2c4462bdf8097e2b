//! The member-operations seam: everything the controller asks a running etcd cluster (observe the
//! member list and each member's status, add a learner, promote, remove, move leadership, take a
//! snapshot) goes through the [`MemberOps`] trait. [`EtcdClient`] is the real one (etcd-client,
//! one cached connection per member endpoint); [`fake::FakeMemberOps`] answers from a script, so
//! the reconciler's `act` is unit-tested without etcd.

mod client;
pub mod fake;
pub mod file;
pub mod hedge;
pub mod stream;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

pub use client::EtcdClient;
pub use stream::{SnapshotStream, Verified};

use crate::tls::member::ClientTls;

use crate::backup_policy::SnapshotCheckError;
use crate::model::EtcdView;

/// An etcd membership or maintenance call failed.
#[derive(Debug, thiserror::Error)]
pub enum MemberOpError {
    /// No endpoint to talk to.
    #[error("{op}: no member endpoint to talk to")]
    NoEndpoint {
        /// The operation.
        op: &'static str,
    },
    /// etcd answered "not yet": a learner not caught up, a member added less than 5 s ago, a
    /// cluster that is not healthy enough to change its membership. The reconciler waits.
    #[error("{op}: not possible yet: {detail}")]
    NotReadyYet {
        /// The operation.
        op: &'static str,
        /// What etcd said.
        detail: String,
    },
    /// etcd refused or failed.
    #[error("etcd {op}")]
    Etcd {
        /// The operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: etcd_client::Error,
    },
    /// The TLS handshake failed: a certificate expired, is not from the expected CA, or was
    /// refused by the other side.
    #[error("{op}: TLS handshake failed: {detail}")]
    Tls {
        /// The operation.
        op: &'static str,
        /// What rustls said.
        detail: String,
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
    /// Whether etcd said "not yet", which the reconciler answers by waiting rather than
    /// reporting a failure.
    pub fn is_not_ready_yet(&self) -> bool {
        matches!(self, Self::NotReadyYet { .. })
    }
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
    #[error("snapshot from {endpoint}")]
    Etcd {
        /// The member.
        endpoint: String,
        /// Cause.
        #[source]
        source: MemberOpError,
    },
    /// Writing the file failed.
    #[error("snapshot: write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Reading a snapshot file back failed.
    #[error("snapshot: read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
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
    #[error("snapshot from {endpoint} is corrupt")]
    Corrupt {
        /// The member.
        endpoint: String,
        /// What is wrong.
        #[source]
        source: SnapshotCheckError,
    },
}

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

/// A snapshot written to a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedSnapshot {
    /// Where it was written.
    pub path: PathBuf,
    /// The revision of the cluster when it was asked for (the snapshot holds at least this).
    pub revision: i64,
    /// Its size in bytes.
    pub size: u64,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: String,
}

/// What the controller asks a running etcd cluster. Endpoints are member client URLs; a call
/// given several tries them in order until one answers.
pub trait MemberOps: Send + Sync + 'static {
    /// The members at `endpoints` serve their client plane with TLS and expect this identity
    /// (`None`: plain HTTP). Every later call to them, whoever makes it (a reconcile, a backup,
    /// the `snapshot` subresource), uses it.
    fn use_tls(&self, endpoints: &[String], tls: Option<&ClientTls>);

    /// The cluster as etcd reports it (member list from the first endpoint that answers, then
    /// each member's own status); when none answers the member list, why the last one did not.
    fn observe(&self, endpoints: &[String]) -> impl Future<Output = Result<EtcdView, MemberOpError>> + Send;

    /// Adds a member as a learner; returns its ID.
    fn add_learner(
        &self,
        endpoints: &[String],
        peer_url: &str,
    ) -> impl Future<Output = Result<u64, MemberOpError>> + Send;

    /// Promotes a learner to a voter.
    fn promote(
        &self,
        endpoints: &[String],
        id: u64,
    ) -> impl Future<Output = Result<(), MemberOpError>> + Send;

    /// Removes a member.
    fn remove(&self, endpoints: &[String], id: u64)
    -> impl Future<Output = Result<(), MemberOpError>> + Send;

    /// Compacts the cluster's history up to its current revision (physically) and returns that
    /// revision; a history compacted there already is no failure.
    fn compact(&self, endpoints: &[String]) -> impl Future<Output = Result<i64, MemberOpError>> + Send;

    /// Defragments the database of the member at `endpoint` (it serves nothing meanwhile).
    fn defragment(&self, endpoint: &str) -> impl Future<Output = Result<(), MemberOpError>> + Send;

    /// Disarms an alarm of a member.
    fn disarm(
        &self,
        endpoints: &[String],
        alarm: crate::model::MemberAlarm,
    ) -> impl Future<Output = Result<(), MemberOpError>> + Send;

    /// Validates, then enables etcd's downgrade of the cluster to `version` (`major.minor`): the
    /// cluster version and every member's storage version go down to it, after which members
    /// may restart on that version's binary (etcd 3.6 and later).
    fn enable_downgrade(
        &self,
        endpoints: &[String],
        version: &str,
    ) -> impl Future<Output = Result<(), MemberOpError>> + Send;

    /// Moves leadership to `to`; must be sent to the leader's own client URL.
    fn move_leader(
        &self,
        leader_url: &str,
        to: u64,
    ) -> impl Future<Output = Result<(), MemberOpError>> + Send;

    /// Streams a snapshot from the member at `endpoint` into memory and checks it (small
    /// snapshots; everything else uses [`Self::snapshot_stream`]).
    fn snapshot(&self, endpoint: &str) -> impl Future<Output = Result<Snapshot, SnapshotError>> + Send;

    /// Opens a snapshot stream at the member at `endpoint`: its chunks, checked while they pass
    /// (see [`SnapshotStream`]), in bounded memory whatever the database size.
    fn snapshot_stream(
        &self,
        endpoint: &str,
    ) -> impl Future<Output = Result<SnapshotStream, SnapshotError>> + Send;

    /// Streams a snapshot from the member at `endpoint` into `dir/<prefix>-<revision>.db`,
    /// checked while it streams and written under a temporary name that is renamed once whole,
    /// so a file with the final name is always a complete, valid snapshot.
    fn save_snapshot(
        &self,
        endpoint: &str,
        dir: &std::path::Path,
        prefix: &str,
    ) -> impl Future<Output = Result<SavedSnapshot, SnapshotError>> + Send;
}
