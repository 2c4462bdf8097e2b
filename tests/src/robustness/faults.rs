//! The faults a local-mode cluster is given: SIGSTOP freezes of a follower or the leader (thawed
//! by a guard, also when the test fails), SIGKILL of a follower, the leader, the operator or its
//! backing etcd, and network isolation of a follower or the leader through a fault proxy on every
//! member's peer port ([`PeerProxies`]; the operator runs with `--peer-proxy-ports`, so each member
//! advertises a port of its own for the proxy). Members are found through etcd (the leader, the
//! member IDs) and their processes through the pid files the local runtime writes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::Client;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::RobustnessError;
use super::proxy::{FaultProxy, Mode};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGSTOP a follower, SIGCONT it after a while.
    FreezeFollower,
    /// SIGSTOP the leader, SIGCONT it after a while.
    FreezeLeader,
    /// SIGKILL a follower (the operator starts it again).
    KillFollower,
    /// SIGKILL the leader.
    KillLeader,
    /// SIGKILL the operator, start it again.
    KillOperator,
    /// SIGKILL the operator's backing etcd (the operator starts it again).
    KillBackingEtcd,
    /// Cut a follower off its peers (it keeps running and answering clients), then heal.
    IsolateFollower,
    /// Cut the leader off its peers, then heal.
    IsolateLeader,
    /// Cut the leader off for about one election (0.8–2 s): the partition heals while the others
    /// elect a new leader.
    IsolateLeaderBriefly,
    /// Fill a follower's disk (its data on a tmpfs of its own, see [`super::disk`]), free it after
    /// a while.
    DiskFullFollower,
    /// Fill the leader's disk, free it after a while.
    DiskFullLeader,
    /// Delete a member's Pod (the kubernetes runtime: the operator creates it again on the
    /// member's PVC).
    DeletePod,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 11] = [
        Self::FreezeFollower,
        Self::FreezeLeader,
        Self::KillFollower,
        Self::KillLeader,
        Self::KillOperator,
        Self::KillBackingEtcd,
        Self::IsolateFollower,
        Self::IsolateLeader,
        Self::IsolateLeaderBriefly,
        Self::DiskFullFollower,
        Self::DiskFullLeader,
    ];

    /// The kinds the kubernetes runtime scenario injects (through the node agent: a member's
    /// container killed or frozen, its Pod deleted; the operator killed).
    pub const KUBERNETES: [FaultKind; 6] = [
        Self::FreezeFollower,
        Self::FreezeLeader,
        Self::KillFollower,
        Self::KillLeader,
        Self::KillOperator,
        Self::DeletePod,
    ];

    /// A short name for figures.
    pub fn name(self) -> &'static str {
        match self {
            Self::FreezeFollower => "freeze-follower",
            Self::FreezeLeader => "freeze-leader",
            Self::KillFollower => "kill-follower",
            Self::KillLeader => "kill-leader",
            Self::KillOperator => "kill-operator",
            Self::KillBackingEtcd => "kill-backing-etcd",
            Self::IsolateFollower => "isolate-follower",
            Self::IsolateLeader => "isolate-leader",
            Self::IsolateLeaderBriefly => "isolate-leader-brief",
            Self::DiskFullFollower => "disk-full-follower",
            Self::DiskFullLeader => "disk-full-leader",
            Self::DeletePod => "delete-pod",
        }
    }

    /// Whether the fault only pauses, cuts off or fills the disk of a member (while the others
    /// keep quorum): removing that member would be wrong.
    pub fn only_pauses(self) -> bool {
        matches!(
            self,
            Self::FreezeFollower
                | Self::FreezeLeader
                | Self::IsolateFollower
                | Self::IsolateLeader
                | Self::IsolateLeaderBriefly
                | Self::DiskFullFollower
                | Self::DiskFullLeader
        )
    }

    /// Whether the fault needs every member's data on a tmpfs of its own first.
    pub fn fills_a_disk(self) -> bool {
        matches!(self, Self::DiskFullFollower | Self::DiskFullLeader)
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The cluster as etcd reports it: member name by ID, and the leader's ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// Member names by member ID.
    pub members: BTreeMap<u64, String>,
    /// The leader's member ID.
    pub leader: u64,
    /// Each member's first client URL, by member ID.
    pub client_urls: BTreeMap<u64, String>,
}

impl Membership {
    /// The leader's name.
    pub fn leader_name(&self) -> Option<&str> {
        self.members.get(&self.leader).map(String::as_str)
    }

