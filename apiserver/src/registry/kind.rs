//! The table of served resources: each entry is a [`Store`](super::strategy::Store) over its
//! strategy, behind one interface. The HTTP handlers, discovery, watch, Tables and storage are
//! written once against [`Kind`]; adding a resource is a strategy and one entry in [`ALL`].

use etcd_operator_api::backup as backup_api;
use serde_json::Value;

use super::backup::BACKUPS;
use super::cluster::CLUSTERS;
use super::decode::Findings;
use super::event::EVENTS;
use super::printers::Printer;
use super::strategy::{RequestObject, Resource, Write};
use crate::error::ApiError;

/// What discovery, OpenAPI and routing need to know about a resource.
#[derive(Debug)]
pub struct KindInfo {
    /// API group: `etcd.operator.dev`, or `""` for the legacy core group at `/api`.
    pub group: &'static str,
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
    /// Where its objects live in the backing etcd:
    /// `/registry/etcd.operator.dev/<resource>/` (then `<namespace>/<name>`).
    pub storage_prefix: &'static str,
    /// Field selector paths besides `metadata.name` and `metadata.namespace`.
    pub field_selectors: &'static [&'static str],
}

/// `etcdclusters`: v1alpha1 and v1alpha2; status, scale and snapshot subresources.
pub static CLUSTER_INFO: KindInfo = KindInfo {
    group: etcd_operator_api::GROUP,
    resource: etcd_operator_api::RESOURCE,
    kind: etcd_operator_api::KIND,
    list_kind: etcd_operator_api::LIST_KIND,
    singular: etcd_operator_api::SINGULAR,
    short_names: etcd_operator_api::SHORT_NAMES,
    categories: &["all", "etcd"],
    versions: etcd_operator_api::SERVED_VERSIONS,
    storage_version: etcd_operator_api::HUB_VERSION,
    subresources: &["status", "scale", "snapshot"],
    storage_prefix: "/registry/etcd.operator.dev/etcdclusters/",
    field_selectors: &[],
};

/// `etcdbackups`: v1alpha2; status subresource.
pub static BACKUP_INFO: KindInfo = KindInfo {
    group: etcd_operator_api::GROUP,
    resource: backup_api::RESOURCE,
    kind: backup_api::KIND,
    list_kind: backup_api::LIST_KIND,
    singular: backup_api::SINGULAR,
    short_names: backup_api::SHORT_NAMES,
    categories: &["etcd"],
    versions: &[backup_api::VERSION],
    storage_version: backup_api::VERSION,
    subresources: &["status"],
    storage_prefix: "/registry/etcd.operator.dev/etcdbackups/",
    field_selectors: &[],
};

/// `events` of the core group (`/api/v1`), served in local mode only: there is no
/// kube-apiserver to hold the controller's Events. Stored where kube-apiserver keeps them.
pub static EVENT_INFO: KindInfo = KindInfo {
    group: "",
    resource: "events",
    kind: "Event",
    list_kind: "EventList",
    singular: "event",
    short_names: &["ev"],
    categories: &[],
    versions: &["v1"],
    storage_version: "v1",
    subresources: &[],
    storage_prefix: "/registry/events/",
    // kube-apiserver's `EventToSelectableFields`, less `source` (nothing here writes it for
    // selection) and with `metadata.*` handled for every kind.
    field_selectors: &[
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "type",
    ],
};

/// A served resource: a handle on its store in the table.
#[derive(Clone, Copy)]
pub struct Kind(&'static dyn Resource);

impl Kind {
    /// `etcdclusters`.
    pub const CLUSTER: Kind = Kind(&CLUSTERS);
    /// `etcdbackups`.
    pub const BACKUP: Kind = Kind(&BACKUPS);
    /// Core `events` (local mode).
    pub const EVENT: Kind = Kind(&EVENTS);
}

/// Every resource this server can serve, in discovery order.
pub const ALL: [Kind; 3] = [Kind::CLUSTER, Kind::BACKUP, Kind::EVENT];

/// The resources of the `etcd.operator.dev` group: what `serve` mode (behind the aggregator)
/// serves. Local mode serves [`ALL`].
pub const GROUP_KINDS: [Kind; 2] = [Kind::CLUSTER, Kind::BACKUP];

impl PartialEq for Kind {
    fn eq(&self, other: &Self) -> bool {
        self.info().resource == other.info().resource
    }
}

impl Eq for Kind {}

impl std::hash::Hash for Kind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.info().resource.hash(state);
    }
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kind({})", self.info().resource)
    }
}

impl Kind {
    /// The resource of a URL segment.
    pub fn for_resource(resource: &str) -> Option<Self> {
        ALL.into_iter().find(|k| k.info().resource == resource)
    }

