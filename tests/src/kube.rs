//! kubectl and helm commands for tests, and running them with a readable failure.

use std::path::Path;
use std::process::{Command, Output};

use crate::tools::{self, MissingTool};

/// A kubectl or helm invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The binary is not installed.
    #[error(transparent)]
    Missing(#[from] MissingTool),
    /// The process could not be started.
    #[error("start {program}")]
    Start { program: String, source: std::io::Error },
    /// It ran and exited unsuccessfully.
    #[error("{command} failed ({status}):\nstdout: {stdout}\nstderr: {stderr}")]
    Failed {
        command: String,
        status: String,
        stdout: String,
        stderr: String,
    },
}

/// kubectl with `--kubeconfig` when one is given (and never the user's own `~/.kube/config`).
pub fn kubectl(kubeconfig: Option<&Path>) -> Result<Command, MissingTool> {
    let mut cmd = Command::new(tools::kubectl()?);
    isolate(&mut cmd, kubeconfig);
    Ok(cmd)
}

/// helm with `--kubeconfig` when one is given, with its caches in a place of the caller's choosing.
pub fn helm(kubeconfig: Option<&Path>, home: &Path) -> Result<Command, MissingTool> {
    let mut cmd = Command::new(tools::helm()?);
    isolate(&mut cmd, kubeconfig);
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    Ok(cmd)
}

fn isolate(cmd: &mut Command, kubeconfig: Option<&Path>) {
    match kubeconfig {
        Some(path) => cmd.env("KUBECONFIG", path),
        None => cmd.env("KUBECONFIG", "/dev/null"),
    };
}

/// Runs a command to completion; a non-zero exit is an error carrying both output streams.
pub fn run(cmd: &mut Command) -> Result<Output, RunError> {
    let command = format!("{cmd:?}");
    let output = cmd.output().map_err(|source| RunError::Start {
        program: cmd.get_program().to_string_lossy().into_owned(),
        source,
    })?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(RunError::Failed {
            command,
            status: output.status.to_string(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}
