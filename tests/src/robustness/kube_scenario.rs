//! The robustness scenario on the kubernetes runtime: `etcd-operator local --member-kubeconfig`
//! runs a 3-member EtcdCluster as Pods in the in-memory Kubernetes API, and the test node agent
//! runs them as real etcd processes. Under the same recorded load and watch as the local
//! scenario, the faults that fit there hit one after another:
//!
//! - a member's container SIGKILLed (the agent starts it again with the kubelet's back-off);
//! - a member's container frozen with SIGSTOP;
//! - a member's Pod deleted (the operator creates it again on the member's PVC: same member,
//!   same data);
//! - the operator killed.
//!
//! After each fault the cluster must be back at its spec; at the end come every check of the
//! local scenario. Partitions and full disks stay local-mode faults: the agent gives members
//! loopback addresses of their own with no proxy between them, and its volumes are plain
//! directories.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::RobustnessError;
use super::faults::{self, FaultKind, Frozen};
use super::recorded::Recorded;
use super::report::Report;
use super::scenario::{CLUSTER, ScenarioConfig, at_spec, phase_watchdog, pick_ms, recover};
use crate::node_agent::KubeRuntime;

/// The version the members run (one the node agent has binaries of).
pub const VERSION: &str = "3.5.16";

/// The pid of member `name`'s container.
fn container_pid(rt: &KubeRuntime, name: &str) -> Result<u32, RobustnessError> {
    rt.agent
        .pid("default", name)
        .filter(|pid| crate::leftovers::is_running(*pid))
        .ok_or_else(|| RobustnessError::NoProcess {
            member: name.to_string(),
        })
}

/// How long a member may go without a running container before a fault on it fails the run:
/// the kubelet's restart back-off, and a deleted Pod's re-creation and start.
const CONTAINER_WAIT: Duration = Duration::from_secs(60);

