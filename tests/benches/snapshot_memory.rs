//! The operator's resident memory while a large database is snapshotted, backed up and restored
//! (issue 14: under 150 MiB for 1 GiB). One `etcd-operator local` runs a 1-member etcd 3.5.1
//! cluster (default 2 GiB backend quota, enough for the sizes below), which is filled with
//! `BENCH_DB_MB` MiB of 512 KiB values (default 256; 1024 is the figure and takes longer).
//! Then, one after another, with the operator's peak RSS started again before each:
//!
//! - (a) `kubectl get --raw .../etcdclusters/big/snapshot > file` (the `/snapshot` subresource);
//! - (b) an `EtcdBackup` to an S3 bucket (moto), reaching `Succeeded`;
//! - (c) a new 1-member `EtcdCluster` restored from that backup, reaching `Available`.
//!
//! Each figure is the operator process's peak resident memory during the phase: `VmHWM` from
//! `/proc/<pid>/status` after resetting it through `/proc/<pid>/clear_refs`, and beside it the
//! largest `VmRSS` seen by sampling every 10 ms. The baseline is the operator's RSS at idle with
//! the cluster running, measured in the same run. Prints figures only (no timed asserts); exits
//! non-zero when a phase fails. Run with `cargo bench -p etcd-operator-tests --bench
//! snapshot_memory` (`make bench` runs it with the default size).

// A bench is test code: a failed unwrap is a bench failure with its location, and printing the
// figures is its purpose.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use etcd_operator_tests::kubectl::{Watched, apply, condition, wait_for};
use etcd_operator_tests::memory::{self, PeakSampler};
use etcd_operator_tests::operator::OperatorOptions;
use etcd_operator_tests::{LocalOperator, S3Server, s3};
use serde_json::Value;

const VALUE_SIZE: usize = 512 * 1024;
const WRITERS: usize = 4;
const GOAL_MIB: f64 = 150.0;
const RAW: &str = "/apis/etcd.operator.dev/v1alpha2/namespaces/default/etcdclusters";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn available(obj: &Value) -> bool {
    condition(&obj["status"], "Available").is_some_and(|c| c["status"] == "True")
        && obj["status"]["readyReplicas"] == 1
}

fn cluster_yaml(name: &str, restore_from: Option<&str>) -> String {
    let mut y = format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: 1\n  version: 3.5.1\n"
    );
    if let Some(backup) = restore_from {
        y.push_str(&format!(
            "  bootstrap:\n    restore:\n      backupName: {backup}\n"
        ));
    }
    y
}

