//! Scheduled backups end to end: `etcd-operator local`, a real etcd 3.5.1 cluster with
//! `spec.backup` on a six-field (seconds) schedule, snapshots written to a directory and to an
//! S3-compatible bucket (moto); at least three snapshots are taken and retention keeps exactly
//! the configured count; a missing bucket and then a stopped S3 server set the
//! `BackupSucceeded` condition to False with the reason, and backups resume once the bucket
//! exists.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod backup_support;

use std::collections::BTreeSet;
use std::time::Duration;

use backup_support::*;
use etcd_operator_tests::kubectl::{Watched, apply, condition, get, kubectl, wait_for};
use etcd_operator_tests::operator::OperatorOptions;
use etcd_operator_tests::{LocalOperator, S3Server, s3};
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::Value;

const SCHEDULE: &str = "*/3 * * * * *";
const KEEP: usize = 2;

/// Watches `status.lastBackup` until `n` distinct snapshots have been recorded; returns them.
async fn distinct_backups(op: &LocalOperator, name: &str, n: usize) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    wait_for(
        op,
        Watched::object("ec", name),
        &format!("{n} scheduled snapshots"),
        Duration::from_secs(90),
        |o| {
            if let Some(loc) = o["status"]["lastBackup"]["location"].as_str() {
                seen.insert(loc.to_string());
            }
            seen.len() >= n
        },
    )
    .await
    .unwrap();
    seen
}

/// Stops scheduling (removes `spec.backup`) and lets a snapshot in flight finish.
async fn stop_schedule(op: &LocalOperator, name: &str) {
    kubectl(
        op,
        &[
            "patch",
            "ec",
            name,
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/backup"}]"#,
        ],
        None,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
}

/// The value of `series` in `kubectl get --raw /metrics`, if it has it.
fn last_backup_metric(op: &LocalOperator, series: &str) -> Option<f64> {
    let text = kubectl(op, &["get", "--raw", "/metrics"], None).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

fn check_last_backup(obj: &Value) {
    let last = &obj["status"]["lastBackup"];
    assert!(last["revision"].as_i64().unwrap() > 0, "{last:#}");
    assert!(last["size"].as_i64().unwrap() > 0, "{last:#}");
    assert_eq!(last["sha256"].as_str().unwrap().len(), 64, "{last:#}");
    let cond = condition(&obj["status"], "BackupSucceeded").unwrap();
    assert_eq!(cond["status"], "True", "{cond:#}");
    assert_eq!(cond["reason"], "BackupSucceeded");
}

#[tokio::test]
async fn a_schedule_fills_a_directory_and_retention_keeps_the_count() {
    let op = LocalOperator::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let backup = format!(
        "schedule: \"{SCHEDULE}\"\nretention:\n  maxCount: {KEEP}\ndestination:\n  volume:\n    path: {}\n",
        dir.path().display()
    );
    apply(&op, &cluster_yaml("sched", 1, Some(&backup))).unwrap();
    let obj = wait_for(
        &op,
        Watched::object("ec", "sched"),
        "available",
        Duration::from_secs(60),
        |o| available(o, 1),
    )
    .await
    .unwrap();
    etcdctl_ok(&endpoints(&obj), &["put", "k", "v"]);
    let seen = distinct_backups(&op, "sched", 3).await;
    let obj = get(&op, "ec", "sched").unwrap();
    check_last_backup(&obj);
    // The backup's age is in the metrics while backups are on, and gone once they are off.
    let series =
        r#"etcd_operator_backup_last_success_timestamp_seconds{namespace="default",cluster="sched"}"#;
    let taken = last_backup_metric(&op, series).expect("the last backup's time is in /metrics");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(taken > now - 60.0 && taken <= now + 1.0, "{taken} vs now {now}");
    stop_schedule(&op, "sched").await;
    assert_eq!(last_backup_metric(&op, series), None);

    let cluster_dir = dir.path().join("default").join("sched");
    let mut snapshots: Vec<String> = std::fs::read_dir(&cluster_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".db"))
        .collect();
    snapshots.sort();
    assert_eq!(
        snapshots.len(),
        KEEP,
        "retention keeps exactly {KEEP}: {snapshots:?} (seen {seen:?})"
    );
    for name in &snapshots {
        let data = std::fs::read(cluster_dir.join(name)).unwrap();
        assert!(is_intact_snapshot(&data), "{name} is an intact etcd snapshot");
        let sidecar = std::fs::read_to_string(cluster_dir.join(format!("{name}.sha256"))).unwrap();
        assert_eq!(
            sidecar.split_whitespace().next(),
            Some(sha256_hex(&data).as_str()),
            "{name}"
        );
    }
    // The newest file is the one status records, and names sort by time.
    let last = get(&op, "ec", "sched").unwrap()["status"]["lastBackup"].clone();
    let newest = cluster_dir.join(snapshots.last().unwrap());
    assert_eq!(
        last["location"].as_str(),
        Some(newest.display().to_string().as_str())
    );
    assert_eq!(
        last["sha256"].as_str(),
        Some(sha256_hex(&std::fs::read(&newest).unwrap()).as_str())
    );
    assert!(
        seen.iter().any(|l| !snapshots.iter().any(|s| l.ends_with(s))),
        "older snapshots were deleted"
    );
    // No sidecar is left without its snapshot.
    let sidecars = std::fs::read_dir(&cluster_dir).unwrap().filter(|e| {
        e.as_ref()
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".sha256")
    });
    assert_eq!(sidecars.count(), KEEP);
}

