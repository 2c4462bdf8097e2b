//! Request bodies and options: the 3 MiB limit, JSON and YAML decoding, patch types, and the
//! `dryRun` / `fieldValidation` / `fieldManager` query parameters.

use axum::body::Body;
use serde_json::Value;

use super::error::{ApiError, Cause};
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

/// The media types of object bodies (create, update).
pub const OBJECT_MEDIA_TYPES: [&str; 2] = ["application/json", "application/yaml"];
/// The media types of patches.
pub const PATCH_MEDIA_TYPES: [&str; 2] = ["application/json-patch+json", "application/merge-patch+json"];

/// Decodes an object body: JSON, or YAML when the content type says so.
pub fn decode_object(bytes: &[u8], content_type: Option<&str>) -> Result<Value, ApiError> {
    let media = media_type(content_type);
    let value: Value = match media.as_str() {
        "application/json" | "" | "*/*" => serde_json::from_slice(bytes).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?,
        "application/yaml" | "application/x-yaml" | "text/yaml" => serde_yaml::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?,
        other => return Err(ApiError::unsupported_media_type(other, &OBJECT_MEDIA_TYPES)),
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

/// The `dryRun` cause of kube-apiserver's option validation (`field.NotSupported` of a
/// `[]string`, printed the way Go prints it).
pub fn dry_run_unsupported(values: &[&str]) -> Cause {
    let shown = values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    Cause {
        reason: "FieldValueNotSupported".into(),
        message: format!("Unsupported value: []string{{{shown}}}: supported values: \"All\""),
        field: "dryRun".into(),
    }
}

impl WriteOptions {
    /// Parses the query string of a write whose options are `kind` (`CreateOptions`,
    /// `UpdateOptions`, `PatchOptions`, `DeleteOptions`). Unsupported values are a 422 about
    /// that kind with every cause, as kube-apiserver's option validation reports them.
    pub fn parse(query: Option<&str>, kind: &str) -> Result<Self, ApiError> {
        let mut causes = Vec::new();
        if let Some(manager) = query_value(query, "fieldManager") {
            if manager.len() > 128 {
                causes.push(Cause {
                    reason: "FieldValueTooLong".into(),
                    message: "Too long: may not be more than 128 bytes".into(),
                    field: "fieldManager".into(),
                });
            }
            if let Some((i, c)) = manager.chars().enumerate().find(|(_, c)| c.is_control()) {
                causes.push(Cause {
                    reason: "FieldValueInvalid".into(),
                    message: format!(
                        "Invalid value: {manager:?}: invalid character U+{:04X} (at position {i})",
                        u32::from(c)
                    ),
                    field: "fieldManager".into(),
                });
            }
        }
        let dry_run = match query_value(query, "dryRun").as_deref() {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                causes.push(dry_run_unsupported(&[other]));
                false
            }
        };
        let field_validation = match query_value(query, "fieldValidation").as_deref() {
            None | Some("") | Some("Warn") => FieldValidation::Warn,
            Some("Ignore") => FieldValidation::Ignore,
            Some("Strict") => FieldValidation::Strict,
            Some(other) => {
                causes.push(Cause {
                    reason: "FieldValueNotSupported".into(),
                    message: format!(
                        "Unsupported value: {other:?}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
                    ),
                    field: "fieldValidation".into(),
                });
                FieldValidation::Warn
            }
        };
        if !causes.is_empty() {
            return Err(ApiError::invalid_options(kind, causes));
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
        other => Err(ApiError::unsupported_media_type(other, &PATCH_MEDIA_TYPES)),
    }
}

/// Applies a patch to the object `name`; a malformed patch (400) or one that cannot apply (422)
/// is an error.
pub fn apply_patch(
    target: &Value,
    name: &str,
    patch_bytes: &[u8],
    patch_type: PatchType,
) -> Result<Value, ApiError> {
    let mut doc = target.clone();
    match patch_type {
        PatchType::Json => {
            let mut patch: json_patch::Patch = serde_json::from_slice(patch_bytes)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            // kube-apiserver's JSON patch library treats a missing value as null, so
            // `{"op":"test","path":"/metadata/finalizers","value":null}` passes when the object
            // has no finalizers (kube-runtime's finalizer helper relies on it). json-patch
            // fails it instead; drop exactly those tests.
            patch.0.retain(|op| match op {
                json_patch::PatchOperation::Test(t) => {
                    !(t.value.is_null() && doc.pointer(t.path.as_str()).is_none_or(Value::is_null))
                }
                _ => true,
            });
            if patch.0.len() > 10_000 {
                return Err(ApiError::invalid(
                    etcd_operator_api::KIND,
                    name,
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
                    name,
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
        assert!(
            WriteOptions::parse(Some("dryRun=All"), "CreateOptions")
                .unwrap()
                .dry_run
        );
        assert_eq!(
            WriteOptions::parse(None, "CreateOptions")
                .unwrap()
                .field_validation,
            FieldValidation::Warn
        );
        assert_eq!(
            WriteOptions::parse(Some("fieldValidation=Strict"), "UpdateOptions")
                .unwrap()
                .field_validation,
            FieldValidation::Strict
        );
    }

    #[test]
    fn unsupported_options_are_422_about_the_options_kind_with_every_cause() {
        let err = WriteOptions::parse(Some("dryRun=Some&fieldValidation=Loose"), "PatchOptions").unwrap_err();
        assert_eq!(err.code, 422);
        let status = err.to_status();
        assert_eq!(
            status["message"],
            "PatchOptions.meta.k8s.io \"\" is invalid: [dryRun: Unsupported value: []string{\"Some\"}: supported values: \"All\", fieldValidation: Unsupported value: \"Loose\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"]"
        );
        assert_eq!(status["details"]["kind"], "PatchOptions");
        assert_eq!(status["details"]["group"], "meta.k8s.io");
        let long = "m".repeat(129);
        let err = WriteOptions::parse(Some(&format!("fieldManager={long}")), "CreateOptions").unwrap_err();
        assert_eq!(err.to_status()["details"]["causes"][0]["field"], "fieldManager");
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
            "a",
            br#"{"spec":{"replicas":5,"version":null}}"#,
            PatchType::Merge,
        )
        .unwrap();
        assert_eq!(merged, json!({"spec": {"replicas": 5}}));
        let patched = apply_patch(
            &target,
            "a",
            br#"[{"op":"replace","path":"/spec/replicas","value":1}]"#,
            PatchType::Json,
        )
        .unwrap();
        assert_eq!(patched["spec"]["replicas"], 1);
        let failing = apply_patch(
            &target,
            "a",
            br#"[{"op":"test","path":"/spec/replicas","value":9}]"#,
            PatchType::Json,
        );
        let failing = failing.unwrap_err();
        assert_eq!(failing.code, 422);
        assert!(
            failing
                .message
                .starts_with("EtcdCluster.etcd.operator.dev \"a\" is invalid: "),
            "{}",
            failing.message
        );
        assert_eq!(
            apply_patch(&target, "a", b"not json", PatchType::Json)
                .unwrap_err()
                .code,
            400
        );
    }
}
