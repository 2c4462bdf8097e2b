//! A child process owned by a test: killed and reaped when its guard drops, also on panic.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::leftovers;

/// Set on every process a test starts (and inherited by what those start): `<pid>:<starttime>`
/// of the test process, so [`leftovers`] can find processes that outlived their test.
pub const OWNER_ENV: &str = "ETCD_OPERATOR_TEST_OWNER";

/// Starting a test process failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The log file could not be created.
    #[error("create log file {}", path.display())]
    CreateLog { path: PathBuf, source: std::io::Error },
    /// The program could not be executed.
    #[error("spawn {program}")]
    Spawn { program: String, source: std::io::Error },
}

/// A running child process with its output going to a log file.
#[derive(Debug)]
pub struct TestProcess {
    name: String,
    child: Child,
    log: PathBuf,
}

impl TestProcess {
    /// Starts `cmd` with stdout and stderr appended to `log`, marked as owned by this test process.
    pub fn spawn(name: impl Into<String>, mut cmd: Command, log: &Path) -> Result<Self, SpawnError> {
        let name = name.into();
        let out = File::create(log).map_err(|source| SpawnError::CreateLog {
            path: log.into(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| SpawnError::CreateLog {
            path: log.into(),
            source,
        })?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env(OWNER_ENV, leftovers::owner_token());
        let child = cmd.spawn().map_err(|source| SpawnError::Spawn {
            program: name.clone(),
            source,
        })?;
        Ok(Self {
            name,
            child,
            log: log.to_path_buf(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has ended, without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `max` bytes of the log, for error messages.
    pub fn log_tail(&self, max: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(max);
        let start = (start..=text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    /// Path of the log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Kills the process (SIGKILL) and reaps it. Idempotent.
    pub fn kill(&mut self) {
        if self.exited().is_none() {
            if let Err(error) = self.child.kill() {
                tracing::warn!(name = %self.name, %error, "kill test process");
            }
            let _ = self.child.wait();
        }
    }
}

impl Drop for TestProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
