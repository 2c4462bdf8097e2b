//! The controller's Prometheus series: reconcile durations, failures by their stable code, steps
//! taken, waits by reason, and per cluster and member the view the last reconcile observed
//! (members, health, quorum, alarms, database sizes) and the last successful scheduled backup.
//!
//! [`ClusterSample::of`] turns an observed view into the values (pure, unit-tested);
//! [`ControllerMetrics`] keeps the series and removes a cluster's (and a departed member's) when
//! they no longer exist, so nothing stale is scraped.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::model::{AlarmKind, is_healthy, quorum};
use crate::plan::{Observed, Step};

/// Reconcile duration buckets, in seconds (a reconcile takes up to a dozen steps, some of
/// which wait for etcd).
const DURATION_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Every alarm kind, each always reported (0 or 1) for a cluster whose etcd answered.
const ALARMS: [AlarmKind; 2] = [AlarmKind::NoSpace, AlarmKind::Corrupt];

/// An EtcdCluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct ClusterLabels {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub cluster: String,
}

/// A member of an EtcdCluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MemberLabels {
    /// The cluster's namespace.
    pub namespace: String,
    /// The cluster's name.
    pub cluster: String,
    /// The member's name (its Pod's, or its local process's).
    pub member: String,
}

/// An alarm of an EtcdCluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AlarmLabels {
    /// The cluster's namespace.
    pub namespace: String,
    /// The cluster's name.
    pub cluster: String,
    /// etcd's name of the alarm (`NOSPACE`, `CORRUPT`).
    pub alarm: &'static str,
}

/// A stable code: a failure's, a wait's or a step's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The code (CamelCase).
    pub reason: &'static str,
}

/// A step the controller took.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct StepLabels {
    /// [`Step::code`].
    pub step: &'static str,
}

/// What one member looked like.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberSample {
    /// Its name.
    pub name: String,
    /// Whether it answered its status without errors and sees a leader.
    pub healthy: bool,
    /// Its database file size and the part in use, in bytes, when it answered.
    pub db_size: Option<(u64, u64)>,
}

/// What one cluster looked like in a reconcile's observed view.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSample {
    /// `spec.replicas`.
    pub desired: usize,
    /// Members in etcd's member list (learners included); `None` when no member answered.
    pub members: Option<usize>,
    /// Whether the healthy voters are a quorum of the voters; `None` for a cluster that never
    /// formed and that no member answers for (paused before it started, or bootstrapping): it
    /// has not lost a quorum it never had, and `EtcdClusterQuorumLost` must not fire for it.
    pub quorum: Option<bool>,
    /// Each alarm kind and whether it is raised; empty when no member answered.
    pub alarms: Vec<(AlarmKind, bool)>,
    /// Each member the runtime holds or etcd lists, by name.
    pub member_samples: Vec<MemberSample>,
}

