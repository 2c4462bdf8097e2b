//! Rolling upgrades end to end: `etcd-operator local` with real etcd 3.4.23, 3.5.0, 3.5.1 and
//! 3.5.16 members, a continuous writer through a client holding every endpoint, kubectl for the spec
//! changes, and etcd's own `HashKV` to check that members agree afterwards.

// Test code: a failed unwrap is a test failure with its location; the write gap is printed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::Client;
use etcd_operator_tests::kubectl::{Watched, apply, condition, kubectl, output, status, wait_for};
use etcd_operator_tests::local_cluster::{cluster_dir, endpoints};
use etcd_operator_tests::operator::OperatorOptions;
use etcd_operator_tests::writer::{Writes, assert_hash_kv_agrees, assert_no_write_lost, start_writer};
use etcd_operator_tests::{EtcdVersion, LocalOperator, tools};
use serde_json::Value;

/// The health-gate timeout the halting test runs with (the default is 120 s).
const SHORT_UPGRADE_TIMEOUT: &str = "8s";

/// How often the waits read the cluster's status.
const STATUS_POLL: Duration = Duration::from_millis(250);

fn cluster_yaml(name: &str, version: &str) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: 3\n  version: {version}\n"
    )
}

fn set_version(op: &LocalOperator, name: &str, version: &str) -> std::process::Output {
    let patch = format!(r#"{{"spec":{{"version":"{version}"}}}}"#);
    output(op, &["patch", "ec", name, "--type=merge", "-p", &patch], None).unwrap()
}

fn available_on(s: &Value, version: &str) -> bool {
    condition(s, "Available").is_some_and(|c| c["status"] == "True")
        && s["readyReplicas"] == 3
        && s["members"].as_array().is_some_and(|m| {
            m.len() == 3 && m.iter().all(|m| m["healthy"] == true && m["version"] == version)
        })
}

fn roll_complete(s: &Value, version: &str) -> bool {
    available_on(s, version)
        && s["upgrade"]["phase"] == "Complete"
        && s["upgrade"]["targetVersion"] == version
        && s["currentVersion"] == version
}

/// The versions recorded for the members in the local runtime's `member.json` files.
fn recorded_versions(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| {
                let text = std::fs::read_to_string(e.ok()?.path().join("member.json")).ok()?;
                let v: Value = serde_json::from_str(&text).ok()?;
                Some(v["config"]["version"].as_str()?.to_string())
            })
            .collect()
        })
        .unwrap_or_default()
}

/// The longest gap and the failures that took long enough to matter for it (the client's timeout
/// is 2 s), each with the operator's member steps around it, so the gap can be attributed.
fn print_slow_failures(writes: &Writes, steps: &[(f64, String)]) {
    let (from, to) = writes.longest_gap_at;
    println!("longest gap: from {from:.3} to {to:.3}");
    for (at, step) in steps.iter().filter(|(at, _)| *at > from - 3.0 && *at < to + 1.0) {
        println!("  {:+6.0} ms  {step}", (at - from) * 1000.0);
    }
    for (sent, failed, error) in writes.failure_log.iter().filter(|(s, f, _)| f - s > 0.5) {
        println!(
            "a write sent at {sent:.3} failed after {:.0} ms: {error}",
            (failed - sent) * 1000.0
        );
        for (at, step) in steps.iter().filter(|(at, _)| (at - sent).abs() < 3.0) {
            println!("  {:+6.0} ms  {step}", (at - sent) * 1000.0);
        }
    }
}

/// The operator's member steps for cluster `name` from its logs (Unix seconds, what).
fn operator_steps(op: &LocalOperator, name: &str) -> Vec<(f64, String)> {
    let mut steps = Vec::new();
    for entry in std::fs::read_dir(op.state_dir()).unwrap().flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if !(file.starts_with("operator") && file.ends_with(".log")) {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap_or_default().lines() {
            let plain = strip_ansi(line);
            let step = ["moved leadership", "stopped etcd member", "started etcd member"]
                .iter()
                .any(|w| plain.contains(w));
            if !step || !(plain.contains(&format!("{name}-")) || plain.contains(&format!("/{name} "))) {
                continue;
            }
            if let Some((ts, rest)) = plain.split_once(' ')
                && let Ok(t) = ts.parse::<jiff::Timestamp>()
            {
                let what = rest.rsplit_once(": ").map_or(rest, |(_, w)| w);
                steps.push((t.as_millisecond() as f64 / 1000.0, what.trim().to_string()));
            }
        }
    }
    steps.sort_by(|a, b| a.0.total_cmp(&b.0));
    steps
}

