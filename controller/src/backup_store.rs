//! Backup destinations as `object_store` stores: an S3-compatible bucket (endpoint, region,
//! path-style, credentials from a Secret or from the operator's environment/a file) or a
//! directory (the local filesystem store).
//!
//! Snapshots are written as they stream ([`Destination::put_snapshot_stream`]): to a directory
//! through a temporary file that is synced and renamed once the snapshot passed its integrity
//! check; to S3 as a multipart upload of [`PART_SIZE`] parts, at most [`PARTS_IN_FLIGHT`] in
//! flight, completed only after the check (aborted otherwise). Either way the memory held is a few
//! parts, whatever the snapshot's size, and a refused snapshot leaves no object at its key.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use etcd_operator_api::v1alpha2::BackupDestination;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::backup_policy as policy;
use crate::member_ops::{SnapshotError, SnapshotStream, Verified};

/// The size of the parts of an S3 multipart upload (S3 wants at least 5 MiB but for the last).
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts uploading at once; one more is filling. Memory held by an upload is at most about
/// `(PARTS_IN_FLIGHT + 1) * PART_SIZE`.
pub const PARTS_IN_FLIGHT: usize = 2;

/// How long an S3 connection may stay silent before a transfer counts as stalled (and is retried
/// by object_store).
const S3_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// HTTP settings for S3 transfers of whole snapshots: no limit on a request's total time (object
/// store's default of 30 s cuts off any download or part slower than that, whatever its size), but
/// a stalled connection — no bytes for [`S3_READ_TIMEOUT`] — fails and is retried.
pub fn s3_client_options() -> object_store::ClientOptions {
    object_store::ClientOptions::new()
        .with_timeout_disabled()
        .with_read_timeout(S3_READ_TIMEOUT)
}

/// Environment variable naming a credentials file for local mode (lines `KEY=VALUE` with
/// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`).
pub const CREDENTIALS_FILE_ENV: &str = "ETCD_OPERATOR_S3_CREDENTIALS_FILE";
/// Where a `volume.claimName` destination is mounted in the operator's Pod (cluster mode):
/// `<this>/<claimName>`.
pub const CLAIM_MOUNT_ROOT: &str = "/var/lib/etcd-operator/backups";

/// Where S3 credentials come from.
#[derive(Clone)]
pub enum Credentials {
    /// Cluster mode: the Secret named by `credentialsSecret`, in the cluster's namespace.
    Kubernetes(kube::Client),
    /// Local mode: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` from the environment, else the file
    /// named by [`CREDENTIALS_FILE_ENV`] (or this one).
    Environment {
        /// A credentials file to use when the environment has none.
        file: Option<PathBuf>,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Kubernetes(_) => f.write_str("Credentials::Kubernetes"),
            Self::Environment { file } => f
                .debug_struct("Credentials::Environment")
                .field("file", file)
                .finish(),
        }
    }
}

