//! Events about an EtcdCluster: what both runtimes report ([`Report`]: type, reason, action,
//! note, decided once here), and the local runtime's [`LocalEvents`], which writes them as core
//! `v1` Events through the local API server (its own API, over loopback), folding repeats the
//! way client-go's `EventCorrelator` does: the same object, type, reason and message within
//! [`FOLD_WINDOW`] raise the existing Event's `count` and `lastTimestamp` instead of adding one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::Patch;

use crate::model::ClusterRef;
use crate::resources::{FIELD_MANAGER, cluster_object_reference};

/// The type of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Progress worth seeing.
    Normal,
    /// Trouble, or a disruptive step.
    Warning,
}

impl EventType {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One Event's content, whichever runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Normal or Warning.
    pub type_: EventType,
    /// A stable code (`MemberReplacing`).
    pub reason: String,
    /// What was being done (`ReplaceMember`).
    pub action: String,
    /// For people.
    pub note: String,
}

impl Report {
    /// A Warning about the cluster (the `Runtime::warn` of both runtimes).
    pub fn warning(reason: &str, action: &str, note: &str) -> Self {
        Self {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            action: action.to_owned(),
            note: note.to_owned(),
        }
    }

    /// A dead or lost member is being replaced (`Runtime::announce_replacement`).
    pub fn member_replacing(note: &str) -> Self {
        Self::warning(super::MEMBER_REPLACING_REASON, "ReplaceMember", note)
    }

    /// A member was removed; `action` names how (`DeletePod`, `StopProcess`), `kept` says what
    /// became of its data (empty, or `, kept ...`).
    pub fn member_removed(name: &str, action: &str, kept: &str) -> Self {
        Self {
            type_: EventType::Normal,
            reason: "MemberRemoved".to_owned(),
            action: action.to_owned(),
            note: format!("Removed member {name}{kept}"),
        }
    }

    /// The cluster was rebuilt from `survivor` with `--force-new-cluster`; `others` says what
    /// became of the other members' data.
    pub fn quorum_recovered(survivor: &str, others: &str) -> Self {
        Self::warning(
            "QuorumRecovered",
            "ForceNewCluster",
            &format!("Rebuilt the cluster from member {survivor} with --force-new-cluster; {others}"),
        )
    }

    /// A plane's CA rotation moved from `from` to `to` (`plane`: `client` or `peer`).
    pub fn authority_moved(
        plane: &str,
        from: crate::tls::authority::AuthorityPhase,
        to: crate::tls::authority::AuthorityPhase,
    ) -> Self {
        use crate::tls::authority::AuthorityPhase;
        let note = match to {
            AuthorityPhase::Trusting => "a new CA is trusted beside the old one, which still issues",
            AuthorityPhase::Reissuing => {
                "the new CA issues; the old one stays trusted until every member holds new certificates"
            }
            AuthorityPhase::Steady => "the old CA is trusted no more",
        };
        Self::normal(
            "CertificateAuthorityRotating",
            "RotateCertificateAuthority",
            format!("The {plane} plane's CA rotation moved from {from} to {to}: {note}"),
        )
    }

    /// A member was restarted on new certificates: `how` says how (`Deleted Pod x to restart it
    /// on ...`, `Restarted member process x`), `reason` why.
    pub fn member_certificates_renewed(action: &str, how: &str, reason: &str) -> Self {
        Self::normal(
            "MemberCertificatesRenewed",
            action,
            format!("{how} with new certificates ({reason})"),
        )
    }

    /// Progress worth seeing.
    pub fn normal(reason: &str, action: &str, note: String) -> Self {
        Self {
            type_: EventType::Normal,
            reason: reason.to_owned(),
            action: action.to_owned(),
            note,
        }
    }
}

/// How long a repeat folds into the Event it repeats (client-go's aggregation window).
pub const FOLD_WINDOW: Duration = Duration::from_secs(600);

/// What makes two Events the same for folding: the object, type, reason and message (client-go's
/// `getEventKey`, less the source, which is always this operator).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FoldKey {
    namespace: String,
    name: String,
    uid: String,
    type_: EventType,
    reason: String,
    message: String,
}

impl FoldKey {
    /// The key of `report` about `cluster`.
    pub fn of(cluster: &ClusterRef, report: &Report) -> Self {
        Self {
            namespace: cluster.namespace.clone(),
            name: cluster.name.clone(),
            uid: cluster.uid.clone(),
            type_: report.type_,
            reason: report.reason.clone(),
            message: report.note.clone(),
        }
    }
}

