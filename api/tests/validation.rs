//! Table-driven validation tests: every rule has accepted and rejected inputs; each rejection
//! names the exact field paths and reasons expected (and nothing else).

// Test helpers outside `#[test]` functions unwrap too: a failed unwrap is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use ErrorType::{Duplicate, Forbidden, Invalid, NotSupported, Required, TooLong};
use etcd_operator_api::VersionedCluster;
use etcd_operator_api::convert::V1ALPHA2_FIELDS_ANNOTATION;
use etcd_operator_api::v1alpha1 as v1;
use etcd_operator_api::v1alpha2::{self as v2, StorageMedium};
use etcd_operator_api::validation::{ErrorType, Outcome, validate, validate_update, validate_versioned};
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

type Mutation = fn(&mut v2::EtcdCluster);
type Expected = Vec<(&'static str, ErrorType)>;
type Case = (&'static str, Mutation, Expected);
type UpdateCase = (&'static str, Mutation, Mutation, Expected);
type WarningCase = (&'static str, Mutation, Vec<&'static str>);

fn q(s: &str) -> Quantity {
    Quantity(s.to_owned())
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A valid cluster with every part of the spec set, so that every rule has something to check.
fn base() -> v2::EtcdCluster {
    let mut obj = v2::EtcdCluster::new(
        "example",
        "default",
        v2::EtcdClusterSpec {
            replicas: Some(3),
            version: Some("3.5.21".into()),
            repository: Some("gcr.io/etcd-development/etcd".into()),
            pod_template: Some(Box::new(v2::PodTemplate {
                metadata: Some(v2::PodTemplateMetadata {
                    labels: Some(map(&[("team", "storage")])),
                    annotations: Some(map(&[("example.com/owner", "sre")])),
                }),
                spec: Some(v2::PodTemplateSpec {
                    resources: Some(ResourceRequirements {
                        requests: Some(BTreeMap::from([
                            ("cpu".into(), q("100m")),
                            ("memory".into(), q("256Mi")),
                        ])),
                        limits: Some(BTreeMap::from([
                            ("cpu".into(), q("1")),
                            ("memory".into(), q("1Gi")),
                        ])),
                        claims: None,
                    }),
                    affinity: None,
                    node_selector: Some(map(&[("kubernetes.io/os", "linux")])),
                    tolerations: Some(vec![Toleration {
                        key: Some("dedicated".into()),
                        operator: Some("Equal".into()),
                        value: Some("etcd".into()),
                        effect: Some("NoSchedule".into()),
                        toleration_seconds: None,
                    }]),
                    topology_spread_constraints: Some(vec![TopologySpreadConstraint {
                        max_skew: 1,
                        topology_key: "topology.kubernetes.io/zone".into(),
                        when_unsatisfiable: "ScheduleAnyway".into(),
                        ..TopologySpreadConstraint::default()
                    }]),
                    priority_class_name: Some("etcd-critical".into()),
                }),
            })),
            storage: Some(v2::StorageSpec {
                medium: Some(StorageMedium::Disk),
                size: Some(q("8Gi")),
                storage_class_name: Some("fast-ssd".into()),
            }),
            tls: Some(Box::new(v2::TlsSpec {
                client: Some(v2::TlsPlane {
                    secret_ref: Some(v2::SecretReference {
                        name: "etcd-client-tls".into(),
                    }),
                    ..v2::TlsPlane::default()
                }),
                peer: Some(v2::TlsPlane {
                    auto: Some(v2::AutoTls {}),
                    ..v2::TlsPlane::default()
                }),
            })),
            backup: Some(Box::new(v2::BackupSpec {
                schedule: "0 */6 * * *".into(),
                retention: Some(v2::BackupRetention {
                    max_count: Some(7),
                    max_age: Some("72h".into()),
                }),
                destination: v2::BackupDestination {
                    s3: Some(v2::S3Destination {
                        bucket: "etcd-backups".into(),
                        prefix: Some("prod/etcd".into()),
                        endpoint: Some("https://minio.example:9000".into()),
                        region: Some("eu-west-1".into()),
                        credentials_secret: Some("s3-credentials".into()),
                        force_path_style: Some(true),
                    }),
                    volume: None,
                },
            })),
            bootstrap: None,
            maintenance: Some(Box::new(v2::MaintenanceSpec {
                auto_compaction: Some(v2::AutoCompactionSpec {
                    mode: Some(v2::AutoCompactionMode::Periodic),
                    retention: Some("1h30m".into()),
                }),
                quota_backend_bytes: Some(q("2Gi")),
                defragmentation: Some(v2::DefragmentationSpec {
                    schedule: Some("0 3 * * 0".into()),
                    fragmentation_percent: Some(40),
                    min_reclaimable_bytes: Some(q("128Mi")),
                }),
            })),
            replacement: Some(Box::new(v2::ReplacementSpec {
                policy: Some(v2::ReplacementPolicy::Automatic),
                unhealthy_after: Some("10m".into()),
                crash_loop_after: Some("5m".into()),
            })),
            paused: None,
        },
    );
    obj.metadata.labels = Some(map(&[("app.kubernetes.io/name", "etcd")]));
    obj
}

fn with_restore(obj: &mut v2::EtcdCluster, restore: v2::RestoreSpec) {
    obj.spec.bootstrap = Some(Box::new(v2::BootstrapSpec {
        restore: Some(restore),
    }));
}

fn s3_dest() -> v2::BackupDestination {
    v2::BackupDestination {
        s3: Some(v2::S3Destination {
            bucket: "etcd-backups".into(),
            ..v2::S3Destination::default()
        }),
        volume: None,
    }
}

fn pod_spec(obj: &mut v2::EtcdCluster) -> &mut v2::PodTemplateSpec {
    obj.spec.pod_template.as_mut().unwrap().spec.as_mut().unwrap()
}

fn toleration(obj: &mut v2::EtcdCluster) -> &mut Toleration {
    &mut pod_spec(obj).tolerations.as_mut().unwrap()[0]
}

fn spread(obj: &mut v2::EtcdCluster) -> &mut TopologySpreadConstraint {
    &mut pod_spec(obj).topology_spread_constraints.as_mut().unwrap()[0]
}

fn storage(obj: &mut v2::EtcdCluster) -> &mut v2::StorageSpec {
    obj.spec.storage.as_mut().unwrap()
}

fn maintenance(obj: &mut v2::EtcdCluster) -> &mut v2::MaintenanceSpec {
    obj.spec.maintenance.as_mut().unwrap()
}

fn replacement(obj: &mut v2::EtcdCluster) -> &mut v2::ReplacementSpec {
    obj.spec.replacement.as_mut().unwrap()
}

fn compaction(obj: &mut v2::EtcdCluster) -> &mut v2::AutoCompactionSpec {
    maintenance(obj).auto_compaction.as_mut().unwrap()
}

fn defrag(obj: &mut v2::EtcdCluster) -> &mut v2::DefragmentationSpec {
    maintenance(obj).defragmentation.as_mut().unwrap()
}

fn tls(obj: &mut v2::EtcdCluster) -> &mut v2::TlsSpec {
    obj.spec.tls.as_mut().unwrap()
}

fn backup(obj: &mut v2::EtcdCluster) -> &mut v2::BackupSpec {
    obj.spec.backup.as_mut().unwrap()
}

fn s3(obj: &mut v2::EtcdCluster) -> &mut v2::S3Destination {
    backup(obj).destination.s3.as_mut().unwrap()
}

fn found(outcome: &Outcome) -> Vec<(String, ErrorType)> {
    let mut out: Vec<_> = outcome.errors.iter().map(|e| (e.field.clone(), e.kind)).collect();
    out.sort();
    out
}

fn expected(want: &[(&str, ErrorType)]) -> Vec<(String, ErrorType)> {
    let mut out: Vec<_> = want.iter().map(|(f, k)| ((*f).to_owned(), *k)).collect();
    out.sort();
    out
}

#[test]
fn base_is_valid() {
    let outcome = validate(&base());
    assert_eq!(outcome.errors, vec![], "{:?}", outcome.errors);
    assert_eq!(outcome.warnings, vec![]);
}

const TOL: &str = "spec.podTemplate.spec.tolerations[0]";
const TSC: &str = "spec.podTemplate.spec.topologySpreadConstraints";
const S3: &str = "spec.backup.destination.s3";
const RESTORE: &str = "spec.bootstrap.restore";

#[rustfmt::skip]
fn invalid_cases() -> Vec<Case> {
    vec![
        ("name missing", |o| o.metadata.name = None, vec![("metadata.name", Required)]),
        ("name too long for children", |o| o.metadata.name = Some("a".repeat(53)), vec![("metadata.name", Invalid)]),
        ("name uppercase", |o| o.metadata.name = Some("Example".into()), vec![("metadata.name", Invalid)]),
        ("name starts with digit", |o| o.metadata.name = Some("1example".into()), vec![("metadata.name", Invalid)]),
        ("name with dot", |o| o.metadata.name = Some("a.b".into()), vec![("metadata.name", Invalid)]),
        ("namespace invalid", |o| o.metadata.namespace = Some("Bad_NS".into()), vec![("metadata.namespace", Invalid)]),
        ("label key invalid", |o| o.metadata.labels = Some(map(&[("-bad", "x")])), vec![("metadata.labels", Invalid)]),
        ("label value invalid", |o| o.metadata.labels = Some(map(&[("app", "a b")])), vec![("metadata.labels", Invalid)]),
        ("label key prefix over 253", |o| o.metadata.labels = Some(BTreeMap::from([(format!("{}/a", "p".repeat(254)), "x".to_owned())])), vec![("metadata.labels", Invalid)]),
        ("label key prefix not a subdomain", |o| o.metadata.labels = Some(map(&[("Example.com/a", "x")])), vec![("metadata.labels", Invalid)]),
        ("label key prefix empty", |o| o.metadata.labels = Some(map(&[("/a", "x")])), vec![("metadata.labels", Invalid)]),
        ("label key name over 63", |o| o.metadata.labels = Some(BTreeMap::from([("n".repeat(64), "x".to_owned())])), vec![("metadata.labels", Invalid)]),
        ("label key name empty", |o| o.metadata.labels = Some(map(&[("example.com/", "x")])), vec![("metadata.labels", Invalid)]),
        ("label key two slashes", |o| o.metadata.labels = Some(map(&[("a/b/c", "x")])), vec![("metadata.labels", Invalid)]),
        ("label value over 63", |o| o.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "v".repeat(64))])), vec![("metadata.labels", Invalid)]),
        ("label value ends with dash", |o| o.metadata.labels = Some(map(&[("app", "v-")])), vec![("metadata.labels", Invalid)]),
        ("annotation key invalid", |o| o.metadata.annotations = Some(map(&[("a/b/c", "x")])), vec![("metadata.annotations", Invalid)]),
        ("annotation key name over 63", |o| o.metadata.annotations = Some(BTreeMap::from([("n".repeat(64), "x".to_owned())])), vec![("metadata.annotations", Invalid)]),
        ("annotation key empty", |o| o.metadata.annotations = Some(map(&[("", "x")])), vec![("metadata.annotations", Invalid)]),
        ("annotations too large", |o| o.metadata.annotations = Some(BTreeMap::from([("big".to_owned(), "x".repeat(300 * 1024))])), vec![("metadata.annotations", TooLong)]),
        ("annotations one byte too large", |o| o.metadata.annotations = Some(BTreeMap::from([("a".to_owned(), "x".repeat(128 * 1024)), ("b".to_owned(), "x".repeat(128 * 1024 - 1))])), vec![("metadata.annotations", TooLong)]),
        ("replicas 0", |o| o.spec.replicas = Some(0), vec![("spec.replicas", Invalid)]),
        ("replicas 10", |o| o.spec.replicas = Some(10), vec![("spec.replicas", Invalid)]),
        ("replicas negative", |o| o.spec.replicas = Some(-1), vec![("spec.replicas", Invalid)]),
        ("replicas 0 in memory", |o| { o.spec.replicas = Some(0); storage(o).medium = Some(StorageMedium::Memory); storage(o).storage_class_name = None; }, vec![("spec.replicas", Invalid)]),
        ("version not semver", |o| o.spec.version = Some("3.5".into()), vec![("spec.version", Invalid)]),
        ("version leading v", |o| o.spec.version = Some("v3.5.1".into()), vec![("spec.version", Invalid)]),
        ("version major 2", |o| o.spec.version = Some("2.3.8".into()), vec![("spec.version", Invalid)]),
        ("version minor 3", |o| o.spec.version = Some("3.3.27".into()), vec![("spec.version", Invalid)]),
        ("version minor 7", |o| o.spec.version = Some("3.7.0".into()), vec![("spec.version", Invalid)]),
        ("version pre-release", |o| o.spec.version = Some("3.6.0-rc.1".into()), vec![("spec.version", Invalid)]),
        ("version build metadata", |o| o.spec.version = Some("3.5.1+abc".into()), vec![("spec.version", Invalid)]),
        ("repository with tag", |o| o.spec.repository = Some("quay.io/coreos/etcd:v3.5.1".into()), vec![("spec.repository", Invalid)]),
        ("repository uppercase", |o| o.spec.repository = Some("quay.io/CoreOS/etcd".into()), vec![("spec.repository", Invalid)]),
        ("pod label reserved", |o| o.spec.pod_template.as_mut().unwrap().metadata = Some(v2::PodTemplateMetadata { labels: Some(map(&[("etcd.operator.dev/cluster", "x")])), annotations: None }), vec![("spec.podTemplate.metadata.labels[etcd.operator.dev/cluster]", Forbidden)]),
        ("pod label key invalid", |o| o.spec.pod_template.as_mut().unwrap().metadata = Some(v2::PodTemplateMetadata { labels: Some(map(&[("a b", "x")])), annotations: None }), vec![("spec.podTemplate.metadata.labels", Invalid)]),
        ("pod annotation key invalid", |o| o.spec.pod_template.as_mut().unwrap().metadata = Some(v2::PodTemplateMetadata { labels: None, annotations: Some(map(&[("", "x")])) }), vec![("spec.podTemplate.metadata.annotations", Invalid)]),
        ("resource quantity malformed", |o| { pod_spec(o).resources.as_mut().unwrap().requests.as_mut().unwrap().insert("memory".into(), q("1GB")); }, vec![("spec.podTemplate.spec.resources.requests[memory]", Invalid)]),
        ("request above limit", |o| { pod_spec(o).resources.as_mut().unwrap().requests.as_mut().unwrap().insert("cpu".into(), q("2")); }, vec![("spec.podTemplate.spec.resources.requests[cpu]", Invalid)]),
        ("negative limit", |o| { pod_spec(o).resources.as_mut().unwrap().limits.as_mut().unwrap().insert("cpu".into(), q("-1")); }, vec![("spec.podTemplate.spec.resources.limits[cpu]", Invalid)]),
        ("node selector value invalid", |o| pod_spec(o).node_selector = Some(map(&[("disk", "fast ssd")])), vec![("spec.podTemplate.spec.nodeSelector", Invalid)]),
        ("toleration key invalid", |o| toleration(o).key = Some("bad key".into()), vec![("spec.podTemplate.spec.tolerations[0].key", Invalid)]),
        ("toleration operator unknown", |o| toleration(o).operator = Some("In".into()), vec![("spec.podTemplate.spec.tolerations[0].operator", NotSupported)]),
        ("toleration empty key needs Exists", |o| toleration(o).key = None, vec![("spec.podTemplate.spec.tolerations[0].operator", Invalid)]),
        ("toleration Exists with value", |o| toleration(o).operator = Some("Exists".into()), vec![("spec.podTemplate.spec.tolerations[0].operator", Invalid)]),
        ("toleration effect unknown", |o| toleration(o).effect = Some("Sometimes".into()), vec![("spec.podTemplate.spec.tolerations[0].effect", NotSupported)]),
        ("toleration seconds without NoExecute", |o| toleration(o).toleration_seconds = Some(30), vec![("spec.podTemplate.spec.tolerations[0].effect", Invalid)]),
        ("spread maxSkew 0", |o| spread(o).max_skew = 0, vec![("spec.podTemplate.spec.topologySpreadConstraints[0].maxSkew", Invalid)]),
        ("spread topologyKey empty", |o| spread(o).topology_key = String::new(), vec![("spec.podTemplate.spec.topologySpreadConstraints[0].topologyKey", Required)]),
        ("spread whenUnsatisfiable unknown", |o| spread(o).when_unsatisfiable = "Maybe".into(), vec![("spec.podTemplate.spec.topologySpreadConstraints[0].whenUnsatisfiable", NotSupported)]),
        ("spread duplicate", |o| { let c = spread(o).clone(); pod_spec(o).topology_spread_constraints.as_mut().unwrap().push(c); }, vec![("spec.podTemplate.spec.topologySpreadConstraints[1].{topologyKey, whenUnsatisfiable}", Duplicate)]),
        ("priority class invalid", |o| pod_spec(o).priority_class_name = Some("High_Priority".into()), vec![("spec.podTemplate.spec.priorityClassName", Invalid)]),
        ("storage medium unknown", |o| storage(o).medium = Some(StorageMedium::Unknown("SSD".into())), vec![("spec.storage.medium", NotSupported)]),
        ("storage size malformed", |o| storage(o).size = Some(q("lots")), vec![("spec.storage.size", Invalid)]),
        ("storage size zero", |o| storage(o).size = Some(q("0")), vec![("spec.storage.size", Invalid)]),
        ("quota malformed", |o| maintenance(o).quota_backend_bytes = Some(q("plenty")), vec![("spec.maintenance.quotaBackendBytes", Invalid)]),
        ("quota too small", |o| maintenance(o).quota_backend_bytes = Some(q("1Mi")), vec![("spec.maintenance.quotaBackendBytes", Invalid)]),
        ("quota too large", |o| maintenance(o).quota_backend_bytes = Some(q("9Gi")), vec![("spec.maintenance.quotaBackendBytes", Invalid)]),
        ("defrag schedule not cron", |o| defrag(o).schedule = Some("weekly".into()), vec![("spec.maintenance.defragmentation.schedule", Invalid)]),
        ("defrag schedule empty", |o| defrag(o).schedule = Some(" ".into()), vec![("spec.maintenance.defragmentation.schedule", Required)]),
        ("defrag percent too high", |o| defrag(o).fragmentation_percent = Some(100), vec![("spec.maintenance.defragmentation.fragmentationPercent", Invalid)]),
        ("defrag percent negative", |o| defrag(o).fragmentation_percent = Some(-1), vec![("spec.maintenance.defragmentation.fragmentationPercent", Invalid)]),
        ("defrag min malformed", |o| defrag(o).min_reclaimable_bytes = Some(q("some")), vec![("spec.maintenance.defragmentation.minReclaimableBytes", Invalid)]),
        ("defrag min too large", |o| defrag(o).min_reclaimable_bytes = Some(q("9Gi")), vec![("spec.maintenance.defragmentation.minReclaimableBytes", Invalid)]),
        ("replacement policy unknown", |o| replacement(o).policy = Some(v2::ReplacementPolicy::Unknown("Never".into())), vec![("spec.replacement.policy", NotSupported)]),
        ("unhealthyAfter not a duration", |o| replacement(o).unhealthy_after = Some("ten minutes".into()), vec![("spec.replacement.unhealthyAfter", Invalid)]),
        ("unhealthyAfter too short", |o| replacement(o).unhealthy_after = Some("5s".into()), vec![("spec.replacement.unhealthyAfter", Invalid)]),
        ("crashLoopAfter unit unknown", |o| replacement(o).crash_loop_after = Some("1d".into()), vec![("spec.replacement.crashLoopAfter", Invalid)]),
        ("crashLoopAfter too long", |o| replacement(o).crash_loop_after = Some("169h".into()), vec![("spec.replacement.crashLoopAfter", Invalid)]),
        ("both replacement durations empty", |o| { replacement(o).unhealthy_after = Some(String::new()); replacement(o).crash_loop_after = Some(String::new()); }, vec![("spec.replacement.unhealthyAfter", Invalid), ("spec.replacement.crashLoopAfter", Invalid)]),
        ("compaction mode unknown", |o| compaction(o).mode = Some(v2::AutoCompactionMode::Unknown("Daily".into())), vec![("spec.maintenance.autoCompaction.mode", NotSupported)]),
        ("periodic retention not a duration", |o| compaction(o).retention = Some("1 hour".into()), vec![("spec.maintenance.autoCompaction.retention", Invalid)]),
        ("periodic retention unit unknown", |o| compaction(o).retention = Some("2d".into()), vec![("spec.maintenance.autoCompaction.retention", Invalid)]),
        ("revision retention not a number", |o| { compaction(o).mode = Some(v2::AutoCompactionMode::Revision); compaction(o).retention = Some("1h".into()); }, vec![("spec.maintenance.autoCompaction.retention", Invalid)]),
        ("storage class with memory", |o| storage(o).medium = Some(StorageMedium::Memory), vec![("spec.storage.storageClassName", Forbidden)]),
        ("storage class invalid", |o| storage(o).storage_class_name = Some("Fast_SSD".into()), vec![("spec.storage.storageClassName", Invalid)]),
        ("tls plane empty", |o| tls(o).client = Some(v2::TlsPlane::default()), vec![("spec.tls.client", Required)]),
        ("tls plane two sources", |o| tls(o).peer.as_mut().unwrap().secret_ref = Some(v2::SecretReference { name: "peer".into() }), vec![("spec.tls.peer", Forbidden)]),
        ("tls secret name empty", |o| tls(o).client.as_mut().unwrap().secret_ref = Some(v2::SecretReference::default()), vec![("spec.tls.client.secretRef.name", Required)]),
        ("tls secret name invalid", |o| tls(o).client.as_mut().unwrap().secret_ref = Some(v2::SecretReference { name: "Bad_Secret".into() }), vec![("spec.tls.client.secretRef.name", Invalid)]),
        ("cert-manager issuer kind unknown", |o| tls(o).peer = Some(v2::TlsPlane { cert_manager: Some(v2::CertManagerTls { issuer_ref: v2::IssuerReference { name: "ca".into(), kind: Some("Vault".into()), group: None } }), ..v2::TlsPlane::default() }), vec![("spec.tls.peer.certManager.issuerRef.kind", NotSupported)]),
        ("cert-manager issuer name empty", |o| tls(o).peer = Some(v2::TlsPlane { cert_manager: Some(v2::CertManagerTls::default()), ..v2::TlsPlane::default() }), vec![("spec.tls.peer.certManager.issuerRef.name", Required)]),
        ("backup schedule empty", |o| backup(o).schedule = String::new(), vec![("spec.backup.schedule", Required)]),
        ("backup schedule words", |o| backup(o).schedule = "every hour".into(), vec![("spec.backup.schedule", Invalid)]),
        ("backup schedule with a year", |o| backup(o).schedule = "0 0 0 * * * 2030".into(), vec![("spec.backup.schedule", Invalid)]),
        ("backup schedule seconds out of range", |o| backup(o).schedule = "61 * * * * *".into(), vec![("spec.backup.schedule", Invalid)]),
        ("backup schedule out of range", |o| backup(o).schedule = "61 * * * *".into(), vec![("spec.backup.schedule", Invalid)]),
        ("retention count 0", |o| backup(o).retention.as_mut().unwrap().max_count = Some(0), vec![("spec.backup.retention.maxCount", Invalid)]),
        ("retention count too high", |o| backup(o).retention.as_mut().unwrap().max_count = Some(1001), vec![("spec.backup.retention.maxCount", Invalid)]),
        ("retention age in days", |o| backup(o).retention.as_mut().unwrap().max_age = Some("3d".into()), vec![("spec.backup.retention.maxAge", Invalid)]),
        ("retention age too short", |o| backup(o).retention.as_mut().unwrap().max_age = Some("30s".into()), vec![("spec.backup.retention.maxAge", Invalid)]),
        ("destination missing", |o| backup(o).destination = v2::BackupDestination::default(), vec![("spec.backup.destination", Required)]),
        ("destination both", |o| backup(o).destination.volume = Some(v2::VolumeDestination { claim_name: Some("backups".into()), path: None }), vec![("spec.backup.destination", Forbidden)]),
        ("bucket empty", |o| s3(o).bucket = String::new(), vec![("spec.backup.destination.s3.bucket", Required)]),
        ("bucket invalid", |o| s3(o).bucket = "My_Bucket".into(), vec![("spec.backup.destination.s3.bucket", Invalid)]),
        ("endpoint not a URL", |o| s3(o).endpoint = Some("minio:9000 x".into()), vec![("spec.backup.destination.s3.endpoint", Invalid)]),
        ("endpoint scheme", |o| s3(o).endpoint = Some("ftp://minio.example".into()), vec![("spec.backup.destination.s3.endpoint", Invalid)]),
        ("credentials secret invalid", |o| s3(o).credentials_secret = Some("Creds!".into()), vec![("spec.backup.destination.s3.credentialsSecret", Invalid)]),
        ("prefix absolute", |o| s3(o).prefix = Some("/prod".into()), vec![("spec.backup.destination.s3.prefix", Invalid)]),
        ("region invalid", |o| s3(o).region = Some("EU West".into()), vec![("spec.backup.destination.s3.region", Invalid)]),
        ("volume claim and path", |o| backup(o).destination = v2::BackupDestination { s3: None, volume: Some(v2::VolumeDestination { claim_name: Some("b".into()), path: Some("/b".into()) }) }, vec![("spec.backup.destination.volume", Forbidden)]),
        ("volume empty", |o| backup(o).destination = v2::BackupDestination { s3: None, volume: Some(v2::VolumeDestination::default()) }, vec![("spec.backup.destination.volume", Required)]),
        ("volume path relative", |o| backup(o).destination = v2::BackupDestination { s3: None, volume: Some(v2::VolumeDestination { claim_name: None, path: Some("backups".into()) }) }, vec![("spec.backup.destination.volume.path", Invalid)]),
        ("restore empty", |o| with_restore(o, v2::RestoreSpec::default()), vec![(RESTORE, Required)]),
        ("restore two sources", |o| with_restore(o, v2::RestoreSpec { backup_name: Some("b".into()), source: Some(v2::RestoreSource { url: Some("https://x.example/s.db".into()), ..v2::RestoreSource::default() }) }), vec![(RESTORE, Forbidden)]),
        ("restore backup name invalid", |o| with_restore(o, v2::RestoreSpec { backup_name: Some("B!".into()), source: None }), vec![("spec.bootstrap.restore.backupName", Invalid)]),
        ("restore key without destination", |o| with_restore(o, v2::RestoreSpec { backup_name: None, source: Some(v2::RestoreSource { key: Some("snap.db".into()), ..v2::RestoreSource::default() }) }), vec![("spec.bootstrap.restore.source.destination", Required)]),
        ("restore url invalid", |o| with_restore(o, v2::RestoreSpec { backup_name: None, source: Some(v2::RestoreSource { url: Some("not a url".into()), ..v2::RestoreSource::default() }) }), vec![("spec.bootstrap.restore.source.url", Invalid)]),
        ("restore url with destination", |o| with_restore(o, v2::RestoreSpec { backup_name: None, source: Some(v2::RestoreSource { url: Some("s3://b/k".into()), destination: Some(s3_dest()), key: None }) }), vec![("spec.bootstrap.restore.source.destination", Forbidden)]),
        ("several errors at once", |o| { o.spec.replicas = Some(11); o.spec.version = Some("4.0.0".into()); backup(o).schedule = String::new(); }, vec![("spec.replicas", Invalid), ("spec.version", Invalid), ("spec.backup.schedule", Required)]),
    ]
}

