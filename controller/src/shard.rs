//! Which EtcdClusters this replica reconciles: clusters are split into shards by a stable hash of
//! `namespace/name`, and a replica reconciles the clusters of the shards it holds (in serve mode,
//! one `coordination.k8s.io/v1` Lease per shard; the operator's shard manager takes and renews
//! them and tells this handle).
//!
//! [`shard_of`] is pure and fixed across processes and releases (64-bit FNV-1a, written out
//! here: std's hashers are seeded per process). [`ShardOwnership`] is the cheap shared handle the
//! reconcilers ask: a shard is owned only until the instant its Lease renewal allows
//! ([`ShardOwnership::hold`]), checked on every question, so a replica whose shard manager
//! cannot reach kube-apiserver stops on time even while its requests hang. A reconcile holds a
//! [`ShardGuard`] while it runs; giving a shard up ([`ShardOwnership::stop`]) refuses new
//! reconciles at once and [`ShardOwnership::drained`] waits for those in flight, so the Lease is
//! released only after the last one ended.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::sync::{Notify, watch};

/// 64-bit FNV-1a offset basis.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// 64-bit FNV-1a prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `bytes` (the same value in every process and release).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME)
    })
}

/// The shard of the cluster `namespace/name` among `shards`: FNV-1a of `namespace/name`, modulo
/// the number of shards.
pub fn shard_of(namespace: &str, name: &str, shards: NonZeroU32) -> u32 {
    let key = format!("{namespace}/{name}");
    let shard = fnv1a64(key.as_bytes()) % u64::from(shards.get());
    // Less than `shards`, so it fits.
    u32::try_from(shard).unwrap_or(0)
}

/// Shards held, and reconciles in flight per shard.
#[derive(Debug, Default)]
struct State {
    /// Held shards and until when each may be acted on (`None`: no deadline).
    held: BTreeMap<u32, Option<Instant>>,
    /// Reconciles running per shard.
    in_flight: BTreeMap<u32, usize>,
}

#[derive(Debug)]
struct Inner {
    shards: NonZeroU32,
    state: Mutex<State>,
    /// Woken when a shard's last reconcile in flight ends.
    idle: Notify,
    /// Bumped when the set of held shards changes.
    changes: watch::Sender<u64>,
}

/// Which shards this replica holds. Cheap to clone; every clone is the same handle.
#[derive(Debug, Clone)]
pub struct ShardOwnership {
    inner: Arc<Inner>,
}

impl Default for ShardOwnership {
    /// [`ShardOwnership::all`].
    fn default() -> Self {
        Self::all()
    }
}

/// A reconcile of a cluster in a held shard is running; dropped when it ends.
#[derive(Debug)]
pub struct ShardGuard {
    inner: Arc<Inner>,
    shard: u32,
}

impl ShardGuard {
    /// The shard.
    pub fn shard(&self) -> u32 {
        self.shard
    }
}

