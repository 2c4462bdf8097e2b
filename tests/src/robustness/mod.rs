//! A robustness suite in the style of etcd's own (issue 26): clients write and read a small
//! keyset while faults hit a local-mode cluster; afterwards the recorded history is checked for
//! linearizability per key, the watch streams against the writes, every acknowledged write read
//! back and HashKV compared across members.
//!
//! - [`linearizability`]: the checker (Wing & Gong with memoisation, as porcupine) and the
//!   register model;
//! - [`history`]: the recorded client load;
//! - [`watch`]: the watch-stream recorder;
//! - [`checks`]: the checks run after a scenario;
//! - [`recorded`]: the load and the watch of a scenario, and the checks of what they saw;
//! - [`proxy`]: a fault-injecting TCP proxy (pass, blackhole, delay);
//! - [`faults`]: the faults a local-mode cluster can be given (SIGSTOP, SIGKILL, isolation, a
//!   full disk);
//! - [`disk`]: members' data on small tmpfs mounts, filled and freed;
//! - [`operations`]: spec changes (scale, roll, template roll, defragmentation, backup) made
//!   under load, each overlapped by a fault or an operator kill at one of its steps;
//! - [`status`]: what the EtcdCluster's status said during the run;
//! - [`scenario`]: the seeded runner (local mode);
//! - [`kube_scenario`]: the runner on the kubernetes runtime through the node agent;
//! - [`spec_changes`]: one phase of a spec change under a fault;
//! - [`report`]: what a run found and its figures.

pub mod checks;
pub mod disk;
pub mod faults;
pub mod history;
pub mod kube_scenario;
pub mod linearizability;
pub mod operations;
pub mod proxy;
pub mod recorded;
pub mod report;
pub mod scenario;
pub mod spec_changes;
pub mod status;
pub mod watch;

use std::time::Duration;

/// Options for a robustness client: short timeouts, so a frozen member shows up as an unknown
/// outcome rather than a stalled client.
pub fn client_options(timeout: Duration) -> etcd_client::ConnectOptions {
    etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(timeout)
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
}

/// A step of a robustness scenario failed (not a check: checks report findings).
#[derive(Debug, thiserror::Error)]
pub enum RobustnessError {
    /// No connection to the cluster could be made.
    #[error("connect to {endpoints:?}")]
    Connect {
        endpoints: Vec<String>,
        source: etcd_client::Error,
    },
    /// Reading the cluster (a revision, the member list, a status) failed.
    #[error("read {what} from the cluster")]
    Read {
        what: &'static str,
        source: etcd_client::Error,
    },
    /// A step did not finish in time.
    #[error("{what}: not within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    /// Sending a signal to a process failed.
    #[error("send {signal} to pid {pid}")]
    Signal {
        signal: &'static str,
        pid: u32,
        source: nix::Error,
    },
    /// A member has no recorded process.
    #[error("member {member} has no running process")]
    NoProcess { member: String },
    /// A member has no fault proxy in front of its peer port (its `member.json` records no
    /// `advertisePeerPort`: the operator was not started with `ETCD_OPERATOR_PEER_PROXY_PORTS`).
    #[error("member {member} has no peer proxy")]
    NoPeerProxy { member: String },
    /// The EtcdCluster could not be created.
    #[error("create the EtcdCluster: {0}")]
    Apply(crate::kubectl::KubectlError),
    /// The operator could not be restarted.
    #[error("restart the operator")]
    Operator(#[from] crate::operator::OperatorError),
    /// A client task of the load ended abnormally.
    #[error("join a load task")]
    Join(#[from] tokio::task::JoinError),
    /// A member cut off by the proxies still knew a leader: the partition did not isolate it.
    #[error("{member} still knew leader {leader:x} after {held:?} cut off by the peer proxies")]
    NotIsolated {
        member: String,
        held: Duration,
        leader: u64,
    },
    /// `ROBUSTNESS_KINDS` names a kind that does not exist.
    #[error("unknown fault kind {name:?} in ROBUSTNESS_KINDS (known: {})", crate::robustness::faults::FaultKind::ALL.map(|k| k.name()).join(", "))]
    UnknownKind { name: String },
    /// A full-disk fault could not be set up or healed.
    #[error("{what}: {detail}")]
    Disk { what: &'static str, detail: String },
    /// A spec change of an operation could not be made, or its object not read.
    #[error("{what}")]
    Operation {
        what: String,
        source: Box<crate::kubectl::KubectlError>,
    },
    /// An operation's phase ended in a state it must not (a backup that failed).
    #[error("{what}: {detail}")]
    PhaseFailed { what: String, detail: String },
    /// The fault kind has no meaning in the runtime of the scenario (a Pod deletion in local
    /// mode, a partition through the node agent).
    #[error("{kind} is not a fault of this runtime")]
    NotInThisRuntime {
        kind: crate::robustness::faults::FaultKind,
    },
    /// A Pod could not be deleted.
    #[error("delete Pod {pod}")]
    DeletePod { pod: String, source: kube::Error },
    /// The kubernetes runtime scenario could not start.
    #[error("start the kubernetes runtime")]
    KubeRuntime(#[from] Box<crate::node_agent::KubeRuntimeError>),
    /// The proxy could not listen or connect.
    #[error("proxy {what}")]
    Proxy {
        what: &'static str,
        source: std::io::Error,
    },
}
