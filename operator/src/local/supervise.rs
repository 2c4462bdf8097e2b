//! Supervision of the backing etcd in local mode: a task that waits on the process (so it is
//! reaped, never left `<defunct>`), logs its exit loudly, and starts it again with backoff on the
//! same data directory and the same ports, until local mode stops. While etcd is down the API
//! answers errors and `/readyz` is not ready (its storage probe fails); the storage client's
//! channel reconnects by itself once etcd serves again on the same endpoint. While etcd runs the
//! supervisor also checks its certificates on an interval and issues again, in place, those
//! about to expire: etcd reads its certificate files at each new TLS connection.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use etcd_operator_controller::tls::member::ClientTls;

use super::backing_etcd::{self, BackingEtcd, BackingEtcdError, BackingEtcdOptions, EtcdPorts};
use super::etcd_pki;

/// The first delay before a restart.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// The longest delay between restarts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A run at least this long counts as healthy: the next crash restarts after the initial delay.
pub const STABLE_RUN: Duration = Duration::from_secs(60);

/// Delays between restarts: doubling from an initial delay up to a maximum, back to the initial
/// one after a healthy run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `initial`, never above `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial.min(max),
        }
    }

    /// The delay before the next attempt; the one after is twice as long (at most `max`).
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// After a run of `ran_for`: a healthy run (at least `stable`) starts the delays over.
    pub fn after_run(&mut self, ran_for: Duration, stable: Duration) {
        if ran_for >= stable {
            self.next = self.initial.min(self.max);
        }
    }
}

/// Whether the supervised etcd runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdState {
    /// Serving, as process `pid`.
    Running { pid: u32 },
    /// Exited; being restarted.
    Down,
}

/// A backing etcd under supervision. [`SupervisedEtcd::shutdown`] stops the supervision and
/// then etcd.
#[derive(Debug)]
pub struct SupervisedEtcd {
    endpoint: String,
    socket: Option<std::path::PathBuf>,
    metrics_url: String,
    tls: ClientTls,
    data_dir: std::path::PathBuf,
    state: watch::Receiver<EtcdState>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), BackingEtcdError>>,
}

impl SupervisedEtcd {
    /// Supervises `etcd`, started with `options`: from now on an exit restarts it.
    pub fn start(etcd: BackingEtcd, options: BackingEtcdOptions) -> Self {
        let endpoint = etcd.endpoint().to_owned();
        let socket = etcd.client_socket().map(std::path::Path::to_path_buf);
        let metrics_url = etcd.metrics_url();
        let tls = etcd.client_tls().clone();
        let data_dir = etcd.data_dir();
        let (state_tx, state) = watch::channel(EtcdState::Running { pid: etcd.pid() });
        let stop = CancellationToken::new();
        let task = tokio::spawn(supervise(etcd, options, state_tx, stop.clone()));
        Self {
            endpoint,
            socket,
            metrics_url,
            tls,
            data_dir,
            state,
            stop,
            task,
        }
    }

    /// The client URL; the same across restarts.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The plain-HTTP URL of `/metrics` and `/health`; the same across restarts.
    pub fn metrics_url(&self) -> &str {
        &self.metrics_url
    }

    /// A client as the storage's: over etcd's Unix socket, or TLS with the client certificate
    /// of the backing etcd's CA when there is no socket (see [`super::backing_etcd::connect`]).
    pub async fn connect(&self) -> Result<etcd_client::Client, etcd_client::Error> {
        super::backing_etcd::connect(&self.endpoint, self.socket.as_deref(), &self.tls).await
    }

    /// The etcd data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// The process id of the running etcd; `None` while it is being restarted.
    pub fn pid(&self) -> Option<u32> {
        match *self.state.borrow() {
            EtcdState::Running { pid } => Some(pid),
            EtcdState::Down => None,
        }
    }

    /// Follows the state: each restart is `Down` then `Running` with the new pid.
    pub fn state(&self) -> watch::Receiver<EtcdState> {
        self.state.clone()
    }

    /// Stops supervising and stops etcd (SIGTERM, then SIGKILL after the stop timeout).
    pub async fn shutdown(self) -> Result<(), BackingEtcdError> {
        self.stop.cancel();
        match self.task.await {
            Ok(result) => result,
            Err(error) => {
                tracing::error!(error = %etcd_operator_api::report::Chain(&error), "the backing etcd supervisor failed");
                Ok(())
            }
        }
    }
}

