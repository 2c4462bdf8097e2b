//! Pure builders of the Kubernetes objects of a cluster: member Pods and PVCs, the peer and
//! client Services, the PodDisruptionBudget and the TLS Secrets and cert-manager Certificates
//! ([`tls`]). No I/O; the kubernetes runtime applies them.
//!
//! Every object carries the labels of the design page (`etcd.operator.dev/cluster`, and
//! `etcd.operator.dev/member` on member objects), the `app.kubernetes.io/*` recommended labels and
//! a controller owner reference to the EtcdCluster, so that deleting the cluster collects them.

mod pdb;
mod pod;
mod pvc;
mod service;
pub mod tls;

use std::collections::BTreeMap;

use etcd_operator_api::naming::{self, CLUSTER_LABEL, MEMBER_LABEL};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::model::{ClusterRef, MemberConfig};

pub use pdb::{build_pdb, pdb_min_available};
pub use pod::{
    Probes, RESTORE_FETCH_CONTAINER, RESTORE_FINISH_CONTAINER, RESTORE_SOURCE_VOLUME, RESTORE_TOOL_CONTAINER,
    TEMPLATE_HASH_ANNOTATION, build_pod, probes_for, template_hash,
};
pub use pvc::build_pvc;
pub use service::{build_client_service, build_peer_service};

/// Field manager of every server-side apply and status write, and the reporting controller of
/// Events.
pub const FIELD_MANAGER: &str = "etcd-operator";

/// A patch (of status, or a merge patch of an object the controller keeps) under
/// [`FIELD_MANAGER`]: without it the API server records the writer as its User-Agent, or
/// `unknown`, in `managedFields`.
pub fn patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..kube::api::PatchParams::default()
    }
}

/// A status patch under [`FIELD_MANAGER`] (see [`patch_params`]).
pub fn status_patch_params() -> kube::api::PatchParams {
    patch_params()
}

/// A create under [`FIELD_MANAGER`] (see [`patch_params`]).
pub fn post_params() -> kube::api::PostParams {
    kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..kube::api::PostParams::default()
    }
}
/// Annotation holding the member's [`MemberConfig`] as JSON, on its Pod and its PVC.
pub const MEMBER_CONFIG_ANNOTATION: &str = "etcd.operator.dev/member-config";
/// Annotation on a PVC that was released (kept) when its member or cluster was removed:
/// `<namespace>/<cluster>/<member>` it belonged to.
pub const RELEASED_FROM_ANNOTATION: &str = "etcd.operator.dev/released-from";
/// Label on a PVC set aside when its member was removed without keeping its data (scale-down,
/// replacement): the member's name. The claim keeps the cluster label and owner reference; only
/// the newest [`crate::runtime::RETAINED_REMOVED_LIMIT`] are kept.
pub const REMOVED_MEMBER_LABEL: &str = "etcd.operator.dev/removed-member";
/// Annotation on such a PVC: when it was set aside (RFC 3339), the order pruning goes by.
pub const REMOVED_AT_ANNOTATION: &str = "etcd.operator.dev/removed-at";

/// Name of the etcd container.
pub const CONTAINER_NAME: &str = "etcd";
/// Name of the data volume of a member Pod.
pub const DATA_VOLUME: &str = "data";
/// Where the data volume is mounted.
pub const DATA_MOUNT_PATH: &str = "/var/lib/etcd";
/// etcd's `--data-dir`: a directory inside the volume (a fresh filesystem may hold `lost+found`).
pub const DATA_DIR: &str = "/var/lib/etcd/data";
/// Where the restore init containers of a member restored from a snapshot work, on its volume.
pub const RESTORE_DIR: &str = "/var/lib/etcd/restore";
/// The fetched, verified snapshot (kept: a restarted Pod runs the restore tool again).
pub const RESTORE_SNAPSHOT: &str = "/var/lib/etcd/restore/snapshot.db";
/// Where the restore tool writes the member before it is moved to [`DATA_DIR`].
pub const RESTORE_STAGING: &str = "/var/lib/etcd/restore/data";
/// Environment variable naming the operator's own image, which member Pods restored from a
/// snapshot run as init containers (the Helm chart sets it from `image`).
pub const OPERATOR_IMAGE_ENV: &str = "ETCD_OPERATOR_IMAGE";
/// Client port.
pub const CLIENT_PORT: i32 = 2379;
/// Peer port.
pub const PEER_PORT: i32 = 2380;
/// Metrics and health port (`--listen-metrics-urls`), always plain HTTP.
pub const METRICS_PORT: i32 = 2381;
/// User and group the etcd container runs as (the distroless `nonroot` user).
pub const RUN_AS_ID: i64 = 65532;
/// Grace period of a member Pod: etcd flushes and leaves raft cleanly well within it.
pub const TERMINATION_GRACE_SECONDS: i64 = 30;

