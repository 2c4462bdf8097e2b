//! A [`Runtime`] held in memory: members reserved, started, stopped and removed as the calls say,
//! every call recorded, failures scripted per operation. For unit tests of the reconciler's
//! steps without processes or an API server.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use super::{Runtime, RuntimeError, ValidatedCluster};
use crate::model::{ClusterRef, Liveness, MemberConfig, RuntimeMember};

/// A call the fake runtime received (`members` is not recorded: it only reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeCall {
    /// `reserve(name)`.
    Reserve(String),
    /// `start(name)` on the configured version.
    Start(String, String),
    /// `change_version(name, version)`.
    ChangeVersion(String, String),
    /// `renew_certificates(name)` under the rotation asked for.
    RenewCertificates(String, Option<String>),
    /// `advance_authority(to, rotation)`.
    AdvanceAuthority(crate::tls::authority::AuthorityPhase, Option<String>),
    /// `recover_quorum(survivor)`.
    RecoverQuorum(String),
    /// `recreate(name)` on the template hash asked for.
    Recreate(String, Option<String>),
    /// `expand_volume(name)` to the size asked for.
    ExpandVolume(String, Option<u64>),
    /// `stop(name)`.
    Stop(String),
    /// `announce_replacement(member, note)`.
    AnnounceReplacement(String, String),
    /// `warn(reason, action, note)`.
    Warn(String, String, String),
    /// `remove(name, keep_data)`.
    Remove(String, bool),
    /// `teardown(keep_data)`.
    Teardown(bool),
}

/// The operations a failure can be scripted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeOp {
    /// [`Runtime::reserve`].
    Reserve,
    /// [`Runtime::start`].
    Start,
    /// [`Runtime::change_version`].
    ChangeVersion,
    /// [`Runtime::renew_certificates`].
    RenewCertificates,
    /// [`Runtime::advance_authority`].
    AdvanceAuthority,
    /// [`Runtime::recover_quorum`].
    RecoverQuorum,
    /// [`Runtime::recreate`].
    Recreate,
    /// [`Runtime::expand_volume`].
    ExpandVolume,
    /// [`Runtime::stop`].
    Stop,
    /// [`Runtime::remove`].
    Remove,
    /// [`Runtime::teardown`].
    Teardown,
}

#[derive(Debug, Default)]
struct State {
    members: Vec<RuntimeMember>,
    calls: Vec<RuntimeCall>,
    failures: VecDeque<(RuntimeOp, RuntimeError)>,
}

/// The fake. See the module documentation.
#[derive(Debug, Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
    snapshot_dir: Option<PathBuf>,
    client_tls: Option<crate::tls::member::ClientTls>,
    template: Mutex<Option<String>>,
    authority: Mutex<Option<crate::tls::authority::AuthorityView>>,
}

impl FakeRuntime {
    /// A runtime holding `members`; `snapshot_dir` is what [`Runtime::snapshot_dir`] answers.
    pub fn new(members: Vec<RuntimeMember>, snapshot_dir: Option<PathBuf>) -> Self {
        Self {
            state: Mutex::new(State {
                members,
                ..Default::default()
            }),
            snapshot_dir,
            client_tls: None,
            template: Mutex::new(None),
            authority: Mutex::new(None),
        }
    }

    /// Answers [`Runtime::authority`] with `view` from now on; [`Runtime::advance_authority`]
    /// moves it.
    pub fn set_authority(&self, view: Option<crate::tls::authority::AuthorityView>) {
        *self
            .authority
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = view;
    }

    /// Answers [`Runtime::template_hash`] with `hash` from now on (a spec edit, as the test
    /// scripts it); members started or re-created from now on report it.
    pub fn set_template(&self, hash: Option<&str>) {
        *self
            .template
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = hash.map(str::to_owned);
    }

    /// Sets the template hash a member reports.
    pub fn set_member_template(&self, name: &str, hash: Option<&str>) {
        if let Some(m) = self.state().members.iter_mut().find(|m| m.name == name) {
            m.template_hash = hash.map(str::to_owned);
        }
    }

