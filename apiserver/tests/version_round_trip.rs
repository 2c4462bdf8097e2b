//! A GET in either served version followed by a PUT of the same body in that version is accepted
//! and changes nothing, for generated valid v1alpha2 objects — including the ones that use
//! settings v1alpha1 cannot express (cron schedules, S3 or volume destinations with their own
//! names, retention by age, the storage medium, TLS issued by cert-manager or the operator, a
//! bootstrap restore, maintenance and replacement settings). Driven through the real router
//! over the in-memory store, as a client such as `kubectl get -o yaml | kubectl replace -f -`
//! or a GitOps tool holding v1alpha1 manifests would.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use etcd_operator_apiserver::http::auth::{AllowAuthenticated, AuthenticateFuture, Authenticator, UserInfo};
use etcd_operator_apiserver::http::openapi::Documents;
use etcd_operator_apiserver::http::{AppState, Stores, router};
use etcd_operator_apiserver::storage::backend::{Backend, MemoryBackend};
use etcd_operator_apiserver::storage::{Storage, StorageOptions};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use proptest::option::of;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use serde_json::{Map, Value, json};
use tower::ServiceExt;

const CASES: u32 = 192;
const NS: &str = "team-a";

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

async fn app() -> axum::Router {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let stores =
        Stores::open(|prefix| Storage::with_backend(Arc::clone(&backend), prefix, StorageOptions::default()))
            .await
            .unwrap();
    for storage in stores.all() {
        storage.wait_initialized(Duration::from_secs(10)).await.unwrap();
    }
    router(AppState {
        stores,
        authenticator: Arc::new(FixedUser),
        authorizer: Arc::new(AllowAuthenticated),
        openapi: Arc::new(Documents::generate().unwrap()),
        snapshots: None,
        namespaces: None,
        metrics: None,
        controller_init: Arc::new([]),
    })
}

async fn call(app: &axum::Router, method: Method, uri: &str, body: Option<&Value>) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    let body = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            Body::from(b.to_string())
        }
        None => Body::empty(),
    };
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

async fn call_with(
    app: &axum::Router,
    method: Method,
    uri: &str,
    content_type: &str,
    body: &Value,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

fn collection(version: &str) -> String {
    format!("/apis/etcd.operator.dev/{version}/namespaces/{NS}/etcdclusters")
}

// --- generated valid v1alpha2 specs (JSON, as a client sends them)

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9]{0,8}"
}

