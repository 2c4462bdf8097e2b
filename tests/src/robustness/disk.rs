//! Full-disk faults: a member's data directory is given a small file system of its own (a tmpfs
//! mounted over `<member>/data`, its contents copied in while the member is down and the operator
//! frozen, so nothing restarts it half-moved), then filled by a filler file until a write fails
//! with ENOSPC; the heal deletes the filler. etcd then meets a full disk wherever it next needs
//! a block: a new database page, a WAL segment, a snapshot file.
//!
//! Mounting needs root (CAP_SYS_ADMIN); without it the fault fails with a message saying so.
//! Every mount is detached (`umount --lazy`) when [`SmallDisks`] is dropped, also when the test
//! fails, so no tmpfs outlives the run.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::RobustnessError;
use super::faults::{self, Frozen};

/// Room left on a member's tmpfs above what its data used when it was moved there.
const HEADROOM: u64 = 256 << 20;

/// The name of the filler file, beside etcd's `member/` directory.
const FILLER: &str = "disk-fault-filler";

/// The tmpfs mounts made for members' data (member name → mount point).
#[derive(Debug, Default)]
pub struct SmallDisks {
    mounts: Mutex<BTreeMap<String, PathBuf>>,
}

/// Runs `cmd`; its failure (or absence) as a [`RobustnessError::Disk`].
fn run(cmd: &mut Command, what: &'static str) -> Result<(), RobustnessError> {
    let out = cmd.output().map_err(|source| RobustnessError::Disk {
        what,
        detail: source.to_string(),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(RobustnessError::Disk {
            what,
            detail: format!(
                "{} ({}){}",
                String::from_utf8_lossy(&out.stderr).trim(),
                out.status,
                if running_as_root() {
                    ""
                } else {
                    "; mounting a tmpfs needs root (CAP_SYS_ADMIN): run the suite as root"
                }
            ),
        })
    }
}

/// Whether this process runs with effective uid 0 (`/proc/self/status`).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// Bytes used under `dir` (`du -sb`).
fn used_bytes(dir: &Path) -> Result<u64, RobustnessError> {
    let out = Command::new("du")
        .arg("-sb")
        .arg(dir)
        .output()
        .map_err(|source| RobustnessError::Disk {
            what: "measure the member's data",
            detail: source.to_string(),
        })?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| RobustnessError::Disk {
            what: "measure the member's data",
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
}

/// Waits until `pid` has exited (a zombie counts: its files are closed).
async fn wait_gone(pid: u32) -> Result<(), RobustnessError> {
    let began = Instant::now();
    while crate::leftovers::is_running(pid) {
        if began.elapsed() > Duration::from_secs(10) {
            return Err(RobustnessError::Timeout {
                what: format!("pid {pid} to exit after SIGKILL"),
                timeout: Duration::from_secs(10),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

impl SmallDisks {
    /// Whether `member`'s data is on a tmpfs of its own.
    pub fn has(&self, member: &str) -> bool {
        self.mounts.lock().is_ok_and(|m| m.contains_key(member))
    }

    /// Moves `member`'s data onto a tmpfs of its own (what it uses plus [`HEADROOM`]): the operator
    /// is frozen, the member killed, its data copied onto the new mount at the same path; the
    /// operator, thawed, starts the member again on it. Nothing when it is there already.
    pub async fn move_onto_tmpfs(
        &self,
        op: &crate::LocalOperator,
        cluster: &str,
        member: &str,
    ) -> Result<(), RobustnessError> {
        if self.has(member) {
            return Ok(());
        }
        let dir = crate::local_cluster::member_dir(op, cluster, member);
        let data = dir.join("data");
        let aside = dir.join("data.before-tmpfs");
        let operator = op.pid().ok_or_else(|| RobustnessError::NoProcess {
            member: "the operator".into(),
        })?;
        let pid = faults::member_pid(op, cluster, member)?;
        // Frozen, the operator cannot start the member again while its data is in flight.
        let frozen = Frozen::freeze(operator)?;
        faults::sigkill(pid)?;
        wait_gone(pid).await?;
        let size = used_bytes(&data)? + HEADROOM;
        let moved = (|| {
            std::fs::rename(&data, &aside).map_err(|source| RobustnessError::Disk {
                what: "set the member's data aside",
                detail: source.to_string(),
            })?;
            std::fs::create_dir(&data).map_err(|source| RobustnessError::Disk {
                what: "create the mount point",
                detail: source.to_string(),
            })?;
            run(
                Command::new("mount")
                    .args(["-t", "tmpfs", "-o"])
                    .arg(format!("size={size},mode=0700"))
                    .arg("etcd-disk-fault")
                    .arg(&data),
                "mount a tmpfs over the member's data",
            )?;
            if let Ok(mut m) = self.mounts.lock() {
                m.insert(member.to_string(), data.clone());
            }
            run(
                Command::new("cp").arg("-a").arg(aside.join(".")).arg(&data),
                "copy the member's data onto the tmpfs",
            )?;
            std::fs::remove_dir_all(&aside).map_err(|source| RobustnessError::Disk {
                what: "remove the copied data",
                detail: source.to_string(),
            })
        })();
        frozen.thaw()?;
        moved
    }

    /// Fills `member`'s tmpfs: a filler file grows until a write fails with ENOSPC. The bytes
    /// written.
    pub fn fill(&self, member: &str) -> Result<u64, RobustnessError> {
        let data = self
            .mounts
            .lock()
            .ok()
            .and_then(|m| m.get(member).cloned())
            .ok_or_else(|| RobustnessError::Disk {
                what: "fill the member's disk",
                detail: format!("{member} has no tmpfs of its own"),
            })?;
        let mut file = std::fs::File::create(data.join(FILLER)).map_err(|source| RobustnessError::Disk {
            what: "create the filler",
            detail: source.to_string(),
        })?;
        let chunk = vec![0xa5_u8; 1 << 20];
        let mut written = 0_u64;
        let mut small = false;
        loop {
            let buf = if small { &chunk[..4096] } else { &chunk[..] };
            match file.write(buf) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) && !small => small = true,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => {
                    return Err(RobustnessError::Disk {
                        what: "fill the member's disk",
                        detail: e.to_string(),
                    });
                }
            }
        }
        Ok(written)
    }

    /// Deletes `member`'s filler: its disk has room again.
    pub fn heal(&self, member: &str) -> Result<(), RobustnessError> {
        let Some(data) = self.mounts.lock().ok().and_then(|m| m.get(member).cloned()) else {
            return Ok(());
        };
        match std::fs::remove_file(data.join(FILLER)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(RobustnessError::Disk {
                what: "delete the filler",
                detail: e.to_string(),
            }),
            _ => Ok(()),
        }
    }
}

impl Drop for SmallDisks {
    fn drop(&mut self) {
        let mounts = self.mounts.get_mut().map(std::mem::take).unwrap_or_default();
        // A removed member's directory is set aside with its mount inside it (a rename moves
        // the mount along): every mount under the clusters' directories goes, not only those at
        // the places they were made.
        let clusters: Vec<PathBuf> = mounts
            .values()
            .filter_map(|data| Some(data.parent()?.parent()?.to_path_buf()))
            .collect();
        let table = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut all = mounts_under(&table, &clusters);
        all.extend(mounts.into_values());
        all.sort();
        all.dedup();
        // Deepest first; lazy: a member still running keeps its files until it is stopped.
        for data in all.iter().rev() {
            let _ = Command::new("umount").arg("--lazy").arg(data).output();
        }
    }
}

/// The mount points in `table` (the text of `/proc/mounts`) under any of `dirs`.
fn mounts_under(table: &str, dirs: &[PathBuf]) -> Vec<PathBuf> {
    table
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .map(PathBuf::from)
        .filter(|point| dirs.iter().any(|d| point.starts_with(d) && point != d))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mounts_under_the_clusters_are_found_wherever_they_moved() {
        let table = "tmpfs /tmp/s/members/default/c/m1/data tmpfs rw 0 0\n\
                     tmpfs /tmp/s/members/default/c/.retained/removed/m2/data tmpfs rw 0 0\n\
                     tmpfs /tmp/other/members/default/c/m3/data tmpfs rw 0 0\n\
                     /dev/vda / ext4 rw 0 0\n";
        let found = mounts_under(table, &[PathBuf::from("/tmp/s/members/default/c")]);
        assert_eq!(
            found,
            [
                PathBuf::from("/tmp/s/members/default/c/m1/data"),
                PathBuf::from("/tmp/s/members/default/c/.retained/removed/m2/data"),
            ]
        );
        assert!(mounts_under(table, &[]).is_empty());
    }
}
