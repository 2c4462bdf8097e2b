//! `etcd.operator.dev/v1alpha2`: the hub, storage and preferred version of `EtcdCluster`.
//!
//! Every other version converts to and from this one (see [`crate::convert`]), validation runs
//! on it (see [`crate::validation`]) and the API server stores it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::status::EtcdClusterStatus;

/// The version string of this module.
pub const VERSION: &str = "v1alpha2";
/// `apiVersion` of objects of this version.
pub const API_VERSION: &str = "etcd.operator.dev/v1alpha2";

/// Default for `spec.replicas`.
pub const DEFAULT_REPLICAS: i32 = 3;
/// Default for `spec.repository`.
pub const DEFAULT_REPOSITORY: &str = "gcr.io/etcd-development/etcd";
/// Default for `spec.storage.size`.
pub const DEFAULT_STORAGE_SIZE: &str = "1Gi";
/// Default for `spec.backup.retention.maxCount` when neither `maxCount` nor `maxAge` is set.
pub const DEFAULT_BACKUP_MAX_COUNT: i32 = 7;
/// Annotation on an EtcdCluster asking for its member certificates to be issued again now: when
/// its value changes, every member whose certificates were issued under another value gets new
/// ones and restarts on them, one at a time with the health gate of an upgrade (see
/// `docs/tls.md`). Any value works; a timestamp is customary.
pub const ROTATE_CERTIFICATES_ANNOTATION: &str = "etcd.operator.dev/rotate-certificates";
/// Annotation on an EtcdCluster asking for its `auto` CAs to be rotated: when its value changes,
/// a new CA is made for each `auto` plane and rolled in through a trust bundle that holds both CAs
/// (trust the new CA, issue from it, drop the old one: three rolls, one member at a time), so no
/// member and no client is cut off (see `docs/tls.md`). Any value works; a timestamp is customary.
pub const ROTATE_CA_ANNOTATION: &str = "etcd.operator.dev/rotate-ca";
/// Annotation on an EtcdCluster that has lost quorum asking the operator to rebuild it from one
/// surviving member: the value names that member, or is `auto` for the running member that has
/// applied the most of the log. Nothing is rebuilt without it (see `docs/day2.md`); each value is
/// acted on once, and the result is recorded in `status.recovery`.
pub const RECOVER_QUORUM_ANNOTATION: &str = "etcd.operator.dev/recover-quorum";
/// Annotation on an EtcdCluster asking the operator to replace the named member now, whatever
/// `spec.replacement` says (the safety rules still hold: quorum kept, no alarm, not the member
/// furthest ahead). The replaced member's name is never used again, so the request is done once
/// that member is gone; the annotation may then be removed (see `docs/day2.md`).
pub const REPLACE_MEMBER_ANNOTATION: &str = "etcd.operator.dev/replace-member";
/// Annotation on an EtcdCluster asking for every member to be defragmented now: its value is a
/// time (RFC 3339, e.g. `2026-11-27T01:00:00Z`), and every voting member not defragmented since
/// then is defragmented, one at a time under the gate and order of scheduled defragmentation
/// (followers first, the leader after handing leadership over). The time may not be in the
/// future (it then waits for it); `status.maintenance.defragmentations` records each member with
/// trigger `Requested`. `kubectl etcd defrag` writes it (see `docs/day2.md`).
pub const DEFRAGMENT_ANNOTATION: &str = "etcd.operator.dev/defragment";
/// Annotation on an EtcdCluster asking the operator to hand raft leadership to the named voting
/// member, once all voters are healthy. Text after an `@` is ignored, so the same member can be
/// asked for again with another value (`kubectl etcd move-leader` writes `<member>@<unix time>`).
/// Each value is acted on once: `status.maintenance.lastLeaderTransfer` records the request once
/// the member leads; a name that is no voting member asks for nothing (see `docs/day2.md`).
pub const MOVE_LEADER_ANNOTATION: &str = "etcd.operator.dev/move-leader";

