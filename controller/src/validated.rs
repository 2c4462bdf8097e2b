//! The one validated view of an EtcdCluster: every effective value the controller acts on,
//! resolved once per reconcile from the object (defaults filled in, annotations read, TLS planes,
//! maintenance flags, image, pod template, restore request) so the planner, the builders of both
//! runtimes and the status read the same answers and nothing else reads the raw spec. Objects
//! reach the controller validated by the API server; this resolves and returns a typed error for
//! what it cannot. Pure.

use std::collections::BTreeMap;

use etcd_operator_api::defaults::EffectiveReplacement;
use etcd_operator_api::status::{EtcdClusterStatus, UpgradePhase};
use etcd_operator_api::v1alpha2::{
    BackupSpec, DEFAULT_REPLICAS, DEFAULT_REPOSITORY, DEFRAGMENT_ANNOTATION, EtcdCluster,
    MOVE_LEADER_ANNOTATION, PodTemplateSpec, RECOVER_QUORUM_ANNOTATION, REPLACE_MEMBER_ANNOTATION,
    ROTATE_CA_ANNOTATION, ROTATE_CERTIFICATES_ANNOTATION, RestoreSpec, StorageSpec,
};
use etcd_operator_api::versions::DEFAULT_ETCD_VERSION;

use crate::model::ClusterRef;
use crate::tls::member::TlsPlanes;

/// Annotation: `"true"` keeps member data (volumes, data directories) when the cluster is deleted.
pub const KEEP_DATA_ANNOTATION: &str = "etcd.operator.dev/keep-data-on-delete";

/// What cannot be resolved from an EtcdCluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The object lacks a namespace, name or uid (never true of a stored object).
    #[error("EtcdCluster without metadata.{0}")]
    MissingMetadata(&'static str),
    /// A stored defragmentation schedule does not parse (admission refuses new ones; one stored
    /// before the rule changed is ignored).
    #[error("spec.maintenance.defragmentation.schedule {schedule:?} does not parse: {detail}")]
    DefragmentationSchedule {
        /// The schedule as stored.
        schedule: String,
        /// The parser's complaint.
        detail: String,
    },
    /// The defragment annotation's value is not an RFC 3339 time (it is ignored).
    #[error("annotation {DEFRAGMENT_ANNOTATION}={value:?} is not an RFC 3339 time")]
    DefragmentRequest {
        /// The value as stored.
        value: String,
    },
}

/// A rolling version change as persisted in `status.upgrade`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RollRecord {
    /// The (lowest) version members ran when it started.
    pub from: String,
    /// The version it moves to.
    pub target: String,
    /// Where the pre-upgrade snapshot went (or why there is none).
    pub snapshot: Option<String>,
    /// Why it halted; a halted roll touches no further member until the spec changes.
    pub halted: Option<String>,
    /// The member that did not come up on the target (when halted).
    pub failed_member: Option<String>,
    /// Every member runs the target, healthy and caught up.
    pub complete: bool,
}

impl RollRecord {
    /// The roll remembered in a status (the inverse of what [`crate::status::compute`] writes).
    pub fn from_status(status: Option<&EtcdClusterStatus>) -> Option<Self> {
        let upgrade = status?.upgrade.as_ref()?;
        let halted = upgrade.phase == Some(UpgradePhase::Halted);
        Some(Self {
            from: upgrade.from_version.clone().unwrap_or_default(),
            target: upgrade.target_version.clone()?,
            snapshot: upgrade.snapshot.clone(),
            halted: halted.then(|| upgrade.message.clone().unwrap_or_else(|| "halted".into())),
            failed_member: if halted {
                upgrade.current_member.clone()
            } else {
                None
            },
            complete: upgrade.phase == Some(UpgradePhase::Complete),
        })
    }

    /// Whether this record drives the roll to `version`: started for it, neither halted nor done.
    pub fn is_active_for(&self, version: &str) -> bool {
        self.target == version && self.halted.is_none() && !self.complete
    }
}

/// A rolling restart onto a changed member template, as remembered in `status.rollout`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RolloutRecord {
    /// The template hash it moves the members to.
    pub target: String,
    /// The member re-created last (the one that did not come back, when halted).
    pub current_member: Option<String>,
    /// Why it halted; a halted rollout touches no further member until the template changes.
    pub halted: Option<String>,
    /// Every member runs the template and is healthy.
    pub complete: bool,
}

