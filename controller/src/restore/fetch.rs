//! Fetching a snapshot from where a restore plan says (an S3 key or a directory in a backup
//! destination, or a URL) into a local file, verified while it streams: the SHA-256 recorded at
//! backup time and etcd's own integrity hash are computed chunk by chunk, so memory is one chunk
//! whatever the snapshot's size, and a snapshot that fails either check never reaches the file's
//! final name.

// The restore module's types and imports.
#[allow(clippy::wildcard_imports)]
use super::*;

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};

/// A fetched, verified snapshot, in a local file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The file it was written to.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
    /// Where it came from.
    pub location: String,
}

/// The chunks of a snapshot being downloaded.
type Chunks = BoxStream<'static, Result<Bytes, RestoreError>>;

/// A GET of `url`: `None` when it answers 404.
async fn http_get(url: &str) -> Result<Option<reqwest::Response>, RestoreError> {
    let err = |reason: String| RestoreError::Download {
        url: url.to_owned(),
        reason,
    };
    let resp = reqwest::get(url)
        .await
        .map_err(|e| err(etcd_operator_api::report::chain(&e)))?;
    if resp.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !resp.status().is_success() {
        return Err(err(format!("status {}", resp.status())));
    }
    Ok(Some(resp))
}

/// A response body as a stream of chunks.
fn http_chunks(url: &str, resp: reqwest::Response) -> Chunks {
    let url = url.to_owned();
    futures::stream::try_unfold(resp, move |mut resp| {
        let url = url.clone();
        async move {
            let chunk = resp.chunk().await.map_err(|e| RestoreError::Download {
                url,
                reason: etcd_operator_api::report::chain(&e),
            })?;
            Ok(chunk.map(|c| (c, resp)))
        }
    })
    .boxed()
}

/// The recorded checksum in a sidecar's text.
fn sidecar_checksum(text: &[u8]) -> Option<String> {
    policy::parse_checksum_file(&String::from_utf8_lossy(text))
}

/// Opens `url` (`s3://bucket/key` with ambient AWS settings, or HTTP(S)) as a stream, with the
/// checksum of its sidecar when there is one.
async fn open_url(url: &str) -> Result<(Chunks, Option<String>), RestoreError> {
    let not_found = || RestoreError::Download {
        url: url.to_owned(),
        reason: "not found".into(),
    };
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let to_err = |e: object_store::Error| RestoreError::Download {
            url: url.to_owned(),
            reason: etcd_operator_api::report::chain(&e),
        };
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_client_options(store::s3_client_options())
            .build()
            .map_err(to_err)?;
        let sidecar = match s3
            .get(&object_store::path::Path::from(format!(
                "{key}{}",
                policy::CHECKSUM_SUFFIX
            )))
            .await
        {
            Ok(got) => sidecar_checksum(&got.bytes().await.map_err(to_err)?),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(to_err(e)),
        };
        let got = match s3.get(&object_store::path::Path::from(key)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Err(not_found()),
            Err(e) => return Err(to_err(e)),
        };
        let owned = url.to_owned();
        let chunks = got
            .into_stream()
            .map_err(move |e| RestoreError::Download {
                url: owned.clone(),
                reason: etcd_operator_api::report::chain(&e),
            })
            .boxed();
        return Ok((chunks, sidecar));
    }
    let sidecar_url = format!("{url}{}", policy::CHECKSUM_SUFFIX);
    let sidecar = match http_get(&sidecar_url).await? {
        Some(resp) => resp.bytes().await.ok().and_then(|t| sidecar_checksum(&t)),
        None => None,
    };
    let resp = http_get(url).await?.ok_or_else(not_found)?;
    Ok((http_chunks(url, resp), sidecar))
}

