//! Storage of API objects in the backing etcd: CAS writes on mod_revision, lists, watch cache.
//!
//! One [`Storage`] serves one resource prefix (e.g. `/registry/etcd.operator.dev/etcdclusters/`);
//! keys are `<prefix><namespace>/<name>`, values the JSON of the storage version without
//! `metadata.resourceVersion`, which is the key's etcd mod revision on the way out.
//!
//! # Consistency
//! Reads are served from the watch cache (an in-memory copy fed by one etcd watch). A
//! *consistent* read (resourceVersion unset) first makes sure the cache has caught up:
//! - [`ConsistencyMode::Linearizable`] (default, correct with several writers on the same etcd):
//!   one cheap etcd read (count-only range on a single key) gives the current etcd revision; the
//!   read waits until the cache has applied it, asking etcd for a watch progress notification so
//!   that writes outside the prefix do not hold it back. Cost: one small etcd round trip per
//!   consistent read, the same as kube-apiserver's consistent list from cache.
//! - [`ConsistencyMode::SingleWriter`] (only when this process is the only writer of the prefix,
//!   e.g. local mode): the read waits until the cache has applied the highest revision this
//!   process wrote or saw in an etcd response. No etcd round trip; read-your-writes holds.
//!
//! If the cache does not catch up within [`StorageOptions::consistent_read_timeout`], the read
//! goes to etcd directly.
//!
//! # Backends
//! "etcd" above is whatever [`backend::Backend`] the storage runs on: a real etcd
//! ([`Storage::new`], [`backend::EtcdBackend`]) or the in-memory MVCC store with the same
//! revision, compare-and-swap, watch and compaction semantics ([`Storage::in_memory`],
//! [`backend::MemoryBackend`]), which tests use to run without etcd.

pub mod backend;
mod cache;
mod compact;
mod continue_token;
mod error;
mod raw;
mod watch;

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use backend::{Backend, CasOutcome, EtcdBackend, KeyValue, MemoryBackend, RangeRequest, prefix_end};
use cache::{CacheState, Control, StoredObj};

pub use error::{GuaranteedUpdateError, StorageError};
pub use raw::{JsonListChunks, RawListResult, RawObject};
pub use watch::{RawWatchStream, WatchEvent, WatchStream};

/// How consistent reads make sure the watch cache is fresh. See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsistencyMode {
    /// Ask etcd for its current revision on every consistent read (correct with many writers).
    #[default]
    Linearizable,
    /// Trust that only this process writes the prefix: wait for the cache to apply our writes.
    SingleWriter,
}

/// Tuning of a [`Storage`].
#[derive(Debug, Clone)]
pub struct StorageOptions {
    /// Events kept in the watch cache's ring buffer (watches may start this far back).
    pub event_buffer_capacity: usize,
    /// How long an event stays in the ring once more than the newest 100 are kept (the last
    /// state of a deleted object lives in its event: this bounds how long its memory does).
    pub event_retention: Duration,
    /// How often watches with `allow_bookmarks` get a bookmark (kube-apiserver: about 60 s).
    pub bookmark_interval: Duration,
    /// How long a consistent read waits for the cache before reading etcd.
    pub consistent_read_timeout: Duration,
    /// How long a `NotOlderThan` list or a watch from a future resourceVersion waits for the
    /// cache to reach it before failing with `TooLargeResourceVersion` (kube-apiserver: 3 s).
    pub resource_version_wait: Duration,
    /// How consistent reads are made consistent.
    pub consistency: ConsistencyMode,
    /// Compare-and-swap attempts of one update before giving up with `Conflict`.
    pub max_update_attempts: u32,
    /// Timeout of the readiness probe's etcd call.
    pub ready_timeout: Duration,
    /// The etcd key coordinating compaction between servers (kube-apiserver: `compact_rev_key`).
    pub compact_key: String,
    /// How long an object lives after its last write (kube-apiserver's `--event-ttl` for
    /// Events: 1 h); `None`: for ever. Needs a backend with expiry (etcd leases).
    pub ttl: Option<Duration>,
    /// After an etcd watch message of at least this many bytes, the watch cache reopens its
    /// etcd watch at the next revision once no events came for `watch_reopen_quiet`: the gRPC
    /// stream keeps a decode buffer the size of the largest message it carried for as long as it
    /// lives (a 1.5 MiB object's event would hold megabytes for good).
    pub watch_reopen_bytes: usize,
    /// See `watch_reopen_bytes`. Not during a burst: a new etcd watch starts behind and catches
    /// up in large batches, which would call for reopening again.
    pub watch_reopen_quiet: Duration,
}

impl Default for StorageOptions {
    fn default() -> Self {
        Self {
            event_buffer_capacity: 16 * 1024,
            event_retention: Duration::from_secs(60),
            bookmark_interval: Duration::from_secs(60),
            consistent_read_timeout: Duration::from_secs(5),
            resource_version_wait: Duration::from_secs(3),
            consistency: ConsistencyMode::default(),
            max_update_attempts: 100,
            ready_timeout: Duration::from_secs(2),
            compact_key: "compact_rev_key".to_owned(),
            ttl: None,
            watch_reopen_bytes: 512 * 1024,
            watch_reopen_quiet: Duration::from_millis(500),
        }
    }
}