impl ClusterSample {
    /// The values of `observed` for a cluster of `desired` replicas, which formed before (its
    /// status records a cluster ID) or not.
    pub fn of(desired: usize, formed_before: bool, observed: &Observed) -> Self {
        let etcd = observed.etcd.as_ref();
        let mut member_samples: Vec<MemberSample> = Vec::new();
        for runtime in &observed.runtime {
            let in_etcd = etcd.and_then(|v| v.by_peer_url(&runtime.peer_url));
            member_samples.push(MemberSample {
                name: runtime.name.clone(),
                healthy: in_etcd.is_some_and(is_healthy),
                db_size: in_etcd
                    .and_then(|m| m.status.as_ref())
                    .map(|s| (s.db_size, s.db_size_in_use)),
            });
        }
        // Members etcd lists that no runtime member backs (named once they started).
        for member in etcd.map(|v| v.members.as_slice()).unwrap_or_default() {
            if member.name.is_empty() || member_samples.iter().any(|s| s.name == member.name) {
                continue;
            }
            let backed = observed
                .runtime
                .iter()
                .any(|r| member.peer_urls.contains(&r.peer_url));
            if !backed {
                member_samples.push(MemberSample {
                    name: member.name.clone(),
                    healthy: is_healthy(member),
                    db_size: member.status.as_ref().map(|s| (s.db_size, s.db_size_in_use)),
                });
            }
        }
        member_samples.sort_by(|a, b| a.name.cmp(&b.name));
        let voters = etcd.map_or(0, |v| v.voters().count());
        Self {
            desired,
            members: etcd.map(|v| v.members.len()),
            quorum: (formed_before || etcd.is_some())
                .then(|| etcd.is_some_and(|v| voters > 0 && v.healthy_voters() >= quorum(voters))),
            alarms: etcd.map_or_else(Vec::new, |v| {
                ALARMS
                    .iter()
                    .map(|kind| (*kind, v.alarms.iter().any(|a| a.alarm == *kind)))
                    .collect()
            }),
            member_samples,
        }
    }
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The controller's series. Cheap to clone (the families are shared); the member and the backup
/// controllers of one process share one.
#[derive(Debug, Clone)]
pub struct ControllerMetrics {
    reconcile_duration: Histogram,
    /// The longest reconcile this process ran (a reconcile never waits for the world: this says
    /// how long the longest step took).
    reconcile_longest: Gauge<f64, AtomicU64>,
    longest: Arc<Mutex<f64>>,
    reconcile_errors: Family<ReasonLabels, Counter>,
    waits: Family<ReasonLabels, Counter>,
    steps: Family<StepLabels, Counter>,
    desired_members: Family<ClusterLabels, Gauge>,
    members: Family<ClusterLabels, Gauge>,
    quorum: Family<ClusterLabels, Gauge>,
    alarms: Family<AlarmLabels, Gauge>,
    member_healthy: Family<MemberLabels, Gauge>,
    member_db_size: Family<MemberLabels, Gauge>,
    member_db_in_use: Family<MemberLabels, Gauge>,
    backup_last_success: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    backup_failures: Family<ReasonLabels, Counter>,
    etcdbackup_last_success: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    etcdbackup_failures: Family<ReasonLabels, Counter>,
    shards: Gauge,
    shards_held: Gauge,
    /// The members each cluster's series were last recorded for, to remove departed ones.
    recorded_members: Arc<Mutex<HashMap<ClusterLabels, BTreeSet<String>>>>,
}

impl Default for ControllerMetrics {
    /// Series recorded but not registered anywhere (tests, or a process without `/metrics`).
    fn default() -> Self {
        Self {
            reconcile_duration: duration_histogram(),
            reconcile_longest: Gauge::default(),
            longest: Arc::default(),
            reconcile_errors: Family::default(),
            waits: Family::default(),
            steps: Family::default(),
            desired_members: Family::default(),
            members: Family::default(),
            quorum: Family::default(),
            alarms: Family::default(),
            member_healthy: Family::default(),
            member_db_size: Family::default(),
            member_db_in_use: Family::default(),
            backup_last_success: Family::default(),
            backup_failures: Family::default(),
            etcdbackup_last_success: Family::default(),
            etcdbackup_failures: Family::default(),
            shards: Gauge::default(),
            shards_held: Gauge::default(),
            recorded_members: Arc::default(),
        }
    }
}

impl ControllerMetrics {
    /// Creates the series and registers them in `registry` under the `etcd_operator_` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("etcd_operator");
        r.register(
            "reconcile_duration_seconds",
            "Time one EtcdCluster reconcile took (observe, steps, status write)",
            m.reconcile_duration.clone(),
        );
        r.register(
            "reconcile_longest_seconds",
            "The longest EtcdCluster reconcile since the process started",
            m.reconcile_longest.clone(),
        );
        // Counters get `_total` appended by the text encoding.
        r.register(
            "reconcile_errors",
            "Reconciles that ended in an error, by its stable code",
            m.reconcile_errors.clone(),
        );
        r.register(
            "reconcile_waits",
            "Reconciles that waited instead of acting, by the wait's stable code",
            m.waits.clone(),
        );
        r.register(
            "steps",
            "Steps the controller carried out (successful or not), by step",
            m.steps.clone(),
        );
        r.register(
            "cluster_desired_members",
            "spec.replicas of each EtcdCluster",
            m.desired_members.clone(),
        );
        r.register(
            "cluster_members",
            "Members in etcd's member list (learners included), as last observed",
            m.members.clone(),
        );
        r.register(
            "cluster_quorum",
            "1 when the healthy voting members are a quorum, else 0, as last observed",
            m.quorum.clone(),
        );
        r.register(
            "cluster_alarm",
            "1 while etcd reports the alarm (NOSPACE, CORRUPT) in the cluster, else 0",
            m.alarms.clone(),
        );
        r.register(
            "member_healthy",
            "1 when the member answers its status without errors and sees a leader, else 0",
            m.member_healthy.clone(),
        );
        r.register(
            "member_db_size_bytes",
            "Size of the member's database file",
            m.member_db_size.clone(),
        );
        r.register(
            "member_db_size_in_use_bytes",
            "Bytes of the member's database file in use (the rest a defragmentation returns)",
            m.member_db_in_use.clone(),
        );
        r.register(
            "backup_last_success_timestamp_seconds",
            "When the last successful scheduled backup of the cluster was taken (Unix time)",
            m.backup_last_success.clone(),
        );
        r.register(
            "backup_failures",
            "Scheduled backups that failed, by reason",
            m.backup_failures.clone(),
        );
        r.register(
            "etcdbackup_last_success_timestamp_seconds",
            "When the newest successful EtcdBackup of the cluster completed (Unix time)",
            m.etcdbackup_last_success.clone(),
        );
        r.register(
            "etcdbackup_failures",
            "EtcdBackups that failed for good (after their retries), by reason",
            m.etcdbackup_failures.clone(),
        );
        r.register(
            "shards",
            "Shards the EtcdClusters are split into among the operator replicas (--shards)",
            m.shards.clone(),
        );
        r.register(
            "shards_held",
            "Shards whose clusters this replica reconciles now",
            m.shards_held.clone(),
        );
        m
    }

