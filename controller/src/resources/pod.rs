//! The Pod of one etcd member: named after the member, reachable as
//! `<member>.<peer-service>.<namespace>.svc`, data on its PVC (or a tmpfs emptyDir for
//! `medium: Memory`), restricted security context, soft anti-affinity and the podTemplate applied.

use etcd_operator_api::naming;
use etcd_operator_api::v1alpha2::{PodTemplateSpec, StorageMedium};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, Probe, ResourceFieldSelector, ResourceRequirements, SeccompProfile,
    SecretKeySelector, SecurityContext, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::tls::{
    Plane, TLS_ANNOTATION, TlsSchemes, client_url_for, peer_url_for, tls_files, tls_mounts, tls_volumes,
};
use super::{
    CLIENT_PORT, CONTAINER_NAME, DATA_DIR, DATA_MOUNT_PATH, DATA_VOLUME, MEMBER_CONFIG_ANNOTATION,
    METRICS_PORT, OPERATOR_IMAGE_ENV, PEER_PORT, RESTORE_SNAPSHOT, RESTORE_STAGING, RUN_AS_ID, ResourceError,
    TERMINATION_GRACE_SECONDS, encode_config, member_labels, owner_reference, selector_labels,
};
use crate::model::{ClusterRef, MemberConfig};
use crate::restore::{self, RestoreError, RestoreMember, RestorePlan, SnapshotSource};
use crate::validated::ValidatedCluster;

/// The hash of the member template a Pod was built from (see [`template_hash`]).
pub const TEMPLATE_HASH_ANNOTATION: &str = "etcd.operator.dev/template-hash";

/// The Pod volume of the claim a restored member's snapshot is on (mounted read-only into the
/// fetch step only).
pub const RESTORE_SOURCE_VOLUME: &str = "restore-source";

/// Init container fetching and verifying the snapshot (operator image).
pub const RESTORE_FETCH_CONTAINER: &str = "restore-fetch";
/// Init container running the etcd image's restore tool.
pub const RESTORE_TOOL_CONTAINER: &str = "restore";
/// Init container moving the restored member into the data directory (operator image).
pub const RESTORE_FINISH_CONTAINER: &str = "restore-finish";

/// Weight of the default preferred anti-affinity (the maximum).
const ANTI_AFFINITY_WEIGHT: i32 = 100;
/// Topology key of the default anti-affinity: one member per node where possible.
const HOSTNAME_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// The HTTP paths the probes use on the metrics port; which exist depends on the etcd version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probes {
    /// Liveness and startup: the local member works (serializable read), no leader needed, so a
    /// cluster without quorum is not made worse by restarts.
    pub liveness: &'static str,
    /// Readiness: the member can serve linearizable reads (has a leader; `/readyz` also excludes
    /// learners), so the client Service and the PodDisruptionBudget count only serving members.
    pub readiness: &'static str,
}

/// `/livez` and `/readyz` exist from etcd 3.4.29, 3.5.11 and 3.6.0; older members use `/health`
/// (`?serializable=true` for liveness, honoured from 3.5.3; an older 3.4 ignores it and checks
/// linearizably, which the liveness probe's generous failure threshold absorbs). A version that
/// does not parse gets the `/health` paths, which every supported version serves.
pub fn probes_for(version: &str) -> Probes {
    let modern = etcd_operator_api::versions::parse(version).is_ok_and(|v| match v.minor {
        0..=3 => false,
        4 => v.patch >= 29,
        5 => v.patch >= 11,
        _ => true,
    });
    if modern {
        Probes {
            liveness: "/livez",
            readiness: "/readyz",
        }
    } else {
        Probes {
            liveness: "/health?serializable=true",
            readiness: "/health",
        }
    }
}

