//! `EtcdBackup` (`etcd.operator.dev/v1alpha2` only): a one-shot backup of a named cluster to a
//! destination, with its defaulting, validation (field paths) and `kube`/`k8s-openapi` traits.
//! Pure: the controller in `etcd-operator-controller` takes the snapshot.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::v1alpha2::{self as v2, BackupDestination};
use crate::validation::{FieldError, Outcome, Path};

/// The kind of the backup resource.
pub const KIND: &str = "EtcdBackup";
/// The kind of a list of backups.
pub const LIST_KIND: &str = "EtcdBackupList";
/// The plural resource name (URL path segment).
pub const RESOURCE: &str = "etcdbackups";
/// The singular resource name.
pub const SINGULAR: &str = "etcdbackup";
/// The short names `kubectl` accepts.
pub const SHORT_NAMES: &[&str] = &["eb"];
/// The only version `EtcdBackup` is served in (also its storage version).
pub const VERSION: &str = v2::VERSION;
/// `apiVersion` of backups.
pub const API_VERSION: &str = v2::API_VERSION;

/// A one-shot backup (snapshot) of an EtcdCluster in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackup {
    /// APIVersion defines the versioned schema of this representation of an object: here
    /// `etcd.operator.dev/v1alpha2`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,

    /// Kind is a string value representing the REST resource this object represents: here
    /// `EtcdBackup`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,

    /// Standard object's metadata. The name must be a DNS-1123 subdomain.
    #[serde(default)]
    pub metadata: ObjectMeta,

    /// What to back up and where to. Immutable.
    #[serde(default)]
    pub spec: EtcdBackupSpec,

    /// The progress and result of the backup, written by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EtcdBackupStatus>,
}

/// A list of EtcdBackup objects.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupList {
    /// APIVersion of the list: `etcd.operator.dev/v1alpha2`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,

    /// Kind of the list: `EtcdBackupList`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,

    /// Standard list metadata.
    #[serde(default)]
    pub metadata: ListMeta,

    /// The backups.
    pub items: Vec<EtcdBackup>,
}

/// What to back up and where to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupSpec {
    /// Name of the EtcdCluster to back up, in the backup's namespace. Required.
    #[serde(default)]
    pub cluster_name: String,

    /// Where the snapshot is written. When unset, the destination of the cluster's
    /// `spec.backup` is used (the backup fails when the cluster has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<BackupDestination>,
}

string_enum! {
    /// The lifecycle phase of a backup.
    pub enum BackupPhase {
        Pending => "Pending",
        Running => "Running",
        Succeeded => "Succeeded",
        Failed => "Failed",
    }
}

