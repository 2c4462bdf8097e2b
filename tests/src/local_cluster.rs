//! What end-to-end suites read of an EtcdCluster run by `etcd-operator local`: its status (is it
//! available, where are its members) and its members on disk (their directories under the
//! operator's state dir, the pid each one's process recorded), with the faults suites inject
//! (SIGKILL of one member or of all of them).
//!
//! These are assertions for test bodies: a missing tool or a failed signal fails the test with
//! its cause, so panicking is this module's way of reporting.
#![allow(clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::kubectl::{Watched, client_endpoints, condition, wait_for};
use crate::operator::LocalOperator;
use crate::tools::{self, EtcdVersion};

/// An EtcdCluster manifest (`default` namespace, etcd 3.5.1) with `replicas` members.
pub fn cluster_yaml(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: {replicas}\n  version: 3.5.1\n"
    )
}

/// `Available=True` with `replicas` ready voters, every one of them healthy.
pub fn available(status: &Value, replicas: i64) -> bool {
    condition(status, "Available").is_some_and(|c| c["status"] == "True")
        && status["readyReplicas"] == replicas
        && status["members"].as_array().is_some_and(|m| {
            m.len() as i64 == replicas && m.iter().all(|m| m["healthy"] == true && m["learner"] == false)
        })
}

/// Waits until EtcdCluster `name` is [`available`] with `replicas` members; its status. Fails
/// the test with `what` and the last status seen when `timeout` passes first.
pub async fn wait_available(
    op: &LocalOperator,
    name: &str,
    replicas: i64,
    what: &str,
    timeout: std::time::Duration,
) -> Value {
    wait_for(op, Watched::status("ec", name), what, timeout, |s| {
        available(s, replicas)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The member names `status.members` lists, in its order.
pub fn member_names(status: &Value) -> Vec<String> {
    status["members"]
        .as_array()
        .map(|members| {
            members
                .iter()
                .filter_map(|m| m["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The client endpoints of `status`; panics (failing the test) when there are none.
pub fn endpoints(status: &Value) -> Vec<String> {
    let eps = client_endpoints(status);
    assert!(!eps.is_empty(), "no client endpoints in {status}");
    eps
}

/// etcdctl 3.5.1 (API v3, 3 s command timeout) at `endpoint`, ready for its arguments.
pub fn etcdctl(endpoint: &str) -> Command {
    let mut cmd = Command::new(tools::etcdctl(EtcdVersion::V3_5_1).unwrap_or_else(|e| panic!("{e}")));
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=3s");
    cmd
}

/// Runs etcdctl at `endpoint` with `args`; its output, whatever the exit status.
pub fn etcdctl_output(endpoint: &str, args: &[&str]) -> Output {
    etcdctl(endpoint)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running etcdctl {args:?}: {e}"))
}

/// Runs etcdctl at `endpoint` with `args`; its standard output, failing the test on an error.
pub fn etcdctl_ok(endpoint: &str, args: &[&str]) -> String {
    let out = etcdctl_output(endpoint, args);
    assert!(
        out.status.success(),
        "etcdctl {args:?} at {endpoint}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The directory holding every member of cluster `name` (namespace `default`).
pub fn cluster_dir(op: &LocalOperator, name: &str) -> PathBuf {
    op.state_dir().join("members").join("default").join(name)
}

/// The directory of one member of `cluster` (its data, pid file, certificates).
pub fn member_dir(op: &LocalOperator, cluster: &str, member: &str) -> PathBuf {
    cluster_dir(op, cluster).join(member)
}

/// The pid a member's etcd process recorded (`etcd.pid`: `pid start version`), if any.
pub fn recorded_pid(member_dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(member_dir.join("etcd.pid")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The recorded pid of every member process of cluster `name` that runs, sorted.
pub fn running_member_pids(op: &LocalOperator, name: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir(cluster_dir(op, name))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| recorded_pid(&e.path()))
                .filter(|pid| crate::leftovers::is_running(*pid))
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    pids
}

/// SIGKILLs the process `pid`; fails the test when the signal cannot be sent.
pub fn sigkill(pid: u32) {
    let raw = i32::try_from(pid).unwrap_or_else(|_| panic!("pid {pid} out of range"));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), nix::sys::signal::Signal::SIGKILL)
        .unwrap_or_else(|e| panic!("SIGKILL {pid}: {e}"));
}

/// SIGKILLs the member whose directory is `member_dir`; fails the test when it recorded no pid.
pub fn kill_member(member_dir: &Path) {
    let pid =
        recorded_pid(member_dir).unwrap_or_else(|| panic!("no pid recorded in {}", member_dir.display()));
    sigkill(pid);
}

/// SIGKILLs every running member process of cluster `name`; their pids.
pub fn kill_every_member(op: &LocalOperator, name: &str) -> Vec<u32> {
    let pids = running_member_pids(op, name);
    for pid in &pids {
        sigkill(*pid);
    }
    pids
}
