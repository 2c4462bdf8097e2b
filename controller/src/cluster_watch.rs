//! The EtcdCluster watch the controllers run on: a reflector whose store keeps a projection of
//! each object, not the whole object.
//!
//! `metadata.managedFields` (server-side apply's bookkeeping, a tree of field paths per
//! manager) is most of an EtcdCluster's memory once decoded, and no controller reads it; with
//! it, the member controller's and the backup controller's stores held about 20 KiB per
//! cluster (docs/performance.md). Nothing writes an EtcdCluster back from a store (status is
//! patched, finalizers through JSON patches), so the projection never reaches the API.
//!
//! The member controller and the scheduled-backup controller run on one [`shared`] watch and
//! store, not one each: every EtcdCluster is held once. Each is woken only by the changes it
//! acts on ([`looked_at`], [`backup_looked_at`]).
//!
//! What the controllers read of a stored EtcdCluster (checked by the tests below, which resolve
//! a full and a projected object into the same [`ValidatedCluster`](crate::validated)): the
//! whole spec; the whole status (the status write compares it with the new one to skip writes
//! that change nothing, and keeps transition times, the backup and recovery records from it);
//! name, namespace, uid, generation, resourceVersion, creationTimestamp, deletionTimestamp and
//! finalizers; and the request annotations, all named `etcd.operator.dev/...`. Labels, owner
//! references, other annotations (`kubectl.kubernetes.io/last-applied-configuration` is a copy
//! of the whole object) and the conversion annotations (which only the API server reads) are
//! not kept.

use etcd_operator_api::v1alpha2::EtcdCluster;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::{WatchStreamExt, reflector, watcher};

/// How long one watch request to this project's API lasts before the watcher renews it
/// (kube-runtime's default: 290 s). kube-client reads a watch through a line buffer that keeps
/// the size of the largest event the request carried for as long as the request lasts: an object
/// near the 1.5 MiB request limit would hold megabytes that long. A renewal resumes from the last
/// event or bookmark seen (no list), as one in-process request for the co-located controller.
pub const WATCH_RENEWAL_SECS: u32 = 60;

/// The watcher configuration of the controllers' watches of this project's API.
pub fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_RENEWAL_SECS)
}

/// A `Controller` over every EtcdCluster `api` reaches, as `Controller::new` builds it, with
/// the store's objects projected by [`project`], on the changes [`looked_at`] sees.
pub fn controller(api: Api<EtcdCluster>) -> Controller<EtcdCluster> {
    let (reader, writer) = reflector::store();
    let clusters = reflector::reflector(writer, watcher(api, watch_config()).modify(project))
        .applied_objects()
        .predicate_filter(
            |c: &EtcdCluster| Some(looked_at(c)),
            kube::runtime::utils::PredicateConfig::default(),
        );
    Controller::for_stream(clusters, reader)
}

/// A digest of what makes the member controller look at an EtcdCluster again: its uid, its
/// generation (the server raises it on every spec change), its deletion, its finalizers and the
/// annotations it reads (the projection keeps only those). Not `resourceVersion` and not
/// `status`: an annotation no controller reads, a label, or a status write (the controller's
/// own, or the backup controller's `lastBackup`) changes nothing to do, and each would have
/// cost a reconcile (observe every member, plan, compute a status) for nothing. The
/// controller's own requeues and resyncs are not events and are not filtered.
pub fn looked_at(cluster: &EtcdCluster) -> u64 {
    use std::hash::{Hash, Hasher};
    let meta = &cluster.metadata;
    let mut h = identity_and_spec(cluster);
    meta.finalizers.hash(&mut h);
    if let Some(annotations) = &meta.annotations {
        for (key, value) in annotations.iter().filter(|(key, _)| read_annotation(key)) {
            key.hash(&mut h);
            value.hash(&mut h);
        }
    }
    h.finish()
}

