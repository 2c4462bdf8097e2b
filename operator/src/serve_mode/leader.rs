//! Leader election for the controller: with more than one replica of `etcd-operator serve`, every
//! replica serves the API but only the one holding a `coordination.k8s.io/v1` Lease runs the
//! controller; it stops the controller when it loses the Lease.
//!
//! Hand-written, the way client-go's `leaderelection` package does it (get, then create or
//! update with the object's `resourceVersion`, so a concurrent writer gets 409 Conflict and
//! loses): `kube-lease-manager` is the maintained crate for kube 5, but it takes the Lease with
//! server-side apply, which pulls a second `rand` into the lock file and needs kube-apiserver's
//! field-ownership conflicts to be correct, which a recorded exchange cannot show. Expiry is
//! judged like client-go: by how long *this* process has seen the same holder and renew time,
//! on its own monotonic clock, so clock skew between nodes does not matter.
//!
//! [`Observation`] (what to do with a Lease as read) is pure and unit-tested below; [`LeaseLock`]
//! does the API calls; [`Timing::act_until`] is how long a holder may act after a renewal;
//! [`run_while_leader`] runs a controller for as long as the Lease is held. Sharding
//! ([`super::shards`]) holds one Lease per shard with the same three pieces.

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio_util::sync::CancellationToken;

/// Flags of leader election (flattened into `etcd-operator serve`).
#[derive(Debug, Clone, clap::Args)]
pub struct LeaderElectionArgs {
    /// Run the controller only while this replica holds the leader-election Lease (needed with
    /// more than one replica).
    #[arg(long)]
    pub leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, default_value = "etcd-operator")]
    pub leader_elect_lease_name: String,
    /// Namespace of the Lease (default: the Pod's, from `POD_NAMESPACE`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_elect_lease_namespace: String,
    /// This replica's identity in the Lease (default: the Pod name, from `POD_NAME`; else a
    /// random one).
    #[arg(long, env = "POD_NAME")]
    pub leader_elect_identity: Option<String>,
    /// Seconds a Lease stays valid without renewal; others take it over after that.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(2..=3600))]
    pub leader_elect_lease_duration: u32,
    /// Seconds between attempts to acquire or renew (less than the lease duration).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub leader_elect_renew_period: u32,
    /// Split the EtcdClusters into this many shards, each with its own Lease
    /// (`<lease-name>-shard-<i>`), shared out among the replicas so that each reconciles the
    /// clusters of the shards it holds (more than 1 needs `--leader-elect`). With 1, the holder of
    /// the one Lease runs every controller.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub shards: u32,
}

impl LeaderElectionArgs {
    /// The identity: the flag, `POD_NAME`, or `etcd-operator-<random>`.
    pub fn identity(&self) -> String {
        self.leader_elect_identity
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("etcd-operator-{}", uuid::Uuid::new_v4().simple()))
    }

    /// The lease timing; an error when the renew period is not shorter than the duration.
    pub fn timing(&self) -> Result<Timing, LeaderElectionError> {
        let duration = Duration::from_secs(u64::from(self.leader_elect_lease_duration));
        let retry = Duration::from_secs(u64::from(self.leader_elect_renew_period));
        if retry >= duration {
            return Err(LeaderElectionError::Config(format!(
                "--leader-elect-renew-period ({}s) must be shorter than --leader-elect-lease-duration ({}s)",
                self.leader_elect_renew_period, self.leader_elect_lease_duration
            )));
        }
        Ok(Timing { duration, retry })
    }

    /// The number of shards; an error when more than one is asked for without leader election,
    /// or with a lease name that cannot be a label value (shard Leases are listed by it).
    pub fn shard_count(&self) -> Result<NonZeroU32, LeaderElectionError> {
        let shards = NonZeroU32::new(self.shards).unwrap_or(NonZeroU32::MIN);
        if shards.get() > 1 && !self.leader_elect {
            return Err(LeaderElectionError::Config(format!(
                "--shards={} needs --leader-elect (the shards are held through Leases)",
                self.shards
            )));
        }
        if shards.get() > 1 && self.leader_elect_lease_name.len() > 50 {
            return Err(LeaderElectionError::Config(format!(
                "--leader-elect-lease-name {:?} is longer than 50 characters, too long to name the shard Leases",
                self.leader_elect_lease_name
            )));
        }
        Ok(shards)
    }
}

