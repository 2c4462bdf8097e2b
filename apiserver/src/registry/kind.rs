//! The resources this server serves, and the strategy of each behind one interface: the HTTP
//! handlers, discovery and watch are written once and call [`Kind`] for what differs (decoding,
//! admission, conversion to the requested version, Table columns).

use etcd_operator_api::backup::{self as backup_api, EtcdBackup};
use etcd_operator_api::{VersionedCluster, v1alpha2 as hub};
use serde_json::Value;

use super::UpdateDecision;
use crate::http::error::ApiError;

/// A served resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `etcdclusters` (v1alpha1 and v1alpha2; status, scale and snapshot subresources).
    Cluster,
    /// `etcdbackups` (v1alpha2; status subresource).
    Backup,
}

/// What discovery, OpenAPI and routing need to know about a resource.
#[derive(Debug)]
pub struct KindInfo {
    /// Plural resource name (URL segment).
    pub resource: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// List kind.
    pub list_kind: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Short names.
    pub short_names: &'static [&'static str],
    /// Categories (`kubectl get all`, `kubectl get etcd`).
    pub categories: &'static [&'static str],
    /// Served versions, preferred first.
    pub versions: &'static [&'static str],
    /// The version objects are stored in.
    pub storage_version: &'static str,
    /// Subresources.
    pub subresources: &'static [&'static str],
}

static CLUSTER: KindInfo = KindInfo {
    resource: etcd_operator_api::RESOURCE,
    kind: etcd_operator_api::KIND,
    list_kind: etcd_operator_api::LIST_KIND,
    singular: etcd_operator_api::SINGULAR,
    short_names: etcd_operator_api::SHORT_NAMES,
    categories: &["all", "etcd"],
    versions: etcd_operator_api::SERVED_VERSIONS,
    storage_version: etcd_operator_api::HUB_VERSION,
    subresources: &["status", "scale", "snapshot"],
};

static BACKUP: KindInfo = KindInfo {
    resource: backup_api::RESOURCE,
    kind: backup_api::KIND,
    list_kind: backup_api::LIST_KIND,
    singular: backup_api::SINGULAR,
    short_names: backup_api::SHORT_NAMES,
    categories: &["etcd"],
    versions: &[backup_api::VERSION],
    storage_version: backup_api::VERSION,
    subresources: &["status"],
};

/// Every served resource, in discovery order.
pub const ALL: [Kind; 2] = [Kind::Cluster, Kind::Backup];

/// A decoded request object.
#[derive(Debug, Clone)]
pub enum RequestObject {
    /// An EtcdCluster in the version it was sent in.
    Cluster(Box<VersionedCluster>),
    /// An EtcdBackup.
    Backup(Box<EtcdBackup>),
}

/// What a write decided.
#[derive(Debug, Clone)]
pub enum Write {
    /// Store this (storage JSON), returning these warnings.
    Store(Value, Vec<String>),
    /// Delete the object (its last finalizer is gone).
    Delete,
}

impl Kind {
    /// The resource of a URL segment.
    pub fn for_resource(resource: &str) -> Option<Self> {
        ALL.into_iter().find(|k| k.info().resource == resource)
    }