/// The text of a log line without its terminal colour codes.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Upgrades a 3-member cluster from `from` to `to` under a continuous writer, optionally
/// SIGKILLing the operator once the first member has been restarted on `to`.
async fn roll_under_writer(op: &mut LocalOperator, name: &str, from: &str, to: &str, crash_mid_roll: bool) {
    let s = wait_for(
        op,
        Watched::status("ec", name).every(STATUS_POLL),
        "3 members on the old version",
        Duration::from_secs(90),
        |s| available_on(s, from),
    )
    .await
    .unwrap();
    let eps = endpoints(&s);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(eps.clone(), None, stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let started = Instant::now();
    let out = set_version(op, name, to);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    if crash_mid_roll {
        let dir = cluster_dir(op, name);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !recorded_versions(&dir).iter().any(|v| v == to) {
            assert!(Instant::now() < deadline, "no member was restarted on {to}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        op.crash();
        println!(
            "operator SIGKILLed {:.1}s into the roll with member versions {:?}",
            started.elapsed().as_secs_f64(),
            recorded_versions(&dir)
        );
        op.start_again().await.unwrap();
    }
    let s = wait_for(
        op,
        Watched::status("ec", name).every(STATUS_POLL),
        "the roll to complete",
        Duration::from_secs(180),
        |s| roll_complete(s, to),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let writes = writer.await.unwrap();
    println!(
        "roll {from} -> {to}: {:.1}s; {} writes acknowledged, {} failed attempts; longest gap between successful writes: {} ms",
        took.as_secs_f64(),
        writes.acknowledged.len(),
        writes.failures,
        writes.longest_gap.as_millis()
    );
    print_slow_failures(&writes, &operator_steps(op, name));
    assert!(
        writes.acknowledged.len() > 10,
        "the writer hardly wrote ({} writes)",
        writes.acknowledged.len()
    );
    assert_eq!(s["upgrade"]["fromVersion"], from);
    assert_eq!(s["upgrade"]["updatedMembers"], 3);
    assert_eq!(condition(&s, "Degraded").unwrap()["status"], "False");
    assert!(
        recorded_versions(&cluster_dir(op, name)).iter().all(|v| v == to),
        "every member recorded on {to}"
    );
    // The snapshot beside the cluster's data (first; then where else it was sent, if anywhere).
    let kept = s["upgrade"]["snapshot"].as_str().unwrap();
    let snapshot = PathBuf::from(kept.split(" and ").next().unwrap());
    assert!(
        snapshot.starts_with(cluster_dir(op, name).join("snapshots")),
        "{}",
        snapshot.display()
    );
    let file_name = snapshot.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        file_name.starts_with(&format!("pre-upgrade-{from}-to-{to}-")) && file_name.ends_with(".db"),
        "{file_name}"
    );
    assert!(std::fs::metadata(&snapshot).unwrap().len() > 0);
    let eps = endpoints(&s);
    assert_no_write_lost(&eps, None, &writes).await;
    assert_hash_kv_agrees(&eps).await;
}

#[tokio::test]
async fn patch_upgrade_3_5_0_to_3_5_1_under_a_writer_loses_no_write() {
    let mut op = LocalOperator::start().await.unwrap();
    // With a backup destination (a schedule that does not fire during the test), the
    // pre-upgrade snapshot is sent there too.
    let backups = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}  backup:\n    schedule: \"0 0 1 1 *\"\n    destination:\n      volume:\n        path: {}\n",
        cluster_yaml("up", "3.5.0"),
        backups.path().display()
    );
    apply(&op, &yaml).unwrap();
    roll_under_writer(&mut op, "up", "3.5.0", "3.5.1", false).await;
    let manual = backups.path().join("default").join("up").join("manual");
    let mut sent: Vec<String> = std::fs::read_dir(&manual)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    sent.sort();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(
        sent[0].starts_with("pre-upgrade-3.5.0-to-3.5.1-") && sent[0].ends_with(".db"),
        "{sent:?}"
    );
    assert_eq!(sent[1], format!("{}.sha256", sent[0]));
    let beside = status(&op, "ec", "up").unwrap()["upgrade"]["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        beside.ends_with(&manual.join(&sent[0]).display().to_string()),
        "{beside}"
    );
    let local = PathBuf::from(beside.split(" and ").next().unwrap());
    assert_eq!(
        std::fs::read(&local).unwrap(),
        std::fs::read(manual.join(&sent[0])).unwrap(),
        "the same snapshot in both places"
    );
}

/// Across fifteen patch releases and two builds (PyPI's 3.5.1, Debian's 3.5.16).
#[tokio::test]
async fn patch_upgrade_3_5_1_to_3_5_16_under_a_writer_loses_no_write() {
    tools::etcd(EtcdVersion::V3_5_16).unwrap();
    let mut op = LocalOperator::start().await.unwrap();
    apply(&op, &cluster_yaml("up16", "3.5.1")).unwrap();
    roll_under_writer(&mut op, "up16", "3.5.1", "3.5.16", false).await;
}

/// A minor roll onto etcd 3.6 (the server-only 3.6.15 build: the roll needs no etcdctl/etcdutl of
/// the target, its pre-upgrade snapshot is taken over gRPC).
#[tokio::test]
async fn minor_upgrade_3_5_16_to_3_6_15_under_a_writer_loses_no_write() {
    tools::etcd(EtcdVersion::V3_6_15).unwrap();
    let mut op = LocalOperator::start().await.unwrap();
    apply(&op, &cluster_yaml("up36", "3.5.16")).unwrap();
    roll_under_writer(&mut op, "up36", "3.5.16", "3.6.15", false).await;
}

/// A minor roll back from etcd 3.6 to 3.5: the pre-upgrade snapshot, then etcd's downgrade
/// validated and enabled (the cluster and storage versions go to 3.5), then each member on the
/// 3.5 binary in the upgrade order, with the operator SIGKILLed in the middle.
#[tokio::test]
async fn minor_downgrade_3_6_15_to_3_5_34_through_etcds_downgrade_under_a_writer_loses_no_write() {
    tools::etcd(EtcdVersion::V3_6_15).unwrap();
    tools::etcd(EtcdVersion::V3_5_34).unwrap();
    let mut op = LocalOperator::start().await.unwrap();
    apply(&op, &cluster_yaml("down35", "3.6.15")).unwrap();
    roll_under_writer(&mut op, "down35", "3.6.15", "3.5.34", true).await;
    let s = etcd_operator_tests::kubectl::status(&op, "ec", "down35").unwrap();
    assert_eq!(s["upgrade"]["downgrade"], "Complete", "{s:#}");
    // etcd says the cluster is 3.5 now, on every member.
    for ep in endpoints(&s) {
        let body = reqwest::get(format!("{ep}/version"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let version: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(version["etcdserver"], "3.5.34", "{ep}: {version}");
        assert_eq!(version["etcdcluster"], "3.5.0", "{ep}: {version}");
    }
}

#[tokio::test]
async fn minor_upgrade_3_4_to_3_5_refuses_skips_and_survives_an_operator_sigkill() {
    tools::etcd(EtcdVersion::V3_4_23).unwrap();
    let mut op = LocalOperator::start().await.unwrap();
    apply(&op, &cluster_yaml("minor", "3.4.23")).unwrap();
    wait_for(
        &op,
        Watched::status("ec", "minor").every(STATUS_POLL),
        "3 members on 3.4.23",
        Duration::from_secs(90),
        |s| available_on(s, "3.4.23"),
    )
    .await
    .unwrap();

    // Refused at admission, nothing starts: a skipped minor, a major change.
    for (version, says) in [("3.6.0", "may not skip a minor"), ("4.0.0", "major version")] {
        let out = set_version(&op, "minor", version);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{version} was accepted");
        assert!(
            stderr.contains("Invalid") && stderr.contains(says),
            "{version}: {stderr}"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = status(&op, "ec", "minor").unwrap();
    assert!(s["upgrade"].is_null(), "a refused version started a roll: {s:#}");
    let spec: Value =
        serde_json::from_str(&kubectl(&op, &["get", "ec", "minor", "-o", "json"], None).unwrap()).unwrap();
    assert_eq!(spec["spec"]["version"], "3.4.23");
    assert!(
        recorded_versions(&cluster_dir(&op, "minor"))
            .iter()
            .all(|v| v == "3.4.23")
    );

    roll_under_writer(&mut op, "minor", "3.4.23", "3.5.1", true).await;
}

/// A directory of etcd binaries: the real ones, plus a `3.5.2/etcd` that exits 1 at once.
fn binaries_with_a_broken_3_5_2() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for version in EtcdVersion::ALL {
        let real = tools::etcd(version).unwrap();
        std::fs::create_dir_all(dir.path().join(version.as_str())).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join(version.as_str()).join("etcd")).unwrap();
    }
    let broken = dir.path().join("3.5.2");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("etcd"),
        "#!/bin/sh\necho 'broken etcd 3.5.2' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(broken.join("etcd"), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[tokio::test]
async fn a_target_that_cannot_start_halts_the_roll_degraded_while_the_cluster_serves() {
    let binaries = binaries_with_a_broken_3_5_2();
    let mut op = LocalOperator::start_with(OperatorOptions {
        env: vec![(
            "ETCD_OPERATOR_UPGRADE_TIMEOUT".into(),
            SHORT_UPGRADE_TIMEOUT.into(),
        )],
        args: vec!["--etcd-binaries".into(), binaries.path().display().to_string()],
    })
    .await
    .unwrap();
    apply(&op, &cluster_yaml("halt", "3.5.1")).unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "halt").every(STATUS_POLL),
        "3 members on 3.5.1",
        Duration::from_secs(90),
        |s| available_on(s, "3.5.1"),
    )
    .await
    .unwrap();
    let eps = endpoints(&s);

    let out = set_version(&op, "halt", "3.5.2");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = wait_for(
        &op,
        Watched::status("ec", "halt").every(STATUS_POLL),
        "the roll to halt",
        Duration::from_secs(120),
        |s| s["upgrade"]["phase"] == "Halted",
    )
    .await
    .unwrap();
    let failed = s["upgrade"]["currentMember"].as_str().unwrap().to_string();
    let degraded = condition(&s, "Degraded").unwrap();
    assert_eq!(degraded["status"], "True", "{s:#}");
    assert_eq!(degraded["reason"], "UpgradeHalted");
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("member {failed} did not become healthy on etcd 3.5.2"))
            && message.contains("started again on etcd 3.5.1"),
        "{message}"
    );
    // The failed member is back on 3.5.1, the cluster is whole and serves; nobody else was touched.
    let s = wait_for(
        &op,
        Watched::status("ec", "halt").every(STATUS_POLL),
        "all healthy on 3.5.1 again",
        Duration::from_secs(60),
        |s| available_on(s, "3.5.1"),
    )
    .await
    .unwrap();
    assert_eq!(s["upgrade"]["phase"], "Halted");
    assert_eq!(condition(&s, "Degraded").unwrap()["reason"], "UpgradeHalted");
    let mut client = Client::connect(&eps, None).await.unwrap();
    client.put("after-halt", "served", None).await.unwrap();
    let log = std::fs::read_to_string(cluster_dir(&op, "halt").join(&failed).join("etcd.log")).unwrap();
    assert!(
        log.contains("broken etcd 3.5.2"),
        "the failed member never ran 3.5.2"
    );
    let restarted_on_target: Vec<String> = std::fs::read_dir(cluster_dir(&op, "halt"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let log = std::fs::read_to_string(e.path().join("etcd.log")).ok()?;
            log.contains("broken etcd 3.5.2")
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect();
    assert_eq!(
        restarted_on_target,
        std::slice::from_ref(&failed),
        "only one member was tried"
    );
    // It stays halted across an operator restart: no retry until the spec changes.
    op.restart().await.unwrap();
    etcd_operator_tests::kubectl::wait_reconciles(
        &op,
        3,
        "three looks at the halted roll",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let s = status(&op, "ec", "halt").unwrap();
    assert_eq!(s["upgrade"]["phase"], "Halted");
    assert!(available_on(&s, "3.5.1"), "{s:#}");
    assert!(
        recorded_versions(&cluster_dir(&op, "halt"))
            .iter()
            .all(|v| v == "3.5.1")
    );

    // A version without a binary: a clear error in the status, not a crash; nothing touched.
    let out = set_version(&op, "halt", "3.5.3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = wait_for(
        &op,
        Watched::status("ec", "halt").every(STATUS_POLL),
        "the roll to 3.5.3 to halt",
        Duration::from_secs(60),
        |s| s["upgrade"]["phase"] == "Halted" && s["upgrade"]["targetVersion"] == "3.5.3",
    )
    .await
    .unwrap();
    let message = condition(&s, "Degraded").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("etcd 3.5.3 is not available") && message.contains("no etcd binary"),
        "{message}"
    );
    assert!(available_on(&s, "3.5.1"), "{s:#}");
    assert!(
        recorded_versions(&cluster_dir(&op, "halt"))
            .iter()
            .all(|v| v == "3.5.1")
    );
    assert!(op.pid().is_some_and(etcd_operator_tests::leftovers::is_running));
}
