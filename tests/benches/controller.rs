//! Benchmarks of the controller (local runtime, real etcd 3.5.1 members), each operation beside
//! the same operation done by hand with the etcd and etcdctl binaries, in the same run:
//!
//! - apply → `Available` for 1, 3 and 5 members (by hand: start the members with a static
//!   `--initial-cluster`, wait for `etcdctl endpoint health --cluster`);
//! - replace a SIGKILLed member whose data directory is gone, in a 3-member cluster (by hand:
//!   `member remove`, `member add --learner`, start a fresh etcd with
//!   `--initial-cluster-state=existing`, `member promote` until accepted, wait for health);
//! - scale 3 → 5 (by hand: two learners added one at a time, each promoted once accepted).
//!
//! Each figure is the median of several runs (min and max beside it); operator and by-hand runs
//! alternate, so that load from whatever else runs on the machine hits both sides alike, and the
//! ratio operator / by hand is the figure to compare across machines. Prints figures only; never
//! asserts on timings; exits non-zero when something fails.
//!
//! The operator side watches the EtcdCluster with kube-rs (a `watch` with
//! `fieldSelector=metadata.name=<name>`, established before the clock starts), so a status is
//! seen the moment the API server sends it; nothing polls. The by-hand side polls etcdctl every
//! 50 ms. Where the operator's time goes is read from its own log lines (member removed, learner
//! added, promoted, a step refused), time-stamped on the same clock.
//!
//! Run with `make bench` (`cargo bench -p etcd-operator-tests --bench controller`). The bench
//! builds the release `etcd-operator` binary itself (cargo bench builds no bin targets) and runs
//! one `etcd-operator local` for the whole bench. Knobs: `BENCH_RUNS` (runs per operation,
//! default 5 for apply and 3 for replace and scale), `BENCH_ONLY` (run only the operations whose
//! name contains this), `BENCH_OPERATOR_BINARY` (use this binary instead of building one) and
//! `BENCH_OPERATOR_LOG` (the operator's `RUST_LOG`, default `info`).

// A bench is test code: a failed unwrap is a bench failure with its location, and printing the
// figures is its purpose.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::fmt::Write as _;
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use etcd_operator_tests::kube_client::{ClientOptions, connect, etcd_clusters};
use etcd_operator_tests::{EtcdVersion, TestProcess, kubectl, leftovers, ports, tools};
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use serde_json::Value;
use tokio::sync::mpsc;

const ETCD: EtcdVersion = EtcdVersion::V3_5_1;
/// How often the by-hand side polls etcdctl (and retries a refused `member add` or `promote`).
const POLL: Duration = Duration::from_millis(50);
/// The longest any one wait may take before the bench fails.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// Before a replace or a scale-up, both sides let the fresh cluster run this long: etcd refuses a
/// member add until every voter has been connected for 5 s (strict reconfiguration check), and
/// neither side should pay for the setup's own bootstrap.
const SETTLE: Duration = Duration::from_secs(6);
/// Operator-side replace runs kill their member at offsets spread evenly over this window after
/// [`SETTLE`] (run i of n at i/n of it), because the time the controller takes to notice depends
/// on where the kill falls in its periodic reconcile.
const KILL_WINDOW: Duration = Duration::from_secs(10);
const NAMESPACE: &str = "default";

fn cluster_yaml(name: &str, replicas: usize) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\nspec:\n  replicas: {replicas}\n  version: {}\n",
        ETCD.as_str()
    )
}

fn progress(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("[bench {:6.1} s] {what}", t.as_secs_f64());
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// Status predicates (the same checks as the end-to-end tests).

fn condition_true(s: &Value, type_: &str) -> bool {
    kubectl::condition(s, type_).is_some_and(|c| c["status"] == "True")
}

fn members(s: &Value) -> Vec<Value> {
    s["members"].as_array().cloned().unwrap_or_default()
}

/// `Available`, and exactly `n` voting members, all healthy.
fn available_with(s: &Value, n: usize) -> bool {
    let n = n as i64;
    condition_true(s, "Available")
        && s["readyReplicas"] == n
        && s["replicas"] == n
        && members(s).len() as i64 == n
        && members(s)
            .iter()
            .all(|m| m["healthy"] == true && m["learner"] == false)
}

fn has_member(s: &Value, name: &str) -> bool {
    members(s).iter().any(|m| m["name"] == name)
}

fn member_healthy(s: &Value, name: &str) -> bool {
    members(s)
        .iter()
        .any(|m| m["name"] == name && m["healthy"] == true)
}

fn healthy_voters(s: &Value) -> usize {
    members(s)
        .iter()
        .filter(|m| m["healthy"] == true && m["learner"] == false)
        .count()
}

// ---------------------------------------------------------------------------------------------
// The operator under test.

fn workspace_root() -> PathBuf {
    tools::workspace_root()
}

/// Builds the release server binary (cargo bench builds no bin targets) and returns its path.
fn build_release_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("BENCH_OPERATOR_BINARY") {
        return Ok(PathBuf::from(p));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    progress("building the release etcd-operator binary (cargo build --release) ...");
    let out = std::process::Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "etcd-operator",
            "--bin",
            "etcd-operator",
            "--message-format=json",
        ])
        .output()
        .context("run cargo build")?;
    ensure!(
        out.status.success(),
        "cargo build --release failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "etcd-operator")
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .next_back()
        .ok_or_else(|| anyhow!("cargo build reported no etcd-operator executable"))
}