/// `apiVersion` of the owner references (the hub version of the API).
pub const OWNER_API_VERSION: &str = etcd_operator_api::v1alpha2::API_VERSION;

/// Could not build an object.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// The member configuration could not be encoded into its annotation.
    #[error("encoding the configuration of member {member}")]
    EncodeConfig {
        /// The member.
        member: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The member is to start from a snapshot that its Pod cannot restore.
    #[error("restoring member {member}")]
    Restore {
        /// The member.
        member: String,
        /// The cause.
        #[source]
        source: Box<crate::restore::RestoreError>,
    },
}

/// Labels of every object of the cluster: the cluster label and the recommended
/// `app.kubernetes.io/*` labels.
pub fn cluster_labels(cluster: &ClusterRef) -> BTreeMap<String, String> {
    BTreeMap::from([
        (CLUSTER_LABEL.to_owned(), cluster.name.clone()),
        ("app.kubernetes.io/name".to_owned(), "etcd".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), cluster.name.clone()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            FIELD_MANAGER.to_owned(),
        ),
    ])
}

/// Labels of a member's Pod and PVC: [`cluster_labels`] plus the member label.
pub fn member_labels(cluster: &ClusterRef, member: &str) -> BTreeMap<String, String> {
    let mut labels = cluster_labels(cluster);
    labels.insert(MEMBER_LABEL.to_owned(), member.to_owned());
    labels
}

/// The selector of every member Pod of the cluster (Services, PDB, anti-affinity).
pub fn selector_labels(cluster: &ClusterRef) -> BTreeMap<String, String> {
    BTreeMap::from([(CLUSTER_LABEL.to_owned(), cluster.name.clone())])
}

/// `etcd.operator.dev/cluster=<name>`, the label selector to list a cluster's children.
pub fn list_selector(cluster: &ClusterRef) -> String {
    naming::selector(&cluster.name)
}

/// The controller owner reference to the EtcdCluster.
pub fn owner_reference(cluster: &ClusterRef) -> OwnerReference {
    OwnerReference {
        api_version: OWNER_API_VERSION.to_owned(),
        kind: etcd_operator_api::KIND.to_owned(),
        name: cluster.name.clone(),
        uid: cluster.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The EtcdCluster as the subject (`regarding`) of Events.
pub fn cluster_object_reference(cluster: &ClusterRef) -> ObjectReference {
    ObjectReference {
        api_version: Some(OWNER_API_VERSION.to_owned()),
        kind: Some(etcd_operator_api::KIND.to_owned()),
        name: Some(cluster.name.clone()),
        namespace: Some(cluster.namespace.clone()),
        uid: Some(cluster.uid.clone()),
        ..ObjectReference::default()
    }
}

/// DNS name of a member: `<member>.<peer-service>.<namespace>.svc` (the Pod's `hostname` and
/// `subdomain` under the headless peer Service).
pub fn member_host(cluster: &ClusterRef, member: &str) -> String {
    format!(
        "{member}.{}.{}.svc",
        naming::peer_service_name(&cluster.name),
        cluster.namespace
    )
}

/// Peer URL of a member: `http://<member host>:2380`.
pub fn peer_url(cluster: &ClusterRef, member: &str) -> String {
    format!("http://{}:{PEER_PORT}", member_host(cluster, member))
}

/// Client URL of a member: `http://<member host>:2379`.
pub fn client_url(cluster: &ClusterRef, member: &str) -> String {
    format!("http://{}:{CLIENT_PORT}", member_host(cluster, member))
}

/// The member configuration as stored in [`MEMBER_CONFIG_ANNOTATION`].
pub fn encode_config(member: &str, config: &MemberConfig) -> Result<String, ResourceError> {
    serde_json::to_string(config).map_err(|source| ResourceError::EncodeConfig {
        member: member.to_owned(),
        source,
    })
}

/// Reads [`MEMBER_CONFIG_ANNOTATION`] back.
pub fn decode_config(value: &str) -> Result<MemberConfig, serde_json::Error> {
    serde_json::from_str(value)
}

/// Quorum of `members` voting members.
pub fn quorum(members: usize) -> usize {
    crate::model::quorum(members)
}
