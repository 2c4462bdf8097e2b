//! Restore: fetch a snapshot (from an EtcdBackup's location, a key in a backup destination, or
//! a URL), verify it (the SHA-256 recorded at backup time, and etcd's own integrity hash), and
//! restore it into a member's data directory with the restore tool of the cluster's version
//! (`etcdutl snapshot restore` from 3.5; `etcdctl snapshot restore` for 3.4, which has no
//! etcdutl), so that the member starts from the snapshot. Where a version's own tool is not
//! installed (local runtime), the newest one of the same minor restores: never one of another.
//!
//! - [`fetch`](self::fetch): getting a snapshot from where the plan says, and verifying it;
//! - [`tool`]: the restore tool of each etcd version and restoring into a data directory;
//! - [`pod`]: the same steps as the init containers of a member Pod run them (Kubernetes).
//! - here: the plan (which snapshot, resolved from the spec and the EtcdBackup) and the errors.

mod fetch;
mod pod;
mod tool;

pub use crate::model::{RestorePlan, SnapshotSource};
pub use fetch::{Fetched, fetch, verify};
pub use pod::{
    PodFetch, PodFinish, RESTORE_SOURCE_MOUNT, check_reachable_from_pod, fetch_for_pod, finish_for_pod,
    source_claim,
};
pub use tool::{
    RestoreTool, ToolChoice, choose_tool_version, has_member_data, prepare_data_dir, restore_args,
    restore_into, tool_program,
};

use std::path::{Path, PathBuf};
use std::process::Stdio;

use etcd_operator_api::backup::EtcdBackup;
use etcd_operator_api::v1alpha2::{BackupDestination, RestoreSpec};
use object_store::ObjectStoreExt;

use crate::backup_policy::{self as policy, SnapshotCheckError, SnapshotDigest};
use crate::backup_store::{self as store, Credentials, DestinationError};

/// How the restored member is named and joins: the same values it starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreMember {
    /// `--name`.
    pub name: String,
    /// `--initial-advertise-peer-urls`.
    pub peer_url: String,
    /// `--initial-cluster`, e.g. `a=http://..,b=http://..`.
    pub initial_cluster: String,
    /// `--initial-cluster-token`.
    pub cluster_token: String,
}

