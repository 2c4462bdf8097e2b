//! The backing etcd of local mode: one etcd process on free loopback ports, its data, log, ports,
//! pid and certificates under `DIR/etcd/`, owned by a guard that stops it (SIGTERM, then SIGKILL).
//! It serves mutual TLS on its client and peer ports (certificates of its own CA, see
//! [`super::etcd_pki`]), plain HTTP on loopback only for `/metrics` and `/health`, and plain gRPC
//! on a Unix socket in its private directory, `DIR/etcd/client.sock:0`, for the API server's
//! storage (see [`connect`]).
//!
//! Finding the binary, choosing ports and spotting a stale etcd of a crashed run are hand-written
//! (a few lines each over `std` and `/proc`); no crate among the dependencies does them.

use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use serde::{Deserialize, Serialize};

use etcd_operator_apiserver::files;
use etcd_operator_apiserver::pki::PkiError;
use etcd_operator_controller::tls::member::ClientTls;

use super::etcd_pki;

/// Environment variable naming the etcd binary to use.
pub const ETCD_BINARY_ENV: &str = "ETCD_OPERATOR_ETCD";
/// Environment variable overriding the tools directory (default: `.tools/` of the workspace).
pub const TOOLS_DIR_ENV: &str = "ETCD_OPERATOR_TOOLS";
/// The etcd release local mode runs its backing etcd on (one `make tools-etcd` installs): the
/// newest 3.5 patch pinned, well past the 3.5.0–3.5.2 releases with the data-inconsistency bug.
/// A state directory written by an older 3.5 patch opens unchanged.
pub const PREFERRED_ETCD_VERSION: &str = "3.5.34";

/// The name of the one member (`--name`).
const MEMBER_NAME: &str = "backing";
/// How many bytes of the etcd log an error quotes.
const LOG_TAIL_BYTES: u64 = 4000;
/// How often a start is retried when a port chosen as free was taken meanwhile.
const START_ATTEMPTS: usize = 3;
/// The file name of the Unix socket etcd serves its clients on, in its directory. etcd parses
/// a `unix://` listen URL as `host:port` and binds the socket at the host and port as given.
const SOCKET_NAME: &str = "client.sock:0";
/// The longest path a Unix socket can have on Linux (`sun_path` holds 108 bytes with the NUL).
const SOCKET_PATH_MAX: usize = 107;

