//! Namespace lifecycle in serve mode, as kube-apiserver's `NamespaceLifecycle` admission plugin
//! answers creates: 404 when the namespace does not exist, 403 while it is being terminated.
//! The namespace is read from kube-apiserver on each create (creates are rare; no cache to go
//! stale). Local mode has no Namespace objects and does not use this (see `docs/api.md`).

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use serde_json::json;

use crate::error::{ApiError, qualified_resource};
use crate::http::admission::CreateAdmission;

/// Reads namespaces from kube-apiserver before a create.
#[derive(Clone)]
pub struct NamespaceLifecycle {
    namespaces: Api<Namespace>,
}

impl std::fmt::Debug for NamespaceLifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceLifecycle").finish_non_exhaustive()
    }
}

impl NamespaceLifecycle {
    /// Over a kube-apiserver client (the operator's ServiceAccount: the chart grants namespaces
    /// `get`).
    pub fn new(client: kube::Client) -> Self {
        Self {
            namespaces: Api::all(client),
        }
    }

    /// Whether `name` of `resource` may be created in `namespace`.
    pub async fn admit_create(&self, resource: &str, name: &str, namespace: &str) -> Result<(), ApiError> {
        let found = self.namespaces.get_opt(namespace).await.map_err(|e| {
            tracing::warn!(namespace, error = %etcd_operator_api::report::Chain(&e), "namespace lookup failed");
            ApiError::internal(format!("look up namespace {namespace:?}: {}", crate::error::chain(&e)))
        })?;
        admit(resource, name, namespace, found.as_ref())
    }
}

impl CreateAdmission for NamespaceLifecycle {
    fn admit_create<'a>(
        &'a self,
        resource: &'a str,
        name: &'a str,
        namespace: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(NamespaceLifecycle::admit_create(self, resource, name, namespace))
    }
}

/// The decision, pure: `found` is the namespace as kube-apiserver has it.
pub fn admit(resource: &str, name: &str, namespace: &str, found: Option<&Namespace>) -> Result<(), ApiError> {
    let Some(ns) = found else {
        return Err(ApiError {
            code: http::StatusCode::NOT_FOUND,
            reason: "NotFound",
            message: format!("namespaces {namespace:?} not found"),
            details: Some(json!({"name": namespace, "kind": "namespaces"})),
            retry_after: None,
            continue_token: None,
        });
    };
    let terminating = ns.metadata.deletion_timestamp.is_some()
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
    if terminating {
        let why =
            format!("unable to create new content in namespace {namespace} because it is being terminated");
        let subject = if name.is_empty() {
            qualified_resource(resource)
        } else {
            format!("{} {name:?}", qualified_resource(resource))
        };
        let mut err = ApiError::forbidden(format!("{subject} is forbidden: {why}"));
        err.details = Some(json!({
            "name": name, "group": etcd_operator_api::GROUP, "kind": resource,
            "causes": [{"reason": "NamespaceTerminating", "message": why, "field": "metadata.namespace"}],
        }));
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(phase: &str) -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"phase": phase}})).unwrap()
    }

    #[test]
    fn missing_namespaces_are_404_and_terminating_ones_403() {
        assert!(admit("etcdclusters", "a", "n", Some(&ns("Active"))).is_ok());
        let e = admit("etcdclusters", "a", "gone", None).unwrap_err();
        assert_eq!(e.code, 404);
        assert_eq!(e.message, "namespaces \"gone\" not found");
        let e = admit("etcdclusters", "a", "n", Some(&ns("Terminating"))).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "etcdclusters.etcd.operator.dev \"a\" is forbidden: unable to create new content in namespace n because it is being terminated"
        );
        assert_eq!(
            e.to_status()["details"]["causes"][0]["reason"],
            "NamespaceTerminating"
        );
    }
}
