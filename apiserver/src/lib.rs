//! The aggregated API server for `etcd.operator.dev` as a library: HTTPS serving, delegated
//! authentication and authorization, discovery, OpenAPI, the registry and storage in the backing
//! etcd. The `etcd-operator` binary (crate `operator/`) wires it to the controller in local and
//! serve mode.

pub mod cluster;
pub mod error;
pub mod files;
pub mod http;
pub mod kubeconfig;
pub mod pki;
pub mod registry;
pub mod serve;
pub mod storage;