/// A digest of what makes the scheduled-backup controller look at an EtcdCluster again: its
/// uid, generation (the schedule, the destination, `paused`), its deletion and
/// `status.lastBackup` (which its reconcile counts the next snapshot from). The member
/// controller's status writes and finalizers change none of these, so they wake it no more:
/// before, it validated the whole cluster on each of them (three events per new cluster) for
/// nothing. A backup that failed retries on its own back-off, not on events.
pub fn backup_looked_at(cluster: &EtcdCluster) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = identity_and_spec(cluster);
    if let Some(last) = cluster.status.as_ref().and_then(|s| s.last_backup.as_ref()) {
        last.time.as_ref().map(|t| t.0.as_nanosecond()).hash(&mut h);
        last.revision.hash(&mut h);
        last.location.hash(&mut h);
    }
    h.finish()
}

/// A hasher fed with what both controllers' digests start from: the object's uid, its generation
/// (the server raises it on every spec change) and its deletion.
fn identity_and_spec(cluster: &EtcdCluster) -> std::collections::hash_map::DefaultHasher {
    use std::hash::Hash;
    let meta = &cluster.metadata;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    meta.uid.hash(&mut h);
    meta.generation.hash(&mut h);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .hash(&mut h);
    h
}

/// The key an object's digest is kept under: a hash of its namespace and name (8 bytes, where
/// the two strings took an allocation each per object of a fleet).
fn object_key(cluster: &EtcdCluster) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    cluster.metadata.namespace.hash(&mut h);
    cluster.metadata.name.hash(&mut h);
    h.finish()
}

/// Hand-written because kube-runtime's `predicate_filter` takes the owned events of a watch, not
/// the shared store's: lets through the EtcdClusters whose `digest` changed since the last one
/// of the same object, as kube-runtime's `predicate_filter` does. The digests of objects gone
/// from `store` are dropped whenever the map has grown to twice the store.
fn changed_only<S>(
    events: S,
    store: reflector::Store<EtcdCluster>,
    digest: fn(&EtcdCluster) -> u64,
) -> impl futures::Stream<Item = S::Item> + Send
where
    S: futures::Stream<Item = std::sync::Arc<EtcdCluster>> + Send,
{
    use futures::StreamExt as _;
    let mut seen: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    events.filter(move |cluster| {
        let now = digest(cluster);
        let changed = seen.insert(object_key(cluster), now) != Some(now);
        if seen.len() > 64 && seen.len() > 2 * store.len() {
            let live: std::collections::HashSet<u64> = store.state().iter().map(|c| object_key(c)).collect();
            seen.retain(|key, _| live.contains(key));
            crate::sparse::shrink_when_sparse(&mut seen);
        }
        std::future::ready(changed)
    })
}

/// How many events the shared watch holds for a controller that has not taken them yet (past
/// that, the watch waits for it).
const SHARED_BUFFER: usize = 1024;

/// Controllers that share one watch and one store of the EtcdClusters.
pub struct SharedClusters {
    /// A controller for the member reconciler.
    pub members: Controller<EtcdCluster>,
    /// A controller for the scheduled backups.
    pub backups: Controller<EtcdCluster>,
    /// The watch itself: the controllers see nothing unless this runs (until they stop).
    pub watch: std::pin::Pin<Box<dyn futures::Future<Output = ()> + Send>>,
}

impl std::fmt::Debug for SharedClusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedClusters").finish_non_exhaustive()
    }
}

/// One watch of every EtcdCluster `api` reaches, with its store projected by [`project`], and
/// the two controllers that run on it. Both subscribe before the watch starts, so neither misses
/// an object.
pub fn shared(api: Api<EtcdCluster>) -> SharedClusters {
    use futures::StreamExt as _;
    let (reader, writer) = reflector::store_shared(SHARED_BUFFER);
    // The member controller sees the changes [`looked_at`] digests; the scheduled backups those
    // [`backup_looked_at`] digests.
    let members = writer.subscribe().map(|events| {
        Controller::for_shared_stream(changed_only(events, reader.clone(), looked_at), reader.clone())
    });
    let backups = writer.subscribe().map(|events| {
        Controller::for_shared_stream(
            changed_only(events, reader.clone(), backup_looked_at),
            reader.clone(),
        )
    });
    // A writer made by `store_shared` always has subscribers to give; were it not so, each
    // controller would watch on its own (as before the watch was shared).
    let (Some(members), Some(backups)) = (members, backups) else {
        return SharedClusters {
            members: controller(api.clone()),
            backups: controller(api),
            watch: Box::pin(std::future::ready(())),
        };
    };
    let watch = watcher(api, watch_config())
        .modify(project)
        .reflect_shared(writer)
        .for_each(|_| std::future::ready(()));
    SharedClusters {
        members,
        backups,
        watch: Box::pin(watch),
    }
}

