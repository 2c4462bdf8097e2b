//! Overload protection around the whole API: bounded in-flight requests, one budget for mutating
//! requests and one for read-only ones (kube-apiserver's `--max-mutating-requests-inflight` and
//! `--max-requests-inflight`), answered with 429 `TooManyRequests` and `Retry-After: 1` when
//! exhausted, and a request timeout answered with a 504 `Timeout` Status. Long-running requests
//! (watches, snapshot streams) and the health checks are exempt from both.
//!
//! The limiting is tower's (`load_shed` over `concurrency_limit`, `timeout`); this module only
//! classifies requests ([`RequestClass::of`], pure) and maps the layers' errors to Statuses.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use http::Method;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

use super::error::ApiError;
use super::request_info::RequestInfo;

/// The `Retry-After` a refused request gets, in seconds (kube-apiserver sends 1).
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// The limits. [`OverloadOptions::default`] has kube-apiserver's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverloadOptions {
    /// Read-only requests (get, list, discovery, OpenAPI) served at once; more are refused with
    /// 429. kube-apiserver: 400.
    pub max_requests_inflight: usize,
    /// Mutating requests (create, update, patch, delete) served at once; more are refused with
    /// 429. kube-apiserver: 200.
    pub max_mutating_requests_inflight: usize,
    /// How long a request that is not long-running may take before it is answered with 504.
    /// kube-apiserver: 60 s.
    pub request_timeout: Duration,
}

impl Default for OverloadOptions {
    fn default() -> Self {
        Self {
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// Which budget a request draws on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// Watches, snapshot streams and health checks: no limit, no timeout.
    Exempt,
    /// get, list and every other GET/HEAD/OPTIONS.
    ReadOnly,
    /// create, update, patch, delete, deletecollection.
    Mutating,
}

/// Paths kubelet probes: never refused for load, so a busy server is not taken for a dead one.
const HEALTH_PATHS: [&str; 3] = ["/healthz", "/livez", "/readyz"];

/// Subresources that stream for as long as they take (kube-apiserver's long-running check).
const LONG_RUNNING_SUBRESOURCES: [&str; 1] = ["snapshot"];

impl RequestClass {
    /// Classifies a request from its method, path and query.
    pub fn of(method: &Method, path: &str, query: Option<&str>) -> Self {
        if HEALTH_PATHS.contains(&path) {
            return Self::Exempt;
        }
        let info = RequestInfo::parse(method, path, query);
        if info.verb == "watch"
            || info
                .subresource
                .as_deref()
                .is_some_and(|s| LONG_RUNNING_SUBRESOURCES.contains(&s))
        {
            return Self::Exempt;
        }
        match *method {
            Method::GET | Method::HEAD | Method::OPTIONS => Self::ReadOnly,
            _ => Self::Mutating,
        }
    }
}

/// `app` behind the limits of `options`.
pub fn limit(app: Router, options: OverloadOptions) -> Router {
    let service = Overload {
        exempt: app.clone(),
        read_only: limited(
            app.clone(),
            options.max_requests_inflight,
            options.request_timeout,
        ),
        mutating: limited(
            app,
            options.max_mutating_requests_inflight,
            options.request_timeout,
        ),
    };
    Router::new().fallback_service(service)
}

type Limited = BoxCloneSyncService<Request, Response, Infallible>;

/// One budget: at most `max` requests at once (the next is shed at once, not queued), each
/// answered within `timeout`.
fn limited(app: Router, max: usize, timeout: Duration) -> Limited {
    let service = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(move |error: BoxError| async move {
            refusal(&error, timeout).into_response()
        }))
        .load_shed()
        .concurrency_limit(max.max(1))
        .timeout(timeout)
        .service(app);
    BoxCloneSyncService::new(service)
}

/// The Status for an error of the limiting layers.
fn refusal(error: &BoxError, timeout: Duration) -> ApiError {
    if error.is::<tower::load_shed::error::Overloaded>() {
        tracing::debug!("in-flight limit reached; answering 429");
        ApiError::too_many_requests("Too many requests, please try again later.", RETRY_AFTER_SECONDS)
    } else if error.is::<tower::timeout::error::Elapsed>() {
        tracing::warn!(?timeout, "request timed out; answering 504");
        ApiError::timeout(timeout)
    } else {
        ApiError::internal(format!("serve request: {}", crate::error::chain(&**error)))
    }
}

/// Sends each request to the budget of its class.
#[derive(Clone)]
struct Overload {
    exempt: Router,
    read_only: Limited,
    mutating: Limited,
}

impl Service<Request> for Overload {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness is decided per budget when the request is called (shed, never queued).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let class = RequestClass::of(request.method(), request.uri().path(), request.uri().query());
        match class {
            RequestClass::Exempt => Box::pin(self.exempt.clone().oneshot(request)),
            RequestClass::ReadOnly => Box::pin(self.read_only.clone().oneshot(request)),
            RequestClass::Mutating => Box::pin(self.mutating.clone().oneshot(request)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::Body;
    use axum::routing::any;
    use http::StatusCode;
    use http_body_util::BodyExt;
    use tokio::sync::Semaphore;

    use super::*;

    fn class(method: Method, uri: &str) -> RequestClass {
        let uri: http::Uri = uri.parse().unwrap();
        RequestClass::of(&method, uri.path(), uri.query())
    }

    #[test]
    fn requests_are_classified_like_kube_apiserver_does() {
        let coll = "/apis/etcd.operator.dev/v1alpha2/namespaces/a/etcdclusters";
        assert_eq!(class(Method::GET, coll), RequestClass::ReadOnly);
        assert_eq!(class(Method::GET, &format!("{coll}/x")), RequestClass::ReadOnly);
        assert_eq!(class(Method::GET, "/openapi/v2"), RequestClass::ReadOnly);
        assert_eq!(class(Method::GET, "/apis"), RequestClass::ReadOnly);
        assert_eq!(
            class(Method::GET, &format!("{coll}?watch=true")),
            RequestClass::Exempt
        );
        assert_eq!(
            class(Method::GET, &format!("{coll}?watch=1")),
            RequestClass::Exempt
        );
        assert_eq!(
            class(Method::GET, &format!("{coll}?watch=false")),
            RequestClass::ReadOnly
        );
        assert_eq!(
            class(
                Method::GET,
                "/apis/etcd.operator.dev/v1alpha2/watch/namespaces/a/etcdclusters"
            ),
            RequestClass::Exempt
        );
        assert_eq!(
            class(Method::GET, &format!("{coll}/x/snapshot")),
            RequestClass::Exempt
        );
        for path in HEALTH_PATHS {
            assert_eq!(class(Method::GET, path), RequestClass::Exempt, "{path}");
        }
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert_eq!(
                class(method.clone(), &format!("{coll}/x")),
                RequestClass::Mutating,
                "{method}"
            );
        }
        assert_eq!(class(Method::DELETE, coll), RequestClass::Mutating);
        assert_eq!(
            class(Method::PUT, &format!("{coll}/x/status")),
            RequestClass::Mutating
        );
    }

    /// A server whose every handler waits for a permit of `gate` (so requests pile up in flight
    /// until the test lets them go), under `options`.
    fn gated(options: OverloadOptions, gate: Arc<Semaphore>) -> Router {
        let app = Router::new().fallback(any(move || {
            let gate = gate.clone();
            async move {
                // Held until the handler ends; closed never.
                let _permit = gate.acquire().await;
                (StatusCode::CREATED, "{}")
            }
        }));
        limit(app, options)
    }

    fn request(method: Method, uri: &str) -> Request {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap()
    }

    async fn json_of(response: Response) -> serde_json::Value {
        let body = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    const COLL: &str = "/apis/etcd.operator.dev/v1alpha2/namespaces/a/etcdclusters";

    #[tokio::test]
    async fn requests_beyond_a_budget_get_429_with_retry_after_and_a_status() {
        let options = OverloadOptions {
            max_requests_inflight: 2,
            max_mutating_requests_inflight: 3,
            request_timeout: Duration::from_secs(60),
        };
        let gate = Arc::new(Semaphore::new(0));
        let app = gated(options, gate.clone());
        // Three creates and two gets fill both budgets and wait.
        let mut held = Vec::new();
        for method in [Method::POST, Method::POST, Method::POST, Method::GET, Method::GET] {
            let app = app.clone();
            held.push(tokio::spawn(app.oneshot(request(method, COLL))));
        }
        // Let them reach their handlers.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for method in [Method::POST, Method::PATCH, Method::GET] {
            let response = app.clone().oneshot(request(method.clone(), COLL)).await.unwrap();
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{method}");
            assert_eq!(response.headers()["retry-after"], "1");
            assert_eq!(response.headers()["content-type"], "application/json");
            let status = json_of(response).await;
            assert_eq!(status["kind"], "Status");
            assert_eq!(status["code"], 429);
            assert_eq!(status["reason"], "TooManyRequests");
            assert_eq!(status["message"], "Too many requests, please try again later.");
            assert_eq!(status["details"]["retryAfterSeconds"], 1);
        }
        // Watches and health checks are not counted: they reach the (gated) handler.
        for uri in [format!("{COLL}?watch=true"), "/readyz".to_owned()] {
            let waiting = tokio::spawn(app.clone().oneshot(request(Method::GET, &uri)));
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!waiting.is_finished(), "{uri} was refused");
            held.push(waiting);
        }
        // Once they finish, the budgets are free again.
        gate.add_permits(100);
        for h in held {
            assert_eq!(h.await.unwrap().unwrap().status(), StatusCode::CREATED);
        }
        let response = app.clone().oneshot(request(Method::POST, COLL)).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }

