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
//! Hand-written: no crate offers an in-process Kubernetes API server.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use etcd_operator_apiserver::http::selectors::{FieldSelector, LabelSelector};
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
];

/// How long a Pod's graceful deletion takes when neither the request nor the Pod says.
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// Starting the fake API failed.
#[derive(Debug, thiserror::Error)]
pub enum FakeKubeError {
    /// The listener could not be bound.
    #[error("listen for the fake Kubernetes API: {0}")]
    Listen(#[source] std::io::Error),
    /// The kubeconfig could not be written.
    #[error("write the fake Kubernetes API's kubeconfig {}: {source}", path.display())]
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
    history: Vec<Change>,
}

#[derive(Debug)]
struct Shared {
    store: Mutex<Store>,
    changes: broadcast::Sender<Change>,
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
        store.history.push(change.clone());
        let _ = self.changes.send(change);
        object
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
    /// Serves plain HTTP on a free loopback port.
    pub async fn start() -> Result<Self, FakeKubeError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(FakeKubeError::Listen)?;
        let addr = listener.local_addr().map_err(FakeKubeError::Listen)?;
        let (changes, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            changes,
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
    fn parse(query: &BTreeMap<String, String>) -> Result<Self, String> {
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
    match (method, target.name.clone()) {
        (Method::GET, Some(name)) => get(&shared, &target, &name),
        (Method::GET, None) if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) => {
            watch(shared, target, &query)
        }
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
        Err(message) => return bad_request(message),
    };
    let store = shared.lock();
    let items: Vec<Value> = store
        .objects
        .iter()
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
        Err(message) => return bad_request(message),
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
                .objects
                .iter()
                .filter(|(k, v)| selection.matches(&target, k, v))
                .map(|(_, v)| ("ADDED", v.clone()))
                .collect(),
            Some(rv) => store
                .history
                .iter()
                .filter(|c| c.rv > rv && selection.matches(&target, &c.key, &c.object))
                .map(|c| (c.kind, c.object.clone()))
                .collect(),
        };
        (initial, changes)
    };
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
        Err(message) => return bad_request(message),
    };
    let names: Vec<String> = shared
        .lock()
        .objects
        .iter()
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
}