/// Finding, starting or stopping the backing etcd failed.
#[derive(Debug, thiserror::Error)]
pub enum BackingEtcdError {
    /// No etcd binary was found.
    #[error(
        "find the etcd binary: none found (looked at {}); run `make tools-etcd` to install etcd {PREFERRED_ETCD_VERSION} into .tools/, or pass --etcd-binary PATH, or set {ETCD_BINARY_ENV}",
        looked_at.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    BinaryNotFound { looked_at: Vec<PathBuf> },
    /// The binary given explicitly does not exist.
    #[error("find the etcd binary: {} (from --etcd-binary) is not a file; run `make tools-etcd` or fix the path", path.display())]
    ExplicitBinaryMissing { path: PathBuf },
    /// A state file or directory could not be used.
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// No free loopback ports could be found.
    #[error("choose free loopback ports for etcd")]
    Ports(#[source] std::io::Error),
    /// A stale etcd of an earlier run holds the data directory and would not stop.
    #[error("stop stale etcd (pid {pid}) still using {}: it did not exit after SIGKILL", data_dir.display())]
    StaleProcess { pid: u32, data_dir: PathBuf },
    /// A signal could not be sent.
    #[error("send {signal} to etcd (pid {pid})")]
    Signal {
        signal: &'static str,
        pid: u32,
        #[source]
        source: nix::Error,
    },
    /// The process could not be executed.
    #[error("spawn etcd {}", binary.display())]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The process exited before it served.
    #[error("start etcd: it exited ({status}) before serving; log {} ends with:\n{log_tail}", log.display())]
    Exited {
        status: String,
        log: PathBuf,
        log_tail: String,
    },
    /// The certificates could not be loaded, checked or issued.
    #[error("set up the backing etcd's certificates")]
    Pki(#[source] PkiError),
    /// The member's peer URL (kept in etcd's data) could not be brought up to date.
    #[error("update the backing etcd's peer URL to {peer_url}")]
    UpdatePeerUrl {
        peer_url: String,
        #[source]
        source: etcd_client::Error,
    },
    /// The process runs but did not answer in time.
    #[error("start etcd: no answer at {endpoint} within {timeout:?} ({last_error}); log {} ends with:\n{log_tail}", log.display())]
    NotReady {
        endpoint: String,
        timeout: Duration,
        last_error: String,
        log: PathBuf,
        log_tail: String,
    },
    /// The binary is a release known to lose acknowledged writes as a single member.
    #[error(
        "start etcd: {} is etcd {version}, which the backing etcd must not run: {issues}; run `make tools-etcd` to install etcd {PREFERRED_ETCD_VERSION} into .tools/, or pass --etcd-binary PATH of a fixed release",
        binary.display()
    )]
    UnsafeRelease {
        binary: PathBuf,
        version: String,
        issues: String,
    },
    /// Waiting for the process to exit failed.
    #[error("stop etcd (pid {pid})")]
    Wait {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// Where to look for the etcd binary, in order: the explicit path, `$ETCD_OPERATOR_ETCD`, the
/// preferred release in a tools directory (`$ETCD_OPERATOR_TOOLS`, else every `.tools/` found
/// walking up from each start directory), then `etcd` on `PATH`.
#[derive(Debug, Clone, Default)]
pub struct EtcdSearch {
    /// `--etcd-binary`: when given, it is the only candidate and must exist.
    pub explicit: Option<PathBuf>,
    /// The value of `$ETCD_OPERATOR_ETCD`.
    pub env_binary: Option<PathBuf>,
    /// The value of `$ETCD_OPERATOR_TOOLS`.
    pub tools_dir: Option<PathBuf>,
    /// Directories to walk up from looking for `.tools/` (the current directory, the executable's).
    pub start_dirs: Vec<PathBuf>,
    /// The value of `$PATH`.
    pub path_var: Option<OsString>,
}

impl EtcdSearch {
    /// The search as this process's environment sets it up.
    pub fn from_environment(explicit: Option<PathBuf>) -> Self {
        let mut start_dirs = Vec::new();
        if let Ok(cwd) = std::env::current_dir() {
            start_dirs.push(cwd);
        }
        if let Some(exe_dir) = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(Path::to_path_buf))
        {
            start_dirs.push(exe_dir);
        }
        Self {
            explicit,
            env_binary: std::env::var_os(ETCD_BINARY_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            tools_dir: std::env::var_os(TOOLS_DIR_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            start_dirs,
            path_var: std::env::var_os("PATH"),
        }
    }

    /// The first existing candidate.
    pub fn find(&self) -> Result<PathBuf, BackingEtcdError> {
        if let Some(path) = &self.explicit {
            return if path.is_file() {
                Ok(path.clone())
            } else {
                Err(BackingEtcdError::ExplicitBinaryMissing { path: path.clone() })
            };
        }
        let relative = Path::new("etcd").join(PREFERRED_ETCD_VERSION).join("etcd");
        let mut candidates: Vec<PathBuf> = self.env_binary.iter().cloned().collect();
        candidates.extend(self.tools_dir.iter().map(|d| d.join(&relative)));
        for start in &self.start_dirs {
            candidates.extend(start.ancestors().map(|dir| dir.join(".tools").join(&relative)));
        }
        if let Some(path_var) = &self.path_var {
            candidates.extend(std::env::split_paths(path_var).map(|dir| dir.join("etcd")));
        }
        let mut looked_at = Vec::new();
        for candidate in candidates {
            if candidate.is_file() {
                return Ok(candidate);
            }
            if !looked_at.contains(&candidate) {
                looked_at.push(candidate);
            }
        }
        Err(BackingEtcdError::BinaryNotFound { looked_at })
    }
}

/// How to run the backing etcd.
#[derive(Debug, Clone)]
pub struct BackingEtcdOptions {
    /// Its directory (`DIR/etcd`): `data/`, `etcd.log`, `ports.json`, `etcd.pid`.
    pub dir: PathBuf,
    /// The etcd binary.
    pub binary: PathBuf,
    /// `--quota-backend-bytes`: the database size at which etcd refuses writes (alarm NOSPACE).
    pub quota_backend_bytes: u64,
    /// `--max-request-bytes`: the largest write; above the 3 MiB request-body limit of the API
    /// server so that every accepted object can be stored.
    pub max_request_bytes: u64,
    /// How long etcd may take to serve after start (it is probed every 100 ms meanwhile, with a
    /// progress line every [`Self::progress_interval`]). Generous: a loaded machine may take
    /// minutes to start etcd on a large data directory.
    pub ready_timeout: Duration,
    /// How often a start that is taking long logs that it is still waiting.
    pub progress_interval: Duration,
    /// How long etcd may take to exit after SIGTERM before it gets SIGKILL.
    pub stop_timeout: Duration,
    /// Further environment for the etcd process (tests mark their processes this way).
    pub extra_env: Vec<(OsString, OsString)>,
    /// How often the supervisor checks the certificates while etcd runs, and issues again in
    /// place what expires within 30 days (etcd reads its certificate files at each new TLS
    /// connection, so it serves the new ones without a restart).
    pub certificate_check_interval: Duration,
}

impl BackingEtcdOptions {
    /// Defaults: 4 GiB quota, 4 MiB requests, 5 minutes to start (progress every 10 s), 5 s to
    /// stop, the certificates checked every 12 hours while etcd runs.
    pub fn new(dir: PathBuf, binary: PathBuf) -> Self {
        Self {
            dir,
            binary,
            quota_backend_bytes: 4 * 1024 * 1024 * 1024,
            max_request_bytes: 4 * 1024 * 1024,
            ready_timeout: Duration::from_secs(300),
            progress_interval: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(5),
            extra_env: Vec::new(),
            certificate_check_interval: Duration::from_secs(12 * 3600),
        }
    }
}

/// The ports of the backing etcd, kept in `ports.json` so that a restart reuses them when free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdPorts {
    /// Client port (HTTPS, client certificate required).
    pub client: u16,
    /// Peer port (HTTPS, peer certificate required).
    pub peer: u16,
    /// Metrics port: plain HTTP on loopback for `/metrics` and `/health`. 0 in a `ports.json` of
    /// a release that had none (a free one is chosen then).
    #[serde(default)]
    pub metrics: u16,
}

/// A running backing etcd. [`BackingEtcd::shutdown`] stops it; dropping the guard does too
/// (blocking the thread for up to the stop timeout), also on panic.
#[derive(Debug)]
pub struct BackingEtcd {
    child: Option<tokio::process::Child>,
    pid: u32,
    ports: EtcdPorts,
    endpoint: String,
    socket: Option<PathBuf>,
    tls: ClientTls,
    dir: PathBuf,
    stop_timeout: Duration,
}

impl BackingEtcd {
    /// Starts etcd and waits until it answers. A stale etcd of an earlier run still using the
    /// same data directory is stopped first.
    pub async fn start(options: BackingEtcdOptions) -> Result<Self, BackingEtcdError> {
        files::create_private_dir(&options.dir).map_err(|source| BackingEtcdError::Io {
            action: "create etcd directory",
            path: options.dir.clone(),
            source,
        })?;
        let dir = std::fs::canonicalize(&options.dir).map_err(|source| BackingEtcdError::Io {
            action: "resolve etcd directory",
            path: options.dir.clone(),
            source,
        })?;
        let options = BackingEtcdOptions { dir, ..options };
        stop_stale(&options.dir).await?;
        if !data_dir(&options.dir).join("member").exists() {
            Self::bootstrap(&options).await?;
        }
        Self::start_in(&options, &data_dir(&options.dir)).await
    }

    /// Creates the data directory: etcd bootstraps in `data.bootstrap/`, which becomes `data/`
    /// once etcd has served from it. An etcd stopped during its very first start leaves a data
    /// directory without its own membership that never elects a leader; this way such a
    /// directory is never the one reused.
    async fn bootstrap(options: &BackingEtcdOptions) -> Result<(), BackingEtcdError> {
        let io = |action, path: &Path| {
            let path = path.to_path_buf();
            move |source| BackingEtcdError::Io { action, path, source }
        };
        let staging = bootstrap_dir(&options.dir);
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(io("remove unfinished bootstrap", &staging))?;
        }
        tracing::info!(data_dir = %data_dir(&options.dir).display(), "bootstrapping a new backing etcd");
        Self::start_in(options, &staging).await?.shutdown().await?;
        let data = data_dir(&options.dir);
        match std::fs::remove_dir(&data) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(io("remove empty data directory", &data)(source)),
        }
        std::fs::rename(&staging, &data).map_err(io("move bootstrapped data to", &data))
    }

