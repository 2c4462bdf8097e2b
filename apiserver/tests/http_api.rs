//! The HTTP API driven in process: the real router over real storage, one request at a time
//! through `tower::ServiceExt::oneshot`, each test twice: on the in-memory store and on a real
//! etcd (see `both_backings!` at the end). Every failure path asserts the `Status` body
//! kube-apiserver sends (code, `kind`, `apiVersion`, reason, message, causes) and that nothing was
//! stored: the backing store's revision and every key under the resource prefix are unchanged.
//! The verbs' semantics around those failures (finalizers, subresources, generation, paging,
//! dry runs, Table output, discovery, OpenAPI) are checked on the same server.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use etcd_operator_apiserver::http::auth::{
    AllowAuthenticated, AuthenticateFuture, Authenticator, LocalAuthenticator, UserInfo,
};
use etcd_operator_apiserver::http::metrics::{ApiMetrics, instrument};
use etcd_operator_apiserver::http::openapi::Documents;
use etcd_operator_apiserver::http::snapshot::{
    MemberSnapshot, OpenSnapshotError, SnapshotSource, VerifiedSnapshot,
};
use etcd_operator_apiserver::http::{AppState, Stores, router};
use etcd_operator_apiserver::registry::controller_init::ControllerInit;
use etcd_operator_apiserver::registry::kind::Kind;
use etcd_operator_apiserver::storage::backend::{
    Backend, EtcdBackend, MemoryBackend, RangeRequest, prefix_end,
};
use etcd_operator_apiserver::storage::{Storage, StorageOptions};
use etcd_operator_tests::{EtcdVersion, TestEtcd};
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tower::ServiceExt;

const PREFIX: &str = "/registry/etcd.operator.dev/etcdclusters/";
const BACKUPS_PREFIX: &str = "/registry/etcd.operator.dev/etcdbackups/";
const NS: &str = "team-a";
const GROUP_PATH: &str = "/apis/etcd.operator.dev";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
const AGGREGATED_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
const NOT_FOUND_X: &str = "etcdclusters.etcd.operator.dev \"x\" not found";
const MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const APPLY: &str = "application/apply-patch+yaml";
const SMP: &str = "application/strategic-merge-patch+json";

/// Every request is made by this user.
struct FixedUser;

impl Authenticator for FixedUser {
    fn authenticate<'a>(&'a self, _parts: &'a mut http::request::Parts) -> AuthenticateFuture<'a> {
        Box::pin(async {
            Ok(Some(UserInfo {
                name: "tester".into(),
                uid: None,
                groups: vec!["system:authenticated".into()],
                extra: Default::default(),
            }))
        })
    }
}

/// The test's stand-in for the snapshot source the binary injects (the controller's): the whole
/// snapshot of the first endpoint that streams one (here, the backing etcd), in one chunk.
struct DirectSnapshots;

impl SnapshotSource for DirectSnapshots {
    fn open<'a>(
        &'a self,
        endpoints: &'a [String],
    ) -> futures::future::BoxFuture<'a, Result<MemberSnapshot, OpenSnapshotError>> {
        Box::pin(async move {
            for endpoint in endpoints {
                let options = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
                let Ok(mut client) = etcd_client::Client::connect([endpoint], Some(options)).await else {
                    continue;
                };
                let Ok(mut stream) = client.snapshot().await else {
                    continue;
                };
                let mut data = Vec::new();
                while let Some(chunk) = stream
                    .message()
                    .await
                    .map_err(|e| OpenSnapshotError::Member(Box::new(e)))?
                {
                    data.extend_from_slice(chunk.blob());
                }
                use sha2::Digest;
                let sha256 = hex::encode(sha2::Sha256::digest(&data));
                let size = data.len() as u64;
                return Ok(MemberSnapshot {
                    revision: 1,
                    endpoint: endpoint.clone(),
                    chunks: futures::StreamExt::boxed(futures::stream::iter([Ok(bytes::Bytes::from(data))])),
                    verified: Box::new(move || {
                        Some(VerifiedSnapshot {
                            size,
                            sha256: sha256.clone(),
                        })
                    }),
                });
            }
            Err(OpenSnapshotError::NoHealthyMember)
        })
    }
}

/// A response, read to the end.
#[derive(Debug)]
struct Resp {
    status: StatusCode,
    headers: HeaderMap,
    body: bytes::Bytes,
    /// Trailers sent after the body (a snapshot's SHA-256).
    trailers: Option<HeaderMap>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} response is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn warnings(&self) -> Vec<String> {
        self.headers
            .get_all(header::WARNING)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    }

    #[track_caller]
    fn expect(&self, code: u16) -> Value {
        assert_eq!(
            self.status.as_u16(),
            code,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        self.json()
    }
}

/// Everything stored under the resource prefix, and the etcd revision: equal before and after a
/// refused request means nothing was written anywhere.
#[derive(Debug, PartialEq, Eq)]
struct Stored {
    revision: i64,
    keys: Vec<(String, i64, String)>,
}

/// The store under the server: every test runs on both (see [`both_backings!`]).
#[derive(Debug, Clone, Copy)]
enum Backing {
    /// The in-memory MVCC store: no etcd, milliseconds.
    Memory,
    /// A real etcd 3.5.1 from `.tools/`.
    Etcd,
}

struct Api {
    app: axum::Router,
    storage: Storage,
    backend: Arc<dyn Backend>,
    /// The etcd behind `backend`, for [`Backing::Etcd`]; declared last so it stops last.
    etcd: Option<TestEtcd>,
}

fn coll(ns: &str) -> String {
    format!("{GROUP_PATH}/v1alpha2/namespaces/{ns}/etcdclusters")
}

fn obj(ns: &str, name: &str) -> String {
    format!("{}/{name}", coll(ns))
}

/// A cluster that asks for what defaulting gives, the default version included (so a
/// `{"spec":null}` merge patch changes nothing).
fn cluster(name: &str) -> Value {
    json!({
        "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
        "metadata": {"name": name},
        "spec": {"replicas": 3, "version": etcd_operator_api::versions::DEFAULT_ETCD_VERSION},
    })
}

/// Asserts a `Status` failure body: code, kind, apiVersion, reason, and a part of the message.
#[track_caller]
fn assert_status(r: &Resp, code: u16, reason: &str, message: &str) -> Value {
    let s = r.json();
    assert_eq!(r.status.as_u16(), code, "{s:#}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{s:#}");
    assert_eq!(s["kind"], "Status", "{s:#}");
    assert_eq!(s["apiVersion"], "v1", "{s:#}");
    assert_eq!(s["status"], "Failure", "{s:#}");
    assert_eq!(s["code"], code, "{s:#}");
    assert_eq!(s["reason"], reason, "{s:#}");
    let text = s["message"].as_str().unwrap_or_default();
    assert!(
        text.contains(message),
        "message {text:?} lacks {message:?}: {s:#}"
    );
    s
}

/// The `field` of every cause.
fn cause_fields(status: &Value) -> Vec<String> {
    status["details"]["causes"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| c["field"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

impl Api {
    async fn start(backing: Backing) -> Self {
        Self::start_with(backing, Arc::new(FixedUser)).await
    }

    async fn start_with(backing: Backing, authenticator: Arc<dyn Authenticator>) -> Self {
        Self::start_full(backing, authenticator, Arc::new([])).await
    }

    /// A server whose new objects get `controller_init` (as when the controller runs in it).
    async fn start_with_controller_init(backing: Backing, controller_init: Arc<[ControllerInit]>) -> Self {
        Self::start_full(backing, Arc::new(FixedUser), controller_init).await
    }

    async fn start_full(
        backing: Backing,
        authenticator: Arc<dyn Authenticator>,
        controller_init: Arc<[ControllerInit]>,
    ) -> Self {
        let (backend, etcd): (Arc<dyn Backend>, _) = match backing {
            Backing::Memory => (Arc::new(MemoryBackend::new()), None),
            Backing::Etcd => {
                let etcd = TestEtcd::start(EtcdVersion::V3_5_1)
                    .await
                    .expect("start etcd 3.5.1 (install it with `make tools`)");
                let client = etcd.client().await.unwrap();
                (Arc::new(EtcdBackend::new(client)), Some(etcd))
            }
        };
        let (app, storage) = Self::app_on_with(&backend, authenticator, controller_init).await;
        Self {
            app,
            storage,
            backend,
            etcd,
        }
    }

    /// A router (a "server process") over the backing store.
    async fn app_on(
        backend: &Arc<dyn Backend>,
        authenticator: Arc<dyn Authenticator>,
    ) -> (axum::Router, Storage) {
        Self::app_on_with(backend, authenticator, Arc::new([])).await
    }

    async fn app_on_with(
        backend: &Arc<dyn Backend>,
        authenticator: Arc<dyn Authenticator>,
        controller_init: Arc<[ControllerInit]>,
    ) -> (axum::Router, Storage) {
        let stores = Stores::open(|prefix| {
            Storage::with_backend(Arc::clone(backend), prefix, StorageOptions::default())
        })
        .await
        .unwrap();
        for storage in stores.all() {
            storage.wait_initialized(Duration::from_secs(10)).await.unwrap();
        }
        let storage = stores.get(Kind::CLUSTER).unwrap().clone();
        assert_eq!(storage.prefix(), PREFIX);
        // Every request goes through the metrics layer, as in both modes of the binary.
        let mut registry = Registry::default();
        let metrics = ApiMetrics::register(&mut registry);
        let app = router(AppState {
            stores,
            authenticator,
            authorizer: Arc::new(AllowAuthenticated),
            openapi: Arc::new(Documents::generate().unwrap()),
            snapshots: Some(Arc::new(DirectSnapshots)),
            namespaces: None,
            metrics: Some(Arc::new(registry)),
            controller_init,
        });
        (instrument(app, metrics), storage)
    }

    async fn send(&self, req: Request<Body>) -> Resp {
        send_to(&self.app, req).await
    }

    async fn call(&self, method: Method, uri: &str, headers: &[(&str, &str)], body: impl Into<Body>) -> Resp {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req.body(body.into()).unwrap()).await
    }

    async fn get(&self, uri: &str) -> Resp {
        self.call(Method::GET, uri, &[], Body::empty()).await
    }

    async fn get_accept(&self, uri: &str, accept: &str) -> Resp {
        self.call(Method::GET, uri, &[("accept", accept)], Body::empty())
            .await
    }

    async fn post(&self, uri: &str, body: &Value) -> Resp {
        self.call(
            Method::POST,
            uri,
            &[("content-type", "application/json")],
            body.to_string(),
        )
        .await
    }

    async fn put(&self, uri: &str, body: &Value) -> Resp {
        self.call(
            Method::PUT,
            uri,
            &[("content-type", "application/json")],
            body.to_string(),
        )
        .await
    }

    async fn patch(&self, uri: &str, content_type: &str, body: &str) -> Resp {
        self.call(
            Method::PATCH,
            uri,
            &[("content-type", content_type)],
            body.to_string(),
        )
        .await
    }

    async fn delete(&self, uri: &str, body: Option<&Value>) -> Resp {
        match body {
            Some(b) => {
                self.call(
                    Method::DELETE,
                    uri,
                    &[("content-type", "application/json")],
                    b.to_string(),
                )
                .await
            }
            None => self.call(Method::DELETE, uri, &[], Body::empty()).await,
        }
    }

    /// Creates `name` in `ns` (v1alpha2, 3 replicas) and returns the stored object.
    async fn create_in(&self, ns: &str, body: &Value) -> Value {
        self.post(&coll(ns), body).await.expect(201)
    }

    async fn create(&self, name: &str) -> Value {
        self.create_in(NS, &cluster(name)).await
    }

    /// Every key under `prefix` at the latest revision, read from the backing store directly.
    async fn read_prefix(&self, prefix: &str) -> etcd_operator_apiserver::storage::backend::RangeResponse {
        self.backend
            .range(RangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: prefix_end(prefix.as_bytes()),
                revision: None,
                limit: None,
            })
            .await
            .unwrap()
    }

    async fn stored(&self) -> Stored {
        let resp = self.read_prefix(PREFIX).await;
        Stored {
            revision: resp.revision as i64,
            keys: resp
                .kvs
                .iter()
                .map(|kv| {
                    (
                        String::from_utf8(kv.key.clone()).unwrap(),
                        kv.mod_revision as i64,
                        String::from_utf8(kv.value.clone()).unwrap(),
                    )
                })
                .collect(),
        }
    }

    /// Compacts the backing store (etcd: its own compaction) to `revision`.
    async fn compact_store(&self, revision: i64) {
        self.backend.compact(revision as u64).await.unwrap();
    }

    async fn assert_unchanged(&self, before: &Stored, what: &str) {
        let after = self.stored().await;
        assert_eq!(&after, before, "{what} changed what is stored");
    }

    /// Names listed in a namespace.
    async fn names(&self, ns: &str) -> BTreeSet<String> {
        self.get(&coll(ns)).await.expect(200)["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }
}

async fn send_to(app: &axum::Router, req: Request<Body>) -> Resp {
    let resp = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let collected = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("the response body ends within 30 s")
        .unwrap();
    let trailers = collected.trailers().cloned();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    }
}

// ---------------------------------------------------------------------------------------------
// Authentication

async fn local_authenticator_refuses_requests_without_a_client_certificate_except_health_checks(
    backing: Backing,
) {
    let api = Api::start_with(backing, Arc::new(LocalAuthenticator)).await;
    for path in [
        coll(NS),
        obj(NS, "a"),
        "/apis".to_string(),
        format!("{GROUP_PATH}/v1alpha2"),
        "/openapi/v2".to_string(),
        "/version".to_string(),
    ] {
        let r = api.get(&path).await;
        assert_status(&r, 401, "Unauthorized", "Unauthorized");
    }
    // Identity headers from an unverified client are no credentials.
    let r = api
        .call(
            Method::POST,
            &coll(NS),
            &[
                ("x-remote-user", "admin"),
                ("x-remote-group", "system:masters"),
                ("content-type", "application/json"),
            ],
            cluster("a").to_string(),
        )
        .await;
    assert_status(&r, 401, "Unauthorized", "Unauthorized");
    for path in ["/healthz", "/livez", "/readyz"] {
        let r = api.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(&r.body[..], b"ok", "{path}");
    }
    assert!(api.stored().await.keys.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Decoding

async fn malformed_and_non_object_bodies_are_400_and_store_nothing(backing: Backing) {
    let api = Api::start(backing).await;
    let existing = api.create("keep").await;
    let before = api.stored().await;
    let json = "application/json";
    let yaml = "application/yaml";
    let cases: [(&str, &str, &str, &str); 8] = [
        ("malformed JSON", json, "{\"apiVersion\": ", "json parse error"),
        ("JSON with trailing garbage", json, "{} {", "json parse error"),
        ("empty body", json, "", "json parse error"),
        (
            "malformed YAML",
            yaml,
            "apiVersion: [unclosed\nkind: EtcdCluster\n",
            "error converting YAML to JSON",
        ),
        ("JSON array", json, "[1, 2]", "must be a JSON object"),
        ("JSON string", json, "\"EtcdCluster\"", "must be a JSON object"),
        ("YAML scalar", yaml, "just a string\n", "must be a JSON object"),
        ("YAML list", yaml, "- a\n- b\n", "must be a JSON object"),
    ];
    for (what, content_type, body, message) in cases {
        let r = api
            .call(Method::POST, &coll(NS), &[("content-type", content_type)], body)
            .await;
        let s = assert_status(&r, 400, "BadRequest", message);
        assert!(
            s.get("details").is_none_or(|d| d["causes"].is_null()),
            "{what}: {s}"
        );
        let r = api
            .call(
                Method::PUT,
                &obj(NS, "keep"),
                &[("content-type", content_type)],
                body,
            )
            .await;
        assert_status(&r, 400, "BadRequest", message);
    }
    // A YAML body that is fine is accepted (the check above is not about YAML as such).
    let r = api
        .call(
            Method::POST,
            &coll(NS),
            &[("content-type", yaml)],
            "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata: {name: yaml-ok}\nspec: {replicas: 3, version: 3.5.1}\n",
        )
        .await;
    r.expect(201);
    assert_eq!(existing["metadata"]["name"], "keep");
    let after = api.stored().await;
    assert_eq!(after.keys.len(), before.keys.len() + 1);
    assert_eq!(after.keys[0], before.keys[0], "the existing object is untouched");
}

async fn wrong_kind_or_api_version_is_400_and_stores_nothing(backing: Backing) {
    let api = Api::start(backing).await;
    let existing = api.create("keep").await;
    let before = api.stored().await;
    let with = |f: &dyn Fn(&mut Value)| {
        let mut b = cluster("new");
        f(&mut b);
        b
    };
    let cases = [
        (
            with(&|b| b["kind"] = json!("Pod")),
            "the kind in the data (Pod) does not match the expected kind (EtcdCluster)",
        ),
        (
            with(&|b| {
                b.as_object_mut().unwrap().remove("kind");
            }),
            "Object 'Kind' is missing",
        ),
        (
            with(&|b| b["apiVersion"] = json!("v1")),
            "the API version in the data (v1) does not match the expected API version (etcd.operator.dev/v1alpha2)",
        ),
        (
            with(&|b| b["apiVersion"] = json!("other.example.com/v1alpha2")),
            "does not match the expected API version (etcd.operator.dev/v1alpha2)",
        ),
        (
            with(&|b| {
                b.as_object_mut().unwrap().remove("apiVersion");
            }),
            "Object 'apiVersion' is missing",
        ),
        (
            // The other served version than the URL's.
            with(&|b| b["apiVersion"] = json!("etcd.operator.dev/v1alpha1")),
            "the API version in the data (etcd.operator.dev/v1alpha1) does not match the expected API version (etcd.operator.dev/v1alpha2)",
        ),
    ];
    for (body, message) in &cases {
        let r = api.post(&coll(NS), body).await;
        assert_status(&r, 400, "BadRequest", message);
        let mut put = body.clone();
        put["metadata"] = existing["metadata"].clone();
        let r = api.put(&obj(NS, "keep"), &put).await;
        assert_status(&r, 400, "BadRequest", message);
    }
    // And the reverse: a v1alpha2 body to the v1alpha1 URL.
    let r = api
        .post(
            &format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdclusters"),
            &cluster("new"),
        )
        .await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "the API version in the data (etcd.operator.dev/v1alpha2) does not match the expected API version (etcd.operator.dev/v1alpha1)",
    );
    api.assert_unchanged(&before, "wrong kind/apiVersion").await;
}

async fn identity_metadata_that_disagrees_with_the_request_is_refused(backing: Backing) {
    let api = Api::start(backing).await;
    let existing = api.create("a").await;
    let before = api.stored().await;

    let mut b = cluster("b");
    b["metadata"]["namespace"] = json!("other");
    let r = api.post(&coll(NS), &b).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "the namespace of the provided object does not match the namespace sent on the request",
    );

    let mut b = cluster("b");
    b["metadata"]["resourceVersion"] = json!("5");
    let r = api.post(&coll(NS), &b).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "resourceVersion should not be set on objects to be created",
    );

    let mut renamed = existing.clone();
    renamed["metadata"]["name"] = json!("other");
    let r = api.put(&obj(NS, "a"), &renamed).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "the name of the object (other) does not match the name on the URL (a)",
    );
    let r = api.put(&format!("{}/status", obj(NS, "a")), &renamed).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "the name of the object (other) does not match the name on the URL (a)",
    );

    let mut moved = existing.clone();
    moved["metadata"]["namespace"] = json!("other");
    let r = api.put(&obj(NS, "a"), &moved).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "the namespace of the provided object does not match the namespace sent on the request",
    );

    // Neither name nor generateName.
    let mut nameless = cluster("x");
    nameless["metadata"] = json!({});
    let r = api.post(&coll(NS), &nameless).await;
    let s = assert_status(&r, 422, "Invalid", "is invalid");
    assert_eq!(cause_fields(&s), ["metadata.name"], "{s:#}");

    // Server-owned identity cannot change.
    let mut uid = existing.clone();
    uid["metadata"]["uid"] = json!("6a1cbd0d-0000-0000-0000-000000000000");
    let r = api.put(&obj(NS, "a"), &uid).await;
    let s = assert_status(&r, 422, "Invalid", "field is immutable");
    assert_eq!(cause_fields(&s), ["metadata.uid"]);
    // A different creationTimestamp is ignored (k8s.io/apiserver's BeforeUpdate): a no-op here.
    let mut created = existing.clone();
    created["metadata"]["creationTimestamp"] = json!("2001-01-01T00:00:00Z");
    let r = api.put(&obj(NS, "a"), &created).await;
    assert_eq!(r.expect(200), existing);

    api.assert_unchanged(&before, "identity mismatches").await;
}

