//! A small in-memory Kubernetes API, for the node agent and the controller's kubernetes runtime
//! on a machine without kube-apiserver (no registry this project can reach ships one).
//!
//! It is a test double, not an API server: any group, version and resource is stored as JSON
//! without schema, defaulting or admission. What it does keep from kube-apiserver is what the
//! kubernetes runtime and a kubelet rely on: resourceVersions from one counter, `409` on stale
//! updates and existing names, label and field selectors, list + watch from a resourceVersion,
//! the status subresource (main-resource writes keep the status, `/status` writes change only
//! it), `pods/binding`, graceful Pod deletion (a bound Pod gets a deletionTimestamp and is gone
//! when its node deletes it with grace 0), finalizers, and the patch types kube-rs sends. Where
//! it simplifies, it says so: strategic merge and server-side apply are JSON merge patches here
//! (no field ownership); there is no garbage collection, no discovery and no authentication.
//! The real kube-apiserver suite (`make test-kube`) covers those.
//!
//! It also serves EtcdClusters (`etcd.operator.dev`) the way this project's API server does as
//! far as the controller can tell (status subresource, a new object's status saying that no
//! generation was observed yet), without validation or conversion, so one fake API can hold the
//! clusters and their children (the fleet benchmark). Like kube-apiserver it keeps a bounded
//! window of changes: a watch from a resourceVersion older than that window gets `410 Gone`
//! (`Expired`) and the client lists again. Every request is counted by the client's
//! `User-Agent`, verb and resource ([`FakeKube::request_counts`]) and can be followed as it comes
//! ([`FakeKube::requests_seen`]), which is how the benchmark counts the controller's requests.
//!
//! Hand-written: no crate offers an in-process Kubernetes API server.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use etcd_operator_apiserver::http::selectors::{FieldSelector, LabelSelector, SelectorError};
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// Resources whose `status` is a subresource: main-resource writes keep it.
const STATUS_RESOURCES: &[&str] = &[
    "pods",
    "persistentvolumeclaims",
    "services",
    "poddisruptionbudgets",
    "nodes",
    "namespaces",
    "etcdclusters",
    "etcdbackups",
];

/// How many changes are kept for watches from an older resourceVersion (kube-apiserver's watch
/// cache and etcd's compaction keep a window too); older ones get `410 Gone`.
pub const DEFAULT_HISTORY: usize = 20_000;

/// How long a Pod's graceful deletion takes when neither the request nor the Pod says.
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// Starting the fake API failed.
#[derive(Debug, thiserror::Error)]
pub enum FakeKubeError {
    /// The listener could not be bound.
    #[error("listen for the fake Kubernetes API")]
    Listen(#[source] std::io::Error),
    /// The kubeconfig could not be written.
    #[error("write the fake Kubernetes API's kubeconfig {}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One stored object's address: group/version (`v1` for the core group), resource, namespace
/// (empty for cluster-scoped objects) and name.
type Key = (String, String, String, String);

/// A change, as a watch reports it.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    kind: &'static str,
    key: Key,
    object: Value,
}

#[derive(Debug, Default)]
struct Store {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Value>,
    /// The newest changes, oldest first.
    history: VecDeque<Change>,
    /// How many changes `history` keeps.
    history_limit: usize,
    /// The resourceVersion of the newest change no longer in `history` (0: none dropped).
    compacted: u64,
}

/// One request the fake API received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSeen {
    /// When it arrived.
    pub at: std::time::Instant,
    /// The client's `User-Agent` (empty when it sent none).
    pub agent: String,
    /// kube-apiserver's verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` or
    /// `deletecollection`.
    pub verb: &'static str,
    /// The resource (`pods`, `etcdclusters`, ...).
    pub resource: String,
    /// The subresource (`status`, `binding`, ...), if any.
    pub subresource: Option<String>,
    /// The namespace, for namespaced requests.
    pub namespace: Option<String>,
    /// The object's name, for requests on one object.
    pub name: Option<String>,
    /// The label selector of a list, watch or collection delete.
    pub label_selector: Option<String>,
}

impl RequestSeen {
    /// Whether it asks for a change (create, update, patch, delete).
    pub fn is_write(&self) -> bool {
        !matches!(self.verb, "get" | "list" | "watch")
    }
}

/// Requests counted by (agent, verb, resource): see [`FakeKube::request_counts`].
pub type RequestCounts = BTreeMap<(String, &'static str, String), u64>;

impl Store {
    /// The stored objects of the target's group/version and resource (in its namespace when it
    /// names one), in key order: a range of the map, not a scan of every object.
    fn of<'a>(&'a self, target: &'a Target) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        let start: Key = (
            target.group_version.clone(),
            target.resource.clone(),
            target.namespace.clone().unwrap_or_default(),
            String::new(),
        );
        self.objects.range(start..).take_while(move |(k, _)| {
            k.0 == target.group_version
                && k.1 == target.resource
                && target.namespace.as_ref().is_none_or(|ns| *ns == k.2)
        })
    }
}

