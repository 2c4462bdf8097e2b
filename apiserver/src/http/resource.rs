//! The resource endpoints, written once for every served resource ([`Kind`]): get, list,
//! watch, create, update, patch, delete, deletecollection, the `status` subresource, and the
//! EtcdCluster-only `scale` and `snapshot` subresources.

use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use super::AppState;
use super::body::{self, FieldValidation, PatchType, WriteOptions};
use super::error::{ApiError, Cause};
use super::managed::{self, WriteContext};
use super::negotiate::{Output, negotiate};
use super::request_info::{RequestInfo, query_value};
use super::selectors::{FieldSelector, LabelSelector};
use super::table::{self, IncludeObject};
use crate::registry::controller_init::{self, ControllerInit};
use crate::registry::kind::Kind;
use crate::registry::strategy::{RequestObject, Write};
use crate::registry::{self, UpdateDecision};
use crate::storage::{
    GuaranteedUpdateError, ListOptions, ReadConsistency, RvMatch, Storage, StorageError, UpdateAction,
    UpdateOutcome,
};

/// What a resource request addresses, after routing.
struct Target {
    kind: Kind,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
    query: Option<String>,
    output: Output,
    /// The User-Agent's product: the field manager when the request names none.
    agent_manager: String,
    /// Serve mode's namespace lifecycle check on creates.
    namespaces: Option<std::sync::Arc<dyn super::admission::CreateAdmission>>,
    /// The finalizers new objects get (the co-located controller's).
    controller_init: std::sync::Arc<[ControllerInit]>,
}

/// Entry point for every path not routed elsewhere.
pub async fn handle(State(state): State<AppState>, req: Request) -> Response {
    match dispatch(state, req).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn dispatch(state: AppState, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().map(str::to_string);
    let info = RequestInfo::parse(&parts.method, &path, query.as_deref());
    let kind = Kind::for_resource(&info.resource);
    // A kind this server opened no storage for (Events outside local mode) is not served.
    let Some(kind) = kind.filter(|k| {
        info.is_resource_request
            && info.group == k.info().group
            && k.serves(&info.version)
            && state.stores.serves(*k)
    }) else {
        return Err(ApiError::path_not_found(&path));
    };
    if let Some(sub) = info.subresource.as_deref()
        && !kind.has_subresource(sub)
    {
        return Err(ApiError::path_not_found(&path));
    }
    let accept = parts.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if info.subresource.as_deref() == Some("snapshot") {
        return match (&parts.method, info.name.as_deref()) {
            (&Method::GET, Some(name)) if path_names_object(&info) => {
                super::snapshot::serve(
                    state.stores.get(Kind::CLUSTER)?,
                    state.snapshots.as_ref(),
                    info.namespace.as_deref(),
                    name,
                    accept,
                )
                .await
            }
            _ => Err(ApiError::method_not_allowed(&format!("{} {path}", parts.method))),
        };
    }
    let target = Target {
        kind,
        version: info.version.clone(),
        namespace: info.namespace.clone(),
        name: info.name.clone().filter(|_| path_names_object(&info)),
        subresource: info.subresource.clone(),
        query,
        output: negotiate(accept)?,
        namespaces: state.namespaces.clone(),
        controller_init: state.controller_init.clone(),
        agent_manager: managed::manager_from_user_agent(
            parts
                .headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok()),
        ),
    };
    let storage = state.stores.get(kind)?;
    match (
        &parts.method,
        target.name.is_some(),
        target.subresource.as_deref(),
    ) {
        (&Method::GET, false, None) if info.verb == "watch" => {
            super::watch::serve(storage, &target_watch(&target)?)
        }
        (&Method::GET, false, None) => list(storage, &target).await,
        (&Method::GET, true, None | Some("status")) => get(storage, &target).await,
        (&Method::GET, true, Some("scale")) => get_scale(storage, &target).await,
        (&Method::POST, false, None) => create(storage, &target, body, content_type.as_deref()).await,
        (&Method::PUT, true, sub) => update(storage, &target, sub, body, content_type.as_deref()).await,
        (&Method::PATCH, true, sub) => patch(storage, &target, sub, body, content_type.as_deref()).await,
        (&Method::DELETE, true, None) => delete(storage, &target, body).await,
        (&Method::DELETE, false, None) if target.namespace.is_some() => {
            delete_collection(storage, &target, body).await
        }
        _ => Err(ApiError::method_not_allowed(&format!("{} {path}", parts.method))),
    }
}

/// Whether the name came from the path (not from a `metadata.name` field selector).
fn path_names_object(info: &RequestInfo) -> bool {
    let after_resource = info
        .path
        .split(&format!("/{}", info.resource))
        .nth(1)
        .unwrap_or_default();
    after_resource
        .trim_matches('/')
        .split('/')
        .next()
        .is_some_and(|s| !s.is_empty())
}

fn ns_and_name(t: &Target) -> Result<(&str, &str), ApiError> {
    match (t.namespace.as_deref(), t.name.as_deref()) {
        (Some(ns), Some(name)) => Ok((ns, name)),
        _ => Err(ApiError::bad_request(
            "a namespace and a name are required for this request",
        )),
    }
}

/// Maps a storage failure of an EtcdCluster to the response kube-apiserver gives.
pub fn storage_error(e: StorageError, name: &str) -> ApiError {
    storage_error_in(Kind::CLUSTER.info().resource, e, name)
}

/// Maps a storage failure of `resource` to the response kube-apiserver gives.
pub fn storage_error_in(resource: &str, e: StorageError, name: &str) -> ApiError {
    match e {
        StorageError::NotFound { .. } => ApiError::not_found(resource, name),
        StorageError::AlreadyExists { .. } => ApiError::already_exists(resource, name),
        StorageError::PreconditionFailed {
            what,
            expected,
            actual,
            ..
        } => ApiError::conflict(
            resource,
            name,
            &format!(
                "Precondition failed: {what} in precondition: {expected}, {what} in object meta: {actual}"
            ),
        ),
        StorageError::Conflict { .. } => ApiError::modified(resource, name),
        e @ StorageError::Expired { .. } => ApiError::gone(e.to_string()),
        StorageError::ExpiredContinue {
            message,
            inconsistent_continue,
            ..
        } => ApiError::expired_continue(message, inconsistent_continue),
        StorageError::InvalidContinue { reason } => {
            ApiError::bad_request(format!("invalid continue token: {reason}"))
        }
        StorageError::InvalidOptions { reason } => ApiError::bad_request(reason),
        e @ StorageError::InvalidResourceVersion { .. } => ApiError::bad_request(e.to_string()),
        e @ StorageError::TooLargeResourceVersion { .. } => {
            let mut err = ApiError::unavailable(e.to_string());
            err.code = StatusCode::GATEWAY_TIMEOUT;
            err.reason = "Timeout";
            err
        }
        StorageError::NotReady => ApiError::too_many_requests("storage is (re)initializing", 1),
        e @ StorageError::Timeout { .. } => ApiError::unavailable(e.to_string()),
        e => match e.request_too_large() {
            Some(etcd) => ApiError::too_large_to_store(etcd),
            None => ApiError::internal(crate::error::chain(&e)),
        },
    }
}

