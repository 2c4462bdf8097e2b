//! [`Backend`] in memory: a small MVCC key-value store with etcd's revision semantics, for
//! tests (the HTTP suite runs on it in milliseconds) and anything else that needs no etcd.
//!
//! Hand-written: no crate offers an in-process store with etcd's revision model (global
//! revision, per-key create/mod revision and version, reads at a revision, compaction that
//! fails older reads and watches, prefix watches from a revision with ordered progress
//! notifications), and the model is small. Every key keeps its versions in a `BTreeMap`; an
//! event log (dropped up to the compacted revision) serves watches from a past revision; live
//! watches get events through unbounded channels, sent under the store lock so that events and
//! progress notifications stay in revision order. History is kept until [`Backend::compact`].

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;

use super::{
    Backend, BackendError, BackendStatus, BackendWatch, CasOutcome, KeyValue, RangeRequest, RangeResponse,
    VersionCas, WatchEvent, WatchEventKind, WatchResponse,
};

/// The etcd version the in-memory store reports: one whose progress notifications are ordered
/// with events, which this store guarantees too.
const REPORTED_VERSION: &str = "3.5.21";

/// The in-memory store. Clones share the same data.
#[derive(Clone, Default)]
pub struct MemoryBackend {
    store: Arc<Mutex<Store>>,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rev, compacted) = self.with_store(|s| (s.rev, s.compacted));
        f.debug_struct("MemoryBackend")
            .field("revision", &rev)
            .field("compacted", &compacted)
            .finish_non_exhaustive()
    }
}

/// One version of a key: its state from `mod_rev` on (`None`: deleted).
#[derive(Debug, Clone)]
struct Entry {
    mod_rev: u64,
    kv: Option<KeyValue>,
}

#[derive(Debug)]
struct Store {
    /// The current revision (1 for an empty store, as etcd).
    rev: u64,
    /// Reads and watches before this revision fail (0: never compacted).
    compacted: u64,
    /// Versions of every key, oldest first.
    keys: BTreeMap<Vec<u8>, Vec<Entry>>,
    /// Every event with a revision >= `compacted`, in revision order.
    log: VecDeque<WatchEvent>,
    watchers: Vec<Watcher>,
}

#[derive(Debug)]
struct Watcher {
    prefix: Vec<u8>,
    tx: mpsc::UnboundedSender<WatchResponse>,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            rev: 1,
            compacted: 0,
            keys: BTreeMap::new(),
            log: VecDeque::new(),
            watchers: Vec::new(),
        }
    }
}

impl Store {
    /// The state of `key` at revision `rev`.
    fn at(&self, key: &[u8], rev: u64) -> Option<&KeyValue> {
        let entries = self.keys.get(key)?;
        let idx = entries.partition_point(|e| e.mod_rev <= rev);
        entries.get(idx.checked_sub(1)?)?.kv.as_ref()
    }

    fn latest(&self, key: &[u8]) -> Option<&KeyValue> {
        self.at(key, self.rev)
    }