#[derive(Debug)]
struct Shared {
    store: Mutex<Store>,
    changes: broadcast::Sender<Change>,
    counts: Mutex<RequestCounts>,
    requests: broadcast::Sender<RequestSeen>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Store> {
        // A handler that panicked mid-write leaves a consistent map (writes are single inserts).
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a change and tells the watchers.
    fn commit(&self, store: &mut Store, kind: &'static str, key: Key, object: Option<Value>) -> Value {
        store.rv += 1;
        let rv = store.rv;
        let mut object = match object {
            Some(o) => o,
            None => store.objects.remove(&key).unwrap_or(Value::Null),
        };
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if kind != "DELETED" {
            store.objects.insert(key.clone(), object.clone());
        }
        let change = Change {
            rv,
            kind,
            key,
            object: object.clone(),
        };
        store.history.push_back(change.clone());
        while store.history.len() > store.history_limit {
            if let Some(dropped) = store.history.pop_front() {
                store.compacted = dropped.rv;
            }
        }
        let _ = self.changes.send(change);
        object
    }

    /// Counts a request and tells whoever follows them.
    fn count(&self, seen: RequestSeen) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *counts
            .entry((seen.agent.clone(), seen.verb, seen.resource.clone()))
            .or_default() += 1;
        drop(counts);
        // Nobody following is no failure.
        let _ = self.requests.send(seen);
    }
}

/// The running fake API; stops when dropped.
#[derive(Debug)]
pub struct FakeKube {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeKube {
    /// Serves plain HTTP on a free loopback port, keeping [`DEFAULT_HISTORY`] changes for
    /// watches.
    pub async fn start() -> Result<Self, FakeKubeError> {
        Self::start_with_history(DEFAULT_HISTORY).await
    }

    /// Serves plain HTTP on a free loopback port, keeping the newest `history` changes for
    /// watches from a resourceVersion (older ones get `410 Gone`).
    pub async fn start_with_history(history: usize) -> Result<Self, FakeKubeError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(FakeKubeError::Listen)?;
        let addr = listener.local_addr().map_err(FakeKubeError::Listen)?;
        let (changes, _) = broadcast::channel(4096);
        let (requests, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store {
                history_limit: history.max(1),
                ..Store::default()
            }),
            changes,
            counts: Mutex::new(RequestCounts::new()),
            requests,
        });
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let server = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::warn!(%error, "fake Kubernetes API stopped");
            }
        });
        Ok(Self { addr, shared, server })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig for this API to `path` and returns the path.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<PathBuf, FakeKubeError> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\nusers:\n- name: fake\n  user:\n    token: fake\n",
            self.url()
        );
        std::fs::write(path, text).map_err(|source| FakeKubeError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(path.to_path_buf())
    }

    /// A client for this API.
    pub fn client(&self) -> Result<kube::Client, kube::Error> {
        // kube's TLS stack needs a process-wide provider even for plain HTTP.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = self
            .url()
            .parse()
            .map_err(|e: axum::http::uri::InvalidUri| kube::Error::Service(e.into()))?;
        let mut config = kube::Config::new(url);
        config.default_namespace = "default".to_owned();
        kube::Client::try_from(config)
    }

    /// A client for this API that names itself `agent` (its `User-Agent`, by which
    /// [`Self::request_counts`] tells clients apart).
    pub fn client_as(&self, agent: &str) -> Result<kube::Client, kube::Error> {
        client_for(&self.url(), agent)
    }

    /// Every request so far, counted by (`User-Agent`, verb, resource).
    pub fn request_counts(&self) -> RequestCounts {
        self.shared
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Each request from now on, as it arrives (a receiver that falls more than 4096 requests
    /// behind loses the oldest).
    pub fn requests_seen(&self) -> broadcast::Receiver<RequestSeen> {
        self.shared.requests.subscribe()
    }

    /// Every stored object of `resource` (any group), for assertions.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        self.shared
            .lock()
            .objects
            .iter()
            .filter(|(k, _)| k.1 == resource)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A client for the fake API at `url` (from [`FakeKube::url`], in this or another process) that
/// names itself `agent` (its `User-Agent`, by which [`FakeKube::request_counts`] tells clients
/// apart).
pub fn client_for(url: &str, agent: &str) -> Result<kube::Client, kube::Error> {
    // kube's TLS stack needs a process-wide provider even for plain HTTP.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = url
        .parse()
        .map_err(|e: axum::http::uri::InvalidUri| kube::Error::Service(e.into()))?;
    let mut config = kube::Config::new(url);
    config.default_namespace = "default".to_owned();
    let agent = header::HeaderValue::from_str(agent).map_err(|e| kube::Error::Service(Box::new(e)))?;
    config.headers.push((header::USER_AGENT, agent));
    kube::Client::try_from(config)
}

/// What a request's path names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    group_version: String,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    fn key(&self, name: &str) -> Key {
        (
            self.group_version.clone(),
            self.resource.clone(),
            self.namespace.clone().unwrap_or_default(),
            name.to_owned(),
        )
    }

    fn api_version(&self) -> &str {
        &self.group_version
    }
}

