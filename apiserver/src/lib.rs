//! The aggregated API server for `etcd.operator.dev`: serving, storage, discovery and OpenAPI.

pub mod cluster;
pub mod http;
pub mod local;
pub mod registry;
pub mod serve;
pub mod storage;
