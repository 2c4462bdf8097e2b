//! A [`MemberOps`] that answers from memory: a member list the test sets, the effect of every
//! membership call applied to it (a learner added, promoted, a member removed, leadership moved),
//! every call recorded, and failures scripted per operation. For unit tests of the reconciler's
//! steps without etcd; also usable by other crates' tests.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use super::{MemberOpError, MemberOps, SavedSnapshot, Snapshot, SnapshotError};
use crate::model::{EtcdMember, EtcdView, MemberHealth};
use crate::tls::member::ClientTls;

/// The operations a failure can be scripted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// [`MemberOps::observe`] (the view is left as it is).
    Observe,
    /// [`MemberOps::add_learner`].
    AddLearner,
    /// [`MemberOps::promote`].
    Promote,
    /// [`MemberOps::remove`].
    Remove,
    /// [`MemberOps::move_leader`].
    MoveLeader,
    /// [`MemberOps::compact`], [`MemberOps::defragment`] and [`MemberOps::disarm`].
    Maintenance,
    /// [`MemberOps::snapshot`] and [`MemberOps::save_snapshot`].
    Snapshot,
}

/// A call the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `observe(endpoints)`.
    Observe(Vec<String>),
    /// `use_tls(endpoints, tls)`, with the identity's fingerprint.
    UseTls(Vec<String>, Option<String>),
    /// `add_learner(endpoints, peer_url)`.
    AddLearner {
        /// Where it was sent.
        endpoints: Vec<String>,
        /// The new member's peer URL.
        peer_url: String,
    },
    /// `promote(endpoints, id)`.
    Promote {
        /// Where it was sent.
        endpoints: Vec<String>,
        /// The learner.
        id: u64,
    },
    /// `remove(endpoints, id)`.
    Remove {
        /// Where it was sent.
        endpoints: Vec<String>,
        /// The member.
        id: u64,
    },
    /// `compact(endpoints)`.
    Compact(Vec<String>),
    /// `defragment(endpoint)`.
    Defragment(String),
    /// `disarm(endpoints, alarm)`.
    Disarm(Vec<String>, crate::model::MemberAlarm),
    /// `enable_downgrade(endpoints, version)`.
    EnableDowngrade(Vec<String>, String),
    /// `move_leader(leader_url, to)`.
    MoveLeader {
        /// Where it was sent.
        leader_url: String,
        /// The new leader.
        to: u64,
    },
    /// `snapshot(endpoint)`.
    Snapshot {
        /// The member asked.
        endpoint: String,
    },
    /// `save_snapshot(endpoint, dir, prefix)`.
    SaveSnapshot {
        /// The member asked.
        endpoint: String,
        /// The directory.
        dir: PathBuf,
        /// The file name prefix.
        prefix: String,
    },
}

/// A scripted failure.
#[derive(Debug)]
enum Failure {
    Member(MemberOpError),
    Snapshot(SnapshotError),
}

#[derive(Debug, Default)]
struct State {
    view: Option<EtcdView>,
    calls: Vec<Call>,
    failures: VecDeque<(Op, Failure)>,
    next_id: u64,
    revision: i64,
}

/// The fake. See the module documentation.
#[derive(Debug, Default)]
pub struct FakeMemberOps {
    state: Mutex<State>,
}

/// The revision fake snapshots report.
pub const FAKE_REVISION: i64 = 42;

/// A valid snapshot as etcd streams it: one page of database and etcd's trailing SHA-256.
pub fn fake_snapshot_bytes() -> Vec<u8> {
    let mut data = vec![0x5a; 512];
    let hash = Sha256::digest(&data);
    data.extend_from_slice(&hash);
    data
}

