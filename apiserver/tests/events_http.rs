//! Core `v1` Events over HTTP, in process on the in-memory store: served (discovery at `/api`,
//! create, get, list and field selectors on the involved object, Table rows, the merge patch
//! that folds a repeat, delete, 422s with field paths) when the stores include them, as local
//! mode opens them; not served at all with the group's stores alone, as `serve` mode opens them.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use etcd_operator_apiserver::http::auth::{AllowAuthenticated, AuthenticateFuture, Authenticator, UserInfo};
use etcd_operator_apiserver::http::openapi::Documents;
use etcd_operator_apiserver::http::{AppState, Stores, router};
use etcd_operator_apiserver::registry::kind;
use etcd_operator_apiserver::storage::backend::{Backend, MemoryBackend};
use etcd_operator_apiserver::storage::{Storage, StorageOptions};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

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

async fn serving(kinds: &[kind::Kind]) -> axum::Router {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let stores = Stores::open_kinds(kinds, |prefix| {
        Storage::with_backend(Arc::clone(&backend), prefix, StorageOptions::default())
    })
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

async fn call(
    app: &axum::Router,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: String,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value)
}

async fn get(app: &axum::Router, uri: &str) -> (StatusCode, Value) {
    call(app, Method::GET, uri, &[], String::new()).await
}

