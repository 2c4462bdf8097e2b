//! The controller's vocabulary: which cluster, how a member is configured, and what the runtime
//! and etcd report about members, and the snapshot a member is restored from. Plain data, shared
//! by the planner, runtimes and reconciler; it imports no other module of the controller.

use etcd_operator_api::v1alpha2::BackupDestination;
use serde::{Deserialize, Serialize};

/// The EtcdCluster a member belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterRef {
    /// Namespace of the EtcdCluster.
    pub namespace: String,
    /// Name of the EtcdCluster.
    pub name: String,
    /// UID of the EtcdCluster (owner references; the cluster token).
    pub uid: String,
}

impl ClusterRef {
    /// `<namespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// How a member joins: as part of a brand-new cluster, or into a running one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InitialState {
    /// `--initial-cluster-state=new`: static bootstrap with every initial member.
    New,
    /// `--initial-cluster-state=existing`: joins a running cluster (after a member add).
    Existing,
}

impl InitialState {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Existing => "existing",
        }
    }
}

/// Everything etcd needs to start a member, decided once and persisted with the member so a
/// restarted operator starts it the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberConfig {
    /// etcd version to run, e.g. `3.5.1`.
    pub version: String,
    /// `--initial-cluster` as (name, peer URL) pairs.
    pub initial_cluster: Vec<(String, String)>,
    /// `--initial-cluster-state`.
    pub initial_state: InitialState,
    /// `--initial-cluster-token`.
    pub cluster_token: String,
    /// The version the member ran before its last version change (set by
    /// [`crate::runtime::Runtime::change_version`]): where a failed upgrade rolls back to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_version: Option<String>,
    /// The snapshot a member of a cluster bootstrapped from a backup starts from
    /// (`spec.bootstrap.restore`): restored into its data directory before its first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestorePlan>,
}

impl MemberConfig {
    /// `--initial-cluster` as etcd wants it: `a=http://..,b=http://..`.
    pub fn initial_cluster_flag(&self) -> String {
        self.initial_cluster
            .iter()
            .map(|(n, u)| format!("{n}={u}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Whether a member's process (or Pod) runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// Addresses and storage are reserved; never started (no config yet, or not started yet).
    Reserved,
    /// The process or Pod runs.
    Running,
    /// It was started and is gone now (process exited, Pod failed or deleted).
    Gone {
        /// Why, for status and events.
        reason: String,
        /// Whether its data survived, so starting it again brings the member back (a volume
        /// or data directory still there); otherwise it must be replaced.
        restartable: bool,
    },
}

/// A member as the runtime sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeMember {
    /// Member name (Pod name in Kubernetes).
    pub name: String,
    /// Peer URL other members reach it on.
    pub peer_url: String,
    /// Client URL.
    pub client_url: String,
    /// The start configuration, once decided.
    pub config: Option<MemberConfig>,
    /// Process state.
    pub liveness: Liveness,
    /// Its TLS certificates, when it uses TLS and the runtime issued them.
    pub certificates: Option<MemberCertificates>,
    /// How often the platform restarted its process after it exited (the kubelet's
    /// `restartCount` of the etcd container). 0 where the operator restarts members itself
    /// (local): there each exit shows as [`Liveness::Gone`].
    pub restarts: u32,
    /// The hash of the member template it was created with (see
    /// [`crate::runtime::Runtime::template_hash`]); `None` when it does not run or was created
    /// before templates were recorded (such a member is adopted as it is, not rolled).
    pub template_hash: Option<String>,
    /// Its persistent volume, where the runtime has one per member (Kubernetes: its claim).
    pub volume: Option<VolumeState>,
    /// When it was created (reserved): its claim's (else its Pod's) creation on Kubernetes, the
    /// time recorded in its directory locally; `None` when unknown. A scale down removes the
    /// newest member first.
    pub created: Option<chrono::DateTime<chrono::Utc>>,
}

/// A member's persistent volume as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VolumeState {
    /// The size its claim requests, in bytes.
    pub requested: u64,
    /// The size the volume has, in bytes (0 until the claim reports one).
    pub capacity: u64,
    /// The volume grew, and its filesystem is resized when the member's Pod starts again
    /// (the claim's `FileSystemResizePending` condition).
    pub resize_pending: bool,
}

/// What the runtime knows about a member's certificates, so the planner can decide on a
/// rotation without reading files or Secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberCertificates {
    /// How long the earliest-expiring of its certificates stays valid (zero once expired),
    /// measured when the runtime observed it.
    pub valid_for: std::time::Duration,
    /// The on-demand rotation (annotation value) they were issued under.
    pub rotation: Option<String>,
    /// Why it does not yet run on what the cluster's CA rotation asks (trust bundle, issuing
    /// CA); `None` when it does, or when no `auto` plane has a CA.
    pub authority: Option<AuthorityLag>,
}