/// `etcd-operator local` on a free port with a temporary state directory. Dropping it stops it
/// with SIGTERM and kills whatever it left behind (its etcd members).
struct Operator {
    process: Option<TestProcess>,
    client: kube::Client,
    state: tempfile::TempDir,
}

impl Operator {
    async fn start(binary: &Path) -> anyhow::Result<Self> {
        let state = tempfile::Builder::new()
            .prefix("etcd-operator-bench-ctl-")
            .tempdir()?;
        let port = ports::free_ports(1)?[0];
        let mut cmd = std::process::Command::new(binary);
        cmd.arg("local")
            .arg("--state-dir")
            .arg(state.path())
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .env(
                "RUST_LOG",
                std::env::var("BENCH_OPERATOR_LOG").unwrap_or_else(|_| "info".into()),
            )
            // Plain log lines: the bench reads the controller's steps from them.
            .env("NO_COLOR", "1")
            .env("ETCD_OPERATOR_ETCD", tools::etcd(EtcdVersion::V3_5_34)?);
        let log = state.path().join("operator.log");
        let mut process = TestProcess::spawn("etcd-operator", cmd, &log)?;
        let kubeconfig = state.path().join("kubeconfig");
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::from("no kubeconfig yet");
        while Instant::now() < deadline {
            if let Some(status) = process.exited() {
                bail!(
                    "etcd-operator exited ({status}); log tail:\n{}",
                    process.log_tail(4000)
                );
            }
            if kubeconfig.is_file() {
                match connect(&kubeconfig, ClientOptions::default()).await {
                    Ok(client) => {
                        match Api::<DynamicObject>::namespaced_with(
                            client.clone(),
                            NAMESPACE,
                            &etcd_clusters(),
                        )
                        .list(&Default::default())
                        .await
                        {
                            Ok(_) => {
                                return Ok(Self {
                                    process: Some(process),
                                    client,
                                    state,
                                });
                            }
                            Err(e) => last = e.to_string(),
                        }
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "etcd-operator did not become ready in 60 s: {last}; log tail:\n{}",
            process.log_tail(4000)
        )
    }

    fn kubeconfig(&self) -> PathBuf {
        self.state.path().join("kubeconfig")
    }

    fn log_tail(&self) -> String {
        self.process
            .as_ref()
            .map(|p| p.log_tail(4000))
            .unwrap_or_default()
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(p) = self.process.as_mut()
            && let Some(status) = p.exited()
        {
            bail!("etcd-operator exited ({status}); log tail:\n{}", p.log_tail(4000));
        }
        Ok(())
    }

    fn member_dir(&self, cluster: &str, member: &str) -> PathBuf {
        self.state
            .path()
            .join("members")
            .join(NAMESPACE)
            .join(cluster)
            .join(member)
    }

    /// Runs kubectl against the operator (on a blocking thread, so the watch keeps being read);
    /// a non-zero exit is an error with kubectl's stderr and the operator's log tail.
    async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut cmd = etcd_operator_tests::kube::kubectl(Some(&self.kubeconfig()))?;
        cmd.args(args);
        let owned: Vec<String> = args.iter().map(|a| (*a).to_string()).collect();
        let stdin = stdin.map(str::to_string);
        let out = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = owned.iter().map(String::as_str).collect();
            kubectl::run_with_stdin(cmd, &args, stdin.as_deref())
        })
        .await??;
        Ok(kubectl::stdout(args, out, || self.log_tail())?)
    }

    async fn delete_cluster(&self, name: &str) -> anyhow::Result<()> {
        self.kubectl(&["delete", "ec", name, "--wait", "--timeout=120s"], None)
            .await?;
        Ok(())
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(mut p) = self.process.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline && p.exited().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            p.kill();
        }
        leftovers::kill_processes_mentioning(self.state.path());
    }
}

/// Seconds since midnight UTC, now.
fn time_of_day() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
        .rem_euclid(86_400.0)
}

