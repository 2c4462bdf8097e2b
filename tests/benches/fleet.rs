//! The fleet benchmark: the controller's kubernetes runtime over N EtcdClusters of 3 members
//! each, with no etcd process and no node. The bench process serves the in-memory Kubernetes API
//! (`fake_kube`: the EtcdClusters, Pods, PVCs, Services, PDBs and Events) and runs a kubelet
//! stand-in on it (`fleet::Kubelet`: binds, reports Running and Ready, deletes what is being
//! deleted); the operator is a child process (this same binary, re-executed with
//! `FLEET_BENCH_ROLE=operator`) that runs `reconcile::run` with `KubernetesRuntime` against that
//! API and `fleet::SimulatedEtcd` behind the member operations. So the resident memory and the
//! CPU read from `/proc/<pid>` are the controller's alone, and every request it makes is counted
//! by the fake API (by its `User-Agent`).
//!
//! Per N (`BENCH_CLUSTERS`, default `100,1000`), it measures:
//! - operator RSS: at start (no cluster), settled with N, and its peak (`VmHWM`);
//! - CPU per idle minute: the operator's utime + stime over a settled window
//!   (`BENCH_IDLE_SECONDS`, default 60, from 5 s after the last write of the operator or the
//!   kubelet), as % of one core;
//! - API requests per minute while settled (same window), in all and per cluster, with the
//!   three biggest kinds (verb and resource);
//! - time for all N to reach `Available=True` from the first create (and the operator's CPU
//!   seconds until then), and until the last write of the operator or the kubelet (every Pod
//!   Ready, every status written);
//! - reaction to a spec change amid N settled clusters: `spec.replicas` 3→4 on one cluster
//!   (`BENCH_REACTIONS` clusters, default 20, one after another, each let finish scaling before
//!   the next), from the moment the API received the patch to the first write the operator sends
//!   for that cluster's children (Pods, PVCs, Services, PDB); p50 and p99 (nearest rank).
//!
//! With `BENCH_BASELINE_BINARY` naming this bench built against the base commit (`make bench`
//! does it with `tools/fleet-baseline.sh`: a `git archive` of 18d8eb5 with this file and its
//! support files copied in), each N is measured with both controllers, one after the other on a
//! fresh fake API, and printed side by side with the ratio current / baseline. Other knobs:
//! `BENCH_AVAILABLE_TIMEOUT_SECONDS` (default max(120, N/2)), `BENCH_CLUSTERS_PER_NAMESPACE`
//! (default 10), `BENCH_OPERATOR_LOG` (the operator's `RUST_LOG`, default `warn`; its log goes to
//! `target/fleet-bench/<side>-<N>.log`), `BENCH_ONLY` (`current` or `baseline`) and
//! `BENCH_MEMBER_START_MS` (default 1000: a member Pod turns Ready this long after it runs, and its
//! simulated etcd serves after 4/5 of it).
//!
//! Prints figures; never asserts on them. Exits non-zero when something fails (an operator that
//! dies, clusters that do not become Available before the deadline, a change never acted on).

// A bench is test code: a failed unwrap is a bench failure with its location, and printing the
// figures is its purpose.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use etcd_operator_api::v1alpha2::{EtcdCluster, EtcdClusterSpec};
use etcd_operator_controller::plan::Thresholds;
use etcd_operator_controller::reconcile::{self, Context};
use etcd_operator_controller::runtime::kubernetes::KubernetesRuntime;
use etcd_operator_tests::fake_kube::{self, FakeKube, RequestCounts};
use etcd_operator_tests::fleet::{Kubelet, SimulatedEtcd};
use etcd_operator_tests::memory;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

