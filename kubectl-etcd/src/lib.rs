//! The `kubectl etcd` plugin's logic, apart from its I/O where it can be: the command line, the
//! status rendering, the annotation requests and their checks, the etcdctl environment, and the
//! snapshot download. The binary (`src/main.rs`) wires them to a kube client.

pub mod cli;
pub mod env;
pub mod render;
pub mod requests;
pub mod snapshot;
