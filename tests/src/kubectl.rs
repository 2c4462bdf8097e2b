//! kubectl against a [`LocalOperator`] for the suites and benches: a runner that returns stdout
//! or a typed error carrying stderr and the operator's log, `apply` of a manifest, a JSON getter,
//! a wait that polls an object (or its status) until a predicate holds, failing with what it
//! waited for and the last value seen, and a status condition lookup.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::LocalOperator;
use crate::tools::MissingTool;

/// How often [`wait_for`] polls unless told otherwise.
pub const POLL: Duration = Duration::from_millis(200);

/// A kubectl invocation failed, or a wait ran out of time.
///
/// `Debug` prints the same text as `Display`, so that a test's `.unwrap()` shows kubectl's stderr
/// and the operator's log as readable lines.
#[derive(thiserror::Error)]
pub enum KubectlError {
    /// kubectl is not installed.
    #[error(transparent)]
    Missing(#[from] MissingTool),
    /// kubectl could not be started, fed its stdin or waited for.
    #[error("kubectl {args:?}")]
    Io {
        args: Vec<String>,
        source: std::io::Error,
    },
    /// It ran and exited unsuccessfully.
    #[error("kubectl {args:?} failed ({status}):\nstdout: {stdout}\nstderr: {stderr}\noperator log:\n{log}")]
    Failed {
        args: Vec<String>,
        status: std::process::ExitStatus,
        stdout: String,
        stderr: String,
        log: String,
    },
    /// It printed something that is not JSON where JSON was asked for.
    #[error("kubectl {args:?}: output is not JSON:\n{stdout}")]
    NotJson {
        args: Vec<String>,
        stdout: String,
        source: serde_json::Error,
    },
    /// The predicate did not hold within the timeout.
    #[error("timed out after {timeout:?} waiting for {what}; last {seen}: {last:#}\noperator log:\n{log}")]
    TimedOut {
        what: String,
        timeout: Duration,
        /// What `last` is, e.g. `ec/alpha status`.
        seen: String,
        last: Box<Value>,
        log: String,
    },
}

/// The message and its causes (a failed `unwrap` prints this): readable, where the derived
/// `Debug` would escape the streams and the log into one line.
impl std::fmt::Debug for KubectlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)?;
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_string()).collect()
}

/// Runs `cmd` (a kubectl command with its arguments) with `stdin` written to it, or with stdin
/// closed; returns its output whatever the exit status. `args` names the command in an error.
pub fn run_with_stdin(mut cmd: Command, args: &[&str], stdin: Option<&str>) -> Result<Output, KubectlError> {
    let io = |source| KubectlError::Io {
        args: owned(args),
        source,
    };
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().map_err(io)?;
    if let Some(input) = stdin
        && let Some(mut pipe) = child.stdin.take()
    {
        pipe.write_all(input.as_bytes()).map_err(io)?;
    }
    child.wait_with_output().map_err(io)
}

/// stdout of a finished kubectl `args` if it exited successfully; otherwise [`KubectlError::Failed`]
/// with both streams and `log` (the operator's log tail).
pub fn stdout(args: &[&str], out: Output, log: impl FnOnce() -> String) -> Result<String, KubectlError> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(KubectlError::Failed {
            args: owned(args),
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            log: log(),
        })
    }
}

/// Runs kubectl `args` against the operator (with `stdin`, if given); its output whatever the
/// exit status.
pub fn output(op: &LocalOperator, args: &[&str], stdin: Option<&str>) -> Result<Output, KubectlError> {
    let mut cmd = op.kubectl()?;
    cmd.args(args);
    run_with_stdin(cmd, args, stdin)
}

/// Runs kubectl `args` against the operator (with `stdin`, if given); stdout, or an error with
/// stderr and the operator's log.
pub fn kubectl(op: &LocalOperator, args: &[&str], stdin: Option<&str>) -> Result<String, KubectlError> {
    stdout(args, output(op, args, stdin)?, || op.log_tail())
}

/// `kubectl apply -f -` with `manifest` on stdin; stdout, or an error as from [`kubectl`].
pub fn apply(op: &LocalOperator, manifest: &str) -> Result<String, KubectlError> {
    kubectl(op, &["apply", "-f", "-"], Some(manifest))
}

