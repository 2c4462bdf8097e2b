//! [`Backend`] on a real etcd through `etcd_client`: transactions comparing mod revision or
//! version, ranges at a revision, a prefix watch with progress notifications.

use etcd_client::{
    Compare, CompareOp, DeleteOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions as EtcdWatchOptions,
};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::{
    Backend, BackendError, BackendStatus, BackendWatch, CasOutcome, KeyValue, RangeRequest, RangeResponse,
    VersionCas, WatchEvent, WatchEventKind, WatchResponse,
};

/// Largest gRPC message accepted from etcd (lists of many objects, batched events).
pub(crate) const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// The key of the count-only read that asks etcd for its current revision (any key would do).
const REVISION_PROBE_KEY: &[u8] = b"/registry/";

/// The etcd backend: a cheap-to-clone `etcd_client::Client`.
#[derive(Clone)]
pub struct EtcdBackend {
    client: etcd_client::Client,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend").finish_non_exhaustive()
    }
}

impl EtcdBackend {
    pub fn new(client: etcd_client::Client) -> Self {
        Self { client }
    }
}

fn rev(r: i64) -> u64 {
    r.max(0) as u64
}

fn kv_of(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        create_revision: rev(kv.create_revision()),
        mod_revision: rev(kv.mod_revision()),
        version: kv.version(),
    }
}

fn header_rev(h: Option<&etcd_client::ResponseHeader>) -> u64 {
    rev(h.map_or(0, |h| h.revision()))
}

fn first_kv(resp: &TxnOpResponse) -> Option<KeyValue> {
    match resp {
        TxnOpResponse::Get(g) => g.kvs().first().map(kv_of),
        _ => None,
    }
}

impl EtcdBackend {
    /// Put options carrying a new lease of `ttl` (rounded up to whole seconds), or none.
    async fn lease_options(
        &self,
        ttl: Option<std::time::Duration>,
    ) -> Result<Option<PutOptions>, BackendError> {
        let Some(ttl) = ttl else {
            return Ok(None);
        };
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let lease = self
            .client
            .lease_client()
            .grant(i64::try_from(seconds).unwrap_or(i64::MAX).max(1), None)
            .await?;
        Ok(Some(PutOptions::new().with_lease(lease.id())))
    }

    /// Runs `If(compare) Then(op) Else(Get(key))`.
    async fn cas(&self, key: Vec<u8>, compare: Compare, op: TxnOp) -> Result<CasOutcome, BackendError> {
        let txn = Txn::new()
            .when([compare])
            .and_then([op])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.client.kv_client().txn(txn).await?;
        if resp.succeeded() {
            return Ok(CasOutcome::Done(header_rev(resp.header())));
        }
        Ok(CasOutcome::Failed(resp.op_responses().first().and_then(first_kv)))
    }
}