// ---------------------------------------------------------------------------------------------
// Validation

async fn invalid_objects_are_422_with_every_cause_and_store_nothing(backing: Backing) {
    let api = Api::start(backing).await;
    let existing = api.create("a").await;
    let mut old = cluster("old");
    old["spec"]["version"] = json!("3.4.23");
    let old = api.create_in(NS, &old).await;
    let before = api.stored().await;

    let mut bad = cluster("bad");
    bad["spec"] = json!({"replicas": 0, "version": "4.0.0", "storage": {"size": "lots"}});
    let r = api.post(&coll(NS), &bad).await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "EtcdCluster.etcd.operator.dev \"bad\" is invalid: [",
    );
    let fields = cause_fields(&s);
    assert_eq!(
        fields,
        ["spec.replicas", "spec.version", "spec.storage.size"],
        "{s:#}"
    );
    for cause in s["details"]["causes"].as_array().unwrap() {
        assert_eq!(cause["reason"], "FieldValueInvalid", "{s:#}");
        let msg = cause["message"].as_str().unwrap();
        assert!(msg.starts_with("Invalid value: "), "{msg}");
        let field = cause["field"].as_str().unwrap();
        assert!(
            s["message"]
                .as_str()
                .unwrap()
                .contains(&format!("{field}: {msg}")),
            "{s:#}"
        );
    }
    assert_eq!(s["details"]["name"], "bad");
    assert_eq!(s["details"]["group"], "etcd.operator.dev");
    assert_eq!(s["details"]["kind"], "EtcdCluster");

    // Field paths are those of the version the client wrote.
    let v1 = json!({"apiVersion": "etcd.operator.dev/v1alpha1", "kind": "EtcdCluster",
                    "metadata": {"name": "old"}, "spec": {"size": 0, "version": "2.3.8"}});
    let r = api
        .post(
            &format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdclusters"),
            &v1,
        )
        .await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "EtcdCluster.etcd.operator.dev \"old\" is invalid",
    );
    assert_eq!(cause_fields(&s), ["spec.size", "spec.version"], "{s:#}");

    // Updates and patches are validated the same way.
    let mut update = existing.clone();
    update["spec"]["replicas"] = json!(0);
    update["spec"]["version"] = json!("4.0.0");
    let r = api.put(&obj(NS, "a"), &update).await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "EtcdCluster.etcd.operator.dev \"a\" is invalid",
    );
    assert_eq!(cause_fields(&s), ["spec.replicas", "spec.version"], "{s:#}");
    let r = api
        .patch(
            &obj(NS, "a"),
            MERGE,
            r#"{"spec":{"replicas":10,"storage":{"size":"-1Gi"}}}"#,
        )
        .await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "EtcdCluster.etcd.operator.dev \"a\" is invalid",
    );
    assert!(cause_fields(&s).contains(&"spec.replicas".to_string()), "{s:#}");
    let r = api
        .patch(
            &obj(NS, "a"),
            JSON_PATCH,
            r#"[{"op":"replace","path":"/spec/replicas","value":0}]"#,
        )
        .await;
    let s = assert_status(&r, 422, "Invalid", "spec.replicas");
    assert_eq!(cause_fields(&s), ["spec.replicas"]);
    // Version moves are update-only rules: no skipped minor, no downgrade 3.5 -> 3.4.
    let mut skip = old.clone();
    skip["spec"]["version"] = json!("3.6.0");
    let r = api.put(&obj(NS, "old"), &skip).await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "EtcdCluster.etcd.operator.dev \"old\" is invalid: spec.version: Invalid value: \"3.6.0\"",
    );
    assert_eq!(cause_fields(&s), ["spec.version"], "{s:#}");
    let mut older = existing.clone();
    older["spec"]["version"] = json!("3.4.23");
    let r = api.put(&obj(NS, "a"), &older).await;
    let s = assert_status(&r, 422, "Invalid", "spec.version: Invalid value: \"3.4.23\"");
    assert_eq!(cause_fields(&s), ["spec.version"], "{s:#}");
    // Immutable fields.
    let r = api
        .patch(
            &obj(NS, "a"),
            MERGE,
            r#"{"spec":{"storage":{"medium":"Memory"}}}"#,
        )
        .await;
    let s = assert_status(&r, 422, "Invalid", "field is immutable");
    assert_eq!(cause_fields(&s), ["spec.storage.medium"], "{s:#}");
    api.assert_unchanged(&before, "invalid writes").await;
}

// ---------------------------------------------------------------------------------------------
// resourceVersion values the server never returned

async fn resource_versions_that_are_not_numbers_are_invalid_input_not_conflicts(backing: Backing) {
    let api = Api::start(backing).await;
    let first = api.create("a").await;
    let before = api.stored().await;
    for uri in [
        format!("{}?resourceVersion=abc", obj(NS, "a")),
        format!("{}?resourceVersion=abc", coll(NS)),
        format!("{}?resourceVersion=-1", coll(NS)),
    ] {
        let r = api.get(&uri).await;
        assert_status(&r, 400, "BadRequest", "invalid value \"");
    }
    // A PUT or merge patch carrying one is refused as invalid (422), not as a conflict (409).
    let mut bad = first.clone();
    bad["metadata"]["resourceVersion"] = json!("abc");
    bad["spec"]["replicas"] = json!(5);
    let r = api.put(&obj(NS, "a"), &bad).await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "metadata.resourceVersion: Invalid value: \"abc\": must be a resourceVersion returned by the server",
    );
    assert_eq!(cause_fields(&s), ["metadata.resourceVersion"]);
    let r = api
        .patch(
            &obj(NS, "a"),
            MERGE,
            &json!({"metadata": {"resourceVersion": "abc"}, "spec": {"replicas": 5}}).to_string(),
        )
        .await;
    assert_status(&r, 422, "Invalid", "metadata.resourceVersion");
    // The scale subresource too, on replace and on patch.
    let scale = format!("{}/scale", obj(NS, "a"));
    let r = api
        .put(
            &scale,
            &json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": "a", "namespace": NS, "resourceVersion": "abc"},
                "spec": {"replicas": 5}}),
        )
        .await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "metadata.resourceVersion: Invalid value: \"abc\"",
    );
    assert_eq!(cause_fields(&s), ["metadata.resourceVersion"]);
    let r = api
        .patch(
            &scale,
            MERGE,
            r#"{"metadata":{"resourceVersion":"abc"},"spec":{"replicas":5}}"#,
        )
        .await;
    assert_status(&r, 422, "Invalid", "metadata.resourceVersion");
    assert_eq!(api.stored().await, before, "nothing was written");
    // The real one still works.
    let mut good = first.clone();
    good["spec"]["replicas"] = json!(5);
    api.put(&obj(NS, "a"), &good).await.expect(200);
}

// ---------------------------------------------------------------------------------------------
// Concurrency and existence

async fn conflicts_and_existing_names_are_409_and_missing_resource_versions_422(backing: Backing) {
    let api = Api::start(backing).await;
    let first = api.create("a").await;
    let r = api.post(&coll(NS), &cluster("a")).await;
    let s = assert_status(
        &r,
        409,
        "AlreadyExists",
        "etcdclusters.etcd.operator.dev \"a\" already exists",
    );
    assert_eq!(s["details"]["name"], "a");
    assert_eq!(s["details"]["kind"], "etcdclusters");

    // A newer version exists: writes with the first resourceVersion are stale.
    let mut newer = first.clone();
    newer["metadata"]["labels"] = json!({"x": "1"});
    api.put(&obj(NS, "a"), &newer).await.expect(200);
    let before = api.stored().await;

    let mut stale = first.clone();
    stale["spec"]["replicas"] = json!(5);
    let r = api.put(&obj(NS, "a"), &stale).await;
    let s = assert_status(
        &r,
        409,
        "Conflict",
        &format!("Operation cannot be fulfilled on etcdclusters.etcd.operator.dev \"a\": {MODIFIED}"),
    );
    assert_eq!(s["details"]["name"], "a");
    let rv = first["metadata"]["resourceVersion"].as_str().unwrap();
    let r = api
        .patch(
            &obj(NS, "a"),
            MERGE,
            &json!({"metadata": {"resourceVersion": rv}, "spec": {"replicas": 5}}).to_string(),
        )
        .await;
    assert_status(&r, 409, "Conflict", MODIFIED);
    let r = api.put(&format!("{}/status", obj(NS, "a")), &stale).await;
    assert_status(&r, 409, "Conflict", MODIFIED);
    let scale = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                       "metadata": {"name": "a", "namespace": NS, "resourceVersion": rv},
                       "spec": {"replicas": 5}});
    let r = api.put(&format!("{}/scale", obj(NS, "a")), &scale).await;
    assert_status(&r, 409, "Conflict", MODIFIED);

    // PUT must carry a resourceVersion (CRDs disallow unconditional updates).
    let mut unconditional = first.clone();
    unconditional["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    unconditional["spec"]["replicas"] = json!(5);
    let r = api.put(&obj(NS, "a"), &unconditional).await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "EtcdCluster.etcd.operator.dev \"a\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
    );
    assert_eq!(cause_fields(&s), ["metadata.resourceVersion"]);
    let r = api.put(&format!("{}/status", obj(NS, "a")), &unconditional).await;
    assert_status(&r, 422, "Invalid", "must be specified for an update");
    api.assert_unchanged(&before, "stale and unconditional writes")
        .await;
}

/// A create answers with the object a read of it right after returns: in the storage version
/// as JSON the very bytes (the server answers with what it wrote, not a second encoding), in
/// v1alpha1 converted, and as YAML.
async fn a_create_answers_with_the_object_a_get_returns(backing: Backing) {
    let api = Api::start(backing).await;
    let r = api.post(&coll(NS), &cluster("a")).await;
    r.expect(201);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let got = api.get(&obj(NS, "a")).await;
    got.expect(200);
    assert_eq!(
        std::str::from_utf8(&r.body).unwrap(),
        std::str::from_utf8(&got.body).unwrap()
    );
    assert_ne!(r.json()["metadata"]["resourceVersion"], Value::Null);

    let v1 = format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdclusters");
    let body = json!({"apiVersion": "etcd.operator.dev/v1alpha1", "kind": "EtcdCluster",
                      "metadata": {"name": "old"},
                      "spec": {"size": 3, "version": etcd_operator_api::versions::DEFAULT_ETCD_VERSION}});
    let r = api.post(&v1, &body).await;
    let created = r.expect(201);
    assert_eq!(created["apiVersion"], "etcd.operator.dev/v1alpha1", "{created:#}");
    assert_eq!(created["spec"]["size"], 3, "{created:#}");
    assert_eq!(created, api.get(&format!("{v1}/old")).await.expect(200));

    let r = api
        .call(
            Method::POST,
            &coll(NS),
            &[
                ("content-type", "application/json"),
                ("accept", "application/yaml"),
            ],
            cluster("y").to_string(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.header("content-type"), Some("application/yaml"));
    let yaml: Value = serde_yaml::from_slice(&r.body).unwrap();
    assert_eq!(yaml, api.get(&obj(NS, "y")).await.expect(200));
}

async fn missing_objects_are_404_for_every_verb(backing: Backing) {
    let api = Api::start(backing).await;
    api.create("a").await;
    let before = api.stored().await;
    let x = obj(NS, "x");
    let body = {
        let mut b = cluster("x");
        b["metadata"]["resourceVersion"] = json!("1");
        b
    };
    let scale = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                       "metadata": {"name": "x"}, "spec": {"replicas": 5}});
    let responses = [
        api.get(&x).await,
        api.get(&format!("{x}/status")).await,
        api.get(&format!("{x}/scale")).await,
        api.put(&x, &body).await,
        api.put(&format!("{x}/status"), &body).await,
        api.put(&format!("{x}/scale"), &scale).await,
        api.patch(&x, MERGE, r#"{"metadata":{"labels":{"a":"b"}}}"#).await,
        api.patch(
            &x,
            JSON_PATCH,
            r#"[{"op":"add","path":"/metadata/labels","value":{}}]"#,
        )
        .await,
        api.patch(&format!("{x}/status"), MERGE, r#"{"status":{}}"#).await,
        api.patch(&format!("{x}/scale"), MERGE, r#"{"spec":{"replicas":5}}"#)
            .await,
        api.delete(&x, None).await,
        api.delete(&format!("{x}?dryRun=All"), None).await,
        api.patch(&format!("{x}?dryRun=All"), MERGE, "{}").await,
        // Another namespace is another object.
        api.get(&obj("elsewhere", "a")).await,
    ];
    for (i, r) in responses.iter().enumerate() {
        let expected = if i == responses.len() - 1 {
            "etcdclusters.etcd.operator.dev \"a\" not found"
        } else {
            NOT_FOUND_X
        };
        let s = assert_status(r, 404, "NotFound", expected);
        assert_eq!(s["details"]["group"], "etcd.operator.dev", "{s:#}");
        assert_eq!(s["details"]["kind"], "etcdclusters", "{s:#}");
    }
    api.assert_unchanged(&before, "requests for missing objects")
        .await;
}

// ---------------------------------------------------------------------------------------------
// Transport-level refusals

/// A cluster with `n` labels `k000001: v` (valid, and no limit on their count), its body well
/// under the 3 MiB limit; stored with its `managedFields` (an entry per label) it is about 2.3
/// times as large.
fn labelled(name: &str, n: usize) -> Value {
    let mut c = cluster(name);
    c["metadata"]["labels"] = (0..n).map(|i| (format!("k{i:06}"), json!("v"))).collect();
    c
}

/// Objects the body limit lets through but the backing etcd refuses as larger than its
/// `--max-request-bytes` (1.5 MiB by default, as the tests run it) are 413, as the body limit's,
/// not 500: etcd's own refusal (`request is too large`) and gRPC's, above the limit plus
/// 512 KiB. Nothing is stored. Only etcd has the limit.
#[tokio::test]
async fn objects_larger_than_the_backing_etcd_stores_are_413() {
    let api = Api::start(Backing::Etcd).await;
    let existing = api.create("a").await;
    let before = api.stored().await;
    // A label is 14 bytes of JSON and 15 of managedFields: about 1.7 MB stored (etcd's own
    // check), and about 2.3 MB (over gRPC's limit, 2 MiB).
    for (n, etcd_says) in [
        (58_000, "etcdserver: request is too large"),
        (80_000, "grpc: received message larger than max"),
    ] {
        let body = labelled("big", n);
        assert!(body.to_string().len() < 3 * 1024 * 1024);
        let r = api.post(&coll(NS), &body).await;
        let status = assert_status(
            &r,
            413,
            "RequestEntityTooLarge",
            "Request entity too large: the object as stored is larger than the backing etcd accepts",
        );
        let message = status["message"].as_str().unwrap_or_default();
        assert!(message.contains("--max-request-bytes"), "{message}");
        assert!(message.contains(etcd_says), "{message}");
        // Growing an existing object over the limit is refused the same way.
        let labels: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("k{i:06}"), json!("v"))).collect();
        let patch = json!({"metadata": {"labels": labels}}).to_string();
        let r = api.patch(&obj(NS, "a"), MERGE, &patch).await;
        assert_status(
            &r,
            413,
            "RequestEntityTooLarge",
            "larger than the backing etcd accepts",
        );
        let mut put = existing.clone();
        put["metadata"]["labels"] = labelled("a", n)["metadata"]["labels"].clone();
        let r = api.put(&obj(NS, "a"), &put).await;
        assert_status(
            &r,
            413,
            "RequestEntityTooLarge",
            "larger than the backing etcd accepts",
        );
    }
    api.assert_unchanged(&before, "objects etcd refused").await;
    // Below the limit, such an object is stored.
    api.post(&coll(NS), &labelled("fits", 8_000)).await.expect(201);
}