    fn publish(&mut self, event: WatchEvent) {
        self.watchers.retain(|w| {
            !event.kv.key.starts_with(&w.prefix)
                || w.tx.send(WatchResponse::Events(vec![event.clone()])).is_ok()
        });
        self.log.push_back(event);
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> u64 {
        let rev = self.rev + 1;
        self.rev = rev;
        let prev = self.at(&key, rev - 1).cloned();
        let kv = KeyValue {
            key: key.clone(),
            value,
            create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
            mod_revision: rev,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
        };
        self.keys.entry(key).or_default().push(Entry {
            mod_rev: rev,
            kv: Some(kv.clone()),
        });
        self.publish(WatchEvent {
            kind: WatchEventKind::Put,
            kv,
            prev,
        });
        rev
    }

    /// Deletes a key that exists.
    fn delete(&mut self, key: Vec<u8>, prev: KeyValue) -> u64 {
        let rev = self.rev + 1;
        self.rev = rev;
        self.keys.entry(key.clone()).or_default().push(Entry {
            mod_rev: rev,
            kv: None,
        });
        self.publish(WatchEvent {
            kind: WatchEventKind::Delete,
            kv: KeyValue {
                key,
                value: Vec::new(),
                create_revision: 0,
                mod_revision: rev,
                version: 0,
            },
            prev: Some(prev),
        });
        rev
    }

    fn check_read_revision(&self, rev: u64) -> Result<(), BackendError> {
        if rev > self.rev {
            return Err(BackendError::FutureRevision {
                requested: rev,
                current: self.rev,
            });
        }
        if rev < self.compacted {
            return Err(BackendError::Compacted {
                requested: rev,
                compacted: self.compacted,
            });
        }
        Ok(())
    }

    fn range(&self, request: &RangeRequest) -> Result<RangeResponse, BackendError> {
        let at = request.revision.filter(|r| *r > 0).unwrap_or(self.rev);
        self.check_read_revision(at)?;
        let upper = if request.range_end == [0] {
            Bound::Unbounded
        } else if request.range_end.is_empty() {
            Bound::Included(request.key.as_slice())
        } else {
            Bound::Excluded(request.range_end.as_slice())
        };
        if let Bound::Excluded(end) = upper
            && request.key.as_slice() >= end
        {
            return Ok(RangeResponse {
                revision: self.rev,
                ..RangeResponse::default()
            });
        }
        let live: Vec<&KeyValue> = self
            .keys
            .range::<[u8], _>((Bound::Included(request.key.as_slice()), upper))
            .filter_map(|(k, _)| self.at(k, at))
            .collect();
        let count = live.len();
        let take = request.limit.filter(|l| *l > 0).unwrap_or(count).min(count);
        Ok(RangeResponse {
            kvs: live[..take].iter().map(|kv| (*kv).clone()).collect(),
            revision: self.rev,
            count: count as u64,
            more: take < count,
        })
    }

    fn compact(&mut self, rev: u64) -> Result<(), BackendError> {
        if rev <= self.compacted {
            return Err(BackendError::Compacted {
                requested: rev,
                compacted: self.compacted,
            });
        }
        if rev > self.rev {
            return Err(BackendError::FutureRevision {
                requested: rev,
                current: self.rev,
            });
        }
        self.compacted = rev;
        self.keys.retain(|_, entries| {
            // Keep the state at `rev` (when the key exists then) and everything after it.
            let idx = entries.partition_point(|e| e.mod_rev <= rev);
            let keep_from = match idx.checked_sub(1).and_then(|i| entries.get(i).map(|e| (i, e))) {
                Some((i, e)) if e.kv.is_some() => i,
                _ => idx,
            };
            entries.drain(..keep_from);
            !entries.is_empty()
        });
        while self.log.front().is_some_and(|e| e.kv.mod_revision < rev) {
            self.log.pop_front();
        }
        Ok(())
    }
}

impl MemoryBackend {
    /// An empty store at revision 1.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let mut guard = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    /// Compare-and-swap on the key's mod revision (0: absent), then `write`.
    fn cas(
        &self,
        key: Vec<u8>,
        expected: u64,
        write: impl FnOnce(&mut Store, Vec<u8>, Option<KeyValue>) -> u64,
    ) -> CasOutcome {
        self.with_store(|s| {
            let current = s.latest(&key).cloned();
            let actual = current.as_ref().map_or(0, |kv| kv.mod_revision);
            if actual != expected {
                return CasOutcome::Failed(current);
            }
            CasOutcome::Done(write(s, key, current))
        })
    }
}

fn ready<T: Send + 'static>(value: T) -> BoxFuture<'static, T> {
    futures::future::ready(value).boxed()
}

impl Backend for MemoryBackend {
    fn revision(&self) -> BoxFuture<'_, Result<u64, BackendError>> {
        ready(Ok(self.with_store(|s| s.rev)))
    }

