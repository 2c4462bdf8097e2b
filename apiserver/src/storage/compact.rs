//! Compaction of the backing etcd, coordinated between servers the way kube-apiserver does it
//! (`k8s.io/apiserver/pkg/storage/etcd3/compact.go`).
//!
//! Each step runs a transaction `If(version(compact_rev_key) == t) Then Put(compact_rev_key, rev)
//! Else Get(compact_rev_key)`. The winner of a round compacts etcd to the revision it saw in the
//! *previous* round, so at least one interval of history is always kept (with a 5 minute
//! interval: 5–10 minutes, enough for watches to resume from a recent bookmark). The first
//! round only records the current revision. Several servers (or several storages in one
//! process) sharing the key compact once per round between them.

use etcd_client::{Compare, CompareOp, TxnOp, TxnOpResponse};

use super::Inner;
use super::error::StorageError;

/// What the previous round saw.
#[derive(Debug, Default)]
pub(crate) struct CompactState {
    /// The version of the compact key this server expects (its logical clock).
    time: i64,
    /// The etcd revision seen in the previous round: the next compaction target.
    rev: i64,
    /// The last revision this server compacted to.
    pub(crate) compacted: i64,
}

/// One round. `Ok(Some(rev))` when etcd was compacted to `rev`.
pub(crate) async fn step(inner: &Inner) -> Result<Option<i64>, StorageError> {
    let mut state = inner.compaction.lock().await;
    let key = inner.options.compact_key.as_str();
    let txn = etcd_client::Txn::new()
        .when([Compare::version(key, CompareOp::Equal, state.time)])
        .and_then([TxnOp::put(key, state.rev.to_string(), None)])
        .or_else([TxnOp::get(key, None)]);
    let resp = inner
        .client
        .kv_client()
        .txn(txn)
        .await
        .map_err(|e| StorageError::etcd("compaction: update compact key", e))?;
    let current_rev = resp.header().map_or(0, |h| h.revision());
    if !resp.succeeded() {
        // Another server compacted in this round: adopt its clock, target our current revision.
        let version = resp
            .op_responses()
            .first()
            .and_then(|r| match r {
                TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.version()),
                _ => None,
            })
            .unwrap_or(0);
        state.time = version;
        state.rev = current_rev;
        return Ok(None);
    }
    state.time += 1;
    let target = state.rev;
    state.rev = current_rev;
    if target <= 0 || target <= state.compacted {
        return Ok(None);
    }
    match inner.client.kv_client().compact(target, None).await {
        Ok(_) => {}
        Err(e) if e.to_string().contains("required revision has been compacted") => {}
        Err(e) => return Err(StorageError::etcd("compaction: compact", e)),
    }
    state.compacted = target;
    drop(state);
    inner.with_state_mut(|s| s.compacted(target as u64));
    Ok(Some(target))
}