#[test]
fn invalid_inputs_are_rejected_with_path_and_reason() {
    let cases = invalid_cases();
    assert!(cases.len() >= 40, "only {} invalid cases", cases.len());
    let _ = (TOL, TSC, S3);
    for (name, mutate, want) in cases {
        let mut obj = base();
        mutate(&mut obj);
        let outcome = validate(&obj);
        assert_eq!(
            found(&outcome),
            expected(&want),
            "case {name:?}: {:#?}",
            outcome.errors
        );
        let status = outcome.clone().into_result("example").unwrap_err();
        assert_eq!(status.code, Some(422), "case {name:?}");
        assert_eq!(
            status.details.unwrap().causes.unwrap().len(),
            want.len(),
            "case {name:?}"
        );
    }
}

#[test]
fn oversized_annotations_say_so_as_kube_apiserver_does() {
    let mut obj = base();
    obj.metadata.annotations = Some(BTreeMap::from([("big".to_owned(), "x".repeat(262_142))]));
    let outcome = validate(&obj);
    assert_eq!(outcome.errors.len(), 1, "{:?}", outcome.errors);
    assert_eq!(
        outcome.errors[0].to_string(),
        "metadata.annotations: Too long: may not be more than 262144 bytes"
    );
}

#[test]
fn memory_with_zero_replicas_gets_its_own_message() {
    let mut obj = base();
    obj.spec.replicas = Some(0);
    storage(&mut obj).medium = Some(StorageMedium::Memory);
    storage(&mut obj).storage_class_name = None;
    let outcome = validate(&obj);
    assert!(
        outcome.errors[0].detail.contains("medium Memory"),
        "{}",
        outcome.errors[0]
    );
    let mut disk = base();
    disk.spec.replicas = Some(0);
    assert_eq!(validate(&disk).errors[0].detail, "must be between 1 and 9");
}

