//! Conversion between v1alpha1 and the hub (v1alpha2), lossless from either side.
//!
//! Each spec is split into parts that map onto each other: the scalars (`size`/`replicas`,
//! `version`, `repository`, `paused`) map one to one; `pod` ↔ (`podTemplate`, `storage`),
//! `backup` ↔ `backup` and `TLS` ↔ `tls` map as far as the shapes allow; `bootstrap`,
//! `maintenance` and `replacement` exist in v1alpha2 only. Metadata and status are copied.
//!
//! When a part does not survive the trip to the other version and back, the original part is
//! stashed as JSON in an annotation of the converted object — [`V1ALPHA2_FIELDS_ANNOTATION`] on a
//! v1alpha1 object, [`V1ALPHA1_FIELDS_ANNOTATION`] on the hub — and restored on the way back. The
//! rules that make round trips exact and edits safe:
//!
//! * store a part iff converting the chosen counterpart back does not give the part;
//! * restore a stashed part iff converting it gives exactly the counterpart now present (if a
//!   client edited the counterpart in the other version, the stash is stale and dropped);
//! * the annotation is always consumed (removed) by the conversion that reads it.
//!
//! An `annotations` map that becomes empty when the stash is removed is dropped (`None`), as the
//! Kubernetes API server does with `omitempty`. Both annotation keys are reserved.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::v1alpha1::{self as v1, BackupStorageType};
use crate::v1alpha2::{self as v2, StorageMedium};
use crate::{VersionedCluster, naming};

/// Annotation on the hub holding v1alpha1 settings that v1alpha2 cannot express.
pub const V1ALPHA1_FIELDS_ANNOTATION: &str = "etcd.operator.dev/v1alpha1-fields";
/// Annotation on a v1alpha1 object holding v1alpha2 settings that v1alpha1 cannot express.
pub const V1ALPHA2_FIELDS_ANNOTATION: &str = "etcd.operator.dev/v1alpha2-fields";

const PART_POD: &str = "pod";
const PART_BACKUP: &str = "backup";
const PART_TLS: &str = "tls";
const PART_BOOTSTRAP: &str = "bootstrap";
const PART_MAINTENANCE: &str = "maintenance";
const PART_REPLACEMENT: &str = "replacement";

/// Converts any served version to the hub.
pub fn to_hub(obj: VersionedCluster) -> v2::EtcdCluster {
    match obj {
        VersionedCluster::V1alpha1(obj) => obj.into(),
        VersionedCluster::V1alpha2(obj) => obj,
    }
}

/// The v1alpha2 side of the `pod` part.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodParts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_template: Option<Box<v2::PodTemplate>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    storage: Option<v2::StorageSpec>,
}

/// Parts stashed in an annotation, by part name.
#[derive(Default)]
struct Stash(BTreeMap<String, Value>);

impl Stash {
    /// Removes the annotation `key` from `meta` and parses it. A malformed stash is dropped.
    fn take(meta: &mut ObjectMeta, key: &str) -> Self {
        let Some(annotations) = meta.annotations.as_mut() else {
            return Self::default();
        };
        let raw = annotations.remove(key);
        if annotations.is_empty() {
            meta.annotations = None;
        }
        Self(
            raw.and_then(|raw| serde_json::from_str(&raw).ok())
                .unwrap_or_default(),
        )
    }

    /// The stashed part `name`, if it parses and `forward(part)` equals `current` once both
    /// have the defaults of their version (`normalize`): defaults the server filled in after the
    /// stash was written (a write through the other version) do not make it stale.
    fn restore<T: DeserializeOwned, U: PartialEq>(
        &self,
        name: &str,
        current: &U,
        forward: impl Fn(&T) -> U,
        normalize: impl Fn(&U) -> U,
    ) -> Option<T> {
        let value = self.0.get(name)?;
        let part: T = serde_json::from_value(value.clone()).ok()?;
        (normalize(&forward(&part)) == normalize(current)).then_some(part)
    }

    /// Stashes `part` unless `backward(chosen) == *part`.
    fn keep<T: Serialize + PartialEq, U>(
        &mut self,
        name: &str,
        part: &T,
        chosen: &U,
        backward: impl Fn(&U) -> T,
    ) {
        if backward(chosen) != *part
            && let Ok(value) = serde_json::to_value(part)
        {
            self.0.insert(name.to_owned(), value);
        }
    }