    async fn start_in(options: &BackingEtcdOptions, data: &Path) -> Result<Self, BackingEtcdError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ports = choose_ports(&options.dir, attempt > 1)?;
            match Self::start_once(options, data, ports).await {
                // etcd exited at start: if one of its ports cannot be bound now that it is gone,
                // another process took it after it was chosen (told by the bind, not etcd's log).
                Err(BackingEtcdError::Exited { .. }) if attempt < START_ATTEMPTS && ports_taken(&ports) => {
                    tracing::info!(
                        attempt,
                        "a port chosen for etcd was taken meanwhile; retrying with new ports"
                    );
                }
                other => return other,
            }
        }
    }

    async fn start_once(
        options: &BackingEtcdOptions,
        data: &Path,
        ports: EtcdPorts,
    ) -> Result<Self, BackingEtcdError> {
        let dir = &options.dir;
        // Checked at every start: what expires within 30 days or no longer chains is issued again.
        let pki = etcd_pki::ensure(&pki_dir(dir)).map_err(BackingEtcdError::Pki)?;
        let endpoint = format!("https://127.0.0.1:{}", ports.client);
        let socket = client_socket(dir);
        let listen = match &socket {
            // Relative to etcd's working directory, `dir`, and in the `host:port` form that 3.4.23,
            // 3.5.0–3.5.34 and 3.6.15 all parse (3.5.1 refuses `unix:///absolute/path`).
            Some(_) => format!("{endpoint},unix://{SOCKET_NAME}"),
            None => endpoint.clone(),
        };
        let peer_url = format!("https://127.0.0.1:{}", ports.peer);
        let metrics_url = format!("http://127.0.0.1:{}", ports.metrics);
        let (cert, key) = pki.pair_paths("server");
        let (peer_cert, peer_key) = pki.pair_paths("peer");
        let (ca, _) = pki.pair_paths("ca");
        let log_path = dir.join("etcd.log");
        let log = open_log(&log_path)?;
        let log_err = log.try_clone().map_err(|source| BackingEtcdError::Io {
            action: "open etcd log",
            path: log_path.clone(),
            source,
        })?;
        let mut cmd = tokio::process::Command::new(&options.binary);
        cmd.arg(format!("--name={MEMBER_NAME}"))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={listen}"))
            .arg(format!("--advertise-client-urls={endpoint}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={MEMBER_NAME}={peer_url}"))
            .arg(format!("--listen-metrics-urls={metrics_url}"))
            .arg(format!("--cert-file={}", cert.display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--trusted-ca-file={}", ca.display()))
            .arg("--client-cert-auth=true")
            .arg(format!("--peer-cert-file={}", peer_cert.display()))
            .arg(format!("--peer-key-file={}", peer_key.display()))
            .arg(format!("--peer-trusted-ca-file={}", ca.display()))
            .arg("--peer-client-cert-auth=true")
            .arg("--initial-cluster-state=new")
            .arg("--initial-cluster-token=etcd-operator-local")
            .arg(format!("--quota-backend-bytes={}", options.quota_backend_bytes))
            .arg(format!("--max-request-bytes={}", options.max_request_bytes))
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true);
        // etcd reads every `ETCD_*` variable as a flag and refuses to start when one conflicts
        // with a command-line flag; keep only this project's own (`ETCD_OPERATOR_*`).
        for (key, _) in std::env::vars_os() {
            let key_str = key.to_string_lossy();
            if key_str.starts_with("ETCD_") && !key_str.starts_with("ETCD_OPERATOR_") {
                cmd.env_remove(&key);
            }
        }
        cmd.envs(options.extra_env.iter().map(|(k, v)| (k, v)));
        let child = cmd.spawn().map_err(|source| BackingEtcdError::Spawn {
            binary: options.binary.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or_default();
        let mut etcd = Self {
            child: Some(child),
            pid,
            ports,
            endpoint,
            socket,
            tls: pki.client_tls(),
            dir: dir.clone(),
            stop_timeout: options.stop_timeout,
        };
        let pid_path = dir.join("etcd.pid");
        files::write_atomic(&pid_path, format!("{pid}\n").as_bytes(), files::PUBLIC).map_err(|source| {
            BackingEtcdError::Io {
                action: "write",
                path: pid_path,
                source,
            }
        })?;
        tracing::info!(pid, endpoint = %etcd.endpoint, binary = %options.binary.display(), "started backing etcd");
        let version = etcd
            .wait_ready(options.ready_timeout, options.progress_interval)
            .await?;
        if let Err(refused) = check_release(&options.binary, &version) {
            // Asked of the serving process (no extra exec per start); stopped before any write.
            etcd.shutdown().await?;
            return Err(refused);
        }
        etcd.update_peer_url(&peer_url).await?;
        Ok(etcd)
    }

    /// Makes the member's peer URL, which etcd keeps in its data, the one it listens on now: a
    /// data directory of a release that served plain HTTP (or of a start on other ports) still
    /// advertises the old one. A single member never dials its peer URL, so etcd serves either
    /// way; this keeps the data truthful for etcdctl and a later second member.
    async fn update_peer_url(&self, peer_url: &str) -> Result<(), BackingEtcdError> {
        let err = |source| BackingEtcdError::UpdatePeerUrl {
            peer_url: peer_url.to_owned(),
            source,
        };
        let mut client = self.connect_with(probe_options(&self.tls)).await.map_err(err)?;
        let members = client.member_list().await.map_err(err)?;
        for member in members.members() {
            if member.name() != MEMBER_NAME || member.peer_urls() == [peer_url] {
                continue;
            }
            tracing::info!(
                member = member.id(),
                old = ?member.peer_urls(),
                new = %peer_url,
                "updating the backing etcd's peer URL kept in its data"
            );
            client
                .member_update(member.id(), vec![peer_url.to_owned()])
                .await
                .map_err(err)?;
        }
        Ok(())
    }

    /// Starts etcd again on its data directory and on exactly `ports` (its clients know only
    /// that endpoint), after it exited: what the supervisor does. Waits until it answers.
    pub(crate) async fn restart(
        options: &BackingEtcdOptions,
        ports: EtcdPorts,
    ) -> Result<Self, BackingEtcdError> {
        stop_stale(&options.dir).await?;
        Self::start_once(options, &data_dir(&options.dir), ports).await
    }

    /// Waits until the process exits and reaps it; returns its exit status. The guard then owns
    /// no process.
    pub(crate) async fn wait_exit(&mut self) -> Result<std::process::ExitStatus, BackingEtcdError> {
        let pid = self.pid;
        let Some(child) = self.child.as_mut() else {
            return Err(BackingEtcdError::Wait {
                pid,
                source: std::io::Error::other("the process was already reaped"),
            });
        };
        let status = child
            .wait()
            .await
            .map_err(|source| BackingEtcdError::Wait { pid, source })?;
        self.child = None;
        self.remove_pid_file();
        Ok(status)
    }

    /// Waits until etcd answers a status request; returns the release it reports.
    async fn wait_ready(
        &mut self,
        timeout: Duration,
        progress: Duration,
    ) -> Result<String, BackingEtcdError> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut next_progress = start + progress;
        let mut last_error = String::from("no attempt yet");
        let probe = probe_options(&self.tls);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(BackingEtcdError::Exited {
                    status: status.to_string(),
                    log: self.log_path(),
                    log_tail: log_tail(&self.log_path()),
                });
            }
            match Client::connect([self.endpoint.as_str()], Some(probe.clone())).await {
                Ok(mut client) => match client.status().await {
                    Ok(status) => {
                        tracing::info!(endpoint = %self.endpoint, version = status.version(), "backing etcd is serving");
                        return Ok(status.version().to_owned());
                    }
                    Err(e) => last_error = e.to_string(),
                },
                Err(e) => last_error = e.to_string(),
            }
            if Instant::now() >= next_progress {
                next_progress += progress;
                tracing::warn!(
                    pid = self.pid,
                    endpoint = %self.endpoint,
                    waited = ?start.elapsed(),
                    limit = ?timeout,
                    %last_error,
                    log = %self.log_path().display(),
                    "the backing etcd is not answering yet; still waiting"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(BackingEtcdError::NotReady {
            endpoint: self.endpoint.clone(),
            timeout,
            last_error,
            log: self.log_path(),
            log_tail: log_tail(&self.log_path()),
        })
    }

    /// The client URL, e.g. `https://127.0.0.1:23790`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The plain-HTTP URL of `/metrics` and `/health`, e.g. `http://127.0.0.1:23792`.
    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.metrics)
    }

    /// The storage's TLS identity toward this etcd (its CA and the client certificate).
    pub fn client_tls(&self) -> &ClientTls {
        &self.tls
    }

    /// The Unix socket etcd also serves its clients on (plain gRPC); `None` when the directory's
    /// path is too long for one, and the storage uses the TLS endpoint.
    pub fn client_socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its ports.
    pub fn ports(&self) -> EtcdPorts {
        self.ports
    }

    /// The etcd data directory.
    pub fn data_dir(&self) -> PathBuf {
        data_dir(&self.dir)
    }

    /// The etcd log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// A client for the API server's storage: no per-request timeout (watches are long), HTTP/2
    /// keep-alive so a dead etcd is noticed; over the Unix socket when there is one.
    pub async fn connect(&self) -> Result<Client, etcd_client::Error> {
        connect(&self.endpoint, self.socket.as_deref(), &self.tls).await
    }

    async fn connect_with(&self, options: ConnectOptions) -> Result<Client, etcd_client::Error> {
        Client::connect([self.endpoint.as_str()], Some(options)).await
    }

    /// Stops etcd: SIGTERM, then SIGKILL after the stop timeout; returns when it has exited.
    pub async fn shutdown(mut self) -> Result<(), BackingEtcdError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = self.pid;
        let wait_err = |source| BackingEtcdError::Wait { pid, source };
        if child.try_wait().map_err(wait_err)?.is_none() {
            signal(pid, nix::sys::signal::Signal::SIGTERM)?;
            match tokio::time::timeout(self.stop_timeout, child.wait()).await {
                Ok(status) => {
                    let status = status.map_err(wait_err)?;
                    tracing::info!(pid, %status, "backing etcd stopped");
                }
                Err(_) => {
                    tracing::warn!(pid, timeout = ?self.stop_timeout, "backing etcd ignored SIGTERM; killing it");
                    child.kill().await.map_err(wait_err)?;
                }
            }
        }
        self.remove_pid_file();
        Ok(())
    }

    fn remove_pid_file(&self) {
        let path = self.dir.join("etcd.pid");
        if let Err(error) = std::fs::remove_file(&path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %etcd_operator_api::report::Chain(&error), "remove etcd pid file");
        }
    }
}

