//! Writing a stream of chunks to a file so that the file's final name only ever holds a complete
//! stream: the chunks go to a temporary file beside it, which is synced and renamed into place
//! once the stream ended cleanly, and removed when the stream (or the disk) failed. Memory is one
//! chunk at a time.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

use crate::member_ops::{SnapshotError, SnapshotStream, Verified};

/// A temporary name beside `path`, unique per call: `.<name>.<random>.partial`.
pub fn partial_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{:016x}.partial", rand::random::<u64>()))
}

/// Writes every chunk of `stream` to `path` through a temporary file (synced, then renamed, then
/// the directory synced); returns the bytes written. An error from the stream — which a checked
/// stream yields last when its check fails — or from the disk leaves nothing at `path` and no
/// temporary file. `io` names a failed file operation in the caller's error type.
pub async fn write_atomically<S: Into<E>, E>(
    mut stream: impl Stream<Item = Result<Bytes, S>> + Unpin,
    path: &Path,
    io: impl Fn(&'static str, &Path, std::io::Error) -> E,
) -> Result<u64, E> {
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| io("create directory", parent, e))?;
    }
    let partial = partial_path(path);
    let mut file = tokio::fs::File::create(&partial)
        .await
        .map_err(|e| io("create", &partial, e))?;
    let written = async {
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(Into::into)?;
            file.write_all(&chunk)
                .await
                .map_err(|e| io("write", &partial, e))?;
            size = size.saturating_add(chunk.len() as u64);
        }
        file.sync_all().await.map_err(|e| io("sync", &partial, e))?;
        Ok(size)
    }
    .await;
    drop(file);
    let size = match written {
        Ok(size) => size,
        Err(e) => {
            if let Err(error) = tokio::fs::remove_file(&partial).await {
                tracing::warn!(path = %partial.display(), error = %etcd_operator_api::report::Chain(&error), "could not remove a partial file");
            }
            return Err(e);
        }
    };
    if let Err(e) = tokio::fs::rename(&partial, path).await {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(io("rename into place", path, e));
    }
    // The rename is durable once the directory is synced (best effort: not every filesystem
    // lets a directory be opened for sync).
    if let Some(parent) = path.parent()
        && let Ok(dir) = tokio::fs::File::open(parent).await
        && let Err(error) = dir.sync_all().await
    {
        tracing::debug!(path = %parent.display(), error = %etcd_operator_api::report::Chain(&error), "could not sync directory");
    }
    Ok(size)
}

/// Writes a snapshot stream to `path` (see [`write_atomically`]); a snapshot that fails its
/// integrity check leaves nothing behind.
pub async fn write_snapshot(stream: SnapshotStream, path: &Path) -> Result<Verified, SnapshotError> {
    let verified = stream.verified_handle();
    let endpoint = stream.endpoint.clone();
    write_atomically(stream, path, |_, path, source| SnapshotError::Write {
        path: path.to_path_buf(),
        source,
    })
    .await?;
    verified.get().cloned().ok_or(SnapshotError::Etcd {
        endpoint,
        source: crate::member_ops::MemberOpError::NoEndpoint {
            op: "snapshot stream ended unverified",
        },
    })
}

/// Streams a snapshot file written by [`write_snapshot`] (or `save_snapshot`) again, checked on
/// the way like one from a member.
pub async fn read_snapshot(
    saved: &crate::member_ops::SavedSnapshot,
) -> Result<SnapshotStream, SnapshotError> {
    let path = saved.path.clone();
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|source| SnapshotError::Read {
            path: path.clone(),
            source,
        })?;
    let chunks = tokio_util::io::ReaderStream::new(file).map(move |chunk| {
        chunk.map_err(|source| SnapshotError::Read {
            path: path.clone(),
            source,
        })
    });
    Ok(SnapshotStream::new(
        saved.revision,
        saved.path.display().to_string(),
        chrono::Utc::now(),
        chunks.boxed(),
        std::time::Duration::from_secs(600),
    ))
}

