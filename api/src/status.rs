//! The observed state of a cluster, shared by every API version (`status` is written by the
//! controller and has the same shape in v1alpha1 and v1alpha2).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition type: the cluster has quorum and serves clients.
pub const CONDITION_AVAILABLE: &str = "Available";
/// Condition type: the controller is working towards the spec (scaling, upgrading, restoring).
pub const CONDITION_PROGRESSING: &str = "Progressing";
/// Condition type: some members are unhealthy or missing, or the last step failed.
pub const CONDITION_DEGRADED: &str = "Degraded";
/// Condition type (kstatus, for Flux health checks and dependency ordering, Argo CD, `kubectl
/// wait`): the cluster serves at the spec, nothing in progress, nothing degraded.
pub const CONDITION_READY: &str = "Ready";
/// Condition type (kstatus, abnormal-true): the controller is still working towards the spec.
pub const CONDITION_RECONCILING: &str = "Reconciling";
/// Condition type (kstatus, abnormal-true): the controller cannot reach the spec without a
/// person (a halted roll, corrupt or over-quota data, a failed restore, ...).
pub const CONDITION_STALLED: &str = "Stalled";
/// Condition type: `False` (reason `NamespaceNotWatched`) on a cluster in a namespace the
/// controller does not manage (`--watch-namespaces`); absent otherwise.
pub const CONDITION_MANAGED: &str = "Managed";
/// Condition type: the last scheduled backup succeeded (`True`) or failed (`False`).
pub const CONDITION_BACKUP_SUCCEEDED: &str = "BackupSucceeded";

string_enum! {
    /// The coarse lifecycle phase of a cluster.
    pub enum ClusterPhase {
        Pending => "Pending",
        Creating => "Creating",
        Running => "Running",
        Scaling => "Scaling",
        Upgrading => "Upgrading",
        Restoring => "Restoring",
        Paused => "Paused",
        Failed => "Failed",
    }
}

// The records of things that happen now and then (a backup, an upgrade, a rollout, a quorum
// recovery, a defragmentation) are boxed: a cluster that never had one pays a pointer, not the
// record's size, in every EtcdCluster the controllers' store holds (issue 24; see
// `v1alpha2::tests::a_stored_cluster_stays_small`). Serde and schemars treat `Box<T>` as `T`.
// (Plain comments here: doc comments become the schema's descriptions.)
/// The observed state of an etcd cluster. Written by the controller through the `/status`
/// subresource; ignored on writes to the main resource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    /// Coarse lifecycle phase: one of Pending, Creating, Running, Scaling, Upgrading, Restoring,
    /// Paused, Failed. Prefer `conditions` for automation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClusterPhase>,

    /// Current conditions of the cluster (Kubernetes condition shape). Types: `Available`,
    /// `Progressing`, `Degraded`, `BackupSucceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,

    /// The `metadata.generation` of the spec the controller last acted on. Written last, after
    /// every other status field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Number of members in the etcd cluster (the `/scale` subresource reports it as
    /// `status.replicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,

    /// Number of members that are healthy and started (not learners).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,

    /// The members of the etcd cluster as reported by etcd, joined with their Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<MemberStatus>>,

    /// The etcd cluster ID, in hexadecimal.
    #[serde(default, rename = "clusterID", skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,

    /// The name of the member that currently leads the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,

    /// The etcd version every member runs (the lowest member version during an upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,

    /// Client URLs of the voting members, for clients of the etcd cluster (learners are left
    /// out: they do not serve reads or writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_endpoints: Option<Vec<String>>,

    /// Label selector of the member Pods, in the string form used by the `/scale` subresource,
    /// e.g. `etcd.operator.dev/cluster=example`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// The last successful backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup: Option<Box<BackupStatus>>,

    /// Progress of the latest rolling version change (upgrade or permitted downgrade) started by
    /// a change of `spec.version`. Absent until the first one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<Box<UpgradeStatus>>,

    /// Progress of the latest rolling restart onto a changed member template: `spec.podTemplate`,
    /// `spec.repository`, and the etcd flags the spec amounts to (maintenance, quota). Members are
    /// re-created one at a time on their own data (followers first, the leader last after a
    /// leadership move), each health-gated. Absent until the first one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Box<RolloutStatus>>,

    /// The latest quorum recovery, asked for with the annotation
    /// `etcd.operator.dev/recover-quorum` (see docs/day2.md): what was chosen and what was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Box<RecoveryStatus>>,

    /// Routine maintenance the operator carried out: the latest defragmentation of each member
    /// (see `spec.maintenance.defragmentation`). Scheduled defragmentation resumes from it after
    /// an operator restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<Box<MaintenanceStatus>>,
}

/// Routine maintenance carried out on the members.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceStatus {
    /// When the latest defragmentation of any member finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_defragmentation: Option<Time>,

    /// The latest defragmentation of each current member (members never defragmented are
    /// absent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defragmentations: Vec<DefragmentationStatus>,

    /// The latest reclaim of space after a NOSPACE alarm: the history compacted, every member
    /// that answered defragmented, the alarms disarmed. A NOSPACE alarm that comes straight back
    /// after it (the data alone fills the quota) is not reclaimed again for a while, also
    /// across operator restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_space_reclaim: Option<SpaceReclaimStatus>,

    /// The latest leadership move asked for with the annotation `etcd.operator.dev/move-leader`,
    /// recorded once the named member leads (a request with the same value is not acted on
    /// again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_leader_transfer: Option<LeaderTransferStatus>,
}

