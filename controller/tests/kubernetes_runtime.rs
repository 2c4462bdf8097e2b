//! The kubernetes runtime against a scripted API server (tower-test): each test states the exact
//! sequence of requests (method, path and query, content type, key parts of the body) that
//! creating, scaling, replacing and deleting members must make, and answers them. Plus golden
//! YAML of the objects the runtime builds (`tests/golden/*.yaml`; `UPDATE_GOLDEN=1` rewrites).

// Test helpers outside `#[test]` functions unwrap too: a failed unwrap is a test failure.
// A scenario's future holds the kube client's request futures; it is awaited once per test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::path::PathBuf;
use std::pin::pin;
use std::time::Duration;

use etcd_operator_api::v1alpha2::{
    BackupDestination, EtcdCluster, EtcdClusterSpec, PodTemplate, PodTemplateMetadata, PodTemplateSpec,
    S3Destination, StorageMedium, StorageSpec, VolumeDestination,
};
use etcd_operator_controller::model::{
    ClusterRef, InitialState, Liveness, MemberConfig, RuntimeMember, VolumeState,
};
use etcd_operator_controller::resources;
use etcd_operator_controller::restore::{RestorePlan, SnapshotSource};
use etcd_operator_controller::runtime::kubernetes::KubernetesRuntime;
use etcd_operator_controller::runtime::{Runtime, RuntimeError, ValidatedCluster};
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tower_test::mock;

const NS: &str = "prod";
const NAME: &str = "demo";
const UID: &str = "7c1f5a9e-2b1d-4c3e-9f0a-1e2d3c4b5a69";
const SELECTOR: &str = "labelSelector=etcd.operator.dev%2Fcluster%3Ddemo";
const APPLY: &str = "force=true&fieldManager=etcd-operator";
/// The query of the controller's creates and merge patches.
const MANAGED: &str = "fieldManager=etcd-operator";
const APPLY_PATCH: &str = "application/apply-patch+yaml";
const MERGE_PATCH: &str = "application/merge-patch+json";
const JSON: &str = "application/json";
const CONFIG: &str = "etcd.operator.dev/member-config";

// ---------------------------------------------------------------------------------------------
// Fixtures

fn cluster_ref() -> ClusterRef {
    ClusterRef {
        namespace: NS.to_owned(),
        name: NAME.to_owned(),
        uid: UID.to_owned(),
    }
}

fn view(spec: EtcdClusterSpec) -> ValidatedCluster {
    let mut cluster = EtcdCluster {
        metadata: ObjectMeta {
            name: Some(NAME.to_owned()),
            namespace: Some(NS.to_owned()),
            uid: Some(UID.to_owned()),
            ..ObjectMeta::default()
        },
        spec,
        ..EtcdCluster::default()
    };
    etcd_operator_api::defaults::apply_v1alpha2(&mut cluster);
    ValidatedCluster::for_test(cluster)
}

/// Three replicas on 1Gi disks, everything else defaulted.
fn disk_spec(replicas: i32) -> ValidatedCluster {
    view(EtcdClusterSpec {
        replicas: Some(replicas),
        version: Some("3.5.21".to_owned()),
        ..EtcdClusterSpec::default()
    })
}

fn memory_spec() -> ValidatedCluster {
    view(EtcdClusterSpec {
        replicas: Some(3),
        version: Some("3.4.23".to_owned()),
        storage: Some(StorageSpec {
            medium: Some(StorageMedium::Memory),
            size: Some(Quantity("512Mi".to_owned())),
            storage_class_name: None,
        }),
        ..EtcdClusterSpec::default()
    })
}

/// Every podTemplate field, 8Gi disks of a StorageClass.
fn full_spec() -> ValidatedCluster {
    let resources: ResourceRequirements = serde_json::from_value(json!({
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "2", "memory": "2Gi"}
    }))
    .unwrap();
    let tolerations: Vec<Toleration> = serde_json::from_value(json!([
        {"key": "dedicated", "operator": "Equal", "value": "etcd", "effect": "NoSchedule"}
    ]))
    .unwrap();
    view(EtcdClusterSpec {
        replicas: Some(3),
        version: Some("3.5.21".to_owned()),
        repository: Some("registry.example.com/etcd".to_owned()),
        pod_template: Some(Box::new(PodTemplate {
            metadata: Some(PodTemplateMetadata {
                labels: Some([("team".to_owned(), "storage".to_owned())].into()),
                annotations: Some([("prometheus.io/scrape".to_owned(), "true".to_owned())].into()),
            }),
            spec: Some(PodTemplateSpec {
                resources: Some(resources),
                affinity: None,
                node_selector: Some([("disktype".to_owned(), "ssd".to_owned())].into()),
                tolerations: Some(tolerations),
                topology_spread_constraints: Some(
                    serde_json::from_value(json!([{
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": {"etcd.operator.dev/cluster": "demo"}}
                    }]))
                    .unwrap(),
                ),
                priority_class_name: Some("system-cluster-critical".to_owned()),
            }),
        })),
        storage: Some(StorageSpec {
            medium: Some(StorageMedium::Disk),
            size: Some(Quantity("8Gi".to_owned())),
            storage_class_name: Some("fast-ssd".to_owned()),
        }),
        ..EtcdClusterSpec::default()
    })
}

fn member(suffix: &str) -> String {
    format!("{NAME}-{suffix}")
}

fn peer_url(member: &str) -> String {
    format!("http://{member}.{NAME}.{NS}.svc:2380")
}

fn client_url(member: &str) -> String {
    format!("http://{member}.{NAME}.{NS}.svc:2379")
}

fn config(members: &[&str], state: InitialState) -> MemberConfig {
    MemberConfig {
        version: "3.5.21".to_owned(),
        initial_cluster: members.iter().map(|m| (m.to_string(), peer_url(m))).collect(),
        initial_state: state,
        cluster_token: UID.to_owned(),
        previous_version: None,
        restore: None,
    }
}

fn config_json(config: &MemberConfig) -> String {
    serde_json::to_string(config).unwrap()
}

fn member_labels(member: &str) -> Value {
    json!({"etcd.operator.dev/cluster": NAME, "etcd.operator.dev/member": member})
}

/// A member Pod as the API server would list it.
fn pod(member: &str, phase: &str, config: Option<&MemberConfig>, deleting: bool) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": member, "namespace": NS, "labels": member_labels(member), "annotations": {}},
        "spec": {
            "containers": [{"name": "etcd", "image": "gcr.io/etcd-development/etcd:v3.5.21"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("{member}-data")}}]
        },
        "status": {"phase": phase}
    });
    if let Some(config) = config {
        pod["metadata"]["annotations"][CONFIG] = json!(config_json(config));
    }
    if deleting {
        pod["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    }
    pod
}

fn memory_pod(member: &str, config: &MemberConfig) -> Value {
    let mut pod = pod(member, "Running", Some(config), false);
    pod["spec"]["volumes"] =
        json!([{"name": "data", "emptyDir": {"medium": "Memory", "sizeLimit": "512Mi"}}]);
    pod
}

/// A member PVC as the API server would list it.
fn pvc(member: &str, config: Option<&MemberConfig>, deleting: bool) -> Value {
    let mut pvc = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": format!("{member}-data"), "namespace": NS, "labels": member_labels(member), "annotations": {}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound"}
    });
    if let Some(config) = config {
        pvc["metadata"]["annotations"][CONFIG] = json!(config_json(config));
    }
    if deleting {
        pvc["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    }
    pvc
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {},
        "status": "Failure", "reason": reason, "message": message, "code": code
    })
}

// ---------------------------------------------------------------------------------------------
// The scripted API server

type Handle = mock::Handle<Request<Body>, Response<Body>>;

/// Answers the runtime's requests in the order a scenario states them, asserting each.
struct ApiServerVerifier {
    handle: Handle,
}

/// One request as received, to be answered.
struct Exchange {
    body: Value,
    send: mock::SendResponse<Response<Body>>,
}

impl Exchange {
    fn reply(self, code: StatusCode, body: &Value) {
        let response = Response::builder()
            .status(code)
            .header("content-type", JSON)
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap();
        self.send.send_response(response);
    }

    /// 200 with the request body (what an apply or create returns, near enough).
    fn echo(self) {
        let body = self.body.clone();
        self.reply(StatusCode::OK, &body);
    }

    fn not_found(self, what: &str) {
        self.reply(
            StatusCode::NOT_FOUND,
            &status(404, "NotFound", &format!("{what} not found")),
        );
    }
}

fn setup() -> (KubernetesRuntime, ApiServerVerifier) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    (KubernetesRuntime::new(client), ApiServerVerifier { handle })
}

/// Runs the verifier's script beside the runtime's actions (in one task, so neither needs to be
/// `Send`); after the actions the runtime is dropped and the script must have consumed every
/// request. Both must finish within 10 s. The runtime knows no operator image.
async fn scenario<S, A, T>(script: S, actions: A) -> T
where
    S: AsyncFnOnce(&mut ApiServerVerifier),
    A: AsyncFnOnce(KubernetesRuntime) -> T,
{
    scenario_with(None, script, actions).await
}

/// [`scenario`] with the operator image `operator_image` (the restore init containers).
async fn scenario_with<S, A, T>(operator_image: Option<&str>, script: S, actions: A) -> T
where
    S: AsyncFnOnce(&mut ApiServerVerifier),
    A: AsyncFnOnce(KubernetesRuntime) -> T,
{
    let (runtime, mut verifier) = setup();
    let runtime = runtime.with_operator_image(operator_image.map(str::to_owned));
    let server = async move {
        script(&mut verifier).await;
        verifier.silent().await;
    };
    let both = async { tokio::join!(actions(runtime), server) };
    let (out, ()) = tokio::time::timeout(Duration::from_secs(10), both)
        .await
        .expect("scenario timed out: the runtime waits for an answer the script does not give");
    out
}

impl ApiServerVerifier {
    /// The next request must be `method uri` (with `content_type`, when given).
    async fn expect(&mut self, method: Method, uri: &str, content_type: Option<&str>) -> Exchange {
        let mut handle = pin!(&mut self.handle);
        let (request, send) = handle
            .next_request()
            .await
            .unwrap_or_else(|| panic!("expected {method} {uri}, but the runtime made no further request"));
        assert_eq!(
            (request.method().clone(), request.uri().to_string()),
            (method, uri.to_owned()),
            "request out of script"
        );
        let got_type = request
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        if let Some(expected) = content_type {
            assert_eq!(got_type.as_deref(), Some(expected), "content type of {uri}");
        }
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        Exchange { body, send }
    }

    /// After the actions: no further request (the runtime and its client are dropped).
    async fn silent(&mut self) {
        let mut handle = pin!(&mut self.handle);
        if let Some((request, _)) = handle.next_request().await {
            panic!("unexpected extra request {} {}", request.method(), request.uri());
        }
    }

    // --- steps shared by scenarios

    async fn apply_services(&mut self) {
        let peer = self
            .expect(
                Method::PATCH,
                &format!("/api/v1/namespaces/{NS}/services/{NAME}?&{APPLY}"),
                Some(APPLY_PATCH),
            )
            .await;
        assert_eq!(peer.body["kind"], "Service");
        assert_eq!(peer.body["spec"]["clusterIP"], "None");
        assert_eq!(peer.body["spec"]["publishNotReadyAddresses"], true);
        assert_eq!(
            peer.body["spec"]["selector"],
            json!({"etcd.operator.dev/cluster": NAME})
        );
        assert_eq!(peer.body["metadata"]["ownerReferences"][0]["uid"], UID);
        peer.echo();
        let client = self
            .expect(
                Method::PATCH,
                &format!("/api/v1/namespaces/{NS}/services/{NAME}-client?&{APPLY}"),
                Some(APPLY_PATCH),
            )
            .await;
        assert_eq!(client.body["spec"]["type"], "ClusterIP");
        assert_eq!(client.body["spec"]["ports"][0]["port"], 2379);
        client.echo();
    }

    /// `reserve` first looks for a member started with `--force-new-cluster` by a quorum
    /// recovery (none here).
    async fn no_recovery_to_settle(&mut self) {
        self.expect(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/pods?&{SELECTOR}"),
            None,
        )
        .await
        .reply(StatusCode::OK, &list("PodList", vec![]));
    }

    async fn list_members(&mut self, pods: Vec<Value>, pvcs: Vec<Value>) {
        self.expect(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/pods?&{SELECTOR}"),
            None,
        )
        .await
        .reply(StatusCode::OK, &list("PodList", pods));
        self.expect(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims?&{SELECTOR}"),
            None,
        )
        .await
        .reply(StatusCode::OK, &list("PersistentVolumeClaimList", pvcs));
    }

    async fn apply_pdb(&mut self, min_available: i64) {
        let pdb = self
            .expect(
                Method::PATCH,
                &format!("/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/{NAME}?&{APPLY}"),
                Some(APPLY_PATCH),
            )
            .await;
        assert_eq!(pdb.body["apiVersion"], "policy/v1");
        assert_eq!(pdb.body["spec"]["minAvailable"], min_available);
        assert_eq!(
            pdb.body["spec"]["selector"]["matchLabels"],
            json!({"etcd.operator.dev/cluster": NAME})
        );
        pdb.echo();
    }

    async fn create_pvc(&mut self, member: &str) {
        let create = self
            .expect(
                Method::POST,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims?&{MANAGED}"),
                Some(JSON),
            )
            .await;
        assert_eq!(create.body["metadata"]["name"], format!("{member}-data"));
        assert_eq!(
            create.body["metadata"]["labels"]["etcd.operator.dev/member"],
            member
        );
        assert_eq!(create.body["spec"]["resources"]["requests"]["storage"], "1Gi");
        assert!(
            create.body["metadata"]["annotations"].get(CONFIG).is_none(),
            "no config at reserve time"
        );
        let body = create.body.clone();
        create.reply(StatusCode::CREATED, &body);
    }

    async fn record_config(&mut self, member: &str, config: &MemberConfig) {
        let pvc_path = format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{member}-data");
        self.expect(Method::GET, &pvc_path, None)
            .await
            .reply(StatusCode::OK, &pvc(member, None, false));
        let patch = self
            .expect(
                Method::PATCH,
                &format!("{pvc_path}?&{MANAGED}"),
                Some(MERGE_PATCH),
            )
            .await;
        assert_eq!(
            patch.body,
            json!({"metadata": {"annotations": {CONFIG: config_json(config)}}})
        );
        patch.reply(StatusCode::OK, &pvc(member, Some(config), false));
    }

