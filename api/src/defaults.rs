//! Defaulting, per version: fills unset fields with the defaults documented on each field. Pure,
//! idempotent functions, applied to the version the client sent before conversion to the hub
//! (as Kubernetes does).
//!
//! Defaults that depend on other fields (the storage of a v1alpha1 cluster without a PVC spec, a
//! TLS plane left unset) are not materialised: an unset value means the documented default, and
//! [`effective_storage`] gives the value the controller uses.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::v1alpha2::{self as v2, StorageMedium};
use crate::{v1alpha1 as v1, versions};

/// Applies the defaults of whichever version the object is in.
pub fn apply(obj: &mut crate::VersionedCluster) {
    obj.apply_defaults();
}

/// Defaults of v1alpha1: `size` 3, `version` the default etcd version, `repository`
/// `quay.io/coreos/etcd`, `backup.maxBackups` 7; `apiVersion` and `kind`.
pub fn apply_v1alpha1(obj: &mut v1::EtcdCluster) {
    set_if_empty(&mut obj.api_version, v1::API_VERSION);
    set_if_empty(&mut obj.kind, crate::KIND);
    let spec = &mut obj.spec;
    spec.size.get_or_insert(v1::DEFAULT_SIZE);
    spec.version
        .get_or_insert_with(|| versions::DEFAULT_ETCD_VERSION.to_owned());
    spec.repository
        .get_or_insert_with(|| v1::DEFAULT_REPOSITORY.to_owned());
    if let Some(backup) = spec.backup.as_mut() {
        backup.max_backups.get_or_insert(v1::DEFAULT_MAX_BACKUPS);
    }
}

/// Defaults of v1alpha2: `replicas` 3, `version` the default etcd version, `repository`
/// `gcr.io/etcd-development/etcd`, `storage` medium `Disk` and size `1Gi`,
/// `backup.retention.maxCount` 7 when no retention limit is set, cert-manager issuer kind
/// `Issuer` and group `cert-manager.io`; `apiVersion` and `kind`.
pub fn apply_v1alpha2(obj: &mut v2::EtcdCluster) {
    set_if_empty(&mut obj.api_version, v2::API_VERSION);
    set_if_empty(&mut obj.kind, crate::KIND);
    let spec = &mut obj.spec;
    spec.replicas.get_or_insert(v2::DEFAULT_REPLICAS);
    spec.version
        .get_or_insert_with(|| versions::DEFAULT_ETCD_VERSION.to_owned());
    spec.repository
        .get_or_insert_with(|| v2::DEFAULT_REPOSITORY.to_owned());
    let storage = spec.storage.get_or_insert_with(v2::StorageSpec::default);
    default_storage(storage);
    if let Some(backup) = spec.backup.as_mut() {
        let retention = backup.retention.get_or_insert_with(v2::BackupRetention::default);
        if retention.max_count.is_none() && retention.max_age.is_none() {
            retention.max_count = Some(v2::DEFAULT_BACKUP_MAX_COUNT);
        }
    }
    if let Some(tls) = spec.tls.as_mut() {
        for plane in [tls.client.as_mut(), tls.peer.as_mut()].into_iter().flatten() {
            if let Some(cert_manager) = plane.cert_manager.as_mut() {
                let issuer = &mut cert_manager.issuer_ref;
                issuer.kind.get_or_insert_with(|| "Issuer".to_owned());
                issuer.group.get_or_insert_with(|| "cert-manager.io".to_owned());
            }
        }
    }
}

fn default_storage(storage: &mut v2::StorageSpec) {
    storage.medium.get_or_insert(StorageMedium::Disk);
    storage
        .size
        .get_or_insert_with(|| Quantity(v2::DEFAULT_STORAGE_SIZE.to_owned()));
}

/// The storage the controller provisions: the spec's storage with defaults filled in (an unset
/// `storage` is a 1Gi `Disk`).
pub fn effective_storage(spec: &v2::EtcdClusterSpec) -> v2::StorageSpec {
    let mut storage = spec.storage.clone().unwrap_or_default();
    default_storage(&mut storage);
    storage
}

/// The smallest and largest backend quota accepted (etcd's own suggested maximum is 8GiB).
pub const QUOTA_RANGE: (u64, u64) = (16 << 20, 8 << 30);

/// What `spec.maintenance` amounts to for the members' flags, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveMaintenance {
    /// `--auto-compaction-mode`: `periodic` or `revision`.
    pub compaction_mode: &'static str,
    /// `--auto-compaction-retention`.
    pub compaction_retention: String,
    /// `--quota-backend-bytes`.
    pub quota_backend_bytes: u64,
    /// When members are defragmented (not an etcd flag: the operator does it).
    pub defragmentation: EffectiveDefragmentation,
}