/// Opening or using a destination failed.
#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    /// Neither `s3` nor `volume` (or a volume with neither claim nor path).
    #[error("the backup destination names no store")]
    Empty,
    /// A claim in local mode.
    #[error("volume.claimName {0:?} needs the Kubernetes runtime; use volume.path in local mode")]
    ClaimInLocalMode(String),
    /// Reading the credentials Secret failed.
    #[error("read credentials Secret {namespace}/{name}")]
    Secret {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The Secret or file lacks a key.
    #[error("credentials {from} lack {key}")]
    MissingKey {
        /// Where they were read from.
        from: String,
        /// The missing key.
        key: &'static str,
    },
    /// The credentials file could not be read.
    #[error("read credentials file {path}")]
    File {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Creating or writing in the directory of a volume destination failed.
    #[error("{op} {path}")]
    Directory {
        /// What was being done.
        op: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The object store refused or failed.
    #[error("{op} {location}")]
    Store {
        /// What was being done.
        op: &'static str,
        /// The object or store.
        location: String,
        /// Cause.
        #[source]
        source: object_store::Error,
    },
}

/// An opened destination.
#[derive(Debug, Clone)]
pub struct Destination {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// `s3://<bucket>/` or the directory with a trailing `/`: prefixed to keys in locations.
    pub base: String,
    /// The key prefix inside the store (S3 `prefix`), without slashes around it.
    pub prefix: Option<String>,
    /// The directory of a volume destination (`None` for S3): snapshots are written to it
    /// directly, through a synced temporary file.
    pub dir: Option<PathBuf>,
}

/// Streaming a snapshot into a destination failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreSnapshotError {
    /// The snapshot stream failed (the member, its time limit, or its integrity check).
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The destination failed.
    #[error(transparent)]
    Destination(#[from] DestinationError),
}

/// Uploads `stream` as the parts of `upload` ([`PART_SIZE`] each, at most `in_flight` uploading
/// while the next fills) and completes it once the stream ended cleanly; an error from the stream
/// or a part aborts the upload, so the object never appears. Returns the bytes uploaded.
pub async fn upload_multipart(
    upload: Box<dyn MultipartUpload>,
    mut stream: impl Stream<Item = Result<Bytes, SnapshotError>> + Unpin,
    part_size: usize,
    in_flight: usize,
    location: &str,
) -> Result<u64, StoreSnapshotError> {
    let store_err = |op: &'static str| {
        let location = location.to_owned();
        move |source| DestinationError::Store { op, location, source }
    };
    let mut writer = WriteMultipart::new_with_chunk_size(upload, part_size);
    let mut size = 0u64;
    let failure: StoreSnapshotError = loop {
        match stream.next().await {
            Some(Ok(chunk)) => {
                // Back pressure: no more than `in_flight` parts uploading before the next fills.
                if let Err(e) = writer.wait_for_capacity(in_flight).await {
                    break store_err("upload snapshot part")(e).into();
                }
                size = size.saturating_add(chunk.len() as u64);
                writer.put(chunk);
            }
            Some(Err(e)) => break e.into(),
            None => {
                writer
                    .finish()
                    .await
                    .map_err(store_err("complete snapshot upload"))?;
                return Ok(size);
            }
        }
    };
    if let Err(error) = writer.abort().await {
        tracing::warn!(%location, error = %etcd_operator_api::report::Chain(&error), "could not abort a snapshot upload (the store expires incomplete uploads)");
    }
    Err(failure)
}

impl Destination {
    /// The location of a key as users see it: `s3://bucket/key` or `/dir/key`.
    pub fn location(&self, key: &str) -> String {
        format!("{}{key}", self.base)
    }

    /// The key of a location written by [`Self::location`], if it belongs to this store.
    pub fn key_of<'a>(&self, location: &'a str) -> Option<&'a str> {
        location.strip_prefix(&self.base)
    }

    fn err(op: &'static str, location: &str) -> impl FnOnce(object_store::Error) -> DestinationError {
        let location = location.to_owned();
        move |source| DestinationError::Store { op, location, source }
    }

    /// Streams a snapshot to `key` and then writes its checksum sidecar (the sidecar last: a
    /// snapshot without one is an interrupted upload). The checksum is computed while the
    /// snapshot streams; a snapshot that fails (its member, or its integrity check) leaves nothing
    /// at `key`. Memory: one chunk for a directory, a few [`PART_SIZE`] parts for S3.
    pub async fn put_snapshot_stream(
        &self,
        key: &str,
        stream: SnapshotStream,
    ) -> Result<Verified, StoreSnapshotError> {
        let location = self.location(key);
        let verified = stream.verified_handle();
        let endpoint = stream.endpoint.clone();
        if let Some(dir) = &self.dir {
            let path = dir.join(key);
            crate::member_ops::file::write_atomically(stream, &path, |op, path, source| {
                StoreSnapshotError::Destination(DestinationError::Directory {
                    op,
                    path: path.to_path_buf(),
                    source,
                })
            })
            .await?;
        } else {
            let path = object_store::path::Path::from(key);
            let upload = self
                .store
                .put_multipart(&path)
                .await
                .map_err(Self::err("start snapshot upload", &location))?;
            upload_multipart(upload, stream, PART_SIZE, PARTS_IN_FLIGHT, &location).await?;
        }
        let verified = verified.get().cloned().ok_or(SnapshotError::Etcd {
            endpoint,
            source: crate::member_ops::MemberOpError::NoEndpoint {
                op: "snapshot stream ended unverified",
            },
        })?;
        self.put_checksum(key, &verified.sha256).await?;
        Ok(verified)
    }

    /// Writes a snapshot held in memory and its checksum sidecar (small snapshots; everything
    /// else uses [`Self::put_snapshot_stream`]).
    pub async fn put_snapshot(
        &self,
        key: &str,
        data: bytes::Bytes,
        sha256: &str,
    ) -> Result<(), DestinationError> {
        let path = object_store::path::Path::from(key);
        self.store
            .put(&path, PutPayload::from(data))
            .await
            .map_err(Self::err("upload snapshot", &self.location(key)))?;
        self.put_checksum(key, sha256).await
    }

    /// Writes the checksum sidecar of the snapshot at `key`.
    async fn put_checksum(&self, key: &str, sha256: &str) -> Result<(), DestinationError> {
        let sidecar_key = format!("{key}{}", policy::CHECKSUM_SUFFIX);
        let sidecar = object_store::path::Path::from(sidecar_key.as_str());
        self.store
            .put(
                &sidecar,
                PutPayload::from(policy::checksum_file(sha256, key).into_bytes()),
            )
            .await
            .map_err(Self::err("upload checksum", &self.location(&sidecar_key)))?;
        Ok(())
    }

    /// Opens the object at `key` as a stream of chunks (the store's own, bounded).
    pub async fn get_stream(
        &self,
        key: &str,
    ) -> Result<futures::stream::BoxStream<'static, Result<Bytes, DestinationError>>, DestinationError> {
        let location = self.location(key);
        let got = self
            .store
            .get(&object_store::path::Path::from(key))
            .await
            .map_err(Self::err("download", &location))?;
        Ok(got
            .into_stream()
            .map(move |chunk| {
                chunk.map_err(|source| DestinationError::Store {
                    op: "download",
                    location: location.clone(),
                    source,
                })
            })
            .boxed())
    }

    /// Reads a whole object.
    pub async fn get(&self, key: &str) -> Result<bytes::Bytes, DestinationError> {
        let path = object_store::path::Path::from(key);
        let got = self
            .store
            .get(&path)
            .await
            .map_err(Self::err("download", &self.location(key)))?;
        got.bytes()
            .await
            .map_err(Self::err("download", &self.location(key)))
    }

    /// The checksum recorded beside a snapshot, if there is a sidecar.
    pub async fn recorded_checksum(&self, key: &str) -> Result<Option<String>, DestinationError> {
        let sidecar = format!("{key}{}", policy::CHECKSUM_SUFFIX);
        match self.get(&sidecar).await {
            Ok(text) => Ok(policy::parse_checksum_file(&String::from_utf8_lossy(&text))),
            Err(DestinationError::Store {
                source: object_store::Error::NotFound { .. },
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The snapshot keys directly under `dir` (a prefix ending in `/`), sorted (= by time).
    pub async fn list_snapshots(&self, dir: &str) -> Result<Vec<String>, DestinationError> {
        let prefix = object_store::path::Path::from(dir.trim_end_matches('/'));
        let listed = self
            .store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(Self::err("list snapshots", &self.location(dir)))?;
        let mut keys: Vec<String> = listed
            .objects
            .into_iter()
            .map(|o| o.location.to_string())
            .filter(|k| k.ends_with(policy::SNAPSHOT_SUFFIX))
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Deletes a snapshot and its sidecar (a missing sidecar is fine).
    pub async fn delete_snapshot(&self, key: &str) -> Result<(), DestinationError> {
        let sidecar = format!("{key}{}", policy::CHECKSUM_SUFFIX);
        match self
            .store
            .delete(&object_store::path::Path::from(sidecar.as_str()))
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => {
                return Err(DestinationError::Store {
                    op: "delete checksum",
                    location: self.location(&sidecar),
                    source,
                });
            }
        }
        self.store
            .delete(&object_store::path::Path::from(key))
            .await
            .map_err(Self::err("delete snapshot", &self.location(key)))
    }
}

/// The access key pair.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KeyPair {
    access_key_id: String,
    secret_access_key: String,
}

/// Reads `KEY=VALUE` lines (blank lines and `#` comments ignored).
fn key_pair_from_lines(text: &str, from: &str) -> Result<KeyPair, DestinationError> {
    let value = |key: &'static str| {
        text.lines()
            .filter_map(|l| l.trim().split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().trim_matches('"').to_owned())
            .filter(|v| !v.is_empty())
            .ok_or(DestinationError::MissingKey {
                from: from.to_owned(),
                key,
            })
    };
    Ok(KeyPair {
        access_key_id: value("AWS_ACCESS_KEY_ID")?,
        secret_access_key: value("AWS_SECRET_ACCESS_KEY")?,
    })
}

async fn key_pair(
    credentials: &Credentials,
    namespace: &str,
    secret: Option<&str>,
) -> Result<Option<KeyPair>, DestinationError> {
    match credentials {
        Credentials::Kubernetes(client) => {
            let Some(name) = secret else { return Ok(None) };
            let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
            let secret = api.get(name).await.map_err(|source| DestinationError::Secret {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            })?;
            let from = format!("Secret {namespace}/{name}");
            let data = secret.data.unwrap_or_default();
            let value = |key: &'static str| {
                data.get(key)
                    .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
                    .ok_or(DestinationError::MissingKey {
                        from: from.clone(),
                        key,
                    })
            };
            Ok(Some(KeyPair {
                access_key_id: value("AWS_ACCESS_KEY_ID")?,
                secret_access_key: value("AWS_SECRET_ACCESS_KEY")?,
            }))
        }
        Credentials::Environment { file } => {
            if let (Ok(id), Ok(key)) = (
                std::env::var("AWS_ACCESS_KEY_ID"),
                std::env::var("AWS_SECRET_ACCESS_KEY"),
            ) {
                return Ok(Some(KeyPair {
                    access_key_id: id,
                    secret_access_key: key,
                }));
            }
            let path = file
                .clone()
                .or_else(|| std::env::var_os(CREDENTIALS_FILE_ENV).map(PathBuf::from));
            let Some(path) = path else { return Ok(None) };
            let text = tokio::fs::read_to_string(&path)
                .await
                .map_err(|source| DestinationError::File {
                    path: path.clone(),
                    source,
                })?;
            key_pair_from_lines(&text, &path.display().to_string()).map(Some)
        }
    }
}

