//! The planner: from the desired spec and what the runtime and etcd report, the ONE next safe
//! step. Pure: no I/O, so every decision is tested without processes or sockets.
//!
//! Rules (from what went wrong for other operators):
//! - a new, empty cluster bootstraps all members together (static bootstrap); a bootstrap that
//!   does not form a cluster in time is wiped and retried, since nothing can be lost yet;
//! - members join a running cluster one at a time as learners and are promoted once caught up;
//!   never more than one learner;
//! - scale-down removes a non-leader first and moves leadership away before removing a leader;
//! - a dead member is removed from etcd and replaced by a fresh one;
//! - nothing that removes a voter happens unless the remaining healthy voters keep quorum.

use std::time::Duration;

use crate::model::{
    EtcdMember, EtcdView, InitialState, Liveness, MemberConfig, RuntimeMember, is_healthy, quorum,
};

/// What the user asked for, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Voting members wanted.
    pub replicas: usize,
    /// etcd version for new members.
    pub version: String,
    /// `--initial-cluster-token` for a bootstrap.
    pub cluster_token: String,
    /// Whether the cluster ever formed (status.clusterID was recorded): from then on its data
    /// must never be wiped.
    pub formed_before: bool,
    /// `spec.paused`.
    pub paused: bool,
}

/// Timing facts the planner compares against thresholds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Timing {
    /// How long the current bootstrap has been waiting for a cluster to form.
    pub bootstrap_waiting: Option<Duration>,
    /// How long each member (by name) has been unhealthy while running.
    pub unhealthy_for: Vec<(String, Duration)>,
}

/// Thresholds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thresholds {
    /// A bootstrap that has not formed a cluster after this long is wiped and retried.
    pub bootstrap_timeout: Duration,
    /// A running member unhealthy for this long is replaced.
    pub unhealthy_timeout: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            bootstrap_timeout: Duration::from_secs(60),
            unhealthy_timeout: Duration::from_secs(120),
        }
    }
}

/// Everything observed in one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Members the runtime holds.
    pub runtime: Vec<RuntimeMember>,
    /// The cluster as etcd reports it; `None` when no member answered.
    pub etcd: Option<EtcdView>,
    /// Timings.
    pub timing: Timing,
}

/// The next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Reserve these members (addresses, storage) for a static bootstrap.
    ReserveForBootstrap {
        /// New member names.
        names: Vec<String>,
    },
    /// Start members with their configuration (bootstrap members, or a learner already added).
    Start {
        /// (member, configuration) pairs.
        members: Vec<(String, MemberConfig)>,
    },
    /// Reserve a member that will join as a learner.
    ReserveForJoin {
        /// The new member's name.
        name: String,
    },
    /// Add a reserved member to etcd as a learner.
    AddLearner {
        /// Member name.
        name: String,
        /// Its peer URL.
        peer_url: String,
    },
    /// Promote a caught-up learner.
    Promote {
        /// Member ID.
        id: u64,
        /// Member name.
        name: String,
    },
    /// Move leadership away from a member that is about to be removed.
    MoveLeader {
        /// Current leader.
        from: u64,
        /// New leader.
        to: u64,
    },
    /// Remove a member from etcd (scale-down or replacement); the runtime member goes next.
    RemoveFromEtcd {
        /// Member ID.
        id: u64,
        /// Member name (may be empty for a member that never started).
        name: String,
        /// Why.
        reason: String,
    },
    /// Stop and delete a runtime member that is not (or no longer) part of etcd.
    DeleteRuntimeMember {
        /// Member name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Delete every member: a bootstrap that never formed a cluster, retried from scratch.
    WipeBootstrap {
        /// Why.
        reason: String,
    },
    /// Nothing safe to do now; check again soon.
    Wait {
        /// Why, for status.
        reason: String,
    },
    /// Nothing to do: the cluster matches the spec.
    Idle,
}

impl Step {
    /// Whether the step changes anything.
    pub fn is_action(&self) -> bool {
        !matches!(self, Step::Wait { .. } | Step::Idle)
    }
}

fn runtime_for<'a>(observed: &'a Observed, member: &EtcdMember) -> Option<&'a RuntimeMember> {
    observed
        .runtime
        .iter()
        .find(|r| member.peer_urls.contains(&r.peer_url))
}