    async fn create_pod(&mut self, member: &str, config: &MemberConfig) {
        self.expect(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/pods/{member}"),
            None,
        )
        .await
        .not_found(&format!("pods \"{member}\""));
        let apply = self
            .expect(
                Method::PATCH,
                &format!("/api/v1/namespaces/{NS}/pods/{member}?&{APPLY}"),
                Some(APPLY_PATCH),
            )
            .await;
        let body = &apply.body;
        assert_eq!(body["kind"], "Pod");
        assert_eq!(body["metadata"]["annotations"][CONFIG], config_json(config));
        assert_eq!(body["spec"]["hostname"], member);
        assert_eq!(body["spec"]["subdomain"], NAME);
        let container = &body["spec"]["containers"][0];
        assert_eq!(
            container["image"],
            format!("gcr.io/etcd-development/etcd:v{}", config.version)
        );
        let command: Vec<String> = serde_json::from_value(container["command"].clone()).unwrap();
        for flag in [
            format!("--name={member}"),
            format!("--initial-cluster={}", config.initial_cluster_flag()),
            format!("--initial-cluster-state={}", config.initial_state.as_str()),
            format!("--initial-advertise-peer-urls={}", peer_url(member)),
        ] {
            assert!(command.contains(&flag), "{flag} missing from {command:?}");
        }
        assert_eq!(
            body["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            format!("{member}-data")
        );
        let mut running = body.clone();
        running["status"] = json!({"phase": "Pending"});
        apply.reply(StatusCode::OK, &running);
    }

    async fn event(&mut self, reason: &str, note: &str) {
        let event = self
            .expect(
                Method::POST,
                &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events?"),
                Some(JSON),
            )
            .await;
        assert_eq!(event.body["reason"], reason);
        assert_eq!(event.body["note"], note);
        assert_eq!(event.body["type"], "Normal");
        assert_eq!(event.body["reportingController"], "etcd-operator");
        assert_eq!(
            event.body["regarding"],
            json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "name": NAME, "namespace": NS, "uid": UID})
        );
        let body = event.body.clone();
        event.reply(StatusCode::CREATED, &body);
    }

    /// `remove` deletes the member's cert-manager Certificates (404: cert-manager is not
    /// installed) and then its Secrets, by the member's labels.
    async fn delete_member_certificates(&mut self, member: &str, cert_manager: bool) {
        let selector = format!(
            "labelSelector=etcd.operator.dev%2Fcluster%3D{NAME}%2Cetcd.operator.dev%2Fmember%3D{member}"
        );
        let empty = |kind: &str| json!({"apiVersion": "v1", "kind": kind, "metadata": {}, "items": []});
        let certificates = self
            .expect(
                Method::DELETE,
                &format!("/apis/cert-manager.io/v1/namespaces/{NS}/certificates?&{selector}"),
                Some(JSON),
            )
            .await;
        if cert_manager {
            certificates.reply(StatusCode::OK, &empty("CertificateList"));
        } else {
            certificates.not_found("the server could not find the requested resource");
        }
        self.expect(
            Method::DELETE,
            &format!("/api/v1/namespaces/{NS}/secrets?&{selector}"),
            Some(JSON),
        )
        .await
        .reply(StatusCode::OK, &empty("SecretList"));
    }

    async fn delete(&mut self, path: &str, answer: Option<Value>) {
        let delete = self.expect(Method::DELETE, &format!("{path}?"), Some(JSON)).await;
        match answer {
            Some(body) => delete.reply(StatusCode::OK, &body),
            None => delete.not_found(path),
        }
    }

    /// The member's claim set aside (relabelled, stamped with the time), answered with `answer`
    /// (`None`: 404, there is no claim); the set-aside claims are then listed (`listed`) and all
    /// but the newest three deleted (`pruned`).
    async fn set_aside(&mut self, member: &str, answer: Option<Value>, listed: Vec<Value>, pruned: &[&str]) {
        let path = format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{member}-data");
        let patch = self
            .expect(Method::PATCH, &format!("{path}?&{MANAGED}"), Some(MERGE_PATCH))
            .await;
        let at = patch.body["metadata"]["annotations"]["etcd.operator.dev/removed-at"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(chrono::DateTime::parse_from_rfc3339(&at).is_ok(), "{at}");
        assert_eq!(
            patch.body,
            json!({"metadata": {
                "labels": {"etcd.operator.dev/member": null, "etcd.operator.dev/removed-member": member},
                "annotations": {"etcd.operator.dev/removed-at": at}
            }})
        );
        let Some(answer) = answer else {
            patch.not_found(&path);
            return;
        };
        patch.reply(StatusCode::OK, &answer);
        self.expect(
            Method::GET,
            &format!(
                "/api/v1/namespaces/{NS}/persistentvolumeclaims?&{SELECTOR}%2Cetcd.operator.dev%2Fremoved-member"
            ),
            None,
        )
        .await
        .reply(StatusCode::OK, &list("PersistentVolumeClaimList", listed));
        for claim in pruned {
            self.delete(
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{claim}"),
                Some(
                    json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1", "metadata": {"name": claim}}),
                ),
            )
            .await;
        }
    }
}

/// A claim set aside when `member` (started with `config`, if it was) was removed at `at`.
fn set_aside_pvc(member: &str, at: &str, config: Option<&MemberConfig>) -> Value {
    let mut claim = pvc(member, config, false);
    claim["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("etcd.operator.dev/member");
    claim["metadata"]["labels"]["etcd.operator.dev/removed-member"] = json!(member);
    claim["metadata"]["annotations"]["etcd.operator.dev/removed-at"] = json!(at);
    claim
}

fn reserved(name: &str, config: Option<MemberConfig>) -> RuntimeMember {
    RuntimeMember {
        name: name.to_owned(),
        peer_url: peer_url(name),
        client_url: client_url(name),
        config,
        liveness: Liveness::Reserved,
        certificates: None,
        restarts: 0,
        template_hash: None,
        volume: None,
        created: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Create

#[tokio::test]
async fn create_reserves_and_starts_the_first_member_of_a_new_cluster() {
    let a = member("bbbbb");
    let cfg = config(&[&a], InitialState::New);
    let (a2, cfg2) = (a.clone(), cfg.clone());
    let got = scenario(
        async move |api: &mut ApiServerVerifier| {
            // reserve: Services, PDB for the desired 3 replicas, the PVC.
            api.no_recovery_to_settle().await;
            api.apply_services().await;
            api.list_members(vec![], vec![]).await;
            api.apply_pdb(2).await;
            api.create_pvc(&a2).await;
            // start: config on the PVC first, then the Pod, then an Event.
            api.record_config(&a2, &cfg2).await;
            api.create_pod(&a2, &cfg2).await;
            api.event(
                "MemberPodCreated",
                &format!("Created member Pod {a2} (etcd 3.5.21)"),
            )
            .await;
        },
        async |rt: KubernetesRuntime| {
            let spec = disk_spec(3);
            let got = rt.reserve(&cluster_ref(), &spec, &a).await.unwrap();
            rt.start(&cluster_ref(), &spec, &a, &cfg).await.unwrap();
            got
        },
    )
    .await;
    assert_eq!(got, reserved(&member("bbbbb"), None));
}

#[tokio::test]
async fn reserving_again_returns_the_same_member_with_its_recorded_config() {
    let a = member("bbbbb");
    let cfg = config(&[&a], InitialState::New);
    let (a2, cfg2) = (a.clone(), cfg.clone());
    let got = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.no_recovery_to_settle().await;
            api.apply_services().await;
            api.list_members(
                vec![pod(&a2, "Running", Some(&cfg2), false)],
                vec![pvc(&a2, Some(&cfg2), false)],
            )
            .await;
            api.apply_pdb(2).await;
            api.expect(
                Method::POST,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims?&{MANAGED}"),
                Some(JSON),
            )
            .await
            .reply(
                StatusCode::CONFLICT,
                &status(409, "AlreadyExists", "already exists"),
            );
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data"),
                None,
            )
            .await
            .reply(StatusCode::OK, &pvc(&a2, Some(&cfg2), false));
        },
        async |rt: KubernetesRuntime| rt.reserve(&cluster_ref(), &disk_spec(3), &a).await.unwrap(),
    )
    .await;
    assert_eq!(got, reserved(&member("bbbbb"), Some(cfg)));
}

#[tokio::test]
async fn a_removed_member_s_claim_is_never_taken_over_by_a_new_member() {
    let a = member("bbbbb");
    let a2 = a.clone();
    let err = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.no_recovery_to_settle().await;
            api.apply_services().await;
            api.list_members(vec![], vec![]).await;
            api.apply_pdb(1).await;
            api.expect(
                Method::POST,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims?&{MANAGED}"),
                Some(JSON),
            )
            .await
            .reply(
                StatusCode::CONFLICT,
                &status(409, "AlreadyExists", "already exists"),
            );
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data"),
                None,
            )
            .await
            .reply(
                StatusCode::OK,
                &set_aside_pvc(&a2, "2026-11-25T10:00:00.000Z", None),
            );
        },
        async |rt: KubernetesRuntime| rt.reserve(&cluster_ref(), &disk_spec(1), &a).await.unwrap_err(),
    )
    .await;
    assert!(
        matches!(&err, RuntimeError::State { detail, .. } if detail.contains("holds the data of removed member") && detail.contains("bbbbb")),
        "{err}"
    );
}

#[tokio::test]
async fn removing_a_member_that_never_started_deletes_its_claim() {
    let c = member("ddddd");
    let c2 = c.clone();
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.delete(&format!("/api/v1/namespaces/{NS}/pods/{c2}"), None)
                .await;
            let path = format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{c2}-data");
            let patch = api
                .expect(Method::PATCH, &format!("{path}?&{MANAGED}"), Some(MERGE_PATCH))
                .await;
            // Answered without a configuration: it never started. Deleted, not set aside
            // (nothing listed, nothing pruned).
            patch.reply(
                StatusCode::OK,
                &set_aside_pvc(&c2, "2026-11-25T10:00:00.000Z", None),
            );
            api.delete(&path, Some(pvc(&c2, None, true))).await;
            api.delete_member_certificates(&c2, false).await;
            api.list_members(vec![], vec![]).await;
            api.apply_pdb(1).await;
            api.event("MemberRemoved", &format!("Removed member {c2}")).await;
        },
        async |rt: KubernetesRuntime| rt.remove(&cluster_ref(), &c, false).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn starting_a_running_member_keeps_its_first_config_and_changes_nothing() {
    let a = member("bbbbb");
    let first = config(&[&a], InitialState::New);
    let other = config(&[&a], InitialState::Existing);
    let (a2, first2) = (a.clone(), first.clone());
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data"),
                None,
            )
            .await
            .reply(StatusCode::OK, &pvc(&a2, Some(&first2), false));
            api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await
                .reply(StatusCode::OK, &pod(&a2, "Running", Some(&first2), false));
        },
        async |rt: KubernetesRuntime| rt.start(&cluster_ref(), &disk_spec(3), &a, &other).await.unwrap(),
    )
    .await;
}

const OPERATOR_IMAGE: &str = "ghcr.io/etcd-operator/etcd-operator:0.1.0";

fn s3_plan() -> RestorePlan {
    RestorePlan {
        source: SnapshotSource::Store {
            destination: BackupDestination {
                s3: Some(S3Destination {
                    bucket: "etcd-backups".into(),
                    endpoint: Some("http://minio.storage.svc:9000".into()),
                    force_path_style: Some(true),
                    credentials_secret: Some("s3-keys".into()),
                    ..Default::default()
                }),
                volume: None,
            },
            key: "prod/main/manual/before-5.db".into(),
        },
        expected_sha256: Some("ab".repeat(32)),
    }
}

#[tokio::test]
async fn a_member_from_a_snapshot_gets_init_containers_that_fetch_verify_and_restore_it() {
    let a = member("bbbbb");
    let mut cfg = config(&[&a], InitialState::New);
    cfg.restore = Some(s3_plan());
    let (a2, cfg2) = (a.clone(), cfg.clone());
    scenario_with(
        Some(OPERATOR_IMAGE),
        async move |api: &mut ApiServerVerifier| {
            api.record_config(&a2, &cfg2).await;
            api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await
                .not_found(&format!("pods \"{a2}\""));
            let apply = api
                .expect(
                    Method::PATCH,
                    &format!("/api/v1/namespaces/{NS}/pods/{a2}?&{APPLY}"),
                    Some(APPLY_PATCH),
                )
                .await;
            let init = apply.body["spec"]["initContainers"].clone();
            let mount = json!([{"name": "data", "mountPath": "/var/lib/etcd"}]);
            let key = |k: &str| json!({"name": k, "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": k, "optional": false}}});
            assert_eq!(init[0]["name"], "restore-fetch");
            assert_eq!(init[0]["image"], OPERATOR_IMAGE);
            assert_eq!(
                init[0]["args"],
                json!([
                    "fetch-snapshot",
                    "--plan",
                    serde_json::to_string(&s3_plan()).unwrap(),
                    "--data-dir",
                    "/var/lib/etcd/data",
                    "--snapshot",
                    "/var/lib/etcd/restore/snapshot.db",
                    "--staging",
                    "/var/lib/etcd/restore/data"
                ])
            );
            assert_eq!(
                init[0]["env"],
                json!([key("AWS_ACCESS_KEY_ID"), key("AWS_SECRET_ACCESS_KEY")])
            );
            assert_eq!(init[0]["volumeMounts"], mount);
            assert_eq!(init[1]["name"], "restore");
            assert_eq!(init[1]["image"], "gcr.io/etcd-development/etcd:v3.5.21");
            assert_eq!(
                init[1]["command"],
                json!([
                    "etcdutl",
                    "snapshot",
                    "restore",
                    "/var/lib/etcd/restore/snapshot.db",
                    "--name",
                    a2,
                    "--initial-cluster",
                    cfg2.initial_cluster_flag(),
                    "--initial-cluster-token",
                    UID,
                    "--initial-advertise-peer-urls",
                    peer_url(&a2),
                    "--data-dir",
                    "/var/lib/etcd/restore/data"
                ])
            );
            assert_eq!(init[1]["volumeMounts"], mount);
            assert_eq!(init[2]["name"], "restore-finish");
            assert_eq!(init[2]["image"], OPERATOR_IMAGE);
            assert_eq!(
                init[2]["args"],
                json!([
                    "finish-restore",
                    "--data-dir",
                    "/var/lib/etcd/data",
                    "--staging",
                    "/var/lib/etcd/restore/data"
                ])
            );
            assert_eq!(init.as_array().unwrap().len(), 3);
            assert_eq!(apply.body["metadata"]["annotations"][CONFIG], config_json(&cfg2));
            let body = apply.body.clone();
            apply.reply(StatusCode::OK, &body);
            api.event(
                "MemberPodCreated",
                &format!("Created member Pod {a2} (etcd 3.5.21)"),
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.start(&cluster_ref(), &disk_spec(3), &a, &cfg).await.unwrap(),
    )
    .await;
}

