//! Fetching a snapshot from where a restore plan says (an S3 key or a directory in a backup
//! destination, or a URL) and verifying it: the SHA-256 recorded at backup time and etcd's own
//! integrity hash.

// The restore module's types and imports.
#[allow(clippy::wildcard_imports)]
use super::*;

/// A fetched, verified snapshot.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The file's bytes.
    pub data: bytes::Bytes,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
    /// Where it came from.
    pub location: String,
}

async fn http_get(url: &str) -> Result<Option<bytes::Bytes>, RestoreError> {
    let err = |reason: String| RestoreError::Download {
        url: url.to_owned(),
        reason,
    };
    let resp = reqwest::get(url).await.map_err(|e| err(e.to_string()))?;
    if resp.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !resp.status().is_success() {
        return Err(err(format!("status {}", resp.status())));
    }
    resp.bytes().await.map(Some).map_err(|e| err(e.to_string()))
}

async fn fetch_url(url: &str) -> Result<(bytes::Bytes, Option<String>), RestoreError> {
    let sidecar_url = format!("{url}{}", policy::CHECKSUM_SUFFIX);
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| RestoreError::Download {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
        let get = |k: String| {
            let s3 = &s3;
            async move {
                match s3.get(&object_store::path::Path::from(k.as_str())).await {
                    Ok(r) => r.bytes().await.map(Some),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        };
        let to_err = |e: object_store::Error| RestoreError::Download {
            url: url.to_owned(),
            reason: e.to_string(),
        };
        let data = get(key.to_owned())
            .await
            .map_err(to_err)?
            .ok_or_else(|| RestoreError::Download {
                url: url.to_owned(),
                reason: "not found".into(),
            })?;
        let sidecar = get(format!("{key}{}", policy::CHECKSUM_SUFFIX))
            .await
            .map_err(to_err)?;
        return Ok((
            data,
            sidecar.and_then(|t| policy::parse_checksum_file(&String::from_utf8_lossy(&t))),
        ));
    }
    let data = http_get(url).await?.ok_or_else(|| RestoreError::Download {
        url: url.to_owned(),
        reason: "not found".into(),
    })?;
    let sidecar = http_get(&sidecar_url).await?;
    Ok((
        data,
        sidecar.and_then(|t| policy::parse_checksum_file(&String::from_utf8_lossy(&t))),
    ))
}

/// Checks fetched bytes: against the recorded checksum(s), then etcd's own hash (pure).
pub fn verify(data: &[u8], location: &str, expected: &[Option<String>]) -> Result<String, RestoreError> {
    let actual = hex::encode(Sha256::digest(data));
    for expected in expected.iter().flatten() {
        if !expected.eq_ignore_ascii_case(&actual) {
            return Err(RestoreError::ChecksumMismatch {
                location: location.to_owned(),
                expected: expected.clone(),
                actual,
            });
        }
    }
    policy::check_snapshot(data).map_err(|source| RestoreError::Corrupt {
        location: location.to_owned(),
        source,
    })?;
    Ok(actual)
}

/// Fetches the snapshot of a plan and verifies it.
pub async fn fetch(
    plan: &RestorePlan,
    namespace: &str,
    credentials: &Credentials,
) -> Result<Fetched, RestoreError> {
    let (data, recorded, location) = match &plan.source {
        SnapshotSource::Store { destination, key } => {
            let dest = store::open(destination, namespace, credentials).await?;
            let data = dest.get(key).await?;
            let recorded = dest.recorded_checksum(key).await?;
            (data, recorded, dest.location(key))
        }
        SnapshotSource::Url(url) => {
            let (data, recorded) = fetch_url(url).await?;
            (data, recorded, url.clone())
        }
    };
    let sha256 = verify(&data, &location, &[plan.expected_sha256.clone(), recorded])?;
    Ok(Fetched {
        data,
        sha256,
        location,
    })
}
