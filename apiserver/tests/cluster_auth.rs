//! Cluster-mode authentication and authorization against a recorded kube-apiserver: an HTTPS stub
//! on loopback serves the `extension-apiserver-authentication` ConfigMap, TokenReview and
//! SubjectAccessReview and records every request, so the tests assert the exact reviews the
//! server sends. The server under test is the real router over real storage on a real etcd,
//! served over real TLS, called by real TLS clients holding certificates generated here (a
//! front-proxy CA, a client CA, a CA nobody trusts). Every 401 and 403 also shows that nothing
//! was written (the backing etcd's revision and keys are unchanged) and that the request went
//! no further than it should (no SubjectAccessReview after a 401, no object in a 403 body).

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use etcd_client::GetOptions;
use etcd_operator_apiserver::cluster::authn::{DelegatedAuthenticator, TokenReviewer};
use etcd_operator_apiserver::cluster::authz::SubjectAccessReviewAuthorizer;
use etcd_operator_apiserver::cluster::config;
use etcd_operator_apiserver::cluster::loopback::Loopback;
use etcd_operator_apiserver::cluster::namespaces::NamespaceLifecycle;
use etcd_operator_apiserver::cluster::tls::{ServingTls, follow_client_cas};
use etcd_operator_apiserver::http::metrics::{ApiMetrics, instrument};
use etcd_operator_apiserver::http::openapi::Documents;
use etcd_operator_apiserver::http::{AppState, Stores, router_with};
use etcd_operator_apiserver::pki::{CertificateAuthority, LeafSpec, PemPair};
use etcd_operator_apiserver::serve::{self, UserInfo, tls as serve_tls};
use etcd_operator_apiserver::storage::{Storage, StorageOptions};
use etcd_operator_tests::{EtcdVersion, TestEtcd};
use http::{Method, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const PREFIX: &str = "/registry/etcd.operator.dev/etcdclusters/";
const CM_PATH: &str = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication";
const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const SARS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
const COLL: &str = "/apis/etcd.operator.dev/v1alpha2/namespaces/team-a/etcdclusters";
const GROUP: &str = "etcd.operator.dev";
const DAY: Duration = Duration::from_secs(86_400);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---------------------------------------------------------------- certificates

struct Pki {
    serving_ca: CertificateAuthority,
    server: PemPair,
    front_proxy_ca: CertificateAuthority,
    /// CN front-proxy-client, from the front-proxy CA.
    proxy: PemPair,
    /// CN intruder, from the front-proxy CA.
    intruder: PemPair,
    client_ca: CertificateAuthority,
    /// CN alice, O devs, from the client CA.
    alice: PemPair,
    /// CN mallory, O system:masters, from a CA nobody trusts.
    mallory: PemPair,
}

fn pki() -> Pki {
    let serving_ca = CertificateAuthority::generate("serving-ca", DAY).unwrap();
    let server = serving_ca
        .issue(&LeafSpec::server(
            "etcd-operator",
            &["localhost"],
            &["127.0.0.1".parse().unwrap()],
        ))
        .unwrap();
    let front_proxy_ca = CertificateAuthority::generate("front-proxy-ca", DAY).unwrap();
    let proxy = front_proxy_ca
        .issue(&LeafSpec::client("front-proxy-client", &[]))
        .unwrap();
    let intruder = front_proxy_ca.issue(&LeafSpec::client("intruder", &[])).unwrap();
    let client_ca = CertificateAuthority::generate("client-ca", DAY).unwrap();
    let alice = client_ca.issue(&LeafSpec::client("alice", &["devs"])).unwrap();
    let other_ca = CertificateAuthority::generate("other-ca", DAY).unwrap();
    let mallory = other_ca
        .issue(&LeafSpec::client("mallory", &["system:masters"]))
        .unwrap();
    Pki {
        serving_ca,
        server,
        front_proxy_ca,
        proxy,
        intruder,
        client_ca,
        alice,
        mallory,
    }
}

fn cm_data(pki: &Pki, allowed_names: &[&str]) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("client-ca-file".to_owned(), pki.client_ca.pem().cert_pem.clone()),
        (
            "requestheader-client-ca-file".to_owned(),
            pki.front_proxy_ca.pem().cert_pem.clone(),
        ),
        (
            "requestheader-username-headers".to_owned(),
            r#"["X-Remote-User"]"#.to_owned(),
        ),
        (
            "requestheader-uid-headers".to_owned(),
            r#"["X-Remote-Uid"]"#.to_owned(),
        ),
        (
            "requestheader-group-headers".to_owned(),
            r#"["X-Remote-Group"]"#.to_owned(),
        ),
        (
            "requestheader-extra-headers-prefix".to_owned(),
            r#"["X-Remote-Extra-"]"#.to_owned(),
        ),
        (
            "requestheader-allowed-names".to_owned(),
            serde_json::to_string(allowed_names).unwrap(),
        ),
    ])
}

// ---------------------------------------------------------------- the recorded kube-apiserver

#[derive(Debug, Clone, PartialEq)]
struct Recorded {
    method: String,
    path: String,
    body: Value,
}

#[derive(Default)]
struct StubState {
    configmap: Mutex<Option<BTreeMap<String, String>>>,
    requests: Mutex<Vec<Recorded>>,
    denied_users: Mutex<HashSet<String>>,
    tokens: Mutex<HashMap<String, Value>>,
}