/// The verdict on a snapshot whose every byte went through `digest`: the recorded checksums
/// first (a replaced or corrupted file), then etcd's own hash. The SHA-256 on success.
fn verdict(
    digest: SnapshotDigest,
    location: &str,
    expected: &[Option<String>],
) -> Result<String, RestoreError> {
    let (actual, check) = digest.finish_both();
    for expected in expected.iter().flatten() {
        if !expected.eq_ignore_ascii_case(&actual) {
            return Err(RestoreError::ChecksumMismatch {
                location: location.to_owned(),
                expected: expected.clone(),
                actual,
            });
        }
    }
    check.map_err(|source| RestoreError::Corrupt {
        location: location.to_owned(),
        source,
    })?;
    Ok(actual)
}

/// Checks bytes held in memory: against the recorded checksum(s), then etcd's own hash (pure).
pub fn verify(data: &[u8], location: &str, expected: &[Option<String>]) -> Result<String, RestoreError> {
    let mut digest = SnapshotDigest::default();
    digest.update(data);
    verdict(digest, location, expected)
}

/// `chunks`, checked while they pass: the stream yields the verdict's error as its last item
/// when the snapshot fails a check, and otherwise ends after putting the SHA-256 in `sha256`.
fn verifying(
    chunks: Chunks,
    location: String,
    expected: Vec<Option<String>>,
    sha256: Arc<OnceLock<String>>,
) -> Chunks {
    let state = Some((chunks, SnapshotDigest::default()));
    futures::stream::unfold(state, move |state| {
        let (location, expected, sha256) = (location.clone(), expected.clone(), Arc::clone(&sha256));
        async move {
            let (mut chunks, mut digest) = state?;
            match chunks.next().await {
                Some(Ok(chunk)) => {
                    digest.update(&chunk);
                    Some((Ok(chunk), Some((chunks, digest))))
                }
                Some(Err(e)) => Some((Err(e), None)),
                None => match verdict(digest, &location, &expected) {
                    Ok(actual) => {
                        let _ = sha256.set(actual);
                        None
                    }
                    Err(e) => Some((Err(e), None)),
                },
            }
        }
    })
    .boxed()
}

