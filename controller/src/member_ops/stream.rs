//! A snapshot as a stream of chunks, checked while it streams: etcd's integrity hash and the
//! file's SHA-256 are computed chunk by chunk ([`SnapshotDigest`]), so a snapshot of any size
//! passes through in bounded memory and a corrupt one ends in an error instead of a clean end.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{BoxStream, Stream, StreamExt};

use super::SnapshotError;
use crate::backup_policy::SnapshotDigest;

/// The chunks of a snapshot as a member sends them, unchecked.
pub type RawChunks = BoxStream<'static, Result<Bytes, SnapshotError>>;

/// What a snapshot that streamed to its end and passed etcd's integrity check was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Its size in bytes.
    pub size: u64,
    /// SHA-256 of the whole file (etcd's trailing hash included), lowercase hex.
    pub sha256: String,
}

/// A snapshot streaming from a member. Yields the file's chunks in order; the stream ends
/// cleanly (`None`) only after the last chunk passed etcd's integrity check, and then
/// [`Self::verified`] says what it was. A stream that fails — the member, the time limit, or the
/// integrity check at the end — yields one `Err` as its last item, so whatever consumes it (an
/// HTTP body, an upload, a file) can refuse what it received.
pub struct SnapshotStream {
    /// The revision of the member when the snapshot began (the snapshot holds at least this).
    pub revision: i64,
    /// The member it streams from.
    pub endpoint: String,
    /// When it was taken.
    pub taken: chrono::DateTime<chrono::Utc>,
    inner: RawChunks,
    /// `None` once the stream has ended (cleanly or not).
    digest: Option<SnapshotDigest>,
    verified: Arc<OnceLock<Verified>>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl std::fmt::Debug for SnapshotStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStream")
            .field("revision", &self.revision)
            .field("endpoint", &self.endpoint)
            .field("taken", &self.taken)
            .field("verified", &self.verified.get())
            .finish_non_exhaustive()
    }
}

impl SnapshotStream {
    /// Checks `inner`, the chunks `endpoint` sends, which must all arrive within `limit`.
    pub fn new(
        revision: i64,
        endpoint: impl Into<String>,
        taken: chrono::DateTime<chrono::Utc>,
        inner: RawChunks,
        limit: Duration,
    ) -> Self {
        Self {
            revision,
            endpoint: endpoint.into(),
            taken,
            inner,
            digest: Some(SnapshotDigest::default()),
            verified: Arc::new(OnceLock::new()),
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
        }
    }

    /// Checks a snapshot already in memory (tests and small files), sent in `chunk`-byte pieces.
    pub fn from_bytes(revision: i64, endpoint: impl Into<String>, data: Bytes, chunk: usize) -> Self {
        let chunk = chunk.max(1);
        let pieces: Vec<Result<Bytes, SnapshotError>> = (0..data.len())
            .step_by(chunk)
            .map(|at| Ok(data.slice(at..data.len().min(at + chunk))))
            .collect();
        Self::new(
            revision,
            endpoint,
            chrono::Utc::now(),
            futures::stream::iter(pieces).boxed(),
            Duration::from_secs(600),
        )
    }

    /// Size and SHA-256, once the stream has ended cleanly (after its last chunk passed the
    /// integrity check); `None` before that or after a failure.
    pub fn verified(&self) -> Option<Verified> {
        self.verified.get().cloned()
    }

    /// A handle on [`Self::verified`] that outlives the stream (for a consumer that takes the
    /// stream, such as an HTTP body).
    pub fn verified_handle(&self) -> Arc<OnceLock<Verified>> {
        Arc::clone(&self.verified)
    }

    /// Reads the whole snapshot into memory (small snapshots and tests only).
    pub async fn collect_bytes(mut self) -> Result<(Bytes, Verified), SnapshotError> {
        let mut data = Vec::new();
        while let Some(chunk) = self.next().await {
            data.extend_from_slice(&chunk?);
        }
        let verified = self.verified().ok_or_else(|| self.ended_early())?;
        Ok((Bytes::from(data), verified))
    }

    /// The error of a stream that ended without being verified (it yielded an error before).
    fn ended_early(&self) -> SnapshotError {
        SnapshotError::Etcd {
            endpoint: self.endpoint.clone(),
            source: super::MemberOpError::NoEndpoint {
                op: "snapshot stream ended after an error",
            },
        }
    }
}

