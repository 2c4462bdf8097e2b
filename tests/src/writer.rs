//! A continuous etcd writer for roll tests (upgrades, certificate rotation): puts `w-<n>` = `<n>`
//! one after another through one client holding every endpoint, records which writes etcd
//! acknowledged and the longest time without one, and checks afterwards that none was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, TlsOptions};

/// What the continuous writer saw.
#[derive(Debug, Default)]
pub struct Writes {
    /// Keys whose put etcd acknowledged, in order.
    pub acknowledged: Vec<String>,
    /// The longest time between two successful writes.
    pub longest_gap: Duration,
    /// When the longest gap began and ended (Unix seconds).
    pub longest_gap_at: (f64, f64),
    /// Failed attempts.
    pub failures: usize,
    /// Each failed attempt: when it started and ended (Unix seconds) and why.
    pub failure_log: Vec<(f64, f64, String)>,
    /// How often a reloading writer ([`start_reloading_writer`]) connected again with the TLS
    /// identity it read anew.
    pub reconnects: usize,
}

/// Seconds since the Unix epoch, for lining up the writer's log with the operator's.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Client options with short timeouts, and TLS when given.
fn options(tls: Option<&TlsOptions>) -> ConnectOptions {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2));
    match tls {
        Some(tls) => options.with_tls(tls.clone()),
        None => options,
    }
}

/// Starts the writer against `endpoints` (with `tls` for https endpoints); it runs until `stop`.
///
/// # Panics
/// When the first connection cannot be made (a test failure).
pub fn start_writer(
    endpoints: Vec<String>,
    tls: Option<TlsOptions>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Writes> {
    run_writer(endpoints, move || tls.clone(), false, stop)
}

/// A writer whose client reads its TLS identity again with `tls` and reconnects after a failed
/// write, as a client that re-reads its mounted certificate files does: for rolls that change
/// what the members trust or present (a CA rotation).
///
/// # Panics
/// When the first connection cannot be made (a test failure).
pub fn start_reloading_writer(
    endpoints: Vec<String>,
    tls: impl Fn() -> Option<TlsOptions> + Send + 'static,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Writes> {
    run_writer(endpoints, tls, true, stop)
}

fn run_writer(
    endpoints: Vec<String>,
    tls: impl Fn() -> Option<TlsOptions> + Send + 'static,
    reload: bool,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Writes> {
    tokio::spawn(async move {
        #[allow(clippy::unwrap_used)]
        let mut client = Client::connect(&endpoints, Some(options(tls().as_ref())))
            .await
            .unwrap();
        let mut writes = Writes::default();
        let mut last_success = Instant::now();
        let mut last_success_unix = unix_now();
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            n += 1;
            let key = format!("w-{n:08}");
            let began = unix_now();
            match tokio::time::timeout(
                Duration::from_secs(3),
                client.put(key.as_str(), n.to_string(), None),
            )
            .await
            {
                Ok(Ok(_)) => {
                    let now = Instant::now();
                    if now - last_success > writes.longest_gap {
                        writes.longest_gap = now - last_success;
                        writes.longest_gap_at = (last_success_unix, unix_now());
                    }
                    last_success = now;
                    last_success_unix = unix_now();
                    writes.acknowledged.push(key);
                }
                Ok(Err(e)) => {
                    writes.failures += 1;
                    writes.failure_log.push((began, unix_now(), e.to_string()));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(_) => {
                    writes.failures += 1;
                    writes
                        .failure_log
                        .push((began, unix_now(), "no answer in 3 s".into()));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            if reload
                && writes.failure_log.last().is_some_and(|f| f.0 >= began)
                && let Ok(Ok(fresh)) = tokio::time::timeout(
                    Duration::from_secs(2),
                    Client::connect(&endpoints, Some(options(tls().as_ref()))),
                )
                .await
            {
                client = fresh;
                writes.reconnects += 1;
            }
        }
        writes.longest_gap = writes.longest_gap.max(Instant::now() - last_success);
        writes
    })
}

/// Every acknowledged key reads back (linearizable) with its value.
///
/// # Panics
/// When one is missing or wrong, or etcd cannot be read (a test failure).
#[allow(clippy::unwrap_used, clippy::panic)]
pub async fn assert_no_write_lost(endpoints: &[String], tls: Option<&TlsOptions>, writes: &Writes) {
    // A member just restarted may refuse connections for a moment: the read is asked again for
    // up to 30 s, and the last error fails the test.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let all = loop {
        let read = async {
            let mut client = Client::connect(endpoints, Some(options(tls))).await?;
            client.get("w-", Some(GetOptions::new().with_prefix())).await
        };
        match read.await {
            Ok(all) => break all,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "reading the written keys back; asking again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("reading the written keys back from {endpoints:?}: {e}"),
        }
    };
    let stored: std::collections::HashMap<String, String> = all
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect();
    for key in &writes.acknowledged {
        let n: u64 = key.trim_start_matches("w-").parse().unwrap();
        assert_eq!(
            stored.get(key).map(String::as_str),
            Some(n.to_string().as_str()),
            "acknowledged write {key} lost"
        );
    }
}

/// `HashKV` at one revision agrees on every member (retried for 20 s while members catch up).
///
/// # Panics
/// When the hashes still differ after that, or etcd cannot be read (a test failure).
#[allow(clippy::unwrap_used, clippy::panic, clippy::print_stdout)]
pub async fn assert_hash_kv_agrees(endpoints: &[String]) {
    let mut client = Client::connect(endpoints, None).await.unwrap();
    let revision = client.get("w-", None).await.unwrap().header().unwrap().revision();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut hashes = Vec::new();
        for ep in endpoints {
            let mut one = Client::connect([ep.as_str()], None).await.unwrap();
            match one.hash_kv(revision).await {
                Ok(h) => hashes.push((ep.clone(), Some(h.hash()))),
                Err(e) => {
                    println!("hash_kv at {ep}: {e}");
                    hashes.push((ep.clone(), None));
                }
            }
        }
        let first = hashes[0].1;
        if first.is_some() && hashes.iter().all(|h| h.1 == first) {
            println!(
                "HashKV at revision {revision} agrees on {} members: {:#x}",
                hashes.len(),
                first.unwrap_or_default()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "HashKV differs at revision {revision}: {hashes:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
