//! `etcd.operator.dev/v1alpha1`: the older, flat (CoreOS-style) shape of `EtcdCluster`. Served,
//! converted to and from the hub ([`crate::v1alpha2`]) through [`crate::convert`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, PersistentVolumeClaimSpec, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::status::EtcdClusterStatus;

/// The version string of this module.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of objects of this version.
pub const API_VERSION: &str = "etcd.operator.dev/v1alpha1";

/// Default for `spec.size`.
pub const DEFAULT_SIZE: i32 = 3;
/// Default for `spec.repository`.
pub const DEFAULT_REPOSITORY: &str = "quay.io/coreos/etcd";
/// Default for `spec.backup.maxBackups`.
pub const DEFAULT_MAX_BACKUPS: i32 = 7;

/// An etcd cluster managed by the operator (v1alpha1 shape).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdCluster {
    /// APIVersion defines the versioned schema of this representation of an object: here
    /// `etcd.operator.dev/v1alpha1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,

    /// Kind is a string value representing the REST resource this object represents: here
    /// `EtcdCluster`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,

    /// Standard object's metadata. The name must be a DNS-1035 label of at most 52 characters so
    /// that the names of the Pods, Services and volumes derived from it are valid. Settings of
    /// v1alpha2 that this version cannot express are kept in the annotation
    /// `etcd.operator.dev/v1alpha2-fields`; leave it alone.
    #[serde(default)]
    pub metadata: ObjectMeta,

    /// The desired state of the etcd cluster.
    #[serde(default)]
    pub spec: ClusterSpec,

    /// The observed state of the etcd cluster, written by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EtcdClusterStatus>,
}

/// A list of EtcdCluster objects.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterList {
    /// APIVersion of the list: `etcd.operator.dev/v1alpha1`.
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

/// The desired state of an etcd cluster (v1alpha1 shape).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Number of etcd members, 1 to 9. An odd number is recommended. Defaults to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i32>,

    /// The etcd version to run, a semantic version `3.<minor>.<patch>` with minor 4, 5 or 6 and no
    /// pre-release. Upgrades move by a patch or by exactly one minor version at a time; the only
    /// minor downgrade is 3.6 to 3.5. Defaults to the operator's default version (3.5.34).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// Container image repository of etcd, without a tag: the tag is `v<version>`. Defaults to
    /// `quay.io/coreos/etcd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,

    /// Settings of the member Pods, including their persistent volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodPolicy>,

    /// Periodic backups. When unset, the operator takes no backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupPolicy>,

    /// TLS settings. Immutable. When unset, members talk plain HTTP.
    #[serde(default, rename = "TLS", skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsPolicy>,

    /// When true, the controller stops acting on the cluster; status is still reported.
    /// Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// Settings of the member Pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodPolicy {
    /// Labels added to every member Pod. Keys under `etcd.operator.dev/` are reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,

    /// Annotations added to every member Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,

    /// Compute resources of the etcd container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Scheduling constraints of the member Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Node labels a node must have to run a member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Tolerations of the member Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// When true, no two members run on the same node (required Pod anti-affinity on
    /// `kubernetes.io/hostname`). When false, members are spread on a best-effort basis.
    /// Ignored when `affinity` is set. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anti_affinity: Option<bool>,

    /// The PersistentVolumeClaim each member stores its data in. Only
    /// `resources.requests.storage` and `storageClassName` are used. When unset, a 1Gi claim of
    /// the default storage class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_spec: Option<PersistentVolumeClaimSpec>,
}

string_enum! {
    /// Where backups are stored.
    pub enum BackupStorageType {
        S3 => "S3",
        PersistentVolume => "PersistentVolume",
    }
}

/// Periodic backups (v1alpha1 shape).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupPolicy {
    /// Seconds between two backups, at least 60. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_interval_in_second: Option<i64>,

    /// How many backups to keep, 1 to 1000. Defaults to 7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backups: Option<i32>,

    /// `S3` (settings in `s3`) or `PersistentVolume` (settings in `pv`). Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_type: Option<BackupStorageType>,

    /// S3 settings, for `storageType: S3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Source>,

    /// Volume settings, for `storageType: PersistentVolume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pv: Option<PvSource>,
}

/// An S3-compatible bucket (v1alpha1 shape).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Source {
    /// Bucket name. Required.
    #[serde(default)]
    pub bucket: String,

    /// Key prefix of the backups inside the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,

    /// URL of an S3-compatible endpoint. When unset, AWS S3 is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Region of the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,

    /// Name of a Secret with keys `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_secret: Option<String>,

    /// Use path-style URLs. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_path_style: Option<bool>,
}

/// A persistent volume for backups, created by the operator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvSource {
    /// Size of the volume in megabytes. Defaults to 512.
    #[serde(default, rename = "volumeSizeInMB", skip_serializing_if = "Option::is_none")]
    pub volume_size_in_mb: Option<i64>,

    /// StorageClass of the volume. When unset, the default StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
}

/// TLS settings (v1alpha1 shape).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsPolicy {
    /// Certificates provided as Secrets by the user.
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_tls: Option<StaticTlsPolicy>,
}

/// Certificates provided as Secrets by the user.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticTlsPolicy {
    /// Secrets of the members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<MemberSecret>,

    /// Name of a Secret with the client certificate the operator uses to talk to the members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_secret: Option<String>,
}

/// Secrets of the members.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberSecret {
    /// Name of a Secret with the peer certificate (`tls.crt`, `tls.key`, `ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_secret: Option<String>,

    /// Name of a Secret with the client-facing serving certificate (`tls.crt`, `tls.key`,
    /// `ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_secret: Option<String>,
}

impl EtcdCluster {
    /// A new object of this version with the given name, namespace and spec.
    pub fn new(name: &str, namespace: &str, spec: ClusterSpec) -> Self {
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