/// Fetches the snapshot of a plan into the file `to`, verified while it streams (see the module
/// documentation). A snapshot that fails a check, or a download that fails, leaves nothing at
/// `to`.
pub async fn fetch(
    plan: &RestorePlan,
    namespace: &str,
    credentials: &Credentials,
    to: &Path,
) -> Result<Fetched, RestoreError> {
    let (chunks, recorded, location) = match &plan.source {
        SnapshotSource::Store { destination, key } => {
            let dest = store::open(destination, namespace, credentials).await?;
            let recorded = dest.recorded_checksum(key).await?;
            let chunks = dest.get_stream(key).await?.err_into().boxed();
            (chunks, recorded, dest.location(key))
        }
        SnapshotSource::Url(url) => {
            let (chunks, recorded) = open_url(url).await?;
            (chunks, recorded, url.clone())
        }
    };
    let sha256 = Arc::new(OnceLock::new());
    let checked = verifying(
        chunks,
        location.clone(),
        vec![plan.expected_sha256.clone(), recorded],
        Arc::clone(&sha256),
    );
    let size = crate::member_ops::file::write_atomically(checked, to, |op, path, source| RestoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    })
    .await?;
    let sha256 = sha256.get().cloned().ok_or_else(|| RestoreError::Download {
        url: location.clone(),
        reason: "the download ended without its checks".into(),
    })?;
    tracing::info!(%location, path = %to.display(), size, %sha256, "snapshot fetched and verified");
    Ok(Fetched {
        path: to.to_path_buf(),
        size,
        sha256,
        location,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_api::v1alpha2::VolumeDestination;
    use sha2::{Digest, Sha256};

    fn snapshot(pages: usize) -> Vec<u8> {
        let db: Vec<u8> = (0..pages * 512).map(|i| (i % 253) as u8).collect();
        let mut data = db.clone();
        data.extend_from_slice(&Sha256::digest(&db));
        data
    }

    fn plan_in(dir: &Path, key: &str, expected: Option<String>) -> RestorePlan {
        RestorePlan {
            source: SnapshotSource::Store {
                destination: BackupDestination {
                    volume: Some(VolumeDestination {
                        path: Some(dir.display().to_string()),
                        claim_name: None,
                    }),
                    s3: None,
                },
                key: key.to_owned(),
            },
            expected_sha256: expected,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    const CREDS: Credentials = Credentials::Environment { file: None };

    #[tokio::test]
    async fn a_snapshot_streams_into_the_file_verified() {
        let store = tempfile::tempdir().unwrap();
        // Several of the store's read chunks, so the digest really is incremental.
        let data = snapshot(4096);
        std::fs::write(store.path().join("s.db"), &data).unwrap();
        let sha = hex::encode(Sha256::digest(&data));
        std::fs::write(
            store.path().join("s.db.sha256"),
            policy::checksum_file(&sha, "s.db"),
        )
        .unwrap();
        let out = tempfile::tempdir().unwrap();
        let to = out.path().join("got.db");
        let got = fetch(&plan_in(store.path(), "s.db", Some(sha.clone())), "", &CREDS, &to)
            .await
            .unwrap();
        assert_eq!(got.sha256, sha);
        assert_eq!(got.size, data.len() as u64);
        assert_eq!(std::fs::read(&to).unwrap(), data);
        assert_eq!(names(out.path()), ["got.db"]);
    }

    #[tokio::test]
    async fn a_corrupt_or_replaced_snapshot_is_refused_and_leaves_nothing_behind() {
        let store = tempfile::tempdir().unwrap();
        let data = snapshot(300);
        let sha = hex::encode(Sha256::digest(&data));
        let mut corrupt = data.clone();
        corrupt[700] ^= 1;
        std::fs::write(store.path().join("bad.db"), &corrupt).unwrap();
        let out = tempfile::tempdir().unwrap();
        let to = out.path().join("got.db");
        // Recorded checksum: the mismatch names both.
        let err = fetch(&plan_in(store.path(), "bad.db", Some(sha)), "", &CREDS, &to)
            .await
            .unwrap_err();
        assert!(matches!(err, RestoreError::ChecksumMismatch { .. }), "{err}");
        assert!(names(out.path()).is_empty(), "{:?}", names(out.path()));
        // Nothing recorded: etcd's own hash catches it.
        let err = fetch(&plan_in(store.path(), "bad.db", None), "", &CREDS, &to)
            .await
            .unwrap_err();
        assert!(matches!(err, RestoreError::Corrupt { .. }), "{err}");
        assert!(names(out.path()).is_empty(), "{:?}", names(out.path()));
        // A missing object is a destination error, and nothing is written either.
        let err = fetch(&plan_in(store.path(), "none.db", None), "", &CREDS, &to)
            .await
            .unwrap_err();
        assert!(matches!(err, RestoreError::Destination(_)), "{err}");
        assert!(names(out.path()).is_empty());
    }

    #[tokio::test]
    async fn a_download_failing_midway_leaves_nothing_behind() {
        let chunks: Chunks = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Err(RestoreError::Download {
                url: "u".into(),
                reason: "reset".into(),
            }),
        ])
        .boxed();
        let out = tempfile::tempdir().unwrap();
        let sha = Arc::new(OnceLock::new());
        let checked = verifying(chunks, "u".into(), vec![], Arc::clone(&sha));
        let to = out.path().join("got.db");
        let err =
            crate::member_ops::file::write_atomically(checked, &to, |op, path, source| RestoreError::Io {
                op,
                path: path.to_path_buf(),
                source,
            })
            .await
            .unwrap_err();
        assert!(matches!(err, RestoreError::Download { .. }), "{err}");
        assert!(sha.get().is_none());
        assert!(names(out.path()).is_empty());
    }
}