/// A leadership move asked for with the annotation `etcd.operator.dev/move-leader`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderTransferStatus {
    /// The annotation's value this answered.
    #[serde(default)]
    pub request: String,

    /// The member that leads since.
    #[serde(default)]
    pub leader: String,

    /// When the operator saw it lead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

/// A reclaim of space after a NOSPACE alarm.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpaceReclaimStatus {
    /// When it finished (the alarms disarmed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,

    /// The revision the history was compacted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compacted_revision: Option<i64>,

    /// The members that were defragmented, one at a time, leader last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defragmented: Vec<String>,

    /// The members whose NOSPACE alarm was disarmed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disarmed: Vec<String>,
}

string_enum! {
    /// Why a member was defragmented.
    pub enum DefragmentationTrigger {
        /// `spec.maintenance.defragmentation.schedule` said so.
        Schedule => "Schedule",
        /// Its database file was mostly free space (the size trigger).
        Fragmentation => "Fragmentation",
        /// The annotation `etcd.operator.dev/defragment` asked for it.
        Requested => "Requested",
    }
}

/// One member's latest defragmentation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefragmentationStatus {
    /// The member name.
    #[serde(default)]
    pub member: String,

    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,

    /// Why it ran: `Schedule`, `Fragmentation` or `Requested`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<DefragmentationTrigger>,

    /// The size of the member's database file before, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size_before: Option<i64>,

    /// The bytes of that file in use before (what the file shrinks to, roughly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size_in_use_before: Option<i64>,
}

/// A quorum recovery the operator carried out: the cluster was rebuilt from one surviving member
/// (`--force-new-cluster`), and the other members' data was given up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryStatus {
    /// The annotation's value the recovery answered (a second recovery needs another value).
    #[serde(default)]
    pub request: String,

    /// The member the cluster was rebuilt from.
    #[serde(default)]
    pub survivor: String,

    /// The members whose data was given up (they are replaced by fresh members).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_members: Vec<String>,

    /// The raft index the survivor had applied, when it was running and answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survivor_applied_index: Option<i64>,

    /// When it was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

string_enum! {
    /// Where a rolling version change stands.
    pub enum UpgradePhase {
        /// Members are being restarted on the target version, one at a time.
        Rolling => "Rolling",
        /// Every member runs the target version, is healthy and caught up.
        Complete => "Complete",
        /// A member did not come up on the target version in time: the roll stopped and touches
        /// no further member until `spec.version` changes. `message` says why.
        Halted => "Halted",
    }
}

string_enum! {
    /// Where the etcd downgrade of a roll to an older minor (3.6 → 3.5) stands.
    pub enum DowngradePhase {
        /// etcd's downgrade is being validated and enabled, and the cluster waits for every
        /// member's storage version to go down; no member has been restarted yet.
        Enabling => "Enabling",
        /// The cluster and storage versions are at the target minor: members restart on it.
        StorageDowngraded => "StorageDowngraded",
        /// Every member runs the older version (etcd ended the downgrade).
        Complete => "Complete",
    }
}

/// A rolling version change: members restarted one at a time on the target version (followers
/// first, the leader last), each health-gated, after a snapshot of the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// The version the members ran when the roll started (the lowest, if they differed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_version: Option<String>,

    /// The version the roll moves to (`spec.version` when it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,

    /// One of Rolling, Complete, Halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<UpgradePhase>,

    /// Where the snapshot taken before the first member was touched was written, or why none
    /// was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,

    /// Members that run the target version, are healthy, caught up and report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_members: Option<i32>,

    /// Members in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_members: Option<i32>,

    /// The member being restarted (or that failed, when `Halted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_member: Option<String>,

    /// Why the roll halted, and what was done about the failed member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// For a roll to an older minor version (etcd's downgrade): Enabling, StorageDowngraded,
    /// Complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downgrade: Option<DowngradePhase>,
}

/// A rolling restart onto a changed member template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The hash of the member template the members move to (recorded on each member as the
    /// annotation `etcd.operator.dev/template-hash` in Kubernetes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,

    /// One of Rolling, Complete, Halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<UpgradePhase>,

    /// Members that run the template and are healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_members: Option<i32>,

    /// Members in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_members: Option<i32>,

    /// The member being re-created (or that did not come back, when `Halted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_member: Option<String>,

    /// Why the rollout halted. A halted rollout touches no further member until the template
    /// changes again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One etcd member, as seen by etcd and by the controller.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// The member name (also the name of its Pod).
    #[serde(default)]
    pub name: String,

    /// The etcd member ID, in hexadecimal (as `etcdctl member list -w table` prints it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,

    /// The etcd server version the member reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// Whether the member is a non-voting learner that is still catching up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learner: Option<bool>,

    /// Whether the member is the current raft leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<bool>,

    /// Whether the member answered its last health check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,

    /// Size of the member's database file in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size: Option<i64>,

    /// Bytes of the database file in use; the difference to `dbSize` is what a
    /// defragmentation gives back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size_in_use: Option<i64>,

    /// Alarms etcd raised for the member (`NOSPACE`, `CORRUPT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarms: Option<Vec<String>>,
}

/// A completed backup (snapshot) of the cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// When the snapshot was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,

    /// The etcd revision the snapshot contains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,

    /// Size of the snapshot in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,

    /// Where the snapshot was written, e.g. `s3://bucket/prefix/name.db` or a path in a volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,

    /// SHA-256 of the snapshot file, in lowercase hexadecimal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}