impl BackupPhase {
    /// Whether the backup is over (it is never retried once `Succeeded` or `Failed`).
    pub fn is_finished(&self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// The progress and result of a backup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupStatus {
    /// One of Pending, Running, Succeeded, Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,

    /// When the controller started taking the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the backup succeeded or failed for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// Size of the snapshot in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,

    /// The etcd revision the snapshot contains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,

    /// Where the snapshot was written: `s3://bucket/key` or a file path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,

    /// SHA-256 of the snapshot file, in lowercase hexadecimal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,

    /// Attempts made so far (failed attempts are retried with backoff up to a limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,

    /// A human-readable explanation of the phase, e.g. the last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl EtcdBackup {
    /// A new backup of `cluster` with the given name and namespace.
    pub fn new(name: &str, namespace: &str, spec: EtcdBackupSpec) -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
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

/// Defaults: `apiVersion` and `kind`, `s3.forcePathStyle` false.
pub fn apply_defaults(obj: &mut EtcdBackup) {
    if obj.api_version.is_empty() {
        obj.api_version = API_VERSION.to_owned();
    }
    if obj.kind.is_empty() {
        obj.kind = KIND.to_owned();
    }
    if let Some(s3) = obj.spec.destination.as_mut().and_then(|d| d.s3.as_mut()) {
        s3.force_path_style.get_or_insert(false);
    }
}

/// Create-time validation: metadata (name, labels, annotations), the cluster name and the
/// destination, every error at once.
pub fn validate(obj: &EtcdBackup) -> Outcome {
    let mut report = crate::validation::spec::Report::default();
    let meta = Path::root("metadata");
    match obj.metadata.name.as_deref() {
        None | Some("") => report.error(FieldError::required(
            &meta.child("name"),
            "name or generateName is required",
        )),
        Some(name) => report.format(
            &meta.child("name"),
            name,
            crate::validation::format::dns1123_subdomain(name),
        ),
    }
    crate::validation::spec::namespace(&mut report, &obj.metadata);
    crate::validation::spec::labels_and_annotations(&mut report, &obj.metadata);
    let spec = Path::root("spec");
    let cluster = spec.child("clusterName");
    if obj.spec.cluster_name.is_empty() {
        report.error(FieldError::required(&cluster, "the EtcdCluster to back up"));
    } else {
        report.format(
            &cluster,
            &obj.spec.cluster_name,
            crate::validation::format::dns1035_label(
                &obj.spec.cluster_name,
                crate::naming::MAX_CLUSTER_NAME_LEN,
            ),
        );
    }
    if let Some(destination) = &obj.spec.destination {
        crate::validation::spec::destination(&mut report, &spec.child("destination"), destination);
    }
    report.into()
}

/// Update validation: the create rules, and the spec may not change.
pub fn validate_update(new: &EtcdBackup, old: &EtcdBackup) -> Outcome {
    let mut outcome = validate(new);
    if new.spec != old.spec {
        outcome.errors.push(FieldError::forbidden(
            &Path::root("spec"),
            "the spec of an EtcdBackup is immutable: create a new EtcdBackup instead",
        ));
    }
    outcome
}

impl k8s_openapi::Resource for EtcdBackup {
    const API_VERSION: &'static str = API_VERSION;
    const GROUP: &'static str = crate::GROUP;
    const KIND: &'static str = KIND;
    const VERSION: &'static str = VERSION;
    const URL_PATH_SEGMENT: &'static str = RESOURCE;
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::ListableResource for EtcdBackup {
    const LIST_KIND: &'static str = LIST_KIND;
}

impl k8s_openapi::Metadata for EtcdBackup {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(v: serde_json::Value) -> EtcdBackup {
        serde_json::from_value(v).unwrap()
    }

    fn fields(o: &Outcome) -> Vec<&str> {
        o.errors.iter().map(|e| e.field.as_str()).collect()
    }

    #[test]
    fn a_valid_backup_passes_and_defaults_apply() {
        let mut b = decode(
            json!({"metadata": {"name": "b1"}, "spec": {"clusterName": "example",
            "destination": {"s3": {"bucket": "backups", "endpoint": "http://127.0.0.1:9000"}}}}),
        );
        apply_defaults(&mut b);
        assert_eq!(b.kind, "EtcdBackup");
        assert_eq!(b.api_version, "etcd.operator.dev/v1alpha2");
        assert_eq!(
            b.spec
                .destination
                .as_ref()
                .unwrap()
                .s3
                .as_ref()
                .unwrap()
                .force_path_style,
            Some(false)
        );
        assert!(validate(&b).is_valid(), "{:?}", validate(&b));
    }

    #[test]
    fn every_error_is_reported_with_its_path() {
        let b = decode(
            json!({"metadata": {"name": "Bad_Name"}, "spec": {"clusterName": "",
            "destination": {"s3": {"bucket": "x"}, "volume": {"path": "relative"}}}}),
        );
        let o = validate(&b);
        assert_eq!(
            fields(&o),
            [
                "metadata.name",
                "spec.clusterName",
                "spec.destination",
                "spec.destination.s3.bucket",
                "spec.destination.volume.path"
            ]
        );
    }

    #[test]
    fn labels_and_annotations_follow_kube_apiserver_rules() {
        let valid = json!({"metadata": {"name": "b", "labels": {"example.com/tier": "a_b.c", "empty": ""},
            "annotations": {"Example.com/Owner": "sre"}}, "spec": {"clusterName": "a"}});
        assert!(validate(&decode(valid)).is_valid());
        let cases = [
            (
                "label key",
                json!({"labels": {"-bad": "x"}}),
                "metadata.labels",
                "Invalid value",
            ),
            (
                "label key prefix",
                json!({"labels": {(format!("{}/a", "p".repeat(254))): "x"}}),
                "metadata.labels",
                "must be no more than 253 characters",
            ),
            (
                "label key name",
                json!({"labels": {("n".repeat(64)): "x"}}),
                "metadata.labels",
                "name part must be no more than 63 characters",
            ),
            (
                "label value",
                json!({"labels": {"a": "v".repeat(64)}}),
                "metadata.labels",
                "must be no more than 63 characters",
            ),
            (
                "label value chars",
                json!({"labels": {"a": "a b"}}),
                "metadata.labels",
                "a valid label must be an empty string",
            ),
            (
                "annotation key",
                json!({"annotations": {"a/b/c": "x"}}),
                "metadata.annotations",
                "name part must consist of",
            ),
            (
                "annotation size",
                json!({"annotations": {"a": "x".repeat(262_144)}}),
                "metadata.annotations",
                "Too long: may not be more than 262144 bytes",
            ),
        ];
        for (case, metadata, field, message) in cases {
            let mut body = json!({"metadata": {"name": "b"}, "spec": {"clusterName": "a"}});
            body["metadata"]
                .as_object_mut()
                .unwrap()
                .extend(metadata.as_object().unwrap().clone());
            let o = validate(&decode(body));
            assert_eq!(fields(&o), [field], "{case}: {o:?}");
            let text = o.errors[0].to_string();
            assert!(text.contains(message), "{case}: {text}");
            // On update too, with the same paths.
            let old = decode(json!({"metadata": {"name": "b"}, "spec": {"clusterName": "a"}}));
            let mut new = old.clone();
            new.metadata = o_metadata(&metadata);
            assert_eq!(fields(&validate_update(&new, &old)), [field], "{case} on update");
        }
    }

    fn o_metadata(extra: &serde_json::Value) -> ObjectMeta {
        let mut meta = json!({"name": "b"});
        meta.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(meta).unwrap()
    }

    #[test]
    fn the_spec_is_immutable() {
        let old = decode(json!({"metadata": {"name": "b"}, "spec": {"clusterName": "a"}}));
        let mut new = old.clone();
        assert!(validate_update(&new, &old).is_valid());
        new.spec.cluster_name = "other".into();
        let o = validate_update(&new, &old);
        assert_eq!(fields(&o), ["spec"]);
        assert_eq!(o.errors[0].kind, crate::validation::ErrorType::Forbidden);
    }

    #[test]
    fn phases_round_trip_and_unknown_ones_are_kept() {
        let s: EtcdBackupStatus = serde_json::from_value(json!({"phase": "Succeeded"})).unwrap();
        assert_eq!(s.phase, Some(BackupPhase::Succeeded));
        assert!(BackupPhase::Failed.is_finished());
        assert!(!BackupPhase::Running.is_finished());
        let s: EtcdBackupStatus = serde_json::from_value(json!({"phase": "Odd"})).unwrap();
        assert_eq!(s.phase, Some(BackupPhase::Unknown("Odd".into())));
    }
}