/// An etcd cluster managed by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdCluster {
    /// APIVersion defines the versioned schema of this representation of an object: here
    /// `etcd.operator.dev/v1alpha2`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,

    /// Kind is a string value representing the REST resource this object represents: here
    /// `EtcdCluster`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,

    /// Standard object's metadata. The name must be a DNS-1035 label of at most 52 characters so
    /// that the names of the Pods, Services and volumes derived from it are valid.
    #[serde(default)]
    pub metadata: ObjectMeta,

    /// The desired state of the etcd cluster.
    #[serde(default)]
    pub spec: EtcdClusterSpec,

    /// The observed state of the etcd cluster, written by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EtcdClusterStatus>,
}

/// A list of EtcdCluster objects.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterList {
    /// APIVersion of the list: `etcd.operator.dev/v1alpha2`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,

    /// Kind of the list: `EtcdClusterList`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,

    /// Standard list metadata.
    #[serde(default)]
    pub metadata: ListMeta,

    /// The clusters.
    pub items: Vec<EtcdCluster>,
}

// The optional sections are boxed: most clusters leave them unset, and an unset `Box` costs a
// pointer where the section itself would take its whole size, in every EtcdCluster the
// controllers' store holds (issue 24; `tests::a_stored_cluster_stays_small`). `storage` stays
// inline: the server defaults it on every stored object, so boxing it would only add an
// allocation. Serde and schemars treat `Box<T>` as `T`: the wire format and the OpenAPI schema
// are unchanged. (Plain comments here: doc comments become the schema's descriptions.)
/// The desired state of an etcd cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterSpec {
    /// Number of etcd members, 1 to 9. An odd number is recommended: an even number tolerates no
    /// more failures than the odd number below it. Defaults to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,

    /// The etcd version to run, a semantic version `3.<minor>.<patch>` with minor 4, 5 or 6 and no
    /// pre-release. Upgrades move by a patch or by exactly one minor version at a time; the only
    /// minor downgrade is 3.6 to 3.5. Defaults to the operator's default version (3.5.34).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// Container image repository of etcd, without a tag: the tag is `v<version>`. Defaults to
    /// `gcr.io/etcd-development/etcd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,

    /// Settings applied to every member Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<Box<PodTemplate>>,

    /// Where members keep their data. Immutable. Defaults to a 1Gi persistent volume of the
    /// default storage class (`medium: Disk`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,

    /// TLS for client and peer traffic. Immutable. When unset, members talk plain HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Box<TlsSpec>>,

    /// Scheduled backups. When unset, the operator takes no scheduled backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Box<BackupSpec>>,

    /// How a new cluster gets its initial data. Immutable. When unset, the cluster starts empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<Box<BootstrapSpec>>,

    /// Routine care that keeps etcd taking writes: compaction of old revisions and the backend
    /// quota. When unset, the defaults described on each field apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<Box<MaintenanceSpec>>,

    /// When and how a failing member is replaced by a fresh one (its data set aside). When
    /// unset, replacement is `Automatic` with the default thresholds described on each field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<Box<ReplacementSpec>>,

    /// When true, the controller stops acting on the cluster (no scaling, upgrades, repairs or
    /// backups); status is still reported. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// Settings applied to every member Pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Labels and annotations added to every member Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PodTemplateMetadata>,

    /// Scheduling and resource settings of every member Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodTemplateSpec>,
}