/// How fresh a single-object read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadConsistency {
    /// resourceVersion unset: the latest state (read-your-writes).
    Consistent,
    /// resourceVersion `0`: any state the cache has.
    Any,
}

/// `resourceVersionMatch` of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RvMatch {
    Exact,
    NotOlderThan,
}

/// Options of [`Storage::list`]. Label and field selectors are applied by the caller.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub namespace: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<RvMatch>,
    pub limit: Option<i64>,
    pub continue_token: Option<String>,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListResult {
    /// Objects in key order, each with `metadata.resourceVersion`.
    pub items: Vec<Value>,
    /// The revision of the snapshot the page was read from; the same for every page of a list.
    pub resource_version: u64,
    /// Set when more items follow.
    pub continue_token: Option<String>,
    /// How many items follow this page (only when paging). Drop it when a selector filters items.
    pub remaining_item_count: Option<i64>,
}

/// Options of [`Storage::watch`].
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    pub namespace: Option<String>,
    pub resource_version: Option<String>,
    pub send_initial_events: bool,
    pub allow_bookmarks: bool,
}

/// Delete preconditions.
#[derive(Debug, Clone, Default)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// What an update closure wants done with the current object.
#[derive(Debug, Clone)]
pub enum UpdateAction {
    /// Store this object (a no-op when it encodes to the stored bytes).
    Write(Value),
    /// Delete the object (compare-and-swap on the revision the closure saw).
    Delete,
    /// Leave the object as it is.
    Noop,
}

/// What [`Storage::guaranteed_update`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateOutcome {
    /// Written; the object carries its new resourceVersion.
    Updated(Value),
    /// Nothing written (identical bytes or `Noop`); the object as stored.
    Unchanged(Value),
    /// Deleted; the last state with resourceVersion = the revision of the delete.
    Deleted(Value),
}

/// The storage of one resource prefix. Cheap to clone; the watch cache task stops when the last
/// clone is dropped.
#[derive(Clone)]
pub struct Storage {
    inner: Arc<Inner>,
    _stop: Arc<DropGuard>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("prefix", &self.inner.prefix)
            .field("revision", &self.current_revision())
            .finish_non_exhaustive()
    }
}

/// State shared by the storage handles, the cache task and the watchers.
pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) prefix: String,
    pub(crate) options: StorageOptions,
    state: RwLock<CacheState>,
    /// The cache revision; every state change notifies (watchers wake on it).
    rev_tx: tokio_watch::Sender<u64>,
    /// The highest revision of the prefix this process wrote or saw in an etcd response: always
    /// a revision of the prefix's own keys (a write, or an object's mod revision), so the cache
    /// reaches it through the prefix's events without help.
    observed_rev: AtomicU64,
    /// Whether etcd orders progress notifications after pending events (etcd >= 3.5.13 or
    /// 3.4.31 <= v < 3.5; older ones may announce a revision before sending its events).
    pub(crate) progress_trusted: std::sync::atomic::AtomicBool,
    control: mpsc::UnboundedSender<Control>,
    compaction: tokio::sync::Mutex<compact::CompactState>,
    /// etcd watches the cache opened (the first, reconnects, reopens after outsized messages).
    pub(crate) backing_watches: AtomicU64,
}

