//! The restore tool of each etcd version (`etcdutl snapshot restore` from 3.5, `etcdctl` for
//! 3.4) and restoring a verified snapshot into a member's data directory, crash-safe.

// The restore module's types and imports.
#[allow(clippy::wildcard_imports)]
use super::*;

/// The restore tool of an etcd version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreTool {
    /// `etcdutl snapshot restore` (etcd 3.5 and later).
    Etcdutl(PathBuf),
    /// `ETCDCTL_API=3 etcdctl snapshot restore` (etcd 3.4).
    Etcdctl(PathBuf),
}

impl RestoreTool {
    /// The tool for `version` among binaries laid out as `<dir>/<version>/{etcdutl,etcdctl}`
    /// (the local runtime's layout): the version's own when installed, else the newest installed
    /// one of the same minor (a release installed as the server alone, such as the crates.io
    /// builds, ships no tools). The storage format of a member is fixed within a minor, so any
    /// 3.5 `etcdutl` writes data every 3.5 server opens; a tool of another minor is never used.
    pub fn for_version(binaries: &Path, version: &str) -> Result<Self, RestoreError> {
        let (program, _) = tool_program(version);
        let own = binaries.join(version).join(program);
        if own.is_file() {
            return Ok(Self::of(program, own));
        }
        let installed = installed_with(binaries, program);
        match choose_tool_version(version, &installed) {
            ToolChoice::Own => Ok(Self::of(program, own)),
            ToolChoice::SameMinor(other) => {
                let path = binaries.join(&other).join(program);
                tracing::info!(
                    version,
                    tool = %path.display(),
                    "no {program} of etcd {version} installed; restoring with the one of etcd {other}, of the same minor (its data format is the same)"
                );
                Ok(Self::of(program, path))
            }
            ToolChoice::None => Err(RestoreError::ToolMissing {
                path: own,
                version: version.to_owned(),
                reason: missing_reason(version, program, &installed),
            }),
        }
    }

    fn of(program: &str, path: PathBuf) -> Self {
        if program == "etcdctl" {
            Self::Etcdctl(path)
        } else {
            Self::Etcdutl(path)
        }
    }

    /// The binary this tool runs.
    pub fn path(&self) -> &Path {
        match self {
            Self::Etcdutl(p) | Self::Etcdctl(p) => p,
        }
    }

    /// The command line restoring `snapshot` into `data_dir` for `member`.
    pub fn command(&self, snapshot: &Path, member: &RestoreMember, data_dir: &Path) -> std::process::Command {
        let (program, env) = match self {
            Self::Etcdutl(p) => (p, None),
            Self::Etcdctl(p) => (p, Some(("ETCDCTL_API", "3"))),
        };
        let mut cmd = std::process::Command::new(program);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        cmd.args(restore_args(
            &snapshot.to_string_lossy(),
            member,
            &data_dir.to_string_lossy(),
        ));
        cmd
    }
}

/// The restore tool's program name for `version` (`etcdctl` for 3.4, else `etcdutl`) and
/// whether it needs `ETCDCTL_API=3` (the tools of the official etcd images are on the `PATH`).
pub fn tool_program(version: &str) -> (&'static str, bool) {
    if version.starts_with("3.4.") {
        ("etcdctl", true)
    } else {
        ("etcdutl", false)
    }
}

/// Which installed version's restore tool restores data for `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The version's own tool.
    Own,
    /// The newest installed tool of the same minor (the version's own is not installed).
    SameMinor(String),
    /// None of the same minor is installed.
    None,
}