    /// Writes the stash as annotation `key` of `meta` (nothing when empty).
    fn put(self, meta: &mut ObjectMeta, key: &str) {
        if self.0.is_empty() {
            return;
        }
        if let Ok(json) = serde_json::to_string(&self.0) {
            meta.annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(key.to_owned(), json);
        }
    }
}

/// The parts of a v1alpha1 object that its conversion to the hub took from the stash in its
/// annotation rather than from its own fields. There, the v1alpha1 fields are only a rendering of
/// the hub's settings (a cron schedule shown as the nearest interval, for example): the hub part
/// is what is stored and validated, and the rules on the v1alpha1 fields do not apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoredParts {
    /// `spec.pod` stands for a stashed `podTemplate` and `storage`.
    pub pod: bool,
    /// `spec.backup` stands for a stashed v1alpha2 `backup`.
    pub backup: bool,
    /// `spec.TLS` stands for a stashed v1alpha2 `tls`.
    pub tls: bool,
}

/// Converts a v1alpha1 object to the hub, and tells which parts came from its stash.
pub fn v1alpha1_to_hub(obj: v1::EtcdCluster) -> (v2::EtcdCluster, RestoredParts) {
    let v1::EtcdCluster {
        metadata: mut meta,
        spec,
        status,
        ..
    } = obj;
    let stash = Stash::take(&mut meta, V1ALPHA2_FIELDS_ANNOTATION);
    let name = meta.name.clone().unwrap_or_default();
    let name = name.as_str();

    let restored_pod: Option<PodParts> = stash.restore(PART_POD, &spec.pod, pod_down, Clone::clone);
    let restored_backup = stash.restore(
        PART_BACKUP,
        &spec.backup,
        |b: &Option<Box<v2::BackupSpec>>| backup_down(b.as_deref()),
        normalize_v1_backup,
    );
    let restored_tls = stash.restore(
        PART_TLS,
        &spec.tls,
        |t: &Option<Box<v2::TlsSpec>>| tls_down(t.as_deref()),
        Clone::clone,
    );
    let restored = RestoredParts {
        pod: restored_pod.is_some(),
        backup: restored_backup.is_some(),
        tls: restored_tls.is_some(),
    };
    let pod = restored_pod.unwrap_or_else(|| pod_up(spec.pod.as_ref()));
    let backup = restored_backup.unwrap_or_else(|| backup_up(spec.backup.as_ref(), name));
    let tls = restored_tls.unwrap_or_else(|| tls_up(spec.tls.as_ref()));
    let bootstrap: Option<Box<v2::BootstrapSpec>> = stash
        .restore(PART_BOOTSTRAP, &(), |_: &Option<_>| (), |()| ())
        .flatten();
    let maintenance: Option<Box<v2::MaintenanceSpec>> = stash
        .restore(PART_MAINTENANCE, &(), |_: &Option<_>| (), |()| ())
        .flatten();
    let replacement: Option<Box<v2::ReplacementSpec>> = stash
        .restore(PART_REPLACEMENT, &(), |_: &Option<_>| (), |()| ())
        .flatten();

    // A part restored from the stash matches the v1alpha1 fields up to their defaults (the
    // condition of `restore`): the hub part stands for them, and stashing the v1alpha1 fields
    // as well would write a v1alpha1 annotation into an object whose client changed nothing.
    let mut keep = Stash::default();
    if !restored.pod {
        keep.keep(PART_POD, &spec.pod, &pod, pod_down);
    }
    if !restored.backup {
        keep.keep(PART_BACKUP, &spec.backup, &backup, |b| backup_down(b.as_deref()));
    }
    if !restored.tls {
        keep.keep(PART_TLS, &spec.tls, &tls, |t| tls_down(t.as_deref()));
    }
    keep.put(&mut meta, V1ALPHA1_FIELDS_ANNOTATION);

    let hub = v2::EtcdCluster {
        api_version: v2::API_VERSION.to_owned(),
        kind: crate::KIND.to_owned(),
        metadata: meta,
        spec: v2::EtcdClusterSpec {
            replicas: spec.size,
            version: spec.version,
            repository: spec.repository,
            pod_template: pod.pod_template,
            storage: pod.storage,
            tls,
            backup,
            bootstrap,
            maintenance,
            replacement,
            paused: spec.paused,
        },
        status,
    };
    (hub, restored)
}

