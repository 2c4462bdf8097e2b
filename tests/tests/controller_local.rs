//! The controller end to end with the local runtime: real etcd 3.5.1 members started by
//! `etcd-operator local`, driven with kubectl, checked with etcdctl.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use etcd_operator_tests::kubectl::{Watched, apply, condition, kubectl, wait_for};
use etcd_operator_tests::local_cluster::{
    self, cluster_yaml, endpoints, etcdctl, etcdctl_ok, kill_member, member_dir,
    running_member_pids as member_pids,
};
use etcd_operator_tests::{EtcdVersion, LocalOperator, tools};
use serde_json::Value;

/// Available with `replicas` members, and `status.replicas` agreeing.
fn available(s: &Value, replicas: i64) -> bool {
    local_cluster::available(s, replicas) && s["replicas"] == replicas
}

#[tokio::test]
async fn three_members_become_available_and_serve_from_every_member() {
    let op = LocalOperator::start().await.unwrap();
    apply(&op, &cluster_yaml("alpha", 3)).unwrap();
    kubectl(
        &op,
        &["wait", "ec/alpha", "--for=condition=Available", "--timeout=60s"],
        None,
    )
    .unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "alpha"),
        "3 healthy members",
        Duration::from_secs(30),
        |s| available(s, 3),
    )
    .await
    .unwrap();
    assert_eq!(s["observedGeneration"], 1);
    assert!(s["leader"].is_string());
    let eps = endpoints(&s);
    assert_eq!(eps.len(), 3);
    for ep in &eps {
        let out = etcdctl(ep).args(["endpoint", "health"]).output().unwrap();
        assert!(
            out.status.success(),
            "{ep}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    etcdctl_ok(&eps[0], &["put", "greeting", "hello"]);
    for ep in &eps {
        // A serializable read answers from the member's own copy.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = etcdctl_ok(ep, &["get", "greeting", "--print-value-only", "--consistency=s"]);
            if got.trim() == "hello" {
                break;
            }
            assert!(Instant::now() < deadline, "{ep} never had the value");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let list = etcdctl_ok(&eps[1], &["member", "list", "-w", "json"]);
    let members: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(members["members"].as_array().unwrap().len(), 3);
    // kstatus's conditions, as Flux's health checks and `kubectl wait` read them: Ready once
    // settled, neither reconciling nor stalled.
    kubectl(
        &op,
        &["wait", "ec/alpha", "--for=condition=Ready", "--timeout=60s"],
        None,
    )
    .unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "alpha"),
        "Reconciling and Stalled False",
        Duration::from_secs(10),
        |s| {
            ["Reconciling", "Stalled"]
                .iter()
                .all(|t| condition(s, t).is_some_and(|c| c["status"] == "False"))
        },
    )
    .await
    .unwrap();
    assert_eq!(condition(&s, "Ready").unwrap()["reason"], "Reconciled");
}