/// `spec.maintenance.defragmentation` with its defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveDefragmentation {
    /// The cron schedule of a defragmentation of every member, if any.
    pub schedule: Option<String>,
    /// The size trigger's share of free space in a database file, in percent; `0`: off.
    pub fragmentation_percent: u8,
    /// The size trigger's least free space worth a defragmentation, in bytes.
    pub min_reclaimable_bytes: u64,
}

/// The largest `minReclaimableBytes` accepted (the largest quota).
pub const MAX_MIN_RECLAIMABLE: u64 = QUOTA_RANGE.1;

/// `spec.maintenance.defragmentation` with its documented defaults (no schedule; the size
/// trigger at 50% free and 64Mi reclaimable). Values that do not parse or are out of range
/// (validation refuses them on admission) fall back to the defaults.
pub fn effective_defragmentation(spec: &v2::EtcdClusterSpec) -> EffectiveDefragmentation {
    let defrag = spec
        .maintenance
        .as_ref()
        .and_then(|m| m.defragmentation.clone())
        .unwrap_or_default();
    let percent = defrag
        .fragmentation_percent
        .filter(|p| (0..=99).contains(p))
        .unwrap_or(v2::DEFAULT_DEFRAG_FRAGMENTATION_PERCENT);
    let default_min = crate::quantity::parse(v2::DEFAULT_DEFRAG_MIN_RECLAIMABLE).unwrap_or(0.0);
    let min = defrag
        .min_reclaimable_bytes
        .and_then(|q| crate::quantity::parse(&q.0).ok())
        .filter(|v| {
            #[allow(clippy::cast_precision_loss)]
            let max = MAX_MIN_RECLAIMABLE as f64;
            *v >= 0.0 && *v <= max
        })
        .unwrap_or(default_min);
    // Truncation is intended: a byte count from a quantity within 0..=8Gi.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let min_reclaimable_bytes = min as u64;
    EffectiveDefragmentation {
        schedule: defrag.schedule.filter(|s| !s.trim().is_empty()),
        fragmentation_percent: u8::try_from(percent).unwrap_or(50),
        min_reclaimable_bytes,
    }
}

impl EffectiveMaintenance {
    /// The etcd flags.
    pub fn flags(&self) -> Vec<String> {
        vec![
            format!("--auto-compaction-mode={}", self.compaction_mode),
            format!("--auto-compaction-retention={}", self.compaction_retention),
            format!("--quota-backend-bytes={}", self.quota_backend_bytes),
        ]
    }
}

/// The maintenance the members run with: `spec.maintenance` with its documented defaults
/// (periodic compaction keeping `1h`, or `10000` revisions in `Revision` mode; a quota of three
/// quarters of the storage size, within [`QUOTA_RANGE`]). Values that do not parse (validation
/// refuses them on admission) fall back to the defaults.
pub fn effective_maintenance(spec: &v2::EtcdClusterSpec) -> EffectiveMaintenance {
    let maintenance = spec.maintenance.clone().unwrap_or_default();
    let compaction = maintenance.auto_compaction.unwrap_or_default();
    let revision = compaction.mode == Some(v2::AutoCompactionMode::Revision);
    let compaction_retention = compaction
        .retention
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| if revision { "10000" } else { "1h" }.to_owned());
    let storage = effective_storage(spec);
    let size = storage
        .size
        .as_ref()
        .and_then(|q| crate::quantity::parse(&q.0).ok())
        .unwrap_or(f64::from(1u32 << 30));
    let (low, high) = QUOTA_RANGE;
    // Truncation is intended: a byte count from a positive quantity below 2^53.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let from_size = (size * 0.75) as u64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let quota_backend_bytes = maintenance
        .quota_backend_bytes
        .and_then(|q| crate::quantity::parse(&q.0).ok())
        .map_or(from_size.clamp(low, high), |q| q as u64);
    EffectiveMaintenance {
        compaction_mode: if revision { "revision" } else { "periodic" },
        compaction_retention,
        quota_backend_bytes,
        defragmentation: effective_defragmentation(spec),
    }
}

/// Default of `spec.replacement.unhealthyAfter`, in seconds (10m).
pub const DEFAULT_UNHEALTHY_AFTER_SECS: u64 = 600;
/// Default of `spec.replacement.crashLoopAfter`, in seconds (5m).
pub const DEFAULT_CRASH_LOOP_AFTER_SECS: u64 = 300;
/// The range `spec.replacement`'s durations accept, in seconds (10s to 168h).
pub const REPLACEMENT_AFTER_RANGE: (u64, u64) = (10, 168 * 3600);

/// What `spec.replacement` amounts to, defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveReplacement {
    /// `policy: Manual`: failing members are reported, replaced only on request.
    pub manual: bool,
    /// `unhealthyAfter`.
    pub unhealthy_after: std::time::Duration,
    /// `crashLoopAfter`.
    pub crash_loop_after: std::time::Duration,
}