impl Drop for BackingEtcd {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            self.remove_pid_file();
            return;
        }
        // Synchronous: a drop cannot await. Waiting here makes sure etcd is gone (and its data
        // directory unlocked) when the guard is, which a restart on the same directory relies on.
        let pid = self.pid;
        if let Err(error) = signal(pid, nix::sys::signal::Signal::SIGTERM) {
            tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "stop backing etcd on drop");
        }
        if !poll_exit(&mut child, self.stop_timeout) {
            tracing::warn!(pid, "backing etcd ignored SIGTERM; killing it");
            if let Err(error) = child.start_kill() {
                tracing::warn!(pid, error = %etcd_operator_api::report::Chain(&error), "kill backing etcd");
            }
            poll_exit(&mut child, Duration::from_secs(2));
        }
        self.remove_pid_file();
    }
}

/// Polls a child until it exits or `timeout` passes; true when it exited.
fn poll_exit(child: &mut tokio::process::Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// How long the storage's client waits for a connection to etcd.
const STORAGE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The storage client's HTTP/2 keep-alive: a ping this often, etcd dead when one goes unanswered
/// this long.
const STORAGE_KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(5));

/// A client for the API server's storage: no per-request timeout (watches are long), HTTP/2
/// keep-alive so a dead etcd is noticed. Its channel reconnects by itself when etcd comes back.
///
/// With `socket`, over etcd's Unix socket in the private etcd directory, in plain gRPC: every
/// request and every watch event of the storage takes this path; over TLS and TCP its client
/// was a sixth of the server's CPU per write, about half of it TLS and socket calls
/// (docs/performance.md, change 32). The directory is
/// the process owner's alone (mode 0700), as the client key that TLS would present is. Otherwise
/// at `endpoint` over mutual TLS, presenting `tls`.
pub async fn connect(
    endpoint: &str,
    socket: Option<&Path>,
    tls: &ClientTls,
) -> Result<Client, etcd_client::Error> {
    let (interval, timeout) = STORAGE_KEEP_ALIVE;
    let Some(socket) = socket else {
        let options = ConnectOptions::new()
            .with_connect_timeout(STORAGE_CONNECT_TIMEOUT)
            .with_keep_alive(interval, timeout)
            .with_keep_alive_while_idle(true)
            .with_tls(tls.options());
        return Client::connect([endpoint], Some(options)).await;
    };
    let path = socket.to_path_buf();
    // The URI is not dialled: the connector below opens the socket; gRPC needs an authority.
    let channel = tonic::transport::Endpoint::from_static("http://backing-etcd.local")
        .connect_timeout(STORAGE_CONNECT_TIMEOUT)
        .http2_keep_alive_interval(interval)
        .keep_alive_timeout(timeout)
        .keep_alive_while_idle(true)
        .connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }));
    Client::from_channel(etcd_client::Channel::Tonic(channel), None).await
}