/// A new cluster carries its first status from the create on (the server writes what the
/// controller's first reconcile computes: bootstrapping, nothing formed yet), and the
/// controller's first write is its next step, not the same status again (issue 24).
#[tokio::test]
async fn a_new_cluster_has_its_first_status_from_the_create_and_the_controller_writes_only_progress() {
    use etcd_operator_tests::kube_client::{connect, etcd_clusters};
    use futures::StreamExt;
    use kube::api::{Api, DynamicObject, WatchEvent, WatchParams};

    let op = LocalOperator::start().await.unwrap();
    let client = connect(&op.kubeconfig(), Default::default()).await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &etcd_clusters());

    let out = kubectl(
        &op,
        &["create", "-o", "json", "-f", "-"],
        Some(&cluster_yaml("fresh", 1)),
    )
    .unwrap();
    let created: Value = serde_json::from_str(&out).unwrap();
    let first = &created["status"];
    assert_eq!(first["phase"], "Creating", "{created:#}");
    assert_eq!(first["observedGeneration"], 1, "{created:#}");
    let progressing = condition(first, "Progressing").unwrap();
    assert_eq!(
        (
            &progressing["status"],
            &progressing["reason"],
            &progressing["message"]
        ),
        (
            &"True".into(),
            &"Bootstrapping".into(),
            &"creating 1 members".into()
        ),
        "{created:#}"
    );
    assert_eq!(condition(first, "Ready").unwrap()["status"], "False");

    // Every change from the create on, until the cluster is available.
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut events = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .unwrap()
        .boxed();
    let mut statuses: Vec<Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while statuses.last().is_none_or(|s| !available(s, 1)) {
        assert!(Instant::now() < deadline, "not available in time: {statuses:#?}");
        match tokio::time::timeout(Duration::from_secs(60), events.next()).await {
            Ok(Some(Ok(WatchEvent::Modified(obj)))) => statuses.push(obj.data["status"].clone()),
            Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
            other => panic!("unexpected watch answer {other:?} after {statuses:#?}"),
        }
    }
    let controllers_first = &statuses[0];
    assert_ne!(
        condition(controllers_first, "Progressing").unwrap()["reason"],
        "Bootstrapping",
        "the controller wrote the first status again: {statuses:#?}"
    );
    // Its status writes are recorded under its field manager.
    let now: Value = serde_json::from_str(
        &kubectl(
            &op,
            &["get", "ec", "fresh", "-o", "json", "--show-managed-fields"],
            None,
        )
        .unwrap(),
    )
    .unwrap();
    let status_managers: Vec<&str> = now["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["subresource"] == "status")
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert_eq!(status_managers, ["etcd-operator"], "{now:#}");
}