impl StubState {
    fn requests_to(&self, path: &str) -> Vec<Value> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.body.clone())
            .collect()
    }

    fn sars(&self) -> Vec<Value> {
        self.requests_to(SARS)
    }

    fn token_reviews(&self) -> Vec<Value> {
        self.requests_to(TOKEN_REVIEWS)
    }

    /// SAR and TokenReview requests so far (ConfigMap polls are not counted).
    fn reviews(&self) -> usize {
        self.sars().len() + self.token_reviews().len()
    }

    /// Every request was one the server is meant to send, with the right method.
    fn assert_only_known_requests(&self) {
        for r in self.requests.lock().unwrap().iter() {
            let known = matches!(
                (r.method.as_str(), r.path.as_str()),
                ("GET", CM_PATH) | ("POST", TOKEN_REVIEWS) | ("POST", SARS)
            ) || (r.method == "GET" && namespace_of(&r.path).is_some());
            assert!(known, "unexpected request to kube-apiserver: {r:?}");
        }
    }
}

/// The namespace a `GET /api/v1/namespaces/<ns>` reads.
fn namespace_of(path: &str) -> Option<&str> {
    path.strip_prefix("/api/v1/namespaces/")
        .filter(|ns| !ns.contains('/'))
}

/// The stub's namespaces: `missing` does not exist, `dying` is terminating, every other is active.
fn stub_namespace(ns: &str) -> Response {
    let phase = match ns {
        "missing" => {
            return (
                StatusCode::NOT_FOUND,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                       "message": format!("namespaces \"{ns}\" not found")})
                .to_string(),
            )
                .into_response();
        }
        "dying" => "Terminating",
        _ => "Active",
    };
    let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}, "status": {"phase": phase}});
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn stub_handler(State(state): State<Arc<StubState>>, request: Request) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let body = request.into_body().collect().await.unwrap().to_bytes();
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap()
    };
    state.requests.lock().unwrap().push(Recorded {
        method: method.clone(),
        path: path.clone(),
        body: body.clone(),
    });
    if let ("GET", Some(ns)) = (method.as_str(), namespace_of(&path)) {
        return stub_namespace(ns);
    }
    let reply = match (method.as_str(), path.as_str()) {
        ("GET", CM_PATH) => match state.configmap.lock().unwrap().clone() {
            Some(data) => json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
                "data": data,
            }),
            None => {
                return (
                    StatusCode::NOT_FOUND,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                           "message": "configmaps \"extension-apiserver-authentication\" not found"})
                    .to_string(),
                )
                    .into_response();
            }
        },
        ("POST", TOKEN_REVIEWS) => {
            let token = body["spec"]["token"].as_str().unwrap_or_default().to_owned();
            let status = match state.tokens.lock().unwrap().get(&token) {
                Some(user) => json!({"authenticated": true, "user": user}),
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            };
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": body["spec"], "status": status})
        }
        ("POST", SARS) => {
            let user = body["spec"]["user"].as_str().unwrap_or_default().to_owned();
            let allowed = !state.denied_users.lock().unwrap().contains(&user);
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": body["spec"],
                   "status": {"allowed": allowed}})
        }
        _ => return (StatusCode::NOT_FOUND, "not found").into_response(),
    };
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        reply.to_string(),
    )
        .into_response()
}

struct Stub {
    state: Arc<StubState>,
    client: kube::Client,
    _task: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn spawn<F: std::future::Future<Output = ()> + Send + 'static>(f: F) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(f))
}

async fn start_stub() -> Stub {
    let ca = CertificateAuthority::generate("kube-ca", DAY).unwrap();
    let cert = ca
        .issue(&LeafSpec::server(
            "kube-apiserver",
            &["localhost"],
            &["127.0.0.1".parse().unwrap()],
        ))
        .unwrap();
    let tls = serve::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes(), None).unwrap();
    let state = Arc::new(StubState::default());
    let app = Router::new().fallback(stub_handler).with_state(state.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = spawn(async move {
        serve::serve(listener, tls, app, std::future::pending())
            .await
            .unwrap();
    });
    let mut config = kube::Config::new(format!("https://{addr}").parse().unwrap());
    config.root_cert = Some(vec![
        CertificateDer::from_pem_slice(ca.pem().cert_pem.as_bytes())
            .unwrap()
            .to_vec(),
    ]);
    let client = kube::Client::try_from(config).unwrap();
    Stub {
        state,
        client,
        _task: task,
    }
}

// ---------------------------------------------------------------- the server under test

/// What a handler behind the middleware saw: the `UserInfo` extension and any header that claims
/// an identity.
async fn whoami(request: Request) -> Response {
    let user = request
        .extensions()
        .get::<UserInfo>()
        .map(|u| json!({"name": u.name, "uid": u.uid, "groups": u.groups, "extra": u.extra}));
    let identity_headers: Vec<String> = request
        .headers()
        .keys()
        .map(|k| k.as_str().to_owned())
        .filter(|k| k.starts_with("x-remote-") || k.starts_with("impersonate-") || k == "authorization")
        .collect();
    axum::Json(json!({"user": user, "identity_headers": identity_headers})).into_response()
}

struct Harness {
    pki: Pki,
    stub: Stub,
    addr: SocketAddr,
    /// What the controller's in-process client talks to (serve mode's `app`).
    app: Router,
    loopback: Loopback,
    etcd_client: etcd_client::Client,
    _tasks: Vec<AbortOnDrop>,
    _etcd: TestEtcd,
}

#[derive(Debug, PartialEq)]
struct Stored {
    revision: i64,
    keys: Vec<(String, i64)>,
}

impl Harness {
    /// Starts everything; with `allowed_names`, the stub serves the ConfigMap for this PKI with
    /// those allowed names and this waits until the server loaded it.
    async fn start(allowed_names: Option<&[&str]>) -> Self {
        // Boxed: the whole setup is a large future.
        Box::pin(Self::start_unboxed(allowed_names)).await
    }

