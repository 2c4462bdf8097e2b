//! What the chart deploys against what the code does, with a recording kube-apiserver stand-in:
//!
//! * RBAC coverage: the real code that talks to kube-apiserver in cluster mode (the controller's
//!   Kubernetes runtime through every `Runtime` operation, Events, the backup credentials read,
//!   TokenReview, SubjectAccessReview, the authentication ConfigMap, the leader-election Lease)
//!   runs against a stub that answers any request generically and records it; each request
//!   becomes (verb, API group, resource, namespace, name) by the same rules the server's own
//!   authorizer uses ([`RequestInfo::parse`]), and the rules bound to the ServiceAccount in
//!   `manifests/etcd-operator.yaml` must allow every one. A new call made through these paths is
//!   picked up without touching this file; a new `Runtime` operation or a new file that calls
//!   kube-apiserver fails [`every_code_path_that_calls_kube_apiserver_is_driven_here`] until it is
//!   driven here too.
//! * The Deployment's container arguments, for the defaults and every `charts/etcd-operator/ci`
//!   value set, parse with the real `ServeArgs` (`etcd-operator serve`).
//! * Leader election (`cluster::leader`) against the same stub, which keeps Leases with
//!   `resourceVersion` checks like kube-apiserver: one leader at a time, hand-over on release,
//!   step-down when the Lease is taken or cannot be renewed.

// Test code: a failed unwrap is a test failure with its location.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use etcd_operator::serve_mode::ServeArgs;
use etcd_operator::serve_mode::leader::{
    Attempt, LeaderElectionArgs, LeaseLock, Observation, run_while_leader,
};
use etcd_operator_apiserver::cluster::authn::TokenReviewer;
use etcd_operator_apiserver::cluster::authz::SubjectAccessReviewAuthorizer;
use etcd_operator_apiserver::cluster::config;
use etcd_operator_apiserver::http::auth::Authorizer;
use etcd_operator_apiserver::http::request_info::RequestInfo;
use etcd_operator_apiserver::serve::UserInfo;
use etcd_operator_controller::model::{ClusterRef, MemberConfig};
use etcd_operator_controller::runtime::kubernetes::KubernetesRuntime;
use etcd_operator_controller::runtime::{Runtime, ValidatedCluster};
use etcd_operator_controller::tls::authority::AuthorityPhase;
use etcd_operator_tests::kube::{helm, run};
use etcd_operator_tests::tools::workspace_root;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const NS: &str = "prod";
const CLUSTER: &str = "demo";
const UID: &str = "7c1f5a9e-2b1d-4c3e-9f0a-1e2d3c4b5a69";

// ---------------------------------------------------------------------------------------------
// The recording stand-in for kube-apiserver

/// How the stub answers requests for objects other than Leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum World {
    /// Nothing exists: reads 404, creates succeed, lists are empty.
    Empty,
    /// Everything exists: reads return an object (a stopped Pod, a labelled PVC...), creates
    /// conflict, lists hold one member's objects.
    Full,
}

#[derive(Debug, Clone)]
struct Call {
    method: Method,
    path: String,
    query: Option<String>,
}

#[derive(Debug)]
struct State {
    world: World,
    calls: Vec<Call>,
    /// Leases by (namespace, name), kept like kube-apiserver does.
    leases: BTreeMap<(String, String), Value>,
    revision: u64,
    /// Answer everything with 500.
    broken: bool,
}

#[derive(Debug, Clone)]
struct Stub(Arc<Mutex<State>>);

impl Stub {
    fn new(world: World) -> Self {
        Self(Arc::new(Mutex::new(State {
            world,
            calls: Vec::new(),
            leases: BTreeMap::new(),
            revision: 100,
            broken: false,
        })))
    }

    fn client(&self) -> kube::Client {
        let stub = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let stub = stub.clone();
            async move { Ok::<_, Infallible>(stub.answer(request).await) }
        });
        kube::Client::new(service, "default")
    }

    fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap().calls.clone()
    }

    fn set_world(&self, world: World) {
        self.0.lock().unwrap().world = world;
    }

    fn set_broken(&self, broken: bool) {
        self.0.lock().unwrap().broken = broken;
    }

    fn lease(&self, namespace: &str, name: &str) -> Option<Value> {
        self.0
            .lock()
            .unwrap()
            .leases
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Another writer changes the Lease (a new resourceVersion).
    fn overwrite_lease(&self, namespace: &str, name: &str, holder: &str) {
        let mut state = self.0.lock().unwrap();
        state.revision += 1;
        let rv = state.revision.to_string();
        let lease = state
            .leases
            .get_mut(&(namespace.to_owned(), name.to_owned()))
            .unwrap();
        lease["metadata"]["resourceVersion"] = json!(rv);
        lease["spec"]["holderIdentity"] = json!(holder);
        lease["spec"]["renewTime"] = json!(jiff::Timestamp::now().to_string());
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body)
                .or_else(|_| serde_yaml::from_slice(&body))
                .unwrap_or(Value::Null)
        };
        let call = Call {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().map(str::to_owned),
        };
        let mut state = self.0.lock().unwrap();
        state.calls.push(call.clone());
        if state.broken {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "broken on purpose",
            );
        }
        let target = Target::parse(&call.path);
        if target.resource == "leases" {
            return answer_lease(&mut state, &call.method, &target, body);
        }
        answer_generic(state.world, &call.method, &target, body)
    }
}

/// A request path taken apart.
#[derive(Debug)]
struct Target {
    api_version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
}

impl Target {
    fn parse(path: &str) -> Self {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (api_version, rest) = match parts.first() {
            Some(&"api") => (parts[1].to_owned(), &parts[2..]),
            _ => (format!("{}/{}", parts[1], parts[2]), &parts[3..]),
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
            _ => (None, rest),
        };
        Target {
            api_version,
            namespace,
            resource: rest.first().map(|s| (*s).to_owned()).unwrap_or_default(),
            name: rest.get(1).map(|s| (*s).to_owned()),
        }
    }

    fn kind(&self) -> &'static str {
        match self.resource.as_str() {
            "pods" => "Pod",
            "persistentvolumeclaims" => "PersistentVolumeClaim",
            "services" => "Service",
            "poddisruptionbudgets" => "PodDisruptionBudget",
            "events" => "Event",
            "secrets" => "Secret",
            "configmaps" => "ConfigMap",
            "leases" => "Lease",
            "certificates" => "Certificate",
            "storageclasses" => "StorageClass",
            _ => "Unknown",
        }
    }
}

fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json_response(
        code,
        &json!({
            "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code.as_u16()
        }),
    )
}