/// Seconds since midnight UTC of a log line's leading RFC 3339 timestamp
/// (`2026-01-02T17:52:23.553810Z ...`).
fn line_time_of_day(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let time = stamp.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The controller's log lines about `cluster` written since `since` (a [`time_of_day`]), each
/// with its time in seconds after `since`.
fn controller_steps(op: &Operator, cluster: &str, since: f64) -> Vec<(f64, String)> {
    let Some(log) = op.process.as_ref().map(|p| p.log_path().to_path_buf()) else {
        return Vec::new();
    };
    let text = std::fs::read_to_string(log).unwrap_or_default();
    // Lines name the cluster in a field, or in the span of the reconcile they belong to.
    let field = format!("cluster={NAMESPACE}/{cluster}");
    let span = format!("/{cluster}.{NAMESPACE} ");
    text.lines()
        .map(strip_ansi)
        .filter(|l| l.contains(&format!("{field} ")) || l.ends_with(&field) || l.contains(&span))
        .filter_map(|l| {
            let at = (line_time_of_day(&l)? - since).rem_euclid(86_400.0);
            // A line from before `since` wraps around to nearly a day.
            (at < 43_200.0).then_some((at, l))
        })
        .collect()
}

/// When the first of `steps` containing every one of `needles` was logged.
fn step_at(steps: &[(f64, String)], needles: &[&str]) -> Option<Duration> {
    steps
        .iter()
        .find(|(_, l)| needles.iter().all(|n| l.contains(n)))
        .map(|(at, _)| Duration::from_secs_f64(*at))
}

/// When the first leader of a new cluster was elected, after `since` (a [`time_of_day`]): the
/// earliest "became leader" line in the members' etcd logs (JSON lines with a `ts` field).
fn first_election(logs: &[PathBuf], since: f64) -> anyhow::Result<Duration> {
    let mut first: Option<f64> = None;
    for log in logs {
        let text = std::fs::read_to_string(log).with_context(|| format!("read {}", log.display()))?;
        for line in text.lines().filter(|l| l.contains("became leader at term")) {
            let Ok(entry) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(at) = entry["ts"].as_str().and_then(line_time_of_day) else {
                continue;
            };
            let at = (at - since).rem_euclid(86_400.0);
            if at < 43_200.0 {
                first = Some(first.map_or(at, |f: f64| f.min(at)));
            }
        }
    }
    first
        .map(|f| Duration::from_secs_f64(f.max(0.0)))
        .ok_or_else(|| anyhow!("no 'became leader' line in {logs:?}"))
}

/// A kube-rs watch on one EtcdCluster; every status it delivers is stamped on arrival.
struct StatusWatch {
    rx: mpsc::UnboundedReceiver<(Instant, Value)>,
    task: tokio::task::JoinHandle<()>,
    /// The latest status seen, and when.
    last: Option<(Instant, Value)>,
    /// Every status seen while waiting, in order.
    history: Vec<(Instant, Value)>,
    name: String,
}

impl StatusWatch {
    /// Starts the watch and returns once its initial list is done (so that what happens next is
    /// seen through the open watch, without a list in between).
    async fn start(client: &kube::Client, name: &str) -> anyhow::Result<Self> {
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &etcd_clusters());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                match event {
                    Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                        if tx.send((now, obj.data["status"].clone())).is_err() {
                            return;
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(watcher::Event::Delete(_) | watcher::Event::Init) => {}
                    Err(error) => progress(&format!("watch error (retrying): {error}")),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .map_err(|_| anyhow!("the watch on {name} did not finish its initial list in 30 s"))?
            .map_err(|_| anyhow!("the watch on {name} ended"))?;
        Ok(Self {
            rx,
            task,
            last: None,
            history: Vec::new(),
            name: name.to_string(),
        })
    }

    /// The arrival time of the first status (the latest one seen counts too) for which `check`
    /// holds.
    async fn until(&mut self, what: &str, check: impl Fn(&Value) -> bool) -> anyhow::Result<Instant> {
        if let Some((at, s)) = &self.last
            && check(s)
        {
            return Ok(*at);
        }
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some((at, s))) => {
                    let hit = check(&s);
                    self.history.push((at, s.clone()));
                    self.last = Some((at, s));
                    if hit {
                        return Ok(at);
                    }
                }
                Ok(None) => bail!("the watch on {} ended while waiting for {what}", self.name),
                Err(_) => bail!(
                    "{}: timed out after {STEP_TIMEOUT:?} waiting for {what}; last status: {:#}",
                    self.name,
                    self.last.as_ref().map(|l| l.1.clone()).unwrap_or_default()
                ),
            }
        }
    }

    fn last_status(&self) -> Value {
        self.last.as_ref().map(|l| l.1.clone()).unwrap_or_default()
    }
}

impl Drop for StatusWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// By hand: etcd processes and etcdctl.

async fn etcdctl(endpoints: &str, args: &[&str]) -> anyhow::Result<std::process::Output> {
    let mut cmd = tokio::process::Command::new(tools::etcdctl(ETCD)?);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .arg("--dial-timeout=1s")
        .arg("--command-timeout=2s")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.output().await.context("run etcdctl")
}

async fn etcdctl_ok(endpoints: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = etcdctl(endpoints, args).await?;
    ensure!(
        out.status.success(),
        "etcdctl {args:?} at {endpoints}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Retries an etcdctl command every [`POLL`] until etcd accepts it.
async fn etcdctl_until_ok(endpoints: &str, args: &[&str]) -> anyhow::Result<String> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let out = etcdctl(endpoints, args).await?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        ensure!(
            Instant::now() < deadline,
            "etcdctl {args:?} at {endpoints} still refused after {STEP_TIMEOUT:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        tokio::time::sleep(POLL).await;
    }
}

fn port_open(url: &str) -> bool {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .is_some_and(|port| {
            TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_millis(200))
                .is_ok()
        })
}

struct HandMember {
    name: String,
    client_url: String,
    peer_url: String,
    data: PathBuf,
    process: TestProcess,
}

/// etcd members started by hand in a temporary directory; dropping it kills them.
struct HandCluster {
    // Declared before `dir`: the processes die before their directories go.
    members: Vec<HandMember>,
    token: String,
    dir: tempfile::TempDir,
}

impl HandCluster {
    fn new(token: &str) -> anyhow::Result<Self> {
        Ok(Self {
            members: Vec::new(),
            token: token.to_string(),
            dir: tempfile::Builder::new().prefix("etcd-bench-by-hand-").tempdir()?,
        })
    }