/// `/api/v1/...` or `/apis/<group>/<version>/...`, then `namespaces/<ns>/<resource>[/<name>[/<sub>]]`
/// or `<resource>[/<name>[/<sub>]]`.
fn parse_path(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group_version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let own = |s: &&str| (*s).to_owned();
    match rest {
        ["namespaces", ns, resource, tail @ ..] if tail.len() <= 2 => Some(Target {
            group_version,
            resource: (*resource).to_owned(),
            namespace: Some((*ns).to_owned()),
            name: tail.first().map(own),
            subresource: tail.get(1).map(own),
        }),
        [resource, tail @ ..] if tail.len() <= 2 => Some(Target {
            group_version,
            resource: (*resource).to_owned(),
            namespace: None,
            name: tail.first().map(own),
            subresource: tail.get(1).map(own),
        }),
        _ => None,
    }
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

fn not_found(target: &Target, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", target.resource),
    )
}

fn conflict(target: &Target, name: &str, why: &str) -> Response {
    status(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            target.resource
        ),
    )
}

fn bad_request(message: String) -> Response {
    status(StatusCode::BAD_REQUEST, "BadRequest", message)
}

fn ok(code: StatusCode, object: Value) -> Response {
    (code, axum::Json(object)).into_response()
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn str_at<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The selectors of a list, watch or collection delete.
struct Selection {
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Selection {
    /// The selectors of the query; a 400 message when one does not parse.
    fn parse(query: &BTreeMap<String, String>) -> Result<Self, SelectorError> {
        let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?;
        let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))?;
        Ok(Self { labels, fields })
    }

    fn matches(&self, target: &Target, key: &Key, object: &Value) -> bool {
        key.0 == target.group_version
            && key.1 == target.resource
            && target.namespace.as_ref().is_none_or(|ns| *ns == key.2)
            && self.labels.matches(&labels_of(object))
            && self.fields.matches(&key.3, &key.2)
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(target) = parse_path(uri.path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the fake Kubernetes API does not serve {}", uri.path()),
        );
    };
    let body: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(json_error) => match serde_yaml::from_slice(&body) {
                Ok(v) => Some(v),
                Err(_) => return bad_request(format!("the body is not JSON: {json_error}")),
            },
        }
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let dry_run = query.contains_key("dryRun");
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    shared.count(RequestSeen {
        at: std::time::Instant::now(),
        agent: headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        verb: verb(&method, target.name.is_some(), watching),
        resource: target.resource.clone(),
        subresource: target.subresource.clone(),
        namespace: target.namespace.clone(),
        name: target.name.clone(),
        label_selector: query.get("labelSelector").cloned(),
    });
    match (method, target.name.clone()) {
        (Method::GET, Some(name)) => get(&shared, &target, &name),
        (Method::GET, None) if watching => watch(shared, target, &query),
        (Method::GET, None) => list(&shared, &target, &query),
        (Method::POST, None) => create(&shared, &target, body, dry_run),
        (Method::POST, Some(name)) if target.subresource.as_deref() == Some("binding") => {
            bind(&shared, &target, &name, body)
        }
        (Method::POST, Some(name)) if target.subresource.as_deref() == Some("eviction") => delete(
            &shared,
            &Target {
                subresource: None,
                ..target.clone()
            },
            &name,
            &query,
            None,
        ),
        (Method::PUT, Some(name)) => update(&shared, &target, &name, body, dry_run),
        (Method::PATCH, Some(name)) => patch(&shared, &target, &name, &content_type, body, dry_run),
        (Method::DELETE, Some(name)) => delete(&shared, &target, &name, &query, body),
        (Method::DELETE, None) => delete_collection(&shared, &target, &query),
        (method, _) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not supported on {}", uri.path()),
        ),
    }
}

/// kube-apiserver's name for what a request does (as audit logs and metrics say it).
fn verb(method: &Method, named: bool, watching: bool) -> &'static str {
    match (method, named) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watching => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => "other",
    }
}

fn get(shared: &Shared, target: &Target, name: &str) -> Response {
    match shared.lock().objects.get(&target.key(name)) {
        Some(object) => ok(StatusCode::OK, object.clone()),
        None => not_found(target, name),
    }
}

/// `<Kind>List` from the items, or from the resource name when there are none.
fn list_kind(target: &Target, items: &[Value]) -> String {
    if let Some(kind) = items.first().and_then(|o| o["kind"].as_str()) {
        return format!("{kind}List");
    }
    let known = [
        ("pods", "Pod"),
        ("persistentvolumeclaims", "PersistentVolumeClaim"),
        ("services", "Service"),
        ("secrets", "Secret"),
        ("events", "Event"),
        ("poddisruptionbudgets", "PodDisruptionBudget"),
        ("namespaces", "Namespace"),
        ("leases", "Lease"),
        ("configmaps", "ConfigMap"),
        ("etcdclusters", "EtcdCluster"),
        ("etcdbackups", "EtcdBackup"),
    ];
    let kind = known
        .iter()
        .find(|(r, _)| *r == target.resource)
        .map_or("Object", |(_, k)| k);
    format!("{kind}List")
}