impl From<v1::EtcdCluster> for v2::EtcdCluster {
    fn from(obj: v1::EtcdCluster) -> Self {
        v1alpha1_to_hub(obj).0
    }
}

impl From<v2::EtcdCluster> for v1::EtcdCluster {
    fn from(obj: v2::EtcdCluster) -> Self {
        let v2::EtcdCluster {
            metadata: mut meta,
            spec,
            status,
            ..
        } = obj;
        let stash = Stash::take(&mut meta, V1ALPHA1_FIELDS_ANNOTATION);
        let name = meta.name.clone().unwrap_or_default();
        let name = name.as_str();
        let pod_parts = PodParts {
            pod_template: spec.pod_template,
            storage: spec.storage,
        };

        let pod = stash
            .restore(
                PART_POD,
                &pod_parts,
                |p: &Option<v1::PodPolicy>| pod_up(p.as_ref()),
                normalize_pod_parts,
            )
            .unwrap_or_else(|| pod_down(&pod_parts));
        let backup = stash
            .restore(
                PART_BACKUP,
                &spec.backup,
                |b: &Option<v1::BackupPolicy>| backup_up(b.as_ref(), name),
                normalize_v2_backup,
            )
            .unwrap_or_else(|| backup_down(spec.backup.as_deref()));
        let tls = stash
            .restore(
                PART_TLS,
                &spec.tls,
                |t: &Option<v1::TlsPolicy>| tls_up(t.as_ref()),
                normalize_v2_tls,
            )
            .unwrap_or_else(|| tls_down(spec.tls.as_deref()));

        let mut keep = Stash::default();
        keep.keep(PART_POD, &pod_parts, &pod, |p| pod_up(p.as_ref()));
        keep.keep(PART_BACKUP, &spec.backup, &backup, |b| {
            backup_up(b.as_ref(), name)
        });
        keep.keep(PART_TLS, &spec.tls, &tls, |t| tls_up(t.as_ref()));
        keep.keep(PART_BOOTSTRAP, &spec.bootstrap, &(), |_| None);
        keep.keep(PART_MAINTENANCE, &spec.maintenance, &(), |_| None);
        keep.keep(PART_REPLACEMENT, &spec.replacement, &(), |_| None);
        keep.put(&mut meta, V1ALPHA2_FIELDS_ANNOTATION);

        v1::EtcdCluster {
            api_version: v1::API_VERSION.to_owned(),
            kind: crate::KIND.to_owned(),
            metadata: meta,
            spec: v1::ClusterSpec {
                size: spec.replicas,
                version: spec.version,
                repository: spec.repository,
                pod,
                backup,
                tls,
                paused: spec.paused,
            },
            status,
        }
    }
}

// --- defaults, for comparing parts (the same functions the server applies)

fn normalize_pod_parts(parts: &PodParts) -> PodParts {
    let mut obj = v2::EtcdCluster::default();
    obj.spec.pod_template = parts.pod_template.clone();
    obj.spec.storage = parts.storage.clone();
    crate::defaults::apply_v1alpha2(&mut obj);
    PodParts {
        pod_template: obj.spec.pod_template,
        storage: obj.spec.storage,
    }
}

fn normalize_v2_backup(backup: &Option<Box<v2::BackupSpec>>) -> Option<Box<v2::BackupSpec>> {
    let mut obj = v2::EtcdCluster::default();
    obj.spec.backup = backup.clone();
    crate::defaults::apply_v1alpha2(&mut obj);
    obj.spec.backup
}

fn normalize_v2_tls(tls: &Option<Box<v2::TlsSpec>>) -> Option<Box<v2::TlsSpec>> {
    let mut obj = v2::EtcdCluster::default();
    obj.spec.tls = tls.clone();
    crate::defaults::apply_v1alpha2(&mut obj);
    obj.spec.tls
}

fn normalize_v1_backup(backup: &Option<v1::BackupPolicy>) -> Option<v1::BackupPolicy> {
    let mut obj = v1::EtcdCluster::default();
    obj.spec.backup = backup.clone();
    crate::defaults::apply_v1alpha1(&mut obj);
    obj.spec.backup
}

// --- pod ↔ podTemplate + storage

