//! `kubectl etcd snapshot`: streams the `/snapshot` subresource into a temporary file beside the
//! target, hashing as it goes, with a progress line on stderr; checks the SHA-256 the server
//! sends as the HTTP trailer `x-etcd-snapshot-sha256` once the body ended cleanly (a snapshot
//! that failed its check on the server ends in a broken transfer, never a clean end); then syncs
//! the file and renames it into place, so the target only ever holds a whole, checked snapshot.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use http_body_util::BodyExt as _;
use sha2::Digest as _;

/// The trailer the server sends the SHA-256 in (apiserver/src/http/snapshot.rs).
pub const SHA256_TRAILER: &str = "x-etcd-snapshot-sha256";
/// The header the server sends the revision in.
pub const REVISION_HEADER: &str = "x-etcd-snapshot-revision";

/// The API path of a cluster's snapshot.
pub fn path(namespace: &str, name: &str) -> String {
    format!("/apis/etcd.operator.dev/v1alpha2/namespaces/{namespace}/etcdclusters/{name}/snapshot")
}

/// What was saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// Bytes written.
    pub size: u64,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: String,
    /// Whether it matched the server's.
    pub verified: bool,
    /// The member's revision when the snapshot began, when the server said.
    pub revision: Option<String>,
}

/// Why a snapshot was not saved.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The request could not be built (a name that is no valid path segment).
    #[error("build the snapshot request for {path:?}")]
    BuildRequest {
        /// The path.
        path: String,
        /// What was wrong.
        #[source]
        source: http::Error,
    },
    /// The request failed before an answer.
    #[error("request the snapshot")]
    Request(#[source] kube::Error),
    /// The server answered with an error status; `message` is its `Status` message.
    #[error("{message}")]
    Refused {
        /// The HTTP status.
        code: u16,
        /// What the server said.
        message: String,
    },
    /// The transfer broke off (the server aborts a snapshot that fails its integrity check).
    #[error(
        "the snapshot transfer broke off after {bytes} bytes (the snapshot failed on the server, or the connection did)"
    )]
    Transfer {
        /// Bytes received before.
        bytes: u64,
        /// The failure.
        #[source]
        source: kube::Error,
    },
    /// The temporary file could not be made beside the target.
    #[error("create a temporary file in {dir}")]
    CreateTemp {
        /// The directory.
        dir: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// Writing or syncing the temporary file failed.
    #[error("write {path}")]
    Write {
        /// The temporary file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The server sent no checksum to check against.
    #[error(
        "the server sent no {SHA256_TRAILER} trailer to check the snapshot against (a proxy on the way may drop HTTP trailers); nothing was written (--allow-unverified keeps such a snapshot)"
    )]
    NoChecksum,
    /// The file's SHA-256 is not the server's.
    #[error("the snapshot's SHA-256 {actual} is not the {expected} the server sent; nothing was written")]
    Mismatch {
        /// The server's.
        expected: String,
        /// The file's.
        actual: String,
    },
    /// The rename into place failed.
    #[error("move the snapshot into place at {path}")]
    Persist {
        /// The target.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

/// The progress line: bytes so far and the rate.
pub fn progress_line(bytes: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { bytes as f64 / secs } else { 0.0 };
    format!(
        "{} received, {}/s, {:.1}s",
        crate::render::bytes(i64::try_from(bytes).unwrap_or(i64::MAX)),
        crate::render::bytes(rate as i64),
        secs
    )
}

/// Whether the received bytes are the checked snapshot: `Ok(true)` verified, `Ok(false)` no
/// checksum sent and unverified snapshots allowed.
pub fn verify(expected: Option<&str>, actual: &str, allow_unverified: bool) -> Result<bool, SnapshotError> {
    match expected {
        Some(e) if e.trim().eq_ignore_ascii_case(actual) => Ok(true),
        Some(e) => Err(SnapshotError::Mismatch {
            expected: e.trim().to_owned(),
            actual: actual.to_owned(),
        }),
        None if allow_unverified => Ok(false),
        None => Err(SnapshotError::NoChecksum),
    }
}

/// The message of a `Status` error body, or the body itself.
fn status_message(code: http::StatusCode, body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body).trim().to_owned();
            if text.is_empty() {
                format!("the server answered {code}")
            } else {
                text
            }
        })
}

/// Draws the progress on stderr, at most every 200 ms, when stderr is a terminal.
struct Progress {
    started: Instant,
    drawn: Option<Instant>,
    terminal: bool,
}

