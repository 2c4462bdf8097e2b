//! `GET .../etcdclusters/<name>/snapshot`: a fresh etcd snapshot of the named cluster, taken
//! from a healthy member (a follower when there is one) at the client endpoints its status
//! reports, checked against etcd's integrity hash and sent as `application/octet-stream` — the
//! file `etcdutl snapshot status` and `etcdutl snapshot restore` read. Authorized as `get` on
//! `etcdclusters/snapshot` like any subresource.
//!
//! The body streams: each chunk etcd sends is passed on as it arrives (memory is a chunk or two,
//! whatever the database size) while etcd's integrity hash and the file's SHA-256 are computed.
//! The status (200) and headers leave before the check can be made, so a snapshot that fails it at
//! the end — or a member that fails midway — aborts the body instead of ending it: over HTTP/1.1
//! the connection closes without the final empty chunk, over HTTP/2 the stream is reset. Either
//! way the client sees a failed transfer, never a complete response (hyper's client: `UnexpectedEof`
//! or `Reset(.., INTERNAL_ERROR)`; see the wire test below). A body that ends cleanly passed the check;
//! its SHA-256 follows as the trailer `x-etcd-snapshot-sha256` (HTTP/2, or HTTP/1.1 clients that
//! send `TE: trailers`).

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::StreamBody;
use hyper::body::Frame;

use super::error::ApiError;
use crate::registry::kind::Kind;
use crate::storage::{ReadConsistency, Storage};

/// The trailer carrying the SHA-256 of a snapshot that streamed whole and passed its check.
pub const SHA256_TRAILER: &str = "x-etcd-snapshot-sha256";

/// The content type of a snapshot.
pub const CONTENT_TYPE: &str = "application/octet-stream";

/// Any error a snapshot stream ends with.
pub type StreamError = Box<dyn std::error::Error + Send + Sync>;

/// Where snapshots come from: the members of an EtcdCluster. The API server does not talk to
/// members itself; the binary injects an implementation (the controller's member connections,
/// which pick a healthy follower and check etcd's integrity hash).
pub trait SnapshotSource: Send + Sync {
    /// Opens a snapshot at a healthy member among those `endpoints` lead to.
    fn open<'a>(
        &'a self,
        endpoints: &'a [String],
    ) -> BoxFuture<'a, Result<MemberSnapshot, OpenSnapshotError>>;
}

/// What a snapshot that streamed whole and passed its integrity check was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedSnapshot {
    /// Its size in bytes.
    pub size: u64,
    /// SHA-256 of the whole file, lowercase hex.
    pub sha256: String,
}

/// A snapshot streaming from one member.
pub struct MemberSnapshot {
    /// The member's revision when the snapshot began.
    pub revision: i64,
    /// The member it streams from.
    pub endpoint: String,
    /// The file's chunks in order. The stream ends cleanly only after the last chunk passed the
    /// integrity check; a failure (the member, a time limit, the check) is its last item.
    pub chunks: BoxStream<'static, Result<Bytes, StreamError>>,
    /// What the snapshot was, once the stream ended cleanly (`None` before, or after a failure).
    pub verified: Box<dyn Fn() -> Option<VerifiedSnapshot> + Send + Sync>,
}

impl std::fmt::Debug for MemberSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberSnapshot")
            .field("revision", &self.revision)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// Opening a snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenSnapshotError {
    /// No member answered as healthy.
    #[error("no healthy member to take a snapshot from")]
    NoHealthyMember,
    /// Every healthy member failed to start streaming; the last failure.
    #[error("open a snapshot stream")]
    Member(#[source] StreamError),
}

/// Whether an Accept header admits a snapshot (absent, `*/*`, `application/*` or the type).
pub fn accepts(accept: Option<&str>) -> bool {
    accept.is_none_or(|a| {
        a.split(',').any(|entry| {
            let media = entry.split(';').next().unwrap_or_default().trim();
            matches!(media, "" | "*/*" | "application/*" | CONTENT_TYPE)
        })
    })
}