    /// The names of the members that are not the leader.
    pub fn followers(&self) -> Vec<&str> {
        self.members
            .iter()
            .filter(|(id, _)| **id != self.leader)
            .map(|(_, name)| name.as_str())
            .collect()
    }
}

/// Asks the cluster for its members and its leader (giving up after 5 s in all).
pub async fn membership(endpoints: &[String]) -> Result<Membership, RobustnessError> {
    let limit = Duration::from_secs(5);
    tokio::time::timeout(limit, membership_unbounded(endpoints))
        .await
        .unwrap_or_else(|_| {
            Err(RobustnessError::Timeout {
                what: format!("the member list and status from {endpoints:?}"),
                timeout: limit,
            })
        })
}

async fn membership_unbounded(endpoints: &[String]) -> Result<Membership, RobustnessError> {
    let mut client = Client::connect(endpoints, Some(super::client_options(Duration::from_secs(2))))
        .await
        .map_err(|source| RobustnessError::Connect {
            endpoints: endpoints.to_vec(),
            source,
        })?;
    let list = client
        .member_list()
        .await
        .map_err(|source| RobustnessError::Read {
            what: "the member list",
            source,
        })?;
    let status = client.status().await.map_err(|source| RobustnessError::Read {
        what: "the status",
        source,
    })?;
    Ok(Membership {
        members: list
            .members()
            .iter()
            .map(|m| (m.id(), m.name().to_string()))
            .collect(),
        leader: status.leader(),
        client_urls: list
            .members()
            .iter()
            .filter_map(|m| Some((m.id(), m.client_urls().first()?.clone())))
            .collect(),
    })
}

