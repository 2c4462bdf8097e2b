//! Request bodies and options: the 3 MiB limit, JSON and YAML decoding, patch types, and the
//! `dryRun` / `fieldValidation` / `fieldManager` query parameters.

use axum::body::Body;
use serde_json::Value;

use super::error::ApiError;
use super::request_info::query_value;

/// kube-apiserver's default `MaxRequestBodyBytes`.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Reads the whole body, refusing more than [`MAX_BODY_BYTES`] with 413.
pub async fn read(body: Body) -> Result<bytes::Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|e| {
        // http-body-util reports the limit as a boxed LengthLimitError somewhere in the chain.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                return ApiError::too_large(MAX_BODY_BYTES);
            }
            source = err.source();
        }
        ApiError::bad_request(format!("read request body: {e}"))
    })
}

/// The media type of a `Content-Type` header, lower-cased, without parameters.
pub fn media_type(content_type: Option<&str>) -> String {
    content_type
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// Decodes an object body: JSON, or YAML when the content type says so.
pub fn decode_object(bytes: &[u8], content_type: Option<&str>) -> Result<Value, ApiError> {
    let media = media_type(content_type);
    let value: Value = match media.as_str() {
        "application/json" | "" | "*/*" => serde_json::from_slice(bytes).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?,
        "application/yaml" | "application/x-yaml" | "text/yaml" => serde_yaml::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    Ok(value)
}

/// `fieldValidation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop them with a `Warning` header (the server default).
    Warn,
    /// Refuse the request with 400.
    Strict,
}

/// Options common to writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// `dryRun=All`: do everything but store.
    pub dry_run: bool,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
}

impl WriteOptions {
    /// Parses the query string; bad values are a 400 as in kube-apiserver.
    pub fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let dry_run = match query_value(query, "dryRun").as_deref() {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "dryRun: Unsupported value: \"{other}\": supported values: \"All\""
                )));
            }
        };
        let field_validation = match query_value(query, "fieldValidation").as_deref() {
            None | Some("") | Some("Warn") => FieldValidation::Warn,
            Some("Ignore") => FieldValidation::Ignore,
            Some("Strict") => FieldValidation::Strict,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "fieldValidation: Unsupported value: \"{other}\": supported values: \"Ignore\", \"Strict\", \"Warn\""
                )));
            }
        };
        if let Some(manager) = query_value(query, "fieldManager")
            && (manager.chars().count() > 128 || manager.chars().any(|c| c.is_control()))
        {
            return Err(ApiError::bad_request(
                "fieldManager: Invalid value: must be at most 128 printable characters",
            ));
        }
        Ok(Self {
            dry_run,
            field_validation,
        })
    }
}

/// Patch types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 6902.
    Json,
    /// RFC 7386.
    Merge,
}

/// The patch type of a `Content-Type`; strategic merge and apply patches are 415, as for CRDs
/// (strategic merge needs per-field patch metadata this API does not have).
pub fn patch_type(content_type: Option<&str>) -> Result<PatchType, ApiError> {
    match media_type(content_type).as_str() {
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/merge-patch+json" => Ok(PatchType::Merge),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// Applies a patch to an object; a malformed patch or one that cannot apply is an error.
pub fn apply_patch(target: &Value, patch_bytes: &[u8], patch_type: PatchType) -> Result<Value, ApiError> {
    let mut doc = target.clone();
    match patch_type {
        PatchType::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(patch_bytes)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            if patch.0.len() > 10_000 {
                return Err(ApiError::invalid(
                    etcd_operator_api::KIND,
                    "",
                    vec![super::error::Cause {
                        reason: "FieldValueTooMany".into(),
                        message: "The allowed maximum operations in a JSON patch is 10000".into(),
                        field: String::new(),
                    }],
                ));
            }
            json_patch::patch(&mut doc, &patch).map_err(|e| {
                ApiError::invalid(
                    etcd_operator_api::KIND,
                    "",
                    vec![super::error::Cause {
                        reason: "FieldValueInvalid".into(),
                        message: format!("the JSON patch could not be applied: {e}"),
                        field: String::new(),
                    }],
                )
            })?;
        }
        PatchType::Merge => {
            let patch: Value = serde_json::from_slice(patch_bytes)
                .map_err(|e| ApiError::bad_request(format!("invalid merge patch: {e}")))?;
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(&mut doc, &patch);
        }
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn bodies_over_the_limit_are_413() {
        let big = vec![b' '; MAX_BODY_BYTES + 1];
        let err = read(Body::from(big)).await.unwrap_err();
        assert_eq!(err.code, http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(read(Body::from(vec![b' '; 10])).await.is_ok());
    }

    #[test]
    fn decoding() {
        assert_eq!(decode_object(b"{\"a\":1}", None).unwrap(), json!({"a": 1}));
        assert_eq!(
            decode_object(b"a: 1\n", Some("application/yaml")).unwrap(),
            json!({"a": 1})
        );
        assert_eq!(decode_object(b"{not json", None).unwrap_err().code, 400);
        assert_eq!(decode_object(b"[1]", None).unwrap_err().code, 400);
        assert_eq!(decode_object(b"x", Some("text/plain")).unwrap_err().code, 415);
    }

    #[test]
    fn options() {
        assert!(WriteOptions::parse(Some("dryRun=All")).unwrap().dry_run);
        assert_eq!(WriteOptions::parse(Some("dryRun=Some")).unwrap_err().code, 400);
        assert_eq!(
            WriteOptions::parse(None).unwrap().field_validation,
            FieldValidation::Warn
        );
        assert_eq!(
            WriteOptions::parse(Some("fieldValidation=Strict"))
                .unwrap()
                .field_validation,
            FieldValidation::Strict
        );
        assert_eq!(
            WriteOptions::parse(Some("fieldValidation=Loose"))
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn patches() {
        assert_eq!(
            patch_type(Some("application/strategic-merge-patch+json"))
                .unwrap_err()
                .code,
            415
        );
        assert_eq!(
            patch_type(Some("application/apply-patch+yaml")).unwrap_err().code,
            415
        );
        let target = json!({"spec": {"replicas": 3, "version": "3.5.1"}});
        let merged = apply_patch(
            &target,
            br#"{"spec":{"replicas":5,"version":null}}"#,
            PatchType::Merge,
        )
        .unwrap();
        assert_eq!(merged, json!({"spec": {"replicas": 5}}));
        let patched = apply_patch(
            &target,
            br#"[{"op":"replace","path":"/spec/replicas","value":1}]"#,
            PatchType::Json,
        )
        .unwrap();
        assert_eq!(patched["spec"]["replicas"], 1);
        let failing = apply_patch(
            &target,
            br#"[{"op":"test","path":"/spec/replicas","value":9}]"#,
            PatchType::Json,
        );
        assert_eq!(failing.unwrap_err().code, 422);
        assert_eq!(
            apply_patch(&target, b"not json", PatchType::Json)
                .unwrap_err()
                .code,
            400
        );
    }
}
