//! Sharding the controllers across `etcd-operator serve` replicas (`--shards N`, N > 1): the
//! EtcdClusters are split into N shards by a stable hash of `namespace/name`
//! ([`etcd_operator_controller::shard::shard_of`]), each shard has its own
//! `coordination.k8s.io/v1` Lease `<lease-name>-shard-<i>`, and every replica runs the
//! controllers for the clusters of the shards whose Lease it holds.
//!
//! Each Lease is taken, renewed and judged exactly as the single leader Lease is
//! ([`super::leader`]: [`Observation`] decides, [`LeaseLock`] writes conditionally on the
//! `resourceVersion`, [`Timing::act_until`] says until when a holder may act). What sharding
//! adds is *which* shards a replica tries to hold, so that they spread:
//!
//! - Every replica also keeps a presence Lease `<lease-name>-replica-<identity>` (as
//!   kube-apiserver keeps its identity Leases), so replicas that hold no shard yet are counted
//!   (those of the same shard count only).
//!   One labelled list per renew period reads the shard and presence Leases together.
//! - With `L` live replicas (valid presence Leases, valid shard holders, and this one), the fair
//!   share is `ceil(N / L)` ([`fair_share`]). [`plan`] (pure, unit-tested) then decides: a replica
//!   above its fair share gives up the excess; with no shard free, one holding two or more
//!   shards more than the poorest live replica gives one up (so `N = 4, L = 3` ends `2/1/1`, not
//!   `2/2/0`); a replica takes free shards while below its fair share and not richer than the
//!   poorest other replica (the poorest take first, so a shard given up is not taken back by the
//!   replica that gave it up), or any free shard left free for a whole lease duration.
//! - A replica gives a shard up by first refusing new reconciles of its clusters, then waiting
//!   (renewing the Lease meanwhile, at most one lease duration) for the reconciles in flight, and
//!   only then releasing the Lease (holder cleared), which the next replica takes at once. One
//!   whose reconciles outlast that is not released but left to expire (no longer renewed).
//! - A replica that dies stops renewing: its shards are free to the others one lease duration
//!   after they last saw them renewed. A replica that cannot renew stops reconciling a shard
//!   at [`Timing::act_until`], one renew period before that, whatever its requests are doing
//!   (the deadline is checked by [`ShardOwnership`] on every reconcile start).
//! - On shutdown a replica stops reconciling, waits for the reconciles in flight, releases its
//!   shard Leases and its presence Lease.
//! - Replicas of another configuration (a rollout that changes `--shards`) cover other sets of
//!   clusters with their Leases, so two configurations must not act at once: each shard Lease
//!   carries its holder's shard count (label [`SHARDS_LABEL`]). A replica takes no shard while
//!   the single leader Lease (`--shards 1`) or a shard Lease of a smaller count is validly held
//!   by another replica, and gives all its shards up when the leader Lease or one of a larger
//!   count is (the larger count wins; `--shards 1` replicas do not know about shards, so they
//!   win too). Only replicas that took Leases in the same renew period, each before seeing the
//!   other's, can overlap, and for one renew period.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use etcd_operator_controller::metrics::ControllerMetrics;
use etcd_operator_controller::shard::{ShardOwnership, fnv1a64};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Preconditions};
use tokio_util::sync::CancellationToken;

use super::leader::{Attempt, LeaderElectionError, LeaseLock, Observation, Step, Timing};

/// Label on every Lease of a shard group: the base lease name.
pub const GROUP_LABEL: &str = "etcd.operator.dev/lease-group";
/// Label saying what a Lease of the group is: `shard` or `replica`.
pub const ROLE_LABEL: &str = "etcd.operator.dev/lease-role";
/// Label on the Leases of a replica: its shard count (`--shards`).
pub const SHARDS_LABEL: &str = "etcd.operator.dev/shards";

/// The Lease of shard `shard`.
pub fn shard_lease_name(lease_name: &str, shard: u32) -> String {
    format!("{lease_name}-shard-{shard}")
}

