//! Finds processes that outlived the test that started them.
//!
//! Every process started through [`crate::process::TestProcess`] carries
//! [`crate::process::OWNER_ENV`] = `<pid>:<starttime>` of its test process, and children inherit
//! it. A marked process whose owner no longer runs (the pid is gone or was reused, which the start
//! time tells apart) is a leftover.

use std::path::Path;

/// A process that should not be running any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// Its pid.
    pub pid: u32,
    /// Its command line, arguments joined by spaces.
    pub cmdline: String,
    /// Why it counts as a leftover.
    pub reason: String,
}

/// `<pid>:<starttime>` of the current process.
pub fn owner_token() -> String {
    let pid = std::process::id();
    format!("{pid}:{}", start_time(pid).unwrap_or_default())
}

/// The start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`) of a process.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

fn owner_of(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let key = format!("{}=", crate::process::OWNER_ENV);
    env.split(|b| *b == 0).find_map(|kv| {
        kv.strip_prefix(key.as_bytes())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
}

fn owner_alive(token: &str) -> bool {
    let Some((pid, start)) = token.split_once(':') else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    start_time(pid) == Some(start)
}

/// Processes marked by a test whose test process has ended.
pub fn orphaned_test_processes() -> Vec<Leftover> {
    pids()
        .into_iter()
        .filter_map(|pid| {
            let owner = owner_of(pid)?;
            if owner_alive(&owner) {
                return None;
            }
            // A zombie already exited; its parent will reap it.
            if std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()?
                .rsplit(')')
                .next()?
                .trim_start()
                .starts_with('Z')
            {
                return None;
            }
            Some(Leftover {
                pid,
                cmdline: cmdline(pid).unwrap_or_default().join(" "),
                reason: format!("its test process {owner} has ended"),
            })
        })
        .collect()
}

/// Processes whose executable or script (first two command-line words) lies under `dir`.
pub fn processes_running_from(dir: &Path) -> Vec<Leftover> {
    let me = std::process::id();
    pids()
        .into_iter()
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            let args = cmdline(pid)?;
            let from_dir = exe.as_deref().is_some_and(|e| e.starts_with(dir))
                || args.iter().take(2).any(|a| Path::new(a).starts_with(dir));
            from_dir.then(|| Leftover {
                pid,
                cmdline: args.join(" "),
                reason: format!("it runs a binary from {}", dir.display()),
            })
        })
        .collect()
}

/// SIGKILLs every process (but this one) whose command line mentions `dir`, and waits (up to
/// 5 s) until they are gone. Used to clean up what an operator under test started.
pub fn kill_processes_mentioning(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    let victims: Vec<u32> = pids()
        .into_iter()
        .filter(|pid| *pid != me)
        .filter(|pid| cmdline(*pid).is_some_and(|args| args.iter().any(|a| a.contains(&needle))))
        .collect();
    for pid in &victims {
        if let Ok(pid) = i32::try_from(*pid) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline && victims.iter().any(|p| is_running(*p)) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether a pid runs (a zombie does not count).
pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|rest| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_token_is_alive_and_a_dead_one_is_not() {
        assert!(owner_alive(&owner_token()));
        // Same pid, another start time: a reused pid is not the owner.
        let pid = std::process::id();
        assert!(!owner_alive(&format!("{pid}:1")));
        assert!(!owner_alive("garbage"));
        assert!(!owner_alive("4194304999:5"));
    }

    #[test]
    fn finds_an_orphan_and_not_a_live_child() {
        // A child marked with a dead owner is found; one marked with ours is not.
        let mut orphan = std::process::Command::new("sleep")
            .arg("30")
            .env(crate::process::OWNER_ENV, format!("{}:1", std::process::id()))
            .spawn()
            .unwrap();
        let mut ours = std::process::Command::new("sleep")
            .arg("30")
            .env(crate::process::OWNER_ENV, owner_token())
            .spawn()
            .unwrap();
        // Until a child has called exec, its environment is still ours (without the marker): poll
        // until both children run `sleep`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let execed = |pid: u32| cmdline(pid).is_some_and(|a| a.first().is_some_and(|c| c == "sleep"));
        while !(execed(orphan.id()) && execed(ours.id())) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let found = orphaned_test_processes();
        let _ = orphan.kill();
        let _ = ours.kill();
        let _ = orphan.wait();
        let _ = ours.wait();
        assert!(found.iter().any(|l| l.pid == orphan.id()), "{found:?}");
        assert!(!found.iter().any(|l| l.pid == ours.id()), "{found:?}");
    }
}
