//! The aggregated API server for `etcd.operator.dev`: serving, storage, discovery and OpenAPI.
