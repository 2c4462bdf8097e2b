//! Property-based round trips: arbitrary objects of each version (including the settings the
//! other version cannot express) convert to the other version and back unchanged, also when the
//! intermediate object goes through JSON, as it does between the API server and its clients.

// Test helpers outside `#[test]` functions unwrap too: a failed unwrap is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use etcd_operator_api::status::{BackupStatus, ClusterPhase, EtcdClusterStatus, MemberStatus};
use etcd_operator_api::v1alpha1 as v1;
use etcd_operator_api::v1alpha2 as v2;
use k8s_openapi::api::core::v1::{
    Affinity, PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity, ResourceRequirements, Toleration,
    TopologySpreadConstraint, VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use proptest::collection::{btree_map, vec};
use proptest::option::of;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const CASES: u32 = 2048;

fn word() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,6}"
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9 ./:_-]{0,12}", Just(String::new())]
}

fn string_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map("[a-z]{1,4}(/[a-z]{1,4})?", text(), 0..3)
}

fn quantity() -> impl Strategy<Value = Quantity> {
    (
        "[1-9][0-9]{0,3}",
        prop_oneof![Just(""), Just("m"), Just("Mi"), Just("Gi"), Just("k")],
    )
        .prop_map(|(n, unit)| Quantity(format!("{n}{unit}")))
}

fn quantity_map() -> impl Strategy<Value = BTreeMap<String, Quantity>> {
    btree_map(
        prop_oneof![Just("cpu".to_owned()), Just("memory".to_owned()), word()],
        quantity(),
        0..3,
    )
}

fn resources() -> impl Strategy<Value = ResourceRequirements> {
    (of(quantity_map()), of(quantity_map())).prop_map(|(limits, requests)| ResourceRequirements {
        claims: None,
        limits,
        requests,
    })
}

fn affinity() -> impl Strategy<Value = Affinity> {
    (1..100i32, word(), of(string_map())).prop_map(|(weight, topology_key, labels)| Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                weight,
                pod_affinity_term: PodAffinityTerm {
                    topology_key,
                    label_selector: labels.map(|m| LabelSelector {
                        match_labels: Some(m),
                        match_expressions: None,
                    }),
                    ..PodAffinityTerm::default()
                },
            }]),
            required_during_scheduling_ignored_during_execution: None,
        }),
        ..Affinity::default()
    })
}

fn toleration() -> impl Strategy<Value = Toleration> {
    (
        of(word()),
        of(prop_oneof![
            Just("Exists".to_owned()),
            Just("Equal".to_owned()),
            word()
        ]),
        of(text()),
        of(prop_oneof![
            Just("NoSchedule".to_owned()),
            Just("NoExecute".to_owned())
        ]),
        of(0..10_000i64),
    )
        .prop_map(|(key, operator, value, effect, toleration_seconds)| Toleration {
            key,
            operator,
            value,
            effect,
            toleration_seconds,
        })
}

fn spread() -> impl Strategy<Value = TopologySpreadConstraint> {
    (
        -1..4i32,
        word(),
        prop_oneof![
            Just("DoNotSchedule".to_owned()),
            Just("ScheduleAnyway".to_owned()),
            word()
        ],
    )
        .prop_map(
            |(max_skew, topology_key, when_unsatisfiable)| TopologySpreadConstraint {
                max_skew,
                topology_key,
                when_unsatisfiable,
                ..TopologySpreadConstraint::default()
            },
        )
}

fn pvc() -> impl Strategy<Value = PersistentVolumeClaimSpec> {
    (
        of(vec(
            prop_oneof![
                Just("ReadWriteOnce".to_owned()),
                Just("ReadWriteOncePod".to_owned())
            ],
            0..2,
        )),
        of((
            of(btree_map(
                prop_oneof![Just("storage".to_owned()), word()],
                quantity(),
                0..2,
            )),
            of(quantity_map()),
        )),
        of(word()),
        of(prop_oneof![
            Just("Filesystem".to_owned()),
            Just("Block".to_owned())
        ]),
    )
        .prop_map(|(access_modes, resources, storage_class_name, volume_mode)| {
            PersistentVolumeClaimSpec {
                access_modes,
                resources: resources
                    .map(|(requests, limits)| VolumeResourceRequirements { limits, requests }),
                storage_class_name,
                volume_mode,
                ..PersistentVolumeClaimSpec::default()
            }
        })
}