/// How long a Lease lasts and how often it is renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Validity without renewal.
    pub duration: Duration,
    /// Time between acquire/renew attempts.
    pub retry: Duration,
}

impl Timing {
    /// How long after *sending* a successful acquire or renew the holder may act: one duration
    /// less one retry period. Another candidate waits a full duration from when it first *saw*
    /// that renewal (which is after it was sent), so the holder stops at least one retry period
    /// before anyone may take over, whatever the nodes' clocks say.
    pub fn renew_deadline(&self) -> Duration {
        self.duration.saturating_sub(self.retry)
    }

    /// The instant until which a holder whose acquire or renew was sent at `sent` may act.
    pub fn act_until(&self, sent: Instant) -> Instant {
        sent + self.renew_deadline()
    }
}

/// Leader election failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    /// The flags do not work together.
    #[error("configure leader election: {0}")]
    Config(String),
    /// kube-apiserver refused or could not be reached.
    #[error("{op} Lease {namespace}/{name}")]
    Kube {
        /// What was attempted: read, create, update, release.
        op: &'static str,
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The error (boxed: `kube::Error` is large).
        #[source]
        source: Box<kube::Error>,
    },
    /// kube-apiserver did not answer in time (a holder must not wait past its deadline).
    #[error("{op} Lease {namespace}/{name}: no answer within {after:?}")]
    Timeout {
        /// What was attempted.
        op: &'static str,
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// How long it waited.
        after: Duration,
    },
}

/// What a candidate does about the Lease it just read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No Lease: create it, holding it.
    Create,
    /// Held by us: renew it.
    Renew,
    /// Free, or expired: take it over.
    TakeOver,
    /// Held by someone else, valid for this long yet (as we observe it).
    Wait {
        /// The holder.
        holder: String,
        /// Remaining validity.
        remaining: Duration,
    },
}

/// The holder and renew time last seen, and since when (monotonic): how client-go judges expiry
/// without trusting other nodes' clocks.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    seen: Option<(Option<String>, Option<MicroTime>, Instant)>,
}