impl RolloutRecord {
    /// The rollout remembered in a status (the inverse of what [`crate::status::compute`]
    /// writes).
    pub fn from_status(status: Option<&EtcdClusterStatus>) -> Option<Self> {
        let rollout = status?.rollout.as_ref()?;
        let halted = rollout.phase == Some(UpgradePhase::Halted);
        Some(Self {
            target: rollout.template_hash.clone()?,
            current_member: rollout.current_member.clone(),
            halted: halted.then(|| rollout.message.clone().unwrap_or_else(|| "halted".into())),
            complete: rollout.phase == Some(UpgradePhase::Complete),
        })
    }

    /// Whether this record halted the rollout to `hash`.
    pub fn halted_for(&self, hash: &str) -> bool {
        self.target == hash && self.halted.is_some()
    }
}

/// The size trigger of defragmentation (`spec.maintenance.defragmentation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DefragPolicy {
    /// The share of a database file that must be free, in percent; `0` turns the trigger off.
    pub fragmentation_percent: u8,
    /// The least free space, in bytes, worth a defragmentation.
    pub min_reclaimable_bytes: u64,
}

impl DefragPolicy {
    /// Whether a member's database file is fragmented enough to defragment. A member that does
    /// not report how much of its file is in use is never.
    pub fn fragmented(&self, health: &crate::model::MemberHealth) -> bool {
        if self.fragmentation_percent == 0 || health.db_size == 0 || health.db_size_in_use == 0 {
            return false;
        }
        let free = health.db_size.saturating_sub(health.db_size_in_use);
        free >= self.min_reclaimable_bytes
            && u128::from(free) * 100 >= u128::from(health.db_size) * u128::from(self.fragmentation_percent)
    }
}

/// Labels, annotations and scheduling of every member Pod (`spec.podTemplate`, defaulted).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSettings {
    /// Labels added to every member Pod (the operator's own go on top).
    pub labels: BTreeMap<String, String>,
    /// Annotations added to every member Pod.
    pub annotations: BTreeMap<String, String>,
    /// Resources and scheduling.
    pub spec: PodTemplateSpec,
}

/// An EtcdCluster as the controller acts on it: every effective setting resolved.
#[derive(Debug, Clone)]
pub struct ValidatedCluster {
    /// Namespace, name and uid.
    pub cluster: ClusterRef,
    /// `metadata.generation` (status reports it as `observedGeneration`).
    pub generation: Option<i64>,
    /// When the object was created (the defragmentation schedule counts from it).
    pub created: Option<chrono::DateTime<chrono::Utc>>,
    /// The status as stored (what the controller wrote last, and other writers' fields).
    pub status: Option<EtcdClusterStatus>,
    /// Voting members wanted (`spec.replicas`, at least 1).
    pub replicas: usize,
    /// The etcd version members run (`spec.version`).
    pub version: String,
    /// The image repository of member Pods (`spec.repository`).
    pub repository: String,
    /// The bootstrap token: unique to this incarnation of a cluster with this name.
    pub cluster_token: String,
    /// Whether the cluster ever formed (`status.clusterID` is recorded): its data is never wiped.
    pub formed_before: bool,
    /// `spec.paused`.
    pub paused: bool,
    /// The latest rolling version change, as remembered in status (or, newer, by this process).
    pub roll: Option<RollRecord>,
    /// The latest rolling restart onto a changed member template, as remembered in status.
    pub rollout: Option<RolloutRecord>,
    /// The hash of the member template this spec renders to, as the runtime renders it
    /// ([`crate::runtime::Runtime::template_hash`]; filled in by the reconcile). `None`: the
    /// runtime does not roll templates.
    pub template_hash: Option<String>,
    /// `spec.bootstrap.restore` of a cluster that never formed: the snapshot to start from.
    pub restore_request: Option<RestoreSpec>,
    /// The restore asked for, resolved to a snapshot by the reconcile (it reads the EtcdBackup).
    pub restore: Option<crate::restore::RestorePlan>,
    /// `spec.storage` with its defaults (medium, size).
    pub storage: StorageSpec,
    /// The size of each member's persistent volume in bytes; `None` for members in memory (or
    /// a size that does not parse, which admission never lets through).
    pub volume_bytes: Option<u64>,
    /// The TLS planes and their providers (`spec.tls`).
    pub tls: TlsPlanes,
    /// `spec.podTemplate` with its defaults.
    pub pod: PodSettings,
    /// `spec.backup`: the schedule, retention and destination (the pre-upgrade snapshot goes there).
    pub backup: Option<BackupSpec>,
    /// The etcd flags `spec.maintenance` amounts to (auto compaction, backend quota).
    pub maintenance_flags: Vec<String>,
    /// The backend quota in bytes.
    pub quota_backend_bytes: u64,
    /// The size trigger of defragmentation.
    pub defragmentation: DefragPolicy,
    /// The defragmentation schedule, when there is one that parses.
    pub defrag_schedule: Option<croner::Cron>,
    /// The value of the [`ROTATE_CERTIFICATES_ANNOTATION`]: the on-demand rotation member
    /// certificates must have been issued under (`None`: none asked for).
    pub certificate_rotation: Option<String>,
    /// The value of the [`ROTATE_CA_ANNOTATION`]: the CA rotation the `auto` planes' CAs must
    /// have begun under (`None`: none asked for).
    pub ca_rotation: Option<String>,
    /// The value of the [`RECOVER_QUORUM_ANNOTATION`], when not answered yet (status.recovery
    /// records the last request done).
    pub recover_quorum: Option<String>,
    /// `spec.replacement` with its defaults.
    pub replacement: EffectiveReplacement,
    /// The value of the [`REPLACE_MEMBER_ANNOTATION`]: the member to replace now.
    pub replace_member: Option<String>,
    /// The time the [`DEFRAGMENT_ANNOTATION`] names: members not defragmented since are due.
    pub defragment_request: Option<chrono::DateTime<chrono::Utc>>,
    /// The [`MOVE_LEADER_ANNOTATION`] when not answered yet (`status.maintenance
    /// .lastLeaderTransfer` records the last request done).
    pub move_leader: Option<LeaderRequest>,
    /// The [`KEEP_DATA_ANNOTATION`]: member data is kept when the cluster is deleted.
    pub keep_data_on_delete: bool,
    /// What was ignored because it cannot be resolved (logged by the reconcile).
    pub ignored: Vec<ValidationError>,
}