/// The Pod of member `member`, started with `config`. The configuration is also stored in the
/// [`MEMBER_CONFIG_ANNOTATION`] annotation, so the runtime can read it back.
///
/// A member restored from a snapshot (`config.restore`) gets three init containers on its data
/// volume: `restore-fetch` (`operator_image`: fetch and verify the snapshot), `restore` (the etcd
/// image: its restore tool writes the member into [`RESTORE_STAGING`]) and `restore-finish`
/// (`operator_image`: move it to [`DATA_DIR`] unless a member is there already). Without an
/// operator image, or with a snapshot the Pod cannot reach, this is an error.
///
/// The planes `spec.tls` asks for are served over HTTPS with their certificates mounted
/// read-only from their Secrets (see [`super::tls`]); the Pod then carries
/// [`TLS_ANNOTATION`].
///
/// The Pod carries [`TEMPLATE_HASH_ANNOTATION`]: the hash of the member template it was built
/// from, compared by the template roll.
pub fn build_pod(
    cluster: &ClusterRef,
    spec: &ValidatedCluster,
    member: &str,
    config: &MemberConfig,
    operator_image: Option<&str>,
    force_new_cluster: bool,
) -> Result<Pod, ResourceError> {
    let mut pod = render_pod(cluster, spec, member, config, operator_image, force_new_cluster)?;
    if let Some(hash) = template_hash(cluster, spec) {
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(TEMPLATE_HASH_ANNOTATION.to_owned(), hash);
    }
    Ok(pod)
}

/// The hash of the member template `spec` renders to in Kubernetes: the Pod of a placeholder
/// member (fixed name, start configuration and version), so everything but per-member identity
/// and the etcd version counts: `spec.podTemplate` (labels, annotations, resources,
/// scheduling), `spec.repository`, the etcd flags of the spec (maintenance, quota, TLS), and the
/// operator's own Pod layout (probes, security context), so that an operator upgrade that
/// changes the layout rolls the members onto it too.
pub fn template_hash(cluster: &ClusterRef, spec: &ValidatedCluster) -> Option<String> {
    let placeholder = render_pod(
        cluster,
        spec,
        crate::template::PLACEHOLDER_MEMBER,
        &crate::template::placeholder_config(),
        None,
        false,
    )
    .ok()?;
    crate::template::hash_of(&placeholder)
}

fn render_pod(
    cluster: &ClusterRef,
    spec: &ValidatedCluster,
    member: &str,
    config: &MemberConfig,
    operator_image: Option<&str>,
    force_new_cluster: bool,
) -> Result<Pod, ResourceError> {
    let mut labels = spec.pod.labels.clone();
    labels.extend(member_labels(cluster, member));
    let mut annotations = spec.pod.annotations.clone();
    annotations.insert(
        MEMBER_CONFIG_ANNOTATION.to_owned(),
        encode_config(member, config)?,
    );
    let planes = &spec.tls;
    let schemes = TlsSchemes::of(planes);
    if let Some(value) = schemes.annotation() {
        annotations.insert(TLS_ANNOTATION.to_owned(), value);
    }

    let PodTemplateSpec {
        resources,
        affinity,
        node_selector,
        tolerations,
        topology_spread_constraints,
        priority_class_name,
    } = spec.pod.spec.clone();
    let restore_source = config.restore.as_ref().and_then(|plan| {
        restore::source_claim(plan).map(|claim| Volume {
            name: RESTORE_SOURCE_VOLUME.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.to_owned(),
                read_only: Some(true),
            }),
            ..Volume::default()
        })
    });
    let init_containers = match &config.restore {
        Some(plan) => Some(
            restore_containers(
                member,
                peer_url_for(cluster, member, schemes),
                config,
                plan,
                operator_image,
                &spec.repository,
                resources.as_ref(),
            )
            .map_err(|source| ResourceError::Restore {
                member: member.to_owned(),
                source: Box::new(source),
            })?,
        ),
        None => None,
    };
    let has_cpu_limit = resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|limits| limits.contains_key("cpu"));

    let container = Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(spec.image(&config.version)),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(command(cluster, spec, member, config, force_new_cluster)),
        env: has_cpu_limit.then(|| vec![gomaxprocs()]),
        ports: Some(vec![
            container_port("client", CLIENT_PORT),
            container_port("peer", PEER_PORT),
            container_port("metrics", METRICS_PORT),
        ]),
        resources,
        volume_mounts: Some(
            std::iter::once(VolumeMount {
                name: DATA_VOLUME.to_owned(),
                mount_path: DATA_MOUNT_PATH.to_owned(),
                ..VolumeMount::default()
            })
            .chain(tls_mounts(planes))
            .collect(),
        ),
        startup_probe: Some(startup_probe(&config.version)),
        liveness_probe: Some(liveness_probe(&config.version)),
        readiness_probe: Some(readiness_probe(&config.version)),
        security_context: Some(container_security_context()),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };

    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(member.to_owned()),
            namespace: Some(cluster.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_reference(cluster)]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            hostname: Some(member.to_owned()),
            subdomain: Some(naming::peer_service_name(&cluster.name)),
            init_containers,
            containers: vec![container],
            volumes: Some(
                std::iter::once(data_volume(spec, member))
                    .chain(tls_volumes(planes, member))
                    .chain(restore_source)
                    .collect(),
            ),
            restart_policy: Some("Always".to_owned()),
            enable_service_links: Some(false),
            automount_service_account_token: Some(false),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            security_context: Some(pod_security_context()),
            affinity: Some(affinity.unwrap_or_else(|| default_affinity(cluster))),
            node_selector,
            tolerations,
            topology_spread_constraints,
            priority_class_name,
            ..PodSpec::default()
        }),
        status: None,
    })
}

