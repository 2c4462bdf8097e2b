//! Delegated authorization: `system:masters` is always allowed, everything else is a
//! SubjectAccessReview (`authorization.k8s.io/v1`) to kube-apiserver, cached briefly; a denial
//! is a 403 `Status` in kube-apiserver's wording.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::cache::TtlCache;
use crate::http::auth::Authorizer;
use crate::http::error::ApiError;
use crate::http::request_info::RequestInfo;
use crate::serve::UserInfo;

/// The group that is always allowed (Go: `AlwaysAllowGroups`).
pub const MASTERS_GROUP: &str = "system:masters";
/// How long allow and deny decisions are reused (Go: 10 s each).
pub const DECISION_CACHE_TTL: Duration = Duration::from_secs(10);
const DECISION_CACHE_MAX: usize = 8192;

/// A SubjectAccessReview decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Not allowed, with kube-apiserver's reason (may be empty).
    Deny(String),
}

/// The cluster-mode authorizer.
pub struct SubjectAccessReviewAuthorizer {
    client: kube::Client,
    cache: TtlCache<String, Decision>,
}

impl std::fmt::Debug for SubjectAccessReviewAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectAccessReviewAuthorizer")
            .finish_non_exhaustive()
    }
}

impl SubjectAccessReviewAuthorizer {
    /// Asks kube-apiserver through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self::with_ttl(client, DECISION_CACHE_TTL)
    }

    /// Asks through `client`, caching decisions for `ttl`.
    pub fn with_ttl(client: kube::Client, ttl: Duration) -> Self {
        Self {
            client,
            cache: TtlCache::new(ttl, DECISION_CACHE_MAX),
        }
    }

    async fn decide(&self, spec: Value) -> Result<Decision, ApiError> {
        let key = spec.to_string();
        if let Some(hit) = self.cache.get(&key) {
            return Ok(hit);
        }
        let body = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        });
        let request = http::Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string().into_bytes())
            .map_err(|e| {
                ApiError::internal(format!(
                    "build SubjectAccessReview request: {}",
                    crate::error::chain(&e)
                ))
            })?;
        let review: Value = self.client.request(request).await.map_err(|e| {
            ApiError::internal(format!("create SubjectAccessReview: {}", crate::error::chain(&e)))
        })?;
        let decision = decision_of(&review);
        self.cache.insert(key, decision.clone());
        Ok(decision)
    }
}

impl Authorizer for SubjectAccessReviewAuthorizer {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        info: &'a RequestInfo,
    ) -> Pin<Box<dyn Future<Output = Result<(), ApiError>> + Send + 'a>> {
        Box::pin(async move {
            if user.in_group(MASTERS_GROUP) {
                return Ok(());
            }
            match self.decide(review_spec(user, info)).await? {
                Decision::Allow => Ok(()),
                Decision::Deny(reason) => {
                    tracing::debug!(user = %user.name, verb = %info.verb, path = %info.path, %reason, "forbidden");
                    Err(ApiError::forbidden(forbidden_message(user, info, &reason)))
                }
            }
        })
    }
}

/// The `spec` of the SubjectAccessReview for a request, with Go's `omitempty` fields left out.
pub fn review_spec(user: &UserInfo, info: &RequestInfo) -> Value {
    let mut spec = Map::new();
    spec.insert("user".into(), json!(user.name));
    if let Some(uid) = user.uid.as_ref().filter(|u| !u.is_empty()) {
        spec.insert("uid".into(), json!(uid));
    }
    if !user.groups.is_empty() {
        spec.insert("groups".into(), json!(user.groups));
    }
    if !user.extra.is_empty() {
        spec.insert("extra".into(), json!(user.extra));
    }
    if info.is_resource_request {
        let mut attrs = Map::new();
        let fields = [
            ("namespace", info.namespace.as_deref().unwrap_or_default()),
            ("verb", info.verb.as_str()),
            ("group", info.group.as_str()),
            ("version", info.version.as_str()),
            ("resource", info.resource.as_str()),
            ("subresource", info.subresource.as_deref().unwrap_or_default()),
            ("name", info.name.as_deref().unwrap_or_default()),
        ];
        for (key, value) in fields {
            if !value.is_empty() {
                attrs.insert(key.into(), json!(value));
            }
        }
        spec.insert("resourceAttributes".into(), Value::Object(attrs));
    } else {
        spec.insert(
            "nonResourceAttributes".into(),
            json!({"path": info.path, "verb": info.verb}),
        );
    }
    Value::Object(spec)
}