/// The presence Lease of the replica `identity`: its identity when that is usable in a name,
/// else a hash of it.
pub fn replica_lease_name(lease_name: &str, identity: &str) -> String {
    let usable = !identity.is_empty()
        && identity.len() <= 63
        && identity
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !identity.starts_with('-')
        && !identity.ends_with('-');
    if usable {
        format!("{lease_name}-replica-{identity}")
    } else {
        format!("{lease_name}-replica-{:016x}", fnv1a64(identity.as_bytes()))
    }
}

/// `ceil(shards / replicas)`: the most shards one of `replicas` live replicas should hold.
pub fn fair_share(shards: u32, replicas: usize) -> u32 {
    let replicas = u32::try_from(replicas.max(1)).unwrap_or(u32::MAX);
    shards.div_ceil(replicas)
}

/// What one replica sees of the shard group at one renew period.
#[derive(Debug, Clone)]
pub struct View<'a> {
    /// This replica's identity.
    pub me: &'a str,
    /// Replicas whose presence Lease is valid (this one may or may not be among them).
    pub live: &'a BTreeSet<String>,
    /// Per shard, its valid holder as observed; `None` when free or expired.
    pub holders: &'a [Option<String>],
    /// Per shard, how long it has been seen free (zero when held).
    pub free_for: &'a [Duration],
    /// Shards this replica is giving up (their Lease still names it).
    pub leaving: &'a BTreeSet<u32>,
    /// The lease duration: a shard free for this long may be taken by any replica below its
    /// fair share.
    pub duration: Duration,
    /// Another configuration acts (a held leader Lease, or shard Leases held under a larger
    /// shard count): give every shard up.
    pub yield_all: bool,
    /// Another configuration may act (shard Leases held under a smaller shard count, or the
    /// leader Lease could not be read): take nothing.
    pub hold_off: bool,
}

/// What a replica does with the shards at one renew period.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Free shards to take, in the order to try them.
    pub take: Vec<u32>,
    /// Held shards to give up.
    pub shed: Vec<u32>,
}

/// The fair-share rule (see the module documentation).
pub fn plan(view: &View<'_>) -> Plan {
    let shards = u32::try_from(view.holders.len()).unwrap_or(u32::MAX);
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for replica in view.live {
        counts.entry(replica.as_str()).or_insert(0);
    }
    counts.entry(view.me).or_insert(0);
    let mut mine: Vec<u32> = Vec::new();
    let mut free: Vec<u32> = Vec::new();
    for (shard, holder) in (0..shards).zip(view.holders) {
        // Shards being given up are neither ours any more nor free yet.
        let leaving = view.leaving.contains(&shard);
        match holder {
            Some(holder) if holder == view.me => {
                if !leaving {
                    mine.push(shard);
                }
            }
            Some(holder) => *counts.entry(holder.as_str()).or_insert(0) += 1,
            None => {
                if !leaving {
                    free.push(shard);
                }
            }
        }
    }
    let fair = fair_share(shards, counts.len());
    let held = u32::try_from(mine.len()).unwrap_or(u32::MAX);
    let poorest_other = counts
        .iter()
        .filter(|(replica, _)| **replica != view.me)
        .map(|(_, count)| *count)
        .min();
    let mut result = Plan::default();
    if view.yield_all {
        result.shed = mine.iter().rev().copied().collect();
        return result;
    }
    if held > fair {
        let excess = usize::try_from(held - fair).unwrap_or(usize::MAX);
        result.shed = mine.iter().rev().take(excess).copied().collect();
        return result;
    }
    if free.is_empty()
        && view.leaving.is_empty()
        && poorest_other.is_some_and(|poorest| held >= poorest.saturating_add(2))
    {
        result.shed = mine.last().copied().into_iter().collect();
        return result;
    }
    // Start at a place of our own, so that replicas taking at the same time try different shards.
    let offset = fnv1a64(view.me.as_bytes()) % u64::from(shards.max(1));
    free.sort_by_key(|shard| (u64::from(*shard) + u64::from(shards) - offset) % u64::from(shards.max(1)));
    let mut count = held;
    if view.hold_off {
        return result;
    }
    for shard in free {
        if count >= fair {
            break;
        }
        let poorest = poorest_other.is_none_or(|poorest| count <= poorest);
        let long_free = view
            .free_for
            .get(usize::try_from(shard).unwrap_or(usize::MAX))
            .is_some_and(|free_for| *free_for >= view.duration);
        if poorest || long_free {
            result.take.push(shard);
            count += 1;
        }
    }
    result
}