/// Labels and annotations added to every member Pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateMetadata {
    /// Labels added to every member Pod. Keys under `etcd.operator.dev/` are reserved for the
    /// operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,

    /// Annotations added to every member Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Scheduling and resource settings of every member Pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateSpec {
    /// Compute resources of the etcd container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Scheduling constraints. When unset, the operator adds a preferred (soft) Pod anti-affinity
    /// that spreads members over nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Node labels a node must have to run a member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Tolerations of the member Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// How members are spread over topology domains (zones, nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,

    /// PriorityClass of the member Pods. A DNS-1123 subdomain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// Routine care of the members' databases.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceSpec {
    /// etcd's own compaction of old key revisions (`--auto-compaction-mode` and
    /// `--auto-compaction-retention`). Without it the database grows with every write until it
    /// reaches the quota. Defaults to `Periodic` keeping one hour of history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compaction: Option<AutoCompactionSpec>,

    /// The backend quota (`--quota-backend-bytes`), a quantity such as `2Gi`, from 16Mi to 8Gi.
    /// Above it etcd raises a NOSPACE alarm and refuses writes; the operator then compacts,
    /// defragments the members one at a time and disarms the alarm. Defaults to three quarters
    /// of `storage.size` (at most 8Gi), so the alarm comes before the volume or tmpfs is full.
    /// A change re-creates the members one at a time on their data (see `status.rollout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_backend_bytes: Option<Quantity>,

    /// Defragmentation of the members' database files, which gives the space freed by
    /// compaction back to the file system: on a schedule, and whenever a member's file is mostly
    /// free space. Members are defragmented one at a time, followers first and the leader last
    /// (after handing leadership over), only while every voting member is healthy and nothing
    /// else (a scale, a roll, an alarm, a recovery) is in progress. When unset, the size trigger
    /// runs with its defaults and there is no schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defragmentation: Option<DefragmentationSpec>,
}

/// Default for `spec.maintenance.defragmentation.fragmentationPercent`.
pub const DEFAULT_DEFRAG_FRAGMENTATION_PERCENT: i32 = 50;
/// Default for `spec.maintenance.defragmentation.minReclaimableBytes`.
pub const DEFAULT_DEFRAG_MIN_RECLAIMABLE: &str = "64Mi";

/// When members are defragmented. A member is defragmented when the schedule says so, or when
/// both size limits are reached: at least `fragmentationPercent` of its database file is free
/// and at least `minReclaimableBytes` would be given back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefragmentationSpec {
    /// Defragment every member on this schedule: a five-field cron expression in UTC (minute
    /// hour day-of-month month day-of-week), e.g. `0 3 * * 0`, or six fields with a leading
    /// seconds field. A missed time is made up for once. When unset, no scheduled
    /// defragmentation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,

    /// The size trigger: defragment a member when at least this percentage of its database file
    /// is free (`dbSize - dbSizeInUse` over `dbSize`), 1 to 99; `0` turns the size trigger off.
    /// Defaults to 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragmentation_percent: Option<i32>,

    /// The size trigger leaves a member alone while its free space is below this quantity
    /// (small databases are not worth the pause), e.g. `64Mi`; at most 8Gi. Defaults to `64Mi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_reclaimable_bytes: Option<Quantity>,
}

string_enum! {
    /// Who decides that a failing member is replaced.
    pub enum ReplacementPolicy {
        Automatic => "Automatic",
        Manual => "Manual",
    }
}

/// When and how a failing member is replaced. A member is replaced only while the members
/// that remain keep a healthy quorum, never while the cluster has an alarm (NOSPACE is
/// reclaimed instead, CORRUPT freezes everything), never while it is the member furthest ahead
/// in the log, and one at a time; a Warning Event (`MemberReplacing`) comes first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplacementSpec {
    /// `Automatic`: the operator replaces a member that cannot start for `crashLoopAfter`, or
    /// runs unhealthy without progress for `unhealthyAfter`. `Manual`: it only reports such a
    /// member (condition `Degraded`, reason `ReplacementPending`, and a Warning Event) and
    /// replaces one when asked with the annotation `etcd.operator.dev/replace-member=<member>`.
    /// The annotation works with either policy. Defaults to `Automatic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<ReplacementPolicy>,

    /// How long a member whose process runs may stay unhealthy (not answering, no leader,
    /// errors) without applying any new raft entries before it is replaced: a slow member that
    /// keeps catching up is never replaced. A duration such as `10m` or `1h`, from 10s to 168h.
    /// Defaults to `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_after: Option<String>,

    /// How long a member that cannot start (its process exits again and again, its Pod crash
    /// loops) keeps failing before it is replaced; until then it is restarted on its own data.
    /// A duration such as `5m`, from 10s to 168h. Defaults to `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_loop_after: Option<String>,
}

