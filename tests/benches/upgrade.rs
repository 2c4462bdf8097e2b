//! Benchmark of a rolling upgrade 3.5.0 → 3.5.1 of a 3-member cluster under a continuous writer:
//! the operator (`etcd-operator local`, `kubectl patch` of `spec.version` until
//! `status.upgrade.phase` is `Complete`) beside the same roll done by hand in the same run (three
//! etcd processes; each follower stopped with SIGTERM and started on the 3.5.1 binary with its
//! data directory, waited for until its own `Status` reports 3.5.1 and it has caught up;
//! leadership moved to an upgraded member; the old leader restarted last).
//!
//! Printed per side: the roll's duration and the longest time between two successful writes of a
//! writer that puts sequential keys through one client holding every endpoint (median, min and
//! max over the runs). The operator's duration includes its reconcile pacing and the snapshot it
//! takes first; the by-hand side polls every 50 ms. Prints figures only; never asserts on timings;
//! exits non-zero when something fails (including a lost acknowledged write).
//!
//! Run with `cargo bench -p etcd-operator-tests --bench upgrade`. Knob: `BENCH_RUNS` (runs per
//! side, default 3). The operator is the workspace's debug build (built by the test support).

// A bench is test code: a failed unwrap is a bench failure with its location, and printing the
// figures is its purpose.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, ensure};
use etcd_client::{Client, ConnectOptions, GetOptions};
use etcd_operator_tests::kubectl::{Watched, apply, kubectl, wait_for};
use etcd_operator_tests::{EtcdVersion, LocalOperator, TestProcess, ports, tools};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const FROM: EtcdVersion = EtcdVersion::V3_5_0;
const TO: EtcdVersion = EtcdVersion::V3_5_1;
const POLL: Duration = Duration::from_millis(50);
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// One roll: how long it took and the longest write gap.
#[derive(Debug, Clone, Copy)]
struct Sample {
    roll: Duration,
    gap: Duration,
    writes: usize,
}

/// A failed write: when it was sent and when it failed (Unix seconds), and why.
#[derive(Debug, Clone)]
struct Failure {
    sent: f64,
    failed: f64,
    error: String,
}

/// What the writer saw.
struct Written {
    acknowledged: Vec<String>,
    gap: Duration,
    failures: Vec<Failure>,
}

struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<Written>>,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Failures that took long enough to matter for the gap (the client's timeout is 2 s), with the
/// steps of the roll around them, so the longest gap can be attributed.
fn print_slow_failures(side: &str, failures: &[Failure], steps: &[(f64, String)]) {
    for f in failures.iter().filter(|f| f.failed - f.sent > 0.5) {
        println!(
            "  {side}: a write sent at {:.3} failed after {:.0} ms: {}",
            f.sent,
            (f.failed - f.sent) * 1000.0,
            f.error
        );
        for (at, step) in steps.iter().filter(|(at, _)| (at - f.sent).abs() < 3.0) {
            println!("    {:+6.0} ms  {step}", (at - f.sent) * 1000.0);
        }
    }
}

/// Puts `w-<n>` = `<n>` through one client holding every endpoint until stopped.
fn start_writer(endpoints: Vec<String>) -> Writer {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(2));
        let mut client = Client::connect(&endpoints, Some(options)).await?;
        let mut acknowledged = Vec::new();
        let mut failures = Vec::new();
        let mut gap = Duration::ZERO;
        let mut last = Instant::now();
        let mut n = 0u64;
        while !flag.load(Ordering::SeqCst) {
            n += 1;
            let key = format!("w-{n:08}");
            let sent = unix_now();
            match tokio::time::timeout(
                Duration::from_secs(3),
                client.put(key.as_str(), n.to_string(), None),
            )
            .await
            {
                Ok(Ok(_)) => {
                    let now = Instant::now();
                    gap = gap.max(now - last);
                    last = now;
                    acknowledged.push(key);
                }
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "no answer in 3 s".to_string(),
                    };
                    failures.push(Failure {
                        sent,
                        failed: unix_now(),
                        error,
                    });
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        Ok(Written {
            acknowledged,
            gap: gap.max(Instant::now() - last),
            failures,
        })
    });
    Writer { stop, task }
}

impl Writer {
    /// Stops the writer and checks every acknowledged write reads back.
    async fn finish(self, endpoints: &[String]) -> anyhow::Result<(usize, Duration, Vec<Failure>)> {
        self.stop.store(true, Ordering::SeqCst);
        let Written {
            acknowledged,
            gap,
            failures,
        } = self.task.await??;
        let mut client = Client::connect(endpoints, None).await?;
        let stored = client
            .get("w-", Some(GetOptions::new().with_prefix().with_keys_only()))
            .await?;
        let keys: std::collections::HashSet<&str> =
            stored.kvs().iter().filter_map(|kv| kv.key_str().ok()).collect();
        let lost = acknowledged.iter().filter(|k| !keys.contains(k.as_str())).count();
        ensure!(lost == 0, "{lost} acknowledged writes lost");
        Ok((acknowledged.len(), gap, failures))
    }
}