fn metadata() -> impl Strategy<Value = ObjectMeta> {
    (
        of(word()),
        of(word()),
        of(string_map()),
        // Annotations are omitted when empty (as the API server does); reserved keys are the
        // conversion's own.
        of(btree_map("[a-z]{1,4}(\\.io/[a-z]{1,4})?", text(), 1..3)),
        of(1..1000i64),
        of("[0-9]{1,6}"),
        of(Just(Time(Timestamp::UNIX_EPOCH))),
    )
        .prop_map(
            |(name, namespace, labels, annotations, generation, resource_version, creation_timestamp)| {
                ObjectMeta {
                    name,
                    namespace,
                    labels,
                    annotations,
                    generation,
                    resource_version,
                    creation_timestamp,
                    ..ObjectMeta::default()
                }
            },
        )
}

fn condition() -> impl Strategy<Value = Condition> {
    (
        word(),
        prop_oneof![Just("True"), Just("False"), Just("Unknown")],
        0..2_000_000_000i64,
        text(),
        word(),
    )
        .prop_map(|(type_, status, seconds, message, reason)| Condition {
            last_transition_time: Time(Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH)),
            message,
            observed_generation: Some(seconds % 7),
            reason,
            status: status.to_owned(),
            type_,
        })
}

fn status() -> impl Strategy<Value = EtcdClusterStatus> {
    let member = (
        word(),
        of("[0-9a-f]{16}"),
        of(word()),
        of(any::<bool>()),
        of(any::<bool>()),
        of(any::<bool>()),
        of(0..1_000_000_000i64),
        of(prop::collection::vec(
            prop_oneof![Just("NOSPACE".to_owned()), Just("CORRUPT".to_owned())],
            0..2,
        )),
    )
        .prop_map(
            |(name, id, version, learner, leader, healthy, db_size, alarms)| MemberStatus {
                name,
                id,
                version,
                learner,
                leader,
                healthy,
                db_size,
                db_size_in_use: db_size.map(|d| d / 2),
                alarms,
            },
        );
    let backup = (
        of(0..2_000_000_000i64),
        of(0..100_000i64),
        of(0..1_000_000i64),
        of(text()),
        of("[0-9a-f]{64}"),
    )
        .prop_map(|(seconds, revision, size, location, sha256)| BackupStatus {
            time: seconds.and_then(|s| Timestamp::from_second(s).ok()).map(Time),
            revision,
            size,
            location,
            sha256,
        });
    (
        (
            of(prop_oneof![
                Just(ClusterPhase::Running),
                Just(ClusterPhase::Creating),
                word().prop_map(ClusterPhase::Unknown)
            ]),
            of(vec(condition(), 0..3)),
            of(0..100i64),
            of(0..9i32),
            of(0..9i32),
        ),
        (
            of(vec(member, 0..3)),
            of("[0-9a-f]{16}"),
            of(word()),
            of(word()),
            of(word()),
            of(backup),
            of(vec(word(), 0..3)),
        ),
    )
        .prop_map(
            |(
                (phase, conditions, observed_generation, replicas, ready_replicas),
                (members, cluster_id, leader, current_version, selector, last_backup, client_endpoints),
            )| EtcdClusterStatus {
                phase,
                conditions,
                observed_generation,
                replicas,
                ready_replicas,
                members,
                cluster_id,
                leader,
                current_version,
                client_endpoints,
                selector,
                last_backup: last_backup.map(Box::new),
                // Fields added later (e.g. the upgrade progress) keep their defaults here.
                ..EtcdClusterStatus::default()
            },
        )
}

// --- v1alpha1

fn v1_pod() -> impl Strategy<Value = v1::PodPolicy> {
    (
        of(string_map()),
        of(string_map()),
        of(resources()),
        of(affinity()),
        of(string_map()),
        of(vec(toleration(), 0..3)),
        of(any::<bool>()),
        of(pvc()),
    )
        .prop_map(
            |(labels, annotations, resources, affinity, node_selector, tolerations, anti_affinity, pvc)| {
                v1::PodPolicy {
                    labels,
                    annotations,
                    resources,
                    affinity,
                    node_selector,
                    tolerations,
                    anti_affinity,
                    persistent_volume_claim_spec: pvc,
                }
            },
        )
}