fn pod_up(pod: Option<&v1::PodPolicy>) -> PodParts {
    let Some(pod) = pod else {
        return PodParts::default();
    };
    let has_metadata = pod.labels.is_some() || pod.annotations.is_some();
    let has_spec = pod.resources.is_some()
        || pod.affinity.is_some()
        || pod.node_selector.is_some()
        || pod.tolerations.is_some();
    let only_storage = !has_metadata
        && !has_spec
        && pod.anti_affinity.is_none()
        && pod.persistent_volume_claim_spec.is_some();
    let pod_template = (!only_storage).then(|| v2::PodTemplate {
        metadata: has_metadata.then(|| v2::PodTemplateMetadata {
            labels: pod.labels.clone(),
            annotations: pod.annotations.clone(),
        }),
        spec: has_spec.then(|| v2::PodTemplateSpec {
            resources: pod.resources.clone(),
            affinity: pod.affinity.clone(),
            node_selector: pod.node_selector.clone(),
            tolerations: pod.tolerations.clone(),
            topology_spread_constraints: None,
            priority_class_name: None,
        }),
    });
    let storage = pod
        .persistent_volume_claim_spec
        .as_ref()
        .map(|pvc| v2::StorageSpec {
            medium: Some(StorageMedium::Disk),
            size: pvc
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .cloned(),
            storage_class_name: pvc.storage_class_name.clone(),
        });
    PodParts {
        pod_template: pod_template.map(Box::new),
        storage,
    }
}

fn pod_down(parts: &PodParts) -> Option<v1::PodPolicy> {
    let pvc = parts.storage.as_ref().and_then(|storage| match storage.medium {
        None | Some(StorageMedium::Disk) => Some(PersistentVolumeClaimSpec {
            resources: storage.size.as_ref().map(|size| VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), size.clone())])),
                limits: None,
            }),
            storage_class_name: storage.storage_class_name.clone(),
            ..PersistentVolumeClaimSpec::default()
        }),
        Some(_) => None,
    });
    if parts.pod_template.is_none() && pvc.is_none() {
        return None;
    }
    let template = parts.pod_template.as_deref().cloned().unwrap_or_default();
    let metadata = template.metadata.unwrap_or_default();
    let spec = template.spec.unwrap_or_default();
    Some(v1::PodPolicy {
        labels: metadata.labels,
        annotations: metadata.annotations,
        resources: spec.resources,
        affinity: spec.affinity,
        node_selector: spec.node_selector,
        tolerations: spec.tolerations,
        anti_affinity: None,
        persistent_volume_claim_spec: pvc,
    })
}

// --- backup

fn backup_up(backup: Option<&v1::BackupPolicy>, cluster: &str) -> Option<Box<v2::BackupSpec>> {
    let backup = backup?;
    let destination = match backup.storage_type {
        Some(BackupStorageType::S3) => v2::BackupDestination {
            s3: Some(backup.s3.as_ref().map(s3_up).unwrap_or_default()),
            volume: None,
        },
        Some(BackupStorageType::PersistentVolume) => v2::BackupDestination {
            s3: None,
            volume: Some(v2::VolumeDestination {
                claim_name: Some(naming::backup_claim_name(cluster)),
                path: None,
            }),
        },
        _ => v2::BackupDestination::default(),
    };
    Some(Box::new(v2::BackupSpec {
        schedule: backup
            .backup_interval_in_second
            .map(interval_to_cron)
            .unwrap_or_default(),
        retention: backup.max_backups.map(|count| v2::BackupRetention {
            max_count: Some(count),
            max_age: None,
        }),
        destination,
    }))
}

fn backup_down(backup: Option<&v2::BackupSpec>) -> Option<v1::BackupPolicy> {
    let backup = backup?;
    let dest = &backup.destination;
    let (storage_type, s3, pv) = match (&dest.s3, &dest.volume) {
        (Some(s3), None) => (Some(BackupStorageType::S3), Some(s3_down(s3)), None),
        (None, Some(_)) => (
            Some(BackupStorageType::PersistentVolume),
            None,
            Some(v1::PvSource::default()),
        ),
        _ => (None, None, None),
    };
    Some(v1::BackupPolicy {
        backup_interval_in_second: cron_to_interval(&backup.schedule),
        max_backups: backup.retention.as_ref().and_then(|r| r.max_count),
        storage_type,
        s3,
        pv,
    })
}