fn list(shared: &Shared, target: &Target, query: &BTreeMap<String, String>) -> Response {
    let selection = match Selection::parse(query) {
        Ok(s) => s,
        Err(message) => return bad_request(message.to_string()),
    };
    let store = shared.lock();
    let items: Vec<Value> = store
        .of(target)
        .filter(|(k, v)| selection.matches(target, k, v))
        .map(|(_, v)| v.clone())
        .collect();
    let kind = list_kind(target, &items);
    ok(
        StatusCode::OK,
        json!({
            "apiVersion": target.api_version(),
            "kind": kind,
            "metadata": {"resourceVersion": store.rv.to_string()},
            "items": items,
        }),
    )
}

fn watch(shared: Arc<Shared>, target: Target, query: &BTreeMap<String, String>) -> Response {
    let selection = match Selection::parse(query) {
        Ok(s) => s,
        Err(message) => return bad_request(message.to_string()),
    };
    let since: Option<u64> = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => match rv.parse() {
            Ok(rv) => Some(rv),
            Err(_) => return bad_request(format!("resourceVersion {rv:?} is not a number")),
        },
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(Duration::from_secs(300), Duration::from_secs);
    // Subscribe and read what is there under one lock, so no change falls in between.
    let (initial, mut changes) = {
        let store = shared.lock();
        let changes = shared.changes.subscribe();
        let initial: Vec<(&'static str, Value)> = match since {
            None => store
                .of(&target)
                .filter(|(k, v)| selection.matches(&target, k, v))
                .map(|(_, v)| ("ADDED", v.clone()))
                .collect(),
            // Older than the window kept: kube-apiserver's answer, and the client lists again.
            Some(rv) if rv < store.compacted => vec![(
                "ERROR",
                json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {rv} ({})", store.compacted + 1),
                    "reason": "Expired", "code": 410,
                }),
            )],
            Some(rv) => {
                let first = store.history.partition_point(|c| c.rv <= rv);
                store
                    .history
                    .range(first..)
                    .filter(|c| selection.matches(&target, &c.key, &c.object))
                    .map(|c| (c.kind, c.object.clone()))
                    .collect()
            }
        };
        (initial, changes)
    };
    let expired = initial.first().is_some_and(|(kind, _)| *kind == "ERROR");
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let event = |kind: &str, object: Value| {
            let mut line = json!({"type": kind, "object": object}).to_string();
            line.push('\n');
            Ok(Bytes::from(line))
        };
        for (kind, object) in initial {
            if tx.send(event(kind, object)).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                change = changes.recv() => match change {
                    Ok(c) if selection.matches(&target, &c.key, &c.object) => {
                        if tx.send(event(c.kind, c.object)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Fell behind: end the watch; the client watches again from its last version.
                    Err(_) => return,
                },
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .unwrap_or_else(|e| status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()))
}

/// What kube-apiserver resets on create: a new object's status.
fn initial_status(resource: &str) -> Option<Value> {
    match resource {
        "pods" => Some(json!({"phase": "Pending"})),
        "persistentvolumeclaims" => Some(json!({"phase": "Pending"})),
        // This project's API server: no generation observed yet (see its cluster strategy).
        "etcdclusters" => Some(json!({"observedGeneration": 0})),
        r if STATUS_RESOURCES.contains(&r) => Some(json!({})),
        _ => None,
    }
}

fn create(shared: &Shared, target: &Target, body: Option<Value>, dry_run: bool) -> Response {
    let Some(mut object) = body.filter(Value::is_object) else {
        return bad_request("create needs an object".to_owned());
    };
    let body_ns = str_at(&object, "/metadata/namespace").to_owned();
    if let Some(ns) = &target.namespace {
        if !body_ns.is_empty() && body_ns != *ns {
            return bad_request(format!(
                "the namespace of the object ({body_ns}) does not match the namespace on the request ({ns})"
            ));
        }
        object["metadata"]["namespace"] = json!(ns);
    }
    let mut store = shared.lock();
    let mut name = str_at(&object, "/metadata/name").to_owned();
    if name.is_empty() {
        let base = str_at(&object, "/metadata/generateName").to_owned();
        if base.is_empty() {
            return status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                "metadata.name: Required value: name or generateName is required".to_owned(),
            );
        }
        name = format!("{base}{:05x}", store.uid % 0xfffff);
        object["metadata"]["name"] = json!(name);
    }
    let key = target.key(&name);
    if store.objects.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", target.resource),
        );
    }
    store.uid += 1;
    object["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{:012x}", store.uid));
    object["metadata"]["creationTimestamp"] = json!(now());
    object["metadata"]["generation"] = json!(1);
    if let Some(status) = initial_status(&target.resource) {
        object["status"] = status;
    }
    if dry_run {
        return ok(StatusCode::CREATED, object);
    }
    let stored = shared.commit(&mut store, "ADDED", key, Some(object));
    ok(StatusCode::CREATED, stored)
}