async fn bodies_over_3_mib_are_413(backing: Backing) {
    let api = Api::start(backing).await;
    let existing = api.create("a").await;
    let before = api.stored().await;
    let mut big = cluster("big");
    big["metadata"]["annotations"] = json!({"blob": "x".repeat(3 * 1024 * 1024)});
    let big = big.to_string();
    let message = "Request entity too large: limit is 3145728";
    let r = api
        .call(
            Method::POST,
            &coll(NS),
            &[("content-type", "application/json")],
            big.clone(),
        )
        .await;
    assert_status(&r, 413, "RequestEntityTooLarge", message);
    let mut big_put = existing.clone();
    big_put["metadata"]["annotations"] = json!({"blob": "x".repeat(3 * 1024 * 1024)});
    let r = api.put(&obj(NS, "a"), &big_put).await;
    assert_status(&r, 413, "RequestEntityTooLarge", message);
    let patch = json!({"metadata": {"annotations": {"blob": "x".repeat(3 * 1024 * 1024)}}}).to_string();
    let r = api.patch(&obj(NS, "a"), MERGE, &patch).await;
    assert_status(&r, 413, "RequestEntityTooLarge", message);
    let r = api
        .call(
            Method::DELETE,
            &obj(NS, "a"),
            &[("content-type", "application/json")],
            " ".repeat(3 * 1024 * 1024 + 1),
        )
        .await;
    assert_status(&r, 413, "RequestEntityTooLarge", message);
    // Exactly at the limit is read (and then judged on its content).
    let mut at_limit = " ".repeat(3 * 1024 * 1024 - 2);
    at_limit.push_str("{}");
    let r = api
        .call(
            Method::POST,
            &coll(NS),
            &[("content-type", "application/json")],
            at_limit,
        )
        .await;
    assert_status(&r, 400, "BadRequest", "apiVersion");
    api.assert_unchanged(&before, "oversized bodies").await;
}

async fn unsupported_content_types_are_415_and_unsatisfiable_accepts_406(backing: Backing) {
    let api = Api::start(backing).await;
    api.create("a").await;
    let before = api.stored().await;
    for content_type in ["application/apply-patch+cbor", "text/plain", "application/json"] {
        let r = api
            .patch(&obj(NS, "a"), content_type, r#"{"spec":{"replicas":5}}"#)
            .await;
        let s = assert_status(
            &r,
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json",
        );
        assert!(s["message"].as_str().unwrap().contains(content_type), "{s}");
    }
    let r = api
        .call(Method::PATCH, &obj(NS, "a"), &[], r#"{"spec":{"replicas":5}}"#)
        .await;
    assert_status(&r, 415, "UnsupportedMediaType", "unknown format");
    for (method, uri) in [(Method::POST, coll(NS)), (Method::PUT, obj(NS, "a"))] {
        for content_type in [
            "text/plain",
            "application/xml",
            "application/vnd.kubernetes.protobuf",
        ] {
            let r = api
                .call(
                    method.clone(),
                    &uri,
                    &[("content-type", content_type)],
                    cluster("b").to_string(),
                )
                .await;
            let s = assert_status(
                &r,
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
            );
            assert!(s["message"].as_str().unwrap().contains(content_type), "{s}");
        }
    }
    for accept in [
        "application/vnd.kubernetes.protobuf",
        "text/html",
        "application/json;as=Table;v=v2;g=meta.k8s.io",
        "application/json;as=Scale;v=v1;g=autoscaling",
    ] {
        for r in [
            api.get_accept(&obj(NS, "a"), accept).await,
            api.get_accept(&coll(NS), accept).await,
            api.call(
                Method::POST,
                &coll(NS),
                &[("accept", accept), ("content-type", "application/json")],
                cluster("b").to_string(),
            )
            .await,
        ] {
            let s = assert_status(
                &r,
                406,
                "NotAcceptable",
                "only the following media types are accepted",
            );
            assert!(s["message"].as_str().unwrap().contains(accept), "{s}");
        }
    }
    api.assert_unchanged(&before, "unsupported media types").await;
}

async fn unknown_paths_are_404_and_wrong_methods_405(backing: Backing) {
    let api = Api::start(backing).await;
    api.create("a").await;
    let before = api.stored().await;
    for path in [
        format!("{GROUP_PATH}/v9"),
        format!("{GROUP_PATH}/v9/namespaces/{NS}/etcdclusters"),
        format!("{GROUP_PATH}/v1alpha2/namespaces/{NS}/widgets"),
        format!("{GROUP_PATH}/v1alpha2/namespaces/{NS}/etcdclusters/a/bogus"),
        format!("{GROUP_PATH}/v1alpha2/widgets"),
        format!("/apis/other.example.com/v1/namespaces/{NS}/etcdclusters"),
        "/api/v1/namespaces".to_string(),
        "/nothing/here".to_string(),
        format!("/openapi/v3/apis/{}/v9", "etcd.operator.dev"),
    ] {
        let r = api.get(&path).await;
        assert_status(
            &r,
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
    }
    let r = api
        .post(
            &format!("{GROUP_PATH}/v9/namespaces/{NS}/etcdclusters"),
            &cluster("b"),
        )
        .await;
    assert_status(&r, 404, "NotFound", "could not find the requested resource");
    // Creating on an object path, or deleting every namespace's objects, is not a verb here.
    let r = api.post(&obj(NS, "a"), &cluster("a")).await;
    assert_status(&r, 405, "MethodNotAllowed", "does not allow this method");
    let r = api
        .delete(&format!("{GROUP_PATH}/v1alpha2/etcdclusters"), None)
        .await;
    assert_status(&r, 405, "MethodNotAllowed", "does not allow this method");
    let r = api.put(&coll(NS), &cluster("a")).await;
    assert_status(&r, 405, "MethodNotAllowed", "does not allow this method");
    api.assert_unchanged(&before, "unknown paths").await;
}

// ---------------------------------------------------------------------------------------------
// Options: fieldValidation, dryRun

async fn unknown_fields_follow_field_validation(backing: Backing) {
    let api = Api::start(backing).await;
    let before = api.stored().await;
    let mut bogus = cluster("strict");
    bogus["spec"]["bogus"] = json!(1);
    let r = api
        .post(&format!("{}?fieldValidation=Strict", coll(NS)), &bogus)
        .await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "strict decoding error: unknown field \"spec.bogus\"",
    );
    let mut two = bogus.clone();
    two["metadata"]["bogus"] = json!("x");
    let r = api
        .post(&format!("{}?fieldValidation=Strict", coll(NS)), &two)
        .await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "strict decoding error: unknown field \"metadata.bogus\", unknown field \"spec.bogus\"",
    );
    let r = api
        .post(&format!("{}?fieldValidation=Loose", coll(NS)), &cluster("loose"))
        .await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Loose\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"",
    );
    assert_eq!(cause_fields(&s), ["fieldValidation"]);
    assert_eq!(s["details"]["group"], "meta.k8s.io");
    assert_eq!(s["details"]["kind"], "CreateOptions");
    api.assert_unchanged(&before, "strict decoding").await;

    // Warn is the default: stored without the field, with a Warning header.
    let expected_warning = "299 - \"unknown field \\\"spec.bogus\\\"\"";
    for (name, query) in [("warn-default", ""), ("warn", "?fieldValidation=Warn")] {
        let mut b = bogus.clone();
        b["metadata"]["name"] = json!(name);
        let r = api.post(&format!("{}{query}", coll(NS)), &b).await;
        let created = r.expect(201);
        assert_eq!(r.warnings(), [expected_warning], "{name}");
        assert!(created["spec"].get("bogus").is_none());
        let got = api.get(&obj(NS, name)).await.expect(200);
        assert!(got["spec"].get("bogus").is_none());
    }
    let mut b = bogus.clone();
    b["metadata"]["name"] = json!("ignore");
    let r = api
        .post(&format!("{}?fieldValidation=Ignore", coll(NS)), &b)
        .await;
    r.expect(201);
    assert!(r.warnings().is_empty(), "{:?}", r.warnings());

    // Updates and patches too.
    let current = api.get(&obj(NS, "ignore")).await.expect(200);
    let before = api.stored().await;
    let mut put = current.clone();
    put["spec"]["bogus"] = json!(true);
    let r = api
        .put(&format!("{}?fieldValidation=Strict", obj(NS, "ignore")), &put)
        .await;
    assert_status(&r, 400, "BadRequest", "unknown field \"spec.bogus\"");
    let r = api
        .patch(
            &format!("{}?fieldValidation=Strict", obj(NS, "ignore")),
            MERGE,
            r#"{"spec":{"bogus":true,"replicas":5}}"#,
        )
        .await;
    assert_status(&r, 400, "BadRequest", "unknown field \"spec.bogus\"");
    api.assert_unchanged(&before, "strict update and patch").await;
    let r = api
        .patch(
            &obj(NS, "ignore"),
            MERGE,
            r#"{"spec":{"bogus":true,"replicas":5}}"#,
        )
        .await;
    let patched = r.expect(200);
    assert_eq!(r.warnings(), [expected_warning]);
    assert_eq!(patched["spec"]["replicas"], 5);
}

async fn dry_run_stores_nothing(backing: Backing) {
    let api = Api::start(backing).await;
    let existing = api.create("a").await;
    let before = api.stored().await;

    let r = api
        .post(&format!("{}?dryRun=All", coll(NS)), &cluster("dry"))
        .await;
    let created = r.expect(201);
    let meta = &created["metadata"];
    assert_eq!(meta["name"], "dry");
    assert_eq!(meta["namespace"], NS);
    assert_eq!(meta["uid"].as_str().map(str::len), Some(36), "{created:#}");
    assert!(meta["creationTimestamp"].is_string(), "{created:#}");
    assert_eq!(meta["generation"], 1);
    assert!(
        meta["resourceVersion"].is_null() || meta["resourceVersion"] == "",
        "{created:#}"
    );
    // A dry-run create of an existing name still conflicts, and of an invalid object is 422.
    let r = api.post(&format!("{}?dryRun=All", coll(NS)), &cluster("a")).await;
    assert_status(
        &r,
        409,
        "AlreadyExists",
        "etcdclusters.etcd.operator.dev \"a\" already exists",
    );
    let mut bad = cluster("bad");
    bad["spec"]["replicas"] = json!(0);
    let r = api.post(&format!("{}?dryRun=All", coll(NS)), &bad).await;
    assert_status(&r, 422, "Invalid", "spec.replicas");

    let mut update = existing.clone();
    update["spec"]["replicas"] = json!(5);
    let r = api.put(&format!("{}?dryRun=All", obj(NS, "a")), &update).await;
    let updated = r.expect(200);
    assert_eq!(updated["spec"]["replicas"], 5);
    assert_eq!(updated["metadata"]["generation"], 2);

    let r = api
        .patch(
            &format!("{}?dryRun=All", obj(NS, "a")),
            MERGE,
            r#"{"spec":{"replicas":7}}"#,
        )
        .await;
    assert_eq!(r.expect(200)["spec"]["replicas"], 7);
    let r = api
        .patch(
            &format!("{}/scale?dryRun=All", obj(NS, "a")),
            MERGE,
            r#"{"spec":{"replicas":7}}"#,
        )
        .await;
    assert_eq!(r.expect(200)["spec"]["replicas"], 7);

    api.delete(&format!("{}?dryRun=All", obj(NS, "a")), None)
        .await
        .expect(200);
    api.delete(
        &obj(NS, "a"),
        Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]})),
    )
    .await
    .expect(200);
    api.delete(&format!("{}?dryRun=All", coll(NS)), None)
        .await
        .expect(200);
    api.assert_unchanged(&before, "dry runs").await;

    // Only `All` is a dry-run value: anything else is refused, as kube-apiserver's option
    // validation does, before anything happens.
    let unsupported = "dryRun: Unsupported value: []string{\"Some\"}: supported values: \"All\"";
    let r = api
        .post(&format!("{}?dryRun=Some", coll(NS)), &cluster("dry"))
        .await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        &format!("CreateOptions.meta.k8s.io \"\" is invalid: {unsupported}"),
    );
    assert_eq!(cause_fields(&s), ["dryRun"]);
    let r = api.put(&format!("{}?dryRun=Some", obj(NS, "a")), &update).await;
    assert_status(
        &r,
        422,
        "Invalid",
        &format!("UpdateOptions.meta.k8s.io \"\" is invalid: {unsupported}"),
    );
    let r = api
        .patch(
            &format!("{}?dryRun=Some", obj(NS, "a")),
            MERGE,
            r#"{"spec":{"replicas":7}}"#,
        )
        .await;
    assert_status(
        &r,
        422,
        "Invalid",
        &format!("PatchOptions.meta.k8s.io \"\" is invalid: {unsupported}"),
    );
    let r = api.delete(&format!("{}?dryRun=Some", obj(NS, "a")), None).await;
    assert_status(
        &r,
        422,
        "Invalid",
        &format!("DeleteOptions.meta.k8s.io \"\" is invalid: {unsupported}"),
    );
    let r = api
        .delete(
            &obj(NS, "a"),
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["Some"]})),
        )
        .await;
    assert_status(
        &r,
        422,
        "Invalid",
        "DeleteOptions.meta.k8s.io \"\" is invalid: dryRun",
    );
    let r = api.delete(&format!("{}?dryRun=Some", coll(NS)), None).await;
    assert_status(
        &r,
        422,
        "Invalid",
        "DeleteOptions.meta.k8s.io \"\" is invalid: dryRun",
    );
    api.assert_unchanged(&before, "invalid dryRun values").await;
}

// ---------------------------------------------------------------------------------------------
// List and watch options

