//! Helpers shared by the backup suites (`backup_schedule`, `backup_snapshot`,
//! `backup_restore`): cluster manifests and availability, etcdctl, snapshot checks, and a
//! restored etcd member started on a prepared data directory. kubectl and waiting on objects are
//! the library's (`etcd_operator_tests::kubectl`).

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use etcd_operator_tests::kubectl::condition;
use etcd_operator_tests::{EtcdVersion, TestProcess, tools};
use serde_json::Value;
use sha2::Digest;

/// Whether the cluster is available with `replicas` healthy voting members.
pub(crate) fn available(obj: &Value, replicas: i64) -> bool {
    let s = &obj["status"];
    condition(&obj["status"], "Available").is_some_and(|c| c["status"] == "True")
        && s["readyReplicas"] == replicas
        && s["clientEndpoints"]
            .as_array()
            .is_some_and(|e| e.len() as i64 == replicas)
}

/// The cluster's client endpoints.
pub(crate) fn endpoints(obj: &Value) -> Vec<String> {
    obj["status"]["clientEndpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

/// etcdctl (3.5.1) at `endpoints`.
pub(crate) fn etcdctl(endpoints: &[String]) -> Command {
    let mut cmd = Command::new(tools::etcdctl(EtcdVersion::V3_5_1).unwrap());
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("--command-timeout=5s");
    cmd
}

/// Runs etcdctl and returns stdout; a failure fails the test.
pub(crate) fn etcdctl_ok(endpoints: &[String], args: &[&str]) -> String {
    let out = etcdctl(endpoints).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A cluster manifest with a backup section (YAML of `backup`, indented by 2 under spec).
pub(crate) fn cluster_yaml(name: &str, replicas: u32, backup: Option<&str>) -> String {
    let mut y = format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: {replicas}\n  version: 3.5.1\n"
    );
    if let Some(b) = backup {
        y.push_str("  backup:\n");
        for line in b.lines() {
            y.push_str("    ");
            y.push_str(line);
            y.push('\n');
        }
    }
    y
}

/// Whether bytes are an etcd snapshot whose trailing hash matches its content.
pub(crate) fn is_intact_snapshot(data: &[u8]) -> bool {
    data.len() > 544 && data.len() % 512 == 32 && {
        let (db, hash) = data.split_at(data.len() - 32);
        sha2::Sha256::digest(db).as_slice() == hash
    }
}

/// Lowercase hex SHA-256.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(data))
}

/// An etcd member started on a data directory prepared by a restore.
pub(crate) struct RestoredMember {
    pub(crate) process: TestProcess,
    pub(crate) client_url: String,
}

/// How a restored member starts: the same name, peer URL, initial cluster and token the restore
/// used.
pub(crate) struct MemberStart<'a> {
    pub(crate) name: &'a str,
    pub(crate) data_dir: &'a Path,
    pub(crate) client_port: u16,
    pub(crate) peer_port: u16,
    pub(crate) initial_cluster: &'a str,
    pub(crate) token: &'a str,
}

/// Starts `binary` as a member on a data directory a restore prepared.
pub(crate) fn start_member(binary: &Path, m: &MemberStart<'_>, log_dir: &Path) -> RestoredMember {
    let client_url = format!("http://127.0.0.1:{}", m.client_port);
    let peer_url = format!("http://127.0.0.1:{}", m.peer_port);
    let mut cmd = Command::new(binary);
    cmd.arg(format!("--name={}", m.name))
        .arg(format!("--data-dir={}", m.data_dir.display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster={}", m.initial_cluster))
        .arg(format!("--initial-cluster-token={}", m.token))
        .arg("--initial-cluster-state=new");
    let process = TestProcess::spawn(m.name, cmd, &log_dir.join(format!("{}.log", m.name))).unwrap();
    RestoredMember { process, client_url }
}