fn s3_backup(server: &S3Server, bucket: &str) -> String {
    format!(
        "schedule: \"{SCHEDULE}\"\nretention:\n  maxCount: {KEEP}\ndestination:\n  s3:\n    bucket: {bucket}\n    prefix: etcd/prod\n    endpoint: {}\n    region: {}\n    forcePathStyle: true\n",
        server.endpoint(),
        s3::REGION
    )
}

async fn start_operator_with_s3_keys() -> LocalOperator {
    LocalOperator::start_with(OperatorOptions {
        env: vec![
            ("AWS_ACCESS_KEY_ID".into(), s3::ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), s3::SECRET_KEY.into()),
        ],
        args: Vec::new(),
    })
    .await
    .unwrap()
}

async fn bucket_keys(server: &S3Server, bucket: &str) -> Vec<String> {
    let store = server.store(bucket).unwrap();
    let mut keys: Vec<String> = store
        .list(Some(&object_store::path::Path::from("etcd/prod/default/s3c")))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_schedule_fills_a_bucket_and_retention_keeps_the_count() {
    let server = S3Server::start()
        .await
        .expect("start moto (install it with `make tools`)");
    server.create_bucket("backups").await.unwrap();
    let op = start_operator_with_s3_keys().await;
    apply(&op, &cluster_yaml("s3c", 1, Some(&s3_backup(&server, "backups")))).unwrap();
    wait_for(
        &op,
        Watched::object("ec", "s3c"),
        "available",
        Duration::from_secs(60),
        |o| available(o, 1),
    )
    .await
    .unwrap();
    let seen = distinct_backups(&op, "s3c", 3).await;
    check_last_backup(&get(&op, "ec", "s3c").unwrap());
    assert!(
        seen.iter()
            .all(|l| l.starts_with("s3://backups/etcd/prod/default/s3c/")),
        "{seen:?}"
    );
    stop_schedule(&op, "s3c").await;

    let keys = bucket_keys(&server, "backups").await;
    let snapshots: Vec<&String> = keys.iter().filter(|k| k.ends_with(".db")).collect();
    let sidecars: Vec<&String> = keys.iter().filter(|k| k.ends_with(".db.sha256")).collect();
    assert_eq!(snapshots.len(), KEEP, "retention keeps exactly {KEEP}: {keys:?}");
    assert_eq!(sidecars.len(), KEEP, "{keys:?}");
    let store = server.store("backups").unwrap();
    let last = get(&op, "ec", "s3c").unwrap()["status"]["lastBackup"].clone();
    let newest = snapshots.last().unwrap();
    assert_eq!(
        last["location"].as_str().unwrap(),
        format!("s3://backups/{newest}")
    );
    let data = store
        .get(&object_store::path::Path::from(newest.as_str()))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(is_intact_snapshot(&data));
    assert_eq!(last["sha256"].as_str(), Some(sha256_hex(&data).as_str()));
}

#[tokio::test]
async fn an_unreachable_bucket_sets_the_condition_and_backups_resume_when_it_comes_back() {
    let mut server = S3Server::start()
        .await
        .expect("start moto (install it with `make tools`)");
    let op = start_operator_with_s3_keys().await;
    // The bucket does not exist yet.
    apply(&op, &cluster_yaml("s3c", 1, Some(&s3_backup(&server, "late")))).unwrap();
    wait_for(
        &op,
        Watched::object("ec", "s3c"),
        "available",
        Duration::from_secs(60),
        |o| available(o, 1),
    )
    .await
    .unwrap();
    let failed = wait_for(
        &op,
        Watched::object("ec", "s3c"),
        "BackupSucceeded=False for the destination",
        Duration::from_secs(60),
        // Attempts before the members answer fail with `NoHealthyMember` first; wait for the
        // destination's failure.
        |o| {
            condition(&o["status"], "BackupSucceeded")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "DestinationUnavailable")
        },
    )
    .await
    .unwrap();
    let cond = condition(&failed["status"], "BackupSucceeded").unwrap();
    assert_eq!(cond["reason"], "DestinationUnavailable", "{cond:#}");
    assert!(cond["message"].as_str().unwrap().contains("late"), "{cond:#}");
    assert!(
        failed["status"]["lastBackup"].is_null(),
        "no backup recorded while failing"
    );

    // The bucket comes back: the due snapshot is taken (not skipped) and the condition recovers.
    server.create_bucket("late").await.unwrap();
    let recovered = wait_for(
        &op,
        Watched::object("ec", "s3c"),
        "BackupSucceeded=True",
        Duration::from_secs(90),
        |o| condition(&o["status"], "BackupSucceeded").is_some_and(|c| c["status"] == "True"),
    )
    .await
    .unwrap();
    check_last_backup(&recovered);
    assert!(!bucket_keys(&server, "late").await.is_empty());

    // The server goes away entirely: unreachable, the condition says so.
    server.kill();
    let failed = wait_for(
        &op,
        Watched::object("ec", "s3c"),
        "BackupSucceeded=False again",
        Duration::from_secs(90),
        |o| condition(&o["status"], "BackupSucceeded").is_some_and(|c| c["status"] == "False"),
    )
    .await
    .unwrap();
    let cond = condition(&failed["status"], "BackupSucceeded").unwrap();
    assert_eq!(cond["reason"], "DestinationUnavailable", "{cond:#}");
    assert!(cond["message"].as_str().unwrap().contains("retrying"), "{cond:#}");
    // The last good backup is still recorded; other conditions are untouched.
    assert_eq!(failed["status"]["lastBackup"], recovered["status"]["lastBackup"]);
    assert!(condition(&failed["status"], "Available").is_some_and(|c| c["status"] == "True"));
}