/// What this replica has seen of the other Leases, each judged like the leader Lease.
#[derive(Debug, Default)]
struct Seen {
    /// Our presence Lease.
    presence: Observation,
    /// Other replicas' presence Leases, by name.
    others: HashMap<String, Observation>,
    /// Shard Leases of another shard count, by name.
    foreign: HashMap<String, Observation>,
    /// The single leader Lease.
    leader: Observation,
}

/// One shard's Lease as this replica deals with it.
#[derive(Debug)]
struct Slot {
    lock: LeaseLock,
    observation: Observation,
    /// The Lease names us and we act on it (or are giving it up).
    held: bool,
    /// Giving it up since then: not reconciled any more, released once drained.
    leaving: Option<Instant>,
    /// Given up with reconciles that did not end within a lease duration: no longer renewed nor
    /// released, left to expire (one more lease duration for them), until the Lease no longer
    /// names us.
    abandoned: bool,
    /// Seen free since then.
    free_since: Option<Instant>,
}

/// Takes, renews, spreads and gives up the shard Leases of one replica (see the module
/// documentation), and tells [`ShardOwnership`] which shards it may reconcile until when.
pub struct ShardManager {
    client: kube::Client,
    api: Api<Lease>,
    namespace: String,
    lease_name: String,
    identity: String,
    timing: Timing,
    ownership: ShardOwnership,
    metrics: ControllerMetrics,
}

impl std::fmt::Debug for ShardManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardManager")
            .field("namespace", &self.namespace)
            .field("lease_name", &self.lease_name)
            .field("identity", &self.identity)
            .field("timing", &self.timing)
            .field("ownership", &self.ownership)
            .finish_non_exhaustive()
    }
}