fn v1_backup() -> impl Strategy<Value = v1::BackupPolicy> {
    let interval = prop_oneof![
        Just(60i64),
        Just(300),
        Just(3600),
        Just(7200),
        Just(86_400),
        -100i64..200_000,
    ];
    let storage_type = prop_oneof![
        Just(v1::BackupStorageType::S3),
        Just(v1::BackupStorageType::PersistentVolume),
        word().prop_map(v1::BackupStorageType::Unknown),
    ];
    let s3 = (
        word(),
        of(text()),
        of(text()),
        of(word()),
        of(word()),
        of(any::<bool>()),
    )
        .prop_map(
            |(bucket, prefix, endpoint, region, aws_secret, force_path_style)| v1::S3Source {
                bucket,
                prefix,
                endpoint,
                region,
                aws_secret,
                force_path_style,
            },
        );
    let pv = (of(-5..10_000i64), of(word())).prop_map(|(volume_size_in_mb, storage_class)| v1::PvSource {
        volume_size_in_mb,
        storage_class,
    });
    (of(interval), of(0..20i32), of(storage_type), of(s3), of(pv)).prop_map(
        |(backup_interval_in_second, max_backups, storage_type, s3, pv)| v1::BackupPolicy {
            backup_interval_in_second,
            max_backups,
            storage_type,
            s3,
            pv,
        },
    )
}

fn v1_tls() -> impl Strategy<Value = v1::TlsPolicy> {
    let member = (of(word()), of(word())).prop_map(|(peer_secret, server_secret)| v1::MemberSecret {
        peer_secret,
        server_secret,
    });
    of(
        (of(member), of(word())).prop_map(|(member, operator_secret)| v1::StaticTlsPolicy {
            member,
            operator_secret,
        }),
    )
    .prop_map(|static_tls| v1::TlsPolicy { static_tls })
}

fn v1_cluster() -> impl Strategy<Value = v1::EtcdCluster> {
    let spec = (
        of(-1..12i32),
        of(prop_oneof![Just("3.5.21".to_owned()), "3\\.[0-9]\\.[0-9]{1,2}"]),
        of(word()),
        of(v1_pod()),
        of(v1_backup()),
        of(v1_tls()),
        of(any::<bool>()),
    )
        .prop_map(
            |(size, version, repository, pod, backup, tls, paused)| v1::ClusterSpec {
                size,
                version,
                repository,
                pod,
                backup,
                tls,
                paused,
            },
        );
    (metadata(), spec, of(status())).prop_map(|(metadata, spec, status)| v1::EtcdCluster {
        api_version: v1::API_VERSION.to_owned(),
        kind: "EtcdCluster".to_owned(),
        metadata,
        spec,
        status,
    })
}

// --- v1alpha2

fn v2_pod_template() -> impl Strategy<Value = v2::PodTemplate> {
    let metadata = (of(string_map()), of(string_map()))
        .prop_map(|(labels, annotations)| v2::PodTemplateMetadata { labels, annotations });
    let spec = (
        of(resources()),
        of(affinity()),
        of(string_map()),
        of(vec(toleration(), 0..3)),
        of(vec(spread(), 0..3)),
        of(word()),
    )
        .prop_map(
            |(
                resources,
                affinity,
                node_selector,
                tolerations,
                topology_spread_constraints,
                priority_class_name,
            )| {
                v2::PodTemplateSpec {
                    resources,
                    affinity,
                    node_selector,
                    tolerations,
                    topology_spread_constraints,
                    priority_class_name,
                }
            },
        );
    (of(metadata), of(spec)).prop_map(|(metadata, spec)| v2::PodTemplate { metadata, spec })
}

fn v2_storage() -> impl Strategy<Value = v2::StorageSpec> {
    let medium = prop_oneof![
        Just(v2::StorageMedium::Disk),
        Just(v2::StorageMedium::Memory),
        word().prop_map(v2::StorageMedium::Unknown),
    ];
    (of(medium), of(quantity()), of(word())).prop_map(|(medium, size, storage_class_name)| v2::StorageSpec {
        medium,
        size,
        storage_class_name,
    })
}