// --- operator side

fn all_on(s: &Value, version: &str) -> bool {
    s["readyReplicas"] == 3
        && s["members"].as_array().is_some_and(|m| {
            m.len() == 3 && m.iter().all(|m| m["healthy"] == true && m["version"] == version)
        })
}

async fn operator_roll(op: &LocalOperator, run: usize) -> anyhow::Result<Sample> {
    let name = format!("bench-{run}");
    let yaml = format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: 3\n  version: {FROM}\n"
    );
    apply(op, &yaml)?;
    let s = wait_for(
        op,
        Watched::status("ec", &name).every(POLL),
        "3 members on the old version",
        STEP_TIMEOUT,
        |s| all_on(s, FROM.as_str()),
    )
    .await?;
    let endpoints: Vec<String> = serde_json::from_value(s["clientEndpoints"].clone())?;
    let writer = start_writer(endpoints.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    let patch = format!(r#"{{"spec":{{"version":"{TO}"}}}}"#);
    kubectl(op, &["patch", "ec", &name, "--type=merge", "-p", &patch], None)?;
    wait_for(
        op,
        Watched::status("ec", &name).every(POLL),
        "the roll to complete",
        STEP_TIMEOUT,
        |s| all_on(s, TO.as_str()) && s["upgrade"]["phase"] == "Complete",
    )
    .await?;
    let roll = t0.elapsed();
    let (writes, gap, failures) = writer.finish(&endpoints).await?;
    print_slow_failures("operator", &failures, &operator_steps(op, &name));
    kubectl(op, &["delete", "ec", &name, "--wait", "--timeout=60s"], None)?;
    Ok(Sample { roll, gap, writes })
}

/// The operator's member steps for cluster `name` from its log (Unix seconds, what).
fn operator_steps(op: &LocalOperator, name: &str) -> Vec<(f64, String)> {
    let Ok(entries) = std::fs::read_dir(op.state_dir()) else {
        return Vec::new();
    };
    let mut steps = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if !(file.starts_with("operator") && file.ends_with(".log")) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            let plain = strip_ansi(line);
            let interesting = ["moved leadership", "stopped etcd member", "started etcd member"]
                .iter()
                .any(|w| plain.contains(w));
            if !interesting || !plain.contains(&format!("{name}-")) && !plain.contains(&format!("/{name}")) {
                continue;
            }
            let Some((ts, rest)) = plain.split_once(' ') else {
                continue;
            };
            if let Ok(t) = ts.parse::<jiff::Timestamp>() {
                let what = rest.rsplit_once(": ").map_or(rest, |(_, w)| w);
                steps.push((t.as_millisecond() as f64 / 1000.0, what.trim().to_string()));
            }
        }
    }
    steps
}

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

// --- by hand

struct HandMember {
    name: String,
    peer: String,
    client: String,
    dir: std::path::PathBuf,
    process: Option<TestProcess>,
}

fn spawn_member(
    m: &HandMember,
    version: EtcdVersion,
    initial_cluster: &str,
    log: &Path,
) -> anyhow::Result<TestProcess> {
    let mut cmd = Command::new(tools::etcd(version)?);
    cmd.arg(format!("--name={}", m.name))
        .arg(format!("--data-dir={}", m.dir.display()))
        .arg(format!("--listen-peer-urls={}", m.peer))
        .arg(format!("--initial-advertise-peer-urls={}", m.peer))
        .arg(format!("--listen-client-urls={}", m.client))
        .arg(format!("--advertise-client-urls={}", m.client))
        .arg(format!("--initial-cluster={initial_cluster}"))
        .arg("--initial-cluster-state=new")
        .arg("--initial-cluster-token=bench-by-hand");
    Ok(TestProcess::spawn(m.name.clone(), cmd, log)?)
}

/// Polls the member's own status until it reports `version`, sees a leader and has applied close
/// to the leader's index.
async fn wait_member_on(client_url: &str, all: &[String], version: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let ok = async {
            let mut one = Client::connect([client_url], None).await.ok()?;
            let s = one.status().await.ok()?;
            let mut any = Client::connect(all, None).await.ok()?;
            let leader = any.status().await.ok()?;
            (s.version() == version
                && s.leader() != 0
                && s.raft_applied_index() + 1000 >= leader.raft_applied_index())
            .then_some(())
        }
        .await;
        if ok.is_some() {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{client_url} never ran {version}");
        tokio::time::sleep(POLL).await;
    }
}