/// Decides the next step. `new_names` yields fresh member names (the caller guarantees they
/// are unused).
pub fn plan(
    desired: &Desired,
    observed: &Observed,
    thresholds: &Thresholds,
    new_names: &mut dyn FnMut() -> String,
) -> Step {
    if desired.paused {
        return Step::Wait {
            reason: "spec.paused is true: no changes are made".into(),
        };
    }
    // No answer, or members that answer but never elected a leader in a cluster that never
    // formed: a bootstrap in progress (or to retry).
    let Some(etcd) = observed
        .etcd
        .as_ref()
        .filter(|v| v.leader != 0 || desired.formed_before)
    else {
        return plan_without_etcd(desired, observed, thresholds, new_names);
    };

    // 1. Runtime members that etcd does not know: pending joins, or leftovers of a removal.
    let learners: Vec<&EtcdMember> = etcd.members.iter().filter(|m| m.learner).collect();
    for r in &observed.runtime {
        if etcd.by_peer_url(&r.peer_url).is_some() {
            continue;
        }
        match (&r.config, &r.liveness) {
            // Reserved for a join and not added yet: add it (one learner at a time).
            (None, Liveness::Reserved) if learners.is_empty() => {
                return Step::AddLearner {
                    name: r.name.clone(),
                    peer_url: r.peer_url.clone(),
                };
            }
            (None, Liveness::Reserved) => {}
            // Configured but not a member: removed from etcd, or a bootstrap member of a cluster
            // that formed without it. Either way it can never join with that configuration.
            _ => {
                return Step::DeleteRuntimeMember {
                    name: r.name.clone(),
                    reason: "not a member of the etcd cluster".into(),
                };
            }
        }
    }

    // 2. etcd members that have no runtime member: started elsewhere or lost their
    //    reservation. A never-started one can simply be removed; a voter only with quorum.
    for m in &etcd.members {
        if runtime_for(observed, m).is_none() {
            if can_remove(etcd, m) {
                return Step::RemoveFromEtcd {
                    id: m.id,
                    name: m.name.clone(),
                    reason: "no runtime member backs this etcd member".into(),
                };
            }
            return Step::Wait {
                reason: format!(
                    "etcd member {:x} has no runtime member, and removing it would cost quorum",
                    m.id
                ),
            };
        }
    }

    // 3. Members etcd knows whose runtime member has not started yet (a learner added before a
    //    crash, or a bootstrap member): start them.
    let mut to_start = Vec::new();
    for m in &etcd.members {
        if let Some(r) = runtime_for(observed, m)
            && r.liveness == Liveness::Reserved
        {
            let config = r
                .config
                .clone()
                .unwrap_or_else(|| join_config(desired, etcd, &r.name, &r.peer_url, observed));
            to_start.push((r.name.clone(), config));
        }
    }
    if !to_start.is_empty() {
        return Step::Start { members: to_start };
    }

    // 4. Dead members. One whose data survived (a crashed process, a deleted Pod on its volume)
    //    is started again, the way a kubelet restarts a container; one without data, or that
    //    stays unhealthy past the threshold, is replaced. Replacements go one at a time, and only
    //    when the healthy voters that remain keep quorum of the smaller cluster.
    let unhealthy_too_long = |name: &str| {
        observed
            .timing
            .unhealthy_for
            .iter()
            .find(|(n, d)| n == name && *d >= thresholds.unhealthy_timeout)
            .map(|(_, d)| *d)
    };
    for m in &etcd.members {
        let Some(r) = runtime_for(observed, m) else {
            continue;
        };
        if let (
            Liveness::Gone {
                restartable: true, ..
            },
            Some(config),
            None,
        ) = (&r.liveness, &r.config, unhealthy_too_long(&r.name))
        {
            return Step::Start {
                members: vec![(r.name.clone(), config.clone())],
            };
        }
    }
    for m in &etcd.members {
        let Some(r) = runtime_for(observed, m) else {
            continue;
        };
        let dead_reason = match &r.liveness {
            Liveness::Gone {
                reason,
                restartable: false,
            } => Some(format!("member {} is gone: {reason}", r.name)),
            Liveness::Gone {
                reason,
                restartable: true,
            } => unhealthy_too_long(&r.name)
                .map(|d| format!("member {} keeps failing ({reason}) for {}s", r.name, d.as_secs())),
            Liveness::Running if !is_healthy(m) => unhealthy_too_long(&r.name)
                .map(|d| format!("member {} has been unhealthy for {}s", r.name, d.as_secs())),
            _ => None,
        };
        if let Some(reason) = dead_reason {
            if can_remove(etcd, m) {
                // A leader that is still running but unhealthy hands over first.
                if m.id == etcd.leader
                    && let Some(to) = etcd.voters().find(|v| v.id != m.id && is_healthy(v))
                {
                    return Step::MoveLeader {
                        from: m.id,
                        to: to.id,
                    };
                }
                return Step::RemoveFromEtcd {
                    id: m.id,
                    name: r.name.clone(),
                    reason,
                };
            }
            return Step::Wait {
                reason: format!(
                    "{reason}; replacing it would cost quorum: restore quorum first (see the Degraded condition)"
                ),
            };
        }
    }

    // 5. A learner: promote when it is healthy (etcd refuses until it has caught up).
    if let Some(learner) = learners.first() {
        if is_healthy(learner) {
            return Step::Promote {
                id: learner.id,
                name: learner.name.clone(),
            };
        }
        return Step::Wait {
            reason: format!("learner {} is catching up", learner.name),
        };
    }

    // 6. Scale.
    let voters: Vec<&EtcdMember> = etcd.voters().collect();
    if voters.len() < desired.replicas {
        if etcd.healthy_voters() < voters.len() {
            return Step::Wait {
                reason: "waiting for every member to be healthy before adding one".into(),
            };
        }
        return Step::ReserveForJoin { name: new_names() };
    }
    if voters.len() > desired.replicas {
        if etcd.healthy_voters() < voters.len() {
            return Step::Wait {
                reason: "waiting for every member to be healthy before removing one".into(),
            };
        }
        // The newest non-leader goes first; if only the leader is left to remove, move
        // leadership to a healthy voter first.
        let victim = voters
            .iter()
            .rev()
            .find(|m| m.id != etcd.leader)
            .or_else(|| voters.last());
        let Some(victim) = victim else { return Step::Idle };
        if victim.id == etcd.leader {
            if let Some(to) = voters.iter().find(|m| m.id != victim.id && is_healthy(m)) {
                return Step::MoveLeader {
                    from: victim.id,
                    to: to.id,
                };
            }
            return Step::Wait {
                reason: "no healthy member to move leadership to".into(),
            };
        }
        return Step::RemoveFromEtcd {
            id: victim.id,
            name: victim.name.clone(),
            reason: "scale down".into(),
        };
    }
    if etcd.healthy_voters() < voters.len() {
        return Step::Wait {
            reason: "some members are not healthy yet".into(),
        };
    }
    Step::Idle
}