fn v2_plane() -> impl Strategy<Value = v2::TlsPlane> {
    let issuer = (word(), of(word()), of(word())).prop_map(|(name, kind, group)| v2::CertManagerTls {
        issuer_ref: v2::IssuerReference { name, kind, group },
    });
    (
        of(word().prop_map(|name| v2::SecretReference { name })),
        of(issuer),
        of(Just(v2::AutoTls {})),
    )
        .prop_map(|(secret_ref, cert_manager, auto)| v2::TlsPlane {
            secret_ref,
            cert_manager,
            auto,
        })
}

fn v2_destination() -> impl Strategy<Value = v2::BackupDestination> {
    let s3 = (
        word(),
        of(text()),
        of(text()),
        of(word()),
        of(word()),
        of(any::<bool>()),
    )
        .prop_map(
            |(bucket, prefix, endpoint, region, credentials_secret, force_path_style)| v2::S3Destination {
                bucket,
                prefix,
                endpoint,
                region,
                credentials_secret,
                force_path_style,
            },
        );
    let volume = (of(word()), of("/[a-z]{1,6}"))
        .prop_map(|(claim_name, path)| v2::VolumeDestination { claim_name, path });
    (of(s3), of(volume)).prop_map(|(s3, volume)| v2::BackupDestination { s3, volume })
}

fn v2_backup() -> impl Strategy<Value = v2::BackupSpec> {
    let schedule = prop_oneof![
        Just("* * * * *".to_owned()),
        Just("*/5 * * * *".to_owned()),
        Just("0 * * * *".to_owned()),
        Just("0 */6 * * *".to_owned()),
        Just("0 0 * * *".to_owned()),
        Just("17 3 * * 1".to_owned()),
        Just(String::new()),
        "[0-9*/ ]{0,12}",
    ];
    let retention = (
        of(-1..50i32),
        of(prop_oneof![Just("72h".to_owned()), "[0-9]{1,3}[smh]"]),
    )
        .prop_map(|(max_count, max_age)| v2::BackupRetention { max_count, max_age });
    (schedule, of(retention), v2_destination()).prop_map(|(schedule, retention, destination)| {
        v2::BackupSpec {
            schedule,
            retention,
            destination,
        }
    })
}

fn v2_bootstrap() -> impl Strategy<Value = v2::BootstrapSpec> {
    let source = (of(v2_destination()), of(word()), of(text())).prop_map(|(destination, key, url)| {
        v2::RestoreSource {
            destination,
            key,
            url,
        }
    });
    of((of(word()), of(source)).prop_map(|(backup_name, source)| v2::RestoreSpec { backup_name, source }))
        .prop_map(|restore| v2::BootstrapSpec { restore })
}

fn v2_maintenance() -> impl Strategy<Value = v2::MaintenanceSpec> {
    let mode = prop_oneof![
        Just(v2::AutoCompactionMode::Periodic),
        Just(v2::AutoCompactionMode::Revision)
    ];
    let compaction =
        (of(mode), of(word())).prop_map(|(mode, retention)| v2::AutoCompactionSpec { mode, retention });
    let defragmentation = (
        of(word()),
        of(0..100i32),
        of(prop_oneof![Just("0"), Just("64Mi")]),
    )
        .prop_map(|(schedule, fragmentation_percent, min)| v2::DefragmentationSpec {
            schedule,
            fragmentation_percent,
            min_reclaimable_bytes: min.map(|q| Quantity(q.to_owned())),
        });
    (
        of(compaction),
        of(prop_oneof![Just("64Mi"), Just("2Gi")]),
        of(defragmentation),
    )
        .prop_map(|(auto_compaction, quota, defragmentation)| v2::MaintenanceSpec {
            auto_compaction,
            quota_backend_bytes: quota.map(|q| Quantity(q.to_owned())),
            defragmentation,
        })
}

fn v2_replacement() -> impl Strategy<Value = v2::ReplacementSpec> {
    let policy = prop_oneof![
        Just(v2::ReplacementPolicy::Automatic),
        Just(v2::ReplacementPolicy::Manual)
    ];
    (of(policy), of(word()), of(word())).prop_map(|(policy, unhealthy_after, crash_loop_after)| {
        v2::ReplacementSpec {
            policy,
            unhealthy_after,
            crash_loop_after,
        }
    })
}

