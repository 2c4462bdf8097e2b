//! Client watches served from the watch cache: initial state, changes from the ring buffer,
//! bookmarks, and `Expired` when a watcher falls behind the retained history.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use serde_json::Value;
use tokio::sync::watch as tokio_watch;

use super::cache::{self, CacheEvent, EventKind, StoredObj};
use super::error::StorageError;
use super::raw::RawObject;
use super::{Inner, WatchOptions, parse_rv};

/// One event of a watch. Objects carry `metadata.resourceVersion` = the event's revision: as
/// JSON values ([`WatchStream`]) or as stored bytes ([`RawWatchStream`]).
#[derive(Debug)]
pub enum WatchEvent<T = Value> {
    Added(T),
    Modified(T),
    /// The last state of the object, with resourceVersion = the revision of the delete.
    Deleted(T),
    /// Progress: every change up to `resource_version` was sent. `initial_events_end` marks the
    /// end of the initial state of a `send_initial_events` watch.
    Bookmark {
        resource_version: u64,
        initial_events_end: bool,
    },
    /// The watch cannot continue (e.g. `Expired`); the stream ends after it.
    Error(StorageError),
}

/// The events of one watch. Ends after an `Error` event or when the storage is dropped.
pub struct WatchStream {
    inner: Pin<Box<dyn Stream<Item = WatchEvent> + Send>>,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream").finish_non_exhaustive()
    }
}

impl Stream for WatchStream {
    type Item = WatchEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchEvent>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// The events of one watch with objects as stored bytes (see [`RawObject`]), for encoders that
/// serve them without decoding. Ends after an `Error` event or when the storage is dropped.
pub struct RawWatchStream {
    inner: Pin<Box<dyn Stream<Item = WatchEvent<RawObject>> + Send>>,
}

impl std::fmt::Debug for RawWatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawWatchStream").finish_non_exhaustive()
    }
}

