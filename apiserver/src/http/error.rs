//! The HTTP side of [`ApiError`]: rendered as a `metav1.Status` body with the right code,
//! content type and `Retry-After`.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, header};

pub use crate::error::{ApiError, Cause, qualified_resource};

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.to_status().to_string();
        let mut response = (self.code, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use serde_json::json;

    #[test]
    fn status_has_kind_api_version_code_and_reason() {
        let status = ApiError::not_found("etcdclusters", "a").to_status();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["apiVersion"], "v1");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["code"], 404);
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(
            status["message"],
            "etcdclusters.etcd.operator.dev \"a\" not found"
        );
        assert_eq!(status["details"]["kind"], "etcdclusters");
    }

    #[test]
    fn invalid_lists_every_cause() {
        let err = ApiError::invalid(
            "EtcdCluster",
            "a",
            vec![
                Cause {
                    reason: "FieldValueInvalid".into(),
                    message: "Invalid value: 0: must be 1..9".into(),
                    field: "spec.replicas".into(),
                },
                Cause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value".into(),
                    field: "spec.version".into(),
                },
            ],
        );
        let status = err.to_status();
        assert_eq!(status["code"], 422);
        assert_eq!(status["details"]["causes"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            status["message"],
            "EtcdCluster.etcd.operator.dev \"a\" is invalid: [spec.replicas: Invalid value: 0: must be 1..9, spec.version: Required value]"
        );
    }

    #[test]
    fn option_errors_are_about_meta_k8s_io_kinds() {
        let status = ApiError::invalid_options(
            "ListOptions",
            vec![Cause {
                reason: "FieldValueForbidden".into(),
                message: "Forbidden: sendInitialEvents is forbidden for list".into(),
                field: "sendInitialEvents".into(),
            }],
        )
        .to_status();
        assert_eq!(status["code"], 422);
        assert_eq!(
            status["message"],
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"
        );
        assert_eq!(status["details"]["group"], "meta.k8s.io");
        assert_eq!(status["details"]["kind"], "ListOptions");
        assert_eq!(status["details"]["name"], "");
    }

    #[test]
    fn expired_continue_carries_the_inconsistent_token() {
        let status = ApiError::expired_continue("too old", Some("abc".into())).to_status();
        assert_eq!(status["code"], 410);
        assert_eq!(status["reason"], "Expired");
        assert_eq!(status["metadata"], json!({"continue": "abc"}));
        let status = ApiError::expired_continue("too old", None).to_status();
        assert_eq!(status["metadata"], json!({}));
    }

    #[test]
    fn too_many_requests_sets_retry_after() {
        let response = ApiError::too_many_requests("cache not ready", 1).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }
}
