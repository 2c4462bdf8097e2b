//! Reporting hub validation results in v1alpha1 terms: field paths mapped to the v1alpha1 shape,
//! plus the rules on v1alpha1 fields that have no hub counterpart (backup interval, PV size,
//! operator secret), which the hub keeps only in its conversion annotation.

use super::Outcome;
use super::field::{FieldError, FieldWarning, Path};
use super::format;
use crate::convert::{RestoredParts, V1ALPHA2_FIELDS_ANNOTATION, interval_to_cron};
use crate::v1alpha1::{self as v1, BackupStorageType};

/// Hub path prefixes and their v1alpha1 equivalents, most specific first.
const PATH_MAP: &[(&str, &str)] = &[
    ("spec.replicas", "spec.size"),
    ("spec.podTemplate.metadata.labels", "spec.pod.labels"),
    ("spec.podTemplate.metadata.annotations", "spec.pod.annotations"),
    ("spec.podTemplate.spec.resources", "spec.pod.resources"),
    ("spec.podTemplate.spec.affinity", "spec.pod.affinity"),
    ("spec.podTemplate.spec.nodeSelector", "spec.pod.nodeSelector"),
    ("spec.podTemplate.spec.tolerations", "spec.pod.tolerations"),
    (
        "spec.storage.size",
        "spec.pod.persistentVolumeClaimSpec.resources.requests[storage]",
    ),
    (
        "spec.storage.storageClassName",
        "spec.pod.persistentVolumeClaimSpec.storageClassName",
    ),
    ("spec.storage", "spec.pod.persistentVolumeClaimSpec"),
    (
        "spec.tls.client.secretRef.name",
        "spec.TLS.static.member.serverSecret",
    ),
    (
        "spec.tls.peer.secretRef.name",
        "spec.TLS.static.member.peerSecret",
    ),
    ("spec.tls", "spec.TLS"),
    ("spec.backup.schedule", "spec.backup.backupIntervalInSecond"),
    ("spec.backup.retention.maxCount", "spec.backup.maxBackups"),
    (
        "spec.backup.destination.s3.credentialsSecret",
        "spec.backup.s3.awsSecret",
    ),
    ("spec.backup.destination.s3", "spec.backup.s3"),
    ("spec.backup.destination.volume", "spec.backup.pv"),
    ("spec.backup.destination", "spec.backup.storageType"),
    ("spec.backup", "spec.backup"),
    ("spec.version", "spec.version"),
    ("spec.repository", "spec.repository"),
    ("spec.paused", "spec.paused"),
];

/// Hub fields v1alpha1 cannot express (a v1alpha1 object carries them in its annotation).
const V1ALPHA2_ONLY: &[&str] = &[
    "spec.storage.medium",
    "spec.podTemplate.spec.topologySpreadConstraints",
    "spec.podTemplate.spec.priorityClassName",
    "spec.tls.client.certManager",
    "spec.tls.client.auto",
    "spec.tls.peer.certManager",
    "spec.tls.peer.auto",
    "spec.backup.retention.maxAge",
    "spec.bootstrap",
];

fn strip<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(prefix)?;
    (rest.is_empty() || rest.starts_with(['.', '['])).then_some(rest)
}

/// The v1alpha1 path of a hub path, or `None` for a v1alpha2-only field.
pub(crate) fn map_path(hub_path: &str) -> Option<String> {
    if !hub_path.starts_with("spec") {
        return Some(hub_path.to_owned());
    }
    if V1ALPHA2_ONLY
        .iter()
        .any(|prefix| strip(hub_path, prefix).is_some())
    {
        return None;
    }
    PATH_MAP
        .iter()
        .find_map(|(hub, old)| strip(hub_path, hub).map(|rest| format!("{old}{rest}")))
}

fn annotation_path() -> String {
    Path::root("metadata")
        .child("annotations")
        .key(V1ALPHA2_FIELDS_ANNOTATION)
        .to_string()
}