/// [`membership`], asked again every 200 ms for up to `timeout` while it fails (a member the
/// client picked may be restarting).
pub async fn membership_retrying(
    endpoints: &[String],
    timeout: Duration,
) -> Result<Membership, RobustnessError> {
    let began = std::time::Instant::now();
    loop {
        match membership(endpoints).await {
            Ok(m) => return Ok(m),
            Err(e) if began.elapsed() > timeout => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The leader member `endpoint` knows of (0: none), if it answers within a second.
pub async fn leader_seen_by(endpoint: &str) -> Option<u64> {
    let options = super::client_options(Duration::from_secs(1));
    tokio::time::timeout(Duration::from_secs(2), async {
        let mut client = Client::connect([endpoint], Some(options)).await.ok()?;
        Some(client.status().await.ok()?.leader())
    })
    .await
    .ok()
    .flatten()
}

fn signal(pid: u32, signal: Signal) -> Result<(), RobustnessError> {
    let raw = i32::try_from(pid).unwrap_or(i32::MAX);
    kill(Pid::from_raw(raw), signal).map_err(|source| RobustnessError::Signal {
        signal: signal.as_str(),
        pid,
        source,
    })
}

/// SIGKILLs `pid`.
pub fn sigkill(pid: u32) -> Result<(), RobustnessError> {
    signal(pid, Signal::SIGKILL)
}

/// A process stopped with SIGSTOP; SIGCONT when dropped.
#[derive(Debug)]
pub struct Frozen {
    pid: u32,
}

impl Frozen {
    /// SIGSTOPs `pid`.
    pub fn freeze(pid: u32) -> Result<Self, RobustnessError> {
        signal(pid, Signal::SIGSTOP)?;
        Ok(Self { pid })
    }

    /// SIGCONTs it now.
    pub fn thaw(self) -> Result<(), RobustnessError> {
        let pid = self.pid;
        std::mem::forget(self);
        signal(pid, Signal::SIGCONT)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = signal(self.pid, Signal::SIGCONT);
    }
}

/// A fault proxy in front of every member's peer port, started as the local runtime records the
/// members (`advertisePeerPort` → `peerPort` in each `member.json`); stopped when dropped.
#[derive(Debug)]
pub struct PeerProxies {
    proxies: Arc<Mutex<BTreeMap<String, FaultProxy>>>,
    keeper: tokio::task::JoinHandle<()>,
}

fn ports_of(member_json: &std::path::Path) -> Option<(u16, u16)> {
    let text = std::fs::read_to_string(member_json).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let port = |k: &str| u16::try_from(v[k].as_u64()?).ok();
    Some((port("advertisePeerPort")?, port("peerPort")?))
}

impl PeerProxies {
    /// Watches `cluster_dir` (every 50 ms) and starts a proxy for each member that appears.
    pub fn start(cluster_dir: PathBuf) -> Self {
        let proxies: Arc<Mutex<BTreeMap<String, FaultProxy>>> = Arc::default();
        let keeper = {
            let proxies = proxies.clone();
            tokio::spawn(async move {
                loop {
                    for entry in std::fs::read_dir(&cluster_dir).into_iter().flatten().flatten() {
                        let name = entry.file_name().to_string_lossy().into_owned();
                        let known = proxies.lock().map(|p| p.contains_key(&name)).unwrap_or(true);
                        if known || name.starts_with('.') {
                            continue;
                        }
                        let Some((advertised, listening)) = ports_of(&entry.path().join("member.json"))
                        else {
                            continue;
                        };
                        let at = std::net::SocketAddr::from(([127, 0, 0, 1], advertised));
                        let to = std::net::SocketAddr::from(([127, 0, 0, 1], listening));
                        if let Ok(proxy) = FaultProxy::start(at, to).await
                            && let Ok(mut p) = proxies.lock()
                        {
                            p.insert(name, proxy);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        Self { proxies, keeper }
    }

    /// The members with a proxy.
    pub fn members(&self) -> Vec<String> {
        self.proxies
            .lock()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Cuts `member` (etcd member ID `id`) off its peers: its own proxy stalls everything, and the
    /// others stall the connections it opened to them.
    pub fn isolate(&self, member: &str, id: u64) -> Result<(), RobustnessError> {
        let proxies = self.proxies.lock().map_err(|_| RobustnessError::NoPeerProxy {
            member: member.to_string(),
        })?;
        let Some(own) = proxies.get(member) else {
            return Err(RobustnessError::NoPeerProxy {
                member: member.to_string(),
            });
        };
        own.set(Mode::Stall);
        let sender: BTreeSet<String> = [format!("{id:x}")].into();
        for (name, proxy) in proxies.iter() {
            if name != member {
                proxy.block_senders(sender.clone());
            }
        }
        Ok(())
    }

    /// Lets every proxy pass everything again.
    pub fn heal(&self) {
        if let Ok(proxies) = self.proxies.lock() {
            for proxy in proxies.values() {
                proxy.set(Mode::Pass);
                proxy.block_senders(BTreeSet::new());
            }
        }
    }
}

impl Drop for PeerProxies {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// The pid of the process of member `member` of cluster `cluster`, from its pid file, if it runs.
pub fn member_pid(op: &crate::LocalOperator, cluster: &str, member: &str) -> Result<u32, RobustnessError> {
    let dir = crate::local_cluster::member_dir(op, cluster, member);
    crate::local_cluster::recorded_pid(&dir)
        .filter(|pid| crate::leftovers::is_running(*pid))
        .ok_or_else(|| RobustnessError::NoProcess {
            member: member.to_string(),
        })
}

/// The pid of the operator's backing etcd (`DIR/etcd/etcd.pid`), if it runs.
pub fn backing_etcd_pid(op: &crate::LocalOperator) -> Result<u32, RobustnessError> {
    std::fs::read_to_string(op.state_dir().join("etcd").join("etcd.pid"))
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .filter(|pid| crate::leftovers::is_running(*pid))
        .ok_or_else(|| RobustnessError::NoProcess {
            member: "the backing etcd".into(),
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn state(pid: u32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat.rsplit(')')
            .next()
            .unwrap()
            .trim_start()
            .chars()
            .next()
            .unwrap()
    }

    #[test]
    fn a_frozen_process_is_stopped_and_thawed_also_by_drop() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let frozen = Frozen::freeze(pid).unwrap();
        let wait_for = |want: char| {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while state(pid) != want && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            state(pid)
        };
        assert_eq!(wait_for('T'), 'T');
        frozen.thaw().unwrap();
        assert_eq!(wait_for('S'), 'S');
        let frozen = Frozen::freeze(pid).unwrap();
        assert_eq!(wait_for('T'), 'T');
        drop(frozen);
        assert_eq!(wait_for('S'), 'S');
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn followers_are_the_members_but_the_leader() {
        let m = Membership {
            members: [(1, "a".to_string()), (2, "b".to_string()), (3, "c".to_string())].into(),
            leader: 2,
            client_urls: BTreeMap::new(),
        };
        assert_eq!(m.leader_name(), Some("b"));
        assert_eq!(m.followers(), vec!["a", "c"]);
        assert!(FaultKind::FreezeLeader.only_pauses() && !FaultKind::KillLeader.only_pauses());
    }
}