/// Keeps the newest `keep` snapshot files (`*.db`, by modification time) in `dir` — the
/// pre-upgrade snapshots a runtime keeps beside the members' data — and deletes the others;
/// returns what was deleted. A missing directory holds nothing to delete.
pub async fn prune_local(dir: &Path, keep: usize) -> Result<Vec<PathBuf>, std::io::Error> {
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    while let Some(entry) = entries.next_entry().await? {
        let meta = entry.metadata().await?;
        if meta.is_file() {
            files.push((entry.file_name().to_string_lossy().into_owned(), meta.modified()?));
        }
    }
    let mut deleted = Vec::new();
    for name in crate::backup_policy::local_expired(&files, keep) {
        let path = dir.join(&name);
        tokio::fs::remove_file(&path).await?;
        deleted.push(path);
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member_ops::fake::fake_snapshot_bytes;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_good_snapshot_is_renamed_into_place_with_its_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/s.db");
        let data = fake_snapshot_bytes();
        let stream = SnapshotStream::from_bytes(3, "e", Bytes::from(data.clone()), 100);
        let verified = write_snapshot(stream, &path).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(verified.sha256, crate::backup_policy::sha256_hex(&data));
        assert_eq!(names(&dir.path().join("sub")), ["s.db"]);
    }

    #[tokio::test]
    async fn a_saved_snapshot_streams_again_checked_and_a_missing_one_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let data = fake_snapshot_bytes();
        std::fs::write(&path, &data).unwrap();
        let saved = crate::member_ops::SavedSnapshot {
            path: path.clone(),
            revision: 4,
            size: data.len() as u64,
            sha256: crate::backup_policy::sha256_hex(&data),
        };
        let (got, verified) = read_snapshot(&saved)
            .await
            .unwrap()
            .collect_bytes()
            .await
            .unwrap();
        assert_eq!(got, data);
        assert_eq!(verified.sha256, saved.sha256);
        std::fs::write(&path, &data[..data.len() - 1]).unwrap();
        let err = read_snapshot(&saved)
            .await
            .unwrap()
            .collect_bytes()
            .await
            .unwrap_err();
        assert!(matches!(err, SnapshotError::Corrupt { .. }), "{err}");
        std::fs::remove_file(&path).unwrap();
        let err = read_snapshot(&saved).await.unwrap_err();
        assert!(matches!(err, SnapshotError::Read { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_corrupt_snapshot_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut data = fake_snapshot_bytes();
        data[3] ^= 0xff;
        let stream = SnapshotStream::from_bytes(3, "e", Bytes::from(data), 100);
        let err = write_snapshot(stream, &path).await.unwrap_err();
        assert!(matches!(err, SnapshotError::Corrupt { .. }), "{err}");
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }

    #[tokio::test]
    async fn a_disk_failure_is_named_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        // The parent is a file: the directory cannot be created.
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let stream = SnapshotStream::from_bytes(3, "e", Bytes::from(fake_snapshot_bytes()), 100);
        let err = write_snapshot(stream, &dir.path().join("f/s.db"))
            .await
            .unwrap_err();
        assert!(matches!(err, SnapshotError::Write { .. }), "{err}");
        assert_eq!(names(dir.path()), ["f"]);
    }

    #[tokio::test]
    async fn only_the_newest_snapshots_stay_in_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        for (i, name) in ["a.db", "b.db", "c.db", "d.db", "notes.txt"].iter().enumerate() {
            let file = std::fs::File::create(dir.path().join(name)).unwrap();
            file.set_modified(base + std::time::Duration::from_secs(i as u64 * 10))
                .unwrap();
        }
        let mut deleted = prune_local(dir.path(), 2).await.unwrap();
        deleted.sort();
        assert_eq!(deleted, vec![dir.path().join("a.db"), dir.path().join("b.db")]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["c.db", "d.db", "notes.txt"]);
        assert!(prune_local(&dir.path().join("none"), 2).await.unwrap().is_empty());
    }
}