    /// Answers [`Runtime::client_tls`] with `tls`.
    pub fn with_client_tls(mut self, tls: crate::tls::member::ClientTls) -> Self {
        self.client_tls = Some(tls);
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next call of `op` fails with `error` (and changes nothing).
    pub fn fail_next(&self, op: RuntimeOp, error: RuntimeError) {
        self.state().failures.push_back((op, error));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<RuntimeCall> {
        self.state().calls.clone()
    }

    /// Sets a member's liveness (a process exiting, a Pod failing) as a test scripts it.
    pub fn set_liveness(&self, name: &str, liveness: Liveness) {
        if let Some(m) = self.state().members.iter_mut().find(|m| m.name == name) {
            m.liveness = liveness;
        }
    }

    /// Sets a member's restart count (a kubelet restarting its container).
    pub fn set_restarts(&self, name: &str, restarts: u32) {
        if let Some(m) = self.state().members.iter_mut().find(|m| m.name == name) {
            m.restarts = restarts;
        }
    }

    /// The members now.
    pub fn held(&self) -> Vec<RuntimeMember> {
        self.state().members.clone()
    }

    fn call(&self, call: RuntimeCall, op: RuntimeOp) -> Result<MutexGuard<'_, State>, RuntimeError> {
        let mut state = self.state();
        state.calls.push(call);
        if let Some(i) = state.failures.iter().position(|(o, _)| *o == op)
            && let Some((_, error)) = state.failures.remove(i)
        {
            return Err(error);
        }
        Ok(state)
    }
}

fn member<'a>(state: &'a mut State, name: &str) -> Result<&'a mut RuntimeMember, RuntimeError> {
    state
        .members
        .iter_mut()
        .find(|m| m.name == name)
        .ok_or_else(|| RuntimeError::UnknownMember {
            name: name.to_owned(),
        })
}

impl Runtime for FakeRuntime {
    async fn members(&self, _cluster: &ClusterRef) -> Result<Vec<RuntimeMember>, RuntimeError> {
        Ok(self.held())
    }

    async fn reserve(
        &self,
        _cluster: &ClusterRef,
        _spec: &ValidatedCluster,
        name: &str,
    ) -> Result<RuntimeMember, RuntimeError> {
        let mut state = self.call(RuntimeCall::Reserve(name.to_owned()), RuntimeOp::Reserve)?;
        if let Some(m) = state.members.iter().find(|m| m.name == name) {
            return Ok(m.clone());
        }
        let m = RuntimeMember {
            name: name.to_owned(),
            peer_url: format!("http://{name}:2380"),
            client_url: format!("http://{name}:2379"),
            config: None,
            liveness: Liveness::Reserved,
            certificates: None,
            restarts: 0,
            template_hash: None,
            volume: None,
            created: Some(chrono::Utc::now()),
        };
        state.members.push(m.clone());
        Ok(m)
    }

    async fn start(
        &self,
        _cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        config: &MemberConfig,
    ) -> Result<(), RuntimeError> {
        let mut state = self.call(
            RuntimeCall::Start(name.to_owned(), config.version.clone()),
            RuntimeOp::Start,
        )?;
        let m = member(&mut state, name)?;
        m.config.get_or_insert_with(|| config.clone());
        if m.liveness != Liveness::Running {
            m.template_hash = spec.template_hash.clone();
        }
        m.liveness = Liveness::Running;
        Ok(())
    }

    async fn change_version(
        &self,
        _cluster: &ClusterRef,
        _spec: &ValidatedCluster,
        name: &str,
        version: &str,
    ) -> Result<(), RuntimeError> {
        let mut state = self.call(
            RuntimeCall::ChangeVersion(name.to_owned(), version.to_owned()),
            RuntimeOp::ChangeVersion,
        )?;
        let m = member(&mut state, name)?;
        let config = m.config.as_mut().ok_or_else(|| RuntimeError::State {
            member: name.to_owned(),
            detail: "never started".into(),
        })?;
        if config.version != version {
            config.previous_version = Some(std::mem::replace(&mut config.version, version.to_owned()));
        }
        m.liveness = Liveness::Running;
        Ok(())
    }

    async fn renew_certificates(
        &self,
        _cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let mut state = self.call(
            RuntimeCall::RenewCertificates(name.to_owned(), spec.certificate_rotation.clone()),
            RuntimeOp::RenewCertificates,
        )?;
        let m = member(&mut state, name)?;
        m.certificates = Some(crate::model::MemberCertificates {
            valid_for: crate::tls::ca::LEAF_VALIDITY,
            rotation: spec.certificate_rotation.clone(),
            authority: None,
        });
        m.liveness = Liveness::Running;
        Ok(())
    }

