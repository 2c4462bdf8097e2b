//! Bad input of bounded cost (issue 26, item 4): objects near the 3 MiB request limit with huge
//! label, annotation and finalizer lists, several at once, against the real router over a real
//! etcd, on a two-worker runtime like the binary's on a two-core machine. While they are being
//! admitted, other requests (`GET` of another object, `/readyz`) keep being answered; the
//! accepted ones round-trip intact, the refused ones get their status and field path and store
//! nothing. No wall-clock bound: "responsive" is an order of events (answers to the other
//! requests while none of the huge ones has been answered yet). The time an admission takes is in
//! the benchmark (`make bench`, "huge labels"), not here.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use etcd_operator_apiserver::http::auth::{AllowAuthenticated, AuthenticateFuture, Authenticator, UserInfo};
use etcd_operator_apiserver::http::body::MAX_BODY_BYTES;
use etcd_operator_apiserver::http::openapi::Documents;
use etcd_operator_apiserver::http::{AppState, Stores, router};
use etcd_operator_apiserver::registry::kind::Kind;
use etcd_operator_apiserver::storage::backend::{Backend, EtcdBackend, RangeRequest, prefix_end};
use etcd_operator_apiserver::storage::{Storage, StorageOptions};
use etcd_operator_tests::{EtcdVersion, TestEtcd};
use http::{Method, Request};
use http_body_util::BodyExt;
use serde_json::{Map, Value, json};
use tower::ServiceExt;

const PREFIX: &str = "/registry/etcd.operator.dev/etcdclusters/";
const COLL: &str = "/apis/etcd.operator.dev/v1alpha2/namespaces/team-a/etcdclusters";

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

async fn call(app: &axum::Router, method: Method, uri: &str, body: String) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

fn cluster(name: &str, metadata: Value) -> Value {
    let mut meta = metadata;
    meta["name"] = json!(name);
    json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "metadata": meta,
        "spec": {"replicas": 3, "version": etcd_operator_api::versions::DEFAULT_ETCD_VERSION}})
}

fn map(n: usize, entry: impl Fn(usize) -> (String, String)) -> Map<String, Value> {
    (0..n)
        .map(|i| {
            let (k, v) = entry(i);
            (k, Value::String(v))
        })
        .collect()
}

/// One huge request: what is sent, and what must come back.
struct Huge {
    name: &'static str,
    body: String,
    /// 201, 422 or 413.
    code: u16,
}

fn huge_requests() -> Vec<Huge> {
    // Accepted: as large as the backing etcd takes (its default request limit is 1.5 MiB and the
    // stored form carries every field again in managedFields).
    let labels = map(20_000, |i| (format!("example.com/k{i:05}"), format!("v{i}")));
    let finalizers: Vec<String> = (0..12_000).map(|i| format!("example.com/f{i}")).collect();
    // Refused by validation, near the request limit: 2.9 MB of valid annotations (more than the
    // 256 KiB all annotations may take), and 20,000 label keys that are not qualified names.
    let annotations = map(140_000, |i| (format!("a{i:06}"), "012345678".into()));
    let bad_labels = map(20_000, |i| (format!("bad key {i}"), "v".into()));
    let over_limit = "x".repeat(MAX_BODY_BYTES);
    let huge = [
        ("huge-labels", json!({"labels": labels}), 201),
        ("huge-finalizers", json!({"finalizers": finalizers}), 201),
        ("huge-annotations", json!({"annotations": annotations}), 422),
        ("bad-labels", json!({"labels": bad_labels}), 422),
        ("over-limit", json!({"annotations": {"a": over_limit}}), 413),
    ];
    huge.into_iter()
        .map(|(name, metadata, code)| Huge {
            name,
            body: cluster(name, metadata).to_string(),
            code,
        })
        .collect()
}

