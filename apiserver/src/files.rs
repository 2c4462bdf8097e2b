//! Writing state files safely (certificates, kubeconfigs, the backing etcd's records): private
//! modes from the first byte, atomic replacement.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of private keys and kubeconfigs.
pub const PRIVATE: u32 = 0o600;
/// Mode of certificates and other non-secret state.
pub const PUBLIC: u32 = 0o644;

/// Writes `contents` to `path` atomically (a temporary sibling, fsynced, renamed over it), created
/// with `mode` so a secret is never readable by others, not even for a moment.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    // A leftover from a crash may have another mode: start afresh.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    // The umask may have cleared bits of `mode`; state it exactly.
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent()
        && let Ok(dir) = std::fs::File::open(dir)
    {
        // Best effort: makes the rename itself durable.
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Creates `dir` (and its parents) and restricts it to its owner.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Reads a file, or `None` when it does not exist.
pub fn read_optional(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