#[tokio::test]
async fn scale_three_to_five_to_three_then_replace_a_killed_member_then_delete() {
    let op = LocalOperator::start().await.unwrap();
    apply(&op, &cluster_yaml("beta", 3)).unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "beta"),
        "3 members",
        Duration::from_secs(60),
        |s| available(s, 3),
    )
    .await
    .unwrap();
    etcdctl_ok(&endpoints(&s)[0], &["put", "kept", "across-everything"]);

    kubectl(&op, &["scale", "ec", "beta", "--replicas=5"], None).unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "beta"),
        "5 members",
        Duration::from_secs(90),
        |s| available(s, 5),
    )
    .await
    .unwrap();
    assert_eq!(member_pids(&op, "beta").len(), 5);
    let list: Value =
        serde_json::from_str(&etcdctl_ok(&endpoints(&s)[0], &["member", "list", "-w", "json"])).unwrap();
    assert_eq!(list["members"].as_array().unwrap().len(), 5);

    kubectl(&op, &["scale", "ec", "beta", "--replicas=3"], None).unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "beta"),
        "back to 3 members",
        Duration::from_secs(60),
        |s| available(s, 3),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while member_pids(&op, "beta").len() != 3 {
        assert!(Instant::now() < deadline, "removed members still run");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Delete a member's data and SIGKILL it: it is replaced by a fresh member. (In this order:
    // killed first, the operator may start it again on its data before the data goes, and that
    // process runs on the deleted files, healthy until it next opens one.)
    let victim = s["members"][0]["name"].as_str().unwrap().to_string();
    let dir = member_dir(&op, "beta", &victim);
    std::fs::remove_dir_all(dir.join("data")).unwrap();
    kill_member(&dir);
    let s = wait_for(
        &op,
        Watched::status("ec", "beta"),
        "the killed member replaced",
        Duration::from_secs(90),
        |s| {
            available(s, 3)
                && !s["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["name"] == victim.as_str())
        },
    )
    .await
    .unwrap();
    let eps = endpoints(&s);
    let list: Value = serde_json::from_str(&etcdctl_ok(&eps[0], &["member", "list", "-w", "json"])).unwrap();
    let names: Vec<&str> = list["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&victim.as_str()), "{names:?}");
    assert_eq!(names.len(), 3);
    for ep in &eps {
        assert_eq!(
            etcdctl_ok(ep, &["get", "kept", "--print-value-only"]).trim(),
            "across-everything"
        );
    }

    kubectl(&op, &["delete", "ec", "beta", "--wait", "--timeout=60s"], None).unwrap();
    assert!(
        member_pids(&op, "beta").is_empty(),
        "members still run after delete"
    );
    assert!(
        !op.state_dir()
            .join("members")
            .join("default")
            .join("beta")
            .exists(),
        "member data left after delete"
    );
}

/// Polls the member list of a cluster and records the most learners seen at once.
fn watch_learners(
    op: &LocalOperator,
    stop: Arc<AtomicBool>,
) -> (Arc<AtomicUsize>, std::thread::JoinHandle<()>) {
    let max = Arc::new(AtomicUsize::new(0));
    let seen = max.clone();
    let members_dir = op.state_dir().join("members").join("default").join("gamma");
    let etcdctl_bin = tools::etcdctl(EtcdVersion::V3_5_1).unwrap();
    let handle = std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            // Any member's client port answers the member list.
            let ports: Vec<String> = std::fs::read_dir(&members_dir)
                .map(|d| {
                    d.filter_map(|e| {
                        let v: Value = serde_json::from_str(
                            &std::fs::read_to_string(e.ok()?.path().join("member.json")).ok()?,
                        )
                        .ok()?;
                        Some(format!("http://127.0.0.1:{}", v["clientPort"].as_u64()?))
                    })
                    .collect()
                })
                .unwrap_or_default();
            if !ports.is_empty() {
                let out = Command::new(&etcdctl_bin)
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={}", ports.join(",")))
                    .args(["--command-timeout=1s", "member", "list", "-w", "json"])
                    .output();
                if let Ok(out) = out
                    && let Ok(v) = serde_json::from_slice::<Value>(&out.stdout)
                {
                    let learners = v["members"]
                        .as_array()
                        .map_or(0, |m| m.iter().filter(|m| m["isLearner"] == true).count());
                    seen.fetch_max(learners, Ordering::SeqCst);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    (max, handle)
}

#[tokio::test]
async fn an_operator_killed_at_random_points_of_bootstrap_and_scale_up_converges() {
    let mut op = LocalOperator::start().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (max_learners, watcher) = watch_learners(&op, stop.clone());
    let mut rng_state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |bound: u64| {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state % bound
    };

    // Bootstrap, killed at random points.
    apply(&op, &cluster_yaml("gamma", 3)).unwrap();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(next(900))).await;
        op.crash();
        op.start_again().await.unwrap();
    }
    wait_for(
        &op,
        Watched::status("ec", "gamma"),
        "bootstrap to converge",
        Duration::from_secs(120),
        |s| available(s, 3),
    )
    .await
    .unwrap();

    // Scale-up 3 → 5 (two learner joins, each ~5 s), killed at random points.
    kubectl(&op, &["scale", "ec", "gamma", "--replicas=5"], None).unwrap();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(500 + next(2500))).await;
        op.crash();
        op.start_again().await.unwrap();
    }
    let s = wait_for(
        &op,
        Watched::status("ec", "gamma"),
        "scale-up to converge",
        Duration::from_secs(180),
        |s| available(s, 5),
    )
    .await
    .unwrap();
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    assert!(
        max_learners.load(Ordering::SeqCst) <= 1,
        "saw {} learners at once",
        max_learners.load(Ordering::SeqCst)
    );
    let list: Value =
        serde_json::from_str(&etcdctl_ok(&endpoints(&s)[0], &["member", "list", "-w", "json"])).unwrap();
    assert_eq!(
        list["members"].as_array().unwrap().len(),
        5,
        "no stray members: {list}"
    );
    // Exactly the five members run: nothing half-created was left behind.
    let deadline = Instant::now() + Duration::from_secs(30);
    while member_pids(&op, "gamma").len() != 5 {
        assert!(
            Instant::now() < deadline,
            "{} member processes run, want 5",
            member_pids(&op, "gamma").len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