    async fn start_unboxed(allowed_names: Option<&[&str]>) -> Self {
        serve::install_crypto_provider();
        let pki = pki();
        let configmap = allowed_names.map(|names| cm_data(&pki, names));
        let stub = start_stub().await;
        *stub.state.configmap.lock().unwrap() = configmap.clone();
        let etcd = TestEtcd::start(EtcdVersion::V3_5_1)
            .await
            .expect("start etcd 3.5.1 (install it with `make tools`)");
        let etcd_client = etcd.client().await.unwrap();
        let stores =
            Stores::open(|prefix| Storage::new(etcd_client.clone(), prefix, StorageOptions::default()))
                .await
                .unwrap();
        for storage in stores.all() {
            storage.wait_initialized(Duration::from_secs(10)).await.unwrap();
        }

        let mut tasks = Vec::new();
        let (config_tx, config_rx) = config::channel();
        tasks.push(spawn(config::keep_loaded(
            stub.client.clone(),
            "kube-system".into(),
            Duration::from_millis(100),
            config_tx,
        )));
        let serving = Arc::new(
            ServingTls::new(
                pki.server.cert_pem.clone().into_bytes(),
                pki.server.key_pem.clone().into_bytes(),
                Vec::new(),
            )
            .unwrap(),
        );
        tasks.push(spawn(follow_client_cas(serving.clone(), config_rx.clone())));
        let loopback = Loopback::generate().unwrap();
        let authenticator = DelegatedAuthenticator::new(
            config_rx,
            Some(loopback.trust()),
            Some(TokenReviewer::new(stub.client.clone())),
        );
        let mut registry = Registry::default();
        let api_metrics = ApiMetrics::register(&mut registry);
        let state = AppState {
            stores,
            authenticator: Arc::new(authenticator),
            authorizer: Arc::new(SubjectAccessReviewAuthorizer::new(stub.client.clone())),
            openapi: Arc::new(Documents::generate().unwrap()),
            snapshots: None,
            namespaces: Some(Arc::new(NamespaceLifecycle::new(stub.client.clone()))),
            metrics: Some(Arc::new(registry)),
            controller_init: Arc::new([]),
        };
        let app = instrument(
            router_with(state, Router::new().route("/debug/whoami", get(whoami))),
            api_metrics,
        );

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = serving.reloadable();
        let public_app = app.clone();
        let in_process_app = app;
        tasks.push(spawn(async move {
            serve::serve(listener, tls, public_app, std::future::pending())
                .await
                .unwrap();
        }));
        let harness = Self {
            pki,
            stub,
            addr,
            app: in_process_app,
            loopback,
            etcd_client,
            _tasks: tasks,
            _etcd: etcd,
        };
        if configmap.is_some() {
            harness.wait_ready().await;
        }
        harness
    }