/// Handles the request. Without a `source` (a server that serves no snapshots) it is 503.
pub async fn serve(
    storage: &Storage,
    source: Option<&Arc<dyn SnapshotSource>>,
    namespace: Option<&str>,
    name: &str,
    accept: Option<&str>,
) -> Result<Response, ApiError> {
    let resource = Kind::CLUSTER.info().resource;
    let Some(namespace) = namespace else {
        return Err(ApiError::bad_request(
            "a namespace and a name are required for this request",
        ));
    };
    if !accepts(accept) {
        let mut e = ApiError::not_acceptable(accept.unwrap_or_default());
        e.message = format!(
            "only the following media types are accepted: {CONTENT_TYPE} (asked for {})",
            accept.unwrap_or_default()
        );
        return Err(e);
    }
    let stored = storage
        .get(namespace, name, ReadConsistency::Consistent)
        .await
        .map_err(|e| super::resource::storage_error_in(resource, e, name))?
        .ok_or_else(|| ApiError::not_found(resource, name))?;
    let cluster = crate::registry::cluster::from_storage(stored)?;
    let Some(source) = source else {
        return Err(ApiError::unavailable(
            "this server does not serve snapshots".to_owned(),
        ));
    };
    let endpoints = cluster
        .status
        .as_ref()
        .and_then(|s| s.client_endpoints.clone())
        .unwrap_or_default();
    if endpoints.is_empty() {
        return Err(ApiError::unavailable(format!(
            "EtcdCluster {namespace}/{name} reports no client endpoints: no healthy member to take a snapshot from"
        )));
    }
    let snapshot = source.open(&endpoints).await.map_err(|e| {
        ApiError::unavailable(format!(
            "EtcdCluster {namespace}/{name}: {}",
            crate::error::chain(&e)
        ))
    })?;
    let cluster = format!("{namespace}/{name}");
    tracing::info!(%cluster, revision = snapshot.revision, from = %snapshot.endpoint, "streaming snapshot");
    let filename = format!("{namespace}-{name}-{}.db", snapshot.revision);
    let revision = snapshot.revision;
    let mut response = Response::new(streaming_body(snapshot, cluster));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    headers.insert(header::TRAILER, HeaderValue::from_static(SHA256_TRAILER));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{filename}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&revision.to_string()) {
        headers.insert("x-etcd-snapshot-revision", v);
    }
    Ok(response)
}