/// The Unix socket etcd serves its clients on beside its TLS port, `DIR/etcd/client.sock:0`;
/// `None` when that path is longer than a socket's path can be (then only TLS).
fn client_socket(dir: &Path) -> Option<PathBuf> {
    let path = dir.join(SOCKET_NAME);
    (path.as_os_str().len() <= SOCKET_PATH_MAX).then_some(path)
}

/// Options of the short-lived clients that check etcd answers (start-up wait, peer URL).
fn probe_options(tls: &ClientTls) -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2))
        .with_tls(tls.options())
}

/// Refuses a release that can lose writes it acknowledged when it crashes as a single member
/// (the backing etcd always is one), or that can corrupt its data under load: the API server
/// answers a write once etcd did, so such a loss would be an acknowledged write lost. A version
/// this code cannot parse is let through with a warning (a newer major or minor).
fn check_release(binary: &Path, version: &str) -> Result<(), BackingEtcdError> {
    let parsed = match etcd_operator_api::versions::parse(version) {
        Ok(parsed) => parsed,
        Err(reason) => {
            tracing::warn!(version, %reason, "cannot tell whether this etcd release has known defects");
            return Ok(());
        }
    };
    let issues = etcd_operator_api::versions::known_issues(&parsed, 1);
    if issues.is_empty() {
        return Ok(());
    }
    Err(BackingEtcdError::UnsafeRelease {
        binary: binary.to_path_buf(),
        version: version.to_owned(),
        issues: issues.join("; "),
    })
}

