//! Observing a cluster: the runtime's members, etcd's view of them, and the timing memory the
//! planner's thresholds compare against (how long a bootstrap, an unhealthy member or a version
//! change has been waiting).

use std::collections::HashMap;
use std::time::Instant;

use crate::member_ops::{MemberOpError, MemberOps};
use crate::model::{ClusterRef, InitialState, Liveness, is_healthy};
use crate::plan::{self, Observed, Timing};
use crate::runtime::{Runtime, RuntimeError};
use crate::tls::member::ClientTls;

use super::Context;

/// Observes the runtime and etcd, and updates the timing memory. When no member answers because
/// the TLS handshake fails, that failure comes back beside what was observed.
pub(super) async fn observe<R: Runtime, M: MemberOps>(
    cluster: &ClusterRef,
    ctx: &Context<R, M>,
    version: &str,
    replace_member: Option<&str>,
    client_tls: Option<&ClientTls>,
) -> Result<(Observed, Option<MemberOpError>), RuntimeError> {
    let runtime = ctx.runtime.members(cluster).await?;
    // Every member's client URL speaks TLS with the operator's identity when the plane asks for
    // it: the calls below, the steps and the backups all go through the same member operations.
    let all: Vec<String> = runtime.iter().map(|r| r.client_url.clone()).collect();
    ctx.members.use_tls(&all, client_tls);
    let endpoints: Vec<String> = runtime
        .iter()
        .filter(|r| r.liveness == Liveness::Running)
        .map(|r| r.client_url.clone())
        .collect();
    let (etcd, tls_failure) = if endpoints.is_empty() {
        (None, None)
    } else {
        match ctx.members.observe(&endpoints).await {
            Ok(view) => (Some(view), None),
            Err(e @ MemberOpError::Tls { .. }) => (None, Some(e)),
            Err(e) => {
                tracing::debug!(cluster = %cluster.key(), error = %etcd_operator_api::report::Chain(&e), "no member answers the member list");
                (None, None)
            }
        }
    };
    let now = Instant::now();
    let mut timing = Timing::default();
    if let Ok(mut all) = ctx.memory.lock() {
        let memory = all.entry(cluster.key()).or_default();
        let formed = etcd.as_ref().is_some_and(|v| v.leader != 0);
        // A bootstrap is under way once a member was started with `new`, whether its process
        // runs or already exited: a member that dies at once (its port taken, say) keeps the
        // clock running, so the bootstrap is wiped and reserved anew when it never forms.
        let bootstrapping = runtime.iter().any(|r| {
            r.config
                .as_ref()
                .is_some_and(|c| c.initial_state == InitialState::New)
                && r.liveness != Liveness::Reserved
        });
        if formed || !bootstrapping {
            memory.bootstrap_since = None;
        } else {
            let since = *memory.bootstrap_since.get_or_insert(now);
            timing.bootstrap_waiting = Some(now - since);
        }
        let mut still_unhealthy = HashMap::new();
        let mut still_failing = HashMap::new();
        let mut progress = HashMap::new();
        if let Some(view) = &etcd {
            for m in &view.members {
                let Some(r) = runtime.iter().find(|r| m.peer_urls.contains(&r.peer_url)) else {
                    continue;
                };
                let gone = matches!(r.liveness, Liveness::Gone { .. });
                let down = gone || (r.liveness == Liveness::Running && !is_healthy(m));
                if let Some(status) = &m.status {
                    // Progress: since when the member applied the highest index seen.
                    let seen = match memory.progress.get(&r.name) {
                        Some(&(index, since)) if index >= status.raft_applied_index => (index, since),
                        _ => (status.raft_applied_index, now),
                    };
                    progress.insert(r.name.clone(), seen);
                } else if let Some(seen) = memory.progress.get(&r.name) {
                    progress.insert(r.name.clone(), *seen);
                }
                if down {
                    let since = memory.unhealthy_since.get(&r.name).copied().unwrap_or(now);
                    still_unhealthy.insert(r.name.clone(), since);
                    timing.unhealthy_for.push((r.name.clone(), now - since));
                    let failing = count_exits(memory.failed_starts.get(&r.name).copied(), r, now);
                    still_failing.insert(r.name.clone(), failing);
                    timing.failed_starts.push((r.name.clone(), failing.count));
                    if let Some(since) = failing.gone_since {
                        timing.gone_for.push((r.name.clone(), now - since));
                    }
                    if let Some((_, since)) = progress.get(&r.name) {
                        timing.no_progress_for.push((r.name.clone(), now - *since));
                    }
                }
            }
        }
        if etcd.is_none() {
            // No member answers (a bootstrap, or a full outage): the members the planner starts
            // again are counted the same way, for the same back-off. A running one keeps its
            // count, so that its next exit adds to it.
            for r in &runtime {
                if r.config.is_none() || r.liveness == Liveness::Reserved {
                    continue;
                }
                let failing = count_exits(memory.failed_starts.get(&r.name).copied(), r, now);
                if let Some(since) = failing.gone_since {
                    timing.failed_starts.push((r.name.clone(), failing.count));
                    timing.gone_for.push((r.name.clone(), now - since));
                }
                still_failing.insert(r.name.clone(), failing);
            }
        }
        memory.failed_starts = still_failing;
        memory.progress = progress;
        // An announcement stands while its member is still down (or still asked for).
        memory
            .announced
            .retain(|name, _| still_unhealthy.contains_key(name) || replace_member == Some(name.as_str()));
        timing.announced = memory
            .announced
            .iter()
            .map(|(n, note)| (n.clone(), note.clone()))
            .collect();
        memory.unhealthy_since = still_unhealthy;
        // Members recorded on `version` after a version change that etcd does not yet show
        // healthy, caught up and on it: the roll's health gate clock.
        let mut still_waiting = HashMap::new();
        for r in &runtime {
            let changed = r.config.as_ref().is_some_and(|c| {
                c.version == version && c.previous_version.as_deref().is_some_and(|p| p != version)
            });
            let verified = etcd.as_ref().is_some_and(|view| {
                view.by_peer_url(&r.peer_url)
                    .is_some_and(|m| plan::runs_version(view, m, version))
            });
            if changed && !verified {
                let since = memory.version_wait_since.get(&r.name).copied().unwrap_or(now);
                still_waiting.insert(r.name.clone(), since);
                timing.version_change_waiting.push((r.name.clone(), now - since));
            }
        }
        memory.version_wait_since = still_waiting;
    }
    Ok((
        Observed {
            authority: None,
            runtime,
            etcd,
            timing,
        },
        tls_failure,
    ))
}

