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
use etcd_operator_controller::model::{ClusterRef, InitialState, Liveness, MemberConfig, RuntimeMember};
use etcd_operator_controller::resources;
use etcd_operator_controller::restore::{RestorePlan, SnapshotSource};
use etcd_operator_controller::runtime::kubernetes::KubernetesRuntime;
use etcd_operator_controller::runtime::{ClusterSpecView, Runtime, RuntimeError};
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

fn view(spec: EtcdClusterSpec) -> ClusterSpecView {
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
    ClusterSpecView::new(cluster)
}

/// Three replicas on 1Gi disks, everything else defaulted.
fn disk_spec(replicas: i32) -> ClusterSpecView {
    view(EtcdClusterSpec {
        replicas: Some(replicas),
        version: Some("3.5.21".to_owned()),
        ..EtcdClusterSpec::default()
    })
}

fn memory_spec() -> ClusterSpecView {
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
fn full_spec() -> ClusterSpecView {
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
        pod_template: Some(PodTemplate {
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
        }),
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
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims?"),
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
            .expect(Method::PATCH, &format!("{pvc_path}?"), Some(MERGE_PATCH))
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
}

fn reserved(name: &str, config: Option<MemberConfig>) -> RuntimeMember {
    RuntimeMember {
        name: name.to_owned(),
        peer_url: peer_url(name),
        client_url: client_url(name),
        config,
        liveness: Liveness::Reserved,
        certificates: None,
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
            api.apply_services().await;
            api.list_members(
                vec![pod(&a2, "Running", Some(&cfg2), false)],
                vec![pvc(&a2, Some(&cfg2), false)],
            )
            .await;
            api.apply_pdb(2).await;
            api.expect(
                Method::POST,
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims?"),
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
        err.to_string(),
        "restore from snapshot for member demo-bbbbb: the operator's image is unknown, so member Pods cannot fetch the snapshot: set ETCD_OPERATOR_IMAGE in the operator's environment (the Helm chart does)"
    );
}

#[tokio::test]
async fn a_restore_from_a_volume_the_member_pods_cannot_mount_is_refused_before_any_call() {
    for volume in [
        VolumeDestination {
            claim_name: Some("backups".into()),
            path: None,
        },
        VolumeDestination {
            claim_name: None,
            path: Some("/var/backups".into()),
        },
    ] {
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
            err.to_string().starts_with(
                "restore from snapshot for member demo-bbbbb: the snapshot cannot be fetched from the member Pods: snapshot \"prod/main/x.db\" is in "
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("which member Pods cannot mount"),
            "{err}"
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
        err.to_string(),
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
                .expect(Method::PATCH, &format!("{pvc_path}?"), Some(MERGE_PATCH))
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
async fn scale_down_and_replace_delete_the_pod_then_its_volume_claim() {
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
            api.delete(
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{c2}-data"),
                Some(pvc(&c2, Some(&boot2), true)),
            )
            .await;
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
            api.event("MemberRemoved", &format!("Removed member {c2}")).await;
        },
        async |rt: KubernetesRuntime| rt.remove(&cluster_ref(), &c, false).await.unwrap(),
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
            api.delete(
                &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{c2}-data"),
                None,
            )
            .await;
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
                    &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{c2}-data?"),
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
                        &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{m}-data?"),
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
            api.list_members(
                vec![
                    pod(&running, "Running", Some(&cfg2), false),
                    pod(&pending, "Pending", Some(&cfg2), false),
                    pod(&failed, "Failed", Some(&cfg2), false),
                    pod(&terminating, "Running", Some(&cfg2), true),
                    pod(&removed, "Running", Some(&cfg2), true),
                    pod(&doomed, "Running", Some(&cfg2), false),
                    // Not a member: no member label.
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray", "labels": {"etcd.operator.dev/cluster": NAME}}}),
                ],
                vec![
                    pvc(&running, Some(&cfg2), false),
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
    };
    let gone = |reason: String, restartable: bool| Liveness::Gone { reason, restartable };
    assert_eq!(
        got,
        vec![
            with(&running, Liveness::Running),
            with(&pending, Liveness::Running),
            with(&failed, gone(format!("Pod {failed} has phase Failed"), true)),
            with(
                &terminating,
                gone(format!("Pod {terminating} is being deleted"), true)
            ),
            with(&missing, gone(format!("Pod {missing} is missing"), true)),
            reserved(&reserved_only, None),
            // The removed member (Pod and PVC being deleted) is not reported.
            with(
                &doomed,
                gone(
                    format!("the PersistentVolumeClaim of member {doomed} is being deleted"),
                    false
                )
            ),
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
    )
    .unwrap();
    golden("pod-restore", &pod);
}

#[test]
fn golden_pod_memory() {
    let mut cfg = golden_config();
    cfg.version = "3.4.23".to_owned();
    cfg.initial_state = InitialState::Existing;
    let pod = resources::build_pod(&cluster_ref(), &memory_spec(), &member("x2b4c"), &cfg, None).unwrap();
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
