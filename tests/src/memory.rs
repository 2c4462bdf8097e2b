//! The resident memory of a process, from `/proc/<pid>/status`: the current size (`VmRSS`) and
//! the peak (`VmHWM`), which [`reset_peak`] starts again (`/proc/<pid>/clear_refs`, Linux ≥ 4.0),
//! and a [`PeakSampler`] that also follows `VmRSS` every few milliseconds, for a second opinion.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Reading or resetting a process's memory figures failed.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// `/proc/<pid>/...` could not be read or written.
    #[error("{op} /proc/{pid}")]
    Proc {
        /// What was done.
        op: &'static str,
        /// The process.
        pid: u32,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The status file lacks a field.
    #[error("/proc/{pid}/status has no {field}")]
    Missing {
        /// The process.
        pid: u32,
        /// The field.
        field: &'static str,
    },
}

/// Memory figures of a process, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Resident now (`VmRSS`).
    pub rss_kib: u64,
    /// Peak resident since start or the last [`reset_peak`] (`VmHWM`).
    pub peak_kib: u64,
}

fn field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Reads the memory figures of `pid`.
pub fn read(pid: u32) -> Result<Memory, MemoryError> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|source| MemoryError::Proc {
            op: "read status of",
            pid,
            source,
        })?;
    Ok(Memory {
        rss_kib: field(&status, "VmRSS").ok_or(MemoryError::Missing { pid, field: "VmRSS" })?,
        peak_kib: field(&status, "VmHWM").ok_or(MemoryError::Missing { pid, field: "VmHWM" })?,
    })
}

/// Starts the peak (`VmHWM`) of `pid` again from its current resident size.
pub fn reset_peak(pid: u32) -> Result<(), MemoryError> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").map_err(|source| MemoryError::Proc {
        op: "reset peak RSS (clear_refs) of",
        pid,
        source,
    })
}

/// Samples `VmRSS` of a process on a thread until dropped; [`Self::peak_kib`] is the largest seen.
#[derive(Debug)]
pub struct PeakSampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeakSampler {
    /// Samples `pid` every `every`.
    pub fn start(pid: u32, every: Duration) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&peak), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Ok(m) = read(pid) {
                    p.fetch_max(m.rss_kib, Ordering::Relaxed);
                }
                std::thread::sleep(every);
            }
        });
        Self {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    /// The largest `VmRSS` seen so far, in KiB.
    pub fn peak_kib(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for PeakSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_figures_and_its_peak_can_be_reset() {
        let pid = std::process::id();
        let before = read(pid).unwrap();
        assert!(before.rss_kib > 0 && before.peak_kib >= before.rss_kib);
        reset_peak(pid).unwrap();
        let sampler = PeakSampler::start(pid, Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(20));
        assert!(sampler.peak_kib() > 0);
        assert!(read(pid).is_ok());
        assert!(matches!(read(u32::MAX), Err(MemoryError::Proc { .. })));
    }
}