/// Why a member does not yet run on what its plane's phase of the CA rotation asks
/// (`tls::authority` decides it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorityLag {
    /// It trusts another set of CAs than the phase's bundle.
    Trust,
    /// Its certificates are not issued by the CA that issues now.
    Issuer,
}

impl std::fmt::Display for AuthorityLag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Trust => "it trusts another set of CAs than the rotation's current one",
            Self::Issuer => "its certificates are not yet issued by the new CA",
        })
    }
}

/// A member as etcd's member list reports it, joined with its status when it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    /// Member ID.
    pub id: u64,
    /// Name (empty until the member has started once).
    pub name: String,
    /// Peer URLs.
    pub peer_urls: Vec<String>,
    /// Client URLs (empty until started).
    pub client_urls: Vec<String>,
    /// Non-voting learner.
    pub learner: bool,
    /// Health and version, when its endpoint answered a status request.
    pub status: Option<MemberHealth>,
}

/// What a member's own status endpoint said.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberHealth {
    /// Server version.
    pub version: String,
    /// Raft applied index.
    pub raft_applied_index: u64,
    /// The leader it sees (0: none).
    pub leader: u64,
    /// Errors it reports other than alarms (empty when healthy); alarms are in
    /// [`EtcdView::alarms`].
    pub errors: Vec<String>,
    /// Size of its database file in bytes.
    pub db_size: u64,
    /// Bytes of the database file in use (the rest is free pages a defragmentation returns).
    pub db_size_in_use: u64,
    /// The storage version of its data (`3.6.0`); etcd 3.5 and older report none.
    pub storage_version: Option<String>,
    /// The version an enabled downgrade moves the cluster to (`3.5.0`), as etcd 3.6 reports it.
    pub downgrade_target: Option<String>,
}

/// An alarm etcd raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmKind {
    /// The backend quota is exceeded: the cluster refuses writes until space is reclaimed and
    /// the alarm disarmed.
    NoSpace,
    /// A member's data differs from the others' (corruption check): never fixed blindly.
    Corrupt,
}

impl AlarmKind {
    /// etcd's name of the alarm.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSpace => "NOSPACE",
            Self::Corrupt => "CORRUPT",
        }
    }
}

/// An alarm raised on a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberAlarm {
    /// The member's ID.
    pub member: u64,
    /// The alarm.
    pub alarm: AlarmKind,
}

/// The cluster as etcd reports it (from any member that answered).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdView {
    /// Cluster ID.
    pub cluster_id: u64,
    /// The member list.
    pub members: Vec<EtcdMember>,
    /// Current leader ID (0: none known).
    pub leader: u64,
    /// Alarms raised in the cluster (from etcd's alarm list).
    pub alarms: Vec<MemberAlarm>,
}

impl EtcdView {
    /// Voting members.
    pub fn voters(&self) -> impl Iterator<Item = &EtcdMember> {
        self.members.iter().filter(|m| !m.learner)
    }

    /// Voters that answered their status without errors and see a leader.
    pub fn healthy_voters(&self) -> usize {
        self.voters().filter(|m| is_healthy(m)).count()
    }

    /// The member with this peer URL.
    pub fn by_peer_url(&self, url: &str) -> Option<&EtcdMember> {
        self.members.iter().find(|m| m.peer_urls.iter().any(|u| u == url))
    }
}

/// Whether a member answered its status, reports no errors and sees a leader.
pub fn is_healthy(m: &EtcdMember) -> bool {
    m.status
        .as_ref()
        .is_some_and(|s| s.errors.is_empty() && s.leader != 0)
}

/// Quorum of a cluster of `voters` voting members.
pub fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

// --- restore plans: plain data (the restore module fetches and restores; `restore` re-exports
// these), so that this module depends on nothing of the controller's

/// Where a snapshot comes from, resolved. Serializable, so a member's start configuration can
/// carry it (a restarted operator restores the same way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SnapshotSource {
    /// A key in a backup destination (its `.sha256` sidecar, when present, is checked).
    Store {
        /// The destination.
        destination: BackupDestination,
        /// The key inside it.
        key: String,
    },
    /// An `http`, `https` or `s3` URL (`<url>.sha256`, when present, is checked). `s3://` URLs
    /// use the operator's ambient AWS configuration.
    Url(String),
}

/// A snapshot to restore: its source and the checksum it must have, when known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestorePlan {
    /// Where to fetch it.
    pub source: SnapshotSource,
    /// The SHA-256 recorded when it was taken (an EtcdBackup's `status.sha256`).
    pub expected_sha256: Option<String>,
}
