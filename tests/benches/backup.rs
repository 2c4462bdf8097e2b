//! Snapshot and restore throughput for a 100 MB keyspace (real etcd 3.5.1), the operator's code
//! paths beside the same work done by hand with the etcd tools, in the same run:
//!
//! - snapshot: the backup controller's path — `MemberOps::snapshot_stream` of `EtcdClient` (etcd's
//!   Snapshot RPC, hashed and integrity-checked as it streams) into `Destination::put_snapshot_stream`
//!   of a directory (temporary file, synced and renamed, + `.sha256` sidecar) — beside
//!   `etcdctl snapshot save <file>`;
//! - restore: `restore::prepare_data_dir` (fetch from the directory, verify the recorded SHA-256
//!   and etcd's hash, `etcdutl snapshot restore`) beside `etcdutl snapshot restore` by hand.
//!
//! Throughput is snapshot size / wall time, in MB/s (10^6 bytes). Each figure is the median of
//! `BENCH_RUNS` runs (default 3; min and max beside it); operator and by-hand runs alternate so
//! that load from anything else on the machine hits both alike. Prints figures only; never
//! asserts on timings; exits non-zero when something fails. `BENCH_KEYSPACE_MB` changes the size
//! (default 100). Run with `cargo bench -p etcd-operator-tests --bench backup`.

// A bench is test code: a failed unwrap is a bench failure with its location, and printing the
// figures is its purpose.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use etcd_operator_api::v1alpha2::{BackupDestination, VolumeDestination};
use etcd_operator_controller::backup::Credentials;
use etcd_operator_controller::member_ops::{EtcdClient, MemberOps};
use etcd_operator_controller::restore::{self, RestoreMember, RestorePlan, RestoreTool, SnapshotSource};
use etcd_operator_controller::{backup_policy as policy, backup_store as store};
use etcd_operator_tests::{EtcdVersion, TestEtcd, tools};

const ETCD: EtcdVersion = EtcdVersion::V3_5_1;
const VALUE_SIZE: usize = 256 * 1024;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mbps(bytes: usize, took: Duration) -> f64 {
    bytes as f64 / 1e6 / took.as_secs_f64()
}

/// `median (min–max)` of MB/s figures.
fn summary(figures: &[f64]) -> (f64, String) {
    let mut sorted = figures.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    (
        median,
        format!(
            "{median:8.1} MB/s  (min {:.1}, max {:.1})",
            sorted[0],
            sorted[sorted.len() - 1]
        ),
    )
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("start {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn member(peer_port: u16) -> RestoreMember {
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    RestoreMember {
        name: "m0".into(),
        initial_cluster: format!("m0={peer_url}"),
        peer_url,
        cluster_token: "bench".into(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let runs = env_usize("BENCH_RUNS", 3).max(1);
    let keyspace_mb = env_usize("BENCH_KEYSPACE_MB", 100);
    let etcd = TestEtcd::start(ETCD)
        .await
        .context("start etcd 3.5.1 (install it with `make tools`)")?;
    let etcdctl = tools::etcdctl(ETCD)?;
    let etcdutl = tools::etcdutl(ETCD)?;
    let work = tempfile::tempdir()?;

    // The keyspace: values of 256 KiB with distinct content, about BENCH_KEYSPACE_MB in total.
    let keys = keyspace_mb * 1_000_000 / VALUE_SIZE;
    let mut client = etcd.client().await?;
    let fill = Instant::now();
    for i in 0..keys {
        let value: Vec<u8> = (0..VALUE_SIZE).map(|j| ((i * 31 + j * 7) % 251) as u8).collect();
        client.put(format!("bench/{i:05}"), value, None).await?;
    }
    println!(
        "keyspace: {keys} keys x {} KiB = {:.0} MB, written in {:.1}s",
        VALUE_SIZE / 1024,
        (keys * VALUE_SIZE) as f64 / 1e6,
        fill.elapsed().as_secs_f64()
    );

    let root = work.path().join("backups");
    let destination = BackupDestination {
        s3: None,
        volume: Some(VolumeDestination {
            path: Some(root.display().to_string()),
            claim_name: None,
        }),
    };
    let creds = Credentials::Environment { file: None };
    let dest = store::open(&destination, "bench", &creds).await?;
    let tool = RestoreTool::for_version(&tools::tools_dir().join("etcd"), ETCD.as_str())?;
    let (mut op_snap, mut hand_snap, mut op_restore, mut hand_restore) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut size = 0;
    for r in 0..runs {
        // Snapshot: the operator's path.
        let t = Instant::now();
        let snap = EtcdClient::default().snapshot_stream(etcd.endpoint()).await?;
        let key = policy::scheduled_key("bench/c/", snap.taken, snap.revision + r as i64);
        let snap = dest.put_snapshot_stream(&key, snap).await?;
        let took = t.elapsed();
        size = usize::try_from(snap.size)?;
        op_snap.push(mbps(size, took));
        // Snapshot: by hand.
        let file = work.path().join(format!("hand-{r}.db"));
        let t = Instant::now();
        run(Command::new(&etcdctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", etcd.endpoint()))
            .args(["snapshot", "save"])
            .arg(&file))?;
        hand_snap.push(mbps(std::fs::metadata(&file)?.len() as usize, t.elapsed()));

        // Restore: the operator's path (fetch, verify, etcdutl restore).
        let plan = RestorePlan {
            source: SnapshotSource::Store {
                destination: destination.clone(),
                key: key.clone(),
            },
            expected_sha256: Some(snap.sha256.clone()),
        };
        let data_dir = work.path().join(format!("op-restore-{r}"));
        let t = Instant::now();
        restore::prepare_data_dir(&plan, "bench", &creds, &tool, &member(2380), &data_dir).await?;
        op_restore.push(mbps(size, t.elapsed()));
        ensure!(
            restore::has_member_data(&data_dir),
            "restored data dir has a member"
        );
        // Restore: by hand.
        let hand_dir = work.path().join(format!("hand-restore-{r}"));
        let t = Instant::now();
        run(Command::new(&etcdutl)
            .args(["snapshot", "restore"])
            .arg(&file)
            .args([
                "--name",
                "m0",
                "--initial-cluster",
                "m0=http://127.0.0.1:2380",
                "--initial-cluster-token",
                "bench",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
                "--data-dir",
            ])
            .arg(&hand_dir))?;
        hand_restore.push(mbps(size, t.elapsed()));
        cleanup(&[&data_dir, &hand_dir, &file]);
    }

    println!("snapshot size: {:.1} MB, {runs} runs each", size as f64 / 1e6);
    for (what, op, hand) in [
        ("snapshot", &op_snap, &hand_snap),
        ("restore ", &op_restore, &hand_restore),
    ] {
        let (op_median, op_text) = summary(op);
        let (hand_median, hand_text) = summary(hand);
        println!(
            "{what}  operator {op_text}   by hand {hand_text}   operator/by hand {:.2}",
            op_median / hand_median
        );
    }
    println!(
        "(snapshot by hand: etcdctl snapshot save; operator: Snapshot RPC + hash check + directory store with checksum sidecar)"
    );
    println!(
        "(restore by hand: etcdutl snapshot restore; operator: fetch + SHA-256 verification + etcdutl snapshot restore)"
    );
    Ok(())
}

fn cleanup(paths: &[&Path]) {
    for p in paths {
        let _ = std::fs::remove_dir_all(p);
        let _ = std::fs::remove_file(p);
    }
}