/// Keys under the prefix, and the store's revision.
async fn stored(backend: &Arc<dyn Backend>) -> (BTreeSet<String>, u64) {
    let resp = backend
        .range(RangeRequest {
            key: PREFIX.as_bytes().to_vec(),
            range_end: prefix_end(PREFIX.as_bytes()),
            revision: None,
            limit: None,
        })
        .await
        .unwrap();
    let keys = resp
        .kvs
        .iter()
        .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
        .collect();
    (keys, resp.revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_objects_are_admitted_or_refused_while_the_server_answers_others() {
    let etcd = TestEtcd::start(EtcdVersion::V3_5_1)
        .await
        .expect("start etcd 3.5.1 (install it with `make tools`)");
    let backend: Arc<dyn Backend> = Arc::new(EtcdBackend::new(etcd.client().await.unwrap()));
    let stores =
        Stores::open(|prefix| Storage::with_backend(Arc::clone(&backend), prefix, StorageOptions::default()))
            .await
            .unwrap();
    for storage in stores.all() {
        storage.wait_initialized(Duration::from_secs(10)).await.unwrap();
    }
    assert_eq!(stores.get(Kind::CLUSTER).unwrap().prefix(), PREFIX);
    let app = router(AppState {
        stores,
        authenticator: Arc::new(FixedUser),
        authorizer: Arc::new(AllowAuthenticated),
        openapi: Arc::new(Documents::generate().unwrap()),
        snapshots: None,
        namespaces: None,
        metrics: None,
        controller_init: Arc::new([]),
    });
    let (code, other) = call(&app, Method::POST, COLL, cluster("other", json!({})).to_string()).await;
    assert_eq!(code, 201, "{other}");
    let (keys_before, revision_before) = stored(&backend).await;

    let requests = huge_requests();
    let admissions = requests.iter().filter(|r| r.code != 413).count();
    // How many of the huge requests that go through admission have been answered.
    let answered = Arc::new(AtomicUsize::new(0));
    let mut huge = Vec::new();
    for r in &requests {
        let (app, answered, body, counts) =
            (app.clone(), Arc::clone(&answered), r.body.clone(), r.code != 413);
        huge.push(tokio::spawn(async move {
            let out = call(&app, Method::POST, COLL, body).await;
            if counts {
                answered.fetch_add(1, Ordering::SeqCst);
            }
            out
        }));
    }
    // Meanwhile, on the same workers: a GET of another object and /readyz, again and again.
    let prober = {
        let (app, answered) = (app.clone(), Arc::clone(&answered));
        let other_uri = format!("{COLL}/other");
        let expected = other.clone();
        tokio::spawn(async move {
            let (mut gets_meanwhile, mut readyz_meanwhile) = (0, 0);
            while answered.load(Ordering::SeqCst) < admissions {
                let (code, got) = call(&app, Method::GET, &other_uri, String::new()).await;
                assert_eq!((code, &got), (200, &expected));
                if answered.load(Ordering::SeqCst) == 0 {
                    gets_meanwhile += 1;
                }
                let (code, _) = call(&app, Method::GET, "/readyz", String::new()).await;
                assert_eq!(code, 200);
                if answered.load(Ordering::SeqCst) == 0 {
                    readyz_meanwhile += 1;
                }
                tokio::task::yield_now().await;
            }
            (gets_meanwhile, readyz_meanwhile)
        })
    };
    let mut results = Vec::new();
    for h in huge {
        results.push(h.await.unwrap());
    }
    let (gets_meanwhile, readyz_meanwhile) = prober.await.unwrap();
    assert!(
        gets_meanwhile >= 3 && readyz_meanwhile >= 3,
        "while {admissions} huge objects were being admitted, only {gets_meanwhile} GETs and \
         {readyz_meanwhile} /readyz were answered"
    );

    for (r, (code, body)) in requests.iter().zip(&results) {
        assert_eq!(
            *code,
            r.code,
            "{}: {}",
            r.name,
            &body.to_string()[..body.to_string().len().min(500)]
        );
        if r.code != 201 {
            assert_eq!(body["kind"], "Status", "{}", r.name);
            assert_eq!(body["code"], r.code, "{}", r.name);
        }
    }
    // The refusals name the field and why.
    let causes = |i: usize| {
        results[i].1["details"]["causes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(results[2].1["reason"], "Invalid");
    assert_eq!(
        causes(2),
        [
            json!({"reason": "FieldValueTooLong", "message": "Too long: may not be more than 262144 bytes",
            "field": "metadata.annotations"})
        ]
    );
    let bad = causes(3);
    assert_eq!(bad.len(), 20_000, "one cause per bad key");
    assert!(
        bad.iter()
            .all(|c| c["field"] == "metadata.labels" && c["reason"] == "FieldValueInvalid"),
        "{:?}",
        &bad[..3]
    );
    assert_eq!(results[4].1["reason"], "RequestEntityTooLarge");

    // The accepted ones round-trip intact.
    let sent: Vec<Value> = requests
        .iter()
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect();
    for i in [0, 1] {
        let (code, got) = call(
            &app,
            Method::GET,
            &format!("{COLL}/{}", requests[i].name),
            String::new(),
        )
        .await;
        assert_eq!(code, 200);
        for field in ["labels", "annotations", "finalizers"] {
            assert_eq!(
                got["metadata"][field], sent[i]["metadata"][field],
                "{field} of {}",
                requests[i].name
            );
        }
        assert_eq!(
            got, results[i].1,
            "the stored object is the one the create returned"
        );
    }
    // A one-label patch of the huge object: that label is the patcher's, the rest stay the
    // creator's.
    let req = Request::builder()
        .method(Method::PATCH)
        .uri(format!("{COLL}/huge-labels?fieldManager=patcher"))
        .header("content-type", "application/merge-patch+json")
        .body(Body::from(
            json!({"metadata": {"labels": {"patched": "yes"}}}).to_string(),
        ))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let patched: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let mut labels = sent[0]["metadata"]["labels"].as_object().unwrap().clone();
    labels.insert("patched".into(), json!("yes"));
    assert_eq!(patched["metadata"]["labels"], Value::Object(labels));
    let entries = patched["metadata"]["managedFields"].as_array().unwrap();
    let of = |manager: &str| {
        entries.iter().find(|e| e["manager"] == manager).map(|e| {
            e["fieldsV1"]["f:metadata"]["f:labels"]
                .as_object()
                .map_or(0, Map::len)
        })
    };
    assert_eq!(of("patcher"), Some(1));
    assert_eq!(
        of("unknown"),
        Some(20_000),
        "{:?}",
        entries.iter().map(|e| &e["manager"]).collect::<Vec<_>>()
    );

    // The refused ones stored nothing: only the accepted keys are new, one revision each (and
    // the patch's).
    let (keys_after, revision_after) = stored(&backend).await;
    let new: BTreeSet<String> = keys_after.difference(&keys_before).cloned().collect();
    assert_eq!(
        new,
        BTreeSet::from([
            format!("{PREFIX}team-a/huge-finalizers"),
            format!("{PREFIX}team-a/huge-labels")
        ])
    );
    assert_eq!(revision_after, revision_before + 3);
    for r in &requests[2..] {
        let (code, _) = call(&app, Method::GET, &format!("{COLL}/{}", r.name), String::new()).await;
        assert_eq!(code, 404, "{}", r.name);
    }
    drop(etcd);
}
