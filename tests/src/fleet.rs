//! Stand-ins for a fleet of etcd clusters on Kubernetes, so the controller's kubernetes runtime
//! can be run at scale (`benches/fleet.rs`) without etcd processes or nodes:
//!
//! - [`SimulatedEtcd`], a [`MemberOps`] that keeps one member list per cluster in memory and
//!   answers as a healthy etcd would: the first member list asked for forms the cluster from the
//!   members asked (a static bootstrap; the first one leads), learners are added, promoted and
//!   removed, leadership moves; a member answers (its status, healthy, on the version given at
//!   construction) while its Pod runs (its client URL is among those asked) and once it has had
//!   its start time since it was first asked for. No snapshots.
//! - [`Kubelet`], what the scheduler, a volume provisioner and the kubelet do for member Pods,
//!   without running anything: each new Pod is bound to the node, its claims marked bound, and
//!   it is reported Running at once and Ready after its start time, with container statuses (the
//!   shape the node agent of `node_agent.rs` writes); a Pod given a deletionTimestamp is deleted
//!   for good (grace 0).
//!
//! A member's cluster is read from its client or peer URL, `<scheme>://<member>.<peer
//! service>.<namespace>.svc:<port>` (the controller's `member_host`); the peer Service is named
//! after the cluster.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use etcd_operator_controller::member_ops::{
    MemberOpError, MemberOps, SavedSnapshot, Snapshot, SnapshotError, SnapshotStream,
};
use etcd_operator_controller::model::{EtcdMember, EtcdView, MemberAlarm, MemberHealth, quorum};
use etcd_operator_controller::tls::member::ClientTls;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// The raft index every simulated member reports (all caught up).
const APPLIED_INDEX: u64 = 1000;
/// The database size every simulated member reports (no free pages: nothing to defragment).
const DB_SIZE: u64 = 64 * 1024;

/// `(cluster key <namespace>/<cluster>, member, host)` of a member URL, or `None` when the URL
/// is not a member's.
fn locate(url: &str) -> Option<(String, String, String)> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split([':', '/']).next()?;
    let mut parts = host.split('.');
    let (member, service, namespace, svc) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    (svc == "svc" && parts.next().is_none() && !member.is_empty()).then(|| {
        (
            format!("{namespace}/{service}"),
            member.to_owned(),
            host.to_owned(),
        )
    })
}

/// An etcd refusal, as etcd-client reports one.
fn refused(op: &'static str, detail: &str) -> MemberOpError {
    MemberOpError::Etcd {
        op,
        source: etcd_client::Error::InvalidArgs(detail.to_owned()),
    }
}

#[derive(Debug, Clone)]
struct SimMember {
    id: u64,
    /// Empty until the member first answered (a learner added before its Pod ran).
    name: String,
    host: String,
    peer_url: String,
    client_url: Option<String>,
    learner: bool,
}

#[derive(Debug, Default)]
struct SimCluster {
    id: u64,
    leader: u64,
    members: Vec<SimMember>,
}

impl SimCluster {
    fn member(&self, id: u64) -> Option<&SimMember> {
        self.members.iter().find(|m| m.id == id)
    }
}

#[derive(Debug, Default)]
struct State {
    clusters: HashMap<String, SimCluster>,
    next_id: u64,
    /// Since when each member host has been asked for without a break (its Pod running).
    asked_since: HashMap<String, Instant>,
}

impl State {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct SimulatedEtcd {
    version: String,
    start: Duration,
    state: Mutex<State>,
}

impl SimulatedEtcd {
    /// Clusters whose members all run etcd `version` and answer at once.
    pub fn new(version: &str) -> Self {
        Self::with_start_time(version, Duration::ZERO)
    }

