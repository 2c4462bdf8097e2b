//! The Pod of one etcd member: named after the member, reachable as
//! `<member>.<peer-service>.<namespace>.svc`, data on its PVC (or a tmpfs emptyDir for
//! `medium: Memory`), restricted security context, soft anti-affinity and the podTemplate applied.

use std::collections::BTreeMap;

use etcd_operator_api::defaults::effective_storage;
use etcd_operator_api::naming;
use etcd_operator_api::v1alpha2::{DEFAULT_REPOSITORY, PodTemplateSpec, StorageMedium};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, Probe, ResourceFieldSelector, SeccompProfile, SecurityContext, Volume,
    VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    CLIENT_PORT, CONTAINER_NAME, DATA_DIR, DATA_MOUNT_PATH, DATA_VOLUME, MEMBER_CONFIG_ANNOTATION,
    METRICS_PORT, PEER_PORT, RUN_AS_ID, ResourceError, TERMINATION_GRACE_SECONDS, client_url, encode_config,
    member_labels, owner_reference, peer_url, selector_labels,
};
use crate::model::{ClusterRef, MemberConfig};
use crate::runtime::ClusterSpecView;

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
pub fn build_pod(
    cluster: &ClusterRef,
    spec: &ClusterSpecView,
    member: &str,
    config: &MemberConfig,
) -> Result<Pod, ResourceError> {
    let cluster_spec = &spec.cluster.spec;
    let template = cluster_spec.pod_template.as_ref();
    let template_meta = template.and_then(|t| t.metadata.as_ref());
    let template_spec = template.and_then(|t| t.spec.clone()).unwrap_or_default();

    let mut labels: BTreeMap<String, String> =
        template_meta.and_then(|m| m.labels.clone()).unwrap_or_default();
    labels.extend(member_labels(cluster, member));
    let mut annotations: BTreeMap<String, String> = template_meta
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    annotations.insert(
        MEMBER_CONFIG_ANNOTATION.to_owned(),
        encode_config(member, config)?,
    );

    let repository = cluster_spec.repository.as_deref().unwrap_or(DEFAULT_REPOSITORY);
    let PodTemplateSpec {
        resources,
        affinity,
        node_selector,
        tolerations,
        topology_spread_constraints,
        priority_class_name,
    } = template_spec;
    let has_cpu_limit = resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|limits| limits.contains_key("cpu"));

    let container = Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(format!("{repository}:v{}", config.version)),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(command(cluster, member, config)),
        env: has_cpu_limit.then(|| vec![gomaxprocs()]),
        ports: Some(vec![
            container_port("client", CLIENT_PORT),
            container_port("peer", PEER_PORT),
            container_port("metrics", METRICS_PORT),
        ]),
        resources,
        volume_mounts: Some(vec![VolumeMount {
            name: DATA_VOLUME.to_owned(),
            mount_path: DATA_MOUNT_PATH.to_owned(),
            ..VolumeMount::default()
        }]),
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
            containers: vec![container],
            volumes: Some(vec![data_volume(spec, member)]),
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

/// `etcd` and its flags; every URL is plain HTTP.
fn command(cluster: &ClusterRef, member: &str, config: &MemberConfig) -> Vec<String> {
    vec![
        "etcd".to_owned(),
        format!("--name={member}"),
        format!("--data-dir={DATA_DIR}"),
        format!("--listen-peer-urls=http://0.0.0.0:{PEER_PORT}"),
        format!("--listen-client-urls=http://0.0.0.0:{CLIENT_PORT}"),
        format!("--advertise-client-urls={}", client_url(cluster, member)),
        format!("--initial-advertise-peer-urls={}", peer_url(cluster, member)),
        format!("--initial-cluster={}", config.initial_cluster_flag()),
        format!("--initial-cluster-state={}", config.initial_state.as_str()),
        format!("--initial-cluster-token={}", config.cluster_token),
        format!("--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}"),
    ]
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
fn data_volume(spec: &ClusterSpecView, member: &str) -> Volume {
    let storage = effective_storage(&spec.cluster.spec);
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
