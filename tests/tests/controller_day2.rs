//! Day-2 operations end to end with the local runtime and real etcd 3.5.1: a cluster whose
//! members all went down (killed at once, or a "host reboot" that also took the operator) comes
//! back with its cluster ID and data.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use etcd_operator_tests::LocalOperator;
use etcd_operator_tests::kubectl::{Watched, apply, client_endpoints, condition, wait_for};
use etcd_operator_tests::local_cluster::{
    available, cluster_dir, cluster_yaml, etcdctl_output as etcdctl, kill_every_member, kill_member,
    running_member_pids as member_pids, wait_available,
};
use serde_json::Value;

/// Brings up a 3-member cluster with one key in it; its status.
async fn three_members_with_a_key(op: &LocalOperator, name: &str) -> Value {
    apply(op, &cluster_yaml(name, 3)).unwrap();
    let s = wait_available(op, name, 3, "3 healthy members", Duration::from_secs(90)).await;
    let out = etcdctl(&client_endpoints(&s)[0], &["put", "survives", "the-outage"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(s["clusterID"].is_string(), "{s}");
    s
}

/// Waits until every member runs as a new process (none of `killed`) and the cluster is
/// available again, then checks it has the same ID and every member serves the key.
async fn back_with_the_same_id_and_data(op: &LocalOperator, name: &str, before: &Value, killed: &[u32]) {
    let s = wait_for(
        op,
        Watched::status("ec", name),
        "the cluster back after the outage",
        Duration::from_secs(90),
        |s| {
            let now = member_pids(op, name);
            available(s, 3) && now.len() == 3 && now.iter().all(|p| !killed.contains(p))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        s["clusterID"], before["clusterID"],
        "the same cluster, not a new one"
    );
    assert_eq!(
        client_endpoints(&s),
        client_endpoints(before),
        "the same members, restarted on their data"
    );
    for ep in client_endpoints(&s) {
        let out = etcdctl(&ep, &["get", "survives", "--print-value-only"]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "the-outage",
            "{ep}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn every_member_killed_at_once_comes_back_with_its_id_and_data() {
    let op = LocalOperator::start().await.unwrap();
    let before = three_members_with_a_key(&op, "outage").await;
    let killed = kill_every_member(&op, "outage");
    assert_eq!(killed.len(), 3);
    back_with_the_same_id_and_data(&op, "outage", &before, &killed).await;
}

#[tokio::test]
async fn a_host_reboot_that_took_the_operator_too_brings_the_cluster_back() {
    let mut op = LocalOperator::start().await.unwrap();
    let before = three_members_with_a_key(&op, "reboot").await;
    op.crash();
    let killed = kill_every_member(&op, "reboot");
    assert_eq!(killed.len(), 3);
    op.start_again().await.unwrap();
    back_with_the_same_id_and_data(&op, "reboot", &before, &killed).await;
}

/// Members that exit as they start after an outage (here: their client ports are taken) are
/// started again with a growing back-off, not as fast as their exits wake the controller; once
/// they can start, the cluster comes back with its ID and data.
#[tokio::test]
async fn members_that_exit_as_they_start_after_an_outage_are_started_again_with_a_back_off() {
    let mut op = LocalOperator::start().await.unwrap();
    let before = three_members_with_a_key(&op, "loop").await;
    // The operator down first, so that nothing starts the members before their ports are taken.
    op.crash();
    let killed = kill_every_member(&op, "loop");
    assert_eq!(killed.len(), 3);
    let mut taken = Vec::new();
    for ep in client_endpoints(&before) {
        let addr = ep
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match std::net::TcpListener::bind(&addr) {
                Ok(l) => break l,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("cannot take {addr} from the killed member: {e}"),
            }
        };
        taken.push(listener);
    }
    let logged_before = op.log().len();
    op.start_again().await.unwrap();

    let watched = Duration::from_secs(12);
    let s = wait_for(
        &op,
        Watched::status("ec", "loop"),
        "the wait for the restart back-off in the status",
        Duration::from_secs(60),
        |s| {
            condition(s, "Progressing")
                .and_then(|c| c["message"].as_str())
                .is_some_and(|m| {
                    m.contains("since it was last healthy") && m.contains("starting it again in")
                })
        },
    )
    .await
    .unwrap();
    let message = condition(&s, "Progressing").unwrap()["message"].to_string();
    assert!(message.contains("loop-"), "{message}");
    tokio::time::sleep(watched).await;
    let log = op.log();
    let starts = log[logged_before..]
        .lines()
        .filter(|l| l.contains("started etcd member") && l.contains("loop-"))
        .count();
    // With waits of 0, 1, 2, 4, 8 s each member starts about five times in 12 s (and once more
    // per member while the status was awaited); without them, hundreds of times.
    assert!(
        (3..=3 * 9).contains(&starts),
        "{starts} member starts while their ports were taken"
    );

    drop(taken);
    back_with_the_same_id_and_data(&op, "loop", &before, &killed).await;
}

#[tokio::test]
#[allow(clippy::print_stdout)]
async fn a_cluster_past_its_quota_is_reclaimed_and_takes_writes_again_losing_nothing() {
    let op = LocalOperator::start().await.unwrap();
    apply(
        &op,
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: full\n  namespace: default\nspec:\n  replicas: 3\n  version: 3.5.1\n  maintenance:\n    quotaBackendBytes: 16Mi\n",
    )
    .unwrap();
    let s = wait_available(&op, "full", 3, "3 healthy members", Duration::from_secs(90)).await;
    let eps = client_endpoints(&s);
    let mut client = etcd_client::Client::connect(&eps, None).await.unwrap();

    // Small keys that must survive, and a 512 KiB value written again and again: its history
    // fills the 16 MiB quota until etcd raises NOSPACE and refuses writes.
    let big = vec![b'x'; 512 * 1024];
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for i in 0..200 {
        let key = format!("small-{i:04}");
        if client.put(key.as_str(), i.to_string(), None).await.is_ok() {
            acknowledged.push(key);
        }
        if let Err(e) = client.put("big", big.clone(), None).await {
            refused = Some(e.to_string());
            break;
        }
    }
    let refused = refused.expect("the quota was never reached");
    assert!(refused.contains("database space exceeded"), "{refused}");
    let alarmed_at = std::time::Instant::now();

    // Without anyone's help writes are taken again: compacted, defragmented, disarmed.
    let deadline = alarmed_at + Duration::from_secs(180);
    loop {
        if client.put("after", "the-alarm", None).await.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "writes were never taken again; operator log:\n{}",
            op.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "NOSPACE after {} acknowledged small writes; writes taken again {:.1}s later",
        acknowledged.len(),
        alarmed_at.elapsed().as_secs_f64()
    );
    let alarms = client
        .alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None)
        .await
        .unwrap();
    assert!(
        alarms.alarms().is_empty(),
        "{} alarms left",
        alarms.alarms().len()
    );
    // Nothing acknowledged was lost, and the members' databases shrank below the quota.
    for (i, key) in acknowledged.iter().enumerate() {
        let got = client.get(key.as_str(), None).await.unwrap();
        assert_eq!(
            got.kvs().first().map(|kv| kv.value_str().unwrap().to_owned()),
            Some(i.to_string()),
            "{key} lost"
        );
    }
    let s = wait_for(
        &op,
        Watched::status("ec", "full"),
        "healthy with the database sizes shown",
        Duration::from_secs(30),
        |s| {
            available(s, 3)
                && condition(s, "Degraded").is_some_and(|c| c["status"] == "False")
                && s["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|m| m["dbSize"].as_i64().is_some_and(|d| d < 16 << 20) && m["alarms"].is_null())
        },
    )
    .await
    .unwrap();
    println!("members after reclaiming: {}", s["members"]);
    // The reclaim is in status: every member defragmented (the leader last), the alarmed
    // members disarmed, the compaction's revision; it holds off another reclaim for a while,
    // across operator restarts too.
    let reclaim = &s["maintenance"]["lastSpaceReclaim"];
    let names: Vec<&str> = s["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    let mut defragmented: Vec<&str> = reclaim["defragmented"]
        .as_array()
        .unwrap_or_else(|| panic!("no reclaim recorded: {s:#}"))
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    defragmented.sort_unstable();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(defragmented, sorted, "{reclaim:#}");
    let disarmed = reclaim["disarmed"].as_array().unwrap();
    assert!(
        !disarmed.is_empty() && disarmed.iter().all(|m| names.contains(&m.as_str().unwrap())),
        "{reclaim:#}"
    );
    assert!(reclaim["compactedRevision"].as_i64().unwrap() > 0, "{reclaim:#}");
    assert!(reclaim["time"].as_str().is_some(), "{reclaim:#}");
}

#[tokio::test]
async fn quorum_lost_with_two_members_destroyed_is_rebuilt_only_when_asked_and_recorded() {
    let op = LocalOperator::start().await.unwrap();
    let before = three_members_with_a_key(&op, "lost").await;
    let members: Vec<String> = before["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect();
    let (survivor, destroyed) = (members[0].clone(), members[1..].to_vec());
    for name in &destroyed {
        let dir = cluster_dir(&op, "lost").join(name);
        kill_member(&dir);
        std::fs::remove_dir_all(dir.join("data")).unwrap();
    }
    // Without a request nothing is rebuilt: the status says quorum is gone and no member is
    // added, replaced or touched for a while.
    let s = wait_for(
        &op,
        Watched::status("ec", "lost"),
        "the quorum loss reported",
        Duration::from_secs(60),
        |s| condition(s, "Available").is_some_and(|c| c["status"] == "False"),
    )
    .await
    .unwrap();
    etcd_operator_tests::kubectl::wait_reconciles(
        &op,
        3,
        "three looks at the cluster without quorum",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let mut dirs: Vec<String> = std::fs::read_dir(cluster_dir(&op, "lost"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != "snapshots")
        .collect();
    dirs.sort();
    let mut expected = members.clone();
    expected.sort();
    assert_eq!(dirs, expected, "members changed without a request: {s}");
    assert!(s["recovery"].is_null(), "{s}");

    // Asked for: rebuilt from the survivor, then grown back to 3 members with its data.
    etcd_operator_tests::kubectl::kubectl(
        &op,
        &["annotate", "ec", "lost", "etcd.operator.dev/recover-quorum=auto"],
        None,
    )
    .unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "lost"),
        "the cluster rebuilt from the survivor and grown back",
        Duration::from_secs(120),
        |s| available(s, 3) && s["recovery"].is_object(),
    )
    .await
    .unwrap();
    let recovery = &s["recovery"];
    assert_eq!(recovery["request"], "auto", "{s}");
    assert_eq!(recovery["survivor"], survivor.as_str(), "{s}");
    let mut lost: Vec<String> = recovery["lostMembers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    lost.sort();
    let mut want = destroyed.clone();
    want.sort();
    assert_eq!(lost, want, "{s}");
    assert!(recovery["time"].is_string(), "{s}");
    for ep in client_endpoints(&s) {
        let out = etcdctl(&ep, &["get", "survives", "--print-value-only"]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "the-outage",
            "{ep}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The lost members' data was set aside, not deleted.
    for name in &destroyed {
        assert!(
            cluster_dir(&op, "lost").join(".retained").join(name).exists(),
            "{name}"
        );
    }
}

#[tokio::test]
#[allow(clippy::print_stdout)]
async fn a_mostly_free_database_is_defragmented_member_by_member_while_writes_go_on() {
    use etcd_operator_tests::writer::{assert_no_write_lost, start_writer};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let op = LocalOperator::start().await.unwrap();
    // A low size trigger: half the file free and at least 2 MiB to gain.
    apply(
        &op,
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: frag\n  namespace: default\nspec:\n  replicas: 3\n  version: 3.5.1\n  maintenance:\n    defragmentation:\n      fragmentationPercent: 50\n      minReclaimableBytes: 2Mi\n",
    )
    .unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "frag"),
        "3 healthy members",
        Duration::from_secs(90),
        |s| available(s, 3),
    )
    .await
    .unwrap();
    let eps = client_endpoints(&s);
    let mut client = etcd_client::Client::connect(&eps, None).await.unwrap();

    // 12 MiB of data: the files grow, and nearly all of them is in use.
    let big = vec![b'x'; 512 * 1024];
    for i in 0..24 {
        client
            .put(format!("big-{i:02}"), big.clone(), None)
            .await
            .unwrap();
    }
    let grown = wait_for(
        &op,
        Watched::status("ec", "frag"),
        "the grown database sizes",
        Duration::from_secs(30),
        |s| {
            s["members"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["dbSize"].as_i64().is_some_and(|d| d >= 12 << 20))
        },
    )
    .await
    .unwrap();
    assert!(
        grown["maintenance"].is_null(),
        "nothing defragmented while the data is in use: {}",
        grown["maintenance"]
    );

    // Writes go on throughout; the data goes and its history is compacted: the files are now
    // mostly free pages, which only a defragmentation gives back.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(eps.clone(), None, stop.clone());
    let deleted = client
        .delete("big-", Some(etcd_client::DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(deleted.deleted(), 24);
    let revision = deleted.header().unwrap().revision();
    client
        .compact(
            revision,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();

    let s = wait_for(
        &op,
        Watched::status("ec", "frag"),
        "every member defragmented by the size trigger",
        Duration::from_secs(120),
        |s| {
            let records = s["maintenance"]["defragmentations"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            available(s, 3)
                && records.len() == 3
                && records.iter().all(|r| r["trigger"] == "Fragmentation")
                && s["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|m| m["dbSize"].as_i64().is_some_and(|d| d < 6 << 20))
        },
    )
    .await
    .unwrap();
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let writes = writer.await.unwrap();
    println!(
        "defragmented 3 members in {:.1}s; {} writes acknowledged meanwhile, {} failed attempts, longest gap {} ms; members: {}; record: {}",
        took.as_secs_f64(),
        writes.acknowledged.len(),
        writes.failures,
        writes.longest_gap.as_millis(),
        s["members"],
        s["maintenance"]
    );
    assert!(
        s["maintenance"]["lastDefragmentation"].is_string(),
        "{}",
        s["maintenance"]
    );
    for r in s["maintenance"]["defragmentations"].as_array().unwrap() {
        assert!(r["dbSizeBefore"].as_i64().is_some_and(|d| d >= 12 << 20), "{r}");
    }
    assert!(!writes.acknowledged.is_empty());
    assert_no_write_lost(&eps, None, &writes).await;
    // Leadership was handed over before the leader's turn, which came last (times are in
    // seconds: ties allowed).
    assert_ne!(s["leader"], grown["leader"], "leadership moved off the leader");
    let records = s["maintenance"]["defragmentations"].as_array().unwrap();
    let time_of = |member: &Value| {
        records
            .iter()
            .find(|r| &r["member"] == member)
            .and_then(|r| r["time"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let leader_time = time_of(&grown["leader"]);
    assert!(
        records
            .iter()
            .all(|r| r["time"].as_str().unwrap_or_default() <= leader_time.as_str()),
        "the leader before ({}) last: {records:?}",
        grown["leader"]
    );
}

#[tokio::test]
#[allow(clippy::print_stdout)]
async fn the_defragmentation_schedule_takes_every_member_once_per_time() {
    let op = LocalOperator::start().await.unwrap();
    // Every 20 seconds (six fields); the size trigger off, so only the schedule acts.
    apply(
        &op,
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: sched\n  namespace: default\nspec:\n  replicas: 3\n  version: 3.5.1\n  maintenance:\n    defragmentation:\n      schedule: \"*/20 * * * * *\"\n      fragmentationPercent: 0\n",
    )
    .unwrap();
    let times = |s: &Value| -> Vec<String> {
        s["maintenance"]["defragmentations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|r| r["trigger"] == "Schedule")
            .filter_map(|r| r["time"].as_str().map(str::to_owned))
            .collect()
    };
    let first = wait_for(
        &op,
        Watched::status("ec", "sched"),
        "every member defragmented on schedule",
        Duration::from_secs(150),
        |s| available(s, 3) && times(s).len() == 3,
    )
    .await
    .unwrap();
    let first_done = times(&first).into_iter().max().unwrap();
    let second = wait_for(
        &op,
        Watched::status("ec", "sched"),
        "the next scheduled pass",
        Duration::from_secs(90),
        |s| {
            let t = times(s);
            t.len() == 3 && t.iter().all(|t| *t > first_done)
        },
    )
    .await
    .unwrap();
    let second_start = times(&second).into_iter().min().unwrap();
    let parse = |t: &str| t.parse::<jiff::Timestamp>().unwrap().as_second();
    let gap = parse(&second_start) - parse(&first_done);
    println!(
        "first pass done {first_done}, next pass from {second_start}: {}",
        second["maintenance"]
    );
    assert!(
        gap >= 5,
        "a pass is not run again right after the last one: {gap}s"
    );
}

/// The command line of process `pid`, space-separated.
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .unwrap_or_default()
}

#[tokio::test]
#[allow(clippy::print_stdout)]
async fn a_changed_quota_rolls_every_member_onto_it_one_at_a_time_keeping_the_data() {
    // Local mode: the members' etcd flags are their template. A new quota re-creates every
    // member's process once on its data, and status.rollout follows it to Complete.
    let op = LocalOperator::start().await.unwrap();
    let name = "quota";
    let before = three_members_with_a_key(&op, name).await;
    let pids = member_pids(&op, name);
    assert_eq!(pids.len(), 3);
    assert!(
        pids.iter()
            .all(|p| !cmdline(*p).contains("--quota-backend-bytes=67108864"))
    );
    let started = std::time::Instant::now();
    let out = etcd_operator_tests::kubectl::output(
        &op,
        &[
            "patch",
            "ec",
            name,
            "--type=merge",
            "-p",
            r#"{"spec":{"maintenance":{"quotaBackendBytes":"64Mi"}}}"#,
        ],
        None,
    )
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Never more than one member down at a time while it rolls.
    let mut least_healthy = 3;
    let s = wait_for(
        &op,
        Watched::status("ec", name).every(Duration::from_millis(100)),
        "the rollout onto the new quota",
        Duration::from_secs(120),
        |s| {
            if let Some(n) = s["readyReplicas"].as_i64() {
                least_healthy = least_healthy.min(n);
            }
            s["rollout"]["phase"] == "Complete" && available(s, 3)
        },
    )
    .await
    .unwrap();
    println!(
        "local template rollout of 3 members in {:.1} s; fewest healthy members seen: {least_healthy}",
        started.elapsed().as_secs_f64()
    );
    assert!(least_healthy >= 2, "two members were down at once");
    assert_eq!(s["rollout"]["updatedMembers"], 3, "{s:#}");
    let now = member_pids(&op, name);
    assert_eq!(now.len(), 3);
    assert!(
        now.iter().all(|p| !pids.contains(p)),
        "every member restarted: {pids:?} -> {now:?}"
    );
    for pid in &now {
        assert!(
            cmdline(*pid).contains("--quota-backend-bytes=67108864"),
            "{}",
            cmdline(*pid)
        );
    }
    back_with_the_same_id_and_data(&op, name, &before, &pids).await;
}