fn data_dir(dir: &Path) -> PathBuf {
    dir.join("data")
}

/// `DIR/etcd/pki`: the backing etcd's certificates.
pub fn pki_dir(dir: &Path) -> PathBuf {
    dir.join("pki")
}

fn bootstrap_dir(dir: &Path) -> PathBuf {
    dir.join("data.bootstrap")
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) -> Result<(), BackingEtcdError> {
    let raw = i32::try_from(pid).map_err(|_| BackingEtcdError::Signal {
        signal: sig.as_str(),
        pid,
        source: nix::Error::EINVAL,
    })?;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), sig) {
        Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
        Err(source) => Err(BackingEtcdError::Signal {
            signal: sig.as_str(),
            pid,
            source,
        }),
    }
}

fn open_log(path: &Path) -> Result<std::fs::File, BackingEtcdError> {
    let io = |source| BackingEtcdError::Io {
        action: "open etcd log",
        path: path.to_path_buf(),
        source,
    };
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    writeln!(
        log,
        "=== etcd-operator: starting the backing etcd at {} ===",
        jiff::Timestamp::now()
    )
    .map_err(io)?;
    Ok(log)
}

/// The last few KiB of the log, from the last start marker on when it is within them.
fn log_tail(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => match text.rfind("=== etcd-operator: starting") {
            Some(start) => text[start..].to_owned(),
            None => text,
        },
        Err(error) => format!("(log unreadable: {error})"),
    }
}