/// The body of a snapshot response: its chunks as they arrive, then the SHA-256 trailer once the
/// integrity check passed. A failed stream ends with an error frame, which makes hyper abort the
/// response (see the module documentation).
pub fn streaming_body(snapshot: MemberSnapshot, cluster: String) -> Body {
    let MemberSnapshot { chunks, verified, .. } = snapshot;
    let failed_for = cluster.clone();
    let chunks = chunks.map(move |chunk| {
        chunk.map(Frame::data).inspect_err(|error| {
            tracing::warn!(cluster = %failed_for, error = &**error as &dyn std::error::Error, "snapshot stream failed; aborting the response body");
        })
    });
    let trailer = futures::stream::iter([()]).filter_map(move |()| {
        let verified = verified();
        let cluster = cluster.clone();
        async move {
            let verified = verified?;
            tracing::info!(%cluster, size = verified.size, sha256 = %verified.sha256, "snapshot served");
            let mut trailers = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(&verified.sha256) {
                trailers.insert(SHA256_TRAILER, v);
            }
            Some(Ok::<Frame<Bytes>, StreamError>(Frame::trailers(trailers)))
        }
    });
    Body::new(StreamBody::new(chunks.chain(trailer)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use sha2::Digest;
    use std::sync::OnceLock;

    /// 512 bytes of "database" and etcd's trailing SHA-256 of them: a file that passes the check.
    fn good_snapshot_bytes() -> Vec<u8> {
        let mut data = vec![0x5a; 512];
        let hash = sha2::Sha256::digest(&data);
        data.extend_from_slice(&hash);
        data
    }

    /// A snapshot of `data` in chunks of `chunk` bytes, checked at the end as a source checks
    /// it: the last 32 bytes must be the SHA-256 of the rest, else the stream ends in an error.
    fn snapshot_of(data: Vec<u8>, chunk: usize) -> MemberSnapshot {
        let verified = Arc::new(OnceLock::new());
        let data = Bytes::from(data);
        let pieces: Vec<Result<Bytes, StreamError>> = (0..data.len())
            .step_by(chunk)
            .map(|at| Ok(data.slice(at..data.len().min(at + chunk))))
            .collect();
        let (db, hash) = data.split_at(data.len().saturating_sub(32));
        let check: Result<Bytes, StreamError> =
            Err("snapshot is corrupt: etcd's integrity hash does not match".into());
        let end = if sha2::Sha256::digest(db).as_slice() == hash {
            let _ = verified.set(VerifiedSnapshot {
                size: data.len() as u64,
                sha256: hex::encode(sha2::Sha256::digest(&data)),
            });
            Vec::new()
        } else {
            vec![check]
        };
        let read = Arc::clone(&verified);
        MemberSnapshot {
            revision: 1,
            endpoint: "e".into(),
            chunks: futures::stream::iter(pieces.into_iter().chain(end)).boxed(),
            verified: Box::new(move || read.get().cloned()),
        }
    }

    #[tokio::test]
    async fn a_good_snapshot_streams_whole_with_its_checksum_trailer() {
        let data = good_snapshot_bytes();
        let collected = streaming_body(snapshot_of(data.clone(), 100), "ns/a".into())
            .collect()
            .await
            .unwrap();
        let trailers = collected.trailers().cloned().unwrap();
        assert_eq!(
            trailers.get(SHA256_TRAILER).unwrap(),
            hex::encode(sha2::Sha256::digest(&data)).as_str()
        );
        assert_eq!(collected.to_bytes(), data);
    }

    #[tokio::test]
    async fn a_corrupt_snapshot_ends_the_body_in_an_error_not_a_clean_end() {
        let mut data = good_snapshot_bytes();
        data[7] ^= 1;
        let mut body = streaming_body(snapshot_of(data.clone(), 100), "ns/a".into());
        let mut passed = 0;
        let err = loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    assert!(frame.is_data(), "no trailer for a refused snapshot");
                    passed += frame.into_data().map(|d| d.len()).unwrap_or_default();
                }
                Some(Err(e)) => break e,
                None => panic!("the body ended cleanly"),
            }
        };
        assert_eq!(passed, data.len());
        assert!(err.to_string().contains("corrupt"), "{err}");
    }

    /// Serves one snapshot body (`corrupt` or not) on a loopback port, as the server would.
    async fn serve_one(corrupt: bool) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/snapshot",
            axum::routing::get(move || async move {
                let mut data = vec![7; 64 * 512];
                // Many chunks, so the headers and most of the body are out before the check.
                let hash = sha2::Sha256::digest(&data);
                data.extend_from_slice(&hash);
                if corrupt {
                    data[100] ^= 1;
                }
                streaming_body(snapshot_of(data, 512), "ns/a".into())
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    /// What a client reads over the wire: the status and the body's length, or the error that
    /// ended the response (before its head or within its body).
    async fn download(addr: std::net::SocketAddr, http2: bool) -> Result<(StatusCode, usize), String> {
        let io = hyper_util::rt::TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
        let req = http::Request::get(format!("http://{addr}/snapshot"))
            .header(header::HOST, addr.to_string())
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let sent = if http2 {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            send.send_request(req).await
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            send.send_request(req).await
        };
        let resp = sent.map_err(|e| format!("{e:?}"))?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| format!("{e:?}"))?;
        Ok((status, body.to_bytes().len()))
    }

    #[tokio::test]
    async fn over_the_wire_a_refused_snapshot_is_a_broken_response_in_http1_and_http2() {
        for http2 in [false, true] {
            let good = serve_one(false).await;
            assert_eq!(
                download(good, http2).await,
                Ok((StatusCode::OK, 64 * 512 + 32)),
                "http2: {http2}"
            );
            // The status may have left before the check (HTTP/1.1: it has); only the broken
            // response tells, never a complete one.
            let bad = serve_one(true).await;
            let err = download(bad, http2)
                .await
                .expect_err("a refused snapshot never reads as a complete response");
            println!("http2 {http2}: the client sees {err}");
        }
    }

    #[test]
    fn accept_headers() {
        assert!(accepts(None));
        assert!(accepts(Some("application/json, */*")));
        assert!(accepts(Some("application/octet-stream")));
        assert!(accepts(Some("application/*;q=0.5")));
        assert!(!accepts(Some("application/json")));
        assert!(!accepts(Some("application/yaml, text/plain")));
    }
}