/// Opens a destination for a cluster in `namespace`.
pub async fn open(
    destination: &BackupDestination,
    namespace: &str,
    credentials: &Credentials,
) -> Result<Destination, DestinationError> {
    if let Some(s3) = &destination.s3 {
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&s3.bucket)
            .with_region(s3.region.as_deref().unwrap_or("us-east-1"))
            .with_virtual_hosted_style_request(!s3.force_path_style.unwrap_or(false))
            .with_client_options(s3_client_options());
        if let Some(endpoint) = &s3.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        if let Some(keys) = key_pair(credentials, namespace, s3.credentials_secret.as_deref()).await? {
            builder = builder
                .with_access_key_id(keys.access_key_id)
                .with_secret_access_key(keys.secret_access_key);
        }
        let store = builder.build().map_err(|source| DestinationError::Store {
            op: "configure S3 client",
            location: format!("s3://{}", s3.bucket),
            source,
        })?;
        let prefix = s3
            .prefix
            .as_deref()
            .map(|p| p.trim_matches('/').to_owned())
            .filter(|p| !p.is_empty());
        return Ok(Destination {
            store: Arc::new(store),
            base: format!("s3://{}/", s3.bucket),
            prefix,
            dir: None,
        });
    }
    let Some(volume) = &destination.volume else {
        return Err(DestinationError::Empty);
    };
    let dir = match (&volume.path, &volume.claim_name, credentials) {
        (Some(path), _, _) => PathBuf::from(path),
        (None, Some(claim), Credentials::Kubernetes(_)) => PathBuf::from(CLAIM_MOUNT_ROOT).join(claim),
        (None, Some(claim), Credentials::Environment { .. }) => {
            return Err(DestinationError::ClaimInLocalMode(claim.clone()));
        }
        (None, None, _) => return Err(DestinationError::Empty),
    };
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|source| DestinationError::Directory {
            op: "create backup directory",
            path: dir.clone(),
            source,
        })?;
    let store = LocalFileSystem::new_with_prefix(&dir).map_err(|source| DestinationError::Store {
        op: "open backup directory",
        location: dir.display().to_string(),
        source,
    })?;
    Ok(Destination {
        store: Arc::new(store),
        base: format!("{}/", dir.display().to_string().trim_end_matches('/')),
        prefix: None,
        dir: Some(dir),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_api::v1alpha2::VolumeDestination;

    #[test]
    fn s3_transfers_have_no_total_time_limit_but_a_stall_limit() {
        use object_store::ClientConfigKey;
        let options = s3_client_options();
        assert_eq!(options.get_config_value(&ClientConfigKey::Timeout), None);
        assert!(options.get_config_value(&ClientConfigKey::ReadTimeout).is_some());
        assert!(
            options
                .get_config_value(&ClientConfigKey::ConnectTimeout)
                .is_some()
        );
    }

    #[test]
    fn credential_files_are_key_value_lines() {
        let pair = key_pair_from_lines(
            "# test\nAWS_ACCESS_KEY_ID = id\nAWS_SECRET_ACCESS_KEY=\"secret\"\n",
            "f",
        )
        .unwrap();
        assert_eq!(pair.access_key_id, "id");
        assert_eq!(pair.secret_access_key, "secret");
        let err = key_pair_from_lines("AWS_ACCESS_KEY_ID=id\n", "f").unwrap_err();
        assert_eq!(err.to_string(), "credentials f lack AWS_SECRET_ACCESS_KEY");
    }

    #[tokio::test]
    async fn a_directory_destination_stores_lists_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("backups");
        let destination = BackupDestination {
            volume: Some(VolumeDestination {
                path: Some(root.display().to_string()),
                claim_name: None,
            }),
            s3: None,
        };
        let creds = Credentials::Environment { file: None };
        let d = open(&destination, "ns", &creds).await.unwrap();
        let key = "ns/c/20260102T030405Z-5.db";
        d.put_snapshot(key, bytes::Bytes::from_static(b"data"), &"a".repeat(64))
            .await
            .unwrap();
        assert!(root.join(key).is_file());
        assert_eq!(d.location(key), format!("{}/{key}", root.display()));
        assert_eq!(d.key_of(&d.location(key)), Some(key));
        assert_eq!(d.list_snapshots("ns/c/").await.unwrap(), vec![key.to_string()]);
        assert_eq!(d.recorded_checksum(key).await.unwrap(), Some("a".repeat(64)));
        assert_eq!(d.recorded_checksum("ns/c/none.db").await.unwrap(), None);
        d.delete_snapshot(key).await.unwrap();
        assert!(d.list_snapshots("ns/c/").await.unwrap().is_empty());
        // A claim cannot be used in local mode; an empty destination names nothing.
        let claim = BackupDestination {
            volume: Some(VolumeDestination {
                claim_name: Some("pvc".into()),
                path: None,
            }),
            s3: None,
        };
        assert!(matches!(
            open(&claim, "ns", &creds).await,
            Err(DestinationError::ClaimInLocalMode(_))
        ));
        assert!(matches!(
            open(&BackupDestination::default(), "ns", &creds).await,
            Err(DestinationError::Empty)
        ));
    }

    /// A multipart upload into an in-memory store that counts what the code under test holds:
    /// bytes produced by the source but not yet acknowledged by an uploaded part.
    #[derive(Debug)]
    struct Metered {
        inner: Box<dyn MultipartUpload>,
        meter: Arc<Meter>,
    }

    #[derive(Debug, Default)]
    struct Meter {
        produced: std::sync::atomic::AtomicU64,
        uploaded: std::sync::atomic::AtomicU64,
        max_held: std::sync::atomic::AtomicU64,
        parts: std::sync::atomic::AtomicU64,
        completed: std::sync::atomic::AtomicBool,
        aborted: std::sync::atomic::AtomicBool,
    }

    impl Meter {
        fn produce(&self, n: u64) {
            use std::sync::atomic::Ordering::SeqCst;
            let produced = self.produced.fetch_add(n, SeqCst) + n;
            let held = produced.saturating_sub(self.uploaded.load(SeqCst));
            self.max_held.fetch_max(held, SeqCst);
        }
    }

    impl MultipartUpload for Metered {
        fn put_part(&mut self, data: PutPayload) -> object_store::UploadPart {
            let meter = Arc::clone(&self.meter);
            let len = data.content_length() as u64;
            let upload = self.inner.put_part(data);
            Box::pin(async move {
                // A slow network: the producer must wait, not buffer.
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                upload.await?;
                meter.uploaded.fetch_add(len, std::sync::atomic::Ordering::SeqCst);
                meter.parts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
        }

        fn complete<'a, 'b>(
            &'a mut self,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = object_store::Result<object_store::PutResult>> + Send + 'b>,
        >
        where
            'a: 'b,
            Self: 'b,
        {
            self.meter
                .completed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            self.inner.complete()
        }

        fn abort<'a, 'b>(
            &'a mut self,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = object_store::Result<()>> + Send + 'b>>
        where
            'a: 'b,
            Self: 'b,
        {
            self.meter
                .aborted
                .store(true, std::sync::atomic::Ordering::SeqCst);
            self.inner.abort()
        }
    }

    async fn metered(
        store: &object_store::memory::InMemory,
        key: &str,
    ) -> (Box<dyn MultipartUpload>, Arc<Meter>) {
        let meter = Arc::new(Meter::default());
        let inner = store
            .put_multipart(&object_store::path::Path::from(key))
            .await
            .unwrap();
        (
            Box::new(Metered {
                inner,
                meter: Arc::clone(&meter),
            }),
            meter,
        )
    }

    #[tokio::test]
    async fn a_multipart_upload_holds_a_few_parts_whatever_the_size() {
        use std::sync::atomic::Ordering::SeqCst;
        const CHUNK: usize = 64 * 1024;
        const PART: usize = 1024 * 1024;
        const TOTAL: usize = 64 * PART;
        let store = object_store::memory::InMemory::new();
        let (upload, meter) = metered(&store, "k.db").await;
        let source_meter = Arc::clone(&meter);
        // Produced lazily: a chunk exists only once the upload asks for it.
        let source = futures::stream::iter(0..TOTAL / CHUNK).map(move |i| {
            source_meter.produce(CHUNK as u64);
            Ok::<_, SnapshotError>(Bytes::from(vec![(i % 256) as u8; CHUNK]))
        });
        let size = upload_multipart(upload, source, PART, PARTS_IN_FLIGHT, "mem://k.db")
            .await
            .unwrap();
        assert_eq!(size, TOTAL as u64);
        assert!(meter.completed.load(SeqCst) && !meter.aborted.load(SeqCst));
        assert_eq!(meter.parts.load(SeqCst), (TOTAL / PART) as u64);
        let held = meter.max_held.load(SeqCst);
        let bound = ((PARTS_IN_FLIGHT + 1) * PART + CHUNK) as u64;
        assert!(held <= bound, "held {held} bytes at most, bound {bound}");
        let stored = store
            .get(&object_store::path::Path::from("k.db"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(stored.len(), TOTAL);
        assert_eq!(stored[TOTAL - 1], ((TOTAL / CHUNK - 1) % 256) as u8);
    }

    #[tokio::test]
    async fn a_corrupt_snapshot_aborts_the_upload_and_no_object_appears() {
        use std::sync::atomic::Ordering::SeqCst;
        let store = object_store::memory::InMemory::new();
        let (upload, meter) = metered(&store, "k.db").await;
        let mut data = crate::member_ops::fake::fake_snapshot_bytes();
        data[10] ^= 1;
        let stream = SnapshotStream::from_bytes(1, "e", Bytes::from(data), 64);
        let err = upload_multipart(upload, stream, PART_SIZE, PARTS_IN_FLIGHT, "mem://k.db")
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreSnapshotError::Snapshot(SnapshotError::Corrupt { .. })),
            "{err}"
        );
        assert!(meter.aborted.load(SeqCst) && !meter.completed.load(SeqCst));
        assert!(matches!(
            store.head(&object_store::path::Path::from("k.db")).await,
            Err(object_store::Error::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn a_failing_part_aborts_the_upload() {
        #[derive(Debug)]
        struct Refusing(Arc<Meter>);
        impl MultipartUpload for Refusing {
            fn put_part(&mut self, _: PutPayload) -> object_store::UploadPart {
                Box::pin(async {
                    Err(object_store::Error::Generic {
                        store: "test",
                        source: "disk full".into(),
                    })
                })
            }
            fn complete<'a, 'b>(
                &'a mut self,
            ) -> std::pin::Pin<
                Box<
                    dyn std::future::Future<Output = object_store::Result<object_store::PutResult>>
                        + Send
                        + 'b,
                >,
            >
            where
                'a: 'b,
                Self: 'b,
            {
                Box::pin(async {
                    Err(object_store::Error::NotImplemented {
                        operation: "complete".into(),
                        implementer: "test".into(),
                    })
                })
            }
            fn abort<'a, 'b>(
                &'a mut self,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = object_store::Result<()>> + Send + 'b>>
            where
                'a: 'b,
                Self: 'b,
            {
                self.0.aborted.store(true, std::sync::atomic::Ordering::SeqCst);
                Box::pin(async { Ok(()) })
            }
        }
        let meter = Arc::new(Meter::default());
        let chunks = (0..64).map(|_| Ok::<_, SnapshotError>(Bytes::from(vec![0u8; 1024])));
        let err = upload_multipart(
            Box::new(Refusing(Arc::clone(&meter))),
            futures::stream::iter(chunks),
            1024,
            1,
            "mem://k.db",
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                err,
                StoreSnapshotError::Destination(DestinationError::Store { .. })
            ),
            "{err}"
        );
        assert!(meter.aborted.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_snapshot_streams_into_a_directory_destination_with_its_sidecar() {
        let dir = tempfile::tempdir().unwrap();
        let destination = BackupDestination {
            volume: Some(VolumeDestination {
                path: Some(dir.path().display().to_string()),
                claim_name: None,
            }),
            s3: None,
        };
        let d = open(&destination, "ns", &Credentials::Environment { file: None })
            .await
            .unwrap();
        let data = crate::member_ops::fake::fake_snapshot_bytes();
        let key = "ns/c/20260102T030405Z-5.db";
        let stream = SnapshotStream::from_bytes(5, "e", Bytes::from(data.clone()), 100);
        let verified = d.put_snapshot_stream(key, stream).await.unwrap();
        assert_eq!(verified.sha256, policy::sha256_hex(&data));
        assert_eq!(std::fs::read(dir.path().join(key)).unwrap(), data);
        assert_eq!(d.recorded_checksum(key).await.unwrap(), Some(verified.sha256));
        // A corrupt one: nothing at its key, no sidecar, no temporary file.
        let mut bad = data.clone();
        bad[0] ^= 1;
        let bad_key = "ns/c/20260102T030406Z-6.db";
        let stream = SnapshotStream::from_bytes(6, "e", Bytes::from(bad), 100);
        let err = d.put_snapshot_stream(bad_key, stream).await.unwrap_err();
        assert!(
            matches!(err, StoreSnapshotError::Snapshot(SnapshotError::Corrupt { .. })),
            "{err}"
        );
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("ns/c"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["20260102T030405Z-5.db", "20260102T030405Z-5.db.sha256"]);
    }
}
