//! EtcdCluster API: the versioned wire types, the hub, conversion, defaulting, validation and
//! OpenAPI generation. Pure code: no I/O, no async runtime.
//!
//! The request path of the API server uses this crate in the order k8s.io/apiserver does:
//! [`decode`] the body (any served version) → [`defaults::apply`] in the version sent →
//! [`convert::to_hub`] → [`validation::validate`] / [`validation::validate_update`] (errors with
//! field paths, warnings) → store the hub ([`v1alpha2`]) → [`convert::from_hub`] into the version
//! the client asked for.

#[macro_use]
mod macros;

pub mod backup;
pub mod convert;
pub mod defaults;
pub mod naming;
pub mod openapi;
pub mod quantity;
pub mod report;
pub mod status;
pub mod v1alpha1;
pub mod v1alpha2;
pub mod validation;
pub mod versions;

mod decode;
mod resource;

pub use decode::{DecodeError, VersionedCluster, decode, decode_value};

/// The API group every resource of this project belongs to.
pub const GROUP: &str = "etcd.operator.dev";
/// The kind of the cluster resource.
pub const KIND: &str = "EtcdCluster";
/// The kind of a list of clusters.
pub const LIST_KIND: &str = "EtcdClusterList";
/// The plural resource name (URL path segment).
pub const RESOURCE: &str = "etcdclusters";
/// The singular resource name.
pub const SINGULAR: &str = "etcdcluster";
/// The short names `kubectl` accepts.
pub const SHORT_NAMES: &[&str] = &["ec"];
/// The hub, storage and preferred version.
pub const HUB_VERSION: &str = v1alpha2::VERSION;
/// Every served version, preferred first.
pub const SERVED_VERSIONS: &[&str] = &[v1alpha2::VERSION, v1alpha1::VERSION];
/// The controller's finalizer on EtcdClusters: deleting one stops its members and removes their
/// data first. The controller adds it when missing; a server whose controller manages the
/// cluster's namespace adds it at create.
pub const CLEANUP_FINALIZER: &str = "etcd.operator.dev/cleanup";