fn stop_member(m: &mut HandMember) -> anyhow::Result<()> {
    let mut p = m.process.take().context("member not running")?;
    kill(Pid::from_raw(i32::try_from(p.pid())?), Signal::SIGTERM)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.exited().is_none() {
        if Instant::now() > deadline {
            p.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

async fn hand_roll() -> anyhow::Result<Sample> {
    let dir = tempfile::tempdir()?;
    let ports = ports::free_ports(6)?;
    let mut members: Vec<HandMember> = (0..3)
        .map(|i| HandMember {
            name: format!("m{i}"),
            peer: format!("http://127.0.0.1:{}", ports[2 * i]),
            client: format!("http://127.0.0.1:{}", ports[2 * i + 1]),
            dir: dir.path().join(format!("m{i}")),
            process: None,
        })
        .collect();
    let initial = members
        .iter()
        .map(|m| format!("{}={}", m.name, m.peer))
        .collect::<Vec<_>>()
        .join(",");
    let endpoints: Vec<String> = members.iter().map(|m| m.client.clone()).collect();
    for (i, m) in members.iter_mut().enumerate() {
        m.process = Some(spawn_member(
            m,
            FROM,
            &initial,
            &dir.path().join(format!("m{i}-0.log")),
        )?);
    }
    for m in &members {
        wait_member_on(&m.client, &endpoints, FROM.as_str()).await?;
    }
    let writer = start_writer(endpoints.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    let mut any = Client::connect(&endpoints, None).await?;
    let leader_id = any.status().await?.leader();
    let list = any.member_list().await?;
    let id_of = |name: &str| list.members().iter().find(|m| m.name() == name).map(|m| m.id());
    let leader = members
        .iter()
        .position(|m| id_of(&m.name) == Some(leader_id))
        .ok_or_else(|| anyhow!("no leader"))?;
    let mut steps: Vec<(f64, String)> = Vec::new();
    let mut order: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    order.push(leader);
    for (step, i) in order.into_iter().enumerate() {
        if i == leader {
            let to = members
                .iter()
                .find(|m| m.name != members[leader].name)
                .and_then(|m| id_of(&m.name))
                .ok_or_else(|| anyhow!("no member to move leadership to"))?;
            let mut l = Client::connect([members[leader].client.as_str()], None).await?;
            steps.push((
                unix_now(),
                format!("move leadership from {}", members[leader].name),
            ));
            l.move_leader(to).await?;
            steps.push((unix_now(), "moved leadership".into()));
        }
        steps.push((unix_now(), format!("stop {}", members[i].name)));
        stop_member(&mut members[i])?;
        steps.push((unix_now(), format!("stopped {}", members[i].name)));
        let log = dir.path().join(format!("m{i}-{}.log", step + 1));
        members[i].process = Some(spawn_member(&members[i], TO, &initial, &log)?);
        steps.push((unix_now(), format!("started {} on {TO}", members[i].name)));
        wait_member_on(&members[i].client, &endpoints, TO.as_str()).await?;
    }
    let roll = t0.elapsed();
    let (writes, gap, failures) = writer.finish(&endpoints).await?;
    print_slow_failures("by hand", &failures, &steps);
    Ok(Sample { roll, gap, writes })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn line(what: &str, v: &[Duration]) -> String {
    let min = v.iter().min().copied().unwrap_or_default();
    let max = v.iter().max().copied().unwrap_or_default();
    format!(
        "{what:<34} median {:>7.2} s   (min {:.2}, max {:.2})",
        median(v.to_vec()).as_secs_f64(),
        min.as_secs_f64(),
        max.as_secs_f64()
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    tools::etcd(FROM)?;
    tools::etcd(TO)?;
    let op = LocalOperator::start().await?;
    let (mut ops, mut hands) = (Vec::new(), Vec::new());
    // Alternate, so that load from elsewhere hits both sides alike.
    for run in 0..runs {
        let o = operator_roll(&op, run).await?;
        println!(
            "run {run}: operator roll {:.2} s, longest write gap {} ms, {} writes",
            o.roll.as_secs_f64(),
            o.gap.as_millis(),
            o.writes
        );
        ops.push(o);
        let h = hand_roll().await?;
        println!(
            "run {run}: by-hand roll {:.2} s, longest write gap {} ms, {} writes",
            h.roll.as_secs_f64(),
            h.gap.as_millis(),
            h.writes
        );
        hands.push(h);
    }
    let op_roll: Vec<Duration> = ops.iter().map(|s| s.roll).collect();
    let hand_roll_: Vec<Duration> = hands.iter().map(|s| s.roll).collect();
    let op_gap: Vec<Duration> = ops.iter().map(|s| s.gap).collect();
    let hand_gap: Vec<Duration> = hands.iter().map(|s| s.gap).collect();
    println!("\nrolling upgrade {FROM} -> {TO}, 3 members, continuous writer, {runs} runs per side");
    println!("{}", line("roll, operator", &op_roll));
    println!("{}", line("roll, by hand", &hand_roll_));
    println!("{}", line("longest write gap, operator", &op_gap));
    println!("{}", line("longest write gap, by hand", &hand_gap));
    let ratio = median(op_roll).as_secs_f64() / median(hand_roll_).as_secs_f64().max(f64::EPSILON);
    println!("roll duration operator / by hand: {ratio:.2}");
    Ok(())
}
