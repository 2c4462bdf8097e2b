//! `/openapi/v2`, `/openapi/v3` and the per-group-version v3 documents with their hash URLs,
//! as kube-openapi's handler serves them (ETag, 301 on a stale hash, immutable caching).

use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use sha2::{Digest, Sha512};

use super::AppState;
use super::error::ApiError;
use super::request_info::query_value;

/// One prepared document.
#[derive(Debug, Clone)]
pub struct Document {
    /// The JSON text.
    pub body: String,
    /// Upper-case hex SHA-512 of the body.
    pub hash: String,
}

impl Document {
    fn new(body: String) -> Self {
        let hash = hex::encode_upper(Sha512::digest(body.as_bytes()));
        Self { body, hash }
    }
}

/// Every OpenAPI document the server serves.
#[derive(Debug, Clone)]
pub struct Documents {
    /// OpenAPI v2.
    pub v2: Document,
    /// OpenAPI v3 per served version, preferred first.
    pub v3: Vec<(String, Document)>,
}

/// Generating the documents failed (a bug in the schema code).
#[derive(Debug, thiserror::Error)]
#[error("generate OpenAPI documents: {0}")]
pub struct OpenApiGenerateError(String);

impl Documents {
    /// Builds the documents from the API types (the same code that writes `openapi/`, whose
    /// drift test keeps the committed files equal to these).
    pub fn generate() -> Result<Self, OpenApiGenerateError> {
        let v2 = etcd_operator_api::openapi::v2_json()
            .map_err(|e| OpenApiGenerateError(crate::error::chain(&e)))?;
        let mut v3 = Vec::new();
        for version in etcd_operator_api::SERVED_VERSIONS {
            let body = etcd_operator_api::openapi::v3_json(version)
                .map_err(|e| OpenApiGenerateError(crate::error::chain(&e)))?;
            v3.push((version.to_string(), Document::new(body)));
        }
        Ok(Self {
            v2: Document::new(v2),
            v3,
        })
    }
}

fn json(body: &str) -> Response {
    let mut r = (StatusCode::OK, body.to_string()).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// `GET /openapi/v2`, with an ETag.
pub async fn v2(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let doc = &state.openapi.v2;
    let etag = format!("\"{}\"", doc.hash);
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        return StatusCode::NOT_MODIFIED.into_response();
    }
    let mut r = json(&doc.body);
    if let Ok(v) = HeaderValue::from_str(&etag) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r
}

/// `GET /openapi/v3`: the paths with their hash URLs (keys without a leading slash).
pub async fn v3_root(State(state): State<AppState>) -> Response {
    let paths: serde_json::Map<String, serde_json::Value> = state
        .openapi
        .v3
        .iter()
        .map(|(version, doc)| {
            let gv = format!("apis/{}/{version}", etcd_operator_api::GROUP);
            let url = format!("/openapi/v3/{gv}?hash={}", doc.hash);
            (gv, serde_json::json!({"serverRelativeURL": url}))
        })
        .collect();
    json(&serde_json::json!({"paths": paths}).to_string())
}

/// `GET /openapi/v3/apis/<group>/<version>[?hash=H]`.
pub async fn v3_group_version(
    State(state): State<AppState>,
    Path(version): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let Some((_, doc)) = state.openapi.v3.iter().find(|(v, _)| *v == version) else {
        return ApiError::path_not_found(&format!(
            "/openapi/v3/apis/{}/{version}",
            etcd_operator_api::GROUP
        ))
        .into_response();
    };
    let etag = format!("\"{}\"", doc.hash);
    match query_value(query.as_deref(), "hash") {
        Some(hash) if hash != doc.hash => {
            let location = format!(
                "/openapi/v3/apis/{}/{version}?hash={}",
                etcd_operator_api::GROUP,
                doc.hash
            );
            let mut r = StatusCode::MOVED_PERMANENTLY.into_response();
            if let Ok(v) = HeaderValue::from_str(&location) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        Some(_) => {
            let mut r = json(&doc.body);
            let h = r.headers_mut();
            h.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, immutable"),
            );
            let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24 * 365);
            if let Ok(v) = HeaderValue::from_str(&expires.strftime("%a, %d %b %Y %H:%M:%S GMT").to_string()) {
                h.insert(header::EXPIRES, v);
            }
            h.insert(header::VARY, HeaderValue::from_static("Accept"));
            if let Ok(v) = HeaderValue::from_str(&etag) {
                h.insert(header::ETAG, v);
            }
            r
        }
        None => {
            let mut r = json(&doc.body);
            if let Ok(v) = HeaderValue::from_str(&etag) {
                r.headers_mut().insert(header::ETAG, v);
            }
            r
        }
    }
}