    /// Starts one etcd with the same flags the operator's local runtime passes.
    fn spawn_at(
        &mut self,
        name: &str,
        client_url: &str,
        peer_url: &str,
        initial_cluster: &str,
        state: &str,
    ) -> anyhow::Result<()> {
        let member_dir = self.dir.path().join(name);
        std::fs::create_dir_all(&member_dir)?;
        let data = member_dir.join("data");
        let mut cmd = std::process::Command::new(tools::etcd(ETCD)?);
        cmd.arg(format!("--name={name}"))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .arg(format!("--initial-cluster-state={state}"))
            .arg(format!("--initial-cluster-token={}", self.token))
            .env_remove("ETCDCTL_API");
        let process = TestProcess::spawn(format!("etcd {name}"), cmd, &member_dir.join("etcd.log"))?;
        self.members.push(HandMember {
            name: name.to_string(),
            client_url: client_url.to_string(),
            peer_url: peer_url.to_string(),
            data,
            process,
        });
        Ok(())
    }

    /// `n` members started together with a static `--initial-cluster` (not waited for).
    fn bootstrap(token: &str, n: usize) -> anyhow::Result<Self> {
        let mut c = Self::new(token)?;
        let ports = ports::free_ports(2 * n)?;
        let urls: Vec<(String, String, String)> = (0..n)
            .map(|i| {
                (
                    format!("{token}-m{i}"),
                    format!("http://127.0.0.1:{}", ports[2 * i]),
                    format!("http://127.0.0.1:{}", ports[2 * i + 1]),
                )
            })
            .collect();
        let initial = urls
            .iter()
            .map(|(name, _, peer)| format!("{name}={peer}"))
            .collect::<Vec<_>>()
            .join(",");
        for (name, client, peer) in &urls {
            c.spawn_at(name, client, peer, &initial, "new")?;
        }
        Ok(c)
    }

    /// `name=peer` of every member, for the `--initial-cluster` of a joining member.
    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.client_url.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn check_running(&mut self) -> anyhow::Result<()> {
        for m in &mut self.members {
            if let Some(status) = m.process.exited() {
                bail!(
                    "etcd {} exited ({status}); log tail:\n{}",
                    m.name,
                    m.process.log_tail(3000)
                );
            }
        }
        Ok(())
    }

    /// Polls every [`POLL`] until `etcdctl endpoint health --cluster` succeeds: every member the
    /// cluster lists answers a (linearizable) read. Until then each poll asks only what answers at
    /// once: whether every member's client port accepts connections (else etcdctl's connection
    /// backoff would inflate the figure), and whether `etcdctl endpoint status --cluster` shows
    /// every member knowing a leader (a read sent before the election waits in etcd, whose
    /// read-index retry is 500 ms, up to etcdctl's command timeout).
    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut last = String::from("no attempt yet");
        while Instant::now() < deadline {
            self.check_running()?;
            if !self.members.iter().all(|m| port_open(&m.client_url)) {
                last = "a client port does not accept connections yet".into();
            } else {
                let eps = self.endpoints();
                let status = etcdctl(&eps, &["endpoint", "status", "--cluster", "-w", "json"]).await?;
                let statuses: Value = serde_json::from_slice(&status.stdout).unwrap_or_default();
                let with_leader = statuses.as_array().map_or(0, |all| {
                    all.iter()
                        .filter(|s| s["Status"]["leader"].as_u64().is_some_and(|l| l != 0))
                        .count()
                });
                if !status.status.success() || with_leader < self.members.len() {
                    last = format!(
                        "{with_leader} of {} members know a leader: {}",
                        self.members.len(),
                        String::from_utf8_lossy(&status.stderr).trim()
                    );
                } else {
                    let out = etcdctl(&eps, &["endpoint", "health", "--cluster"]).await?;
                    if out.status.success() {
                        return Ok(());
                    }
                    last = String::from_utf8_lossy(&out.stderr).trim().to_string();
                }
            }
            tokio::time::sleep(POLL).await;
        }
        bail!("the hand-started cluster did not become healthy in {STEP_TIMEOUT:?}: {last}")
    }

    /// The index of a member that is not the leader.
    async fn a_follower(&self) -> anyhow::Result<usize> {
        let out = etcdctl_ok(&self.endpoints(), &["endpoint", "status", "-w", "json"]).await?;
        let statuses: Value = serde_json::from_str(&out)?;
        let statuses = statuses
            .as_array()
            .ok_or_else(|| anyhow!("endpoint status: not a list: {out}"))?;
        for (i, m) in self.members.iter().enumerate() {
            let s = statuses
                .iter()
                .find(|s| s["Endpoint"] == m.client_url.as_str())
                .ok_or_else(|| anyhow!("no endpoint status for {}", m.client_url))?;
            if s["Status"]["header"]["member_id"] != s["Status"]["leader"] {
                return Ok(i);
            }
        }
        bail!("every member claims to be the leader: {out}")
    }
}

/// etcd member IDs as etcdctl takes them (hex).
fn member_id(member_json: &Value) -> anyhow::Result<String> {
    member_json["ID"]
        .as_u64()
        .map(|id| format!("{id:x}"))
        .ok_or_else(|| anyhow!("member without an ID: {member_json}"))
}