/// The replacement policy the controller applies: `spec.replacement` with its documented
/// defaults (`Automatic`, `unhealthyAfter` 10m, `crashLoopAfter` 5m). Values that do not parse
/// (validation refuses them on admission) fall back to the defaults.
pub fn effective_replacement(spec: &v2::EtcdClusterSpec) -> EffectiveReplacement {
    let replacement = spec.replacement.clone().unwrap_or_default();
    let after = |text: Option<&String>, default: u64| {
        // Whole seconds: fractions below a second do not matter at these scales.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let secs = text
            .and_then(|t| crate::validation::format::duration_seconds(t).ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(default, |s| s as u64);
        std::time::Duration::from_secs(secs)
    };
    EffectiveReplacement {
        manual: replacement.policy == Some(v2::ReplacementPolicy::Manual),
        unhealthy_after: after(replacement.unhealthy_after.as_ref(), DEFAULT_UNHEALTHY_AFTER_SECS),
        crash_loop_after: after(
            replacement.crash_loop_after.as_ref(),
            DEFAULT_CRASH_LOOP_AFTER_SECS,
        ),
    }
}

fn set_if_empty(field: &mut String, value: &str) {
    if field.is_empty() {
        value.clone_into(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn replacement_defaults_and_parsed_durations() {
        let mut spec = v2::EtcdClusterSpec::default();
        let r = effective_replacement(&spec);
        assert_eq!(
            r,
            EffectiveReplacement {
                manual: false,
                unhealthy_after: std::time::Duration::from_secs(600),
                crash_loop_after: std::time::Duration::from_secs(300),
            }
        );
        spec.replacement = Some(Box::new(v2::ReplacementSpec {
            policy: Some(v2::ReplacementPolicy::Manual),
            unhealthy_after: Some("1h30m".into()),
            crash_loop_after: Some("not a duration".into()),
        }));
        let r = effective_replacement(&spec);
        assert!(r.manual);
        assert_eq!(r.unhealthy_after, std::time::Duration::from_secs(5400));
        assert_eq!(r.crash_loop_after, std::time::Duration::from_secs(300));
    }

    #[test]
    fn maintenance_defaults_follow_the_storage_and_the_mode() {
        let mut spec = v2::EtcdClusterSpec::default();
        let m = effective_maintenance(&spec);
        assert_eq!(
            m.flags(),
            [
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=1h",
                "--quota-backend-bytes=805306368",
            ],
            "three quarters of the default 1Gi"
        );
        spec.storage = Some(v2::StorageSpec {
            medium: Some(StorageMedium::Memory),
            size: Some(Quantity("64Gi".into())),
            storage_class_name: None,
        });
        spec.maintenance = Some(Box::new(v2::MaintenanceSpec {
            auto_compaction: Some(v2::AutoCompactionSpec {
                mode: Some(v2::AutoCompactionMode::Revision),
                retention: None,
            }),
            quota_backend_bytes: None,
            defragmentation: None,
        }));
        let m = effective_maintenance(&spec);
        assert_eq!(
            (m.compaction_mode, m.compaction_retention.as_str()),
            ("revision", "10000")
        );
        assert_eq!(m.quota_backend_bytes, 8 << 30, "capped at 8Gi");
        spec.storage.as_mut().unwrap().size = Some(Quantity("10Mi".into()));
        assert_eq!(
            effective_maintenance(&spec).quota_backend_bytes,
            16 << 20,
            "at least 16Mi"
        );
        spec.maintenance.as_mut().unwrap().quota_backend_bytes = Some(Quantity("100Mi".into()));
        assert_eq!(
            effective_maintenance(&spec).quota_backend_bytes,
            100 << 20,
            "as asked"
        );
    }

    #[test]
    fn defragmentation_defaults_to_the_size_trigger_without_a_schedule() {
        let mut spec = v2::EtcdClusterSpec::default();
        assert_eq!(
            effective_defragmentation(&spec),
            EffectiveDefragmentation {
                schedule: None,
                fragmentation_percent: 50,
                min_reclaimable_bytes: 64 << 20,
            }
        );
        spec.maintenance = Some(Box::new(v2::MaintenanceSpec {
            defragmentation: Some(v2::DefragmentationSpec {
                schedule: Some("0 3 * * 0".into()),
                fragmentation_percent: Some(0),
                min_reclaimable_bytes: Some(Quantity("1Mi".into())),
            }),
            ..Default::default()
        }));
        assert_eq!(
            effective_defragmentation(&spec),
            EffectiveDefragmentation {
                schedule: Some("0 3 * * 0".into()),
                fragmentation_percent: 0,
                min_reclaimable_bytes: 1 << 20,
            }
        );
        // What admission refuses falls back to the defaults.
        let d = spec
            .maintenance
            .as_mut()
            .unwrap()
            .defragmentation
            .as_mut()
            .unwrap();
        d.fragmentation_percent = Some(100);
        d.min_reclaimable_bytes = Some(Quantity("lots".into()));
        d.schedule = Some(" ".into());
        assert_eq!(
            effective_defragmentation(&spec),
            EffectiveDefragmentation {
                schedule: None,
                fragmentation_percent: 50,
                min_reclaimable_bytes: 64 << 20,
            }
        );
    }

    #[test]
    fn v1alpha2_defaults() {
        let mut obj: v2::EtcdCluster = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {
                "backup": {"schedule": "0 * * * *", "destination": {"s3": {"bucket": "b"}}},
                "tls": {"peer": {"certManager": {"issuerRef": {"name": "ca"}}}}
            }
        }))
        .unwrap();
        apply_v1alpha2(&mut obj);
        assert_eq!(obj.api_version, v2::API_VERSION);
        assert_eq!(obj.kind, "EtcdCluster");
        assert_eq!(obj.spec.replicas, Some(3));
        assert_eq!(obj.spec.version.as_deref(), Some(versions::DEFAULT_ETCD_VERSION));
        assert_eq!(
            obj.spec.repository.as_deref(),
            Some("gcr.io/etcd-development/etcd")
        );
        assert_eq!(
            obj.spec.storage,
            Some(v2::StorageSpec {
                medium: Some(StorageMedium::Disk),
                size: Some(Quantity("1Gi".into())),
                storage_class_name: None
            })
        );
        assert_eq!(
            obj.spec.backup.as_ref().unwrap().retention,
            Some(v2::BackupRetention {
                max_count: Some(7),
                max_age: None
            })
        );
        let issuer = &obj
            .spec
            .tls
            .as_ref()
            .unwrap()
            .peer
            .as_ref()
            .unwrap()
            .cert_manager
            .as_ref()
            .unwrap()
            .issuer_ref;
        assert_eq!(issuer.kind.as_deref(), Some("Issuer"));
        assert_eq!(issuer.group.as_deref(), Some("cert-manager.io"));
        assert!(
            obj.spec.tls.as_ref().unwrap().client.is_none(),
            "an unset plane stays plain HTTP"
        );
        assert_eq!(obj.spec.paused, None);

        let once = obj.clone();
        apply_v1alpha2(&mut obj);
        assert_eq!(obj, once, "defaulting is idempotent");
    }

    #[test]
    fn v1alpha2_defaults_keep_set_values() {
        let mut obj = v2::EtcdCluster::default();
        obj.spec.replicas = Some(5);
        obj.spec.version = Some("3.4.23".into());
        obj.spec.repository = Some("registry.local/etcd".into());
        obj.spec.storage = Some(v2::StorageSpec {
            medium: Some(StorageMedium::Memory),
            size: Some(Quantity("256Mi".into())),
            storage_class_name: None,
        });
        obj.spec.backup = Some(Box::new(v2::BackupSpec {
            retention: Some(v2::BackupRetention {
                max_count: None,
                max_age: Some("24h".into()),
            }),
            ..v2::BackupSpec::default()
        }));
        let before = obj.spec.clone();
        apply_v1alpha2(&mut obj);
        assert_eq!(obj.spec, before);
    }

    #[test]
    fn v1alpha1_defaults() {
        let mut obj = v1::EtcdCluster::default();
        obj.spec.backup = Some(v1::BackupPolicy::default());
        apply_v1alpha1(&mut obj);
        assert_eq!(obj.api_version, v1::API_VERSION);
        assert_eq!(obj.spec.size, Some(3));
        assert_eq!(obj.spec.version.as_deref(), Some(versions::DEFAULT_ETCD_VERSION));
        assert_eq!(obj.spec.repository.as_deref(), Some("quay.io/coreos/etcd"));
        assert_eq!(obj.spec.backup.as_ref().unwrap().max_backups, Some(7));
        assert!(obj.spec.pod.is_none());
        let once = obj.clone();
        apply_v1alpha1(&mut obj);
        assert_eq!(obj, once);

        let mut set = v1::EtcdCluster::default();
        set.spec.size = Some(1);
        apply_v1alpha1(&mut set);
        assert_eq!(set.spec.size, Some(1));
    }

    #[test]
    fn effective_storage_fills_defaults() {
        let spec = v2::EtcdClusterSpec::default();
        let storage = effective_storage(&spec);
        assert_eq!(storage.medium, Some(StorageMedium::Disk));
        assert_eq!(storage.size, Some(Quantity("1Gi".into())));
    }
}
