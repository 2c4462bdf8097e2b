//! The `etcd-operator` binary's wiring, as a library so its tests can reach it: local mode (a
//! backing etcd, the API server and the controller with the local-process runtime, all under one
//! state directory) and serve mode (inside a Kubernetes cluster, behind the aggregator, with
//! leader election). The API server itself is the `etcd-operator-apiserver` crate; the reconcile
//! logic is `etcd-operator-controller`.

pub mod allocator;
pub mod controller_init;
pub mod flags;
pub mod local;
pub mod serve_mode;
pub mod snapshots;