/// Whether removing `m` leaves enough healthy voters for quorum of the smaller cluster.
fn can_remove(etcd: &EtcdView, m: &EtcdMember) -> bool {
    if m.learner {
        return true;
    }
    let voters = etcd.voters().count();
    let healthy_after = etcd.voters().filter(|v| v.id != m.id && is_healthy(v)).count();
    voters > 1 && healthy_after >= quorum(voters - 1)
}

/// Configuration for a member joining the running cluster: current members (started ones by
/// name) plus itself.
fn join_config(
    desired: &Desired,
    etcd: &EtcdView,
    name: &str,
    peer_url: &str,
    observed: &Observed,
) -> MemberConfig {
    let mut initial: Vec<(String, String)> = etcd
        .members
        .iter()
        .filter_map(|m| {
            let url = m.peer_urls.first()?.clone();
            if url == peer_url {
                return None;
            }
            let member_name = if m.name.is_empty() {
                runtime_for(observed, m)
                    .map(|r| r.name.clone())
                    .unwrap_or_default()
            } else {
                m.name.clone()
            };
            Some((member_name, url))
        })
        .collect();
    initial.push((name.to_string(), peer_url.to_string()));
    MemberConfig {
        version: desired.version.clone(),
        initial_cluster: initial,
        initial_state: InitialState::Existing,
        cluster_token: desired.cluster_token.clone(),
    }
}