    fn status(&self) -> BoxFuture<'_, Result<BackendStatus, BackendError>> {
        ready(Ok(BackendStatus {
            version: REPORTED_VERSION.to_owned(),
        }))
    }

    fn get(&self, key: Vec<u8>) -> BoxFuture<'_, Result<Option<KeyValue>, BackendError>> {
        ready(Ok(self.with_store(|s| s.latest(&key).cloned())))
    }

    fn range(&self, request: RangeRequest) -> BoxFuture<'_, Result<RangeResponse, BackendError>> {
        ready(self.with_store(|s| s.range(&request)))
    }

    fn create(&self, key: Vec<u8>, value: Vec<u8>) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        ready(Ok(self.cas(key, 0, |s, key, _| s.put(key, value))))
    }

    fn update(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        mod_revision: u64,
    ) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        ready(Ok(self.cas(key, mod_revision, |s, key, _| s.put(key, value))))
    }

    fn delete(&self, key: Vec<u8>, mod_revision: u64) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        ready(Ok(self.cas(key, mod_revision, |s, key, current| match current {
            Some(prev) => s.delete(key, prev),
            // Deleting nothing writes nothing (etcd does not bump the revision either).
            None => s.rev,
        })))
    }

    fn put_if_version(
        &self,
        key: Vec<u8>,
        version: i64,
        value: Vec<u8>,
    ) -> BoxFuture<'_, Result<VersionCas, BackendError>> {
        ready(Ok(self.with_store(|s| {
            let current = s.latest(&key).map_or(0, |kv| kv.version);
            if current != version {
                return VersionCas {
                    succeeded: false,
                    revision: s.rev,
                    version: current,
                };
            }
            let revision = s.put(key, value);
            VersionCas {
                succeeded: true,
                revision,
                version: current + 1,
            }
        })))
    }

    fn watch(
        &self,
        prefix: Vec<u8>,
        start_revision: u64,
    ) -> BoxFuture<'_, Result<Box<dyn BackendWatch>, BackendError>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.with_store(|s| {
            // As etcd: a start revision before the compacted one cancels the watch.
            if start_revision > 0 && start_revision < s.compacted {
                let _ = tx.send(WatchResponse::Compacted(s.compacted));
                return;
            }
            let start = if start_revision == 0 {
                s.rev + 1
            } else {
                start_revision
            };
            let past: Vec<WatchEvent> = s
                .log
                .iter()
                .filter(|e| e.kv.mod_revision >= start && e.kv.key.starts_with(&prefix))
                .cloned()
                .collect();
            if !past.is_empty() {
                let _ = tx.send(WatchResponse::Events(past));
            }
            s.watchers.push(Watcher {
                prefix,
                tx: tx.clone(),
            });
        });
        let watch = MemoryWatch {
            store: Arc::clone(&self.store),
            tx,
            rx,
        };
        ready(Ok(Box::new(watch) as Box<dyn BackendWatch>))
    }

    fn compact(&self, revision: u64) -> BoxFuture<'_, Result<(), BackendError>> {
        ready(self.with_store(|s| s.compact(revision)))
    }
}

struct MemoryWatch {
    store: Arc<Mutex<Store>>,
    /// This watch's own sender, for progress notifications queued behind its events.
    tx: mpsc::UnboundedSender<WatchResponse>,
    rx: mpsc::UnboundedReceiver<WatchResponse>,
}

impl BackendWatch for MemoryWatch {
    fn next(&mut self) -> BoxFuture<'_, Result<Option<WatchResponse>, BackendError>> {
        async move {
            let msg = self.rx.recv().await;
            if matches!(msg, Some(WatchResponse::Compacted(_))) {
                self.rx.close();
            }
            Ok(msg)
        }
        .boxed()
    }

    fn request_progress(&mut self) -> BoxFuture<'_, Result<(), BackendError>> {
        let guard = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        // Under the store lock: no event can slip in between the revision and the send.
        let _ = self.tx.send(WatchResponse::Progress(guard.rev));
        drop(guard);
        ready(Ok(()))
    }
}