async fn bad_selectors_are_400(backing: Backing) {
    let api = Api::start(backing).await;
    for (name, tier) in [("a", "x"), ("b", "y")] {
        let mut b = cluster(name);
        b["metadata"]["labels"] = json!({"tier": tier});
        api.create_in(NS, &b).await;
    }
    let before = api.stored().await;
    for selector in ["tier in (x", "tier=x=y", "!", "bad key=x", "tier=in valid"] {
        let q = format!("labelSelector={}", urlencode(selector));
        for uri in [
            format!("{}?{q}", coll(NS)),
            format!("{}?watch=true&{q}", coll(NS)),
            format!("{GROUP_PATH}/v1alpha2/etcdclusters?{q}"),
        ] {
            let r = api.get(&uri).await;
            assert_status(&r, 400, "BadRequest", "unable to parse requirement");
        }
        let r = api.delete(&format!("{}?{q}", coll(NS)), None).await;
        assert_status(&r, 400, "BadRequest", "unable to parse requirement");
    }
    for (selector, message) in [
        ("spec.replicas=3", "field label not supported: spec.replicas"),
        ("status.phase!=Running", "field label not supported: status.phase"),
        ("metadata.labels=x", "field label not supported: metadata.labels"),
    ] {
        let q = format!("fieldSelector={}", urlencode(selector));
        for uri in [format!("{}?{q}", coll(NS)), format!("{}?watch=1&{q}", coll(NS))] {
            let r = api.get(&uri).await;
            assert_status(&r, 400, "BadRequest", message);
        }
        let r = api.delete(&format!("{}?{q}", coll(NS)), None).await;
        assert_status(&r, 400, "BadRequest", message);
    }
    api.assert_unchanged(&before, "bad selectors").await;
    // The supported ones select.
    let r = api
        .get(&format!("{}?labelSelector=tier%3Dx", coll(NS)))
        .await
        .expect(200);
    assert_eq!(r["items"].as_array().unwrap().len(), 1);
    let r = api
        .get(&format!(
            "{}?fieldSelector=metadata.name%3Db,metadata.namespace%3D{NS}",
            coll(NS)
        ))
        .await
        .expect(200);
    assert_eq!(r["items"][0]["metadata"]["name"], "b");
    assert_eq!(r["items"].as_array().unwrap().len(), 1);
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn list_and_watch_options_kube_apiserver_forbids_are_422(backing: Backing) {
    let api = Api::start(backing).await;
    api.create("a").await;
    let list_options = |r: &Resp, message: &str, field: &str| {
        let s = assert_status(
            r,
            422,
            "Invalid",
            &format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
        );
        assert_eq!(s["details"]["group"], "meta.k8s.io", "{s:#}");
        assert_eq!(s["details"]["kind"], "ListOptions", "{s:#}");
        assert!(cause_fields(&s).contains(&field.to_string()), "{s:#}");
    };
    let r = api.get(&format!("{}?sendInitialEvents=true", coll(NS))).await;
    list_options(
        &r,
        "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        "sendInitialEvents",
    );
    let r = api
        .get(&format!("{}?sendInitialEvents=false&limit=1", coll(NS)))
        .await;
    list_options(
        &r,
        "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        "sendInitialEvents",
    );
    let r = api
        .get(&format!("{}?resourceVersionMatch=NotOlderThan", coll(NS)))
        .await;
    list_options(
        &r,
        "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        "resourceVersionMatch",
    );
    let r = api
        .get(&format!(
            "{}?resourceVersion=0&resourceVersionMatch=Exact",
            coll(NS)
        ))
        .await;
    list_options(
        &r,
        "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        "resourceVersionMatch",
    );
    let r = api
        .get(&format!(
            "{}?resourceVersion=1&resourceVersionMatch=Newest",
            coll(NS)
        ))
        .await;
    list_options(
        &r,
        "resourceVersionMatch: Unsupported value: \"Newest\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
        "resourceVersionMatch",
    );
    // A watch-list needs resourceVersionMatch=NotOlderThan.
    let r = api
        .get(&format!(
            "{}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
            coll(NS)
        ))
        .await;
    list_options(
        &r,
        "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        "resourceVersionMatch",
    );
    let r = api
        .get(&format!(
            "{}?watch=true&resourceVersionMatch=NotOlderThan&resourceVersion=1",
            coll(NS)
        ))
        .await;
    list_options(
        &r,
        "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        "resourceVersionMatch",
    );
    let r = api
        .get(&format!(
            "{}?watch=true&sendInitialEvents=true&resourceVersionMatch=Exact&allowWatchBookmarks=true",
            coll(NS)
        ))
        .await;
    list_options(
        &r,
        "[resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]",
        "resourceVersionMatch",
    );

    // Malformed values are 400.
    for (query, message) in [
        ("continue=not-a-token", "invalid continue token"),
        ("limit=2&continue=%25%25%25", "invalid continue token"),
        ("limit=ten", "limit"),
        ("resourceVersion=abc", "resourceVersion"),
        ("watch=true&resourceVersion=abc", "resourceVersion"),
        ("watch=true&timeoutSeconds=soon", "timeoutSeconds"),
        ("includeObject=Everything", "includeObject"),
    ] {
        let r = api.get_accept(&format!("{}?{query}", coll(NS)), TABLE).await;
        assert_status(&r, 400, "BadRequest", message);
    }
    // A continue token whose start key escapes the resource prefix.
    let escaping =
        base64_url(&json!({"v": "meta.k8s.io/v1", "rv": 1, "start": "../../secrets/x\u{0}"}).to_string());
    let r = api
        .get(&format!("{}?limit=1&continue={escaping}", coll(NS)))
        .await;
    assert_status(&r, 400, "BadRequest", "invalid continue token");
}

fn base64_url(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

// ---------------------------------------------------------------------------------------------
// Patches

async fn failing_and_malformed_patches_change_nothing(backing: Backing) {
    let api = Api::start(backing).await;
    api.create("a").await;
    let before = api.stored().await;
    let r = api
        .patch(
            &obj(NS, "a"),
            JSON_PATCH,
            r#"[{"op":"test","path":"/spec/replicas","value":9},{"op":"replace","path":"/spec/replicas","value":5}]"#,
        )
        .await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "EtcdCluster.etcd.operator.dev \"a\" is invalid",
    );
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("failed at path '/spec/replicas'"),
        "{s:#}"
    );
    let r = api
        .patch(
            &obj(NS, "a"),
            JSON_PATCH,
            r#"[{"op":"remove","path":"/spec/nothing"}]"#,
        )
        .await;
    assert_status(&r, 422, "Invalid", "could not be applied");
    for (content_type, body, message) in [
        (JSON_PATCH, "not json", "invalid JSON patch"),
        (JSON_PATCH, r#"{"op":"add"}"#, "invalid JSON patch"),
        (
            JSON_PATCH,
            r#"[{"op":"frobnicate","path":"/spec"}]"#,
            "invalid JSON patch",
        ),
        (JSON_PATCH, r#"[{"op":"add","value":1}]"#, "invalid JSON patch"),
        (MERGE, "{\"spec\":", "invalid merge patch"),
        (MERGE, "[1]", "a merge patch must be a JSON object"),
    ] {
        let r = api.patch(&obj(NS, "a"), content_type, body).await;
        assert_status(&r, 400, "BadRequest", message);
    }
    // A patch cannot rename, move, or retype the object.
    let r = api
        .patch(&obj(NS, "a"), MERGE, r#"{"metadata":{"name":"b"}}"#)
        .await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "the name of the object (b) does not match the name on the URL (a)",
    );
    let r = api
        .patch(&obj(NS, "a"), MERGE, r#"{"metadata":{"namespace":"other"}}"#)
        .await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "does not match the namespace sent on the request",
    );
    let r = api.patch(&obj(NS, "a"), MERGE, r#"{"kind":"Pod"}"#).await;
    assert_status(&r, 400, "BadRequest", "kind");
    let r = api
        .patch(
            &obj(NS, "a"),
            MERGE,
            r#"{"apiVersion":"etcd.operator.dev/v1alpha1"}"#,
        )
        .await;
    assert_status(&r, 400, "BadRequest", "API version");
    let r = api
        .patch(
            &obj(NS, "a"),
            JSON_PATCH,
            r#"[{"op":"test","path":"/metadata/resourceVersion","value":"1"}]"#,
        )
        .await;
    assert_status(&r, 422, "Invalid", "failed at path '/metadata/resourceVersion'");
    api.assert_unchanged(&before, "failing patches").await;
}

// ---------------------------------------------------------------------------------------------
// Deletion

async fn delete_preconditions_that_do_not_match_are_409_and_delete_nothing(backing: Backing) {
    let api = Api::start(backing).await;
    let a = api.create("a").await;
    let uid = a["metadata"]["uid"].as_str().unwrap();
    let rv = a["metadata"]["resourceVersion"].as_str().unwrap();
    let before = api.stored().await;
    let r = api
        .delete(
            &obj(NS, "a"),
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1",
                          "preconditions": {"uid": "0f4b5c52-0000-0000-0000-000000000000"}})),
        )
        .await;
    let s = assert_status(
        &r,
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on etcdclusters.etcd.operator.dev \"a\": Precondition failed: UID in precondition: 0f4b5c52-0000-0000-0000-000000000000, UID in object meta: {uid}"
        ),
    );
    assert_eq!(s["details"]["name"], "a");
    let r = api
        .delete(
            &obj(NS, "a"),
            Some(&json!({"preconditions": {"resourceVersion": "1"}})),
        )
        .await;
    assert_status(
        &r,
        409,
        "Conflict",
        &format!(
            "Precondition failed: ResourceVersion in precondition: 1, ResourceVersion in object meta: {rv}"
        ),
    );
    // The same preconditions hold on deletecollection.
    let r = api
        .delete(
            &coll(NS),
            Some(&json!({"preconditions": {"uid": "0f4b5c52-0000-0000-0000-000000000000"}})),
        )
        .await;
    assert_status(&r, 409, "Conflict", "Precondition failed: UID in precondition");
    // Malformed or unsupported DeleteOptions.
    let r = api
        .call(
            Method::DELETE,
            &obj(NS, "a"),
            &[("content-type", "application/json")],
            "{\"preconditions\":",
        )
        .await;
    assert_status(&r, 400, "BadRequest", "DeleteOptions");
    let r = api
        .delete(&obj(NS, "a"), Some(&json!({"propagationPolicy": "Sideways"})))
        .await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Sideways\"",
    );
    assert_eq!(cause_fields(&s), ["propagationPolicy"]);
    let r = api
        .delete(&format!("{}?propagationPolicy=Sideways", obj(NS, "a")), None)
        .await;
    assert_status(
        &r,
        422,
        "Invalid",
        "propagationPolicy: Unsupported value: \"Sideways\"",
    );
    api.assert_unchanged(&before, "failed preconditions").await;

    // Matching preconditions delete.
    api.delete(
        &obj(NS, "a"),
        Some(&json!({"preconditions": {"uid": uid, "resourceVersion": rv}})),
    )
    .await
    .expect(200);
    assert_status(&api.get(&obj(NS, "a")).await, 404, "NotFound", "\"a\" not found");
}