    async fn wait_ready(&self) {
        for _ in 0..100 {
            let r = self.call(None, Method::GET, "/readyz", &[], None).await.unwrap();
            if r.status == StatusCode::OK {
                // The TLS roots follow the configuration right after it is published.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the server never became ready");
    }

    fn set_configmap(&self, data: BTreeMap<String, String>) {
        *self.stub.state.configmap.lock().unwrap() = Some(data);
    }

    fn config(&self, identity: Option<&PemPair>, alpn: &[&[u8]]) -> Arc<ClientConfig> {
        client_config(
            &self.pki.serving_ca.pem().cert_pem,
            &[&rustls::version::TLS13, &rustls::version::TLS12],
            alpn,
            identity,
        )
    }

    async fn call(
        &self,
        identity: Option<&PemPair>,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Resp, BoxError> {
        send(
            self.addr,
            self.config(identity, &[b"h2", b"http/1.1"]),
            method,
            path,
            headers,
            body,
        )
        .await
    }

    async fn stored(&self) -> Stored {
        let resp = self
            .etcd_client
            .kv_client()
            .get(PREFIX, Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        Stored {
            revision: resp.header().unwrap().revision(),
            keys: resp
                .kvs()
                .iter()
                .map(|kv| (kv.key_str().unwrap().to_owned(), kv.mod_revision()))
                .collect(),
        }
    }

    async fn assert_unchanged(&self, before: &Stored, what: &str) {
        assert_eq!(&self.stored().await, before, "{what} changed what is stored");
    }
}

// ---------------------------------------------------------------- TLS client

fn client_config(
    ca_pem: &str,
    versions: &[&'static SupportedProtocolVersion],
    alpn: &[&[u8]],
    identity: Option<&PemPair>,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let builder = ClientConfig::builder_with_provider(serve_tls::provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(pair) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(pair.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

#[derive(Debug)]
struct Resp {
    status: StatusCode,
    version: Version,
    tls: Option<rustls::ProtocolVersion>,
    body: Bytes,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One request on a fresh connection (so every call sees the TLS configuration in force).
async fn send(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Result<Resp, BoxError> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let tls_version = tls.get_ref().1.protocol_version();
    let io = TokioIo::new(tls);
    let uri = if h2 {
        format!("https://localhost{path}")
    } else {
        path.to_owned()
    };
    let mut builder = http::Request::builder().method(method).uri(uri);
    if !h2 {
        builder = builder.header(http::header::HOST, "localhost");
    }
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let payload = match body {
        Some(v) => {
            builder = builder.header(http::header::CONTENT_TYPE, "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    let request = builder.body(Full::new(payload))?;
    let response = if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        send.send_request(request).await?
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        send.send_request(request).await?
    };
    let status = response.status();
    let version = response.version();
    let body = response.into_body().collect().await?.to_bytes();
    Ok(Resp {
        status,
        version,
        tls: tls_version,
        body,
    })
}

fn cluster(name: &str) -> Value {
    json!({
        "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
        "metadata": {"name": name},
        "spec": {"replicas": 3, "version": "3.5.21"},
    })
}

fn assert_status(r: &Resp, code: u16, reason: &str, message: &str) {
    assert_eq!(r.status.as_u16(), code, "{}", r.text());
    let status = r.json();
    assert_eq!(status["kind"], "Status", "{status}");
    assert_eq!(status["apiVersion"], "v1", "{status}");
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], reason, "{status}");
    assert_eq!(status["code"], code, "{status}");
    assert_eq!(status["message"], message, "{status}");
}

fn assert_unauthorized(r: &Resp) {
    assert_status(r, 401, "Unauthorized", "Unauthorized");
}

/// Front-proxy headers as the aggregator sends them for `user`.
fn proxied(user: &str) -> Vec<(&str, &str)> {
    vec![("X-Remote-User", user), ("X-Remote-Group", "team")]
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn health_paths_answer_without_credentials_and_readyz_waits_for_the_configmap() {
    let h = Harness::start(None).await;
    for path in ["/healthz", "/livez"] {
        let r = h.call(None, Method::GET, path, &[], None).await.unwrap();
        assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "ok"), "{path}");
    }
    // The ConfigMap is missing: not ready, and nothing but the health paths gets in.
    let r = h.call(None, Method::GET, "/readyz", &[], None).await.unwrap();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.text().contains("authentication"), "{}", r.text());

    h.set_configmap(cm_data(&h.pki, &["front-proxy-client"]));
    h.wait_ready().await;
    for path in ["/healthz", "/livez", "/readyz"] {
        let r = h.call(None, Method::GET, path, &[], None).await.unwrap();
        assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "ok"), "{path}");
    }
    // Health checks are never reviewed, and the server read the ConfigMap at its exact path.
    assert_eq!(h.stub.state.reviews(), 0);
    h.stub.state.assert_only_known_requests();
    assert!(!h.stub.state.requests_to(CM_PATH).is_empty());
}

#[tokio::test]
async fn forged_remote_user_without_a_front_proxy_certificate_is_401_and_touches_nothing() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let before = h.stored().await;
    let forged = [
        ("X-Remote-User", "admin"),
        ("X-Remote-Group", "system:masters"),
        ("Impersonate-User", "admin"),
    ];
    let r = h
        .call(None, Method::POST, COLL, &forged, Some(&cluster("forged")))
        .await
        .unwrap();
    assert_unauthorized(&r);
    for path in [
        COLL,
        &format!("{COLL}/forged"),
        "/debug/whoami",
        "/apis",
        "/version",
    ] {
        let r = h.call(None, Method::GET, path, &forged, None).await.unwrap();
        assert_unauthorized(&r);
    }
    let r = h.call(None, Method::DELETE, COLL, &forged, None).await.unwrap();
    assert_unauthorized(&r);
    h.assert_unchanged(&before, "a forged X-Remote-User").await;
    // Refused before authorization: no review was asked for, no handler ran.
    assert_eq!(h.stub.state.reviews(), 0);
    h.stub.state.assert_only_known_requests();
}

#[tokio::test]
async fn a_client_ca_certificate_is_its_cn_and_o_and_forged_headers_never_reach_the_handler() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let alice = h.pki.alice.clone();
    let forged = [
        ("X-Remote-User", "admin"),
        ("X-Remote-Group", "system:masters"),
        ("X-Remote-Extra-Scopes", "all"),
        ("Impersonate-Group", "system:masters"),
    ];
    let r = h
        .call(Some(&alice), Method::GET, "/debug/whoami", &forged, None)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"user": {"name": "alice", "uid": null, "groups": ["devs", "system:authenticated"], "extra": {}},
               "identity_headers": []})
    );
    assert_eq!(
        h.stub.state.sars(),
        [
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
            "user": "alice", "groups": ["devs", "system:authenticated"],
            "nonResourceAttributes": {"path": "/debug/whoami", "verb": "get"}}})
        ]
    );
    h.stub.state.assert_only_known_requests();
}

#[tokio::test]
async fn a_certificate_from_another_ca_fails_the_handshake() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let before = h.stored().await;
    let mallory = h.pki.mallory.clone();
    for (method, path, body) in [
        (Method::POST, COLL, Some(cluster("m"))),
        (Method::GET, COLL, None),
        (Method::GET, "/debug/whoami", None),
    ] {
        let result = h
            .call(
                Some(&mallory),
                method,
                path,
                &[("X-Remote-User", "admin")],
                body.as_ref(),
            )
            .await;
        assert!(
            result.is_err(),
            "a certificate of an unknown CA got an answer: {result:?}"
        );
    }
    // The server's own loopback controller certificate is not trusted on the public port either.
    let controller = h.loopback.controller_identity().clone();
    assert!(
        h.call(Some(&controller), Method::GET, COLL, &[], None)
            .await
            .is_err()
    );
    h.assert_unchanged(&before, "an unknown CA's certificate").await;
    assert_eq!(h.stub.state.reviews(), 0);
}

#[tokio::test]
async fn a_proxy_certificate_whose_cn_is_not_allowed_is_401_and_touches_nothing() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    h.stub
        .state
        .tokens
        .lock()
        .unwrap()
        .insert("good".into(), json!({"username": "tokenuser"}));
    let before = h.stored().await;
    let intruder = h.pki.intruder.clone();
    let r = h
        .call(
            Some(&intruder),
            Method::POST,
            COLL,
            &proxied("admin"),
            Some(&cluster("x")),
        )
        .await
        .unwrap();
    assert_unauthorized(&r);
    let r = h
        .call(
            Some(&intruder),
            Method::GET,
            "/debug/whoami",
            &proxied("admin"),
            None,
        )
        .await
        .unwrap();
    assert_unauthorized(&r);
    // A refused certificate is not rescued by a token: fail closed, and the token is not even
    // reviewed.
    let mut with_token = proxied("admin");
    with_token.push(("Authorization", "Bearer good"));
    let r = h
        .call(Some(&intruder), Method::GET, COLL, &with_token, None)
        .await
        .unwrap();
    assert_unauthorized(&r);
    // The allowed proxy without a user header is not authenticated either.
    let proxy = h.pki.proxy.clone();
    let r = h.call(Some(&proxy), Method::GET, COLL, &[], None).await.unwrap();
    assert_unauthorized(&r);
    h.assert_unchanged(&before, "a disallowed proxy certificate")
        .await;
    assert_eq!(h.stub.state.reviews(), 0);
    h.stub.state.assert_only_known_requests();
}