async fn post(app: &axum::Router, uri: &str, body: &Value) -> (StatusCode, Value) {
    call(
        app,
        Method::POST,
        uri,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

fn event(name: &str, cluster: &str, reason: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": "ns"},
        "involvedObject": {"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "name": cluster, "namespace": "ns", "uid": format!("uid-{cluster}")},
        "reason": reason, "message": format!("{reason} on {cluster}"), "type": "Normal", "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z",
        "source": {"component": "etcd-operator"}})
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

fn cause_fields(status: &Value) -> Vec<String> {
    status["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["field"].as_str().unwrap().to_owned())
        .collect()
}

const EVENTS: &str = "/api/v1/namespaces/ns/events";

#[tokio::test]
async fn the_group_alone_serves_no_core_group() {
    let app = serving(&kind::GROUP_KINDS).await;
    for path in ["/api", "/api/v1", EVENTS, "/api/v1/events"] {
        assert_eq!(get(&app, path).await.0, StatusCode::NOT_FOUND, "{path}");
    }
    let (status, _) = post(&app, EVENTS, &event("a.1", "a", "MemberStarted")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Nor does the group's discovery list Events, whatever the stores.
    let app = serving(&kind::ALL).await;
    let (_, apis) = get(&app, "/apis/etcd.operator.dev/v1alpha2").await;
    assert!(!apis.to_string().contains("\"events\""), "{apis}");
}

#[tokio::test]
async fn discovery_of_the_core_group_lists_events_only() {
    let app = serving(&kind::ALL).await;
    let (status, api) = get(&app, "/api").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(api["kind"], "APIVersions");
    assert_eq!(api["versions"], json!(["v1"]));
    let (_, v1) = get(&app, "/api/v1").await;
    assert_eq!(v1["groupVersion"], "v1");
    let resources = v1["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 1);
    assert_eq!(resources[0]["name"], "events");
    assert_eq!(resources[0]["kind"], "Event");
    assert_eq!(resources[0]["namespaced"], true);
}

#[tokio::test]
async fn events_are_created_selected_by_involved_object_folded_and_deleted() {
    let app = serving(&kind::ALL).await;
    for (name, cluster, reason) in [
        ("a.1", "a", "MemberStarted"),
        ("a.2", "a", "MemberReplacing"),
        ("b.1", "b", "MemberStarted"),
    ] {
        let (status, created) = post(&app, EVENTS, &event(name, cluster, reason)).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        assert_eq!(created["apiVersion"], "v1");
        assert!(created["metadata"]["uid"].is_string());
    }
    let select = |s: &str| {
        format!(
            "{EVENTS}?fieldSelector={}",
            s.replace('=', "%3D").replace(',', "%2C")
        )
    };
    let (status, list) = get(&app, &select("involvedObject.name=a")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["kind"], "EventList");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(names(&list), ["a.1", "a.2"]);
    // What kubectl describe sends.
    let (_, list) = get(
        &app,
        &select("involvedObject.namespace=ns,involvedObject.kind=EtcdCluster,involvedObject.uid=uid-a,involvedObject.name=a"),
    )
    .await;
    assert_eq!(names(&list), ["a.1", "a.2"]);
    let (_, list) = get(&app, &select("reason=MemberStarted,type=Normal")).await;
    assert_eq!(names(&list), ["a.1", "b.1"]);
    let (_, list) = get(&app, &select("involvedObject.name=c")).await;
    assert!(names(&list).is_empty());
    // Cluster-wide.
    let (_, all) = get(&app, "/api/v1/events?fieldSelector=involvedObject.name%3Db").await;
    assert_eq!(names(&all), ["b.1"]);
    // A field Events do not have is a 400.
    let (status, body) = get(&app, &select("source.host=x")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["message"], "field label not supported: source.host");

    // Folding: a merge patch of count and lastTimestamp.
    let (status, patched) = call(
        &app,
        Method::PATCH,
        &format!("{EVENTS}/a.1"),
        &[("content-type", "application/merge-patch+json")],
        json!({"count": 2, "lastTimestamp": "2026-01-01T00:05:00Z"}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["count"], 2);
    assert_eq!(patched["lastTimestamp"], "2026-01-01T00:05:00Z");
    assert_eq!(patched["firstTimestamp"], "2026-01-01T00:00:00Z");

    // The Table kubectl get events asks for.
    let (status, table) = call(
        &app,
        Method::GET,
        &select("involvedObject.name=a"),
        &[("accept", TABLE)],
        String::new(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["priority"] == 0)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Last Seen", "Type", "Reason", "Object", "Message"]);
    let first = &table["rows"][0]["cells"];
    assert!(first[0].as_str().unwrap().contains("(x2 over "), "{first}");
    assert_eq!(first[3], "etcdcluster/a");

    let (status, _) = call(&app, Method::DELETE, &format!("{EVENTS}/a.1"), &[], String::new()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(get(&app, &format!("{EVENTS}/a.1")).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn invalid_events_are_422_with_field_paths_and_store_nothing() {
    let app = serving(&kind::ALL).await;
    let mut no_object = event("x.1", "x", "R");
    no_object.as_object_mut().unwrap().remove("involvedObject");
    let mut other_namespace = event("x.2", "x", "R");
    other_namespace["involvedObject"]["namespace"] = json!("elsewhere");
    let mut nameless_object = event("x.3", "x", "R");
    nameless_object["involvedObject"] = json!({"namespace": "ns"});
    let mut bad_type = event("x.4", "x", "R");
    bad_type["type"] = json!("Fatal");
    for (body, fields) in [
        (no_object, vec!["involvedObject"]),
        (other_namespace, vec!["involvedObject.namespace"]),
        (
            nameless_object,
            vec!["involvedObject.name", "involvedObject.kind"],
        ),
        (bad_type, vec!["type"]),
    ] {
        let (status, refusal) = post(&app, EVENTS, &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refusal}");
        assert_eq!(refusal["kind"], "Status");
        assert_eq!(refusal["reason"], "Invalid");
        assert_eq!(refusal["details"]["kind"], "Event");
        assert_eq!(refusal["details"]["group"], "");
        assert_eq!(cause_fields(&refusal), fields, "{refusal}");
        assert!(
            refusal["message"].as_str().unwrap().starts_with(&format!(
                "Event \"{}\" is invalid: ",
                body["metadata"]["name"].as_str().unwrap()
            )),
            "{refusal}"
        );
    }
    let (_, list) = get(&app, EVENTS).await;
    assert!(names(&list).is_empty(), "{list}");
}

#[tokio::test]
async fn a_watch_with_an_involved_object_selector_sees_only_that_objects_events() {
    let app = serving(&kind::ALL).await;
    for (name, cluster) in [("a.1", "a"), ("b.1", "b")] {
        assert_eq!(
            post(&app, EVENTS, &event(name, cluster, "MemberStarted")).await.0,
            StatusCode::CREATED
        );
    }
    let req = Request::builder()
        .uri(format!(
            "{EVENTS}?watch=1&fieldSelector=involvedObject.name%3Da&timeoutSeconds=1"
        ))
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
        .await
        .expect("the watch ends after its timeoutSeconds")
        .unwrap()
        .to_bytes();
    let lines: Vec<Value> = String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["type"].as_str().unwrap(),
                l["object"]["metadata"]["name"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(seen, [("ADDED", "a.1")], "{lines:#?}");
    assert_eq!(lines[0]["object"]["apiVersion"], "v1");
    assert_eq!(lines[0]["object"]["kind"], "Event");
}