    async fn recover_quorum(
        &self,
        _cluster: &ClusterRef,
        _spec: &ValidatedCluster,
        survivor: &str,
    ) -> Result<(), RuntimeError> {
        let mut state = self.call(
            RuntimeCall::RecoverQuorum(survivor.to_owned()),
            RuntimeOp::RecoverQuorum,
        )?;
        member(&mut state, survivor)?.liveness = Liveness::Running;
        state.members.retain(|m| m.name == survivor);
        Ok(())
    }

    async fn authority(
        &self,
        _cluster: &ClusterRef,
        _spec: &ValidatedCluster,
    ) -> Result<Option<crate::tls::authority::AuthorityView>, RuntimeError> {
        Ok(self
            .authority
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone())
    }

    /// Moves the view set with [`FakeRuntime::set_authority`] to `to` (settled), recording
    /// `rotation` when a rotation begins.
    async fn advance_authority(
        &self,
        _cluster: &ClusterRef,
        _spec: &ValidatedCluster,
        to: crate::tls::authority::AuthorityPhase,
        rotation: Option<&str>,
    ) -> Result<(), RuntimeError> {
        drop(self.call(
            RuntimeCall::AdvanceAuthority(to, rotation.map(str::to_owned)),
            RuntimeOp::AdvanceAuthority,
        )?);
        let mut view = self
            .authority
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(view) = view.as_mut() {
            if to == crate::tls::authority::AuthorityPhase::Trusting {
                view.rotation = rotation.map(str::to_owned);
            }
            view.phase = to;
            view.settled = true;
        }
        Ok(())
    }

    fn template_hash(&self, _cluster: &ClusterRef, _spec: &ValidatedCluster) -> Option<String> {
        self.template
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records the new size as requested (the volume itself grows when a test says so).
    async fn expand_volume(
        &self,
        _cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let mut state = self.call(
            RuntimeCall::ExpandVolume(name.to_owned(), spec.volume_bytes),
            RuntimeOp::ExpandVolume,
        )?;
        if let (Some(volume), Some(bytes)) = (member(&mut state, name)?.volume.as_mut(), spec.volume_bytes) {
            volume.requested = volume.requested.max(bytes);
        }
        Ok(())
    }

    /// Stops the member, as the real runtimes do; the next start brings it back on the template.
    async fn recreate(
        &self,
        _cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let mut state = self.call(
            RuntimeCall::Recreate(name.to_owned(), spec.template_hash.clone()),
            RuntimeOp::Recreate,
        )?;
        member(&mut state, name)?.liveness = Liveness::Gone {
            reason: "re-created on a new template".into(),
            restartable: true,
        };
        Ok(())
    }

    async fn stop(&self, _cluster: &ClusterRef, name: &str) -> Result<(), RuntimeError> {
        let mut state = self.call(RuntimeCall::Stop(name.to_owned()), RuntimeOp::Stop)?;
        member(&mut state, name)?.liveness = Liveness::Gone {
            reason: "stopped".into(),
            restartable: true,
        };
        Ok(())
    }

    fn snapshot_dir(&self, _cluster: &ClusterRef) -> Option<PathBuf> {
        self.snapshot_dir.clone()
    }

    async fn announce_replacement(&self, _cluster: &ClusterRef, member: &str, note: &str) {
        self.state().calls.push(RuntimeCall::AnnounceReplacement(
            member.to_owned(),
            note.to_owned(),
        ));
    }

    async fn warn(&self, _cluster: &ClusterRef, reason: &str, action: &str, note: &str) {
        self.state().calls.push(RuntimeCall::Warn(
            reason.to_owned(),
            action.to_owned(),
            note.to_owned(),
        ));
    }

    async fn remove(&self, _cluster: &ClusterRef, name: &str, keep_data: bool) -> Result<(), RuntimeError> {
        let mut state = self.call(RuntimeCall::Remove(name.to_owned(), keep_data), RuntimeOp::Remove)?;
        state.members.retain(|m| m.name != name);
        Ok(())
    }

    async fn client_tls(
        &self,
        _cluster: &ClusterRef,
        _spec: &ValidatedCluster,
    ) -> Result<Option<crate::tls::member::ClientTls>, RuntimeError> {
        Ok(self.client_tls.clone())
    }

    fn watch_children(
        &self,
        controller: kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster>,
    ) -> kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster> {
        controller
    }

    fn resync_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(3)
    }

    async fn teardown(&self, _cluster: &ClusterRef, keep_data: bool) -> Result<(), RuntimeError> {
        let mut state = self.call(RuntimeCall::Teardown(keep_data), RuntimeOp::Teardown)?;
        state.members.clear();
        Ok(())
    }
}