/// A leadership move asked for with the [`MOVE_LEADER_ANNOTATION`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderRequest {
    /// The annotation's value (recorded once answered).
    pub request: String,
    /// The member to lead: the value up to an `@`.
    pub member: String,
}

impl LeaderRequest {
    /// The request a value makes, unless `answered` (the value recorded last) is the same.
    pub fn of(value: &str, answered: Option<&str>) -> Option<Self> {
        let member = value.split('@').next().unwrap_or_default().trim();
        if member.is_empty() || answered == Some(value) {
            return None;
        }
        Some(Self {
            request: value.to_owned(),
            member: member.to_owned(),
        })
    }
}

/// The bytes a persistent member volume of `storage` holds.
fn volume_bytes(storage: &StorageSpec) -> Option<u64> {
    if matches!(
        storage.medium,
        Some(etcd_operator_api::v1alpha2::StorageMedium::Memory)
    ) {
        return None;
    }
    etcd_operator_api::quantity::bytes(&storage.size.as_ref()?.0)
}

impl ValidatedCluster {
    /// The view of `obj`; an error when it lacks the metadata every stored object has.
    pub fn new(obj: &EtcdCluster) -> Result<Self, ValidationError> {
        let meta = &obj.metadata;
        let cluster = ClusterRef {
            namespace: meta
                .namespace
                .clone()
                .ok_or(ValidationError::MissingMetadata("namespace"))?,
            name: meta
                .name
                .clone()
                .ok_or(ValidationError::MissingMetadata("name"))?,
            uid: meta.uid.clone().ok_or(ValidationError::MissingMetadata("uid"))?,
        };
        let spec = &obj.spec;
        let annotation = |key: &str| {
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let status = obj.status.clone();
        let formed_before = status.as_ref().is_some_and(|s| s.cluster_id.is_some());
        let maintenance = etcd_operator_api::defaults::effective_maintenance(spec);
        let defrag = etcd_operator_api::defaults::effective_defragmentation(spec);
        let mut ignored = Vec::new();
        let defrag_schedule = defrag.schedule.as_ref().and_then(|text| {
            crate::backup_policy::parse_schedule(text)
                .map_err(|e| {
                    ignored.push(ValidationError::DefragmentationSchedule {
                        schedule: text.clone(),
                        detail: e.to_string(),
                    });
                })
                .ok()
        });
        let defragment_request = annotation(DEFRAGMENT_ANNOTATION).and_then(|value| {
            // To the second, as defragmentations are recorded: one done in the same second as
            // the request counts for it.
            chrono::DateTime::parse_from_rfc3339(&value)
                .map(|t| {
                    chrono::DateTime::from_timestamp(t.timestamp(), 0)
                        .unwrap_or_else(|| t.with_timezone(&chrono::Utc))
                })
                .map_err(|_| ignored.push(ValidationError::DefragmentRequest { value }))
                .ok()
        });
        let answered_leader_request = status
            .as_ref()
            .and_then(|s| s.maintenance.as_ref())
            .and_then(|m| m.last_leader_transfer.as_ref())
            .map(|t| t.request.as_str());
        let move_leader = annotation(MOVE_LEADER_ANNOTATION)
            .and_then(|value| LeaderRequest::of(&value, answered_leader_request));
        let template = spec.pod_template.clone().unwrap_or_default();
        let template_meta = template.metadata.unwrap_or_default();
        Ok(Self {
            generation: meta.generation,
            created: meta
                .creation_timestamp
                .as_ref()
                .and_then(crate::backup_policy::from_time),
            replicas: usize::try_from(spec.replicas.unwrap_or(DEFAULT_REPLICAS))
                .unwrap_or(1)
                .max(1),
            version: spec
                .version
                .clone()
                .unwrap_or_else(|| DEFAULT_ETCD_VERSION.to_string()),
            repository: spec
                .repository
                .clone()
                .unwrap_or_else(|| DEFAULT_REPOSITORY.to_owned()),
            cluster_token: format!("{}-{}-{}", cluster.namespace, cluster.name, cluster.uid),
            formed_before,
            paused: spec.paused.unwrap_or(false),
            roll: RollRecord::from_status(status.as_ref()),
            rollout: RolloutRecord::from_status(status.as_ref()),
            template_hash: None,
            restore_request: spec
                .bootstrap
                .as_ref()
                .and_then(|b| b.restore.clone())
                .filter(|_| !formed_before),
            restore: None,
            storage: etcd_operator_api::defaults::effective_storage(spec),
            volume_bytes: volume_bytes(&etcd_operator_api::defaults::effective_storage(spec)),
            tls: TlsPlanes::of(spec.tls.as_deref()),
            pod: PodSettings {
                labels: template_meta.labels.unwrap_or_default(),
                annotations: template_meta.annotations.unwrap_or_default(),
                spec: template.spec.unwrap_or_default(),
            },
            backup: spec.backup.as_deref().cloned(),
            maintenance_flags: maintenance.flags(),
            quota_backend_bytes: maintenance.quota_backend_bytes,
            defragmentation: DefragPolicy {
                fragmentation_percent: defrag.fragmentation_percent,
                min_reclaimable_bytes: defrag.min_reclaimable_bytes,
            },
            defrag_schedule,
            certificate_rotation: annotation(ROTATE_CERTIFICATES_ANNOTATION),
            ca_rotation: annotation(ROTATE_CA_ANNOTATION),
            // Each request is answered once: status.recovery records the last one done.
            recover_quorum: annotation(RECOVER_QUORUM_ANNOTATION).filter(|request| {
                status
                    .as_ref()
                    .and_then(|s| s.recovery.as_ref())
                    .is_none_or(|done| &done.request != request)
            }),
            replacement: etcd_operator_api::defaults::effective_replacement(spec),
            replace_member: annotation(REPLACE_MEMBER_ANNOTATION),
            defragment_request,
            move_leader,
            keep_data_on_delete: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(KEEP_DATA_ANNOTATION))
                .is_some_and(|v| v == "true"),
            ignored,
            status,
            cluster,
        })
    }