fn v2_cluster() -> impl Strategy<Value = v2::EtcdCluster> {
    let spec = (
        of(-1..12i32),
        of(prop_oneof![Just("3.5.21".to_owned()), "3\\.[0-9]\\.[0-9]{1,2}"]),
        of(word()),
        of(v2_pod_template()),
        of(v2_storage()),
        of((of(v2_plane()), of(v2_plane())).prop_map(|(client, peer)| v2::TlsSpec { client, peer })),
        of(v2_backup()),
        of(v2_bootstrap()),
        of(v2_maintenance()),
        of(v2_replacement()),
        of(any::<bool>()),
    )
        .prop_map(
            |(
                replicas,
                version,
                repository,
                pod_template,
                storage,
                tls,
                backup,
                bootstrap,
                maintenance,
                replacement,
                paused,
            )| {
                v2::EtcdClusterSpec {
                    replicas,
                    version,
                    repository,
                    pod_template: pod_template.map(Box::new),
                    storage,
                    tls: tls.map(Box::new),
                    backup: backup.map(Box::new),
                    bootstrap: bootstrap.map(Box::new),
                    maintenance: maintenance.map(Box::new),
                    replacement: replacement.map(Box::new),
                    paused,
                }
            },
        );
    (metadata(), spec, of(status())).prop_map(|(metadata, spec, status)| v2::EtcdCluster {
        api_version: v2::API_VERSION.to_owned(),
        kind: "EtcdCluster".to_owned(),
        metadata,
        spec,
        status,
    })
}

fn through_json<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
    serde_json::from_value(serde_json::to_value(value).unwrap()).unwrap()
}

/// Runs a property on a thread with a large stack: the nested strategies of these deep object
/// trees overflow the default test-thread stack in unoptimised builds.
fn check<S, F>(strategy: fn() -> S, property: F)
where
    S: Strategy + 'static,
    S::Value: std::fmt::Debug,
    F: Fn(S::Value) -> Result<(), TestCaseError> + Send + 'static,
{
    let outcome = std::thread::Builder::new()
        .stack_size(512 << 20)
        .spawn(move || {
            let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(CASES));
            runner.run(&strategy(), property).map_err(|e| e.to_string())
        })
        .unwrap()
        .join()
        .unwrap();
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

#[test]
fn v1alpha1_round_trips_through_the_hub() {
    check(v1_cluster, |obj| {
        let hub = v2::EtcdCluster::from(obj.clone());
        prop_assert_eq!(&hub.api_version, v2::API_VERSION);
        let back = v1::EtcdCluster::from(through_json(&hub));
        prop_assert_eq!(back, obj);
        Ok(())
    });
}

#[test]
fn v1alpha2_round_trips_through_v1alpha1() {
    check(v2_cluster, |obj| {
        let old = v1::EtcdCluster::from(obj.clone());
        prop_assert_eq!(&old.api_version, v1::API_VERSION);
        let back = v2::EtcdCluster::from(through_json(&old));
        prop_assert_eq!(back, obj);
        Ok(())
    });
}

#[test]
fn repeated_round_trips_are_stable() {
    check(v2_cluster, |obj| {
        let once = v1::EtcdCluster::from(obj);
        let twice = v1::EtcdCluster::from(v2::EtcdCluster::from(once.clone()));
        prop_assert_eq!(once, twice);
        Ok(())
    });
}

#[test]
fn json_encoding_round_trips() {
    check(v2_cluster, |obj| {
        prop_assert_eq!(through_json(&obj), obj);
        Ok(())
    });
}

#[test]
fn validation_and_defaulting_never_panic() {
    check(
        || (v2_cluster(), v1_cluster()),
        |(obj, old)| {
            let mut defaulted = obj.clone();
            etcd_operator_api::defaults::apply_v1alpha2(&mut defaulted);
            let _ = etcd_operator_api::validation::validate_update(&defaulted, &obj);
            let versioned = etcd_operator_api::VersionedCluster::V1alpha1(old);
            let _ = etcd_operator_api::validation::validate_versioned_update(&versioned, &obj);
            Ok(())
        },
    );
}