fn s3_up(s3: &v1::S3Source) -> v2::S3Destination {
    v2::S3Destination {
        bucket: s3.bucket.clone(),
        prefix: s3.prefix.clone(),
        endpoint: s3.endpoint.clone(),
        region: s3.region.clone(),
        credentials_secret: s3.aws_secret.clone(),
        force_path_style: s3.force_path_style,
    }
}

fn s3_down(s3: &v2::S3Destination) -> v1::S3Source {
    v1::S3Source {
        bucket: s3.bucket.clone(),
        prefix: s3.prefix.clone(),
        endpoint: s3.endpoint.clone(),
        region: s3.region.clone(),
        aws_secret: s3.credentials_secret.clone(),
        force_path_style: s3.force_path_style,
    }
}

/// The cron schedule of a v1alpha1 backup interval. Intervals that divide an hour or a day
/// evenly map exactly; others are approximated by the next shorter such interval (the exact
/// interval is kept in the conversion annotation). A non-positive interval gives no schedule.
pub fn interval_to_cron(seconds: i64) -> String {
    if seconds <= 0 {
        return String::new();
    }
    let minutes = (seconds / 60).max(1);
    if minutes < 60 {
        let step = largest_divisor_at_most(60, minutes);
        return if step == 1 {
            "* * * * *".to_owned()
        } else {
            format!("*/{step} * * * *")
        };
    }
    let hours = minutes / 60;
    if hours < 24 {
        let step = largest_divisor_at_most(24, hours);
        return if step == 1 {
            "0 * * * *".to_owned()
        } else {
            format!("0 */{step} * * *")
        };
    }
    "0 0 * * *".to_owned()
}

fn largest_divisor_at_most(whole: i64, limit: i64) -> i64 {
    (1..=limit.min(whole)).rev().find(|d| whole % d == 0).unwrap_or(1)
}

/// The v1alpha1 backup interval of a cron schedule, for the schedules [`interval_to_cron`]
/// produces; `None` for any other schedule.
pub fn cron_to_interval(schedule: &str) -> Option<i64> {
    let fields: Vec<&str> = schedule.split(' ').collect();
    let step = |field: &str, whole: i64| -> Option<i64> {
        if field == "*" {
            return Some(1);
        }
        let n: i64 = field.strip_prefix("*/")?.parse().ok()?;
        (n > 1 && n < whole && whole % n == 0 && field == format!("*/{n}")).then_some(n)
    };
    match fields.as_slice() {
        ["0", "0", "*", "*", "*"] => Some(86_400),
        ["0", hour, "*", "*", "*"] => step(hour, 24).map(|h| h * 3600),
        [minute, "*", "*", "*", "*"] => step(minute, 60).map(|m| m * 60),
        _ => None,
    }
}

// --- TLS

fn tls_up(tls: Option<&v1::TlsPolicy>) -> Option<Box<v2::TlsSpec>> {
    let tls = tls?;
    let member = tls.static_tls.as_ref().and_then(|s| s.member.as_ref());
    let plane = |name: Option<&String>| {
        name.map(|name| v2::TlsPlane {
            secret_ref: Some(v2::SecretReference { name: name.clone() }),
            ..v2::TlsPlane::default()
        })
    };
    Some(Box::new(v2::TlsSpec {
        client: plane(member.and_then(|m| m.server_secret.as_ref())),
        peer: plane(member.and_then(|m| m.peer_secret.as_ref())),
    }))
}