#[rustfmt::skip]
fn valid_cases() -> Vec<WarningCase> {
    vec![
        ("minimal spec", |o| o.spec = v2::EtcdClusterSpec::default(), vec![]),
        ("name of maximal length", |o| o.metadata.name = Some("a".repeat(52)), vec![]),
        ("one replica warns", |o| o.spec.replicas = Some(1), vec!["spec.replicas"]),
        ("even replicas warn", |o| o.spec.replicas = Some(4), vec!["spec.replicas"]),
        ("nine replicas", |o| o.spec.replicas = Some(9), vec![]),
        ("version 3.4", |o| o.spec.version = Some("3.4.23".into()), vec![]),
        ("version 3.6", |o| o.spec.version = Some("3.6.4".into()), vec![]),
        ("version with known issue warns", |o| o.spec.version = Some("3.5.1".into()), vec!["spec.version"]),
        ("single-member durability issue is moot with three members", |o| o.spec.version = Some("3.5.4".into()), vec![]),
        ("single member on a version that loses writes on a crash warns", |o| { o.spec.replicas = Some(1); o.spec.version = Some("3.5.4".into()); }, vec!["spec.replicas", "spec.version"]),
        ("single member on 3.5.1 warns of corruption and of lost writes", |o| { o.spec.replicas = Some(1); o.spec.version = Some("3.5.1".into()); }, vec!["spec.replicas", "spec.version", "spec.version"]),
        ("registry with port", |o| o.spec.repository = Some("registry.local:5000/etcd".into()), vec![]),
        ("toleration matching everything", |o| *toleration(o) = Toleration { operator: Some("Exists".into()), ..Toleration::default() }, vec![]),
        ("toleration seconds with NoExecute", |o| { toleration(o).effect = Some("NoExecute".into()); toleration(o).toleration_seconds = Some(30); }, vec![]),
        ("spread with DoNotSchedule", |o| spread(o).when_unsatisfiable = "DoNotSchedule".into(), vec![]),
        ("memory without class warns", |o| { storage(o).medium = Some(StorageMedium::Memory); storage(o).storage_class_name = None; }, vec!["spec.storage.medium"]),
        ("decimal storage size", |o| storage(o).size = Some(q("10G")), vec![]),
        ("cluster issuer", |o| tls(o).peer = Some(v2::TlsPlane { cert_manager: Some(v2::CertManagerTls { issuer_ref: v2::IssuerReference { name: "ca".into(), kind: Some("ClusterIssuer".into()), group: None } }), ..v2::TlsPlane::default() }), vec![]),
        ("external issuer", |o| tls(o).peer = Some(v2::TlsPlane { cert_manager: Some(v2::CertManagerTls { issuer_ref: v2::IssuerReference { name: "vault".into(), kind: Some("VaultIssuer".into()), group: Some("vault.example.com".into()) } }), ..v2::TlsPlane::default() }), vec![]),
        ("no tls planes", |o| o.spec.tls = Some(Box::new(v2::TlsSpec::default())), vec![]),
        ("cron nickname", |o| backup(o).schedule = "@daily".into(), vec![]),
        ("cron with a seconds field", |o| backup(o).schedule = "*/5 * * * * *".into(), vec![]),
        ("cron step and list", |o| backup(o).schedule = "*/15 1,13 * * MON-FRI".into(), vec![]),
        ("retention by age only", |o| backup(o).retention = Some(v2::BackupRetention { max_count: None, max_age: Some("1h30m".into()) }), vec![]),
        ("http endpoint", |o| s3(o).endpoint = Some("http://moto.local:5000".into()), vec![]),
        ("volume claim", |o| backup(o).destination = v2::BackupDestination { s3: None, volume: Some(v2::VolumeDestination { claim_name: Some("etcd-backups".into()), path: None }) }, vec![]),
        ("volume path", |o| backup(o).destination = v2::BackupDestination { s3: None, volume: Some(v2::VolumeDestination { claim_name: None, path: Some("/var/backups/etcd".into()) }) }, vec![]),
        ("restore from backup", |o| with_restore(o, v2::RestoreSpec { backup_name: Some("example-20260101".into()), source: None }), vec![]),
        ("restore from key", |o| with_restore(o, v2::RestoreSpec { backup_name: None, source: Some(v2::RestoreSource { destination: Some(s3_dest()), key: Some("prod/snap.db".into()), url: None }) }), vec![]),
        ("restore from url", |o| with_restore(o, v2::RestoreSpec { backup_name: None, source: Some(v2::RestoreSource { url: Some("https://backups.example/snap.db".into()), ..v2::RestoreSource::default() }) }), vec![]),
        ("manual replacement", |o| *replacement(o) = v2::ReplacementSpec { policy: Some(v2::ReplacementPolicy::Manual), ..v2::ReplacementSpec::default() }, vec![]),
        ("replacement thresholds at their bounds", |o| { replacement(o).unhealthy_after = Some("10s".into()); replacement(o).crash_loop_after = Some("168h".into()); }, vec![]),
        ("paused warns", |o| o.spec.paused = Some(true), vec!["spec.paused"]),
        ("label key with prefix of 253 and name of 63", |o| o.metadata.labels = Some(BTreeMap::from([(format!("{}.{}.{}.{}/{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61), "n".repeat(63)), "x".to_owned())])), vec![]),
        ("label value empty", |o| o.metadata.labels = Some(map(&[("app", "")])), vec![]),
        ("label value of 63 with inner punctuation", |o| o.metadata.labels = Some(BTreeMap::from([("app".to_owned(), format!("A{}z", "-_.".repeat(20) + "9"))])), vec![]),
        ("annotation key with an uppercase prefix", |o| o.metadata.annotations = Some(map(&[("Example.com/Owner", "sre")])), vec![]),
        ("annotations of exactly 256 KiB", |o| o.metadata.annotations = Some(BTreeMap::from([("a".to_owned(), "x".repeat(128 * 1024)), ("b".to_owned(), "x".repeat(128 * 1024 - 2))])), vec![]),
    ]
}

#[test]
fn valid_inputs_are_accepted_with_expected_warnings() {
    for (name, mutate, warnings) in valid_cases() {
        let mut obj = base();
        mutate(&mut obj);
        let outcome = validate(&obj);
        assert_eq!(outcome.errors, vec![], "case {name:?}");
        let fields: Vec<&str> = outcome.warnings.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(fields, warnings, "case {name:?}");
    }
}

#[rustfmt::skip]
fn update_cases() -> Vec<UpdateCase> {
    vec![
        ("patch upgrade", |o| o.spec.version = Some("3.5.1".into()), |o| o.spec.version = Some("3.5.21".into()), vec![]),
        ("patch downgrade", |o| o.spec.version = Some("3.5.21".into()), |o| o.spec.version = Some("3.5.3".into()), vec![]),
        ("minor upgrade", |o| o.spec.version = Some("3.4.23".into()), |o| o.spec.version = Some("3.5.0".into()), vec![]),
        ("minor upgrade to 3.6", |o| o.spec.version = Some("3.5.21".into()), |o| o.spec.version = Some("3.6.4".into()), vec![]),
        ("downgrade 3.6 to 3.5", |o| o.spec.version = Some("3.6.4".into()), |o| o.spec.version = Some("3.5.21".into()), vec![]),
        ("default version to explicit", |o| o.spec.version = None, |o| o.spec.version = Some("3.6.0".into()), vec![]),
        ("skipped minor", |o| o.spec.version = Some("3.4.23".into()), |o| o.spec.version = Some("3.6.0".into()), vec![("spec.version", Invalid)]),
        ("downgrade 3.5 to 3.4", |o| o.spec.version = Some("3.5.21".into()), |o| o.spec.version = Some("3.4.23".into()), vec![("spec.version", Invalid)]),
        ("downgrade 3.6 to 3.4", |o| o.spec.version = Some("3.6.0".into()), |o| o.spec.version = Some("3.4.23".into()), vec![("spec.version", Invalid)]),
        ("scale", |_| {}, |o| o.spec.replicas = Some(5), vec![]),
        ("medium changed", |_| {}, |o| { storage(o).medium = Some(StorageMedium::Memory); storage(o).storage_class_name = None; }, vec![("spec.storage.medium", Invalid)]),
        ("storage size grown", |o| storage(o).size = Some(q("8Gi")), |o| storage(o).size = Some(q("16Gi")), vec![]),
        ("storage size grown in another unit", |o| storage(o).size = Some(q("8Gi")), |o| storage(o).size = Some(q("8193Mi")), vec![]),
        ("storage size shrunk", |o| storage(o).size = Some(q("8Gi")), |o| storage(o).size = Some(q("4Gi")), vec![("spec.storage.size", Invalid)]),
        ("storage class changed", |_| {}, |o| storage(o).storage_class_name = None, vec![("spec.storage.storageClassName", Invalid)]),
        ("storage defaulted", |o| o.spec.storage = None, |o| o.spec.storage = Some(v2::StorageSpec { medium: Some(StorageMedium::Disk), size: Some(q("1Gi")), storage_class_name: None }), vec![]),
        ("tls changed", |_| {}, |o| tls(o).peer = None, vec![("spec.tls", Forbidden)]),
        ("tls added", |o| o.spec.tls = None, |o| o.spec.tls = base().spec.tls, vec![("spec.tls", Forbidden)]),
        ("empty tls is no tls", |o| o.spec.tls = None, |o| o.spec.tls = Some(Box::new(v2::TlsSpec::default())), vec![]),
        ("bootstrap changed", |_| {}, |o| with_restore(o, v2::RestoreSpec { backup_name: Some("b".into()), source: None }), vec![("spec.bootstrap", Forbidden)]),
        ("backup changed", |_| {}, |o| backup(o).schedule = "0 0 * * *".into(), vec![]),
    ]
}

#[test]
fn updates_follow_the_version_and_immutability_rules() {
    for (name, old_mutation, new_mutation, want) in update_cases() {
        let mut old = base();
        old_mutation(&mut old);
        let mut new = old.clone();
        new_mutation(&mut new);
        let outcome = validate_update(&new, &old);
        assert_eq!(
            found(&outcome),
            expected(&want),
            "case {name:?}: {:#?}",
            outcome.errors
        );
    }
}

#[test]
fn a_shrinking_volume_is_refused_saying_why_and_a_growing_one_warns() {
    let mut old = base();
    storage(&mut old).size = Some(q("8Gi"));
    let mut new = old.clone();
    storage(&mut new).size = Some(q("2Gi"));
    let outcome = validate_update(&new, &old);
    assert!(
        outcome.errors[0].detail.contains("may only grow (it is 8Gi)"),
        "{}",
        outcome.errors[0]
    );
    storage(&mut new).size = Some(q("16Gi"));
    let outcome = validate_update(&new, &old);
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert!(
        outcome.warnings.iter().any(|w| w.field == "spec.storage.size"
            && w.message.contains("StorageClass must allow volume expansion")),
        "{:?}",
        outcome.warnings
    );
}

#[test]
fn a_downgrade_from_3_6_to_3_5_is_accepted_and_says_what_will_happen() {
    let mut old = base();
    old.spec.version = Some("3.6.4".into());
    let mut new = old.clone();
    new.spec.version = Some("3.5.21".into());
    let outcome = validate_update(&new, &old);
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert!(
        outcome.warnings.iter().any(|w| w.field == "spec.version"
            && w.message.contains("downgrade is validated and enabled")
            && w.message.contains("storage versions become 3.5")),
        "{:?}",
        outcome.warnings
    );
}

#[test]
fn version_rejections_say_why() {
    let cases = [
        ("3.4.23", "3.6.0", "may not skip a minor version"),
        (
            "3.5.21",
            "3.4.23",
            "only supported minor downgrade is from 3.6 to 3.5",
        ),
    ];
    for (from, to, reason) in cases {
        let mut old = base();
        old.spec.version = Some(from.into());
        let mut new = old.clone();
        new.spec.version = Some(to.into());
        let outcome = validate_update(&new, &old);
        assert!(
            outcome.errors[0].detail.contains(reason),
            "{from} -> {to}: {}",
            outcome.errors[0]
        );
    }
}

fn v1_base() -> v1::EtcdCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "etcd.operator.dev/v1alpha1",
        "kind": "EtcdCluster",
        "metadata": {"name": "legacy", "namespace": "default"},
        "spec": {
            "size": 3,
            "version": "3.4.23",
            "repository": "quay.io/coreos/etcd",
            "pod": {
                "antiAffinity": true,
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "etcd", "effect": "NoSchedule"}],
                "persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "2Gi"}}}
            },
            "backup": {"backupIntervalInSecond": 3600, "maxBackups": 5, "storageType": "S3", "s3": {"bucket": "legacy-backups", "awsSecret": "aws"}},
            "TLS": {"static": {"member": {"peerSecret": "peer-tls", "serverSecret": "server-tls"}, "operatorSecret": "operator-tls"}}
        }
    }))
    .unwrap()
}