/// Incompressible-looking content, distinct per key.
fn value(i: usize) -> Vec<u8> {
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..VALUE_SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One phase's figures.
struct Phase {
    what: &'static str,
    took: Duration,
    hwm_kib: u64,
    sampled_kib: u64,
    note: String,
}

/// Runs `work` with the operator's peak RSS reset before and read after.
async fn measure<F: std::future::Future<Output = anyhow::Result<String>>>(
    pid: u32,
    what: &'static str,
    work: F,
) -> anyhow::Result<Phase> {
    memory::reset_peak(pid)?;
    let sampler = PeakSampler::start(pid, Duration::from_millis(10));
    let t = Instant::now();
    let note = work.await.with_context(|| format!("phase {what}"))?;
    let took = t.elapsed();
    let hwm_kib = memory::read(pid)?.peak_kib;
    let sampled_kib = sampler.peak_kib();
    println!(
        "  {what}: done in {:.1}s, peak {:.1} MiB ({note})",
        took.as_secs_f64(),
        mib(hwm_kib)
    );
    Ok(Phase {
        what,
        took,
        hwm_kib,
        sampled_kib,
        note,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let db_mb = env_usize("BENCH_DB_MB", 256);
    let server = S3Server::start()
        .await
        .context("start moto (install it with `make tools`)")?;
    server.create_bucket("bench").await?;
    let op = LocalOperator::start_with(OperatorOptions {
        env: vec![
            ("AWS_ACCESS_KEY_ID".into(), s3::ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), s3::SECRET_KEY.into()),
            ("RUST_LOG".into(), "info".into()),
        ],
        args: Vec::new(),
    })
    .await?;
    let pid = op.pid().context("the operator's pid")?;
    apply(&op, &cluster_yaml("big", None))?;
    let obj = wait_for(
        &op,
        Watched::object("ec", "big"),
        "available",
        Duration::from_secs(120),
        available,
    )
    .await?;
    let endpoints: Vec<String> = obj["status"]["clientEndpoints"]
        .as_array()
        .context("client endpoints")?
        .iter()
        .filter_map(|e| e.as_str().map(str::to_owned))
        .collect();

    // Fill: BENCH_DB_MB MiB of 512 KiB values, WRITERS at a time.
    let keys = db_mb * 1024 * 1024 / VALUE_SIZE;
    let client = etcd_client::Client::connect(&endpoints, None).await?;
    let fill = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = client.clone();
        writers.push(tokio::spawn(async move {
            for i in (w..keys).step_by(WRITERS) {
                client.put(format!("bench/{i:06}"), value(i), None).await?;
            }
            Ok::<_, etcd_client::Error>(())
        }));
    }
    for w in writers {
        w.await??;
    }
    let fill_took = fill.elapsed();
    let db_size = client.clone().status().await?.db_size() as u64;
    println!(
        "filled {keys} keys x {} KiB in {:.1}s; etcd reports a {:.1} MiB database",
        VALUE_SIZE / 1024,
        fill_took.as_secs_f64(),
        db_size as f64 / 1048576.0
    );

    // Baseline: the operator at idle with the cluster running.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = memory::read(pid)?;
    println!(
        "operator (pid {pid}) at idle: RSS {:.1} MiB (peak since start {:.1} MiB)",
        mib(idle.rss_kib),
        mib(idle.peak_kib)
    );

    let work = tempfile::tempdir()?;
    let mut phases = Vec::new();
    let file = work.path().join("snap.db");
    phases.push(
        measure(pid, "(a) /snapshot download", async {
            let out = std::fs::File::create(&file)?;
            let kubectl = op.kubectl()?;
            let status = tokio::task::spawn_blocking(move || {
                let mut kubectl = kubectl;
                kubectl
                    .args(["get", "--raw", &format!("{RAW}/big/snapshot")])
                    .stdout(Stdio::from(out))
                    .stderr(Stdio::inherit())
                    .status()
            })
            .await??;
            ensure!(status.success(), "kubectl get --raw failed: {status}");
            let size = std::fs::metadata(&file)?.len();
            ensure!(size % 512 == 32, "a bbolt file plus etcd's hash: {size} bytes");
            Ok(format!("{:.1} MiB file", size as f64 / 1048576.0))
        })
        .await?,
    );
    let _ = std::fs::remove_file(&file);

    let backup = format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdBackup\nmetadata:\n  name: b1\n  namespace: default\nspec:\n  clusterName: big\n  destination:\n    s3:\n      bucket: bench\n      endpoint: {}\n      region: {}\n      forcePathStyle: true\n",
        server.endpoint(),
        s3::REGION
    );
    phases.push(
        measure(pid, "(b) EtcdBackup to S3", async {
            apply(&op, &backup)?;
            let done = wait_for(
                &op,
                Watched::object("etcdbackup", "b1"),
                "backup finished",
                Duration::from_secs(1800),
                |o| o["status"]["phase"] == "Succeeded" || o["status"]["phase"] == "Failed",
            )
            .await?;
            ensure!(
                done["status"]["phase"] == "Succeeded",
                "backup failed: {}",
                done["status"]
            );
            Ok(format!(
                "{:.1} MiB object",
                done["status"]["size"].as_f64().unwrap_or_default() / 1048576.0
            ))
        })
        .await?,
    );

    phases.push(
        measure(pid, "(c) restore from S3", async {
            apply(&op, &cluster_yaml("restored", Some("b1")))?;
            wait_for(
                &op,
                Watched::object("ec", "restored"),
                "restored cluster available",
                Duration::from_secs(1800),
                available,
            )
            .await?;
            let restored = wait_for(
                &op,
                Watched::object("ec", "restored"),
                "endpoints",
                Duration::from_secs(60),
                |o| {
                    o["status"]["clientEndpoints"]
                        .as_array()
                        .is_some_and(|a| !a.is_empty())
                },
            )
            .await?;
            let eps: Vec<String> = restored["status"]["clientEndpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str().map(str::to_owned))
                .collect();
            let mut c = etcd_client::Client::connect(&eps, None).await?;
            let count = c
                .get(
                    "bench/",
                    Some(etcd_client::GetOptions::new().with_prefix().with_count_only()),
                )
                .await?
                .count();
            ensure!(count as usize == keys, "restored {count} of {keys} keys");
            Ok(format!("{count} keys restored"))
        })
        .await?,
    );

    println!();
    println!(
        "database: {:.1} MiB ({keys} keys x {} KiB); operator idle RSS {:.1} MiB; goal: peak < {GOAL_MIB} MiB",
        db_size as f64 / 1048576.0,
        VALUE_SIZE / 1024,
        mib(idle.rss_kib)
    );
    println!(
        "{:<26} {:>9} {:>15} {:>17} {:>13} {:>8}",
        "phase", "took", "peak VmHWM", "peak VmRSS (10ms)", "over idle", "< goal"
    );
    let mut holds = true;
    for p in &phases {
        let peak = mib(p.hwm_kib.max(p.sampled_kib));
        holds &= peak < GOAL_MIB;
        println!(
            "{:<26} {:>8.1}s {:>11.1} MiB {:>13.1} MiB {:>9.1} MiB {:>8}   {}",
            p.what,
            p.took.as_secs_f64(),
            mib(p.hwm_kib),
            mib(p.sampled_kib),
            peak - mib(idle.rss_kib),
            if peak < GOAL_MIB { "yes" } else { "NO" },
            p.note
        );
    }
    println!(
        "the operator's peak resident memory {} under {GOAL_MIB} MiB for a {:.1} MiB database",
        if holds { "stayed" } else { "did NOT stay" },
        db_size as f64 / 1048576.0
    );
    Ok(())
}