fn update_error(resource: &str, e: GuaranteedUpdateError<ApiError>, name: &str) -> ApiError {
    match e {
        GuaranteedUpdateError::Storage(e) => storage_error_in(resource, e, name),
        GuaranteedUpdateError::Update(e) => e,
    }
}

impl Target {
    fn resource(&self) -> &'static str {
        self.kind.info().resource
    }

    /// A storage failure of this resource as a response.
    fn storage_error(&self, e: StorageError, name: &str) -> ApiError {
        storage_error_in(self.resource(), e, name)
    }

    /// A stored object in the requested version.
    fn in_version(&self, stored: Value) -> Result<Value, ApiError> {
        self.kind.in_version(stored, &self.version)
    }

    /// Serve mode: refuses a create in a missing (404) or terminating (403) namespace, as
    /// kube-apiserver's NamespaceLifecycle admission, before validation as admission runs.
    async fn admit_namespace(&self, name: &str, namespace: &str) -> Result<(), ApiError> {
        match &self.namespaces {
            Some(lifecycle) => lifecycle.admit_create(self.resource(), name, namespace).await,
            None => Ok(()),
        }
    }

    /// What the server sets on a new object after its `managedFields` are recorded (so no
    /// client owns it): the co-located controller's finalizer and initial status.
    fn prepare_create(&self, namespace: &str, stored: &mut Value) {
        controller_init::prepare_create(&self.controller_init, self.kind, namespace, stored);
    }

    /// Who writes, for `metadata.managedFields`: `fieldManager`, else the User-Agent's product.
    fn write_context(&self, opts: &WriteOptions, sub: Option<&str>) -> WriteContext {
        let manager = opts
            .field_manager
            .clone()
            .or_else(|| (!self.agent_manager.is_empty()).then(|| self.agent_manager.clone()))
            .unwrap_or_else(|| "unknown".to_string());
        WriteContext {
            kind: self.kind,
            version: self.version.clone(),
            manager,
            subresource: sub.map(str::to_string),
        }
    }
}

/// A write whose body is at least this large is admitted off the async workers (see [`offload`]).
const HEAVY_BODY_BYTES: usize = 256 * 1024;
/// A write to a stored object with at least this many metadata entries (labels, annotations,
/// finalizers, owner references) is admitted off the async workers too.
const HEAVY_META_ENTRIES: usize = 4096;

/// Whether admitting a write of `body_len` bytes to `current` (if any) is heavy enough for
/// [`offload`]: a cheap look at sizes, not a walk.
fn is_heavy(body_len: usize, current: Option<&Value>) -> bool {
    let entries = |field: &str| {
        current
            .and_then(|c| c.get("metadata"))
            .and_then(|m| m.get(field))
            .map_or(0, |v| match v {
                Value::Object(m) => m.len(),
                Value::Array(a) => a.len(),
                _ => 0,
            })
    };
    body_len >= HEAVY_BODY_BYTES
        || ["labels", "annotations", "finalizers", "ownerReferences"]
            .iter()
            .map(|f| entries(f))
            .sum::<usize>()
            >= HEAVY_META_ENTRIES
}

