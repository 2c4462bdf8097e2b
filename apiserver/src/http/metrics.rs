//! The API server's Prometheus metrics: a layer around the whole API that counts requests and
//! times them by kube verb, group, version, resource, subresource and HTTP code, keeps a gauge of
//! the watches open, and the `/metrics` endpoint that encodes the process's one registry.
//!
//! The labels come from [`RequestInfo`], the attributes authorization uses too; every label value
//! is one of a fixed set ([`RouteLabels::of`], pure), so a client sending arbitrary paths cannot
//! grow the number of series.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::AppState;
use super::error::ApiError;
use super::request_info::RequestInfo;
use crate::registry::kind::Kind;

/// The content type of the OpenMetrics text format `/metrics` answers in.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Request duration buckets, in seconds (kube-apiserver's range: 5 ms to 60 s).
const DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
];

/// A label value standing for anything outside the fixed set (an unknown group, version,
/// resource or subresource in a resource path).
const OTHER: &str = "other";

/// What a request addressed, as metric labels. Every value is from a fixed set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RouteLabels {
    /// The kube verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `apply`, `delete`,
    /// `deletecollection`) of a resource request; the lower-case HTTP method of any other path.
    pub verb: &'static str,
    /// The API group of a resource request (empty for other paths).
    pub group: &'static str,
    /// The API version of a resource request (empty for other paths).
    pub version: &'static str,
    /// The resource (empty for other paths).
    pub resource: &'static str,
    /// The subresource (empty when none).
    pub subresource: &'static str,
}

/// [`RouteLabels`] and the HTTP status code of the answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    /// The kube verb (see [`RouteLabels::verb`]).
    pub verb: &'static str,
    /// The API group.
    pub group: &'static str,
    /// The API version.
    pub version: &'static str,
    /// The resource.
    pub resource: &'static str,
    /// The subresource.
    pub subresource: &'static str,
    /// The HTTP status code (429 and 504 are the overload refusals).
    pub code: u16,
}

/// The resource an open watch is on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WatchLabels {
    /// The API group.
    pub group: &'static str,
    /// The resource.
    pub resource: &'static str,
}

const VERBS: [&str; 9] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "apply",
];

const METHODS: [&str; 9] = [
    "get", "head", "post", "put", "patch", "delete", "options", "connect", "trace",
];