impl ShardManager {
    /// A manager for the shards of `ownership`, whose Leases are `<lease_name>-shard-<i>` in
    /// `namespace`, held as `identity`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        lease_name: &str,
        identity: &str,
        timing: Timing,
        ownership: ShardOwnership,
    ) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            client,
            namespace: namespace.to_owned(),
            lease_name: lease_name.to_owned(),
            identity: identity.to_owned(),
            timing,
            ownership,
            metrics: ControllerMetrics::default(),
        }
    }

    /// Records the shards held in `metrics`.
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    fn labels(&self, role: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (GROUP_LABEL.to_owned(), self.lease_name.clone()),
            (ROLE_LABEL.to_owned(), role.to_owned()),
            (SHARDS_LABEL.to_owned(), self.ownership.shards().to_string()),
        ])
    }

    fn lock(&self, name: &str, role: &str) -> LeaseLock {
        LeaseLock::new(
            self.client.clone(),
            &self.namespace,
            name,
            &self.identity,
            self.timing,
        )
        .with_labels(self.labels(role))
    }

    /// Holds shards until `shutdown` is cancelled, then gives them all up.
    pub async fn run(self, shutdown: CancellationToken) {
        let shards: NonZeroU32 = self.ownership.shards();
        let mut slots: Vec<Slot> = (0..shards.get())
            .map(|shard| Slot {
                lock: self.lock(&shard_lease_name(&self.lease_name, shard), "shard"),
                observation: Observation::default(),
                held: false,
                leaving: None,
                abandoned: false,
                free_since: None,
            })
            .collect();
        let presence = self.lock(&replica_lease_name(&self.lease_name, &self.identity), "replica");
        let mut seen = Seen::default();
        tracing::info!(
            identity = %self.identity,
            shards = shards.get(),
            lease = %self.lease_name,
            "sharding the controllers"
        );
        loop {
            let started = Instant::now();
            self.tick(&mut slots, &presence, &mut seen).await;
            self.metrics.set_shards(self.ownership.held().len(), shards.get());
            let pause = self.timing.retry.saturating_sub(started.elapsed());
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
            }
        }
        self.shut_down(&mut slots, &presence).await;
        self.metrics.set_shards(0, shards.get());
    }

    /// One renew period: presence, one list, renewals, what to give up and what to take.
    async fn tick(&self, slots: &mut [Slot], presence: &LeaseLock, seen: &mut Seen) {
        let limit = self.timing.retry;
        if let Err(error) = presence
            .try_acquire_or_renew_within(&mut seen.presence, limit)
            .await
        {
            tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "shard presence");
        }
        let selector = format!("{GROUP_LABEL}={}", self.lease_name);
        let listed =
            tokio::time::timeout(limit, self.api.list(&ListParams::default().labels(&selector))).await;
        let leases: BTreeMap<String, Lease> = match listed {
            Ok(Ok(list)) => list
                .items
                .into_iter()
                .filter_map(|lease| Some((lease.metadata.name.clone()?, lease)))
                .collect(),
            Ok(Err(error)) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "list the shard Leases; renewing the held ones one by one");
                self.renew_one_by_one(slots).await;
                return;
            }
            Err(_) => {
                tracing::warn!(after = ?limit, "list the shard Leases: no answer; renewing the held ones one by one");
                self.renew_one_by_one(slots).await;
                return;
            }
        };
        // The single leader Lease of `--shards 1` replicas (a rollout changing the flag).
        let leader = tokio::time::timeout(limit, self.api.get_opt(&self.lease_name)).await;
        let now = Instant::now();
        let (leader_held, leader_unknown) = match leader {
            Ok(Ok(lease)) => (
                matches!(
                    seen.leader.step(lease.as_ref(), &self.identity, now, self.timing),
                    Step::Wait { .. }
                ),
                false,
            ),
            _ => (false, true),
        };

        // Other replicas' presence.
        let mut live = BTreeSet::from([self.identity.clone()]);
        let replica_role = |lease: &Lease| {
            lease
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLE_LABEL))
                .is_some_and(|r| r == "replica")
        };
        seen.others.retain(|name, _| leases.contains_key(name));
        for (name, lease) in leases.iter().filter(|(_, l)| replica_role(l)) {
            if name == presence.name() {
                continue;
            }
            let step = seen.others.entry(name.clone()).or_default().step(
                Some(lease),
                &self.identity,
                now,
                self.timing,
            );
            // Replicas of another shard count do not share our shards (see below).
            let same_count = lease
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SHARDS_LABEL))
                .is_some_and(|n| *n == self.ownership.shards().to_string());
            match step {
                Step::Wait { holder, .. } => {
                    if same_count {
                        live.insert(holder);
                    }
                }
                Step::TakeOver => self.forget_replica(name, lease).await,
                Step::Create | Step::Renew => {}
            }
        }

        // Shard Leases held under another shard count (a rollout changing the flag): they cover
        // other sets of clusters, so two counts must never act at once.
        let ours = self.ownership.shards().get();
        let (mut larger, mut smaller) = (false, false);
        seen.foreign.retain(|name, _| leases.contains_key(name));
        for (name, lease) in &leases {
            let labels = lease.metadata.labels.clone().unwrap_or_default();
            if labels.get(ROLE_LABEL).is_none_or(|r| r != "shard") {
                continue;
            }
            let count = labels.get(SHARDS_LABEL).and_then(|n| n.parse::<u32>().ok());
            if count == Some(ours) {
                continue;
            }
            let step = seen.foreign.entry(name.clone()).or_default().step(
                Some(lease),
                &self.identity,
                now,
                self.timing,
            );
            if matches!(step, Step::Wait { .. }) {
                if count.is_none_or(|n| n > ours) {
                    larger = true;
                } else {
                    smaller = true;
                }
            }
        }
        let yield_all = leader_held || larger;
        if yield_all && slots.iter().any(|s| s.held && s.leaving.is_none()) {
            tracing::warn!(
                leader_held,
                "replicas of another --shards value hold Leases; giving every shard up to them"
            );
        }

        // The shards as read.
        let mut steps = Vec::with_capacity(slots.len());
        let mut holders = Vec::with_capacity(slots.len());
        let mut free_for = Vec::with_capacity(slots.len());
        for (shard, slot) in (0_u32..).zip(slots.iter_mut()) {
            let lease = leases.get(slot.lock.name());
            let step = slot.observation.step(lease, &self.identity, now, self.timing);
            let holder = match &step {
                Step::Renew => Some(self.identity.clone()),
                Step::Wait { holder, .. } => Some(holder.clone()),
                Step::Create | Step::TakeOver => None,
            };
            if step != Step::Renew {
                slot.abandoned = false;
            }
            if slot.held && step != Step::Renew {
                tracing::warn!(
                    shard,
                    ?step,
                    "lost the shard Lease; no longer reconciling its clusters"
                );
                self.ownership.stop(shard);
                slot.held = false;
                slot.leaving = None;
            }
            if holder.is_none() {
                slot.free_since.get_or_insert(now);
            } else {
                slot.free_since = None;
            }
            free_for.push(slot.free_since.map_or(Duration::ZERO, |since| now - since));
            holders.push(holder);
            steps.push((lease.cloned(), step));
        }
        let leaving: BTreeSet<u32> = (0_u32..)
            .zip(slots.iter())
            .filter(|(_, s)| s.leaving.is_some() || s.abandoned)
            .map(|(shard, _)| shard)
            .collect();
        let decided = plan(&View {
            me: &self.identity,
            live: &live,
            holders: &holders,
            free_for: &free_for,
            leaving: &leaving,
            duration: self.timing.duration,
            yield_all,
            hold_off: yield_all || smaller || leader_unknown,
        });

        // Renew what the Lease says is ours (also what we are giving up, until it drained).
        for (shard, (slot, (lease, step))) in (0_u32..).zip(slots.iter_mut().zip(&steps)) {
            if *step != Step::Renew || slot.abandoned {
                continue;
            }
            let sent = Instant::now();
            match self.write(slot, lease.as_ref(), step.clone()).await {
                Ok(Attempt::Held) => {
                    slot.held = true;
                    if slot.leaving.is_none() {
                        self.ownership.hold(shard, self.timing.act_until(sent));
                    }
                }
                Ok(Attempt::NotHeld(step)) => {
                    tracing::warn!(
                        shard,
                        ?step,
                        "lost the shard Lease; no longer reconciling its clusters"
                    );
                    self.ownership.stop(shard);
                    slot.held = false;
                    slot.leaving = None;
                }
                Err(error) => {
                    tracing::warn!(shard, error = %etcd_operator_api::report::Chain(&error), "renew the shard Lease")
                }
            }
        }

        // Give up.
        for shard in &decided.shed {
            if let Some(slot) = slots.get_mut(usize::try_from(*shard).unwrap_or(usize::MAX)) {
                tracing::info!(
                    shard,
                    live = live.len(),
                    "giving the shard up to spread the shards"
                );
                self.ownership.stop(*shard);
                slot.leaving = Some(now);
            }
        }
        for (shard, slot) in (0_u32..).zip(slots.iter_mut()) {
            let Some(since) = slot.leaving else { continue };
            let in_flight = self.ownership.in_flight(shard);
            if in_flight > 0 && since.elapsed() < self.timing.duration {
                continue;
            }
            if in_flight > 0 {
                // Released, another replica would start at once: left to expire instead.
                tracing::warn!(
                    shard,
                    in_flight,
                    "reconciles of the shard still run after a lease duration; leaving its Lease to expire"
                );
                slot.held = false;
                slot.leaving = None;
                slot.abandoned = true;
                continue;
            }
            match tokio::time::timeout(limit, slot.lock.release()).await {
                Ok(Ok(())) => {
                    tracing::info!(shard, "released the shard Lease");
                    slot.held = false;
                    slot.leaving = None;
                }
                Ok(Err(error)) => {
                    tracing::warn!(shard, error = %etcd_operator_api::report::Chain(&error), "release the shard Lease")
                }
                Err(_) => tracing::warn!(shard, "release the shard Lease: no answer"),
            }
        }

        // Take.
        for shard in decided.take {
            let index = usize::try_from(shard).unwrap_or(usize::MAX);
            let (Some(slot), Some((lease, step))) = (slots.get_mut(index), steps.get(index)) else {
                continue;
            };
            let sent = Instant::now();
            match self.write(slot, lease.as_ref(), step.clone()).await {
                Ok(Attempt::Held) => {
                    tracing::info!(shard, "acquired the shard Lease");
                    slot.held = true;
                    slot.leaving = None;
                    slot.free_since = None;
                    self.ownership.hold(shard, self.timing.act_until(sent));
                }
                Ok(Attempt::NotHeld(_)) => {
                    tracing::debug!(shard, "another replica took the shard first");
                }
                Err(error) => {
                    tracing::warn!(shard, error = %etcd_operator_api::report::Chain(&error), "take the shard Lease")
                }
            }
        }
    }

    /// Writes `step` for `slot`, given up after one renew period.
    async fn write(
        &self,
        slot: &Slot,
        lease: Option<&Lease>,
        step: Step,
    ) -> Result<Attempt, LeaderElectionError> {
        let limit = self.timing.retry;
        tokio::time::timeout(limit, slot.lock.write(lease, step))
            .await
            .unwrap_or_else(|_| Err(slot.lock.timeout("write", limit)))
    }

    /// Without the list: renew the held shards each with its own read.
    async fn renew_one_by_one(&self, slots: &mut [Slot]) {
        for (shard, slot) in (0_u32..).zip(slots.iter_mut()) {
            if !slot.held {
                continue;
            }
            let sent = Instant::now();
            let limit = self.timing.retry;
            match slot
                .lock
                .try_acquire_or_renew_within(&mut slot.observation, limit)
                .await
            {
                Ok(Attempt::Held) => {
                    if slot.leaving.is_none() {
                        self.ownership.hold(shard, self.timing.act_until(sent));
                    }
                }
                Ok(Attempt::NotHeld(step)) => {
                    tracing::warn!(
                        shard,
                        ?step,
                        "lost the shard Lease; no longer reconciling its clusters"
                    );
                    self.ownership.stop(shard);
                    slot.held = false;
                    slot.leaving = None;
                }
                Err(error) => {
                    tracing::warn!(shard, error = %etcd_operator_api::report::Chain(&error), "renew the shard Lease")
                }
            }
        }
    }

    /// Deletes the presence Lease of a replica that has been gone for a lease duration (or left),
    /// unless it was renewed since it was read.
    async fn forget_replica(&self, name: &str, lease: &Lease) {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: lease.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        match tokio::time::timeout(self.timing.retry, self.api.delete(name, &params)).await {
            Ok(Ok(_)) => tracing::info!(lease = name, "deleted the presence Lease of a departed replica"),
            Ok(Err(kube::Error::Api(status))) if status.code == 404 || status.code == 409 => {}
            Ok(Err(error)) => {
                tracing::debug!(lease = name, error = %etcd_operator_api::report::Chain(&error), "delete a departed replica's Lease")
            }
            Err(_) => tracing::debug!(lease = name, "delete a departed replica's Lease: no answer"),
        }
    }

    /// Stops reconciling, waits for the reconciles in flight, releases every Lease held.
    async fn shut_down(&self, slots: &mut [Slot], presence: &LeaseLock) {
        for (shard, slot) in (0_u32..).zip(slots.iter()) {
            if slot.held {
                self.ownership.stop(shard);
            }
        }
        // The controllers stop at the same time; serve mode waits 10 s for both.
        let deadline = Instant::now() + self.timing.renew_deadline().min(Duration::from_secs(5));
        for (shard, slot) in (0_u32..).zip(slots.iter_mut()) {
            if !slot.held {
                continue;
            }
            slot.held = false;
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.ownership.drained(shard, left).await {
                tracing::warn!(
                    shard,
                    "reconciles of the shard still run; leaving its Lease to expire"
                );
                continue;
            }
            match tokio::time::timeout(self.timing.retry, slot.lock.release()).await {
                Ok(Ok(())) => tracing::info!(shard, "released the shard Lease"),
                Ok(Err(error)) => {
                    tracing::warn!(shard, error = %etcd_operator_api::report::Chain(&error), "release the shard Lease")
                }
                Err(_) => tracing::warn!(shard, "release the shard Lease: no answer"),
            }
        }
        match tokio::time::timeout(self.timing.retry, presence.release()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "release the presence Lease")
            }
            Err(_) => tracing::warn!("release the presence Lease: no answer"),
        }
        tracing::info!(identity = %self.identity, "released the shard Leases");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn live(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn holders(spec: &str) -> Vec<Option<String>> {
        // One character per shard: a letter is its holder, `.` free.
        spec.chars().map(|c| (c != '.').then(|| c.to_string())).collect()
    }

    fn decide(me: &str, alive: &[&str], spec: &str, leaving: &[u32]) -> Plan {
        let holders = holders(spec);
        let free_for = vec![Duration::ZERO; holders.len()];
        let leaving: BTreeSet<u32> = leaving.iter().copied().collect();
        let live = live(alive);
        plan(&View {
            me,
            live: &live,
            holders: &holders,
            free_for: &free_for,
            leaving: &leaving,
            duration: D,
            yield_all: false,
            hold_off: false,
        })
    }

    /// Runs every replica's plan on the same view, applying sheds and then takes in turn (a
    /// take of a shard another took first is lost), until nothing changes.
    fn settle(replicas: &[&str], spec: &str) -> String {
        let mut state = holders(spec);
        for _ in 0..50 {
            let before = state.clone();
            for me in replicas {
                let p = decide(me, replicas, &render(&state), &[]);
                for shard in p.shed {
                    state[shard as usize] = None;
                }
                for shard in p.take {
                    if state[shard as usize].is_none() {
                        state[shard as usize] = Some((*me).to_owned());
                    }
                }
            }
            if state == before {
                return render(&state);
            }
        }
        panic!("did not settle: {}", render(&state));
    }

    fn render(state: &[Option<String>]) -> String {
        state.iter().map(|h| h.as_deref().unwrap_or(".")).collect()
    }

    fn count(spec: &str, who: char) -> usize {
        spec.chars().filter(|c| *c == who).count()
    }

    #[test]
    fn fair_share_is_the_ceiling() {
        assert_eq!(fair_share(6, 3), 2);
        assert_eq!(fair_share(6, 4), 2);
        assert_eq!(fair_share(4, 3), 2);
        assert_eq!(fair_share(1, 3), 1);
        assert_eq!(fair_share(5, 1), 5);
        assert_eq!(fair_share(5, 0), 5, "no count: this replica alone");
    }

    #[test]
    fn alone_a_replica_takes_every_shard() {
        let p = decide("a", &["a"], "......", &[]);
        let mut take = p.take.clone();
        take.sort_unstable();
        assert_eq!(take, vec![0, 1, 2, 3, 4, 5]);
        assert!(p.shed.is_empty());
    }

    #[test]
    fn a_replica_above_its_fair_share_gives_up_the_excess() {
        // c joined: fair share 2.
        assert_eq!(
            decide("a", &["a", "b", "c"], "aaabbb", &[]),
            Plan {
                take: vec![],
                shed: vec![2]
            }
        );
        assert_eq!(decide("a", &["a", "b", "c", "d"], "aaaabb", &[]).shed, vec![3, 2]);
    }

    #[test]
    fn the_poorest_take_first_and_nobody_takes_back_what_it_gave_up() {
        // a gave shard 2 up: a (2) is richer than c (0) and leaves it to c.
        assert!(decide("a", &["a", "b", "c"], "aa.bbb", &[]).take.is_empty());
        let c = decide("c", &["a", "b", "c"], "aa.bb.", &[]);
        let mut take = c.take.clone();
        take.sort_unstable();
        assert_eq!(take, vec![2, 5]);
        // Not richer than the poorest other: one at a time while others compete.
        assert_eq!(decide("a", &["a", "b"], "......", &[]).take.len(), 1);
        // A shard free for a lease duration goes to anyone below its fair share.
        let holders = holders("aa.bbb");
        let mut free_for = vec![Duration::ZERO; 6];
        free_for[2] = D;
        let alive = live(&["a", "b"]);
        let p = plan(&View {
            me: "a",
            live: &alive,
            holders: &holders,
            free_for: &free_for,
            leaving: &BTreeSet::new(),
            duration: D,
            yield_all: false,
            hold_off: false,
        });
        assert_eq!(p.take, vec![2]);
    }

    #[test]
    fn an_imbalance_of_two_is_evened_out_when_nothing_is_free() {
        // N = 4, three replicas: 2/2/0 is within the fair share (2) but c has nothing.
        assert_eq!(decide("a", &["a", "b", "c"], "aabb", &[]).shed, vec![1]);
        assert!(decide("a", &["a", "b", "c"], "aabc", &[]).shed.is_empty());
        // Not while a shard is free (c takes it) or one is being given up.
        assert!(decide("a", &["a", "b", "c"], "aab.", &[]).shed.is_empty());
        assert!(decide("a", &["a", "b", "c"], "aabb", &[1]).shed.is_empty());
    }

    #[test]
    fn shards_being_given_up_are_neither_held_nor_free() {
        let p = decide("a", &["a", "b"], "aab...", &[1]);
        // a holds 1 counted shard (0); fair share 3; b has 1: a may take one (not richer).
        assert_eq!(p.take.len(), 1);
        assert!(!p.take.contains(&1));
    }

    #[test]
    fn another_configuration_acting_makes_a_replica_give_up_or_hold_off() {
        let holders = holders("ab....");
        let free_for = vec![Duration::ZERO; 6];
        let alive = live(&["a", "b"]);
        let none = BTreeSet::new();
        let view = |yield_all, hold_off| View {
            me: "a",
            live: &alive,
            holders: &holders,
            free_for: &free_for,
            leaving: &none,
            duration: D,
            yield_all,
            hold_off,
        };
        assert_eq!(
            plan(&view(true, true)),
            Plan {
                take: vec![],
                shed: vec![0]
            }
        );
        assert_eq!(plan(&view(false, true)), Plan::default());
        assert_eq!(plan(&view(false, false)).take.len(), 1);
    }

    #[test]
    fn holders_without_presence_are_counted_as_live() {
        // b's presence Lease is not seen, but it holds shards: fair share is 3, not 6.
        assert!(decide("a", &["a"], "aaabbb", &[]).take.is_empty());
    }

    #[test]
    fn the_rule_settles_spread_out() {
        for (replicas, spec) in [
            (&["a", "b"][..], "......"),
            (&["a", "b", "c"][..], "aaabbb"),
            (&["a", "b", "c"][..], "......"),
            (&["a", "c"][..], "aabbcc"),
            (&["a", "b", "c"][..], "aabb"),
            (&["a", "b", "c", "d"][..], "aaaaaaaaaaaaaaaa"),
            (&["a", "b", "c"][..], "aa"),
        ] {
            let settled = settle(replicas, spec);
            let n = settled.len();
            assert!(!settled.contains('.'), "{spec} -> {settled}: every shard held");
            let counts: Vec<usize> = replicas
                .iter()
                .map(|r| count(&settled, r.chars().next().unwrap()))
                .collect();
            let (min, max) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
            assert!(max - min <= 1, "{spec} -> {settled}: {counts:?}");
            if n >= replicas.len() {
                assert!(min >= 1, "{spec} -> {settled}");
            }
        }
    }

    #[test]
    fn lease_names() {
        assert_eq!(shard_lease_name("etcd-operator", 3), "etcd-operator-shard-3");
        assert_eq!(
            replica_lease_name("etcd-operator", "etcd-operator-7d9f-x2"),
            "etcd-operator-replica-etcd-operator-7d9f-x2"
        );
        let odd = replica_lease_name("etcd-operator", "Host_Name:1");
        assert!(odd.starts_with("etcd-operator-replica-"), "{odd}");
        assert_eq!(odd.len(), "etcd-operator-replica-".len() + 16);
    }
}