    /// The view of an object built in code that may lack metadata (tests): a missing namespace
    /// is `default`, a missing name `test`, a missing uid `uid`. The controller uses [`Self::new`].
    #[doc(hidden)]
    pub fn for_test(mut obj: EtcdCluster) -> Self {
        let meta = &mut obj.metadata;
        meta.namespace.get_or_insert_with(|| "default".to_owned());
        meta.name.get_or_insert_with(|| "test".to_owned());
        meta.uid.get_or_insert_with(|| "uid".to_owned());
        match Self::new(&obj) {
            Ok(view) => view,
            Err(error) => unreachable!("metadata was filled in: {error}"),
        }
    }

    /// The image of a member on `version`.
    pub fn image(&self, version: &str) -> String {
        format!("{}:v{version}", self.repository)
    }

    /// Where backups go, when `spec.backup` names a destination.
    pub fn backup_destination(&self) -> Option<&etcd_operator_api::v1alpha2::BackupDestination> {
        self.backup.as_ref().map(|b| &b.destination)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_api::v1alpha2::StorageMedium;

    #[test]
    fn what_the_user_left_out_is_defaulted_once() {
        let view = ValidatedCluster::for_test(EtcdCluster::default());
        assert_eq!(view.replicas, usize::try_from(DEFAULT_REPLICAS).unwrap());
        assert_eq!(view.version, DEFAULT_ETCD_VERSION);
        assert!(!view.paused);
        assert_eq!(view.storage.medium, Some(StorageMedium::Disk));

        let mut c = EtcdCluster::default();
        c.spec.replicas = Some(5);
        c.spec.version = Some("3.4.23".into());
        c.spec.paused = Some(true);
        let view = ValidatedCluster::for_test(c);
        assert_eq!(
            (view.replicas, view.version.as_str(), view.paused),
            (5, "3.4.23", true)
        );
        // Never below one member, whatever reaches the controller.
        let mut zero = EtcdCluster::default();
        zero.spec.replicas = Some(0);
        assert_eq!(ValidatedCluster::for_test(zero).replicas, 1);
    }

    #[test]
    fn the_rotation_annotation_is_read_and_an_empty_one_asks_for_nothing() {
        assert_eq!(
            ValidatedCluster::for_test(EtcdCluster::default()).certificate_rotation,
            None
        );
        let mut c = EtcdCluster::default();
        c.metadata.annotations =
            Some([(ROTATE_CERTIFICATES_ANNOTATION.to_owned(), "2026-11-25".to_owned())].into());
        assert_eq!(
            ValidatedCluster::for_test(c.clone())
                .certificate_rotation
                .as_deref(),
            Some("2026-11-25")
        );
        c.metadata.annotations = Some([(ROTATE_CERTIFICATES_ANNOTATION.to_owned(), String::new())].into());
        assert_eq!(ValidatedCluster::for_test(c).certificate_rotation, None);
    }

    #[test]
    fn the_defragment_annotation_is_a_time_and_anything_else_is_ignored_with_a_reason() {
        let mut c = EtcdCluster::default();
        c.metadata.annotations = Some(
            [(
                DEFRAGMENT_ANNOTATION.to_owned(),
                "2026-11-27T01:00:00+01:00".to_owned(),
            )]
            .into(),
        );
        let view = ValidatedCluster::for_test(c.clone());
        assert_eq!(
            view.defragment_request.map(|t| t.to_rfc3339()),
            Some("2026-11-27T00:00:00+00:00".to_owned())
        );
        assert!(view.ignored.is_empty());
        // Fractions of a second are dropped (defragmentations are recorded to the second).
        c.metadata.annotations = Some(
            [(
                DEFRAGMENT_ANNOTATION.to_owned(),
                "2026-11-27T00:00:00.9Z".to_owned(),
            )]
            .into(),
        );
        assert_eq!(
            ValidatedCluster::for_test(c.clone())
                .defragment_request
                .map(|t| t.to_rfc3339()),
            Some("2026-11-27T00:00:00+00:00".to_owned())
        );
        c.metadata.annotations = Some([(DEFRAGMENT_ANNOTATION.to_owned(), "now".to_owned())].into());
        let view = ValidatedCluster::for_test(c);
        assert_eq!(view.defragment_request, None);
        assert_eq!(
            view.ignored,
            vec![ValidationError::DefragmentRequest { value: "now".into() }]
        );
    }

    #[test]
    fn the_move_leader_annotation_names_a_member_and_is_answered_once() {
        let mut c = EtcdCluster::default();
        c.metadata.annotations = Some(
            [(
                MOVE_LEADER_ANNOTATION.to_owned(),
                " c-abcde@1764200000 ".to_owned(),
            )]
            .into(),
        );
        let asked = ValidatedCluster::for_test(c.clone()).move_leader;
        assert_eq!(
            asked,
            Some(LeaderRequest {
                request: "c-abcde@1764200000".into(),
                member: "c-abcde".into()
            })
        );
        // Recorded as answered: nothing more; another value asks again.
        c.status = Some(EtcdClusterStatus {
            maintenance: Some(Box::new(etcd_operator_api::status::MaintenanceStatus {
                last_leader_transfer: Some(etcd_operator_api::status::LeaderTransferStatus {
                    request: "c-abcde@1764200000".into(),
                    leader: "c-abcde".into(),
                    time: None,
                }),
                ..Default::default()
            })),
            ..Default::default()
        });
        assert_eq!(ValidatedCluster::for_test(c.clone()).move_leader, None);
        c.metadata.annotations = Some([(MOVE_LEADER_ANNOTATION.to_owned(), "c-abcde".to_owned())].into());
        assert_eq!(
            ValidatedCluster::for_test(c.clone())
                .move_leader
                .map(|r| r.member),
            Some("c-abcde".to_owned())
        );
        c.metadata.annotations = Some([(MOVE_LEADER_ANNOTATION.to_owned(), "@1".to_owned())].into());
        assert_eq!(ValidatedCluster::for_test(c).move_leader, None);
    }

    #[test]
    fn the_replacement_policy_and_the_replace_member_annotation_are_read() {
        let view = ValidatedCluster::for_test(EtcdCluster::default());
        assert!(!view.replacement.manual);
        assert_eq!(view.replace_member, None);
        let mut c = EtcdCluster::default();
        c.spec.replacement = Some(Box::new(etcd_operator_api::v1alpha2::ReplacementSpec {
            policy: Some(etcd_operator_api::v1alpha2::ReplacementPolicy::Manual),
            unhealthy_after: Some("30s".into()),
            crash_loop_after: None,
        }));
        c.metadata.annotations =
            Some([(REPLACE_MEMBER_ANNOTATION.to_owned(), " c-abcde ".to_owned())].into());
        let view = ValidatedCluster::for_test(c);
        assert!(view.replacement.manual);
        assert_eq!(view.replacement.unhealthy_after.as_secs(), 30);
        assert_eq!(view.replacement.crash_loop_after.as_secs(), 300);
        assert_eq!(view.replace_member.as_deref(), Some("c-abcde"));
    }

    #[test]
    fn what_cannot_be_resolved_is_a_typed_error() {
        let mut obj = EtcdCluster::new("c", "ns", Default::default());
        assert_eq!(
            ValidatedCluster::new(&obj).err(),
            Some(ValidationError::MissingMetadata("uid"))
        );
        obj.metadata.uid = Some("u".into());
        let view = ValidatedCluster::new(&obj).unwrap();
        assert_eq!(view.cluster_token, "ns-c-u");
        assert!(view.ignored.is_empty());
        // A stored schedule that no longer parses is ignored, and said to be.
        obj.spec.maintenance = Some(Box::new(etcd_operator_api::v1alpha2::MaintenanceSpec {
            defragmentation: Some(etcd_operator_api::v1alpha2::DefragmentationSpec {
                schedule: Some("every tuesday".into()),
                ..Default::default()
            }),
            ..Default::default()
        }));
        let view = ValidatedCluster::new(&obj).unwrap();
        assert!(view.defrag_schedule.is_none());
        assert!(matches!(
            view.ignored.as_slice(),
            [ValidationError::DefragmentationSchedule { schedule, .. }] if schedule == "every tuesday"
        ));
    }

    #[test]
    fn everything_the_builders_read_is_resolved_once() {
        let mut obj = EtcdCluster::new("c", "ns", Default::default());
        obj.metadata.uid = Some("u".into());
        let view = ValidatedCluster::new(&obj).unwrap();
        assert_eq!(view.image("3.5.16"), format!("{DEFAULT_REPOSITORY}:v3.5.16"));
        assert_eq!(view.tls, TlsPlanes::default());
        assert!(view.backup_destination().is_none());
        assert!(!view.keep_data_on_delete);
        assert!(view.restore_request.is_none());
        assert_eq!(
            view.maintenance_flags,
            etcd_operator_api::defaults::effective_maintenance(&obj.spec).flags()
        );
        obj.spec.repository = Some("registry.example/etcd".into());
        obj.spec.bootstrap = Some(Box::new(etcd_operator_api::v1alpha2::BootstrapSpec {
            restore: Some(Default::default()),
        }));
        obj.metadata.annotations = Some([(KEEP_DATA_ANNOTATION.to_owned(), "true".to_owned())].into());
        let view = ValidatedCluster::new(&obj).unwrap();
        assert_eq!(view.image("3.6.15"), "registry.example/etcd:v3.6.15");
        assert!(view.keep_data_on_delete);
        assert!(view.restore_request.is_some());
        // A cluster that formed is never restored again.
        obj.status = Some(EtcdClusterStatus {
            cluster_id: Some("abc".into()),
            ..Default::default()
        });
        assert!(ValidatedCluster::new(&obj).unwrap().restore_request.is_none());
    }
}