/// `etcd` and its flags ([`crate::etcd_args::etcd_args`]). A plane with TLS listens and
/// advertises `https://` with its certificates from the mounted Secret; the metrics and health
/// port stays plain HTTP, so the probes work whatever the planes use.
fn command(
    cluster: &ClusterRef,
    spec: &ValidatedCluster,
    member: &str,
    config: &MemberConfig,
    force_new_cluster: bool,
) -> Vec<String> {
    let planes = &spec.tls;
    let schemes = TlsSchemes::of(planes);
    let launch = crate::etcd_args::MemberLaunch {
        name: member,
        config,
        data_dir: DATA_DIR.to_owned(),
        listen_peer_url: format!("{}://0.0.0.0:{PEER_PORT}", planes.peer_scheme()),
        advertise_peer_url: peer_url_for(cluster, member, schemes),
        listen_client_url: format!("{}://0.0.0.0:{CLIENT_PORT}", planes.client_scheme()),
        advertise_client_url: client_url_for(cluster, member, schemes),
        listen_metrics_url: Some(format!("http://0.0.0.0:{METRICS_PORT}")),
        client_tls: tls_files(planes, Plane::Client),
        peer_tls: tls_files(planes, Plane::Peer),
        force_new_cluster,
    };
    std::iter::once("etcd".to_owned())
        .chain(crate::etcd_args::etcd_args(spec, &launch))
        .collect()
}

