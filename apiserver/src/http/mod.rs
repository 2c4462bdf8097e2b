//! The HTTP layer: routing, authentication, discovery, OpenAPI, and the resource endpoints.
//! Handlers are thin; object semantics live in [`crate::registry`], persistence in
//! [`crate::storage`].

pub mod admission;
pub mod auth;
pub mod body;
pub mod discovery;
pub mod error;
pub mod managed;
pub mod metrics;
pub mod negotiate;
pub mod openapi;
pub mod overload;
pub mod request_info;
pub mod resource;
pub mod selectors;
pub mod snapshot;
pub mod table;
pub mod watch;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::registry::kind::{self, Kind};
use crate::storage::Storage;
use error::ApiError;

/// The storage of every served resource (each its own prefix of the backing etcd, with its own
/// watch cache), opened from the resource table. Cheap to clone.
#[derive(Clone)]
pub struct Stores(Arc<Vec<(Kind, Storage)>>);

impl Stores {
    /// Opens the storage of every resource of the group ([`kind::GROUP_KINDS`]) with
    /// `open(storage_prefix)`.
    pub async fn open<F, Fut, E>(open: F) -> Result<Self, E>
    where
        F: FnMut(&'static str) -> Fut,
        Fut: std::future::Future<Output = Result<Storage, E>>,
    {
        Self::open_kinds(&kind::GROUP_KINDS, open).await
    }

    /// Opens the storage of `kinds` with `open(storage_prefix)`; only those are served (local
    /// mode adds core Events, [`kind::ALL`]).
    pub async fn open_kinds<F, Fut, E>(kinds: &[Kind], mut open: F) -> Result<Self, E>
    where
        F: FnMut(&'static str) -> Fut,
        Fut: std::future::Future<Output = Result<Storage, E>>,
    {
        let mut stores = Vec::with_capacity(kinds.len());
        for kind in kinds {
            stores.push((*kind, open(kind.info().storage_prefix).await?));
        }
        Ok(Self(Arc::new(stores)))
    }

    /// Whether `kind` is served (has storage).
    pub fn serves(&self, kind: Kind) -> bool {
        self.0.iter().any(|(k, _)| *k == kind)
    }

    /// The storage of `kind`.
    pub fn get(&self, kind: Kind) -> Result<&Storage, ApiError> {
        self.0
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, s)| s)
            .ok_or_else(|| ApiError::internal(format!("no storage for {}", kind.info().resource)))
    }

    /// Every resource's storage.
    pub fn all(&self) -> impl Iterator<Item = &Storage> {
        self.0.iter().map(|(_, s)| s)
    }
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(k, _)| k)).finish()
    }
}

/// Everything the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The storage of every served resource.
    pub stores: Stores,
    /// Who is calling.
    pub authenticator: Arc<dyn auth::Authenticator>,
    /// Whether they may.
    pub authorizer: Arc<dyn auth::Authorizer>,
    /// The OpenAPI documents, prepared once.
    pub openapi: Arc<openapi::Documents>,
    /// Where `/snapshot` takes snapshots from: the members of an EtcdCluster, reached by code the
    /// binary injects (the controller's member connections). `None`: 503 on `/snapshot`.
    pub snapshots: Option<Arc<dyn snapshot::SnapshotSource>>,
    /// Serve mode: creates are refused in missing or terminating namespaces, read from
    /// kube-apiserver. `None` in local mode (any DNS-1123 label is a namespace).
    pub namespaces: Option<Arc<dyn admission::CreateAdmission>>,
    /// The process's metrics registry, served at `/metrics` (404 there when `None`).
    pub metrics: Option<Arc<prometheus_client::registry::Registry>>,
    /// What new objects get at create for the controller of this deployment, in the namespaces
    /// it manages: its finalizer and initial status. Empty when no controller of this deployment
    /// manages them (a finalizer nobody removes would hold every delete).
    pub controller_init: Arc<[crate::registry::controller_init::ControllerInit]>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// Paths answered without credentials (kubelet probes), as kube-apiserver always allows them.
const ALWAYS_ALLOWED: [&str; 3] = ["/healthz", "/livez", "/readyz"];

