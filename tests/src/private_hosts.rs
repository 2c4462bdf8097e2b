//! Runs a test in a private mount namespace whose `/etc/hosts` is a file of the test's own, so
//! names that only a cluster's DNS would know (`<member>.<cluster>.<namespace>.svc`) resolve on
//! this machine for the test, the processes it starts and nothing else.
//!
//! The test calls [`enter`] first. Outside the namespace that re-runs the same test binary, for
//! this one test, under `unshare --mount` with the file bind-mounted on `/etc/hosts`, waits for
//! it and returns `None` (the re-run's result is the test's result). Inside it returns the hosts
//! file, which the test's node agent appends to. Needs root and `unshare` (util-linux).

use std::path::PathBuf;
use std::process::Command;

/// Set in the re-run: the hosts file mounted on `/etc/hosts`.
pub const HOSTS_ENV: &str = "ETCD_OPERATOR_TEST_HOSTS";

/// Entering the private namespace failed, or the test failed inside it.
#[derive(Debug, thiserror::Error)]
pub enum PrivateHostsError {
    /// The hosts file or its directory could not be prepared.
    #[error("prepare the private hosts file")]
    Prepare(#[from] std::io::Error),
    /// `unshare` could not be run.
    #[error("run `unshare --mount` (util-linux; the test needs root to mount its own /etc/hosts): {0}")]
    Unshare(std::io::Error),
    /// The re-run ran no test of that name.
    #[error("the re-run in a private mount namespace ran no test named {0:?}")]
    NotRun(String),
    /// The test failed in the private namespace.
    #[error("the test failed in its private mount namespace ({0}); its output is above")]
    Failed(std::process::ExitStatus),
}

/// The hosts file when running inside the private namespace; `None` after the test ran (and
/// passed) in a re-run inside one.
pub fn enter(test: &str) -> Result<Option<PathBuf>, PrivateHostsError> {
    if let Some(hosts) = std::env::var_os(HOSTS_ENV) {
        // Tell the caller the test did run here (a wrong name would run none and pass).
        std::fs::write(PathBuf::from(&hosts).with_extension("ran"), test)?;
        return Ok(Some(PathBuf::from(hosts)));
    }
    let dir = tempfile::Builder::new()
        .prefix("etcd-operator-hosts-")
        .tempdir()?;
    let hosts = dir.path().join("hosts");
    crate::node_agent::seed_hosts(&hosts)?;
    let exe = std::env::current_exe()?;
    let status = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" /etc/hosts && shift && exec "$@""#)
        .arg("sh")
        .arg(&hosts)
        .arg(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(HOSTS_ENV, &hosts)
        .status()
        .map_err(PrivateHostsError::Unshare)?;
    if !status.success() {
        return Err(PrivateHostsError::Failed(status));
    }
    if hosts.with_extension("ran").is_file() {
        Ok(None)
    } else {
        Err(PrivateHostsError::NotRun(test.to_owned()))
    }
}