    /// Clusters whose members all run etcd `version` and answer `start` after they were first
    /// asked for (the time etcd takes to serve once its Pod runs).
    pub fn with_start_time(version: &str, start: Duration) -> Self {
        Self {
            version: version.to_owned(),
            start,
            state: Mutex::new(State {
                next_id: 0x1000,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many clusters it knows.
    pub fn clusters(&self) -> usize {
        self.state().clusters.len()
    }

    /// The cluster the first of `urls` that names a member belongs to.
    fn cluster_of(urls: &[String]) -> Option<String> {
        urls.iter().find_map(|u| locate(u)).map(|(key, ..)| key)
    }
}

impl MemberOps for SimulatedEtcd {
    fn use_tls(&self, _endpoints: &[String], _tls: Option<&ClientTls>) {}

    async fn observe(&self, endpoints: &[String]) -> Result<EtcdView, MemberOpError> {
        let no_answer = MemberOpError::NoEndpoint { op: "member list" };
        let key = Self::cluster_of(endpoints).ok_or(no_answer)?;
        let asked: HashSet<String> = endpoints
            .iter()
            .filter_map(|u| locate(u).map(|(_, _, host)| host))
            .collect();
        let now = Instant::now();
        let mut state = self.state();
        // The cluster's members not asked for have stopped: they take their start time again.
        let stopped: Vec<String> = state
            .clusters
            .get(&key)
            .map(|c| {
                c.members
                    .iter()
                    .map(|m| m.host.clone())
                    .filter(|h| !asked.contains(h))
                    .collect()
            })
            .unwrap_or_default();
        for host in stopped {
            state.asked_since.remove(&host);
        }
        for host in &asked {
            state.asked_since.entry(host.clone()).or_insert(now);
        }
        let running: HashSet<String> = asked
            .iter()
            .filter(|h| {
                state
                    .asked_since
                    .get(*h)
                    .is_some_and(|since| now.duration_since(*since) >= self.start)
            })
            .cloned()
            .collect();
        if running.is_empty() {
            return Err(MemberOpError::NoEndpoint { op: "member list" });
        }
        let answers = state
            .clusters
            .get(&key)
            .is_some_and(|c| c.members.iter().any(|m| !m.learner && running.contains(&m.host)));
        if !answers {
            // Nobody of a cluster answers: the members asked form a new one (static bootstrap).
            let mut formed = SimCluster {
                id: state.id(),
                ..SimCluster::default()
            };
            for url in endpoints {
                let Some((_, member, host)) = locate(url) else {
                    continue;
                };
                let scheme = url.split_once("://").map_or("http", |(s, _)| s);
                formed.members.push(SimMember {
                    id: state.id(),
                    name: member,
                    peer_url: format!("{scheme}://{host}:2380"),
                    host,
                    client_url: Some(url.clone()),
                    learner: false,
                });
            }
            formed.leader = formed.members.first().map_or(0, |m| m.id);
            state.clusters.insert(key.clone(), formed);
        }
        let cluster = state
            .clusters
            .get_mut(&key)
            .ok_or(MemberOpError::NoEndpoint { op: "member list" })?;
        // Members whose Pod runs answer (a learner added before its Pod ran starts now).
        for m in &mut cluster.members {
            if running.contains(&m.host)
                && let Some((url, (_, member, _))) = endpoints
                    .iter()
                    .find_map(|u| locate(u).filter(|(_, _, h)| *h == m.host).map(|l| (u, l)))
            {
                m.name = member;
                m.client_url = Some(url.clone());
            }
        }
        // A leader whose Pod is gone: the running voters elect another while they have quorum.
        let voters: Vec<&SimMember> = cluster.members.iter().filter(|m| !m.learner).collect();
        let up: Vec<u64> = voters
            .iter()
            .filter(|m| running.contains(&m.host))
            .map(|m| m.id)
            .collect();
        if !up.contains(&cluster.leader) {
            cluster.leader = if up.len() >= quorum(voters.len()) {
                up.first().copied().unwrap_or(0)
            } else {
                0
            };
        }
        let leader = cluster.leader;
        Ok(EtcdView {
            cluster_id: cluster.id,
            leader,
            alarms: Vec::new(),
            members: cluster
                .members
                .iter()
                .map(|m| EtcdMember {
                    id: m.id,
                    name: m.name.clone(),
                    peer_urls: vec![m.peer_url.clone()],
                    client_urls: m.client_url.iter().cloned().collect(),
                    learner: m.learner,
                    status: running.contains(&m.host).then(|| MemberHealth {
                        version: self.version.clone(),
                        raft_applied_index: APPLIED_INDEX,
                        leader,
                        errors: Vec::new(),
                        db_size: DB_SIZE,
                        db_size_in_use: DB_SIZE,
                        ..MemberHealth::default()
                    }),
                })
                .collect(),
        })
    }

    async fn add_learner(&self, _endpoints: &[String], peer_url: &str) -> Result<u64, MemberOpError> {
        const OP: &str = "member add";
        let (key, _, host) = locate(peer_url).ok_or_else(|| refused(OP, "not a member peer URL"))?;
        let mut state = self.state();
        let id = state.id();
        let cluster = state
            .clusters
            .get_mut(&key)
            .ok_or(MemberOpError::NoEndpoint { op: OP })?;
        if cluster.members.iter().any(|m| m.peer_url == peer_url) {
            return Err(refused(OP, "etcdserver: Peer URLs already exists"));
        }
        if cluster.members.iter().any(|m| m.learner) {
            return Err(refused(OP, "etcdserver: too many learner members in cluster"));
        }
        cluster.members.push(SimMember {
            id,
            name: String::new(),
            host,
            peer_url: peer_url.to_owned(),
            client_url: None,
            learner: true,
        });
        Ok(id)
    }

    async fn promote(&self, endpoints: &[String], id: u64) -> Result<(), MemberOpError> {
        const OP: &str = "member promote";
        let key = Self::cluster_of(endpoints).ok_or(MemberOpError::NoEndpoint { op: OP })?;
        let mut state = self.state();
        let cluster = state
            .clusters
            .get_mut(&key)
            .ok_or(MemberOpError::NoEndpoint { op: OP })?;
        let member = cluster
            .members
            .iter_mut()
            .find(|m| m.id == id)
            .ok_or_else(|| refused(OP, "etcdserver: member not found"))?;
        if !member.learner {
            return Err(refused(OP, "etcdserver: can only promote a learner member"));
        }
        if member.client_url.is_none() {
            return Err(MemberOpError::NotReadyYet {
                op: OP,
                detail: "etcdserver: can only promote a learner member which is in sync with leader"
                    .to_owned(),
            });
        }
        member.learner = false;
        Ok(())
    }

    async fn remove(&self, endpoints: &[String], id: u64) -> Result<(), MemberOpError> {
        const OP: &str = "member remove";
        let key = Self::cluster_of(endpoints).ok_or(MemberOpError::NoEndpoint { op: OP })?;
        let mut state = self.state();
        let cluster = state
            .clusters
            .get_mut(&key)
            .ok_or(MemberOpError::NoEndpoint { op: OP })?;
        if cluster.member(id).is_none() {
            return Err(refused(OP, "etcdserver: member not found"));
        }
        cluster.members.retain(|m| m.id != id);
        if cluster.leader == id {
            cluster.leader = cluster.members.iter().find(|m| !m.learner).map_or(0, |m| m.id);
        }
        Ok(())
    }

    async fn compact(&self, _endpoints: &[String]) -> Result<i64, MemberOpError> {
        Ok(i64::try_from(APPLIED_INDEX).unwrap_or_default())
    }

    async fn defragment(&self, _endpoint: &str) -> Result<(), MemberOpError> {
        Ok(())
    }

    async fn disarm(&self, _endpoints: &[String], _alarm: MemberAlarm) -> Result<(), MemberOpError> {
        Ok(())
    }

    /// The fleet runs one version: nothing to downgrade.
    async fn enable_downgrade(&self, _endpoints: &[String], _version: &str) -> Result<(), MemberOpError> {
        Ok(())
    }

    async fn move_leader(&self, leader_url: &str, to: u64) -> Result<(), MemberOpError> {
        const OP: &str = "move leader";
        let (key, ..) = locate(leader_url).ok_or(MemberOpError::NoEndpoint { op: OP })?;
        let mut state = self.state();
        let cluster = state
            .clusters
            .get_mut(&key)
            .ok_or(MemberOpError::NoEndpoint { op: OP })?;
        let asked_leader = cluster
            .member(cluster.leader)
            .is_some_and(|m| m.client_url.as_deref() == Some(leader_url));
        if !asked_leader {
            return Err(refused(OP, "etcdserver: not leader"));
        }
        match cluster.member(to) {
            Some(m) if !m.learner => {
                cluster.leader = to;
                Ok(())
            }
            Some(_) => Err(refused(OP, "etcdserver: learner can not transfer leadership")),
            None => Err(refused(OP, "etcdserver: member not found")),
        }
    }

    /// No snapshots: the fleet holds no data.
    async fn snapshot(&self, endpoint: &str) -> Result<Snapshot, SnapshotError> {
        Err(SnapshotError::NoHealthyMember {
            asked: vec![endpoint.to_owned()],
        })
    }

    /// No snapshots: the fleet holds no data.
    async fn snapshot_stream(&self, endpoint: &str) -> Result<SnapshotStream, SnapshotError> {
        Err(SnapshotError::NoHealthyMember {
            asked: vec![endpoint.to_owned()],
        })
    }

    /// No snapshots: the fleet holds no data.
    async fn save_snapshot(
        &self,
        endpoint: &str,
        _dir: &Path,
        _prefix: &str,
    ) -> Result<SavedSnapshot, SnapshotError> {
        Err(SnapshotError::NoHealthyMember {
            asked: vec![endpoint.to_owned()],
        })
    }
}

/// The node the [`Kubelet`] binds Pods to.
pub const NODE: &str = "fleet-node";

/// How many Pods the [`Kubelet`] handles at once.
const KUBELET_CONCURRENCY: usize = 32;

/// See the module documentation. Stops when dropped.
#[derive(Debug)]
pub struct Kubelet {
    task: tokio::task::JoinHandle<()>,
}

/// What the kubelet already did, by Pod uid.
#[derive(Debug, Default)]
struct Handled {
    started: HashSet<String>,
    deleted: HashSet<String>,
}

impl Kubelet {
    /// Watches every Pod through `client` and acts on each (see the module documentation); a
    /// Pod turns Ready `start` after it was reported Running.
    pub fn start(client: Client, start: Duration) -> Self {
        let task = tokio::spawn(async move {
            let handled = Arc::new(Mutex::new(Handled::default()));
            let limit = Arc::new(tokio::sync::Semaphore::new(KUBELET_CONCURRENCY));
            let pods: Api<Pod> = Api::all(client.clone());
            let mut events = watcher(pods, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let pod = match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::debug!(%error, "kubelet: the Pod watch failed; it restarts");
                        continue;
                    }
                };
                let Some(work) = Work::of(&pod, &handled) else {
                    continue;
                };
                let (client, handled, limit) = (client.clone(), handled.clone(), limit.clone());
                tokio::spawn(async move {
                    if let Err(error) = work.run(&client, &pod, start, &limit).await {
                        tracing::warn!(pod = %pod.name_any(), %error, "kubelet: could not act on a Pod");
                        // Tried again on the Pod's next event.
                        let mut handled = handled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        let uid = pod.uid().unwrap_or_default();
                        handled.started.remove(&uid);
                        handled.deleted.remove(&uid);
                    }
                });
            }
        });
        Self { task }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the kubelet does for one Pod event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// Bind it (and its claims), report it running, and ready after its start time.
    Start,
    /// It is being deleted: its containers stopped, delete it for good.
    Delete,
}

/// A status write that finds the object gone is no failure.
fn gone_is_fine<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

impl Work {
    /// What `pod` needs, once per Pod (by uid).
    fn of(pod: &Pod, handled: &Mutex<Handled>) -> Option<Self> {
        let uid = pod.uid()?;
        let mut handled = handled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if pod.metadata.deletion_timestamp.is_some() {
            return handled.deleted.insert(uid).then_some(Self::Delete);
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if node.is_some_and(|n| n != NODE) {
            return None;
        }
        handled.started.insert(uid).then_some(Self::Start)
    }

    /// Does it, with at most [`KUBELET_CONCURRENCY`] Pods handled at once (a Pod waiting to
    /// turn Ready does not count).
    async fn run(
        self,
        client: &Client,
        pod: &Pod,
        start: Duration,
        limit: &tokio::sync::Semaphore,
    ) -> Result<(), kube::Error> {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let permit = limit.acquire().await;
        match self {
            Self::Delete => {
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: pod.uid(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match pods.delete(&name, &params).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Self::Start => {
                let spec = pod.spec.clone().unwrap_or_default();
                // The provisioner binds the claims (WaitForFirstConsumer: at scheduling).
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
                for volume in spec.volumes.iter().flatten() {
                    if let Some(claim) = &volume.persistent_volume_claim {
                        let status = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                            "capacity": {"storage": "1Gi"}}});
                        gone_is_fine(
                            claims
                                .patch_status(
                                    &claim.claim_name,
                                    &PatchParams::default(),
                                    &Patch::Merge(&status),
                                )
                                .await,
                        )?;
                    }
                }
                if spec.node_name.is_none() {
                    let binding = json!({
                        "apiVersion": "v1", "kind": "Binding",
                        "metadata": {"name": name, "namespace": namespace},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
                    });
                    match pods
                        .create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
                        .await
                    {
                        Ok(_) => {}
                        // Deleted meanwhile, or bound already: nothing to run.
                        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
                        Err(e) => return Err(e),
                    }
                }
                let ip = address(pod);
                let params = PatchParams::default();
                let running = running_status(pod, &ip, false);
                gone_is_fine(pods.patch_status(&name, &params, &Patch::Merge(&running)).await)?;
                drop(permit);
                // The readiness probe passes once the member serves.
                tokio::time::sleep(start).await;
                let _permit = limit.acquire().await;
                let ready = running_status(pod, &ip, true);
                gone_is_fine(pods.patch_status(&name, &params, &Patch::Merge(&ready)).await)
            }
        }
    }
}

/// A Pod address derived from its uid (unique enough for a fleet of simulated Pods).
fn address(pod: &Pod) -> String {
    let uid = pod.uid().unwrap_or_default();
    let n = uid
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let [_, a, b, c] = n.to_be_bytes();
    format!("10.{a}.{b}.{}", c.max(1))
}

/// The status a kubelet reports for a Pod whose containers all run (and are `ready`): phase,
/// addresses, conditions, init containers completed and container statuses.
fn running_status(pod: &Pod, ip: &str, ready: bool) -> Value {
    let now = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let init: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": "", "ready": true, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}})
        })
        .collect();
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": "", "ready": ready, "started": true,
                "restartCount": 0, "state": {"running": {"startedAt": now}}, "lastState": {}})
        })
        .collect();
    let condition = |type_: &str, true_: bool| json!({"type": type_, "status": if true_ { "True" } else { "False" }, "lastTransitionTime": now});
    json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "hostIP": "127.0.0.1",
        "startTime": now,
        "conditions": [condition("PodScheduled", true), condition("Initialized", true),
            condition("ContainersReady", ready), condition("Ready", ready)],
        "initContainerStatuses": init,
        "containerStatuses": containers,
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(member: &str, port: u16) -> String {
        format!("http://{member}.demo.ns.svc:{port}")
    }

    fn endpoints(members: &[&str]) -> Vec<String> {
        members.iter().map(|m| url(m, 2379)).collect()
    }

    #[test]
    fn member_urls_name_their_cluster() {
        assert_eq!(
            locate("https://demo-abcde.demo.ns.svc:2379"),
            Some((
                "ns/demo".to_owned(),
                "demo-abcde".to_owned(),
                "demo-abcde.demo.ns.svc".to_owned()
            ))
        );
        assert_eq!(locate("http://127.0.0.1:2379"), None);
        assert_eq!(locate("http://a.b.c.svc.cluster.local:2379"), None);
    }

    /// A bootstrap forms from the members asked; a learner joins once its Pod runs, is promoted,
    /// takes the lead; the old leader is removed; a member whose Pod is gone stops answering.
    #[tokio::test]
    async fn clusters_form_grow_and_shrink_as_etcd_would() {
        let etcd = SimulatedEtcd::new("3.5.16");
        let view = etcd.observe(&endpoints(&["a", "b", "c"])).await.unwrap();
        assert_eq!(view.members.len(), 3);
        assert_eq!(view.healthy_voters(), 3);
        let leader = view.leader;
        assert_eq!(view.members[0].id, leader);
        assert!(
            view.members
                .iter()
                .all(|m| m.status.as_ref().unwrap().version == "3.5.16")
        );

        // Another cluster is another member list.
        let other = etcd
            .observe(&["http://x.other.ns.svc:2379".to_owned()])
            .await
            .unwrap();
        assert_ne!(other.cluster_id, view.cluster_id);
        assert_eq!(etcd.clusters(), 2);

        let running = endpoints(&["a", "b", "c"]);
        let id = etcd.add_learner(&running, &url("d", 2380)).await.unwrap();
        let second = etcd.add_learner(&running, &url("e", 2380)).await.unwrap_err();
        let second = etcd_operator_api::report::chain(&second);
        assert!(second.contains("too many learner"), "{second}");
        // Not started yet: listed without a name, not answering, not promotable.
        let view = etcd.observe(&running).await.unwrap();
        let d = view.members.iter().find(|m| m.id == id).unwrap();
        assert!(d.learner && d.name.is_empty() && d.status.is_none());
        let early = etcd.promote(&running, id).await.unwrap_err();
        assert!(early.is_not_ready_yet(), "{early}");

        let all = endpoints(&["a", "b", "c", "d"]);
        let view = etcd.observe(&all).await.unwrap();
        assert_eq!(view.by_peer_url(&url("d", 2380)).unwrap().name, "d");
        etcd.promote(&all, id).await.unwrap();
        assert!(etcd.move_leader(&url("b", 2379), id).await.is_err());
        etcd.move_leader(&url("a", 2379), id).await.unwrap();
        etcd.remove(&all, leader).await.unwrap();
        let view = etcd.observe(&endpoints(&["b", "c", "d"])).await.unwrap();
        assert_eq!(
            (view.members.len(), view.leader, view.healthy_voters()),
            (3, id, 3)
        );

        // d's Pod is gone: it no longer answers, and another voter leads.
        let view = etcd.observe(&endpoints(&["b", "c"])).await.unwrap();
        assert_eq!(view.healthy_voters(), 2);
        assert_ne!(view.leader, id);
        assert_ne!(view.leader, 0);
    }

    /// A member answers once it has been asked for its start time without a break.
    #[tokio::test]
    async fn members_answer_after_their_start_time() {
        let etcd = SimulatedEtcd::with_start_time("3.5.16", Duration::from_millis(100));
        let two = endpoints(&["a", "b"]);
        assert!(etcd.observe(&two).await.is_err());
        tokio::time::sleep(Duration::from_millis(120)).await;
        let view = etcd.observe(&endpoints(&["a", "b", "c"])).await.unwrap();
        // c was asked for just now: listed (the bootstrap named it), not answering yet.
        assert_eq!((view.members.len(), view.healthy_voters()), (3, 2));
        // b stops and starts again: it takes its start time again.
        etcd.observe(&endpoints(&["a", "c"])).await.unwrap();
        let view = etcd.observe(&endpoints(&["a", "b", "c"])).await.unwrap();
        assert!(view.by_peer_url(&url("b", 2380)).unwrap().status.is_none());
        tokio::time::sleep(Duration::from_millis(120)).await;
        let view = etcd.observe(&endpoints(&["a", "b", "c"])).await.unwrap();
        assert_eq!(view.healthy_voters(), 3);
    }

    #[tokio::test]
    async fn kubelet_binds_starts_and_deletes_pods() {
        let kube = crate::fake_kube::FakeKube::start().await.unwrap();
        let _kubelet = Kubelet::start(kube.client_as("kubelet").unwrap(), Duration::from_millis(50));
        let pods: Api<Pod> = Api::namespaced(kube.client().unwrap(), "ns");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "etcd", "image": "etcd:v3.5.16"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let ready = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let p = pods.get("p").await.unwrap();
            if ready(&p) {
                assert_eq!(p.spec.unwrap().node_name.as_deref(), Some(NODE));
                break;
            }
            assert!(std::time::Instant::now() < deadline, "not ready: {p:?}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        pods.delete("p", &DeleteParams::default()).await.unwrap();
        loop {
            if pods.get_opt("p").await.unwrap().is_none() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "not deleted");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