/// A restore failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The restore spec names no snapshot, or the backup has none yet.
    #[error("restore source: {0}")]
    Source(String),
    /// The member Pods cannot reach the snapshot (kubernetes runtime).
    #[error("the snapshot cannot be fetched from the member Pods: {0}")]
    Unreachable(String),
    /// The operator's own image, which fetches snapshots in member Pods, is not known.
    #[error(
        "the operator's image is unknown, so member Pods cannot fetch the snapshot: set {0} in the operator's environment (the Helm chart does)"
    )]
    OperatorImageUnknown(&'static str),
    /// A restore init container of the member Pod failed (its termination message).
    #[error("init container {container} of the member Pod failed: {message}")]
    InPod {
        /// The init container.
        container: String,
        /// What it reported.
        message: String,
    },
    /// Reading the EtcdBackup failed.
    #[error("read EtcdBackup {name}")]
    ReadBackup {
        /// Its name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The destination holding the snapshot failed.
    #[error("fetch snapshot")]
    Destination(#[from] DestinationError),
    /// Downloading from a URL failed.
    #[error("fetch snapshot {url}: {reason}")]
    Download {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The snapshot is not the one that was backed up.
    #[error(
        "snapshot {location} was refused: its SHA-256 is {actual} but {expected} was recorded when it was taken (corrupted or replaced)"
    )]
    ChecksumMismatch {
        /// Where it came from.
        location: String,
        /// What was recorded.
        expected: String,
        /// What it has.
        actual: String,
    },
    /// The snapshot fails etcd's integrity check.
    #[error("snapshot {location} was refused")]
    Corrupt {
        /// Where it came from.
        location: String,
        /// What is wrong.
        #[source]
        source: SnapshotCheckError,
    },
    /// No restore tool for the version is installed: neither its own nor one of its minor.
    #[error("the restore tool for etcd {version} is missing at {path}: {reason} (run `make tools`)")]
    ToolMissing {
        /// Where its own was looked for.
        path: PathBuf,
        /// The version.
        version: String,
        /// What was found instead, and why it cannot serve.
        reason: String,
    },
    /// File work failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The restore tool failed.
    #[error("{tool} snapshot restore failed ({status}): {output}")]
    Tool {
        /// The tool.
        tool: String,
        /// Its exit status.
        status: String,
        /// Its output.
        output: String,
    },
}

/// Resolves a cluster's `spec.bootstrap.restore` into a plan. `backup` is the EtcdBackup named
/// by `backupName` (the caller reads it); its destination (or `fallback`, the destination of
/// the backed-up cluster) says how to reach its location.
pub fn plan(
    spec: &RestoreSpec,
    backup: Option<&EtcdBackup>,
    fallback: Option<&BackupDestination>,
) -> Result<RestorePlan, RestoreError> {
    if let Some(source) = &spec.source {
        return match (&source.url, &source.key, &source.destination) {
            (Some(url), _, _) => Ok(RestorePlan {
                source: SnapshotSource::Url(url.clone()),
                expected_sha256: None,
            }),
            (None, Some(key), Some(destination)) => Ok(RestorePlan {
                source: SnapshotSource::Store {
                    destination: destination.clone(),
                    key: key.clone(),
                },
                expected_sha256: None,
            }),
            _ => Err(RestoreError::Source(
                "source needs `url`, or `key` with `destination`".into(),
            )),
        };
    }
    let name = spec
        .backup_name
        .as_deref()
        .ok_or_else(|| RestoreError::Source("neither backupName nor source is set".into()))?;
    let backup = backup.ok_or_else(|| RestoreError::Source(format!("EtcdBackup {name} was not found")))?;
    let status = backup.status.clone().unwrap_or_default();
    if status.phase != Some(etcd_operator_api::backup::BackupPhase::Succeeded) {
        return Err(RestoreError::Source(format!(
            "EtcdBackup {name} has not succeeded (phase {})",
            status.phase.as_ref().map_or("Pending", |p| p.as_str())
        )));
    }
    let location = status
        .location
        .ok_or_else(|| RestoreError::Source(format!("EtcdBackup {name} records no location")))?;
    let destination = backup.spec.destination.clone().or_else(|| fallback.cloned());
    let source = match (location.strip_prefix("s3://"), destination) {
        (Some(rest), Some(destination)) if destination.s3.is_some() => {
            let key = rest
                .split_once('/')
                .map(|(_, k)| k.to_owned())
                .unwrap_or_default();
            SnapshotSource::Store { destination, key }
        }
        (Some(_), _) => SnapshotSource::Url(location.clone()),
        (None, _) => {
            // A file path: open its directory as a volume destination.
            let path = Path::new(&location);
            let dir = path.parent().map(|p| p.display().to_string()).unwrap_or_default();
            let key = path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            SnapshotSource::Store {
                destination: BackupDestination {
                    s3: None,
                    volume: Some(etcd_operator_api::v1alpha2::VolumeDestination {
                        path: Some(dir),
                        claim_name: None,
                    }),
                },
                key,
            }
        }
    };
    Ok(RestorePlan {
        source,
        expected_sha256: status.sha256,
    })
}

/// Reads the EtcdBackup a restore names (`None` when it does not exist).
pub async fn read_backup(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<EtcdBackup>, RestoreError> {
    let api: kube::Api<EtcdBackup> = kube::Api::namespaced(client.clone(), namespace);
    api.get_opt(name)
        .await
        .map_err(|source| RestoreError::ReadBackup {
            name: name.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_api::backup::{BackupPhase, EtcdBackupSpec, EtcdBackupStatus};
    use etcd_operator_api::v1alpha2::{RestoreSource, S3Destination};
    use sha2::{Digest, Sha256};

    fn snapshot_bytes() -> Vec<u8> {
        let db = vec![3u8; 2048];
        let mut data = db.clone();
        data.extend_from_slice(&Sha256::digest(&db));
        data
    }

    #[test]
    fn plans_serialize_for_the_member_configuration() {
        let plan = RestorePlan {
            source: SnapshotSource::Url("https://x/s.db".into()),
            expected_sha256: Some("ab".into()),
        };
        let json = serde_json::to_value(&plan).unwrap();
        assert_eq!(json["source"]["url"], "https://x/s.db");
        assert_eq!(serde_json::from_value::<RestorePlan>(json).unwrap(), plan);
    }

    #[test]
    fn a_checksum_mismatch_is_refused_clearly() {
        let data = snapshot_bytes();
        let good = hex::encode(Sha256::digest(&data));
        assert_eq!(verify(&data, "loc", &[Some(good.clone()), None]).unwrap(), good);
        let err = verify(&data, "s3://b/k.db", &[Some("0".repeat(64))]).unwrap_err();
        assert!(matches!(err, RestoreError::ChecksumMismatch { .. }));
        assert!(err.to_string().contains("s3://b/k.db was refused"), "{err}");
        let mut corrupt = data.clone();
        corrupt[5] ^= 0xff;
        // Without a recorded checksum, etcd's own hash still catches it.
        assert!(matches!(
            verify(&corrupt, "loc", &[None]),
            Err(RestoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn plans_from_sources_and_backups() {
        let by_url = RestoreSpec {
            source: Some(RestoreSource {
                url: Some("https://x/s.db".into()),
                ..Default::default()
            }),
            backup_name: None,
        };
        assert_eq!(
            plan(&by_url, None, None).unwrap().source,
            SnapshotSource::Url("https://x/s.db".into())
        );
        let by_backup = RestoreSpec {
            backup_name: Some("b1".into()),
            source: None,
        };
        assert!(matches!(
            plan(&by_backup, None, None),
            Err(RestoreError::Source(_))
        ));
        let mut backup = EtcdBackup::new(
            "b1",
            "ns",
            EtcdBackupSpec {
                cluster_name: "c".into(),
                destination: Some(BackupDestination {
                    s3: Some(S3Destination {
                        bucket: "bk".into(),
                        ..Default::default()
                    }),
                    volume: None,
                }),
            },
        );
        assert!(
            plan(&by_backup, Some(&backup), None).is_err(),
            "not succeeded yet"
        );
        backup.status = Some(EtcdBackupStatus {
            phase: Some(BackupPhase::Succeeded),
            location: Some("s3://bk/ns/c/manual/b1-x-5.db".into()),
            sha256: Some("ab".into()),
            ..Default::default()
        });
        let p = plan(&by_backup, Some(&backup), None).unwrap();
        assert_eq!(p.expected_sha256.as_deref(), Some("ab"));
        assert!(matches!(p.source, SnapshotSource::Store { ref key, .. } if key == "ns/c/manual/b1-x-5.db"));
        backup.spec.destination = None;
        backup.status.as_mut().unwrap().location = Some("/var/b/ns/c/x.db".into());
        let p = plan(&by_backup, Some(&backup), None).unwrap();
        match p.source {
            SnapshotSource::Store { destination, key } => {
                assert_eq!(key, "x.db");
                assert_eq!(destination.volume.unwrap().path.as_deref(), Some("/var/b/ns/c"));
            }
            other => panic!("{other:?}"),
        }
    }

    fn volume_plan(dir: &Path, key: &str, expected: Option<String>) -> RestorePlan {
        RestorePlan {
            source: SnapshotSource::Store {
                destination: BackupDestination {
                    s3: None,
                    volume: Some(etcd_operator_api::v1alpha2::VolumeDestination {
                        path: Some(dir.display().to_string()),
                        claim_name: None,
                    }),
                },
                key: key.into(),
            },
            expected_sha256: expected,
        }
    }

    #[test]
    fn s3_url_and_claim_sources_are_reachable_from_member_pods_a_host_directory_is_not() {
        let url = RestorePlan {
            source: SnapshotSource::Url("https://x/s.db".into()),
            expected_sha256: None,
        };
        assert!(check_reachable_from_pod(&url).is_ok());
        let s3 = RestorePlan {
            source: SnapshotSource::Store {
                destination: BackupDestination {
                    s3: Some(S3Destination {
                        bucket: "bk".into(),
                        ..Default::default()
                    }),
                    volume: None,
                },
                key: "k.db".into(),
            },
            expected_sha256: None,
        };
        assert!(check_reachable_from_pod(&s3).is_ok());
        let err = check_reachable_from_pod(&volume_plan(Path::new("/var/b"), "x.db", None)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the snapshot cannot be fetched from the member Pods: snapshot \"x.db\" is in directory \"/var/b\" on the operator's host, which member Pods cannot mount; copy it to S3, an HTTP(S) server or a volume claim in the cluster's namespace and restore from there"
        );
        let claim = RestorePlan {
            source: SnapshotSource::Store {
                destination: BackupDestination {
                    s3: None,
                    volume: Some(etcd_operator_api::v1alpha2::VolumeDestination {
                        path: None,
                        claim_name: Some("backups".into()),
                    }),
                },
                key: "x.db".into(),
            },
            expected_sha256: None,
        };
        assert!(check_reachable_from_pod(&claim).is_ok());
        assert_eq!(source_claim(&claim), Some("backups"));
        assert_eq!(source_claim(&s3), None);
    }

    #[tokio::test]
    async fn the_pod_steps_fetch_verify_and_move_the_restored_member_into_place() {
        let store = tempfile::tempdir().unwrap();
        let data = snapshot_bytes();
        std::fs::write(store.path().join("s.db"), &data).unwrap();
        let sha = hex::encode(Sha256::digest(&data));
        let vol = tempfile::tempdir().unwrap();
        let data_dir = vol.path().join("data");
        let snapshot = vol.path().join("restore/snapshot.db");
        let staging = vol.path().join("restore/data");
        std::fs::create_dir_all(staging.join("stale")).unwrap();

        // A wrong recorded checksum: refused, nothing written, the stale staging cleared.
        let bad = volume_plan(store.path(), "s.db", Some("0".repeat(64)));
        let err = fetch_for_pod(&bad, &data_dir, &snapshot, &staging, None)
            .await
            .unwrap_err();
        assert!(matches!(err, RestoreError::ChecksumMismatch { .. }), "{err}");
        assert!(!snapshot.exists() && !staging.exists());

        // On a claim: read from where the Pod mounts it.
        let on_claim = RestorePlan {
            source: SnapshotSource::Store {
                destination: BackupDestination {
                    s3: None,
                    volume: Some(etcd_operator_api::v1alpha2::VolumeDestination {
                        path: None,
                        claim_name: Some("backups".into()),
                    }),
                },
                key: "s.db".into(),
            },
            expected_sha256: Some(sha.clone()),
        };
        let claimed = tempfile::tempdir().unwrap();
        let claimed_snapshot = claimed.path().join("snapshot.db");
        let got = fetch_for_pod(
            &on_claim,
            &claimed.path().join("data"),
            &claimed_snapshot,
            &claimed.path().join("staging"),
            Some(store.path()),
        )
        .await
        .unwrap();
        assert!(
            matches!(got, PodFetch::Fetched { ref sha256, .. } if *sha256 == sha),
            "{got:?}"
        );
        assert_eq!(std::fs::read(&claimed_snapshot).unwrap(), data);

        let good = volume_plan(store.path(), "s.db", Some(sha.clone()));
        let got = fetch_for_pod(&good, &data_dir, &snapshot, &staging, None)
            .await
            .unwrap();
        assert_eq!(
            got,
            PodFetch::Fetched {
                location: format!("{}/s.db", store.path().display()),
                sha256: sha
            }
        );
        assert_eq!(std::fs::read(&snapshot).unwrap(), data);

        // The restore tool left nothing: a clear error, the data dir untouched.
        let err = finish_for_pod(&data_dir, &staging).await.unwrap_err();
        assert!(err.to_string().contains("holds no restored member"), "{err}");
        // What the etcd image's tool writes; an empty data dir (made by etcd or by hand) gives way.
        std::fs::create_dir_all(staging.join("member/snap")).unwrap();
        std::fs::create_dir_all(&data_dir).unwrap();
        assert_eq!(
            finish_for_pod(&data_dir, &staging).await.unwrap(),
            PodFinish::Restored
        );
        assert!(has_member_data(&data_dir) && !staging.exists());

        // A restarted Pod: nothing fetched (the source may be gone), the tool's copy discarded.
        std::fs::remove_file(store.path().join("s.db")).unwrap();
        assert_eq!(
            fetch_for_pod(&good, &data_dir, &snapshot, &staging, None)
                .await
                .unwrap(),
            PodFetch::Kept
        );
        std::fs::create_dir_all(staging.join("member")).unwrap();
        std::fs::write(data_dir.join("member/keep"), "x").unwrap();
        assert_eq!(
            finish_for_pod(&data_dir, &staging).await.unwrap(),
            PodFinish::AlreadyRestored
        );
        assert!(data_dir.join("member/keep").is_file() && !staging.exists());
        // A non-empty data dir without a member is not overwritten.
        let other = vol.path().join("other");
        std::fs::create_dir_all(other.join("junk")).unwrap();
        std::fs::create_dir_all(staging.join("member")).unwrap();
        assert!(matches!(
            finish_for_pod(&other, &staging).await,
            Err(RestoreError::Io { op: "replace", .. })
        ));
    }

    /// A binaries directory with `<version>/<tool>` files for each pair (empty files).
    fn binaries(pairs: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (v, tool) in pairs {
            std::fs::create_dir_all(dir.path().join(v)).unwrap();
            std::fs::write(dir.path().join(v).join(tool), "").unwrap();
        }
        dir
    }

    #[test]
    fn the_own_tool_is_preferred_to_a_newer_one_of_the_minor() {
        let dir = binaries(&[("3.5.1", "etcdutl"), ("3.5.16", "etcdutl"), ("3.5.34", "etcd")]);
        let tool = RestoreTool::for_version(dir.path(), "3.5.1").unwrap();
        assert_eq!(tool, RestoreTool::Etcdutl(dir.path().join("3.5.1/etcdutl")));
    }

    #[test]
    fn a_server_only_release_restores_with_the_newest_tool_of_its_minor() {
        // 3.5.34 is the server alone; 3.5.9 sorts after 3.5.16 by name but not by version; the
        // 3.6 tool and the 3.5.40 directory without a tool are not candidates.
        let dir = binaries(&[
            ("3.5.0", "etcdutl"),
            ("3.5.9", "etcdutl"),
            ("3.5.16", "etcdutl"),
            ("3.5.34", "etcd"),
            ("3.5.40", "etcd"),
            ("3.6.15", "etcdutl"),
            ("3.4.23", "etcdctl"),
        ]);
        let tool = RestoreTool::for_version(dir.path(), "3.5.34").unwrap();
        assert_eq!(tool, RestoreTool::Etcdutl(dir.path().join("3.5.16/etcdutl")));
        assert_eq!(tool.path(), dir.path().join("3.5.16/etcdutl"));
    }

    #[test]
    fn a_tool_of_another_minor_is_refused_with_the_reason() {
        let dir = binaries(&[("3.5.16", "etcdutl"), ("3.6.15", "etcd"), ("3.4.23", "etcdctl")]);
        let err = RestoreTool::for_version(dir.path(), "3.6.15").unwrap_err();
        let RestoreError::ToolMissing {
            path,
            version,
            reason,
        } = &err
        else {
            panic!("not ToolMissing: {err}");
        };
        assert_eq!(path, &dir.path().join("3.6.15/etcdutl"));
        assert_eq!(version, "3.6.15");
        assert!(
            reason.contains("no etcdutl of etcd 3.6.x is installed"),
            "{reason}"
        );
        assert!(
            reason.contains("(installed versions with etcdutl: 3.5.16)"),
            "{reason}"
        );
        assert!(reason.contains("another minor is never used"), "{reason}");
        // Nor the other way round: a 3.6 etcdutl does not restore for 3.5.
        let dir = binaries(&[("3.6.15", "etcdutl"), ("3.5.34", "etcd")]);
        assert!(matches!(
            RestoreTool::for_version(dir.path(), "3.5.34"),
            Err(RestoreError::ToolMissing { .. })
        ));
        // An empty (or absent) binaries directory says none is installed.
        let err = RestoreTool::for_version(&dir.path().join("absent"), "3.5.34").unwrap_err();
        assert!(
            err.to_string().contains("(no installed version has etcdutl)"),
            "{err}"
        );
    }

    #[test]
    fn etcd_3_4_restores_with_etcdctl_also_of_another_patch() {
        let dir = binaries(&[("3.4.23", "etcdctl"), ("3.4.20", "etcd"), ("3.5.16", "etcdutl")]);
        assert_eq!(
            RestoreTool::for_version(dir.path(), "3.4.23").unwrap(),
            RestoreTool::Etcdctl(dir.path().join("3.4.23/etcdctl"))
        );
        assert_eq!(
            RestoreTool::for_version(dir.path(), "3.4.20").unwrap(),
            RestoreTool::Etcdctl(dir.path().join("3.4.23/etcdctl"))
        );
        // The etcdctl of 3.5 is no restore tool for 3.4 (nor is any tool of 3.5).
        let dir = binaries(&[("3.5.16", "etcdctl"), ("3.5.16", "etcdutl")]);
        assert!(RestoreTool::for_version(dir.path(), "3.4.23").is_err());
    }

    #[test]
    fn choose_tool_version_rules() {
        let installed = |vs: &[&str]| vs.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            choose_tool_version("3.5.34", &installed(&["3.5.34", "3.5.40"])),
            ToolChoice::Own
        );
        assert_eq!(
            choose_tool_version("3.5.34", &installed(&["3.5.1", "3.5.16", "3.5.9", "3.6.15"])),
            ToolChoice::SameMinor("3.5.16".into())
        );
        // A newer patch of the minor is as good as an older one.
        assert_eq!(
            choose_tool_version("3.5.1", &installed(&["3.5.16"])),
            ToolChoice::SameMinor("3.5.16".into())
        );
        assert_eq!(
            choose_tool_version("3.6.15", &installed(&["3.5.16", "3.4.23"])),
            ToolChoice::None
        );
        // Pre-releases and names that are no release are no candidates.
        assert_eq!(
            choose_tool_version("3.6.15", &installed(&["3.6.0-rc.1", "latest", ".tmp"])),
            ToolChoice::None
        );
        assert_eq!(
            choose_tool_version("junk", &installed(&["3.5.16"])),
            ToolChoice::None
        );
    }

    #[test]
    fn the_tool_follows_the_version() {
        let dir = tempfile::tempdir().unwrap();
        for (v, tool) in [("3.4.23", "etcdctl"), ("3.5.1", "etcdutl")] {
            std::fs::create_dir_all(dir.path().join(v)).unwrap();
            std::fs::write(dir.path().join(v).join(tool), "").unwrap();
        }
        assert!(matches!(
            RestoreTool::for_version(dir.path(), "3.4.23").unwrap(),
            RestoreTool::Etcdctl(_)
        ));
        assert!(matches!(
            RestoreTool::for_version(dir.path(), "3.5.1").unwrap(),
            RestoreTool::Etcdutl(_)
        ));
        let err = RestoreTool::for_version(dir.path(), "3.6.0").unwrap_err();
        assert!(err.to_string().contains("make tools"), "{err}");
        let member = RestoreMember {
            name: "m0".into(),
            peer_url: "http://127.0.0.1:1".into(),
            initial_cluster: "m0=http://127.0.0.1:1".into(),
            cluster_token: "t".into(),
        };
        let cmd = RestoreTool::Etcdctl("etcdctl".into()).command(Path::new("s.db"), &member, Path::new("d"));
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args,
            [
                "snapshot",
                "restore",
                "s.db",
                "--name",
                "m0",
                "--initial-cluster",
                "m0=http://127.0.0.1:1",
                "--initial-cluster-token",
                "t",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:1",
                "--data-dir",
                "d"
            ]
        );
        assert!(
            cmd.get_envs()
                .any(|(k, v)| k == "ETCDCTL_API" && v == Some("3".as_ref()))
        );
        assert_eq!(args, restore_args("s.db", &member, "d"));
        assert_eq!(tool_program("3.4.23"), ("etcdctl", true));
        assert_eq!(tool_program("3.5.21"), ("etcdutl", false));
    }
}