impl Inner {
    /// The key relative to the prefix, when `key` lies under it and is UTF-8.
    pub(crate) fn relative_key<'a>(&self, key: &'a [u8]) -> Option<&'a str> {
        let rest = key.strip_prefix(self.prefix.as_bytes())?;
        std::str::from_utf8(rest).ok()
    }

    pub(crate) fn read_state<R>(&self, f: impl FnOnce(&CacheState) -> R) -> R {
        let guard = self.state.read().unwrap_or_else(PoisonError::into_inner);
        f(&guard)
    }

    pub(crate) fn with_state_mut<R>(&self, f: impl FnOnce(&mut CacheState) -> R) -> R {
        let (r, rev) = {
            let mut guard = self.state.write().unwrap_or_else(PoisonError::into_inner);
            let r = f(&mut guard);
            (r, guard.rev)
        };
        self.rev_tx.send_replace(rev);
        r
    }

    pub(crate) fn subscribe(&self) -> tokio_watch::Receiver<u64> {
        self.rev_tx.subscribe()
    }

    fn observe(&self, rev: i64) {
        if rev > 0 {
            self.observed_rev.fetch_max(rev as u64, Ordering::SeqCst);
        }
    }

    /// Observes the newest of the prefix's objects an etcd read returned (a header revision is
    /// etcd's, not the prefix's: see `observed_rev`).
    fn observe_newest(&self, kvs: &[KeyValue]) {
        if let Some(newest) = kvs.iter().map(|kv| kv.mod_revision).max() {
            self.observe(newest as i64);
        }
    }

    /// Asks etcd for a watch progress notification, when etcd's answer can be trusted.
    pub(crate) fn request_progress(&self) {
        if self.progress_trusted.load(Ordering::SeqCst) {
            // The task only stops with the storage; a send error then does not matter.
            let _ = self.control.send(Control::RequestProgress);
        }
    }

    /// Waits until the cache reached `target` (and is initialized), asking etcd for progress
    /// notifications meanwhile when `progress` is set. False on timeout.
    pub(crate) async fn wait_for_rev(&self, target: u64, timeout: Duration, progress: bool) -> bool {
        let mut rx = self.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let current = *rx.borrow_and_update();
            if current >= target.max(1) {
                return true;
            }
            if progress && current > 0 {
                self.request_progress();
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return false;
            }
            let step = (deadline - now).min(Duration::from_millis(200));
            tokio::select! {
                r = rx.changed() => if r.is_err() { return false },
                () = tokio::time::sleep(step) => {},
            }
        }
    }

    /// The current revision of etcd, from a count-only read of a single key.
    async fn etcd_revision(&self) -> Result<u64, StorageError> {
        self.backend
            .revision()
            .await
            .map_err(|e| StorageError::backend("read current revision", e))
    }

    /// Makes the cache fresh enough for a consistent read: `Ok(None)` when the read may be
    /// served from the cache, `Ok(Some(rev))` when it must go to etcd (the cache could not be
    /// shown to have caught up with etcd revision `rev` in time; 0 when unknown).
    async fn ensure_consistent(&self) -> Result<Option<u64>, StorageError> {
        let observed = self.observed_rev.load(Ordering::SeqCst);
        let timeout = self.options.consistent_read_timeout;
        if self.options.consistency == ConsistencyMode::SingleWriter {
            // Our own writes are events of the prefix: the watch delivers them without help.
            let ok = self.wait_for_rev(observed, timeout, false).await;
            return Ok(if ok { None } else { Some(0) });
        }
        let target = observed.max(self.etcd_revision().await?);
        if self.progress_trusted.load(Ordering::SeqCst) {
            let ok = self.wait_for_rev(target, timeout, true).await;
            return Ok(if ok { None } else { Some(target) });
        }
        // Without trustworthy progress notifications the cache only learns of revisions through
        // events of the prefix. Wait for our own writes fully, and briefly for the rest: if
        // the newest revisions belong to other keys, the read goes to etcd.
        if !self.wait_for_rev(observed, timeout, false).await {
            return Ok(Some(target));
        }
        let ok = self.wait_for_rev(target, UNTRUSTED_PROGRESS_GRACE, false).await;
        Ok(if ok { None } else { Some(target) })
    }

    /// Every object of the namespace (or all) read from etcd at its latest revision.
    pub(crate) async fn list_raw_from_etcd(
        &self,
        namespace: Option<&str>,
    ) -> Result<(Vec<(Arc<str>, StoredObj)>, u64), StorageError> {
        let (start, end) = cache::namespace_range(namespace);
        let end_key = match end {
            Some(end) => format!("{}{end}", self.prefix).into_bytes(),
            None => prefix_end(self.prefix.as_bytes()),
        };
        let resp = self
            .backend
            .range(RangeRequest {
                key: format!("{}{start}", self.prefix).into_bytes(),
                range_end: end_key,
                revision: None,
                limit: None,
            })
            .await
            .map_err(|e| StorageError::backend("list", e))?;
        let rev = resp.revision;
        // What this read shows of the prefix: its newest object. Not the header revision, which
        // may belong to another prefix's write: the cache never sees that one as an event, and a
        // wait for it would last the whole consistent-read timeout.
        self.observe_newest(&resp.kvs);
        let items = resp
            .kvs
            .iter()
            .filter_map(|kv| {
                let rel = self.relative_key(&kv.key)?;
                Some((Arc::from(rel), stored_of(kv)))
            })
            .collect();
        Ok((items, rev))
    }

    fn cached(&self, rel: &str) -> Option<StoredObj> {
        self.read_state(|s| s.objects.get(rel).cloned())
    }

    fn cache_rev(&self) -> u64 {
        *self.rev_tx.borrow()
    }
}

/// Parses stored bytes and sets `metadata.resourceVersion`.
pub(crate) fn decode(key: &str, data: &[u8], rev: u64) -> Result<Value, StorageError> {
    let mut value: Value = serde_json::from_slice(data).map_err(|source| StorageError::Decode {
        key: key.to_owned(),
        source,
    })?;
    if !value.is_object() {
        return Err(StorageError::Decode {
            key: key.to_owned(),
            source: serde::de::Error::custom("stored value is not a JSON object"),
        });
    }
    set_resource_version(&mut value, rev);
    Ok(value)
}