    /// The resource's description.
    pub fn info(self) -> &'static KindInfo {
        match self {
            Self::Cluster => &CLUSTER,
            Self::Backup => &BACKUP,
        }
    }

    /// Whether `version` serves this resource.
    pub fn serves(self, version: &str) -> bool {
        self.info().versions.contains(&version)
    }

    /// Whether the resource has this subresource.
    pub fn has_subresource(self, sub: &str) -> bool {
        self.info().subresources.contains(&sub)
    }

    /// Decodes a request body for `version`; also returns the typed object re-encoded, to find
    /// type mismatches and unknown fields.
    pub fn decode(self, value: Value, version: &str) -> Result<(RequestObject, Value), ApiError> {
        match self {
            Self::Cluster => {
                let versioned = super::decode_for_version(value, version)?;
                let typed = versioned
                    .to_value()
                    .map_err(|e| ApiError::internal(format!("encode EtcdCluster: {e}")))?;
                Ok((RequestObject::Cluster(Box::new(versioned)), typed))
            }
            Self::Backup => {
                let obj = super::backup::decode(value)?;
                let typed = serde_json::to_value(&obj)
                    .map_err(|e| ApiError::internal(format!("encode EtcdBackup: {e}")))?;
                Ok((RequestObject::Backup(Box::new(obj)), typed))
            }
        }
    }

    /// [`super::check_types`] for this kind.
    pub fn check_types(self, input: &Value, typed: &Value) -> Result<(), ApiError> {
        super::check_types_of(self.info().kind, input, typed)
    }

    /// Create: the object to store, its name and the warnings.
    pub fn create(
        self,
        obj: RequestObject,
        namespace: &str,
    ) -> Result<(Value, String, Vec<String>), ApiError> {
        match obj {
            RequestObject::Cluster(c) => {
                let admitted = super::prepare_create(*c, namespace)?;
                let name = admitted.hub.metadata.name.clone().unwrap_or_default();
                Ok((super::to_storage(admitted.hub)?, name, admitted.warnings))
            }
            RequestObject::Backup(b) => {
                let b = super::backup::prepare_create(*b, namespace)?;
                let name = b.metadata.name.clone().unwrap_or_default();
                Ok((super::backup::to_storage(b)?, name, Vec::new()))
            }
        }
    }

    /// Update of the main resource against the stored object `current`.
    pub fn update(
        self,
        obj: &RequestObject,
        current: Value,
        name: &str,
        namespace: &str,
        require_rv: bool,
    ) -> Result<Write, ApiError> {
        match obj {
            RequestObject::Cluster(c) => {
                let old = super::from_storage(current)?;
                match super::prepare_update((**c).clone(), &old, name, namespace, require_rv)? {
                    UpdateDecision::Store(a) => Ok(Write::Store(super::to_storage(a.hub)?, a.warnings)),
                    UpdateDecision::Delete => Ok(Write::Delete),
                }
            }
            RequestObject::Backup(b) => {
                let old = super::backup::from_storage(current)?;
                match super::backup::prepare_update((**b).clone(), &old, name, namespace, require_rv)? {
                    Some(b) => Ok(Write::Store(super::backup::to_storage(b)?, Vec::new())),
                    None => Ok(Write::Delete),
                }
            }
        }
    }

    /// Update of the `status` subresource: the object to store.
    pub fn update_status(
        self,
        obj: &RequestObject,
        current: Value,
        name: &str,
        require_rv: bool,
    ) -> Result<Value, ApiError> {
        match obj {
            RequestObject::Cluster(c) => {
                let old = super::from_storage(current)?;
                let admitted = super::prepare_status_update((**c).clone(), &old, name, require_rv)?;
                super::to_storage(admitted.hub)
            }
            RequestObject::Backup(b) => {
                let old = super::backup::from_storage(current)?;
                super::backup::to_storage(super::backup::prepare_status_update(
                    (**b).clone(),
                    &old,
                    name,
                    require_rv,
                )?)
            }
        }
    }

    /// Delete: the object marked for deletion, or `None` to delete it now.
    pub fn delete(self, current: Value, propagation: Option<&str>) -> Result<Option<Value>, ApiError> {
        match self {
            Self::Cluster => {
                let old = super::from_storage(current)?;
                super::prepare_delete(&old, propagation)
                    .map(super::to_storage)
                    .transpose()
            }
            Self::Backup => {
                let old = super::backup::from_storage(current)?;
                super::backup::prepare_delete(&old, propagation)
                    .map(super::backup::to_storage)
                    .transpose()
            }
        }
    }

    /// A stored object in the version a client asked for.
    pub fn in_version(self, stored: Value, version: &str) -> Result<Value, ApiError> {
        if version == self.info().storage_version {
            // Stored objects are storage JSON already: no decode/encode round trip.
            return Ok(stored);
        }
        match self {
            Self::Cluster => super::to_version(super::from_storage(stored)?, version),
            Self::Backup => Err(ApiError::internal(format!(
                "EtcdBackup is not served in {version}"
            ))),
        }
    }

    /// A stored EtcdCluster as the hub (for the scale and snapshot subresources).
    pub fn cluster(stored: Value) -> Result<hub::EtcdCluster, ApiError> {
        super::from_storage(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resources_are_found_by_their_url_segment() {
        assert_eq!(Kind::for_resource("etcdclusters"), Some(Kind::Cluster));
        assert_eq!(Kind::for_resource("etcdbackups"), Some(Kind::Backup));
        assert_eq!(Kind::for_resource("pods"), None);
        assert!(Kind::Backup.serves("v1alpha2"));
        assert!(!Kind::Backup.serves("v1alpha1"));
        assert!(Kind::Cluster.has_subresource("snapshot"));
        assert!(!Kind::Backup.has_subresource("scale"));
    }

    #[test]
    fn backups_go_through_their_own_strategy() {
        let body = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdBackup",
            "metadata": {"name": "b"}, "spec": {"clusterName": "c"}});
        let (obj, typed) = Kind::Backup.decode(body.clone(), "v1alpha2").unwrap();
        assert!(Kind::Backup.check_types(&body, &typed).is_ok());
        let (stored, name, warnings) = Kind::Backup.create(obj, "ns").unwrap();
        assert_eq!(name, "b");
        assert!(warnings.is_empty());
        assert_eq!(stored["kind"], "EtcdBackup");
        assert!(Kind::Backup.delete(stored.clone(), None).unwrap().is_none());
        assert_eq!(
            Kind::Backup.in_version(stored.clone(), "v1alpha2").unwrap(),
            stored
        );
        // A cluster body sent to the backups endpoint is refused.
        let cluster = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "metadata": {"name": "x"}});
        assert_eq!(Kind::Backup.decode(cluster, "v1alpha2").unwrap_err().code, 400);
    }
}
