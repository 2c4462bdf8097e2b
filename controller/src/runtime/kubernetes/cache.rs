//! The member Pods, PVCs and certificate Secrets as the controller's own watches see them: reflector stores fed by
//! the same streams that trigger reconciles (so a store has applied an event before the
//! reconcile it triggers runs). A settled cluster is observed from them with no API request;
//! a cluster this process wrote to a moment ago is read from the API instead, so a step always
//! sees its own effect (a store may lag behind a write by the time its event travels).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodSpec, Secret};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, reflector::Lookup};
use kube::{Api, Client, Resource, ResourceExt};

use crate::model::ClusterRef;

/// How long after this process wrote to a cluster's Pods or PVCs its reads go to the API: far
/// longer than a watch event takes, short enough that a settled cluster soon reads the stores.
pub const OWN_WRITES_WINDOW: Duration = Duration::from_secs(10);

/// One kind of child: a store per watched namespace (one for all namespaces when the operator
/// watches them all) and whether each one's first list is complete.
#[derive(Clone)]
struct Reflected<K: Lookup<DynamicType = ()> + Clone + 'static> {
    stores: Vec<(Option<String>, Store<K>, Arc<AtomicBool>)>,
}

impl<K> Reflected<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Lookup<DynamicType = ()>
        + Clone
        + Send
        + Sync
        + 'static,
    K: serde::de::DeserializeOwned + std::fmt::Debug,
{
    /// A store of every `K` carrying `label`, each kept as `project` leaves it, and the stream
    /// that fills it and yields the objects it touched (for the controller to map to their
    /// owners).
    /// In `namespaces` (every namespace when empty): one watch and store per namespace, their
    /// streams merged.
    fn watch(
        client: Client,
        namespaces: &[String],
        label: &str,
        project: fn(&mut K),
    ) -> (
        Self,
        impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    ) {
        let scopes: Vec<Option<String>> = if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.iter().cloned().map(Some).collect()
        };
        let mut stores = Vec::with_capacity(scopes.len());
        let mut streams = Vec::with_capacity(scopes.len());
        for scope in scopes {
            let (store, writer) = reflector::store();
            let ready = Arc::new(AtomicBool::new(false));
            let done = Arc::clone(&ready);
            let api = match &scope {
                Some(namespace) => Api::<K>::namespaced(client.clone(), namespace),
                None => Api::<K>::all(client.clone()),
            };
            let config = watcher::Config::default().labels(label);
            let stream = reflector::reflector(writer, watcher(api, config).modify(project))
                .inspect(move |event| {
                    if matches!(event, Ok(watcher::Event::InitDone)) {
                        done.store(true, Ordering::Release);
                    }
                })
                .default_backoff()
                .touched_objects();
            stores.push((scope, store, ready));
            streams.push(stream.boxed());
        }
        (Self { stores }, futures::stream::select_all(streams))
    }

    fn ready(&self) -> bool {
        self.stores.iter().all(|(_, _, r)| r.load(Ordering::Acquire))
    }

    /// Every `K` of the cluster (its namespace and cluster label).
    fn of(&self, cluster: &ClusterRef) -> Vec<K> {
        let Some((_, store, _)) = self
            .stores
            .iter()
            .find(|(scope, _, _)| scope.as_ref().is_none_or(|n| *n == cluster.namespace))
        else {
            return Vec::new();
        };
        store
            .state()
            .into_iter()
            .filter(|o| {
                o.namespace().as_deref() == Some(cluster.namespace.as_str())
                    && o.labels().get(etcd_operator_api::naming::CLUSTER_LABEL) == Some(&cluster.name)
            })
            .map(|o| K::clone(&o))
            .collect()
    }
}

/// What the stores keep of any object: everything but `managedFields` (server-side apply's
/// bookkeeping, which the runtime never reads and which is often the larger part of a
/// member Secret or Pod).
fn drop_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// What the stores keep of a member Pod: its metadata, its status and, of its spec, the volumes
/// and the node (what observing a member reads: the member's recorded configuration and TLS in
/// annotations, phase, readiness, restarts and init container states, whether its data is a
/// tmpfs). The containers, probes and scheduling are written, never read back, and would make
/// the fleet's Pods most of the operator's memory.
fn project_pod(pod: &mut Pod) {
    drop_managed_fields(pod);
    if let Some(spec) = pod.spec.as_mut() {
        *spec = PodSpec {
            volumes: spec.volumes.take(),
            node_name: spec.node_name.take(),
            ..PodSpec::default()
        };
    }
}

