//! The `kubectl-etcd` plugin binary of this workspace, built once per test process with cargo
//! (as [`crate::operator::operator_binary`] builds the operator) so a test never runs a stale
//! one, and run against a [`LocalOperator`] with the kubeconfig it wrote.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::operator::LocalOperator;
use crate::tools;

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
        .get_or_init(|| {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let out = Command::new(cargo)
                .current_dir(tools::workspace_root())
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "kubectl-etcd",
                    "--bin",
                    "kubectl-etcd",
                    "--message-format=json",
                ])
                .output()
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(String::from_utf8_lossy(&out.stderr).into_owned());
            }
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "kubectl-etcd")
                .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
                .next_back()
                .ok_or_else(|| "cargo build reported no kubectl-etcd executable".to_string())
        })
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