/// Set to `operator` in the child process.
const ROLE_ENV: &str = "FLEET_BENCH_ROLE";
/// The fake API's URL, for the child.
const API_ENV: &str = "FLEET_BENCH_API";
/// The etcd version the simulated members run, for the child.
const VERSION_ENV: &str = "FLEET_BENCH_VERSION";
/// How long a simulated member takes to serve once its Pod runs (ms), for the child.
const START_ENV: &str = "FLEET_BENCH_MEMBER_START_MS";
/// The `User-Agent` of each client of the fake API.
const OPERATOR_AGENT: &str = "etcd-operator";
const BENCH_AGENT: &str = "fleet-bench";
const KUBELET_AGENT: &str = "fleet-kubelet";
/// The clusters' etcd version.
const VERSION: &str = "3.5.16";
const REPLICAS: i32 = 3;
/// The resources whose writes are the controller acting on a cluster's members.
const CHILDREN: &[&str] = &[
    "pods",
    "persistentvolumeclaims",
    "services",
    "poddisruptionbudgets",
];
/// How long a change may wait for its first act, and a scaled cluster for its new member.
const REACTION_TIMEOUT: Duration = Duration::from_secs(30);
const SCALE_TIMEOUT: Duration = Duration::from_secs(120);
/// Settled: no write from the operator or the kubelet for this long (looked at once a second),
/// at most [`SETTLE_LIMIT`] after the last cluster became Available.
const QUIET: Duration = Duration::from_secs(5);
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

