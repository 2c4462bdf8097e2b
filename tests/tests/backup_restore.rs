//! Restore against real binaries.
//!
//! - Standalone (runs today): snapshots of a real etcd are taken and stored by the operator's
//!   code, restored with `etcdutl snapshot restore` (3.5; for the server-only 3.5.34 the etcdutl
//!   of another 3.5 patch) / `etcdctl snapshot restore` (3.4) through `restore::prepare_data_dir`
//!   into fresh data directories, real members are started on them, and every key written before the snapshot is read back — nothing written after it. A
//!   corrupted snapshot is refused with a clear error and restores nothing.
//! - End to end (`a_new_cluster_bootstraps_from_an_etcdbackup`): needs the planner and local
//!   runtime to call `restore::prepare_data_dir` before a member's first start; it is ignored
//!   until that integration lands (see docs/backups.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod backup_support;

use std::time::{Duration, Instant};

use backup_support::*;
use etcd_operator_api::v1alpha2::{BackupDestination, VolumeDestination};
use etcd_operator_controller::backup::Credentials;
use etcd_operator_controller::member_ops::{EtcdClient, MemberOps};
use etcd_operator_controller::restore::{self, RestoreMember, RestorePlan, RestoreTool, SnapshotSource};
use etcd_operator_controller::{backup_policy as policy, backup_store as store};
use etcd_operator_tests::kubectl::{Watched, apply, condition, wait_for};
use etcd_operator_tests::{EtcdVersion, LocalOperator, TestEtcd, tools};

fn directory(path: &std::path::Path) -> BackupDestination {
    BackupDestination {
        s3: None,
        volume: Some(VolumeDestination {
            path: Some(path.display().to_string()),
            claim_name: None,
        }),
    }
}

async fn read(endpoint: &str, key: &str) -> Option<String> {
    let mut client = etcd_client::Client::connect([endpoint], None).await.unwrap();
    let resp = client.get(key, None).await.unwrap();
    resp.kvs().first().map(|kv| kv.value_str().unwrap().to_string())
}

async fn wait_readable(endpoint: &str, key: &str, log: &dyn Fn() -> String) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = async {
            let mut client = etcd_client::Client::connect([endpoint], None).await.ok()?;
            let resp = tokio::time::timeout(Duration::from_secs(2), client.get(key, None))
                .await
                .ok()?
                .ok()?;
            Some(resp.kvs().first().map(|kv| kv.value_str().unwrap().to_string()))
        };
        if let Some(value) = attempt.await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "restored member at {endpoint} did not answer; log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Snapshots `etcd` after writing `before` keys, writes `after` keys, stores the snapshot in a
/// directory the operator's way, and returns the store root and key.
async fn snapshot_into_directory(etcd: &TestEtcd, root: &std::path::Path) -> String {
    let mut client = etcd.client().await.unwrap();
    for i in 0..50 {
        client
            .put(format!("before/{i:03}"), format!("value-{i}"), None)
            .await
            .unwrap();
    }
    let snap = EtcdClient::default().snapshot(etcd.endpoint()).await.unwrap();
    client
        .put("after/1", "written after the snapshot", None)
        .await
        .unwrap();
    let dest = store::open(&directory(root), "ns", &Credentials::Environment { file: None })
        .await
        .unwrap();
    let key = policy::scheduled_key("ns/src/", snap.taken, snap.revision);
    dest.put_snapshot(&key, snap.data.clone(), &snap.sha256)
        .await
        .unwrap();
    assert!(
        snap.revision >= 51,
        "revision {} covers the 50 writes",
        snap.revision
    );
    key
}

