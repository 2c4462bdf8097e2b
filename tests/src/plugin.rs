//! The `kubectl-etcd` plugin binary of this workspace, built once per test process with cargo
//! ([`crate::cargo_bin`]) so a test never runs a stale one, and run against a [`LocalOperator`] with the kubeconfig it wrote.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::operator::LocalOperator;

/// Why the plugin could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// `cargo build` failed (its stderr), or named no executable.
    #[error("building kubectl-etcd failed: {0}")]
    Build(String),
    /// The process could not be started or waited for.
    #[error("run kubectl-etcd")]
    Run(#[source] std::io::Error),
}

/// The `kubectl-etcd` binary, built with cargo.
pub fn plugin_binary() -> Result<PathBuf, PluginError> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| crate::cargo_bin::build("kubectl-etcd", "kubectl-etcd"))
        .clone()
        .map_err(PluginError::Build)
}

/// Runs `kubectl-etcd --kubeconfig <op's> ARGS` with `stdin` (none: `/dev/null`, never a
/// terminal) and returns what it did.
pub fn run(op: &LocalOperator, args: &[&str], stdin: Option<&str>) -> Result<Output, PluginError> {
    let mut cmd = Command::new(plugin_binary()?);
    cmd.arg("--kubeconfig")
        .arg(op.kubeconfig())
        .args(args)
        .env_remove("KUBECONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().map_err(PluginError::Run)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(PluginError::Run)?;
    }
    child.wait_with_output().map_err(PluginError::Run)
}