/// The pid of member `name`'s container once one runs that is not `not` (the container a fault
/// just killed or whose Pod it deleted). A member between containers (in the kubelet's back-off,
/// or its Pod being created again) is waited for: a fault is only injected into a running
/// member, and the recovery is only timed once the fault took effect.
async fn running_container(rt: &KubeRuntime, name: &str, not: Option<u32>) -> Result<u32, RobustnessError> {
    let began = Instant::now();
    loop {
        match container_pid(rt, name) {
            Ok(pid) if Some(pid) != not => return Ok(pid),
            Ok(_) | Err(_) if began.elapsed() < CONTAINER_WAIT => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(_) => {
                return Err(RobustnessError::Timeout {
                    what: format!("a new container of member {name}"),
                    timeout: CONTAINER_WAIT,
                });
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs the scenario on a started kubernetes runtime (in its private mount namespace).
#[allow(clippy::print_stdout)]
pub async fn run(rt: &mut KubeRuntime, config: ScenarioConfig) -> Result<Report, RobustnessError> {
    let run_began = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed);
    println!(
        "robustness (kubernetes runtime): seed {} ({}={} replays it), {} faults of {:?}",
        config.seed,
        super::scenario::SEED_ENV,
        config.seed,
        config.faults,
        config.kinds.iter().map(|k| k.name()).collect::<Vec<_>>()
    );
    let manifest = format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {CLUSTER}\n  namespace: default\nspec:\n  replicas: 3\n  version: {VERSION}\n"
    );
    tokio::task::block_in_place(|| crate::kubectl::apply(&rt.op, &manifest))
        .map_err(RobustnessError::Apply)?;
    let began = Instant::now();
    while !at_spec(&rt.op, 3).await {
        if began.elapsed() > Duration::from_secs(180) {
            return Err(RobustnessError::Timeout {
                what: format!(
                    "3 members through the node agent; operator log:\n{}",
                    rt.op.log_tail()
                ),
                timeout: Duration::from_secs(180),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let status = tokio::task::block_in_place(|| crate::kubectl::status(&rt.op, "ec", CLUSTER))
        .map_err(RobustnessError::Apply)?;
    let endpoints = crate::kubectl::client_endpoints(&status);
    let initial = faults::membership(&endpoints).await?;
    println!(
        "robustness: cluster up after {:.1}s: members {:?}, leader {}",
        run_began.elapsed().as_secs_f64(),
        initial.members.values().collect::<Vec<_>>(),
        initial.leader_name().unwrap_or("?")
    );
    let sampler = super::status::StatusSampler::start(rt.op.kubeconfig(), CLUSTER);
    let recorded = Recorded::start(&endpoints, config.load.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut report = Report {
        seed: config.seed,
        ..Report::default()
    };
    let pods: Api<Pod> = Api::namespaced(
        rt.kube_api
            .client()
            .map_err(|source| RobustnessError::DeletePod {
                pod: "(no client)".into(),
                source,
            })?,
        "default",
    );
    let mut failure = None;
    for i in 0..config.faults {
        let Some(kind) = config.kinds.choose(&mut rng).copied() else {
            break;
        };
        let membership = match faults::membership_retrying(&endpoints, Duration::from_secs(10)).await {
            Ok(m) => m,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let follower = membership
            .followers()
            .choose(&mut rng)
            .map(|s| s.to_string())
            .unwrap_or_default();
        let leader = membership.leader_name().unwrap_or_default().to_string();
        let any = if rng.random_bool(0.5) {
            leader.clone()
        } else {
            follower.clone()
        };
        // Under the local scenario's watchdog: whatever an injection awaits (a Pod delete, the
        // operator's restart), the run never hangs silently.
        let limit = phase_watchdog(&config);
        let injection = async {
            match kind {
                FaultKind::FreezeFollower | FaultKind::FreezeLeader => {
                    let member = if kind == FaultKind::FreezeLeader {
                        leader
                    } else {
                        follower
                    };
                    let held = pick_ms(&mut rng, &config.freeze_ms);
                    let frozen = Frozen::freeze(running_container(rt, &member, None).await?)?;
                    tokio::time::sleep(held).await;
                    frozen.thaw()?;
                    Ok((member, held))
                }
                FaultKind::KillFollower | FaultKind::KillLeader => {
                    let member = if kind == FaultKind::KillLeader {
                        leader
                    } else {
                        follower
                    };
                    let pid = running_container(rt, &member, None).await?;
                    faults::sigkill(pid)?;
                    running_container(rt, &member, Some(pid)).await?;
                    Ok((member, Duration::ZERO))
                }
                FaultKind::KillOperator => {
                    let down = pick_ms(&mut rng, &config.operator_down_ms);
                    rt.op.crash();
                    tokio::time::sleep(down).await;
                    rt.op.start_again().await?;
                    Ok(("operator".into(), down))
                }
                FaultKind::DeletePod => {
                    let pid = running_container(rt, &any, None).await?;
                    pods.delete(&any, &DeleteParams::default())
                        .await
                        .map_err(|source| RobustnessError::DeletePod {
                            pod: any.clone(),
                            source,
                        })?;
                    // The status may still say "at spec" until the operator saw the delete:
                    // recovery is timed from the member's new container.
                    running_container(rt, &any, Some(pid)).await?;
                    Ok((any, Duration::ZERO))
                }
                other => Err(RobustnessError::NotInThisRuntime { kind: other }),
            }
        };
        let injected: Result<(String, Duration), RobustnessError> =
            tokio::time::timeout(limit, injection).await.unwrap_or_else(|_| {
                Err(RobustnessError::Timeout {
                    what: format!("injecting {kind}"),
                    timeout: limit,
                })
            });
        let (target, held) = match injected {
            Ok(t) => t,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        if let Err(e) = recover(&rt.op, &mut report, &config, (i, kind, &target, held)).await {
            failure = Some(e);
            break;
        }
        // Every fault here keeps each member's data (a deleted Pod comes back on its PVC): the
        // member IDs stay as they were.
        if let Ok(now) = faults::membership(&endpoints).await
            && now.members != initial.members
        {
            report.findings.push(format!(
                "after fault {i} ({kind} of {target}, seed {}) the members changed: {:?} -> {:?}",
                config.seed, initial.members, now.members
            ));
            if kind.only_pauses() {
                report.wrongful_removals += 1;
            }
        }
        tokio::time::sleep(pick_ms(&mut rng, &config.pause_ms)).await;
    }
    recorded.finish(&endpoints, &mut report).await?;
    // Events tell what the status told: each Degraded reason the status carried during the run
    // is a Warning Event on the EtcdCluster.
    let samples = sampler.samples();
    if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
        report.degraded_reasons = super::status::degraded_reasons(&samples, first.at, last.at);
    }
    let events = rt.kube_api.objects("events");
    report.findings.extend(super::status::events_missing(
        &report.degraded_reasons,
        &events,
        CLUSTER,
    ));
    report.elapsed = run_began.elapsed();
    if let Some(e) = failure {
        println!("{}", report.figures());
        return Err(e);
    }
    Ok(report)
}

/// Starts the kubernetes runtime for the scenario (boxed error: the runtime's is large).
pub async fn start(hosts: std::path::PathBuf) -> Result<KubeRuntime, RobustnessError> {
    KubeRuntime::start(hosts)
        .await
        .map_err(|e| RobustnessError::KubeRuntime(Box::new(e)))
}
