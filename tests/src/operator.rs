//! `etcd-operator local` for end-to-end tests: built from this workspace, started on a free
//! port with a temporary state directory, driven with kubectl through the kubeconfig it writes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::process::{SpawnError, TestProcess};
use crate::tools::{self, MissingTool};

const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Starting or stopping the operator failed.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// Building the binary failed.
    #[error("build etcd-operator: {0}")]
    Build(String),
    /// kubectl is not installed.
    #[error(transparent)]
    Missing(#[from] MissingTool),
    /// Preparing the state directory or a port failed.
    #[error("prepare etcd-operator state")]
    Prepare(#[from] std::io::Error),
    /// The process could not be started.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// It exited while starting.
    #[error("etcd-operator exited during start ({status}); log tail:\n{log}")]
    Exited { status: String, log: String },
    /// It did not become ready in time.
    #[error("etcd-operator did not become ready within {timeout:?}: {last}; log tail:\n{log}")]
    NotReady {
        timeout: Duration,
        last: String,
        log: String,
    },
    /// It did not stop after SIGTERM.
    #[error("etcd-operator did not stop within {timeout:?} of SIGTERM")]
    DidNotStop { timeout: Duration },
}

/// The `etcd-operator` binary of this workspace, built (once per test process) with cargo so a
/// test never runs a stale binary.
pub fn operator_binary() -> Result<PathBuf, OperatorError> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| crate::cargo_bin::build("etcd-operator", "etcd-operator"))
        .clone()
        .map_err(OperatorError::Build)
}

/// Extra settings for [`LocalOperator::start_with`], kept across restarts.
#[derive(Debug, Clone, Default)]
pub struct OperatorOptions {
    /// Environment variables for the operator process.
    pub env: Vec<(String, String)>,
    /// Arguments appended after `local --state-dir DIR --listen ADDR`.
    pub args: Vec<String>,
}

/// A running `etcd-operator local`. Dropping it stops the operator and every process it started.
#[derive(Debug)]
pub struct LocalOperator {
    process: Option<TestProcess>,
    listen: String,
    restarts: u32,
    options: OperatorOptions,
    // Declared last: removed after the processes are gone.
    state: tempfile::TempDir,
}

impl LocalOperator {
    /// Starts the operator on a free port with a fresh state directory and waits until `/readyz`
    /// answers through kubectl.
    pub async fn start() -> Result<Self, OperatorError> {
        Self::start_with(OperatorOptions::default()).await
    }

    /// [`Self::start`] with extra environment variables and arguments (used on every restart).
    pub async fn start_with(options: OperatorOptions) -> Result<Self, OperatorError> {
        let state = tempfile::Builder::new()
            .prefix("etcd-operator-local-")
            .tempdir()?;
        let port = crate::ports::free_ports(1)?[0];
        let mut op = Self {
            process: None,
            listen: format!("127.0.0.1:{port}"),
            restarts: 0,
            options,
            state,
        };
        op.launch().await?;
        Ok(op)
    }

