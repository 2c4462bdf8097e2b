//! The PersistentVolumeClaim holding one member's data (`medium: Disk`): `<member>-data`,
//! ReadWriteOnce, size and StorageClass from the spec.

use std::collections::BTreeMap;

use etcd_operator_api::naming;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{member_labels, owner_reference};
use crate::model::ClusterRef;
use crate::validated::ValidatedCluster;

/// The PVC of member `member`. It carries no configuration yet: the runtime adds the
/// `etcd.operator.dev/member-config` annotation when the member is started. A member with TLS
/// planes carries [`super::tls::TLS_ANNOTATION`] naming them.
pub fn build_pvc(cluster: &ClusterRef, spec: &ValidatedCluster, member: &str) -> PersistentVolumeClaim {
    let storage = spec.storage.clone();
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(naming::member_pvc_name(member)),
            namespace: Some(cluster.namespace.clone()),
            labels: Some(member_labels(cluster, member)),
            annotations: super::tls::TlsSchemes::of(&spec.tls)
                .annotation()
                .map(|planes| BTreeMap::from([(super::tls::TLS_ANNOTATION.to_owned(), planes)])),
            owner_references: Some(vec![owner_reference(cluster)]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            resources: Some(VolumeResourceRequirements {
                requests: storage
                    .size
                    .map(|size| BTreeMap::from([("storage".to_owned(), size)])),
                limits: None,
            }),
            storage_class_name: storage.storage_class_name,
            volume_mode: Some("Filesystem".to_owned()),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}