/// An Event already written, to fold repeats into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folded {
    /// Its name.
    pub name: String,
    /// Its count so far.
    pub count: i32,
    /// When it was last written.
    pub at: Instant,
}

/// The folding decisions, apart from the API calls. Pure.
#[derive(Debug, Default)]
pub struct Correlator {
    seen: HashMap<FoldKey, Folded>,
}

/// What to write for a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fold {
    /// A new Event.
    Create,
    /// Raise this Event's count to `count`.
    Bump {
        /// The Event's name.
        name: String,
        /// The new count.
        count: i32,
    },
}

impl Correlator {
    /// Most keys remembered; past it the oldest are forgotten (client-go keeps an LRU of 4096).
    const CAPACITY: usize = 4096;

    /// Whether `key` at `now` folds into an Event written within the window.
    pub fn decide(&self, key: &FoldKey, now: Instant) -> Fold {
        match self.seen.get(key) {
            Some(f) if now.duration_since(f.at) < FOLD_WINDOW => Fold::Bump {
                name: f.name.clone(),
                count: f.count.saturating_add(1),
            },
            _ => Fold::Create,
        }
    }

    /// Records that `key`'s Event `name` now has `count`.
    pub fn written(&mut self, key: FoldKey, name: String, count: i32, now: Instant) {
        if self.seen.len() >= Self::CAPACITY && !self.seen.contains_key(&key) {
            self.seen.retain(|_, f| now.duration_since(f.at) < FOLD_WINDOW);
            if self.seen.len() >= Self::CAPACITY
                && let Some(oldest) = self.seen.iter().min_by_key(|(_, f)| f.at).map(|(k, _)| k.clone())
            {
                self.seen.remove(&oldest);
            }
        }
        self.seen.insert(key, Folded { name, count, at: now });
    }

    /// Forgets `key` (its Event is gone).
    pub fn forget(&mut self, key: &FoldKey) {
        self.seen.remove(key);
    }
}

/// The name of a new Event about `cluster`: `<name>.<hex nanoseconds>`, as client-go makes it.
pub fn event_name(cluster: &ClusterRef, now: jiff::Timestamp) -> String {
    format!("{}.{:x}", cluster.name, now.as_nanosecond())
}

/// A new core Event carrying `report` about `cluster`.
pub fn new_event(cluster: &ClusterRef, report: &Report, name: String, now: jiff::Timestamp) -> Event {
    let at = Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now));
    Event {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(cluster.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: cluster_object_reference(cluster),
        type_: Some(report.type_.as_str().to_owned()),
        reason: Some(report.reason.clone()),
        action: Some(report.action.clone()),
        message: Some(report.note.clone()),
        count: Some(1),
        first_timestamp: Some(at.clone()),
        last_timestamp: Some(at),
        source: Some(EventSource {
            component: Some(FIELD_MANAGER.to_owned()),
            host: None,
        }),
        reporting_component: Some(FIELD_MANAGER.to_owned()),
        reporting_instance: Some(FIELD_MANAGER.to_owned()),
        ..Event::default()
    }
}

/// Writing an Event failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordEventError {
    /// Creating a new Event failed.
    #[error("create Event {name}")]
    Create {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Raising the count of a folded Event failed.
    #[error("update the count of Event {name}")]
    Bump {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// The local runtime's Events: core `v1` Events written through the local API server.
pub struct LocalEvents {
    client: kube::Client,
    correlator: Mutex<Correlator>,
}

impl std::fmt::Debug for LocalEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEvents").finish_non_exhaustive()
    }
}

