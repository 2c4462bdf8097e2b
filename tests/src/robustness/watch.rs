//! The watch-stream recorder: one watch on the load's prefix from revision 1, re-established
//! from the next revision whenever the stream breaks or stalls, every event kept in the order it
//! arrived, so the checks can tell a missed, repeated or reordered revision.

use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, WatchOptions};
use tokio::sync::watch;

/// One event as the watch delivered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedEvent {
    /// The revision of the change (`mod_revision` of the key).
    pub revision: i64,
    /// The key.
    pub key: String,
    /// The value put (empty for a delete).
    pub value: String,
    /// A put (else a delete).
    pub put: bool,
}

/// What the watcher saw.
#[derive(Debug, Clone, Default)]
pub struct WatchLog {
    /// Every event, in arrival order.
    pub events: Vec<WatchedEvent>,
    /// Times the watch was established again after a break or a stall.
    pub reconnects: usize,
    /// Why it ended early, if it did (canceled, or never caught up with the target revision).
    pub incomplete: Option<String>,
}

/// How long the watcher waits for the last revision once it is told it.
const CATCH_UP: Duration = Duration::from_secs(30);
/// A stream silent for this long while behind the target is established again.
const STALL: Duration = Duration::from_secs(3);

/// Starts a watcher on `prefix` at `endpoints`. Send it a revision through `until`: it ends once it
/// has seen an event at or beyond it (or after 30 s more, saying so).
pub fn start_watch(
    endpoints: Vec<String>,
    prefix: String,
    mut until: watch::Receiver<Option<i64>>,
) -> tokio::task::JoinHandle<WatchLog> {
    tokio::spawn(async move {
        let mut log = WatchLog::default();
        let mut next = 1i64;
        let mut target_since: Option<Instant> = None;
        let mut first = true;
        let mut open = true;
        loop {
            let target = *until.borrow();
            if let Some(target) = target {
                if next > target {
                    return log;
                }
                let since = *target_since.get_or_insert_with(Instant::now);
                if since.elapsed() > CATCH_UP {
                    log.incomplete = Some(format!(
                        "the watch never reached revision {target} (next expected {next}) within {CATCH_UP:?}"
                    ));
                    return log;
                }
            }
            if !first {
                log.reconnects += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            first = false;
            let options = super::client_options(Duration::from_secs(2));
            let Ok(Ok(mut client)) =
                tokio::time::timeout(Duration::from_secs(3), Client::connect(&endpoints, Some(options)))
                    .await
            else {
                continue;
            };
            let options = WatchOptions::new().with_prefix().with_start_revision(next);
            let Ok(Ok(mut stream)) = tokio::time::timeout(
                Duration::from_secs(3),
                client.watch(prefix.as_str(), Some(options)),
            )
            .await
            else {
                continue;
            };
            let mut last_event = Instant::now();
            loop {
                tokio::select! {
                    message = stream.message() => match message {
                        Ok(Some(response)) => {
                            if response.canceled() {
                                log.incomplete = Some(format!(
                                    "the watch was canceled at revision {next} (compacted to {}): {}",
                                    response.compact_revision(),
                                    response.cancel_reason()
                                ));
                                return log;
                            }
                            for event in response.events() {
                                let Some(kv) = event.kv() else { continue };
                                log.events.push(WatchedEvent {
                                    revision: kv.mod_revision(),
                                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                                    value: String::from_utf8_lossy(kv.value()).into_owned(),
                                    put: event.event_type() == EventType::Put,
                                });
                                next = next.max(kv.mod_revision() + 1);
                                last_event = Instant::now();
                            }
                        }
                        Ok(None) | Err(_) => break,
                    },
                    changed = until.changed(), if open => open = changed.is_ok(),
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
                if let Some(target) = *until.borrow() {
                    if next > target {
                        return log;
                    }
                    if last_event.elapsed() > STALL {
                        break;
                    }
                    let since = *target_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > CATCH_UP {
                        break;
                    }
                }
            }
        }
    })
}
