//! Content negotiation: which representation the client asked for in `Accept` (plain JSON or
//! YAML, a `meta.k8s.io` Table, or PartialObjectMetadata), as k8s.io/apiserver negotiates it.

use super::error::ApiError;

/// The representation of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The object (or list) itself, as JSON.
    Json,
    /// The object as YAML.
    Yaml,
    /// A `meta.k8s.io` Table of the given version (`v1` or `v1beta1`).
    Table(&'static str),
    /// `PartialObjectMetadata` (or `PartialObjectMetadataList` for lists).
    Metadata,
}

/// Picks the first acceptable entry of an `Accept` header. A missing header means JSON; a header
/// with nothing acceptable is a 406.
pub fn negotiate(accept: Option<&str>) -> Result<Output, ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(Output::Json);
    };
    for entry in accept.split(',') {
        let mut params = entry.split(';').map(str::trim);
        let media = params.next().unwrap_or_default().to_ascii_lowercase();
        let (mut as_, mut g, mut v) = (None, None, None);
        for p in params {
            if let Some((k, val)) = p.split_once('=') {
                match k.trim() {
                    "as" => as_ = Some(val.trim().to_string()),
                    "g" => g = Some(val.trim().to_string()),
                    "v" => v = Some(val.trim().to_string()),
                    _ => {}
                }
            }
        }
        let json_like = matches!(media.as_str(), "application/json" | "*/*" | "application/*");
        match (as_.as_deref(), g.as_deref(), v.as_deref()) {
            (None, _, _) if json_like => return Ok(Output::Json),
            (None, _, _) if media == "application/yaml" => return Ok(Output::Yaml),
            (Some("Table"), Some("meta.k8s.io"), Some("v1")) if json_like => return Ok(Output::Table("v1")),
            (Some("Table"), Some("meta.k8s.io"), Some("v1beta1")) if json_like => {
                return Ok(Output::Table("v1beta1"));
            }
            (
                Some("PartialObjectMetadata" | "PartialObjectMetadataList"),
                Some("meta.k8s.io"),
                Some("v1"),
            ) if json_like => {
                return Ok(Output::Metadata);
            }
            // Protobuf and anything else: try the next entry.
            _ => {}
        }
    }
    Err(ApiError::not_acceptable(accept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_get_asks_for_a_table() {
        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(negotiate(Some(accept)).unwrap(), Output::Table("v1"));
    }

    #[test]
    fn metadata_client_skips_protobuf() {
        let accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
        assert_eq!(negotiate(Some(accept)).unwrap(), Output::Metadata);
    }

    #[test]
    fn plain_and_missing_accept_mean_json() {
        assert_eq!(negotiate(None).unwrap(), Output::Json);
        assert_eq!(negotiate(Some("*/*")).unwrap(), Output::Json);
        assert_eq!(negotiate(Some("application/json, */*")).unwrap(), Output::Json);
        assert_eq!(negotiate(Some("application/yaml")).unwrap(), Output::Yaml);
    }

    #[test]
    fn nothing_acceptable_is_406() {
        let err = negotiate(Some("application/vnd.kubernetes.protobuf")).unwrap_err();
        assert_eq!(err.code, http::StatusCode::NOT_ACCEPTABLE);
        let err = negotiate(Some("application/json;as=Table;v=v2;g=meta.k8s.io")).unwrap_err();
        assert_eq!(err.code, http::StatusCode::NOT_ACCEPTABLE);
    }
}
