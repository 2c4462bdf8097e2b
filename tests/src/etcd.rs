//! A real etcd server of a chosen version on free loopback ports, in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

use crate::process::{SpawnError, TestProcess};
use crate::tools::{self, EtcdVersion, MissingTool};

/// How long a started etcd may take to answer before the start counts as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a start is retried when a port chosen as free was taken meanwhile.
const START_ATTEMPTS: usize = 3;

/// Starting an etcd for a test failed.
#[derive(Debug, thiserror::Error)]
pub enum StartEtcdError {
    /// The binary is not installed.
    #[error(transparent)]
    Missing(#[from] MissingTool),
    /// The temporary directory or ports could not be set up.
    #[error("prepare etcd directory or ports")]
    Prepare(#[from] std::io::Error),
    /// The process could not be started.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The process exited before it became ready.
    #[error("etcd {version} exited during start ({status}); log tail:\n{log}")]
    Exited {
        version: EtcdVersion,
        status: String,
        log: String,
    },
    /// The process runs but did not answer in time.
    #[error("etcd {version} did not answer within {timeout:?}: {last_error}; log tail:\n{log}")]
    NotReady {
        version: EtcdVersion,
        timeout: Duration,
        last_error: String,
        log: String,
    },
}

/// A single-member etcd cluster owned by a test. Dropping it kills the process and deletes its data.
#[derive(Debug)]
pub struct TestEtcd {
    version: EtcdVersion,
    client_url: String,
    peer_url: String,
    process: TestProcess,
    // Declared last: dropped after the process is gone.
    dir: tempfile::TempDir,
}

impl TestEtcd {
    /// Starts etcd `version` and waits until it serves requests. It runs without fsync (3.5 and
    /// later): tests need no durability, and this keeps them fast on slow disks.
    pub async fn start(version: EtcdVersion) -> Result<Self, StartEtcdError> {
        Self::start_with(version, false).await
    }

    /// Starts etcd `version` with fsync, as etcd runs in production: a baseline for benches.
    pub async fn start_durable(version: EtcdVersion) -> Result<Self, StartEtcdError> {
        Self::start_with(version, true).await
    }

    async fn start_with(version: EtcdVersion, fsync: bool) -> Result<Self, StartEtcdError> {
        let binary = tools::etcd(version)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(version, &binary, fsync).await {
                Err(StartEtcdError::Exited { log, .. })
                    if attempt < START_ATTEMPTS && log.contains("address already in use") =>
                {
                    tracing::info!(%version, attempt, "port taken meanwhile; retrying with new ports");
                }
                other => return other,
            }
        }
    }

    async fn start_once(version: EtcdVersion, binary: &Path, fsync: bool) -> Result<Self, StartEtcdError> {
        let dir = tempfile::Builder::new().prefix("etcd-test-").tempdir()?;
        let ports = crate::ports::free_ports(2)?;
        let client_url = format!("http://127.0.0.1:{}", ports[0]);
        let peer_url = format!("http://127.0.0.1:{}", ports[1]);
        let mut cmd = Command::new(binary);
        cmd.arg("--name=test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            .arg("--initial-cluster-state=new")
            // Tests do not need fsync durability; this keeps them fast on slow disks.
            .arg("--unsafe-no-fsync")
            .env_remove("ETCDCTL_API");
        // 3.4 has no --unsafe-no-fsync; a durable etcd goes without it.
        if fsync || version == EtcdVersion::V3_4_23 {
            cmd = strip_arg(cmd, "--unsafe-no-fsync");
        }
        let process = TestProcess::spawn(format!("etcd {version}"), cmd, &dir.path().join("etcd.log"))?;
        let mut etcd = Self {
            version,
            client_url,
            peer_url,
            process,
            dir,
        };
        etcd.wait_ready().await?;
        Ok(etcd)
    }

    async fn wait_ready(&mut self) -> Result<(), StartEtcdError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_error = String::from("no attempt yet");
        while Instant::now() < deadline {
            if let Some(status) = self.process.exited() {
                return Err(StartEtcdError::Exited {
                    version: self.version,
                    status: status.to_string(),
                    log: self.process.log_tail(4000),
                });
            }
            match self.client().await {
                Ok(mut client) => match client.status().await {
                    Ok(_) => return Ok(()),
                    Err(e) => last_error = e.to_string(),
                },
                Err(e) => last_error = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(StartEtcdError::NotReady {
            version: self.version,
            timeout: READY_TIMEOUT,
            last_error,
            log: self.process.log_tail(4000),
        })
    }

    /// The version running.
    pub fn version(&self) -> EtcdVersion {
        self.version
    }

    /// The client URL, e.g. `http://127.0.0.1:34567`.
    pub fn endpoint(&self) -> &str {
        &self.client_url
    }

    /// The peer URL.
    pub fn peer_url(&self) -> &str {
        &self.peer_url
    }

    /// The etcd data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The pid of the etcd process.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// A connected etcd-client.
    pub async fn client(&self) -> Result<Client, etcd_client::Error> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        Client::connect([self.client_url.as_str()], Some(options)).await
    }

    /// An `etcdctl` command of the same version, pointed at this server (v3 API).
    pub fn etcdctl(&self) -> Result<Command, MissingTool> {
        let mut cmd = Command::new(tools::etcdctl(self.version)?);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.client_url));
        Ok(cmd)
    }
}

fn strip_arg(cmd: Command, arg: &str) -> Command {
    let mut out = Command::new(cmd.get_program());
    out.args(cmd.get_args().filter(|a| *a != arg));
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => out.env(k, v),
            None => out.env_remove(k),
        };
    }
    out
}
