//! The recorded side of a scenario, whichever runtime runs the members: the client load and the
//! watch started together, and at the end the checks of what they saw (linearizability per key
//! with its stale-read control, the watch against the writes, every acknowledged write read
//! back, HashKV across the members), written into the [`Report`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::RobustnessError;
use super::checks;
use super::history::{self, History, KEY_PREFIX, LoadConfig, Request};
use super::linearizability::Verdict;
use super::report::Report;
use super::watch::{self, WatchLog};

/// The load and the watch, running.
#[derive(Debug)]
pub struct Recorded {
    load_config: LoadConfig,
    started: Instant,
    stop: Arc<AtomicBool>,
    load: tokio::task::JoinHandle<History>,
    until: tokio::sync::watch::Sender<Option<i64>>,
    watcher: tokio::task::JoinHandle<WatchLog>,
}

impl Recorded {
    /// Starts the load and a watch of its keys on `endpoints`.
    pub fn start(endpoints: &[String], load_config: LoadConfig) -> Self {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let load = history::start_load(endpoints.to_vec(), load_config.clone(), started, stop.clone());
        let (until, until_rx) = tokio::sync::watch::channel(None);
        let watcher = watch::start_watch(endpoints.to_vec(), KEY_PREFIX.to_string(), until_rx);
        Self {
            load_config,
            started,
            stop,
            load,
            until,
            watcher,
        }
    }

    /// Stops the load, writes an end marker, lets the watch reach it, and runs every check
    /// against `endpoints` (the members now); the figures and findings go into `report`.
    #[allow(clippy::print_stdout)]
    pub async fn finish(self, endpoints: &[String], report: &mut Report) -> Result<(), RobustnessError> {
        self.stop.store(true, Ordering::SeqCst);
        let mut history = self.load.await?;
        history::final_reads(&mut history, endpoints, &self.load_config, self.started).await?;
        // A last write, so the watch knows the revision it must reach.
        let mut client =
            etcd_client::Client::connect(endpoints, Some(super::client_options(Duration::from_secs(5))))
                .await
                .map_err(|source| RobustnessError::Connect {
                    endpoints: endpoints.to_vec(),
                    source,
                })?;
        let marker = history::record(
            &mut client,
            self.load_config.clients + 1,
            &format!("{KEY_PREFIX}marker"),
            Request::Put { value: "end".into() },
            Duration::from_secs(10),
            self.started,
        )
        .await;
        history.ops.push(marker);
        let revision = checks::current_revision(endpoints).await?;
        self.until.send_replace(Some(revision));
        let log = self.watcher.await?;

        report.operations = history.ops.len();
        report.acknowledged_writes = history.acknowledged_writes().len();
        report.unknown_outcomes = history.failed();
        report.watch_events = log.events.len();
        report.watch_reconnects = log.reconnects;
        // Unknown outcomes settled by the watch when it is complete (else the search may not end).
        let checked = if log.incomplete.is_none() {
            history.settled_by_watch(&log.events)
        } else {
            history.clone()
        };
        report.unknown_unsettled = checked
            .ops
            .iter()
            .filter(|op| {
                op.request != Request::Get && matches!(op.response, history::Response::Failed { .. })
            })
            .count();
        let seed = report.seed;
        for verdict in checked.check_linearizable(5_000_000) {
            report.keys_checked += 1;
            match &verdict.verdict {
                Verdict::Linearizable => {}
                Verdict::Undecided { steps } => {
                    report.keys_undecided += 1;
                    println!("robustness: key {} undecided after {steps} steps", verdict.key);
                }
                Verdict::NotLinearizable { longest, stuck } => {
                    let stuck_op = verdict.checked.get(*stuck);
                    report.findings.push(format!(
                        "key {}: not linearizable (seed {seed}): {} of {} operations placed, then {:?} cannot be",
                        verdict.key,
                        longest.len(),
                        verdict.operations,
                        stuck_op
                    ));
                }
            }
        }
        // The checker must be able to fail on this very history: one stale read added must be caught.
        match checked.stale_read_control(5_000_000) {
            Some(v) if v.is_violation() => report.control_caught = true,
            other => report.findings.push(format!(
                "the checker's control (a stale read added to the recorded history) was not caught: {other:?}"
            )),
        }
        report.findings.extend(checks::check_watch(&history, &log));
        report
            .findings
            .extend(checks::check_writes_readable(endpoints, &history).await?);
        report
            .findings
            .extend(checks::check_hash_kv(endpoints, revision).await);
        Ok(())
    }
}
