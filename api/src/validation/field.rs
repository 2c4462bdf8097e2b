//! Field errors in the shape of Kubernetes `field.Error` (apimachinery `pkg/util/validation/field`),
//! warnings, and their rendering into a `422 Invalid` `Status`.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Status, StatusCause, StatusDetails};

/// The kind of a field error, mirroring `field.ErrorType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorType {
    /// `FieldValueRequired`: a required field is unset or empty.
    Required,
    /// `FieldValueInvalid`: malformed or out of range.
    Invalid,
    /// `FieldValueNotSupported`: not one of the known values.
    NotSupported,
    /// `FieldValueForbidden`: may not be set (here, or together with another field).
    Forbidden,
    /// `FieldValueTooLong`: longer than allowed.
    TooLong,
    /// `FieldValueDuplicate`: the same value appears twice.
    Duplicate,
}

impl ErrorType {
    /// The `reason` of a `StatusCause`, e.g. `FieldValueInvalid`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Forbidden => "FieldValueForbidden",
            Self::TooLong => "FieldValueTooLong",
            Self::Duplicate => "FieldValueDuplicate",
        }
    }

    /// The human-readable label Kubernetes prints, e.g. `Invalid value`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid => "Invalid value",
            Self::NotSupported => "Unsupported value",
            Self::Forbidden => "Forbidden",
            Self::TooLong => "Too long",
            Self::Duplicate => "Duplicate value",
        }
    }
}

/// One validation error: a field path, a kind, the offending value (rendered) and a detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Kubernetes field path, e.g. `spec.podTemplate.spec.tolerations[0].key`.
    pub field: String,
    /// The kind of error.
    pub kind: ErrorType,
    /// The offending value as Kubernetes prints it (strings quoted), for the kinds that show it.
    pub value: Option<String>,
    /// Why the value is wrong.
    pub detail: String,
}

impl FieldError {
    fn new(field: &Path, kind: ErrorType, value: Option<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.to_string(),
            kind,
            value,
            detail: detail.into(),
        }
    }

    /// `FieldValueRequired`.
    pub fn required(field: &Path, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::Required, None, detail)
    }

    /// `FieldValueInvalid` for a string value.
    pub fn invalid(field: &Path, value: &str, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::Invalid, Some(quote(value)), detail)
    }

    /// `FieldValueInvalid` for a number (or any value rendered without quotes).
    pub fn invalid_raw(field: &Path, value: impl fmt::Display, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::Invalid, Some(value.to_string()), detail)
    }

    /// `FieldValueNotSupported`, listing the supported values.
    pub fn not_supported(field: &Path, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| quote(s)).collect();
        Self::new(
            field,
            ErrorType::NotSupported,
            Some(quote(value)),
            format!("supported values: {}", list.join(", ")),
        )
    }

    /// `FieldValueForbidden`.
    pub fn forbidden(field: &Path, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::Forbidden, None, detail)
    }

    /// `FieldValueTooLong`.
    pub fn too_long(field: &Path, max: usize) -> Self {
        Self::new(
            field,
            ErrorType::TooLong,
            None,
            format!("may not be more than {max} bytes"),
        )
    }

    /// `FieldValueDuplicate`.
    pub fn duplicate(field: &Path, value: &str) -> Self {
        Self::new(field, ErrorType::Duplicate, Some(quote(value)), "")
    }

    /// The message without the field, as in `StatusCause.message`
    /// (`Invalid value: 10: must be between 1 and 9`).
    pub fn body(&self) -> String {
        let mut out = self.kind.label().to_owned();
        if let Some(value) = &self.value {
            out.push_str(": ");
            out.push_str(value);
        }
        if !self.detail.is_empty() {
            out.push_str(": ");
            out.push_str(&self.detail);
        }
        out
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// A warning about an accepted object (returned in `Warning` headers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldWarning {
    /// Field path the warning is about.
    pub field: String,
    /// The warning text.
    pub message: String,
}

impl FieldWarning {
    /// A warning about `field`.
    pub fn new(field: &Path, message: impl Into<String>) -> Self {
        Self {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Quotes a string value the way Go's `%q` does for printable text.
pub(crate) fn quote(value: &str) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| format!("\"{value}\""))
}

/// A field path under construction: `spec`, `.child`, `[3]`, `[key]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    /// A root path such as `spec` or `metadata`.
    pub fn root(name: &str) -> Self {
        Self(name.to_owned())
    }

