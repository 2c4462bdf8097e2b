//! A binary of this workspace, built with cargo from the test process so a test never runs a
//! stale one: the operator ([`crate::operator::operator_binary`]) and the kubectl plugin
//! ([`crate::plugin::plugin_binary`]) each build theirs once per test process through
//! [`build`].

use std::path::PathBuf;
use std::process::Command;

use crate::tools;

/// Builds `bin` of `package` (`cargo build -p PACKAGE --bin BIN`) and returns the executable's
/// path, or cargo's stderr when the build failed or named no executable.
pub fn build(package: &str, bin: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(tools::workspace_root())
        .args([
            "build",
            "--quiet",
            "-p",
            package,
            "--bin",
            bin,
            "--message-format=json",
        ])
        .output()
        .map_err(|e| format!("run cargo: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    executable(&String::from_utf8_lossy(&out.stdout), bin)
        .ok_or_else(|| format!("cargo build reported no {bin} executable"))
}

/// The path of `bin` in cargo's JSON messages: the last compiler-artifact message for it.
fn executable(messages: &str, bin: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_artifact_of_the_binary_names_its_path() {
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"x"},"executable":null}"#,
            r#"{"reason":"compiler-artifact","target":{"name":"other"},"executable":"/t/other"}"#,
            "not json",
            r#"{"reason":"compiler-artifact","target":{"name":"x"},"executable":"/t/x"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(executable(&messages, "x"), Some(PathBuf::from("/t/x")));
        assert_eq!(executable(&messages, "y"), None);
    }
}