/// The stores, once the controller's watches are set up.
#[derive(Clone)]
struct Stores {
    pods: Reflected<Pod>,
    pvcs: Reflected<PersistentVolumeClaim>,
    secrets: Reflected<Secret>,
}

impl Stores {
    fn ready(&self) -> bool {
        self.pods.ready() && self.pvcs.ready() && self.secrets.ready()
    }
}

/// The member objects the controller's watches keep, and when this process last wrote to each
/// cluster's.
#[derive(Clone, Default)]
pub struct ChildCache {
    stores: Arc<RwLock<Option<Stores>>>,
    written: Arc<Mutex<HashMap<String, Instant>>>,
}

impl std::fmt::Debug for ChildCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let watching = self.stores.read().map(|s| s.is_some()).unwrap_or_default();
        f.debug_struct("ChildCache")
            .field("watching", &watching)
            .finish_non_exhaustive()
    }
}

/// The streams that fill the stores: the controller watches them as its children.
pub(super) type ChildStreams = (
    std::pin::Pin<Box<dyn Stream<Item = Result<Pod, watcher::Error>> + Send>>,
    std::pin::Pin<Box<dyn Stream<Item = Result<PersistentVolumeClaim, watcher::Error>> + Send>>,
    std::pin::Pin<Box<dyn Stream<Item = Result<Secret, watcher::Error>> + Send>>,
);

impl ChildCache {
    /// Starts new stores of the objects labelled `label` (replacing earlier ones: a controller
    /// started again after a lost leadership reads its own watches); the streams must be polled
    /// (by the controller) for them to fill.
    /// Only `namespaces` are watched when it is not empty.
    pub(super) fn watch(&self, client: &Client, namespaces: &[String], label: &str) -> ChildStreams {
        let (pods, pod_stream) = Reflected::<Pod>::watch(client.clone(), namespaces, label, project_pod);
        let (pvcs, pvc_stream) =
            Reflected::<PersistentVolumeClaim>::watch(client.clone(), namespaces, label, drop_managed_fields);
        let (secrets, secret_stream) =
            Reflected::<Secret>::watch(client.clone(), namespaces, label, drop_managed_fields);
        *self.stores.write().unwrap_or_else(PoisonError::into_inner) = Some(Stores { pods, pvcs, secrets });
        (
            Box::pin(pod_stream),
            Box::pin(pvc_stream),
            Box::pin(secret_stream),
        )
    }

    /// Records that this process is about to write to the cluster's Pods or PVCs.
    pub fn wrote(&self, cluster: &ClusterRef) {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(cluster.key(), Instant::now());
    }

    /// The stores, when they are filled and this process has not written to the cluster's
    /// children within [`OWN_WRITES_WINDOW`]; `None`: read the API.
    fn fresh(&self, cluster: &ClusterRef) -> Option<Stores> {
        {
            let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
            let key = cluster.key();
            match written.get(&key) {
                Some(at) if at.elapsed() < OWN_WRITES_WINDOW => return None,
                Some(_) => {
                    written.remove(&key);
                }
                None => {}
            }
        }
        let stores = self.stores.read().unwrap_or_else(PoisonError::into_inner);
        stores.as_ref().filter(|s| s.ready()).cloned()
    }

    /// The cluster's Pods and PVCs from the stores (see [`Self::fresh`]).
    pub fn read(&self, cluster: &ClusterRef) -> Option<(Vec<Pod>, Vec<PersistentVolumeClaim>)> {
        let stores = self.fresh(cluster)?;
        Some((stores.pods.of(cluster), stores.pvcs.of(cluster)))
    }

    /// The cluster's labelled Secrets (its CAs and member certificates) from the stores (see
    /// [`Self::fresh`]).
    pub fn read_secrets(&self, cluster: &ClusterRef) -> Option<Vec<Secret>> {
        Some(self.fresh(cluster)?.secrets.of(cluster))
    }

