//! The EtcdCluster controller: observe members, plan one safe step, act through a runtime.
//!
//! The reconcile machinery arrives with the controller issue; this crate exists so the workspace
//! has its final shape from the start.