/// `value` when it is one of `known`, else [`OTHER`].
fn known(value: &str, known: impl IntoIterator<Item = &'static str>) -> &'static str {
    known.into_iter().find(|k| *k == value).unwrap_or(OTHER)
}

impl RouteLabels {
    /// The labels of a request, from its method, path, query and `Content-Type` (a PATCH of
    /// `application/apply-patch+yaml` is the verb `apply`, as kube-apiserver reports it).
    pub fn of(method: &Method, path: &str, query: Option<&str>, content_type: Option<&str>) -> Self {
        let info = RequestInfo::parse(method, path, query);
        if !info.is_resource_request {
            return Self {
                verb: known(&info.verb, METHODS),
                group: "",
                version: "",
                resource: "",
                subresource: "",
            };
        }
        let apply = *method == Method::PATCH
            && content_type.is_some_and(|c| c.trim_start().starts_with("application/apply-patch"));
        let verb = if apply { "apply" } else { known(&info.verb, VERBS) };
        let group = known(&info.group, [etcd_operator_api::GROUP]);
        let kind = Kind::for_resource(&info.resource).filter(|_| group != OTHER);
        let (version, resource, subresource) = match kind {
            Some(kind) => {
                let kind_info = kind.info();
                let subresource = match info.subresource.as_deref() {
                    None => "",
                    Some(sub) => known(sub, kind_info.subresources.iter().copied()),
                };
                (
                    known(&info.version, kind_info.versions.iter().copied()),
                    kind_info.resource,
                    subresource,
                )
            }
            None => (
                known(&info.version, etcd_operator_api::SERVED_VERSIONS.iter().copied()),
                OTHER,
                if info.subresource.is_some() { OTHER } else { "" },
            ),
        };
        Self {
            verb,
            group,
            version,
            resource,
            subresource,
        }
    }

    /// These labels with the status code of the answer.
    pub fn with_code(&self, code: StatusCode) -> RequestLabels {
        RequestLabels {
            verb: self.verb,
            group: self.group,
            version: self.version,
            resource: self.resource,
            subresource: self.subresource,
            code: code.as_u16(),
        }
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The API server's series. Cheap to clone (the families are shared).
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    requests: Family<RequestLabels, Counter>,
    durations: HistogramFamily<RouteLabels>,
    watchers: Family<WatchLabels, Gauge>,
}

impl Default for ApiMetrics {
    /// Series recorded but not registered anywhere (tests, benches).
    fn default() -> Self {
        Self {
            requests: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            watchers: Family::default(),
        }
    }
}

impl ApiMetrics {
    /// Creates the series and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        // The text encoding appends `_total` to a counter's name.
        registry.register(
            "apiserver_request",
            "Requests answered, by kube verb, group, version, resource, subresource and HTTP code",
            metrics.requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Time to answer a request (to its response headers; a watch's is the time to open it)",
            metrics.durations.clone(),
        );
        registry.register(
            "apiserver_registered_watchers",
            "Watches open now, by group and resource",
            metrics.watchers.clone(),
        );
        metrics
    }

    /// Records one answered request.
    pub fn observe(&self, route: &RouteLabels, code: StatusCode, seconds: f64) {
        self.requests.get_or_create(&route.with_code(code)).inc();
        self.durations.get_or_create(route).observe(seconds);
    }

    /// Counts a watch as open until the returned guard is dropped.
    pub fn watch_opened(&self, route: &RouteLabels) -> WatchGuard {
        let gauge = self.watchers.get_or_create_owned(&WatchLabels {
            group: route.group,
            resource: route.resource,
        });
        gauge.inc();
        WatchGuard(gauge)
    }
}

/// One open watch, counted in `apiserver_registered_watchers` while it lives.
#[derive(Debug)]
pub struct WatchGuard(Gauge);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// `app` with every request recorded in `metrics`. Put it outermost (around the overload
/// limits) so that refusals for load (429, 504) are counted too.
pub fn instrument(app: Router, metrics: ApiMetrics) -> Router {
    app.layer(middleware::from_fn_with_state(metrics, record))
}

async fn record(State(metrics): State<ApiMetrics>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let route = RouteLabels::of(
        request.method(),
        request.uri().path(),
        request.uri().query(),
        content_type,
    );
    let response = next.run(request).await;
    metrics.observe(&route, response.status(), start.elapsed().as_secs_f64());
    if route.verb != "watch" || !response.status().is_success() {
        return response;
    }
    // The watch stays open as long as its body streams: the guard lives in the body.
    let guard = metrics.watch_opened(&route);
    response.map(move |body| {
        Body::new(body.map_frame(move |frame| {
            let _open = &guard;
            frame
        }))
    })
}

/// `GET /metrics`: the registry in the OpenMetrics text format (404 when this server keeps
/// none). Authorized like any other path: in serve mode, `get` on the non-resource URL
/// `/metrics`.
pub(super) async fn serve(State(state): State<AppState>) -> Response {
    let Some(registry) = state.metrics.as_ref() else {
        return ApiError::path_not_found("/metrics").into_response();
    };
    match encode(registry) {
        Ok(text) => {
            let mut response = (StatusCode::OK, text).into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            response
        }
        Err(e) => ApiError::internal(format!("encode metrics: {e}")).into_response(),
    }
}

/// The registry in the OpenMetrics text format.
pub fn encode(registry: &Arc<Registry>) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn labels(method: Method, uri: &str, content_type: Option<&str>) -> RouteLabels {
        let uri: http::Uri = uri.parse().unwrap();
        RouteLabels::of(&method, uri.path(), uri.query(), content_type)
    }

    fn tuple(l: &RouteLabels) -> (&str, &str, &str, &str, &str) {
        (l.verb, l.group, l.version, l.resource, l.subresource)
    }

    #[test]
    fn resource_requests_are_labelled_with_kube_verbs() {
        let g = "etcd.operator.dev";
        let ns = "/apis/etcd.operator.dev/v1alpha2/namespaces/a/etcdclusters";
        let cases = [
            (
                Method::GET,
                format!("{ns}/x"),
                None,
                ("get", g, "v1alpha2", "etcdclusters", ""),
            ),
            (
                Method::GET,
                ns.to_string(),
                None,
                ("list", g, "v1alpha2", "etcdclusters", ""),
            ),
            (
                Method::GET,
                format!("{ns}?watch=true"),
                None,
                ("watch", g, "v1alpha2", "etcdclusters", ""),
            ),
            (
                Method::POST,
                ns.to_string(),
                None,
                ("create", g, "v1alpha2", "etcdclusters", ""),
            ),
            (
                Method::PUT,
                format!("{ns}/x/status"),
                None,
                ("update", g, "v1alpha2", "etcdclusters", "status"),
            ),
            (
                Method::PATCH,
                format!("{ns}/x/scale"),
                Some("application/merge-patch+json"),
                ("patch", g, "v1alpha2", "etcdclusters", "scale"),
            ),
            (
                Method::PATCH,
                format!("{ns}/x"),
                Some("application/apply-patch+yaml"),
                ("apply", g, "v1alpha2", "etcdclusters", ""),
            ),
            (
                Method::DELETE,
                format!("{ns}/x"),
                None,
                ("delete", g, "v1alpha2", "etcdclusters", ""),
            ),
            (
                Method::DELETE,
                ns.to_string(),
                None,
                ("deletecollection", g, "v1alpha2", "etcdclusters", ""),
            ),
            (
                Method::GET,
                "/apis/etcd.operator.dev/v1alpha1/etcdclusters".to_string(),
                None,
                ("list", g, "v1alpha1", "etcdclusters", ""),
            ),
            (
                Method::GET,
                "/apis/etcd.operator.dev/v1alpha2/namespaces/a/etcdbackups/b".to_string(),
                None,
                ("get", g, "v1alpha2", "etcdbackups", ""),
            ),
        ];
        for (method, uri, content_type, want) in cases {
            assert_eq!(tuple(&labels(method, &uri, content_type)), want, "{uri}");
        }
    }

    #[test]
    fn unknown_path_segments_fold_into_other() {
        let cases = [
            (
                "/apis/etcd.operator.dev/v1alpha2/namespaces/a/widgets/x",
                ("get", "etcd.operator.dev", "v1alpha2", "other", ""),
            ),
            (
                "/apis/etcd.operator.dev/v9/namespaces/a/etcdclusters/x",
                ("get", "etcd.operator.dev", "other", "etcdclusters", ""),
            ),
            (
                "/apis/evil.example/v1/namespaces/a/etcdclusters/x/y",
                ("get", "other", "other", "other", "other"),
            ),
            (
                "/apis/etcd.operator.dev/v1alpha2/namespaces/a/etcdbackups/x/scale",
                ("get", "etcd.operator.dev", "v1alpha2", "etcdbackups", "other"),
            ),
            // etcdbackups are not served in v1alpha1
            (
                "/apis/etcd.operator.dev/v1alpha1/namespaces/a/etcdbackups/x",
                ("get", "etcd.operator.dev", "other", "etcdbackups", ""),
            ),
        ];
        for (uri, want) in cases {
            assert_eq!(tuple(&labels(Method::GET, uri, None)), want, "{uri}");
        }
    }

    #[test]
    fn other_paths_carry_only_the_method() {
        for path in [
            "/metrics",
            "/apis",
            "/openapi/v2",
            "/readyz",
            "/no/such/path/x/y/z",
        ] {
            assert_eq!(
                tuple(&labels(Method::GET, path, None)),
                ("get", "", "", "", ""),
                "{path}"
            );
        }
        let weird = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(labels(weird, "/", None).verb, "other");
    }

    /// Around the overload limits, refusals for load are counted by their code.
    #[tokio::test]
    async fn overload_refusals_are_counted_as_429_and_504() {
        use axum::routing::any;
        use tower::ServiceExt;

        use crate::http::overload::{OverloadOptions, limit};

        let mut registry = Registry::default();
        let metrics = ApiMetrics::register(&mut registry);
        let registry = Arc::new(registry);
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let inner = {
            let gate = gate.clone();
            Router::new().fallback(any(move || {
                let gate = gate.clone();
                async move {
                    let _permit = gate.acquire().await;
                    StatusCode::OK
                }
            }))
        };
        let options = OverloadOptions {
            max_requests_inflight: 1,
            max_mutating_requests_inflight: 1,
            request_timeout: Duration::from_millis(300),
        };
        let app = instrument(limit(inner, options), metrics);
        let coll = "/apis/etcd.operator.dev/v1alpha2/namespaces/a/etcdclusters";
        let get = || Request::builder().uri(coll).body(Body::empty()).unwrap();
        // One list holds the only read-only slot until it times out; the next is refused.
        let held = tokio::spawn(app.clone().oneshot(get()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let refused = app.clone().oneshot(get()).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::GATEWAY_TIMEOUT);
        gate.add_permits(1);
        assert_eq!(app.clone().oneshot(get()).await.unwrap().status(), StatusCode::OK);

        let text = encode(&registry).unwrap();
        let list = r#"verb="list",group="etcd.operator.dev",version="v1alpha2",resource="etcdclusters",subresource="""#;
        for code in [200, 429, 504] {
            let line = format!("apiserver_request_total{{{list},code=\"{code}\"}} 1");
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn recorded_requests_and_watches_show_in_the_encoding() {
        let mut registry = Registry::default();
        let metrics = ApiMetrics::register(&mut registry);
        let registry = Arc::new(registry);
        let list = labels(Method::GET, "/apis/etcd.operator.dev/v1alpha2/etcdclusters", None);
        metrics.observe(&list, StatusCode::OK, 0.003);
        metrics.observe(&list, StatusCode::OK, 0.2);
        metrics.observe(&list, StatusCode::TOO_MANY_REQUESTS, 0.001);
        let watch = labels(
            Method::GET,
            "/apis/etcd.operator.dev/v1alpha2/etcdclusters?watch=1",
            None,
        );
        let guard = metrics.watch_opened(&watch);
        let text = encode(&registry).unwrap();
        let list_labels = r#"verb="list",group="etcd.operator.dev",version="v1alpha2",resource="etcdclusters",subresource="""#;
        for line in [
            format!("apiserver_request_total{{{list_labels},code=\"200\"}} 2"),
            format!("apiserver_request_total{{{list_labels},code=\"429\"}} 1"),
            format!("apiserver_request_duration_seconds_count{{{list_labels}}} 3"),
            format!("apiserver_request_duration_seconds_bucket{{le=\"0.005\",{list_labels}}} 2"),
            r#"apiserver_registered_watchers{group="etcd.operator.dev",resource="etcdclusters"} 1"#
                .to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        drop(guard);
        let text = encode(&registry).unwrap();
        assert!(
            text.contains(
                r#"apiserver_registered_watchers{group="etcd.operator.dev",resource="etcdclusters"} 0"#
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