fn tls_down(tls: Option<&v2::TlsSpec>) -> Option<v1::TlsPolicy> {
    let tls = tls?;
    let secret = |plane: &Option<v2::TlsPlane>| {
        plane
            .as_ref()
            .and_then(|p| p.secret_ref.as_ref())
            .map(|s| s.name.clone())
    };
    let member = v1::MemberSecret {
        peer_secret: secret(&tls.peer),
        server_secret: secret(&tls.client),
    };
    let has_member = member.peer_secret.is_some() || member.server_secret.is_some();
    Some(v1::TlsPolicy {
        static_tls: has_member.then_some(v1::StaticTlsPolicy {
            member: Some(member),
            operator_secret: None,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn intervals_and_cron_schedules() {
        let exact = [
            (60, "* * * * *"),
            (300, "*/5 * * * *"),
            (1800, "*/30 * * * *"),
            (3600, "0 * * * *"),
            (7200, "0 */2 * * *"),
            (43_200, "0 */12 * * *"),
            (86_400, "0 0 * * *"),
        ];
        for (seconds, cron) in exact {
            assert_eq!(interval_to_cron(seconds), cron);
            assert_eq!(cron_to_interval(cron), Some(seconds), "{cron}");
        }
        assert_eq!(interval_to_cron(0), "");
        assert_eq!(interval_to_cron(-5), "");
        assert_eq!(interval_to_cron(30), "* * * * *");
        assert_eq!(interval_to_cron(7 * 60), "*/6 * * * *");
        assert_eq!(interval_to_cron(5 * 3600), "0 */4 * * *");
        assert_eq!(interval_to_cron(3 * 86_400), "0 0 * * *");
        for cron in [
            "*/7 * * * *",
            "*/60 * * * *",
            "*/1 * * * *",
            "*/05 * * * *",
            "15 * * * *",
            "0 0 * * 1",
            "",
        ] {
            assert_eq!(cron_to_interval(cron), None, "{cron}");
        }
    }

    fn v1_sample() -> v1::EtcdCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "etcd.operator.dev/v1alpha1",
            "kind": "EtcdCluster",
            "metadata": {"name": "example", "namespace": "default"},
            "spec": {
                "size": 3,
                "version": "3.5.21",
                "pod": {
                    "labels": {"team": "a"},
                    "antiAffinity": true,
                    "persistentVolumeClaimSpec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "2Gi"}},
                        "storageClassName": "fast"
                    }
                },
                "backup": {
                    "backupIntervalInSecond": 1800,
                    "maxBackups": 5,
                    "storageType": "S3",
                    "s3": {"bucket": "backups", "awsSecret": "aws"}
                },
                "TLS": {"static": {"member": {"peerSecret": "peer", "serverSecret": "server"}, "operatorSecret": "op"}}
            }
        }))
        .unwrap()
    }

    #[test]
    fn v1alpha1_to_hub_maps_fields_and_stashes_the_rest() {
        let hub = v2::EtcdCluster::from(v1_sample());
        assert_eq!(hub.api_version, v2::API_VERSION);
        assert_eq!(hub.spec.replicas, Some(3));
        let storage = hub.spec.storage.clone().unwrap();
        assert_eq!(storage.medium, Some(StorageMedium::Disk));
        assert_eq!(storage.size.unwrap().0, "2Gi");
        assert_eq!(storage.storage_class_name.as_deref(), Some("fast"));
        let backup = hub.spec.backup.clone().unwrap();
        assert_eq!(backup.schedule, "*/30 * * * *");
        assert_eq!(backup.retention.unwrap().max_count, Some(5));
        assert_eq!(
            backup.destination.s3.unwrap().credentials_secret.as_deref(),
            Some("aws")
        );
        let tls = hub.spec.tls.clone().unwrap();
        assert_eq!(tls.peer.unwrap().secret_ref.unwrap().name, "peer");
        assert_eq!(tls.client.unwrap().secret_ref.unwrap().name, "server");
        // antiAffinity, accessModes and operatorSecret have no v1alpha2 form: stashed.
        let stash = hub
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(V1ALPHA1_FIELDS_ANNOTATION)
            .unwrap();
        let stash: serde_json::Value = serde_json::from_str(stash).unwrap();
        assert_eq!(stash["pod"]["antiAffinity"], true);
        assert_eq!(stash["tls"]["static"]["operatorSecret"], "op");
        assert!(stash.get("backup").is_none(), "the backup maps exactly: {stash}");

        let back = v1::EtcdCluster::from(hub);
        assert_eq!(back, v1_sample());
    }

    #[test]
    fn hub_only_fields_survive_v1alpha1() {
        let mut hub = v2::EtcdCluster::new(
            "mem",
            "default",
            v2::EtcdClusterSpec {
                replicas: Some(5),
                storage: Some(v2::StorageSpec {
                    medium: Some(StorageMedium::Memory),
                    ..v2::StorageSpec::default()
                }),
                bootstrap: Some(Box::new(v2::BootstrapSpec {
                    restore: Some(v2::RestoreSpec {
                        backup_name: Some("b1".into()),
                        source: None,
                    }),
                })),
                maintenance: Some(Box::new(v2::MaintenanceSpec {
                    auto_compaction: Some(v2::AutoCompactionSpec {
                        mode: Some(v2::AutoCompactionMode::Revision),
                        retention: Some("500".into()),
                    }),
                    quota_backend_bytes: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                        "64Mi".into(),
                    )),
                    defragmentation: Some(v2::DefragmentationSpec {
                        schedule: Some("0 3 * * 0".into()),
                        fragmentation_percent: Some(30),
                        min_reclaimable_bytes: None,
                    }),
                })),
                replacement: Some(Box::new(v2::ReplacementSpec {
                    policy: Some(v2::ReplacementPolicy::Manual),
                    unhealthy_after: Some("30m".into()),
                    crash_loop_after: Some("2m".into()),
                })),
                ..v2::EtcdClusterSpec::default()
            },
        );
        hub.metadata.labels = Some(BTreeMap::from([("a".to_owned(), "b".to_owned())]));
        let old = v1::EtcdCluster::from(hub.clone());
        assert_eq!(old.spec.size, Some(5));
        assert!(old.spec.pod.is_none());
        assert!(
            old.metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(V1ALPHA2_FIELDS_ANNOTATION)
        );
        assert_eq!(v2::EtcdCluster::from(old.clone()), hub);

        // An edit of a v1alpha1 scalar keeps the stash valid.
        let mut edited = old;
        edited.spec.size = Some(3);
        let hub2 = v2::EtcdCluster::from(edited);
        assert_eq!(hub2.spec.replicas, Some(3));
        assert_eq!(hub2.spec.storage, hub.spec.storage);
        assert_eq!(hub2.spec.bootstrap, hub.spec.bootstrap);
        assert_eq!(hub2.spec.maintenance, hub.spec.maintenance);
        assert_eq!(hub2.spec.replacement, hub.spec.replacement);
        assert!(hub2.metadata.annotations.is_none());
    }

    #[test]
    fn stale_stash_is_dropped() {
        let hub = v2::EtcdCluster::from(v1_sample());
        let mut edited = hub;
        // A v1alpha2 client replaces the TLS settings: the stashed v1alpha1 TLS is stale.
        edited.spec.tls = Some(Box::new(v2::TlsSpec {
            client: Some(v2::TlsPlane {
                auto: Some(v2::AutoTls {}),
                ..v2::TlsPlane::default()
            }),
            peer: None,
        }));
        let old = v1::EtcdCluster::from(edited.clone());
        assert_eq!(old.spec.tls, Some(v1::TlsPolicy { static_tls: None }));
        // ...but the pod part is still restored (antiAffinity).
        assert_eq!(old.spec.pod.as_ref().unwrap().anti_affinity, Some(true));
        // The stale part is gone from the stash, the rest round-trips.
        assert_eq!(v2::EtcdCluster::from(old).spec, edited.spec);
    }

    #[test]
    fn defaults_added_through_the_hub_do_not_make_the_stash_stale() {
        // Created through v1alpha1 with antiAffinity (stashed on the hub); then any write
        // through v1alpha2 applies the v1alpha2 defaults (storage, backup retention).
        let mut hub = v2::EtcdCluster::from(v1_sample());
        crate::defaults::apply_v1alpha2(&mut hub);
        let old = v1::EtcdCluster::from(hub.clone());
        assert_eq!(
            old.spec.pod.as_ref().and_then(|p| p.anti_affinity),
            Some(true),
            "antiAffinity survives"
        );
        assert_eq!(old.spec.tls, v1_sample().spec.tls);
        // And the hub keeps what it had when converted back.
        let mut again = v2::EtcdCluster::from(old);
        crate::defaults::apply_v1alpha2(&mut again);
        assert_eq!(again.spec, hub.spec);
    }

    #[test]
    fn malformed_stash_is_ignored() {
        let mut old = v1_sample();
        old.metadata.annotations = Some(BTreeMap::from([(
            V1ALPHA2_FIELDS_ANNOTATION.to_owned(),
            "not json".to_owned(),
        )]));
        let hub = v2::EtcdCluster::from(old);
        assert!(
            !hub.metadata
                .annotations
                .unwrap()
                .contains_key(V1ALPHA2_FIELDS_ANNOTATION)
        );
    }
}
