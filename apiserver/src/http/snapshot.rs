//! `GET .../etcdclusters/<name>/snapshot`: a fresh etcd snapshot of the named cluster, taken
//! from a healthy member (a follower when there is one) at the client endpoints its status
//! reports, checked against etcd's integrity hash and sent as `application/octet-stream` — the
//! file `etcdutl snapshot status` and `etcdutl snapshot restore` read. Authorized as `get` on
//! `etcdclusters/snapshot` like any subresource.

use axum::response::{IntoResponse, Response};
use etcd_operator_controller::backup::snapshot::{self, SnapshotError};
use http::{HeaderValue, StatusCode, header};

use super::error::ApiError;
use crate::registry::kind::Kind;
use crate::storage::{ReadConsistency, Storage};

/// The content type of a snapshot.
pub const CONTENT_TYPE: &str = "application/octet-stream";

/// Whether an Accept header admits a snapshot (absent, `*/*`, `application/*` or the type).
pub fn accepts(accept: Option<&str>) -> bool {
    accept.is_none_or(|a| {
        a.split(',').any(|entry| {
            let media = entry.split(';').next().unwrap_or_default().trim();
            matches!(media, "" | "*/*" | "application/*" | CONTENT_TYPE)
        })
    })
}

/// Handles the request.
pub async fn serve(
    storage: &Storage,
    members: &etcd_operator_controller::member_ops::EtcdClient,
    namespace: Option<&str>,
    name: &str,
    accept: Option<&str>,
) -> Result<Response, ApiError> {
    let resource = Kind::CLUSTER.info().resource;
    let Some(namespace) = namespace else {
        return Err(ApiError::bad_request(
            "a namespace and a name are required for this request",
        ));
    };
    if !accepts(accept) {
        let mut e = ApiError::not_acceptable(accept.unwrap_or_default());
        e.message = format!(
            "only the following media types are accepted: {CONTENT_TYPE} (asked for {})",
            accept.unwrap_or_default()
        );
        return Err(e);
    }
    let stored = storage
        .get(namespace, name, ReadConsistency::Consistent)
        .await
        .map_err(|e| super::resource::storage_error_in(resource, e, name))?
        .ok_or_else(|| ApiError::not_found(resource, name))?;
    let cluster = crate::registry::cluster::from_storage(stored)?;
    let endpoints = cluster
        .status
        .as_ref()
        .and_then(|s| s.client_endpoints.clone())
        .unwrap_or_default();
    if endpoints.is_empty() {
        return Err(ApiError::unavailable(format!(
            "EtcdCluster {namespace}/{name} reports no client endpoints: no healthy member to take a snapshot from"
        )));
    }
    let snap = snapshot::take(members, &endpoints).await.map_err(|e| match e {
        SnapshotError::NoHealthyMember { .. } => ApiError::unavailable(format!(
            "EtcdCluster {namespace}/{name}: no healthy member to take a snapshot from"
        )),
        other => ApiError::unavailable(format!("EtcdCluster {namespace}/{name}: {other}")),
    })?;
    tracing::info!(cluster = %format!("{namespace}/{name}"), size = snap.data.len(), revision = snap.revision, from = %snap.endpoint, "serving snapshot");
    let mut response = (StatusCode::OK, snap.data).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"{namespace}-{name}-{}.db\"",
        snap.revision
    )) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&snap.sha256) {
        headers.insert("x-etcd-snapshot-sha256", v);
    }
    if let Ok(v) = HeaderValue::from_str(&snap.revision.to_string()) {
        headers.insert("x-etcd-snapshot-revision", v);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers() {
        assert!(accepts(None));
        assert!(accepts(Some("application/json, */*")));
        assert!(accepts(Some("application/octet-stream")));
        assert!(accepts(Some("application/*;q=0.5")));
        assert!(!accepts(Some("application/json")));
        assert!(!accepts(Some("application/yaml, text/plain")));
    }
}
