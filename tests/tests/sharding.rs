//! Sharding the controllers across `etcd-operator serve` replicas (issue 21): several replicas'
//! shard managers (`etcd_operator::serve_mode::shards`) in one process against the in-memory
//! Kubernetes API of `fake_kube` (Leases with `resourceVersion` conflicts, as kube-apiserver
//! keeps them), each with a stand-in reconciler that reconciles, every few milliseconds, those
//! of 50 clusters its [`ShardOwnership`] says are its own, holding the [`ShardGuard`] exactly as
//! the controller's reconcile does, and logs every reconcile as an interval.
//!
//! The run: two replicas share 6 shards; a third joins; one is killed (its tasks aborted, its
//! Leases left to expire); a fourth joins; one is cut off from the API (its reconciler keeps
//! running, as a replica that reaches its etcd members but not kube-apiserver would) and comes
//! back; one shuts down gracefully. Asserted over the whole run: no cluster is ever reconciled by
//! two replicas at once; after the kill and the cut, every cluster is reconciled again within a
//! lease duration and a margin; shards are spread (every replica holds some, at most one apart)
//! once settled; a graceful shutdown hands its shards over without waiting for expiry.
//!
//! A second run changes the configuration in a rollout (`--shards 1` leader, then 3 shards, then
//! 6): no configuration takes anything while another's Leases are held, and none acts at once.
//! A third runs the real member controller (`reconcile::run`, fake runtime and member operations)
//! in each replica over EtcdClusters stored in the fake API: each reconciles only the clusters of
//! its shards, reconciles a gained shard's clusters at once, forgets a lost one's series, and a
//! killed replica's clusters are taken over in time; at no runtime call of a reconcile is another
//! replica reconciling a cluster of the same shard.
//!
//! [`ShardGuard`]: etcd_operator_controller::shard::ShardGuard

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_operator::serve_mode::leader::Timing;
use etcd_operator::serve_mode::shards::ShardManager;
use etcd_operator_controller::shard::ShardOwnership;
use etcd_operator_tests::fake_kube::FakeKube;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

const SHARDS: u32 = 6;
const CLUSTERS: usize = 50;
const NAMESPACE: &str = "etcd-operator";
const LEASE: &str = "etcd-operator";
const TIMING: Timing = Timing {
    duration: Duration::from_secs(2),
    retry: Duration::from_millis(500),
};
/// How long waiting for the replicas to settle may take.
const SETTLE: Duration = Duration::from_secs(30);
/// Beyond a lease duration, what taking over a dead replica's shards may take: up to a renew
/// period until its last renewal is seen, one until the expiry is noticed, one more when the
/// fair share changes only then, and the time to reconcile.
const MARGIN: Duration = Duration::from_millis(2000);

/// One reconcile: which cluster, by whom, from when to when.
#[derive(Debug, Clone)]
struct Interval {
    cluster: usize,
    replica: &'static str,
    start: Instant,
    end: Instant,
}

type Log = Arc<Mutex<Vec<Interval>>>;

/// Logs its interval when dropped: at the end of the reconcile, or when the replica is killed in
/// the middle of it.
struct Recording {
    log: Log,
    cluster: usize,
    replica: &'static str,
    start: Instant,
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.log.lock().unwrap().push(Interval {
            cluster: self.cluster,
            replica: self.replica,
            start: self.start,
            end: Instant::now(),
        });
    }
}

fn cluster_key(cluster: usize) -> (String, String) {
    (format!("team-{}", cluster % 4), format!("cluster-{cluster}"))
}

/// How long the stand-in takes to reconcile: a quarter of the clusters long (a quarter of a
/// second, as a reconcile that waits for etcd: a shard given up has one in flight, which the
/// replica must wait for before it releases the Lease), the others a few milliseconds.
fn reconcile_time(cluster: usize) -> Duration {
    if cluster.is_multiple_of(4) {
        Duration::from_millis(250)
    } else {
        Duration::from_millis(2 + (cluster % 5) as u64 * 2)
    }
}

