//! `ApiError`: the single exit for failures, as a `metav1.Status` with `kind` and `apiVersion`,
//! the HTTP code, reason and causes kubectl shows. Used by the registry (admission) and the HTTP
//! layer alike; [`crate::http::error`] turns it into a response.

use http::StatusCode;
use serde_json::{Value, json};

/// One cause of a failure (`details.causes[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// Machine-readable reason, e.g. `FieldValueInvalid`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// Field path, e.g. `spec.replicas`.
    pub field: String,
}

/// A failed API request.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: StatusCode,
    /// `Status.reason`, e.g. `NotFound`.
    pub reason: &'static str,
    /// `Status.message`.
    pub message: String,
    /// `Status.details`, when there are any.
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
    /// `Status.metadata.continue`: for an expired continue token, a token that continues the
    /// list inconsistently (at the latest revision), as kube-apiserver sends it.
    pub continue_token: Option<String>,
}

pub use etcd_operator_api::report::chain;

/// The qualified resource of an error: `etcdclusters.etcd.operator.dev`, or `events` for a
/// resource of the core group.
pub fn qualified_resource(resource: &str) -> String {
    if CORE_RESOURCES.contains(&resource) {
        resource.to_owned()
    } else {
        format!("{resource}.{}", etcd_operator_api::GROUP)
    }
}

/// The served resources of the core group, named without a group in errors (kube-apiserver:
/// `events "x" not found`). The resource table checks that it lists each of its core kinds.
pub const CORE_RESOURCES: &[&str] = &["events"];

impl ApiError {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
            continue_token: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// 404 for a missing object.
    pub fn not_found(resource: &str, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", qualified_resource(resource)),
        )
        .with_details(json!({"name": name, "group": etcd_operator_api::GROUP, "kind": resource}))
    }

    /// 404 for a path that is not served.
    pub fn path_not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 when creating an object that exists.
    pub fn already_exists(resource: &str, name: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified_resource(resource)),
        )
        .with_details(json!({"name": name, "group": etcd_operator_api::GROUP, "kind": resource}))
    }

    /// 409 when the client's resourceVersion (or another precondition) is stale.
    pub fn conflict(resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified_resource(resource)
            ),
        )
        .with_details(json!({"name": name, "group": etcd_operator_api::GROUP, "kind": resource}))
    }

    /// 409 of a server-side apply that would take fields other managers own; the causes are
    /// `FieldManagerConflict`s (k8s.io/apimachinery `NewApplyConflict`, which names no object).
    pub fn apply_conflict(_resource: &str, _name: &str, message: String, causes: Vec<Cause>) -> Self {
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        Self::new(StatusCode::CONFLICT, "Conflict", message).with_details(json!({"causes": causes}))
    }

    /// The standard optimistic-concurrency conflict.
    pub fn modified(resource: &str, name: &str) -> Self {
        Self::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with every cause, about an object of this API group.
    pub fn invalid(kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        Self::invalid_in(etcd_operator_api::GROUP, kind, name, causes)
    }

    /// 422 about request options (`ListOptions`, `CreateOptions`, `DeleteOptions`, ...), which
    /// kube-apiserver reports as kinds of `meta.k8s.io` with an empty name.
    pub fn invalid_options(kind: &str, causes: Vec<Cause>) -> Self {
        Self::invalid_in("meta.k8s.io", kind, "", causes)
    }

    /// 422 with every cause: `<kind>.<group> "<name>" is invalid: <causes>`.
    pub fn invalid_in(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let summary = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect::<Vec<_>>();
        let summary = match summary.len() {
            1 => summary.join(""),
            _ => format!("[{}]", summary.join(", ")),
        };
        let causes_json: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            match group {
                // The core group: `Event "x" is invalid`, as kube-apiserver words it.
                "" => format!("{kind} \"{name}\" is invalid: {summary}"),
                _ => format!("{kind}.{group} \"{name}\" is invalid: {summary}"),
            },
        )
        .with_details(json!({"name": name, "group": group, "kind": kind, "causes": causes_json}))
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// 405.
    pub fn method_not_allowed(what: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({what})"),
        )
    }

    /// 406.
    pub fn not_acceptable(accept: &str) -> Self {
        Self::new(
            StatusCode::NOT_ACCEPTABLE,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: application/json, application/yaml (asked for {accept})"
            ),
        )
    }

    /// 415, naming the media types this request accepts.
    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {} (got {content_type})",
                accepted.join(", ")
            ),
        )
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// 413 for an object the backing etcd refused as larger than it stores (`etcd` is what it
    /// said). kube-apiserver answers 500 there (kubernetes issue 112152); a larger object will
    /// not fit on a retry either, so it is the client's error, as the body limit's.
    pub fn too_large_to_store(etcd: &str) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!(
                "Request entity too large: the object as stored is larger than the backing etcd accepts (its --max-request-bytes, 1.5 MiB unless set): {etcd}"
            ),
        )
    }

    /// 410 for a resourceVersion older than the retained history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, "Expired", message)
    }

    /// 410 for an expired continue token; `continue_token` (when there is one) lets the client
    /// go on with an inconsistent list, in `Status.metadata.continue`.
    pub fn expired_continue(message: impl Into<String>, continue_token: Option<String>) -> Self {
        let mut err = Self::gone(message);
        err.continue_token = continue_token.filter(|t| !t.is_empty());
        err
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
    }

    /// 403 with the standard wording.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", message)
    }

    /// 429 with Retry-After.
    pub fn too_many_requests(message: impl Into<String>, retry_after: u64) -> Self {
        let mut err = Self::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message);
        err.retry_after = Some(retry_after);
        err.details = Some(json!({"retryAfterSeconds": retry_after}));
        err
    }

    /// 504 for a request that did not finish within the server's request timeout, as
    /// kube-apiserver's timeout filter answers.
    pub fn timeout(after: std::time::Duration) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "Timeout",
            format!("Timeout: request did not complete within the allotted timeout of {after:?}"),
        )
        .with_details(json!({}))
    }

    /// 503.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", message)
    }

    /// 500; the message is logged, the client sees it too (it carries no secrets by construction).
    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        tracing::error!(%message, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(token) = &self.continue_token {
            status["metadata"]["continue"] = json!(token);
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code.as_u16(), self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