    /// A child field.
    pub fn child(&self, name: &str) -> Self {
        Self(format!("{}.{name}", self.0))
    }

    /// A list element.
    pub fn index(&self, index: usize) -> Self {
        Self(format!("{}[{index}]", self.0))
    }

    /// A map entry.
    pub fn key(&self, key: &str) -> Self {
        Self(format!("{}[{key}]", self.0))
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The `422 Unprocessable Entity` `Status` Kubernetes returns for an invalid object:
/// `reason: Invalid`, `details.causes[] = {reason, message, field}` and the message
/// `EtcdCluster.etcd.operator.dev "<name>" is invalid: [<errors>]`.
pub fn invalid_status(name: &str, errors: &[FieldError]) -> Status {
    let qualified_kind = format!("{}.{}", crate::KIND, crate::GROUP);
    let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let aggregate = match rendered.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    Status {
        code: Some(422),
        details: Some(StatusDetails {
            causes: Some(
                errors
                    .iter()
                    .map(|e| StatusCause {
                        field: Some(e.field.clone()),
                        message: Some(e.body()),
                        reason: Some(e.kind.reason().to_owned()),
                    })
                    .collect(),
            ),
            group: Some(crate::GROUP.to_owned()),
            kind: Some(crate::KIND.to_owned()),
            name: Some(name.to_owned()),
            retry_after_seconds: None,
            uid: None,
        }),
        message: Some(format!(
            "{qualified_kind} {} is invalid: {aggregate}",
            quote(name)
        )),
        metadata: ListMeta::default(),
        reason: Some("Invalid".to_owned()),
        status: Some("Failure".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn messages_match_kubernetes() {
        let spec = Path::root("spec");
        let e = FieldError::invalid_raw(&spec.child("replicas"), 10, "must be between 1 and 9");
        assert_eq!(
            e.to_string(),
            "spec.replicas: Invalid value: 10: must be between 1 and 9"
        );
        let e = FieldError::required(&spec.child("backup").child("schedule"), "");
        assert_eq!(e.to_string(), "spec.backup.schedule: Required value");
        let e = FieldError::not_supported(&spec.child("storage").child("medium"), "SSD", &["Disk", "Memory"]);
        assert_eq!(
            e.to_string(),
            "spec.storage.medium: Unsupported value: \"SSD\": supported values: \"Disk\", \"Memory\""
        );
        let path = spec
            .child("podTemplate")
            .child("spec")
            .child("tolerations")
            .index(0)
            .child("key");
        assert_eq!(path.to_string(), "spec.podTemplate.spec.tolerations[0].key");
        assert_eq!(
            Path::root("metadata").child("labels").key("a/b").to_string(),
            "metadata.labels[a/b]"
        );
    }

    #[test]
    fn status_has_the_kubernetes_shape() {
        let spec = Path::root("spec");
        let errors = vec![
            FieldError::invalid_raw(&spec.child("replicas"), 0, "must be between 1 and 9"),
            FieldError::required(&spec.child("backup").child("schedule"), ""),
        ];
        let value = serde_json::to_value(invalid_status("example", &errors)).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {},
                "status": "Failure",
                "code": 422,
                "reason": "Invalid",
                "message": "EtcdCluster.etcd.operator.dev \"example\" is invalid: [spec.replicas: Invalid value: 0: must be between 1 and 9, spec.backup.schedule: Required value]",
                "details": {
                    "name": "example",
                    "group": "etcd.operator.dev",
                    "kind": "EtcdCluster",
                    "causes": [
                        {"reason": "FieldValueInvalid", "message": "Invalid value: 0: must be between 1 and 9", "field": "spec.replicas"},
                        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.backup.schedule"}
                    ]
                }
            })
        );
        let one = invalid_status("x", &errors[..1]);
        assert_eq!(
            one.message.as_deref(),
            Some(
                "EtcdCluster.etcd.operator.dev \"x\" is invalid: spec.replicas: Invalid value: 0: must be between 1 and 9"
            )
        );
    }
}
