//! The restore steps as the init containers of a member Pod run them (Kubernetes runtime): fetch
//! and verify in one container, the image's restore tool in the next, and finishing in a third.

// The restore module's types and imports.
#[allow(clippy::wildcard_imports)]
use super::*;

/// Where a member Pod's restore step mounts the claim its snapshot is on (read-only), for a
/// snapshot in a `volume.claimName` destination.
pub const RESTORE_SOURCE_MOUNT: &str = "/var/lib/etcd-operator/restore-source";

/// The claim a plan's snapshot is on, when it is in a `volume.claimName` destination (a claim in
/// the cluster's namespace, which the member Pod mounts read-only).
pub fn source_claim(plan: &RestorePlan) -> Option<&str> {
    match &plan.source {
        SnapshotSource::Store { destination, .. } if destination.s3.is_none() => {
            destination.volume.as_ref().and_then(|v| v.claim_name.as_deref())
        }
        _ => None,
    }
}

/// Whether a member Pod can fetch the plan's snapshot itself: a URL, an S3 destination or a
/// volume claim in the cluster's namespace (mounted read-only into the restore step) can be; a
/// directory on the operator's host cannot.
pub fn check_reachable_from_pod(plan: &RestorePlan) -> Result<(), RestoreError> {
    match &plan.source {
        SnapshotSource::Url(_) => Ok(()),
        SnapshotSource::Store { destination, .. } if destination.s3.is_some() => Ok(()),
        SnapshotSource::Store { .. } if source_claim(plan).is_some() => Ok(()),
        SnapshotSource::Store { destination, key } => {
            let place = match destination.volume.as_ref().and_then(|v| v.path.as_ref()) {
                Some(path) => format!("directory {path:?} on the operator's host"),
                None => "a destination naming no store".to_owned(),
            };
            Err(RestoreError::Unreachable(format!(
                "snapshot {key:?} is in {place}, which member Pods cannot mount; copy it to S3, an HTTP(S) server or a volume claim in the cluster's namespace and restore from there"
            )))
        }
    }
}

/// What [`fetch_for_pod`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodFetch {
    /// The snapshot was fetched, verified and written.
    Fetched {
        /// Where it came from.
        location: String,
        /// Its SHA-256.
        sha256: String,
    },
    /// The data directory already holds a member and the snapshot file is still there: nothing
    /// was downloaded (the restore step then makes a throwaway copy that [`finish_for_pod`]
    /// discards).
    Kept,
}

/// The first step of a restore inside a member Pod (`etcd-operator fetch-snapshot`, run by an
/// init container in the operator's image on the member's volume): clears `staging`, then —
/// unless `data_dir` already holds a member and `snapshot` exists — fetches the snapshot of
/// `plan` with S3 keys from the environment, verifies it, and writes it to `snapshot`
/// (through a temporary file beside it, so a half-written file is never restored). A snapshot that
/// fails its checks is refused and nothing is written.
///
/// A snapshot on a volume claim is read from `claim_dir`, where the Pod mounts the claim.
pub async fn fetch_for_pod(
    plan: &RestorePlan,
    data_dir: &Path,
    snapshot: &Path,
    staging: &Path,
    claim_dir: Option<&Path>,
) -> Result<PodFetch, RestoreError> {
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| RestoreError::Io { op, path, source }
    };
    match tokio::fs::remove_dir_all(staging).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("clear", staging)(e)),
    }
    if has_member_data(data_dir) && snapshot.is_file() {
        return Ok(PodFetch::Kept);
    }
    // Streamed and verified into a temporary file beside `snapshot`, renamed once whole.
    let mut plan = plan.clone();
    if let (Some(dir), SnapshotSource::Store { destination, .. }) = (claim_dir, &mut plan.source)
        && let Some(volume) = destination.volume.as_mut()
        && volume.claim_name.is_some()
    {
        // The claim is mounted here: read it as a directory.
        volume.claim_name = None;
        volume.path = Some(dir.display().to_string());
    }
    let fetched = fetch(&plan, "", &Credentials::Environment { file: None }, snapshot).await?;
    Ok(PodFetch::Fetched {
        location: fetched.location,
        sha256: fetched.sha256,
    })
}

/// What [`finish_for_pod`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodFinish {
    /// The restored data was moved into the data directory.
    Restored,
    /// The data directory already held a member; the restored copy was discarded.
    AlreadyRestored,
}

/// The last step of a restore inside a member Pod (`etcd-operator finish-restore`, after the
/// etcd image's restore tool wrote `staging`): moves the restored member into `data_dir` (an
/// empty `data_dir` gives way), unless `data_dir` already holds a member, in which case the
/// copy is discarded. The snapshot file is kept: a restarted Pod runs the restore tool again.
pub async fn finish_for_pod(data_dir: &Path, staging: &Path) -> Result<PodFinish, RestoreError> {
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| RestoreError::Io { op, path, source }
    };
    if has_member_data(data_dir) {
        match tokio::fs::remove_dir_all(staging).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("discard", staging)(e)),
        }
        return Ok(PodFinish::AlreadyRestored);
    }
    if !has_member_data(staging) {
        return Err(RestoreError::Tool {
            tool: "etcdutl/etcdctl".into(),
            status: "left no member".into(),
            output: format!("{} holds no restored member", staging.display()),
        });
    }
    match tokio::fs::remove_dir(data_dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("replace", data_dir)(e)),
    }
    tokio::fs::rename(staging, data_dir)
        .await
        .map_err(io("move restored data into", data_dir))?;
    Ok(PodFinish::Restored)
}
