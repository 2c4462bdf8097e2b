//! The key-value store under the watch cache: exactly the etcd calls [`super::Storage`] makes,
//! behind a trait, with the etcd implementation ([`EtcdBackend`]) and an in-memory MVCC one
//! ([`MemoryBackend`]) for tests that need no etcd.
//!
//! Revisions follow etcd: one global counter starting at 1, bumped by every successful write;
//! every key carries its create and mod revisions; reads and watches at a revision older than
//! the last compaction fail with [`BackendError::Compacted`] (or the equivalent etcd error).

mod etcd;
mod memory;

#[cfg(test)]
mod memory_tests;

use etcd_operator_etcd_errors::{self as etcd_errors, EtcdErrorKind};
use futures::future::BoxFuture;

pub use etcd::EtcdBackend;
pub use memory::MemoryBackend;

/// One key as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The revision that created the key (0 on a delete event).
    pub create_revision: u64,
    /// The revision of the last change (on a delete event: the revision of the delete).
    pub mod_revision: u64,
    /// Puts since the key was created (0 on a delete event).
    pub version: i64,
}

/// A range read: `[key, range_end)`; `range_end` `[0]` means every key from `key` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRequest {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    /// Read at this revision (latest when `None`).
    pub revision: Option<u64>,
    /// At most this many keys (all when `None`).
    pub limit: Option<usize>,
}

/// The answer of a range read.
#[derive(Debug, Clone, Default)]
pub struct RangeResponse {
    /// Keys in order, at most `limit`.
    pub kvs: Vec<KeyValue>,
    /// The store's current revision when the read was served (not the requested one).
    pub revision: u64,
    /// Keys in the range, `limit` ignored.
    pub count: u64,
    /// Whether the limit cut the answer short.
    pub more: bool,
}

/// The outcome of a compare-and-swap write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasOutcome {
    /// Written at this revision.
    Done(u64),
    /// The compare failed; the key's current state (`None` when it does not exist).
    Failed(Option<KeyValue>),
}

/// The outcome of [`Backend::put_if_version`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionCas {
    pub succeeded: bool,
    /// The store's revision after the call.
    pub revision: u64,
    /// On failure: the key's current version (0 when absent).
    pub version: i64,
}

/// Facts about the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStatus {
    /// The etcd version (decides whether progress notifications are ordered with events).
    pub version: String,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEventKind {
    Put,
    Delete,
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: WatchEventKind,
    /// For a delete: the key with `mod_revision` = the revision of the delete, empty value.
    pub kv: KeyValue,
    /// The state before the change, when the backend knows it cheaply (etcd: never asked for).
    pub prev: Option<KeyValue>,
}

/// One message of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchResponse {
    /// Changes, in revision order.
    Events(Vec<WatchEvent>),
    /// Every event up to this revision was sent.
    Progress(u64),
    /// The start revision was compacted; the watch ends.
    Compacted(u64),
}

/// An open watch of a prefix.
pub trait BackendWatch: Send {
    /// The next message; `Ok(None)` when the watch ended.
    fn next(&mut self) -> BoxFuture<'_, Result<Option<WatchResponse>, BackendError>>;
    /// Asks for a [`WatchResponse::Progress`] ordered after the events sent so far.
    fn request_progress(&mut self) -> BoxFuture<'_, Result<(), BackendError>>;
}

/// The store operations [`super::Storage`] needs. Futures are boxed so the trait is object safe
/// (`Arc<dyn Backend>`); the cost is an allocation per call, small beside a network round trip.
pub trait Backend: Send + Sync + 'static {
    /// The current revision.
    fn revision(&self) -> BoxFuture<'_, Result<u64, BackendError>>;
    /// Health and version of the store (the readiness probe times it out).
    fn status(&self) -> BoxFuture<'_, Result<BackendStatus, BackendError>>;
    /// One key at the latest revision.
    fn get(&self, key: Vec<u8>) -> BoxFuture<'_, Result<Option<KeyValue>, BackendError>>;
    /// A range of keys, at a revision or the latest.
    fn range(&self, request: RangeRequest) -> BoxFuture<'_, Result<RangeResponse, BackendError>>;
    /// Puts `value` when `key` does not exist.
    fn create(&self, key: Vec<u8>, value: Vec<u8>) -> BoxFuture<'_, Result<CasOutcome, BackendError>>;
    /// Puts `value` when the key's mod revision is `mod_revision`.
    fn update(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        mod_revision: u64,
    ) -> BoxFuture<'_, Result<CasOutcome, BackendError>>;
    /// Deletes the key when its mod revision is `mod_revision`.
    fn delete(&self, key: Vec<u8>, mod_revision: u64) -> BoxFuture<'_, Result<CasOutcome, BackendError>>;
    /// Puts `value` when the key's version is `version` (0: absent); compaction coordination.
    fn put_if_version(
        &self,
        key: Vec<u8>,
        version: i64,
        value: Vec<u8>,
    ) -> BoxFuture<'_, Result<VersionCas, BackendError>>;
    /// Watches every key starting with `prefix` from `start_revision` on (inclusive).
    fn watch(
        &self,
        prefix: Vec<u8>,
        start_revision: u64,
    ) -> BoxFuture<'_, Result<Box<dyn BackendWatch>, BackendError>>;
    /// Forgets every revision before `revision`.
    fn compact(&self, revision: u64) -> BoxFuture<'_, Result<(), BackendError>>;

    /// [`Backend::create`] with the key expiring `ttl` after the write (etcd: a lease of its
    /// own). Backends without expiry ignore `ttl`.
    fn create_with_ttl(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        let _ = ttl;
        self.create(key, value)
    }

    /// [`Backend::update`] with the key expiring `ttl` after the write, as kube-apiserver
    /// attaches a fresh lease on every write of a resource with a TTL. Backends without expiry
    /// ignore `ttl`.
    fn update_with_ttl(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        mod_revision: u64,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        let _ = ttl;
        self.update(key, value, mod_revision)
    }
}

/// A backend call failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The etcd client failed (including etcd's own compaction and future-revision errors).
    #[error(transparent)]
    Etcd(#[from] etcd_client::Error),
    /// The requested revision was compacted (etcd's wording).
    #[error(
        "etcdserver: mvcc: required revision has been compacted (requested {requested}, compacted {compacted})"
    )]
    Compacted { requested: u64, compacted: u64 },
    /// The requested revision is newer than the store (etcd's wording).
    #[error(
        "etcdserver: mvcc: required revision is a future revision (requested {requested}, current {current})"
    )]
    FutureRevision { requested: u64, current: u64 },
    /// The watch stream failed.
    #[error("watch failed: {0}")]
    Watch(String),
}

impl BackendError {
    /// Whether the requested revision was compacted.
    pub fn is_compacted(&self) -> bool {
        match self {
            Self::Compacted { .. } => true,
            Self::Etcd(e) => etcd_errors::classify(e) == EtcdErrorKind::Compacted,
            _ => false,
        }
    }

    /// Whether the requested revision is in the future.
    pub fn is_future_revision(&self) -> bool {
        match self {
            Self::FutureRevision { .. } => true,
            Self::Etcd(e) => etcd_errors::classify(e) == EtcdErrorKind::FutureRevision,
            _ => false,
        }
    }
}

/// The first key after every key starting with `prefix` (`[0]`: to the end of the keyspace).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