/// An existing object of the target's kind, labelled as a member of the cluster.
fn existing(target: &Target, name: &str) -> Value {
    let member = name.strip_suffix("-data").unwrap_or(name);
    let mut obj = json!({
        "apiVersion": target.api_version,
        "kind": target.kind(),
        "metadata": {
            "name": name,
            "namespace": target.namespace.clone().unwrap_or_else(|| NS.to_owned()),
            "resourceVersion": "1",
            "labels": {"etcd.operator.dev/cluster": CLUSTER, "etcd.operator.dev/member": member},
            "annotations": {}
        }
    });
    match target.resource.as_str() {
        "pods" => obj["status"] = json!({"phase": "Failed"}),
        "secrets" => {
            obj["data"] = json!({"AWS_ACCESS_KEY_ID": "aWQ=", "AWS_SECRET_ACCESS_KEY": "a2V5"});
        }
        "configmaps" => obj["data"] = json!({}),
        // A claim smaller than the spec asks for, of a class that may grow.
        "persistentvolumeclaims" => {
            obj["spec"] =
                json!({"storageClassName": "standard", "resources": {"requests": {"storage": "512Mi"}}});
        }
        "storageclasses" => obj["allowVolumeExpansion"] = json!(true),
        _ => {}
    }
    obj
}

fn answer_generic(world: World, method: &Method, target: &Target, mut body: Value) -> Response<Body> {
    let reviews = matches!(target.resource.as_str(), "tokenreviews" | "subjectaccessreviews");
    match (method, &target.name) {
        (&Method::POST, _) if reviews => {
            body["status"] = if target.resource == "tokenreviews" {
                json!({"authenticated": true, "user": {"username": "alice", "groups": ["devs"]}})
            } else {
                json!({"allowed": true})
            };
            json_response(StatusCode::CREATED, &body)
        }
        (&Method::POST, _) if world == World::Full && target.resource != "events" => {
            status(StatusCode::CONFLICT, "AlreadyExists", "already exists")
        }
        (&Method::POST | &Method::PUT, _) => {
            body["metadata"]["resourceVersion"] = json!("2");
            json_response(StatusCode::CREATED, &body)
        }
        (&Method::GET, None) => {
            let items = match (world, target.resource.as_str()) {
                (World::Full, "persistentvolumeclaims") => {
                    vec![existing(target, &format!("{CLUSTER}-0-data"))]
                }
                (World::Full, _) => vec![existing(target, &format!("{CLUSTER}-0"))],
                (World::Empty, _) => Vec::new(),
            };
            json_response(
                StatusCode::OK,
                &json!({
                    "apiVersion": target.api_version, "kind": format!("{}List", target.kind()),
                    "metadata": {"resourceVersion": "1"}, "items": items
                }),
            )
        }
        (&Method::DELETE, None) => json_response(
            StatusCode::OK,
            &json!({"apiVersion": target.api_version, "kind": format!("{}List", target.kind()),
                    "metadata": {}, "items": []}),
        ),
        (&Method::GET | &Method::DELETE, Some(_)) if world == World::Empty || target.kind() == "Unknown" => {
            status(StatusCode::NOT_FOUND, "NotFound", "not found")
        }
        (_, Some(name)) => json_response(StatusCode::OK, &existing(target, name)),
        _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "not here"),
    }
}

/// Leases with kube-apiserver's optimistic concurrency: create conflicts when one exists, an
/// update conflicts unless it carries the stored `resourceVersion`.
fn answer_lease(state: &mut State, method: &Method, target: &Target, mut body: Value) -> Response<Body> {
    let namespace = target.namespace.clone().unwrap_or_default();
    match (method, &target.name) {
        (&Method::GET, Some(name)) => match state.leases.get(&(namespace, name.clone())) {
            Some(lease) => json_response(StatusCode::OK, lease),
            None => status(StatusCode::NOT_FOUND, "NotFound", "leases not found"),
        },
        (&Method::POST, None) => {
            let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            let key = (namespace.clone(), name);
            if state.leases.contains_key(&key) {
                return status(StatusCode::CONFLICT, "AlreadyExists", "leases already exists");
            }
            state.revision += 1;
            body["metadata"]["resourceVersion"] = json!(state.revision.to_string());
            body["metadata"]["namespace"] = json!(namespace);
            state.leases.insert(key, body.clone());
            json_response(StatusCode::CREATED, &body)
        }
        (&Method::GET, None) => {
            // The shard manager's list (its label selector is not applied: only its Leases exist).
            let items: Vec<Value> = state
                .leases
                .iter()
                .filter(|((ns, _), _)| *ns == namespace)
                .map(|(_, lease)| lease.clone())
                .collect();
            let list = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "LeaseList",
                "metadata": {"resourceVersion": state.revision.to_string()},
                "items": items,
            });
            json_response(StatusCode::OK, &list)
        }
        (&Method::DELETE, Some(name)) => match state.leases.remove(&(namespace, name.clone())) {
            Some(lease) => json_response(StatusCode::OK, &lease),
            None => status(StatusCode::NOT_FOUND, "NotFound", "leases not found"),
        },
        (&Method::PUT, Some(name)) => {
            let key = (namespace.clone(), name.clone());
            let Some(stored) = state.leases.get(&key) else {
                return status(StatusCode::NOT_FOUND, "NotFound", "leases not found");
            };
            if stored["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"] {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version",
                );
            }
            state.revision += 1;
            body["metadata"]["resourceVersion"] = json!(state.revision.to_string());
            state.leases.insert(key, body.clone());
            json_response(StatusCode::OK, &body)
        }
        _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "not here"),
    }
}

// ---------------------------------------------------------------------------------------------
// The manifests

fn manifests() -> Vec<Value> {
    let path = workspace_root().join("manifests").join("etcd-operator.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "read {}: {e}; generate it with UPDATE_MANIFESTS=1 cargo test -p etcd-operator-tests --test helm_chart",
            path.display()
        )
    });
    yaml_documents(&text)
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| {
            let value: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
            serde_json::to_value(value).unwrap()
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn deployment_args(docs: &[Value]) -> Vec<String> {
    let [deployment] = find(docs, "Deployment")[..] else {
        panic!("expected one Deployment")
    };
    serde_json::from_value(deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone()).unwrap()
}

/// The (name, namespace) the Deployment's Pods run as.
fn service_account(docs: &[Value]) -> (String, String) {
    let [deployment] = find(docs, "Deployment")[..] else {
        panic!("expected one Deployment")
    };
    (
        deployment["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap()
            .to_owned(),
        deployment["metadata"]["namespace"].as_str().unwrap().to_owned(),
    )
}

// ---------------------------------------------------------------------------------------------
// RBAC evaluation (the subset of Kubernetes RBAC the chart uses: no wildcards needed, but they
// are honoured)

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ApiCall {
    verb: String,
    group: String,
    /// `resource` or `resource/subresource`.
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
}

impl std::fmt::Display for ApiCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)?;
        if let Some(ns) = &self.namespace {
            write!(f, " in {ns}")?;
        }
        if let Some(name) = &self.name {
            write!(f, " named {name}")?;
        }
        Ok(())
    }
}