async fn finalizers_hold_deletion_until_the_last_one_is_removed(backing: Backing) {
    let api = Api::start(backing).await;
    let mut b = cluster("held");
    b["metadata"]["finalizers"] = json!(["example.com/hold"]);
    api.create_in(NS, &b).await;

    let r = api.delete(&obj(NS, "held"), None).await;
    let deleting = r.expect(200);
    assert!(
        deleting["metadata"]["deletionTimestamp"].is_string(),
        "{deleting:#}"
    );
    assert_eq!(deleting["metadata"]["deletionGracePeriodSeconds"], 0);
    let got = api.get(&obj(NS, "held")).await.expect(200);
    assert_eq!(
        got["metadata"]["deletionTimestamp"],
        deleting["metadata"]["deletionTimestamp"]
    );
    assert_eq!(got["metadata"]["finalizers"], json!(["example.com/hold"]));
    let before = api.stored().await;

    // Deleting again changes nothing.
    api.delete(&obj(NS, "held"), None).await.expect(200);
    api.assert_unchanged(&before, "a second delete").await;

    // No new finalizers while deleting, by PUT or by patch.
    let mut more = got.clone();
    more["metadata"]["finalizers"] = json!(["example.com/hold", "example.com/more"]);
    let r = api.put(&obj(NS, "held"), &more).await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"example.com/more\"}",
    );
    assert_eq!(cause_fields(&s), ["metadata.finalizers"]);
    let r = api
        .patch(
            &obj(NS, "held"),
            JSON_PATCH,
            r#"[{"op":"add","path":"/metadata/finalizers/-","value":"example.com/more"}]"#,
        )
        .await;
    assert_status(&r, 422, "Invalid", "no new finalizers can be added");
    // deletionTimestamp cannot be taken back.
    let mut undelete = got.clone();
    undelete["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("deletionTimestamp");
    let r = api.put(&obj(NS, "held"), &undelete).await;
    assert_eq!(r.expect(200), got);
    api.assert_unchanged(&before, "an update without deletionTimestamp")
        .await;

    // Other updates are allowed while deleting and keep the deletion mark.
    let labelled = api
        .patch(&obj(NS, "held"), MERGE, r#"{"metadata":{"labels":{"a":"b"}}}"#)
        .await
        .expect(200);
    assert_eq!(
        labelled["metadata"]["deletionTimestamp"],
        got["metadata"]["deletionTimestamp"]
    );

    // Removing the last finalizer deletes the object.
    let r = api
        .patch(&obj(NS, "held"), MERGE, r#"{"metadata":{"finalizers":null}}"#)
        .await;
    r.expect(200);
    assert_status(
        &api.get(&obj(NS, "held")).await,
        404,
        "NotFound",
        "\"held\" not found",
    );
    assert!(api.stored().await.keys.is_empty());

    // Foreground propagation holds the object with its finalizer, for the garbage collector.
    api.create("fg").await;
    let fg = api
        .delete(
            &obj(NS, "fg"),
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"})),
        )
        .await
        .expect(200);
    assert_eq!(fg["metadata"]["finalizers"], json!(["foregroundDeletion"]));
    assert!(fg["metadata"]["deletionTimestamp"].is_string());
}

/// With the controller in the process, a new cluster in a namespace it manages carries its
/// cleanup finalizer from the create on (the controller need not write it), owned by no field
/// manager, as kube-apiserver's create strategies set fields; elsewhere, on other resources,
/// and on a server without the controller, nothing is added. Deletion still completes.
async fn the_controllers_finalizer_is_added_at_create_only_where_it_manages(backing: Backing) {
    const CLEANUP: &str = "etcd.operator.dev/cleanup";
    let api = Api::start_with_controller_init(
        backing,
        Arc::new([ControllerInit::cluster_cleanup(vec![NS.to_string()])]),
    )
    .await;
    let created = api.create("a").await;
    assert_eq!(created["metadata"]["finalizers"], json!([CLEANUP]), "{created:#}");
    let got = api.get(&obj(NS, "a")).await.expect(200);
    assert_eq!(got["metadata"]["finalizers"], json!([CLEANUP]));
    let entries = got["metadata"]["managedFields"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{got:#}");
    assert!(
        entries[0]["fieldsV1"]["f:metadata"].get("f:finalizers").is_none(),
        "the client does not own the server's finalizer: {got:#}"
    );
    // The client's own finalizers come first and are kept.
    let mut held = cluster("held");
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    let held = api.create_in(NS, &held).await;
    assert_eq!(
        held["metadata"]["finalizers"],
        json!(["example.com/hold", CLEANUP])
    );
    // v1alpha1 creates get it too.
    let v1 = json!({"apiVersion": "etcd.operator.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "old"}, "spec": {"size": 3}});
    let r = api
        .post(
            &format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdclusters"),
            &v1,
        )
        .await
        .expect(201);
    assert_eq!(r["metadata"]["finalizers"], json!([CLEANUP]));
    // A dry-run create shows it and stores nothing.
    let before = api.stored().await;
    let dry = api
        .post(&format!("{}?dryRun=All", coll(NS)), &cluster("dry"))
        .await
        .expect(201);
    assert_eq!(dry["metadata"]["finalizers"], json!([CLEANUP]));
    api.assert_unchanged(&before, "a dry-run create").await;
    // Server-side apply creates get it, and applying the same configuration again (which does
    // not list it) keeps it: the applier does not own it.
    let config = r#"{"apiVersion":"etcd.operator.dev/v1alpha2","kind":"EtcdCluster","metadata":{"name":"applied"},"spec":{"replicas":3}}"#;
    let uri = format!("{}?fieldManager=t", obj(NS, "applied"));
    let applied = api.patch(&uri, APPLY, config).await.expect(201);
    assert_eq!(applied["metadata"]["finalizers"], json!([CLEANUP]), "{applied:#}");
    let again = api
        .patch(&uri, APPLY, &config.replace("\"replicas\":3", "\"replicas\":5"))
        .await
        .expect(200);
    assert_eq!(again["spec"]["replicas"], 5);
    assert_eq!(again["metadata"]["finalizers"], json!([CLEANUP]), "{again:#}");
    // Namespaces the controller does not manage, and other resources, get nothing.
    let elsewhere = api.create_in("elsewhere", &cluster("a")).await;
    assert!(elsewhere["metadata"].get("finalizers").is_none(), "{elsewhere:#}");
    let backup = api
        .post(
            &backups(NS),
            &json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdBackup",
                "metadata": {"name": "b"}, "spec": {"clusterName": "a"}}),
        )
        .await
        .expect(201);
    assert!(backup["metadata"].get("finalizers").is_none(), "{backup:#}");

    // A delete waits for the controller's cleanup, which then removes the finalizer.
    let deleting = api.delete(&obj(NS, "a"), None).await.expect(200);
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    api.patch(
        &obj(NS, "a"),
        JSON_PATCH,
        &format!(r#"[{{"op":"test","path":"/metadata/finalizers","value":["{CLEANUP}"]}},{{"op":"remove","path":"/metadata/finalizers/0"}}]"#),
    )
    .await
    .expect(200);
    assert_status(&api.get(&obj(NS, "a")).await, 404, "NotFound", "\"a\" not found");

    // Without a controller in the process: no finalizer, and a delete is immediate.
    let plain = Api::start(backing).await;
    let created = plain.create("a").await;
    assert!(created["metadata"].get("finalizers").is_none(), "{created:#}");
    plain.delete(&obj(NS, "a"), None).await.expect(200);
    assert_status(
        &plain.get(&obj(NS, "a")).await,
        404,
        "NotFound",
        "\"a\" not found",
    );
}

async fn deletecollection_deletes_exactly_the_selected_objects(backing: Backing) {
    let api = Api::start(backing).await;
    for (ns, name, tier) in [
        (NS, "a", Some("x")),
        (NS, "b", Some("x")),
        (NS, "c", Some("y")),
        (NS, "d", None),
        ("team-b", "e", Some("x")),
    ] {
        let mut b = cluster(name);
        if let Some(t) = tier {
            b["metadata"]["labels"] = json!({"tier": t});
        }
        api.create_in(ns, &b).await;
    }
    let mut held = cluster("f");
    held["metadata"]["labels"] = json!({"tier": "x"});
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    api.create_in(NS, &held).await;

    let r = api
        .delete(&format!("{}?labelSelector=tier%3Dx", coll(NS)), None)
        .await;
    let list = r.expect(200);
    assert_eq!(list["kind"], "EtcdClusterList");
    let deleted: BTreeSet<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(deleted, BTreeSet::from(["a", "b", "f"]));
    assert_eq!(
        api.names(NS).await,
        BTreeSet::from(["c".to_string(), "d".to_string(), "f".to_string()])
    );
    let f = api.get(&obj(NS, "f")).await.expect(200);
    assert!(f["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(api.names("team-b").await, BTreeSet::from(["e".to_string()]));

    // A field selector narrows the same way; nothing matching deletes nothing.
    let before = api.stored().await;
    let r = api
        .delete(&format!("{}?labelSelector=tier%3Dnone", coll(NS)), None)
        .await;
    assert_eq!(r.expect(200)["items"], json!([]));
    api.assert_unchanged(&before, "an empty deletecollection").await;
    api.delete(&format!("{}?fieldSelector=metadata.name%3Dc", coll(NS)), None)
        .await
        .expect(200);
    assert_eq!(
        api.names(NS).await,
        BTreeSet::from(["d".to_string(), "f".to_string()])
    );
}

// ---------------------------------------------------------------------------------------------
// Subresources, generation, no-op writes, generateName

async fn status_writes_change_only_status_and_main_writes_ignore_status(backing: Backing) {
    let api = Api::start(backing).await;
    let mut b = cluster("a");
    b["status"] = json!({"replicas": 9, "phase": "Running"});
    let created = api.create_in(NS, &b).await;
    // The request's status is dropped; the server's says no generation was observed yet (so
    // kstatus, Flux's health checks, see the new object in progress).
    assert_eq!(
        created["status"],
        json!({"observedGeneration": 0}),
        "status is dropped on create: {created:#}"
    );

    let mut with_status = created.clone();
    with_status["spec"]["replicas"] = json!(5);
    with_status["metadata"]["labels"] = json!({"ignored": "yes"});
    with_status["status"] = json!({"replicas": 3, "readyReplicas": 2, "observedGeneration": 1});
    let r = api.put(&format!("{}/status", obj(NS, "a")), &with_status).await;
    let after = r.expect(200);
    assert_eq!(after["spec"]["replicas"], 3, "spec untouched: {after:#}");
    assert!(
        after["metadata"].get("labels").is_none(),
        "metadata untouched: {after:#}"
    );
    assert_eq!(after["status"]["readyReplicas"], 2);
    assert_eq!(after["metadata"]["generation"], 1);
    assert_ne!(
        after["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );
    let got = api.get(&format!("{}/status", obj(NS, "a"))).await.expect(200);
    assert_eq!(got, after);

    // The main resource ignores status: only a status change is a no-op.
    let mut main = after.clone();
    main["status"] = json!({"replicas": 1});
    let before = api.stored().await;
    let r = api.put(&obj(NS, "a"), &main).await;
    let same = r.expect(200);
    assert_eq!(same["status"], after["status"]);
    assert_eq!(
        same["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );
    api.assert_unchanged(&before, "a main-resource PUT of status only")
        .await;
    let r = api
        .patch(&obj(NS, "a"), MERGE, r#"{"status":{"readyReplicas":0}}"#)
        .await;
    assert_eq!(r.expect(200)["status"]["readyReplicas"], 2);
    api.assert_unchanged(&before, "a main-resource patch of status only")
        .await;

    // A status patch.
    let r = api
        .patch(
            &format!("{}/status", obj(NS, "a")),
            MERGE,
            r#"{"spec":{"replicas":7},"status":{"readyReplicas":3}}"#,
        )
        .await;
    let patched = r.expect(200);
    assert_eq!(patched["status"]["readyReplicas"], 3);
    assert_eq!(patched["spec"]["replicas"], 3);
    assert_eq!(patched["metadata"]["generation"], 1);
}

async fn scale_subresource_reads_and_writes_replicas(backing: Backing) {
    let api = Api::start(backing).await;
    let created = api.create("a").await;
    let scale = api.get(&format!("{}/scale", obj(NS, "a"))).await.expect(200);
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["metadata"]["name"], "a");
    assert_eq!(scale["metadata"]["namespace"], NS);
    assert_eq!(scale["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(
        scale["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );
    assert_eq!(scale["spec"]["replicas"], 3);
    assert_eq!(scale["status"]["selector"], "etcd.operator.dev/cluster=a");
    assert!(scale["status"]["selector"].is_string());

    let mut put = scale.clone();
    put["spec"]["replicas"] = json!(5);
    let r = api.put(&format!("{}/scale", obj(NS, "a")), &put).await;
    let scaled = r.expect(200);
    assert_eq!(scaled["kind"], "Scale");
    assert_eq!(scaled["spec"]["replicas"], 5);
    let parent = api.get(&obj(NS, "a")).await.expect(200);
    assert_eq!(parent["spec"]["replicas"], 5);
    assert_eq!(parent["metadata"]["generation"], 2);
    assert_eq!(
        scaled["metadata"]["resourceVersion"],
        parent["metadata"]["resourceVersion"]
    );

    let r = api
        .patch(
            &format!("{}/scale", obj(NS, "a")),
            MERGE,
            r#"{"spec":{"replicas":7}}"#,
        )
        .await;
    assert_eq!(r.expect(200)["spec"]["replicas"], 7);
    let parent = api.get(&obj(NS, "a")).await.expect(200);
    assert_eq!(parent["spec"]["replicas"], 7);
    assert_eq!(parent["metadata"]["generation"], 3);

    let before = api.stored().await;
    let mut zero = put.clone();
    zero["spec"]["replicas"] = json!(0);
    zero["metadata"]["resourceVersion"] = parent["metadata"]["resourceVersion"].clone();
    let r = api.put(&format!("{}/scale", obj(NS, "a")), &zero).await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "EtcdCluster.etcd.operator.dev \"a\" is invalid",
    );
    assert_eq!(cause_fields(&s), ["spec.replicas"]);
    let r = api
        .patch(
            &format!("{}/scale", obj(NS, "a")),
            MERGE,
            r#"{"spec":{"replicas":0}}"#,
        )
        .await;
    assert_status(&r, 422, "Invalid", "spec.replicas");
    let r = api
        .patch(
            &format!("{}/scale", obj(NS, "a")),
            MERGE,
            r#"{"spec":{"replicas":"many"}}"#,
        )
        .await;
    assert_status(&r, 422, "Invalid", "spec.replicas");
    let mut wrong_kind = zero.clone();
    wrong_kind["kind"] = json!("Pod");
    wrong_kind["spec"]["replicas"] = json!(5);
    let r = api.put(&format!("{}/scale", obj(NS, "a")), &wrong_kind).await;
    assert_status(&r, 400, "BadRequest", "Scale");
    let mut renamed = zero.clone();
    renamed["metadata"]["name"] = json!("b");
    renamed["spec"]["replicas"] = json!(5);
    let r = api.put(&format!("{}/scale", obj(NS, "a")), &renamed).await;
    assert_status(&r, 400, "BadRequest", "does not match the name on the URL");
    api.assert_unchanged(&before, "invalid scale writes").await;

    // The v1alpha1 path scales `size`.
    let v1 = format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdclusters/a");
    let r = api
        .patch(&format!("{v1}/scale"), MERGE, r#"{"spec":{"replicas":3}}"#)
        .await;
    assert_eq!(r.expect(200)["spec"]["replicas"], 3);
    assert_eq!(api.get(&v1).await.expect(200)["spec"]["size"], 3);
}

async fn generation_bumps_only_for_spec_changes_and_identical_writes_are_no_ops(backing: Backing) {
    let api = Api::start(backing).await;
    let created = api.create("a").await;
    assert_eq!(created["metadata"]["generation"], 1);

    let before = api.stored().await;
    let r = api.put(&obj(NS, "a"), &created).await;
    let same = r.expect(200);
    assert_eq!(same, created, "an identical PUT returns the stored object");
    api.assert_unchanged(&before, "an identical PUT").await;
    let r = api.patch(&obj(NS, "a"), MERGE, "{}").await;
    assert_eq!(r.expect(200), created);
    let r = api
        .patch(&obj(NS, "a"), MERGE, r#"{"spec":{"replicas":3}}"#)
        .await;
    assert_eq!(r.expect(200), created);
    api.assert_unchanged(&before, "no-op patches").await;

    let labelled = api
        .patch(
            &obj(NS, "a"),
            MERGE,
            r#"{"metadata":{"labels":{"x":"y"},"annotations":{"n":"1"}}}"#,
        )
        .await
        .expect(200);
    assert_eq!(labelled["metadata"]["generation"], 1);
    assert_ne!(
        labelled["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );

    let mut bigger = labelled.clone();
    bigger["spec"]["replicas"] = json!(5);
    let updated = api.put(&obj(NS, "a"), &bigger).await.expect(200);
    assert_eq!(updated["metadata"]["generation"], 2);
    // A client cannot set generation.
    let mut forged = updated.clone();
    forged["metadata"]["generation"] = json!(42);
    let r = api.put(&obj(NS, "a"), &forged).await.expect(200);
    assert_eq!(r["metadata"]["generation"], 2);
    let v1 = api
        .patch(
            &format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdclusters/a"),
            MERGE,
            r#"{"spec":{"size":7}}"#,
        )
        .await
        .expect(200);
    assert_eq!(v1["metadata"]["generation"], 3);
}

async fn generate_name_completes_the_name(backing: Backing) {
    let api = Api::start(backing).await;
    let mut b = cluster("x");
    b["metadata"] = json!({"generateName": "demo-"});
    let mut names = BTreeSet::new();
    for _ in 0..3 {
        let created = api.create_in(NS, &b).await;
        let name = created["metadata"]["name"].as_str().unwrap().to_string();
        assert_eq!(name.len(), "demo-".len() + 5, "{name}");
        assert!(name.starts_with("demo-"), "{name}");
        assert!(
            name[5..]
                .bytes()
                .all(|c| b"bcdfghjklmnpqrstvwxz2456789".contains(&c)),
            "{name}"
        );
        assert_eq!(created["metadata"]["generateName"], "demo-");
        api.get(&obj(NS, &name)).await.expect(200);
        names.insert(name);
    }
    assert_eq!(names.len(), 3);
    assert_eq!(api.names(NS).await, names);
}

// ---------------------------------------------------------------------------------------------
// Paging and compaction

async fn list_pages_through_every_object_exactly_once(backing: Backing) {
    let api = Api::start(backing).await;
    for i in 0..5 {
        api.create(&format!("p{i}")).await;
    }
    api.create_in("team-b", &cluster("other")).await;

    let mut seen = Vec::new();
    let mut list_rv: Option<String> = None;
    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut remaining = Vec::new();
    loop {
        let uri = match &token {
            Some(t) => format!("{}?limit=2&continue={t}", coll(NS)),
            None => format!("{}?limit=2", coll(NS)),
        };
        let page = api.get(&uri).await.expect(200);
        pages += 1;
        let rv = page["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        match &list_rv {
            Some(first) => assert_eq!(&rv, first, "every page carries the list's resourceVersion"),
            None => list_rv = Some(rv),
        }
        for item in page["items"].as_array().unwrap() {
            seen.push(item["metadata"]["name"].as_str().unwrap().to_string());
        }
        remaining.push(page["metadata"]["remainingItemCount"].clone());
        if pages == 1 {
            // A write between pages does not show in later pages: they are one snapshot.
            api.patch(&obj(NS, "p4"), MERGE, r#"{"metadata":{"labels":{"late":"yes"}}}"#)
                .await
                .expect(200);
        }
        match page["metadata"]["continue"].as_str() {
            Some(t) if !t.is_empty() => token = Some(t.to_string()),
            _ => {
                let last = page["items"].as_array().unwrap().last().unwrap().clone();
                assert!(last["metadata"].get("labels").is_none(), "{last:#}");
                break;
            }
        }
    }
    assert_eq!(seen, ["p0", "p1", "p2", "p3", "p4"]);
    assert_eq!(pages, 3);
    assert_eq!(remaining, [json!(3), json!(1), Value::Null]);

    // Across all namespaces too.
    let all = api
        .get(&format!("{GROUP_PATH}/v1alpha2/etcdclusters?limit=4"))
        .await
        .expect(200);
    assert_eq!(all["items"].as_array().unwrap().len(), 4);
    assert_eq!(all["metadata"]["remainingItemCount"], 2);
    // Empty lists have `items: []`.
    let empty = api.get(&coll("nobody")).await.expect(200);
    assert_eq!(empty["items"], json!([]));
}

async fn an_expired_continue_token_is_410_with_an_inconsistent_continue_token(backing: Backing) {
    let api = Api::start(backing).await;
    for i in 0..5 {
        api.create(&format!("p{i}")).await;
    }
    let first = api.get(&format!("{}?limit=2", coll(NS))).await.expect(200);
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    // Move on and compact the backing etcd past the list's revision.
    api.patch(&obj(NS, "p3"), MERGE, r#"{"metadata":{"labels":{"late":"yes"}}}"#)
        .await
        .expect(200);
    // A consistent read: the watch cache has applied the patch (else, still at the list's
    // revision, it could serve the continuation itself, consistently, without asking the store).
    api.get(&obj(NS, "p3")).await.expect(200);
    let revision = api.stored().await.revision;
    api.compact_store(revision).await;

    let r = api.get(&format!("{}?limit=2&continue={token}", coll(NS))).await;
    let s = assert_status(
        &r,
        410,
        "Expired",
        "The provided continue parameter is too old to display a consistent list result.",
    );
    let inconsistent = s["metadata"]["continue"]
        .as_str()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| panic!("the Status carries a continue token: {s:#}"))
        .to_string();
    assert_ne!(inconsistent, token);

    // It continues where the expired one would have, at the latest state.
    let mut names = Vec::new();
    let mut next = Some(inconsistent);
    while let Some(t) = next {
        let page = api
            .get(&format!("{}?limit=2&continue={t}", coll(NS)))
            .await
            .expect(200);
        for item in page["items"].as_array().unwrap() {
            names.push(item["metadata"]["name"].as_str().unwrap().to_string());
            if item["metadata"]["name"] == "p3" {
                assert_eq!(item["metadata"]["labels"]["late"], "yes");
            }
        }
        next = page["metadata"]["continue"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string);
    }
    assert_eq!(names, ["p2", "p3", "p4"]);

    // An exact list at the compacted revision is 410 too.
    let old = first["metadata"]["resourceVersion"].as_str().unwrap();
    let r = api
        .get(&format!(
            "{}?resourceVersion={old}&resourceVersionMatch=Exact",
            coll(NS)
        ))
        .await;
    assert_status(
        &r,
        410,
        "Expired",
        "The resourceVersion for the provided list is too old.",
    );
}

async fn a_watch_from_a_compacted_resource_version_is_an_error_event_with_410(backing: Backing) {
    let api = Api::start(backing).await;
    let first = api.create("a").await;
    let old: u64 = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    for i in 0..3 {
        api.patch(
            &obj(NS, "a"),
            MERGE,
            &json!({"metadata": {"labels": {"n": i.to_string()}}}).to_string(),
        )
        .await
        .expect(200);
    }
    // Compact the backing etcd past `old` and start a server on it (its history begins now).
    let revision = api.stored().await.revision;
    api.compact_store(revision).await;
    let (restarted, _storage) = Api::app_on(&api.backend, Arc::new(FixedUser)).await;
    let r = send_to(
        &restarted,
        Request::get(format!("{}?watch=true&resourceVersion={old}", coll(NS)))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let events: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.len(), 1, "{text}");
    assert_eq!(events[0]["type"], "ERROR");
    let status = &events[0]["object"];
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["apiVersion"], "v1");
    assert_eq!(status["code"], 410);
    assert_eq!(status["reason"], "Expired");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("too old resource version: {old} (")),
        "{status:#}"
    );

    // The running server's own compactor tells its watch cache, with the same outcome.
    api.storage.compact().await.unwrap();
    api.patch(&obj(NS, "a"), MERGE, r#"{"metadata":{"labels":{"n":"x"}}}"#)
        .await
        .expect(200);
    api.storage.compact().await.unwrap();
    let r = api
        .get(&format!("{}?watch=1&resourceVersion={old}", coll(NS)))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let event: Value = serde_json::from_slice(r.body.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(event["type"], "ERROR", "{event:#}");
    assert_eq!(event["object"]["code"], 410, "{event:#}");
}

// ---------------------------------------------------------------------------------------------
// Representations

async fn tables_and_partial_object_metadata(backing: Backing) {
    let api = Api::start(backing).await;
    let a = api.create("a").await;
    api.create("b").await;

    let r = api.get_accept(&coll(NS), TABLE).await;
    let table = r.expect(200);
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
    let columns = table["columnDefinitions"].as_array().unwrap();
    assert!(columns.len() >= 3);
    assert_eq!(columns[0]["name"], "Name");
    assert_eq!(columns[0]["format"], "name");
    let rows = table["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["cells"][0], "a");
    assert_eq!(rows[0]["cells"].as_array().unwrap().len(), columns.len());
    assert_eq!(rows[0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(rows[0]["object"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(rows[0]["object"]["metadata"]["uid"], a["metadata"]["uid"]);
    assert!(rows[0]["object"].get("spec").is_none());

    let one = api.get_accept(&obj(NS, "a"), TABLE).await.expect(200);
    assert_eq!(one["kind"], "Table");
    assert_eq!(one["rows"].as_array().unwrap().len(), 1);
    let full = api
        .get_accept(&format!("{}?includeObject=Object", coll(NS)), TABLE)
        .await
        .expect(200);
    assert_eq!(full["rows"][0]["object"]["kind"], "EtcdCluster");
    let none = api
        .get_accept(&format!("{}?includeObject=None", coll(NS)), TABLE)
        .await
        .expect(200);
    assert!(none["rows"][0]["object"].is_null());
    let empty = api.get_accept(&coll("nobody"), TABLE).await.expect(200);
    assert_eq!(empty["rows"], json!([]));

    let meta_accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let list = api.get_accept(&coll(NS), meta_accept).await.expect(200);
    assert_eq!(list["kind"], "PartialObjectMetadataList");
    assert_eq!(list["apiVersion"], "meta.k8s.io/v1");
    assert!(list["metadata"]["resourceVersion"].is_string());
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["kind"], "PartialObjectMetadata");
    assert_eq!(items[0]["metadata"]["name"], "a");
    assert!(items[0].get("spec").is_none());
    let empty = api.get_accept(&coll("nobody"), meta_accept).await.expect(200);
    assert_eq!(empty["items"], json!([]));
    let one = api
        .get_accept(
            &obj(NS, "a"),
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        )
        .await
        .expect(200);
    assert_eq!(one["kind"], "PartialObjectMetadata");
    assert_eq!(one["metadata"]["name"], "a");

    let yaml = api.get_accept(&obj(NS, "a"), "application/yaml").await;
    assert_eq!(yaml.status, StatusCode::OK);
    assert_eq!(yaml.header("content-type"), Some("application/yaml"));
    let parsed: Value = serde_yaml::from_slice(&yaml.body).unwrap();
    assert_eq!(parsed, a);

    // Lists are encoded one item at a time: paging, selection and conversion still apply to
    // each representation, and the list metadata comes with them.
    api.patch(&obj(NS, "b"), MERGE, r#"{"metadata":{"labels":{"tier":"x"}}}"#)
        .await
        .expect(200);
    let page = api
        .get_accept(&format!("{}?limit=1", coll(NS)), TABLE)
        .await
        .expect(200);
    assert_eq!(page["rows"].as_array().map(Vec::len), Some(1));
    assert_eq!(page["rows"][0]["cells"][0], "a");
    assert!(page["columnDefinitions"].is_array());
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    let rest = api
        .get_accept(&format!("{}?limit=1&continue={token}", coll(NS)), TABLE)
        .await
        .expect(200);
    assert_eq!(rest["rows"][0]["cells"][0], "b");
    let page = api
        .get_accept(&format!("{}?limit=1", coll(NS)), meta_accept)
        .await
        .expect(200);
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1));
    assert!(page["metadata"]["continue"].is_string());
    let selected = api
        .get_accept(&format!("{}?labelSelector=tier%3Dx", coll(NS)), meta_accept)
        .await
        .expect(200);
    assert_eq!(selected["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(selected["items"][0]["metadata"]["labels"]["tier"], "x");
    let selected = api
        .get(&format!("{}?labelSelector=tier%3Dx", coll(NS)))
        .await
        .expect(200);
    assert_eq!(selected["kind"], "EtcdClusterList");
    assert_eq!(selected["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(selected["items"][0]["metadata"]["name"], "b");
    let old = api
        .get(&format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdclusters"))
        .await
        .expect(200);
    assert_eq!(old["apiVersion"], "etcd.operator.dev/v1alpha1");
    assert_eq!(old["items"].as_array().map(Vec::len), Some(2));
    assert!(
        old["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["apiVersion"] == "etcd.operator.dev/v1alpha1"),
        "{old:#}"
    );
    let none = api
        .get_accept(&format!("{}?labelSelector=tier%3Dnone", coll(NS)), TABLE)
        .await
        .expect(200);
    assert_eq!(none["rows"], json!([]));
}

async fn discovery_and_openapi_are_cacheable(backing: Backing) {
    let api = Api::start(backing).await;
    let r = api.get_accept("/apis", AGGREGATED_ACCEPT).await;
    let doc = r.expect(200);
    assert_eq!(
        r.header("content-type"),
        Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
    );
    assert_eq!(doc["kind"], "APIGroupDiscoveryList");
    let etag = r.header("etag").expect("an ETag").to_string();
    let r = api
        .call(
            Method::GET,
            "/apis",
            &[("accept", AGGREGATED_ACCEPT), ("if-none-match", &etag)],
            Body::empty(),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    assert!(r.body.is_empty());
    let r = api
        .call(
            Method::GET,
            "/apis",
            &[("accept", AGGREGATED_ACCEPT), ("if-none-match", "\"stale\"")],
            Body::empty(),
        )
        .await;
    r.expect(200);
    let legacy = api.get_accept("/apis", "application/json").await.expect(200);
    assert_eq!(legacy["kind"], "APIGroupList");

    let resources = api.get(&format!("{GROUP_PATH}/v1alpha2")).await.expect(200);
    let names: Vec<&str> = resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "etcdclusters",
            "etcdclusters/status",
            "etcdclusters/scale",
            "etcdclusters/snapshot",
            "etcdbackups",
            "etcdbackups/status"
        ]
    );

    let root = api.get("/openapi/v3").await.expect(200);
    let paths = root["paths"].as_object().unwrap();
    assert_eq!(paths.len(), 2, "{root:#}");
    for version in ["v1alpha1", "v1alpha2"] {
        let url = paths[&format!("apis/etcd.operator.dev/{version}")]["serverRelativeURL"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            url.starts_with(&format!("/openapi/v3/apis/etcd.operator.dev/{version}?hash=")),
            "{url}"
        );
        let r = api
            .get(&format!(
                "/openapi/v3/apis/etcd.operator.dev/{version}?hash=WRONG"
            ))
            .await;
        assert_eq!(r.status, StatusCode::MOVED_PERMANENTLY);
        assert_eq!(r.header("location"), Some(url.as_str()));
        let r = api.get(&url).await;
        let doc = r.expect(200);
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        assert_eq!(r.header("cache-control"), Some("public, immutable"));
        assert!(r.header("etag").is_some());
    }
    let r = api.get("/openapi/v2").await;
    r.expect(200);
    let etag = r.header("etag").unwrap().to_string();
    let r = api
        .call(
            Method::GET,
            "/openapi/v2",
            &[("if-none-match", &etag)],
            Body::empty(),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
}

// ---------------------------------------------------------------------------------------------
// Odd input never reaches a 500

async fn odd_input_gets_a_client_error_never_a_server_error(backing: Backing) {
    let api = Api::start(backing).await;
    let existing = api.create("a").await;
    let before = api.stored().await;
    let mut bodies = Vec::new();
    let mut named = |f: &dyn Fn(&mut Value)| {
        let mut b = cluster("odd");
        f(&mut b);
        bodies.push(b);
    };
    named(&|b| b["metadata"]["name"] = json!("UPPER"));
    named(&|b| b["metadata"]["name"] = json!("a.b"));
    named(&|b| b["metadata"]["name"] = json!("x".repeat(80)));
    named(&|b| b["metadata"]["name"] = json!("../escape"));
    named(&|b| b["metadata"]["name"] = json!(5));
    named(&|b| b["metadata"] = json!("string"));
    named(&|b| b["metadata"] = json!(null));
    named(&|b| b["spec"] = json!([]));
    named(&|b| b["spec"]["replicas"] = json!("three"));
    named(&|b| b["spec"]["replicas"] = json!(1e12));
    named(&|b| b["metadata"]["labels"] = json!({"bad key": "x"}));
    named(&|b| b["metadata"]["labels"] = json!({"k": "v w"}));
    named(&|b| b["metadata"]["annotations"] = json!({"k": 1}));
    for body in &bodies {
        let r = api.post(&coll(NS), body).await;
        assert!(
            r.status.is_client_error(),
            "{body}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["kind"], "Status", "{body}");
    }
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let deep_yaml = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]\ni: [*h, *h, *h, *h, *h, *h, *h, *h, *h]\n";
    for (content_type, body) in [
        ("application/json", deep.as_str()),
        ("application/yaml", deep_yaml.as_str()),
        ("application/yaml", bomb),
        ("application/json", "\u{feff}{}"),
        ("application/json", "{\"a\":\"\\ud800\"}"),
    ] {
        let r = api
            .call(
                Method::POST,
                &coll(NS),
                &[("content-type", content_type)],
                body.to_string(),
            )
            .await;
        assert!(
            r.status.is_client_error(),
            "{}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["kind"], "Status");
    }
    for (content_type, patch) in [
        (MERGE, r#"{"metadata":null}"#),
        (MERGE, r#"{"spec":null}"#),
        (MERGE, r#"{"apiVersion":null}"#),
        (MERGE, r#"{"metadata":{"name":null}}"#),
        (JSON_PATCH, r#"[{"op":"remove","path":"/metadata"}]"#),
        (JSON_PATCH, r#"[{"op":"replace","path":"/spec","value":"x"}]"#),
        (JSON_PATCH, r#"[{"op":"replace","path":"","value":[]}]"#),
        (JSON_PATCH, r#"[{"op":"move","from":"/spec","path":"/spec/x"}]"#),
        (JSON_PATCH, r#"[]"#),
    ] {
        let r = api.patch(&obj(NS, "a"), content_type, patch).await;
        assert!(
            r.status.is_client_error() || r.status == StatusCode::OK,
            "{patch}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        if r.status == StatusCode::OK {
            assert_eq!(
                r.json()["metadata"]["resourceVersion"],
                existing["metadata"]["resourceVersion"],
                "{patch}"
            );
        } else {
            assert_eq!(r.json()["kind"], "Status");
        }
    }
    for path in [
        format!("{}/%2e%2e", coll(NS)),
        format!("{}/a%2Fb", coll(NS)),
        format!("{}/UPPER", coll(NS)),
        format!("{GROUP_PATH}/v1alpha2/namespaces/%2e%2e/etcdclusters/a"),
        format!("{GROUP_PATH}/v1alpha2/namespaces/UPPER_NS/etcdclusters"),
        format!("{GROUP_PATH}/v1alpha2/namespaces//etcdclusters"),
        format!("{}?limit=-1", coll(NS)),
        format!("{}?limit=99999999999999999999", coll(NS)),
        format!("{}?resourceVersion=99999999999999999999", coll(NS)),
        format!("{}?resourceVersion=-5", coll(NS)),
        format!("{}?labelSelector=%ff%fe", coll(NS)),
        format!("{}?watch=true&timeoutSeconds=-1", coll(NS)),
        format!("{}?watch=true&resourceVersion=99999999999999999999", coll(NS)),
        format!("{}/a?resourceVersion=abc", coll(NS)),
    ] {
        let r = api.get(&path).await;
        assert!(
            !r.status.is_server_error(),
            "{path}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        if !r.status.is_success() {
            assert_eq!(r.json()["kind"], "Status", "{path}");
        }
    }
    for path in [
        format!("{GROUP_PATH}/v1alpha2/namespaces/UPPER_NS/etcdclusters"),
        format!("{GROUP_PATH}/v1alpha2/namespaces/%2e%2e/etcdclusters"),
    ] {
        let r = api.post(&path, &cluster("b")).await;
        assert!(
            r.status.is_client_error(),
            "{path}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    api.assert_unchanged(&before, "odd input").await;
}

/// A watch from a resourceVersion does not know what the client saw before it began: a change
/// is MODIFIED (not ADDED) when it matches, and DELETED when it stops matching the selector.
async fn a_watch_from_a_resource_version_reports_changes_and_selector_exits(backing: Backing) {
    let h = Api::start(backing).await;
    let mut body = cluster("w1");
    body["metadata"]["labels"] = json!({"tier": "a"});
    let created = h.create_in(NS, &body).await;
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    h.patch(
        &obj(NS, "w1"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"tier":"b"}}}"#,
    )
    .await
    .expect(200);
    let events = |r: Resp| -> Vec<String> {
        String::from_utf8_lossy(&r.body)
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let all = h
        .get(&format!(
            "{}?watch=1&resourceVersion={rv}&timeoutSeconds=1",
            coll(NS)
        ))
        .await;
    assert_eq!(events(all), ["MODIFIED"]);
    let selected = h
        .get(&format!(
            "{}?watch=1&resourceVersion={rv}&timeoutSeconds=1&labelSelector=tier%3Da",
            coll(NS)
        ))
        .await;
    assert_eq!(events(selected), ["DELETED"], "the object left the selection");
    // From the whole state (resourceVersion 0) the watcher knows: nothing matches tier=a.
    let from_zero = h
        .get(&format!(
            "{}?watch=1&resourceVersion=0&timeoutSeconds=1&labelSelector=tier%3Da",
            coll(NS)
        ))
        .await;
    assert!(events(from_zero).is_empty());
}

/// The bookmark ending the initial events of a watch-list, in the representation negotiated
/// (client-go's metadata client decodes only `meta.k8s.io` kinds: a bookmark of another kind
/// ends its watch, which is how the garbage collector and the namespace controller watch).
async fn watch_list_bookmarks_come_in_the_negotiated_representation(backing: Backing) {
    let h = Api::start(backing).await;
    h.create("bm1").await;
    h.post(&backups(NS), &backup("b1", "bm1")).await.expect(201);
    let watch_list = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1";
    let metadata = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
    let cases = [
        (
            format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdclusters"),
            "application/json",
            "EtcdCluster",
            "etcd.operator.dev/v1alpha1",
        ),
        (
            coll(NS),
            "application/json",
            "EtcdCluster",
            "etcd.operator.dev/v1alpha2",
        ),
        (
            backups(NS),
            "application/json",
            "EtcdBackup",
            "etcd.operator.dev/v1alpha2",
        ),
        (coll(NS), metadata, "PartialObjectMetadata", "meta.k8s.io/v1"),
        (backups(NS), metadata, "PartialObjectMetadata", "meta.k8s.io/v1"),
        (coll(NS), TABLE, "Table", "meta.k8s.io/v1"),
    ];
    for (path, accept, kind, api_version) in cases {
        let r = h.get_accept(&format!("{path}?{watch_list}"), accept).await;
        assert_eq!(r.status, StatusCode::OK, "{path} {accept}");
        let events: Vec<Value> = String::from_utf8_lossy(&r.body)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(events.len() >= 2, "{path} {accept}: {events:#?}");
        let (added, bookmark) = (&events[0], &events[1]);
        assert_eq!(added["type"], "ADDED", "{events:#?}");
        assert_eq!(added["object"]["kind"], kind, "{path} {accept}");
        assert_eq!(bookmark["type"], "BOOKMARK", "{events:#?}");
        let object = &bookmark["object"];
        assert_eq!(
            (object["kind"].as_str(), object["apiVersion"].as_str()),
            (Some(kind), Some(api_version)),
            "{path} {accept}: {object:#}"
        );
        assert_eq!(
            object["metadata"]["annotations"]["k8s.io/initial-events-end"], "true",
            "{object:#}"
        );
        assert!(object["metadata"]["resourceVersion"].is_string(), "{object:#}");
    }
}

fn backups(ns: &str) -> String {
    format!("{GROUP_PATH}/v1alpha2/namespaces/{ns}/etcdbackups")
}

fn backup(name: &str, cluster: &str) -> Value {
    json!({
        "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdBackup",
        "metadata": {"name": name},
        "spec": {"clusterName": cluster, "destination": {"volume": {"path": "/var/backups"}}},
    })
}

impl Api {
    /// Keys and revisions under the EtcdBackup prefix.
    async fn stored_backups(&self) -> Vec<(String, i64)> {
        let resp = self.read_prefix(BACKUPS_PREFIX).await;
        resp.kvs
            .iter()
            .map(|k| (String::from_utf8(k.key.clone()).unwrap(), k.mod_revision as i64))
            .collect()
    }
}

async fn etcdbackups_are_served_with_every_verb_status_and_validation(backing: Backing) {
    let api = Api::start(backing).await;
    // Create: defaults, server-owned metadata, stored under its own prefix.
    let created = api.post(&backups(NS), &backup("b1", "main")).await.expect(201);
    assert_eq!(created["kind"], "EtcdBackup");
    assert_eq!(created["metadata"]["generation"], 1);
    assert!(created["metadata"]["uid"].is_string());
    assert_eq!(
        api.stored_backups()
            .await
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>(),
        ["/registry/etcd.operator.dev/etcdbackups/team-a/b1"]
    );
    assert!(api.stored().await.keys.is_empty(), "nothing under etcdclusters");
    // Get, list (JSON and Table), watch.
    let got = api.get(&format!("{}/b1", backups(NS))).await.expect(200);
    assert_eq!(got, created);
    let list = api.get(&backups(NS)).await.expect(200);
    assert_eq!(list["kind"], "EtcdBackupList");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
    let table = api.get_accept(&backups(NS), TABLE).await.expect(200);
    assert_eq!(table["columnDefinitions"][1]["name"], "Cluster");
    assert_eq!(table["rows"][0]["cells"][1], "main");
    let all = api
        .get(&format!("{GROUP_PATH}/v1alpha2/etcdbackups"))
        .await
        .expect(200);
    assert_eq!(all["items"][0]["metadata"]["namespace"], NS);
    let watch = api
        .get(&format!("{}?watch=true&timeoutSeconds=1", backups(NS)))
        .await;
    assert_eq!(watch.status, StatusCode::OK);
    let first: Value = serde_json::from_slice(watch.body.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["kind"], "EtcdBackup");

    // Validation: every error with its path, nothing stored.
    let before = api.stored_backups().await;
    let mut bad = backup("Bad_Name", "");
    bad["spec"]["destination"] = json!({"s3": {"bucket": "x"}, "volume": {"path": "rel"}});
    let r = api.post(&backups(NS), &bad).await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "EtcdBackup.etcd.operator.dev \"Bad_Name\" is invalid",
    );
    assert_eq!(s["details"]["kind"], "EtcdBackup");
    assert_eq!(
        cause_fields(&s),
        [
            "metadata.name",
            "spec.clusterName",
            "spec.destination",
            "spec.destination.s3.bucket",
            "spec.destination.volume.path"
        ]
    );
    // An EtcdCluster body at the backups URL, and the existing name.
    let r = api.post(&backups(NS), &cluster("c")).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "does not match the expected kind (EtcdBackup)",
    );
    let r = api.post(&backups(NS), &backup("b1", "main")).await;
    assert_status(
        &r,
        409,
        "AlreadyExists",
        "etcdbackups.etcd.operator.dev \"b1\" already exists",
    );
    // The spec is immutable; a stale resourceVersion is a conflict.
    let r = api
        .patch(
            &format!("{}/b1", backups(NS)),
            MERGE,
            r#"{"spec":{"clusterName":"other"}}"#,
        )
        .await;
    let s = assert_status(&r, 422, "Invalid", "immutable");
    assert_eq!(cause_fields(&s), ["spec"]);
    let mut stale = created.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    let r = api.put(&format!("{}/b1", backups(NS)), &stale).await;
    assert_status(&r, 409, "Conflict", "etcdbackups.etcd.operator.dev \"b1\"");
    assert_eq!(api.stored_backups().await, before, "refused writes store nothing");
    // Not served in v1alpha1; no scale or snapshot subresource.
    let r = api
        .get(&format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdbackups"))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    for sub in ["scale", "snapshot"] {
        let r = api.get(&format!("{}/b1/{sub}", backups(NS))).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{sub}");
    }

    // Status: only status changes; a label change on the main resource keeps status.
    let r = api
        .patch(
            &format!("{}/b1/status", backups(NS)),
            MERGE,
            r#"{"spec":{"clusterName":"x"},"status":{"phase":"Succeeded","size":4128,"revision":9}}"#,
        )
        .await;
    let after = r.expect(200);
    assert_eq!(after["status"]["phase"], "Succeeded");
    assert_eq!(after["spec"]["clusterName"], "main");
    let r = api
        .patch(
            &format!("{}/b1", backups(NS)),
            MERGE,
            r#"{"metadata":{"labels":{"a":"b"}},"status":{"phase":"Failed"}}"#,
        )
        .await;
    let labelled = r.expect(200);
    assert_eq!(labelled["status"]["phase"], "Succeeded");
    assert_eq!(labelled["metadata"]["labels"]["a"], "b");
    let table = api
        .get_accept(&format!("{}/b1", backups(NS)), TABLE)
        .await
        .expect(200);
    assert_eq!(table["rows"][0]["cells"][2], "Succeeded");
    assert_eq!(table["rows"][0]["cells"][3], 4128);

    // Delete and deletecollection.
    api.post(&backups(NS), &backup("b2", "main")).await.expect(201);
    api.delete(&format!("{}/b1", backups(NS)), None).await.expect(200);
    let r = api.get(&format!("{}/b1", backups(NS))).await;
    assert_status(
        &r,
        404,
        "NotFound",
        "etcdbackups.etcd.operator.dev \"b1\" not found",
    );
    let gone = api.delete(&backups(NS), None).await.expect(200);
    assert_eq!(gone["kind"], "EtcdBackupList");
    assert_eq!(gone["items"][0]["metadata"]["name"], "b2");
    assert!(api.stored_backups().await.is_empty());
}

// etcd only: the backing etcd stands in for the cluster's member that serves the snapshot.
#[tokio::test]
async fn the_snapshot_subresource_streams_a_checked_snapshot_or_says_why_not() {
    let api = Api::start(Backing::Etcd).await;
    let snapshot = |name: &str| format!("{}/snapshot", obj(NS, name));
    // A missing cluster is 404; a cluster without endpoints has no healthy member: 503.
    let r = api.get(&snapshot("x")).await;
    assert_status(&r, 404, "NotFound", NOT_FOUND_X);
    api.create_in(NS, &cluster("a")).await;
    let r = api.get(&snapshot("a")).await;
    assert_status(&r, 503, "ServiceUnavailable", "no healthy member");
    // Only GET; only octet-stream.
    let r = api.call(Method::POST, &snapshot("a"), &[], Body::empty()).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    let r = api.get_accept(&snapshot("a"), "application/json").await;
    assert_status(&r, 406, "NotAcceptable", "application/octet-stream");
    // An endpoint that does not answer: 503 too.
    let r = api
        .patch(
            &format!("{}/status", obj(NS, "a")),
            MERGE,
            r#"{"status":{"clientEndpoints":["http://127.0.0.1:9"]}}"#,
        )
        .await;
    r.expect(200);
    let r = api.get(&snapshot("a")).await;
    assert_status(&r, 503, "ServiceUnavailable", "no healthy member");
    // The backing etcd of this test stands in for the cluster's member: a real snapshot.
    let endpoint = api.etcd.as_ref().unwrap().endpoint().to_string();
    let r = api
        .patch(
            &format!("{}/status", obj(NS, "a")),
            MERGE,
            &json!({"status": {"clientEndpoints": [endpoint]}}).to_string(),
        )
        .await;
    r.expect(200);
    let r = api.get_accept(&snapshot("a"), "application/json, */*").await;
    assert_eq!(r.status, StatusCode::OK, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    let data = r.body.to_vec();
    assert_eq!(data.len() % 512, 32, "a bbolt file plus etcd's 32-byte hash");
    use sha2::Digest;
    let (db, hash) = data.split_at(data.len() - 32);
    assert_eq!(sha2::Sha256::digest(db).as_slice(), hash);
    // The checksum is known once the body streamed whole: a trailer, not a header.
    assert_eq!(r.header("x-etcd-snapshot-sha256"), None);
    assert_eq!(
        r.trailers
            .as_ref()
            .and_then(|t| t.get("x-etcd-snapshot-sha256"))
            .and_then(|v| v.to_str().ok()),
        Some(hex::encode(sha2::Sha256::digest(&data)).as_str())
    );
    // The snapshot holds the stored EtcdCluster (the backing etcd's own data).
    assert!(
        data.windows(b"/registry/etcd.operator.dev/etcdclusters/team-a/a".len())
            .any(|w| w == b"/registry/etcd.operator.dev/etcdclusters/team-a/a")
    );
}

/// kube-apiserver's metadata rules on both kinds, on create, replace and patch: bad label keys and
/// values are 422 at `metadata.labels`, bad annotation keys and more than 256 KiB of annotations
/// 422 at `metadata.annotations`; nothing is stored.
async fn labels_and_annotations_are_validated_like_kube_apiserver(backing: Backing) {
    let api = Api::start(backing).await;
    let cluster_uri = obj(NS, "a");
    let backup_uri = format!("{}/a", backups(NS));
    api.create("a").await;
    api.post(&backups(NS), &backup("a", "a")).await.expect(201);
    let before = (api.stored().await, api.stored_backups().await);
    let big = "x".repeat(300 * 1024);
    let cases: [(&str, Value, &str, &str); 5] = [
        (
            "label key",
            json!({"labels": {"-bad": "x"}}),
            "metadata.labels",
            "Invalid value: \"-bad\": name part must consist of",
        ),
        (
            "label key prefix",
            json!({"labels": {(format!("{}/a", "p".repeat(254))): "x"}}),
            "metadata.labels",
            "prefix part must be no more than 253 characters",
        ),
        (
            "label value",
            json!({"labels": {"a": "v".repeat(64)}}),
            "metadata.labels",
            "must be no more than 63 characters",
        ),
        (
            "annotation key",
            json!({"annotations": {"a/b/c": "x"}}),
            "metadata.annotations",
            "Invalid value: \"a/b/c\"",
        ),
        (
            "annotation size",
            json!({"annotations": {"big": big}}),
            "metadata.annotations",
            "metadata.annotations: Too long: may not be more than 262144 bytes",
        ),
    ];
    for (case, metadata, field, message) in &cases {
        for (kind, coll_uri, item_uri, mut body) in [
            ("EtcdCluster", coll(NS), cluster_uri.clone(), cluster("a")),
            ("EtcdBackup", backups(NS), backup_uri.clone(), backup("a", "a")),
        ] {
            body["metadata"]
                .as_object_mut()
                .unwrap()
                .extend(metadata.as_object().unwrap().clone());
            let mut created = body.clone();
            created["metadata"]["name"] = json!("new");
            let current = api.get(&item_uri).await.expect(200);
            let mut replaced = body.clone();
            replaced["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
            let patch = json!({"metadata": metadata}).to_string();
            for (verb, r) in [
                ("create", api.post(&coll_uri, &created).await),
                ("replace", api.put(&item_uri, &replaced).await),
                ("patch", api.patch(&item_uri, MERGE, &patch).await),
            ] {
                let what = format!("{case} on {verb} of an {kind}");
                let s = assert_status(&r, 422, "Invalid", message);
                assert_eq!(cause_fields(&s), [*field], "{what}: {s:#}");
                assert_eq!(s["details"]["kind"], kind, "{what}");
            }
        }
    }
    assert_eq!(
        (api.stored().await, api.stored_backups().await),
        before,
        "refused metadata changed what is stored"
    );
}

/// The patch content types of every PATCH operation the served OpenAPI documents (v2 `consumes`,
/// v3 `requestBody.content`) list, with the path of the operation.
async fn advertised_patch_types(api: &Api) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let v2 = api.get("/openapi/v2").await.expect(200);
    for (path, item) in v2["paths"].as_object().unwrap() {
        for ct in item["patch"]["consumes"].as_array().into_iter().flatten() {
            out.insert((path.clone(), ct.as_str().unwrap().to_owned()));
        }
    }
    for version in ["v1alpha1", "v1alpha2"] {
        let v3 = api
            .get(&format!("/openapi/v3/apis/etcd.operator.dev/{version}"))
            .await
            .expect(200);
        for (path, item) in v3["paths"].as_object().unwrap() {
            if let Some(content) = item["patch"]["requestBody"]["content"].as_object() {
                for ct in content.keys() {
                    out.insert((path.clone(), ct.clone()));
                }
            }
        }
    }
    out
}

async fn every_patch_type_the_openapi_documents_list_is_served(backing: Backing) {
    let api = Api::start(backing).await;
    api.create("a").await;
    api.post(&backups(NS), &backup("a", "a")).await.expect(201);
    let advertised = advertised_patch_types(&api).await;
    let types: BTreeSet<&str> = advertised.iter().map(|(_, ct)| ct.as_str()).collect();
    assert_eq!(
        types,
        BTreeSet::from([JSON_PATCH, MERGE, APPLY]),
        "{advertised:#?}"
    );
    // Every (operation, type) pair is accepted: an empty patch of each kind changes nothing, an
    // apply of nothing but the identity too.
    for (path, content_type) in &advertised {
        let mut uri = path.replace("{namespace}", NS).replace("{name}", "a");
        let body = match content_type.as_str() {
            JSON_PATCH => "[]".to_string(),
            APPLY => {
                uri.push_str("?fieldManager=t");
                let version = path.split('/').nth(3).unwrap();
                let kind = if path.contains("etcdbackups") {
                    "EtcdBackup"
                } else {
                    "EtcdCluster"
                };
                format!(
                    "{{\"apiVersion\":\"etcd.operator.dev/{version}\",\"kind\":\"{kind}\",\"metadata\":{{\"name\":\"a\"}}}}"
                )
            }
            _ => "{}".to_string(),
        };
        let r = api.patch(&uri, content_type, &body).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "PATCH {uri} as {content_type}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    // What the documents do not list is refused (CBOR apply; apply through /scale), except
    // strategic merge, served for `kubectl patch` (see the OpenAPI module's note).
    for (path, _) in &advertised {
        let uri = path.replace("{namespace}", NS).replace("{name}", "a");
        let r = api
            .patch(
                &format!("{uri}?fieldManager=t"),
                "application/apply-patch+cbor",
                "metadata: {}",
            )
            .await;
        assert_status(&r, 415, "UnsupportedMediaType", "application/apply-patch+cbor");
        api.patch(&uri, SMP, "{}").await.expect(200);
    }
    let r = api
        .patch(
            &format!("{}/scale?fieldManager=t", obj(NS, "a")),
            APPLY,
            r#"{"apiVersion":"autoscaling/v1","kind":"Scale","spec":{"replicas":3}}"#,
        )
        .await;
    assert_status(&r, 415, "UnsupportedMediaType", "application/apply-patch+yaml");
}

/// `PATCH ...?fieldManager=<manager>[&force=true]` as an apply patch.
async fn apply_as(api: &Api, manager: &str, force: bool, body: &Value) -> Resp {
    let force = if force { "&force=true" } else { "" };
    api.patch(
        &format!("{}?fieldManager={manager}{force}", obj(NS, "a")),
        APPLY,
        &body.to_string(),
    )
    .await
}

/// The managedFields entries of an object, as (manager, operation, subresource, fieldsV1).
fn managed(obj: &Value) -> Vec<(String, String, String, Value)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            assert_eq!(e["fieldsType"], "FieldsV1", "{e}");
            assert!(e["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{e}");
            (
                e["manager"].as_str().unwrap().to_string(),
                e["operation"].as_str().unwrap().to_string(),
                e["subresource"].as_str().unwrap_or_default().to_string(),
                e["fieldsV1"].clone(),
            )
        })
        .collect()
}

fn applied(spec: Value) -> Value {
    json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
        "metadata": {"name": "a"}, "spec": spec})
}

async fn server_side_apply_creates_owns_conflicts_and_forces(backing: Backing) {
    let api = Api::start(backing).await;
    // Apply creates (201); the applier owns what it applied.
    let created = apply_as(
        &api,
        "a",
        false,
        &applied(json!({"replicas": 3, "version": "3.5.21"})),
    )
    .await
    .expect(201);
    assert_eq!(
        managed(&created),
        [(
            "a".into(),
            "Apply".into(),
            String::new(),
            json!({"f:spec": {"f:replicas": {}, "f:version": {}}})
        )]
    );
    assert_eq!(
        created["metadata"]["managedFields"][0]["apiVersion"],
        "etcd.operator.dev/v1alpha2"
    );
    // Another manager setting the same field to another value: 409, nothing written.
    let before = api.stored().await;
    let r = apply_as(&api, "b", false, &applied(json!({"replicas": 5}))).await;
    let s = assert_status(
        &r,
        409,
        "Conflict",
        "Apply failed with 1 conflict: conflict with \"a\": .spec.replicas",
    );
    assert_eq!(s["details"]["causes"][0]["reason"], "FieldManagerConflict");
    assert_eq!(s["details"]["causes"][0]["field"], ".spec.replicas");
    assert_eq!(s["details"]["causes"][0]["message"], "conflict with \"a\"");
    api.assert_unchanged(&before, "a conflicting apply").await;
    // The same value is no conflict: both own it.
    let shared = apply_as(&api, "b", false, &applied(json!({"replicas": 3})))
        .await
        .expect(200);
    assert_eq!(managed(&shared).len(), 2);
    // force=true takes the field.
    let forced = apply_as(&api, "b", true, &applied(json!({"replicas": 5})))
        .await
        .expect(200);
    assert_eq!(forced["spec"]["replicas"], 5);
    let m = managed(&forced);
    assert_eq!(m[0].0, "a");
    assert_eq!(m[0].3, json!({"f:spec": {"f:version": {}}}));
    assert_eq!(m[1].0, "b");
    assert_eq!(m[1].3, json!({"f:spec": {"f:replicas": {}}}));
    // A field the applier stops applying is removed when nobody else owns it...
    let labelled = applied(json!({"version": "3.5.21"}));
    let mut with_label = labelled.clone();
    with_label["metadata"]["labels"] = json!({"tier": "db"});
    let r = apply_as(&api, "a", false, &with_label).await.expect(200);
    assert_eq!(r["metadata"]["labels"]["tier"], "db");
    let r = apply_as(&api, "a", false, &labelled).await.expect(200);
    assert!(
        r["metadata"]
            .get("labels")
            .is_none_or(|l| l.get("tier").is_none()),
        "{r:#}"
    );
    // ...and kept when another manager owns it too (replicas stays: b owns it).
    assert_eq!(r["spec"]["replicas"], 5);
    // Dry run: the would-be object, nothing stored.
    let before = api.stored().await;
    let r = api
        .patch(
            &format!("{}?fieldManager=b&force=true&dryRun=All", obj(NS, "a")),
            APPLY,
            &applied(json!({"replicas": 7})).to_string(),
        )
        .await
        .expect(200);
    assert_eq!(r["spec"]["replicas"], 7);
    api.assert_unchanged(&before, "a dry-run apply").await;
    // YAML is accepted as well as JSON.
    let yaml = "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: a\nspec:\n  replicas: 5\n";
    api.patch(&format!("{}?fieldManager=b", obj(NS, "a")), APPLY, yaml)
        .await
        .expect(200);
}

async fn apply_refuses_bad_input_as_kube_apiserver_does(backing: Backing) {
    let api = Api::start(backing).await;
    api.create("a").await;
    let before = api.stored().await;
    let body = applied(json!({"replicas": 5})).to_string();
    let r = api.patch(&obj(NS, "a"), APPLY, &body).await;
    let s = assert_status(
        &r,
        422,
        "Invalid",
        "fieldManager: Required value: is required for apply patch",
    );
    assert_eq!(s["details"]["kind"], "PatchOptions");
    let r = api
        .patch(&format!("{}?force=true", obj(NS, "a")), MERGE, "{}")
        .await;
    assert_status(
        &r,
        422,
        "Invalid",
        "force: Forbidden: may not be specified for non-apply patch",
    );
    let uri = format!("{}?fieldManager=m", obj(NS, "a"));
    for (body, message) in [
        (
            r#"{"apiVersion":"etcd.operator.dev/v1alpha1","kind":"EtcdCluster"}"#,
            "does not match the expected API version",
        ),
        (
            r#"{"apiVersion":"etcd.operator.dev/v1alpha2","kind":"EtcdBackup"}"#,
            "does not match the expected kind",
        ),
        (
            r#"{"apiVersion":"etcd.operator.dev/v1alpha2"}"#,
            "Object 'Kind' is missing",
        ),
        (
            r#"{"apiVersion":"etcd.operator.dev/v1alpha2","kind":"EtcdCluster","metadata":{"managedFields":[]}}"#,
            "metadata.managedFields must be nil",
        ),
        ("[1, 2", "error decoding YAML"),
        (
            r#"{"apiVersion":"etcd.operator.dev/v1alpha2","kind":"EtcdCluster","metadata":{"name":"b"}}"#,
            "does not match the name on the URL",
        ),
    ] {
        let r = api.patch(&uri, APPLY, body).await;
        assert_status(&r, 400, "BadRequest", message);
    }
    // Invalid applied values are 422 with the field, as for any write.
    let r = api
        .patch(&uri, APPLY, &applied(json!({"replicas": 12})).to_string())
        .await;
    assert_status(&r, 422, "Invalid", "spec.replicas");
    api.assert_unchanged(&before, "refused applies").await;
}

async fn every_write_records_managed_fields(backing: Backing) {
    let api = Api::start(backing).await;
    let created = api
        .post(&format!("{}?fieldManager=creator", coll(NS)), &cluster("a"))
        .await
        .expect(201);
    let m = managed(&created);
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].0.as_str(), m[0].1.as_str()), ("creator", "Update"));
    // What the request set, and (as kube-apiserver does for CRD defaults) what defaulting set.
    assert_eq!(m[0].3["f:spec"]["f:replicas"], json!({}));
    assert_eq!(m[0].3["f:spec"]["f:version"], json!({}));
    assert!(m[0].3["f:spec"].get("f:storage").is_some(), "{:?}", m[0].3);
    // Identity metadata is never tracked.
    assert!(m[0].3.get("f:metadata").is_none(), "{:?}", m[0].3);
    // An applier changing an Update manager's field conflicts with it, named with its version.
    let r = apply_as(&api, "a", false, &applied(json!({"replicas": 5}))).await;
    assert_status(
        &r,
        409,
        "Conflict",
        "conflict with \"creator\" using etcd.operator.dev/v1alpha2 at ",
    );
    // A merge patch is an Update of its manager, which takes the field from the creator.
    let patched = api
        .patch(
            &format!("{}?fieldManager=patcher", obj(NS, "a")),
            MERGE,
            r#"{"spec":{"replicas":5}}"#,
        )
        .await
        .expect(200);
    let m = managed(&patched);
    assert!(m[0].3["f:spec"].get("f:replicas").is_none(), "{:?}", m[0].3);
    assert!(m[0].3["f:spec"].get("f:version").is_some(), "{:?}", m[0].3);
    assert_eq!((m[1].0.as_str(), m[1].1.as_str()), ("patcher", "Update"));
    assert_eq!(m[1].3, json!({"f:spec": {"f:replicas": {}}}));
    // An identical write changes nothing, not even the times.
    let again = api
        .patch(
            &format!("{}?fieldManager=patcher", obj(NS, "a")),
            MERGE,
            r#"{"spec":{"replicas":5}}"#,
        )
        .await
        .expect(200);
    assert_eq!(
        again["metadata"]["resourceVersion"],
        patched["metadata"]["resourceVersion"]
    );
    // Status writes are tracked apart, with their subresource.
    let status = api
        .patch(
            &format!("{}/status?fieldManager=ctl", obj(NS, "a")),
            MERGE,
            r#"{"status":{"observedGeneration":1}}"#,
        )
        .await
        .expect(200);
    let m = managed(&status);
    let ctl = m
        .iter()
        .find(|e| e.0 == "ctl")
        .expect("the status writer's entry");
    assert_eq!((ctl.1.as_str(), ctl.2.as_str()), ("Update", "status"));
    assert_eq!(ctl.3, json!({"f:status": {"f:observedGeneration": {}}}));
    // Scale too.
    let uri = format!("{}/scale?fieldManager=hpa", obj(NS, "a"));
    api.patch(&uri, MERGE, r#"{"spec":{"replicas":3}}"#)
        .await
        .expect(200);
    let now = api.get(&obj(NS, "a")).await.expect(200);
    let m = managed(&now);
    let hpa = m.iter().find(|e| e.0 == "hpa").expect("the scale writer's entry");
    assert_eq!((hpa.1.as_str(), hpa.2.as_str()), ("Update", "scale"));
    assert_eq!(hpa.3, json!({"f:spec": {"f:replicas": {}}}));
    assert!(
        !m.iter().any(|e| e.0 == "patcher"),
        "patcher lost its only field: {m:?}"
    );
    // In v1alpha1 the same write is spelled in v1alpha1's fields.
    let v1 = format!("{GROUP_PATH}/v1alpha1/namespaces/{NS}/etcdclusters/a?fieldManager=old");
    let r = api.patch(&v1, MERGE, r#"{"spec":{"size":5}}"#).await.expect(200);
    let entry = r["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "old")
        .unwrap()
        .clone();
    assert_eq!(entry["apiVersion"], "etcd.operator.dev/v1alpha1");
    assert_eq!(entry["fieldsV1"], json!({"f:spec": {"f:size": {}}}));
    // A client may rewrite the entries (kubectl's migration to server-side apply does);
    // `[{}]` resets them.
    let reset = api
        .patch(&obj(NS, "a"), MERGE, r#"{"metadata":{"managedFields":[{}]}}"#)
        .await
        .expect(200);
    assert!(reset["metadata"].get("managedFields").is_none(), "{reset:#}");
    let rewritten = json!([{"manager": "kubectl", "operation": "Apply", "apiVersion": "etcd.operator.dev/v1alpha2", "time": "2026-01-01T00:00:00Z",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]);
    let r = api
        .patch(
            &obj(NS, "a"),
            JSON_PATCH,
            &json!([{"op": "add", "path": "/metadata/managedFields", "value": rewritten}]).to_string(),
        )
        .await
        .expect(200);
    assert_eq!(managed(&r)[0].0, "kubectl");
    let r = apply_as(&api, "other", false, &applied(json!({"replicas": 4}))).await;
    assert_status(&r, 409, "Conflict", "conflict with \"kubectl\": .spec.replicas");
}

async fn strategic_merge_patch_is_served_with_list_semantics(backing: Backing) {
    let api = Api::start(backing).await;
    api.create("a").await;
    let r = api
        .patch(
            &obj(NS, "a"),
            SMP,
            r#"{"metadata":{"finalizers":["x.io/a"],"labels":{"l":"1"}},"spec":{"replicas":5}}"#,
        )
        .await
        .expect(200);
    assert_eq!(r["spec"]["replicas"], 5);
    // finalizers is a set: a second patch adds, `$deleteFromPrimitiveList` removes.
    let r = api
        .patch(&obj(NS, "a"), SMP, r#"{"metadata":{"finalizers":["x.io/b"]}}"#)
        .await
        .expect(200);
    assert_eq!(r["metadata"]["finalizers"], json!(["x.io/a", "x.io/b"]));
    let r = api
        .patch(
            &obj(NS, "a"),
            SMP,
            r#"{"metadata":{"$deleteFromPrimitiveList/finalizers":["x.io/a","x.io/b"],"labels":{"$patch":"replace"}}}"#,
        )
        .await
        .expect(200);
    assert!(
        r["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty),
        "{r:#}"
    );
    assert!(
        r["metadata"]["labels"].as_object().is_none_or(|l| l.is_empty()),
        "{r:#}"
    );
    let before = api.stored().await;
    let r = api
        .patch(&obj(NS, "a"), SMP, r#"{"spec":{"$patch":"sideways"}}"#)
        .await;
    assert_status(&r, 400, "BadRequest", "unknown patch type");
    let r = api.patch(&obj(NS, "a"), SMP, r#"{"spec":{"replicas":12}}"#).await;
    assert_status(&r, 422, "Invalid", "spec.replicas");
    api.assert_unchanged(&before, "refused strategic merge patches")
        .await;
}

async fn namespaces_must_be_dns_labels(backing: Backing) {
    let api = Api::start(backing).await;
    let before = api.stored().await;
    let long = "n".repeat(64);
    for ns in ["Bad_NS", "-x", long.as_str()] {
        let r = api.post(&coll(ns), &cluster("a")).await;
        let s = assert_status(&r, 422, "Invalid", "metadata.namespace: Invalid value");
        assert_eq!(cause_fields(&s), ["metadata.namespace"], "{ns}");
        let r = api
            .patch(
                &format!("{}?fieldManager=m", obj(ns, "a")),
                APPLY,
                &applied(json!({"replicas": 3, "version": "3.5.21"})).to_string(),
            )
            .await;
        assert_status(&r, 422, "Invalid", "metadata.namespace");
        let r = api.post(&backups(ns), &backup("b", "a")).await;
        assert_status(&r, 422, "Invalid", "metadata.namespace");
    }
    api.assert_unchanged(&before, "objects in invalid namespaces")
        .await;
    assert!(api.stored_backups().await.is_empty());
    // Any DNS-1123 label is a namespace in local mode: no Namespace object is needed.
    api.create_in("never-created-before", &cluster("a")).await;
}

async fn aggregated_discovery_is_served_in_v2_and_v2beta1(backing: Backing) {
    let api = Api::start(backing).await;
    let beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
    let r = api.get_accept("/apis", &format!("{beta},application/json")).await;
    let doc = r.expect(200);
    assert_eq!(r.header("content-type"), Some(beta));
    assert_eq!(doc["apiVersion"], "apidiscovery.k8s.io/v2beta1");
    assert_eq!(doc["items"][0]["metadata"]["name"], "etcd.operator.dev");
    let etag = r.header("etag").unwrap().to_string();
    let v2 = api.get_accept("/apis", AGGREGATED_ACCEPT).await;
    assert_eq!(v2.expect(200)["apiVersion"], "apidiscovery.k8s.io/v2");
    assert_ne!(
        v2.header("etag"),
        Some(etag.as_str()),
        "each version has its own ETag"
    );
    assert_eq!(v2.json()["items"], doc["items"]);
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// The value of the series `series` (`name{labels}` exactly as exposed) in a scrape; 0 when the
/// scrape does not have it.
fn sample(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.parse().unwrap())
}

async fn scrape(api: &Api) -> String {
    let r = api.get("/metrics").await;
    assert_eq!(r.status, StatusCode::OK, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    text
}

fn requests(verb: &str, resource: &str, subresource: &str, code: u16) -> String {
    let group = if resource.is_empty() {
        ""
    } else {
        "etcd.operator.dev"
    };
    let version = if resource.is_empty() { "" } else { "v1alpha2" };
    format!(
        r#"apiserver_request_total{{verb="{verb}",group="{group}",version="{version}",resource="{resource}",subresource="{subresource}",code="{code}"}}"#
    )
}

async fn metrics_count_requests_by_verb_resource_and_code(backing: Backing) {
    let api = Api::start(backing).await;
    let before = scrape(&api).await;
    api.create("m1").await;
    api.get(&obj(NS, "m1")).await.expect(200);
    api.get(&obj(NS, "m1")).await.expect(200);
    api.get(&obj(NS, "missing")).await.expect(404);
    api.get(&coll(NS)).await.expect(200);
    api.patch(
        &format!("{}/scale", obj(NS, "m1")),
        MERGE,
        r#"{"spec":{"replicas":5}}"#,
    )
    .await
    .expect(200);
    // The same values the object holds (no conflict with the creator's fields).
    let applied = json!({
        "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "metadata": {"name": "m1"},
        "spec": {"replicas": 5, "version": etcd_operator_api::versions::DEFAULT_ETCD_VERSION},
    });
    api.patch(
        &format!("{}?fieldManager=tester", obj(NS, "m1")),
        APPLY,
        &applied.to_string(),
    )
    .await
    .expect(200);
    api.post(&coll(NS), &cluster("m1")).await.expect(409);
    api.delete(&obj(NS, "m1"), None).await.expect(200);
    // A watch is counted while it is open and not after.
    let watch = api
        .app
        .clone()
        .oneshot(
            Request::get(format!("{}?watch=true", coll(NS)))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(watch.status(), StatusCode::OK);
    let watching = scrape(&api).await;
    drop(watch);
    let after = scrape(&api).await;

    let delta = |series: String| sample(&after, &series) - sample(&before, &series);
    for (series, want) in [
        (requests("create", "etcdclusters", "", 201), 1.0),
        (requests("create", "etcdclusters", "", 409), 1.0),
        (requests("get", "etcdclusters", "", 200), 2.0),
        (requests("get", "etcdclusters", "", 404), 1.0),
        (requests("list", "etcdclusters", "", 200), 1.0),
        (requests("patch", "etcdclusters", "scale", 200), 1.0),
        (requests("apply", "etcdclusters", "", 200), 1.0),
        (requests("delete", "etcdclusters", "", 200), 1.0),
        (requests("watch", "etcdclusters", "", 200), 1.0),
        // the scrapes before `after` (the first one is counted after it is answered)
        (requests("get", "", "", 200), 2.0),
    ] {
        assert_eq!(
            delta(series.clone()),
            want,
            "{series}\nbefore:\n{before}\nafter:\n{after}"
        );
    }
    let gets = r#"apiserver_request_duration_seconds_count{verb="get",group="etcd.operator.dev",version="v1alpha2",resource="etcdclusters",subresource=""}"#;
    assert_eq!(delta(gets.to_owned()), 3.0, "{after}");
    let slowest = r#"apiserver_request_duration_seconds_bucket{le="+Inf",verb="get",group="etcd.operator.dev",version="v1alpha2",resource="etcdclusters",subresource=""}"#;
    assert_eq!(delta(slowest.to_owned()), 3.0, "{after}");
    let watchers = r#"apiserver_registered_watchers{group="etcd.operator.dev",resource="etcdclusters"}"#;
    assert_eq!(sample(&watching, watchers), 1.0, "{watching}");
    assert_eq!(sample(&after, watchers), 0.0, "{after}");
}

async fn metrics_need_the_credentials_the_api_needs(backing: Backing) {
    let api = Api::start_with(backing, Arc::new(LocalAuthenticator)).await;
    let r = api.get("/metrics").await;
    assert_status(&r, 401, "Unauthorized", "Unauthorized");
}

// ---------------------------------------------------------------------------------------------
// Every test above, once on each backing store: `in_memory::<test>` (no etcd, milliseconds) and
// `on_etcd::<test>` (the same body against a real etcd). Compaction tests run on both: the
// in-memory store compacts like etcd (older reads and watches fail with etcd's error). Only
// the snapshot test is etcd-only (it needs a real etcd member to stream a snapshot from).

macro_rules! both_backings {
    ($($name:ident),* $(,)?) => {
        mod in_memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Backing::Memory).await
                }
            )*
        }
        mod on_etcd {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Backing::Etcd).await
                }
            )*
        }
    };
}

both_backings!(
    resource_versions_that_are_not_numbers_are_invalid_input_not_conflicts,
    a_create_answers_with_the_object_a_get_returns,
    local_authenticator_refuses_requests_without_a_client_certificate_except_health_checks,
    malformed_and_non_object_bodies_are_400_and_store_nothing,
    wrong_kind_or_api_version_is_400_and_stores_nothing,
    identity_metadata_that_disagrees_with_the_request_is_refused,
    invalid_objects_are_422_with_every_cause_and_store_nothing,
    conflicts_and_existing_names_are_409_and_missing_resource_versions_422,
    missing_objects_are_404_for_every_verb,
    bodies_over_3_mib_are_413,
    unsupported_content_types_are_415_and_unsatisfiable_accepts_406,
    unknown_paths_are_404_and_wrong_methods_405,
    unknown_fields_follow_field_validation,
    dry_run_stores_nothing,
    bad_selectors_are_400,
    list_and_watch_options_kube_apiserver_forbids_are_422,
    failing_and_malformed_patches_change_nothing,
    delete_preconditions_that_do_not_match_are_409_and_delete_nothing,
    finalizers_hold_deletion_until_the_last_one_is_removed,
    the_controllers_finalizer_is_added_at_create_only_where_it_manages,
    deletecollection_deletes_exactly_the_selected_objects,
    status_writes_change_only_status_and_main_writes_ignore_status,
    scale_subresource_reads_and_writes_replicas,
    generation_bumps_only_for_spec_changes_and_identical_writes_are_no_ops,
    generate_name_completes_the_name,
    list_pages_through_every_object_exactly_once,
    an_expired_continue_token_is_410_with_an_inconsistent_continue_token,
    a_watch_from_a_compacted_resource_version_is_an_error_event_with_410,
    tables_and_partial_object_metadata,
    discovery_and_openapi_are_cacheable,
    odd_input_gets_a_client_error_never_a_server_error,
    a_watch_from_a_resource_version_reports_changes_and_selector_exits,
    watch_list_bookmarks_come_in_the_negotiated_representation,
    etcdbackups_are_served_with_every_verb_status_and_validation,
    every_patch_type_the_openapi_documents_list_is_served,
    labels_and_annotations_are_validated_like_kube_apiserver,
    server_side_apply_creates_owns_conflicts_and_forces,
    apply_refuses_bad_input_as_kube_apiserver_does,
    every_write_records_managed_fields,
    strategic_merge_patch_is_served_with_list_semantics,
    aggregated_discovery_is_served_in_v2_and_v2beta1,
    namespaces_must_be_dns_labels,
    metrics_count_requests_by_verb_resource_and_code,
    metrics_need_the_credentials_the_api_needs,
);