    #[tokio::test]
    async fn a_request_that_takes_too_long_gets_504_timeout() {
        let options = OverloadOptions {
            request_timeout: Duration::from_millis(50),
            ..OverloadOptions::default()
        };
        let app = gated(options, Arc::new(Semaphore::new(0)));
        for method in [Method::POST, Method::GET] {
            let response = app.clone().oneshot(request(method.clone(), COLL)).await.unwrap();
            assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT, "{method}");
            let status = json_of(response).await;
            assert_eq!(status["kind"], "Status");
            assert_eq!(status["code"], 504);
            assert_eq!(status["reason"], "Timeout");
            assert!(
                status["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("Timeout: request did not complete within the allotted timeout of 50ms"),
                "{status}"
            );
        }
        // A watch may run for as long as it likes.
        let watch = tokio::spawn(
            app.clone()
                .oneshot(request(Method::GET, &format!("{COLL}?watch=1"))),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!watch.is_finished(), "the watch was cut by the request timeout");
        watch.abort();
    }

    #[tokio::test]
    async fn a_timed_out_request_frees_its_place() {
        let options = OverloadOptions {
            max_requests_inflight: 1,
            max_mutating_requests_inflight: 1,
            request_timeout: Duration::from_millis(50),
        };
        let app = gated(options, Arc::new(Semaphore::new(0)));
        for _ in 0..3 {
            let response = app.clone().oneshot(request(Method::POST, COLL)).await.unwrap();
            assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        }
    }
}