/// The server-owned parts of `old` carried over into `new` (what a client may not change).
fn carry_over(new: &mut Value, old: &Value, subresource: Option<&str>, resource: &str) {
    let meta_keys = [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ];
    if subresource == Some("status") {
        // Only the status changes.
        let status = new["status"].take();
        *new = old.clone();
        new["status"] = status;
        return;
    }
    for k in meta_keys {
        match old["metadata"].get(k) {
            Some(v) => new["metadata"][k] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(k);
                }
            }
        }
    }
    if STATUS_RESOURCES.contains(&resource) {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    if new.get("spec") != old.get("spec") {
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        new["metadata"]["generation"] = json!(generation + 1);
    }
    if resource == "pods" {
        // nodeName is set once, through pods/binding.
        let node = old.pointer("/spec/nodeName").cloned();
        if new.pointer("/spec/nodeName").cloned() != node
            && let Some(node) = node
        {
            new["spec"]["nodeName"] = node;
        }
    }
}

/// Stores `new` in place of `old` (or deletes it: the last finalizer of an object being deleted
/// went away), under the already-held lock.
fn store_update(
    shared: &Shared,
    store: &mut Store,
    target: &Target,
    name: &str,
    mut new: Value,
    old: &Value,
    dry_run: bool,
) -> Response {
    carry_over(&mut new, old, target.subresource.as_deref(), &target.resource);
    if dry_run {
        return ok(StatusCode::OK, new);
    }
    let deleting = new["metadata"].get("deletionTimestamp").is_some();
    let finalizers_left = new["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    let key = target.key(name);
    if deleting && !finalizers_left && target.resource != "pods" {
        store.objects.insert(key.clone(), new);
        let gone = shared.commit(store, "DELETED", key, None);
        return ok(StatusCode::OK, gone);
    }
    let stored = shared.commit(store, "MODIFIED", key, Some(new));
    ok(StatusCode::OK, stored)
}

fn update(shared: &Shared, target: &Target, name: &str, body: Option<Value>, dry_run: bool) -> Response {
    let Some(new) = body.filter(Value::is_object) else {
        return bad_request("update needs an object".to_owned());
    };
    let mut store = shared.lock();
    let Some(old) = store.objects.get(&target.key(name)).cloned() else {
        return not_found(target, name);
    };
    let sent_rv = str_at(&new, "/metadata/resourceVersion");
    if !sent_rv.is_empty() && sent_rv != str_at(&old, "/metadata/resourceVersion") {
        return conflict(
            target,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        );
    }
    store_update(shared, &mut store, target, name, new, &old, dry_run)
}

fn patch(
    shared: &Shared,
    target: &Target,
    name: &str,
    content_type: &str,
    body: Option<Value>,
    dry_run: bool,
) -> Response {
    let Some(patch) = body else {
        return bad_request("patch needs a body".to_owned());
    };
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let mut store = shared.lock();
    let old = match store.objects.get(&target.key(name)).cloned() {
        Some(old) => old,
        None if media == "application/apply-patch+yaml" => {
            drop(store);
            let mut object = patch;
            object["metadata"]["name"] = json!(name);
            return create(shared, target, Some(object), dry_run);
        }
        None => return not_found(target, name),
    };
    let mut new = old.clone();
    match media {
        // Simplified: strategic merge and apply merge like JSON merge patch (see the module doc).
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/apply-patch+yaml" => json_patch::merge(&mut new, &patch),
        "application/json-patch+json" => {
            // kube-apiserver's JSON patch finds a missing path equal to null in a `test`
            // operation (kube-runtime's finalizer helper tests `/metadata/finalizers` so).
            let mut patch = patch;
            if let Some(ops) = patch.as_array_mut() {
                ops.retain(|op| {
                    let missing = op["path"].as_str().is_some_and(|p| new.pointer(p).is_none());
                    !(op["op"] == "test" && op["value"].is_null() && missing)
                });
            }
            let ops: json_patch::Patch = match serde_json::from_value(patch) {
                Ok(p) => p,
                Err(e) => return bad_request(format!("not a JSON patch: {e}")),
            };
            if let Err(e) = json_patch::patch(&mut new, &ops) {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    format!("the JSON patch failed: {e}"),
                );
            }
        }
        other => {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!("the patch type {other:?} is not supported"),
            );
        }
    }
    let sent_rv = str_at(&new, "/metadata/resourceVersion");
    if !sent_rv.is_empty() && sent_rv != str_at(&old, "/metadata/resourceVersion") {
        return conflict(target, name, "the object has been modified");
    }
    store_update(shared, &mut store, target, name, new, &old, dry_run)
}