fn main() -> anyhow::Result<()> {
    if std::env::var(ROLE_ENV).as_deref() == Ok("operator") {
        return operator();
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn progress(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("[fleet {:7.1} s] {what}", t.as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// The operator side (child process).

/// The controller as the operator runs it, on the fake API named by the environment, with the
/// simulated etcd; until SIGTERM.
fn operator() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let url = std::env::var(API_ENV).with_context(|| format!("{API_ENV} is not set"))?;
    let version = std::env::var(VERSION_ENV).unwrap_or_else(|_| VERSION.to_owned());
    let start = Duration::from_millis(env_or(START_ENV, 0));
    // As `#[tokio::main]` in the operator: a worker per core.
    tokio::runtime::Runtime::new()?.block_on(async move {
        let client = fake_kube::client_for(&url, OPERATOR_AGENT)?;
        let ctx = Context::with_member_ops(
            client.clone(),
            KubernetesRuntime::new(client),
            Thresholds::default(),
            SimulatedEtcd::with_start_time(&version, start),
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            term.recv().await;
            let _ = stop.send(true);
        });
        reconcile::run(ctx, async move {
            let _ = stopped.changed().await;
        })
        .await;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// The bench side.

/// Which controller a run measures.
#[derive(Debug, Clone)]
struct Side {
    label: &'static str,
    binary: PathBuf,
}

#[derive(Debug)]
struct Knobs {
    clusters: Vec<usize>,
    idle: Duration,
    reactions: usize,
    per_namespace: usize,
    available_timeout: Option<Duration>,
    operator_log: String,
    log_dir: PathBuf,
    clock_ticks: f64,
    member_start: Duration,
}

#[derive(Debug, Clone, Default)]
struct Figures {
    rss_start_kib: u64,
    rss_settled_kib: u64,
    rss_peak_kib: u64,
    creates_took: Duration,
    all_available: Duration,
    cpu_to_available_s: f64,
    /// From the first create to the last write of the operator or the kubelet before the
    /// settled window.
    settled_after: Duration,
    settle_note: String,
    idle_window: Duration,
    idle_cpu_pct: f64,
    requests_per_min: f64,
    top_requests: Vec<(String, f64)>,
    /// Clusters whose members the operator listed from the API in the idle window, and the
    /// most lists of one cluster.
    clusters_listed: usize,
    most_lists_of_one: usize,
    reactions: Vec<Duration>,
    first_acts: BTreeMap<String, usize>,
}

async fn bench() -> anyhow::Result<()> {
    let clusters: Vec<usize> = std::env::var("BENCH_CLUSTERS")
        .unwrap_or_else(|_| "100,1000".to_owned())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .context("BENCH_CLUSTERS is a comma-separated list of counts")
        })
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        clusters.iter().all(|n| *n > 0),
        "BENCH_CLUSTERS: counts are at least 1"
    );
    let target = std::env::var("CARGO_TARGET_DIR").map_or_else(
        |_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    let knobs = Knobs {
        clusters,
        idle: Duration::from_secs(env_or("BENCH_IDLE_SECONDS", 60)),
        reactions: env_or("BENCH_REACTIONS", 20),
        per_namespace: env_or("BENCH_CLUSTERS_PER_NAMESPACE", 10usize).max(1),
        available_timeout: std::env::var("BENCH_AVAILABLE_TIMEOUT_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs),
        operator_log: std::env::var("BENCH_OPERATOR_LOG").unwrap_or_else(|_| "warn".to_owned()),
        log_dir: target.join("fleet-bench"),
        clock_ticks: clock_ticks(),
        member_start: Duration::from_millis(env_or("BENCH_MEMBER_START_MS", 1000)),
    };
    std::fs::create_dir_all(&knobs.log_dir)?;
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let mut sides = Vec::new();
    if only.is_empty() || only == "current" {
        sides.push(Side {
            label: "current",
            binary: std::env::current_exe()?,
        });
    }
    match std::env::var_os("BENCH_BASELINE_BINARY") {
        Some(path) if only.is_empty() || only == "baseline" => {
            let binary = PathBuf::from(path);
            ensure!(
                binary.is_file(),
                "BENCH_BASELINE_BINARY {} is no file",
                binary.display()
            );
            sides.push(Side {
                label: "baseline",
                binary,
            });
        }
        Some(_) => {}
        None => eprintln!(
            "fleet: no BENCH_BASELINE_BINARY: the base commit's controller is not measured (`make bench` builds it)"
        ),
    }
    ensure!(!sides.is_empty(), "BENCH_ONLY={only}: nothing to run");
    println!(
        "fleet benchmark: kubernetes runtime, in-memory Kubernetes API, simulated etcd; {REPLICAS} replicas per cluster, etcd {VERSION}, members start in {} ms",
        knobs.member_start.as_millis()
    );
    println!(
        "machine: {} cores, load average at start {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut failed = false;
    for &n in &knobs.clusters {
        let mut results = Vec::new();
        for side in &sides {
            progress(&format!("{}: {n} clusters", side.label));
            let result = run(side, n, &knobs).await;
            if let Err(error) = &result {
                failed = true;
                eprintln!("fleet: {} with {n} clusters failed: {error:#}", side.label);
            }
            results.push((side.label, result));
        }
        print!("{}", table(n, &knobs, &results));
    }
    if failed {
        bail!("some runs failed (see above)");
    }
    Ok(())
}

/// Seconds per clock tick for `/proc/<pid>/stat` (`getconf CLK_TCK`; 100 when it cannot say).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The CPU time (user + system) process `pid` used so far.
fn cpu_seconds(pid: u32, ticks: f64) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces), from field 3 (state): utime is field 14.
    let rest = stat.rsplit_once(')').context("malformed /proc/<pid>/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11).context("no utime")?.parse()?;
    let stime: f64 = fields.get(12).context("no stime")?.parse()?;
    Ok((utime + stime) / ticks)
}

/// The operator's requests so far, by (verb, resource).
fn operator_requests(kube: &FakeKube) -> BTreeMap<(&'static str, String), u64> {
    let counts: RequestCounts = kube.request_counts();
    counts
        .into_iter()
        .filter(|((agent, ..), _)| agent == OPERATOR_AGENT)
        .map(|((_, verb, resource), n)| ((verb, resource), n))
        .collect()
}

/// Every write so far by the operator and the kubelet (the world changing).
fn world_writes(kube: &FakeKube) -> u64 {
    kube.request_counts()
        .iter()
        .filter(|((agent, verb, _), _)| {
            (agent == OPERATOR_AGENT || agent == KUBELET_AGENT) && !matches!(*verb, "get" | "list" | "watch")
        })
        .map(|(_, n)| n)
        .sum()
}

/// Counts the operator's lists of each cluster's members (by namespace and label selector)
/// while it runs (a task to abort, and the counts).
fn follow_lists(kube: &FakeKube) -> (tokio::task::JoinHandle<()>, Arc<Mutex<HashMap<String, usize>>>) {
    let mut seen = kube.requests_seen();
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let kept = counts.clone();
    let follow = tokio::spawn(async move {
        loop {
            match seen.recv().await {
                Ok(r)
                    if r.agent == OPERATOR_AGENT
                        && r.verb == "list"
                        && CHILDREN.contains(&r.resource.as_str()) =>
                {
                    let key = format!(
                        "{}/{}",
                        r.namespace.unwrap_or_default(),
                        r.label_selector.unwrap_or_default()
                    );
                    *kept.lock().unwrap().entry(key).or_insert(0) += 1;
                }
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            }
        }
    });
    (follow, counts)
}

/// `(namespace, name)` of cluster `i` of `n`.
fn cluster_name(i: usize, n: usize, per_namespace: usize) -> (String, String) {
    let width = n.to_string().len().max(4);
    (
        format!("fleet-{:03}", i / per_namespace),
        format!("fleet-{i:0width$}"),
    )
}

/// What the bench follows of each EtcdCluster, from its own watch.
#[derive(Debug, Clone, Default)]
struct Seen {
    available: bool,
    ready: i32,
    generation: i64,
    observed: i64,
}

#[derive(Debug, Default)]
struct Tracked {
    clusters: HashMap<String, Seen>,
    /// When each cluster was first seen Available.
    first_available: HashMap<String, Instant>,
}

/// Follows every EtcdCluster's status through a watch (so nothing polls the API).
struct Tracker {
    state: Arc<Mutex<Tracked>>,
    changed: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Tracker {
    fn start(client: kube::Client) -> Self {
        let state = Arc::new(Mutex::new(Tracked::default()));
        let changed = Arc::new(tokio::sync::Notify::new());
        let (s, c) = (state.clone(), changed.clone());
        let task = tokio::spawn(async move {
            let api: Api<EtcdCluster> = Api::all(client);
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let obj = match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                    _ => continue,
                };
                let key = format!(
                    "{}/{}",
                    obj.metadata.namespace.clone().unwrap_or_default(),
                    obj.metadata.name.clone().unwrap_or_default()
                );
                let status = obj.status.clone().unwrap_or_default();
                let seen = Seen {
                    available: status
                        .conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Available" && c.status == "True"),
                    ready: status.ready_replicas.unwrap_or(0),
                    generation: obj.metadata.generation.unwrap_or(0),
                    observed: status.observed_generation.unwrap_or(0),
                };
                let mut tracked = s.lock().unwrap();
                if seen.available {
                    tracked
                        .first_available
                        .entry(key.clone())
                        .or_insert_with(Instant::now);
                }
                tracked.clusters.insert(key, seen);
                drop(tracked);
                c.notify_waiters();
            }
        });
        Self { state, changed, task }
    }

    /// Waits until `done` holds of what is seen, or `deadline`; checks `alive` meanwhile.
    async fn wait(
        &self,
        deadline: Instant,
        alive: &mut tokio::process::Child,
        done: impl Fn(&Tracked) -> bool,
    ) -> anyhow::Result<bool> {
        loop {
            let notified = self.changed.notified();
            if done(&self.state.lock().unwrap()) {
                return Ok(true);
            }
            if let Some(status) = alive.try_wait()? {
                bail!("the operator exited ({status})");
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let _ = tokio::time::timeout((deadline - now).min(Duration::from_secs(1)), notified).await;
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Stops the operator: SIGTERM, then SIGKILL after 10 s.
async fn stop(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0)),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

async fn run(side: &Side, n: usize, knobs: &Knobs) -> anyhow::Result<Figures> {
    let kube = FakeKube::start().await?;
    let _kubelet = Kubelet::start(kube.client_as(KUBELET_AGENT)?, knobs.member_start);
    let client = kube.client_as(BENCH_AGENT)?;
    let log_path = knobs.log_dir.join(format!("{}-{n}.log", side.label));
    let log = std::fs::File::create(&log_path)?;
    let mut child = tokio::process::Command::new(&side.binary)
        .env(ROLE_ENV, "operator")
        .env(API_ENV, kube.url())
        .env(VERSION_ENV, VERSION)
        // etcd serves a little before the readiness probe says so.
        .env(START_ENV, (knobs.member_start.as_millis() * 4 / 5).to_string())
        .env("RUST_LOG", &knobs.operator_log)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {}", side.binary.display()))?;
    let result = measure(&kube, client, &mut child, n, knobs).await;
    stop(&mut child).await;
    result.with_context(|| format!("the operator's log is {}", log_path.display()))
}

async fn measure(
    kube: &FakeKube,
    client: kube::Client,
    child: &mut tokio::process::Child,
    n: usize,
    knobs: &Knobs,
) -> anyhow::Result<Figures> {
    let pid = child.id().context("the operator's pid")?;
    let mut figures = Figures::default();

    // The operator is up once it watches EtcdClusters, Pods and PVCs.
    let up_by = Instant::now() + Duration::from_secs(60);
    loop {
        let requests = operator_requests(kube);
        let watching = |r: &str| requests.contains_key(&("watch", r.to_owned()));
        if watching("etcdclusters") && watching("pods") && watching("persistentvolumeclaims") {
            break;
        }
        if let Some(status) = child.try_wait()? {
            bail!("the operator exited at start ({status})");
        }
        ensure!(
            Instant::now() < up_by,
            "the operator did not watch within 60 s: {requests:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    figures.rss_start_kib = memory::read(pid)?.rss_kib;
    let tracker = Tracker::start(client.clone());

    // Create the fleet.
    let cpu_start = cpu_seconds(pid, knobs.clock_ticks)?;
    let start = Instant::now();
    let creates = futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            async move {
                let (namespace, name) = cluster_name(i, n, knobs.per_namespace);
                let mut obj = EtcdCluster::new(
                    &name,
                    &namespace,
                    EtcdClusterSpec {
                        replicas: Some(REPLICAS),
                        version: Some(VERSION.to_owned()),
                        ..EtcdClusterSpec::default()
                    },
                );
                // What this project's API server stores: the object with its defaults.
                etcd_operator_api::defaults::apply_v1alpha2(&mut obj);
                Api::<EtcdCluster>::namespaced(client, &namespace)
                    .create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("create {namespace}/{name}"))
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for created in creates {
        created?;
    }
    figures.creates_took = start.elapsed();
    progress(&format!(
        "created {n} clusters in {:.1} s",
        figures.creates_took.as_secs_f64()
    ));

    // All Available.
    let by_count = Duration::from_millis(500) * u32::try_from(n)?;
    let limit = knobs
        .available_timeout
        .unwrap_or_else(|| Duration::from_secs(120).max(by_count));
    let all = tracker
        .wait(start + limit, child, |t| t.first_available.len() >= n)
        .await?;
    if !all {
        let seen = tracker.state.lock().unwrap().first_available.len();
        bail!("{seen} of {n} clusters became Available within {limit:?}");
    }
    let last = tracker
        .state
        .lock()
        .unwrap()
        .first_available
        .values()
        .max()
        .copied()
        .unwrap_or(start);
    figures.all_available = last - start;
    figures.cpu_to_available_s = cpu_seconds(pid, knobs.clock_ticks)? - cpu_start;
    progress(&format!(
        "all {n} Available after {:.1} s",
        figures.all_available.as_secs_f64()
    ));

    // Settle: no write from the operator or the kubelet for a while (Pods turning Ready after
    // their cluster is Available still bring reconciles).
    let settle_start = Instant::now();
    let mut writes = world_writes(kube);
    let mut quiet_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = world_writes(kube);
        if now != writes {
            writes = now;
            quiet_since = Instant::now();
        }
        if quiet_since.elapsed() >= QUIET {
            figures.settled_after = quiet_since.saturating_duration_since(start);
            figures.settle_note = format!("quiet after {:.0} s", settle_start.elapsed().as_secs_f64());
            break;
        }
        if settle_start.elapsed() >= SETTLE_LIMIT {
            figures.settled_after = settle_start.elapsed() + figures.all_available;
            figures.settle_note = format!("still writing after {} s", SETTLE_LIMIT.as_secs());
            break;
        }
        if let Some(status) = child.try_wait()? {
            bail!("the operator exited ({status})");
        }
    }
    progress(&format!(
        "settled ({}); idle window {:?}",
        figures.settle_note, knobs.idle
    ));

    // The idle window.
    let lists = follow_lists(kube);
    let before = operator_requests(kube);
    let cpu_before = cpu_seconds(pid, knobs.clock_ticks)?;
    let window_start = Instant::now();
    let mut rss_max = 0;
    while window_start.elapsed() < knobs.idle {
        let left = knobs.idle.saturating_sub(window_start.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(5))).await;
        rss_max = rss_max.max(memory::read(pid)?.rss_kib);
        if let Some(status) = child.try_wait()? {
            bail!("the operator exited ({status})");
        }
    }
    figures.idle_window = window_start.elapsed();
    let cpu = cpu_seconds(pid, knobs.clock_ticks)? - cpu_before;
    let after = operator_requests(kube);
    lists.0.abort();
    let listed = lists.1.lock().unwrap().clone();
    figures.clusters_listed = listed.len();
    figures.most_lists_of_one = listed.values().copied().max().unwrap_or(0);
    if let Some((most, count)) = listed.iter().max_by_key(|(_, c)| **c) {
        progress(&format!("most listed in the idle window: {most} ({count} lists)"));
    }
    let minutes = figures.idle_window.as_secs_f64() / 60.0;
    figures.idle_cpu_pct = 100.0 * cpu / figures.idle_window.as_secs_f64();
    let mut delta: Vec<(String, f64)> = after
        .iter()
        .map(|(k, v)| {
            let was = before.get(k).copied().unwrap_or(0);
            (format!("{} {}", k.0, k.1), (v - was) as f64 / minutes)
        })
        .filter(|(_, v)| *v > 0.0)
        .collect();
    // `+ 0.0`: an empty sum is -0.0.
    figures.requests_per_min = delta.iter().map(|(_, v)| v).sum::<f64>() + 0.0;
    delta.sort_by(|a, b| b.1.total_cmp(&a.1));
    delta.truncate(3);
    figures.top_requests = delta;
    let mem = memory::read(pid)?;
    figures.rss_settled_kib = mem.rss_kib.max(rss_max);
    progress(&format!(
        "idle: {:.1}% CPU, {:.0} requests/min",
        figures.idle_cpu_pct, figures.requests_per_min
    ));

    // Reactions to a spec change, one cluster at a time.
    let reactions = knobs.reactions.min(n);
    for r in 0..reactions {
        let i = r * n / reactions;
        let (namespace, name) = cluster_name(i, n, knobs.per_namespace);
        let (took, act) = react(kube, &client, &namespace, &name).await?;
        figures.reactions.push(took);
        *figures.first_acts.entry(act).or_default() += 1;
        let key = format!("{namespace}/{name}");
        let scaled = tracker
            .wait(Instant::now() + SCALE_TIMEOUT, child, |t| {
                t.clusters
                    .get(&key)
                    .is_some_and(|s| s.available && s.ready == REPLICAS + 1 && s.observed == s.generation)
            })
            .await?;
        ensure!(
            scaled,
            "{key} did not reach {} ready members within {SCALE_TIMEOUT:?}",
            REPLICAS + 1
        );
    }
    figures.rss_peak_kib = memory::read(pid)?.peak_kib;
    Ok(figures)
}

/// Patches `spec.replicas` of one settled cluster to 4 and returns how long after the API got
/// the patch the operator sent its first write for the cluster's children, and what it was.
async fn react(
    kube: &FakeKube,
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<(Duration, String)> {
    let mut seen = kube.requests_seen();
    Api::<EtcdCluster>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": REPLICAS + 1}})),
        )
        .await?;
    let deadline = tokio::time::Instant::now() + REACTION_TIMEOUT;
    let prefix = format!("{name}-");
    let mut patched = None;
    loop {
        let request = match tokio::time::timeout_at(deadline, seen.recv()).await {
            Err(_) => bail!("no act on {namespace}/{name} within {REACTION_TIMEOUT:?} of its spec change"),
            Ok(Err(RecvError::Lagged(_))) => continue,
            Ok(Err(RecvError::Closed)) => bail!("the fake API stopped"),
            Ok(Ok(request)) => request,
        };
        let on = |resource: &str| {
            request.namespace.as_deref() == Some(namespace)
                && request.resource == resource
                && request
                    .name
                    .as_deref()
                    .is_some_and(|n| n == name || n.starts_with(&prefix))
        };
        if request.agent == BENCH_AGENT && request.verb == "patch" && on("etcdclusters") {
            patched = Some(request.at);
            continue;
        }
        if let Some(at) = patched
            && request.agent == OPERATOR_AGENT
            && request.is_write()
            && CHILDREN.iter().any(|r| on(r))
        {
            return Ok((
                request.at.saturating_duration_since(at),
                format!("{} {}", request.verb, request.resource),
            ));
        }
    }
}

/// The value at quantile `q` (nearest rank) of `values`.
fn quantile(values: &[Duration], q: f64) -> Option<Duration> {
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn ms(d: Option<Duration>) -> f64 {
    d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// One row: a figure per side, the ratio current / baseline when both are there, and the goal.
fn row(
    out: &mut String,
    what: &str,
    results: &[(&str, anyhow::Result<Figures>)],
    figure: impl Fn(&Figures) -> f64,
    digits: usize,
    goal: &str,
) {
    let _ = write!(out, "  {what:<44}");
    let values: Vec<Option<f64>> = results
        .iter()
        .map(|(_, r)| r.as_ref().ok().map(&figure))
        .collect();
    for v in &values {
        match v {
            Some(v) => {
                let _ = write!(out, " {v:>12.digits$}");
            }
            None => {
                let _ = write!(out, " {:>12}", "failed");
            }
        }
    }
    if let [Some(current), Some(baseline)] = values.as_slice() {
        if *baseline != 0.0 {
            let _ = write!(out, " {:>9.2}", current / baseline);
        } else {
            let _ = write!(out, " {:>9}", "-");
        }
    } else if values.len() == 2 {
        let _ = write!(out, " {:>9}", "-");
    }
    let _ = writeln!(out, "   {goal}");
}

fn table(n: usize, knobs: &Knobs, results: &[(&str, anyhow::Result<Figures>)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "N = {n} EtcdClusters x {REPLICAS} members (idle window {} s, {} reactions)",
        knobs.idle.as_secs(),
        knobs.reactions.min(n)
    );
    let _ = write!(out, "  {:<44}", "");
    for (label, _) in results {
        let _ = write!(out, " {label:>12}");
    }
    if results.len() == 2 {
        let _ = write!(out, " {:>9}", "cur/base");
    }
    let _ = writeln!(out, "   goal (N = 1000, one replica)");
    row(
        &mut out,
        "operator RSS at start, no cluster (MiB)",
        results,
        |f| mib(f.rss_start_kib),
        1,
        "",
    );
    row(
        &mut out,
        "operator RSS settled with N (MiB)",
        results,
        |f| mib(f.rss_settled_kib),
        1,
        "<= 150 MiB",
    );
    row(
        &mut out,
        "operator peak RSS, VmHWM (MiB)",
        results,
        |f| mib(f.rss_peak_kib),
        1,
        "",
    );
    row(
        &mut out,
        "idle CPU (% of one core)",
        results,
        |f| f.idle_cpu_pct,
        2,
        "<= 5 %",
    );
    row(
        &mut out,
        "CPU per idle minute (s)",
        results,
        |f| f.idle_cpu_pct * 0.6,
        2,
        "",
    );
    row(
        &mut out,
        "API requests per minute, settled",
        results,
        |f| f.requests_per_min,
        0,
        "",
    );
    row(
        &mut out,
        "  per cluster per minute",
        results,
        |f| f.requests_per_min / n as f64,
        2,
        "<= 1",
    );
    row(
        &mut out,
        "create N objects (s)",
        results,
        |f| f.creates_took.as_secs_f64(),
        1,
        "",
    );
    row(
        &mut out,
        "all N Available from first create (s)",
        results,
        |f| f.all_available.as_secs_f64(),
        1,
        "",
    );
    row(
        &mut out,
        "operator CPU until all Available (s)",
        results,
        |f| f.cpu_to_available_s,
        1,
        "",
    );
    row(
        &mut out,
        "last write (operator, kubelet) from create (s)",
        results,
        |f| f.settled_after.as_secs_f64(),
        1,
        "",
    );
    row(
        &mut out,
        "reaction to a spec change, p50 (ms)",
        results,
        |f| ms(quantile(&f.reactions, 0.5)),
        1,
        "",
    );
    row(
        &mut out,
        "reaction to a spec change, p99 (ms)",
        results,
        |f| ms(quantile(&f.reactions, 0.99)),
        1,
        "<= 1000 ms",
    );
    row(
        &mut out,
        "reaction to a spec change, max (ms)",
        results,
        |f| ms(f.reactions.iter().max().copied()),
        1,
        "",
    );
    for (label, result) in results {
        match result {
            Ok(f) => {
                let top: Vec<String> = f
                    .top_requests
                    .iter()
                    .map(|(what, per_min)| format!("{what} {per_min:.0}/min"))
                    .collect();
                let acts: Vec<String> = f.first_acts.iter().map(|(a, c)| format!("{a} x{c}")).collect();
                let _ = writeln!(
                    out,
                    "  {label}: settle {}; most requests while settled: {}; clusters listed in the window: {} (at most {} lists of one); first act: {}",
                    f.settle_note,
                    top.join(", "),
                    f.clusters_listed,
                    f.most_lists_of_one,
                    acts.join(", ")
                );
            }
            Err(error) => {
                let _ = writeln!(out, "  {label}: failed: {error:#}");
            }
        }
    }
    out
}
