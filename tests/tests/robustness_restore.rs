//! The robustness suite's restore case (issue 26: the operator killed in the middle of every step
//! kind, restore included): a new 3-member cluster bootstraps from an `EtcdBackup` while the
//! operator is SIGKILLed right after the n-th step of the restore it logs (the snapshot fetched
//! and verified, a member's data restored from it, a member started on it), for n spread over
//! the restore; each time the cluster must come up holding exactly the backup (every key
//! written before it with its value, nothing written after it), as one cluster (every member
//! with the same cluster ID, three members), with HashKV equal on every member.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::time::{Duration, Instant};

use etcd_operator_tests::kubectl::{Watched, apply, wait_for};
use etcd_operator_tests::local_cluster::{cluster_yaml, endpoints, wait_available};
use etcd_operator_tests::robustness::checks;
use etcd_operator_tests::robustness::operations::LogCursor;
use etcd_operator_tests::{EtcdVersion, LocalOperator, tools};

/// The lines the local runtime logs as a restore goes.
const RESTORE_STEPS: [&str; 3] = [
    "snapshot fetched and verified",
    "restored member data from snapshot",
    "started etcd member",
];

/// Keys written before the backup.
const KEYS: usize = 100;

async fn client(endpoints: &[String]) -> etcd_client::Client {
    etcd_client::Client::connect(endpoints, None).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_killed_after_each_restore_step_restores_exactly_the_backup() {
    tools::etcd(EtcdVersion::V3_5_1).unwrap();
    let mut op = LocalOperator::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    apply(&op, &cluster_yaml("src", 3)).unwrap();
    let src = wait_available(&op, "src", 3, "src available", Duration::from_secs(120)).await;
    let mut c = client(&endpoints(&src)).await;
    for i in 0..KEYS {
        c.put(format!("k{i:03}"), format!("v{i}"), None).await.unwrap();
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
    c.put("after", "x", None).await.unwrap();

    // 3 members: the restore logs at least 6 step lines (each member restored, then started).
    for (round, kill_at) in [1_usize, 3, 5].into_iter().enumerate() {
        let name = format!("dst{round}");
        let mut cursor = LogCursor::at_end(op.state_dir().to_path_buf());
        apply(
            &op,
            &format!(
                "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: 3\n  version: 3.5.1\n  bootstrap:\n    restore:\n      backupName: b1\n"
            ),
        )
        .unwrap();
        let began = Instant::now();
        let mut seen = Vec::new();
        while seen.len() < kill_at {
            for line in cursor.new_lines() {
                if let Some(step) = RESTORE_STEPS.iter().find(|s| line.contains(*s)) {
                    seen.push(*step);
                }
            }
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "{name}: only {seen:?} of the restore's steps logged; operator log:\n{}",
                op.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Right after the step, or a little later: into the next one.
        tokio::time::sleep(Duration::from_millis(100 * round as u64)).await;
        op.crash();
        op.start_again().await.unwrap();
        println!(
            "restore {name}: operator killed after step {kill_at} ({:?}), {:.1}s into the restore",
            seen[kill_at - 1],
            began.elapsed().as_secs_f64()
        );
        let dst = wait_available(
            &op,
            &name,
            3,
            "the restored cluster available",
            Duration::from_secs(180),
        )
        .await;
        let eps = endpoints(&dst);
        assert_eq!(eps.len(), 3, "{dst:#}");
        let mut c = client(&eps).await;
        let all = c
            .get("k", Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .unwrap();
        assert_eq!(all.kvs().len(), KEYS, "{name}: every key of the backup, once");
        for kv in all.kvs() {
            let key = kv.key_str().unwrap();
            let i: usize = key[1..].parse().unwrap();
            assert_eq!(kv.value_str().unwrap(), format!("v{i}"), "{name}: {key}");
        }
        let after = c.get("after", None).await.unwrap();
        assert!(
            after.kvs().is_empty(),
            "{name}: a key written after the backup was restored"
        );
        // One cluster: the same cluster ID from every member, three members.
        let mut ids = std::collections::BTreeSet::new();
        for ep in &eps {
            let mut one = client(std::slice::from_ref(ep)).await;
            let list = one.member_list().await.unwrap();
            assert_eq!(list.members().len(), 3, "{name} at {ep}: {:?}", list.members());
            ids.insert(list.header().map(|h| h.cluster_id()).unwrap_or_default());
        }
        assert_eq!(
            ids.len(),
            1,
            "{name}: members answer for different clusters: {ids:?}"
        );
        let revision = checks::current_revision(&eps).await.unwrap();
        let findings = checks::check_hash_kv(&eps, revision).await;
        assert!(findings.is_empty(), "{name}: {findings:?}");
    }
}