async fn refused_restore(operator_image: Option<&str>, plan: RestorePlan) -> RuntimeError {
    let a = member("bbbbb");
    let mut cfg = config(&[&a], InitialState::New);
    cfg.restore = Some(plan);
    // No request is expected: the verifier fails on any call.
    scenario_with(
        operator_image,
        async move |_api: &mut ApiServerVerifier| {},
        async |rt: KubernetesRuntime| {
            rt.start(&cluster_ref(), &disk_spec(3), &a, &cfg)
                .await
                .unwrap_err()
        },
    )
    .await
}

#[tokio::test]
async fn a_restore_without_the_operator_image_is_refused_before_any_call() {
    let err = refused_restore(None, s3_plan()).await;
    assert!(matches!(err, RuntimeError::Restore { .. }), "{err}");
    assert_eq!(
        etcd_operator_api::report::chain(&err),
        "restore from snapshot for member demo-bbbbb: the operator's image is unknown, so member Pods cannot fetch the snapshot: set ETCD_OPERATOR_IMAGE in the operator's environment (the Helm chart does)"
    );
}

#[tokio::test]
async fn a_restore_from_a_volume_the_member_pods_cannot_mount_is_refused_before_any_call() {
    // A claim in the cluster's namespace is mounted (see the pod builder's tests); a directory on
    // the operator's host is not reachable.
    for volume in [VolumeDestination {
        claim_name: None,
        path: Some("/var/backups".into()),
    }] {
        let plan = RestorePlan {
            source: SnapshotSource::Store {
                destination: BackupDestination {
                    s3: None,
                    volume: Some(volume),
                },
                key: "prod/main/x.db".into(),
            },
            expected_sha256: None,
        };
        let err = refused_restore(Some(OPERATOR_IMAGE), plan).await;
        assert!(
            etcd_operator_api::report::chain(&err).starts_with(
                "restore from snapshot for member demo-bbbbb: the snapshot cannot be fetched from the member Pods: snapshot \"prod/main/x.db\" is in "
            ),
            "{}",
            etcd_operator_api::report::Chain(&err)
        );
        assert!(
            etcd_operator_api::report::chain(&err).contains("which member Pods cannot mount"),
            "{}",
            etcd_operator_api::report::Chain(&err)
        );
    }
}

#[tokio::test]
async fn a_failed_restore_init_container_is_reported_with_its_message() {
    let a = member("bbbbb");
    let mut cfg = config(&[&a], InitialState::New);
    cfg.restore = Some(s3_plan());
    let (a2, cfg2) = (a.clone(), cfg.clone());
    let message = "snapshot s3://etcd-backups/prod/main/manual/before-5.db was refused: its SHA-256 is 00 but ab was recorded when it was taken (corrupted or replaced)";
    let err = scenario_with(
        Some(OPERATOR_IMAGE),
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data"),
                None,
            )
            .await
            .reply(StatusCode::OK, &pvc(&a2, Some(&cfg2), false));
            let mut failing = pod(&a2, "Pending", Some(&cfg2), false);
            failing["status"]["initContainerStatuses"] = json!([{
                "name": "restore-fetch", "image": OPERATOR_IMAGE, "imageID": "", "ready": false,
                "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": format!("{message}\n")}}
            }]);
            api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await
                .reply(StatusCode::OK, &failing);
        },
        async |rt: KubernetesRuntime| {
            rt.start(&cluster_ref(), &disk_spec(3), &a, &cfg)
                .await
                .unwrap_err()
        },
    )
    .await;
    assert_eq!(
        etcd_operator_api::report::chain(&err),
        format!(
            "restore from snapshot for member demo-bbbbb: init container restore-fetch of the member Pod failed: {message}"
        )
    );
}

#[tokio::test]
async fn a_restore_init_container_that_succeeded_after_a_failure_is_not_reported() {
    let a = member("bbbbb");
    let mut cfg = config(&[&a], InitialState::New);
    cfg.restore = Some(s3_plan());
    let (a2, cfg2) = (a.clone(), cfg.clone());
    scenario_with(
        Some(OPERATOR_IMAGE),
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data"),
                None,
            )
            .await
            .reply(StatusCode::OK, &pvc(&a2, Some(&cfg2), false));
            let mut recovered = pod(&a2, "Pending", Some(&cfg2), false);
            recovered["status"]["initContainerStatuses"] = json!([
                {
                    "name": "restore-fetch", "image": OPERATOR_IMAGE, "imageID": "", "ready": true,
                    "restartCount": 1,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "timeout"}}
                },
                {
                    "name": "restore", "image": "gcr.io/etcd-development/etcd:v3.5.21", "imageID": "",
                    "ready": false, "restartCount": 0, "state": {"running": {}}, "lastState": {}
                }
            ]);
            api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await
                .reply(StatusCode::OK, &recovered);
        },
        async |rt: KubernetesRuntime| rt.start(&cluster_ref(), &disk_spec(3), &a, &cfg).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn starting_an_unreserved_member_fails() {
    let a = member("bbbbb");
    let a2 = a.clone();
    let err = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data"),
                None,
            )
            .await
            .not_found("persistentvolumeclaims");
        },
        async |rt: KubernetesRuntime| {
            rt.start(
                &cluster_ref(),
                &disk_spec(3),
                &a,
                &config(&[&a], InitialState::New),
            )
            .await
            .unwrap_err()
        },
    )
    .await;
    assert!(matches!(err, RuntimeError::UnknownMember { name } if name == member("bbbbb")));
}

#[tokio::test]
async fn a_stopped_pod_is_deleted_so_that_it_is_recreated_on_its_volume() {
    let a = member("bbbbb");
    let cfg = config(&[&a], InitialState::New);
    let (a2, cfg2) = (a.clone(), cfg.clone());
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data"),
                None,
            )
            .await
            .reply(StatusCode::OK, &pvc(&a2, Some(&cfg2), false));
            api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await
                .reply(StatusCode::OK, &pod(&a2, "Failed", Some(&cfg2), false));
            api.delete(
                &format!("/api/v1/namespaces/{NS}/pods/{a2}"),
                Some(pod(&a2, "Failed", Some(&cfg2), true)),
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.start(&cluster_ref(), &disk_spec(3), &a, &cfg).await.unwrap(),
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Version change (rolling upgrade)

#[tokio::test]
async fn changing_a_version_records_it_on_the_volume_claim_then_deletes_the_pod_with_an_event() {
    let a = member("bbbbb");
    let cfg = config(&[&a], InitialState::New);
    let mut upgraded = cfg.clone();
    upgraded.version = "3.5.22".to_owned();
    upgraded.previous_version = Some("3.5.21".to_owned());
    let (a2, cfg2, up2) = (a.clone(), cfg.clone(), upgraded.clone());
    scenario(
        async move |api: &mut ApiServerVerifier| {
            let pvc_path = format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data");
            api.expect(Method::GET, &pvc_path, None)
                .await
                .reply(StatusCode::OK, &pvc(&a2, Some(&cfg2), false));
            // The new version goes on the PVC first (crash-safe), keeping the old one.
            let patch = api
                .expect(Method::PATCH, &format!("{pvc_path}?&{MANAGED}"), Some(MERGE_PATCH))
                .await;
            assert_eq!(
                patch.body,
                json!({"metadata": {"annotations": {CONFIG: config_json(&up2)}}})
            );
            patch.reply(StatusCode::OK, &pvc(&a2, Some(&up2), false));
            api.delete(
                &format!("/api/v1/namespaces/{NS}/pods/{a2}"),
                Some(pod(&a2, "Running", Some(&cfg2), true)),
            )
            .await;
            api.event(
                "MemberVersionChanging",
                &format!(
                    "Deleted Pod {a2} to recreate it on PersistentVolumeClaim {a2}-data with etcd 3.5.22 (was 3.5.21)"
                ),
            )
            .await;
        },
        async |rt: KubernetesRuntime| {
            rt.change_version(&cluster_ref(), &disk_spec(3), &a, "3.5.22")
                .await
                .unwrap()
        },
    )
    .await;

    // While the old Pod terminates, the member is Gone (restartable) with the PVC's new config.
    let (a3, cfg3, up3) = (a.clone(), cfg.clone(), upgraded.clone());
    let members = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.list_members(
                vec![pod(&a3, "Running", Some(&cfg3), true)],
                vec![pvc(&a3, Some(&up3), false)],
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.members(&cluster_ref()).await.unwrap(),
    )
    .await;
    assert_eq!(members[0].config.as_ref(), Some(&upgraded));
    assert!(matches!(
        members[0].liveness,
        Liveness::Gone {
            restartable: true,
            ..
        }
    ));

    // Once it is gone, the next change (same version) recreates the Pod with the new image.
    let (a4, up4) = (a.clone(), upgraded.clone());
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a4}-data"),
                None,
            )
            .await
            .reply(StatusCode::OK, &pvc(&a4, Some(&up4), false));
            api.create_pod(&a4, &up4).await;
            api.event(
                "MemberPodCreated",
                &format!("Created member Pod {a4} (etcd 3.5.22)"),
            )
            .await;
        },
        async |rt: KubernetesRuntime| {
            rt.change_version(&cluster_ref(), &disk_spec(3), &a, "3.5.22")
                .await
                .unwrap()
        },
    )
    .await;
}

#[tokio::test]
async fn a_version_change_of_an_unknown_or_memory_member_fails_and_changes_nothing() {
    let a = member("bbbbb");
    let a2 = a.clone();
    let err = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data"),
                None,
            )
            .await
            .not_found("persistentvolumeclaims");
        },
        async |rt: KubernetesRuntime| {
            rt.change_version(&cluster_ref(), &disk_spec(3), &a, "3.5.22")
                .await
                .unwrap_err()
        },
    )
    .await;
    assert!(matches!(err, RuntimeError::UnknownMember { .. }), "{err}");
    // No request at all for a memory member: its data would not survive the Pod.
    let err = scenario(
        async |_api: &mut ApiServerVerifier| {},
        async |rt: KubernetesRuntime| {
            rt.change_version(&cluster_ref(), &memory_spec(), &a, "3.5.22")
                .await
                .unwrap_err()
        },
    )
    .await;
    assert!(err.to_string().contains("memory-backed"), "{err}");
}

#[tokio::test]
async fn stopping_a_member_deletes_its_pod_and_keeps_its_claim() {
    let a = member("bbbbb");
    let a2 = a.clone();
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.delete(&format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await;
        },
        async |rt: KubernetesRuntime| {
            rt.stop(&cluster_ref(), &a).await.unwrap();
            assert_eq!(rt.snapshot_dir(&cluster_ref()), None);
        },
    )
    .await;
}

/// A settled cluster is observed from the controller's watches: no request at all. Once this
/// process writes to the cluster (here: a member stopped), its next observation lists from the
/// API, so a step sees its own effect even before the watch event arrives.
#[tokio::test]
async fn members_come_from_the_watches_without_a_request_until_this_process_writes() {
    let [a, b] = ["bbbbb", "ccccc"].map(member);
    let cfg = config(&[&a, &b], InitialState::New);
    fn object<K: serde::de::DeserializeOwned>(v: Value) -> K {
        serde_json::from_value(v).unwrap()
    }
    let cache = etcd_operator_controller::runtime::kubernetes::ChildCache::filled(
        vec![
            object(pod(&a, "Running", Some(&cfg), false)),
            object(pod(&b, "Running", Some(&cfg), false)),
        ],
        vec![
            object(pvc(&a, Some(&cfg), false)),
            object(pvc(&b, Some(&cfg), false)),
        ],
        Vec::new(),
    );
    let (a2, b2, cfg2) = (a.clone(), b.clone(), cfg.clone());
    let (cached, listed) = scenario(
        async move |api: &mut ApiServerVerifier| {
            // Nothing for the first observation; the stop; then the list after it.
            api.delete(&format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await;
            api.list_members(
                vec![pod(&b2, "Running", Some(&cfg2), false)],
                vec![pvc(&a2, Some(&cfg2), false), pvc(&b2, Some(&cfg2), false)],
            )
            .await;
        },
        async |rt: KubernetesRuntime| {
            let rt = rt.with_child_cache(cache);
            let cached = rt.members(&cluster_ref()).await.unwrap();
            rt.stop(&cluster_ref(), &a).await.unwrap();
            let listed = rt.members(&cluster_ref()).await.unwrap();
            (cached, listed)
        },
    )
    .await;
    let liveness = |members: &[RuntimeMember]| -> Vec<(String, bool)> {
        members
            .iter()
            .map(|m| (m.name.clone(), m.liveness == Liveness::Running))
            .collect()
    };
    assert_eq!(liveness(&cached), [(a.clone(), true), (b.clone(), true)]);
    assert_eq!(liveness(&listed), [(a, false), (b, true)]);
}

// ---------------------------------------------------------------------------------------------
// Scale

#[tokio::test]
async fn scale_up_reserves_and_starts_an_additional_member() {
    let [a, b, c, d] = ["bbbbb", "ccccc", "ddddd", "fffff"].map(member);
    let boot = config(&[&a, &b, &c], InitialState::New);
    let join = config(&[&a, &b, &c, &d], InitialState::Existing);
    let (d2, boot2, join2) = (d.clone(), boot.clone(), join.clone());
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.no_recovery_to_settle().await;
            api.apply_services().await;
            let running = [&a, &b, &c];
            api.list_members(
                running
                    .iter()
                    .map(|m| pod(m, "Running", Some(&boot2), false))
                    .collect(),
                running.iter().map(|m| pvc(m, Some(&boot2), false)).collect(),
            )
            .await;
            // Four members (three running + the new one; the spec says 4): quorum 3.
            api.apply_pdb(3).await;
            api.create_pvc(&d2).await;
            api.record_config(&d2, &join2).await;
            api.create_pod(&d2, &join2).await;
            api.event(
                "MemberPodCreated",
                &format!("Created member Pod {d2} (etcd 3.5.21)"),
            )
            .await;
        },
        async |rt: KubernetesRuntime| {
            let spec = disk_spec(4);
            rt.reserve(&cluster_ref(), &spec, &d).await.unwrap();
            rt.start(&cluster_ref(), &spec, &d, &join).await.unwrap();
        },
    )
    .await;
}