/// `member add <name> --learner`, retried until etcd accepts it, then the new etcd started with
/// `--initial-cluster-state=existing`, then `member promote`, retried until accepted.
/// Returns when the add and the promote were accepted.
async fn add_learner_and_promote(c: &mut HandCluster, name: &str) -> anyhow::Result<(Instant, Instant)> {
    let voters = c.endpoints();
    let ports = ports::free_ports(2)?;
    let client_url = format!("http://127.0.0.1:{}", ports[0]);
    let peer_url = format!("http://127.0.0.1:{}", ports[1]);
    let added = etcdctl_until_ok(
        &voters,
        &[
            "member",
            "add",
            name,
            "--learner",
            &format!("--peer-urls={peer_url}"),
            "-w",
            "json",
        ],
    )
    .await?;
    let added_at = Instant::now();
    let added: Value = serde_json::from_str(&added)?;
    let id = member_id(&added["member"])?;
    let initial = format!("{},{name}={peer_url}", c.initial_cluster());
    c.spawn_at(name, &client_url, &peer_url, &initial, "existing")?;
    etcdctl_until_ok(&voters, &["member", "promote", &id]).await?;
    Ok((added_at, Instant::now()))
}

// ---------------------------------------------------------------------------------------------
// Measurements. Each returns the headline duration and named phases (times since the start).

struct Sample {
    total: Duration,
    /// Where an operation splits in two: for an apply, the election of the first leader (read
    /// from the members' etcd logs); for a replace, the member's removal from etcd.
    split: Option<Duration>,
    phases: Vec<(&'static str, Duration)>,
}

async fn op_apply(op: &mut Operator, name: &str, n: usize) -> anyhow::Result<Sample> {
    let mut watch = StatusWatch::start(&op.client, name).await?;
    let t0 = Instant::now();
    let t0_day = time_of_day();
    op.kubectl(&["apply", "-f", "-"], Some(&cluster_yaml(name, n)))
        .await?;
    let applied = t0.elapsed();
    let first = watch.until("a first status", |s| s.is_object()).await? - t0;
    let cond = watch
        .until("Available=True", |s| condition_true(s, "Available"))
        .await?
        - t0;
    let all = watch
        .until(&format!("{n} healthy voters"), |s| available_with(s, n))
        .await?
        - t0;
    op.check_alive()?;
    let cluster_dir = op.member_dir(name, "");
    let logs: Vec<PathBuf> = std::fs::read_dir(&cluster_dir)?
        .filter_map(|e| Some(e.ok()?.path().join("etcd.log")))
        .filter(|p| p.is_file())
        .collect();
    let elected = first_election(&logs, t0_day)?;
    let steps = controller_steps(op, name, t0_day);
    let started = steps
        .iter()
        .filter(|(_, l)| l.contains("started etcd member"))
        .map(|(at, _)| Duration::from_secs_f64(*at))
        .max()
        .ok_or_else(|| anyhow!("no 'started etcd member' in the log: {steps:?}"))?;
    drop(watch);
    op.delete_cluster(name).await?;
    Ok(Sample {
        total: all,
        split: Some(elected),
        phases: vec![
            ("kubectl apply returned", applied),
            ("all started (log)", started),
            ("leader elected (etcd log)", elected),
            ("first status written", first),
            ("Available=True", cond),
            ("all members healthy", all),
        ],
    })
}

async fn hand_apply(token: &str, n: usize) -> anyhow::Result<Sample> {
    let t0 = Instant::now();
    let t0_day = time_of_day();
    let mut c = HandCluster::bootstrap(token, n)?;
    let spawned = t0.elapsed();
    c.wait_healthy().await?;
    let total = t0.elapsed();
    let logs: Vec<PathBuf> = c
        .members
        .iter()
        .map(|m| m.process.log_path().to_path_buf())
        .collect();
    let elected = first_election(&logs, t0_day)?;
    drop(c);
    Ok(Sample {
        total,
        split: Some(elected),
        phases: vec![
            ("all started", spawned),
            ("leader elected (etcd log)", elected),
            ("endpoint health --cluster ok", total),
        ],
    })
}

/// Applies a cluster of `n` and waits until it has been healthy for `settle`.
async fn op_ready_cluster(
    op: &Operator,
    name: &str,
    n: usize,
    settle: Duration,
) -> anyhow::Result<StatusWatch> {
    let mut watch = StatusWatch::start(&op.client, name).await?;
    op.kubectl(&["apply", "-f", "-"], Some(&cluster_yaml(name, n)))
        .await?;
    watch
        .until(&format!("{n} healthy voters"), |s| available_with(s, n))
        .await?;
    tokio::time::sleep(settle).await;
    // Drain what arrived meanwhile, so `last` is the current status.
    while let Ok((at, s)) = watch.rx.try_recv() {
        watch.last = Some((at, s));
    }
    ensure!(
        available_with(&watch.last_status(), n),
        "{name} was not healthy after settling: {:#}",
        watch.last_status()
    );
    Ok(watch)
}

/// Statuses seen since `t0` in which `Available` is not `True` (quorum was never lost in the
/// operations measured, so each one is a false alarm a user would see).
fn count_unavailable(watch: &StatusWatch, t0: Instant) -> usize {
    watch
        .history
        .iter()
        .filter(|(at, s)| *at >= t0 && !condition_true(s, "Available"))
        .count()
}

/// A count carried in a phase (labelled "(count)"), printed as a number.
fn count(n: usize) -> Duration {
    Duration::from_secs(n as u64)
}

/// `offset` spreads the kill over the operator's periodic reconcile: the local runtime has no
/// process watch, so when the controller notices a dead member depends on when it last looked.
async fn op_replace(op: &mut Operator, name: &str, offset: Duration) -> anyhow::Result<Sample> {
    let mut watch = op_ready_cluster(op, name, 3, SETTLE + offset).await?;
    let victim = members(&watch.last_status())
        .iter()
        .find(|m| m["leader"] == false)
        .and_then(|m| m["name"].as_str().map(str::to_string))
        .ok_or_else(|| anyhow!("no follower in {:#}", watch.last_status()))?;
    let dir = op.member_dir(name, &victim);
    let pid: i32 = std::fs::read_to_string(dir.join("etcd.pid"))?
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow!("empty etcd.pid of {victim}"))?
        .parse()?;
    let t0 = Instant::now();
    let t0_day = time_of_day();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)?;
    std::fs::remove_dir_all(dir.join("data"))?;
    let noticed = watch
        .until("the victim reported unhealthy or gone", |s| {
            !member_healthy(s, &victim)
        })
        .await?
        - t0;
    let removed = watch
        .until("the victim removed", |s| !has_member(s, &victim))
        .await?
        - t0;
    let total = watch
        .until("3 healthy voters without the victim", |s| {
            available_with(s, 3) && !has_member(s, &victim)
        })
        .await?
        - t0;
    op.check_alive()?;
    let steps = controller_steps(op, name, t0_day);
    let victim_key = format!("member={victim}");
    let removed_log = step_at(&steps, &["removed member from etcd", &victim_key])
        .ok_or_else(|| anyhow!("no 'removed member from etcd' for {victim} in the log: {steps:?}"))?;
    let added_log = step_at(&steps, &["added learner"])
        .ok_or_else(|| anyhow!("no 'added learner' in the log: {steps:?}"))?;
    let promoted_log = step_at(&steps, &["promoted learner"])
        .ok_or_else(|| anyhow!("no 'promoted learner' in the log: {steps:?}"))?;
    let unavailable = count_unavailable(&watch, t0);
    drop(watch);
    op.delete_cluster(name).await?;
    Ok(Sample {
        total,
        split: Some(removed_log),
        phases: vec![
            ("member removed (log)", removed_log),
            ("learner added (log)", added_log),
            ("promoted (log)", promoted_log),
            ("status: victim down", noticed),
            ("status: victim gone", removed),
            ("status: 3 healthy voters", total),
            ("Available=False statuses (count)", count(unavailable)),
        ],
    })
}