#[tokio::test]
async fn a_front_proxy_identity_reaches_the_handler_and_is_reviewed_exactly() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let proxy = h.pki.proxy.clone();
    let headers = [
        ("X-Remote-User", "jane"),
        ("X-Remote-Uid", "uid-7"),
        ("X-Remote-Group", "devs"),
        ("X-Remote-Group", "ops"),
        ("X-Remote-Extra-Scopes", "read"),
        ("X-Remote-Extra-Scopes", "write"),
        ("X-Remote-Extra-Example.com%2Fteam", "blue"),
        ("Impersonate-User", "root"),
    ];
    let user = json!({"user": "jane", "uid": "uid-7", "groups": ["devs", "ops", "system:authenticated"],
                      "extra": {"example.com/team": ["blue"], "scopes": ["read", "write"]}});
    let sar = |attrs: (&str, Value)| {
        let mut spec = user.clone();
        spec[attrs.0] = attrs.1;
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
    };

    let r = h
        .call(Some(&proxy), Method::GET, "/debug/whoami", &headers, None)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"user": {"name": "jane", "uid": "uid-7", "groups": ["devs", "ops", "system:authenticated"],
                        "extra": {"example.com/team": ["blue"], "scopes": ["read", "write"]}},
               "identity_headers": []})
    );
    let r = h
        .call(Some(&proxy), Method::POST, COLL, &headers, Some(&cluster("c1")))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = h
        .call(
            Some(&proxy),
            Method::GET,
            &format!("{COLL}?fieldSelector=metadata.name%3Dc1"),
            &headers,
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = h
        .call(
            Some(&proxy),
            Method::GET,
            &format!("{COLL}/c1/status"),
            &headers,
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = h
        .call(
            Some(&proxy),
            Method::DELETE,
            "/apis/etcd.operator.dev/v1alpha2/namespaces/team-a/etcdclusters",
            &headers,
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    let base = |verb: &str| json!({"namespace": "team-a", "verb": verb, "group": GROUP, "version": "v1alpha2", "resource": "etcdclusters"});
    let mut list_one = base("list");
    list_one["name"] = json!("c1");
    let mut status = base("get");
    status["subresource"] = json!("status");
    status["name"] = json!("c1");
    assert_eq!(
        h.stub.state.sars(),
        [
            sar((
                "nonResourceAttributes",
                json!({"path": "/debug/whoami", "verb": "get"})
            )),
            sar(("resourceAttributes", base("create"))),
            sar(("resourceAttributes", list_one)),
            sar(("resourceAttributes", status)),
            sar(("resourceAttributes", base("deletecollection"))),
        ]
    );
    assert!(h.stub.state.token_reviews().is_empty());
    h.stub.state.assert_only_known_requests();
}

#[tokio::test]
async fn system_masters_are_allowed_without_a_review() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let proxy = h.pki.proxy.clone();
    // The aggregator's availability check and discovery.
    let headers = [
        ("X-Remote-User", "system:kube-aggregator"),
        ("X-Remote-Group", "system:masters"),
    ];
    let r = h
        .call(
            Some(&proxy),
            Method::GET,
            "/apis/etcd.operator.dev/v1alpha2",
            &headers,
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = h
        .call(Some(&proxy), Method::GET, "/apis", &headers, None)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(h.stub.state.reviews(), 0);
}

#[tokio::test]
async fn a_denied_review_is_403_in_kube_wording_and_stores_nothing() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let proxy = h.pki.proxy.clone();
    // An object exists, created by an allowed user.
    let r = h
        .call(
            Some(&proxy),
            Method::POST,
            COLL,
            &proxied("jane"),
            Some(&cluster("c1")),
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    h.stub.state.denied_users.lock().unwrap().insert("eve".into());
    let before = h.stored().await;
    let eve = proxied("eve");

    let r = h
        .call(Some(&proxy), Method::POST, COLL, &eve, Some(&cluster("c2")))
        .await
        .unwrap();
    assert_status(
        &r,
        403,
        "Forbidden",
        r#"etcdclusters.etcd.operator.dev is forbidden: User "eve" cannot create resource "etcdclusters" in API group "etcd.operator.dev" in the namespace "team-a""#,
    );
    let r = h
        .call(Some(&proxy), Method::GET, &format!("{COLL}/c1"), &eve, None)
        .await
        .unwrap();
    assert_status(
        &r,
        403,
        "Forbidden",
        r#"etcdclusters.etcd.operator.dev "c1" is forbidden: User "eve" cannot get resource "etcdclusters" in API group "etcd.operator.dev" in the namespace "team-a""#,
    );
    assert!(
        !r.text().contains("3.5.21"),
        "a 403 leaked the object: {}",
        r.text()
    );
    let r = h
        .call(
            Some(&proxy),
            Method::PATCH,
            &format!("{COLL}/c1/scale"),
            &[
                ("X-Remote-User", "eve"),
                ("Content-Type", "application/merge-patch+json"),
            ],
            Some(&json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_status(
        &r,
        403,
        "Forbidden",
        r#"etcdclusters.etcd.operator.dev "c1" is forbidden: User "eve" cannot patch resource "etcdclusters/scale" in API group "etcd.operator.dev" in the namespace "team-a""#,
    );
    let r = h
        .call(Some(&proxy), Method::DELETE, &format!("{COLL}/c1"), &eve, None)
        .await
        .unwrap();
    assert_status(
        &r,
        403,
        "Forbidden",
        r#"etcdclusters.etcd.operator.dev "c1" is forbidden: User "eve" cannot delete resource "etcdclusters" in API group "etcd.operator.dev" in the namespace "team-a""#,
    );
    let r = h
        .call(
            Some(&proxy),
            Method::GET,
            "/apis/etcd.operator.dev/v1alpha2/etcdclusters",
            &eve,
            None,
        )
        .await
        .unwrap();
    assert_status(
        &r,
        403,
        "Forbidden",
        r#"etcdclusters.etcd.operator.dev is forbidden: User "eve" cannot list resource "etcdclusters" in API group "etcd.operator.dev" at the cluster scope"#,
    );
    let r = h
        .call(Some(&proxy), Method::GET, "/version", &eve, None)
        .await
        .unwrap();
    assert_status(
        &r,
        403,
        "Forbidden",
        r#"forbidden: User "eve" cannot get path "/version""#,
    );
    h.assert_unchanged(&before, "a denied request").await;

    // Denials are cached: the same request again asks nothing new, and still stores nothing.
    let asked = h.stub.state.sars().len();
    let r = h
        .call(Some(&proxy), Method::POST, COLL, &eve, Some(&cluster("c2")))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(h.stub.state.sars().len(), asked);
    h.assert_unchanged(&before, "a denied request (cached)").await;
    let last = h.stub.state.sars().last().cloned().unwrap();
    assert_eq!(
        last["spec"],
        json!({"user": "eve", "groups": ["team", "system:authenticated"],
               "nonResourceAttributes": {"path": "/version", "verb": "get"}})
    );
}

#[tokio::test]
async fn metrics_is_a_non_resource_url_reviewed_for_the_scrapers_token() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let prometheus = "system:serviceaccount:monitoring:prometheus";
    for (token, user) in [("prom-token", prometheus), ("eve-token", "eve")] {
        h.stub.state.tokens.lock().unwrap().insert(
            token.into(),
            json!({"username": user, "groups": ["system:serviceaccounts"]}),
        );
    }
    h.stub.state.denied_users.lock().unwrap().insert("eve".into());

    let r = h.call(None, Method::GET, "/metrics", &[], None).await.unwrap();
    assert_unauthorized(&r);
    let eve = [("Authorization", "Bearer eve-token")];
    let r = h.call(None, Method::GET, "/metrics", &eve, None).await.unwrap();
    assert_status(
        &r,
        403,
        "Forbidden",
        r#"forbidden: User "eve" cannot get path "/metrics""#,
    );
    let prom = [("Authorization", "Bearer prom-token")];
    let r = h.call(None, Method::GET, "/metrics", &prom, None).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let text = r.text();
    // The refusals before are in it, by code; the scrape itself is counted once answered.
    for line in [
        r#"apiserver_request_total{verb="get",group="",version="",resource="",subresource="",code="401"} 1"#,
        r#"apiserver_request_total{verb="get",group="",version="",resource="",subresource="",code="403"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    let reviewed: Vec<Value> = h.stub.state.sars().iter().map(|s| s["spec"].clone()).collect();
    assert_eq!(
        reviewed,
        [
            json!({"user": "eve", "groups": ["system:serviceaccounts", "system:authenticated"],
                   "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}),
            json!({"user": prometheus, "groups": ["system:serviceaccounts", "system:authenticated"],
                   "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}),
        ]
    );
    h.stub.state.assert_only_known_requests();
}

#[tokio::test]
async fn bearer_tokens_go_through_token_review_and_are_cached() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    h.stub.state.tokens.lock().unwrap().insert(
        "good-token".into(),
        json!({"username": "system:serviceaccount:team-a:ci", "uid": "sa-1",
               "groups": ["system:serviceaccounts"], "extra": {"authentication.kubernetes.io/pod-name": ["ci-0"]}}),
    );
    let good = [("Authorization", "Bearer good-token")];
    let r = h
        .call(None, Method::GET, "/debug/whoami", &good, None)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"user": {"name": "system:serviceaccount:team-a:ci", "uid": "sa-1",
                        "groups": ["system:serviceaccounts", "system:authenticated"],
                        "extra": {"authentication.kubernetes.io/pod-name": ["ci-0"]}},
               "identity_headers": []})
    );
    let r = h.call(None, Method::GET, COLL, &good, None).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // One review for both requests (cached), with exactly the token and no audiences.
    assert_eq!(
        h.stub.state.token_reviews(),
        [
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "good-token"}})
        ]
    );
    assert_eq!(
        h.stub.state.sars()[1]["spec"],
        json!({"user": "system:serviceaccount:team-a:ci", "uid": "sa-1",
               "groups": ["system:serviceaccounts", "system:authenticated"],
               "extra": {"authentication.kubernetes.io/pod-name": ["ci-0"]},
               "resourceAttributes": {"namespace": "team-a", "verb": "list", "group": GROUP,
                                      "version": "v1alpha2", "resource": "etcdclusters"}})
    );

    let before = h.stored().await;
    let sars = h.stub.state.sars().len();
    let bad = [("Authorization", "Bearer bad-token")];
    let r = h
        .call(None, Method::POST, COLL, &bad, Some(&cluster("x")))
        .await
        .unwrap();
    assert_unauthorized(&r);
    let r = h.call(None, Method::GET, COLL, &bad, None).await.unwrap();
    assert_unauthorized(&r);
    h.assert_unchanged(&before, "an invalid token").await;
    // The failure was reviewed once and cached; no SubjectAccessReview for a 401.
    assert_eq!(h.stub.state.token_reviews().len(), 2);
    assert_eq!(
        h.stub.state.token_reviews()[1]["spec"],
        json!({"token": "bad-token"})
    );
    assert_eq!(h.stub.state.sars().len(), sars);
    h.stub.state.assert_only_known_requests();
}

#[tokio::test]
async fn a_changed_configmap_takes_effect_without_a_restart() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let (proxy, intruder) = (h.pki.proxy.clone(), h.pki.intruder.clone());
    let before = h.stored().await;
    let r = h
        .call(Some(&intruder), Method::GET, "/debug/whoami", &proxied("x"), None)
        .await
        .unwrap();
    assert_unauthorized(&r);

    // 1. Allowed names change: the new CN gets in, the old one is refused.
    h.set_configmap(cm_data(&h.pki, &["intruder"]));
    let mut admitted = false;
    for _ in 0..100 {
        let r = h
            .call(Some(&intruder), Method::GET, "/debug/whoami", &proxied("x"), None)
            .await
            .unwrap();
        if r.status == StatusCode::OK {
            assert_eq!(r.json()["user"]["name"], "x");
            admitted = true;
            break;
        }
        assert_unauthorized(&r);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(admitted, "the new allowed name never took effect");
    let r = h
        .call(Some(&proxy), Method::GET, "/debug/whoami", &proxied("x"), None)
        .await
        .unwrap();
    assert_unauthorized(&r);

    // 2. The request-header CA rotates: certificates of the new CA are accepted (TLS roots and
    //    per-request verification both follow), those of the old one are no longer.
    let new_ca = CertificateAuthority::generate("front-proxy-ca-2", DAY).unwrap();
    let new_proxy = new_ca
        .issue(&LeafSpec::client("front-proxy-client", &[]))
        .unwrap();
    assert!(
        h.call(
            Some(&new_proxy),
            Method::GET,
            "/debug/whoami",
            &proxied("x"),
            None
        )
        .await
        .is_err()
    );
    let mut data = cm_data(&h.pki, &["front-proxy-client"]);
    data.insert(
        "requestheader-client-ca-file".into(),
        new_ca.pem().cert_pem.clone(),
    );
    h.set_configmap(data);
    let mut admitted = false;
    for _ in 0..100 {
        if let Ok(r) = h
            .call(
                Some(&new_proxy),
                Method::GET,
                "/debug/whoami",
                &proxied("x"),
                None,
            )
            .await
            && r.status == StatusCode::OK
        {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(admitted, "the new request-header CA never took effect");
    assert!(
        h.call(Some(&proxy), Method::GET, "/debug/whoami", &proxied("x"), None)
            .await
            .is_err()
    );
    h.assert_unchanged(&before, "configuration changes").await;
    h.stub.state.assert_only_known_requests();
}

/// A TLS 1.1 ClientHello record, written by hand: record version 3.2, client_version 3.2, cipher
/// suites the server supports in TLS 1.2 (ECDHE-ECDSA/RSA-AES128-GCM) plus two TLS 1.0/1.1 ones,
/// null compression, no extensions (so no `supported_versions` offering 1.2 or 1.3).
fn tls11_client_hello() -> Vec<u8> {
    client_hello(0x02)
}

/// The same ClientHello with client_version 3.`minor`, plus the `signature_algorithms` and
/// `supported_groups` extensions a TLS 1.2 server needs for ECDHE-ECDSA.
fn client_hello(minor: u8) -> Vec<u8> {
    let mut hello = vec![0x03, minor];
    hello.extend_from_slice(&[0x42; 32]); // random
    hello.push(0); // session id
    hello.extend_from_slice(&[0x00, 0x08, 0xc0, 0x2b, 0xc0, 0x2f, 0xc0, 0x13, 0x00, 0x2f]); // cipher suites
    hello.extend_from_slice(&[0x01, 0x00]); // compression methods: null
    let extensions: &[u8] = &[
        0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x03, 0x08, 0x04, // signature_algorithms
        0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17, // supported_groups: secp256r1
        0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // ec_point_formats: uncompressed
    ];
    hello.extend_from_slice(&u16::try_from(extensions.len()).unwrap().to_be_bytes());
    hello.extend_from_slice(extensions);
    let mut handshake = vec![0x01, 0x00];
    handshake.extend_from_slice(&u16::try_from(hello.len()).unwrap().to_be_bytes());
    handshake.extend_from_slice(&hello);
    let mut record = vec![0x16, 0x03, 0x02];
    record.extend_from_slice(&u16::try_from(handshake.len()).unwrap().to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

#[tokio::test]
async fn tls_1_1_is_refused() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let mut tcp = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(&tls11_client_hello()).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut reply))
        .await
        .expect("the server closes the connection")
        .unwrap();
    // One fatal alert record (content type 21, level 2, protocol_version = 70), then close; no
    // ServerHello.
    assert_eq!(
        reply,
        [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 70],
        "reply: {reply:02x?}"
    );

    // Control: the very same hello saying TLS 1.2 gets a ServerHello (handshake record), so the
    // refusal above is about the version alone.
    let mut tcp = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(&client_hello(0x03)).await.unwrap();
    let mut first = [0u8; 6];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut first))
        .await
        .expect("the server answers a TLS 1.2 hello")
        .unwrap();
    assert_eq!(
        &first[..3],
        &[0x16, 0x03, 0x03],
        "no handshake record: {first:02x?}"
    );
    assert_eq!(first[5], 0x02, "not a ServerHello: {first:02x?}");

    // And a real TLS 1.1 client, when openssl is installed (async: the server runs on this
    // test's runtime).
    let openssl = tokio::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &h.addr.to_string(),
            "-tls1_1",
            "-servername",
            "localhost",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    if let Ok(out) = tokio::time::timeout(Duration::from_secs(20), openssl)
        .await
        .expect("openssl s_client ends")
    {
        assert!(!out.status.success(), "openssl s_client -tls1_1 connected");
    }
    assert_eq!(h.stub.state.reviews(), 0);
}

