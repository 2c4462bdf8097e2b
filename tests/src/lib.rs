//! Test support for end-to-end suites: real etcd, kubectl, helm and an S3-compatible server,
//! each started on free loopback ports in a temporary directory and stopped when the test ends
//! (also when it panics: every process is owned by a guard that kills it on drop).
//!
//! Binaries come from `.tools/`, filled by `make tools`; [`tools`] is the one place that knows
//! where each one is. A missing component is an error naming the make target that installs it;
//! nothing is skipped silently.
//!
//! For the kubernetes runtime: an in-memory Kubernetes API ([`fake_kube`]), a test node agent
//! that runs member Pods as local etcd processes ([`node_agent`]) in a private mount namespace
//! whose `/etc/hosts` names them ([`private_hosts`]), and a real control plane from
//! `KUBEBUILDER_ASSETS` for `make test-kube` ([`envtest`]); for the fleet benchmark, a simulated
//! etcd behind the controller's member operations and a kubelet that runs nothing ([`fleet`]).

pub mod cargo_bin;
pub mod envtest;
pub mod error_messages;
pub mod etcd;
pub mod fake_kube;
#[cfg(feature = "fleet")]
pub mod fleet;
pub mod kube;
pub mod kube_client;
pub mod kubectl;
pub mod layering;
pub mod leftovers;
pub mod local_cluster;
pub mod memory;
pub mod node_agent;
pub mod operator;
pub mod plugin;
pub mod ports;
pub mod private_hosts;
pub mod process;
pub mod promql_refs;
#[cfg(feature = "fleet")]
pub mod robustness;
pub mod s3;
pub mod tools;
pub mod writer;

pub use etcd::TestEtcd;
pub use operator::LocalOperator;
pub use process::TestProcess;
pub use s3::S3Server;
pub use tools::{EtcdVersion, MissingTool};