impl LocalEvents {
    /// Events written with `client` (the loopback client of local mode).
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            correlator: Mutex::default(),
        }
    }

    fn correlator(&self) -> std::sync::MutexGuard<'_, Correlator> {
        self.correlator
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `report` about `cluster`: a new Event, or a repeat folded into the last one.
    pub async fn record(&self, cluster: &ClusterRef, report: &Report) -> Result<(), RecordEventError> {
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), &cluster.namespace);
        let key = FoldKey::of(cluster, report);
        let decision = self.correlator().decide(&key, Instant::now());
        let now = jiff::Timestamp::now();
        if let Fold::Bump { name, count } = decision {
            let at = Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now));
            let patch = serde_json::json!({"count": count, "lastTimestamp": at});
            match api
                .patch(&name, &crate::resources::patch_params(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.correlator().written(key, name, count, Instant::now());
                    return Ok(());
                }
                // Expired (or deleted): start a new one.
                Err(kube::Error::Api(e)) if e.code == 404 => self.correlator().forget(&key),
                Err(source) => return Err(RecordEventError::Bump { name, source }),
            }
        }
        let name = event_name(cluster, now);
        let event = new_event(cluster, report, name.clone(), now);
        api.create(&crate::resources::post_params(), &event)
            .await
            .map_err(|source| RecordEventError::Create {
                name: name.clone(),
                source,
            })?;
        self.correlator().written(key, name, 1, Instant::now());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterRef {
        ClusterRef {
            namespace: "ns".into(),
            name: "a".into(),
            uid: "u-1".into(),
        }
    }

    #[test]
    fn a_repeat_within_the_window_folds_into_the_first_event() {
        let mut c = Correlator::default();
        let report = Report::member_replacing("member a-1 is dead");
        let key = FoldKey::of(&cluster(), &report);
        let t0 = Instant::now();
        assert_eq!(c.decide(&key, t0), Fold::Create);
        c.written(key.clone(), "a.1".into(), 1, t0);
        assert_eq!(
            c.decide(&key, t0 + Duration::from_secs(5)),
            Fold::Bump {
                name: "a.1".into(),
                count: 2
            }
        );
        c.written(key.clone(), "a.1".into(), 2, t0 + Duration::from_secs(5));
        // The window runs from the last write.
        assert_eq!(
            c.decide(&key, t0 + FOLD_WINDOW + Duration::from_secs(1)),
            Fold::Bump {
                name: "a.1".into(),
                count: 3
            }
        );
        assert_eq!(
            c.decide(&key, t0 + Duration::from_secs(5) + FOLD_WINDOW),
            Fold::Create
        );
        c.forget(&key);
        assert_eq!(c.decide(&key, t0), Fold::Create);
    }

    #[test]
    fn another_message_reason_type_or_object_is_another_event() {
        let base = Report::warning("RolloutHalted", "RollTemplate", "halted");
        let key = FoldKey::of(&cluster(), &base);
        let mut other_message = base.clone();
        other_message.note = "halted again".into();
        let mut other_reason = base.clone();
        other_reason.reason = "Other".into();
        let mut other_type = base.clone();
        other_type.type_ = EventType::Normal;
        let mut other_cluster = cluster();
        other_cluster.uid = "u-2".into();
        for other in [
            FoldKey::of(&cluster(), &other_message),
            FoldKey::of(&cluster(), &other_reason),
            FoldKey::of(&cluster(), &other_type),
            FoldKey::of(&other_cluster, &base),
        ] {
            assert_ne!(key, other);
        }
        // The action is not part of the key (client-go's key has none).
        let mut other_action = base.clone();
        other_action.action = "Elsewhere".into();
        assert_eq!(key, FoldKey::of(&cluster(), &other_action));
    }

    #[test]
    fn shared_reports_carry_the_reasons_both_runtimes_use() {
        let r = Report::quorum_recovered("a-1", "the rest was kept");
        assert_eq!(
            (r.type_, r.reason.as_str()),
            (EventType::Warning, "QuorumRecovered")
        );
        assert_eq!(
            r.note,
            "Rebuilt the cluster from member a-1 with --force-new-cluster; the rest was kept"
        );
        let r = Report::member_replacing("gone");
        assert_eq!(
            (r.type_, r.reason.as_str()),
            (EventType::Warning, "MemberReplacing")
        );
        let r = Report::member_removed("a-2", "DeletePod", ", kept its volume claim c");
        assert_eq!(r.note, "Removed member a-2, kept its volume claim c");
    }

    #[test]
    fn new_events_name_the_cluster_and_carry_the_report() {
        let now: jiff::Timestamp = "2026-01-01T00:00:00.5Z".parse().unwrap();
        let name = event_name(&cluster(), now);
        assert!(name.starts_with("a."), "{name}");
        let e = new_event(
            &cluster(),
            &Report::member_removed("a-2", "StopProcess", ""),
            name,
            now,
        );
        assert_eq!(e.involved_object.kind.as_deref(), Some("EtcdCluster"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u-1"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.reason.as_deref(), Some("MemberRemoved"));
        assert_eq!(e.message.as_deref(), Some("Removed member a-2"));
        assert_eq!(e.count, Some(1));
        assert_eq!(
            e.last_timestamp.map(|t| t.0.to_string()),
            Some("2026-01-01T00:00:00Z".to_owned())
        );
    }
}
