//! The watch cache: one etcd watch on the resource prefix feeds an in-memory copy of every
//! object (serialized bytes, shared by `Arc`) and a bounded ring buffer of recent events that
//! all client watches read from.
//!
//! The ring is bounded in count ([`super::StorageOptions::event_buffer_capacity`]) and in age
//! ([`super::StorageOptions::event_retention`], beyond the newest [`MIN_EVENTS_KEPT`]): a
//! deleted object's last state lives on in its `DELETED` event, so without the age bound the
//! memory of deleted objects would stay until enough later writes pushed them out.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Inner;
use super::backend::{RangeRequest, WatchEvent as BackendEvent, WatchEventKind, WatchResponse, prefix_end};
use super::error::StorageError;

/// One stored object: its JSON bytes as written to etcd (without `resourceVersion`) and its
/// mod revision. Cloning is cheap; the bytes are shared with the event ring buffer.
#[derive(Debug, Clone)]
pub(crate) struct StoredObj {
    pub(crate) data: Arc<[u8]>,
    pub(crate) mod_rev: u64,
    /// Where `resourceVersion` is spliced in to serve the bytes (see [`super::raw`]).
    pub(crate) splice: Option<u32>,
}

impl StoredObj {
    /// Checks the bytes once and notes where `resourceVersion` goes.
    pub(crate) fn new(data: Arc<[u8]>, mod_rev: u64) -> Self {
        let splice = super::raw::splice_point(&data);
        Self {
            data,
            mod_rev,
            splice,
        }
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// One change, as kept in the ring buffer. For `Deleted`, `data` is the last state and `rev`
/// the revision of the delete.
#[derive(Debug, Clone)]
pub(crate) struct CacheEvent {
    pub(crate) kind: EventKind,
    pub(crate) key: Arc<str>,
    pub(crate) data: Arc<[u8]>,
    pub(crate) rev: u64,
    /// See [`StoredObj::splice`].
    pub(crate) splice: Option<u32>,
    /// When the event entered the ring (its age bound).
    pub(crate) at: Instant,
}

impl CacheEvent {
    /// The object of the event, with resourceVersion = the event's revision.
    pub(crate) fn object(&self) -> super::raw::RawObject {
        super::raw::RawObject::new(
            Arc::clone(&self.key),
            StoredObj {
                data: Arc::clone(&self.data),
                mod_rev: self.rev,
                splice: self.splice,
            },
        )
    }
}

/// The namespace part of a key relative to the prefix (`<ns>/<name>`).
pub(crate) fn key_in_namespace(key: &str, namespace: Option<&str>) -> bool {
    match namespace {
        None => true,
        Some(ns) => key.strip_prefix(ns).is_some_and(|rest| rest.starts_with('/')),
    }
}

/// The key range `[start, end)` (relative to the prefix) holding one namespace, or everything.
pub(crate) fn namespace_range(namespace: Option<&str>) -> (String, Option<String>) {
    match namespace {
        None => (String::new(), None),
        // '0' is the byte after '/'.
        Some(ns) => (format!("{ns}/"), Some(format!("{ns}0"))),
    }
}

/// The in-memory state of the cache. Guarded by a `std::sync::RwLock`; never held across awaits.
#[derive(Debug)]
pub(crate) struct CacheState {
    pub(crate) objects: BTreeMap<Arc<str>, StoredObj>,
    pub(crate) events: VecDeque<CacheEvent>,
    /// Sequence number of `events[0]`; sequence numbers never repeat within an epoch.
    pub(crate) first_seq: u64,
    /// The etcd revision the cache reflects (0 until the initial list is done).
    pub(crate) rev: u64,
    /// Watches starting at a resourceVersion `>= history_start` can be served from the buffer.
    pub(crate) history_start: u64,
    /// Bumped when the cache relists; watchers of an older epoch end with `Expired`.
    pub(crate) epoch: u64,
    /// The cache task stopped (the storage was dropped).
    pub(crate) closed: bool,
    capacity: usize,
    retention: Duration,
}

/// Events kept whatever their age (kube-apiserver's watch cache keeps at least 100 too).
pub(crate) const MIN_EVENTS_KEPT: usize = 100;

impl CacheState {
    pub(crate) fn new(capacity: usize, retention: Duration) -> Self {
        Self {
            objects: BTreeMap::new(),
            events: VecDeque::new(),
            first_seq: 0,
            rev: 0,
            history_start: 0,
            epoch: 0,
            closed: false,
            capacity: capacity.max(1),
            retention,
        }
    }

    pub(crate) fn initialized(&self) -> bool {
        self.rev > 0
    }

    pub(crate) fn end_seq(&self) -> u64 {
        self.first_seq + self.events.len() as u64
    }

    /// The sequence number of the first event after revision `rv`, or `Expired` when events
    /// after `rv` have already left the buffer.
    pub(crate) fn seq_after(&self, rv: u64) -> Result<u64, StorageError> {
        if rv < self.history_start {
            return Err(too_old(rv, self.history_start));
        }
        let idx = self.events.partition_point(|e| e.rev <= rv);
        Ok(self.first_seq + idx as u64)
    }

    /// Objects whose key lies in the namespace (or all), in key order.
    pub(crate) fn snapshot(&self, namespace: Option<&str>) -> Vec<(Arc<str>, StoredObj)> {
        self.range(namespace, None)
            .into_iter()
            .map(|(k, v)| (Arc::clone(k), v.clone()))
            .collect()
    }

    /// The namespace (or everything) from `start` (inclusive, relative key) on, in key order.
    pub(crate) fn range(&self, namespace: Option<&str>, start: Option<&str>) -> Vec<(&Arc<str>, &StoredObj)> {
        let (ns_start, ns_end) = namespace_range(namespace);
        let from = match start {
            Some(s) if s > ns_start.as_str() => s.to_owned(),
            _ => ns_start,
        };
        match ns_end {
            Some(end) if from >= end => Vec::new(),
            Some(end) => self
                .objects
                .range::<str, _>((Bound::Included(from.as_str()), Bound::Excluded(end.as_str())))
                .collect(),
            None => self
                .objects
                .range::<str, _>((Bound::Included(from.as_str()), Bound::Unbounded))
                .collect(),
        }
    }

    fn push(&mut self, event: CacheEvent) {
        while self.events.len() >= self.capacity {
            self.pop_oldest();
        }
        let now = event.at;
        self.events.push_back(event);
        self.expire(now);
    }

    fn pop_oldest(&mut self) {
        if let Some(old) = self.events.pop_front() {
            self.first_seq += 1;
            self.history_start = self.history_start.max(old.rev);
        }
    }

    /// Whether [`CacheState::expire`] would drop anything at `now`.
    pub(crate) fn has_expired(&self, now: Instant) -> bool {
        self.events.len() > MIN_EVENTS_KEPT
            && self
                .events
                .front()
                .is_some_and(|e| now.saturating_duration_since(e.at) > self.retention)
    }

    /// Drops the events older than the retention, beyond the newest [`MIN_EVENTS_KEPT`]:
    /// watches from before them get `Expired` (and relist), as after a compaction.
    pub(crate) fn expire(&mut self, now: Instant) {
        let mut dropped = false;
        while self.has_expired(now) {
            self.pop_oldest();
            dropped = true;
        }
        // A burst grows the ring, which never shrinks on its own: give its buffer back once the
        // burst's events are gone (after a shrink it is full, so this happens once per burst).
        if dropped
            && self.events.capacity() > 4 * MIN_EVENTS_KEPT
            && self.events.len() < self.events.capacity() / 4
        {
            self.events.shrink_to_fit();
        }
    }

    pub(crate) fn apply_put(&mut self, key: Arc<str>, obj: StoredObj) {
        let rev = obj.mod_rev;
        let data = Arc::clone(&obj.data);
        let splice = obj.splice;
        let kind = match self.objects.insert(Arc::clone(&key), obj) {
            Some(_) => EventKind::Modified,
            None => EventKind::Added,
        };
        self.push(CacheEvent {
            kind,
            key,
            data,
            rev,
            splice,
            at: Instant::now(),
        });
        self.rev = self.rev.max(rev);
    }

    pub(crate) fn apply_delete(&mut self, key: &str, rev: u64, prev: Option<StoredObj>) {
        let removed = self.objects.remove_entry(key);
        let (key, last) = match (removed, prev) {
            (Some((k, obj)), _) => (k, obj),
            (None, Some(prev)) => (Arc::from(key), prev),
            (None, None) => {
                // Nothing known about the object: there is no last state to report.
                self.rev = self.rev.max(rev);
                return;
            }
        };
        self.push(CacheEvent {
            kind: EventKind::Deleted,
            key,
            data: last.data,
            rev,
            splice: last.splice,
            at: Instant::now(),
        });
        self.rev = self.rev.max(rev);
    }

    /// Replaces the whole state after a (re)list at `rev`; existing watchers expire.
    pub(crate) fn replace(&mut self, objects: BTreeMap<Arc<str>, StoredObj>, rev: u64) {
        let first = !self.initialized();
        self.objects = objects;
        self.first_seq = self.end_seq();
        self.events.clear();
        self.rev = rev;
        self.history_start = rev;
        if !first {
            self.epoch += 1;
        }
    }

    /// Forgets history at or before a compacted revision.
    pub(crate) fn compacted(&mut self, rev: u64) {
        while self.events.front().is_some_and(|e| e.rev <= rev) {
            self.events.pop_front();
            self.first_seq += 1;
        }
        self.history_start = self.history_start.max(rev);
    }
}

/// The `Expired` error of a watch from a resourceVersion the cache no longer covers.
pub(crate) fn too_old(requested: u64, oldest: u64) -> StorageError {
    StorageError::Expired {
        requested,
        oldest,
        message: format!("too old resource version: {requested} ({oldest})"),
    }
}

/// Requests to the cache task.
#[derive(Debug)]
pub(crate) enum Control {
    /// Ask etcd for a watch progress notification, so the cache revision catches up with
    /// writes outside the prefix.
    RequestProgress,
    /// Drop the etcd watch and resume after a pause (tests use this to miss compacted history).
    #[cfg_attr(not(test), allow(dead_code))]
    Disconnect(Duration),
}

enum WatchEnd {
    /// A message of this many bytes came, and the watch went quiet after it: open a new etcd
    /// watch at once (see [`super::StorageOptions::watch_reopen_bytes`]).
    Outsized(usize),
    Compacted(i64),
    Failed(String),
    Disconnect(Duration),
    Cancelled,
}

/// Lists the whole prefix at the latest revision.
async fn list_all(inner: &Inner) -> Result<(BTreeMap<Arc<str>, StoredObj>, u64), StorageError> {
    let resp = inner
        .backend
        .range(RangeRequest {
            key: inner.prefix.as_bytes().to_vec(),
            range_end: prefix_end(inner.prefix.as_bytes()),
            revision: None,
            limit: None,
        })
        .await
        .map_err(|e| StorageError::backend("list for the watch cache", e))?;
    let rev = resp.revision.max(1);
    let mut objects = BTreeMap::new();
    for kv in resp.kvs {
        if let Some(key) = inner.relative_key(&kv.key) {
            objects.insert(
                Arc::from(key),
                StoredObj::new(Arc::from(kv.value), kv.mod_revision),
            );
        }
    }
    Ok((objects, rev))
}

/// Whether etcd's version sends progress notifications in order with events (kube-apiserver's
/// check: 3.4.31 <= v < 3.5.0, or v >= 3.5.13).
pub(crate) fn progress_notify_reliable(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    let patch = parts.next().unwrap_or(0);
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m > 5,
        (m, _) => m > 3,
    }
}

/// What is known to be wrong with the backing etcd's `version`, for the operator's log: local
/// mode refuses such a release before it starts it; an etcd the server is pointed at (Kubernetes
/// mode) is someone else's, so the server says what it risks and serves. The durability defect
/// only matters when that etcd is a single member, which the server cannot see from here.
pub(crate) fn backing_release_defects(version: &str) -> Option<String> {
    let parsed = etcd_operator_api::versions::parse(version.trim_start_matches('v')).ok()?;
    let mut defects: Vec<String> = etcd_operator_api::versions::known_issue(&parsed)
        .into_iter()
        .map(str::to_owned)
        .collect();
    defects.extend(
        etcd_operator_api::versions::single_member_durability_issue(&parsed)
            .map(|issue| format!("if the backing etcd is a single member: {issue}")),
    );
    (!defects.is_empty()).then(|| defects.join("; "))
}

async fn detect_progress_support(inner: &Inner) {
    match inner.backend.status().await {
        Ok(status) => {
            if let Some(defects) = backing_release_defects(&status.version) {
                tracing::warn!(version = %status.version, %defects, "the backing etcd's release has known defects");
            }
            let reliable = progress_notify_reliable(&status.version);
            tracing::debug!(
                version = %status.version,
                reliable,
                "etcd progress notifications"
            );
            inner
                .progress_trusted
                .store(reliable, std::sync::atomic::Ordering::SeqCst);
        }
        Err(e) => {
            tracing::warn!(error = %etcd_operator_api::report::Chain(&e), "etcd status failed; not relying on progress notifications")
        }
    }
}

/// The cache task: lists, watches from the list revision, relists when the watch falls behind
/// a compaction, reconnects on errors. Ends when `cancel` fires.
pub(crate) async fn run(
    inner: Arc<Inner>,
    mut control: mpsc::UnboundedReceiver<Control>,
    cancel: CancellationToken,
) {
    let mut need_list = true;
    let mut backoff = Duration::from_millis(100);
    loop {
        if cancel.is_cancelled() {
            break;
        }
        if need_list {
            detect_progress_support(&inner).await;
            match list_all(&inner).await {
                Ok((objects, rev)) => {
                    let count = objects.len();
                    inner.with_state_mut(|s| s.replace(objects, rev));
                    tracing::info!(prefix = %inner.prefix, rev, count, "watch cache listed");
                    need_list = false;
                    backoff = Duration::from_millis(100);
                }
                Err(e) => {
                    tracing::warn!(prefix = %inner.prefix, error = %etcd_operator_api::report::Chain(&e), "watch cache list failed; retrying");
                    if sleep_or_cancel(backoff, &cancel).await {
                        break;
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        let start = inner.read_state(|s| s.rev) + 1;
        match watch_once(&inner, start, &mut control, &cancel).await {
            WatchEnd::Cancelled => break,
            WatchEnd::Outsized(bytes) => {
                tracing::debug!(prefix = %inner.prefix, start, bytes, "etcd watch message was outsized; reopening the watch to free its buffer");
            }
            WatchEnd::Compacted(compact_rev) => {
                tracing::warn!(prefix = %inner.prefix, start, compact_rev, "watch cache fell behind a compaction; relisting");
                need_list = true;
            }
            WatchEnd::Failed(error) => {
                tracing::warn!(prefix = %inner.prefix, start, %error, "etcd watch failed; reconnecting");
                if sleep_or_cancel(backoff, &cancel).await {
                    break;
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            WatchEnd::Disconnect(pause) => {
                tracing::info!(prefix = %inner.prefix, ?pause, "watch cache disconnecting on request");
                if sleep_or_cancel(pause, &cancel).await {
                    break;
                }
            }
        }
    }
    inner.with_state_mut(|s| s.closed = true);
}

/// Sleeps; returns true when cancelled meanwhile.
async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = cancel.cancelled() => true,
        () = tokio::time::sleep(d) => false,
    }
}

async fn watch_once(
    inner: &Inner,
    start: u64,
    control: &mut mpsc::UnboundedReceiver<Control>,
    cancel: &CancellationToken,
) -> WatchEnd {
    let opened = tokio::select! {
        () = cancel.cancelled() => return WatchEnd::Cancelled,
        r = inner.backend.watch(inner.prefix.as_bytes().to_vec(), start) => r,
    };
    let mut stream = match opened {
        Ok(s) => s,
        Err(e) => return WatchEnd::Failed(crate::error::chain(&e)),
    };
    inner
        .backing_watches
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut progress_sent: Option<Instant> = None;
    // After an outsized message: the largest one, and when the watch is reopened unless more
    // messages come first. Reopened only once the stream is quiet: under a burst a new etcd watch
    // starts behind and catches up in large batches, which would call for reopening again.
    let mut outsized: Option<(usize, tokio::time::Instant)> = None;
    let mut expiry = tokio::time::interval(EXPIRY_CHECK);
    expiry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return WatchEnd::Cancelled,
            _ = expiry.tick() => expire_events(inner),
            () = sleep_until_some(outsized.map(|(_, at)| at)) => {
                return WatchEnd::Outsized(outsized.map_or(0, |(bytes, _)| bytes));
            }
            c = control.recv() => match c {
                None => return WatchEnd::Cancelled,
                Some(Control::Disconnect(pause)) => return WatchEnd::Disconnect(pause),
                Some(Control::RequestProgress) => {
                    // One outstanding request at a time; re-send if no answer came in a while.
                    if progress_sent.is_none_or(|t| t.elapsed() > Duration::from_millis(500)) {
                        if let Err(e) = stream.request_progress().await {
                            return WatchEnd::Failed(crate::error::chain(&e));
                        }
                        progress_sent = Some(Instant::now());
                    }
                }
            },
            msg = stream.next() => match msg {
                Err(e) => return WatchEnd::Failed(crate::error::chain(&e)),
                Ok(None) => return WatchEnd::Failed("watch stream ended".to_owned()),
                Ok(Some(WatchResponse::Compacted(rev))) => return WatchEnd::Compacted(rev as i64),
                Ok(Some(WatchResponse::Progress(rev))) => {
                    // Every event up to `rev` was sent.
                    progress_sent = None;
                    inner.with_state_mut(|s| s.rev = s.rev.max(rev));
                }
                Ok(Some(WatchResponse::Events(events))) => {
                    let bytes = message_bytes(&events);
                    // Checked outside the lock: readers only wait for the inserts.
                    let changes = prepare_events(inner, events);
                    inner.with_state_mut(|s| apply_changes(s, changes));
                    // Every event up to the cache's revision is applied when the watch is reopened:
                    // the next one starts right after it and misses nothing.
                    let largest = outsized.map_or(0, |(b, _)| b).max(bytes);
                    if largest >= inner.options.watch_reopen_bytes {
                        outsized = Some((largest, tokio::time::Instant::now() + inner.options.watch_reopen_quiet));
                    }
                }
            },
        }
    }
}

/// Completes at `at`; never when `None`.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// About the size of the etcd message that carried `events` (keys and values; the framing
/// around them is small).
fn message_bytes(events: &[BackendEvent]) -> usize {
    events
        .iter()
        .map(|e| {
            e.kv.key.len() + e.kv.value.len() + e.prev.as_ref().map_or(0, |p| p.key.len() + p.value.len())
        })
        .sum()
}

/// How often an idle cache looks for events past their retention.
const EXPIRY_CHECK: Duration = Duration::from_secs(5);

/// Drops the events past their retention (without waking the watchers: nothing new for them).
fn expire_events(inner: &Inner) {
    let now = Instant::now();
    if inner.read_state(|s| s.has_expired(now)) {
        let mut state = inner
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.expire(now);
    }
}

/// One change of the prefix, ready to apply.
enum Change {
    Put(Arc<str>, StoredObj),
    Delete(Arc<str>, u64, Option<StoredObj>),
    /// A key outside the prefix (or not UTF-8): only the revision moves.
    Other(u64),
}

fn prepare_events(inner: &Inner, events: Vec<BackendEvent>) -> Vec<Change> {
    let mut changes = Vec::with_capacity(events.len());
    for event in events {
        let rev = event.kv.mod_revision;
        let Some(key) = inner.relative_key(&event.kv.key) else {
            changes.push(Change::Other(rev));
            continue;
        };
        let key = Arc::from(key);
        changes.push(match event.kind {
            WatchEventKind::Put => Change::Put(key, StoredObj::new(Arc::from(event.kv.value), rev)),
            WatchEventKind::Delete => {
                let prev = event
                    .prev
                    .map(|p| StoredObj::new(Arc::from(p.value), p.mod_revision));
                Change::Delete(key, rev, prev)
            }
        });
    }
    changes
}

fn apply_changes(state: &mut CacheState, changes: Vec<Change>) {
    for change in changes {
        match change {
            Change::Put(key, obj) => state.apply_put(key, obj),
            Change::Delete(key, rev, prev) => state.apply_delete(&key, rev, prev),
            Change::Other(rev) => state.rev = state.rev.max(rev),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(rev: u64) -> StoredObj {
        StoredObj::new(Arc::from(&b"{\"metadata\":{}}"[..]), rev)
    }

    #[test]
    fn a_backing_etcd_release_with_known_defects_is_named() {
        let corrupting = backing_release_defects("3.5.1").unwrap();
        assert!(
            corrupting.contains("13766") && corrupting.contains("14370"),
            "{corrupting}"
        );
        let single = backing_release_defects("3.4.20").unwrap();
        assert!(
            single.starts_with("if the backing etcd is a single member"),
            "{single}"
        );
        for fine in ["3.5.34", "3.4.21", "3.6.0", "not a version"] {
            assert_eq!(backing_release_defects(fine), None, "{fine}");
        }
    }

    #[test]
    fn events_past_their_retention_expire_beyond_the_newest_kept() {
        let mut state = CacheState::new(1000, Duration::from_secs(60));
        for rev in 1..=150u64 {
            state.apply_put(Arc::from(format!("ns/o{rev}").as_str()), obj(rev));
        }
        let now = Instant::now();
        assert!(!state.has_expired(now));
        state.expire(now);
        assert_eq!(state.events.len(), 150);

        let later = now + Duration::from_secs(61);
        assert!(state.has_expired(later));
        state.expire(later);
        assert_eq!(state.events.len(), MIN_EVENTS_KEPT);
        assert_eq!(state.first_seq, 50);
        // The ring's buffer, grown for the burst, is given back once its events are gone.
        let mut burst = CacheState::new(100_000, Duration::from_secs(60));
        for rev in 1..=5_000u64 {
            burst.apply_put(Arc::from(format!("ns/o{rev}").as_str()), obj(rev));
        }
        assert!(burst.events.capacity() >= 5_000);
        burst.expire(later);
        assert_eq!(burst.events.len(), MIN_EVENTS_KEPT);
        assert!(
            burst.events.capacity() < 4 * MIN_EVENTS_KEPT,
            "{}",
            burst.events.capacity()
        );
        // A watch from before the dropped events expires; one from after them is served.
        assert!(state.seq_after(10).is_err());
        assert_eq!(state.seq_after(50).unwrap(), 50);
        // The objects themselves stay.
        assert_eq!(state.objects.len(), 150);
    }
}
