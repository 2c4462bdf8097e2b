//! Decoding a request body into the version it was written in.

use serde_json::Value;

use crate::{convert, v1alpha1, v1alpha2};

/// An `EtcdCluster` in one of the served versions.
// Lives for one request and is converted right away: boxing the larger hub would only add an
// allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum VersionedCluster {
    /// `etcd.operator.dev/v1alpha1`.
    V1alpha1(v1alpha1::EtcdCluster),
    /// `etcd.operator.dev/v1alpha2` (the hub).
    V1alpha2(v1alpha2::EtcdCluster),
}

/// Why a body is not an `EtcdCluster` of a served version.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or a field has the wrong type.
    #[error("invalid EtcdCluster")]
    Json(#[from] serde_json::Error),
    /// `apiVersion` is missing.
    #[error("apiVersion is required")]
    MissingApiVersion,
    /// `kind` is missing.
    #[error("kind is required")]
    MissingKind,
    /// `apiVersion` names another group or an unserved version.
    #[error("apiVersion {0:?} is not served: use etcd.operator.dev/v1alpha2 or etcd.operator.dev/v1alpha1")]
    UnsupportedApiVersion(String),
    /// `kind` is not `EtcdCluster`.
    #[error("kind {0:?} is not EtcdCluster")]
    WrongKind(String),
    /// The version named by [`VersionedCluster::from_hub`] is not served.
    #[error("version {0:?} is not served")]
    UnsupportedVersion(String),
}

/// Decodes a JSON body, dispatching on its `apiVersion`.
pub fn decode(body: &[u8]) -> Result<VersionedCluster, DecodeError> {
    decode_value(serde_json::from_slice(body)?)
}

/// Decodes a JSON value, dispatching on its `apiVersion`.
pub fn decode_value(value: Value) -> Result<VersionedCluster, DecodeError> {
    let api_version = match value.get("apiVersion").and_then(Value::as_str) {
        Some(v) if !v.is_empty() => v.to_owned(),
        _ => return Err(DecodeError::MissingApiVersion),
    };
    match value.get("kind").and_then(Value::as_str) {
        Some(crate::KIND) => {}
        Some(other) if !other.is_empty() => return Err(DecodeError::WrongKind(other.to_owned())),
        _ => return Err(DecodeError::MissingKind),
    }
    match api_version.as_str() {
        v1alpha1::API_VERSION => Ok(VersionedCluster::V1alpha1(serde_json::from_value(value)?)),
        v1alpha2::API_VERSION => Ok(VersionedCluster::V1alpha2(serde_json::from_value(value)?)),
        _ => Err(DecodeError::UnsupportedApiVersion(api_version)),
    }
}

impl VersionedCluster {
    /// The version (`v1alpha1`, `v1alpha2`) of the object.
    pub fn version(&self) -> &'static str {
        match self {
            Self::V1alpha1(_) => v1alpha1::VERSION,
            Self::V1alpha2(_) => v1alpha2::VERSION,
        }
    }

    /// Applies the defaults of the object's own version.
    pub fn apply_defaults(&mut self) {
        match self {
            Self::V1alpha1(obj) => crate::defaults::apply_v1alpha1(obj),
            Self::V1alpha2(obj) => crate::defaults::apply_v1alpha2(obj),
        }
    }

    /// Converts to the hub (storage) version.
    pub fn into_hub(self) -> v1alpha2::EtcdCluster {
        convert::to_hub(self)
    }

    /// Converts a hub object into the given version (`v1alpha1` or `v1alpha2`).
    pub fn from_hub(hub: v1alpha2::EtcdCluster, version: &str) -> Result<Self, DecodeError> {
        match version {
            v1alpha2::VERSION => Ok(Self::V1alpha2(hub)),
            v1alpha1::VERSION => Ok(Self::V1alpha1(hub.into())),
            other => Err(DecodeError::UnsupportedVersion(other.to_owned())),
        }
    }

    /// The object as JSON.
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        match self {
            Self::V1alpha1(obj) => serde_json::to_value(obj),
            Self::V1alpha2(obj) => serde_json::to_value(obj),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatches_on_api_version() {
        let v1 = br#"{"apiVersion":"etcd.operator.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"a"},"spec":{"size":3}}"#;
        let obj = decode(v1).unwrap();
        assert_eq!(obj.version(), "v1alpha1");
        let hub = obj.into_hub();
        assert_eq!(hub.spec.replicas, Some(3));
        assert_eq!(hub.api_version, v1alpha2::API_VERSION);

        let v2 = br#"{"apiVersion":"etcd.operator.dev/v1alpha2","kind":"EtcdCluster","metadata":{"name":"a"},"spec":{"replicas":5}}"#;
        let mut obj = decode(v2).unwrap();
        obj.apply_defaults();
        let VersionedCluster::V1alpha2(hub) = &obj else {
            panic!("wrong version")
        };
        assert_eq!(hub.spec.replicas, Some(5));
        assert!(hub.spec.storage.is_some());
        let back = VersionedCluster::from_hub(hub.clone(), "v1alpha1").unwrap();
        assert_eq!(back.to_value().unwrap()["spec"]["size"], 5);
    }

    #[test]
    fn rejects_what_it_cannot_decode() {
        assert!(matches!(decode(b"{"), Err(DecodeError::Json(_))));
        assert!(matches!(
            decode(br#"{"kind":"EtcdCluster"}"#),
            Err(DecodeError::MissingApiVersion)
        ));
        assert!(matches!(
            decode(br#"{"apiVersion":"etcd.operator.dev/v1alpha2"}"#),
            Err(DecodeError::MissingKind)
        ));
        assert!(matches!(
            decode(br#"{"apiVersion":"etcd.operator.dev/v1","kind":"EtcdCluster"}"#),
            Err(DecodeError::UnsupportedApiVersion(_))
        ));
        assert!(matches!(
            decode(br#"{"apiVersion":"etcd.operator.dev/v1alpha2","kind":"Pod"}"#),
            Err(DecodeError::WrongKind(_))
        ));
        assert!(matches!(
            decode(br#"{"apiVersion":"etcd.operator.dev/v1alpha2","kind":"EtcdCluster","spec":{"replicas":"three"}}"#),
            Err(DecodeError::Json(_))
        ));
        let unknown_medium = br#"{"apiVersion":"etcd.operator.dev/v1alpha2","kind":"EtcdCluster","spec":{"storage":{"medium":"SSD"}}}"#;
        let VersionedCluster::V1alpha2(obj) = decode(unknown_medium).unwrap() else {
            panic!("wrong version")
        };
        assert_eq!(
            obj.spec.storage.unwrap().medium,
            Some(v1alpha2::StorageMedium::Unknown("SSD".into()))
        );
        assert!(VersionedCluster::from_hub(v1alpha2::EtcdCluster::default(), "v2").is_err());
    }
}