/// The prefix of every annotation the controllers read (requests such as
/// `etcd.operator.dev/defragment`, and `etcd.operator.dev/keep-data-on-delete`).
const READ_ANNOTATION_PREFIX: &str = "etcd.operator.dev/";

/// Annotations under [`READ_ANNOTATION_PREFIX`] that only the API server reads: what one API
/// version cannot express, kept for lossless conversion.
const CONVERSION_ANNOTATIONS: [&str; 2] = [
    etcd_operator_api::convert::V1ALPHA1_FIELDS_ANNOTATION,
    etcd_operator_api::convert::V1ALPHA2_FIELDS_ANNOTATION,
];

/// Whether the controllers read the annotation `key` of an EtcdCluster.
fn read_annotation(key: &str) -> bool {
    key.starts_with(READ_ANNOTATION_PREFIX) && !CONVERSION_ANNOTATIONS.contains(&key)
}

/// What the stores keep of an EtcdCluster: what the controllers read (see the module's
/// documentation), not `managedFields`, labels, owner references or annotations they do not read.
///
/// The lists kept are cut to their length: serde_json decodes a list from text without knowing
/// its length, so a `Vec` grows by doubling and six conditions hold room for eight (1,024 bytes
/// for 768), one finalizer room for four. That is how the watcher's initial list decodes its
/// items (a watch event's object is buffered first and comes with exact lengths).
pub fn project(cluster: &mut EtcdCluster) {
    let meta = &mut cluster.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|key, _| read_annotation(key));
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    if let Some(finalizers) = meta.finalizers.as_mut() {
        finalizers.shrink_to_fit();
    }
    if let Some(status) = cluster.status.as_mut() {
        if let Some(conditions) = status.conditions.as_mut() {
            conditions.shrink_to_fit();
        }
        if let Some(members) = status.members.as_mut() {
            members.shrink_to_fit();
        }
        if let Some(endpoints) = status.client_endpoints.as_mut() {
            endpoints.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validated::ValidatedCluster;
    use etcd_operator_api::v1alpha2 as api;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    /// Every annotation the controllers read, each set to a value they act on.
    fn request_annotations() -> serde_json::Value {
        json!({
            api::ROTATE_CERTIFICATES_ANNOTATION: "r1",
            api::ROTATE_CA_ANNOTATION: "c1",
            api::RECOVER_QUORUM_ANNOTATION: "q1",
            api::REPLACE_MEMBER_ANNOTATION: "a-xyz12",
            api::DEFRAGMENT_ANNOTATION: "2026-01-02T03:04:05Z",
            api::MOVE_LEADER_ANNOTATION: "a-abcde",
            crate::validated::KEEP_DATA_ANNOTATION: "true",
        })
    }

    /// A stored EtcdCluster with every part the API can hold: metadata the controllers read and
    /// metadata they do not, a full spec, and a status as the controllers write it.
    fn full() -> EtcdCluster {
        let mut annotations = request_annotations();
        annotations["kubectl.kubernetes.io/last-applied-configuration"] = json!("{\"big\": true}");
        annotations["example.com/note"] = json!("x");
        annotations["bench.etcd.operator.dev/seq"] = json!("7");
        annotations[etcd_operator_api::convert::V1ALPHA1_FIELDS_ANNOTATION] = json!("{\"size\":3}");
        let mut cluster: EtcdCluster = serde_json::from_value(json!({
            "apiVersion": "etcd.operator.dev/v1alpha2",
            "kind": "EtcdCluster",
            "metadata": {
                "name": "a", "namespace": "ns", "uid": "u-1", "generation": 4,
                "resourceVersion": "42", "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-03T00:00:00Z",
                "finalizers": ["etcd.operator.dev/cleanup", "example.com/hold"],
                "labels": {"team": "storage", "app.kubernetes.io/name": "etcd"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "o-1"}],
            },
            "spec": {
                "replicas": 5, "version": "3.5.16", "paused": false,
                "podTemplate": {"metadata": {"labels": {"l": "v"}, "annotations": {"a": "b"}},
                                "spec": {"priorityClassName": "high"}},
                "storage": {"size": "2Gi", "medium": "Disk"},
                "backup": {"schedule": "0 * * * *", "retention": {"maxCount": 3},
                           "destination": {"s3": {"bucket": "b", "prefix": "p"}}},
                "maintenance": {"defragmentation": {"schedule": "0 3 * * *"}},
            },
            "status": {
                "phase": "Running", "observedGeneration": 3, "replicas": 5, "readyReplicas": 4,
                "clusterID": "abc", "leader": "a-abcde", "currentVersion": "3.5.16",
                "conditions": [{"type": "Available", "status": "True", "reason": "Quorum",
                                "message": "m", "observedGeneration": 3,
                                "lastTransitionTime": "2026-01-02T00:00:00Z"}],
                "members": [{"name": "a-abcde", "id": "1", "version": "3.5.16"}],
                "recovery": {"request": "q0", "survivor": "a-abcde", "lostMembers": ["a-xyz12"]},
                "lastBackup": {"revision": 9},
            },
        }))
        .unwrap_or_else(|e| panic!("the test object decodes: {e}"));
        cluster.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            fields_v1: Some(FieldsV1(json!({"f:spec": {"f:replicas": {}}}))),
            ..ManagedFieldsEntry::default()
        }]);
        cluster
    }

    #[test]
    fn the_projection_keeps_everything_the_controllers_read() {
        let full = full();
        let mut projected = full.clone();
        project(&mut projected);
        // What the reconciler and the backup controller resolve from it.
        let (a, b) = match (ValidatedCluster::new(&full), ValidatedCluster::new(&projected)) {
            (Ok(a), Ok(b)) => (a, b),
            other => panic!("both resolve: {other:?}"),
        };
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        // The test object sets what it means to: every request is seen.
        assert!(a.ignored.is_empty(), "{:?}", a.ignored);
        assert_eq!(a.certificate_rotation.as_deref(), Some("r1"));
        assert_eq!(a.ca_rotation.as_deref(), Some("c1"));
        assert_eq!(a.recover_quorum.as_deref(), Some("q1"));
        assert_eq!(a.replace_member.as_deref(), Some("a-xyz12"));
        assert!(a.defragment_request.is_some());
        assert!(a.move_leader.is_some());
        assert!(a.keep_data_on_delete);
        // The finalizer helper, the status write and the backup controller read these whole.
        assert_eq!(projected.spec, full.spec);
        assert_eq!(projected.status, full.status);
        let (p, f) = (&projected.metadata, &full.metadata);
        assert_eq!(
            (&p.name, &p.namespace, &p.uid, &p.generation, &p.resource_version),
            (&f.name, &f.namespace, &f.uid, &f.generation, &f.resource_version)
        );
        assert_eq!(
            (&p.creation_timestamp, &p.deletion_timestamp, &p.finalizers),
            (&f.creation_timestamp, &f.deletion_timestamp, &f.finalizers)
        );
    }

    /// Decoded from JSON, the lists have room to spare; projected, none.
    #[test]
    fn the_projection_cuts_the_lists_it_keeps_to_their_length() {
        // From text, as the watcher's initial list decodes (a `Value` knows its lists' lengths).
        let text = json!({
            "metadata": {"name": "a", "finalizers": ["etcd.operator.dev/cleanup"]},
            "spec": {},
            "status": {
                "conditions": (0..6).map(|i| json!({"type": format!("T{i}"), "status": "True",
                    "reason": "R", "message": "m", "lastTransitionTime": "2026-01-02T00:00:00Z"}))
                    .collect::<Vec<_>>(),
                "members": [{"name": "a-1"}, {"name": "a-2"}, {"name": "a-3"}],
                "clientEndpoints": ["http://a-1:2379", "http://a-2:2379", "http://a-3:2379"],
            },
        })
        .to_string();
        let mut cluster: EtcdCluster = serde_json::from_str(&text).unwrap_or_else(|e| panic!("decodes: {e}"));
        let room = |c: &EtcdCluster| {
            let status = c.status.as_ref().unwrap();
            [
                c.metadata.finalizers.as_ref().map(|v| v.capacity() - v.len()),
                status.conditions.as_ref().map(|v| v.capacity() - v.len()),
                status.members.as_ref().map(|v| v.capacity() - v.len()),
                status.client_endpoints.as_ref().map(|v| v.capacity() - v.len()),
            ]
        };
        assert!(
            room(&cluster).iter().any(|r| r.is_some_and(|r| r > 0)),
            "decoded lists have room to spare (else this test checks nothing): {:?}",
            room(&cluster)
        );
        project(&mut cluster);
        assert_eq!(room(&cluster), [Some(0); 4]);
        assert_eq!(
            cluster
                .status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .len(),
            6
        );
    }

    #[test]
    fn the_projection_drops_what_no_controller_reads() {
        let mut projected = full();
        project(&mut projected);
        let meta = &projected.metadata;
        assert_eq!(meta.managed_fields, None);
        assert_eq!(meta.labels, None);
        assert_eq!(meta.owner_references, None);
        let kept: Vec<&str> = meta
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        let mut expected: Vec<String> = request_annotations()
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        expected.sort();
        assert_eq!(kept, expected);
        // Without any annotation it reads, an object keeps none.
        let mut plain = full();
        plain.metadata.annotations = Some([("example.com/note".to_owned(), "x".to_owned())].into());
        project(&mut plain);
        assert_eq!(plain.metadata.annotations, None);
    }

    /// One change to an object, named in the test's table.
    type Change<T> = Box<dyn Fn(&mut T)>;

    #[test]
    fn the_digest_changes_with_what_the_member_controller_acts_on_and_nothing_else() {
        let base = full();
        let digest = looked_at(&base);
        // What it acts on.
        let changes: Vec<(&str, Change<EtcdCluster>)> = vec![
            ("uid", Box::new(|c| c.metadata.uid = Some("u-2".into()))),
            ("generation", Box::new(|c| c.metadata.generation = Some(5))),
            ("deletion", Box::new(|c| c.metadata.deletion_timestamp = None)),
            ("finalizers", Box::new(|c| c.metadata.finalizers = None)),
            (
                "a request annotation",
                Box::new(|c| {
                    c.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(api::DEFRAGMENT_ANNOTATION.into(), "2026-02-02T00:00:00Z".into());
                }),
            ),
        ];
        for (what, change) in changes {
            let mut other = base.clone();
            change(&mut other);
            assert_ne!(looked_at(&other), digest, "{what}");
        }
        // What it does not.
        let same: Vec<(&str, Change<EtcdCluster>)> = vec![
            (
                "resourceVersion",
                Box::new(|c| c.metadata.resource_version = Some("43".into())),
            ),
            ("status", Box::new(|c| c.status = None)),
            ("labels", Box::new(|c| c.metadata.labels = None)),
            ("managedFields", Box::new(|c| c.metadata.managed_fields = None)),
            (
                "another annotation",
                Box::new(|c| {
                    c.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert("bench.etcd.operator.dev/seq".into(), "8".into());
                }),
            ),
            ("the projection", Box::new(project)),
        ];
        for (what, change) in same {
            let mut other = base.clone();
            change(&mut other);
            assert_eq!(looked_at(&other), digest, "{what}");
        }
    }

    #[test]
    fn the_backup_digest_changes_with_what_the_backup_controller_acts_on_and_nothing_else() {
        let base = full();
        let digest = backup_looked_at(&base);
        let changes: Vec<(&str, Change<EtcdCluster>)> = vec![
            ("uid", Box::new(|c| c.metadata.uid = Some("u-2".into()))),
            ("generation", Box::new(|c| c.metadata.generation = Some(5))),
            ("deletion", Box::new(|c| c.metadata.deletion_timestamp = None)),
            (
                "the last backup",
                Box::new(|c| {
                    if let Some(last) = c.status.as_mut().and_then(|s| s.last_backup.as_mut()) {
                        last.revision = Some(10);
                    }
                }),
            ),
            (
                "no last backup",
                Box::new(|c| {
                    if let Some(status) = c.status.as_mut() {
                        status.last_backup = None;
                    }
                }),
            ),
        ];
        for (what, change) in changes {
            let mut other = base.clone();
            change(&mut other);
            assert_ne!(backup_looked_at(&other), digest, "{what}");
        }
        // The member controller's status writes and finalizers, and what it alone reads.
        let same: Vec<(&str, Change<EtcdCluster>)> = vec![
            (
                "resourceVersion",
                Box::new(|c| c.metadata.resource_version = Some("43".into())),
            ),
            (
                "conditions and members",
                Box::new(|c| {
                    if let Some(status) = c.status.as_mut() {
                        status.conditions = None;
                        status.members = None;
                        status.ready_replicas = Some(5);
                    }
                }),
            ),
            ("finalizers", Box::new(|c| c.metadata.finalizers = None)),
            ("request annotations", Box::new(|c| c.metadata.annotations = None)),
            ("the projection", Box::new(project)),
        ];
        for (what, change) in same {
            let mut other = base.clone();
            change(&mut other);
            assert_eq!(backup_looked_at(&other), digest, "{what}");
        }
    }

    /// `name` in namespace `ns` at `generation`, with `annotation` (a value of the defragment
    /// request annotation, if any), status saying `phase`.
    fn object(name: &str, generation: i64, request: Option<&str>, phase: &str) -> EtcdCluster {
        let mut c: EtcdCluster = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                         "generation": generation, "resourceVersion": format!("{generation}{phase}")},
            "spec": {"replicas": 1},
            "status": {"phase": phase},
        }))
        .unwrap_or_else(|e| panic!("decodes: {e}"));
        if let Some(value) = request {
            c.metadata.annotations = Some([(api::DEFRAGMENT_ANNOTATION.to_owned(), value.to_owned())].into());
        }
        c
    }

    #[tokio::test]
    async fn only_changes_the_member_controller_acts_on_wake_it_and_gone_objects_are_forgotten() {
        use futures::StreamExt as _;
        use std::sync::Arc;
        let (store, mut writer) = reflector::store::<EtcdCluster>();
        let events = vec![
            object("a", 1, None, "Creating"),
            object("a", 1, None, "Running"), // its own status write: nothing to do
            object("b", 1, None, "Creating"),
            object("a", 2, None, "Running"), // a spec change
            object("a", 2, Some("2026-01-01T00:00:00Z"), "Running"), // a request
            object("a", 2, Some("2026-01-01T00:00:00Z"), "Running"), // nothing new
            object("b", 1, None, "Running"),
        ];
        for e in &events {
            writer.apply_watcher_event(&watcher::Event::Apply(e.clone()));
        }
        let passed: Vec<(String, Option<i64>)> = changed_only(
            futures::stream::iter(events.into_iter().map(Arc::new)),
            store.clone(),
            looked_at,
        )
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), c.metadata.generation))
        .collect()
        .await;
        assert_eq!(
            passed,
            [
                ("a".to_owned(), Some(1)),
                ("b".to_owned(), Some(1)),
                ("a".to_owned(), Some(2)),
                ("a".to_owned(), Some(2)),
            ]
        );

        // A fleet comes and goes: what is gone is forgotten, so an object seen again with a
        // digest it had before (here: the same uid, for the test) is looked at.
        let (tx, rx) = futures::channel::mpsc::unbounded::<Arc<EtcdCluster>>();
        let mut filtered = Box::pin(changed_only(rx, store.clone(), looked_at));
        let mut next_name = async |tx: &futures::channel::mpsc::UnboundedSender<Arc<EtcdCluster>>,
                                   c: &EtcdCluster| {
            tx.unbounded_send(Arc::new(c.clone()))
                .unwrap_or_else(|e| panic!("{e}"));
            tokio::time::timeout(std::time::Duration::from_secs(5), filtered.next())
                .await
                .ok()
                .flatten()
                .and_then(|c| c.metadata.name.clone())
        };
        let fleet: Vec<EtcdCluster> = (0..200)
            .map(|i| object(&format!("c{i}"), 1, None, "Creating"))
            .collect();
        for c in &fleet {
            writer.apply_watcher_event(&watcher::Event::Apply(c.clone()));
            assert_eq!(next_name(&tx, c).await, c.metadata.name);
        }
        for c in &fleet[1..] {
            writer.apply_watcher_event(&watcher::Event::Delete(c.clone()));
        }
        // c0's status changes (dropped), then c0's spec (passes): the first event cleaned up.
        let _ = tx.unbounded_send(Arc::new(object("c0", 1, None, "Running")));
        assert_eq!(
            next_name(&tx, &object("c0", 2, None, "Running")).await.as_deref(),
            Some("c0")
        );
        let c5 = &fleet[5];
        writer.apply_watcher_event(&watcher::Event::Apply(c5.clone()));
        assert_eq!(next_name(&tx, c5).await.as_deref(), Some("c5"));
    }

    /// The shared watch asks for [`WATCH_RENEWAL_SECS`] and, when a request ends, renews it from
    /// the last bookmark it saw: no second list.
    #[tokio::test]
    async fn the_shared_watch_renews_its_request_from_where_it_was() {
        use http::{Request, Response};
        use kube::client::Body;
        use std::pin::pin;
        use tower_test::mock;

        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let shared = shared(Api::all(kube::Client::new(service, "default")));
        let watch = tokio::spawn(shared.watch);
        let mut handle = pin!(handle);
        let mut next = async || {
            let (request, send) =
                tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request())
                    .await
                    .expect("the watcher sends its next request")
                    .expect("a request");
            assert_eq!(
                request.uri().path(),
                "/apis/etcd.operator.dev/v1alpha2/etcdclusters"
            );
            let query: std::collections::BTreeMap<String, String> =
                url::form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
                    .into_owned()
                    .collect();
            (query, send)
        };
        let reply = |send: mock::SendResponse<Response<Body>>, body: String| {
            send.send_response(Response::new(Body::from(body.into_bytes())));
        };

        let (list, send) = next().await;
        assert_eq!(list.get("watch"), None, "{list:?}");
        reply(
            send,
            json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdClusterList",
                "metadata": {"resourceVersion": "7"}, "items": []})
            .to_string(),
        );
        // A watch for WATCH_RENEWAL_SECS from `rv`.
        let is_watch_from = |query: &std::collections::BTreeMap<String, String>, rv: &str| {
            let get = |k: &str| query.get(k).map(String::as_str);
            assert_eq!(
                (get("watch"), get("timeoutSeconds"), get("resourceVersion")),
                (Some("true"), Some("60"), Some(rv)),
                "{query:?}"
            );
        };
        let (first, send) = next().await;
        is_watch_from(&first, "7");
        // The request's time is up after a bookmark: its body ends.
        let bookmark = json!({"type": "BOOKMARK", "object": {"apiVersion": "etcd.operator.dev/v1alpha2",
            "kind": "EtcdCluster", "metadata": {"resourceVersion": "9"}}});
        reply(send, format!("{bookmark}\n"));
        let (renewed, _send) = next().await;
        is_watch_from(&renewed, "9");
        watch.abort();
    }
}