/// `kubectl get RESOURCE NAME -o json`, parsed.
pub fn get(op: &LocalOperator, resource: &str, name: &str) -> Result<Value, KubectlError> {
    let args = ["get", resource, name, "-o", "json"];
    let text = kubectl(op, &args, None)?;
    serde_json::from_str(&text).map_err(|source| KubectlError::NotJson {
        args: owned(&args),
        stdout: text,
        source,
    })
}

/// The object's `status`.
pub fn status(op: &LocalOperator, resource: &str, name: &str) -> Result<Value, KubectlError> {
    Ok(get(op, resource, name)?["status"].clone())
}

/// What a wait reads and how often: a whole object or only its status, every [`POLL`] unless
/// [`Watched::every`] says otherwise.
#[derive(Debug, Clone, Copy)]
pub struct Watched<'a> {
    resource: &'a str,
    name: &'a str,
    status_only: bool,
    every: Duration,
}

impl<'a> Watched<'a> {
    /// The whole object `resource/name`.
    pub fn object(resource: &'a str, name: &'a str) -> Self {
        Self {
            resource,
            name,
            status_only: false,
            every: POLL,
        }
    }

    /// Only the `status` of `resource/name`.
    pub fn status(resource: &'a str, name: &'a str) -> Self {
        Self {
            status_only: true,
            ..Self::object(resource, name)
        }
    }

    /// Polls every `every` instead of every [`POLL`].
    pub fn every(self, every: Duration) -> Self {
        Self { every, ..self }
    }
}

/// Polls `watched` until `check` holds for what it reads and returns that; after `timeout`, an
/// error naming `what` with the last value seen and the operator's log.
pub async fn wait_for(
    op: &LocalOperator,
    watched: Watched<'_>,
    what: &str,
    timeout: Duration,
    mut check: impl FnMut(&Value) -> bool,
) -> Result<Value, KubectlError> {
    let Watched {
        resource,
        name,
        status_only,
        every,
    } = watched;
    let deadline = Instant::now() + timeout;
    loop {
        let obj = get(op, resource, name)?;
        let seen = if status_only { obj["status"].clone() } else { obj };
        if check(&seen) {
            return Ok(seen);
        }
        if Instant::now() >= deadline {
            return Err(KubectlError::TimedOut {
                what: what.to_string(),
                timeout,
                seen: format!("{resource}/{name}{}", if status_only { " status" } else { "" }),
                last: Box::new(seen),
                log: op.log_tail(),
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// The condition of type `type_` in a status (`status.conditions`), if present.
pub fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
}

/// `status.clientEndpoints` of an EtcdCluster status, as strings (empty when absent).
pub fn client_endpoints(status: &Value) -> Vec<String> {
    status["clientEndpoints"]
        .as_array()
        .map(|eps| eps.iter().filter_map(|e| e.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// How many reconciles the operator has finished (`etcd_operator_reconcile_duration_seconds_count`
/// from `/metrics`), if it answers.
pub fn reconciles(op: &LocalOperator) -> Option<u64> {
    let text = kubectl(op, &["get", "--raw", "/metrics"], None).ok()?;
    text.lines()
        .filter(|l| l.starts_with("etcd_operator_reconcile_duration_seconds_count"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .reduce(|a, b| a + b)
}

/// Waits until the operator has finished `more` reconciles after this call: a check that nothing
/// happens (no restart, no retry) then rests on the operator having looked again, not on a fixed
/// sleep. Fails with `what` when `timeout` passes first.
pub async fn wait_reconciles(
    op: &LocalOperator,
    more: u64,
    what: &str,
    timeout: Duration,
) -> Result<(), String> {
    let began = std::time::Instant::now();
    let mut start = None;
    loop {
        let now = reconciles(op);
        match (start, now) {
            (None, Some(n)) => start = Some(n),
            (Some(s), Some(n)) if n >= s + more => return Ok(()),
            _ => {}
        }
        if began.elapsed() > timeout {
            return Err(format!(
                "{what}: the operator did not reconcile {more} more times within {timeout:?} (from {start:?}, now {now:?})"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}