static TLS13_ONLY: [&SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
static TLS12_ONLY: [&SupportedProtocolVersion; 1] = [&rustls::version::TLS12];

/// ALPN offered, TLS versions offered, the HTTP version and TLS version expected.
type Case = (
    &'static [&'static [u8]],
    &'static [&'static SupportedProtocolVersion],
    Version,
    rustls::ProtocolVersion,
);

#[tokio::test]
async fn h2_and_http1_both_work() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let proxy = h.pki.proxy.clone();
    let ca = h.pki.serving_ca.pem().cert_pem.clone();
    let cases: [Case; 3] = [
        (
            &[b"h2"],
            &TLS13_ONLY,
            Version::HTTP_2,
            rustls::ProtocolVersion::TLSv1_3,
        ),
        (
            &[b"http/1.1"],
            &TLS13_ONLY,
            Version::HTTP_11,
            rustls::ProtocolVersion::TLSv1_3,
        ),
        (
            &[b"h2", b"http/1.1"],
            &TLS12_ONLY,
            Version::HTTP_2,
            rustls::ProtocolVersion::TLSv1_2,
        ),
    ];
    for (alpn, versions, http_version, tls_version) in cases {
        let config = client_config(&ca, versions, alpn, Some(&proxy));
        let r = send(h.addr, config, Method::GET, COLL, &proxied("jane"), None)
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.version, http_version);
        assert_eq!(r.tls, Some(tls_version));
        assert_eq!(r.json()["kind"], "EtcdClusterList");
    }
}