async fn hand_replace(token: &str) -> anyhow::Result<Sample> {
    let mut c = HandCluster::bootstrap(token, 3)?;
    c.wait_healthy().await?;
    tokio::time::sleep(SETTLE).await;
    let v = c.a_follower().await?;
    let t0 = Instant::now();
    let victim = c.members.remove(v);
    let victim_name = victim.name.clone();
    let data = victim.data.clone();
    drop(victim); // SIGKILL (TestProcess drop) and reap
    std::fs::remove_dir_all(&data)?;
    let survivors = c.endpoints();
    let list: Value =
        serde_json::from_str(&etcdctl_ok(&survivors, &["member", "list", "-w", "json"]).await?)?;
    let dead = list["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == victim_name.as_str()))
        .ok_or_else(|| anyhow!("{victim_name} not in the member list: {list}"))?;
    etcdctl_ok(&survivors, &["member", "remove", &member_id(dead)?]).await?;
    let removed = t0.elapsed();
    let (added, promoted) = add_learner_and_promote(&mut c, &format!("{token}-r")).await?;
    c.wait_healthy().await?;
    let total = t0.elapsed();
    Ok(Sample {
        total,
        split: Some(removed),
        phases: vec![
            ("member remove done", removed),
            ("member add --learner accepted", added - t0),
            ("member promote accepted", promoted - t0),
            ("endpoint health --cluster ok", total),
        ],
    })
}

async fn op_scale(op: &mut Operator, name: &str) -> anyhow::Result<Sample> {
    let mut watch = op_ready_cluster(op, name, 3, SETTLE).await?;
    let t0 = Instant::now();
    let t0_day = time_of_day();
    op.kubectl(&["scale", "ec", name, "--replicas=5"], None).await?;
    let scaled = t0.elapsed();
    let fourth = watch
        .until("4 healthy voters", |s| healthy_voters(s) >= 4)
        .await?
        - t0;
    let total = watch.until("5 healthy voters", |s| available_with(s, 5)).await? - t0;
    op.check_alive()?;
    let steps = controller_steps(op, name, t0_day);
    let learners: Vec<Duration> = steps
        .iter()
        .filter(|(_, l)| l.contains("added learner"))
        .map(|(at, _)| Duration::from_secs_f64(*at))
        .collect();
    ensure!(
        learners.len() == 2,
        "expected 2 'added learner' lines in the log: {steps:?}"
    );
    let degraded = watch
        .history
        .iter()
        .filter(|(at, s)| *at >= t0 && condition_true(s, "Degraded"))
        .count();
    let unavailable = count_unavailable(&watch, t0);
    let refused = steps
        .iter()
        .filter(|(_, l)| l.contains("step failed") && l.contains("member add"))
        .count();
    drop(watch);
    op.delete_cluster(name).await?;
    Ok(Sample {
        total,
        split: None,
        phases: vec![
            ("kubectl scale returned", scaled),
            ("4th member a healthy voter", fourth),
            ("5th learner added (log)", learners[1]),
            ("5 healthy voters", total),
            // Not a time: how often the second member add was refused (and retried).
            ("member adds refused (count)", count(refused)),
            ("Degraded=True statuses (count)", count(degraded)),
            ("Available=False statuses (count)", count(unavailable)),
        ],
    })
}

async fn hand_scale(token: &str) -> anyhow::Result<Sample> {
    let mut c = HandCluster::bootstrap(token, 3)?;
    c.wait_healthy().await?;
    tokio::time::sleep(SETTLE).await;
    let t0 = Instant::now();
    let (_, fourth) = add_learner_and_promote(&mut c, &format!("{token}-m3")).await?;
    let (fifth_added, _) = add_learner_and_promote(&mut c, &format!("{token}-m4")).await?;
    c.wait_healthy().await?;
    let total = t0.elapsed();
    Ok(Sample {
        total,
        split: None,
        phases: vec![
            ("4th member promoted", fourth - t0),
            ("5th member add accepted", fifth_added - t0),
            ("endpoint health --cluster ok", total),
        ],
    })
}

// ---------------------------------------------------------------------------------------------
// Figures.

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    match v.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

fn min_max(v: &[Duration]) -> (Duration, Duration) {
    (
        v.iter().copied().min().unwrap_or_default(),
        v.iter().copied().max().unwrap_or_default(),
    )
}

struct Row {
    operation: String,
    /// Names of the two parts a [`Sample::split`] divides the operation into.
    split_names: [&'static str; 2],
    operator: Vec<Sample>,
    by_hand: Vec<Sample>,
}

fn cell(v: &[Duration]) -> String {
    let (lo, hi) = min_max(v);
    format!("{:>6.2} s [{:.2} .. {:.2}]", secs(median(v)), secs(lo), secs(hi))
}

fn table_line(s: &mut String, operation: &str, op: &[Duration], hand: &[Duration]) {
    let ratio = secs(median(op)) / secs(median(hand)).max(1e-9);
    // The median of the per-run ratios (run i of each side ran back to back).
    let paired: Vec<Duration> = op
        .iter()
        .zip(hand)
        .map(|(o, h)| Duration::from_secs_f64(secs(*o) / secs(*h).max(1e-9)))
        .collect();
    let _ = writeln!(
        s,
        "{:<36} {:>2} | {:<26} | {:<26} | {:>6.2}x {:>6.2}x",
        operation,
        op.len().min(hand.len()),
        cell(op),
        cell(hand),
        ratio,
        secs(median(&paired))
    );
}

fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<36} {:>2} | {:<26} | {:<26} | {:>7} {:>7}",
        "operation", "N", "operator median [min .. max]", "by hand median [min .. max]", "ratio", "paired"
    );
    let _ = writeln!(s, "{}", "-".repeat(113));
    for r in rows {
        let totals = |v: &[Sample]| v.iter().map(|x| x.total).collect::<Vec<_>>();
        table_line(&mut s, &r.operation, &totals(&r.operator), &totals(&r.by_hand));
        let splits = |v: &[Sample]| v.iter().map(|x| x.split).collect::<Option<Vec<_>>>();
        if let (Some(op), Some(hand)) = (splits(&r.operator), splits(&r.by_hand)) {
            let repair = |v: &[Sample], split: &[Duration]| {
                v.iter()
                    .zip(split)
                    .map(|(x, d)| x.total.saturating_sub(*d))
                    .collect::<Vec<_>>()
            };
            table_line(&mut s, r.split_names[0], &op, &hand);
            table_line(
                &mut s,
                r.split_names[1],
                &repair(&r.operator, &op),
                &repair(&r.by_hand, &hand),
            );
        }
    }
    s
}