string_enum! {
    /// How etcd decides which revisions to compact.
    pub enum AutoCompactionMode {
        Periodic => "Periodic",
        Revision => "Revision",
    }
}

/// etcd's automatic compaction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoCompactionSpec {
    /// `Periodic`: keep history for a duration. `Revision`: keep a number of revisions.
    /// Defaults to `Periodic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<AutoCompactionMode>,

    /// How much history to keep: a duration such as `1h`, `30m` or `90s` for `Periodic`, a
    /// number of revisions such as `10000` for `Revision`; `0` turns compaction off (not
    /// recommended). Defaults to `1h` (`Periodic`) or `10000` (`Revision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<String>,
}

string_enum! {
    /// Where member data lives.
    pub enum StorageMedium {
        Disk => "Disk",
        Memory => "Memory",
    }
}

/// Where members keep their data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// `Disk`: one PersistentVolumeClaim per member. `Memory`: a tmpfs emptyDir per member; data
    /// is lost when a member's Pod goes away and the cluster relies on its peers (and backups) to
    /// recover. Defaults to `Disk`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<StorageMedium>,

    /// Capacity per member: the PVC request for `Disk`, the emptyDir size limit for `Memory`. A
    /// Kubernetes quantity such as `8Gi`. Defaults to `1Gi`. It may grow (each member's claim is
    /// expanded when its StorageClass allows volume expansion; `Memory` members are replaced on
    /// the new limit), never shrink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,

    /// StorageClass of the member PVCs (`Disk` only). When unset, the cluster's default
    /// StorageClass is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// TLS for the two traffic planes of etcd. Each plane is configured independently; an unset
/// plane uses plain HTTP.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// TLS of the client plane (port 2379): the members' serving certificate. Clients, the
    /// operator included, must then use HTTPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<TlsPlane>,

    /// TLS of the peer plane (port 2380): certificates members use among themselves, with mutual
    /// authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<TlsPlane>,
}

/// Where the certificates of one TLS plane come from. Exactly one of `secretRef`,
/// `certManager` and `auto` must be set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsPlane {
    /// A Secret of type `kubernetes.io/tls` in the cluster's namespace holding `tls.crt`,
    /// `tls.key` and `ca.crt`, valid for every member's DNS names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretReference>,

    /// Certificates issued by cert-manager from the given issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_manager: Option<CertManagerTls>,

    /// The operator creates a CA and the certificates itself (see docs/tls.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoTls>,
}

/// A reference to a Secret in the cluster's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Name of the Secret. A DNS-1123 subdomain. Required.
    #[serde(default)]
    pub name: String,
}

/// Certificates issued by cert-manager.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertManagerTls {
    /// The cert-manager issuer that signs the certificates. Required.
    #[serde(default)]
    pub issuer_ref: IssuerReference,
}

/// A reference to a cert-manager issuer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerReference {
    /// Name of the issuer. Required.
    #[serde(default)]
    pub name: String,

    /// Kind of the issuer: `Issuer` (namespaced) or `ClusterIssuer` for cert-manager's own group;
    /// any kind for an external issuer group. Defaults to `Issuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,

    /// API group of the issuer. Defaults to `cert-manager.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Operator-managed certificates: a self-signed CA per cluster and per plane, member certificates
/// valid one year, renewed 30 days before they expire or when the annotation
/// `etcd.operator.dev/rotate-certificates` changes, one member at a time. No settings yet; the
/// empty object `{}` selects it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoTls {}