impl Observation {
    /// Records `lease` as read at `now` and decides what `identity` does about it.
    pub fn step(&mut self, lease: Option<&Lease>, identity: &str, now: Instant, timing: Timing) -> Step {
        let Some(lease) = lease else {
            self.seen = None;
            return Step::Create;
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record = (holder.clone(), spec.renew_time.clone());
        let since = match &self.seen {
            Some((h, r, at)) if (h, r) == (&record.0, &record.1) => *at,
            _ => now,
        };
        self.seen = Some((record.0, record.1, since));
        let Some(holder) = holder else {
            return Step::TakeOver;
        };
        if holder == identity {
            return Step::Renew;
        }
        // The Lease's own duration counts when it is longer than ours.
        let valid_for = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(timing.duration);
        let elapsed = now.saturating_duration_since(since);
        match valid_for.checked_sub(elapsed) {
            Some(remaining) if !remaining.is_zero() => Step::Wait { holder, remaining },
            _ => Step::TakeOver,
        }
    }
}

/// The Lease for `step`, from the one read (its `resourceVersion` kept: the update is
/// conditional on it).
pub fn desired_lease(
    current: Option<&Lease>,
    name: &str,
    identity: &str,
    timing: Timing,
    now: jiff::Timestamp,
) -> Lease {
    let mut lease = current.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    let old = lease.spec.take().unwrap_or_default();
    let ours = old.holder_identity.as_deref() == Some(identity);
    let transitions = old.lease_transitions.unwrap_or(0);
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(i32::try_from(timing.duration.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: if ours {
            old.acquire_time.clone()
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours || current.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..old
    });
    lease
}

/// The Lease in kube-apiserver, taken and renewed under one identity.
#[derive(Debug, Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timing: Timing,
    /// Labels set on every write (shard Leases are listed by them).
    labels: BTreeMap<String, String>,
}

/// The outcome of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the Lease (acquired or renewed).
    Held,
    /// Someone else holds it, or won a race for it (409 Conflict / AlreadyExists).
    NotHeld(Step),
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

impl LeaseLock {
    /// A lock on `namespace/name` for `identity`.
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str, timing: Timing) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            labels: BTreeMap::new(),
        }
    }

    /// Sets `labels` on the Lease whenever it is written.
    pub fn with_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.labels = labels;
        self
    }

    /// This lock's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn error(&self, op: &'static str) -> impl FnOnce(kube::Error) -> LeaderElectionError + '_ {
        move |source| LeaderElectionError::Kube {
            op,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: Box::new(source),
        }
    }

    /// One acquire-or-renew attempt: reads the Lease and creates, renews or takes it over when
    /// [`Observation::step`] says so. A lost race is [`Attempt::NotHeld`], not an error.
    pub async fn try_acquire_or_renew(
        &self,
        observation: &mut Observation,
    ) -> Result<Attempt, LeaderElectionError> {
        let current = self.api.get_opt(&self.name).await.map_err(self.error("read"))?;
        let step = observation.step(current.as_ref(), &self.identity, Instant::now(), self.timing);
        self.write(current.as_ref(), step).await
    }

    /// Carries out `step`, decided by [`Observation::step`] on `current` (the Lease as just
    /// read): creates, renews or takes the Lease over, with an update conditional on the
    /// `resourceVersion` read. [`Step::Wait`] writes nothing. A lost race is
    /// [`Attempt::NotHeld`], not an error.
    pub async fn write(&self, current: Option<&Lease>, step: Step) -> Result<Attempt, LeaderElectionError> {
        let mut desired = desired_lease(
            current,
            &self.name,
            &self.identity,
            self.timing,
            jiff::Timestamp::now(),
        );
        if !self.labels.is_empty() {
            desired
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .extend(self.labels.clone());
        }
        let result = match &step {
            Step::Wait { .. } => return Ok(Attempt::NotHeld(step)),
            Step::Create => self.api.create(&PostParams::default(), &desired).await,
            Step::Renew | Step::TakeOver => {
                self.api
                    .replace(&self.name, &PostParams::default(), &desired)
                    .await
            }
        };
        match result {
            Ok(_) => Ok(Attempt::Held),
            Err(error) if is_conflict(&error) => Ok(Attempt::NotHeld(step)),
            Err(error) => Err(self.error(if matches!(step, Step::Create) {
                "create"
            } else {
                "update"
            })(error)),
        }
    }

    /// [`Self::try_acquire_or_renew`], given up after `limit` (an error then).
    pub async fn try_acquire_or_renew_within(
        &self,
        observation: &mut Observation,
        limit: Duration,
    ) -> Result<Attempt, LeaderElectionError> {
        tokio::time::timeout(limit, self.try_acquire_or_renew(observation))
            .await
            .unwrap_or_else(|_| Err(self.timeout("acquire or renew", limit)))
    }

    /// The error of a call that took longer than `after`.
    pub fn timeout(&self, op: &'static str, after: Duration) -> LeaderElectionError {
        LeaderElectionError::Timeout {
            op,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            after,
        }
    }

    /// Gives the Lease up if we hold it (so the next replica need not wait for it to expire).
    pub async fn release(&self) -> Result<(), LeaderElectionError> {
        let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(self.error("read"))? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(error) if is_conflict(&error) => Ok(()),
            Err(error) => Err(self.error("release")(error)),
        }
    }
}

