//! `kubectl get` output: objects as a `meta.k8s.io` Table with their resource's printer columns
//! ([`crate::registry::printers`]), and the PartialObjectMetadata transforms the garbage
//! collector and namespace controller request.

use serde_json::{Value, json};

use crate::registry::kind::Kind;
pub use crate::registry::printers::human_duration;

/// Which row object a Table carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// `PartialObjectMetadata` (the default).
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// Parses the query value; unknown values are a 400 in the caller.
    pub fn parse(value: Option<&str>) -> Result<Self, UnsupportedIncludeObject> {
        match value {
            None | Some("") | Some("Metadata") => Ok(Self::Metadata),
            Some("None") => Ok(Self::None),
            Some("Object") => Ok(Self::Object),
            Some(other) => Err(UnsupportedIncludeObject(other.to_owned())),
        }
    }
}

/// An `includeObject` value other than `None`, `Metadata` and `Object`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("includeObject: Unsupported value: \"{0}\": supported values: \"None\", \"Metadata\", \"Object\"")]
pub struct UnsupportedIncludeObject(pub String);

impl From<UnsupportedIncludeObject> for super::error::ApiError {
    fn from(e: UnsupportedIncludeObject) -> Self {
        Self::bad_request(e.to_string())
    }
}

/// The `PartialObjectMetadata` of an object.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
}

/// The row of one object of `kind` (in its served version).
pub fn row(kind: Kind, obj: &Value, now: jiff::Timestamp, include: IncludeObject) -> Value {
    let object = match include {
        IncludeObject::None => Value::Null,
        IncludeObject::Metadata => partial_metadata(obj),
        IncludeObject::Object => obj.clone(),
    };
    json!({"cells": (kind.printer().cells)(obj, now), "object": object})
}

/// A Table of objects of `kind`; `with_columns` is false for watch events after the first.
pub fn table_of(
    kind: Kind,
    version: &str,
    objects: &[Value],
    resource_version: &str,
    continue_token: Option<&str>,
    include: IncludeObject,
    with_columns: bool,
) -> Value {
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = objects.iter().map(|o| row(kind, o, now, include)).collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": {"resourceVersion": resource_version},
        "rows": rows,
    });
    if let Some(token) = continue_token {
        t["metadata"]["continue"] = json!(token);
    }
    if with_columns {
        t["columnDefinitions"] = (kind.printer().columns)();
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_carry_the_cells_and_the_object_asked_for() {
        let obj = json!({
            "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"replicas": 3, "version": "3.5.1"},
        });
        let now: jiff::Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        let r = row(Kind::CLUSTER, &obj, now, IncludeObject::Metadata);
        assert_eq!(r["cells"][0], "a");
        assert_eq!(r["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(r["object"]["metadata"]["name"], "a");
        assert_eq!(
            row(Kind::CLUSTER, &obj, now, IncludeObject::None)["object"],
            Value::Null
        );
        assert_eq!(
            row(Kind::CLUSTER, &obj, now, IncludeObject::Object)["object"],
            obj
        );
    }

    #[test]
    fn a_table_has_the_columns_of_its_kind() {
        let obj = json!({
            "metadata": {"name": "b", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"clusterName": "a"},
        });
        let t = table_of(Kind::BACKUP, "v1", &[obj], "5", None, IncludeObject::None, true);
        assert_eq!(t["columnDefinitions"].as_array().map(Vec::len), Some(8));
        assert_eq!(t["rows"][0]["cells"][1], "a");
        let t = table_of(
            Kind::CLUSTER,
            "v1",
            &[],
            "5",
            Some("tok"),
            IncludeObject::None,
            false,
        );
        assert!(t.get("columnDefinitions").is_none());
        assert_eq!(t["metadata"]["continue"], "tok");
    }
}