/// Runs the CPU-bound admission of a large object (decode, validation, managedFields, encode)
/// with tokio's `block_in_place` when `heavy` on a multi-threaded runtime: the worker hands its
/// other tasks (health checks, other requests) to a fresh thread while this one works, so a
/// few huge writes at once cannot hold every worker. Everything else runs inline (a
/// single-threaded runtime cannot hand its tasks over).
fn offload<T>(heavy: bool, f: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if heavy && multi_thread {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// Records an update's fields in the object it writes.
fn tracked(
    ctx: &WriteContext,
    name: &str,
    current: &Value,
    action: UpdateAction,
) -> Result<UpdateAction, ApiError> {
    match action {
        UpdateAction::Write(mut v) => {
            managed::track(ctx, name, Some(current), &mut v, None, false)?;
            Ok(UpdateAction::Write(v))
        }
        other => Ok(other),
    }
}

/// kube-apiserver's bound on the `Warning` headers of one response: 4 Ki characters of
/// warning text in all (`truncateAtTotalRunes`)...
const WARNINGS_TOTAL_CHARS: usize = 4 * 1024;
/// ...and, once over it, each warning cut to 256 characters (`truncateItemRunes`).
const WARNING_ITEM_CHARS: usize = 256;

/// The warnings a response carries, as kube-apiserver's warning recorder keeps them: each once,
/// in order; all of them when their text fits in [`WARNINGS_TOTAL_CHARS`], else each cut to
/// [`WARNING_ITEM_CHARS`] and as many as fit. An object with many unknown fields gets a few KiB
/// of headers, not one header per field (clients refuse responses with too many headers).
fn bounded_warnings(warnings: &[String]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&String> = warnings.iter().filter(|w| seen.insert(w.as_str())).collect();
    let mut total = 0usize;
    for w in &unique {
        total += w.chars().count();
        if total > WARNINGS_TOTAL_CHARS {
            break;
        }
    }
    if total <= WARNINGS_TOTAL_CHARS {
        return unique.into_iter().cloned().collect();
    }
    let mut written = 0;
    let mut kept = Vec::new();
    for w in unique {
        if written >= WARNINGS_TOTAL_CHARS {
            break;
        }
        let cut: String = w.chars().take(WARNING_ITEM_CHARS).collect();
        let len = cut.chars().count();
        if written + len <= WARNINGS_TOTAL_CHARS {
            written += len;
            kept.push(cut);
        }
    }
    kept
}

fn add_warnings(response: &mut Response, warnings: &[String]) {
    for w in &bounded_warnings(warnings) {
        let text = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
}

/// One object, in the negotiated representation.
fn object_response(
    code: StatusCode,
    obj: &Value,
    t: &Target,
    warnings: &[String],
) -> Result<Response, ApiError> {
    let (body, content_type) = match t.output {
        Output::Json => (obj.to_string(), "application/json"),
        Output::Yaml => (
            serde_yaml::to_string(obj).map_err(|e| ApiError::internal(format!("encode YAML: {e}")))?,
            "application/yaml",
        ),
        Output::Table(v) => {
            let include = IncludeObject::parse(query_value(t.query.as_deref(), "includeObject").as_deref())
                .map_err(ApiError::from)?;
            let rv = obj["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (
                table::table_of(t.kind, v, std::slice::from_ref(obj), &rv, None, include, true).to_string(),
                "application/json",
            )
        }
        Output::Metadata => (table::partial_metadata(obj).to_string(), "application/json"),
    };
    let mut response = (code, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    add_warnings(&mut response, warnings);
    Ok(response)
}

async fn get(storage: &Storage, t: &Target) -> Result<Response, ApiError> {
    let (ns, name) = ns_and_name(t)?;
    let consistency = match query_value(t.query.as_deref(), "resourceVersion").as_deref() {
        Some("0") => ReadConsistency::Any,
        // Lists and watches refuse such a value in storage; a get must not ignore it either.
        Some(rv) if !rv.is_empty() && rv.parse::<u64>().is_err() => {
            return Err(t.storage_error(
                StorageError::InvalidResourceVersion { value: rv.to_owned() },
                name,
            ));
        }
        _ => ReadConsistency::Consistent,
    };
    let stored = storage
        .get_raw(ns, name, consistency)
        .await
        .map_err(|e| t.storage_error(e, name))?;
    let stored = stored.ok_or_else(|| ApiError::not_found(t.resource(), name))?;
    if serves_stored_json(t) && stored.servable() {
        let body = stored.to_json().map_err(|e| t.storage_error(e, name))?;
        return Ok(json_bytes_response(axum::body::Body::from(body)));
    }
    let stored = stored.decode().map_err(|e| t.storage_error(e, name))?;
    object_response(StatusCode::OK, &t.in_version(stored)?, t, &[])
}

/// Whether the response is the stored JSON itself (storage version, JSON): objects are then
/// served from their stored bytes, without a decode/encode round trip.
fn serves_stored_json(t: &Target) -> bool {
    t.output == Output::Json && t.version == t.kind.info().storage_version
}

fn json_bytes_response(body: axum::body::Body) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A list of stored objects as JSON, streamed in chunks as the client reads it (the whole list
/// is never one document in memory).
fn stream_stored_list(
    result: crate::storage::RawListResult,
    kind: Kind,
    version: &str,
) -> Result<Response, ApiError> {
    let list_kind = kind.info().list_kind;
    let mut meta = serde_json::Map::new();
    meta.insert(
        "resourceVersion".into(),
        json!(result.resource_version.to_string()),
    );
    if let Some(c) = &result.continue_token {
        meta.insert("continue".into(), json!(c));
    }
    if let Some(n) = result.remaining_item_count {
        meta.insert("remainingItemCount".into(), json!(n));
    }
    let head = json!({"kind": list_kind, "apiVersion": kind.api_version(version), "metadata": meta});
    let mut head = serde_json::to_vec(&head).map_err(|e| ApiError::internal(format!("encode list: {e}")))?;
    // `{...}` → `{...,"items":[`: the items follow, then `]}`.
    head.pop();
    head.extend_from_slice(b",\"items\":[");
    let chunks = crate::storage::JsonListChunks::new(head, result.items, b"]}".to_vec());
    let stream = futures::stream::iter(chunks.map(Ok::<_, std::convert::Infallible>));
    Ok(json_bytes_response(axum::body::Body::from_stream(stream)))
}

async fn get_scale(storage: &Storage, t: &Target) -> Result<Response, ApiError> {
    let (ns, name) = ns_and_name(t)?;
    let stored = storage
        .get(ns, name, ReadConsistency::Consistent)
        .await
        .map_err(|e| t.storage_error(e, name))?;
    let hub = registry::from_storage(stored.ok_or_else(|| ApiError::not_found(t.resource(), name))?)?;
    let scale = registry::scale_of(&hub);
    let json_target = Target {
        output: Output::Json,
        ..clone_target(t)
    };
    object_response(
        StatusCode::OK,
        &scale,
        if t.output == Output::Yaml { t } else { &json_target },
        &[],
    )
}

fn clone_target(t: &Target) -> Target {
    Target {
        kind: t.kind,
        version: t.version.clone(),
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        subresource: t.subresource.clone(),
        query: t.query.clone(),
        output: t.output,
        agent_manager: t.agent_manager.clone(),
        namespaces: t.namespaces.clone(),
        controller_init: t.controller_init.clone(),
    }
}

/// Label and field selectors of a list or watch; a bad one is a 400.
#[derive(Debug, Clone)]
pub struct Selectors {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selectors {
    fn parse(query: Option<&str>, kind: Kind) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(&query_value(query, "labelSelector").unwrap_or_default())
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
        let fields = FieldSelector::parse_with(
            &query_value(query, "fieldSelector").unwrap_or_default(),
            kind.info().field_selectors,
        )
        .map_err(ApiError::from)?;
        Ok(Self { labels, fields })
    }

    /// Whether every object matches (neither selector says anything).
    pub fn select_all(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether a stored object matches both selectors.
    pub fn matches(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        if !self.fields.matches_object(obj) {
            return false;
        }
        if self.labels.is_empty() {
            return true;
        }
        let labels: BTreeMap<String, String> = meta["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        self.labels.matches(&labels)
    }
}

/// kube-apiserver's `ValidateListOptions` (apimachinery `internalversion/validation`): every
/// forbidden combination of list or watch options, as causes of one 422 about `ListOptions`.
fn list_option_causes(q: Option<&str>, watch: bool) -> Vec<Cause> {
    let forbidden = |field: &str, detail: &str| Cause {
        reason: "FieldValueForbidden".into(),
        message: format!("Forbidden: {detail}"),
        field: field.into(),
    };
    let not_supported = |field: &str, value: &str, supported: &[&str]| Cause {
        reason: "FieldValueNotSupported".into(),
        message: format!(
            "Unsupported value: {value:?}: supported values: {}",
            supported
                .iter()
                .map(|v| format!("{v:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        field: field.into(),
    };
    let rv = query_value(q, "resourceVersion").unwrap_or_default();
    let rv_match = query_value(q, "resourceVersionMatch").unwrap_or_default();
    let has_continue = query_value(q, "continue").is_some_and(|c| !c.is_empty());
    let send_initial_events = query_value(q, "sendInitialEvents");
    let mut causes = Vec::new();
    if watch {
        if send_initial_events.is_some() {
            if rv_match != "NotOlderThan" {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            // The initial-events-end marker is a bookmark: without bookmarks the client would
            // never learn that the initial state is complete.
            if !query_value(q, "allowWatchBookmarks").is_some_and(|v| v == "true" || v == "1") {
                causes.push(forbidden(
                    "allowWatchBookmarks",
                    "sendInitialEvents requires setting allowWatchBookmarks to true",
                ));
            }
        }
        if !rv_match.is_empty() {
            if send_initial_events.is_none() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if rv_match != "NotOlderThan" {
                causes.push(not_supported(
                    "resourceVersionMatch",
                    &rv_match,
                    &["NotOlderThan"],
                ));
            }
            if has_continue {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
        return causes;
    }
    if !rv_match.is_empty() {
        if rv.is_empty() {
            causes.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if has_continue {
            causes.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if rv_match != "Exact" && rv_match != "NotOlderThan" {
            causes.push(not_supported(
                "resourceVersionMatch",
                &rv_match,
                &["Exact", "NotOlderThan", ""],
            ));
        }
        if rv_match == "Exact" && rv == "0" {
            causes.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if send_initial_events.is_some() {
        causes.push(forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    causes
}

fn check_list_options(q: Option<&str>, watch: bool) -> Result<(), ApiError> {
    let causes = list_option_causes(q, watch);
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_options("ListOptions", causes))
    }
}

async fn list(storage: &Storage, t: &Target) -> Result<Response, ApiError> {
    let q = t.query.as_deref();
    let selectors = Selectors::parse(q, t.kind)?;
    check_list_options(q, false)?;
    let resource_version = query_value(q, "resourceVersion").filter(|s| !s.is_empty());
    let rv_match = match query_value(q, "resourceVersionMatch").as_deref() {
        Some("Exact") => Some(RvMatch::Exact),
        Some("NotOlderThan") => Some(RvMatch::NotOlderThan),
        _ => None,
    };
    let continue_token = query_value(q, "continue").filter(|s| !s.is_empty());
    let limit = match query_value(q, "limit").filter(|s| !s.is_empty()) {
        Some(l) => Some(
            l.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("limit: invalid value {l:?}")))?,
        ),
        None => None,
    }
    .filter(|l| *l > 0);
    let opts = ListOptions {
        namespace: t.namespace.clone(),
        resource_version,
        resource_version_match: rv_match,
        limit,
        continue_token,
    };
    let result = storage
        .list_raw(&opts)
        .await
        .map_err(|e| t.storage_error(e, ""))?;
    if serves_stored_json(t) && selectors.select_all() && result.servable() {
        return stream_stored_list(result, t.kind, &t.version);
    }
    if t.output != Output::Yaml {
        return encode_list(result, &selectors, t);
    }
    // YAML (no client asks a server for a YAML list but curl): the whole list as one value.
    let result = result.decode().map_err(|e| t.storage_error(e, ""))?;
    let mut items = Vec::with_capacity(result.items.len());
    for obj in result.items {
        if selectors.matches(&obj) {
            items.push(t.in_version(obj)?);
        }
    }
    let selecting = !selectors.select_all();
    let mut list = json!({
        "kind": t.kind.info().list_kind, "apiVersion": t.kind.api_version(&t.version),
        "metadata": {"resourceVersion": result.resource_version.to_string()},
        "items": items,
    });
    if let Some(c) = &result.continue_token {
        list["metadata"]["continue"] = json!(c);
    }
    if let (Some(n), false) = (result.remaining_item_count, selecting) {
        list["metadata"]["remainingItemCount"] = json!(n);
    }
    object_response(StatusCode::OK, &list, t, &[])
}

/// A list in JSON (a list of the kind, a `PartialObjectMetadataList` or a `Table`), encoded one
/// item at a time: each stored object is decoded, selected, converted, projected and written out
/// before the next is decoded. Hand-written because serde has no streaming form of a
/// `serde_json::Value` list; decoding every item first held them all at once (a metadata list of
/// 10,000 objects took the server from 130 to 590 MB for a second, and the allocator's metadata
/// for that peak stayed: docs/performance.md, change 16). The body is still built whole (not
/// streamed as [`stream_stored_list`] does), so a decode or conversion failure is an error
/// response, never a truncated list.
fn encode_list(
    result: crate::storage::RawListResult,
    selectors: &Selectors,
    t: &Target,
) -> Result<Response, ApiError> {
    let q = t.query.as_deref();
    let rv = result.resource_version.to_string();
    let selecting = !selectors.select_all();
    let include = match t.output {
        Output::Table(_) => {
            IncludeObject::parse(query_value(q, "includeObject").as_deref()).map_err(ApiError::from)?
        }
        _ => IncludeObject::None,
    };
    let (mut head, items_key) = match t.output {
        Output::Table(v) => {
            let mut head = table::table_of(
                t.kind,
                v,
                &[],
                &rv,
                result.continue_token.as_deref(),
                include,
                true,
            );
            if let Some(map) = head.as_object_mut() {
                map.remove("rows");
            }
            (head, "rows")
        }
        Output::Metadata => (
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv}}),
            "items",
        ),
        Output::Json | Output::Yaml => {
            // (YAML never comes here: `list` encodes it whole.)
            let mut head = json!({
                "kind": t.kind.info().list_kind, "apiVersion": t.kind.api_version(&t.version),
                "metadata": {"resourceVersion": rv},
            });
            if let (Some(n), false) = (result.remaining_item_count, selecting) {
                head["metadata"]["remainingItemCount"] = json!(n);
            }
            (head, "items")
        }
    };
    if !matches!(t.output, Output::Table(_))
        && let Some(c) = &result.continue_token
    {
        head["metadata"]["continue"] = json!(c);
    }
    let encode_error = |e: serde_json::Error| ApiError::internal(format!("encode list: {e}"));
    let mut body = serde_json::to_vec(&head).map_err(encode_error)?;
    // `{...}` → `{...,"<items>":[`, the items, then `]}`.
    body.pop();
    body.extend_from_slice(b",\"");
    body.extend_from_slice(items_key.as_bytes());
    body.extend_from_slice(b"\":[");
    let now = jiff::Timestamp::now();
    let mut first = true;
    for raw in &result.items {
        let obj = raw.decode().map_err(|e| t.storage_error(e, ""))?;
        if !selectors.matches(&obj) {
            continue;
        }
        let obj = t.in_version(obj)?;
        let item = match t.output {
            Output::Table(_) => table::row(t.kind, &obj, now, include),
            Output::Metadata => table::partial_metadata(&obj),
            Output::Json | Output::Yaml => obj,
        };
        if !first {
            body.push(b',');
        }
        first = false;
        serde_json::to_writer(&mut body, &item).map_err(encode_error)?;
    }
    body.extend_from_slice(b"]}");
    Ok(json_bytes_response(axum::body::Body::from(body)))
}

/// Unknown fields of a request object (their paths), handled per `fieldValidation`: warnings,
/// or a 400.
fn check_unknown_fields(unknown: &[String], mode: FieldValidation) -> Result<Vec<String>, ApiError> {
    match mode {
        FieldValidation::Ignore => Ok(Vec::new()),
        FieldValidation::Warn => Ok(unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect()),
        FieldValidation::Strict if unknown.is_empty() => Ok(Vec::new()),
        FieldValidation::Strict => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            unknown
                .iter()
                .map(|f| format!("unknown field \"{f}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn decode_request(
    kind: Kind,
    value: Value,
    version: &str,
    mode: FieldValidation,
) -> Result<(RequestObject, Vec<String>), ApiError> {
    // One pass: the typed object, and what it does not keep of the body.
    let (versioned, findings) = kind.decode(&value, version)?;
    kind.check_types(&value, &findings)?;
    let warnings = check_unknown_fields(&findings.unknown, mode)?;
    Ok((versioned, warnings))
}

async fn create(
    storage: &Storage,
    t: &Target,
    body: axum::body::Body,
    content_type: Option<&str>,
) -> Result<Response, ApiError> {
    let namespace = t
        .namespace
        .as_deref()
        .ok_or_else(|| ApiError::method_not_allowed("create without a namespace"))?;
    let opts = WriteOptions::parse(t.query.as_deref(), "CreateOptions")?;
    let bytes = body::read(body).await?;
    let heavy = is_heavy(bytes.len(), None);
    let value = offload(heavy, || body::decode_object(&bytes, content_type))?;
    t.admit_namespace(
        value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        namespace,
    )
    .await?;
    let (stored, name, warnings) = offload(heavy, || {
        let (versioned, mut warnings) = decode_request(t.kind, value, &t.version, opts.field_validation)?;
        let (mut stored, name, admitted_warnings) = t.kind.create(versioned, namespace)?;
        warnings.extend(admitted_warnings);
        managed::track(
            &t.write_context(&opts, None),
            &name,
            None,
            &mut stored,
            None,
            false,
        )?;
        t.prepare_create(namespace, &mut stored);
        Ok::<_, ApiError>((stored, name, warnings))
    })?;
    let result = if opts.dry_run {
        // As kube-apiserver's dry-run storage: everything but the write, including the check
        // that the name is free.
        let existing = storage
            .get(namespace, &name, ReadConsistency::Consistent)
            .await
            .map_err(|e| t.storage_error(e, &name))?;
        if existing.is_some() {
            return Err(ApiError::already_exists(t.resource(), &name));
        }
        stored
    } else {
        let created = storage
            .create_raw(namespace, &name, stored)
            .await
            .map_err(|e| t.storage_error(e, &name))?;
        // In the storage version as JSON the answer is the bytes written, as a get of the
        // object answers: the object is not encoded a second time.
        if serves_stored_json(t) && created.servable() {
            let body = created.to_json().map_err(|e| t.storage_error(e, &name))?;
            let mut response = json_bytes_response(axum::body::Body::from(body));
            *response.status_mut() = StatusCode::CREATED;
            add_warnings(&mut response, &warnings);
            return Ok(response);
        }
        created.decode().map_err(|e| t.storage_error(e, &name))?
    };
    offload(heavy, || {
        object_response(StatusCode::CREATED, &t.in_version(result)?, t, &warnings)
    })
}

/// Runs an update closure: against storage (CAS, retried), or once on the current object for
/// `dryRun`. Returns the resulting object.
async fn run_update<F>(
    storage: &Storage,
    resource: &str,
    ns: &str,
    name: &str,
    dry_run: bool,
    mut f: F,
) -> Result<Value, ApiError>
where
    F: FnMut(Value) -> Result<UpdateAction, ApiError>,
{
    if dry_run {
        let current = storage
            .get(ns, name, ReadConsistency::Consistent)
            .await
            .map_err(|e| storage_error_in(resource, e, name))?;
        let current = current.ok_or_else(|| ApiError::not_found(resource, name))?;
        let rv = current["metadata"]["resourceVersion"].clone();
        return match f(current.clone())? {
            UpdateAction::Write(mut v) => {
                v["metadata"]["resourceVersion"] = rv;
                Ok(v)
            }
            UpdateAction::Noop | UpdateAction::Delete => Ok(current),
        };
    }
    match storage
        .guaranteed_update(ns, name, f)
        .await
        .map_err(|e| update_error(resource, e, name))?
    {
        UpdateOutcome::Updated(v) | UpdateOutcome::Unchanged(v) | UpdateOutcome::Deleted(v) => Ok(v),
    }
}

fn decision_to_action(
    decision: UpdateDecision<etcd_operator_api::v1alpha2::EtcdCluster>,
    warnings: &mut Vec<String>,
) -> Result<UpdateAction, ApiError> {
    match decision {
        UpdateDecision::Store(admitted) => {
            warnings.extend(admitted.warnings);
            Ok(UpdateAction::Write(registry::to_storage(admitted.object)?))
        }
        UpdateDecision::Delete => Ok(UpdateAction::Delete),
    }
}

fn write_to_action(write: Write, warnings: &mut Vec<String>) -> UpdateAction {
    match write {
        Write::Store(value, w) => {
            warnings.extend(w);
            UpdateAction::Write(value)
        }
        Write::Delete => UpdateAction::Delete,
    }
}

async fn update(
    storage: &Storage,
    t: &Target,
    sub: Option<&str>,
    body: axum::body::Body,
    content_type: Option<&str>,
) -> Result<Response, ApiError> {
    let (ns, name) = ns_and_name(t)?;
    let opts = WriteOptions::parse(t.query.as_deref(), "UpdateOptions")?;
    let bytes = body::read(body).await?;
    let value = offload(is_heavy(bytes.len(), None), || {
        body::decode_object(&bytes, content_type)
    })?;
    let ctx = t.write_context(&opts, sub);
    if sub == Some("scale") {
        let mut warnings = Vec::new();
        let result = run_update(storage, t.resource(), ns, name, opts.dry_run, |current| {
            let old = registry::from_storage(current.clone())?;
            let action = decision_to_action(registry::apply_scale(&value, &old, name)?, &mut warnings)?;
            tracked(&ctx, name, &current, action)
        })
        .await?;
        let scale = registry::scale_of(&registry::from_storage(result)?);
        return object_response(
            StatusCode::OK,
            &scale,
            &Target {
                output: Output::Json,
                ..clone_target(t)
            },
            &warnings,
        );
    }
    let (versioned, base_warnings) = offload(is_heavy(bytes.len(), None), || {
        decode_request(t.kind, value, &t.version, opts.field_validation)
    })?;
    let mut warnings = Vec::new();
    let result = run_update(storage, t.resource(), ns, name, opts.dry_run, |current| {
        offload(is_heavy(bytes.len(), Some(&current)), || {
            warnings = base_warnings.clone();
            let action = if sub == Some("status") {
                UpdateAction::Write(t.kind.update_status(&versioned, current.clone(), name, true)?)
            } else {
                write_to_action(
                    t.kind.update(&versioned, current.clone(), name, ns, true)?,
                    &mut warnings,
                )
            };
            tracked(&ctx, name, &current, action)
        })
    })
    .await?;
    let heavy = is_heavy(bytes.len(), Some(&result));
    offload(heavy, move || {
        object_response(StatusCode::OK, &t.in_version(result)?, t, &warnings)
    })
}

async fn patch(
    storage: &Storage,
    t: &Target,
    sub: Option<&str>,
    body: axum::body::Body,
    content_type: Option<&str>,
) -> Result<Response, ApiError> {
    let (ns, name) = ns_and_name(t)?;
    let patch_type = body::patch_type(content_type)?;
    let opts = WriteOptions::parse(t.query.as_deref(), "PatchOptions")?;
    body::check_patch_options(&opts, patch_type)?;
    let bytes = body::read(body).await?;
    let ctx = t.write_context(&opts, sub);
    if patch_type == PatchType::Apply {
        return apply(storage, t, &ctx, &opts, &bytes).await;
    }
    let mut warnings = Vec::new();
    let result = run_update(storage, t.resource(), ns, name, opts.dry_run, |current| {
        offload(is_heavy(bytes.len(), Some(&current)), || {
            warnings.clear();
            if sub == Some("scale") {
                let old = registry::from_storage(current.clone())?;
                let patched = body::apply_patch(&registry::scale_of(&old), name, &bytes, patch_type)?;
                let action = decision_to_action(registry::apply_scale(&patched, &old, name)?, &mut warnings)?;
                return tracked(&ctx, name, &current, action);
            }
            let original = t.in_version(current.clone())?;
            let patched = body::apply_patch(&original, name, &bytes, patch_type)?;
            let (versioned, unknown) = decode_request(t.kind, patched, &t.version, opts.field_validation)?;
            warnings.extend(unknown);
            let action = if sub == Some("status") {
                UpdateAction::Write(t.kind.update_status(&versioned, current.clone(), name, false)?)
            } else {
                write_to_action(
                    t.kind.update(&versioned, current.clone(), name, ns, false)?,
                    &mut warnings,
                )
            };
            tracked(&ctx, name, &current, action)
        })
    })
    .await?;
    if sub == Some("scale") {
        let scale = registry::scale_of(&registry::from_storage(result)?);
        return object_response(
            StatusCode::OK,
            &scale,
            &Target {
                output: Output::Json,
                ..clone_target(t)
            },
            &warnings,
        );
    }
    let heavy = is_heavy(bytes.len(), Some(&result));
    offload(heavy, move || {
        object_response(StatusCode::OK, &t.in_version(result)?, t, &warnings)
    })
}

/// Server-side apply (`application/apply-patch+yaml`) of the main resource or `/status`:
/// creates the object when it does not exist (201), else merges the applied configuration into
/// it, drops the fields the manager stopped applying, and refuses with 409 to take fields
/// other managers own unless `force=true`.
async fn apply(
    storage: &Storage,
    t: &Target,
    ctx: &WriteContext,
    opts: &WriteOptions,
    bytes: &[u8],
) -> Result<Response, ApiError> {
    let (ns, name) = ns_and_name(t)?;
    if ctx.subresource.as_deref() == Some("scale") {
        return Err(ApiError::unsupported_media_type(
            "application/apply-patch+yaml",
            &body::PATCH_MEDIA_TYPES[..3],
        ));
    }
    let applied = offload(is_heavy(bytes.len(), None), || managed::parse_applied(bytes, ctx))?;
    let force = opts.force == Some(true);
    let existing = storage
        .get(ns, name, ReadConsistency::Consistent)
        .await
        .map_err(|e| t.storage_error(e, name))?;
    if existing.is_none() {
        if ctx.subresource.is_some() {
            return Err(ApiError::not_found(t.resource(), name));
        }
        tracing::debug!(manager = %ctx.manager, name, "apply creates the object");
        let mut obj = applied.clone();
        match obj.pointer("/metadata/name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            _ => {
                if !obj.get("metadata").is_some_and(Value::is_object) {
                    obj["metadata"] = json!({});
                }
                obj["metadata"]["name"] = json!(name);
            }
        }
        t.admit_namespace(name, ns).await?;
        let heavy = is_heavy(bytes.len(), None);
        let (stored, name, warnings) = offload(heavy, || {
            let applied_set = crate::registry::fieldset::fields_of(&applied, ctx.scope());
            let (versioned, mut warnings) = decode_request(t.kind, obj, &t.version, opts.field_validation)?;
            let (mut stored, name, admitted) = t.kind.create(versioned, ns)?;
            warnings.extend(admitted);
            managed::track(ctx, &name, None, &mut stored, Some(&applied_set), force)?;
            t.prepare_create(ns, &mut stored);
            Ok::<_, ApiError>((stored, name, warnings))
        })?;
        let result = if opts.dry_run {
            stored
        } else {
            storage
                .create(ns, &name, stored)
                .await
                .map_err(|e| t.storage_error(e, &name))?
        };
        return offload(heavy, || {
            object_response(StatusCode::CREATED, &t.in_version(result)?, t, &warnings)
        });
    }
    let mut warnings = Vec::new();
    let result = run_update(storage, t.resource(), ns, name, opts.dry_run, |current| {
        offload(is_heavy(bytes.len(), Some(&current)), || {
            warnings.clear();
            let live = t.in_version(current.clone())?;
            let (merged, applied_set) = managed::merge_for_apply(ctx, &live, &applied);
            let (versioned, unknown) = decode_request(t.kind, merged, &t.version, opts.field_validation)?;
            warnings.extend(unknown);
            let action = if ctx.subresource.as_deref() == Some("status") {
                UpdateAction::Write(t.kind.update_status(&versioned, current.clone(), name, false)?)
            } else {
                write_to_action(
                    t.kind.update(&versioned, current.clone(), name, ns, false)?,
                    &mut warnings,
                )
            };
            match action {
                UpdateAction::Write(mut v) => {
                    managed::track(ctx, name, Some(&current), &mut v, Some(&applied_set), force)?;
                    Ok(UpdateAction::Write(v))
                }
                other => Ok(other),
            }
        })
    })
    .await?;
    let heavy = is_heavy(bytes.len(), Some(&result));
    offload(heavy, move || {
        object_response(StatusCode::OK, &t.in_version(result)?, t, &warnings)
    })
}

/// DeleteOptions, from the body when there is one, else from the query.
#[derive(Debug)]
struct DeleteOptions {
    propagation: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    dry_run: bool,
}

fn delete_options(bytes: &[u8], query: Option<&str>) -> Result<DeleteOptions, ApiError> {
    const POLICIES: [&str; 3] = ["Foreground", "Background", "Orphan"];
    let from_query = WriteOptions::parse(query, "DeleteOptions")?;
    let body: Value = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    if !body.is_null() && !body.is_object() {
        return Err(ApiError::bad_request(
            "invalid DeleteOptions: the request body must be a JSON object",
        ));
    }
    // kube-apiserver's ValidateDeleteOptions: every unsupported value, as one 422.
    let mut causes = Vec::new();
    let dry_run = match body.get("dryRun") {
        None | Some(Value::Null) => from_query.dry_run,
        Some(Value::Array(a)) if a.is_empty() => false,
        Some(Value::Array(a)) if a.iter().all(|v| v == "All") => true,
        Some(Value::Array(a)) => {
            let values: Vec<String> = a
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .collect();
            causes.push(body::dry_run_unsupported(
                &values.iter().map(String::as_str).collect::<Vec<_>>(),
            ));
            false
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid DeleteOptions: dryRun must be a list of strings, not {other}"
            )));
        }
    };
    let propagation = match body.get("propagationPolicy") {
        None | Some(Value::Null) => query_value(query, "propagationPolicy").filter(|p| !p.is_empty()),
        Some(Value::String(p)) => Some(p.clone()),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid DeleteOptions: propagationPolicy must be a string, not {other}"
            )));
        }
    };
    let orphan_dependents = match body.get("orphanDependents") {
        None | Some(Value::Null) => query_value(query, "orphanDependents").map(|v| v == "true" || v == "1"),
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid DeleteOptions: orphanDependents must be a boolean, not {other}"
            )));
        }
    };
    if let Some(p) = &propagation {
        if orphan_dependents.is_some() {
            causes.push(Cause {
                reason: "FieldValueInvalid".into(),
                message: format!(
                    "Invalid value: {p:?}: orphanDependents and deletionPropagation cannot be both set"
                ),
                field: "propagationPolicy".into(),
            });
        }
        if !POLICIES.contains(&p.as_str()) {
            causes.push(Cause {
                reason: "FieldValueNotSupported".into(),
                message: format!(
                    "Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
                ),
                field: "propagationPolicy".into(),
            });
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid_options("DeleteOptions", causes));
    }
    let propagation = propagation.or_else(|| match orphan_dependents {
        Some(true) => Some("Orphan".to_string()),
        Some(false) => Some("Background".to_string()),
        None => None,
    });
    let precondition = |key: &str| {
        body.pointer(&format!("/preconditions/{key}"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(DeleteOptions {
        propagation,
        uid: precondition("uid"),
        resource_version: precondition("resourceVersion"),
        dry_run,
    })
}

async fn delete_one(
    storage: &Storage,
    kind: Kind,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Value, ApiError> {
    let resource = kind.info().resource;
    run_update(storage, resource, ns, name, opts.dry_run, |current| {
        let meta_str = |key: &str| {
            current["metadata"][key]
                .as_str()
                .map(str::to_string)
                .unwrap_or_default()
        };
        if let Some(uid) = &opts.uid {
            let actual = meta_str("uid");
            if *uid != actual {
                return Err(ApiError::conflict(
                    resource,
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"),
                ));
            }
        }
        if let Some(rv) = &opts.resource_version {
            let actual = meta_str("resourceVersion");
            if *rv != actual {
                return Err(ApiError::conflict(
                    resource,
                    name,
                    &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"),
                ));
            }
        }
        match kind.delete(current, opts.propagation.as_deref())? {
            Some(marked) => Ok(UpdateAction::Write(marked)),
            None => Ok(UpdateAction::Delete),
        }
    })
    .await
}

async fn delete(storage: &Storage, t: &Target, body: axum::body::Body) -> Result<Response, ApiError> {
    let (ns, name) = ns_and_name(t)?;
    let bytes = body::read(body).await?;
    let opts = delete_options(&bytes, t.query.as_deref())?;
    let result = delete_one(storage, t.kind, ns, name, &opts).await?;
    object_response(StatusCode::OK, &t.in_version(result)?, t, &[])
}

async fn delete_collection(
    storage: &Storage,
    t: &Target,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let ns = t.namespace.as_deref().unwrap_or_default();
    let bytes = body::read(body).await?;
    let opts = delete_options(&bytes, t.query.as_deref())?;
    let selectors = Selectors::parse(t.query.as_deref(), t.kind)?;
    let listed = storage
        .list(&ListOptions {
            namespace: Some(ns.to_string()),
            resource_version: None,
            resource_version_match: None,
            limit: None,
            continue_token: None,
        })
        .await
        .map_err(|e| t.storage_error(e, ""))?;
    let mut items = Vec::new();
    for obj in listed.items.into_iter().filter(|o| selectors.matches(o)) {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
        match delete_one(storage, t.kind, ns, &name, &opts).await {
            Ok(v) => items.push(t.in_version(v)?),
            // Deleted meanwhile by someone else: nothing left to do for it.
            Err(e) if e.code == StatusCode::NOT_FOUND => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({
        "kind": t.kind.info().list_kind, "apiVersion": t.kind.api_version(&t.version),
        "metadata": {"resourceVersion": storage.current_revision().to_string()},
        "items": items,
    });
    object_response(
        StatusCode::OK,
        &list,
        &Target {
            output: Output::Json,
            ..clone_target(t)
        },
        &[],
    )
}

/// Parameters of a watch request.
#[derive(Debug, Clone)]
pub struct WatchTarget {
    /// The resource watched.
    pub kind: Kind,
    /// The version to encode objects in.
    pub version: String,
    /// Storage options.
    pub options: crate::storage::WatchOptions,
    /// Selectors applied to every event.
    pub selectors: Selectors,
    /// The representation of event objects.
    pub output: Output,
    /// Table row objects.
    pub include: IncludeObject,
    /// When the server ends the watch.
    pub timeout: std::time::Duration,
}

fn target_watch(t: &Target) -> Result<WatchTarget, ApiError> {
    let q = t.query.as_deref();
    let flag = |key: &str| query_value(q, key).is_some_and(|v| v == "true" || v == "1");
    let send_initial_events = flag("sendInitialEvents");
    let allow_bookmarks = flag("allowWatchBookmarks");
    check_list_options(q, true)?;
    let timeout = match query_value(q, "timeoutSeconds").filter(|s| !s.is_empty()) {
        Some(s) => std::time::Duration::from_secs(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("timeoutSeconds: invalid value {s:?}")))?,
        ),
        // kube-apiserver: MinRequestTimeout (1800 s) times a random factor in [1, 2).
        None => std::time::Duration::from_secs(1800 + rand::random_range(0..1800)),
    };
    let include = IncludeObject::parse(query_value(q, "includeObject").as_deref()).map_err(ApiError::from)?;
    Ok(WatchTarget {
        kind: t.kind,
        version: t.version.clone(),
        options: crate::storage::WatchOptions {
            namespace: t.namespace.clone(),
            resource_version: query_value(q, "resourceVersion").filter(|s| !s.is_empty()),
            send_initial_events,
            allow_bookmarks,
        },
        selectors: Selectors::parse(q, t.kind)?,
        output: t.output,
        include,
        timeout,
    })
}

/// Exposed for the watch module.
pub(crate) fn convert_for_watch(kind: Kind, stored: Value, version: &str) -> Result<Value, ApiError> {
    kind.in_version(stored, version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(causes: &[Cause]) -> Vec<&str> {
        causes.iter().map(|c| c.field.as_str()).collect()
    }

    #[test]
    fn large_bodies_and_objects_with_many_metadata_entries_are_heavy() {
        assert!(!is_heavy(2_000, None));
        assert!(is_heavy(HEAVY_BODY_BYTES, None));
        let labels: serde_json::Map<String, Value> = (0..HEAVY_META_ENTRIES / 2)
            .map(|i| (format!("k{i}"), json!("v")))
            .collect();
        let finalizers: Vec<String> = (0..HEAVY_META_ENTRIES / 2).map(|i| format!("f{i}")).collect();
        let small = json!({"metadata": {"labels": {"a": "b"}, "finalizers": ["x"]}, "spec": {}});
        assert!(!is_heavy(100, Some(&small)));
        let big = json!({"metadata": {"labels": labels, "finalizers": finalizers}});
        assert!(is_heavy(100, Some(&big)));
        assert!(!is_heavy(100, Some(&json!({"metadata": "not an object"}))));
    }

    /// Whether a task spawned next to one that runs `offload(heavy, ...)` on a one-worker
    /// runtime gets to run while the offloaded work waits for it.
    fn others_run_meanwhile(heavy: bool) -> bool {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        runtime.block_on(async move {
            let work = tokio::spawn(async move {
                // The "admission": it needs the other task to have run. A bound only on the
                // failure path: when the other task cannot run, the wait ends empty.
                offload(heavy, || {
                    rx.recv_timeout(std::time::Duration::from_secs(3)).is_ok()
                })
            });
            tokio::task::yield_now().await;
            let other = tokio::spawn(async move {
                let _ = tx.send(());
            });
            let ran = work.await.unwrap();
            other.await.unwrap();
            ran
        })
    }

    #[test]
    fn heavy_admission_leaves_the_workers_to_other_requests() {
        assert!(others_run_meanwhile(true));
        // Inline, the only worker is held: the other task runs only after the wait gave up.
        assert!(!others_run_meanwhile(false));
        // A single-threaded runtime runs it inline (it cannot hand its tasks over).
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert_eq!(runtime.block_on(async { offload(true, || 7) }), 7);
    }

    #[test]
    fn warnings_are_kept_once_each_and_bounded_as_kube_apiserver_bounds_them() {
        let few = vec!["a".to_string(), "b".into(), "a".into()];
        assert_eq!(bounded_warnings(&few), ["a", "b"]);
        // One warning per unknown field of a huge object: a few KiB of headers, the first ones.
        let many: Vec<String> = (0..40_000)
            .map(|i| format!("unknown field \"spec.u{i:06}\""))
            .collect();
        let kept = bounded_warnings(&many);
        let total: usize = kept.iter().map(|w| w.chars().count()).sum();
        assert!(total <= WARNINGS_TOTAL_CHARS, "{total}");
        assert!(total > WARNINGS_TOTAL_CHARS - 30, "{total}: as many as fit");
        assert_eq!(kept[..2], many[..2]);
        // Over the bound, each warning is cut to 256 characters (on a character boundary).
        let long = vec!["é".repeat(300), "x".repeat(5_000)];
        assert_eq!(
            bounded_warnings(&long),
            ["é".repeat(WARNING_ITEM_CHARS), "x".repeat(WARNING_ITEM_CHARS)]
        );
    }

    #[test]
    fn list_options_are_validated_as_kube_apiserver_does() {
        assert!(list_option_causes(Some("limit=5&resourceVersion=0"), false).is_empty());
        assert!(
            list_option_causes(Some("resourceVersion=5&resourceVersionMatch=NotOlderThan"), false).is_empty()
        );
        let c = list_option_causes(Some("sendInitialEvents=false"), false);
        assert_eq!(fields(&c), ["sendInitialEvents"]);
        assert_eq!(c[0].message, "Forbidden: sendInitialEvents is forbidden for list");
        assert_eq!(c[0].reason, "FieldValueForbidden");
        // Every violation at once.
        let c = list_option_causes(Some("resourceVersionMatch=Newest&continue=x"), false);
        assert_eq!(
            c.iter().map(|c| c.message.as_str()).collect::<Vec<_>>(),
            [
                "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                "Forbidden: resourceVersionMatch is forbidden when continue is provided",
                "Unsupported value: \"Newest\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
            ]
        );
        let c = list_option_causes(Some("resourceVersion=0&resourceVersionMatch=Exact"), false);
        assert_eq!(fields(&c), ["resourceVersionMatch"]);
    }

    #[test]
    fn watch_options_are_validated_as_kube_apiserver_does() {
        let ok = "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
        assert!(list_option_causes(Some(ok), true).is_empty());
        assert!(list_option_causes(Some("resourceVersion=7&allowWatchBookmarks=true"), true).is_empty());
        let c = list_option_causes(Some("sendInitialEvents=true&allowWatchBookmarks=true"), true);
        assert_eq!(fields(&c), ["resourceVersionMatch"]);
        assert_eq!(
            c[0].message,
            "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        );
        let c = list_option_causes(Some("resourceVersionMatch=NotOlderThan&resourceVersion=1"), true);
        assert_eq!(
            c[0].message,
            "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
        );
        let c = list_option_causes(
            Some("sendInitialEvents=true&resourceVersionMatch=NotOlderThan"),
            true,
        );
        assert_eq!(fields(&c), ["allowWatchBookmarks"]);
    }

    #[test]
    fn delete_options_come_from_the_body_or_the_query() {
        let o = delete_options(b"", Some("propagationPolicy=Foreground&dryRun=All")).unwrap();
        assert_eq!(o.propagation.as_deref(), Some("Foreground"));
        assert!(o.dry_run);
        let o = delete_options(
            br#"{"kind":"DeleteOptions","apiVersion":"v1","orphanDependents":true,"preconditions":{"uid":"u","resourceVersion":"5"}}"#,
            None,
        )
        .unwrap();
        assert_eq!(o.propagation.as_deref(), Some("Orphan"));
        assert_eq!(o.uid.as_deref(), Some("u"));
        assert_eq!(o.resource_version.as_deref(), Some("5"));
        let err = delete_options(br#"{"propagationPolicy":"Sideways","dryRun":["Some"]}"#, None).unwrap_err();
        assert_eq!(err.code, StatusCode::UNPROCESSABLE_ENTITY);
        let status = err.to_status();
        assert_eq!(status["details"]["kind"], "DeleteOptions");
        assert_eq!(status["details"]["causes"].as_array().map(Vec::len), Some(2));
        let err = delete_options(
            br#"{"propagationPolicy":"Orphan","orphanDependents":false}"#,
            None,
        )
        .unwrap_err();
        assert_eq!(err.code, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            delete_options(b"[1]", None).unwrap_err().code,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            delete_options(b"{", None).unwrap_err().code,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn expired_continue_keeps_the_inconsistent_token() {
        let err = storage_error(
            StorageError::ExpiredContinue {
                requested: 5,
                message: "too old".into(),
                inconsistent_continue: Some("tok".into()),
            },
            "",
        );
        assert_eq!(err.code, StatusCode::GONE);
        assert_eq!(err.to_status()["metadata"]["continue"], "tok");
        let err = storage_error(StorageError::InvalidContinue { reason: "bad".into() }, "");
        assert_eq!(err.message, "invalid continue token: bad");
    }
}