impl Progress {
    fn update(&mut self, bytes: u64) {
        if !self.terminal
            || self
                .drawn
                .is_some_and(|t| t.elapsed() < Duration::from_millis(200))
        {
            return;
        }
        self.drawn = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{}\x1b[K", progress_line(bytes, self.started.elapsed()));
        let _ = err.flush();
    }

    fn finish(&self, bytes: u64) {
        let mut err = std::io::stderr().lock();
        let line = progress_line(bytes, self.started.elapsed());
        let _ = if self.terminal {
            writeln!(err, "\r{line}\x1b[K")
        } else {
            writeln!(err, "{line}")
        };
    }
}

/// Streams the snapshot of `namespace/name` into `output`.
pub async fn save(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    output: &Path,
    allow_unverified: bool,
    terminal: bool,
) -> Result<Saved, SnapshotError> {
    let uri = path(namespace, name);
    let request = http::Request::get(&uri)
        .header(http::header::ACCEPT, "application/octet-stream")
        .header(http::header::TE, "trailers")
        .body(kube::client::Body::empty())
        .map_err(|source| SnapshotError::BuildRequest { path: uri, source })?;
    let response = client.send(request).await.map_err(SnapshotError::Request)?;
    let code = response.status();
    let revision = response
        .headers()
        .get(REVISION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = response.into_body();
    if !code.is_success() {
        let bytes = body
            .collect()
            .await
            .map(|c| c.to_bytes().to_vec())
            .unwrap_or_default();
        return Err(SnapshotError::Refused {
            code: code.as_u16(),
            message: status_message(code, &bytes),
        });
    }
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "snapshot".into());
    let mut temp = tempfile::Builder::new()
        .prefix(&format!(".{file_name}."))
        .suffix(".partial")
        .tempfile_in(&dir)
        .map_err(|source| SnapshotError::CreateTemp {
            dir: dir.clone(),
            source,
        })?;
    let temp_path = temp.path().to_path_buf();
    let write_error = |source| SnapshotError::Write {
        path: temp_path.clone(),
        source,
    };
    let mut hasher = sha2::Sha256::new();
    let mut size = 0u64;
    let mut trailer = None;
    let mut progress = Progress {
        started: Instant::now(),
        drawn: None,
        terminal,
    };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|source| SnapshotError::Transfer { bytes: size, source })?;
        match frame.into_data() {
            Ok(data) => {
                hasher.update(&data);
                temp.write_all(&data).map_err(write_error)?;
                size += data.len() as u64;
                progress.update(size);
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    trailer = trailers
                        .get(SHA256_TRAILER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                }
            }
        }
    }
    progress.finish(size);
    let sha256 = hex::encode(hasher.finalize());
    let verified = verify(trailer.as_deref(), &sha256, allow_unverified)?;
    temp.as_file().sync_all().map_err(write_error)?;
    temp.persist(output).map_err(|e| SnapshotError::Persist {
        path: output.to_path_buf(),
        source: e.error,
    })?;
    // The rename is durable once the directory is.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(Saved {
        size,
        sha256,
        verified,
        revision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_must_match_and_be_there_unless_allowed() {
        let h = "ab".repeat(32);
        assert!(verify(Some(&h), &h, false).unwrap());
        assert!(verify(Some(&h.to_uppercase()), &h, false).unwrap());
        let e = verify(Some(&"cd".repeat(32)), &h, true).unwrap_err();
        assert!(matches!(e, SnapshotError::Mismatch { .. }), "{e}");
        assert!(matches!(verify(None, &h, false), Err(SnapshotError::NoChecksum)));
        assert!(!verify(None, &h, true).unwrap());
    }

    #[test]
    fn the_path_is_the_subresource_of_the_preferred_version() {
        assert_eq!(
            path("default", "demo"),
            "/apis/etcd.operator.dev/v1alpha2/namespaces/default/etcdclusters/demo/snapshot"
        );
    }

    #[test]
    fn progress_reads_as_size_rate_and_time() {
        assert_eq!(
            progress_line(3 << 20, Duration::from_millis(1500)),
            "3 MiB received, 2 MiB/s, 1.5s"
        );
        assert_eq!(progress_line(0, Duration::ZERO), "0 B received, 0 B/s, 0.0s");
    }

    #[test]
    fn an_error_body_gives_its_status_message() {
        let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcdclusters.etcd.operator.dev \"x\" not found","reason":"NotFound","code":404}"#;
        assert_eq!(
            status_message(http::StatusCode::NOT_FOUND, body),
            r#"etcdclusters.etcd.operator.dev "x" not found"#
        );
        assert_eq!(
            status_message(http::StatusCode::BAD_GATEWAY, b""),
            "the server answered 502 Bad Gateway"
        );
    }
}
