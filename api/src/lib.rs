//! EtcdCluster API: the versioned wire types, the hub, conversion, defaulting, validation and
//! OpenAPI generation. Pure code: no I/O, no async runtime.

/// The API group every resource of this project belongs to.
pub const GROUP: &str = "etcd.operator.dev";
