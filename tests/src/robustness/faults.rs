//! The faults a local-mode cluster is given today: SIGSTOP freezes of a follower or the leader
//! (thawed by a guard, also when the test fails), and SIGKILL of a follower, the leader, the
//! operator or its backing etcd. Members are found through etcd (the leader, the member IDs) and
//! their processes through the pid files the local runtime writes.
//!
//! Partitions through [`super::proxy`] are not wired in: the local runtime advertises the port a
//! member listens on (`listen_peer_url == advertise_peer_url`, chosen at `reserve`), so there is
//! no place for a proxy between members without the runtime advertising another port.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::Client;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::RobustnessError;

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
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 6] = [
        Self::FreezeFollower,
        Self::FreezeLeader,
        Self::KillFollower,
        Self::KillLeader,
        Self::KillOperator,
        Self::KillBackingEtcd,
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
        }
    }

    /// Whether the fault only pauses a member: removing that member would be wrong.
    pub fn only_pauses(self) -> bool {
        matches!(self, Self::FreezeFollower | Self::FreezeLeader)
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

/// Asks the cluster for its members and its leader.
pub async fn membership(endpoints: &[String]) -> Result<Membership, RobustnessError> {
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
    })
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
        };
        assert_eq!(m.leader_name(), Some("b"));
        assert_eq!(m.followers(), vec!["a", "c"]);
        assert!(FaultKind::FreezeLeader.only_pauses() && !FaultKind::KillLeader.only_pauses());
    }
}