fn set_resource_version(value: &mut Value, rev: u64) {
    if let Some(obj) = value.as_object_mut() {
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert("resourceVersion".to_owned(), Value::String(rev.to_string()));
        }
    }
}

/// Encodes an object for storage: without `resourceVersion` and `selfLink`.
fn encode(key: &str, value: &mut Value) -> Result<Vec<u8>, StorageError> {
    let Some(obj) = value.as_object_mut() else {
        return Err(StorageError::Encode {
            key: key.to_owned(),
            reason: "the object is not a JSON object".to_owned(),
        });
    };
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("selfLink");
    }
    serde_json::to_vec(value).map_err(|e| StorageError::Encode {
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

/// Parses a resourceVersion: `None` when unset or empty.
fn parse_rv(value: Option<&str>) -> Result<Option<u64>, StorageError> {
    match value {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<u64>()
            .map(Some)
            .map_err(|_| StorageError::InvalidResourceVersion { value: v.to_owned() }),
    }
}

fn is_path_segment(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('%')
}

fn stored_of(kv: &KeyValue) -> StoredObj {
    StoredObj::new(Arc::from(kv.value.as_slice()), kv.mod_revision)
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";
/// How long a consistent read waits for the cache to reach etcd's revision when progress
/// notifications cannot be used, before it reads etcd instead.
const UNTRUSTED_PROGRESS_GRACE: Duration = Duration::from_millis(30);
const LIST_EXPIRED: &str = "The resourceVersion for the provided list is too old.";

impl Storage {
    /// Creates the storage of `prefix` (a trailing `/` is added when missing) and starts the
    /// watch cache in a task. Reads wait (bounded) for its initial list.
    pub async fn new(
        client: etcd_client::Client,
        prefix: impl Into<String>,
        options: StorageOptions,
    ) -> Result<Storage, StorageError> {
        Self::with_backend(Arc::new(EtcdBackend::new(client)), prefix, options).await
    }

    /// [`Storage::new`] on a fresh in-memory store of its own (see [`MemoryBackend`]); storages
    /// that must share one store use [`Storage::with_backend`] with a cloned [`MemoryBackend`].
    pub async fn in_memory(
        prefix: impl Into<String>,
        options: StorageOptions,
    ) -> Result<Storage, StorageError> {
        Self::with_backend(Arc::new(MemoryBackend::new()), prefix, options).await
    }

    /// [`Storage::new`] on any [`Backend`].
    pub async fn with_backend(
        backend: Arc<dyn Backend>,
        prefix: impl Into<String>,
        options: StorageOptions,
    ) -> Result<Storage, StorageError> {
        let mut prefix = prefix.into();
        if prefix.is_empty() || prefix == "/" {
            return Err(StorageError::InvalidOptions {
                reason: format!("storage prefix {prefix:?} must name a resource"),
            });
        }
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (rev_tx, _) = tokio_watch::channel(0);
        let inner = Arc::new(Inner {
            backend,
            prefix,
            state: RwLock::new(CacheState::new(
                options.event_buffer_capacity,
                options.event_retention,
            )),
            options,
            rev_tx,
            observed_rev: AtomicU64::new(0),
            progress_trusted: std::sync::atomic::AtomicBool::new(false),
            control: control_tx,
            compaction: tokio::sync::Mutex::new(compact::CompactState::default()),
            backing_watches: AtomicU64::new(0),
        });
        let cancel = CancellationToken::new();
        tokio::spawn(cache::run(Arc::clone(&inner), control_rx, cancel.clone()));
        Ok(Storage {
            inner,
            _stop: Arc::new(cancel.drop_guard()),
        })
    }

    /// The resource prefix, ending in `/`.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The revision the watch cache reflects (0 before its initial list).
    pub fn current_revision(&self) -> u64 {
        self.inner.cache_rev()
    }

    /// Waits until the watch cache finished its initial list.
    pub async fn wait_initialized(&self, timeout: Duration) -> Result<(), StorageError> {
        if self.inner.wait_for_rev(1, timeout, false).await {
            Ok(())
        } else {
            Err(StorageError::NotReady)
        }
    }

    /// The store under the cache.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Ready when etcd answers within [`StorageOptions::ready_timeout`] and the cache is primed.
    pub async fn ready(&self) -> bool {
        if self.current_revision() == 0 {
            return false;
        }
        matches!(
            tokio::time::timeout(self.inner.options.ready_timeout, self.inner.backend.status()).await,
            Ok(Ok(_))
        )
    }

    fn key(&self, namespace: &str, name: &str) -> Result<(String, String), StorageError> {
        if !is_path_segment(namespace) || !is_path_segment(name) {
            return Err(StorageError::InvalidOptions {
                reason: format!("namespace {namespace:?} and name {name:?} must be non-empty path segments"),
            });
        }
        let rel = format!("{namespace}/{name}");
        Ok((format!("{}{rel}", self.inner.prefix), rel))
    }

    /// Creates the object; fails with `AlreadyExists` when the key exists. Returns the object
    /// with `metadata.resourceVersion` = the revision of the write.
    pub async fn create(&self, namespace: &str, name: &str, mut obj: Value) -> Result<Value, StorageError> {
        let (key, _) = self.key(namespace, name)?;
        let bytes = encode(&key, &mut obj)?;
        let rev = self.put_new(key, bytes).await?;
        set_resource_version(&mut obj, rev);
        Ok(obj)
    }

    /// [`Storage::create`], returning the object as the bytes written (what a read of it right
    /// after returns): a response in the storage version needs no second encoding of the object.
    pub async fn create_raw(
        &self,
        namespace: &str,
        name: &str,
        mut obj: Value,
    ) -> Result<RawObject, StorageError> {
        let (key, rel) = self.key(namespace, name)?;
        let bytes = encode(&key, &mut obj)?;
        drop(obj);
        let data: Arc<[u8]> = Arc::from(bytes.as_slice());
        let rev = self.put_new(key, bytes).await?;
        Ok(RawObject::new(Arc::from(rel), StoredObj::new(data, rev)))
    }

    /// Writes `bytes` at `key` if the key does not exist; the revision of the write.
    async fn put_new(&self, key: String, bytes: Vec<u8>) -> Result<u64, StorageError> {
        let outcome = self
            .inner
            .backend
            .create_with_ttl(key.clone().into_bytes(), bytes, self.inner.options.ttl)
            .await
            .map_err(|e| StorageError::backend("create", e))?;
        let rev = match outcome {
            CasOutcome::Done(rev) => rev,
            CasOutcome::Failed(current) => {
                if let Some(kv) = current {
                    self.inner.observe(kv.mod_revision as i64);
                }
                return Err(StorageError::AlreadyExists { key });
            }
        };
        self.inner.observe(rev as i64);
        Ok(rev)
    }

    /// Reads one object; `None` when it does not exist.
    pub async fn get(
        &self,
        namespace: &str,
        name: &str,
        consistency: ReadConsistency,
    ) -> Result<Option<Value>, StorageError> {
        let (key, _) = self.key(namespace, name)?;
        let stored = self.get_stored(namespace, name, consistency).await?;
        stored.map(|o| decode(&key, &o.data, o.mod_rev)).transpose()
    }

    /// Reads one object as stored bytes (see [`RawObject`]); `None` when it does not exist.
    pub async fn get_raw(
        &self,
        namespace: &str,
        name: &str,
        consistency: ReadConsistency,
    ) -> Result<Option<RawObject>, StorageError> {
        let (_, rel) = self.key(namespace, name)?;
        let stored = self.get_stored(namespace, name, consistency).await?;
        Ok(stored.map(|o| RawObject::new(Arc::from(rel), o)))
    }

    async fn get_stored(
        &self,
        namespace: &str,
        name: &str,
        consistency: ReadConsistency,
    ) -> Result<Option<StoredObj>, StorageError> {
        let (key, rel) = self.key(namespace, name)?;
        let from_cache = match consistency {
            ReadConsistency::Any => {
                if !self
                    .inner
                    .wait_for_rev(1, self.inner.options.consistent_read_timeout, false)
                    .await
                {
                    return Err(StorageError::NotReady);
                }
                true
            }
            ReadConsistency::Consistent => self.inner.ensure_consistent().await?.is_none(),
        };
        if from_cache {
            Ok(self.inner.cached(&rel))
        } else {
            self.get_from_etcd(&key).await
        }
    }

    async fn get_from_etcd(&self, key: &str) -> Result<Option<StoredObj>, StorageError> {
        let kv = self
            .inner
            .backend
            .get(key.as_bytes().to_vec())
            .await
            .map_err(|e| StorageError::backend("get", e))?;
        let stored = kv.as_ref().map(stored_of);
        if let Some(s) = &stored {
            self.inner.observe(s.mod_rev as i64);
        }
        Ok(stored)
    }

    /// Read-modify-write with compare-and-swap on the mod revision, retried with the fresh state
    /// when another writer won. `update` sees the current object (with resourceVersion) and
    /// decides; it is not called when the object does not exist (`NotFound`).
    pub async fn guaranteed_update<F, E>(
        &self,
        namespace: &str,
        name: &str,
        mut update: F,
    ) -> Result<UpdateOutcome, GuaranteedUpdateError<E>>
    where
        F: FnMut(Value) -> Result<UpdateAction, E>,
    {
        let (key, rel) = self.key(namespace, name)?;
        let not_found = || StorageError::NotFound { key: key.clone() };
        // Fast path: the cached object, as kube-apiserver's cacher does. It may be stale (another
        // writer, or our own write the cache has not applied yet): the CAS then fails and the loop
        // continues with etcd's state, and a refusal by `update` is retried with etcd's state
        // too, so a stale copy costs one etcd round trip, as reading etcd first always would.
        // Waiting for the cache to apply our own writes first would send nearly every update
        // to etcd twice under load, when the cache is always a little behind.
        let cached = self.inner.cached(&rel);
        let (mut current, mut from_cache) = match cached {
            Some(c) => (c, true),
            None => (self.get_from_etcd(&key).await?.ok_or_else(not_found)?, false),
        };
        let attempts = self.inner.options.max_update_attempts.max(1);
        for attempt in 0..attempts {
            if attempt >= 2 && !from_cache {
                // Writers that keep losing the race in lockstep: spread them out.
                let max_ms = 1u64 << attempt.min(6);
                tokio::time::sleep(Duration::from_millis(rand::random_range(0..=max_ms))).await;
            }
            let value = decode(&key, &current.data, current.mod_rev)?;
            let action = match update(value) {
                Ok(a) => a,
                Err(e) => {
                    // A stale cached object may have caused the refusal: retry with etcd's state.
                    if from_cache {
                        from_cache = false;
                        let fresh = self.get_from_etcd(&key).await?.ok_or_else(not_found)?;
                        if fresh.mod_rev != current.mod_rev {
                            current = fresh;
                            continue;
                        }
                    }
                    return Err(GuaranteedUpdateError::Update(e));
                }
            };
            let (bytes, mut written) = match action {
                UpdateAction::Noop => (None, None),
                UpdateAction::Write(mut obj) => {
                    let bytes = encode(&key, &mut obj)?;
                    if *bytes == *current.data {
                        (None, None)
                    } else {
                        (Some(bytes), Some(obj))
                    }
                }
                UpdateAction::Delete => {
                    let outcome = self
                        .inner
                        .backend
                        .delete(key.clone().into_bytes(), current.mod_rev)
                        .await;
                    match self.cas(outcome)? {
                        Ok(rev) => {
                            let last = decode(&key, &current.data, rev)?;
                            return Ok(UpdateOutcome::Deleted(last));
                        }
                        Err(fresh) => {
                            current = fresh.ok_or_else(not_found)?;
                            from_cache = false;
                            continue;
                        }
                    }
                }
            };
            let Some(bytes) = bytes else {
                if from_cache {
                    // Unchanged compared with a possibly stale copy: confirm with etcd.
                    from_cache = false;
                    let fresh = self.get_from_etcd(&key).await?.ok_or_else(not_found)?;
                    if fresh.mod_rev != current.mod_rev {
                        current = fresh;
                        continue;
                    }
                }
                let value = decode(&key, &current.data, current.mod_rev)?;
                return Ok(UpdateOutcome::Unchanged(value));
            };
            let outcome = self
                .inner
                .backend
                .update_with_ttl(
                    key.clone().into_bytes(),
                    bytes,
                    current.mod_rev,
                    self.inner.options.ttl,
                )
                .await;
            match self.cas(outcome)? {
                Ok(rev) => {
                    let mut obj = written.take().unwrap_or(Value::Null);
                    set_resource_version(&mut obj, rev);
                    return Ok(UpdateOutcome::Updated(obj));
                }
                Err(fresh) => {
                    current = fresh.ok_or_else(not_found)?;
                    from_cache = false;
                }
            }
        }
        Err(StorageError::Conflict { key, attempts }.into())
    }

    /// Notes the outcome of a compare-and-swap: `Ok(revision)` when it succeeded, else
    /// `Err(current state)` (`None` when the key is gone).
    fn cas(
        &self,
        outcome: Result<CasOutcome, backend::BackendError>,
    ) -> Result<Result<u64, Option<StoredObj>>, StorageError> {
        let outcome = outcome.map_err(|e| StorageError::backend("compare-and-swap", e))?;
        let fresh = match outcome {
            CasOutcome::Done(rev) => {
                self.inner.observe(rev as i64);
                return Ok(Ok(rev));
            }
            CasOutcome::Failed(current) => current.as_ref().map(stored_of),
        };
        if let Some(f) = &fresh {
            self.inner.observe(f.mod_rev as i64);
        }
        Ok(Err(fresh))
    }

    /// Deletes the object when the preconditions hold (compare-and-swap, retried). Returns the
    /// last state with resourceVersion = the revision of the delete.
    pub async fn delete(
        &self,
        namespace: &str,
        name: &str,
        preconditions: Preconditions,
    ) -> Result<Value, StorageError> {
        let (key, _) = self.key(namespace, name)?;
        let check = |current: Value| -> Result<UpdateAction, StorageError> {
            let meta = current.get("metadata");
            let field = |f: &str| {
                meta.and_then(|m| m.get(f))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            if let Some(uid) = &preconditions.uid {
                let actual = field("uid");
                if *uid != actual {
                    return Err(StorageError::PreconditionFailed {
                        key: key.clone(),
                        what: "UID",
                        expected: uid.clone(),
                        actual,
                    });
                }
            }
            if let Some(rv) = preconditions.resource_version.as_ref().filter(|r| !r.is_empty()) {
                let actual = field("resourceVersion");
                if *rv != actual {
                    return Err(StorageError::PreconditionFailed {
                        key: key.clone(),
                        what: "ResourceVersion",
                        expected: rv.clone(),
                        actual,
                    });
                }
            }
            Ok(UpdateAction::Delete)
        };
        match self.guaranteed_update(namespace, name, check).await {
            Ok(UpdateOutcome::Deleted(v) | UpdateOutcome::Unchanged(v) | UpdateOutcome::Updated(v)) => Ok(v),
            Err(GuaranteedUpdateError::Storage(e) | GuaranteedUpdateError::Update(e)) => Err(e),
        }
    }

    /// Lists objects; see the contract §3.3 for the resourceVersion semantics.
    pub async fn list(&self, opts: &ListOptions) -> Result<ListResult, StorageError> {
        self.list_raw(opts).await?.decode()
    }

    /// [`Storage::list`] with the objects as stored bytes (see [`RawObject`]).
    pub async fn list_raw(&self, opts: &ListOptions) -> Result<RawListResult, StorageError> {
        let limit = opts.limit.filter(|l| *l > 0).map(|l| l as usize);
        let ns = opts.namespace.as_deref().filter(|n| !n.is_empty());
        let rv = parse_rv(opts.resource_version.as_deref())?;
        if let Some(token) = opts.continue_token.as_deref().filter(|t| !t.is_empty()) {
            if opts.resource_version_match.is_some() {
                return Err(StorageError::InvalidOptions {
                    reason: "resourceVersionMatch is forbidden when continue is provided".to_owned(),
                });
            }
            if rv.is_some_and(|r| r != 0) {
                return Err(StorageError::InvalidOptions {
                    reason: "specifying resource version is not allowed when using continue".to_owned(),
                });
            }
            let decoded = continue_token::decode(token)?;
            if decoded.rv == -1 {
                return self.list_from_etcd(ns, Some(&decoded.start), None, limit).await;
            }
            let at = decoded.rv as u64;
            if self.current_revision() == at
                && let Some(page) = self.list_from_cache(ns, Some(&decoded.start), limit, Some(at))?
            {
                return Ok(page);
            }
            return match self
                .list_from_etcd(ns, Some(&decoded.start), Some(at), limit)
                .await
            {
                Err(e) if e.is_compacted() => Err(StorageError::ExpiredContinue {
                    requested: decoded.rv,
                    message: CONTINUE_EXPIRED.to_owned(),
                    inconsistent_continue: Some(continue_token::encode_start(-1, &decoded.start)),
                }),
                other => other,
            };
        }
        // resourceVersion=N with a limit and no match means Exact (the legacy paging form).
        let legacy_exact = opts.resource_version_match.is_none() && limit.is_some();
        match (rv, opts.resource_version_match) {
            (None, Some(_)) => Err(StorageError::InvalidOptions {
                reason: "resourceVersionMatch is forbidden unless resourceVersion is provided".to_owned(),
            }),
            (Some(0), Some(RvMatch::Exact)) => Err(StorageError::InvalidOptions {
                reason: "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"".to_owned(),
            }),
            (None, None) => {
                if self.inner.ensure_consistent().await?.is_none()
                    && let Some(page) = self.list_from_cache(ns, None, limit, None)?
                {
                    return Ok(page);
                }
                self.list_from_etcd(ns, None, None, limit).await
            }
            (Some(0), _) => {
                if !self
                    .inner
                    .wait_for_rev(1, self.inner.options.consistent_read_timeout, false)
                    .await
                {
                    return Err(StorageError::NotReady);
                }
                self.list_from_cache(ns, None, limit, None)?
                    .ok_or(StorageError::NotReady)
            }
            (Some(n), Some(RvMatch::NotOlderThan)) | (Some(n), None) if !legacy_exact => {
                if !self
                    .inner
                    .wait_for_rev(n, self.inner.options.resource_version_wait, true)
                    .await
                {
                    return Err(StorageError::TooLargeResourceVersion {
                        requested: n,
                        current: self.current_revision(),
                    });
                }
                self.list_from_cache(ns, None, limit, None)?
                    .ok_or(StorageError::NotReady)
            }
            (Some(n), _) => {
                // Exact (or the legacy limit + resourceVersion form): exactly revision n.
                if self.current_revision() == n
                    && let Some(page) = self.list_from_cache(ns, None, limit, Some(n))?
                {
                    return Ok(page);
                }
                match self.list_from_etcd(ns, None, Some(n), limit).await {
                    Err(e) if e.is_compacted() => Err(StorageError::Expired {
                        requested: n,
                        oldest: self.inner.compaction.lock().await.compacted.max(0) as u64,
                        message: LIST_EXPIRED.to_owned(),
                    }),
                    other => other,
                }
            }
        }
    }

    /// A page from the cache; `None` when the cache is not initialized or (with `at`) no longer
    /// at revision `at`.
    fn list_from_cache(
        &self,
        ns: Option<&str>,
        start: Option<&str>,
        limit: Option<usize>,
        at: Option<u64>,
    ) -> Result<Option<RawListResult>, StorageError> {
        let snapshot = self.inner.read_state(|s| {
            if !s.initialized() || at.is_some_and(|a| a != s.rev) {
                return None;
            }
            let all = s.range(ns, start);
            let take = limit.unwrap_or(all.len()).min(all.len());
            let page: Vec<RawObject> = all[..take]
                .iter()
                .map(|(k, v)| RawObject::new(Arc::clone(k), (*v).clone()))
                .collect();
            Some((s.rev, page, all.len() - take))
        });
        let Some((rev, page, remaining)) = snapshot else {
            return Ok(None);
        };
        let continue_token = match (remaining, page.last()) {
            (1.., Some(last)) => Some(continue_token::encode_after(rev as i64, last.key())),
            _ => None,
        };
        Ok(Some(RawListResult {
            items: page,
            resource_version: rev,
            remaining_item_count: continue_token.as_ref().map(|_| remaining as i64),
            continue_token,
        }))
    }

    /// A page read from etcd at `revision` (latest when `None`).
    async fn list_from_etcd(
        &self,
        ns: Option<&str>,
        start: Option<&str>,
        revision: Option<u64>,
        limit: Option<usize>,
    ) -> Result<RawListResult, StorageError> {
        let (ns_start, ns_end) = cache::namespace_range(ns);
        let from = match start {
            Some(s) if s > ns_start.as_str() => s.to_owned(),
            _ => ns_start,
        };
        let from_key = format!("{}{from}", self.inner.prefix);
        let end_key = match &ns_end {
            Some(end) => format!("{}{end}", self.inner.prefix).into_bytes(),
            None => prefix_end(self.inner.prefix.as_bytes()),
        };
        let empty = from_key.as_bytes() >= end_key.as_slice();
        let resp = self
            .inner
            .backend
            .range(RangeRequest {
                key: if empty {
                    end_key.clone()
                } else {
                    from_key.into_bytes()
                },
                range_end: end_key,
                revision,
                limit,
            })
            .await
            .map_err(|e| StorageError::backend("list", e))
            .map_err(|e| match revision {
                Some(r) if e.is_future_revision() => StorageError::TooLargeResourceVersion {
                    requested: r,
                    current: self.current_revision(),
                },
                _ => e,
            })?;
        let list_rev = revision.unwrap_or(resp.revision);
        // The newest object listed, not `list_rev` (see `Inner::observe_newest`).
        self.inner.observe_newest(&resp.kvs);
        let mut items = Vec::with_capacity(resp.kvs.len());
        let mut last = None;
        for kv in &resp.kvs {
            let Some(rel) = self.inner.relative_key(&kv.key) else {
                continue;
            };
            items.push(RawObject::new(Arc::from(rel), stored_of(kv)));
            last = Some(rel);
        }
        if empty {
            items.clear();
            last = None;
        }
        let remaining = (resp.count as i64 - resp.kvs.len() as i64).max(0);
        let continue_token = match last {
            Some(last) if resp.more && !empty => Some(continue_token::encode_after(list_rev as i64, last)),
            _ => None,
        };
        Ok(RawListResult {
            items,
            resource_version: list_rev,
            remaining_item_count: continue_token.as_ref().map(|_| remaining),
            continue_token,
        })
    }

    /// Watches the prefix (one namespace or all); see the contract §3.4.
    pub fn watch(&self, opts: &WatchOptions) -> Result<WatchStream, StorageError> {
        Ok(self.watch_raw(opts)?.decoded())
    }

    /// [`Storage::watch`] with the objects as stored bytes (see [`RawObject`]).
    pub fn watch_raw(&self, opts: &WatchOptions) -> Result<RawWatchStream, StorageError> {
        watch::start(Arc::clone(&self.inner), opts)
    }

    /// One compaction step, coordinated like kube-apiserver; see [`compact`].
    pub async fn compact(&self) -> Result<Option<i64>, StorageError> {
        compact::step(&self.inner).await
    }

    /// Runs [`Storage::compact`] every `interval` until the storage is dropped.
    pub fn spawn_compactor(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                match compact::step(&inner).await {
                    Ok(Some(rev)) => tracing::info!(prefix = %inner.prefix, rev, "compacted etcd"),
                    Ok(None) => {
                        tracing::debug!(prefix = %inner.prefix, "compaction: nothing to do this round")
                    }
                    Err(e) => {
                        tracing::warn!(prefix = %inner.prefix, error = %etcd_operator_api::report::Chain(&e), "compaction failed")
                    }
                }
            }
        })
    }

    /// Test hook: drops the cache's etcd watch and resumes it after `pause`.
    #[cfg(test)]
    pub(crate) fn disconnect_cache_watch(&self, pause: Duration) {
        let _ = self.inner.control.send(Control::Disconnect(pause));
    }
}