impl Stream for RawWatchStream {
    type Item = WatchEvent<RawObject>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchEvent<RawObject>>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl RawWatchStream {
    /// The same events with decoded objects; a object that does not decode ends the stream
    /// with an `Error` event.
    pub fn decoded(self) -> WatchStream {
        let stream = futures::stream::unfold((self, false), |(mut raw, done)| async move {
            if done {
                return None;
            }
            let decode = |o: RawObject| o.decode();
            let event = match futures::StreamExt::next(&mut raw).await? {
                WatchEvent::Added(o) => decode(o).map(WatchEvent::Added),
                WatchEvent::Modified(o) => decode(o).map(WatchEvent::Modified),
                WatchEvent::Deleted(o) => decode(o).map(WatchEvent::Deleted),
                WatchEvent::Bookmark {
                    resource_version,
                    initial_events_end,
                } => Ok(WatchEvent::Bookmark {
                    resource_version,
                    initial_events_end,
                }),
                WatchEvent::Error(e) => Err(e),
            };
            Some(match event {
                Ok(event) => (event, (raw, false)),
                Err(e) => (WatchEvent::Error(e), (raw, true)),
            })
        });
        WatchStream {
            inner: Box::pin(stream),
        }
    }
}

/// Where a watch starts, when it could not be settled synchronously.
#[derive(Debug)]
enum Setup {
    /// Changes after this revision, once the cache reached it.
    After(u64),
    /// The state (consistent, or at least at this revision), then changes.
    Initial { min_rev: Option<u64>, consistent: bool },
}

struct Watcher {
    inner: Arc<Inner>,
    namespace: Option<String>,
    send_initial_events: bool,
    setup: Option<Setup>,
    pending: VecDeque<(Arc<str>, StoredObj)>,
    initial_end: Option<u64>,
    next_seq: u64,
    epoch: u64,
    /// Revision of the last event delivered (for the `Expired` message).
    last_rev: u64,
    rx: tokio_watch::Receiver<u64>,
    bookmarks: Option<tokio::time::Interval>,
    bookmark_due: bool,
    /// Events at or before this revision are already part of the initial state.
    min_event_rev: u64,
    done: bool,
}

/// Starts a watch. Fails right away with `Expired` when the requested resourceVersion is older
/// than the cache's history.
pub(crate) fn start(inner: Arc<Inner>, opts: &WatchOptions) -> Result<RawWatchStream, StorageError> {
    let rv = parse_rv(opts.resource_version.as_deref())?;
    let rx = inner.subscribe();
    let bookmarks = opts.allow_bookmarks.then(|| {
        let period = inner
            .options
            .bookmark_interval
            .max(std::time::Duration::from_millis(1));
        let mut i = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let mut watcher = Watcher {
        inner: Arc::clone(&inner),
        namespace: opts.namespace.clone().filter(|n| !n.is_empty()),
        send_initial_events: opts.send_initial_events,
        setup: None,
        pending: VecDeque::new(),
        initial_end: None,
        next_seq: 0,
        epoch: 0,
        last_rev: 0,
        rx,
        bookmarks,
        bookmark_due: false,
        min_event_rev: 0,
        done: false,
    };
    let setup = match (rv, opts.send_initial_events) {
        (Some(n), false) if n > 0 => Setup::After(n),
        (None, true) => Setup::Initial {
            min_rev: None,
            consistent: true,
        },
        (Some(n), true) if n > 0 => Setup::Initial {
            min_rev: Some(n),
            consistent: false,
        },
        // Unset or 0: the current state from the cache, then changes.
        _ => Setup::Initial {
            min_rev: None,
            consistent: false,
        },
    };
    // Settle synchronously what can be: an expired start fails before streaming.
    let settled = inner.read_state(|s| {
        if !s.initialized() {
            return Ok(false);
        }
        match &setup {
            Setup::After(n) if *n <= s.rev => {
                watcher.next_seq = s.seq_after(*n)?;
                watcher.epoch = s.epoch;
                watcher.last_rev = *n;
                Ok(true)
            }
            Setup::Initial {
                min_rev: None,
                consistent: false,
            } => {
                watcher.take_snapshot(s);
                Ok(true)
            }
            _ => Ok(false),
        }
    })?;
    if !settled {
        watcher.setup = Some(setup);
    }
    let stream = futures::stream::unfold(watcher, |mut w| async move {
        let ev = w.next().await?;
        Some((ev, w))
    });
    Ok(RawWatchStream {
        inner: Box::pin(stream),
    })
}

impl Watcher {
    fn take_snapshot(&mut self, s: &cache::CacheState) {
        self.pending = s.snapshot(self.namespace.as_deref()).into();
        self.next_seq = s.end_seq();
        self.epoch = s.epoch;
        self.last_rev = s.rev;
        if self.send_initial_events {
            self.initial_end = Some(s.rev);
        }
    }

    async fn run_setup(&mut self, setup: Setup) -> Result<(), StorageError> {
        let options = &self.inner.options;
        let (target, wait, too_large) = match &setup {
            Setup::After(n) => (*n, options.resource_version_wait, true),
            Setup::Initial { min_rev: Some(n), .. } => (*n, options.resource_version_wait, true),
            Setup::Initial {
                min_rev: None,
                consistent: true,
            } => {
                if self.inner.ensure_consistent().await?.is_some() {
                    // The cache could not be shown to be current: the state comes from etcd.
                    return self.initial_from_etcd().await;
                }
                (1, options.consistent_read_timeout, false)
            }
            Setup::Initial { .. } => (1, options.consistent_read_timeout, false),
        };
        if !self.inner.wait_for_rev(target, wait, true).await {
            let current = self.inner.cache_rev();
            return Err(if too_large && current > 0 {
                StorageError::TooLargeResourceVersion {
                    requested: target,
                    current,
                }
            } else {
                StorageError::Timeout {
                    op: "wait for the watch cache",
                    after: wait,
                }
            });
        }
        let inner = Arc::clone(&self.inner);
        inner.read_state(|s| match setup {
            Setup::After(n) => {
                self.next_seq = s.seq_after(n)?;
                self.epoch = s.epoch;
                self.last_rev = n;
                Ok(())
            }
            Setup::Initial { .. } => {
                self.take_snapshot(s);
                Ok(())
            }
        })
    }

    /// Initial state read from etcd at its latest revision `R`; changes then come from the
    /// buffer, skipping those at or before `R`.
    async fn initial_from_etcd(&mut self) -> Result<(), StorageError> {
        let (items, rev) = self.inner.list_raw_from_etcd(self.namespace.as_deref()).await?;
        let inner = Arc::clone(&self.inner);
        inner.read_state(|s| {
            self.next_seq = s.seq_after(rev.min(s.rev))?;
            self.epoch = s.epoch;
            Ok::<_, StorageError>(())
        })?;
        self.pending = items.into();
        self.min_event_rev = rev;
        self.last_rev = rev;
        if self.send_initial_events {
            self.initial_end = Some(rev);
        }
        Ok(())
    }

    fn raw_event(ev: &CacheEvent) -> WatchEvent<RawObject> {
        let object = ev.object();
        match ev.kind {
            EventKind::Added => WatchEvent::Added(object),
            EventKind::Modified => WatchEvent::Modified(object),
            EventKind::Deleted => WatchEvent::Deleted(object),
        }
    }

    /// The next buffered event for this watcher, or `Err(rev)` when it has seen everything up
    /// to the cache revision `rev`.
    fn next_from_ring(&mut self) -> Result<Result<CacheEvent, u64>, StorageError> {
        let inner = Arc::clone(&self.inner);
        inner.read_state(|s| {
            if s.epoch != self.epoch || self.next_seq < s.first_seq {
                return Err(cache::too_old(self.last_rev, s.history_start));
            }
            while self.next_seq < s.end_seq() {
                let idx = (self.next_seq - s.first_seq) as usize;
                self.next_seq += 1;
                if let Some(ev) = s.events.get(idx) {
                    self.last_rev = self.last_rev.max(ev.rev);
                    if ev.rev > self.min_event_rev
                        && cache::key_in_namespace(&ev.key, self.namespace.as_deref())
                    {
                        return Ok(Ok(ev.clone()));
                    }
                }
            }
            Ok(Err(s.rev))
        })
    }

    async fn next(&mut self) -> Option<WatchEvent<RawObject>> {
        if self.done {
            return None;
        }
        if let Some(setup) = self.setup.take()
            && let Err(e) = self.run_setup(setup).await
        {
            self.done = true;
            return Some(WatchEvent::Error(e));
        }
        if let Some((key, obj)) = self.pending.pop_front() {
            return Some(WatchEvent::Added(RawObject::new(key, obj)));
        }
        if let Some(rev) = self.initial_end.take() {
            return Some(WatchEvent::Bookmark {
                resource_version: rev,
                initial_events_end: true,
            });
        }
        loop {
            self.rx.borrow_and_update();
            if self.inner.read_state(|s| s.closed) {
                self.done = true;
                return None;
            }
            match self.next_from_ring() {
                Ok(Ok(ev)) => return Some(Self::raw_event(&ev)),
                Ok(Err(rev)) => {
                    if self.bookmark_due && rev > 0 {
                        self.bookmark_due = false;
                        return Some(WatchEvent::Bookmark {
                            resource_version: rev,
                            initial_events_end: false,
                        });
                    }
                }
                Err(e) => {
                    self.done = true;
                    return Some(WatchEvent::Error(e));
                }
            }
            let tick = async {
                match self.bookmarks.as_mut() {
                    Some(i) => {
                        i.tick().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        self.done = true;
                        return None;
                    }
                }
                // Sent at the top of the loop, once caught up with the buffer.
                () = tick => self.bookmark_due = true,
            }
        }
    }
}