type V1Mutation = fn(&mut v1::EtcdCluster);

#[rustfmt::skip]
fn v1alpha1_cases() -> Vec<(&'static str, V1Mutation, Expected)> {
    vec![
        ("size 0", |o| o.spec.size = Some(0), vec![("spec.size", Invalid)]),
        ("toleration operator", |o| o.spec.pod.as_mut().unwrap().tolerations.as_mut().unwrap()[0].operator = Some("In".into()), vec![("spec.pod.tolerations[0].operator", NotSupported)]),
        ("pvc storage malformed", |o| { o.spec.pod.as_mut().unwrap().persistent_volume_claim_spec.as_mut().unwrap().resources.as_mut().unwrap().requests.as_mut().unwrap().insert("storage".into(), q("2 GB")); }, vec![("spec.pod.persistentVolumeClaimSpec.resources.requests[storage]", Invalid)]),
        ("interval too short", |o| o.spec.backup.as_mut().unwrap().backup_interval_in_second = Some(30), vec![("spec.backup.backupIntervalInSecond", Invalid)]),
        ("interval missing", |o| o.spec.backup.as_mut().unwrap().backup_interval_in_second = None, vec![("spec.backup.backupIntervalInSecond", Required)]),
        ("storage type unknown", |o| o.spec.backup.as_mut().unwrap().storage_type = Some(v1::BackupStorageType::Unknown("GCS".into())), vec![("spec.backup.storageType", NotSupported)]),
        ("storage type missing", |o| o.spec.backup.as_mut().unwrap().storage_type = None, vec![("spec.backup.storageType", Required)]),
        ("s3 settings missing", |o| o.spec.backup.as_mut().unwrap().s3 = None, vec![("spec.backup.s3", Required)]),
        ("aws secret invalid", |o| o.spec.backup.as_mut().unwrap().s3.as_mut().unwrap().aws_secret = Some("AWS!".into()), vec![("spec.backup.s3.awsSecret", Invalid)]),
        ("max backups 0", |o| o.spec.backup.as_mut().unwrap().max_backups = Some(0), vec![("spec.backup.maxBackups", Invalid)]),
        ("pv size 0", |o| { let b = o.spec.backup.as_mut().unwrap(); b.storage_type = Some(v1::BackupStorageType::PersistentVolume); b.s3 = None; b.pv = Some(v1::PvSource { volume_size_in_mb: Some(0), storage_class: None }); }, vec![("spec.backup.pv.volumeSizeInMB", Invalid)]),
        ("peer secret invalid", |o| o.spec.tls.as_mut().unwrap().static_tls.as_mut().unwrap().member.as_mut().unwrap().peer_secret = Some("Peer_TLS".into()), vec![("spec.TLS.static.member.peerSecret", Invalid)]),
        ("operator secret invalid", |o| o.spec.tls.as_mut().unwrap().static_tls.as_mut().unwrap().operator_secret = Some("Op!".into()), vec![("spec.TLS.static.operatorSecret", Invalid)]),
        ("stashed v1alpha2 field invalid", |o| { o.metadata.annotations = Some(BTreeMap::from([(V1ALPHA2_FIELDS_ANNOTATION.to_owned(), r#"{"bootstrap":{"restore":{}}}"#.to_owned())])); }, vec![("metadata.annotations[etcd.operator.dev/v1alpha2-fields]", Required)]),
    ]
}

#[test]
fn v1alpha1_objects_are_reported_in_v1alpha1_paths() {
    let valid = validate_versioned(&VersionedCluster::V1alpha1(v1_base()));
    assert_eq!(valid.errors, vec![]);
    for (name, mutate, want) in v1alpha1_cases() {
        let mut obj = v1_base();
        mutate(&mut obj);
        let outcome = validate_versioned(&VersionedCluster::V1alpha1(obj));
        assert_eq!(
            found(&outcome),
            expected(&want),
            "case {name:?}: {:#?}",
            outcome.errors
        );
    }
}

#[test]
fn v1alpha1_rounded_interval_warns() {
    let mut obj = v1_base();
    obj.spec.backup.as_mut().unwrap().backup_interval_in_second = Some(7 * 60);
    let outcome = validate_versioned(&VersionedCluster::V1alpha1(obj));
    assert_eq!(outcome.errors, vec![]);
    assert_eq!(outcome.warnings[0].field, "spec.backup.backupIntervalInSecond");
    assert!(
        outcome.warnings[0].message.contains("*/6 * * * *"),
        "{}",
        outcome.warnings[0]
    );
}

#[test]
fn defaulted_objects_are_valid() {
    let mut obj: v2::EtcdCluster =
        serde_json::from_value(serde_json::json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "metadata": {"name": "a"}, "spec": {}}))
            .unwrap();
    etcd_operator_api::defaults::apply_v1alpha2(&mut obj);
    assert!(validate(&obj).is_valid());
    let mut old = v1::EtcdCluster {
        metadata: obj.metadata.clone(),
        ..v1::EtcdCluster::default()
    };
    etcd_operator_api::defaults::apply_v1alpha1(&mut old);
    assert!(validate_versioned(&VersionedCluster::V1alpha1(old.clone())).is_valid());
    // A cluster created through v1alpha1 and updated through v1alpha2 (with v1alpha2 defaults)
    // does not trip the immutability of storage.
    let stored = v2::EtcdCluster::from(old);
    let mut updated = stored.clone();
    etcd_operator_api::defaults::apply_v1alpha2(&mut updated);
    assert!(
        validate_update(&updated, &stored).is_valid(),
        "{:?}",
        validate_update(&updated, &stored).errors
    );
}