impl FakeMemberOps {
    /// A fake whose cluster is `view` (`None`: no member answers).
    pub fn new(view: Option<EtcdView>) -> Self {
        Self {
            state: Mutex::new(State {
                view,
                next_id: 0x1000,
                revision: FAKE_REVISION,
                ..Default::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock poisons it; the state is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What `observe` answers from now on.
    pub fn set_view(&self, view: Option<EtcdView>) {
        self.state().view = view;
    }

    /// The cluster as the fake holds it now (after the effects of the calls so far).
    pub fn view(&self) -> Option<EtcdView> {
        self.state().view.clone()
    }

    /// The next call of `op` fails with `error` (and changes nothing).
    pub fn fail_next(&self, op: Op, error: MemberOpError) {
        self.state().failures.push_back((op, Failure::Member(error)));
    }

    /// The next snapshot fails with `error`.
    pub fn fail_next_snapshot(&self, error: SnapshotError) {
        self.state()
            .failures
            .push_back((Op::Snapshot, Failure::Snapshot(error)));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The calls so far other than `observe` and `use_tls`.
    pub fn actions(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| !matches!(c, Call::Observe(_) | Call::UseTls(..)))
            .collect()
    }

    fn record(&self, call: Call, op: Option<Op>) -> Result<(), Failure> {
        let mut state = self.state();
        state.calls.push(call);
        let Some(op) = op else { return Ok(()) };
        match state.failures.iter().position(|(o, _)| *o == op) {
            Some(i) => match state.failures.remove(i) {
                Some((_, failure)) => Err(failure),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    fn member_result(&self, call: Call, op: Op) -> Result<(), MemberOpError> {
        match self.record(call, Some(op)) {
            Ok(()) => Ok(()),
            Err(Failure::Member(e)) => Err(e),
            Err(Failure::Snapshot(e)) => Err(MemberOpError::NotReadyYet {
                op: "scripted",
                detail: etcd_operator_api::report::chain(&e),
            }),
        }
    }

    fn snapshot_result(&self, call: Call, endpoint: &str) -> Result<(), SnapshotError> {
        match self.record(call, Some(Op::Snapshot)) {
            Ok(()) => Ok(()),
            Err(Failure::Snapshot(e)) => Err(e),
            Err(Failure::Member(source)) => Err(SnapshotError::Etcd {
                endpoint: endpoint.to_owned(),
                source,
            }),
        }
    }
}

impl MemberOps for FakeMemberOps {
    fn use_tls(&self, endpoints: &[String], tls: Option<&ClientTls>) {
        let _ = self.record(
            Call::UseTls(endpoints.to_vec(), tls.map(ClientTls::fingerprint)),
            None,
        );
    }

    async fn observe(&self, endpoints: &[String]) -> Result<EtcdView, MemberOpError> {
        if let Err(failure) = self.record(Call::Observe(endpoints.to_vec()), Some(Op::Observe)) {
            return Err(match failure {
                Failure::Member(e) => e,
                Failure::Snapshot(e) => MemberOpError::NotReadyYet {
                    op: "scripted",
                    detail: etcd_operator_api::report::chain(&e),
                },
            });
        }
        self.state()
            .view
            .clone()
            .ok_or(MemberOpError::NoEndpoint { op: "member list" })
    }

    async fn add_learner(&self, endpoints: &[String], peer_url: &str) -> Result<u64, MemberOpError> {
        self.member_result(
            Call::AddLearner {
                endpoints: endpoints.to_vec(),
                peer_url: peer_url.to_owned(),
            },
            Op::AddLearner,
        )?;
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        if let Some(view) = state.view.as_mut() {
            view.members.push(EtcdMember {
                id,
                name: String::new(),
                peer_urls: vec![peer_url.to_owned()],
                client_urls: Vec::new(),
                learner: true,
                status: None,
            });
        }
        Ok(id)
    }

    async fn promote(&self, endpoints: &[String], id: u64) -> Result<(), MemberOpError> {
        self.member_result(
            Call::Promote {
                endpoints: endpoints.to_vec(),
                id,
            },
            Op::Promote,
        )?;
        if let Some(m) = self
            .state()
            .view
            .as_mut()
            .and_then(|v| v.members.iter_mut().find(|m| m.id == id))
        {
            m.learner = false;
        }
        Ok(())
    }

    async fn remove(&self, endpoints: &[String], id: u64) -> Result<(), MemberOpError> {
        self.member_result(
            Call::Remove {
                endpoints: endpoints.to_vec(),
                id,
            },
            Op::Remove,
        )?;
        if let Some(view) = self.state().view.as_mut() {
            view.members.retain(|m| m.id != id);
        }
        Ok(())
    }

    /// Compacts at a fixed revision 100.
    async fn compact(&self, endpoints: &[String]) -> Result<i64, MemberOpError> {
        self.member_result(Call::Compact(endpoints.to_vec()), Op::Maintenance)?;
        Ok(100)
    }

    /// Defragmenting makes the member's database as large as what it uses.
    async fn defragment(&self, endpoint: &str) -> Result<(), MemberOpError> {
        self.member_result(Call::Defragment(endpoint.to_owned()), Op::Maintenance)?;
        if let Some(view) = self.state().view.as_mut() {
            for m in &mut view.members {
                if m.client_urls.iter().any(|u| u == endpoint)
                    && let Some(status) = m.status.as_mut()
                {
                    status.db_size = status.db_size_in_use;
                }
            }
        }
        Ok(())
    }

    async fn disarm(
        &self,
        endpoints: &[String],
        alarm: crate::model::MemberAlarm,
    ) -> Result<(), MemberOpError> {
        self.member_result(Call::Disarm(endpoints.to_vec(), alarm), Op::Maintenance)?;
        if let Some(view) = self.state().view.as_mut() {
            view.alarms.retain(|a| *a != alarm);
        }
        Ok(())
    }

    /// Records the call; the view's members report the lowered storage version and the enabled
    /// downgrade, as etcd 3.6 does.
    async fn enable_downgrade(&self, endpoints: &[String], version: &str) -> Result<(), MemberOpError> {
        self.member_result(
            Call::EnableDowngrade(endpoints.to_vec(), version.to_owned()),
            Op::Maintenance,
        )?;
        if let Some(view) = self.state().view.as_mut() {
            for status in view.members.iter_mut().filter_map(|m| m.status.as_mut()) {
                status.storage_version = Some(format!("{version}.0"));
                status.downgrade_target = Some(format!("{version}.0"));
            }
        }
        Ok(())
    }

    async fn move_leader(&self, leader_url: &str, to: u64) -> Result<(), MemberOpError> {
        self.member_result(
            Call::MoveLeader {
                leader_url: leader_url.to_owned(),
                to,
            },
            Op::MoveLeader,
        )?;
        if let Some(view) = self.state().view.as_mut() {
            view.leader = to;
            for m in &mut view.members {
                if let Some(status) = m.status.as_mut() {
                    status.leader = to;
                }
            }
        }
        Ok(())
    }

    async fn snapshot(&self, endpoint: &str) -> Result<Snapshot, SnapshotError> {
        self.snapshot_result(
            Call::Snapshot {
                endpoint: endpoint.to_owned(),
            },
            endpoint,
        )?;
        let data = fake_snapshot_bytes();
        Ok(Snapshot {
            sha256: hex::encode(Sha256::digest(&data)),
            data: bytes::Bytes::from(data),
            revision: self.state().revision,
            endpoint: endpoint.to_owned(),
            taken: chrono::Utc::now(),
        })
    }

    async fn snapshot_stream(&self, endpoint: &str) -> Result<super::SnapshotStream, SnapshotError> {
        self.snapshot_result(
            Call::Snapshot {
                endpoint: endpoint.to_owned(),
            },
            endpoint,
        )?;
        Ok(super::SnapshotStream::from_bytes(
            self.state().revision,
            endpoint,
            bytes::Bytes::from(fake_snapshot_bytes()),
            100,
        ))
    }

    async fn save_snapshot(
        &self,
        endpoint: &str,
        dir: &Path,
        prefix: &str,
    ) -> Result<SavedSnapshot, SnapshotError> {
        self.snapshot_result(
            Call::SaveSnapshot {
                endpoint: endpoint.to_owned(),
                dir: dir.to_path_buf(),
                prefix: prefix.to_owned(),
            },
            endpoint,
        )?;
        let revision = self.state().revision;
        let data = fake_snapshot_bytes();
        let path = dir.join(format!("{prefix}-{revision}.db"));
        let write = |source| SnapshotError::Write {
            path: path.clone(),
            source,
        };
        tokio::fs::create_dir_all(dir).await.map_err(write)?;
        tokio::fs::write(&path, &data).await.map_err(write)?;
        Ok(SavedSnapshot {
            sha256: hex::encode(Sha256::digest(&data)),
            size: data.len() as u64,
            path,
            revision,
        })
    }
}

/// A healthy member for a fake view: id, name, peer URL `http://<name>:2380`, client URL
/// `http://<name>:2379`, on `version`, seeing `leader`.
pub fn healthy_member(id: u64, name: &str, version: &str, leader: u64) -> EtcdMember {
    EtcdMember {
        id,
        name: name.to_owned(),
        peer_urls: vec![format!("http://{name}:2380")],
        client_urls: vec![format!("http://{name}:2379")],
        learner: false,
        status: Some(MemberHealth {
            version: version.to_owned(),
            raft_applied_index: 100,
            leader,
            errors: Vec::new(),
            ..Default::default()
        }),
    }
}