/// The ports from `ports.json` when they are free now (and `fresh` is false; a missing metrics
/// port, from a release that had none, is chosen anew), else new free ones, stored for the next
/// start.
fn choose_ports(dir: &Path, fresh: bool) -> Result<EtcdPorts, BackingEtcdError> {
    let path = dir.join("ports.json");
    let stored = files::read_optional(&path)
        .ok()
        .flatten()
        .and_then(|text| serde_json::from_str::<EtcdPorts>(&text).ok());
    let ports = match stored {
        Some(ports)
            if !fresh
                && ports.client != ports.peer
                && port_free(ports.client)
                && port_free(ports.peer)
                && (ports.metrics == 0
                    || (port_free(ports.metrics)
                        && ports.metrics != ports.client
                        && ports.metrics != ports.peer)) =>
        {
            if ports.metrics != 0 {
                return Ok(ports);
            }
            let metrics = free_ports::<1>(&[ports.client, ports.peer])?[0];
            tracing::info!(metrics, "the stored etcd ports have no metrics port; adding one");
            EtcdPorts { metrics, ..ports }
        }
        _ => {
            let [client, peer, metrics] = free_ports::<3>(&[])?;
            let ports = EtcdPorts {
                client,
                peer,
                metrics,
            };
            if stored.is_some() {
                tracing::info!(?stored, new = ?ports, "stored etcd ports are taken; using new ones");
            }
            ports
        }
    };
    let json = serde_json::to_vec(&ports).unwrap_or_default();
    files::write_atomic(&path, &json, files::PUBLIC).map_err(|source| BackingEtcdError::Io {
        action: "write",
        path,
        source,
    })?;
    Ok(ports)
}

/// `N` distinct free loopback ports, none of them in `besides`. The listeners are held until all
/// are chosen, so they differ.
fn free_ports<const N: usize>(besides: &[u16]) -> Result<[u16; N], BackingEtcdError> {
    let mut held = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    let mut found = 0;
    while found < N {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(BackingEtcdError::Ports)?;
        let port = listener.local_addr().map_err(BackingEtcdError::Ports)?.port();
        held.push(listener);
        if besides.contains(&port) {
            if held.len() > N + 16 {
                return Err(BackingEtcdError::Ports(std::io::Error::other(
                    "the system keeps handing out ports already in use",
                )));
            }
            continue;
        }
        ports[found] = port;
        found += 1;
    }
    Ok(ports)
}

/// Whether one of `ports` is bound by another process: binding it fails with `AddrInUse`.
fn ports_taken(ports: &EtcdPorts) -> bool {
    [ports.client, ports.peer, ports.metrics]
        .into_iter()
        .filter(|port| *port != 0)
        .any(|port| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, port))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse)
        })
}