impl Stream for SnapshotStream {
    type Item = Result<Bytes, SnapshotError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.digest.is_none() {
            return Poll::Ready(None);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.digest = None;
            tracing::warn!(endpoint = %this.endpoint, after = ?this.limit, "snapshot stream took too long");
            return Poll::Ready(Some(Err(SnapshotError::Timeout {
                endpoint: this.endpoint.clone(),
                after: this.limit,
            })));
        }
        let next = ready!(this.inner.poll_next_unpin(cx));
        match (next, this.digest.as_mut()) {
            (Some(Ok(chunk)), Some(digest)) => {
                digest.update(&chunk);
                Poll::Ready(Some(Ok(chunk)))
            }
            (Some(Err(e)), _) => {
                this.digest = None;
                tracing::warn!(endpoint = %this.endpoint, error = %etcd_operator_api::report::Chain(&e), "snapshot stream failed");
                Poll::Ready(Some(Err(e)))
            }
            (None, _) | (_, None) => {
                let Some(digest) = this.digest.take() else {
                    return Poll::Ready(None);
                };
                let size = digest.size();
                match digest.finish() {
                    Ok(sha256) => {
                        tracing::debug!(endpoint = %this.endpoint, size, %sha256, "snapshot stream verified");
                        let _ = this.verified.set(Verified { size, sha256 });
                        Poll::Ready(None)
                    }
                    Err(source) => {
                        tracing::warn!(endpoint = %this.endpoint, size, error = %etcd_operator_api::report::Chain(&source), "snapshot failed its integrity check");
                        Poll::Ready(Some(Err(SnapshotError::Corrupt {
                            endpoint: this.endpoint.clone(),
                            source,
                        })))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup_policy::{SnapshotCheckError, sha256_hex};
    use crate::member_ops::fake::fake_snapshot_bytes;

    fn big_snapshot(pages: usize) -> Vec<u8> {
        use sha2::Digest;
        let mut data: Vec<u8> = (0..pages * 512).map(|i| (i % 251) as u8).collect();
        let hash = sha2::Sha256::digest(&data);
        data.extend_from_slice(&hash);
        data
    }

    #[tokio::test]
    async fn the_digest_is_computed_chunk_by_chunk_whatever_the_chunk_size() {
        let data = big_snapshot(40);
        for chunk in [1, 7, 31, 32, 33, 512, 4096, data.len()] {
            let stream = SnapshotStream::from_bytes(5, "e", Bytes::from(data.clone()), chunk);
            let (got, verified) = stream.collect_bytes().await.unwrap();
            assert_eq!(got, data, "chunk {chunk}");
            assert_eq!(verified.sha256, sha256_hex(&data), "chunk {chunk}");
            assert_eq!(verified.size, data.len() as u64);
        }
    }

    #[tokio::test]
    async fn a_corrupt_stream_ends_in_an_error_not_a_clean_end() {
        let mut data = big_snapshot(8);
        data[100] ^= 1;
        let mut stream = SnapshotStream::from_bytes(5, "e", Bytes::from(data.clone()), 1000);
        let mut passed = 0;
        let mut last = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(chunk) => passed += chunk.len(),
                Err(e) => last = Some(e),
            }
        }
        assert_eq!(
            passed,
            data.len(),
            "every chunk passes before the check at the end"
        );
        assert!(
            matches!(
                last,
                Some(SnapshotError::Corrupt {
                    source: SnapshotCheckError::HashMismatch,
                    ..
                })
            ),
            "{last:?}"
        );
        assert_eq!(stream.verified(), None);
        // Truncated: no etcd hash at all.
        let data = fake_snapshot_bytes();
        let short = Bytes::from(data[..data.len() - 5].to_vec());
        let err = SnapshotStream::from_bytes(5, "e", short, 64)
            .collect_bytes()
            .await
            .unwrap_err();
        assert!(matches!(err, SnapshotError::Corrupt { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_member_error_ends_the_stream_and_a_slow_member_times_out() {
        let chunks: Vec<Result<Bytes, SnapshotError>> = vec![
            Ok(Bytes::from_static(b"abc")),
            Err(SnapshotError::NoHealthyMember { asked: vec![] }),
            Ok(Bytes::from_static(b"never")),
        ];
        let mut stream = SnapshotStream::new(
            1,
            "e",
            chrono::Utc::now(),
            futures::stream::iter(chunks).boxed(),
            Duration::from_secs(60),
        );
        assert!(stream.next().await.unwrap().is_ok());
        assert!(stream.next().await.unwrap().is_err());
        assert!(stream.next().await.is_none(), "nothing after the error");
        assert_eq!(stream.verified(), None);

        let stalled = futures::stream::pending().boxed();
        let err = SnapshotStream::new(1, "e", chrono::Utc::now(), stalled, Duration::from_millis(50))
            .collect_bytes()
            .await
            .unwrap_err();
        assert!(matches!(err, SnapshotError::Timeout { .. }), "{err}");
    }
}