    /// The resource's description.
    pub fn info(self) -> &'static KindInfo {
        self.0.info()
    }

    /// Its `kubectl get` columns.
    pub fn printer(self) -> &'static Printer {
        self.0.printer()
    }

    /// `apiVersion` of its objects in `version`: `<group>/<version>`, or `v1` in the core group.
    pub fn api_version(self, version: &str) -> String {
        match self.info().group {
            "" => version.to_owned(),
            group => format!("{group}/{version}"),
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

    /// Decodes a request body for `version`; also returns what the typed object does not keep
    /// of it (unknown fields, mistyped containers).
    pub fn decode(self, value: &Value, version: &str) -> Result<(RequestObject, Findings), ApiError> {
        self.0.decode(value, version)
    }

    /// [`super::check_types_of`] for this kind.
    pub fn check_types(self, input: &Value, findings: &Findings) -> Result<(), ApiError> {
        super::check_types_of(self.info().kind, input, findings)
    }

    /// Create: the object to store, its name and the warnings.
    pub fn create(
        self,
        obj: RequestObject,
        namespace: &str,
    ) -> Result<(Value, String, Vec<String>), ApiError> {
        self.0.create(obj, namespace)
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
        self.0.update(obj, current, name, namespace, require_rv)
    }

    /// Update of the `status` subresource: the object to store.
    pub fn update_status(
        self,
        obj: &RequestObject,
        current: Value,
        name: &str,
        require_rv: bool,
    ) -> Result<Value, ApiError> {
        self.0.update_status(obj, current, name, require_rv)
    }

    /// Delete: the object marked for deletion, or `None` to delete it now.
    pub fn delete(self, current: Value, propagation: Option<&str>) -> Result<Option<Value>, ApiError> {
        self.0.delete(current, propagation)
    }

    /// A stored object in the version a client asked for.
    pub fn in_version(self, stored: Value, version: &str) -> Result<Value, ApiError> {
        self.0.in_version(stored, version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resources_are_found_by_their_url_segment() {
        assert_eq!(Kind::for_resource("etcdclusters"), Some(Kind::CLUSTER));
        assert_eq!(Kind::for_resource("etcdbackups"), Some(Kind::BACKUP));
        assert_eq!(Kind::for_resource("pods"), None);
        assert!(Kind::BACKUP.serves("v1alpha2"));
        assert!(!Kind::BACKUP.serves("v1alpha1"));
        assert!(Kind::CLUSTER.has_subresource("snapshot"));
        assert!(!Kind::BACKUP.has_subresource("scale"));
    }

    #[test]
    fn every_resource_has_its_own_storage_prefix_under_the_group() {
        let prefixes: Vec<&str> = ALL.iter().map(|k| k.info().storage_prefix).collect();
        for (k, p) in ALL.iter().zip(&prefixes) {
            match k.info().group {
                "" => assert_eq!(*p, format!("/registry/{}/", k.info().resource)),
                g => assert_eq!(*p, format!("/registry/{g}/{}/", k.info().resource)),
            }
        }
        let mut unique = prefixes.clone();
        unique.dedup();
        assert_eq!(unique.len(), ALL.len());
        assert!(
            GROUP_KINDS
                .iter()
                .all(|k| k.info().group == etcd_operator_api::GROUP)
        );
        assert_eq!(Kind::EVENT.api_version("v1"), "v1");
        for k in ALL {
            let core = crate::error::CORE_RESOURCES.contains(&k.info().resource);
            assert_eq!(core, k.info().group.is_empty(), "{k:?}");
        }
        assert_eq!(crate::error::qualified_resource("events"), "events");
        assert_eq!(Kind::BACKUP.api_version("v1alpha2"), "etcd.operator.dev/v1alpha2");
    }

    #[test]
    fn a_request_object_of_one_resource_is_refused_by_another() {
        let body = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdBackup",
            "metadata": {"name": "b"}, "spec": {"clusterName": "c"}});
        let (obj, _) = Kind::BACKUP.decode(&body, "v1alpha2").unwrap();
        let err = Kind::CLUSTER.create(obj, "ns").unwrap_err();
        assert_eq!(err.code, 500);
    }

    #[test]
    fn backups_go_through_their_own_strategy() {
        let body = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdBackup",
            "metadata": {"name": "b"}, "spec": {"clusterName": "c"}});
        let (obj, findings) = Kind::BACKUP.decode(&body, "v1alpha2").unwrap();
        assert!(Kind::BACKUP.check_types(&body, &findings).is_ok());
        let (stored, name, warnings) = Kind::BACKUP.create(obj, "ns").unwrap();
        assert_eq!(name, "b");
        assert!(warnings.is_empty());
        assert_eq!(stored["kind"], "EtcdBackup");
        assert!(Kind::BACKUP.delete(stored.clone(), None).unwrap().is_none());
        assert_eq!(
            Kind::BACKUP.in_version(stored.clone(), "v1alpha2").unwrap(),
            stored
        );
        // A cluster body sent to the backups endpoint is refused.
        let cluster = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "metadata": {"name": "x"}});
        assert_eq!(Kind::BACKUP.decode(&cluster, "v1alpha2").unwrap_err().code, 400);
    }
}