/// A TCP relay between one replica and the fake API that can be cut: open connections are
/// dropped and new ones are held unanswered until it is healed (requests hang, as to a
/// kube-apiserver behind a broken network).
struct Relay {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut cut = cut_rx.clone();
                tokio::spawn(async move {
                    if *cut.borrow_and_update() {
                        let _ = cut.wait_for(|cut| !*cut).await;
                        return;
                    }
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self { addr, cut, task }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    fn client(&self) -> kube::Client {
        let mut config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        config.default_namespace = "default".to_owned();
        kube::Client::try_from(config).unwrap()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One replica: its shard manager and its stand-in reconciler.
struct Replica {
    name: &'static str,
    ownership: ShardOwnership,
    stop: CancellationToken,
    manager: tokio::task::JoinHandle<()>,
    reconcilers: JoinSet<()>,
    relay: Relay,
}

/// The stand-in reconciler: one loop per cluster (like kube-runtime, one reconcile of an object
/// at a time), each reconciling its cluster while `ownership` says so, until `stop`.
fn stand_in(
    ownership: &ShardOwnership,
    name: &'static str,
    log: &Log,
    stop: &CancellationToken,
) -> JoinSet<()> {
    let mut reconcilers = JoinSet::new();
    for cluster in 0..CLUSTERS {
        let (ownership, stop, log) = (ownership.clone(), stop.clone(), log.clone());
        reconcilers.spawn(async move {
            let (namespace, cluster_name) = cluster_key(cluster);
            while !stop.is_cancelled() {
                if let Some(guard) = ownership.enter(&namespace, &cluster_name) {
                    let recording = Recording {
                        log: log.clone(),
                        cluster,
                        replica: name,
                        start: Instant::now(),
                    };
                    tokio::time::sleep(reconcile_time(cluster)).await;
                    drop(recording);
                    drop(guard);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }
    reconcilers
}

impl Replica {
    async fn start(kube: &FakeKube, name: &'static str, log: &Log) -> Self {
        Self::start_with(kube, name, log, SHARDS).await
    }

    async fn start_with(kube: &FakeKube, name: &'static str, log: &Log, shards: u32) -> Self {
        let upstream: SocketAddr = kube.url().trim_start_matches("http://").parse().unwrap();
        let relay = Relay::start(upstream).await;
        let ownership = ShardOwnership::new(NonZeroU32::new(shards).unwrap());
        let stop = CancellationToken::new();
        let manager = ShardManager::new(relay.client(), NAMESPACE, LEASE, name, TIMING, ownership.clone());
        let manager = tokio::spawn(manager.run(stop.clone()));
        let reconcilers = stand_in(&ownership, name, log, &stop);
        Self {
            name,
            ownership,
            stop,
            manager,
            reconcilers,
            relay,
        }
    }

    /// Dies: every task aborted where it is, nothing released.
    fn kill(mut self) {
        self.manager.abort();
        self.reconcilers.abort_all();
    }

    /// Shuts down gracefully: the manager stops the reconciles, waits for them and releases.
    async fn shut_down(mut self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.manager)
            .await
            .expect("the shard manager stops within 10 s")
            .unwrap();
        while self.reconcilers.join_next().await.is_some() {}
    }
}

/// Polls `check` every 20 ms until it holds; panics with `what` after `limit`.
async fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every shard held by exactly one of `replicas`, each holding some and at most one more than
/// any other.
fn settled(replicas: &[&Replica]) -> bool {
    settled_in(replicas, SHARDS)
}

fn settled_in(replicas: &[&Replica], shards: u32) -> bool {
    let mut seen = BTreeSet::new();
    let mut counts = Vec::new();
    for replica in replicas {
        let held = replica.ownership.held();
        counts.push(held.len());
        for shard in held {
            if !seen.insert(shard) {
                return false;
            }
        }
    }
    let (min, max) = (
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
    );
    seen.len() == shards as usize && min >= 1 && max - min <= 1
}

fn holdings(replicas: &[&Replica]) -> String {
    replicas
        .iter()
        .map(|r| format!("{}={:?}", r.name, r.ownership.held()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Per cluster, the first reconcile that started at or after `since`.
fn first_reconciles_since(log: &Log, since: Instant) -> BTreeMap<usize, Instant> {
    first_reconciles_by_since(log, since, |_| true)
}

/// [`first_reconciles_since`], of the reconciles by the replicas `by` accepts.
fn first_reconciles_by_since(
    log: &Log,
    since: Instant,
    by: impl Fn(&str) -> bool,
) -> BTreeMap<usize, Instant> {
    let mut first: BTreeMap<usize, Instant> = BTreeMap::new();
    for interval in log
        .lock()
        .unwrap()
        .iter()
        .filter(|i| i.start >= since && by(i.replica))
    {
        let entry = first.entry(interval.cluster).or_insert(interval.start);
        if interval.start < *entry {
            *entry = interval.start;
        }
    }
    first
}

/// Overlapping reconciles of one cluster by two replicas, described (times since `origin`).
fn overlaps(log: &[Interval], origin: Instant) -> Vec<String> {
    let mut by_cluster: BTreeMap<usize, Vec<&Interval>> = BTreeMap::new();
    for interval in log {
        by_cluster.entry(interval.cluster).or_default().push(interval);
    }
    let mut found = Vec::new();
    for (cluster, mut intervals) in by_cluster {
        intervals.sort_by_key(|i| i.start);
        // The latest end so far of each replica's reconciles of this cluster.
        let mut ends: BTreeMap<&str, (Instant, Instant)> = BTreeMap::new();
        for interval in intervals {
            for (other, (start, end)) in &ends {
                if *other != interval.replica && *end > interval.start {
                    found.push(format!(
                        "cluster {cluster}: {other} reconciled it from {:?} to {:?}, {} from {:?}",
                        start.duration_since(origin),
                        end.duration_since(origin),
                        interval.replica,
                        interval.start.duration_since(origin),
                    ));
                }
            }
            let entry = ends
                .entry(interval.replica)
                .or_insert((interval.start, interval.end));
            if interval.end > entry.1 {
                *entry = (interval.start, interval.end);
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_clusters_and_never_reconcile_one_twice_at_a_time() {
    let kube = FakeKube::start().await.unwrap();
    // Installs the TLS provider kube's client needs even for plain HTTP.
    let _ = kube.client().unwrap();
    let log: Log = Arc::default();
    let origin = Instant::now();

    // Two replicas share the 6 shards, 3 each.
    let a = Replica::start(&kube, "replica-a", &log).await;
    let b = Replica::start(&kube, "replica-b", &log).await;
    let took = wait_until("a and b share the shards", SETTLE, || settled(&[&a, &b])).await;
    println!("2 replicas settled in {took:?}: {}", holdings(&[&a, &b]));
    assert_eq!(a.ownership.held().len(), 3);
    assert_eq!(b.ownership.held().len(), 3);
    let since = Instant::now();
    wait_until("every cluster is reconciled", SETTLE, || {
        first_reconciles_since(&log, since).len() == CLUSTERS
    })
    .await;

    // A third joins: the two give one shard each up to it.
    let c = Replica::start(&kube, "replica-c", &log).await;
    let took = wait_until("c gets its share", SETTLE, || settled(&[&a, &b, &c])).await;
    println!(
        "a joining replica got its share in {took:?}: {}",
        holdings(&[&a, &b, &c])
    );
    for r in [&a, &b, &c] {
        assert_eq!(r.ownership.held().len(), 2, "{}", holdings(&[&a, &b, &c]));
    }

    // b dies: a and c take its shards once its Leases expired, and every cluster is reconciled
    // again within a lease duration and the margin. Only the survivors' reconciles count: an
    // abort stops a task at its next await, so a reconcile of b's that was being started as it
    // was killed may still log a start just after `killed`.
    let b_shards = b.ownership.held();
    let b_name = b.name;
    let survivor = move |replica: &str| replica != b_name;
    let killed = Instant::now();
    b.kill();
    let took = wait_until("a and c hold every shard", SETTLE, || settled(&[&a, &c])).await;
    println!(
        "after a kill, the survivors held every shard in {took:?}: {}",
        holdings(&[&a, &c])
    );
    wait_until(
        "every cluster is reconciled after the kill",
        TIMING.duration + MARGIN + Duration::from_secs(5),
        || first_reconciles_by_since(&log, killed, survivor).len() == CLUSTERS,
    )
    .await;
    let first = first_reconciles_by_since(&log, killed, survivor);
    let of_b: Vec<Duration> = (0..CLUSTERS)
        .filter(|cluster| {
            let (ns, name) = cluster_key(*cluster);
            b_shards.contains(&a.ownership.shard_of(&ns, &name))
        })
        .map(|cluster| first[&cluster].duration_since(killed))
        .collect();
    let slowest = first.values().map(|t| t.duration_since(killed)).max().unwrap();
    println!(
        "after a kill: the dead replica's {} clusters reconciled again after {:?} .. {:?} (lease duration {:?})",
        of_b.len(),
        of_b.iter().min().unwrap(),
        of_b.iter().max().unwrap(),
        TIMING.duration
    );
    assert!(!of_b.is_empty());
    assert!(
        slowest <= TIMING.duration + MARGIN,
        "a cluster waited {slowest:?} after the kill"
    );
    assert!(
        *of_b.iter().min().unwrap() >= TIMING.duration - TIMING.retry,
        "the dead replica's clusters were taken before its Leases could expire"
    );

    // A fourth joins after the kill.
    let d = Replica::start(&kube, "replica-d", &log).await;
    let took = wait_until("d gets its share", SETTLE, || settled(&[&a, &c, &d])).await;
    println!(
        "a replica joining after the kill got its share in {took:?}: {}",
        holdings(&[&a, &c, &d])
    );

    // c is cut off from the API but keeps running: it stops reconciling before its Leases can
    // expire for the others, who take its shards over; healed, it gets its share back.
    let c_shards = c.ownership.held();
    let cut = Instant::now();
    c.relay.set_cut(true);
    let stopped = wait_until("c stops reconciling", TIMING.duration, || {
        c.ownership.held().is_empty()
    })
    .await;
    println!(
        "cut off, a replica stopped reconciling after {stopped:?} (its renew deadline: {:?})",
        TIMING.renew_deadline()
    );
    let took = wait_until("a and d hold every shard", SETTLE, || settled(&[&a, &d])).await;
    let c_clusters: Vec<usize> = (0..CLUSTERS)
        .filter(|cluster| {
            let (ns, name) = cluster_key(*cluster);
            c_shards.contains(&a.ownership.shard_of(&ns, &name))
        })
        .collect();
    let by_others_since_cut = |cluster: usize| {
        log.lock()
            .unwrap()
            .iter()
            .filter(|i| i.cluster == cluster && i.replica != "replica-c" && i.start >= cut)
            .map(|i| i.start.duration_since(cut))
            .min()
    };
    wait_until(
        "the cut-off replica's clusters are reconciled by others",
        SETTLE,
        || c_clusters.iter().all(|c| by_others_since_cut(*c).is_some()),
    )
    .await;
    let of_c: Vec<Duration> = c_clusters
        .iter()
        .filter_map(|c| by_others_since_cut(*c))
        .collect();
    let (fastest, slowest) = (*of_c.iter().min().unwrap(), *of_c.iter().max().unwrap());
    println!(
        "cut off: the others held its shards after {took:?}; its {} clusters reconciled by another after {fastest:?} .. {slowest:?}",
        of_c.len()
    );
    assert!(
        slowest <= TIMING.duration + MARGIN,
        "a cluster of the cut-off replica waited {slowest:?}"
    );
    assert!(
        fastest >= TIMING.duration - TIMING.retry,
        "the cut-off replica's clusters were taken before its Leases could expire"
    );
    c.relay.set_cut(false);
    let took = wait_until("c is back with its share", SETTLE, || settled(&[&a, &c, &d])).await;
    println!(
        "healed, it got its share back in {took:?}: {}",
        holdings(&[&a, &c, &d])
    );

    // a shuts down gracefully: its Leases are released and taken at once, not after expiry.
    let a_shards = a.ownership.held();
    let leaving = Instant::now();
    a.shut_down().await;
    let took = wait_until("c and d hold every shard", SETTLE, || settled(&[&c, &d])).await;
    println!(
        "a graceful shutdown handed {} shards over in {:?}",
        a_shards.len(),
        leaving.elapsed()
    );
    assert!(
        took < TIMING.duration,
        "the shards of a replica that shut down were taken only after {took:?}: not released"
    );
    let leases = kube.objects("leases");
    let presence = format!("{LEASE}-replica-replica-a");
    assert!(
        leases
            .iter()
            .filter(|l| l["metadata"]["name"] == presence.as_str())
            .all(|l| l["spec"]
                .get("holderIdentity")
                .is_none_or(serde_json::Value::is_null)),
        "a released its presence Lease"
    );

    c.shut_down().await;
    d.shut_down().await;

    let log = log.lock().unwrap().clone();
    let found = overlaps(&log, origin);
    let by_replica = log.iter().fold(BTreeMap::<&str, usize>::new(), |mut m, i| {
        *m.entry(i.replica).or_default() += 1;
        m
    });
    println!("{} reconciles logged: {by_replica:?}", log.len());
    assert!(
        found.is_empty(),
        "{} overlapping reconciles, e.g.:\n{}",
        found.len(),
        found.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    // The shard Leases all exist, and every replica's presence Lease is released or gone.
    let shard_leases = leases
        .iter()
        .filter(|l| {
            l["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .contains("-shard-")
        })
        .count();
    assert_eq!(shard_leases, SHARDS as usize);
}

/// How often the fake API's Lease `name` was written (its resourceVersion changes), polled.
struct Writes {
    name: String,
    last: Option<String>,
    count: usize,
}

impl Writes {
    fn of(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            last: None,
            count: 0,
        }
    }

    fn poll(&mut self, kube: &FakeKube) -> usize {
        let rv = kube
            .objects("leases")
            .into_iter()
            .find(|l| l["metadata"]["name"] == self.name.as_str())
            .and_then(|l| l["metadata"]["resourceVersion"].as_str().map(str::to_owned));
        if rv.is_some() && rv != self.last {
            self.count += 1;
            self.last = rv;
        }
        self.count
    }
}

/// A rollout that turns sharding on and then changes the shard count: replicas of one
/// configuration take nothing while the other's hold Leases (`--shards 1`'s leader Lease, or
/// shard Leases of another count), and take over when those are released. No cluster is ever
/// reconciled by two replicas at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_shard_count_in_a_rollout_never_lets_two_configurations_act() {
    use etcd_operator::serve_mode::leader::{LeaderElectionArgs, run_while_leader};

    let kube = FakeKube::start().await.unwrap();
    let _ = kube.client().unwrap();
    let log: Log = Arc::default();
    let origin = Instant::now();

    // `--shards 1`: the leader reconciles every cluster.
    let leader_args = LeaderElectionArgs {
        leader_elect: true,
        leader_elect_lease_name: LEASE.to_owned(),
        leader_elect_lease_namespace: NAMESPACE.to_owned(),
        leader_elect_identity: Some("leader".to_owned()),
        leader_elect_lease_duration: 2,
        leader_elect_renew_period: 1,
        shards: 1,
    };
    let leading = Arc::new(Mutex::new(false));
    let stop_leader = CancellationToken::new();
    let leader = {
        let (log, leading) = (log.clone(), leading.clone());
        tokio::spawn(run_while_leader(
            kube.client().unwrap(),
            leader_args,
            stop_leader.clone(),
            move |stop: CancellationToken| {
                let (log, leading) = (log.clone(), leading.clone());
                async move {
                    *leading.lock().unwrap() = true;
                    let mut loops = stand_in(&ShardOwnership::all(), "leader", &log, &stop);
                    while loops.join_next().await.is_some() {}
                    *leading.lock().unwrap() = false;
                }
            },
        ))
    };
    wait_until("the leader leads", SETTLE, || *leading.lock().unwrap()).await;

    // Sharded replicas (3 shards) join: they take nothing while the leader Lease is held, for
    // as long as the leader renews it three times.
    let s1 = Replica::start_with(&kube, "sharded-3-a", &log, 3).await;
    let s2 = Replica::start_with(&kube, "sharded-3-b", &log, 3).await;
    let mut renewals = Writes::of(LEASE);
    let start = renewals.poll(&kube);
    wait_until("the leader renews three times", SETTLE, || {
        assert!(
            s1.ownership.held().is_empty() && s2.ownership.held().is_empty(),
            "took shards while the leader leads"
        );
        renewals.poll(&kube) >= start + 3
    })
    .await;
    // The leader goes: its Lease released, the sharded replicas take over at once.
    let leaving = Instant::now();
    stop_leader.cancel();
    leader.await.unwrap().unwrap();
    let took = wait_until("the 3-shard replicas hold every shard", SETTLE, || {
        settled_in(&[&s1, &s2], 3)
    })
    .await;
    println!(
        "the leader gone, 3-shard replicas held every shard in {:?}",
        leaving.elapsed()
    );
    assert!(
        took < TIMING.duration,
        "the leader Lease was not released: {took:?}"
    );

    // Replicas with 6 shards join: they take nothing while 3-shard Leases are held.
    let t1 = Replica::start_with(&kube, "sharded-6-a", &log, 6).await;
    let t2 = Replica::start_with(&kube, "sharded-6-b", &log, 6).await;
    let mut renewals = Writes::of(&format!("{LEASE}-shard-0"));
    let start = renewals.poll(&kube);
    wait_until("the 3-shard replicas renew three times", SETTLE, || {
        assert!(
            t1.ownership.held().is_empty() && t2.ownership.held().is_empty(),
            "took shards while 3-shard replicas hold theirs"
        );
        renewals.poll(&kube) >= start + 3
    })
    .await;
    // The old replicas go one by one; the new take over once none of the old holds a Lease.
    s1.shut_down().await;
    wait_until("the other 3-shard replica holds every shard", SETTLE, || {
        settled_in(&[&s2], 3)
    })
    .await;
    assert!(t1.ownership.held().is_empty() && t2.ownership.held().is_empty());
    s2.shut_down().await;
    wait_until("the 6-shard replicas hold every shard", SETTLE, || {
        settled_in(&[&t1, &t2], 6)
    })
    .await;
    println!("after the rollout: {}", holdings(&[&t1, &t2]));
    let since = Instant::now();
    wait_until("every cluster is reconciled", SETTLE, || {
        first_reconciles_since(&log, since).len() == CLUSTERS
    })
    .await;
    t1.shut_down().await;
    t2.shut_down().await;

    let log = log.lock().unwrap().clone();
    let found = overlaps(&log, origin);
    println!("{} reconciles logged", log.len());
    assert!(
        found.is_empty(),
        "{} overlapping reconciles, e.g.:\n{}",
        found.len(),
        found.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The real controller (`reconcile::run`) in every replica

use etcd_operator_controller::member_ops::fake::FakeMemberOps;
use etcd_operator_controller::model::{ClusterRef, MemberConfig, RuntimeMember};
use etcd_operator_controller::runtime::fake::FakeRuntime;
use etcd_operator_controller::runtime::{Runtime, RuntimeError, ValidatedCluster};

/// Every replica's ownership, by name: what the recording runtime checks against.
type Replicas = Arc<Mutex<Vec<(&'static str, ShardOwnership)>>>;

/// A runtime call of a reconcile: which cluster, by which replica, when, and whether another
/// replica had a reconcile of the same shard running at that moment.
#[derive(Debug, Clone)]
struct RuntimeCall {
    cluster: String,
    replica: &'static str,
    at: Instant,
    others_in_flight: Vec<&'static str>,
}

/// A [`Runtime`] per replica: a [`FakeRuntime`] per cluster, every call recorded with whether
/// another replica was reconciling a cluster of the same shard at the time.
struct Recorder {
    replica: &'static str,
    ownership: ShardOwnership,
    replicas: Replicas,
    calls: Arc<Mutex<Vec<RuntimeCall>>>,
    runtimes: Mutex<BTreeMap<String, Arc<FakeRuntime>>>,
}

impl Recorder {
    fn of(&self, cluster: &ClusterRef) -> Arc<FakeRuntime> {
        let shard = self.ownership.shard_of(&cluster.namespace, &cluster.name);
        let others_in_flight = self
            .replicas
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, o)| *name != self.replica && o.in_flight(shard) > 0)
            .map(|(name, _)| *name)
            .collect();
        self.calls.lock().unwrap().push(RuntimeCall {
            cluster: cluster.key(),
            replica: self.replica,
            at: Instant::now(),
            others_in_flight,
        });
        self.runtimes
            .lock()
            .unwrap()
            .entry(cluster.key())
            .or_default()
            .clone()
    }
}

impl Runtime for Recorder {
    async fn members(&self, cluster: &ClusterRef) -> Result<Vec<RuntimeMember>, RuntimeError> {
        let runtime = self.of(cluster);
        runtime.members(cluster).await
    }

    async fn reserve(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<RuntimeMember, RuntimeError> {
        let runtime = self.of(cluster);
        runtime.reserve(cluster, spec, name).await
    }

    async fn start(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        config: &MemberConfig,
    ) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.start(cluster, spec, name, config).await
    }

    async fn change_version(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        version: &str,
    ) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.change_version(cluster, spec, name, version).await
    }

    async fn renew_certificates(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.renew_certificates(cluster, spec, name).await
    }

    async fn recover_quorum(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        survivor: &str,
    ) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.recover_quorum(cluster, spec, survivor).await
    }

    async fn authority(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> Result<Option<etcd_operator_controller::tls::authority::AuthorityView>, RuntimeError> {
        let runtime = self.of(cluster);
        runtime.authority(cluster, spec).await
    }

    async fn advance_authority(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        to: etcd_operator_controller::tls::authority::AuthorityPhase,
        rotation: Option<&str>,
    ) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.advance_authority(cluster, spec, to, rotation).await
    }

    fn template_hash(&self, cluster: &ClusterRef, spec: &ValidatedCluster) -> Option<String> {
        self.of(cluster).template_hash(cluster, spec)
    }

    async fn expand_volume(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.expand_volume(cluster, spec, name).await
    }

    async fn recreate(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.recreate(cluster, spec, name).await
    }

    async fn stop(&self, cluster: &ClusterRef, name: &str) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.stop(cluster, name).await
    }

    fn snapshot_dir(&self, cluster: &ClusterRef) -> Option<std::path::PathBuf> {
        self.of(cluster).snapshot_dir(cluster)
    }

    async fn announce_replacement(&self, cluster: &ClusterRef, member: &str, note: &str) {
        let runtime = self.of(cluster);
        runtime.announce_replacement(cluster, member, note).await;
    }

    async fn warn(&self, cluster: &ClusterRef, reason: &str, action: &str, note: &str) {
        let runtime = self.of(cluster);
        runtime.warn(cluster, reason, action, note).await;
    }

    async fn remove(&self, cluster: &ClusterRef, name: &str, keep_data: bool) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.remove(cluster, name, keep_data).await
    }

    async fn teardown(&self, cluster: &ClusterRef, keep_data: bool) -> Result<(), RuntimeError> {
        let runtime = self.of(cluster);
        runtime.teardown(cluster, keep_data).await
    }

    async fn client_tls(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> Result<Option<etcd_operator_controller::tls::member::ClientTls>, RuntimeError> {
        let runtime = self.of(cluster);
        runtime.client_tls(cluster, spec).await
    }

    fn watch_children(
        &self,
        controller: kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster>,
    ) -> kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster> {
        controller
    }

    fn resync_interval(&self) -> Duration {
        Duration::from_secs(3)
    }
}

/// A replica running the real member controller over the fake API's EtcdClusters.
struct ControllerReplica {
    name: &'static str,
    ownership: ShardOwnership,
    registry: prometheus_client::registry::Registry,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ControllerReplica {
    fn start(
        kube: &FakeKube,
        name: &'static str,
        replicas: &Replicas,
        calls: &Arc<Mutex<Vec<RuntimeCall>>>,
    ) -> Self {
        let ownership = ShardOwnership::new(NonZeroU32::new(SHARDS).unwrap());
        replicas.lock().unwrap().push((name, ownership.clone()));
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = etcd_operator_controller::metrics::ControllerMetrics::register(&mut registry);
        let runtime = Recorder {
            replica: name,
            ownership: ownership.clone(),
            replicas: replicas.clone(),
            calls: calls.clone(),
            runtimes: Mutex::default(),
        };
        let ctx = etcd_operator_controller::reconcile::Context::with_member_ops(
            kube.client().unwrap(),
            runtime,
            Default::default(),
            FakeMemberOps::new(None),
        )
        .with_metrics(metrics.clone())
        .with_shards(ownership.clone());
        let manager = ShardManager::new(
            kube.client().unwrap(),
            NAMESPACE,
            LEASE,
            name,
            TIMING,
            ownership.clone(),
        )
        .with_metrics(metrics);
        let stop = CancellationToken::new();
        let tasks = vec![
            tokio::spawn(manager.run(stop.clone())),
            tokio::spawn(etcd_operator_controller::reconcile::run(ctx, async move {
                stop.cancelled().await;
            })),
        ];
        Self {
            name,
            ownership,
            registry,
            tasks,
        }
    }

    fn scrape(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }

    /// Dies: both tasks aborted, nothing released.
    fn kill(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

fn controller_settled(replicas: &[&ControllerReplica]) -> bool {
    let mut seen = BTreeSet::new();
    let mut counts = Vec::new();
    for r in replicas {
        let held = r.ownership.held();
        counts.push(held.len());
        if !held.into_iter().all(|s| seen.insert(s)) {
            return false;
        }
    }
    let (min, max) = (
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
    );
    seen.len() == SHARDS as usize && min >= 1 && max - min <= 1
}

/// Per cluster key, the first runtime call by one of `by` at or after `since`.
fn first_calls(
    calls: &Arc<Mutex<Vec<RuntimeCall>>>,
    since: Instant,
    by: &[&str],
) -> BTreeMap<String, Instant> {
    let mut first = BTreeMap::new();
    for call in calls.lock().unwrap().iter() {
        if call.at >= since && by.contains(&call.replica) {
            first.entry(call.cluster.clone()).or_insert(call.at);
        }
    }
    first
}

/// The real member controller in three replicas over 24 EtcdClusters (fake runtime and fake
/// member operations): each reconciles only the clusters of its shards, takes a gained shard's
/// clusters at once (`reconcile_all_on`), forgets the series of a lost one, and a killed
/// replica's clusters are taken over within a lease duration and a margin. At no runtime call of
/// a reconcile does another replica run a reconcile of the same shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_controller_reconciles_only_the_clusters_of_its_shards() {
    use etcd_operator_api::v1alpha2::EtcdCluster;

    const COUNT: usize = 24;
    let kube = FakeKube::start().await.unwrap();
    let client = kube.client().unwrap();
    for cluster in 0..COUNT {
        let (namespace, name) = cluster_key(cluster);
        let object: EtcdCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "etcd.operator.dev/v1alpha2",
            "kind": "EtcdCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "version": "3.5.21"},
        }))
        .unwrap();
        kube::Api::<EtcdCluster>::namespaced(client.clone(), &namespace)
            .create(&kube::api::PostParams::default(), &object)
            .await
            .unwrap();
    }
    let keys: Vec<String> = (0..COUNT)
        .map(|c| {
            let (ns, name) = cluster_key(c);
            format!("{ns}/{name}")
        })
        .collect();
    let shard_of = |key: &str| {
        let (ns, name) = key.split_once('/').unwrap();
        etcd_operator_controller::shard::shard_of(ns, name, NonZeroU32::new(SHARDS).unwrap())
    };
    let replicas: Replicas = Arc::default();
    let calls: Arc<Mutex<Vec<RuntimeCall>>> = Arc::default();

    let a = ControllerReplica::start(&kube, "replica-a", &replicas, &calls);
    let b = ControllerReplica::start(&kube, "replica-b", &replicas, &calls);
    wait_until("a and b share the shards", SETTLE, || {
        controller_settled(&[&a, &b])
    })
    .await;
    // Every cluster reconciled, each by the replica holding its shard.
    let since = Instant::now();
    let (a_held, b_held) = (a.ownership.held(), b.ownership.held());
    wait_until("every cluster is reconciled", SETTLE, || {
        first_calls(&calls, since, &["replica-a", "replica-b"]).len() == COUNT
    })
    .await;
    assert_eq!(
        (a.ownership.held(), b.ownership.held()),
        (a_held.clone(), b_held.clone())
    );
    for call in calls.lock().unwrap().iter().filter(|c| c.at >= since) {
        let held = if call.replica == "replica-a" {
            &a_held
        } else {
            &b_held
        };
        assert!(
            held.contains(&shard_of(&call.cluster)),
            "{} reconciled {} of shard {} holding {held:?}",
            call.replica,
            call.cluster,
            shard_of(&call.cluster)
        );
    }
    // The controllers saw every cluster (their status written), and each replica's series are of
    // its own clusters only.
    wait_until("each replica's series are of its clusters", SETTLE, || {
        keys.iter().all(|key| {
            let (ns, name) = key.split_once('/').unwrap();
            let series = format!("namespace=\"{ns}\",cluster=\"{name}\"");
            let mine = if a_held.contains(&shard_of(key)) { &a } else { &b };
            let other = if mine.name == "replica-a" { &b } else { &a };
            mine.scrape().contains(&series) && !other.scrape().contains(&series)
        })
    })
    .await;

    // c joins: the clusters of the shards it gets are reconciled by it at once, and the replicas
    // that gave them up drop their series.
    let c = ControllerReplica::start(&kube, "replica-c", &replicas, &calls);
    let joined = Instant::now();
    wait_until("c gets its share", SETTLE, || controller_settled(&[&a, &b, &c])).await;
    let c_held = c.ownership.held();
    let moved: Vec<&String> = keys.iter().filter(|k| c_held.contains(&shard_of(k))).collect();
    assert!(!moved.is_empty());
    let took = wait_until(
        "c reconciles the clusters of its shards",
        Duration::from_secs(10),
        || {
            let first = first_calls(&calls, joined, &["replica-c"]);
            moved.iter().all(|k| first.contains_key(*k))
        },
    )
    .await;
    println!(
        "real controller: a joining replica had reconciled all {} clusters of its shards {took:?} after the shards settled",
        moved.len()
    );
    wait_until("a and b forget the moved clusters' series", SETTLE, || {
        moved.iter().all(|key| {
            let (ns, name) = key.split_once('/').unwrap();
            let series = format!("namespace=\"{ns}\",cluster=\"{name}\"");
            !a.scrape().contains(&series) && !b.scrape().contains(&series)
        })
    })
    .await;
    for r in [&a, &b, &c] {
        assert!(
            r.scrape().lines().any(|l| l == "etcd_operator_shards_held 2"),
            "{}",
            r.name
        );
    }

    // b dies: its clusters are reconciled by a or c within a lease duration and the margin.
    let b_held = b.ownership.held();
    let of_b: Vec<&String> = keys.iter().filter(|k| b_held.contains(&shard_of(k))).collect();
    let killed = Instant::now();
    b.kill();
    wait_until("a and c reconcile b's clusters", SETTLE, || {
        let first = first_calls(&calls, killed, &["replica-a", "replica-c"]);
        of_b.iter().all(|k| first.contains_key(*k))
    })
    .await;
    let first = first_calls(&calls, killed, &["replica-a", "replica-c"]);
    let slowest = of_b
        .iter()
        .map(|k| first[*k].duration_since(killed))
        .max()
        .unwrap();
    println!(
        "real controller: a killed replica's {} clusters reconciled again after at most {slowest:?}",
        of_b.len()
    );
    assert!(
        slowest <= TIMING.duration + MARGIN + Duration::from_secs(1),
        "{slowest:?}"
    );
    wait_until("a and c hold every shard", SETTLE, || {
        controller_settled(&[&a, &c])
    })
    .await;

    a.kill();
    c.kill();
    let calls = calls.lock().unwrap().clone();
    let clashes: Vec<&RuntimeCall> = calls.iter().filter(|c| !c.others_in_flight.is_empty()).collect();
    println!("real controller: {} runtime calls recorded", calls.len());
    assert!(
        clashes.is_empty(),
        "runtime calls while another replica reconciled the same shard: {:?}",
        clashes.iter().take(5).collect::<Vec<_>>()
    );
}