    async fn launch(&mut self) -> Result<(), OperatorError> {
        let binary = operator_binary()?;
        let mut cmd = Command::new(binary);
        cmd.arg("local")
            .arg("--state-dir")
            .arg(self.state.path())
            .arg("--listen")
            .arg(&self.listen)
            .env("RUST_LOG", "info")
            .args(&self.options.args)
            .envs(self.options.env.iter().map(|(k, v)| (k, v)));
        // The release local mode prefers: 3.5.0-3.5.4 lose acknowledged writes when killed (etcd
        // issue 14370), which the operator refuses.
        if let Ok(etcd) = tools::etcd(tools::EtcdVersion::V3_5_34) {
            cmd.env("ETCD_OPERATOR_ETCD", etcd);
        }
        let log = self.state.path().join(format!("operator-{}.log", self.restarts));
        self.restarts += 1;
        self.process = Some(TestProcess::spawn("etcd-operator", cmd, &log)?);
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<(), OperatorError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::from("no attempt yet");
        while Instant::now() < deadline {
            if let Some(p) = self.process.as_mut()
                && let Some(status) = p.exited()
            {
                return Err(OperatorError::Exited {
                    status: status.to_string(),
                    log: p.log_tail(6000),
                });
            }
            if self.kubeconfig().is_file() {
                match self.kubectl()?.args(["get", "--raw", "/readyz"]).output() {
                    Ok(out) if out.status.success() => return Ok(()),
                    Ok(out) => last = String::from_utf8_lossy(&out.stderr).trim().to_string(),
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(OperatorError::NotReady {
            timeout: READY_TIMEOUT,
            last,
            log: self.log_tail(),
        })
    }

    /// The state directory.
    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// The client URL of the backing etcd (from `DIR/etcd/ports.json`): `https://`, mutual TLS;
    /// connect with [`Self::backing_etcd_connect_options`].
    pub fn backing_etcd_endpoint(&self) -> Option<String> {
        Some(format!("https://127.0.0.1:{}", self.backing_etcd_port("client")?))
    }

    /// A port of the backing etcd from `DIR/etcd/ports.json`: `client`, `peer` or `metrics` (plain
    /// HTTP on loopback: `/metrics`, `/health`).
    pub fn backing_etcd_port(&self, which: &str) -> Option<u16> {
        backing_etcd_port(self.state.path(), which)
    }

    /// Options for a client of the backing etcd: its CA and the API server storage's client
    /// certificate (`DIR/etcd/pki/`), as the operator connects.
    pub fn backing_etcd_connect_options(&self) -> Option<etcd_client::ConnectOptions> {
        backing_etcd_connect_options(self.state.path())
    }

    /// The kubeconfig the operator wrote.
    pub fn kubeconfig(&self) -> PathBuf {
        self.state.path().join("kubeconfig")
    }

    /// `host:port` it serves on.
    pub fn listen(&self) -> &str {
        &self.listen
    }

    /// kubectl pointed at this operator.
    pub fn kubectl(&self) -> Result<Command, MissingTool> {
        crate::kube::kubectl(Some(&self.kubeconfig()))
    }

    /// The log of the current run.
    pub fn log_tail(&self) -> String {
        self.process
            .as_ref()
            .map(|p| p.log_tail(6000))
            .unwrap_or_default()
    }

    /// The whole log of the current run.
    pub fn log(&self) -> String {
        self.process
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p.log_path()).ok())
            .unwrap_or_default()
    }

    /// The operator's pid.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(TestProcess::pid)
    }

    /// Stops the operator with SIGTERM and waits for it to exit; returns its exit status.
    pub async fn stop(&mut self) -> Result<Option<std::process::ExitStatus>, OperatorError> {
        let Some(mut p) = self.process.take() else {
            return Ok(None);
        };
        let _ = kill(Pid::from_raw(p.pid() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = p.exited() {
                return Ok(Some(status));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        p.kill();
        Err(OperatorError::DidNotStop {
            timeout: STOP_TIMEOUT,
        })
    }

    /// SIGKILLs the operator (its children stay, as after a crash).
    pub fn crash(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// Starts the operator again after [`Self::stop`] or [`Self::crash`], on the same state
    /// directory and port.
    pub async fn start_again(&mut self) -> Result<(), OperatorError> {
        self.launch().await
    }

    /// Stops (SIGTERM) and starts again on the same state directory and port.
    pub async fn restart(&mut self) -> Result<(), OperatorError> {
        self.stop().await?;
        self.launch().await
    }
}

impl Drop for LocalOperator {
    fn drop(&mut self) {
        if let Some(p) = self.process.as_ref() {
            let _ = kill(Pid::from_raw(p.pid() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline && self.process.as_mut().and_then(TestProcess::exited).is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.process = None;
        // Whatever the operator started and left (after a crash, or if it ignored SIGTERM).
        crate::leftovers::kill_processes_mentioning(self.state.path());
    }
}

/// A port of the backing etcd of the local-mode state directory `state_dir`, from
/// `DIR/etcd/ports.json`: `client`, `peer` or `metrics`.
pub fn backing_etcd_port(state_dir: &Path, which: &str) -> Option<u16> {
    let text = std::fs::read_to_string(state_dir.join("etcd").join("ports.json")).ok()?;
    let ports: serde_json::Value = serde_json::from_str(&text).ok()?;
    u16::try_from(ports[which].as_u64()?).ok()
}

/// Options for a client of the backing etcd of the local-mode state directory `state_dir`: TLS
/// with its CA and the storage's client certificate (`DIR/etcd/pki/{ca,client}.*`).
pub fn backing_etcd_connect_options(state_dir: &Path) -> Option<etcd_client::ConnectOptions> {
    let pki = state_dir.join("etcd").join("pki");
    let read = |name: &str| std::fs::read(pki.join(name)).ok();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read("ca.crt")?))
        .identity(etcd_client::Identity::from_pem(
            read("client.crt")?,
            read("client.key")?,
        ));
    Some(etcd_client::ConnectOptions::new().with_tls(tls))
}