/// The init containers restoring a member from `plan` (see [`build_pod`]).
fn restore_containers(
    member: &str,
    own_peer_url: String,
    config: &MemberConfig,
    plan: &RestorePlan,
    operator_image: Option<&str>,
    repository: &str,
    resources: Option<&ResourceRequirements>,
) -> Result<Vec<Container>, RestoreError> {
    let operator_image = operator_image
        .filter(|i| !i.is_empty())
        .ok_or(RestoreError::OperatorImageUnknown(OPERATOR_IMAGE_ENV))?;
    restore::check_reachable_from_pod(plan)?;
    let plan_json = serde_json::to_string(plan)
        .map_err(|e| RestoreError::Source(format!("encode the restore plan: {e}")))?;
    let mounts = Some(vec![VolumeMount {
        name: DATA_VOLUME.to_owned(),
        mount_path: DATA_MOUNT_PATH.to_owned(),
        ..VolumeMount::default()
    }]);
    let base = Container {
        image_pull_policy: Some("IfNotPresent".to_owned()),
        resources: resources.cloned(),
        volume_mounts: mounts,
        security_context: Some(container_security_context()),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut fetch = Container {
        name: RESTORE_FETCH_CONTAINER.to_owned(),
        image: Some(operator_image.to_owned()),
        args: Some(strings(&[
            "fetch-snapshot",
            "--plan",
            &plan_json,
            "--data-dir",
            DATA_DIR,
            "--snapshot",
            RESTORE_SNAPSHOT,
            "--staging",
            RESTORE_STAGING,
        ])),
        env: s3_credentials_env(plan),
        ..base.clone()
    };
    // A snapshot on a claim: the claim mounted read-only, read as a directory.
    if restore::source_claim(plan).is_some() {
        fetch
            .args
            .get_or_insert_with(Vec::new)
            .extend(strings(&["--claim-dir", restore::RESTORE_SOURCE_MOUNT]));
        fetch
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: RESTORE_SOURCE_VOLUME.to_owned(),
                mount_path: restore::RESTORE_SOURCE_MOUNT.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
    }
    let (program, needs_api) = restore::tool_program(&config.version);
    let restore_member = RestoreMember {
        name: member.to_owned(),
        peer_url: own_peer_url,
        initial_cluster: config.initial_cluster_flag(),
        cluster_token: config.cluster_token.clone(),
    };
    let mut command = vec![program.to_owned()];
    command.extend(restore::restore_args(
        RESTORE_SNAPSHOT,
        &restore_member,
        RESTORE_STAGING,
    ));
    let tool = Container {
        name: RESTORE_TOOL_CONTAINER.to_owned(),
        image: Some(format!("{repository}:v{}", config.version)),
        command: Some(command),
        env: needs_api.then(|| {
            vec![EnvVar {
                name: "ETCDCTL_API".to_owned(),
                value: Some("3".to_owned()),
                ..EnvVar::default()
            }]
        }),
        ..base.clone()
    };
    let finish = Container {
        name: RESTORE_FINISH_CONTAINER.to_owned(),
        image: Some(operator_image.to_owned()),
        args: Some(strings(&[
            "finish-restore",
            "--data-dir",
            DATA_DIR,
            "--staging",
            RESTORE_STAGING,
        ])),
        ..base
    };
    Ok(vec![fetch, tool, finish])
}

/// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` from the destination's `credentialsSecret`,
/// when the snapshot is in an S3 destination that names one.
fn s3_credentials_env(plan: &RestorePlan) -> Option<Vec<EnvVar>> {
    let SnapshotSource::Store { destination, .. } = &plan.source else {
        return None;
    };
    let secret = destination.s3.as_ref()?.credentials_secret.as_deref()?;
    Some(
        ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
            .into_iter()
            .map(|key| EnvVar {
                name: key.to_owned(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: secret.to_owned(),
                        key: key.to_owned(),
                        optional: Some(false),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            })
            .collect(),
    )
}

/// `GOMAXPROCS` from the CPU limit, rounded up to whole cores (divisor 1).
fn gomaxprocs() -> EnvVar {
    EnvVar {
        name: "GOMAXPROCS".to_owned(),
        value_from: Some(EnvVarSource {
            resource_field_ref: Some(ResourceFieldSelector {
                container_name: Some(CONTAINER_NAME.to_owned()),
                resource: "limits.cpu".to_owned(),
                divisor: Some(Quantity("1".to_owned())),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: port,
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

/// A probe on the metrics port (plain HTTP even when the client and peer planes use TLS).
fn http_probe(path: &str, period: i32, timeout: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(METRICS_PORT),
            scheme: Some("HTTP".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(timeout),
        failure_threshold: Some(failures),
        success_threshold: Some(1),
        ..Probe::default()
    }
}

/// Startup: up to 5 minutes to replay the WAL and load the backend before liveness applies.
fn startup_probe(version: &str) -> Probe {
    http_probe(probes_for(version).liveness, 10, 15, 30)
}

/// Liveness: restart only a member that stays broken for 80 s.
fn liveness_probe(version: &str) -> Probe {
    http_probe(probes_for(version).liveness, 10, 15, 8)
}

/// Readiness: whether the member serves (in the client Service, counted by the PDB).
fn readiness_probe(version: &str) -> Probe {
    http_probe(probes_for(version).readiness, 5, 5, 3)
}

fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        ..SecurityContext::default()
    }
}

/// The `restricted` Pod Security Standard: non-root 65532, RuntimeDefault seccomp; `fsGroup` so
/// the data volume is writable.
fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS_ID),
        run_as_group: Some(RUN_AS_ID),
        fs_group: Some(RUN_AS_ID),
        fs_group_change_policy: Some("OnRootMismatch".to_owned()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    }
}

/// Soft anti-affinity: prefer nodes that run no other member of the cluster.
fn default_affinity(cluster: &ClusterRef) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                weight: ANTI_AFFINITY_WEIGHT,
                pod_affinity_term: PodAffinityTerm {
                    label_selector: Some(LabelSelector {
                        match_labels: Some(selector_labels(cluster)),
                        match_expressions: None,
                    }),
                    topology_key: HOSTNAME_TOPOLOGY_KEY.to_owned(),
                    ..PodAffinityTerm::default()
                },
            }]),
            required_during_scheduling_ignored_during_execution: None,
        }),
        ..Affinity::default()
    }
}

