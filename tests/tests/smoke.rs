//! Smoke tests: every real component the suites rely on starts and does real work.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use etcd_operator_tests::kube::{helm, kubectl, run};
use etcd_operator_tests::{EtcdVersion, S3Server, TestEtcd, tools};
use object_store::{ObjectStoreExt, PutPayload, path::Path as ObjectPath};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes through etcd-client, reads back through etcd-client and through etcdctl of the same
/// version (of 3.5.16 where the release's package carries the server alone).
async fn put_get_roundtrip(version: EtcdVersion) {
    let etcd = TestEtcd::start(version).await.unwrap();
    let mut client = etcd.client().await.unwrap();
    let status = client.status().await.unwrap();
    assert_eq!(
        status.version(),
        version.as_str(),
        "the server reports the version we asked for"
    );

    let value = format!("hello from {version}");
    client.put("smoke/key", value.as_str(), None).await.unwrap();
    let got = client.get("smoke/key", None).await.unwrap();
    assert_eq!(got.kvs().len(), 1);
    assert_eq!(got.kvs()[0].value_str().unwrap(), value);

    let ctl = if version.has_etcdctl() {
        version
    } else {
        EtcdVersion::V3_5_16
    };
    let out = run(std::process::Command::new(tools::etcdctl(ctl).unwrap())
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd.endpoint()))
        .args(["get", "smoke/key", "--print-value-only"]))
    .unwrap();
    assert_eq!(stdout(&out).trim(), value, "etcdctl reads what etcd-client wrote");
}

#[tokio::test]
async fn etcd_3_4_23_serves_put_and_get() {
    put_get_roundtrip(EtcdVersion::V3_4_23).await;
}

#[tokio::test]
async fn etcd_3_5_0_serves_put_and_get() {
    put_get_roundtrip(EtcdVersion::V3_5_0).await;
}

#[tokio::test]
async fn etcd_3_5_1_serves_put_and_get() {
    put_get_roundtrip(EtcdVersion::V3_5_1).await;
}

#[tokio::test]
async fn etcd_3_5_16_serves_put_and_get() {
    put_get_roundtrip(EtcdVersion::V3_5_16).await;
}

#[tokio::test]
async fn etcd_3_5_34_serves_put_and_get() {
    put_get_roundtrip(EtcdVersion::V3_5_34).await;
}

#[tokio::test]
async fn etcd_3_6_15_serves_put_and_get() {
    put_get_roundtrip(EtcdVersion::V3_6_15).await;
}

#[tokio::test]
async fn etcdutl_reads_a_snapshot_etcdctl_saved() {
    let version = EtcdVersion::V3_5_1;
    let etcd = TestEtcd::start(version).await.unwrap();
    let mut client = etcd.client().await.unwrap();
    for i in 0..10 {
        client.put(format!("k{i}"), "v", None).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap.db");
    run(etcd.etcdctl().unwrap().arg("snapshot").arg("save").arg(&snap)).unwrap();
    let out = run(std::process::Command::new(tools::etcdutl(version).unwrap())
        .args(["snapshot", "status", "-w", "json"])
        .arg(&snap))
    .unwrap();
    let status: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert!(status["revision"].as_i64().unwrap() >= 11, "{status}");
    assert!(status["totalKey"].as_i64().unwrap() >= 10, "{status}");
}

#[test]
fn kubectl_1_35_runs() {
    let out = run(kubectl(None).unwrap().args(["version", "--client", "-o", "json"])).unwrap();
    let version: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(version["clientVersion"]["major"], "1");
    assert_eq!(version["clientVersion"]["minor"], "35");

    // Client-side work that needs no server: build an object and print it.
    let out = run(kubectl(None).unwrap().args([
        "create",
        "configmap",
        "smoke",
        "--from-literal=answer=42",
        "--dry-run=client",
        "-o",
        "json",
    ]))
    .unwrap();
    let cm: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["data"]["answer"], "42");
}

#[test]
fn helm_4_creates_lints_and_renders_a_chart() {
    let home = tempfile::tempdir().unwrap();
    let out = run(helm(None, home.path())
        .unwrap()
        .args(["version", "--template", "{{.Version}}"]))
    .unwrap();
    assert!(stdout(&out).starts_with("v4."), "helm version: {}", stdout(&out));

    let chart = home.path().join("smoke");
    run(helm(None, home.path()).unwrap().arg("create").arg(&chart)).unwrap();
    run(helm(None, home.path()).unwrap().arg("lint").arg(&chart)).unwrap();
    let out = run(helm(None, home.path())
        .unwrap()
        .arg("template")
        .arg("demo")
        .arg(&chart))
    .unwrap();
    let rendered = stdout(&out);
    assert!(rendered.contains("kind: Deployment"), "{rendered}");
    assert!(rendered.contains("name: demo-smoke"), "{rendered}");
}

#[tokio::test]
async fn s3_server_stores_an_object_written_through_object_store() {
    let s3 = S3Server::start().await.unwrap();
    s3.create_bucket("smoke").await.unwrap();
    let store = s3.store("smoke").unwrap();
    let path = ObjectPath::from("backups/0001.db");
    let payload: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    store.put(&path, PutPayload::from(payload.clone())).await.unwrap();

    let got = store.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(got.as_ref(), payload.as_slice());
    let meta = store.head(&path).await.unwrap();
    assert_eq!(meta.size, 100_000);

    // A missing object is NotFound, not an empty success.
    let missing = store.get(&ObjectPath::from("backups/none.db")).await;
    assert!(
        matches!(missing, Err(object_store::Error::NotFound { .. })),
        "{missing:?}"
    );
}

#[test]
fn a_dropped_etcd_is_killed_even_when_the_test_panics() {
    let pid = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = pid.clone();
    let result = std::panic::catch_unwind(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let etcd = TestEtcd::start(EtcdVersion::V3_5_1).await.unwrap();
            seen.store(etcd.pid(), std::sync::atomic::Ordering::SeqCst);
            panic!("the test body fails while etcd runs");
        })
    });
    assert!(result.is_err());
    let pid = pid.load(std::sync::atomic::Ordering::SeqCst);
    assert_ne!(pid, 0, "etcd started");
    // Killed and reaped by the guard: the pid is gone from /proc (not even a zombie).
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "etcd {pid} outlived its test"
    );
}

/// A test that lacks a component fails, and its failure names the make target that installs it.
#[test]
fn a_missing_component_fails_the_test_and_names_the_make_target() {
    let empty = tempfile::tempdir().unwrap();
    for (test, target) in [
        ("etcd_3_5_1_serves_put_and_get", "make tools-etcd"),
        ("kubectl_1_35_runs", "make tools-kube"),
        (
            "s3_server_stores_an_object_written_through_object_store",
            "make tools-moto",
        ),
    ] {
        // Run one test of this very binary with an empty tools directory.
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(tools::TOOLS_DIR_ENV, empty.path())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success(),
            "{test} passed without its component:\n{text}"
        );
        assert!(
            text.contains(target),
            "{test} failed without naming `{target}`:\n{text}"
        );
        assert!(
            text.contains("1 failed"),
            "{test} did not run as a failing test:\n{text}"
        );
    }
}