/// What a recorded request needs, by the server's own request-attribute rules.
fn api_call(call: &Call) -> ApiCall {
    // RequestInfo parses `/apis/<group>/<version>/...`; the core group is `/api/<version>`.
    let (path, core) = match call.path.strip_prefix("/api/") {
        Some(rest) => (format!("/apis/core/{rest}"), true),
        None => (call.path.clone(), false),
    };
    let info = RequestInfo::parse(&call.method, &path, call.query.as_deref());
    assert!(info.is_resource_request, "not a resource request: {call:?}");
    ApiCall {
        verb: info.verb,
        group: if core { String::new() } else { info.group },
        resource: match info.subresource {
            Some(sub) => format!("{}/{sub}", info.resource),
            None => info.resource,
        },
        namespace: info.namespace,
        name: info.name,
    }
}

#[derive(Debug, Clone)]
struct Rule {
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    resource_names: Vec<String>,
}

impl Rule {
    fn from_json(rule: &Value) -> Self {
        let list =
            |key: &str| -> Vec<String> { serde_json::from_value(rule[key].clone()).unwrap_or_default() };
        Rule {
            api_groups: list("apiGroups"),
            resources: list("resources"),
            verbs: list("verbs"),
            resource_names: list("resourceNames"),
        }
    }

    fn allows(&self, call: &ApiCall) -> bool {
        let has = |list: &[String], want: &str| list.iter().any(|x| x == want || x == "*");
        has(&self.verbs, &call.verb)
            && has(&self.api_groups, &call.group)
            && has(&self.resources, &call.resource)
            && (self.resource_names.is_empty()
                || call.name.as_deref().is_some_and(|n| has(&self.resource_names, n)))
    }
}

/// Rules granted somewhere: everywhere (`None`) or in one namespace.
#[derive(Debug)]
struct Grant {
    namespace: Option<String>,
    from: String,
    rules: Vec<Rule>,
}

/// The rules of Kubernetes' built-in roles the chart binds (from kube-apiserver's bootstrap
/// policy), which are not in the manifests.
fn builtin_rules(kind: &str, name: &str) -> Option<Vec<Rule>> {
    let rule = |groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]| Rule {
        api_groups: groups.iter().map(|s| (*s).to_owned()).collect(),
        resources: resources.iter().map(|s| (*s).to_owned()).collect(),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        resource_names: names.iter().map(|s| (*s).to_owned()).collect(),
    };
    match (kind, name) {
        ("ClusterRole", "system:auth-delegator") => Some(vec![
            rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"], &[]),
            rule(
                &["authorization.k8s.io"],
                &["subjectaccessreviews"],
                &["create"],
                &[],
            ),
        ]),
        ("Role", "extension-apiserver-authentication-reader") => Some(vec![rule(
            &[""],
            &["configmaps"],
            &["get", "list", "watch"],
            &["extension-apiserver-authentication"],
        )]),
        _ => None,
    }
}

fn grants(docs: &[Value], sa: &(String, String)) -> Vec<Grant> {
    let binds_sa = |binding: &Value| {
        binding["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == sa.0.as_str() && s["namespace"] == sa.1.as_str()
        })
    };
    let role_rules = |kind: &str, name: &str, namespace: Option<&str>| -> Vec<Rule> {
        if let Some(rules) = builtin_rules(kind, name) {
            return rules;
        }
        let role = docs.iter().find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"] == name
                && (kind == "ClusterRole" || d["metadata"]["namespace"].as_str() == namespace)
        });
        let role = role.unwrap_or_else(|| panic!("{kind} {name} is bound but neither rendered nor built in"));
        role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(Rule::from_json)
            .collect()
    };
    let mut out = Vec::new();
    for binding in docs.iter().filter(|d| binds_sa(d)) {
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        let role_name = binding["roleRef"]["name"].as_str().unwrap();
        let from = format!(
            "{} {}",
            binding["kind"].as_str().unwrap(),
            binding["metadata"]["name"]
        );
        match binding["kind"].as_str() {
            Some("ClusterRoleBinding") => out.push(Grant {
                namespace: None,
                from,
                rules: role_rules(role_kind, role_name, None),
            }),
            Some("RoleBinding") => {
                let ns = binding["metadata"]["namespace"].as_str().unwrap();
                out.push(Grant {
                    namespace: Some(ns.to_owned()),
                    from,
                    rules: role_rules(role_kind, role_name, Some(ns)),
                });
            }
            _ => {}
        }
    }
    out
}

fn allowed(grants: &[Grant], call: &ApiCall) -> bool {
    grants.iter().any(|g| {
        (g.namespace.is_none() || g.namespace == call.namespace) && g.rules.iter().any(|r| r.allows(call))
    })
}