fn breakdown(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows {
        let _ = writeln!(s, "{}", r.operation);
        for (side, samples) in [("operator", &r.operator), ("by hand", &r.by_hand)] {
            let Some(first) = samples.first() else { continue };
            let phases: Vec<String> = first
                .phases
                .iter()
                .enumerate()
                .map(|(i, (label, _))| {
                    let v: Vec<Duration> = samples
                        .iter()
                        .filter_map(|x| x.phases.get(i).map(|p| p.1))
                        .collect();
                    if let Some(label) = label.strip_suffix(" (count)") {
                        let total: Duration = v.iter().sum();
                        format!("{label} (all runs) {:.0}", secs(total))
                    } else {
                        format!("{label} {:.2}", secs(median(&v)))
                    }
                })
                .collect();
            let _ = writeln!(s, "  {side:<9} {}", phases.join(" · "));
        }
    }
    s
}

fn runs(default: usize) -> usize {
    std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// Runs `n` rounds of one operation, operator and by hand back to back, alternating which goes
/// first.
async fn measure<O, H>(
    rows: &mut Vec<Row>,
    operation: String,
    split_names: [&'static str; 2],
    n: usize,
    mut op: O,
    mut hand: H,
) -> anyhow::Result<()>
where
    O: AsyncFnMut(usize) -> anyhow::Result<Sample>,
    H: AsyncFnMut(usize) -> anyhow::Result<Sample>,
{
    if let Ok(only) = std::env::var("BENCH_ONLY")
        && !operation.contains(&only)
    {
        return Ok(());
    }
    let mut row = Row {
        operation: operation.clone(),
        split_names,
        operator: Vec::new(),
        by_hand: Vec::new(),
    };
    for i in 0..n {
        let (o, h) = if i % 2 == 0 {
            let o = op(i)
                .await
                .with_context(|| format!("{operation}, operator run {i}"))?;
            let h = hand(i)
                .await
                .with_context(|| format!("{operation}, by-hand run {i}"))?;
            (o, h)
        } else {
            let h = hand(i)
                .await
                .with_context(|| format!("{operation}, by-hand run {i}"))?;
            let o = op(i)
                .await
                .with_context(|| format!("{operation}, operator run {i}"))?;
            (o, h)
        };
        progress(&format!(
            "{operation} run {}/{n}: operator {:.2} s, by hand {:.2} s",
            i + 1,
            secs(o.total),
            secs(h.total)
        ));
        row.operator.push(o);
        row.by_hand.push(h);
    }
    rows.push(row);
    Ok(())
}

async fn run(op: &mut Operator) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let apply_runs = runs(5);
    for n in [1usize, 3, 5] {
        let label = format!("apply -> Available, {n} member{}", if n == 1 { "" } else { "s" });
        let op_ref = &mut *op;
        Box::pin(measure(
            &mut rows,
            label,
            [
                "  of which: -> leader elected",
                "  of which: leader elected -> ready",
            ],
            apply_runs,
            async |i| Box::pin(op_apply(op_ref, &format!("apply{n}-{i}"), n)).await,
            async |i| hand_apply(&format!("hand{n}-{i}"), n).await,
        ))
        .await?;
    }
    let other_runs = runs(3);
    let op_ref = &mut *op;
    Box::pin(measure(
        &mut rows,
        "replace a killed member (3)".into(),
        [
            "  of which: kill -> removed from etcd",
            "  of which: removed -> healthy again",
        ],
        other_runs,
        async |i| {
            let offset = KILL_WINDOW.mul_f64(i as f64 / other_runs as f64);
            Box::pin(op_replace(op_ref, &format!("replace-{i}"), offset)).await
        },
        async |i| Box::pin(hand_replace(&format!("handrep-{i}"))).await,
    ))
    .await?;
    let op_ref = &mut *op;
    Box::pin(measure(
        &mut rows,
        "scale 3 -> 5".into(),
        ["", ""],
        other_runs,
        async |i| Box::pin(op_scale(op_ref, &format!("scale-{i}"))).await,
        async |i| Box::pin(hand_scale(&format!("handscale-{i}"))).await,
    ))
    .await?;
    Ok(rows)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // kube (ring) and object_store (aws-lc-rs) may both enable a rustls provider: pick one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let started = Instant::now();
    // Fail early, with the make target to run, when a component is missing.
    tools::etcd(ETCD)?;
    tools::etcdctl(ETCD)?;
    tools::kubectl()?;
    let binary = build_release_binary()?;
    let mut op = Operator::start(&binary).await?;
    progress("etcd-operator local is ready");
    let result = Box::pin(run(&mut op)).await;
    // Keep the operator's log for a look after the run.
    let kept = workspace_root()
        .join("target")
        .join("bench-controller-operator.log");
    if let Some(p) = op.process.as_ref() {
        let _ = std::fs::copy(p.log_path(), &kept);
    }
    let rows = match result {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!(
                "operator log tail (whole log: {}):\n{}",
                kept.display(),
                op.log_tail()
            );
            return Err(e);
        }
    };
    drop(op);
    println!();
    println!(
        "etcd-operator controller (release build, local runtime) vs the same operation by hand with etcd {} + etcdctl, same run; {} CPUs",
        ETCD.as_str(),
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    println!(
        "operator: kubectl apply/scale, status seen through a kube-rs watch; by hand: etcd + etcdctl, polled every {} ms",
        POLL.as_millis()
    );
    println!(
        "replace and scale start {} s after the cluster became healthy (etcd's 5 s strict reconfiguration check); operator-side kills spread over a further {} s window",
        SETTLE.as_secs(),
        KILL_WINDOW.as_secs()
    );
    println!(
        "ratio = median / median; paired = median of per-run ratios (the two sides of a run ran back to back)"
    );
    println!(
        "apply splits at the first leader election (both sides: the members' etcd logs); replace splits at the removal from etcd (operator: its log line)"
    );
    println!();
    print!("{}", table(&rows));
    println!();
    println!(
        "where the time goes (medians, seconds since the start of the operation; counts are totals over all runs):"
    );
    print!("{}", breakdown(&rows));
    println!();
    println!(
        "operator log: {}; total bench time {:.0} s",
        kept.display(),
        secs(started.elapsed())
    );
    Ok(())
}