impl Drop for ShardGuard {
    fn drop(&mut self) {
        let mut state = lock(&self.inner.state);
        let now_idle = match state.in_flight.get_mut(&self.shard) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                state.in_flight.remove(&self.shard);
                true
            }
        };
        drop(state);
        if now_idle {
            self.inner.idle.notify_waiters();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state stays consistent under a panic (each change is one map operation).
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl ShardOwnership {
    /// One shard, always held, without a deadline: every cluster is this replica's (one replica,
    /// or the single leader-election Lease decides whether the controllers run at all).
    pub fn all() -> Self {
        let ownership = Self::new(NonZeroU32::MIN);
        lock(&ownership.inner.state).held.insert(0, None);
        ownership
    }

    /// `shards` shards, none held yet.
    pub fn new(shards: NonZeroU32) -> Self {
        Self {
            inner: Arc::new(Inner {
                shards,
                state: Mutex::new(State::default()),
                idle: Notify::new(),
                changes: watch::channel(0).0,
            }),
        }
    }

    /// The number of shards.
    pub fn shards(&self) -> NonZeroU32 {
        self.inner.shards
    }

    /// The shard of the cluster `namespace/name`.
    pub fn shard_of(&self, namespace: &str, name: &str) -> u32 {
        shard_of(namespace, name, self.inner.shards)
    }

    fn valid(until: Option<Instant>, now: Instant) -> bool {
        until.is_none_or(|until| now < until)
    }

    /// Whether this replica reconciles the cluster `namespace/name` now.
    pub fn owns(&self, namespace: &str, name: &str) -> bool {
        let shard = self.shard_of(namespace, name);
        lock(&self.inner.state)
            .held
            .get(&shard)
            .is_some_and(|until| Self::valid(*until, Instant::now()))
    }

    /// Starts a reconcile of `namespace/name` when its shard is held: the shard is not given up
    /// while the guard lives. `None` when the cluster is another replica's.
    pub fn enter(&self, namespace: &str, name: &str) -> Option<ShardGuard> {
        let shard = self.shard_of(namespace, name);
        let mut state = lock(&self.inner.state);
        let held = state
            .held
            .get(&shard)
            .is_some_and(|until| Self::valid(*until, Instant::now()));
        if !held {
            return None;
        }
        *state.in_flight.entry(shard).or_insert(0) += 1;
        Some(ShardGuard {
            inner: self.inner.clone(),
            shard,
        })
    }

    /// The shards held now (their deadline not passed), ascending.
    pub fn held(&self) -> Vec<u32> {
        let now = Instant::now();
        lock(&self.inner.state)
            .held
            .iter()
            .filter(|(_, until)| Self::valid(**until, now))
            .map(|(shard, _)| *shard)
            .collect()
    }

    /// Holds `shard` until `until` (acquired or renewed its Lease): reconciles of its clusters
    /// may start until then. A shard beyond the count is ignored.
    pub fn hold(&self, shard: u32, until: Instant) {
        if shard >= self.inner.shards.get() {
            return;
        }
        let now = Instant::now();
        let mut state = lock(&self.inner.state);
        let was_held = state
            .held
            .get(&shard)
            .is_some_and(|until| Self::valid(*until, now));
        state.held.insert(shard, Some(until));
        drop(state);
        if !was_held {
            tracing::info!(shard, "reconciling the clusters of shard");
            self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Stops starting reconciles of `shard`'s clusters (giving it up, or its Lease was lost).
    /// Those in flight go on; [`Self::drained`] waits for them.
    pub fn stop(&self, shard: u32) {
        let removed = lock(&self.inner.state).held.remove(&shard).is_some();
        if removed {
            tracing::info!(shard, "no longer reconciling the clusters of shard");
            self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Reconciles of `shard`'s clusters running now.
    pub fn in_flight(&self, shard: u32) -> usize {
        lock(&self.inner.state)
            .in_flight
            .get(&shard)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until no reconcile of `shard`'s clusters runs, at most `limit`; whether none does.
    pub async fn drained(&self, shard: u32, limit: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.inner.idle.notified();
                tokio::pin!(idle);
                // Registered before the check, so a guard dropped in between still wakes us.
                idle.as_mut().enable();
                if self.in_flight(shard) == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }

    /// Yields once each time the set of held shards changes (a shard gained, given up or lost),
    /// for `Controller::reconcile_all_on`: clusters of a newly held shard are reconciled at
    /// once, and those of a lost one forget what this replica recorded about them.
    pub fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.inner.changes.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn n(shards: u32) -> NonZeroU32 {
        NonZeroU32::new(shards).unwrap()
    }

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        // From the FNV reference test suite (draft-eastlake-fnv).
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn shards_are_pinned_across_releases() {
        // Changing these moves clusters between replicas during an upgrade: never do. (Values
        // computed with an independent implementation of FNV-1a.)
        let cases = [
            ("default", "main", 16, 2),
            ("default", "main", 3, 1),
            ("team-a", "orders", 16, 10),
            ("team-a", "orders", 7, 3),
            ("kube-system", "events", 16, 6),
            ("prod", "etcd-0", 5, 3),
        ];
        for (namespace, name, shards, want) in cases {
            assert_eq!(
                shard_of(namespace, name, n(shards)),
                want,
                "{namespace}/{name} among {shards}"
            );
        }
        assert_eq!(fnv1a64(b"default/main"), 0x73c7_ffa5_dfba_38f2);
        // One shard: everything in shard 0.
        assert_eq!(shard_of("x", "y", n(1)), 0);
    }

    #[test]
    fn shards_spread_clusters() {
        let shards = n(8);
        let mut counts = [0_u32; 8];
        for i in 0..800 {
            counts[shard_of(&format!("ns-{}", i % 7), &format!("cluster-{i}"), shards) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (60..=140).contains(c)), "{counts:?}");
    }

    #[test]
    fn all_owns_everything_forever() {
        let all = ShardOwnership::default();
        assert!(all.owns("a", "b"));
        assert_eq!(all.held(), vec![0]);
        assert!(all.enter("c", "d").is_some());
    }

    #[test]
    fn a_shard_is_owned_until_its_deadline_only() {
        let o = ShardOwnership::new(n(4));
        let shard = o.shard_of("default", "main");
        assert!(!o.owns("default", "main"));
        o.hold(shard, Instant::now() + Duration::from_secs(60));
        assert!(o.owns("default", "main"));
        assert_eq!(o.held(), vec![shard]);
        // A renewal that came too late: the deadline passed, nothing more starts.
        o.hold(shard, Instant::now());
        assert!(!o.owns("default", "main"));
        assert!(o.enter("default", "main").is_none());
        assert!(o.held().is_empty());
        // Beyond the count: ignored.
        o.hold(9, Instant::now() + Duration::from_secs(60));
        assert!(o.held().is_empty());
    }

    #[tokio::test]
    async fn stopping_refuses_new_reconciles_and_drained_waits_for_running_ones() {
        let o = ShardOwnership::new(n(2));
        let shard = o.shard_of("default", "main");
        o.hold(shard, Instant::now() + Duration::from_secs(60));
        let guard = o.enter("default", "main").unwrap();
        let second = o.enter("default", "main").unwrap();
        assert_eq!(o.in_flight(shard), 2);
        o.stop(shard);
        assert!(o.enter("default", "main").is_none());
        assert!(!o.drained(shard, Duration::from_millis(20)).await);
        drop(second);
        let o2 = o.clone();
        let waiter = tokio::spawn(async move { o2.drained(shard, Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(guard);
        assert!(waiter.await.unwrap());
        assert_eq!(o.in_flight(shard), 0);
    }

    #[tokio::test]
    async fn changes_fire_on_gains_and_losses_not_on_renewals() {
        let o = ShardOwnership::new(n(2));
        let mut changes = Box::pin(o.changes());
        o.hold(1, Instant::now() + Duration::from_secs(60));
        tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .unwrap()
            .unwrap();
        o.hold(1, Instant::now() + Duration::from_secs(60));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), changes.next())
                .await
                .is_err(),
            "a renewal is no change"
        );
        o.stop(1);
        tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .unwrap()
            .unwrap();
    }
}