/// The whole API as an axum router.
pub fn router(state: AppState) -> Router {
    router_with(state, Router::new())
}

/// [`router`] plus `extra` routes behind the same authentication and authorization (tests use it
/// to observe what a handler receives).
pub fn router_with(state: AppState, extra: Router<AppState>) -> Router {
    extra
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/version", get(version))
        .route("/metrics", get(metrics::serve))
        .route("/apis", get(apis))
        .route("/api", get(core_api))
        .route("/api/v1", get(core_v1))
        .route(
            &format!("/apis/{}", etcd_operator_api::GROUP),
            get(|| async { json_response(&discovery::api_group()) }),
        )
        .route(
            &format!("/apis/{}/{{version}}", etcd_operator_api::GROUP),
            get(group_version),
        )
        .route("/openapi/v2", get(openapi::v2))
        .route("/openapi/v3", get(openapi::v3_root))
        .route(
            &format!("/openapi/v3/apis/{}/{{version}}", etcd_operator_api::GROUP),
            get(openapi::v3_group_version),
        )
        .fallback(resource::handle)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            authenticate_and_authorize,
        ))
        .with_state(state)
}

/// Authentication, then authorization, for every path but the health checks. Identity headers
/// a client sent are never passed on: the handler sees only the [`auth::UserInfo`] extension.
async fn authenticate_and_authorize(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if ALWAYS_ALLOWED.contains(&path.as_str()) {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let user = match state.authenticator.authenticate(&mut parts).await {
        Ok(Some(user)) => user,
        Ok(None) => return ApiError::unauthorized().into_response(),
        Err(e) => return e.into_response(),
    };
    let info = request_info::RequestInfo::parse(&parts.method, &path, parts.uri.query());
    if let Err(e) = state.authorizer.authorize(&user, &info).await {
        return e.into_response();
    }
    parts.extensions.insert(user);
    req = Request::from_parts(parts, body);
    next.run(req).await
}

async fn readyz(State(state): State<AppState>) -> Response {
    if let Some(reason) = state.authenticator.not_ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("[-]authentication failed: {reason}"),
        )
            .into_response();
    }
    let mut ready = true;
    for storage in state.stores.all() {
        ready &= storage.ready().await;
    }
    if ready {
        (StatusCode::OK, "ok").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "[-]etcd failed: backing etcd not reachable or cache not primed",
        )
            .into_response()
    }
}

async fn version() -> Response {
    json_response(&serde_json::json!({
        "major": "1",
        "minor": "35",
        "gitVersion": concat!("v", env!("CARGO_PKG_VERSION")),
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        "goVersion": "",
        "compiler": "rustc",
    }))
}

async fn apis(headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let Some(version) = discovery::aggregated_version(accept) else {
        return json_response(&discovery::api_group_list());
    };
    let body = discovery::aggregated_in(version).to_string();
    let etag = discovery::etag(body.as_bytes());
    let mut response =
        if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
            StatusCode::NOT_MODIFIED.into_response()
        } else {
            (StatusCode::OK, body).into_response()
        };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(version.content_type()),
    );
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    response
}

/// `GET /api`: the core group where Events are served (local mode), else 404.
async fn core_api(State(state): State<AppState>) -> Response {
    if !state.stores.serves(Kind::EVENT) {
        return ApiError::path_not_found("/api").into_response();
    }
    json_response(&discovery::core_api_versions())
}

/// `GET /api/v1`: see [`core_api`].
async fn core_v1(State(state): State<AppState>) -> Response {
    if !state.stores.serves(Kind::EVENT) {
        return ApiError::path_not_found("/api/v1").into_response();
    }
    json_response(&discovery::core_resource_list())
}

async fn group_version(axum::extract::Path(version): axum::extract::Path<String>) -> Response {
    if !etcd_operator_api::SERVED_VERSIONS.contains(&version.as_str()) {
        return ApiError::path_not_found(&format!("/apis/{}/{version}", etcd_operator_api::GROUP))
            .into_response();
    }
    json_response(&discovery::api_resource_list(&version))
}

/// A 200 JSON response.
pub fn json_response(value: &serde_json::Value) -> Response {
    let mut response = (StatusCode::OK, value.to_string()).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