/// Maps a hub outcome to v1alpha1 paths and adds the v1alpha1-only rules. An error on a path a
/// v1alpha1-only rule already reported (or under it) is dropped: it has the same cause. The
/// v1alpha1-only rules skip the parts `restored` from the object's annotation: there the hub part
/// is what counts, and the hub rules check it.
pub(crate) fn translate(hub: Outcome, obj: &v1::EtcdCluster, restored: RestoredParts) -> Outcome {
    let mut own = Outcome::default();
    own_rules(&mut own, obj, restored);
    let own_fields: Vec<String> = own.errors.iter().map(|e| e.field.clone()).collect();
    let mut errors = own.errors;
    for mut error in hub.errors {
        match map_path(&error.field) {
            Some(path) => error.field = path,
            None => {
                error.detail = format!("v1alpha2 field {}: {}", error.field, error.detail);
                error.field = annotation_path();
            }
        }
        if !own_fields.iter().any(|own| strip(&error.field, own).is_some()) {
            errors.push(error);
        }
    }
    let mut warnings = own.warnings;
    warnings.extend(hub.warnings.into_iter().map(|mut warning| {
        warning.field = map_path(&warning.field).unwrap_or_else(annotation_path);
        warning
    }));
    Outcome { errors, warnings }
}

fn own_rules(out: &mut Outcome, obj: &v1::EtcdCluster, restored: RestoredParts) {
    let spec = Path::root("spec");
    if let Some(backup) = obj.spec.backup.as_ref().filter(|_| !restored.backup) {
        let path = spec.child("backup");
        let interval = path.child("backupIntervalInSecond");
        match backup.backup_interval_in_second {
            None => out.errors.push(FieldError::required(&interval, "")),
            Some(seconds) if seconds < 60 => {
                out.errors
                    .push(FieldError::invalid_raw(&interval, seconds, "must be at least 60"));
            }
            Some(seconds) => {
                let cron = interval_to_cron(seconds);
                if crate::convert::cron_to_interval(&cron) != Some(seconds) {
                    out.warnings.push(FieldWarning::new(
                        &interval,
                        format!("backups run on the schedule {cron:?}: intervals that do not divide an hour or a day evenly are rounded down"),
                    ));
                }
            }
        }
        match &backup.storage_type {
            None => out
                .errors
                .push(FieldError::required(&path.child("storageType"), "")),
            Some(t) if !t.is_known() => out.errors.push(FieldError::not_supported(
                &path.child("storageType"),
                t.as_str(),
                BackupStorageType::KNOWN,
            )),
            Some(BackupStorageType::S3) if backup.s3.is_none() => {
                out.errors.push(FieldError::required(
                    &path.child("s3"),
                    "required for storageType S3",
                ));
            }
            Some(_) => {}
        }
        if let Some(pv) = &backup.pv {
            let pv_path = path.child("pv");
            if let Some(size) = pv.volume_size_in_mb
                && size <= 0
            {
                out.errors.push(FieldError::invalid_raw(
                    &pv_path.child("volumeSizeInMB"),
                    size,
                    "must be greater than zero",
                ));
            }
            if let Some(class) = &pv.storage_class {
                for problem in format::dns1123_subdomain(class) {
                    out.errors.push(FieldError::invalid(
                        &pv_path.child("storageClass"),
                        class,
                        problem,
                    ));
                }
            }
        }
    }
    if let Some(secret) = obj
        .spec
        .tls
        .as_ref()
        .filter(|_| !restored.tls)
        .and_then(|t| t.static_tls.as_ref())
        .and_then(|s| s.operator_secret.as_ref())
    {
        let path = spec.child("TLS").child("static").child("operatorSecret");
        for problem in format::dns1123_subdomain(secret) {
            out.errors.push(FieldError::invalid(&path, secret, problem));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_v1alpha1() {
        let cases = [
            ("spec.replicas", Some("spec.size")),
            (
                "spec.podTemplate.spec.tolerations[0].key",
                Some("spec.pod.tolerations[0].key"),
            ),
            (
                "spec.storage.size",
                Some("spec.pod.persistentVolumeClaimSpec.resources.requests[storage]"),
            ),
            (
                "spec.tls.peer.secretRef.name",
                Some("spec.TLS.static.member.peerSecret"),
            ),
            ("spec.backup.destination.s3.bucket", Some("spec.backup.s3.bucket")),
            (
                "spec.backup.destination.s3.credentialsSecret",
                Some("spec.backup.s3.awsSecret"),
            ),
            ("metadata.name", Some("metadata.name")),
            ("spec.bootstrap.restore", None),
            ("spec.podTemplate.spec.priorityClassName", None),
            ("spec.storage.medium", None),
            ("spec.tls.client.auto", None),
            ("spec.tls.client", Some("spec.TLS.client")),
            ("spec.storageX", None),
        ];
        for (hub, want) in cases {
            assert_eq!(map_path(hub).as_deref(), want, "{hub}");
        }
    }
}