/// Chooses among `installed`, the versions whose directory holds the restore tool `version`
/// needs: `version` itself, else the newest release of the same `major.minor` (pre-releases and
/// names that are no supported release are ignored). Never a tool of another minor: the data
/// format of a member changes between minors.
pub fn choose_tool_version(version: &str, installed: &[String]) -> ToolChoice {
    if installed.iter().any(|v| v == version) {
        return ToolChoice::Own;
    }
    let Ok(wanted) = etcd_operator_api::versions::parse(version) else {
        return ToolChoice::None;
    };
    installed
        .iter()
        .filter_map(|name| {
            let v = etcd_operator_api::versions::parse(name).ok()?;
            (v.major == wanted.major && v.minor == wanted.minor).then_some((v, name))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map_or(ToolChoice::None, |(_, name)| ToolChoice::SameMinor(name.clone()))
}

/// Why no restore tool serves `version`, for [`RestoreError::ToolMissing`].
fn missing_reason(version: &str, program: &str, installed: &[String]) -> String {
    let minor = etcd_operator_api::versions::parse(version)
        .map(|v| format!("{}.{}", v.major, v.minor))
        .unwrap_or_else(|_| version.to_owned());
    let elsewhere = if installed.is_empty() {
        format!("no installed version has {program}")
    } else {
        format!("installed versions with {program}: {}", installed.join(", "))
    };
    format!(
        "no {program} of etcd {minor}.x is installed ({elsewhere}); the {program} of another minor is never used, as the data format of a member differs between minors"
    )
}

/// The versions under `binaries` whose directory holds `program`, sorted by name; an unreadable
/// directory lists none.
fn installed_with(binaries: &Path, program: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(binaries)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|v| !v.starts_with('.') && binaries.join(v).join(program).is_file())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// The arguments of `snapshot restore` of `snapshot` into `data_dir` for `member` (after the
/// program name; the same for `etcdutl` and `etcdctl`).
pub fn restore_args(snapshot: &str, member: &RestoreMember, data_dir: &str) -> Vec<String> {
    [
        "snapshot",
        "restore",
        snapshot,
        "--name",
        &member.name,
        "--initial-cluster",
        &member.initial_cluster,
        "--initial-cluster-token",
        &member.cluster_token,
        "--initial-advertise-peer-urls",
        &member.peer_url,
        "--data-dir",
        data_dir,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Whether a data directory already holds a member (`member/` inside it).
pub fn has_member_data(data_dir: &Path) -> bool {
    data_dir.join("member").is_dir()
}

/// Restores `snapshot` (a verified file) into `data_dir` for `member`. Crash-safe: the tool
/// writes into `<data_dir>.restoring`, which is renamed into place when complete; a data dir
/// that already holds a member is left alone.
pub async fn restore_into(
    tool: &RestoreTool,
    snapshot: &Path,
    member: &RestoreMember,
    data_dir: &Path,
) -> Result<(), RestoreError> {
    if has_member_data(data_dir) {
        return Ok(());
    }
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| RestoreError::Io { op, path, source }
    };
    let staging = data_dir.with_extension("restoring");
    match tokio::fs::remove_dir_all(&staging).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("clear", &staging)(e)),
    }
    if let Some(parent) = staging.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(io("create", parent))?;
    }
    let mut cmd = tokio::process::Command::from(tool.command(snapshot, member, &staging));
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(io("run restore tool for", &staging))?;
    if !output.status.success() {
        let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stdout));
        return Err(RestoreError::Tool {
            tool: format!("{tool:?}"),
            status: output.status.to_string(),
            output: text.trim().to_owned(),
        });
    }
    // An empty data dir the runtime created beforehand gives way to the restored one.
    match tokio::fs::remove_dir(data_dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("replace", data_dir)(e)),
    }
    tokio::fs::rename(&staging, data_dir)
        .await
        .map_err(io("move restored data into", data_dir))?;
    Ok(())
}

/// Fetches, verifies and restores: what a runtime calls before the first start of a member of
/// a cluster bootstrapped from a snapshot. Idempotent: a data dir holding a member is left as
/// it is (a restart after the restore).
pub async fn prepare_data_dir(
    plan: &RestorePlan,
    namespace: &str,
    credentials: &Credentials,
    tool: &RestoreTool,
    member: &RestoreMember,
    data_dir: &Path,
) -> Result<(), RestoreError> {
    if has_member_data(data_dir) {
        return Ok(());
    }
    let file = data_dir.with_extension("snapshot.db");
    let fetched = fetch(plan, namespace, credentials, &file).await?;
    let result = restore_into(tool, &file, member, data_dir).await;
    let _ = tokio::fs::remove_file(&file).await;
    tracing::info!(member = %member.name, from = %fetched.location, sha256 = %fetched.sha256, ok = result.is_ok(), "restored member data from snapshot");
    result
}
