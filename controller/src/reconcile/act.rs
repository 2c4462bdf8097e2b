//! Carrying out one planned step through the runtime and the member operations; a failure is a
//! typed [`StepError`]. The pre-upgrade snapshot lives here too.

use etcd_operator_api::status::SpaceReclaimStatus;

use crate::member_ops::MemberOps;
use crate::model::{ClusterRef, Liveness, is_healthy};
use crate::outcome::StepError;
use crate::plan::{Observed, RollRecord, Step};
use crate::runtime::{Runtime, RuntimeError, ValidatedCluster};

use super::Context;

/// What a carried-out step did that status records (beyond what the next observation shows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum Acted {
    /// Nothing more to record.
    #[default]
    Done,
    /// Space was reclaimed for NOSPACE (`time` is left to the caller's clock).
    Reclaimed(SpaceReclaimStatus),
}

/// Carries out one step.
pub(super) async fn act<R: Runtime, M: MemberOps>(
    step: &Step,
    cluster: &ClusterRef,
    spec: &ValidatedCluster,
    observed: &Observed,
    ctx: &Context<R, M>,
    roll: &mut Option<RollRecord>,
) -> Result<Acted, StepError> {
    let running: Vec<String> = observed
        .runtime
        .iter()
        .filter(|r| r.liveness == Liveness::Running)
        .map(|r| r.client_url.clone())
        .collect();
    // Membership calls go to voters: a learner refuses them ("rpc not supported for learner").
    let voters: Vec<String> = match &observed.etcd {
        Some(view) => view
            .voters()
            .filter_map(|m| m.client_urls.first().cloned())
            .filter(|u| running.contains(u))
            .collect(),
        None => running.clone(),
    };
    let endpoints = if voters.is_empty() { running } else { voters };
    match step {
        Step::ReserveForBootstrap { names } => {
            for name in names {
                ctx.runtime.reserve(cluster, spec, name).await?;
            }
        }
        Step::ReserveForJoin { name } => {
            ctx.runtime.reserve(cluster, spec, name).await?;
        }
        Step::Start { members } => {
            for (name, config) in members {
                ctx.runtime.start(cluster, spec, name, config).await?;
            }
        }
        Step::AddLearner { peer_url, name } => match ctx.members.add_learner(&endpoints, peer_url).await {
            Ok(id) => {
                tracing::info!(cluster = %cluster.key(), member = %name, id = format!("{id:x}"), "added learner")
            }
            // etcd's strict reconfiguration check: the previous new member joined < 5 s ago.
            Err(e) if e.is_not_ready_yet() => {
                tracing::debug!(member = %name, error = %etcd_operator_api::report::Chain(&e), "member add not accepted yet")
            }
            Err(e) => return Err(e.into()),
        },
        Step::Promote { id, name } => match ctx.members.promote(&endpoints, *id).await {
            Ok(()) => tracing::info!(cluster = %cluster.key(), member = %name, "promoted learner"),
            Err(e) if e.is_not_ready_yet() => {
                tracing::debug!(member = %name, error = %etcd_operator_api::report::Chain(&e), "learner not ready yet")
            }
            Err(e) => return Err(e.into()),
        },
        Step::MoveLeader { from, to } => {
            let leader_url = observed
                .etcd
                .as_ref()
                .and_then(|v| v.members.iter().find(|m| m.id == *from))
                .and_then(|m| m.client_urls.first().cloned())
                .ok_or(StepError::LeaderUnreachable { id: *from })?;
            ctx.members.move_leader(&leader_url, *to).await?;
            tracing::info!(cluster = %cluster.key(), from = format!("{from:x}"), to = format!("{to:x}"), "moved leadership");
        }
        Step::RemoveFromEtcd { id, name, reason } => {
            let removed_url = observed
                .etcd
                .as_ref()
                .and_then(|v| v.members.iter().find(|m| m.id == *id))
                .and_then(|m| m.client_urls.first().cloned());
            let others: Vec<String> = endpoints
                .iter()
                .filter(|e| Some(*e) != removed_url.as_ref())
                .cloned()
                .collect();
            ctx.members.remove(&others, *id).await?;
            tracing::info!(cluster = %cluster.key(), member = %name, %reason, "removed member from etcd");
        }
        Step::AnnounceReplacement {
            name,
            cause,
            awaiting_request,
            ..
        } => {
            let note = crate::plan::replacement_note(name, cause, *awaiting_request);
            tracing::warn!(cluster = %cluster.key(), member = %name, cause = cause.code(), "{note}");
            ctx.runtime.announce_replacement(cluster, name, &note).await;
            if let Ok(mut all) = ctx.memory.lock() {
                all.entry(cluster.key())
                    .or_default()
                    .announced
                    .insert(name.clone(), note);
            }
        }
        Step::DeleteRuntimeMember { name, reason } => {
            ctx.runtime.remove(cluster, name, false).await?;
            tracing::info!(cluster = %cluster.key(), member = %name, %reason, "deleted member");
        }
        Step::WipeBootstrap { reason } => {
            tracing::warn!(cluster = %cluster.key(), %reason, "wiping the failed bootstrap to retry it");
            ctx.runtime.teardown(cluster, false).await?;
            ctx.forget(cluster);
        }
        Step::SnapshotBeforeUpgrade { from, to } => {
            let snapshot = pre_upgrade_snapshot(cluster, spec, observed, ctx, from, to).await?;
            *roll = Some(RollRecord {
                from: from.clone(),
                target: to.clone(),
                snapshot: Some(snapshot),
                ..Default::default()
            });
        }
        Step::ChangeVersion { name, from, to } => {
            match ctx.runtime.change_version(cluster, spec, name, to).await {
                Ok(()) => {
                    tracing::info!(cluster = %cluster.key(), member = %name, %from, %to, "restarted member on a new version")
                }
                // Nothing was touched: halt the roll with the reason rather than retry forever.
                Err(e @ RuntimeError::VersionUnavailable { .. }) => {
                    tracing::warn!(cluster = %cluster.key(), member = %name, error = %etcd_operator_api::report::Chain(&e), "the roll cannot proceed");
                    if let Some(r) = roll.as_mut() {
                        r.halted = Some(etcd_operator_api::report::chain(&e));
                        r.failed_member = None;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Step::RecoverQuorum {
            survivor,
            lost,
            applied_index,
            request,
        } => {
            tracing::warn!(cluster = %cluster.key(), %survivor, ?lost, ?applied_index, %request, "rebuilding the cluster from one member as asked: the other members' data is given up");
            ctx.runtime.recover_quorum(cluster, spec, survivor).await?;
        }
        Step::ReclaimSpace { alarms } => {
            let revision = ctx.members.compact(&endpoints).await?;
            tracing::info!(cluster = %cluster.key(), revision, "compacted the history for NOSPACE");
            // One member at a time, followers first and the leader last: a member being
            // defragmented serves nothing, the others keep quorum.
            let mut order: Vec<(bool, String, String)> = observed
                .etcd
                .as_ref()
                .map(|view| {
                    // A member that did not answer (its data gone, its process down) cannot be
                    // defragmented; asking it would fail the step for good and keep the alarm.
                    // Its own replacement comes once the alarm is gone.
                    view.members
                        .iter()
                        .filter(|m| m.status.is_some())
                        .filter_map(|m| {
                            Some((
                                m.id == view.leader,
                                m.client_urls.first()?.clone(),
                                m.name.clone(),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            order.sort();
            let mut record = SpaceReclaimStatus {
                compacted_revision: Some(revision),
                ..SpaceReclaimStatus::default()
            };
            for (_, url, name) in &order {
                ctx.members.defragment(url).await?;
                tracing::info!(cluster = %cluster.key(), member = %url, "defragmented");
                record.defragmented.push(name.clone());
            }
            for alarm in alarms {
                ctx.members.disarm(&endpoints, *alarm).await?;
                tracing::info!(cluster = %cluster.key(), member = format!("{:x}", alarm.member), "disarmed NOSPACE");
                let name = observed
                    .etcd
                    .as_ref()
                    .and_then(|v| v.members.iter().find(|m| m.id == alarm.member))
                    .map(|m| m.name.clone())
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| format!("{:x}", alarm.member));
                record.disarmed.push(name);
            }
            return Ok(Acted::Reclaimed(record));
        }
        Step::Defragment {
            name,
            id,
            trigger,
            db_size,
            db_size_in_use,
        } => {
            let url = observed
                .etcd
                .as_ref()
                .and_then(|v| v.members.iter().find(|m| m.id == *id))
                .and_then(|m| m.client_urls.first().cloned())
                .ok_or_else(|| StepError::DefragmentUnreachable { name: name.clone() })?;
            ctx.members.defragment(&url).await?;
            tracing::info!(cluster = %cluster.key(), member = %name, %trigger, db_size, db_size_in_use, "defragmented");
        }
        Step::RenewCertificates { name, reason } => {
            ctx.runtime.renew_certificates(cluster, spec, name).await?;
            tracing::info!(cluster = %cluster.key(), member = %name, %reason, "restarted member on new certificates");
        }
        Step::EnableDowngrade { version } => {
            ctx.members.enable_downgrade(&endpoints, version).await?;
            tracing::info!(cluster = %cluster.key(), %version, "enabled etcd's downgrade: the cluster and storage versions go down before members restart");
        }
        Step::AdvanceAuthority { to, rotation, reason } => {
            ctx.runtime
                .advance_authority(cluster, spec, *to, rotation.as_deref())
                .await?;
            tracing::info!(cluster = %cluster.key(), %to, rotation = ?rotation, %reason, "moved the CA rotation on");
        }
        Step::RollTemplate { name, from, to } => {
            ctx.runtime.recreate(cluster, spec, name).await?;
            tracing::info!(cluster = %cluster.key(), member = %name, from = ?from, %to, "re-creating member on the changed member template");
        }
        Step::ExpandVolume { name, from, to } => {
            ctx.runtime.expand_volume(cluster, spec, name).await?;
            tracing::info!(cluster = %cluster.key(), member = %name, from, to, "asked the member's volume to grow");
        }
        Step::FinishVolumeResize { name } => {
            ctx.runtime.stop(cluster, name).await?;
            tracing::info!(cluster = %cluster.key(), member = %name, "restarted member to resize its filesystem");
        }
        Step::HaltRollout { name, reason } => {
            tracing::warn!(cluster = %cluster.key(), member = %name, %reason, "halting the template rollout");
            ctx.runtime
                .warn(cluster, "RolloutHalted", "RollTemplate", reason)
                .await;
        }
        Step::RollBack {
            name,
            from,
            to,
            reason,
        } => {
            tracing::warn!(cluster = %cluster.key(), member = %name, %from, %to, %reason, "rolling the member back and halting the roll");
            ctx.runtime.change_version(cluster, spec, name, to).await?;
            if let Some(r) = roll.as_mut() {
                r.halted = Some(format!("{reason}; it was started again on etcd {to}"));
                r.failed_member = Some(name.clone());
            }
        }
        Step::HaltUpgrade { name, reason } => {
            tracing::warn!(cluster = %cluster.key(), member = %name, %reason, "stopping the member and halting the roll");
            ctx.runtime.stop(cluster, name).await?;
            if let Some(r) = roll.as_mut() {
                r.halted = Some(reason.clone());
                r.failed_member = Some(name.clone());
            }
        }
        Step::Wait { .. } | Step::Idle => {}
    }
    Ok(Acted::Done)
}

/// Why a roll has no pre-upgrade snapshot in a runtime without a place beside the data.
pub(super) const SNAPSHOT_NOT_TAKEN: &str = "not taken: this runtime has no place beside the members' data reachable by the operator; configure backups to keep one";

/// Takes the snapshot before a roll from a healthy member (the leader when it answers) into the
/// runtime's place beside the cluster's data and to the backup destination when there is one;
/// returns where it went, or why it went nowhere.
async fn pre_upgrade_snapshot<R: Runtime, M: MemberOps>(
    cluster: &ClusterRef,
    spec: &ValidatedCluster,
    observed: &Observed,
    ctx: &Context<R, M>,
    from: &str,
    to: &str,
) -> Result<String, StepError> {
    let destination = spec.backup_destination();
    let beside = ctx.runtime.snapshot_dir(cluster);
    if beside.is_none() && destination.is_none() {
        tracing::info!(cluster = %cluster.key(), "no place for a pre-upgrade snapshot: no backup destination, and none beside the data in this runtime");
        return Ok(SNAPSHOT_NOT_TAKEN.into());
    }
    let view = observed.etcd.as_ref().ok_or(StepError::NoSnapshotSource)?;
    let mut sources: Vec<&crate::model::EtcdMember> = view.voters().filter(|m| is_healthy(m)).collect();
    sources.sort_by_key(|m| m.id != view.leader);
    let endpoint = sources
        .iter()
        .find_map(|m| m.client_urls.first())
        .ok_or(StepError::NoSnapshotSource)?;
    let name = format!("pre-upgrade-{from}-to-{to}");
    let mut kept = Vec::new();
    let mut taken: Option<crate::member_ops::SavedSnapshot> = None;
    if let Some(dir) = beside {
        let saved = ctx
            .members
            .save_snapshot(endpoint, &dir, &name)
            .await
            .map_err(StepError::Snapshot)?;
        tracing::info!(cluster = %cluster.key(), path = %saved.path.display(), revision = saved.revision, size = saved.size, "took the pre-upgrade snapshot");
        // Only the newest few stay beside the data.
        match crate::member_ops::file::prune_local(&dir, crate::backup_policy::LOCAL_PRE_UPGRADE_KEEP).await {
            Ok(deleted) => {
                for path in deleted {
                    tracing::info!(cluster = %cluster.key(), path = %path.display(), "deleted an older pre-upgrade snapshot");
                }
            }
            Err(error) => {
                tracing::warn!(cluster = %cluster.key(), dir = %dir.display(), error = %etcd_operator_api::report::Chain(&error), "could not delete older pre-upgrade snapshots")
            }
        }
        kept.push(saved.path.display().to_string());
        taken = Some(saved);
    }
    if let Some(destination) = destination {
        // The same snapshot goes to the backup destination, among the manual snapshots (kept
        // by the cluster's retention, counted apart from the scheduled ones). Either way it
        // streams, checked against etcd's hash.
        let stream = match &taken {
            Some(saved) => crate::member_ops::file::read_snapshot(saved)
                .await
                .map_err(StepError::Snapshot)?,
            None => ctx
                .members
                .snapshot_stream(endpoint)
                .await
                .map_err(StepError::Snapshot)?,
        };
        let store = crate::backup_store::open(destination, &cluster.namespace, &ctx.backup_credentials)
            .await
            .map_err(StepError::SendSnapshot)?;
        let dir =
            crate::backup_policy::cluster_dir(store.prefix.as_deref(), &cluster.namespace, &cluster.name);
        let key = crate::backup_policy::manual_key(&dir, &name, chrono::Utc::now(), stream.revision);
        store
            .put_snapshot_stream(&key, stream)
            .await
            .map_err(|e| match e {
                crate::backup_store::StoreSnapshotError::Snapshot(e) => StepError::Snapshot(e),
                crate::backup_store::StoreSnapshotError::Destination(e) => StepError::SendSnapshot(e),
            })?;
        tracing::info!(cluster = %cluster.key(), location = %store.location(&key), "sent the pre-upgrade snapshot to the backup destination");
        let retention = spec.backup.as_ref().and_then(|b| b.retention.as_ref());
        if let Err(error) = crate::backup::prune_manual(&store, &dir, retention, &cluster.key()).await {
            tracing::warn!(cluster = %cluster.key(), error = %etcd_operator_api::report::Chain(&error), "retention of manual snapshots failed; retried after the next snapshot");
        }
        kept.push(store.location(&key));
    }
    Ok(kept.join(" and "))
}

#[cfg(test)]
mod tests {
    //! Every step kind carried out over the fake runtime and fake member operations: the exact
    //! calls made, and each failure surfacing as its typed error.

    use super::*;
    use crate::member_ops::fake::{Call, FakeMemberOps, Op, healthy_member};
    use crate::member_ops::{MemberOpError, SnapshotError};
    use crate::model::{EtcdView, InitialState, MemberConfig, RuntimeMember};
    use crate::plan::{Thresholds, Timing};
    use crate::runtime::fake::{FakeRuntime, RuntimeCall, RuntimeOp};
    use etcd_operator_api::v1alpha2::{BackupDestination, BackupSpec, EtcdCluster, VolumeDestination};
    use std::time::Duration;

    type Ctx = Context<FakeRuntime, FakeMemberOps>;

    fn cluster() -> ClusterRef {
        ClusterRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
        }
    }

    fn spec() -> ValidatedCluster {
        ValidatedCluster::for_test(EtcdCluster::default())
    }

    fn config(version: &str) -> MemberConfig {
        MemberConfig {
            version: version.into(),
            initial_cluster: vec![("a".into(), "http://a:2380".into())],
            initial_state: InitialState::New,
            cluster_token: "t".into(),
            previous_version: None,
            restore: None,
        }
    }

    fn running(name: &str) -> RuntimeMember {
        RuntimeMember {
            name: name.into(),
            peer_url: format!("http://{name}:2380"),
            client_url: format!("http://{name}:2379"),
            config: Some(config("3.5.0")),
            liveness: Liveness::Running,
            certificates: None,
            restarts: 0,
            template_hash: None,
            volume: None,
            created: None,
        }
    }

    /// a (leader), b, c as voters; d a learner.
    fn view() -> EtcdView {
        let mut d = healthy_member(4, "d", "3.5.0", 1);
        d.learner = true;
        EtcdView {
            cluster_id: 9,
            members: vec![
                healthy_member(1, "a", "3.5.0", 1),
                healthy_member(2, "b", "3.5.0", 1),
                healthy_member(3, "c", "3.5.0", 1),
                d,
            ],
            leader: 1,
            alarms: Vec::new(),
        }
    }

    fn observed(view: Option<EtcdView>) -> Observed {
        Observed {
            authority: None,
            runtime: ["a", "b", "c", "d"].into_iter().map(running).collect(),
            etcd: view,
            timing: Timing::default(),
        }
    }

    fn ctx(runtime: FakeRuntime, members: FakeMemberOps) -> Ctx {
        // The API client is never called by `act`; a mock service that answers nothing will do.
        let (service, _handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        Context::with_member_ops(
            kube::Client::new(service, "default"),
            runtime,
            Thresholds::default(),
            members,
        )
    }

    fn setup() -> Ctx {
        ctx(
            FakeRuntime::new(["a", "b", "c", "d"].into_iter().map(running).collect(), None),
            FakeMemberOps::new(Some(view())),
        )
    }

    async fn run(ctx: &Ctx, step: Step) -> (Result<Acted, StepError>, Option<RollRecord>) {
        run_with(ctx, step, &spec(), None).await
    }

    async fn run_with(
        ctx: &Ctx,
        step: Step,
        spec: &ValidatedCluster,
        mut roll: Option<RollRecord>,
    ) -> (Result<Acted, StepError>, Option<RollRecord>) {
        let result = act(&step, &cluster(), spec, &observed(Some(view())), ctx, &mut roll).await;
        (result, roll)
    }

    fn voters() -> Vec<String> {
        ["a", "b", "c"]
            .iter()
            .map(|n| format!("http://{n}:2379"))
            .collect()
    }

    fn unknown(name: &str) -> RuntimeError {
        RuntimeError::UnknownMember { name: name.into() }
    }

    fn timeout(op: &'static str) -> MemberOpError {
        MemberOpError::Timeout {
            op,
            after: Duration::from_secs(3),
        }
    }

    fn not_yet(op: &'static str) -> MemberOpError {
        MemberOpError::NotReadyYet {
            op,
            detail: "etcdserver: unhealthy cluster".into(),
        }
    }

    #[tokio::test]
    async fn reservations_and_starts_go_to_the_runtime() {
        let ctx = setup();
        let names = vec!["x".to_string(), "y".to_string()];
        let (result, _) = run(&ctx, Step::ReserveForBootstrap { names }).await;
        assert!(result.is_ok(), "{result:?}");
        let (result, _) = run(&ctx, Step::ReserveForJoin { name: "z".into() }).await;
        assert!(result.is_ok(), "{result:?}");
        let members = vec![
            ("x".to_string(), config("3.5.1")),
            ("y".to_string(), config("3.5.1")),
        ];
        let (result, _) = run(&ctx, Step::Start { members }).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(
            ctx.runtime.calls(),
            [
                RuntimeCall::Reserve("x".into()),
                RuntimeCall::Reserve("y".into()),
                RuntimeCall::Reserve("z".into()),
                RuntimeCall::Start("x".into(), "3.5.1".into()),
                RuntimeCall::Start("y".into(), "3.5.1".into()),
            ]
        );
        assert!(ctx.members.actions().is_empty());

        // A failure stops the step at once and is the runtime's error.
        ctx.runtime.fail_next(RuntimeOp::Reserve, unknown("p"));
        let (result, _) = run(
            &ctx,
            Step::ReserveForBootstrap {
                names: vec!["p".into(), "q".into()],
            },
        )
        .await;
        let err = result.unwrap_err();
        assert_eq!(
            (err.reason(), err.code()),
            ("StepFailed", "RuntimeFailed"),
            "{err}"
        );
        assert_eq!(
            ctx.runtime.calls().last(),
            Some(&RuntimeCall::Reserve("p".into()))
        );
        ctx.runtime.fail_next(RuntimeOp::Start, unknown("x"));
        let (result, _) = run(
            &ctx,
            Step::Start {
                members: vec![("x".to_string(), config("3.5.1"))],
            },
        )
        .await;
        assert!(matches!(
            result,
            Err(StepError::Runtime(RuntimeError::UnknownMember { .. }))
        ));
    }

    #[tokio::test]
    async fn a_learner_is_added_and_promoted_through_the_running_voters_only() {
        let ctx = setup();
        let (result, _) = run(
            &ctx,
            Step::AddLearner {
                name: "e".into(),
                peer_url: "http://e:2380".into(),
            },
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
        let (result, _) = run(
            &ctx,
            Step::Promote {
                id: 4,
                name: "d".into(),
            },
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(
            ctx.members.actions(),
            [
                Call::AddLearner {
                    endpoints: voters(),
                    peer_url: "http://e:2380".into()
                },
                Call::Promote {
                    endpoints: voters(),
                    id: 4
                },
            ]
        );
        let now = ctx.members.view().unwrap();
        assert!(
            now.members
                .iter()
                .any(|m| m.peer_urls == ["http://e:2380"] && m.learner)
        );
        assert!(now.members.iter().any(|m| m.id == 4 && !m.learner));
    }

    #[tokio::test]
    async fn etcd_saying_not_yet_is_no_failure_but_other_errors_are() {
        let ctx = setup();
        ctx.members.fail_next(Op::AddLearner, not_yet("member add"));
        ctx.members.fail_next(Op::Promote, not_yet("member promote"));
        let add = Step::AddLearner {
            name: "e".into(),
            peer_url: "http://e:2380".into(),
        };
        let promote = Step::Promote {
            id: 4,
            name: "d".into(),
        };
        assert!(run(&ctx, add.clone()).await.0.is_ok());
        assert!(run(&ctx, promote.clone()).await.0.is_ok());
        // Nothing changed: the fake applied neither.
        assert_eq!(ctx.members.view(), Some(view()));

        ctx.members.fail_next(Op::AddLearner, timeout("member add"));
        let err = run(&ctx, add).await.0.unwrap_err();
        assert_eq!((err.reason(), err.code()), ("StepFailed", "EtcdTimeout"), "{err}");
        ctx.members
            .fail_next(Op::Promote, MemberOpError::NoEndpoint { op: "member promote" });
        let err = run(&ctx, promote).await.0.unwrap_err();
        assert_eq!(err.code(), "EtcdCallFailed", "{err}");
    }

    #[tokio::test]
    async fn leadership_moves_through_the_leaders_own_url() {
        let ctx = setup();
        let (result, _) = run(&ctx, Step::MoveLeader { from: 1, to: 2 }).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(
            ctx.members.actions(),
            [Call::MoveLeader {
                leader_url: "http://a:2379".into(),
                to: 2
            }]
        );
        ctx.members.fail_next(Op::MoveLeader, timeout("move leader"));
        let err = run(&ctx, Step::MoveLeader { from: 1, to: 2 })
            .await
            .0
            .unwrap_err();
        assert!(
            matches!(err, StepError::Member(MemberOpError::Timeout { .. })),
            "{err}"
        );
        // A leader etcd does not list (or that has no client URL) cannot be asked.
        let err = run(&ctx, Step::MoveLeader { from: 77, to: 2 })
            .await
            .0
            .unwrap_err();
        assert!(matches!(err, StepError::LeaderUnreachable { id: 77 }), "{err}");
        assert_eq!(
            ctx.members.actions().len(),
            2,
            "nothing was sent for the unknown leader"
        );
    }

    #[tokio::test]
    async fn an_announced_replacement_warns_through_the_runtime_and_is_remembered_touching_nothing() {
        let ctx = setup();
        let step = Step::AnnounceReplacement {
            id: 3,
            name: "c".into(),
            cause: crate::plan::ReplacementCause::CrashLoop {
                reason: "the process exited".into(),
                failed_starts: 4,
                down_for: Duration::from_secs(320),
            },
            awaiting_request: false,
        };
        let (result, _) = run(&ctx, step).await;
        assert!(result.is_ok(), "{result:?}");
        let calls = ctx.runtime.calls();
        let [RuntimeCall::AnnounceReplacement(member, note)] = calls.as_slice() else {
            panic!("{calls:?}")
        };
        assert_eq!(member, "c");
        assert!(
            note.starts_with(
                "member c will be replaced by a fresh member: it cannot start: failed 4 time(s)"
            ),
            "{note}"
        );
        // Nothing was removed, and no etcd call made.
        assert_eq!(ctx.members.actions(), []);
        assert_eq!(ctx.runtime.held().len(), 4);
        let remembered = ctx
            .memory
            .lock()
            .unwrap()
            .get("ns/c")
            .map(|m| m.announced.clone());
        assert_eq!(remembered, Some([("c".to_owned(), note.clone())].into()));

        // Manual: the note says how to ask.
        let step = Step::AnnounceReplacement {
            id: 2,
            name: "b".into(),
            cause: crate::plan::ReplacementCause::Unhealthy {
                down_for: Duration::from_secs(700),
            },
            awaiting_request: true,
        };
        let (result, _) = run(&ctx, step).await;
        assert!(result.is_ok(), "{result:?}");
        let calls = ctx.runtime.calls();
        let Some(RuntimeCall::AnnounceReplacement(_, note)) = calls.last() else {
            panic!("{calls:?}")
        };
        assert!(note.contains("etcd.operator.dev/replace-member=b"), "{note}");
    }

    #[tokio::test]
    async fn a_member_is_removed_through_the_others_and_then_deleted() {
        let ctx = setup();
        let remove = Step::RemoveFromEtcd {
            id: 3,
            name: "c".into(),
            reason: "scale down".into(),
        };
        let (result, _) = run(&ctx, remove.clone()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(
            ctx.members.actions(),
            [Call::Remove {
                endpoints: vec!["http://a:2379".into(), "http://b:2379".into()],
                id: 3
            }]
        );
        let (result, _) = run(
            &ctx,
            Step::DeleteRuntimeMember {
                name: "c".into(),
                reason: "removed".into(),
            },
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(ctx.runtime.calls(), [RuntimeCall::Remove("c".into(), false)]);
        assert!(ctx.runtime.held().iter().all(|m| m.name != "c"));

        ctx.members.fail_next(Op::Remove, timeout("member remove"));
        assert!(matches!(run(&ctx, remove).await.0, Err(StepError::Member(_))));
        ctx.runtime.fail_next(RuntimeOp::Remove, unknown("b"));
        let err = run(
            &ctx,
            Step::DeleteRuntimeMember {
                name: "b".into(),
                reason: "removed".into(),
            },
        )
        .await
        .0
        .unwrap_err();
        assert_eq!(err.code(), "RuntimeFailed");
    }

    #[tokio::test]
    async fn a_failed_bootstrap_is_wiped_with_its_memory() {
        let ctx = setup();
        if let Ok(mut memory) = ctx.memory.lock() {
            memory.entry(cluster().key()).or_default().bootstrap_since = Some(std::time::Instant::now());
        }
        let wipe = Step::WipeBootstrap {
            reason: "did not form".into(),
        };
        let (result, _) = run(&ctx, wipe.clone()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(ctx.runtime.calls(), [RuntimeCall::Teardown(false)]);
        assert!(ctx.runtime.held().is_empty());
        assert!(ctx.memory.lock().unwrap().get(&cluster().key()).is_none());
        ctx.runtime.fail_next(RuntimeOp::Teardown, unknown("a"));
        assert!(run(&ctx, wipe).await.0.is_err());
    }

    fn upgrade() -> Step {
        Step::SnapshotBeforeUpgrade {
            from: "3.5.0".into(),
            to: "3.5.1".into(),
        }
    }

    #[tokio::test]
    async fn the_pre_upgrade_snapshot_is_taken_from_the_leader_beside_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx(
            FakeRuntime::new(Vec::new(), Some(dir.path().to_path_buf())),
            FakeMemberOps::new(Some(view())),
        );
        let (result, roll) = run(&ctx, upgrade()).await;
        assert!(result.is_ok(), "{result:?}");
        let file = dir.path().join("pre-upgrade-3.5.0-to-3.5.1-42.db");
        assert!(file.exists());
        assert_eq!(
            roll,
            Some(RollRecord {
                from: "3.5.0".into(),
                target: "3.5.1".into(),
                snapshot: Some(file.display().to_string()),
                ..Default::default()
            })
        );
        assert_eq!(
            ctx.members.actions(),
            [Call::SaveSnapshot {
                endpoint: "http://a:2379".into(),
                dir: dir.path().to_path_buf(),
                prefix: "pre-upgrade-3.5.0-to-3.5.1".into(),
            }]
        );
    }

    #[tokio::test]
    async fn the_pre_upgrade_snapshot_also_goes_to_the_backup_destination() {
        let beside = tempfile::tempdir().unwrap();
        let backups = tempfile::tempdir().unwrap();
        let mut cluster = EtcdCluster::default();
        cluster.spec.backup = Some(Box::new(BackupSpec {
            schedule: "0 * * * *".into(),
            retention: None,
            destination: BackupDestination {
                s3: None,
                volume: Some(VolumeDestination {
                    claim_name: None,
                    path: Some(backups.path().display().to_string()),
                }),
            },
        }));
        let spec = ValidatedCluster::for_test(cluster.clone());
        // With a place beside the data: saved there, and the same file sent.
        let ctx1 = ctx(
            FakeRuntime::new(Vec::new(), Some(beside.path().to_path_buf())),
            FakeMemberOps::new(Some(view())),
        );
        let (result, roll) = run_with(&ctx1, upgrade(), &spec, None).await;
        assert!(result.is_ok(), "{result:?}");
        let kept = roll.and_then(|r| r.snapshot).unwrap_or_default();
        assert!(kept.contains(" and "), "{kept}");
        let sent: Vec<_> = walk(backups.path());
        assert!(
            sent.iter()
                .any(|p| p.ends_with(".db") && p.contains("pre-upgrade-3.5.0-to-3.5.1")),
            "{sent:?}"
        );
        assert!(sent.iter().any(|p| p.ends_with(".sha256")), "{sent:?}");
        // Without one (Kubernetes): streamed from the leader and sent.
        let ctx2 = ctx(
            FakeRuntime::new(Vec::new(), None),
            FakeMemberOps::new(Some(view())),
        );
        let (result, _) = run_with(&ctx2, upgrade(), &spec, None).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(
            ctx2.members.actions(),
            [Call::Snapshot {
                endpoint: "http://a:2379".into()
            }]
        );
        // A destination that cannot be written is its own failure.
        let mut broken = cluster;
        if let Some(b) = broken.spec.backup.as_mut() {
            // A claim cannot be reached by an operator running outside Kubernetes.
            b.destination.volume = Some(VolumeDestination {
                claim_name: Some("backups".into()),
                path: None,
            });
        }
        let broken = ValidatedCluster::for_test(broken);
        let (result, roll) = run_with(&ctx2, upgrade(), &broken, None).await;
        let err = result.unwrap_err();
        assert_eq!(err.code(), "BackupDestinationFailed", "{err}");
        assert_eq!(roll, None, "no roll starts without its snapshot");
    }

    #[tokio::test]
    async fn older_manual_and_pre_upgrade_snapshots_go_by_retention_after_a_new_one() {
        let beside = tempfile::tempdir().unwrap();
        let backups = tempfile::tempdir().unwrap();
        // Four older snapshots beside the data.
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        for (i, name) in ["p-1.db", "p-2.db", "p-3.db", "p-4.db"].iter().enumerate() {
            let file = std::fs::File::create(beside.path().join(name)).unwrap();
            file.set_modified(hour_ago + Duration::from_secs(i as u64))
                .unwrap();
        }
        // In the destination: three older manual snapshots and a scheduled one.
        let manual = backups.path().join("ns/c/manual");
        std::fs::create_dir_all(&manual).unwrap();
        for name in [
            "b1-20260101T000000Z-1.db",
            "pre-upgrade-3.4.23-to-3.5.0-20260102T000000Z-2.db",
            "b2-20260103T000000Z-3.db",
        ] {
            std::fs::write(manual.join(name), b"old").unwrap();
            std::fs::write(manual.join(format!("{name}.sha256")), b"sum").unwrap();
        }
        std::fs::write(backups.path().join("ns/c/20260101T000000Z-1.db"), b"scheduled").unwrap();
        let mut cluster = EtcdCluster::default();
        cluster.spec.backup = Some(Box::new(BackupSpec {
            schedule: "0 * * * *".into(),
            retention: Some(etcd_operator_api::v1alpha2::BackupRetention {
                max_count: Some(2),
                max_age: None,
            }),
            destination: BackupDestination {
                s3: None,
                volume: Some(VolumeDestination {
                    claim_name: None,
                    path: Some(backups.path().display().to_string()),
                }),
            },
        }));
        let ctx = ctx(
            FakeRuntime::new(Vec::new(), Some(beside.path().to_path_buf())),
            FakeMemberOps::new(Some(view())),
        );
        let (result, _) = run_with(&ctx, upgrade(), &ValidatedCluster::for_test(cluster), None).await;
        assert!(result.is_ok(), "{result:?}");
        // Beside the data: the new one and the two newest older ones.
        let mut left: Vec<String> = std::fs::read_dir(beside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["p-3.db", "p-4.db", "pre-upgrade-3.5.0-to-3.5.1-42.db"]);
        // In the destination: the new one and the newest older manual one, with their
        // sidecars; the scheduled snapshot is not the manual retention's business.
        let mut sent: Vec<String> = std::fs::read_dir(&manual)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".db"))
            .collect();
        sent.sort();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[0], "b2-20260103T000000Z-3.db");
        assert!(sent[1].starts_with("pre-upgrade-3.5.0-to-3.5.1-"), "{sent:?}");
        assert!(!manual.join("b1-20260101T000000Z-1.db.sha256").exists());
        assert!(backups.path().join("ns/c/20260101T000000Z-1.db").exists());
    }

    fn walk(dir: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path.display().to_string());
            }
        }
        out
    }

    #[tokio::test]
    async fn without_a_place_or_a_healthy_member_the_snapshot_is_skipped_or_refused() {
        // No place at all: the roll goes on, and says why it has no snapshot.
        let ctx1 = setup();
        let (result, roll) = run(&ctx1, upgrade()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(roll.and_then(|r| r.snapshot).as_deref(), Some(SNAPSHOT_NOT_TAKEN));
        assert!(ctx1.members.actions().is_empty());

        let dir = tempfile::tempdir().unwrap();
        let ctx2 = ctx(
            FakeRuntime::new(Vec::new(), Some(dir.path().to_path_buf())),
            FakeMemberOps::new(None),
        );
        let mut roll = None;
        let silent = observed(None);
        let err = act(&upgrade(), &cluster(), &spec(), &silent, &ctx2, &mut roll)
            .await
            .unwrap_err();
        assert!(matches!(err, StepError::NoSnapshotSource), "{err}");
        let mut sick = view();
        for m in &mut sick.members {
            m.status = None;
        }
        let err = act(
            &upgrade(),
            &cluster(),
            &spec(),
            &observed(Some(sick)),
            &ctx2,
            &mut roll,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, StepError::NoSnapshotSource), "{err}");

        ctx2.members.fail_next_snapshot(SnapshotError::Timeout {
            endpoint: "http://a:2379".into(),
            after: Duration::from_secs(600),
        });
        let (result, roll) = run(&ctx2, upgrade()).await;
        let err = result.unwrap_err();
        assert_eq!(
            (err.reason(), err.code()),
            ("StepFailed", "SnapshotFailed"),
            "{err}"
        );
        assert_eq!(roll, None);
    }

    fn rolling() -> Option<RollRecord> {
        Some(RollRecord {
            from: "3.5.0".into(),
            target: "3.5.1".into(),
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn a_version_change_restarts_the_member_and_a_missing_version_halts_the_roll() {
        let ctx = setup();
        let change = Step::ChangeVersion {
            name: "b".into(),
            from: "3.5.0".into(),
            to: "3.5.1".into(),
        };
        let (result, roll) = run_with(&ctx, change.clone(), &spec(), rolling()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(roll, rolling(), "a successful change leaves the roll as it was");
        let b = ctx.runtime.held().into_iter().find(|m| m.name == "b").unwrap();
        let config = b.config.unwrap();
        assert_eq!(
            (config.version.as_str(), config.previous_version.as_deref()),
            ("3.5.1", Some("3.5.0"))
        );

        ctx.runtime.fail_next(
            RuntimeOp::ChangeVersion,
            RuntimeError::VersionUnavailable {
                version: "3.5.1".into(),
                detail: "no binary".into(),
            },
        );
        let (result, roll) = run_with(&ctx, change.clone(), &spec(), rolling()).await;
        assert!(
            result.is_ok(),
            "a version that cannot run halts the roll instead: {result:?}"
        );
        let roll = roll.unwrap();
        assert!(
            roll.halted
                .as_deref()
                .is_some_and(|h| h.contains("not available")),
            "{roll:?}"
        );
        assert_eq!(roll.failed_member, None);

        ctx.runtime.fail_next(RuntimeOp::ChangeVersion, unknown("b"));
        let (result, roll) = run_with(&ctx, change, &spec(), rolling()).await;
        assert!(matches!(
            result,
            Err(StepError::Runtime(RuntimeError::UnknownMember { .. }))
        ));
        assert_eq!(roll, rolling());
    }

    #[tokio::test]
    async fn a_certificate_renewal_goes_to_the_runtime_under_the_asked_rotation() {
        let ctx = setup();
        let mut cluster = EtcdCluster::default();
        cluster.metadata.annotations = Some(
            [(
                etcd_operator_api::v1alpha2::ROTATE_CERTIFICATES_ANNOTATION.to_owned(),
                "r2".to_owned(),
            )]
            .into(),
        );
        let renew = Step::RenewCertificates {
            name: "c".into(),
            reason: crate::plan::RenewalReason::Requested {
                rotation: "r2".into(),
            },
        };
        let (result, roll) = run_with(
            &ctx,
            renew.clone(),
            &ValidatedCluster::for_test(cluster),
            rolling(),
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(roll, rolling(), "a renewal leaves a roll record as it was");
        assert_eq!(
            ctx.runtime.calls(),
            vec![RuntimeCall::RenewCertificates("c".into(), Some("r2".into()))]
        );
        let c = ctx.runtime.held().into_iter().find(|m| m.name == "c").unwrap();
        assert_eq!(c.certificates.unwrap().rotation.as_deref(), Some("r2"));

        // The runtime's failure is the step's, typed.
        ctx.runtime.fail_next(
            RuntimeOp::RenewCertificates,
            RuntimeError::Certificates {
                what: "c".into(),
                detail: "disk full".into(),
            },
        );
        let (result, _) = run(&ctx, renew).await;
        let Err(StepError::Runtime(RuntimeError::Certificates { detail, .. })) = result else {
            panic!("expected the certificate error: {result:?}")
        };
        assert_eq!(detail, "disk full");
    }

    #[tokio::test]
    async fn a_quorum_recovery_rebuilds_from_the_survivor_only_and_a_runtime_without_it_refuses() {
        let ctx = setup();
        let recover = Step::RecoverQuorum {
            survivor: "a".into(),
            lost: vec!["b".into(), "c".into()],
            applied_index: Some(42),
            request: "auto".into(),
        };
        let (result, roll) = run(&ctx, recover.clone()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(roll, None, "a recovery records no roll");
        // Only the runtime is asked (the members are unreachable), and only for the survivor.
        assert_eq!(ctx.runtime.calls(), vec![RuntimeCall::RecoverQuorum("a".into())]);
        assert_eq!(ctx.members.actions(), vec![], "no etcd member operation");
        let held: Vec<String> = ctx.runtime.held().into_iter().map(|m| m.name).collect();
        assert_eq!(
            held,
            vec!["a".to_owned()],
            "the lost members are given up in the runtime"
        );

        // A runtime that cannot recover refuses with its typed error, and nothing else happens.
        let ctx = setup();
        ctx.runtime.fail_next(
            RuntimeOp::RecoverQuorum,
            RuntimeError::Unsupported {
                operation: "quorum recovery",
                runtime: "kubernetes",
            },
        );
        let (result, _) = run(&ctx, recover).await;
        assert!(
            matches!(result, Err(StepError::Runtime(RuntimeError::Unsupported { .. }))),
            "{result:?}"
        );
        assert_eq!(ctx.runtime.held().len(), 4, "no member was given up");
    }

    #[tokio::test]
    async fn space_is_reclaimed_by_compacting_defragmenting_followers_first_then_disarming() {
        use crate::model::{AlarmKind, MemberAlarm};
        let ctx = setup();
        let alarm = MemberAlarm {
            member: 1,
            alarm: AlarmKind::NoSpace,
        };
        let (result, _) = run(&ctx, Step::ReclaimSpace { alarms: vec![alarm] }).await;
        let Ok(Acted::Reclaimed(record)) = &result else {
            panic!("a reclaim is recorded: {result:?}")
        };
        let calls = ctx.members.calls();
        let Some(Call::Compact(_)) = calls.first() else {
            panic!("compaction first: {calls:?}")
        };
        let defragmented: Vec<&str> = calls
            .iter()
            .filter_map(|c| match c {
                Call::Defragment(url) => Some(url.as_str()),
                _ => None,
            })
            .collect();
        let view = view();
        let leader_url = view
            .members
            .iter()
            .find(|m| m.id == view.leader)
            .and_then(|m| m.client_urls.first())
            .unwrap();
        assert_eq!(defragmented.len(), view.members.len(), "{calls:?}");
        assert_eq!(defragmented.last(), Some(&leader_url.as_str()), "the leader last");
        assert!(
            matches!(calls.last(), Some(Call::Disarm(_, a)) if *a == alarm),
            "{calls:?}"
        );
        // What status records: the compaction's revision, the members in the order they were
        // defragmented (by name), the member whose alarm was disarmed.
        assert_eq!(record.compacted_revision, Some(100), "the fake compacts at 100");
        let name_of = |url: &str| {
            view.members
                .iter()
                .find(|m| m.client_urls.first().map(String::as_str) == Some(url))
                .map(|m| m.name.clone())
                .unwrap()
        };
        let names: Vec<String> = defragmented.iter().map(|u| name_of(u)).collect();
        assert_eq!(record.defragmented, names);
        let alarmed = view.members.iter().find(|m| m.id == 1).unwrap();
        assert_eq!(record.disarmed, vec![alarmed.name.clone()]);
        assert_eq!(record.time, None, "the caller stamps it");

        // A failed maintenance call stops the step before anything is disarmed.
        let ctx = setup();
        ctx.members.fail_next(Op::Maintenance, timeout("compact"));
        let (result, _) = run(&ctx, Step::ReclaimSpace { alarms: vec![alarm] }).await;
        assert!(
            matches!(result, Err(StepError::Member(MemberOpError::Timeout { .. }))),
            "{result:?}"
        );
        assert!(!ctx.members.calls().iter().any(|c| matches!(c, Call::Disarm(..))));
    }

    #[tokio::test]
    async fn space_is_reclaimed_on_the_members_that_answer_only() {
        use crate::model::{AlarmKind, MemberAlarm};
        let ctx = setup();
        let alarm = MemberAlarm {
            member: 1,
            alarm: AlarmKind::NoSpace,
        };
        let mut seen = view();
        seen.members[2].status = None; // c did not answer
        let c_url = seen.members[2].client_urls[0].clone();
        let mut roll = None;
        let result = act(
            &Step::ReclaimSpace { alarms: vec![alarm] },
            &cluster(),
            &spec(),
            &observed(Some(seen.clone())),
            &ctx,
            &mut roll,
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
        let defragmented: Vec<String> = ctx
            .members
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Defragment(url) => Some(url),
                _ => None,
            })
            .collect();
        assert_eq!(defragmented.len(), seen.members.len() - 1, "{defragmented:?}");
        assert!(!defragmented.contains(&c_url), "{defragmented:?}");
        assert!(
            ctx.members
                .calls()
                .iter()
                .any(|c| matches!(c, Call::Disarm(_, a) if *a == alarm)),
            "the alarm is disarmed all the same"
        );
    }

    #[tokio::test]
    async fn a_defragmentation_goes_to_that_member_alone() {
        let ctx = setup();
        let b_url = view().members[1].client_urls[0].clone();
        let step = Step::Defragment {
            name: "b".into(),
            id: 2,
            trigger: crate::plan::DefragTrigger::Fragmentation,
            db_size: 200 << 20,
            db_size_in_use: 50 << 20,
        };
        let (result, _) = run(&ctx, step.clone()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(ctx.members.calls(), [Call::Defragment(b_url)]);
        assert!(ctx.runtime.calls().is_empty(), "{:?}", ctx.runtime.calls());

        // A failure surfaces as the member call's error.
        let ctx = setup();
        ctx.members.fail_next(Op::Maintenance, timeout("defragment"));
        let (result, _) = run(&ctx, step.clone()).await;
        assert!(
            matches!(result, Err(StepError::Member(MemberOpError::Timeout { .. }))),
            "{result:?}"
        );
        // A member etcd no longer lists (or without a client URL) is not guessed at.
        let ctx = setup();
        let gone = Step::Defragment {
            name: "z".into(),
            id: 77,
            trigger: crate::plan::DefragTrigger::Schedule,
            db_size: 0,
            db_size_in_use: 0,
        };
        let (result, _) = run(&ctx, gone).await;
        let err = result.unwrap_err();
        assert!(
            matches!(err, StepError::DefragmentUnreachable { ref name } if name == "z"),
            "{err}"
        );
        assert_eq!(err.code(), "EtcdCallFailed");
        assert!(ctx.members.calls().is_empty());
    }

    #[tokio::test]
    async fn a_rollback_or_a_halt_records_the_member_and_why() {
        let ctx = setup();
        let back = Step::RollBack {
            name: "b".into(),
            from: "3.5.1".into(),
            to: "3.5.0".into(),
            reason: "member b did not become healthy".into(),
        };
        let (result, roll) = run_with(&ctx, back.clone(), &spec(), rolling()).await;
        assert!(result.is_ok(), "{result:?}");
        let roll = roll.unwrap();
        assert_eq!(roll.failed_member.as_deref(), Some("b"));
        assert_eq!(
            roll.halted.as_deref(),
            Some("member b did not become healthy; it was started again on etcd 3.5.0")
        );
        let halt = Step::HaltUpgrade {
            name: "c".into(),
            reason: "it stays stopped".into(),
        };
        let (result, roll) = run_with(&ctx, halt.clone(), &spec(), rolling()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(roll.unwrap().halted.as_deref(), Some("it stays stopped"));
        assert_eq!(
            ctx.runtime.calls(),
            [
                RuntimeCall::ChangeVersion("b".into(), "3.5.0".into()),
                RuntimeCall::Stop("c".into())
            ]
        );
        assert!(matches!(
            ctx.runtime
                .held()
                .iter()
                .find(|m| m.name == "c")
                .map(|m| &m.liveness),
            Some(Liveness::Gone {
                restartable: true,
                ..
            })
        ));

        // Failures leave the roll untouched: the step is retried.
        ctx.runtime.fail_next(RuntimeOp::ChangeVersion, unknown("b"));
        let (result, roll) = run_with(&ctx, back, &spec(), rolling()).await;
        assert!(result.is_err());
        assert_eq!(roll, rolling());
        ctx.runtime.fail_next(RuntimeOp::Stop, unknown("c"));
        let (result, roll) = run_with(&ctx, halt, &spec(), rolling()).await;
        assert!(result.is_err());
        assert_eq!(roll, rolling());
    }

    #[tokio::test]
    async fn waiting_and_idling_touch_nothing() {
        let ctx = setup();
        for step in [
            Step::Idle,
            Step::Wait {
                reason: crate::plan::WaitReason::MembersNotHealthy,
            },
        ] {
            let (result, roll) = run(&ctx, step).await;
            assert!(result.is_ok());
            assert_eq!(roll, None);
        }
        assert!(ctx.runtime.calls().is_empty());
        assert!(ctx.members.actions().is_empty());
    }
}
