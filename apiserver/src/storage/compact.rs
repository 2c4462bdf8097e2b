//! Compaction of the backing etcd, coordinated between servers the way kube-apiserver does it
//! (`k8s.io/apiserver/pkg/storage/etcd3/compact.go`).
//!
//! Each step runs a transaction `If(version(compact_rev_key) == t) Then Put(compact_rev_key, rev)
//! Else Get(compact_rev_key)`. The winner of a round compacts etcd to the revision it saw in the
//! *previous* round, so at least one interval of history is always kept (with a 5 minute
//! interval: 5–10 minutes, enough for watches to resume from a recent bookmark). The first
//! round only records the current revision. Several servers (or several storages in one
//! process) sharing the key compact once per round between them.

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
    let key = inner.options.compact_key.as_bytes().to_vec();
    let round = inner
        .backend
        .put_if_version(key, state.time, state.rev.to_string().into_bytes())
        .await
        .map_err(|e| StorageError::backend("compaction: update compact key", e))?;
    let current_rev = round.revision as i64;
    if !round.succeeded {
        // Another server compacted in this round: adopt its clock, target our current revision.
        state.time = round.version;
        state.rev = current_rev;
        return Ok(None);
    }
    state.time += 1;
    let target = state.rev;
    state.rev = current_rev;
    if target <= 0 || target <= state.compacted {
        return Ok(None);
    }
    match inner.backend.compact(target as u64).await {
        Ok(()) => {}
        Err(e) if e.is_compacted() => {}
        Err(e) => return Err(StorageError::backend("compaction: compact", e)),
    }
    state.compacted = target;
    drop(state);
    inner.with_state_mut(|s| s.compacted(target as u64));
    Ok(Some(target))
}