/// No member answers: a cluster to bootstrap, a bootstrap in progress, or a cluster without
/// quorum.
fn plan_without_etcd(
    desired: &Desired,
    observed: &Observed,
    thresholds: &Thresholds,
    new_names: &mut dyn FnMut() -> String,
) -> Step {
    let bootstrap_members: Vec<&RuntimeMember> = observed
        .runtime
        .iter()
        .filter(|r| {
            r.config
                .as_ref()
                .is_some_and(|c| c.initial_state == InitialState::New)
        })
        .collect();
    if observed.runtime.is_empty() {
        if desired.formed_before {
            return Step::Wait {
                reason: "the cluster formed before but no member exists any more: its data is lost; restore from a backup".into(),
            };
        }
        let names = (0..desired.replicas).map(|_| new_names()).collect();
        return Step::ReserveForBootstrap { names };
    }
    // Members reserved for a bootstrap but not configured yet: configure them all together.
    let unconfigured: Vec<&RuntimeMember> = observed.runtime.iter().filter(|r| r.config.is_none()).collect();
    if !desired.formed_before && bootstrap_members.is_empty() && !unconfigured.is_empty() {
        let initial: Vec<(String, String)> = observed
            .runtime
            .iter()
            .map(|r| (r.name.clone(), r.peer_url.clone()))
            .collect();
        let config = MemberConfig {
            version: desired.version.clone(),
            initial_cluster: initial,
            initial_state: InitialState::New,
            cluster_token: desired.cluster_token.clone(),
        };
        return Step::Start {
            members: observed
                .runtime
                .iter()
                .map(|r| (r.name.clone(), config.clone()))
                .collect(),
        };
    }
    // A bootstrap in progress: start whatever is not running, and wipe it if it never forms.
    let not_running: Vec<(String, MemberConfig)> = bootstrap_members
        .iter()
        .filter(|r| r.liveness != Liveness::Running)
        .filter_map(|r| Some((r.name.clone(), r.config.clone()?)))
        .collect();
    if !desired.formed_before
        && let Some(waited) = observed.timing.bootstrap_waiting
        && waited >= thresholds.bootstrap_timeout
    {
        return Step::WipeBootstrap {
            reason: format!(
                "the bootstrap did not form a cluster within {}s",
                thresholds.bootstrap_timeout.as_secs()
            ),
        };
    }
    if !not_running.is_empty() && !desired.formed_before {
        return Step::Start { members: not_running };
    }
    if desired.formed_before {
        return Step::Wait {
            reason: "no member answers: the cluster has lost quorum; start the stopped members or restore from a backup".into(),
        };
    }
    Step::Wait {
        reason: "waiting for the bootstrap to form a cluster".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MemberHealth;

    fn desired(replicas: usize) -> Desired {
        Desired {
            replicas,
            version: "3.5.1".into(),
            cluster_token: "tok".into(),
            formed_before: true,
            paused: false,
        }
    }

    fn url(name: &str) -> String {
        format!("http://{name}:2380")
    }

    fn runtime(name: &str, liveness: Liveness, state: Option<InitialState>) -> RuntimeMember {
        RuntimeMember {
            name: name.into(),
            peer_url: url(name),
            client_url: format!("http://{name}:2379"),
            config: state.map(|s| MemberConfig {
                version: "3.5.1".into(),
                initial_cluster: vec![(name.into(), url(name))],
                initial_state: s,
                cluster_token: "tok".into(),
            }),
            liveness,
        }
    }

    fn member(id: u64, name: &str, learner: bool, healthy: bool) -> EtcdMember {
        EtcdMember {
            id,
            name: name.into(),
            peer_urls: vec![url(name)],
            client_urls: vec![],
            learner,
            status: healthy.then(|| MemberHealth {
                version: "3.5.1".into(),
                raft_applied_index: 10,
                leader: 1,
                errors: vec![],
            }),
        }
    }

    fn running(names: &[&str]) -> Vec<RuntimeMember> {
        names
            .iter()
            .map(|n| runtime(n, Liveness::Running, Some(InitialState::New)))
            .collect()
    }

    fn view(members: Vec<EtcdMember>, leader: u64) -> Option<EtcdView> {
        Some(EtcdView {
            cluster_id: 7,
            members,
            leader,
        })
    }

    fn names() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("new{n}")
        }
    }

    fn run(d: &Desired, o: &Observed) -> Step {
        plan(d, o, &Thresholds::default(), &mut names())
    }

    #[test]
    fn an_empty_cluster_bootstraps_all_members_together() {
        let mut d = desired(3);
        d.formed_before = false;
        let o = Observed {
            runtime: vec![],
            etcd: None,
            timing: Timing::default(),
        };
        assert_eq!(
            run(&d, &o),
            Step::ReserveForBootstrap {
                names: vec!["new1".into(), "new2".into(), "new3".into()]
            }
        );

        // Reserved: configure and start all with the full initial cluster, state new.
        let o = Observed {
            runtime: vec![
                runtime("a", Liveness::Reserved, None),
                runtime("b", Liveness::Reserved, None),
            ],
            etcd: None,
            timing: Timing::default(),
        };
        let Step::Start { members } = run(&d, &o) else {
            panic!("expected start")
        };
        assert_eq!(members.len(), 2);
        assert_eq!(members[0].1.initial_state, InitialState::New);
        assert_eq!(
            members[0].1.initial_cluster,
            vec![("a".into(), url("a")), ("b".into(), url("b"))]
        );
    }

    #[test]
    fn a_bootstrap_that_never_forms_is_wiped_but_a_formed_cluster_never() {
        let mut d = desired(3);
        d.formed_before = false;
        let timing = Timing {
            bootstrap_waiting: Some(Duration::from_secs(61)),
            ..Default::default()
        };
        let o = Observed {
            runtime: running(&["a", "b", "c"]),
            etcd: None,
            timing,
        };
        assert!(matches!(run(&d, &o), Step::WipeBootstrap { .. }));
        d.formed_before = true;
        assert!(
            matches!(run(&d, &o), Step::Wait { .. }),
            "never wipe a cluster that held data"
        );
    }

    #[test]
    fn a_crashed_bootstrap_member_is_started_again() {
        let mut d = desired(3);
        d.formed_before = false;
        let mut rt = running(&["a", "b"]);
        rt.push(runtime("c", Liveness::Reserved, Some(InitialState::New)));
        let o = Observed {
            runtime: rt,
            etcd: None,
            timing: Timing::default(),
        };
        let Step::Start { members } = run(&d, &o) else {
            panic!("expected start")
        };
        assert_eq!(members.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(), ["c"]);
    }

    #[test]
    fn scale_up_goes_through_one_learner() {
        let d = desired(3);
        let o = Observed {
            runtime: running(&["a"]),
            etcd: view(vec![member(1, "a", false, true)], 1),
            timing: Timing::default(),
        };
        assert_eq!(run(&d, &o), Step::ReserveForJoin { name: "new1".into() });

        let mut rt = running(&["a"]);
        rt.push(runtime("b", Liveness::Reserved, None));
        let o = Observed {
            runtime: rt.clone(),
            etcd: view(vec![member(1, "a", false, true)], 1),
            timing: Timing::default(),
        };
        assert_eq!(
            run(&d, &o),
            Step::AddLearner {
                name: "b".into(),
                peer_url: url("b")
            }
        );

        // Added (not started: empty name) → start with an `existing` config naming both.
        let mut learner = member(2, "", true, false);
        learner.peer_urls = vec![url("b")];
        let o = Observed {
            runtime: rt,
            etcd: view(vec![member(1, "a", false, true), learner], 1),
            timing: Timing::default(),
        };
        let Step::Start { members } = run(&d, &o) else {
            panic!("expected start")
        };
        assert_eq!(members[0].0, "b");
        assert_eq!(members[0].1.initial_state, InitialState::Existing);
        assert_eq!(
            members[0].1.initial_cluster,
            vec![("a".into(), url("a")), ("b".into(), url("b"))]
        );

        // Started and healthy → promote; a second reserved member waits for the promotion.
        let mut rt = running(&["a"]);
        rt.push(runtime("b", Liveness::Running, Some(InitialState::Existing)));
        rt.push(runtime("c", Liveness::Reserved, None));
        let o = Observed {
            runtime: rt,
            etcd: view(vec![member(1, "a", false, true), member(2, "b", true, true)], 1),
            timing: Timing::default(),
        };
        assert_eq!(
            run(&d, &o),
            Step::Promote {
                id: 2,
                name: "b".into()
            }
        );
    }

    #[test]
    fn scale_down_removes_a_follower_first_and_moves_leadership_off_the_last() {
        let d = desired(1);
        let o = Observed {
            runtime: running(&["a", "b", "c"]),
            etcd: view(
                vec![
                    member(1, "a", false, true),
                    member(2, "b", false, true),
                    member(3, "c", false, true),
                ],
                3,
            ),
            timing: Timing::default(),
        };
        assert_eq!(
            run(&d, &o),
            Step::RemoveFromEtcd {
                id: 2,
                name: "b".into(),
                reason: "scale down".into()
            }
        );

        let o = Observed {
            runtime: running(&["a", "c"]),
            etcd: view(vec![member(3, "c", false, true), member(1, "a", false, true)], 3),
            timing: Timing::default(),
        };
        assert_eq!(
            run(&d, &o),
            Step::RemoveFromEtcd {
                id: 1,
                name: "a".into(),
                reason: "scale down".into()
            }
        );
        // Only the leader is left beyond the target: move leadership first.
        let o = Observed {
            runtime: running(&["a", "c"]),
            etcd: view(vec![member(1, "a", false, true), member(3, "c", false, true)], 3),
            timing: Timing::default(),
        };
        // The newest non-leader is `a` (id 1): removed first.
        assert_eq!(
            run(&d, &o),
            Step::RemoveFromEtcd {
                id: 1,
                name: "a".into(),
                reason: "scale down".into()
            }
        );
        let o = Observed {
            runtime: running(&["c", "a"]),
            etcd: view(vec![member(3, "c", false, true)], 3),
            timing: Timing::default(),
        };
        assert!(matches!(run(&d, &o), Step::DeleteRuntimeMember { ref name, .. } if name == "a"));
    }

    #[test]
    fn scale_down_never_picks_the_leader() {
        let d = desired(1);
        for leader in [1, 2] {
            let o = Observed {
                runtime: running(&["a", "b"]),
                etcd: view(
                    vec![member(1, "a", false, true), member(2, "b", false, true)],
                    leader,
                ),
                timing: Timing::default(),
            };
            let Step::RemoveFromEtcd { id, .. } = run(&d, &o) else {
                panic!("expected removal")
            };
            assert_ne!(id, leader);
        }
    }

    #[test]
    fn an_unhealthy_leader_hands_over_leadership_before_removal() {
        let d = desired(3);
        let mut sick = member(1, "a", false, true);
        if let Some(s) = sick.status.as_mut() {
            s.errors = vec!["NOSPACE".into()];
        }
        let o = Observed {
            runtime: running(&["a", "b", "c"]),
            etcd: view(
                vec![sick, member(2, "b", false, true), member(3, "c", false, true)],
                1,
            ),
            timing: Timing {
                unhealthy_for: vec![("a".into(), Duration::from_secs(600))],
                ..Default::default()
            },
        };
        assert_eq!(run(&d, &o), Step::MoveLeader { from: 1, to: 2 });
    }

    #[test]
    fn a_gone_member_is_replaced_only_with_quorum() {
        let d = desired(3);
        let mut rt = running(&["a", "b"]);
        rt.push(runtime(
            "c",
            Liveness::Gone {
                reason: "data lost".into(),
                restartable: false,
            },
            Some(InitialState::New),
        ));
        let o = Observed {
            runtime: rt.clone(),
            etcd: view(
                vec![
                    member(1, "a", false, true),
                    member(2, "b", false, true),
                    member(3, "c", false, false),
                ],
                1,
            ),
            timing: Timing::default(),
        };
        assert!(matches!(run(&d, &o), Step::RemoveFromEtcd { id: 3, .. }));
        // After removal, the runtime leftover is deleted, then a new member joins.
        let o = Observed {
            runtime: rt,
            etcd: view(vec![member(1, "a", false, true), member(2, "b", false, true)], 1),
            timing: Timing::default(),
        };
        assert!(matches!(run(&d, &o), Step::DeleteRuntimeMember { ref name, .. } if name == "c"));
        let o = Observed {
            runtime: running(&["a", "b"]),
            etcd: view(vec![member(1, "a", false, true), member(2, "b", false, true)], 1),
            timing: Timing::default(),
        };
        assert_eq!(run(&d, &o), Step::ReserveForJoin { name: "new1".into() });

        // Two of three gone: removing one would leave 1 healthy of 2 → no quorum → wait.
        let mut rt = running(&["a"]);
        rt.push(runtime(
            "b",
            Liveness::Gone {
                reason: "x".into(),
                restartable: false,
            },
            Some(InitialState::New),
        ));
        rt.push(runtime(
            "c",
            Liveness::Gone {
                reason: "x".into(),
                restartable: false,
            },
            Some(InitialState::New),
        ));
        let o = Observed {
            runtime: rt,
            etcd: view(
                vec![
                    member(1, "a", false, true),
                    member(2, "b", false, false),
                    member(3, "c", false, false),
                ],
                1,
            ),
            timing: Timing::default(),
        };
        let Step::Wait { reason } = run(&d, &o) else {
            panic!("expected wait")
        };
        assert!(reason.contains("quorum"), "{reason}");
    }

    #[test]
    fn a_crashed_member_with_its_data_is_restarted_until_it_keeps_failing() {
        let d = desired(3);
        let mut rt = running(&["a", "b"]);
        rt.push(runtime(
            "c",
            Liveness::Gone {
                reason: "process exited".into(),
                restartable: true,
            },
            Some(InitialState::New),
        ));
        let etcd = view(
            vec![
                member(1, "a", false, true),
                member(2, "b", false, true),
                member(3, "c", false, false),
            ],
            1,
        );
        let o = Observed {
            runtime: rt.clone(),
            etcd: etcd.clone(),
            timing: Timing::default(),
        };
        let Step::Start { members } = run(&d, &o) else {
            panic!("expected a restart")
        };
        assert_eq!(members[0].0, "c");
        let failing = Timing {
            unhealthy_for: vec![("c".into(), Duration::from_secs(600))],
            ..Default::default()
        };
        let o = Observed {
            runtime: rt,
            etcd,
            timing: failing,
        };
        assert!(matches!(run(&d, &o), Step::RemoveFromEtcd { id: 3, .. }));
    }

    #[test]
    fn unhealthy_members_are_replaced_after_the_threshold() {
        let d = desired(3);
        let etcd = view(
            vec![
                member(1, "a", false, true),
                member(2, "b", false, true),
                member(3, "c", false, false),
            ],
            1,
        );
        let young = Timing {
            unhealthy_for: vec![("c".into(), Duration::from_secs(5))],
            ..Default::default()
        };
        let o = Observed {
            runtime: running(&["a", "b", "c"]),
            etcd: etcd.clone(),
            timing: young,
        };
        assert!(matches!(run(&d, &o), Step::Wait { .. }));
        let old = Timing {
            unhealthy_for: vec![("c".into(), Duration::from_secs(600))],
            ..Default::default()
        };
        let o = Observed {
            runtime: running(&["a", "b", "c"]),
            etcd,
            timing: old,
        };
        assert!(matches!(run(&d, &o), Step::RemoveFromEtcd { id: 3, .. }));
    }

    #[test]
    fn never_a_second_learner() {
        let d = desired(5);
        let mut rt = running(&["a", "b", "c"]);
        rt.push(runtime("d", Liveness::Running, Some(InitialState::Existing)));
        rt.push(runtime("e", Liveness::Reserved, None));
        let o = Observed {
            runtime: rt,
            etcd: view(
                vec![
                    member(1, "a", false, true),
                    member(2, "b", false, true),
                    member(3, "c", false, true),
                    member(4, "d", true, false),
                ],
                1,
            ),
            timing: Timing::default(),
        };
        assert!(
            matches!(run(&d, &o), Step::Wait { .. }),
            "e must wait for d's promotion"
        );
    }

    #[test]
    fn paused_changes_nothing_and_a_settled_cluster_is_idle() {
        let mut d = desired(1);
        let o = Observed {
            runtime: running(&["a"]),
            etcd: view(vec![member(1, "a", false, true)], 1),
            timing: Timing::default(),
        };
        assert_eq!(run(&d, &o), Step::Idle);
        d.replicas = 3;
        d.paused = true;
        assert!(matches!(run(&d, &o), Step::Wait { .. }));
    }
}
