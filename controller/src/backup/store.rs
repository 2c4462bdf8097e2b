//! Backup destinations as `object_store` stores: an S3-compatible bucket (endpoint, region,
//! path-style, credentials from a Secret or from the operator's environment/a file) or a
//! directory (the local filesystem store).

use std::path::PathBuf;
use std::sync::Arc;

use etcd_operator_api::v1alpha2::BackupDestination;
use k8s_openapi::api::core::v1::Secret;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::policy;

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
    #[error("read credentials Secret {namespace}/{name}: {source}")]
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
    #[error("read credentials file {path}: {source}")]
    File {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Creating the directory of a volume destination failed.
    #[error("create backup directory {path}: {source}")]
    Directory {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The object store refused or failed.
    #[error("{op} {location}: {source}")]
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

    /// Writes a snapshot and its checksum sidecar (the sidecar last: a snapshot without one is
    /// an interrupted upload).
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
            .with_virtual_hosted_style_request(!s3.force_path_style.unwrap_or(false));
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_api::v1alpha2::VolumeDestination;

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
}