/// `pods/<name>/binding`: the scheduler's call; sets `spec.nodeName` once.
fn bind(shared: &Shared, target: &Target, name: &str, body: Option<Value>) -> Response {
    let node = body
        .as_ref()
        .map(|b| str_at(b, "/target/name").to_owned())
        .unwrap_or_default();
    if node.is_empty() {
        return bad_request("a binding needs target.name".to_owned());
    }
    let pods = Target {
        subresource: None,
        ..target.clone()
    };
    let mut store = shared.lock();
    let key = pods.key(name);
    let Some(mut pod) = store.objects.get(&key).cloned() else {
        return not_found(&pods, name);
    };
    if !str_at(&pod, "/spec/nodeName").is_empty() {
        return conflict(&pods, name, "pod is already assigned to a node");
    }
    if pod["metadata"].get("deletionTimestamp").is_some() {
        return conflict(&pods, name, "pod is being deleted");
    }
    pod["spec"]["nodeName"] = json!(node);
    let condition = json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now()});
    match pod["status"]["conditions"].as_array_mut() {
        Some(conditions) => conditions.push(condition),
        None => pod["status"]["conditions"] = json!([condition]),
    }
    shared.commit(&mut store, "MODIFIED", key, Some(pod));
    ok(
        StatusCode::CREATED,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

fn delete(
    shared: &Shared,
    target: &Target,
    name: &str,
    query: &BTreeMap<String, String>,
    body: Option<Value>,
) -> Response {
    let options = body.unwrap_or(Value::Null);
    let grace: Option<i64> = options["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()));
    let mut store = shared.lock();
    let key = target.key(name);
    let Some(mut object) = store.objects.get(&key).cloned() else {
        return not_found(target, name);
    };
    for (field, pointer) in [
        ("uid", "/metadata/uid"),
        ("resourceVersion", "/metadata/resourceVersion"),
    ] {
        if let Some(want) = options["preconditions"][field].as_str()
            && want != str_at(&object, pointer)
        {
            return conflict(
                target,
                name,
                &format!(
                    "Precondition failed: {field}: {want}, {field} in object meta: {}",
                    str_at(&object, pointer)
                ),
            );
        }
    }
    let has_finalizers = object["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    // A Pod on a node stops first: its node deletes it for good (grace 0) once it has.
    let graceful_pod = target.resource == "pods"
        && !str_at(&object, "/spec/nodeName").is_empty()
        && !matches!(str_at(&object, "/status/phase"), "Succeeded" | "Failed");
    let grace = if graceful_pod {
        grace
            .or_else(|| {
                object
                    .pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
            })
            .unwrap_or(DEFAULT_GRACE_SECONDS)
    } else {
        0
    };
    if has_finalizers || grace > 0 {
        let already = object["metadata"]["deletionGracePeriodSeconds"].as_i64();
        if object["metadata"].get("deletionTimestamp").is_none() || already.is_some_and(|g| grace < g) {
            let at = jiff::Timestamp::now()
                .checked_add(jiff::SignedDuration::from_secs(grace))
                .unwrap_or_else(|_| jiff::Timestamp::now());
            object["metadata"]["deletionTimestamp"] = json!(
                at.round(jiff::Unit::Second)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            );
            object["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            let stored = shared.commit(&mut store, "MODIFIED", key, Some(object));
            return ok(StatusCode::OK, stored);
        }
        return ok(StatusCode::OK, object);
    }
    let gone = shared.commit(&mut store, "DELETED", key, None);
    ok(StatusCode::OK, gone)
}

fn delete_collection(shared: &Shared, target: &Target, query: &BTreeMap<String, String>) -> Response {
    let selection = match Selection::parse(query) {
        Ok(s) => s,
        Err(message) => return bad_request(message.to_string()),
    };
    let names: Vec<String> = shared
        .lock()
        .of(target)
        .filter(|(k, v)| selection.matches(target, k, v))
        .map(|(k, _)| k.3.clone())
        .collect();
    for name in &names {
        let one = Target {
            name: Some(name.clone()),
            ..target.clone()
        };
        let _ = delete(shared, &one, name, query, None);
    }
    ok(
        StatusCode::OK,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_group_version_resource_namespace_name_and_subresource() {
        let t = parse_path("/api/v1/namespaces/ns/pods/p/binding").unwrap();
        assert_eq!(
            t,
            Target {
                group_version: "v1".into(),
                resource: "pods".into(),
                namespace: Some("ns".into()),
                name: Some("p".into()),
                subresource: Some("binding".into()),
            }
        );
        let t = parse_path("/apis/policy/v1/poddisruptionbudgets").unwrap();
        assert_eq!(
            (t.group_version.as_str(), t.resource.as_str()),
            ("policy/v1", "poddisruptionbudgets")
        );
        assert_eq!(t.namespace, None);
        let t = parse_path("/api/v1/namespaces/kube-system").unwrap();
        assert_eq!(
            (t.resource.as_str(), t.name.as_deref()),
            ("namespaces", Some("kube-system"))
        );
        assert!(parse_path("/healthz").is_none());
        assert!(parse_path("/api/v1/namespaces/ns/pods/p/status/extra").is_none());
    }

    #[test]
    fn status_writes_change_only_the_status_and_main_writes_keep_it() {
        let old = json!({"metadata": {"uid": "u", "generation": 1}, "spec": {"a": 1}, "status": {"phase": "Running"}});
        let mut main =
            json!({"metadata": {"uid": "forged"}, "spec": {"a": 2}, "status": {"phase": "Failed"}});
        carry_over(&mut main, &old, None, "pods");
        assert_eq!(main["status"]["phase"], "Running");
        assert_eq!(main["metadata"]["uid"], "u");
        assert_eq!(main["metadata"]["generation"], 2);
        let mut sub = json!({"metadata": {}, "spec": {"a": 9}, "status": {"phase": "Failed"}});
        carry_over(&mut sub, &old, Some("status"), "pods");
        assert_eq!(sub["spec"]["a"], 1);
        assert_eq!(sub["status"]["phase"], "Failed");
    }
}

#[cfg(test)]
mod http_tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
    use serde_json::json;

    use super::FakeKube;

    fn pod(name: &str) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "image": "i"}], "terminationGracePeriodSeconds": 5},
        }))
        .unwrap()
    }

    /// Names are unique, stale writes conflict, a bound Pod is deleted in two steps, selectors
    /// filter lists: what the node agent and the kubernetes runtime rely on.
    #[tokio::test]
    async fn conflicts_binding_graceful_deletion_and_selectors() {
        let kube = FakeKube::start().await.unwrap();
        let pods: Api<Pod> = Api::namespaced(kube.client().unwrap(), "ns");
        let created = pods.create(&PostParams::default(), &pod("a")).await.unwrap();
        assert_eq!(created.status.clone().unwrap().phase.as_deref(), Some("Pending"));
        let again = pods.create(&PostParams::default(), &pod("a")).await.unwrap_err();
        assert!(
            matches!(again, kube::Error::Api(ref s) if s.code == 409),
            "{again:?}"
        );

        // A write on an old resourceVersion is refused.
        let mut stale = created.clone();
        pods.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"b": "1"}}})),
        )
        .await
        .unwrap();
        stale.metadata.labels = None;
        let err = pods
            .replace("a", &PostParams::default(), &stale)
            .await
            .unwrap_err();
        assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409), "{err:?}");

        // Status writes go through /status only.
        pods.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
        assert_eq!(
            pods.get("a").await.unwrap().status.unwrap().phase.as_deref(),
            Some("Pending")
        );

        // Bound once; then a delete leaves it terminating until its node deletes it with grace 0.
        let binding = json!({"target": {"kind": "Node", "name": "n"}});
        let _: serde_json::Value = pods
            .create_subresource("binding", "a", &PostParams::default(), &binding)
            .await
            .unwrap();
        let twice = pods
            .create_subresource::<_, serde_json::Value>("binding", "a", &PostParams::default(), &binding)
            .await
            .unwrap_err();
        assert!(
            matches!(twice, kube::Error::Api(ref s) if s.code == 409),
            "{twice:?}"
        );
        pods.delete("a", &DeleteParams::default()).await.unwrap();
        let terminating = pods.get("a").await.unwrap();
        assert!(terminating.metadata.deletion_timestamp.is_some());
        assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(5));
        pods.delete("a", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        assert!(pods.get_opt("a").await.unwrap().is_none());

        // An unbound Pod goes at once; selectors filter.
        pods.create(&PostParams::default(), &pod("b")).await.unwrap();
        let mut other = pod("c");
        other.metadata.labels = None;
        pods.create(&PostParams::default(), &other).await.unwrap();
        let listed = pods.list(&ListParams::default().labels("app=x")).await.unwrap();
        assert_eq!(listed.items.len(), 1);
        let bad = pods
            .list(&ListParams::default().labels("app in ("))
            .await
            .unwrap_err();
        assert!(matches!(bad, kube::Error::Api(ref s) if s.code == 400), "{bad:?}");
        pods.delete("b", &DeleteParams::default()).await.unwrap();
        assert!(pods.get_opt("b").await.unwrap().is_none());
    }

    /// What the controller sends for EtcdClusters works here as on this project's API server:
    /// kube-runtime's finalizer patch (a JSON patch testing for null finalizers), the status
    /// patch conditional on the resourceVersion read (409 when stale), main-resource writes that
    /// keep the status, and the status a new object gets.
    #[tokio::test]
    async fn etcd_clusters_take_the_finalizer_and_status_patches_the_controller_sends() {
        use etcd_operator_api::v1alpha2::EtcdCluster;
        let kube = FakeKube::start().await.unwrap();
        let clusters: Api<EtcdCluster> = Api::namespaced(kube.client().unwrap(), "ns");
        let mut cluster = EtcdCluster::new("demo", "ns", Default::default());
        cluster.status = Some(Default::default());
        let created = clusters.create(&PostParams::default(), &cluster).await.unwrap();
        assert_eq!(
            created.status.as_ref().and_then(|s| s.observed_generation),
            Some(0)
        );

        // kube-runtime adds its finalizer with a test for null, then a second one after the first.
        let add = |value: serde_json::Value| {
            serde_json::from_value::<json_patch::Patch>(value)
                .map(Patch::<()>::Json)
                .unwrap()
        };
        let first = add(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["a"]},
        ]));
        clusters
            .patch("demo", &PatchParams::default(), &first)
            .await
            .unwrap();
        // The same patch again fails its test: the finalizers are there now.
        let again = clusters
            .patch("demo", &PatchParams::default(), &first)
            .await
            .unwrap_err();
        assert!(
            matches!(again, kube::Error::Api(ref s) if s.code == 422),
            "{again:?}"
        );
        let second = add(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": ["a"]},
            {"op": "add", "path": "/metadata/finalizers/-", "value": "b"},
        ]));
        let stored = clusters
            .patch("demo", &PatchParams::default(), &second)
            .await
            .unwrap();
        assert_eq!(stored.metadata.finalizers, Some(vec!["a".into(), "b".into()]));

        // Status: conditional on the resourceVersion read; only the status changes.
        let rv = stored.metadata.resource_version.clone().unwrap();
        let status = |rv: &str| {
            add(json!([
                {"op": "add", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "add", "path": "/status", "value": {"readyReplicas": 3, "observedGeneration": 1}},
                {"op": "add", "path": "/spec/replicas", "value": 9},
            ]))
        };
        let written = clusters
            .patch_status("demo", &PatchParams::default(), &status(&rv))
            .await
            .unwrap();
        let written_status = written.status.clone().unwrap();
        assert_eq!(written_status.ready_replicas, Some(3));
        assert_eq!(written.spec.replicas, None);
        assert_eq!(written.metadata.generation, Some(1));
        let stale = clusters
            .patch_status("demo", &PatchParams::default(), &status(&rv))
            .await
            .unwrap_err();
        assert!(
            matches!(stale, kube::Error::Api(ref s) if s.code == 409),
            "{stale:?}"
        );

        // A spec change keeps the status and moves the generation.
        let changed = clusters
            .patch(
                "demo",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 4}, "status": {"readyReplicas": 0}})),
            )
            .await
            .unwrap();
        assert_eq!(changed.spec.replicas, Some(4));
        assert_eq!(changed.metadata.generation, Some(2));
        assert_eq!(changed.status.unwrap().ready_replicas, Some(3));
    }

    /// A watch from a resourceVersion older than the changes kept gets `410 Expired` (as from
    /// kube-apiserver) and a newer one the changes since; requests are counted by client.
    #[tokio::test]
    async fn old_watches_expire_and_requests_are_counted_by_client() {
        use futures::StreamExt;
        let kube = FakeKube::start_with_history(2).await.unwrap();
        let mut seen = kube.requests_seen();
        let pods: Api<Pod> = Api::namespaced(kube.client_as("tester").unwrap(), "ns");
        let first = pods.create(&PostParams::default(), &pod("a")).await.unwrap();
        let first_rv = first.metadata.resource_version.unwrap();
        for name in ["b", "c", "d"] {
            pods.create(&PostParams::default(), &pod(name)).await.unwrap();
        }
        let expired = pods
            .watch(&kube::api::WatchParams::default(), &first_rv)
            .await
            .unwrap()
            .boxed()
            .next()
            .await
            .unwrap();
        assert!(
            matches!(expired, Ok(kube::api::WatchEvent::Error(ref s)) if s.code == 410 && s.reason == "Expired"),
            "{expired:?}"
        );
        let list = pods.list(&ListParams::default()).await.unwrap();
        assert_eq!(list.items.len(), 4);
        // The newest two changes are kept: a watch from the one before them sees both.
        let third_rv = list.items[2].metadata.resource_version.clone().unwrap();
        let before = (third_rv.parse::<u64>().unwrap() - 1).to_string();
        let events: Vec<_> = pods
            .watch(&kube::api::WatchParams::default().timeout(1), &before)
            .await
            .unwrap()
            .boxed()
            .take(2)
            .collect()
            .await;
        assert!(
            events
                .iter()
                .all(|e| matches!(e, Ok(kube::api::WatchEvent::Added(_)))),
            "{events:?}"
        );

        let counts = kube.request_counts();
        let count = |verb| {
            counts
                .get(&("tester".to_owned(), verb, "pods".to_owned()))
                .copied()
        };
        assert_eq!(
            (count("create"), count("watch"), count("list")),
            (Some(4), Some(2), Some(1))
        );
        let first_seen = seen.recv().await.unwrap();
        assert_eq!(
            (
                first_seen.verb,
                first_seen.namespace.as_deref(),
                first_seen.is_write()
            ),
            ("create", Some("ns"), true)
        );
    }
}