/// Scheduled backups of the cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// When to take a snapshot: a standard five-field cron expression in UTC (minute hour
    /// day-of-month month day-of-week), e.g. `0 */6 * * *`, or six fields with a leading seconds
    /// field, e.g. `*/10 * * * * *` for every ten seconds. Required.
    #[serde(default)]
    pub schedule: String,

    /// How many snapshots to keep. When unset, the last 7 are kept. The same limits apply to the
    /// manual snapshots (EtcdBackups and pre-upgrade snapshots, under `manual/`), counted apart
    /// from the scheduled ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<BackupRetention>,

    /// Where snapshots are written. Required.
    #[serde(default)]
    pub destination: BackupDestination,
}

/// How many snapshots to keep. A snapshot is deleted when either limit is exceeded; the newest
/// snapshot is never deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRetention {
    /// Keep at most this many snapshots, 1 to 1000. Defaults to 7 when `maxAge` is unset too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_count: Option<i32>,

    /// Delete snapshots older than this: a duration such as `72h` or `90m` (units `s`, `m`, `h`),
    /// at least one minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
}

/// Where snapshots are stored. Exactly one of `s3` and `volume` must be set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupDestination {
    /// An S3-compatible object store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Destination>,

    /// A volume: a PersistentVolumeClaim (Kubernetes runtime) or a directory (local runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeDestination>,
}

/// An S3-compatible bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Destination {
    /// Bucket name (3 to 63 lowercase letters, digits, dots and hyphens). Required.
    #[serde(default)]
    pub bucket: String,

    /// Key prefix of the snapshots inside the bucket, e.g. `prod/etcd`. Defaults to no prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,

    /// URL of an S3-compatible endpoint (`http` or `https`), e.g. `https://minio.example:9000`.
    /// When unset, AWS S3 is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Region of the bucket, e.g. `eu-west-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,

    /// Name of a Secret in the cluster's namespace with keys `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`. When unset, ambient credentials are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,

    /// Use path-style URLs (`endpoint/bucket/key`) instead of virtual-hosted style, as most
    /// self-hosted S3 servers need. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_path_style: Option<bool>,
}

/// A volume for snapshots. Exactly one of `claimName` and `path` must be set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeDestination {
    /// Name of an existing PersistentVolumeClaim in the cluster's namespace (Kubernetes runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,

    /// An absolute directory on the operator's host (local runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// How a new cluster gets its initial data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Restore the new cluster from a snapshot instead of starting empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreSpec>,
}

/// The snapshot a new cluster is restored from. Exactly one of `backupName` and `source` must be
/// set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSpec {
    /// Name of an `EtcdBackup` in the cluster's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_name: Option<String>,

    /// A snapshot given by its location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<RestoreSource>,
}

/// A snapshot given by its location: a key in a backup destination, or a URL.
/// Exactly one of `key` and `url` must be set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSource {
    /// The store holding the snapshot (used with `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<BackupDestination>,

    /// Key of the snapshot inside `destination` (object key for S3, file name for a volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,

    /// An `http`, `https` or `s3` URL of the snapshot file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl EtcdCluster {
    /// A new object of this version with the given name, namespace and spec.
    pub fn new(name: &str, namespace: &str, spec: EtcdClusterSpec) -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            kind: crate::KIND.to_owned(),
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The controllers' store holds one `EtcdCluster` per object, so its inline size is paid
    /// 10,000 times in the bench (issue 24, docs/performance.md): the spec's optional sections
    /// and the status's occasional records are boxed to keep it small. A new inline section of
    /// any size fails here; box it.
    #[test]
    fn a_stored_cluster_stays_small() {
        let spec = std::mem::size_of::<EtcdClusterSpec>();
        let status = std::mem::size_of::<EtcdClusterStatus>();
        let cluster = std::mem::size_of::<EtcdCluster>();
        assert!(
            spec <= 184 && status <= 264 && cluster <= 856,
            "EtcdClusterSpec is {spec} B (at most 184), EtcdClusterStatus {status} B (at most \
             264), EtcdCluster {cluster} B (at most 856)"
        );
    }
}