async fn supervise(
    mut etcd: BackingEtcd,
    options: BackingEtcdOptions,
    state: watch::Sender<EtcdState>,
    stop: CancellationToken,
) -> Result<(), BackingEtcdError> {
    let ports: EtcdPorts = etcd.ports();
    let mut backoff = Backoff::new(INITIAL_BACKOFF, MAX_BACKOFF);
    loop {
        let started = Instant::now();
        let pid = etcd.pid();
        let exited = loop {
            tokio::select! {
                () = stop.cancelled() => return etcd.shutdown().await,
                exited = etcd.wait_exit() => break exited,
                () = tokio::time::sleep(options.certificate_check_interval) => {
                    let dir = backing_etcd::pki_dir(&options.dir);
                    // Files and a key pair or two: off the runtime's threads.
                    if let Err(error) = tokio::task::spawn_blocking(move || renew_certificates(&dir)).await {
                        tracing::error!(error = %etcd_operator_api::report::Chain(&error), "check the backing etcd's certificates");
                    }
                }
            }
        };
        state.send_replace(EtcdState::Down);
        let ran_for = started.elapsed();
        match exited {
            Ok(status) => tracing::error!(
                pid,
                %status,
                ?ran_for,
                log = %etcd.log_path().display(),
                "the backing etcd exited; restarting it on the same data and ports (until it \
                 serves again the API answers errors and /readyz is not ready)"
            ),
            Err(error) => tracing::error!(
                pid,
                error = %etcd_operator_api::report::Chain(&error),
                "the backing etcd could not be waited for; restarting it"
            ),
        }
        backoff.after_run(ran_for, STABLE_RUN);
        let mut attempt = 0u32;
        etcd = loop {
            attempt += 1;
            let delay = backoff.next_delay();
            tracing::warn!(attempt, ?delay, endpoint = %etcd.endpoint(), "restarting the backing etcd");
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(delay) => {}
            }
            let restarted = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                restarted = BackingEtcd::restart(&options, ports) => restarted,
            };
            match restarted {
                Ok(restarted) => break restarted,
                Err(error) => {
                    tracing::error!(attempt, error = %etcd_operator_api::report::Chain(&error), "restart the backing etcd")
                }
            }
        };
        tracing::info!(pid = etcd.pid(), attempt, endpoint = %etcd.endpoint(), "the backing etcd serves again");
        state.send_replace(EtcdState::Running { pid: etcd.pid() });
    }
}

/// Checks the backing etcd's certificates in `dir` as a start does ([`etcd_pki::ensure`]) and
/// logs each one it issued again. A failure is logged and left for the next check (or the next
/// start): etcd keeps serving with what it has.
fn renew_certificates(dir: &std::path::Path) {
    const LEAVES: [&str; 3] = ["server", "peer", "client"];
    let before = LEAVES.map(|name| std::fs::read_to_string(dir.join(format!("{name}.crt"))).ok());
    match etcd_pki::ensure(dir) {
        Ok(pki) => {
            let now = [&pki.server, &pki.peer, &pki.client];
            for ((name, was), pair) in LEAVES.iter().zip(before).zip(now) {
                if was.as_deref() != Some(pair.cert_pem.as_str()) {
                    tracing::info!(
                        certificate = %dir.join(format!("{name}.crt")).display(),
                        "issued the backing etcd's certificate again while it runs (it was about \
                         to expire or no longer valid); etcd serves it from its next TLS connection"
                    );
                }
            }
        }
        Err(error) => tracing::error!(
            error = %etcd_operator_api::report::Chain(&error),
            dir = %dir.display(),
            "check the backing etcd's certificates while it runs; trying again at the next check"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn delays_double_up_to_the_maximum() {
        let mut backoff = Backoff::new(MS(200), MS(1000));
        let delays: Vec<Duration> = (0..5).map(|_| backoff.next_delay()).collect();
        assert_eq!(delays, [MS(200), MS(400), MS(800), MS(1000), MS(1000)]);
    }

    #[test]
    fn a_healthy_run_starts_the_delays_over_and_a_short_one_does_not() {
        let mut backoff = Backoff::new(MS(200), MS(1000));
        backoff.next_delay();
        backoff.next_delay();
        backoff.after_run(MS(59_999), Duration::from_secs(60));
        assert_eq!(backoff.next_delay(), MS(800));
        backoff.after_run(Duration::from_secs(60), Duration::from_secs(60));
        assert_eq!(backoff.next_delay(), MS(200));
    }

    #[test]
    fn an_initial_delay_above_the_maximum_is_capped() {
        let mut backoff = Backoff::new(MS(5000), MS(1000));
        assert_eq!(backoff.next_delay(), MS(1000));
    }
}