#[tokio::test]
async fn scale_down_and_replace_delete_the_pod_and_set_its_volume_claim_aside() {
    let [a, b, c] = ["bbbbb", "ccccc", "ddddd"].map(member);
    let boot = config(&[&a, &b, &c], InitialState::New);
    let (c2, boot2) = (c.clone(), boot.clone());
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.delete(
                &format!("/api/v1/namespaces/{NS}/pods/{c2}"),
                Some(pod(&c2, "Running", Some(&boot2), true)),
            )
            .await;
            // Its claim set aside; with three older ones already, the oldest goes.
            let listed = vec![
                set_aside_pvc("old1", "2026-11-20T10:00:00.000Z", None),
                set_aside_pvc("old2", "2026-11-21T10:00:00.000Z", None),
                set_aside_pvc("old3", "2026-11-22T10:00:00.000Z", None),
                set_aside_pvc(&c2, "2099-01-01T00:00:00.000Z", Some(&boot2)),
            ];
            // The member had started: its configuration is on the claim.
            let answered = set_aside_pvc(&c2, "2099-01-01T00:00:00.000Z", Some(&boot2));
            api.set_aside(&c2, Some(answered), listed, &["old1-data"]).await;
            api.delete_member_certificates(&c2, true).await;
            // The PDB follows the members that remain: two, quorum 2.
            api.list_members(
                vec![
                    pod(&a, "Running", Some(&boot2), false),
                    pod(&b, "Running", Some(&boot2), false),
                    pod(&c2, "Running", Some(&boot2), true),
                ],
                vec![
                    pvc(&a, Some(&boot2), false),
                    pvc(&b, Some(&boot2), false),
                    pvc(&c2, Some(&boot2), true),
                ],
            )
            .await;
            api.apply_pdb(2).await;
            api.event(
                "MemberRemoved",
                &format!("Removed member {c2}, set its volume claim {c2}-data aside (the newest 3 removed members' claims stay until the cluster is deleted)"),
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.remove(&cluster_ref(), &c, false).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn a_replacement_is_announced_with_a_warning_event_naming_the_member_pod() {
    let c = member("eeeee");
    let c2 = c.clone();
    scenario(
        async move |api: &mut ApiServerVerifier| {
            let event = api
                .expect(
                    Method::POST,
                    &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events?"),
                    Some(JSON),
                )
                .await;
            assert_eq!(event.body["type"], "Warning");
            assert_eq!(event.body["reason"], "MemberReplacing");
            assert_eq!(event.body["action"], "ReplaceMember");
            assert_eq!(event.body["regarding"]["kind"], "EtcdCluster");
            assert_eq!(
                event.body["related"],
                json!({"apiVersion": "v1", "kind": "Pod", "name": c2, "namespace": NS})
            );
            assert_eq!(
                event.body["note"],
                format!("member {c2} will be replaced by a fresh member: it cannot start")
            );
            let body = event.body.clone();
            event.reply(StatusCode::CREATED, &body);
        },
        async |rt: KubernetesRuntime| {
            rt.announce_replacement(
                &cluster_ref(),
                &c,
                &format!("member {c} will be replaced by a fresh member: it cannot start"),
            )
            .await;
        },
    )
    .await;
}

#[tokio::test]
async fn a_warning_is_a_warning_event_on_the_cluster_with_its_reason_and_action() {
    scenario(
        async move |api: &mut ApiServerVerifier| {
            let event = api
                .expect(
                    Method::POST,
                    &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events?"),
                    Some(JSON),
                )
                .await;
            assert_eq!(event.body["type"], "Warning");
            assert_eq!(event.body["reason"], "EtcdTimeout");
            assert_eq!(event.body["action"], "AddLearner");
            assert_eq!(event.body["regarding"]["kind"], "EtcdCluster");
            assert_eq!(event.body["note"], "AddLearner failed: member add timed out");
            let body = event.body.clone();
            event.reply(StatusCode::CREATED, &body);
        },
        async |rt: KubernetesRuntime| {
            rt.warn(
                &cluster_ref(),
                "EtcdTimeout",
                "AddLearner",
                "AddLearner failed: member add timed out",
            )
            .await;
        },
    )
    .await;
}

#[tokio::test]
async fn removing_an_already_removed_member_succeeds() {
    let c = member("ddddd");
    let c2 = c.clone();
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.delete(&format!("/api/v1/namespaces/{NS}/pods/{c2}"), None)
                .await;
            // No claim to set aside: nothing listed, nothing pruned.
            api.set_aside(&c2, None, vec![], &[]).await;
            api.delete_member_certificates(&c2, false).await;
            api.list_members(vec![], vec![]).await;
            api.apply_pdb(1).await;
            api.event("MemberRemoved", &format!("Removed member {c2}")).await;
        },
        async |rt: KubernetesRuntime| rt.remove(&cluster_ref(), &c, false).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn removing_a_member_but_keeping_its_data_releases_the_volume_claim() {
    let c = member("ddddd");
    let c2 = c.clone();
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.delete(&format!("/api/v1/namespaces/{NS}/pods/{c2}"), None)
                .await;
            let release = api
                .expect(
                    Method::PATCH,
                    &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{c2}-data?&{MANAGED}"),
                    Some(MERGE_PATCH),
                )
                .await;
            assert_eq!(
                release.body,
                json!({"metadata": {
                    "labels": {"etcd.operator.dev/cluster": null, "etcd.operator.dev/member": null},
                    "ownerReferences": null,
                    "annotations": {"etcd.operator.dev/released-from": format!("{NS}/{NAME}/{c2}")}
                }})
            );
            release.reply(StatusCode::OK, &pvc(&c2, None, false));
            api.delete_member_certificates(&c2, false).await;
            api.list_members(vec![], vec![]).await;
            api.apply_pdb(1).await;
            api.event(
                "MemberRemoved",
                &format!("Removed member {c2}, kept its volume claim {c2}-data"),
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.remove(&cluster_ref(), &c, true).await.unwrap(),
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Delete

#[tokio::test]
async fn teardown_deletes_pods_volume_claims_services_and_the_budget() {
    scenario(
        async |api: &mut ApiServerVerifier| {
            api.expect(
                Method::DELETE,
                &format!("/api/v1/namespaces/{NS}/pods?&{SELECTOR}"),
                Some(JSON),
            )
            .await
            .reply(StatusCode::OK, &list("PodList", vec![]));
            api.expect(
                Method::DELETE,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims?&{SELECTOR}"),
                Some(JSON),
            )
            .await
            .reply(StatusCode::OK, &list("PersistentVolumeClaimList", vec![]));
            api.delete(
                &format!("/api/v1/namespaces/{NS}/services/{NAME}"),
                Some(status(200, "", "")),
            )
            .await;
            // Already gone (garbage collected): fine.
            api.delete(&format!("/api/v1/namespaces/{NS}/services/{NAME}-client"), None)
                .await;
            api.delete(
                &format!("/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/{NAME}"),
                None,
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.teardown(&cluster_ref(), false).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn teardown_keeping_data_releases_every_volume_claim() {
    let [a, b] = ["bbbbb", "ccccc"].map(member);
    scenario(
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::DELETE,
                &format!("/api/v1/namespaces/{NS}/pods?&{SELECTOR}"),
                Some(JSON),
            )
            .await
            .reply(StatusCode::OK, &list("PodList", vec![]));
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims?&{SELECTOR}"),
                None,
            )
            .await
            .reply(
                StatusCode::OK,
                &list(
                    "PersistentVolumeClaimList",
                    vec![pvc(&a, None, false), pvc(&b, None, false)],
                ),
            );
            for m in [&a, &b] {
                let release = api
                    .expect(
                        Method::PATCH,
                        &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{m}-data?&{MANAGED}"),
                        Some(MERGE_PATCH),
                    )
                    .await;
                assert_eq!(release.body["metadata"]["ownerReferences"], Value::Null);
                assert_eq!(
                    release.body["metadata"]["annotations"]["etcd.operator.dev/released-from"],
                    format!("{NS}/{NAME}/{m}")
                );
                release.reply(StatusCode::OK, &pvc(m, None, false));
            }
            api.delete(&format!("/api/v1/namespaces/{NS}/services/{NAME}"), None)
                .await;
            api.delete(&format!("/api/v1/namespaces/{NS}/services/{NAME}-client"), None)
                .await;
            api.delete(
                &format!("/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/{NAME}"),
                None,
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.teardown(&cluster_ref(), true).await.unwrap(),
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Observe

#[tokio::test]
async fn members_are_classified_running_gone_or_reserved() {
    let names = [
        "bbbbb", "ccccc", "ddddd", "fffff", "ggggg", "hhhhh", "jjjjj", "kkkkk",
    ]
    .map(member);
    let [
        running,
        pending,
        failed,
        terminating,
        missing,
        reserved_only,
        removed,
        doomed,
    ] = names.clone();
    let cfg = config(&[&running, &pending, &failed], InitialState::New);
    let cfg2 = cfg.clone();
    let got = scenario(
        async move |api: &mut ApiServerVerifier| {
            // The running one's container was restarted by the kubelet (a crash loop).
            let mut restarted = pod(&running, "Running", Some(&cfg2), false);
            restarted["status"]["containerStatuses"] = json!([{
                "name": "etcd", "image": "etcd", "imageID": "", "ready": false, "restartCount": 4
            }]);
            // A member is as old as its claim (the Pod, re-created, is younger); the pending
            // one's claim says nothing, so its Pod's time counts.
            restarted["metadata"]["creationTimestamp"] = json!("2026-05-05T00:00:00Z");
            let mut running_claim = pvc(&running, Some(&cfg2), false);
            running_claim["metadata"]["creationTimestamp"] = json!("2026-01-02T03:04:05Z");
            let mut pending_pod = pod(&pending, "Pending", Some(&cfg2), false);
            pending_pod["metadata"]["creationTimestamp"] = json!("2026-02-03T04:05:06Z");
            api.list_members(
                vec![
                    restarted,
                    pending_pod,
                    pod(&failed, "Failed", Some(&cfg2), false),
                    pod(&terminating, "Running", Some(&cfg2), true),
                    pod(&removed, "Running", Some(&cfg2), true),
                    pod(&doomed, "Running", Some(&cfg2), false),
                    // Not a member: no member label.
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray", "labels": {"etcd.operator.dev/cluster": NAME}}}),
                ],
                vec![
                    running_claim,
                    pvc(&pending, Some(&cfg2), false),
                    pvc(&failed, Some(&cfg2), false),
                    pvc(&terminating, Some(&cfg2), false),
                    pvc(&missing, Some(&cfg2), false),
                    pvc(&reserved_only, None, false),
                    pvc(&removed, Some(&cfg2), true),
                    pvc(&doomed, Some(&cfg2), true),
                ],
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.members(&cluster_ref()).await.unwrap(),
    )
    .await;
    let [
        running,
        pending,
        failed,
        terminating,
        missing,
        reserved_only,
        _removed,
        doomed,
    ] = names;
    let with = |name: &str, liveness: Liveness| RuntimeMember {
        name: name.to_owned(),
        peer_url: peer_url(name),
        client_url: client_url(name),
        config: Some(cfg.clone()),
        liveness,
        certificates: None,
        restarts: 0,
        template_hash: None,
        created: None,
        // Every claim asks for 1Gi and reports no capacity yet.
        volume: Some(VolumeState {
            requested: 1 << 30,
            capacity: 0,
            resize_pending: false,
        }),
    };
    let gone = |reason: String, restartable: bool| Liveness::Gone { reason, restartable };
    assert_eq!(
        got,
        vec![
            RuntimeMember {
                restarts: 4,
                created: chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
                    .ok()
                    .map(|t| t.to_utc()),
                ..with(&running, Liveness::Running)
            },
            RuntimeMember {
                created: chrono::DateTime::parse_from_rfc3339("2026-02-03T04:05:06Z")
                    .ok()
                    .map(|t| t.to_utc()),
                ..with(&pending, Liveness::Running)
            },
            with(&failed, gone(format!("Pod {failed} has phase Failed"), true)),
            with(
                &terminating,
                gone(format!("Pod {terminating} is being deleted"), true)
            ),
            with(&missing, gone(format!("Pod {missing} is missing"), true)),
            RuntimeMember {
                volume: with(&running, Liveness::Running).volume,
                ..reserved(&reserved_only, None)
            },
            // The removed member (Pod and PVC being deleted) is not reported.
            RuntimeMember {
                volume: None,
                ..with(
                    &doomed,
                    gone(
                        format!("the PersistentVolumeClaim of member {doomed} is being deleted"),
                        false
                    )
                )
            },
        ]
    );
}

#[tokio::test]
async fn memory_members_are_reserved_in_the_runtime_and_never_restarted_empty() {
    let a = member("bbbbb");
    let mut cfg = config(&[&a], InitialState::New);
    cfg.version = "3.4.23".to_owned();
    let (a2, cfg2) = (a.clone(), cfg.clone());
    let (reserved_view, running_view, gone_view, err) = scenario(
        async move |api: &mut ApiServerVerifier| {
            // reserve: no PVC.
            api.no_recovery_to_settle().await;
            api.apply_services().await;
            api.list_members(vec![], vec![]).await;
            api.apply_pdb(2).await;
            // members(): known only to the runtime.
            api.list_members(vec![], vec![]).await;
            // start: the Pod with a tmpfs emptyDir.
            api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await
                .not_found("pods");
            let apply = api
                .expect(
                    Method::PATCH,
                    &format!("/api/v1/namespaces/{NS}/pods/{a2}?&{APPLY}"),
                    Some(APPLY_PATCH),
                )
                .await;
            assert_eq!(
                apply.body["spec"]["volumes"][0],
                json!({"name": "data", "emptyDir": {"medium": "Memory", "sizeLimit": "512Mi"}})
            );
            assert_eq!(
                apply.body["spec"]["containers"][0]["image"],
                "gcr.io/etcd-development/etcd:v3.4.23"
            );
            apply.echo();
            api.event(
                "MemberPodCreated",
                &format!("Created member Pod {a2} (etcd 3.4.23)"),
            )
            .await;
            // members(): running, then its Pod is gone.
            api.list_members(vec![memory_pod(&a2, &cfg2)], vec![]).await;
            api.list_members(vec![], vec![]).await;
            // start again: refused, the data is lost.
            api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await
                .not_found("pods");
        },
        async |rt: KubernetesRuntime| {
            let spec = memory_spec();
            let cluster = cluster_ref();
            assert_eq!(rt.reserve(&cluster, &spec, &a).await.unwrap(), reserved(&a, None));
            let reserved_view = rt.members(&cluster).await.unwrap();
            rt.start(&cluster, &spec, &a, &cfg).await.unwrap();
            let running_view = rt.members(&cluster).await.unwrap();
            let gone_view = rt.members(&cluster).await.unwrap();
            let err = rt.start(&cluster, &spec, &a, &cfg).await.unwrap_err();
            (reserved_view, running_view, gone_view, err)
        },
    )
    .await;
    assert_eq!(reserved_view, vec![reserved(&member("bbbbb"), None)]);
    assert_eq!(running_view.len(), 1);
    assert_eq!(running_view[0].liveness, Liveness::Running);
    assert!(
        matches!(&gone_view[0].liveness, Liveness::Gone { reason, restartable: false } if reason.contains("in-memory data"))
    );
    assert!(matches!(err, RuntimeError::State { .. }), "{err}");
}

#[tokio::test]
async fn api_errors_name_the_operation() {
    let err = scenario(
        async |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/pods?&{SELECTOR}"),
                None,
            )
            .await
            .reply(
                StatusCode::FORBIDDEN,
                &status(403, "Forbidden", "pods is forbidden"),
            );
        },
        async |rt: KubernetesRuntime| rt.members(&cluster_ref()).await.unwrap_err(),
    )
    .await;
    assert!(
        matches!(
            err,
            RuntimeError::Kube {
                op: "list member Pods",
                ..
            }
        ),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Golden YAML of the built objects

fn golden(name: &str, value: &impl serde::Serialize) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.yaml"));
    let actual = serde_yaml::to_string(value).unwrap();
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        eprintln!(
            "{} differs from the built object. If the change is intended, regenerate with:\n  \
             UPDATE_GOLDEN=1 cargo test -p etcd-operator-controller --test kubernetes_runtime golden",
            path.display()
        );
    }
    assert_eq!(expected, actual, "golden file {}", path.display());
}

fn golden_config() -> MemberConfig {
    config(
        &[&member("x2b4c"), &member("7kq9z"), &member("m4n6p")],
        InitialState::New,
    )
}

#[test]
fn golden_pod() {
    let pod = resources::build_pod(
        &cluster_ref(),
        &full_spec(),
        &member("x2b4c"),
        &golden_config(),
        None,
        false,
    )
    .unwrap();
    golden("pod", &pod);
}

#[test]
fn golden_pod_restored_from_a_snapshot() {
    let mut cfg = golden_config();
    cfg.restore = Some(s3_plan());
    let pod = resources::build_pod(
        &cluster_ref(),
        &full_spec(),
        &member("x2b4c"),
        &cfg,
        Some(OPERATOR_IMAGE),
        false,
    )
    .unwrap();
    golden("pod-restore", &pod);
}

#[test]
fn golden_pod_memory() {
    let mut cfg = golden_config();
    cfg.version = "3.4.23".to_owned();
    cfg.initial_state = InitialState::Existing;
    let pod = resources::build_pod(
        &cluster_ref(),
        &memory_spec(),
        &member("x2b4c"),
        &cfg,
        None,
        false,
    )
    .unwrap();
    golden("pod-memory", &pod);
}

#[test]
fn golden_pvc() {
    golden(
        "pvc",
        &resources::build_pvc(&cluster_ref(), &full_spec(), &member("x2b4c")),
    );
}

#[test]
fn golden_services() {
    golden("peer-service", &resources::build_peer_service(&cluster_ref()));
    golden("client-service", &resources::build_client_service(&cluster_ref()));
}

#[test]
fn golden_pdb() {
    golden("pdb", &resources::build_pdb(&cluster_ref(), 3));
}

// ---------------------------------------------------------------------------------------------
// Member TLS

mod tls {
    use super::*;
    use etcd_operator_api::v1alpha2::{
        AutoTls, CertManagerTls, IssuerReference, SecretReference, TlsPlane, TlsSpec,
    };
    use etcd_operator_controller::resources::tls::{
        CaMaterial, CertificateUse, MemberTlsMaterial, Plane, build_ca_secret, build_certificate,
        build_member_secret, member_dns_names,
    };
    use etcd_operator_controller::tls::ca::{CA_VALIDITY, CertificateAuthority, LeafSpec, PemPair};
    use etcd_operator_controller::tls::member::{peer_certificate, server_certificate};
    use k8s_openapi::api::core::v1::Secret;
    use pretty_assertions::assert_eq;
    use rustls_pki_types::ServerName;
    use rustls_pki_types::pem::PemObject;
    use std::time::SystemTime;

    fn auto() -> TlsPlane {
        TlsPlane {
            auto: Some(AutoTls {}),
            ..TlsPlane::default()
        }
    }

    fn secret_ref(name: &str) -> TlsPlane {
        TlsPlane {
            secret_ref: Some(SecretReference {
                name: name.to_owned(),
            }),
            ..TlsPlane::default()
        }
    }

    fn cert_manager() -> TlsPlane {
        TlsPlane {
            cert_manager: Some(CertManagerTls {
                issuer_ref: IssuerReference {
                    name: "etcd-ca".to_owned(),
                    kind: Some("ClusterIssuer".to_owned()),
                    group: None,
                },
            }),
            ..TlsPlane::default()
        }
    }

    /// `base` with `spec.tls` and, when given, the rotate-certificates annotation.
    fn with_tls(
        base: ValidatedCluster,
        client: Option<TlsPlane>,
        peer: Option<TlsPlane>,
        rotation: Option<&str>,
    ) -> ValidatedCluster {
        let mut view = base;
        view.tls = etcd_operator_controller::tls::member::TlsPlanes::of(Some(&TlsSpec { client, peer }));
        if let Some(rotation) = rotation {
            view.certificate_rotation = Some(rotation.to_owned());
        }
        view
    }

    fn auto_spec(rotation: Option<&str>) -> ValidatedCluster {
        with_tls(disk_spec(3), Some(auto()), Some(auto()), rotation)
    }

    fn https_peer(member: &str) -> String {
        format!("https://{member}.{NAME}.{NS}.svc:2380")
    }

    fn tls_config(members: &[&str]) -> MemberConfig {
        MemberConfig {
            initial_cluster: members.iter().map(|m| (m.to_string(), https_peer(m))).collect(),
            ..config(members, InitialState::New)
        }
    }

    fn secret_path(name: &str) -> String {
        format!("/api/v1/namespaces/{NS}/secrets/{name}")
    }

    fn to_value(secret: &Secret) -> Value {
        let mut value = serde_json::to_value(secret).unwrap();
        value["apiVersion"] = json!("v1");
        value["kind"] = json!("Secret");
        value
    }

    fn from_value(value: &Value) -> Secret {
        serde_json::from_value(value.clone()).unwrap()
    }

    fn text(secret: &Secret, key: &str) -> String {
        let data = secret.data.as_ref().unwrap();
        String::from_utf8(data.get(key).unwrap_or_else(|| panic!("no {key}")).0.clone()).unwrap()
    }

    /// The names a member's serving certificate must verify for.
    fn names(member: &str) -> Vec<ServerName<'static>> {
        let mut names: Vec<ServerName<'static>> = member_dns_names(&cluster_ref(), member)
            .into_iter()
            .map(|d| ServerName::try_from(d).unwrap())
            .collect();
        names.push(ServerName::try_from("localhost").unwrap());
        names.push(ServerName::try_from("127.0.0.1").unwrap());
        names
    }

    /// The DNS and IP subject alternative names of a certificate, parsed with x509-parser.
    fn sans(cert_pem: &str) -> (Vec<String>, Vec<String>) {
        use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
        let der = rustls_pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let mut dns = Vec::new();
        let mut ips = Vec::new();
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push((*d).to_owned()),
                GeneralName::IPAddress(ip) => ips.push(format!("{ip:?}")),
                other => panic!("unexpected SAN {other:?}"),
            }
        }
        (dns, ips)
    }

    fn ca_secret(ca: &CertificateAuthority, plane: Plane) -> Value {
        to_value(&build_ca_secret(
            &cluster_ref(),
            plane,
            &CaMaterial::steady(ca.pem()),
        ))
    }

    /// A member Secret issued by the given CAs (validity of the certificates `days`).
    fn member_secret(
        member: &str,
        client_ca: &CertificateAuthority,
        peer_ca: &CertificateAuthority,
        days: u64,
        rotation: Option<&str>,
        issued_at: &str,
    ) -> Value {
        let dns = member_dns_names(&cluster_ref(), member);
        let validity = Duration::from_secs(days * 24 * 3600);
        let server = client_ca
            .issue(&LeafSpec {
                validity,
                ..server_certificate(member, &dns)
            })
            .unwrap();
        let peer = peer_ca
            .issue(&LeafSpec {
                validity,
                ..peer_certificate(member, &dns)
            })
            .unwrap();
        to_value(&build_member_secret(
            &cluster_ref(),
            member,
            &MemberTlsMaterial {
                server: Some(server),
                peer: Some(peer),
                client_ca: Some(client_ca.pem().cert_pem.clone()),
                peer_ca: Some(peer_ca.pem().cert_pem.clone()),
                rotation: rotation.map(str::to_owned),
                issued_at: Some(issued_at.to_owned()),
            },
        ))
    }

    fn new_ca(name: &str) -> CertificateAuthority {
        CertificateAuthority::generate(name, CA_VALIDITY).unwrap()
    }

    impl ApiServerVerifier {
        /// Reads an existing CA Secret.
        async fn existing_ca(&mut self, plane: &str, secret: &Value) {
            self.expect(Method::GET, &secret_path(&format!("{NAME}-{plane}-ca")), None)
                .await
                .reply(StatusCode::OK, secret);
        }

        /// No CA Secret yet: the runtime checks no member holds certificates of a lost CA,
        /// creates it (POST, never an apply) and reports it. Returns the created Secret.
        async fn create_ca(&mut self, plane: &str) -> Value {
            self.expect(Method::GET, &secret_path(&format!("{NAME}-{plane}-ca")), None)
                .await
                .not_found("secrets");
            self.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/secrets?&{SELECTOR}"),
                None,
            )
            .await
            .reply(StatusCode::OK, &list("SecretList", vec![]));
            let create = self
                .expect(
                    Method::POST,
                    &format!("/api/v1/namespaces/{NS}/secrets?&{MANAGED}"),
                    Some(JSON),
                )
                .await;
            assert_eq!(create.body["metadata"]["name"], format!("{NAME}-{plane}-ca"));
            assert_eq!(create.body["type"], "kubernetes.io/tls");
            assert_eq!(create.body["metadata"]["ownerReferences"][0]["uid"], UID);
            let body = create.body.clone();
            create.reply(StatusCode::CREATED, &body);
            self.event(
                "CertificateAuthorityCreated",
                &format!("Created the {plane} plane's CA in Secret {NAME}-{plane}-ca"),
            )
            .await;
            body
        }

        /// The member Secret is read (`existing`) and, when it is not good, applied again; returns
        /// the applied Secret.
        async fn member_secret(
            &mut self,
            member: &str,
            existing: Option<&Value>,
            reason: Option<&str>,
        ) -> Option<Value> {
            let get = self
                .expect(Method::GET, &secret_path(&format!("{member}-tls")), None)
                .await;
            match existing {
                Some(secret) => get.reply(StatusCode::OK, secret),
                None => get.not_found("secrets"),
            }
            let reason = reason?;
            let apply = self
                .expect(
                    Method::PATCH,
                    &format!("{}?&{APPLY}", secret_path(&format!("{member}-tls"))),
                    Some(APPLY_PATCH),
                )
                .await;
            let body = apply.body.clone();
            assert_eq!(body["metadata"]["labels"]["etcd.operator.dev/member"], member);
            assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], UID);
            apply.echo();
            let event = self
                .expect(
                    Method::POST,
                    &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events?"),
                    Some(JSON),
                )
                .await;
            assert_eq!(event.body["reason"], "CertificatesIssued");
            assert_eq!(
                event.body["related"],
                json!({"apiVersion": "v1", "kind": "Secret", "name": format!("{member}-tls"), "namespace": NS}),
                "each member's Event is its own, not a series"
            );
            let note = event.body["note"].as_str().unwrap().to_owned();
            assert!(
                note.starts_with(&format!(
                    "Issued certificates for member {member} into Secret {member}-tls: "
                )) && note.contains(reason),
                "{note}"
            );
            let echoed = event.body.clone();
            event.reply(StatusCode::CREATED, &echoed);
            Some(body)
        }

        /// The member Pod is applied; returns its body.
        async fn apply_pod(&mut self, member: &str, version: &str) -> Value {
            let apply = self
                .expect(
                    Method::PATCH,
                    &format!("/api/v1/namespaces/{NS}/pods/{member}?&{APPLY}"),
                    Some(APPLY_PATCH),
                )
                .await;
            let body = apply.body.clone();
            apply.echo();
            self.event(
                "MemberPodCreated",
                &format!("Created member Pod {member} (etcd {version})"),
            )
            .await;
            body
        }

        async fn pod_missing(&mut self, member: &str) {
            self.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/pods/{member}"),
                None,
            )
            .await
            .not_found("pods");
        }

        async fn warning(&mut self, reason: &str) -> String {
            let event = self
                .expect(
                    Method::POST,
                    &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events?"),
                    Some(JSON),
                )
                .await;
            assert_eq!(event.body["type"], "Warning");
            assert_eq!(event.body["reason"], reason);
            let note = event.body["note"].as_str().unwrap().to_owned();
            let body = event.body.clone();
            event.reply(StatusCode::CREATED, &body);
            note
        }
    }

    fn command(pod: &Value) -> Vec<String> {
        serde_json::from_value(pod["spec"]["containers"][0]["command"].clone()).unwrap()
    }

    #[tokio::test]
    async fn auto_tls_creates_each_ca_once_and_issues_member_certificates_for_every_name() {
        let a = member("bbbbb");
        let cfg = tls_config(&[&a]);
        let (a2, cfg2) = (a.clone(), cfg.clone());
        let captured = std::sync::Mutex::new(Vec::new());
        let cap = &captured;
        let reserved_member = scenario(
            async move |api: &mut ApiServerVerifier| {
                api.no_recovery_to_settle().await;
                api.apply_services().await;
                api.list_members(vec![], vec![]).await;
                api.apply_pdb(2).await;
                let create = api
                    .expect(
                        Method::POST,
                        &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims?&{MANAGED}"),
                        Some(JSON),
                    )
                    .await;
                assert_eq!(
                    create.body["metadata"]["annotations"]["etcd.operator.dev/tls"],
                    "client,peer"
                );
                let body = create.body.clone();
                create.reply(StatusCode::CREATED, &body);
                api.record_config(&a2, &cfg2).await;
                api.pod_missing(&a2).await;
                let client_ca = api.create_ca("client").await;
                let peer_ca = api.create_ca("peer").await;
                let secret = api
                    .member_secret(&a2, None, Some("the member had no certificates yet"))
                    .await
                    .unwrap();
                let pod = api.apply_pod(&a2, "3.5.21").await;
                cap.lock().unwrap().extend([client_ca, peer_ca, secret, pod]);
            },
            async |rt: KubernetesRuntime| {
                let spec = auto_spec(None);
                let reserved = rt.reserve(&cluster_ref(), &spec, &a).await.unwrap();
                rt.start(&cluster_ref(), &spec, &a, &cfg).await.unwrap();
                reserved
            },
        )
        .await;
        let [client_ca, peer_ca, secret, pod]: [Value; 4] =
            captured.into_inner().unwrap().try_into().unwrap();
        assert_eq!(reserved_member.peer_url, https_peer(&member("bbbbb")));
        assert_eq!(
            reserved_member.client_url,
            format!("https://{}.{NAME}.{NS}.svc:2379", member("bbbbb"))
        );

        // The certificates: every DNS name of the member plus localhost and 127.0.0.1, issued by
        // the plane's CA (verified with rustls' verifiers); peer certificates are also clients.
        let a = member("bbbbb");
        let load = |v: &Value| {
            let s = from_value(v);
            CertificateAuthority::load(&text(&s, "tls.crt"), &text(&s, "tls.key")).unwrap()
        };
        let (client_ca, peer_ca) = (load(&client_ca), load(&peer_ca));
        let secret = from_value(&secret);
        let server = text(&secret, "server.crt");
        let peer = text(&secret, "peer.crt");
        let (dns, ips) = sans(&server);
        let mut expected = member_dns_names(&cluster_ref(), &a);
        expected.push("localhost".to_owned());
        assert_eq!(dns, expected);
        assert_eq!(
            dns[..5],
            [
                a.clone(),
                format!("{a}.{NAME}"),
                format!("{a}.{NAME}.{NS}"),
                format!("{a}.{NAME}.{NS}.svc"),
                format!("{a}.{NAME}.{NS}.svc.cluster.local")
            ]
        );
        assert!(dns.contains(&format!("{NAME}-client.{NS}.svc")));
        assert_eq!(
            ips,
            ["[127, 0, 0, 1]"],
            "127.0.0.1 as x509-parser shows its bytes"
        );
        let now = SystemTime::now();
        client_ca.verify_server(&server, &names(&a), now).unwrap();
        // etcd's JSON gateway presents the serving certificate to the member's own client port.
        client_ca.verify_client(&server, now).unwrap();
        peer_ca.verify_server(&peer, &names(&a), now).unwrap();
        peer_ca.verify_client(&peer, now).unwrap();
        assert!(
            peer_ca.verify_server(&server, &names(&a), now).is_err(),
            "planes have their own CA"
        );
        assert_eq!(text(&secret, "client-ca.crt"), client_ca.pem().cert_pem);
        assert_eq!(text(&secret, "peer-ca.crt"), peer_ca.pem().cert_pem);

        // The Pod: https URLs, the TLS flags, the Secret mounted read-only, probes on plain HTTP.
        let command = command(&pod);
        for flag in [
            "--listen-client-urls=https://0.0.0.0:2379",
            "--listen-peer-urls=https://0.0.0.0:2380",
            &format!("--advertise-client-urls=https://{a}.{NAME}.{NS}.svc:2379"),
            &format!("--initial-advertise-peer-urls={}", https_peer(&a)),
            &format!("--initial-cluster={a}={}", https_peer(&a)),
            "--cert-file=/etc/etcd/tls/client/tls.crt",
            "--key-file=/etc/etcd/tls/client/tls.key",
            "--trusted-ca-file=/etc/etcd/tls/client/ca.crt",
            "--client-cert-auth=true",
            "--peer-cert-file=/etc/etcd/tls/peer/tls.crt",
            "--peer-key-file=/etc/etcd/tls/peer/tls.key",
            "--peer-trusted-ca-file=/etc/etcd/tls/peer/ca.crt",
            "--peer-client-cert-auth=true",
            "--listen-metrics-urls=http://0.0.0.0:2381",
        ] {
            assert!(
                command.iter().any(|c| c == flag),
                "{flag} missing from {command:?}"
            );
        }
        assert_eq!(
            pod["spec"]["volumes"][1]["secret"]["secretName"],
            format!("{a}-tls")
        );
        assert_eq!(pod["spec"]["containers"][0]["volumeMounts"][1]["readOnly"], true);
        assert_eq!(
            pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"],
            2381
        );
        assert_eq!(
            pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["scheme"],
            "HTTP"
        );
    }

    #[tokio::test]
    async fn the_ca_is_reused_and_the_operator_identity_is_kept_while_good() {
        let client_ca = new_ca("client");
        let peer_ca = new_ca("peer");
        let (client_secret, peer_secret) = (
            ca_secret(&client_ca, Plane::Client),
            ca_secret(&peer_ca, Plane::Peer),
        );
        let b = member("ccccc");
        let cfg = tls_config(&[&member("bbbbb"), &b]);
        let (b2, cfg2, cs, ps) = (b.clone(), cfg.clone(), client_secret.clone(), peer_secret.clone());
        let (first, second) = scenario(
            async move |api: &mut ApiServerVerifier| {
                // client_tls twice: the CA is read each time, the identity issued once.
                api.existing_ca("client", &cs).await;
                api.existing_ca("client", &cs).await;
                // A second member: no CA is created, both are read.
                api.record_config(&b2, &cfg2).await;
                api.pod_missing(&b2).await;
                api.existing_ca("client", &cs).await;
                api.existing_ca("peer", &ps).await;
                api.member_secret(&b2, None, Some("no certificates yet")).await;
                api.apply_pod(&b2, "3.5.21").await;
            },
            async |rt: KubernetesRuntime| {
                let spec = auto_spec(None);
                let first = rt.client_tls(&cluster_ref(), &spec).await.unwrap().unwrap();
                let second = rt.client_tls(&cluster_ref(), &spec).await.unwrap().unwrap();
                rt.start(&cluster_ref(), &spec, &b, &cfg).await.unwrap();
                (first, second)
            },
        )
        .await;
        assert_eq!(first, second, "a good identity is kept");
        assert_eq!(first.ca_pem, client_ca.pem().cert_pem);
        client_ca
            .verify_client(&first.cert_pem, SystemTime::now())
            .unwrap();
        assert!(peer_ca.verify_client(&first.cert_pem, SystemTime::now()).is_err());
        // A CA Secret that holds no usable CA is an error and a Warning, never replaced.
        let broken = {
            let mut s = client_secret.clone();
            s["data"]["tls.key"] = peer_secret["data"]["tls.key"].clone();
            s
        };
        let err = scenario(
            async move |api: &mut ApiServerVerifier| {
                api.existing_ca("client", &broken).await;
                let note = api.warning("CertificatesInvalid").await;
                assert!(note.contains(&format!("{NAME}-client-ca")), "{note}");
            },
            async |rt: KubernetesRuntime| rt.client_tls(&cluster_ref(), &auto_spec(None)).await.unwrap_err(),
        )
        .await;
        assert!(matches!(err, RuntimeError::Certificates { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_lost_ca_is_not_replaced_while_members_hold_its_certificates() {
        let (client_ca, peer_ca) = (new_ca("client"), new_ca("peer"));
        let a = member("bbbbb");
        let held = member_secret(&a, &client_ca, &peer_ca, 365, None, "2026-01-01T00:00:00Z");
        let err = scenario(
            async move |api: &mut ApiServerVerifier| {
                api.expect(Method::GET, &secret_path(&format!("{NAME}-client-ca")), None)
                    .await
                    .not_found("secrets");
                api.expect(
                    Method::GET,
                    &format!("/api/v1/namespaces/{NS}/secrets?&{SELECTOR}"),
                    None,
                )
                .await
                .reply(StatusCode::OK, &list("SecretList", vec![held]));
                let note = api.warning("CertificateAuthorityMissing").await;
                assert!(note.contains(&format!("{NAME}-client-ca is missing")), "{note}");
            },
            async |rt: KubernetesRuntime| rt.client_tls(&cluster_ref(), &auto_spec(None)).await.unwrap_err(),
        )
        .await;
        assert!(matches!(err, RuntimeError::Certificates { .. }), "{err}");
    }

    /// A start of member `b` (recorded on its PVC) whose Secret is `existing`: issued again
    /// (`reason`) or kept. Returns the applied Secret.
    async fn start_with_secret(
        existing: Value,
        reason: Option<&'static str>,
        rotation: Option<&'static str>,
    ) -> Option<Secret> {
        let (client_ca, peer_ca) = (new_ca("client"), new_ca("peer"));
        start_with(existing, &client_ca, &peer_ca, reason, rotation).await
    }

    async fn start_with(
        existing: Value,
        client_ca: &CertificateAuthority,
        peer_ca: &CertificateAuthority,
        reason: Option<&'static str>,
        rotation: Option<&'static str>,
    ) -> Option<Secret> {
        let b = member("ccccc");
        let cfg = tls_config(&[&b]);
        let (b2, cfg2) = (b.clone(), cfg.clone());
        let (cs, ps) = (
            ca_secret(client_ca, Plane::Client),
            ca_secret(peer_ca, Plane::Peer),
        );
        let captured = std::sync::Mutex::new(None);
        let cap = &captured;
        scenario(
            async move |api: &mut ApiServerVerifier| {
                api.expect(
                    Method::GET,
                    &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{b2}-data"),
                    None,
                )
                .await
                .reply(StatusCode::OK, &pvc(&b2, Some(&cfg2), false));
                api.pod_missing(&b2).await;
                api.existing_ca("client", &cs).await;
                api.existing_ca("peer", &ps).await;
                let applied = api.member_secret(&b2, Some(&existing), reason).await;
                api.apply_pod(&b2, "3.5.21").await;
                *cap.lock().unwrap() = applied;
            },
            async |rt: KubernetesRuntime| {
                rt.start(&cluster_ref(), &auto_spec(rotation), &b, &cfg)
                    .await
                    .unwrap()
            },
        )
        .await;
        let applied = captured.into_inner().unwrap().map(|v| from_value(&v))?;
        let b = member("ccccc");
        let now = SystemTime::now();
        client_ca
            .verify_server(&text(&applied, "server.crt"), &names(&b), now)
            .unwrap();
        peer_ca.verify_client(&text(&applied, "peer.crt"), now).unwrap();
        Some(applied)
    }

    #[tokio::test]
    async fn good_member_certificates_are_kept() {
        let (client_ca, peer_ca) = (new_ca("client"), new_ca("peer"));
        let good = member_secret(
            &member("ccccc"),
            &client_ca,
            &peer_ca,
            365,
            Some("r1"),
            "2026-01-01T00:00:00Z",
        );
        assert!(
            start_with(good.clone(), &client_ca, &peer_ca, None, None)
                .await
                .is_none()
        );
        assert!(
            start_with(good, &client_ca, &peer_ca, None, Some("r1"))
                .await
                .is_none()
        );
    }

    #[tokio::test]
    async fn an_expiring_member_certificate_is_issued_again() {
        let (client_ca, peer_ca) = (new_ca("client"), new_ca("peer"));
        let expiring = member_secret(
            &member("ccccc"),
            &client_ca,
            &peer_ca,
            10,
            None,
            "2026-01-01T00:00:00Z",
        );
        let applied = start_with(expiring, &client_ca, &peer_ca, Some("server.crt"), None)
            .await
            .unwrap();
        let not_after = etcd_operator_controller::tls::ca::not_after(&text(&applied, "server.crt")).unwrap();
        assert!(not_after > SystemTime::now() + Duration::from_secs(300 * 24 * 3600));
    }

    #[tokio::test]
    async fn a_member_certificate_of_another_ca_is_issued_again() {
        let (client_ca, peer_ca) = (new_ca("client"), new_ca("peer"));
        let other = new_ca("other");
        // Signed by another CA, though the Secret names the cluster's CA.
        let mut foreign = member_secret(
            &member("ccccc"),
            &other,
            &other,
            365,
            None,
            "2026-01-01T00:00:00Z",
        );
        let right = member_secret(
            &member("ccccc"),
            &client_ca,
            &peer_ca,
            365,
            None,
            "2026-01-01T00:00:00Z",
        );
        foreign["data"]["client-ca.crt"] = right["data"]["client-ca.crt"].clone();
        foreign["data"]["peer-ca.crt"] = right["data"]["peer-ca.crt"].clone();
        let applied = start_with(foreign.clone(), &client_ca, &peer_ca, Some("server.crt"), None).await;
        assert!(applied.is_some());
        // And a CA certificate in the Secret that is not the cluster's.
        let stale = member_secret(
            &member("ccccc"),
            &other,
            &other,
            365,
            None,
            "2026-01-01T00:00:00Z",
        );
        assert!(
            start_with(
                stale,
                &client_ca,
                &peer_ca,
                Some("is not what the cluster's CAs trust now"),
                None
            )
            .await
            .is_some()
        );
        assert!(
            start_with_secret(foreign, Some("is not what the cluster's CAs trust now"), None)
                .await
                .is_some()
        );
    }

    #[tokio::test]
    async fn the_rotation_annotation_issues_certificates_again_under_it() {
        let (client_ca, peer_ca) = (new_ca("client"), new_ca("peer"));
        let old = member_secret(
            &member("ccccc"),
            &client_ca,
            &peer_ca,
            365,
            Some("r1"),
            "2026-01-01T00:00:00Z",
        );
        let applied = start_with(
            old,
            &client_ca,
            &peer_ca,
            Some("rotation \"r2\" was requested"),
            Some("r2"),
        )
        .await
        .unwrap();
        assert_eq!(
            applied.metadata.annotations.unwrap()["etcd.operator.dev/certificate-rotation"],
            "r2"
        );
    }

    #[tokio::test]
    async fn members_report_their_certificates_with_https_urls() {
        let (client_ca, peer_ca) = (new_ca("client"), new_ca("peer"));
        let other = new_ca("other");
        let (a, b) = (member("bbbbb"), member("ccccc"));
        let cfg = tls_config(&[&a, &b]);
        let tls_pod = |m: &str| {
            let mut p = pod(m, "Running", Some(&cfg), false);
            p["metadata"]["annotations"]["etcd.operator.dev/tls"] = json!("client,peer");
            p
        };
        let tls_pvc = |m: &str| {
            let mut p = pvc(m, Some(&cfg), false);
            p["metadata"]["annotations"]["etcd.operator.dev/tls"] = json!("client,peer");
            p
        };
        let secrets = vec![
            ca_secret(&client_ca, Plane::Client),
            ca_secret(&peer_ca, Plane::Peer),
            member_secret(&a, &client_ca, &peer_ca, 20, Some("r1"), "2026-01-01T00:00:00Z"),
            member_secret(&b, &other, &other, 365, None, "2026-01-01T00:00:00Z"),
        ];
        let (pods, pvcs) = (vec![tls_pod(&a), tls_pod(&b)], vec![tls_pvc(&a), tls_pvc(&b)]);
        let members = scenario(
            async move |api: &mut ApiServerVerifier| {
                api.list_members(pods, pvcs).await;
                api.expect(
                    Method::GET,
                    &format!("/api/v1/namespaces/{NS}/secrets?&{SELECTOR}"),
                    None,
                )
                .await
                .reply(StatusCode::OK, &list("SecretList", secrets));
            },
            async |rt: KubernetesRuntime| rt.members(&cluster_ref()).await.unwrap(),
        )
        .await;
        assert_eq!(members[0].peer_url, https_peer(&a));
        assert!(members[0].client_url.starts_with("https://"));
        let certs = members[0].certificates.clone().unwrap();
        assert!(
            certs.valid_for > Duration::from_secs(18 * 24 * 3600)
                && certs.valid_for <= Duration::from_secs(21 * 24 * 3600),
            "{certs:?}"
        );
        assert_eq!(certs.rotation.as_deref(), Some("r1"));
        assert_eq!(
            members[1].certificates.clone().unwrap().valid_for,
            Duration::ZERO,
            "a certificate of another CA counts as expired"
        );

        // The same from the controller's watches: the same answer, and not one request.
        fn object<K: serde::de::DeserializeOwned>(v: Value) -> K {
            serde_json::from_value(v).unwrap()
        }
        let cache = etcd_operator_controller::runtime::kubernetes::ChildCache::filled(
            vec![object(tls_pod(&a)), object(tls_pod(&b))],
            vec![object(tls_pvc(&a)), object(tls_pvc(&b))],
            vec![
                object(ca_secret(&client_ca, Plane::Client)),
                object(ca_secret(&peer_ca, Plane::Peer)),
                object(member_secret(
                    &a,
                    &client_ca,
                    &peer_ca,
                    20,
                    Some("r1"),
                    "2026-01-01T00:00:00Z",
                )),
                object(member_secret(
                    &b,
                    &other,
                    &other,
                    365,
                    None,
                    "2026-01-01T00:00:00Z",
                )),
            ],
        );
        let cached = scenario(
            async |_: &mut ApiServerVerifier| {},
            async |rt: KubernetesRuntime| rt.with_child_cache(cache).members(&cluster_ref()).await.unwrap(),
        )
        .await;
        // The same members; the certificates' remaining validity is taken a moment later.
        let strip = |ms: &[RuntimeMember]| -> Vec<RuntimeMember> {
            ms.iter()
                .map(|m| RuntimeMember {
                    certificates: None,
                    ..m.clone()
                })
                .collect()
        };
        assert_eq!(strip(&cached), strip(&members));
        for (c, m) in cached.iter().zip(&members) {
            let (c, m) = (c.certificates.clone().unwrap(), m.certificates.clone().unwrap());
            assert_eq!(c.rotation, m.rotation);
            assert!(
                m.valid_for.abs_diff(c.valid_for) < Duration::from_secs(5),
                "{c:?} {m:?}"
            );
        }
    }

    #[tokio::test]
    async fn renewal_issues_new_certificates_and_restarts_the_pod_on_its_claim() {
        let (client_ca, peer_ca) = (new_ca("client"), new_ca("peer"));
        let b = member("ccccc");
        let cfg = tls_config(&[&b]);
        let (cs, ps) = (
            ca_secret(&client_ca, Plane::Client),
            ca_secret(&peer_ca, Plane::Peer),
        );
        let old = member_secret(&b, &client_ca, &peer_ca, 365, Some("r1"), "2026-01-01T00:00:00Z");
        let (b2, cfg2) = (b.clone(), cfg.clone());
        scenario(
            async move |api: &mut ApiServerVerifier| {
                api.expect(
                    Method::GET,
                    &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{b2}-data"),
                    None,
                )
                .await
                .reply(StatusCode::OK, &pvc(&b2, Some(&cfg2), false));
                api.existing_ca("client", &cs).await;
                api.existing_ca("peer", &ps).await;
                api.member_secret(&b2, Some(&old), Some("rotation \"r2\" was requested"))
                    .await;
                let mut running = pod(&b2, "Running", Some(&cfg2), false);
                running["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
                api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{b2}"), None)
                    .await
                    .reply(StatusCode::OK, &running);
                api.delete(
                    &format!("/api/v1/namespaces/{NS}/pods/{b2}"),
                    Some(pod(&b2, "Running", Some(&cfg2), true)),
                )
                .await;
                api.event(
                    "MemberCertificatesRenewed",
                    &format!(
                        "Deleted Pod {b2} to restart it on PersistentVolumeClaim {b2}-data with new certificates (rotation \"r2\" was requested)"
                    ),
                )
                .await;
            },
            async |rt: KubernetesRuntime| {
                rt.renew_certificates(&cluster_ref(), &auto_spec(Some("r2")), &b)
                    .await
                    .unwrap()
            },
        )
        .await;

        // Called again with good certificates and a Pod younger than them: nothing changes.
        let (b3, cfg3) = (b.clone(), cfg.clone());
        let (cs, ps) = (
            ca_secret(&client_ca, Plane::Client),
            ca_secret(&peer_ca, Plane::Peer),
        );
        let fresh = member_secret(&b, &client_ca, &peer_ca, 365, Some("r2"), "2026-01-01T00:00:00Z");
        let fresh2 = fresh.clone();
        scenario(
            async move |api: &mut ApiServerVerifier| {
                api.expect(
                    Method::GET,
                    &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{b3}-data"),
                    None,
                )
                .await
                .reply(StatusCode::OK, &pvc(&b3, Some(&cfg3), false));
                api.existing_ca("client", &cs).await;
                api.existing_ca("peer", &ps).await;
                api.member_secret(&b3, Some(&fresh), None).await;
                let mut running = pod(&b3, "Running", Some(&cfg3), false);
                running["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:05Z");
                api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{b3}"), None)
                    .await
                    .reply(StatusCode::OK, &running);
                api.expect(
                    Method::GET,
                    &format!("/api/v1/namespaces/{NS}/secrets?&{SELECTOR}"),
                    None,
                )
                .await
                .reply(StatusCode::OK, &list("SecretList", vec![fresh2]));
            },
            async |rt: KubernetesRuntime| {
                rt.renew_certificates(&cluster_ref(), &auto_spec(Some("r2")), &b)
                    .await
                    .unwrap()
            },
        )
        .await;
    }

    #[tokio::test]
    async fn renewal_restarts_a_pod_older_than_its_good_certificates() {
        // Certificates issued (by an earlier renewal) after the running Pod was created: the Pod
        // still serves the old ones, so it is restarted though nothing is issued now.
        let (client_ca, peer_ca) = (new_ca("client"), new_ca("peer"));
        let b = member("ccccc");
        let cfg = tls_config(&[&b]);
        let (cs, ps) = (
            ca_secret(&client_ca, Plane::Client),
            ca_secret(&peer_ca, Plane::Peer),
        );
        let fresh = member_secret(&b, &client_ca, &peer_ca, 365, None, "2026-03-01T00:00:00Z");
        let (b2, cfg2, fresh2) = (b.clone(), cfg.clone(), fresh.clone());
        scenario(
            async move |api: &mut ApiServerVerifier| {
                api.expect(
                    Method::GET,
                    &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{b2}-data"),
                    None,
                )
                .await
                .reply(StatusCode::OK, &pvc(&b2, Some(&cfg2), false));
                api.existing_ca("client", &cs).await;
                api.existing_ca("peer", &ps).await;
                api.member_secret(&b2, Some(&fresh), None).await;
                let mut running = pod(&b2, "Running", Some(&cfg2), false);
                running["metadata"]["creationTimestamp"] = json!("2026-02-01T00:00:00Z");
                api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{b2}"), None)
                    .await
                    .reply(StatusCode::OK, &running);
                api.expect(
                    Method::GET,
                    &format!("/api/v1/namespaces/{NS}/secrets?&{SELECTOR}"),
                    None,
                )
                .await
                .reply(StatusCode::OK, &list("SecretList", vec![fresh2]));
                api.delete(
                    &format!("/api/v1/namespaces/{NS}/pods/{b2}"),
                    Some(pod(&b2, "Running", Some(&cfg2), true)),
                )
                .await;
                api.event(
                    "MemberCertificatesRenewed",
                    &format!(
                        "Deleted Pod {b2} to restart it on PersistentVolumeClaim {b2}-data with new certificates (its Pod was created before its current certificates were issued)"
                    ),
                )
                .await;
            },
            async |rt: KubernetesRuntime| {
                rt.renew_certificates(&cluster_ref(), &auto_spec(None), &b)
                    .await
                    .unwrap()
            },
        )
        .await;
        // A memory member cannot be restarted on new certificates: refused before any call.
        let mut memory = auto_spec(None);
        memory.storage = memory_spec().storage;
        let err = scenario(
            async |_| {},
            async |rt: KubernetesRuntime| {
                rt.renew_certificates(&cluster_ref(), &memory, &member("ccccc"))
                    .await
                    .unwrap_err()
            },
        )
        .await;
        assert!(matches!(err, RuntimeError::State { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_missing_secret_ref_secret_is_an_error_naming_it_and_nothing_starts() {
        let b = member("ccccc");
        let cfg = config(&[&b], InitialState::New);
        let (b2, cfg2) = (b.clone(), cfg.clone());
        let err = scenario(
            async move |api: &mut ApiServerVerifier| {
                api.record_config(&b2, &cfg2).await;
                api.pod_missing(&b2).await;
                api.expect(Method::GET, &secret_path("etcd-server-tls"), None)
                    .await
                    .not_found("secrets");
                let note = api.warning("CertificatesMissing").await;
                assert!(
                    note.contains(&format!("Secret {NS}/etcd-server-tls does not exist")),
                    "{note}"
                );
                // No Pod is applied.
            },
            async |rt: KubernetesRuntime| {
                let spec = with_tls(disk_spec(3), Some(secret_ref("etcd-server-tls")), None, None);
                rt.start(&cluster_ref(), &spec, &b, &cfg).await.unwrap_err()
            },
        )
        .await;
        assert!(
            matches!(&err, RuntimeError::TlsSecret { plane: "client", provider: "secretRef", secret, .. } if secret == &format!("{NS}/etcd-server-tls")),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "spec.tls.client.secretRef: Secret {NS}/etcd-server-tls does not exist; the cluster's members are not started without their certificates"
            )
        );

        // A Secret without a key is refused the same way, naming the key; the operator's
        // identity comes from a complete one.
        let ca = new_ca("mine");
        let pair = ca
            .issue(&LeafSpec {
                usage: etcd_operator_controller::tls::ca::LeafUsage::ServerAndClient,
                ..server_certificate("etcd", &member_dns_names(&cluster_ref(), &b))
            })
            .unwrap();
        let user_secret = |with_ca: bool| {
            let mut data = json!({
                "tls.crt": b64(&pair.cert_pem),
                "tls.key": b64(&pair.key_pem),
            });
            if with_ca {
                data["ca.crt"] = json!(b64(&ca.pem().cert_pem));
            }
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "etcd-server-tls", "namespace": NS}, "type": "kubernetes.io/tls", "data": data})
        };
        let (incomplete, complete) = (user_secret(false), user_secret(true));
        let (err, identity) = scenario(
            async move |api: &mut ApiServerVerifier| {
                api.expect(Method::GET, &secret_path("etcd-server-tls"), None)
                    .await
                    .reply(StatusCode::OK, &incomplete);
                let note = api.warning("CertificatesMissing").await;
                assert!(note.contains("has no ca.crt"), "{note}");
                api.expect(Method::GET, &secret_path("etcd-server-tls"), None)
                    .await
                    .reply(StatusCode::OK, &complete);
            },
            async |rt: KubernetesRuntime| {
                let spec = with_tls(disk_spec(3), Some(secret_ref("etcd-server-tls")), None, None);
                let err = rt.client_tls(&cluster_ref(), &spec).await.unwrap_err();
                let identity = rt.client_tls(&cluster_ref(), &spec).await.unwrap().unwrap();
                (err, identity)
            },
        )
        .await;
        assert!(err.to_string().contains("has no ca.crt"), "{err}");
        assert_eq!(identity.cert_pem, pair.cert_pem);
        assert_eq!(identity.ca_pem, ca.pem().cert_pem);
    }

    fn b64(text: &str) -> String {
        // Through k8s-openapi's ByteString, which serializes as base64.
        serde_json::to_value(k8s_openapi::ByteString(text.as_bytes().to_vec()))
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[tokio::test]
    async fn cert_manager_certificates_are_applied_and_the_member_waits_for_their_secret() {
        let b = member("ccccc");
        let cfg = MemberConfig {
            initial_cluster: vec![(b.clone(), https_peer(&b))],
            ..config(&[&b], InitialState::New)
        };
        let spec = with_tls(disk_spec(3), None, Some(cert_manager()), None);
        let certificate_path =
            format!("/apis/cert-manager.io/v1/namespaces/{NS}/certificates/{b}-peer?&{APPLY}");
        let (b2, cfg2, path2) = (b.clone(), cfg.clone(), certificate_path.clone());
        let (spec2, spec3) = (spec.clone(), spec.clone());
        let err = scenario(
            async move |api: &mut ApiServerVerifier| {
                api.record_config(&b2, &cfg2).await;
                api.pod_missing(&b2).await;
                let certificate = api.expect(Method::PATCH, &path2, Some(APPLY_PATCH)).await;
                let body = certificate.body.clone();
                assert_eq!(body["apiVersion"], "cert-manager.io/v1");
                assert_eq!(body["kind"], "Certificate");
                assert_eq!(body["spec"]["secretName"], format!("{b2}-peer-tls"));
                assert_eq!(
                    body["spec"]["usages"],
                    json!([
                        "digital signature",
                        "key encipherment",
                        "server auth",
                        "client auth"
                    ])
                );
                assert_eq!(
                    body["spec"]["issuerRef"],
                    json!({"name": "etcd-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
                );
                let mut dns = member_dns_names(&cluster_ref(), &b2);
                dns.push("localhost".to_owned());
                assert_eq!(body["spec"]["dnsNames"], json!(dns));
                assert_eq!(body["spec"]["ipAddresses"], json!(["127.0.0.1"]));
                assert_eq!(
                    body["spec"]["secretTemplate"]["labels"]["etcd.operator.dev/member"],
                    b2.as_str()
                );
                certificate.echo();
                api.expect(Method::GET, &secret_path(&format!("{b2}-peer-tls")), None)
                    .await
                    .not_found("secrets");
            },
            async |rt: KubernetesRuntime| rt.start(&cluster_ref(), &spec2, &b, &cfg).await.unwrap_err(),
        )
        .await;
        assert!(matches!(err, RuntimeError::CertificateNotReady { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!(
                "waiting for cert-manager to issue Certificate {NS}/{}-peer into Secret {NS}/{}-peer-tls",
                member("ccccc"),
                member("ccccc")
            )
        );

        // Once cert-manager wrote the Secret, the Pod is created and mounts it.
        let ca = new_ca("issuer");
        let pair: PemPair = ca
            .issue(&peer_certificate(&b, &member_dns_names(&cluster_ref(), &b)))
            .unwrap();
        let issued = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{b}-peer-tls"), "namespace": NS},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": b64(&pair.cert_pem), "tls.key": b64(&pair.key_pem), "ca.crt": b64(&ca.pem().cert_pem)}});
        let (b3, cfg3) = (b.clone(), cfg.clone());
        let captured = std::sync::Mutex::new(Value::Null);
        let cap = &captured;
        scenario(
            async move |api: &mut ApiServerVerifier| {
                api.expect(
                    Method::GET,
                    &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{b3}-data"),
                    None,
                )
                .await
                .reply(StatusCode::OK, &pvc(&b3, Some(&cfg3), false));
                api.pod_missing(&b3).await;
                api.expect(Method::PATCH, &certificate_path, Some(APPLY_PATCH))
                    .await
                    .echo();
                api.expect(Method::GET, &secret_path(&format!("{b3}-peer-tls")), None)
                    .await
                    .reply(StatusCode::OK, &issued);
                *cap.lock().unwrap() = api.apply_pod(&b3, "3.5.21").await;
            },
            async |rt: KubernetesRuntime| {
                rt.start(&cluster_ref(), &spec3, &member("ccccc"), &cfg)
                    .await
                    .unwrap()
            },
        )
        .await;
        let pod = captured.into_inner().unwrap();
        let b = member("ccccc");
        assert_eq!(
            pod["spec"]["volumes"][1]["secret"]["secretName"],
            format!("{b}-peer-tls")
        );
        let command = command(&pod);
        assert!(
            command.contains(&"--peer-client-cert-auth=true".to_owned()),
            "{command:?}"
        );
        assert!(
            command.contains(&"--listen-client-urls=http://0.0.0.0:2379".to_owned()),
            "{command:?}"
        );
    }

    // --- golden files

    /// The golden members, with a TLS peer plane.
    fn https_golden_config() -> MemberConfig {
        let mut cfg = golden_config();
        for (_, url) in &mut cfg.initial_cluster {
            *url = url.replace("http://", "https://");
        }
        cfg
    }

    fn redacted(what: &str) -> PemPair {
        PemPair {
            cert_pem: format!("<{what} certificate>"),
            key_pem: format!("<{what} key: redacted>"),
        }
    }

    #[test]
    fn golden_pod_with_auto_tls() {
        let spec = with_tls(full_spec(), Some(auto()), Some(auto()), None);
        let pod = resources::build_pod(
            &cluster_ref(),
            &spec,
            &member("x2b4c"),
            &https_golden_config(),
            None,
            false,
        )
        .unwrap();
        golden("pod-tls", &pod);
    }

    #[test]
    fn golden_pod_with_secret_ref_and_cert_manager() {
        let spec = with_tls(
            disk_spec(3),
            Some(secret_ref("etcd-server-tls")),
            Some(cert_manager()),
            None,
        );
        let pod = resources::build_pod(
            &cluster_ref(),
            &spec,
            &member("x2b4c"),
            &https_golden_config(),
            None,
            false,
        )
        .unwrap();
        let spec = pod.spec.unwrap();
        golden(
            "pod-tls-providers-volumes",
            &(spec.volumes, spec.containers[0].command.clone()),
        );
    }

    #[test]
    fn golden_tls_secrets() {
        let material = MemberTlsMaterial {
            server: Some(redacted("server")),
            peer: Some(redacted("peer")),
            client_ca: Some("<client CA certificate>".to_owned()),
            peer_ca: Some("<peer CA certificate>".to_owned()),
            rotation: Some("2026-01-01".to_owned()),
            issued_at: Some("2026-01-02T03:04:05Z".to_owned()),
        };
        golden(
            "member-tls-secret",
            &build_member_secret(&cluster_ref(), &member("x2b4c"), &material),
        );
        golden(
            "ca-secret",
            &build_ca_secret(
                &cluster_ref(),
                Plane::Client,
                &CaMaterial::steady(&redacted("CA")),
            ),
        );
    }

    #[test]
    fn golden_certificate() {
        let issuer = cert_manager().cert_manager.unwrap().issuer_ref;
        let m = member("x2b4c");
        golden(
            "certificate",
            &build_certificate(
                &cluster_ref(),
                Some(&m),
                &format!("{m}-peer"),
                &format!("{m}-peer-tls"),
                CertificateUse::Peer,
                &member_dns_names(&cluster_ref(), &m),
                &issuer,
            ),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Quorum recovery: the survivor starts once with --force-new-cluster, and once more without it
// before the first member is added back.

/// A Pod that a quorum recovery started: `--force-new-cluster` noted on it, `Ready` or not.
fn forced_pod(member: &str, config: &MemberConfig, ready: bool) -> Value {
    let mut pod = pod(member, "Running", Some(config), false);
    pod["metadata"]["annotations"]["etcd.operator.dev/force-new-cluster"] = json!("true");
    pod["status"]["conditions"] = json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
    pod
}

impl ApiServerVerifier {
    async fn get_pvc(&mut self, member: &str, config: &MemberConfig) {
        self.expect(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{member}-data"),
            None,
        )
        .await
        .reply(StatusCode::OK, &pvc(member, Some(config), false));
    }

    /// `DELETE` of the member's Pod, then a `GET` that finds it (`still_there`) or not.
    async fn delete_pod_and_look(&mut self, member: &str, config: &MemberConfig, still_there: bool) {
        let path = format!("/api/v1/namespaces/{NS}/pods/{member}");
        self.expect(Method::DELETE, &format!("{path}?"), Some(JSON))
            .await
            .reply(StatusCode::OK, &pod(member, "Running", Some(config), true));
        let look = self.expect(Method::GET, &path, None).await;
        if still_there {
            look.reply(StatusCode::OK, &pod(member, "Running", Some(config), true));
        } else {
            look.not_found(&format!("pods \"{member}\""));
        }
    }

    /// The member Pod applied; whether it carries `--force-new-cluster` (and says so).
    async fn apply_pod_forced(&mut self, member: &str, forced: bool) {
        let apply = self
            .expect(
                Method::PATCH,
                &format!("/api/v1/namespaces/{NS}/pods/{member}?&{APPLY}"),
                Some(APPLY_PATCH),
            )
            .await;
        let command: Vec<String> =
            serde_json::from_value(apply.body["spec"]["containers"][0]["command"].clone()).unwrap();
        assert_eq!(
            command.contains(&"--force-new-cluster".to_owned()),
            forced,
            "{command:?}"
        );
        assert_eq!(
            apply.body["metadata"]["annotations"]
                .get("etcd.operator.dev/force-new-cluster")
                .is_some(),
            forced
        );
        apply.echo();
    }
}

#[tokio::test]
async fn quorum_recovery_starts_the_survivor_with_force_new_cluster_and_says_so() {
    let a = member("aaaaa");
    let cfg = config(&[&a], InitialState::New);
    let (a2, cfg2) = (a.clone(), cfg.clone());
    let result = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.get_pvc(&a2, &cfg2).await;
            api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await
                .reply(StatusCode::OK, &pod(&a2, "Running", Some(&cfg2), false));
            api.list_members(
                vec![pod(&a2, "Running", Some(&cfg2), false)],
                vec![pvc(&a2, Some(&cfg2), false)],
            )
            .await;
            api.delete_pod_and_look(&a2, &cfg2, false).await;
            api.apply_pod_forced(&a2, true).await;
            api.event(
                "MemberPodCreated",
                &format!("Created member Pod {a2} (etcd 3.5.21)"),
            )
            .await;
            let warning = api
                .expect(
                    Method::POST,
                    &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events?"),
                    Some(JSON),
                )
                .await;
            assert_eq!(warning.body["reason"], "QuorumRecovered");
            assert_eq!(warning.body["type"], "Warning");
            let body = warning.body.clone();
            warning.reply(StatusCode::CREATED, &body);
        },
        async |rt: KubernetesRuntime| rt.recover_quorum(&cluster_ref(), &disk_spec(3), &a).await,
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn quorum_recovery_waits_while_the_survivor_pod_stops() {
    let a = member("aaaaa");
    let cfg = config(&[&a], InitialState::New);
    let (a2, cfg2) = (a.clone(), cfg.clone());
    let result = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.get_pvc(&a2, &cfg2).await;
            api.expect(Method::GET, &format!("/api/v1/namespaces/{NS}/pods/{a2}"), None)
                .await
                .reply(StatusCode::OK, &pod(&a2, "Running", Some(&cfg2), false));
            api.list_members(
                vec![pod(&a2, "Running", Some(&cfg2), false)],
                vec![pvc(&a2, Some(&cfg2), false)],
            )
            .await;
            api.delete_pod_and_look(&a2, &cfg2, true).await;
        },
        async |rt: KubernetesRuntime| rt.recover_quorum(&cluster_ref(), &disk_spec(3), &a).await,
    )
    .await;
    assert!(
        matches!(result, Err(RuntimeError::Waiting { ref member, .. }) if *member == a),
        "{result:?}"
    );
}

#[tokio::test]
async fn quorum_recovery_refuses_a_survivor_without_data_to_recover_from() {
    let a = member("aaaaa");
    let memory = scenario(
        async |_: &mut ApiServerVerifier| {},
        async |rt: KubernetesRuntime| rt.recover_quorum(&cluster_ref(), &memory_spec(), &a).await,
    )
    .await;
    assert!(
        matches!(&memory, Err(RuntimeError::State { detail, .. }) if detail.contains("memory-backed")),
        "{memory:?}"
    );
    let a2 = a.clone();
    let no_claim = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{a2}-data"),
                None,
            )
            .await
            .not_found("persistentvolumeclaims");
        },
        async |rt: KubernetesRuntime| rt.recover_quorum(&cluster_ref(), &disk_spec(3), &a).await,
    )
    .await;
    assert!(
        matches!(&no_claim, Err(RuntimeError::State { detail, .. }) if detail.contains("no volume claim")),
        "{no_claim:?}"
    );
}

#[tokio::test]
async fn no_member_is_added_back_before_the_recovered_one_serves() {
    let a = member("aaaaa");
    let b = member("bbbbb");
    let cfg = config(&[&a], InitialState::New);
    let (a2, cfg2) = (a.clone(), cfg.clone());
    let result = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/pods?&{SELECTOR}"),
                None,
            )
            .await
            .reply(
                StatusCode::OK,
                &list("PodList", vec![forced_pod(&a2, &cfg2, false)]),
            );
        },
        async |rt: KubernetesRuntime| rt.reserve(&cluster_ref(), &disk_spec(3), &b).await,
    )
    .await;
    assert!(
        matches!(&result, Err(RuntimeError::Waiting { member, detail }) if *member == a && detail.contains("does not serve yet")),
        "{result:?}"
    );
}

#[tokio::test]
async fn the_recovered_member_starts_again_without_force_new_cluster_before_members_are_added() {
    let a = member("aaaaa");
    let b = member("bbbbb");
    let cfg = config(&[&a], InitialState::New);
    let (a2, cfg2) = (a.clone(), cfg.clone());
    let result = scenario(
        async move |api: &mut ApiServerVerifier| {
            api.expect(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/pods?&{SELECTOR}"),
                None,
            )
            .await
            .reply(
                StatusCode::OK,
                &list("PodList", vec![forced_pod(&a2, &cfg2, true)]),
            );
            api.delete_pod_and_look(&a2, &cfg2, false).await;
            api.get_pvc(&a2, &cfg2).await;
            api.apply_pod_forced(&a2, false).await;
            api.event(
                "MemberPodCreated",
                &format!("Created member Pod {a2} (etcd 3.5.21)"),
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.reserve(&cluster_ref(), &disk_spec(3), &b).await,
    )
    .await;
    assert!(
        matches!(&result, Err(RuntimeError::Waiting { member, detail }) if *member == a && detail.contains("restarted without --force-new-cluster")),
        "{result:?}"
    );
}

/// A restore that failed in a member's init container (its Pod stays Pending while the kubelet
/// retries) is what observing the cluster reports, with the container's message: it is not
/// waited out as a slow bootstrap.
#[tokio::test]
async fn a_restore_failed_in_an_init_container_is_reported_when_members_are_listed() {
    let a = member("aaaaa");
    let cfg = config(&[&a], InitialState::New);
    let (a2, cfg2) = (a.clone(), cfg.clone());
    let result = scenario(
        async move |api: &mut ApiServerVerifier| {
            let mut failing = pod(&a2, "Pending", Some(&cfg2), false);
            failing["status"]["initContainerStatuses"] = json!([{
                "name": "restore-fetch", "image": "op", "imageID": "", "ready": false, "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "checksum mismatch: want abc, got def"}},
            }]);
            api.list_members(vec![failing], vec![pvc(&a2, Some(&cfg2), false)])
                .await;
        },
        async |rt: KubernetesRuntime| rt.members(&cluster_ref()).await,
    )
    .await;
    match result {
        Err(RuntimeError::Restore { member, source }) => {
            assert_eq!(member, a);
            assert!(source.to_string().contains("checksum mismatch"), "{source}");
        }
        other => panic!("{other:?}"),
    }

    // Once a member serves, a Pod stuck in its init containers is a member that does not
    // start, listed as running (its Pod exists) for the planner to judge like any other.
    let b = member("bbbbb");
    let (a3, b3, cfg3) = (a.clone(), b.clone(), cfg.clone());
    let listed = scenario(
        async move |api: &mut ApiServerVerifier| {
            let mut failing = pod(&a3, "Pending", Some(&cfg3), false);
            failing["status"]["initContainerStatuses"] = json!([{
                "name": "restore-fetch", "image": "op", "imageID": "", "ready": false, "restartCount": 2,
                "state": {"terminated": {"exitCode": 1, "message": "checksum mismatch"}},
            }]);
            let mut serving = pod(&b3, "Running", Some(&cfg3), false);
            serving["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
            api.list_members(
                vec![failing, serving],
                vec![pvc(&a3, Some(&cfg3), false), pvc(&b3, Some(&cfg3), false)],
            )
            .await;
        },
        async |rt: KubernetesRuntime| rt.members(&cluster_ref()).await,
    )
    .await
    .unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
}