    /// Records that this replica holds `held` of `total` shards.
    pub fn set_shards(&self, held: usize, total: u32) {
        self.shards.set(i64::from(total));
        self.shards_held.set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// Records how long a reconcile took.
    pub fn observe_reconcile(&self, seconds: f64) {
        self.reconcile_duration.observe(seconds);
        if let Ok(mut longest) = self.longest.lock()
            && seconds > *longest
        {
            *longest = seconds;
            self.reconcile_longest.set(seconds);
        }
    }

    /// The longest reconcile recorded, in seconds.
    pub fn longest_reconcile(&self) -> f64 {
        self.reconcile_longest.get()
    }

    /// Counts a reconcile that ended in an error with this stable code.
    pub fn reconcile_failed(&self, code: &'static str) {
        self.reconcile_errors
            .get_or_create(&ReasonLabels { reason: code })
            .inc();
    }

    /// Counts a step carried out, or the wait, of a reconcile.
    pub fn stepped(&self, step: &Step) {
        match step {
            Step::Idle => {}
            Step::Wait { reason } => {
                self.waits
                    .get_or_create(&ReasonLabels {
                        reason: reason.code(),
                    })
                    .inc();
            }
            step => {
                self.steps.get_or_create(&StepLabels { step: step.code() }).inc();
            }
        }
    }

    /// Records the cluster's observed view; removes the series of members no longer in it.
    pub fn record_cluster(&self, namespace: &str, cluster: &str, sample: &ClusterSample) {
        let labels = ClusterLabels {
            namespace: namespace.to_owned(),
            cluster: cluster.to_owned(),
        };
        set(&self.desired_members, &labels, sample.desired);
        match sample.members {
            Some(n) => set(&self.members, &labels, n),
            None => {
                self.members.remove(&labels);
            }
        }
        match sample.quorum {
            Some(quorum) => set(&self.quorum, &labels, usize::from(quorum)),
            None => {
                self.quorum.remove(&labels);
            }
        }
        for kind in ALARMS {
            let alarm = self.alarm_labels(&labels, kind);
            match sample.alarms.iter().find(|(k, _)| *k == kind) {
                Some((_, raised)) => {
                    self.alarms.get_or_create(&alarm).set(i64::from(*raised));
                }
                None => {
                    self.alarms.remove(&alarm);
                }
            }
        }
        let now: BTreeSet<String> = sample.member_samples.iter().map(|m| m.name.clone()).collect();
        // A cluster without members holds no entry (a fleet of paused clusters that never
        // started would hold one each for nothing).
        let before = self
            .recorded_members
            .lock()
            .map(|mut all| {
                if now.is_empty() {
                    all.remove(&labels)
                } else {
                    all.insert(labels.clone(), now.clone())
                }
                .unwrap_or_default()
            })
            .unwrap_or_default();
        for gone in before.difference(&now) {
            self.remove_member(&labels, gone);
        }
        for m in &sample.member_samples {
            let member = member_labels(&labels, &m.name);
            self.member_healthy
                .get_or_create(&member)
                .set(i64::from(m.healthy));
            match m.db_size {
                Some((size, in_use)) => {
                    set(&self.member_db_size, &member, size);
                    set(&self.member_db_in_use, &member, in_use);
                }
                None => {
                    self.member_db_size.remove(&member);
                    self.member_db_in_use.remove(&member);
                }
            }
        }
    }

    /// Records when the cluster's last successful scheduled backup was taken (`None`: it has
    /// none, or backups are off).
    pub fn record_backup(
        &self,
        namespace: &str,
        cluster: &str,
        taken: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let labels = ClusterLabels {
            namespace: namespace.to_owned(),
            cluster: cluster.to_owned(),
        };
        match taken {
            Some(t) => {
                // Milliseconds are plenty; the f64 holds them exactly for millennia.
                #[allow(clippy::cast_precision_loss)]
                let seconds = t.timestamp_millis() as f64 / 1000.0;
                self.backup_last_success.get_or_create(&labels).set(seconds);
            }
            None => {
                self.backup_last_success.remove(&labels);
            }
        }
    }

    /// Records an EtcdBackup of the cluster that succeeded at `completed` (an older one seen
    /// later does not move the series back).
    pub fn record_etcdbackup(
        &self,
        namespace: &str,
        cluster: &str,
        completed: chrono::DateTime<chrono::Utc>,
    ) {
        let labels = ClusterLabels {
            namespace: namespace.to_owned(),
            cluster: cluster.to_owned(),
        };
        // Milliseconds are plenty; the f64 holds them exactly for millennia.
        #[allow(clippy::cast_precision_loss)]
        let seconds = completed.timestamp_millis() as f64 / 1000.0;
        let gauge = self.etcdbackup_last_success.get_or_create(&labels);
        if gauge.get() < seconds {
            gauge.set(seconds);
        }
    }

    /// Counts an EtcdBackup that failed for good.
    pub fn etcdbackup_failed(&self, reason: &'static str) {
        self.etcdbackup_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a failed scheduled backup.
    pub fn backup_failed(&self, reason: &'static str) {
        self.backup_failures.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Removes every series of the cluster (it was deleted).
    pub fn forget_cluster(&self, namespace: &str, cluster: &str) {
        let labels = ClusterLabels {
            namespace: namespace.to_owned(),
            cluster: cluster.to_owned(),
        };
        for family in [&self.desired_members, &self.members, &self.quorum] {
            family.remove(&labels);
        }
        for kind in ALARMS {
            self.alarms.remove(&self.alarm_labels(&labels, kind));
        }
        self.backup_last_success.remove(&labels);
        self.etcdbackup_last_success.remove(&labels);
        let members = self
            .recorded_members
            .lock()
            .ok()
            .and_then(|mut all| all.remove(&labels))
            .unwrap_or_default();
        for member in &members {
            self.remove_member(&labels, member);
        }
    }

    /// Removes every cluster's series (this replica stopped reconciling: it lost leadership).
    pub fn forget_all_clusters(&self) {
        for family in [&self.desired_members, &self.members, &self.quorum] {
            family.clear();
        }
        self.alarms.clear();
        self.backup_last_success.clear();
        self.etcdbackup_last_success.clear();
        for family in [&self.member_healthy, &self.member_db_size, &self.member_db_in_use] {
            family.clear();
        }
        if let Ok(mut all) = self.recorded_members.lock() {
            all.clear();
        }
    }

    fn alarm_labels(&self, labels: &ClusterLabels, kind: AlarmKind) -> AlarmLabels {
        AlarmLabels {
            namespace: labels.namespace.clone(),
            cluster: labels.cluster.clone(),
            alarm: kind.as_str(),
        }
    }

    fn remove_member(&self, labels: &ClusterLabels, member: &str) {
        let member = member_labels(labels, member);
        for family in [&self.member_healthy, &self.member_db_size, &self.member_db_in_use] {
            family.remove(&member);
        }
    }
}

fn member_labels(cluster: &ClusterLabels, member: &str) -> MemberLabels {
    MemberLabels {
        namespace: cluster.namespace.clone(),
        cluster: cluster.cluster.clone(),
        member: member.to_owned(),
    }
}

/// Sets an integer gauge from a count or a size (saturating at `i64::MAX`).
fn set<L>(family: &Family<L, Gauge>, labels: &L, value: impl TryInto<i64>)
where
    L: Clone + std::hash::Hash + Eq,
{
    family
        .get_or_create(labels)
        .set(value.try_into().unwrap_or(i64::MAX));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EtcdMember, EtcdView, Liveness, MemberAlarm, MemberHealth, RuntimeMember};
    use crate::plan::{Timing, WaitReason};

    fn runtime(name: &str) -> RuntimeMember {
        RuntimeMember {
            name: name.into(),
            peer_url: format!("http://{name}:2380"),
            client_url: format!("http://{name}:2379"),
            config: None,
            liveness: Liveness::Running,
            certificates: None,
            restarts: 0,
            template_hash: None,
            volume: None,
            created: None,
        }
    }

    fn member(id: u64, name: &str, healthy: Option<bool>, db: u64) -> EtcdMember {
        EtcdMember {
            id,
            name: name.into(),
            peer_urls: vec![format!("http://{name}:2380")],
            client_urls: vec![format!("http://{name}:2379")],
            learner: false,
            status: healthy.map(|h| MemberHealth {
                version: "3.5.21".into(),
                raft_applied_index: 10,
                leader: if h { 1 } else { 0 },
                errors: Vec::new(),
                db_size: db,
                db_size_in_use: db / 2,
                ..MemberHealth::default()
            }),
        }
    }

    fn observed(runtime: Vec<RuntimeMember>, etcd: Option<EtcdView>) -> Observed {
        Observed {
            authority: None,
            runtime,
            etcd,
            timing: Timing::default(),
        }
    }

    #[test]
    fn a_sample_has_every_member_its_health_and_db_sizes() {
        let view = EtcdView {
            cluster_id: 1,
            members: vec![
                member(1, "a", Some(true), 4096),
                member(2, "b", Some(false), 8192),
                member(3, "c", None, 0),
                // etcd lists it, no runtime member backs it
                member(4, "z", Some(true), 100),
            ],
            leader: 1,
            alarms: vec![MemberAlarm {
                member: 1,
                alarm: AlarmKind::NoSpace,
            }],
        };
        // `d` is reserved in the runtime but not in etcd yet.
        let sample = ClusterSample::of(
            5,
            true,
            &observed(
                vec![runtime("a"), runtime("b"), runtime("c"), runtime("d")],
                Some(view),
            ),
        );
        assert_eq!(sample.desired, 5);
        assert_eq!(sample.members, Some(4));
        // 2 healthy voters of 4: no quorum (3 needed)
        assert_eq!(sample.quorum, Some(false));
        assert_eq!(
            sample.alarms,
            vec![(AlarmKind::NoSpace, true), (AlarmKind::Corrupt, false)]
        );
        type Row<'a> = (&'a str, bool, Option<(u64, u64)>);
        let got: Vec<Row<'_>> = sample
            .member_samples
            .iter()
            .map(|m| (m.name.as_str(), m.healthy, m.db_size))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", true, Some((4096, 2048))),
                ("b", false, Some((8192, 4096))),
                ("c", false, None),
                ("d", false, None),
                ("z", true, Some((100, 50))),
            ]
        );
    }

    #[test]
    fn a_cluster_no_member_answers_has_members_but_no_etcd_figures() {
        let sample = ClusterSample::of(3, true, &observed(vec![runtime("a")], None));
        assert_eq!(sample.members, None);
        assert_eq!(sample.quorum, Some(false), "formed before: quorum lost");
        let bootstrapping = ClusterSample::of(3, false, &observed(vec![runtime("a")], None));
        assert_eq!(bootstrapping.quorum, None, "never formed: no quorum to lose");
        assert!(sample.alarms.is_empty());
        assert_eq!(
            sample.member_samples,
            vec![MemberSample {
                name: "a".into(),
                healthy: false,
                db_size: None
            }]
        );
    }

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    fn has(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    /// A cluster that never formed (paused before it started) has its desired size and no
    /// quorum series, so `EtcdClusterQuorumLost` (`cluster_quorum == 0`) does not fire for it,
    /// and holds no member bookkeeping; once it formed and lost every member, quorum is 0.
    #[test]
    fn a_cluster_that_never_formed_has_no_quorum_series_and_no_member_entry() {
        let mut registry = Registry::default();
        let m = ControllerMetrics::register(&mut registry);
        m.record_cluster(
            "ns",
            "p",
            &ClusterSample::of(3, false, &observed(Vec::new(), None)),
        );
        let text = scrape(&registry);
        assert!(
            has(
                &text,
                r#"etcd_operator_cluster_desired_members{namespace="ns",cluster="p"} 3"#
            ),
            "{text}"
        );
        assert!(!text.contains("etcd_operator_cluster_quorum{"), "{text}");
        assert!(m.recorded_members.lock().unwrap().is_empty());
        // With a member, it has an entry; without again, none.
        m.record_cluster(
            "ns",
            "p",
            &ClusterSample::of(3, false, &observed(vec![runtime("a")], None)),
        );
        assert_eq!(m.recorded_members.lock().unwrap().len(), 1);
        m.record_cluster(
            "ns",
            "p",
            &ClusterSample::of(3, true, &observed(Vec::new(), None)),
        );
        assert!(m.recorded_members.lock().unwrap().is_empty());
        assert!(
            has(
                &scrape(&registry),
                r#"etcd_operator_cluster_quorum{namespace="ns",cluster="p"} 0"#
            ),
            "formed before and no member left: quorum lost"
        );
        assert!(!scrape(&registry).contains(r#"member="a""#));
    }

    #[test]
    fn departed_members_and_deleted_clusters_leave_no_series() {
        let mut registry = Registry::default();
        let m = ControllerMetrics::register(&mut registry);
        let three = EtcdView {
            cluster_id: 1,
            members: vec![
                member(1, "a", Some(true), 4096),
                member(2, "b", Some(true), 4096),
                member(3, "c", Some(true), 4096),
            ],
            leader: 1,
            alarms: Vec::new(),
        };
        let sample = ClusterSample::of(
            3,
            true,
            &observed(
                vec![runtime("a"), runtime("b"), runtime("c")],
                Some(three.clone()),
            ),
        );
        m.record_cluster("ns", "x", &sample);
        m.record_cluster("ns", "other", &sample);
        m.record_backup(
            "ns",
            "x",
            chrono::DateTime::from_timestamp(1_700_000_000, 500_000_000),
        );
        // EtcdBackups: the newest snapshot counts, one finishing late with an older one does not
        // move it back.
        let at = |s: i64| chrono::DateTime::from_timestamp(s, 0).unwrap();
        m.record_etcdbackup("ns", "x", at(1_700_000_100));
        m.record_etcdbackup("ns", "x", at(1_700_000_050));
        let text = scrape(&registry);
        for line in [
            r#"etcd_operator_cluster_desired_members{namespace="ns",cluster="x"} 3"#,
            r#"etcd_operator_cluster_members{namespace="ns",cluster="x"} 3"#,
            r#"etcd_operator_cluster_quorum{namespace="ns",cluster="x"} 1"#,
            r#"etcd_operator_cluster_alarm{namespace="ns",cluster="x",alarm="NOSPACE"} 0"#,
            r#"etcd_operator_member_healthy{namespace="ns",cluster="x",member="c"} 1"#,
            r#"etcd_operator_member_db_size_bytes{namespace="ns",cluster="x",member="c"} 4096"#,
            r#"etcd_operator_member_db_size_in_use_bytes{namespace="ns",cluster="x",member="c"} 2048"#,
            r#"etcd_operator_backup_last_success_timestamp_seconds{namespace="ns",cluster="x"} 1700000000.5"#,
            r#"etcd_operator_etcdbackup_last_success_timestamp_seconds{namespace="ns",cluster="x"} 1700000100.0"#,
        ] {
            assert!(has(&text, line), "missing {line:?} in\n{text}");
        }
        // Scaled down to two: `c` is gone from every family.
        let mut two = three;
        two.members.pop();
        let sample = ClusterSample::of(2, true, &observed(vec![runtime("a"), runtime("b")], Some(two)));
        m.record_cluster("ns", "x", &sample);
        let text = scrape(&registry);
        assert!(!text.contains(r#"cluster="x",member="c""#), "{text}");
        assert!(has(
            &text,
            r#"etcd_operator_member_healthy{namespace="ns",cluster="x",member="b"} 1"#
        ));
        assert!(has(
            &text,
            r#"etcd_operator_cluster_members{namespace="ns",cluster="x"} 2"#
        ));
        // Deleted: nothing of `x` is left, `other` is untouched.
        m.forget_cluster("ns", "x");
        let text = scrape(&registry);
        assert!(!text.contains(r#"cluster="x""#), "{text}");
        assert!(has(
            &text,
            r#"etcd_operator_member_healthy{namespace="ns",cluster="other",member="c"} 1"#
        ));
    }

    #[test]
    fn shards_held_survive_forgetting_the_clusters() {
        let mut registry = Registry::default();
        let m = ControllerMetrics::register(&mut registry);
        m.set_shards(2, 6);
        m.forget_all_clusters();
        let text = scrape(&registry);
        assert!(has(&text, "etcd_operator_shards 6"), "{text}");
        assert!(has(&text, "etcd_operator_shards_held 2"), "{text}");
    }

    #[test]
    fn reconciles_steps_waits_and_errors_are_counted_by_code() {
        let mut registry = Registry::default();
        let m = ControllerMetrics::register(&mut registry);
        m.observe_reconcile(0.02);
        m.observe_reconcile(3.0);
        m.observe_reconcile(0.5);
        assert_eq!(m.longest_reconcile(), 3.0);
        m.stepped(&Step::Promote {
            id: 1,
            name: "a".into(),
        });
        m.stepped(&Step::Wait {
            reason: WaitReason::QuorumLost,
        });
        m.stepped(&Step::Idle);
        m.reconcile_failed("EtcdTimeout");
        m.reconcile_failed("EtcdTimeout");
        m.backup_failed("NoHealthyMember");
        m.etcdbackup_failed("ClusterNotFound");
        let text = scrape(&registry);
        for line in [
            "etcd_operator_reconcile_duration_seconds_count 3",
            "etcd_operator_reconcile_longest_seconds 3.0",
            r#"etcd_operator_reconcile_duration_seconds_bucket{le="0.025"} 1"#,
            r#"etcd_operator_steps_total{step="Promote"} 1"#,
            r#"etcd_operator_reconcile_waits_total{reason="NoQuorum"} 1"#,
            r#"etcd_operator_reconcile_errors_total{reason="EtcdTimeout"} 2"#,
            r#"etcd_operator_backup_failures_total{reason="NoHealthyMember"} 1"#,
            r#"etcd_operator_etcdbackup_failures_total{reason="ClusterNotFound"} 1"#,
        ] {
            assert!(has(&text, line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains(r#"step="Idle""#), "{text}");
    }
}