/// The calls no grant allows.
fn denied<'a>(grants: &[Grant], calls: impl IntoIterator<Item = &'a ApiCall>) -> Vec<String> {
    calls
        .into_iter()
        .filter(|c| !allowed(grants, c))
        .map(ToString::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Driving the code

fn spec_view(medium: &str, tls: Option<Value>) -> ValidatedCluster {
    let mut cluster: etcd_operator_api::v1alpha2::EtcdCluster = serde_json::from_value(json!({
        "apiVersion": "etcd.operator.dev/v1alpha2",
        "kind": "EtcdCluster",
        "metadata": {"name": CLUSTER, "namespace": NS, "uid": UID},
        "spec": {"replicas": 3, "version": "3.5.21", "storage": {"medium": medium, "size": "1Gi"}, "tls": tls}
    }))
    .unwrap();
    etcd_operator_api::defaults::apply_v1alpha2(&mut cluster);
    ValidatedCluster::for_test(cluster)
}

fn member_config() -> MemberConfig {
    serde_json::from_value(json!({
        "version": "3.5.21",
        "initialCluster": [[format!("{CLUSTER}-0"), format!("http://{CLUSTER}-0.{CLUSTER}.{NS}.svc:2380")]],
        "initialState": "new",
        "clusterToken": UID,
    }))
    .unwrap()
}

/// The `Runtime` operations driven below; compared with the trait's methods by
/// [`every_code_path_that_calls_kube_apiserver_is_driven_here`].
const RUNTIME_OPERATIONS: [&str; 20] = [
    "client_tls",
    "authority",
    "advance_authority",
    "template_hash",
    "recreate",
    "expand_volume",
    "recover_quorum",
    "renew_certificates",
    "watch_children",
    "resync_interval",
    "members",
    "reserve",
    "start",
    "change_version",
    "stop",
    "snapshot_dir",
    "announce_replacement",
    "warn",
    "remove",
    "teardown",
];

/// Every `Runtime` operation of the Kubernetes runtime, on disk and memory members, plain and
/// with member TLS (`auto` on both planes: CA and member Secrets; `secretRef` and
/// `certManager`: Secrets read, Certificates applied), with nothing existing and with
/// everything existing (so both the create and the adopt/repair paths run). Errors are expected
/// from a generic stub and ignored: the requests are the point.
async fn drive_runtime(stub: &Stub) {
    let cluster = ClusterRef {
        namespace: NS.to_owned(),
        name: CLUSTER.to_owned(),
        uid: UID.to_owned(),
    };
    let member = format!("{CLUSTER}-0");
    let config = member_config();
    for world in [World::Empty, World::Full] {
        stub.set_world(world);
        let tls = [
            None,
            Some(json!({"client": {"auto": {}}, "peer": {"auto": {}}})),
            Some(json!({
                "client": {"certManager": {"issuerRef": {"name": "etcd-ca"}}},
                "peer": {"secretRef": {"name": "etcd-tls"}}
            })),
        ];
        let cases = tls
            .iter()
            .flat_map(|t| [("Disk", t.clone()), ("Memory", t.clone())]);
        for (medium, tls) in cases {
            let spec = spec_view(medium, tls);
            // A stub's Pods never go away: no waiting for them.
            let runtime = KubernetesRuntime::new(stub.client());
            let _ = runtime.members(&cluster).await;
            let _ = runtime.client_tls(&cluster, &spec).await;
            let _ = runtime.reserve(&cluster, &spec, &member).await;
            let _ = runtime.start(&cluster, &spec, &member, &config).await;
            let _ = runtime.change_version(&cluster, &spec, &member, "3.5.22").await;
            let _ = runtime.renew_certificates(&cluster, &spec, &member).await;
            let _ = runtime.authority(&cluster, &spec).await;
            for to in [
                AuthorityPhase::Trusting,
                AuthorityPhase::Reissuing,
                AuthorityPhase::Steady,
            ] {
                let _ = runtime.advance_authority(&cluster, &spec, to, Some("r1")).await;
            }
            let _ = runtime.template_hash(&cluster, &spec);
            let _ = runtime.recreate(&cluster, &spec, &member).await;
            let _ = runtime.expand_volume(&cluster, &spec, &member).await;
            let _ = runtime.recover_quorum(&cluster, &spec, &member).await;
            let _ = runtime.stop(&cluster, &member).await;
            let _ = runtime.snapshot_dir(&cluster);
            runtime
                .announce_replacement(&cluster, &member, "member will be replaced")
                .await;
            runtime
                .warn(&cluster, "EtcdTimeout", "AddLearner", "member add timed out")
                .await;
            let _ = runtime.remove(&cluster, &member, true).await;
            let _ = runtime.remove(&cluster, &member, false).await;
            let _ = runtime.teardown(&cluster, true).await;
            let _ = runtime.teardown(&cluster, false).await;
        }
    }
    stub.set_world(World::Empty);
    drive_child_watches(stub).await;
}

/// The controller with the Kubernetes runtime's child watches, run for a moment: its Pod and PVC
/// watchers list and watch through the stub. The EtcdCluster watch goes to our own API (loopback
/// in serve mode), so here it goes nowhere.
async fn drive_child_watches(stub: &Stub) {
    use kube::runtime::controller::{Action, Controller};
    let nowhere = tower::service_fn(|_: Request<Body>| async {
        Err::<Response<Body>, _>(std::io::Error::other("our own API is not part of this test"))
    });
    let own_api: kube::Api<etcd_operator_api::v1alpha2::EtcdCluster> =
        kube::Api::all(kube::Client::new(nowhere, "default"));
    let runtime = KubernetesRuntime::new(stub.client());
    assert!(runtime.resync_interval() >= Duration::from_secs(5));
    let controller = runtime.watch_children(Controller::new(own_api, Default::default()));
    let run = controller.run(
        |_, _: Arc<()>| async { Ok::<_, std::io::Error>(Action::await_change()) },
        |_, _, _| Action::await_change(),
        Arc::new(()),
    );
    // Until every child is watched (the watchers list first, then watch).
    let watched = || {
        let calls = stub.calls();
        [
            "/api/v1/pods",
            "/api/v1/persistentvolumeclaims",
            "/api/v1/secrets",
        ]
        .iter()
        .all(|path| {
            calls
                .iter()
                .any(|c| c.path == *path && c.query.as_deref().is_some_and(|q| q.contains("watch=true")))
        })
    };
    let waited = async {
        while !watched() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::select! {
            () = waited => {}
            () = futures::StreamExt::for_each(run, |_| async {}) => {}
        }
    })
    .await;
}

/// Cluster-mode authentication and authorization, the ConfigMap reload loop and the backup
/// credentials read.
async fn drive_serve_mode(stub: &Stub) {
    let client = stub.client();
    let _ = TokenReviewer::new(client.clone()).review("a-token").await;
    let _ = etcd_operator_apiserver::cluster::namespaces::NamespaceLifecycle::new(client.clone())
        .admit_create("etcdclusters", "a", NS)
        .await;
    let user = UserInfo {
        name: "alice".to_owned(),
        uid: None,
        groups: vec!["devs".to_owned()],
        extra: BTreeMap::new(),
    };
    let info = RequestInfo::parse(
        &Method::GET,
        "/apis/etcd.operator.dev/v1alpha2/namespaces/prod/etcdclusters",
        None,
    );
    let _ = SubjectAccessReviewAuthorizer::new(client.clone())
        .authorize(&user, &info)
        .await;
    let (tx, _rx) = config::channel();
    let reload = tokio::spawn(config::keep_loaded(
        client.clone(),
        config::DEFAULT_NAMESPACE.to_owned(),
        Duration::from_millis(50),
        tx,
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    reload.abort();

    let destination: etcd_operator_api::v1alpha2::BackupDestination =
        serde_json::from_value(json!({"s3": {"bucket": "backups", "credentialsSecret": "s3-credentials"}}))
            .unwrap();
    stub.set_world(World::Full);
    let _ = etcd_operator_controller::backup_store::open(
        &destination,
        NS,
        &etcd_operator_controller::backup::Credentials::Kubernetes(client),
    )
    .await;
    stub.set_world(World::Empty);
}

/// The leader election's Lease calls, with the lease name and namespace the Deployment uses.
async fn drive_leader_election(stub: &Stub, args: &LeaderElectionArgs) {
    let timing = args.timing().unwrap();
    let lock = LeaseLock::new(
        stub.client(),
        &args.leader_elect_lease_namespace,
        &args.leader_elect_lease_name,
        "replica-a",
        timing,
    );
    let mut observation = Observation::default();
    assert_eq!(
        lock.try_acquire_or_renew(&mut observation).await.unwrap(),
        Attempt::Held
    );
    assert_eq!(
        lock.try_acquire_or_renew(&mut observation).await.unwrap(),
        Attempt::Held
    );
    lock.release().await.unwrap();
    let other = LeaseLock::new(
        stub.client(),
        &args.leader_elect_lease_namespace,
        &args.leader_elect_lease_name,
        "replica-b",
        timing,
    );
    assert_eq!(
        other
            .try_acquire_or_renew(&mut Observation::default())
            .await
            .unwrap(),
        Attempt::Held
    );
}

/// The leader-election flags of the rendered Deployment (the namespace from `POD_NAMESPACE`,
/// which the Deployment sets to its own).
fn rendered_leader_args(docs: &[Value]) -> LeaderElectionArgs {
    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        leader: LeaderElectionArgs,
    }
    let (_, namespace) = service_account(docs);
    let mut argv = vec![
        "etcd-operator".to_owned(),
        format!("--leader-elect-lease-namespace={namespace}"),
    ];
    argv.extend(
        deployment_args(docs)
            .into_iter()
            .filter(|a| a.starts_with("--leader-elect") || a.starts_with("--shards")),
    );
    let flags = Flags::try_parse_from(argv).unwrap();
    assert!(
        flags.leader.leader_elect,
        "the default Deployment elects a leader"
    );
    flags.leader
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn rendered_rbac_allows_every_call_the_code_makes() {
    let docs = manifests();
    let sa = service_account(&docs);
    let grants = grants(&docs, &sa);
    assert!(!grants.is_empty(), "nothing is bound to {sa:?}");

    let stub = Stub::new(World::Empty);
    drive_runtime(&stub).await;
    drive_serve_mode(&stub).await;
    drive_leader_election(&stub, &rendered_leader_args(&docs)).await;

    let calls: std::collections::BTreeSet<ApiCall> = stub.calls().iter().map(api_call).collect();
    // What the stub saw, so that a regression in driving the code shows as missing calls.
    let seen: std::collections::BTreeSet<(String, String)> = calls
        .iter()
        .map(|c| (c.verb.clone(), c.resource.clone()))
        .collect();
    for (verb, resource) in [
        ("list", "pods"),
        ("watch", "pods"),
        ("watch", "persistentvolumeclaims"),
        ("watch", "secrets"),
        ("patch", "pods"),
        ("delete", "pods"),
        ("deletecollection", "pods"),
        ("create", "persistentvolumeclaims"),
        ("get", "persistentvolumeclaims"),
        ("patch", "persistentvolumeclaims"),
        ("deletecollection", "persistentvolumeclaims"),
        ("patch", "services"),
        ("delete", "services"),
        ("patch", "poddisruptionbudgets"),
        ("get", "storageclasses"),
        ("create", "events"),
        ("create", "tokenreviews"),
        ("create", "subjectaccessreviews"),
        ("get", "configmaps"),
        ("get", "secrets"),
        ("list", "secrets"),
        ("create", "secrets"),
        ("patch", "secrets"),
        ("deletecollection", "secrets"),
        ("patch", "certificates"),
        ("deletecollection", "certificates"),
        ("create", "leases"),
        ("update", "leases"),
    ] {
        assert!(
            seen.contains(&(verb.to_owned(), resource.to_owned())),
            "the code was expected to {verb} {resource}; seen: {seen:?}"
        );
    }
    let missing = denied(&grants, &calls);
    assert!(
        missing.is_empty(),
        "manifests/etcd-operator.yaml (charts/etcd-operator/templates/rbac.yaml) does not allow:\n  {}\n(bound: {:?})",
        missing.join("\n  "),
        grants.iter().map(|g| g.from.as_str()).collect::<Vec<_>>()
    );
}

#[test]
fn a_call_without_a_rule_is_denied() {
    let docs = manifests();
    let grants = grants(&docs, &service_account(&docs));
    let call = |method: Method, path: &str, query: Option<&str>| {
        api_call(&Call {
            method,
            path: path.to_owned(),
            query: query.map(str::to_owned),
        })
    };
    let uncovered = [
        // Secrets are applied (server-side), never updated; they are watched across
        // namespaces (the clusters' own, by label), never per namespace.
        call(Method::PUT, "/api/v1/namespaces/prod/secrets/demo-a-tls", None),
        // cert-manager Certificates are applied, never read.
        call(
            Method::GET,
            "/apis/cert-manager.io/v1/namespaces/prod/certificates/demo-a-peer",
            None,
        ),
        // Services are written, never read or watched.
        call(
            Method::GET,
            "/api/v1/namespaces/prod/services",
            Some("watch=true"),
        ),
        // The Lease Role is for one name in the release namespace.
        call(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/prod/leases/etcd-operator",
            None,
        ),
        call(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/etcd-operator/leases/other",
            None,
        ),
        // The authentication ConfigMap, and no other.
        call(
            Method::GET,
            "/api/v1/namespaces/kube-system/configmaps/coredns",
            None,
        ),
        call(Method::PUT, "/apis/apps/v1/namespaces/prod/deployments/x", None),
    ];
    let denied_calls = denied(&grants, &uncovered);
    assert_eq!(
        denied_calls.len(),
        uncovered.len(),
        "denied only {denied_calls:?}"
    );
    let covered = [
        call(Method::GET, "/api/v1/namespaces/prod/secrets/s3", None),
        call(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/etcd-operator/leases/etcd-operator",
            None,
        ),
        call(
            Method::GET,
            "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
            None,
        ),
        call(
            Method::DELETE,
            "/api/v1/namespaces/prod/pods",
            Some("labelSelector=x"),
        ),
    ];
    assert_eq!(denied(&grants, &covered), Vec::<String>::new());
    assert_eq!(covered[3].verb, "deletecollection");
}

/// Source files that call kube-apiserver (or the aggregated API) through `kube`, each with how
/// this test covers it: driven above, or calling only our own API (`etcd.operator.dev`, served
/// by this process, authorized by its own SubjectAccessReviews, no RBAC rule for the
/// ServiceAccount needed).
const KUBE_CALLERS: [(&str, &str); 19] = [
    (
        "operator/src/serve_mode/mod.rs",
        "own API: EtcdClusters (the controllers' shared watch)",
    ),
    (
        "apiserver/src/cluster/namespaces.rs",
        "driven: drive_serve_mode (Namespace lifecycle)",
    ),
    ("controller/src/runtime/kubernetes.rs", "driven: drive_runtime"),
    (
        "controller/src/runtime/events.rs",
        "own API: core Events, served by this process in local mode only",
    ),
    (
        "controller/src/runtime/kubernetes/cache.rs",
        "driven: drive_runtime (watch_children: the watches of Pods and PVCs)",
    ),
    (
        "controller/src/runtime/kubernetes/tls.rs",
        "driven: drive_runtime (member TLS)",
    ),
    (
        "controller/src/backup_store.rs",
        "driven: drive_serve_mode (credentials Secret)",
    ),
    (
        "controller/src/backup/oneshot.rs",
        "own API: EtcdBackups, EtcdClusters",
    ),
    ("controller/src/backup/scheduled.rs", "own API: EtcdClusters"),
    ("controller/src/reconcile/mod.rs", "own API: EtcdClusters"),
    ("controller/src/cluster_watch.rs", "own API: EtcdClusters"),
    (
        "controller/src/reconcile/status_write.rs",
        "own API: EtcdClusters",
    ),
    ("controller/src/restore/mod.rs", "own API: EtcdClusters"),
    (
        "apiserver/src/cluster/authn.rs",
        "driven: drive_serve_mode (TokenReview)",
    ),
    (
        "apiserver/src/cluster/authz.rs",
        "driven: drive_serve_mode (SubjectAccessReview)",
    ),
    (
        "apiserver/src/cluster/config.rs",
        "driven: drive_serve_mode (ConfigMap)",
    ),
    (
        "operator/src/serve_mode/leader.rs",
        "driven: drive_leader_election",
    ),
    (
        "operator/src/serve_mode/shards.rs",
        "driven: sharded_rbac_allows_every_call_of_the_shard_manager",
    ),
    (
        "apiserver/src/cluster/loopback.rs",
        "own API: the controller's client to this server",
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_code_path_that_calls_kube_apiserver_is_driven_here() {
    let root = workspace_root();
    // Files that use kube's API client.
    let markers = ["Api<", "Api::", "api::<", ".request(", "Recorder::new"];
    let mut files = Vec::new();
    rust_files(&root.join("controller/src"), &mut files);
    rust_files(&root.join("apiserver/src"), &mut files);
    rust_files(&root.join("operator/src"), &mut files);
    let mut unknown = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        if relative.starts_with("operator/src/local") || relative == "operator/src/main.rs" {
            continue; // local mode: no kube-apiserver
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let found: Vec<&str> = markers.iter().copied().filter(|m| code.contains(m)).collect();
        if !found.is_empty() && !KUBE_CALLERS.iter().any(|(f, _)| *f == relative) {
            unknown.push(format!("{relative} ({})", found.join(", ")));
        }
    }
    assert!(
        unknown.is_empty(),
        "these files call a Kubernetes API and are not driven by rendered_rbac_allows_every_call_the_code_makes: \
         {unknown:?}; drive them there (or list them in KUBE_CALLERS when they call only our own API)"
    );

    // Every operation of the Runtime trait is driven.
    let trait_src = std::fs::read_to_string(root.join("controller/src/runtime/mod.rs")).unwrap();
    let body = trait_src
        .split("pub trait Runtime")
        .nth(1)
        .expect("controller/src/runtime/mod.rs defines `pub trait Runtime`");
    let body = &body[..body.find("\n}\n").unwrap()];
    let mut operations: Vec<&str> = body
        .split("fn ")
        .skip(1)
        .map(|s| s.split(['(', '<']).next().unwrap().trim())
        .collect();
    operations.sort_unstable();
    let mut driven = RUNTIME_OPERATIONS.to_vec();
    driven.sort_unstable();
    assert_eq!(
        operations, driven,
        "the Runtime trait's operations differ from those drive_runtime runs: drive the new ones"
    );
}

#[test]
fn rendered_container_args_parse_with_serve_args() {
    #[derive(Debug, Parser)]
    #[command(name = "etcd-operator")]
    struct Cli {
        #[command(subcommand)]
        mode: Mode,
    }
    #[derive(Debug, clap::Subcommand)]
    enum Mode {
        Serve(ServeArgs),
    }

    let chart = workspace_root().join("charts").join("etcd-operator");
    let mut sets: Vec<Option<PathBuf>> = vec![None];
    for entry in std::fs::read_dir(chart.join("ci")).unwrap() {
        sets.push(Some(entry.unwrap().path()));
    }
    let home = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for values in sets {
        let mut cmd = helm(None, home.path()).unwrap();
        cmd.args(["template", "prod"])
            .arg(&chart)
            .args(["--namespace", "team-x", "--kube-version", "1.35"]);
        if let Some(values) = &values {
            cmd.arg("--values").arg(values);
        }
        let out = run(&mut cmd).unwrap();
        let docs = yaml_documents(&String::from_utf8(out.stdout).unwrap());
        let args = deployment_args(&docs);
        let argv = std::iter::once("etcd-operator".to_owned()).chain(args.clone());
        let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| {
            panic!("{values:?}: etcd-operator rejects the Deployment's args {args:?}:\n{e}")
        });
        let Mode::Serve(serve) = cli.mode;
        assert!(!serve.etcd_servers.is_empty());
        assert!(serve.tls_cert_file.starts_with("/var/run/etcd-operator/serving"));
        // The chart's overload values reach the flags (its defaults are kube-apiserver's).
        assert_eq!(
            serve.overload.options(),
            etcd_operator_apiserver::http::overload::OverloadOptions::default(),
            "{values:?}"
        );
        checked += 1;
    }
    assert!(checked >= 5);
    // The committed manifests, too.
    let args = deployment_args(&manifests());
    Cli::try_parse_from(std::iter::once("etcd-operator".to_owned()).chain(args)).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Leader election

const LEASE_NS: &str = "etcd-operator";
const LEASE: &str = "etcd-operator";

fn leader_args(identity: &str, enabled: bool) -> LeaderElectionArgs {
    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        leader: LeaderElectionArgs,
    }
    let mut argv = vec![
        "x".to_owned(),
        format!("--leader-elect-identity={identity}"),
        format!("--leader-elect-lease-namespace={LEASE_NS}"),
        format!("--leader-elect-lease-name={LEASE}"),
        "--leader-elect-lease-duration=4".to_owned(),
        "--leader-elect-renew-period=1".to_owned(),
    ];
    if enabled {
        argv.push("--leader-elect".to_owned());
    }
    Flags::try_parse_from(argv).unwrap().leader
}

type Log = Arc<Mutex<Vec<String>>>;

/// A controller that logs when it starts and stops.
fn controller(
    log: Log,
    who: &'static str,
) -> impl FnMut(CancellationToken) -> futures::future::BoxFuture<'static, ()> {
    move |stop: CancellationToken| {
        let log = log.clone();
        Box::pin(async move {
            log.lock().unwrap().push(format!("{who} start"));
            stop.cancelled().await;
            log.lock().unwrap().push(format!("{who} stop"));
        })
    }
}

fn log_of(log: &Log) -> Vec<String> {
    log.lock().unwrap().clone()
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn one_replica_leads_and_hands_over_when_it_shuts_down() {
    let stub = Stub::new(World::Empty);
    let log: Log = Arc::default();
    let stop_a = CancellationToken::new();
    let stop_b = CancellationToken::new();
    let a = tokio::spawn(run_while_leader(
        stub.client(),
        leader_args("replica-a", true),
        stop_a.clone(),
        controller(log.clone(), "a"),
    ));
    eventually("a leads", || log_of(&log) == ["a start"]).await;
    let b = tokio::spawn(run_while_leader(
        stub.client(),
        leader_args("replica-b", true),
        stop_b.clone(),
        controller(log.clone(), "b"),
    ));
    // b keeps trying for longer than a lease duration while a renews: it never starts.
    tokio::time::sleep(Duration::from_millis(5000)).await;
    assert_eq!(log_of(&log), ["a start"]);
    assert_eq!(
        stub.lease(LEASE_NS, LEASE).unwrap()["spec"]["holderIdentity"],
        "replica-a"
    );

    stop_a.cancel();
    a.await.unwrap().unwrap();
    assert_eq!(log_of(&log), ["a start", "a stop"]);
    let released = stub.lease(LEASE_NS, LEASE).unwrap();
    assert!(
        released["spec"].get("holderIdentity").is_none_or(Value::is_null),
        "{released}"
    );
    eventually("b takes over", || log_of(&log).len() == 3).await;
    assert_eq!(log_of(&log), ["a start", "a stop", "b start"]);
    let lease = stub.lease(LEASE_NS, LEASE).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    stop_b.cancel();
    b.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_controller_stops_when_the_lease_is_taken() {
    let stub = Stub::new(World::Empty);
    let log: Log = Arc::default();
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_while_leader(
        stub.client(),
        leader_args("replica-a", true),
        stop.clone(),
        controller(log.clone(), "a"),
    ));
    eventually("a leads", || log_of(&log) == ["a start"]).await;
    eventually("a renewed", || stub.calls().len() >= 4).await;
    // The first term, exactly: read (404), create, then read + update with the resourceVersion.
    let lease_path = format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases");
    let first: Vec<(Method, String)> = stub
        .calls()
        .into_iter()
        .take(4)
        .map(|c| (c.method, c.path))
        .collect();
    assert_eq!(
        first,
        [
            (Method::GET, format!("{lease_path}/{LEASE}")),
            (Method::POST, lease_path.clone()),
            (Method::GET, format!("{lease_path}/{LEASE}")),
            (Method::PUT, format!("{lease_path}/{LEASE}")),
        ]
    );
    stub.overwrite_lease(LEASE_NS, LEASE, "replica-z");
    eventually("a steps down", || log_of(&log) == ["a start", "a stop"]).await;
    assert!(!task.is_finished(), "a keeps competing");
    assert_eq!(
        stub.lease(LEASE_NS, LEASE).unwrap()["spec"]["holderIdentity"],
        "replica-z"
    );
    stop.cancel();
    task.await.unwrap().unwrap();
    // Not the holder: the Lease is left to replica-z.
    assert_eq!(
        stub.lease(LEASE_NS, LEASE).unwrap()["spec"]["holderIdentity"],
        "replica-z"
    );
}

#[tokio::test]
async fn the_controller_stops_when_the_lease_cannot_be_renewed() {
    let stub = Stub::new(World::Empty);
    let log: Log = Arc::default();
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_while_leader(
        stub.client(),
        leader_args("replica-a", true),
        stop.clone(),
        controller(log.clone(), "a"),
    ));
    eventually("a leads", || log_of(&log) == ["a start"]).await;
    stub.set_broken(true);
    eventually("a steps down", || log_of(&log) == ["a start", "a stop"]).await;
    stub.set_broken(false);
    // kube-apiserver is back and the Lease still names a: it leads again.
    eventually("a leads again", || log_of(&log).len() == 3).await;
    assert_eq!(log_of(&log), ["a start", "a stop", "a start"]);
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn without_leader_election_the_controller_just_runs() {
    let stub = Stub::new(World::Empty);
    let log: Log = Arc::default();
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_while_leader(
        stub.client(),
        leader_args("replica-a", false),
        stop.clone(),
        controller(log.clone(), "a"),
    ));
    eventually("the controller runs", || log_of(&log) == ["a start"]).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(log_of(&log), ["a start", "a stop"]);
    assert!(stub.calls().is_empty(), "no Lease calls: {:?}", stub.calls());
}

#[tokio::test]
async fn bad_timing_is_refused_before_any_call() {
    let stub = Stub::new(World::Empty);
    let mut args = leader_args("replica-a", true);
    args.leader_elect_renew_period = 4;
    let log: Log = Arc::default();
    let error = run_while_leader(
        stub.client(),
        args,
        CancellationToken::new(),
        controller(log.clone(), "a"),
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("must be shorter"), "{error}");
    assert!(log_of(&log).is_empty());
    assert!(stub.calls().is_empty());
}

use etcd_operator::serve_mode::spawn_controllers;

#[tokio::test]
async fn serve_wiring_runs_the_controllers_only_while_leading() {
    let kube_apiserver = Stub::new(World::Empty);
    // The controllers' own API (EtcdClusters, EtcdBackups) answered by a second stub.
    let own_api = Stub::new(World::Empty);
    let tasks = CancellationToken::new();
    // Another replica holds the Lease: the controllers must not start.
    let holder = LeaseLock::new(
        kube_apiserver.client(),
        LEASE_NS,
        LEASE,
        "replica-z",
        leader_args("replica-z", true).timing().unwrap(),
    );
    assert_eq!(
        holder
            .try_acquire_or_renew(&mut Observation::default())
            .await
            .unwrap(),
        Attempt::Held
    );
    let task = spawn_controllers(
        kube_apiserver.client(),
        own_api.client(),
        leader_args("replica-a", true),
        tasks.clone(),
        Default::default(),
        &Default::default(),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        own_api.calls().is_empty(),
        "controllers ran without the Lease: {:?}",
        own_api.calls()
    );
    // replica-z stops renewing: after a lease duration replica-a takes over and the
    // controllers start watching the API.
    eventually("the controllers start", || {
        own_api
            .calls()
            .iter()
            .any(|c| c.path.contains("etcd.operator.dev"))
    })
    .await;
    assert_eq!(
        kube_apiserver.lease(LEASE_NS, LEASE).unwrap()["spec"]["holderIdentity"],
        "replica-a"
    );
    tasks.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the controllers stop on shutdown")
        .unwrap()
        .unwrap();
    let released = kube_apiserver.lease(LEASE_NS, LEASE).unwrap();
    assert!(
        released["spec"].get("holderIdentity").is_none_or(Value::is_null),
        "{released}"
    );
}

/// The chart rendered with one of its `ci/` value sets, as `helm install etcd-operator
/// --namespace etcd-operator` would.
fn rendered_with(values: &str) -> Vec<Value> {
    let chart = workspace_root().join("charts").join("etcd-operator");
    let home = tempfile::tempdir().unwrap();
    let mut cmd = helm(None, home.path()).unwrap();
    cmd.args(["template", "etcd-operator"])
        .arg(&chart)
        .args(["--namespace", LEASE_NS, "--kube-version", "1.35"])
        .arg("--values")
        .arg(chart.join("ci").join(values));
    let out = run(&mut cmd).unwrap();
    yaml_documents(&String::from_utf8(out.stdout).unwrap())
}

#[tokio::test]
async fn sharded_rbac_allows_every_call_of_the_shard_manager() {
    use etcd_operator::serve_mode::leader::Timing;
    use etcd_operator::serve_mode::shards::ShardManager;
    use etcd_operator_controller::shard::ShardOwnership;

    let docs = rendered_with("sharded-values.yaml");
    let grants = grants(&docs, &service_account(&docs));
    let args = rendered_leader_args(&docs);
    let shards = args.shard_count().unwrap();
    assert!(shards.get() > 1, "the sharded value set shards");
    // The chart's names; a short lease so that a departed replica's presence Lease is deleted
    // within the test.
    let timing = Timing {
        duration: Duration::from_secs(2),
        retry: Duration::from_millis(200),
    };
    let manager = |stub: &Stub, identity: &str, ownership: &ShardOwnership| {
        ShardManager::new(
            stub.client(),
            &args.leader_elect_lease_namespace,
            &args.leader_elect_lease_name,
            identity,
            timing,
            ownership.clone(),
        )
    };
    let stub = Stub::new(World::Empty);
    // A replica that takes shards and dies.
    let gone = ShardOwnership::new(shards);
    let stop_gone = CancellationToken::new();
    let task = tokio::spawn(manager(&stub, "replica-gone", &gone).run(stop_gone.clone()));
    eventually("the first replica holds shards", || !gone.held().is_empty()).await;
    task.abort();
    // The next takes every shard over once they expired, deletes the departed presence Lease,
    // and releases everything when it shuts down.
    let ours = ShardOwnership::new(shards);
    let stop = CancellationToken::new();
    let task = tokio::spawn(manager(&stub, "replica-a", &ours).run(stop.clone()));
    eventually("replica-a holds every shard", || {
        ours.held().len() == shards.get() as usize
    })
    .await;
    eventually("the departed presence Lease is deleted", || {
        stub.calls().iter().any(|c| c.method == Method::DELETE)
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    let lease = stub
        .lease(
            &args.leader_elect_lease_namespace,
            &format!("{}-shard-0", args.leader_elect_lease_name),
        )
        .unwrap();
    assert!(
        lease["spec"].get("holderIdentity").is_none_or(Value::is_null),
        "{lease}"
    );

    let calls: std::collections::BTreeSet<ApiCall> = stub.calls().iter().map(api_call).collect();
    let seen: std::collections::BTreeSet<String> = calls.iter().map(|c| c.verb.clone()).collect();
    for verb in ["create", "get", "list", "update", "delete"] {
        assert!(
            seen.contains(verb),
            "the shard manager was expected to {verb} Leases: {seen:?}"
        );
    }
    let missing = denied(&grants, &calls);
    assert!(
        missing.is_empty(),
        "charts/etcd-operator/templates/rbac.yaml with ci/sharded-values.yaml does not allow:\n  {}",
        missing.join("\n  ")
    );
    // Without sharding, the Role names the one Lease: a shard Lease is not allowed.
    let default_grants = grants_of_defaults();
    let shard_call = calls.iter().find(|c| c.verb == "update").unwrap();
    assert_eq!(denied(&default_grants, [shard_call]).len(), 1);
}

fn grants_of_defaults() -> Vec<Grant> {
    let docs = manifests();
    grants(&docs, &service_account(&docs))
}

#[tokio::test]
async fn serve_wiring_with_shards_runs_the_controllers_and_holds_every_shard() {
    let kube_apiserver = Stub::new(World::Empty);
    let own_api = Stub::new(World::Empty);
    let tasks = CancellationToken::new();
    let mut args = leader_args("replica-a", true);
    args.shards = 3;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = etcd_operator_controller::metrics::ControllerMetrics::register(&mut registry);
    let task = spawn_controllers(
        kube_apiserver.client(),
        own_api.client(),
        args,
        tasks.clone(),
        metrics,
        &Default::default(),
    );
    let scrape = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    };
    // Alone, the replica takes every shard; the controllers run from the start.
    eventually("every shard is held", || {
        (0..3).all(|i| {
            kube_apiserver
                .lease(LEASE_NS, &format!("{LEASE}-shard-{i}"))
                .is_some_and(|l| l["spec"]["holderIdentity"] == "replica-a")
        })
    })
    .await;
    eventually("the controllers watch the API", || {
        own_api
            .calls()
            .iter()
            .any(|c| c.path.contains("etcd.operator.dev"))
    })
    .await;
    eventually("the gauge says so", || {
        scrape().lines().any(|l| l == "etcd_operator_shards_held 3")
    })
    .await;
    assert!(scrape().lines().any(|l| l == "etcd_operator_shards 3"));
    // No single leader Lease in shard mode.
    assert!(kube_apiserver.lease(LEASE_NS, LEASE).is_none());
    tasks.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the controllers and the shard manager stop on shutdown")
        .unwrap()
        .unwrap();
    for i in 0..3 {
        let lease = kube_apiserver
            .lease(LEASE_NS, &format!("{LEASE}-shard-{i}"))
            .unwrap();
        assert!(
            lease["spec"].get("holderIdentity").is_none_or(Value::is_null),
            "{lease}"
        );
    }
    assert!(scrape().lines().any(|l| l == "etcd_operator_shards_held 0"));
}