/// The decision in a SubjectAccessReview response: allowed only when `status.allowed` is true.
pub fn decision_of(review: &Value) -> Decision {
    let status = review.get("status");
    if status.and_then(|s| s.get("allowed")).and_then(Value::as_bool) == Some(true) {
        return Decision::Allow;
    }
    Decision::Deny(
        status
            .and_then(|s| s.get("reason"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    )
}

/// Go's `%q` for the strings that appear in these messages.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The 403 message, exactly as k8s.io/apiserver builds it: `forbiddenMessage` (responsewriters),
/// then `: <reason>` when the authorizer gave one, wrapped by `apierrors.NewForbidden`
/// (`<resource>.<group> "<name>" is forbidden: ...`, or `forbidden: ...` for non-resource paths).
pub fn forbidden_message(user: &UserInfo, info: &RequestInfo, reason: &str) -> String {
    let user_q = go_quote(&user.name);
    let inner = if !info.is_resource_request {
        format!("User {user_q} cannot {} path {}", info.verb, go_quote(&info.path))
    } else {
        let mut resource = info.resource.clone();
        if let Some(sub) = info.subresource.as_deref().filter(|s| !s.is_empty()) {
            resource = format!("{resource}/{sub}");
        }
        match info.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => format!(
                "User {user_q} cannot {} resource {} in API group {} in the namespace {}",
                info.verb,
                go_quote(&resource),
                go_quote(&info.group),
                go_quote(ns)
            ),
            None => format!(
                "User {user_q} cannot {} resource {} in API group {} at the cluster scope",
                info.verb,
                go_quote(&resource),
                go_quote(&info.group)
            ),
        }
    };
    let err = if reason.is_empty() {
        inner
    } else {
        format!("{inner}: {reason}")
    };
    let group_resource = if !info.is_resource_request || info.resource.is_empty() {
        String::new()
    } else if info.group.is_empty() {
        info.resource.clone()
    } else {
        format!("{}.{}", info.resource, info.group)
    };
    match (
        group_resource.is_empty(),
        info.name.as_deref().unwrap_or_default(),
    ) {
        (true, _) => format!("forbidden: {err}"),
        (false, "") => format!("{group_resource} is forbidden: {err}"),
        (false, name) => format!("{group_resource} {} is forbidden: {err}", go_quote(name)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use http::Method;

    use super::*;

    fn info(method: Method, path: &str, query: Option<&str>) -> RequestInfo {
        RequestInfo::parse(&method, path, query)
    }

    fn user() -> UserInfo {
        UserInfo {
            name: "eve".into(),
            uid: Some("u1".into()),
            groups: vec!["devs".into(), "system:authenticated".into()],
            extra: BTreeMap::from([("scopes".to_owned(), vec!["a".to_owned()])]),
        }
    }

    const NS_PATH: &str = "/apis/etcd.operator.dev/v1alpha2/namespaces/team-a/etcdclusters";

    #[test]
    fn resource_attributes_follow_the_verb_mapping() {
        let cases = [
            (
                Method::GET,
                format!("{NS_PATH}/x"),
                None,
                json!({"namespace": "team-a", "verb": "get", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters", "name": "x"}),
            ),
            (
                Method::GET,
                NS_PATH.to_owned(),
                None,
                json!({"namespace": "team-a", "verb": "list", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters"}),
            ),
            (
                Method::GET,
                NS_PATH.to_owned(),
                Some("watch=1&fieldSelector=metadata.name%3Dx"),
                json!({"namespace": "team-a", "verb": "watch", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters", "name": "x"}),
            ),
            (
                Method::POST,
                NS_PATH.to_owned(),
                None,
                json!({"namespace": "team-a", "verb": "create", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters"}),
            ),
            (
                Method::PUT,
                format!("{NS_PATH}/x/status"),
                None,
                json!({"namespace": "team-a", "verb": "update", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters", "subresource": "status", "name": "x"}),
            ),
            (
                Method::PATCH,
                format!("{NS_PATH}/x/scale"),
                None,
                json!({"namespace": "team-a", "verb": "patch", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters", "subresource": "scale", "name": "x"}),
            ),
            (
                Method::GET,
                format!("{NS_PATH}/x/snapshot"),
                None,
                json!({"namespace": "team-a", "verb": "get", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters", "subresource": "snapshot", "name": "x"}),
            ),
            (
                Method::DELETE,
                NS_PATH.to_owned(),
                None,
                json!({"namespace": "team-a", "verb": "deletecollection", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters"}),
            ),
            (
                Method::DELETE,
                format!("{NS_PATH}/x"),
                None,
                json!({"namespace": "team-a", "verb": "delete", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters", "name": "x"}),
            ),
            (
                Method::GET,
                "/apis/etcd.operator.dev/v1alpha2/etcdclusters".to_owned(),
                None,
                json!({"verb": "list", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters"}),
            ),
            (
                Method::GET,
                "/apis/etcd.operator.dev/v1alpha2/watch/namespaces/team-a/etcdclusters".to_owned(),
                None,
                json!({"namespace": "team-a", "verb": "watch", "group": "etcd.operator.dev", "version": "v1alpha2", "resource": "etcdclusters"}),
            ),
        ];
        for (method, path, query, attrs) in cases {
            let spec = review_spec(&user(), &info(method.clone(), &path, query));
            assert_eq!(
                spec,
                json!({"user": "eve", "uid": "u1", "groups": ["devs", "system:authenticated"],
                       "extra": {"scopes": ["a"]}, "resourceAttributes": attrs}),
                "{method} {path} {query:?}"
            );
        }
        let spec = review_spec(
            &UserInfo {
                name: "system:aggregator".into(),
                ..UserInfo::default()
            },
            &info(Method::GET, "/openapi/v2", None),
        );
        assert_eq!(
            spec,
            json!({"user": "system:aggregator", "nonResourceAttributes": {"path": "/openapi/v2", "verb": "get"}})
        );
    }

    #[test]
    fn forbidden_messages_use_go_wording() {
        let u = user();
        assert_eq!(
            forbidden_message(&u, &info(Method::POST, NS_PATH, None), ""),
            r#"etcdclusters.etcd.operator.dev is forbidden: User "eve" cannot create resource "etcdclusters" in API group "etcd.operator.dev" in the namespace "team-a""#
        );
        assert_eq!(
            forbidden_message(&u, &info(Method::PUT, &format!("{NS_PATH}/x/status"), None), ""),
            r#"etcdclusters.etcd.operator.dev "x" is forbidden: User "eve" cannot update resource "etcdclusters/status" in API group "etcd.operator.dev" in the namespace "team-a""#
        );
        assert_eq!(
            forbidden_message(
                &u,
                &info(Method::GET, "/apis/etcd.operator.dev/v1alpha2/etcdclusters", None),
                "no RBAC policy matched"
            ),
            r#"etcdclusters.etcd.operator.dev is forbidden: User "eve" cannot list resource "etcdclusters" in API group "etcd.operator.dev" at the cluster scope: no RBAC policy matched"#
        );
        assert_eq!(
            forbidden_message(&u, &info(Method::GET, "/version", None), ""),
            r#"forbidden: User "eve" cannot get path "/version""#
        );
        let odd = UserInfo {
            name: "a\"b\\c".into(),
            ..UserInfo::default()
        };
        assert_eq!(
            forbidden_message(&odd, &info(Method::GET, "/x", None), ""),
            r#"forbidden: User "a\"b\\c" cannot get path "/x""#
        );
    }

    #[test]
    fn only_allowed_true_allows() {
        assert_eq!(
            decision_of(&json!({"status": {"allowed": true}})),
            Decision::Allow
        );
        assert_eq!(
            decision_of(&json!({"status": {"allowed": false, "reason": "nope"}})),
            Decision::Deny("nope".into())
        );
        assert_eq!(
            decision_of(&json!({"status": {"allowed": false, "denied": true}})),
            Decision::Deny(String::new())
        );
        assert_eq!(decision_of(&json!({})), Decision::Deny(String::new()));
    }
}