impl Backend for EtcdBackend {
    fn revision(&self) -> BoxFuture<'_, Result<u64, BackendError>> {
        async move {
            let resp = self
                .client
                .kv_client()
                .get(REVISION_PROBE_KEY, Some(GetOptions::new().with_count_only()))
                .await?;
            Ok(header_rev(resp.header()))
        }
        .boxed()
    }

    fn status(&self) -> BoxFuture<'_, Result<BackendStatus, BackendError>> {
        async move {
            let status = self.client.maintenance_client().status().await?;
            Ok(BackendStatus {
                version: status.version().to_owned(),
            })
        }
        .boxed()
    }

    fn get(&self, key: Vec<u8>) -> BoxFuture<'_, Result<Option<KeyValue>, BackendError>> {
        async move {
            let resp = self.client.kv_client().get(key, None).await?;
            Ok(resp.kvs().first().map(kv_of))
        }
        .boxed()
    }

    fn range(&self, request: RangeRequest) -> BoxFuture<'_, Result<RangeResponse, BackendError>> {
        async move {
            let mut options = GetOptions::new().with_range(request.range_end);
            if let Some(r) = request.revision {
                options = options.with_revision(r as i64);
            }
            if let Some(l) = request.limit {
                options = options.with_limit(l as i64);
            }
            let resp = self
                .client
                .kv_client()
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .get(request.key, Some(options))
                .await?;
            Ok(RangeResponse {
                kvs: resp.kvs().iter().map(kv_of).collect(),
                revision: header_rev(resp.header()),
                count: resp.count().max(0) as u64,
                more: resp.more(),
            })
        }
        .boxed()
    }

    fn create(&self, key: Vec<u8>, value: Vec<u8>) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        async move {
            let compare = Compare::mod_revision(key.clone(), CompareOp::Equal, 0);
            let op = TxnOp::put(key.clone(), value, None);
            self.cas(key, compare, op).await
        }
        .boxed()
    }

    fn update(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        mod_revision: u64,
    ) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        async move {
            let compare = Compare::mod_revision(key.clone(), CompareOp::Equal, mod_revision as i64);
            let op = TxnOp::put(key.clone(), value, None);
            self.cas(key, compare, op).await
        }
        .boxed()
    }

    fn create_with_ttl(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        async move {
            let options = self.lease_options(ttl).await?;
            let compare = Compare::mod_revision(key.clone(), CompareOp::Equal, 0);
            let op = TxnOp::put(key.clone(), value, options);
            self.cas(key, compare, op).await
        }
        .boxed()
    }

    fn update_with_ttl(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        mod_revision: u64,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        async move {
            let options = self.lease_options(ttl).await?;
            let compare = Compare::mod_revision(key.clone(), CompareOp::Equal, mod_revision as i64);
            let op = TxnOp::put(key.clone(), value, options);
            self.cas(key, compare, op).await
        }
        .boxed()
    }

    fn delete(&self, key: Vec<u8>, mod_revision: u64) -> BoxFuture<'_, Result<CasOutcome, BackendError>> {
        async move {
            let compare = Compare::mod_revision(key.clone(), CompareOp::Equal, mod_revision as i64);
            let op = TxnOp::delete(key.clone(), Some(DeleteOptions::new().with_prev_key()));
            self.cas(key, compare, op).await
        }
        .boxed()
    }

    fn put_if_version(
        &self,
        key: Vec<u8>,
        version: i64,
        value: Vec<u8>,
    ) -> BoxFuture<'_, Result<VersionCas, BackendError>> {
        async move {
            let txn = Txn::new()
                .when([Compare::version(key.clone(), CompareOp::Equal, version)])
                .and_then([TxnOp::put(key.clone(), value, None)])
                .or_else([TxnOp::get(key, None)]);
            let resp = self.client.kv_client().txn(txn).await?;
            let current = resp
                .op_responses()
                .first()
                .and_then(first_kv)
                .map_or(0, |kv| kv.version);
            Ok(VersionCas {
                succeeded: resp.succeeded(),
                revision: header_rev(resp.header()),
                version: current,
            })
        }
        .boxed()
    }

    fn watch(
        &self,
        prefix: Vec<u8>,
        start_revision: u64,
    ) -> BoxFuture<'_, Result<Box<dyn BackendWatch>, BackendError>> {
        async move {
            // No `prev_kv`: the cache holds every object's last state already (it lists, then
            // follows every event from the list revision), and asking etcd for it costs a
            // backend read per event.
            let options = EtcdWatchOptions::new()
                .with_prefix()
                .with_progress_notify()
                .with_start_revision(start_revision as i64);
            let stream = self
                .client
                .watch_client()
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .watch(prefix, Some(options))
                .await?;
            Ok(Box::new(EtcdWatch { stream }) as Box<dyn BackendWatch>)
        }
        .boxed()
    }

    fn compact(&self, revision: u64) -> BoxFuture<'_, Result<(), BackendError>> {
        async move {
            self.client.kv_client().compact(revision as i64, None).await?;
            Ok(())
        }
        .boxed()
    }
}

struct EtcdWatch {
    stream: etcd_client::WatchStream,
}

impl BackendWatch for EtcdWatch {
    fn next(&mut self) -> BoxFuture<'_, Result<Option<WatchResponse>, BackendError>> {
        async move {
            loop {
                let Some(resp) = self.stream.message().await? else {
                    return Ok(None);
                };
                if resp.canceled() {
                    if resp.compact_revision() > 0 {
                        return Ok(Some(WatchResponse::Compacted(rev(resp.compact_revision()))));
                    }
                    return Err(BackendError::Watch(format!(
                        "watch canceled: {}",
                        resp.cancel_reason()
                    )));
                }
                if resp.created() {
                    continue;
                }
                if resp.events().is_empty() {
                    // A progress notification: every event up to the header revision was sent.
                    return Ok(Some(WatchResponse::Progress(header_rev(resp.header()))));
                }
                let events = resp
                    .events()
                    .iter()
                    .filter_map(|e| {
                        let kv = kv_of(e.kv()?);
                        let kind = match e.event_type() {
                            EventType::Put => WatchEventKind::Put,
                            EventType::Delete => WatchEventKind::Delete,
                        };
                        Some(WatchEvent {
                            kind,
                            kv,
                            prev: e.prev_kv().map(kv_of),
                        })
                    })
                    .collect();
                return Ok(Some(WatchResponse::Events(events)));
            }
        }
        .boxed()
    }

    fn request_progress(&mut self) -> BoxFuture<'_, Result<(), BackendError>> {
        async move {
            self.stream.request_progress().await?;
            Ok(())
        }
        .boxed()
    }
}