/// Runs `controller` while this replica holds the Lease, until `shutdown` is cancelled.
///
/// Without `--leader-elect` the controller simply runs. With it, the replica tries to acquire
/// the Lease every renew period; once it holds it, it starts `controller(stop)` and renews;
/// when the Lease is lost (another holder won a race) or cannot be renewed for a whole lease
/// duration less one renew period, it cancels `stop` and waits for the controller to end,
/// then competes again. On shutdown the controller is stopped and the Lease released.
pub async fn run_while_leader<F, Fut>(
    client: kube::Client,
    args: LeaderElectionArgs,
    shutdown: CancellationToken,
    mut controller: F,
) -> Result<(), LeaderElectionError>
where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    if !args.leader_elect {
        let stop = shutdown.child_token();
        controller(stop).await;
        return Ok(());
    }
    let timing = args.timing()?;
    let lock = LeaseLock::new(
        client,
        &args.leader_elect_lease_namespace,
        &args.leader_elect_lease_name,
        &args.identity(),
        timing,
    );
    let mut observation = Observation::default();
    let mut leading: Option<(CancellationToken, tokio::task::JoinHandle<()>)> = None;
    // Step down before others may take over: they wait a full duration after our last renew.
    let mut act_until = Instant::now();
    let mut was_waiting_for: Option<String> = None;
    loop {
        let sent = Instant::now();
        if sent >= act_until
            && let Some((stop, task)) = leading.take()
        {
            tracing::warn!(
                identity = lock.identity(),
                "could not renew the leader Lease in time; stopping the controller"
            );
            stop.cancel();
            let _ = task.await;
        }
        // A hanging request must not keep the leader past its deadline.
        let limit = if leading.is_some() {
            timing.retry.min(act_until.saturating_duration_since(sent))
        } else {
            timing.retry
        };
        match lock.try_acquire_or_renew_within(&mut observation, limit).await {
            Ok(Attempt::Held) => {
                act_until = timing.act_until(sent);
                was_waiting_for = None;
                if leading.is_none() {
                    tracing::info!(identity = lock.identity(), lease = %args.leader_elect_lease_name, "acquired the leader Lease; starting the controller");
                    let stop = shutdown.child_token();
                    leading = Some((stop.clone(), tokio::spawn(controller(stop))));
                }
            }
            Ok(Attempt::NotHeld(step)) => {
                if let Some((stop, task)) = leading.take() {
                    tracing::warn!(
                        identity = lock.identity(),
                        ?step,
                        "lost the leader Lease; stopping the controller"
                    );
                    stop.cancel();
                    let _ = task.await;
                } else if let Step::Wait { holder, .. } = &step
                    && was_waiting_for.as_ref() != Some(holder)
                {
                    tracing::info!(identity = lock.identity(), %holder, "another replica leads; waiting");
                    was_waiting_for = Some(holder.clone());
                }
            }
            Err(error) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "leader election");
                if Instant::now() >= act_until
                    && let Some((stop, task)) = leading.take()
                {
                    tracing::warn!(
                        identity = lock.identity(),
                        "could not renew the leader Lease in time; stopping the controller"
                    );
                    stop.cancel();
                    let _ = task.await;
                }
            }
        }
        // While leading, wake at the deadline at the latest.
        let pause = if leading.is_some() {
            timing
                .retry
                .min(act_until.saturating_duration_since(Instant::now()))
        } else {
            timing.retry
        };
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
    }
    if let Some((stop, task)) = leading.take() {
        stop.cancel();
        let _ = task.await;
        lock.release().await?;
        tracing::info!(identity = lock.identity(), "released the leader Lease");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        duration: Duration::from_secs(15),
        retry: Duration::from_secs(5),
    };

    fn lease(holder: Option<&str>, renew_secs: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("etcd-operator".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(
                    jiff::Timestamp::from_second(renew_secs).unwrap_or_default(),
                )),
                lease_transitions: Some(2),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn no_lease_is_created_and_our_own_is_renewed() {
        let now = Instant::now();
        assert_eq!(Observation::default().step(None, "a", now, T), Step::Create);
        assert_eq!(
            Observation::default().step(Some(&lease(Some("a"), 1)), "a", now, T),
            Step::Renew
        );
        assert_eq!(
            Observation::default().step(Some(&lease(None, 1)), "a", now, T),
            Step::TakeOver
        );
        assert_eq!(
            Observation::default().step(Some(&lease(Some(""), 1)), "a", now, T),
            Step::TakeOver
        );
    }

    #[test]
    fn another_holder_expires_only_after_a_duration_without_change_as_we_see_it() {
        let start = Instant::now();
        let mut obs = Observation::default();
        // First sight: a full duration to wait, whatever the (skewed) renew time says.
        assert_eq!(
            obs.step(Some(&lease(Some("b"), 1)), "a", start, T),
            Step::Wait {
                holder: "b".into(),
                remaining: T.duration
            }
        );
        let later = start + Duration::from_secs(10);
        assert_eq!(
            obs.step(Some(&lease(Some("b"), 1)), "a", later, T),
            Step::Wait {
                holder: "b".into(),
                remaining: Duration::from_secs(5)
            }
        );
        // b renewed: the clock starts again.
        let renewed = start + Duration::from_secs(14);
        assert_eq!(
            obs.step(Some(&lease(Some("b"), 2)), "a", renewed, T),
            Step::Wait {
                holder: "b".into(),
                remaining: T.duration
            }
        );
        // No renewal for 15 s: expired.
        assert_eq!(
            obs.step(Some(&lease(Some("b"), 2)), "a", renewed + T.duration, T),
            Step::TakeOver
        );
    }

    #[test]
    fn desired_lease_keeps_the_resource_version_and_counts_transitions() {
        let now = jiff::Timestamp::from_second(100).unwrap_or_default();
        let created = desired_lease(None, "l", "a", T, now);
        let spec = created.spec.clone().unwrap_or_default();
        assert_eq!(created.metadata.name.as_deref(), Some("l"));
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));

        let taken = desired_lease(Some(&lease(Some("b"), 1)), "l", "a", T, now);
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("7"));
        let spec = taken.spec.unwrap_or_default();
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));

        let mut mine = lease(Some("a"), 1);
        if let Some(s) = mine.spec.as_mut() {
            s.acquire_time = Some(MicroTime(jiff::Timestamp::from_second(50).unwrap_or_default()));
        }
        let renewed = desired_lease(Some(&mine), "l", "a", T, now)
            .spec
            .unwrap_or_default();
        assert_eq!(renewed.lease_transitions, Some(2));
        assert_eq!(
            renewed.acquire_time,
            Some(MicroTime(jiff::Timestamp::from_second(50).unwrap_or_default()))
        );
        assert_eq!(renewed.renew_time, Some(MicroTime(now)));
    }

    #[test]
    fn a_renew_period_not_shorter_than_the_duration_is_refused() {
        use clap::Parser;
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: LeaderElectionArgs,
        }
        let parse = |extra: &[&str]| {
            Cli::try_parse_from(["x", "--leader-elect-identity=p-0"].iter().chain(extra)).map(|c| c.args)
        };
        let args = parse(&[
            "--leader-elect",
            "--leader-elect-lease-duration=5",
            "--leader-elect-renew-period=5",
        ]);
        let Ok(args) = args else {
            unreachable!("the flags parse")
        };
        assert!(
            matches!(args.timing(), Err(LeaderElectionError::Config(m)) if m.contains("must be shorter"))
        );
        assert!(parse(&["--leader-elect-lease-duration=1"]).is_err());
        let Ok(ok) = parse(&[]) else {
            unreachable!("the defaults parse")
        };
        assert_eq!(ok.timing().ok(), Some(T));
        assert_eq!(ok.identity(), "p-0");
        assert!(!ok.leader_elect);
        assert_eq!(ok.shard_count().ok(), NonZeroU32::new(1));
        let Ok(sharded) = parse(&["--shards=4"]) else {
            unreachable!("the flags parse")
        };
        assert!(
            matches!(sharded.shard_count(), Err(LeaderElectionError::Config(m)) if m.contains("needs --leader-elect"))
        );
        let Ok(sharded) = parse(&["--shards=4", "--leader-elect"]) else {
            unreachable!("the flags parse")
        };
        assert_eq!(sharded.shard_count().ok(), NonZeroU32::new(4));
        assert!(parse(&["--shards=0"]).is_err());
    }

    #[test]
    fn a_holder_stops_one_retry_period_before_others_may_take_over() {
        let sent = Instant::now();
        assert_eq!(T.renew_deadline(), Duration::from_secs(10));
        assert_eq!(T.act_until(sent), sent + Duration::from_secs(10));
        // Another candidate first sees that renewal no earlier than it was sent, and waits a full
        // duration from then.
        let mut obs = Observation::default();
        let seen = sent + Duration::from_millis(1);
        assert!(matches!(
            obs.step(Some(&lease(Some("b"), 1)), "a", seen, T),
            Step::Wait { .. }
        ));
        assert!(matches!(
            obs.step(Some(&lease(Some("b"), 1)), "a", T.act_until(sent) + T.retry, T),
            Step::Wait { .. }
        ));
        assert_eq!(
            obs.step(Some(&lease(Some("b"), 1)), "a", seen + T.duration, T),
            Step::TakeOver
        );
    }
}