    /// Stores filled by hand (tests): `pods`, `pvcs` and `secrets` as if listed, ready.
    #[doc(hidden)]
    pub fn filled(pods: Vec<Pod>, pvcs: Vec<PersistentVolumeClaim>, secrets: Vec<Secret>) -> Self {
        fn fill<K>(objects: Vec<K>) -> Reflected<K>
        where
            K: Resource<DynamicType = ()> + Lookup<DynamicType = ()> + Clone + 'static,
        {
            let (store, mut writer) = reflector::store();
            writer.apply_watcher_event(&watcher::Event::Init);
            for o in objects {
                writer.apply_watcher_event(&watcher::Event::InitApply(o));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
            Reflected {
                stores: vec![(None, store, Arc::new(AtomicBool::new(true)))],
            }
        }
        let cache = Self::default();
        *cache.stores.write().unwrap_or_else(PoisonError::into_inner) = Some(Stores {
            pods: fill(pods),
            pvcs: fill(pvcs),
            secrets: fill(secrets),
        });
        cache
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;

    fn cluster(name: &str) -> ClusterRef {
        ClusterRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: "u".into(),
        }
    }

    fn pod(namespace: &str, cluster: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                labels: Some(
                    [(
                        etcd_operator_api::naming::CLUSTER_LABEL.to_owned(),
                        cluster.to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn a_cluster_reads_its_own_objects_from_filled_stores_unless_written_a_moment_ago() {
        let cache = ChildCache::filled(
            vec![
                pod("ns", "a", "a-1"),
                pod("ns", "b", "b-1"),
                pod("other", "a", "a-x"),
            ],
            Vec::new(),
            Vec::new(),
        );
        let (pods, pvcs) = cache.read(&cluster("a")).unwrap();
        assert_eq!(pods.iter().map(|p| p.name_any()).collect::<Vec<_>>(), ["a-1"]);
        assert!(pvcs.is_empty());
        assert_eq!(cache.read_secrets(&cluster("a")), Some(Vec::new()));
        // A write of this process: the API is read for that cluster only.
        cache.wrote(&cluster("a"));
        assert!(cache.read(&cluster("a")).is_none());
        assert!(cache.read_secrets(&cluster("a")).is_none());
        assert!(cache.read(&cluster("b")).is_some());
        // Once the window is over, the stores again.
        cache.written.lock().unwrap().insert(
            "ns/a".into(),
            Instant::now().checked_sub(OWN_WRITES_WINDOW).unwrap(),
        );
        assert!(cache.read(&cluster("a")).is_some());
    }

    #[test]
    fn a_stored_pod_keeps_what_observing_reads_and_nothing_written_only() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "c-a", "namespace": "ns",
                "labels": {"etcd.operator.dev/cluster": "c"},
                "annotations": {"etcd.operator.dev/member-config": "{}"},
                "ownerReferences": [{"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "name": "c", "uid": "u", "controller": true}],
                "managedFields": [{"manager": "etcd-operator", "operation": "Apply"}]
            },
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "etcd", "image": "etcd:v3.5.16", "command": ["etcd", "--name=c-a"]}],
                "volumes": [{"name": "data", "emptyDir": {"medium": "Memory"}}]
            },
            "status": {"phase": "Running", "containerStatuses": [{"name": "etcd", "image": "etcd", "imageID": "", "ready": true, "restartCount": 2}]}
        }))
        .unwrap();
        let before = p.clone();
        project_pod(&mut p);
        assert_eq!(p.metadata.managed_fields, None);
        assert_eq!(p.metadata.annotations, before.metadata.annotations);
        assert_eq!(p.metadata.owner_references, before.metadata.owner_references);
        assert_eq!(p.status, before.status);
        let spec = p.spec.unwrap();
        assert!(spec.containers.is_empty());
        assert_eq!(spec.volumes, before.spec.as_ref().unwrap().volumes);
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
    }

    #[test]
    fn without_stores_or_before_their_first_list_the_api_is_read() {
        assert!(ChildCache::default().read(&cluster("a")).is_none());
        let cache = ChildCache::filled(Vec::new(), Vec::new(), Vec::new());
        cache.stores.read().unwrap().as_ref().unwrap().pvcs.stores[0]
            .2
            .store(false, Ordering::Release);
        assert!(cache.read(&cluster("a")).is_none());
    }
}