fn port_free(port: u16) -> bool {
    port != 0 && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Stops every etcd still serving `dir`'s data directory (or its bootstrap directory): the pid in
/// `etcd.pid` and any other process whose command line names it (the pid file may be gone).
async fn stop_stale(dir: &Path) -> Result<(), BackingEtcdError> {
    let data = data_dir(dir);
    let staging = bootstrap_dir(dir);
    let mut pids: Vec<u32> = files::read_optional(&dir.join("etcd.pid"))
        .ok()
        .flatten()
        .and_then(|text| text.trim().parse().ok())
        .into_iter()
        .collect();
    pids.extend(proc_pids());
    pids.sort_unstable();
    pids.dedup();
    let me = std::process::id();
    for pid in pids.into_iter().filter(|pid| *pid != me) {
        if !is_etcd_for(pid, &data) && !is_etcd_for(pid, &staging) {
            continue;
        }
        tracing::warn!(pid, data_dir = %data.display(), "a stale etcd of an earlier run uses the data directory; stopping it");
        signal(pid, nix::sys::signal::Signal::SIGTERM)?;
        if wait_gone(pid, Duration::from_secs(10)).await {
            continue;
        }
        signal(pid, nix::sys::signal::Signal::SIGKILL)?;
        if !wait_gone(pid, Duration::from_secs(5)).await {
            return Err(BackingEtcdError::StaleProcess { pid, data_dir: data });
        }
    }
    Ok(())
}

fn proc_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` is a live etcd whose `--data-dir` is `data`.
fn is_etcd_for(pid: u32, data: &Path) -> bool {
    if !alive(pid) {
        return false;
    }
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    let is_etcd = args
        .first()
        .and_then(|arg0| Path::new(arg0).file_name())
        .is_some_and(|name| name.to_string_lossy().starts_with("etcd"));
    let wanted = format!("--data-dir={}", data.display());
    is_etcd && args.contains(&wanted)
}

/// Whether `pid` runs (a zombie has exited; its parent will reap it).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    !alive(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(dir: &Path) -> EtcdPorts {
        serde_json::from_str(&std::fs::read_to_string(dir.join("ports.json")).unwrap()).unwrap()
    }

    #[test]
    fn releases_that_lose_acknowledged_writes_as_a_single_member_are_refused() {
        let binary = Path::new("/opt/etcd");
        for refused in ["3.5.1", "3.5.4", "3.4.20"] {
            let err = check_release(binary, refused).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, BackingEtcdError::UnsafeRelease { .. })
                    && text.contains("14370")
                    && text.contains(refused)
                    && text.contains("make tools-etcd"),
                "{text}"
            );
        }
        // 3.5.0-3.5.2 are named for both defects.
        let text = check_release(binary, "3.5.2").unwrap_err().to_string();
        assert!(text.contains("13766") && text.contains("14370"), "{text}");
        for accepted in [
            "3.4.21",
            "3.4.23",
            "3.5.5",
            PREFERRED_ETCD_VERSION,
            "3.6.15",
            "3.7.0",
            "garbage",
        ] {
            assert!(check_release(binary, accepted).is_ok(), "{accepted}");
        }
    }

    #[test]
    fn a_port_another_process_holds_is_taken_and_free_ones_are_not() {
        let [client, peer, metrics] = free_ports::<3>(&[]).unwrap();
        let ports = EtcdPorts {
            client,
            peer,
            metrics,
        };
        assert!(!ports_taken(&ports));
        let squatter = TcpListener::bind((Ipv4Addr::LOCALHOST, peer)).unwrap();
        assert!(ports_taken(&ports));
        drop(squatter);
        assert!(!ports_taken(&ports));
    }

    #[test]
    fn ports_of_a_release_without_a_metrics_port_are_kept_and_one_is_added() {
        let dir = tempfile::tempdir().unwrap();
        let [client, peer] = free_ports::<2>(&[]).unwrap();
        std::fs::write(
            dir.path().join("ports.json"),
            format!(r#"{{"client":{client},"peer":{peer}}}"#),
        )
        .unwrap();
        let ports = choose_ports(dir.path(), false).unwrap();
        assert_eq!((ports.client, ports.peer), (client, peer));
        assert!(ports.metrics != 0 && ports.metrics != client && ports.metrics != peer);
        assert_eq!(stored(dir.path()), ports);
        // Then reused as they are.
        assert_eq!(choose_ports(dir.path(), false).unwrap(), ports);
    }

    #[test]
    fn a_taken_or_clashing_metrics_port_gives_three_new_ports() {
        let dir = tempfile::tempdir().unwrap();
        let squatter = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let taken = squatter.local_addr().unwrap().port();
        let [client, peer] = free_ports::<2>(&[taken]).unwrap();
        for metrics in [taken, client] {
            let old = EtcdPorts {
                client,
                peer,
                metrics,
            };
            std::fs::write(dir.path().join("ports.json"), serde_json::to_vec(&old).unwrap()).unwrap();
            let ports = choose_ports(dir.path(), false).unwrap();
            assert_ne!(ports, old, "metrics port {metrics}");
            let all = [ports.client, ports.peer, ports.metrics];
            assert!(all.iter().all(|p| *p != 0 && *p != taken), "{ports:?}");
            assert!(
                ports.client != ports.peer && ports.peer != ports.metrics && ports.client != ports.metrics
            );
            assert_eq!(stored(dir.path()), ports);
        }
        // `fresh` never reuses.
        let before = stored(dir.path());
        assert_ne!(choose_ports(dir.path(), true).unwrap(), before);
    }

    #[test]
    fn free_ports_are_distinct_and_avoid_the_given_ones() {
        let [a, b, c] = free_ports::<3>(&[]).unwrap();
        assert!(a != b && b != c && a != c);
        let [d] = free_ports::<1>(&[a, b, c]).unwrap();
        assert!(![a, b, c].contains(&d));
    }
}
