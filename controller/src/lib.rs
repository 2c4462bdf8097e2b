//! The EtcdCluster controller: observe members, plan one safe step, act through a runtime.
//!
//! - [`plan`] decides the next step from data (pure);
//! - [`member_ops`] talks to etcd (member list, status, learner add/promote, remove, move leader,
//!   snapshots) behind the `MemberOps` seam;
//! - [`outcome`] types what a step did or why it failed (stable reasons for status);
//! - [`runtime`] places members: local etcd processes or Kubernetes Pods;
//! - [`status`] computes what the status says (pure);
//! - [`metrics`] keeps the Prometheus series of reconciles, clusters, members and backups;
//! - [`maintenance`] decides which members are due for defragmentation (pure);
//! - [`template`] hashes the member template, so a changed one is rolled out;
//! - [`shard`] says which clusters this replica reconciles (shards held through Leases);
//! - [`reconcile`] is the kube-runtime `Controller` that ties them together;
//! - [`cluster_watch`] is the EtcdCluster watch it and the backup controller run on.

pub mod backup;
pub mod backup_policy;
pub mod backup_store;
pub mod cluster_watch;
pub mod etcd_args;
pub mod maintenance;
pub mod member_ops;
pub mod metrics;
pub mod model;
pub mod outcome;
pub mod plan;
pub mod reconcile;
pub mod resources;
pub mod restore;
pub mod runtime;
pub mod shard;
pub(crate) mod sparse;
pub mod status;
pub mod template;
pub mod tls;
pub mod validated;
