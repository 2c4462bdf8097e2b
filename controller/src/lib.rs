//! The EtcdCluster controller: observe members, plan one safe step, act through a runtime.
//!
//! - [`plan`] decides the next step from data (pure);
//! - [`etcd`] talks to etcd (member list, status, learner add/promote, remove, move leader);
//! - [`runtime`] places members: local etcd processes or Kubernetes Pods;
//! - [`status`] computes what the status says (pure);
//! - [`reconcile`] is the kube-runtime `Controller` that ties them together.

pub mod backup;
pub mod etcd;
pub mod model;
pub mod plan;
pub mod reconcile;
pub mod resources;
pub mod restore;
pub mod runtime;
pub mod status;