/// The member's PVC, or for `medium: Memory` a tmpfs emptyDir limited to the storage size.
fn data_volume(spec: &ValidatedCluster, member: &str) -> Volume {
    let storage = spec.storage.clone();
    match storage.medium {
        Some(StorageMedium::Memory) => Volume {
            name: DATA_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_owned()),
                size_limit: storage.size,
            }),
            ..Volume::default()
        },
        _ => Volume {
            name: DATA_VOLUME.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: naming::member_pvc_name(member),
                read_only: None,
            }),
            ..Volume::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::InitialState;

    fn restored(version: &str, source: SnapshotSource) -> (ClusterRef, ValidatedCluster, MemberConfig) {
        let cluster = ClusterRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
        };
        let view = ValidatedCluster::for_test(etcd_operator_api::v1alpha2::EtcdCluster::new(
            "c",
            "ns",
            Default::default(),
        ));
        let config = MemberConfig {
            version: version.into(),
            initial_cluster: vec![("c-a".into(), crate::resources::peer_url(&cluster, "c-a"))],
            initial_state: crate::model::InitialState::New,
            cluster_token: "u".into(),
            previous_version: None,
            restore: Some(RestorePlan {
                source,
                expected_sha256: None,
            }),
        };
        (cluster, view, config)
    }

    #[test]
    fn the_template_hash_follows_the_template_not_the_member_or_its_version() {
        let (cluster, view, config) = restored("3.5.21", SnapshotSource::Url("http://x/s.db".into()));
        let hash = template_hash(&cluster, &view);
        assert!(hash.is_some());
        // Every member's Pod carries the same hash, whatever its name, version or restore.
        let pod_hash = |member: &str, config: &MemberConfig| {
            build_pod(&cluster, &view, member, config, Some("op:1"), false)
                .ok()
                .and_then(|p| p.metadata.annotations)
                .and_then(|a| a.get(TEMPLATE_HASH_ANNOTATION).cloned())
        };
        let mut other = config.clone();
        other.version = "3.6.4".into();
        other.restore = None;
        assert_eq!(pod_hash("c-a", &config), hash);
        assert_eq!(pod_hash("c-b", &other), hash);
        // Resources, labels, the repository and the etcd flags change it.
        let mut resources = view.clone();
        resources.pod.spec.resources = Some(ResourceRequirements {
            limits: Some([("memory".to_owned(), Quantity("1Gi".into()))].into()),
            ..ResourceRequirements::default()
        });
        let mut labels = view.clone();
        labels.pod.labels.insert("team".into(), "a".into());
        let mut repository = view.clone();
        repository.repository = "registry.example/etcd".into();
        let mut quota = view.clone();
        quota.quota_backend_bytes += 1;
        quota.maintenance_flags.push("--quota-backend-bytes=1".into());
        for changed in [&resources, &labels, &repository, &quota] {
            assert_ne!(template_hash(&cluster, changed), hash);
        }
        // A version change alone does not (the version roll re-creates the members).
        let mut version = view.clone();
        version.version = "3.6.4".into();
        assert_eq!(template_hash(&cluster, &version), hash);
    }

    #[test]
    fn a_restored_34_member_uses_etcdctl_and_a_url_needs_no_keys() {
        let (cluster, view, config) = restored("3.4.23", SnapshotSource::Url("https://x/s.db".into()));
        assert_eq!(config.initial_state, InitialState::New);
        let pod = build_pod(&cluster, &view, "c-a", &config, Some("op:1"), false).unwrap();
        let init = pod.spec.unwrap().init_containers.unwrap();
        let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["restore-fetch", "restore", "restore-finish"]);
        assert_eq!(init[0].env, None);
        assert_eq!(
            init[1].image.as_deref(),
            Some("gcr.io/etcd-development/etcd:v3.4.23")
        );
        let command = init[1].command.clone().unwrap();
        assert_eq!(command[..3], ["etcdctl", "snapshot", "restore"]);
        assert_eq!(
            init[1].env.as_ref().unwrap()[0].value.as_deref(),
            Some("3"),
            "ETCDCTL_API=3"
        );
        assert_eq!(init[2].image.as_deref(), Some("op:1"));
    }

    #[test]
    fn a_restore_without_operator_image_or_from_a_host_directory_is_an_error() {
        let (cluster, view, config) = restored("3.5.21", SnapshotSource::Url("https://x/s.db".into()));
        for image in [None, Some("")] {
            let err = build_pod(&cluster, &view, "c-a", &config, image, false).unwrap_err();
            assert!(
                matches!(&err, ResourceError::Restore { source, .. } if matches!(**source, RestoreError::OperatorImageUnknown(OPERATOR_IMAGE_ENV))),
                "{err}"
            );
        }
        let volume = SnapshotSource::Store {
            destination: etcd_operator_api::v1alpha2::BackupDestination {
                s3: None,
                volume: Some(etcd_operator_api::v1alpha2::VolumeDestination {
                    path: None,
                    claim_name: Some("b".into()),
                }),
            },
            key: "k.db".into(),
        };
        // A claim in the cluster's namespace: mounted read-only into the fetch step only.
        let (cluster, view, config) = restored("3.5.21", volume);
        let pod = build_pod(&cluster, &view, "c-a", &config, Some("op:1"), false).unwrap();
        let spec = pod.spec.unwrap();
        let source = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == RESTORE_SOURCE_VOLUME)
            .and_then(|v| v.persistent_volume_claim.clone())
            .unwrap();
        assert_eq!((source.claim_name.as_str(), source.read_only), ("b", Some(true)));
        let inits = spec.init_containers.unwrap();
        let fetch = &inits[0];
        assert!(
            fetch
                .args
                .as_ref()
                .unwrap()
                .ends_with(&["--claim-dir".to_owned(), restore::RESTORE_SOURCE_MOUNT.to_owned()])
        );
        assert!(
            fetch
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == RESTORE_SOURCE_VOLUME && m.read_only == Some(true))
        );
        assert!(
            inits[1..].iter().chain(&spec.containers).all(|c| c
                .volume_mounts
                .iter()
                .flatten()
                .all(|m| m.name != RESTORE_SOURCE_VOLUME)),
            "only the fetch step mounts the source"
        );
        // A directory on the operator's host: no member Pod can reach it.
        let host = SnapshotSource::Store {
            destination: etcd_operator_api::v1alpha2::BackupDestination {
                s3: None,
                volume: Some(etcd_operator_api::v1alpha2::VolumeDestination {
                    path: Some("/var/b".into()),
                    claim_name: None,
                }),
            },
            key: "k.db".into(),
        };
        let (cluster, view, config) = restored("3.5.21", host);
        let err = build_pod(&cluster, &view, "c-a", &config, Some("op:1"), false).unwrap_err();
        assert!(
            matches!(&err, ResourceError::Restore { source, .. } if matches!(**source, RestoreError::Unreachable(_))),
            "{err}"
        );
        // Without a restore plan, no init containers and no image needed.
        let (cluster, view, mut config) = restored("3.5.21", SnapshotSource::Url("u".into()));
        config.restore = None;
        let pod = build_pod(&cluster, &view, "c-a", &config, None, false).unwrap();
        assert_eq!(pod.spec.unwrap().init_containers, None);
    }

    #[test]
    fn probe_paths_follow_the_version() {
        let modern = Probes {
            liveness: "/livez",
            readiness: "/readyz",
        };
        let legacy = Probes {
            liveness: "/health?serializable=true",
            readiness: "/health",
        };
        for (version, expected) in [
            ("3.4.28", legacy),
            ("3.4.29", modern),
            ("3.5.1", legacy),
            ("3.5.10", legacy),
            ("3.5.11", modern),
            ("3.5.21", modern),
            ("3.6.0", modern),
            ("not-a-version", legacy),
        ] {
            assert_eq!(probes_for(version), expected, "{version}");
        }
    }
}
