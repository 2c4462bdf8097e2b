//! The default `spec.version` in local mode, out of the box: a cluster that names no version runs
//! the default (3.5.34, installed as the server alone by `make tools-etcd`), and a cluster
//! restored from its backup, also without a version, is restored with the newest installed
//! `etcdutl` of the same minor (3.5.16), as the release ships none of its own.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use etcd_operator_api::versions::DEFAULT_ETCD_VERSION;
use etcd_operator_tests::kubectl::{Watched, apply, get, wait_for};
use etcd_operator_tests::local_cluster::{endpoints, etcdctl_ok, wait_available};
use etcd_operator_tests::{EtcdVersion, LocalOperator, tools};
use serde_json::Value;

/// A 3-member EtcdCluster manifest without `spec.version`, plus `extra` spec lines.
fn versionless(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: 3\n{extra}"
    )
}

/// Every member of `status` reports the default version, and so does `currentVersion`.
fn assert_runs_the_default(name: &str, status: &Value) {
    assert_eq!(status["currentVersion"], DEFAULT_ETCD_VERSION, "{name}: {status}");
    let members = status["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{name}: {status}");
    for m in members {
        assert_eq!(m["version"], DEFAULT_ETCD_VERSION, "{name}: member {m}");
    }
}

#[tokio::test]
async fn a_cluster_without_a_version_runs_the_default_and_restores_with_an_etcdutl_of_its_minor() {
    // The default is one of the pinned versions, and the one whose package has no etcdutl.
    let default = EtcdVersion::ALL
        .into_iter()
        .find(|v| v.as_str() == DEFAULT_ETCD_VERSION)
        .expect("DEFAULT_ETCD_VERSION is pinned in tools/install.sh");
    tools::etcd(default).unwrap();
    assert!(
        tools::etcdutl(default).is_err(),
        "{default} ships its own etcdutl now: this test no longer covers the fallback"
    );
    tools::etcdutl(EtcdVersion::V3_5_16).unwrap();

    let op = LocalOperator::start().await.unwrap();
    apply(&op, &versionless("plain", "")).unwrap();
    assert_eq!(
        get(&op, "ec", "plain").unwrap()["spec"]["version"],
        DEFAULT_ETCD_VERSION
    );
    let s = wait_available(
        &op,
        "plain",
        3,
        "3 members of the default version",
        Duration::from_secs(90),
    )
    .await;
    assert_runs_the_default("plain", &s);
    let eps = endpoints(&s);
    for i in 0..5 {
        etcdctl_ok(&eps[0], &["put", &format!("k{i}"), &format!("v{i}")]);
    }

    let dir = tempfile::tempdir().unwrap();
    let backup = format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdBackup\nmetadata:\n  name: plain-1\n  namespace: default\nspec:\n  clusterName: plain\n  destination:\n    volume:\n      path: {}\n",
        dir.path().display()
    );
    apply(&op, &backup).unwrap();
    wait_for(
        &op,
        Watched::object("etcdbackup", "plain-1"),
        "backup succeeded",
        Duration::from_secs(60),
        |o| o["status"]["phase"] == "Succeeded",
    )
    .await
    .unwrap();

    apply(
        &op,
        &versionless("copy", "  bootstrap:\n    restore:\n      backupName: plain-1\n"),
    )
    .unwrap();
    let s = wait_available(&op, "copy", 3, "the restored cluster", Duration::from_secs(120)).await;
    assert_runs_the_default("copy", &s);
    let eps = endpoints(&s);
    for i in 0..5 {
        assert_eq!(
            etcdctl_ok(&eps[0], &["get", &format!("k{i}"), "--print-value-only"]).trim(),
            format!("v{i}")
        );
    }
    let log = op.log();
    assert!(
        log.contains("restoring with the one of etcd 3.5.16, of the same minor"),
        "the restore did not say it used the etcdutl of 3.5.16:\n{}",
        op.log_tail()
    );
}