/// Inserts the present values of `fields` into an object.
fn object(fields: Vec<(&'static str, Option<Value>)>) -> Value {
    let map: Map<String, Value> = fields
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
        .collect();
    Value::Object(map)
}

fn labels() -> impl Strategy<Value = Value> {
    proptest::collection::btree_map("[a-z]{1,5}", "[a-z0-9]{0,5}", 1..3).prop_map(|m| json!(m))
}

fn pod_template() -> impl Strategy<Value = Value> {
    let resources = ("[1-9][0-9]{0,2}", prop_oneof![Just("Mi"), Just("Gi")])
        .prop_map(|(n, unit)| json!({"requests": {"memory": format!("{n}{unit}")}, "limits": {"cpu": "1"}}));
    let spread = name().prop_map(|key| {
        json!([{"maxSkew": 1, "topologyKey": format!("topology.kubernetes.io/{key}"), "whenUnsatisfiable": "ScheduleAnyway"}])
    });
    let toleration =
        name().prop_map(|key| json!([{"key": key, "operator": "Exists", "effect": "NoSchedule"}]));
    (
        of(labels()),
        of(labels()),
        of(resources),
        of(labels()),
        of(toleration),
        of(spread),
        of(name()),
    )
        .prop_map(
            |(labels, annotations, resources, node_selector, tolerations, spread, priority)| {
                let metadata = object(vec![("labels", labels), ("annotations", annotations)]);
                let spec = object(vec![
                    ("resources", resources),
                    ("nodeSelector", node_selector),
                    ("tolerations", tolerations),
                    ("topologySpreadConstraints", spread),
                    ("priorityClassName", priority.map(Value::String)),
                ]);
                object(vec![
                    ("metadata", (metadata != json!({})).then_some(metadata)),
                    ("spec", (spec != json!({})).then_some(spec)),
                ])
            },
        )
}

/// Storage and replicas together (medium Memory forbids a storage class).
fn storage() -> impl Strategy<Value = Value> {
    prop_oneof![
        (of("[1-9][0-9]?Gi"), of(name())).prop_map(|(size, class)| object(vec![
            ("medium", Some(json!("Disk"))),
            ("size", size.map(Value::String)),
            ("storageClassName", class.map(Value::String)),
        ])),
        of("[1-9][0-9]?Gi").prop_map(|size| object(vec![
            ("medium", Some(json!("Memory"))),
            ("size", size.map(Value::String)),
        ])),
        (of("[1-9]Gi"), of(name())).prop_map(|(size, class)| object(vec![
            ("size", size.map(Value::String)),
            ("storageClassName", class.map(Value::String))
        ])),
    ]
}

fn tls_plane() -> impl Strategy<Value = Value> {
    prop_oneof![
        name().prop_map(|n| json!({"secretRef": {"name": n}})),
        (name(), prop_oneof![Just("Issuer"), Just("ClusterIssuer")])
            .prop_map(|(n, kind)| json!({"certManager": {"issuerRef": {"name": n, "kind": kind}}})),
        Just(json!({"auto": {}})),
    ]
}

fn destination() -> impl Strategy<Value = Value> {
    let s3 = (
        "[a-z][a-z0-9]{2,8}",
        of("[a-z]{1,5}(/[a-z]{1,5})?"),
        of(Just("http://127.0.0.1:9000")),
        of(Just("eu-west-1")),
        of(name()),
        of(any::<bool>()),
    )
        .prop_map(|(bucket, prefix, endpoint, region, secret, path_style)| {
            json!({"s3": object(vec![
                ("bucket", Some(json!(bucket))),
                ("prefix", prefix.map(Value::String)),
                ("endpoint", endpoint.map(|e| json!(e))),
                ("region", region.map(|r| json!(r))),
                ("credentialsSecret", secret.map(Value::String)),
                ("forcePathStyle", path_style.map(Value::Bool)),
            ])})
        });
    let volume = prop_oneof![
        name().prop_map(|claim| json!({"volume": {"claimName": claim}})),
        "/[a-z]{1,6}".prop_map(|path| json!({"volume": {"path": path}})),
    ];
    prop_oneof![s3, volume]
}

fn backup() -> impl Strategy<Value = Value> {
    let schedule = prop_oneof![
        Just("*/5 * * * *"),
        Just("0 */6 * * *"),
        Just("0 0 * * *"),
        Just("17 3 * * 1"),
        Just("30 2 * * *"),
        Just("0 */5 * * *"),
    ];
    let retention = (of(1..50i32), of(prop_oneof![Just("72h"), Just("30m")])).prop_map(|(count, age)| {
        object(vec![
            ("maxCount", count.map(|c| json!(c))),
            ("maxAge", age.map(|a| json!(a))),
        ])
    });
    (schedule, of(retention), destination()).prop_map(|(schedule, retention, destination)| {
        object(vec![
            ("schedule", Some(json!(schedule))),
            ("retention", retention),
            ("destination", Some(destination)),
        ])
    })
}

fn bootstrap() -> impl Strategy<Value = Value> {
    prop_oneof![
        name().prop_map(|b| json!({"restore": {"backupName": b}})),
        name().prop_map(
            |k| json!({"restore": {"source": {"url": format!("https://backups.example.com/{k}.db")}}})
        ),
        (name(), destination())
            .prop_map(|(k, d)| json!({"restore": {"source": {"key": k, "destination": d}}})),
    ]
}

fn maintenance() -> impl Strategy<Value = Value> {
    (
        of(prop_oneof![
            Just(json!({"mode": "Periodic", "retention": "1h"})),
            Just(json!({"mode": "Revision", "retention": "10000"}))
        ]),
        of(prop_oneof![Just("64Mi"), Just("2Gi")]),
        of(prop_oneof![
            Just(json!({"schedule": "0 3 * * 0"})),
            Just(json!({"fragmentationPercent": 40}))
        ]),
    )
        .prop_map(|(compaction, quota, defrag)| {
            object(vec![
                ("autoCompaction", compaction),
                ("quotaBackendBytes", quota.map(|q| json!(q))),
                ("defragmentation", defrag),
            ])
        })
}

fn replacement() -> impl Strategy<Value = Value> {
    (
        of(prop_oneof![Just("Automatic"), Just("Manual")]),
        of(Just("5m")),
        of(Just("2m")),
    )
        .prop_map(|(policy, unhealthy, crash)| {
            object(vec![
                ("policy", policy.map(|p| json!(p))),
                ("unhealthyAfter", unhealthy.map(|u| json!(u))),
                ("crashLoopAfter", crash.map(|c| json!(c))),
            ])
        })
}

fn cluster() -> impl Strategy<Value = Value> {
    let spec = (
        of(1..=5i32),
        of(prop_oneof![Just("3.5.34"), Just("3.6.15"), Just("3.4.23")]),
        of(pod_template()),
        of(storage()),
        of((of(tls_plane()), of(tls_plane()))),
        of(backup()),
        of(bootstrap()),
        of(maintenance()),
        of(replacement()),
        of(any::<bool>()),
    )
        .prop_map(
            |(
                replicas,
                version,
                template,
                storage,
                tls,
                backup,
                bootstrap,
                maintenance,
                replacement,
                paused,
            )| {
                let tls = tls.map(|(client, peer)| object(vec![("client", client), ("peer", peer)]));
                object(vec![
                    ("replicas", replicas.map(|r| json!(r))),
                    ("version", version.map(|v| json!(v))),
                    ("podTemplate", template),
                    ("storage", storage),
                    ("tls", tls),
                    ("backup", backup),
                    ("bootstrap", bootstrap),
                    ("maintenance", maintenance),
                    ("replacement", replacement),
                    ("paused", paused.map(Value::Bool)),
                ])
            },
        );
    (spec, of(labels())).prop_map(|(spec, labels)| {
        json!({
            "apiVersion": "etcd.operator.dev/v1alpha2",
            "kind": "EtcdCluster",
            "metadata": object(vec![("labels", labels)]),
            "spec": spec,
        })
    })
}

/// Creates `obj`, then for each version: GET in it, PUT the body back in it, and checks the PUT
/// was accepted and the stored object (read in v1alpha2, the storage version) is unchanged,
/// resourceVersion included: nothing was written.
async fn round_trip(app: &axum::Router, mut obj: Value, name: String) -> Result<(), TestCaseError> {
    obj["metadata"]["name"] = json!(name);
    let (status, created) = call(app, Method::POST, &collection("v1alpha2"), Some(&obj)).await;
    prop_assert_eq!(status, StatusCode::CREATED, "create: {:#}", created);
    let stored_uri = format!("{}/{name}", collection("v1alpha2"));
    for version in ["v1alpha1", "v1alpha2"] {
        let (_, before) = call(app, Method::GET, &stored_uri, None).await;
        let uri = format!("{}/{name}", collection(version));
        let (status, read) = call(app, Method::GET, &uri, None).await;
        prop_assert_eq!(status, StatusCode::OK, "get in {}: {:#}", version, read);
        let (status, written) = call(app, Method::PUT, &uri, Some(&read)).await;
        prop_assert_eq!(
            status,
            StatusCode::OK,
            "PUT in {} of the body read in {} was refused: {:#}\nthe body: {:#}",
            version,
            version,
            written,
            read
        );
        let (_, after) = call(app, Method::GET, &stored_uri, None).await;
        prop_assert_eq!(
            &after,
            &before,
            "a GET + PUT in {} changed the stored object",
            version
        );

        // Server-side apply of the same body (without the server's bookkeeping, as `kubectl
        // apply --server-side` sends it): accepted, and the object's content is unchanged (the
        // applier's managedFields entry is the one thing it adds).
        let mut applied = read.clone();
        if let Some(meta) = applied["metadata"].as_object_mut() {
            for key in [
                "managedFields",
                "resourceVersion",
                "creationTimestamp",
                "generation",
                "uid",
            ] {
                meta.remove(key);
            }
        }
        applied.as_object_mut().map(|o| o.remove("status"));
        let (status, result) = call_with(
            app,
            Method::PATCH,
            &format!("{uri}?fieldManager=gitops&force=true"),
            "application/apply-patch+yaml",
            &applied,
        )
        .await;
        prop_assert_eq!(
            status,
            StatusCode::OK,
            "apply in {}: {:#}\nthe body: {:#}",
            version,
            result,
            applied
        );
        let (_, after) = call(app, Method::GET, &stored_uri, None).await;
        prop_assert_eq!(
            &after["spec"],
            &before["spec"],
            "an apply in {} changed the spec",
            version
        );
        prop_assert_eq!(
            &after["metadata"]["annotations"],
            &before["metadata"]["annotations"],
            "an apply in {} changed the annotations",
            version
        );
        prop_assert_eq!(
            &after["metadata"]["generation"],
            &before["metadata"]["generation"]
        );
    }

    // A v1alpha1 client edits a v1alpha1 field (the size): the edit lands, and every setting
    // only v1alpha2 has is kept.
    let (_, before) = call(app, Method::GET, &stored_uri, None).await;
    let uri = format!("{}/{name}", collection("v1alpha1"));
    let (_, mut read) = call(app, Method::GET, &uri, None).await;
    let size = read["spec"]["size"].as_i64().unwrap_or(3);
    let new_size = if size == 5 { 3 } else { 5 };
    read["spec"]["size"] = json!(new_size);
    let (status, written) = call(app, Method::PUT, &uri, Some(&read)).await;
    prop_assert_eq!(status, StatusCode::OK, "edit in v1alpha1: {:#}", written);
    let (_, after) = call(app, Method::GET, &stored_uri, None).await;
    let mut want = before["spec"].clone();
    want["replicas"] = json!(new_size);
    prop_assert_eq!(
        &after["spec"],
        &want,
        "a v1alpha1 edit of spec.size lost v1alpha2 settings"
    );
    prop_assert_eq!(
        &after["metadata"]["annotations"],
        &before["metadata"]["annotations"]
    );
    Ok(())
}

#[test]
fn get_then_put_in_either_version_changes_nothing() {
    let outcome = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let app = rt.block_on(app());
            let counter = AtomicUsize::new(0);
            let mut runner = TestRunner::new(ProptestConfig::with_cases(CASES));
            runner
                .run(&cluster(), |obj| {
                    let name = format!("c{}", counter.fetch_add(1, Ordering::Relaxed));
                    rt.block_on(round_trip(&app, obj, name))
                })
                .map_err(|e| e.to_string())
        })
        .unwrap()
        .join()
        .unwrap();
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