#[tokio::test]
async fn snapshots_restore_into_real_members_with_the_tool_of_each_version() {
    // 3.5.34 is installed as the server alone: the newest installed etcdutl of 3.5 restores for it.
    for version in [EtcdVersion::V3_5_1, EtcdVersion::V3_5_34, EtcdVersion::V3_4_23] {
        let etcd = TestEtcd::start(version)
            .await
            .unwrap_or_else(|e| panic!("start etcd {version:?} (install it with `make tools`): {e}"));
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("backups");
        let key = snapshot_into_directory(&etcd, &root).await;
        drop(etcd);

        // Three members for 3.5.1 (a real cluster formed from one snapshot), one otherwise.
        let members = if version == EtcdVersion::V3_5_1 { 3 } else { 1 };
        let ports = etcd_operator_tests::ports::free_ports(2 * members).unwrap();
        let names: Vec<String> = (0..members).map(|i| format!("m{i}")).collect();
        let initial_cluster = names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{n}=http://127.0.0.1:{}", ports[2 * i + 1]))
            .collect::<Vec<_>>()
            .join(",");
        let binaries = tools::tools_dir().join("etcd");
        let tool = RestoreTool::for_version(&binaries, version.as_str()).unwrap();
        let tool_version = tool
            .path()
            .parent()
            .and_then(|d| d.file_name())
            .unwrap()
            .to_string_lossy();
        assert!(
            matches!(
                (&tool, version, &*tool_version),
                (RestoreTool::Etcdutl(_), EtcdVersion::V3_5_1, "3.5.1")
                    | (RestoreTool::Etcdctl(_), EtcdVersion::V3_4_23, "3.4.23")
            ) || (version == EtcdVersion::V3_5_34
                && matches!(tool, RestoreTool::Etcdutl(_))
                && tool_version.starts_with("3.5.")
                && tool_version != "3.5.34"),
            "{tool:?} for {version:?}"
        );
        let plan = RestorePlan {
            source: SnapshotSource::Store {
                destination: directory(&root),
                key: key.clone(),
            },
            expected_sha256: None,
        };
        let creds = Credentials::Environment { file: None };
        let mut running = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let member = RestoreMember {
                name: name.clone(),
                peer_url: format!("http://127.0.0.1:{}", ports[2 * i + 1]),
                initial_cluster: initial_cluster.clone(),
                cluster_token: "restored".into(),
            };
            let data_dir = work.path().join(name).join("data");
            restore::prepare_data_dir(&plan, "ns", &creds, &tool, &member, &data_dir)
                .await
                .unwrap();
            assert!(
                restore::has_member_data(&data_dir),
                "{name} has a restored member dir"
            );
            // Idempotent: a second call leaves the restored data alone.
            restore::prepare_data_dir(&plan, "ns", &creds, &tool, &member, &data_dir)
                .await
                .unwrap();
            running.push(start_member(
                &tools::etcd(version).unwrap(),
                &MemberStart {
                    name,
                    data_dir: &data_dir,
                    client_port: ports[2 * i],
                    peer_port: ports[2 * i + 1],
                    initial_cluster: &initial_cluster,
                    token: "restored",
                },
                work.path(),
            ));
        }
        for m in &running {
            let log = || m.process.log_tail(3000);
            assert_eq!(
                wait_readable(&m.client_url, "before/000", &log).await.as_deref(),
                Some("value-0")
            );
            assert_eq!(
                read(&m.client_url, "before/049").await.as_deref(),
                Some("value-49")
            );
            assert_eq!(
                read(&m.client_url, "after/1").await,
                None,
                "nothing written after the snapshot"
            );
        }
        let mut client = etcd_client::Client::connect([running[0].client_url.as_str()], None)
            .await
            .unwrap();
        let all = client
            .get(
                "before/",
                Some(etcd_client::GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .unwrap();
        assert_eq!(
            all.count(),
            50,
            "{version:?}: every key written before the snapshot"
        );
        assert_eq!(client.member_list().await.unwrap().members().len(), members);
    }
}

#[tokio::test]
async fn a_corrupted_snapshot_is_refused_and_restores_nothing() {
    let etcd = TestEtcd::start(EtcdVersion::V3_5_1)
        .await
        .expect("start etcd 3.5.1 (install it with `make tools`)");
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("backups");
    let key = snapshot_into_directory(&etcd, &root).await;
    // Flip one byte in the middle of the stored snapshot.
    let file = root.join(&key);
    let mut data = std::fs::read(&file).unwrap();
    let middle = data.len() / 2;
    data[middle] ^= 0xff;
    std::fs::write(&file, &data).unwrap();

    let tool = RestoreTool::for_version(&tools::tools_dir().join("etcd"), "3.5.1").unwrap();
    let member = RestoreMember {
        name: "m0".into(),
        peer_url: "http://127.0.0.1:2380".into(),
        initial_cluster: "m0=http://127.0.0.1:2380".into(),
        cluster_token: "t".into(),
    };
    let data_dir = work.path().join("m0");
    let plan = RestorePlan {
        source: SnapshotSource::Store {
            destination: directory(&root),
            key: key.clone(),
        },
        expected_sha256: None,
    };
    let creds = Credentials::Environment { file: None };
    let err = restore::prepare_data_dir(&plan, "ns", &creds, &tool, &member, &data_dir)
        .await
        .unwrap_err();
    assert!(
        matches!(err, restore::RestoreError::ChecksumMismatch { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("was refused") && text.contains(&key), "{text}");
    assert!(!data_dir.exists(), "nothing restored");

    // Without the sidecar (a snapshot from elsewhere), etcd's own hash still refuses it.
    std::fs::remove_file(root.join(format!("{key}.sha256"))).unwrap();
    let err = restore::prepare_data_dir(&plan, "ns", &creds, &tool, &member, &data_dir)
        .await
        .unwrap_err();
    assert!(matches!(err, restore::RestoreError::Corrupt { .. }), "{err:?}");
    assert!(!data_dir.exists(), "nothing restored");

    // An EtcdBackup's recorded checksum is checked too.
    let plan = RestorePlan {
        expected_sha256: Some("0".repeat(64)),
        ..plan
    };
    std::fs::write(&file, {
        let mut good = data.clone();
        good[middle] ^= 0xff;
        good
    })
    .unwrap();
    let err = restore::prepare_data_dir(&plan, "ns", &creds, &tool, &member, &data_dir)
        .await
        .unwrap_err();
    assert!(
        matches!(err, restore::RestoreError::ChecksumMismatch { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_new_cluster_bootstraps_from_an_etcdbackup() {
    let op = LocalOperator::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    apply(&op, &cluster_yaml("src", 3, None)).unwrap();
    let src = wait_for(
        &op,
        Watched::object("ec", "src"),
        "src available",
        Duration::from_secs(90),
        |o| available(o, 3),
    )
    .await
    .unwrap();
    let eps = endpoints(&src);
    for i in 0..20 {
        etcdctl_ok(&eps, &["put", &format!("k{i:02}"), &format!("v{i}")]);
    }
    let backup = format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdBackup\nmetadata:\n  name: b1\n  namespace: default\nspec:\n  clusterName: src\n  destination:\n    volume:\n      path: {}\n",
        dir.path().display()
    );
    apply(&op, &backup).unwrap();
    wait_for(
        &op,
        Watched::object("etcdbackup", "b1"),
        "backup succeeded",
        Duration::from_secs(60),
        |o| o["status"]["phase"] == "Succeeded",
    )
    .await
    .unwrap();
    etcdctl_ok(&eps, &["put", "after", "x"]);
    let restored = "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: dst\n  namespace: default\nspec:\n  replicas: 3\n  version: 3.5.1\n  bootstrap:\n    restore:\n      backupName: b1\n";
    apply(&op, restored).unwrap();
    let dst = wait_for(
        &op,
        Watched::object("ec", "dst"),
        "dst available",
        Duration::from_secs(120),
        |o| available(o, 3),
    )
    .await
    .unwrap();
    let dst_eps = endpoints(&dst);
    for i in 0..20 {
        assert_eq!(
            etcdctl_ok(&dst_eps, &["get", &format!("k{i:02}"), "--print-value-only"]).trim(),
            format!("v{i}")
        );
    }
    assert_eq!(
        etcdctl_ok(&dst_eps, &["get", "after", "--print-value-only"]).trim(),
        ""
    );

    // The stored snapshot is damaged: a cluster restored from it never starts, and says why.
    let backup = wait_for(
        &op,
        Watched::object("etcdbackup", "b1"),
        "backup",
        Duration::from_secs(5),
        |_| true,
    )
    .await
    .unwrap();
    let location = backup["status"]["location"].as_str().unwrap().to_string();
    let mut bytes = std::fs::read(&location).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&location, bytes).unwrap();
    let bad = restored.replace("name: dst", "name: bad");
    apply(&op, &bad).unwrap();
    let refused = wait_for(
        &op,
        Watched::object("ec", "bad"),
        "RestoreFailed",
        Duration::from_secs(60),
        |o| condition(&o["status"], "Degraded").is_some_and(|c| c["reason"] == "RestoreFailed"),
    )
    .await
    .unwrap();
    let message = condition(&refused["status"], "Degraded").unwrap()["message"].to_string();
    assert!(message.contains("was refused: its SHA-256"), "{message}");
    assert!(refused["status"]["clusterID"].is_null(), "{refused:#}");
    assert!(
        !condition(&refused["status"], "Available").is_some_and(|c| c["status"] == "True"),
        "{refused:#}"
    );
    // A restore from a backup that does not exist starts nothing (no empty cluster instead).
    let ghost = restored
        .replace("name: dst", "name: ghost")
        .replace("backupName: b1", "backupName: nope");
    apply(&op, &ghost).unwrap();
    let missing = wait_for(
        &op,
        Watched::object("ec", "ghost"),
        "RestoreFailed",
        Duration::from_secs(60),
        |o| condition(&o["status"], "Degraded").is_some_and(|c| c["reason"] == "RestoreFailed"),
    )
    .await
    .unwrap();
    let message = condition(&missing["status"], "Degraded").unwrap()["message"].to_string();
    assert!(message.contains("EtcdBackup nope was not found"), "{message}");
    let members = op.state_dir().join("members").join("default").join("ghost");
    assert!(!members.exists(), "nothing was reserved for ghost");
}

/// Runs one restore step of a member Pod as a real process; returns its stderr on success.
fn pod_step(program: &std::path::Path, args: &[String]) -> Result<String, String> {
    let out = std::process::Command::new(program)
        .args(args)
        .env_remove("ETCD_OPERATOR_S3_CREDENTIALS_FILE")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(stderr)
    } else {
        Err(stderr)
    }
}

/// The init containers of a restored member Pod, run as the same processes here: the operator's
/// `fetch-snapshot`, the etcd image's `etcdutl snapshot restore`, the operator's `finish-restore`.
fn run_pod_restore_steps(
    operator: &std::path::Path,
    plan: &RestorePlan,
    member: &RestoreMember,
    volume: &std::path::Path,
) -> Result<(), String> {
    let path = |p: &str| volume.join(p).display().to_string();
    pod_step(
        operator,
        &[
            "fetch-snapshot".into(),
            "--plan".into(),
            serde_json::to_string(plan).unwrap(),
            "--data-dir".into(),
            path("data"),
            "--snapshot".into(),
            path("restore/snapshot.db"),
            "--staging".into(),
            path("restore/data"),
        ],
    )?;
    let etcdutl = tools::tools_dir().join("etcd").join("3.5.1").join("etcdutl");
    pod_step(
        &etcdutl,
        &restore::restore_args(&path("restore/snapshot.db"), member, &path("restore/data")),
    )?;
    pod_step(
        operator,
        &[
            "finish-restore".into(),
            "--data-dir".into(),
            path("data"),
            "--staging".into(),
            path("restore/data"),
        ],
    )
    .map(|_| ())
}

#[tokio::test]
async fn a_member_pods_restore_steps_run_as_real_processes() {
    let etcd = TestEtcd::start(EtcdVersion::V3_5_1)
        .await
        .expect("start etcd 3.5.1 (install it with `make tools`)");
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("backups");
    let key = snapshot_into_directory(&etcd, &root).await;
    drop(etcd);
    let operator = etcd_operator_tests::operator::operator_binary().unwrap();
    let ports = etcd_operator_tests::ports::free_ports(2).unwrap();
    let peer_url = format!("http://127.0.0.1:{}", ports[1]);
    let member = RestoreMember {
        name: "m0".into(),
        peer_url: peer_url.clone(),
        initial_cluster: format!("m0={peer_url}"),
        cluster_token: "restored".into(),
    };
    let stored = std::fs::read(root.join(&key)).unwrap();
    let plan = RestorePlan {
        source: SnapshotSource::Store {
            destination: directory(&root),
            key: key.clone(),
        },
        expected_sha256: Some(policy::sha256_hex(&stored)),
    };
    let volume = work.path().join("volume");
    run_pod_restore_steps(&operator, &plan, &member, &volume).unwrap();
    let data_dir = volume.join("data");
    assert!(restore::has_member_data(&data_dir));
    assert!(
        !volume.join("restore/data").exists(),
        "the staging copy is moved into place"
    );

    let start = |work: &std::path::Path| {
        start_member(
            &tools::etcd(EtcdVersion::V3_5_1).unwrap(),
            &MemberStart {
                name: "m0",
                data_dir: &data_dir,
                client_port: ports[0],
                peer_port: ports[1],
                initial_cluster: &member.initial_cluster,
                token: "restored",
            },
            work,
        )
    };
    let m = start(work.path());
    let log = || m.process.log_tail(3000);
    assert_eq!(
        wait_readable(&m.client_url, "before/049", &log).await.as_deref(),
        Some("value-49")
    );
    assert_eq!(read(&m.client_url, "after/1").await, None);
    let mut client = etcd_client::Client::connect([m.client_url.as_str()], None)
        .await
        .unwrap();
    client.put("written/after-restore", "kept", None).await.unwrap();
    drop(client);
    drop(m);

    // The Pod restarts and its init containers run again: the member's data is kept, even with
    // the snapshot's source gone.
    std::fs::remove_dir_all(&root).unwrap();
    run_pod_restore_steps(&operator, &plan, &member, &volume).unwrap();
    let m = start(work.path());
    let log = || m.process.log_tail(3000);
    assert_eq!(
        wait_readable(&m.client_url, "written/after-restore", &log)
            .await
            .as_deref(),
        Some("kept")
    );
    drop(m);

    // A snapshot whose checksum does not match is refused by the first step; nothing is written.
    let key = {
        let etcd = TestEtcd::start(EtcdVersion::V3_5_1).await.unwrap();
        snapshot_into_directory(&etcd, &root).await
    };
    let wrong = RestorePlan {
        source: SnapshotSource::Store {
            destination: directory(&root),
            key,
        },
        expected_sha256: Some("00".repeat(32)),
    };
    let fresh = work.path().join("fresh-volume");
    let error = run_pod_restore_steps(&operator, &wrong, &member, &fresh).unwrap_err();
    assert!(error.contains("was refused: its SHA-256"), "{error}");
    assert!(!fresh.join("restore/snapshot.db").exists());
    assert!(!restore::has_member_data(&fresh.join("data")));
}
