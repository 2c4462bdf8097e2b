//! The member replacement policy end to end with the local runtime and real etcd 3.5.1: a member
//! that cannot start (its database overwritten with garbage, so etcd exits at once) is restarted
//! until `crashLoopAfter`, then announced and replaced, its old data set aside on disk; under
//! `policy: Manual` the same member is only reported until the replace-member annotation asks.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use etcd_operator_tests::LocalOperator;
use etcd_operator_tests::kubectl::{Watched, apply, condition, kubectl, wait_for};
use etcd_operator_tests::local_cluster::{self, cluster_dir, kill_member, member_names, recorded_pid};
use serde_json::Value;

fn cluster_yaml(name: &str, policy: &str) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: 3\n  version: 3.5.1\n  replacement:\n    policy: {policy}\n    crashLoopAfter: 10s\n"
    )
}

fn available(s: &Value) -> bool {
    local_cluster::available(s, 3)
}

/// Brings the cluster up; a follower's name.
async fn three_members(op: &LocalOperator, name: &str, policy: &str) -> String {
    apply(op, &cluster_yaml(name, policy)).unwrap();
    let s = wait_for(
        op,
        Watched::status("ec", name),
        "3 healthy members",
        Duration::from_secs(90),
        available,
    )
    .await
    .unwrap();
    member_names(&s)
        .into_iter()
        .find(|m| s["leader"] != m.as_str())
        .unwrap()
}

/// Kills the member's process and overwrites its database: every start from now on fails. The
/// cluster is paused meanwhile, so the controller cannot start the member again between the kill
/// and the overwrite (a process started in that window would map the database before it changes
/// and might keep running).
/// Returns when it was killed.
async fn break_member(op: &LocalOperator, cluster: &str, member: &str) -> std::time::Instant {
    set_paused(op, cluster, true).await;
    let dir = cluster_dir(op, cluster).join(member);
    kill_member(&dir);
    let killed = std::time::Instant::now();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while recorded_pid(&dir).is_some_and(etcd_operator_tests::leftovers::is_running) {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed member still runs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(dir.join("data/member/snap/db"), vec![0x5a_u8; 64 * 1024]).unwrap();
    set_paused(op, cluster, false).await;
    killed
}

/// Sets `spec.paused` and waits until a reconcile has seen it.
async fn set_paused(op: &LocalOperator, cluster: &str, paused: bool) {
    let patch = format!(r#"{{"spec":{{"paused":{paused}}}}}"#);
    kubectl(op, &["patch", "ec", cluster, "--type=merge", "-p", &patch], None).unwrap();
    wait_for(
        op,
        Watched::status("ec", cluster),
        if paused {
            "the pause seen"
        } else {
            "the pause lifted"
        },
        Duration::from_secs(30),
        |s| condition(s, "Progressing").is_some_and(|c| (c["reason"] == "Paused") == paused),
    )
    .await
    .unwrap();
}

#[tokio::test]
#[allow(clippy::print_stdout)]
async fn a_member_that_cannot_start_is_replaced_after_crash_loop_after_and_its_data_kept() {
    let op = LocalOperator::start().await.unwrap();
    let started = std::time::Instant::now();
    let broken = three_members(&op, "crashy", "Automatic").await;
    println!("3 members after {:.1}s", started.elapsed().as_secs_f64());
    let broke = break_member(&op, "crashy", &broken).await;

    let s = wait_for(
        &op,
        Watched::status("ec", "crashy"),
        "the broken member replaced by a fresh one",
        Duration::from_secs(120),
        |s| available(s) && !member_names(s).contains(&broken),
    )
    .await
    .unwrap();
    println!(
        "replaced and 3 healthy members again {:.1}s after it broke (crashLoopAfter 10s)",
        broke.elapsed().as_secs_f64()
    );
    assert_eq!(condition(&s, "Degraded").unwrap()["status"], "False", "{s}");
    // Announced before it was removed, with the cause.
    let log = op.log();
    let announced = log
        .find(&format!(
            "member {broken} will be replaced by a fresh member: it cannot start"
        ))
        .unwrap_or_else(|| panic!("no announcement in the log:\n{}", op.log_tail()));
    let removed = log
        .find("removed member from etcd")
        .unwrap_or_else(|| panic!("no removal in the log:\n{}", op.log_tail()));
    assert!(announced < removed, "announced after the removal");
    // Its data is set aside, not deleted.
    let kept = cluster_dir(&op, "crashy")
        .join(".retained/removed")
        .join(&broken)
        .join("data/member/snap/db");
    assert!(kept.is_file(), "{} missing", kept.display());
}

#[tokio::test]
async fn with_a_manual_policy_the_member_is_only_reported_until_the_annotation_asks() {
    let op = LocalOperator::start().await.unwrap();
    let broken = three_members(&op, "careful", "Manual").await;
    break_member(&op, "careful", &broken).await;

    let s = wait_for(
        &op,
        Watched::status("ec", "careful"),
        "the replacement reported as pending",
        Duration::from_secs(60),
        |s| condition(s, "Degraded").is_some_and(|c| c["reason"] == "ReplacementPending"),
    )
    .await
    .unwrap();
    let message = condition(&s, "Degraded").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains(&format!("etcd.operator.dev/replace-member={broken}")),
        "{message}"
    );
    // Reported, not acted on: after three more looks the member is still there and still pending.
    etcd_operator_tests::kubectl::wait_reconciles(
        &op,
        3,
        "three looks at the pending replacement",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let s = etcd_operator_tests::kubectl::status(&op, "ec", "careful").unwrap();
    assert!(member_names(&s).contains(&broken), "{s}");
    assert!(
        cluster_dir(&op, "careful")
            .join(&broken)
            .join("member.json")
            .is_file()
    );
    assert!(!cluster_dir(&op, "careful").join(".retained").exists());

    kubectl(
        &op,
        &[
            "annotate",
            "ec",
            "careful",
            &format!("etcd.operator.dev/replace-member={broken}"),
        ],
        None,
    )
    .unwrap();
    wait_for(
        &op,
        Watched::status("ec", "careful"),
        "the member replaced as asked",
        Duration::from_secs(120),
        |s| available(s) && !member_names(s).contains(&broken),
    )
    .await
    .unwrap();
    assert!(
        cluster_dir(&op, "careful")
            .join(".retained/removed")
            .join(&broken)
            .join("data")
            .is_dir()
    );
}