/// The controller's identity works in process (serve mode's controller client) as a member of
/// `system:masters`, and nowhere else: no listener takes a certificate of the loopback CA, and
/// the same leaf in process from another peer address is refused.
#[tokio::test]
async fn the_controller_loopback_identity_works_only_in_process() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let client = h.loopback.client(h.app.clone()).unwrap();
    let list: Value = client
        .request(
            http::Request::get("/apis/etcd.operator.dev/v1alpha2/etcdclusters")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(list["kind"], "EtcdClusterList");
    // system:masters: never reviewed.
    assert_eq!(h.stub.state.reviews(), 0);

    // Over the network the public listener refuses the loopback identity at the handshake (its
    // client CAs are the cluster's, never the loopback CA).
    let serving_ca = h.pki.serving_ca.pem().cert_pem.clone();
    let all = [&rustls::version::TLS13, &rustls::version::TLS12];
    let config = client_config(
        &serving_ca,
        &all,
        &[b"h2"],
        Some(h.loopback.controller_identity()),
    );
    let result = send(h.addr, config, Method::GET, COLL, &[], None).await;
    assert!(
        result.is_err(),
        "the public listener took the loopback identity: {:?}",
        result.map(|r| (r.status, r.text()))
    );

    // In process from a peer that is not the loopback address: refused (401).
    let leaf = CertificateDer::from_pem_slice(h.loopback.controller_identity().cert_pem.as_bytes()).unwrap();
    let mut request = http::Request::get(COLL).body(axum::body::Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(serve::PeerCertificates(Arc::new(vec![leaf])));
    request
        .extensions_mut()
        .insert(serve::RemoteAddr("10.0.0.7:4242".parse().unwrap()));
    let response = tower::ServiceExt::oneshot(h.app.clone(), request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn creates_in_missing_or_terminating_namespaces_are_refused_as_namespace_lifecycle_does() {
    let h = Harness::start(Some(&["front-proxy-client"])).await;
    let proxy = h.pki.proxy.clone();
    let jane = proxied("jane");
    let before = h.stored().await;
    let coll = |ns: &str| format!("/apis/etcd.operator.dev/v1alpha2/namespaces/{ns}/etcdclusters");
    let r = h
        .call(
            Some(&proxy),
            Method::POST,
            &coll("missing"),
            &jane,
            Some(&cluster("c1")),
        )
        .await
        .unwrap();
    assert_status(&r, 404, "NotFound", r#"namespaces "missing" not found"#);
    let r = h
        .call(
            Some(&proxy),
            Method::POST,
            &coll("dying"),
            &jane,
            Some(&cluster("c1")),
        )
        .await
        .unwrap();
    assert_status(
        &r,
        403,
        "Forbidden",
        r#"etcdclusters.etcd.operator.dev "c1" is forbidden: unable to create new content in namespace dying because it is being terminated"#,
    );
    assert_eq!(r.json()["details"]["causes"][0]["reason"], "NamespaceTerminating");
    // Create-on-apply is a create too.
    let mut apply_headers = jane.clone();
    apply_headers.push(("content-type", "application/apply-patch+yaml"));
    let r = h
        .call(
            Some(&proxy),
            Method::PATCH,
            &format!("{}/c1?fieldManager=m", coll("missing")),
            &apply_headers,
            Some(&cluster("c1")),
        )
        .await
        .unwrap();
    assert_status(&r, 404, "NotFound", r#"namespaces "missing" not found"#);
    h.assert_unchanged(&before, "creates in missing or terminating namespaces")
        .await;
    // An active namespace: created, after one lookup of it.
    let r = h
        .call(
            Some(&proxy),
            Method::POST,
            &coll("team-b"),
            &jane,
            Some(&cluster("c1")),
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(h.stub.state.requests_to("/api/v1/namespaces/team-b").len(), 1);
    h.stub.state.assert_only_known_requests();
}