/// The failure record of `r` after this look, from its record after the last one (`None`: it
/// was not down then). Each exit (a transition to gone) counts once, and so does each restart
/// the platform made itself (a kubelet restarting a container); the back-off counts from the
/// first look that found it gone after its last start.
fn count_exits(
    last: Option<super::FailedStarts>,
    r: &crate::model::RuntimeMember,
    now: Instant,
) -> super::FailedStarts {
    let gone = matches!(r.liveness, Liveness::Gone { .. });
    let last = last.unwrap_or(super::FailedStarts {
        restarts: r.restarts,
        ..Default::default()
    });
    let count = last
        .count
        .saturating_add(u32::from(gone && !last.was_gone))
        .saturating_add(r.restarts.saturating_sub(last.restarts));
    let gone_since = match (gone, last.was_gone, last.gone_since) {
        (false, ..) => None,
        (true, true, Some(since)) => Some(since),
        (true, ..) => Some(now),
    };
    super::FailedStarts {
        count,
        was_gone: gone,
        restarts: r.restarts,
        gone_since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member_ops::fake::{Call, FakeMemberOps};
    use crate::model::RuntimeMember;
    use crate::plan::Thresholds;
    use crate::runtime::fake::FakeRuntime;

    type Request = http::Request<kube::client::Body>;
    type Response = http::Response<kube::client::Body>;

    /// A kube client's service that no test here answers (observing calls only the runtime
    /// and the members), and the handle that keeps it open.
    fn api_service() -> (
        tower_test::mock::Mock<Request, Response>,
        tower_test::mock::Handle<Request, Response>,
    ) {
        tower_test::mock::pair()
    }

    fn cluster() -> ClusterRef {
        ClusterRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
        }
    }

    /// The timing facts of one look.
    async fn timing(cluster: &ClusterRef, ctx: &Context<FakeRuntime, FakeMemberOps>) -> Timing {
        observe(cluster, ctx, "3.5.1", None, None).await.unwrap().0.timing
    }

    fn member(name: &str, liveness: Liveness) -> RuntimeMember {
        RuntimeMember {
            name: name.into(),
            peer_url: format!("https://{name}:2380"),
            client_url: format!("https://{name}:2379"),
            config: None,
            liveness,
            certificates: None,
            restarts: 0,
            template_hash: None,
            volume: None,
            created: None,
        }
    }

    #[tokio::test]
    async fn a_bootstrap_whose_members_die_at_once_keeps_its_clock_running() {
        let (service, _handle) = api_service();
        let started = |name: &str, liveness| RuntimeMember {
            config: Some(crate::model::MemberConfig {
                version: "3.5.1".into(),
                initial_cluster: vec![(name.into(), format!("https://{name}:2380"))],
                initial_state: InitialState::New,
                cluster_token: "t".into(),
                previous_version: None,
                restore: None,
            }),
            ..member(name, liveness)
        };
        let dead = || Liveness::Gone {
            reason: "the process exited".into(),
            restartable: true,
        };
        let ctx = Context::with_member_ops(
            kube::Client::new(service, "default"),
            FakeRuntime::new(vec![started("a", dead()), started("b", dead())], None),
            Thresholds::default(),
            FakeMemberOps::new(None),
        );
        let cluster = cluster();
        let first = observe(&cluster, &ctx, "3.5.1", None, None).await.unwrap().0;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let second = observe(&cluster, &ctx, "3.5.1", None, None).await.unwrap().0;
        let (first, second) = (
            first.timing.bootstrap_waiting.unwrap(),
            second.timing.bootstrap_waiting.unwrap(),
        );
        assert!(
            second >= first + std::time::Duration::from_millis(20),
            "{first:?} then {second:?}"
        );
        // Members only reserved: no bootstrap yet, no clock.
        ctx.runtime.set_liveness("a", Liveness::Reserved);
        ctx.runtime.set_liveness("b", Liveness::Reserved);
        let reserved = observe(&cluster, &ctx, "3.5.1", None, None).await.unwrap().0;
        assert_eq!(reserved.timing.bootstrap_waiting, None);
    }

    #[tokio::test]
    async fn every_member_url_is_registered_with_the_clusters_identity_before_etcd_is_asked() {
        let (service, _handle) = api_service();
        let ctx = Context::with_member_ops(
            kube::Client::new(service, "default"),
            FakeRuntime::new(
                vec![member("a", Liveness::Running), member("b", Liveness::Reserved)],
                None,
            ),
            Thresholds::default(),
            FakeMemberOps::new(None),
        );
        let cluster = cluster();
        let tls = ClientTls {
            ca_pem: "ca".into(),
            cert_pem: "cert".into(),
            key_pem: "key".into(),
        };
        observe(&cluster, &ctx, "3.5.1", None, Some(&tls)).await.unwrap();
        observe(&cluster, &ctx, "3.5.1", None, None).await.unwrap();
        let all = vec!["https://a:2379".to_string(), "https://b:2379".to_string()];
        assert_eq!(
            ctx.members.calls(),
            [
                Call::UseTls(all.clone(), Some(tls.fingerprint())),
                Call::Observe(vec!["https://a:2379".into()]),
                Call::UseTls(all, None),
                Call::Observe(vec!["https://a:2379".into()]),
            ]
        );
    }

    #[tokio::test]
    async fn without_an_answer_the_exits_of_started_members_are_counted_until_etcd_answers_healthy() {
        let (service, _handle) = api_service();
        let started = |name: &str| RuntimeMember {
            config: Some(crate::model::MemberConfig {
                version: "3.5.1".into(),
                initial_cluster: vec![
                    ("a".into(), "http://a:2380".into()),
                    ("b".into(), "http://b:2380".into()),
                ],
                initial_state: InitialState::New,
                cluster_token: "t".into(),
                previous_version: None,
                restore: None,
            }),
            peer_url: format!("http://{name}:2380"),
            ..member(name, Liveness::Running)
        };
        let gone = || Liveness::Gone {
            reason: "the process exited".into(),
            restartable: true,
        };
        let ctx = Context::with_member_ops(
            kube::Client::new(service, "default"),
            FakeRuntime::new(
                vec![started("a"), started("b"), member("c", Liveness::Reserved)],
                None,
            ),
            Thresholds::default(),
            FakeMemberOps::new(None),
        );
        let cluster = cluster();
        let look = || timing(&cluster, &ctx);
        let started_again = |name: &str| {
            ctx.memory
                .lock()
                .unwrap()
                .get_mut("ns/c")
                .unwrap()
                .started_again(name)
        };

        // Running without an answer: nothing counted yet; gone: one exit each, with a clock.
        assert_eq!(look().await.failed_starts, []);
        ctx.runtime.set_liveness("a", gone());
        ctx.runtime.set_liveness("b", gone());
        let t = look().await;
        assert_eq!(t.failed_starts, [("a".to_owned(), 1), ("b".to_owned(), 1)]);
        assert_eq!(t.gone_for.len(), 2, "{t:?}");
        assert_eq!(
            look().await.failed_starts,
            [("a".to_owned(), 1), ("b".to_owned(), 1)]
        );
        // Both started again: b is found gone again at once, a runs for a while and then exits.
        started_again("a");
        started_again("b");
        ctx.runtime.set_liveness("a", Liveness::Running);
        let t = look().await;
        assert_eq!(t.failed_starts, [("b".to_owned(), 2)], "a runs: not gone");
        ctx.runtime.set_liveness("a", gone());
        assert_eq!(
            look().await.failed_starts,
            [("a".to_owned(), 2), ("b".to_owned(), 2)]
        );

        // etcd answers and both are healthy: the counts are forgotten.
        ctx.runtime.set_liveness("a", Liveness::Running);
        ctx.runtime.set_liveness("b", Liveness::Running);
        ctx.members.set_view(Some(two_healthy()));
        assert_eq!(look().await.failed_starts, []);
        ctx.members.set_view(None);
        ctx.runtime.set_liveness("b", gone());
        assert_eq!(look().await.failed_starts, [("b".to_owned(), 1)]);
    }

    /// Members a (the leader) and b, healthy.
    fn two_healthy() -> crate::model::EtcdView {
        use crate::member_ops::fake::healthy_member;
        crate::model::EtcdView {
            cluster_id: 1,
            members: vec![
                healthy_member(1, "a", "3.5.1", 1),
                healthy_member(2, "b", "3.5.1", 1),
            ],
            leader: 1,
            alarms: Vec::new(),
        }
    }

    fn sick(view: &mut crate::model::EtcdView, applied: u64) {
        if let Some(s) = view.members[1].status.as_mut() {
            s.errors = vec!["etcdserver: no leader".into()];
            s.raft_applied_index = applied;
        }
    }

    #[tokio::test]
    async fn exits_progress_and_announcements_are_remembered_per_member_while_it_is_down() {
        use crate::member_ops::fake::healthy_member;
        let (service, _handle) = api_service();
        let mut a = member("a", Liveness::Running);
        let mut b = member("b", Liveness::Running);
        a.peer_url = "http://a:2380".into();
        b.peer_url = "http://b:2380".into();
        let mut view = two_healthy();
        sick(&mut view, 10);
        let ctx = Context::with_member_ops(
            kube::Client::new(service, "default"),
            FakeRuntime::new(vec![a, b], None),
            Thresholds::default(),
            FakeMemberOps::new(Some(view.clone())),
        );
        let cluster = cluster();
        let look = || timing(&cluster, &ctx);
        let failed = |t: &Timing| t.failed_starts.iter().find(|(n, _)| n == "b").map(|(_, c)| *c);
        let gone = || Liveness::Gone {
            reason: "the process exited".into(),
            restartable: true,
        };

        // Down but never exited: slow, not failing to start; only b is down.
        let t = look().await;
        assert_eq!(t.failed_starts, [("b".to_owned(), 0)]);
        assert_eq!(t.unhealthy_for.len(), 1);
        // Each exit counts once, however often it is seen gone.
        ctx.runtime.set_liveness("b", gone());
        assert_eq!(failed(&look().await), Some(1));
        assert_eq!(failed(&look().await), Some(1));
        ctx.runtime.set_liveness("b", Liveness::Running);
        assert_eq!(failed(&look().await), Some(1));
        ctx.runtime.set_liveness("b", gone());
        assert_eq!(failed(&look().await), Some(2));
        // How long it has been gone counts from the first look that found it gone...
        let gone_for = |t: &Timing| t.gone_for.iter().find(|(n, _)| n == "b").map(|(_, d)| *d);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let waited = gone_for(&look().await).unwrap();
        assert!(waited >= std::time::Duration::from_millis(50), "{waited:?}");
        // ...and a start in between makes the next gone look a new exit, seen or not running.
        let started = |ctx: &Context<FakeRuntime, FakeMemberOps>| {
            ctx.memory
                .lock()
                .unwrap()
                .get_mut("ns/c")
                .unwrap()
                .started_again("b")
        };
        started(&ctx);
        let t = look().await;
        assert_eq!(failed(&t), Some(3));
        assert!(gone_for(&t).unwrap() < waited, "{t:?}");
        started(&ctx);
        assert_eq!(failed(&look().await), Some(4));

        // Restarts the platform made (a kubelet's restartCount) count as failures too.
        ctx.runtime.set_liveness("b", Liveness::Running);
        assert_eq!(gone_for(&look().await), None, "running: not gone");
        ctx.runtime.set_restarts("b", 3);
        assert_eq!(failed(&look().await), Some(7));

        // Progress: time without a new applied index grows, and a new index starts it again.
        ctx.runtime.set_liveness("b", Liveness::Running);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let stalled = |t: &Timing| t.no_progress_for.iter().find(|(n, _)| n == "b").map(|(_, d)| *d);
        let before = stalled(&look().await).unwrap();
        assert!(before >= std::time::Duration::from_millis(50), "{before:?}");
        sick(&mut view, 11);
        ctx.members.set_view(Some(view.clone()));
        let after = stalled(&look().await).unwrap();
        assert!(after < before, "{after:?} after progress, {before:?} before");

        // An announcement stands while b is down, or while it is asked for by name.
        ctx.memory
            .lock()
            .unwrap()
            .get_mut("ns/c")
            .unwrap()
            .announced
            .insert("b".into(), "b will be replaced".into());
        assert_eq!(
            look().await.announced,
            [("b".to_owned(), "b will be replaced".to_owned())]
        );
        view.members[1] = healthy_member(2, "b", "3.5.1", 1);
        ctx.members.set_view(Some(view.clone()));
        let asked = observe(&cluster, &ctx, "3.5.1", Some("b"), None)
            .await
            .unwrap()
            .0
            .timing;
        assert_eq!(asked.announced.len(), 1);
        assert!(
            asked.failed_starts.is_empty(),
            "healthy again: the count starts over"
        );
        assert_eq!(look().await.announced, []);
    }
}
