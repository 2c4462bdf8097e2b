//! How a crate's top-level modules import each other, read from the `crate::<module>` paths in
//! its source (comments and `#[cfg(test)]` code left out): the graph and its cycles, for the
//! layering tests (`apiserver/tests/layering.rs`, `controller/tests/layering.rs`). Text, not
//! the compiler's view, but dependable for this code: every import of another module is a
//! `crate::` path (`use crate::x::..`, `crate::x::y(..)`, `use crate::{x, y}`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module -> the other top-level modules its code names.
pub type ModuleGraph = BTreeMap<String, BTreeSet<String>>;

/// The graph of the crate whose source root is `src` (`lib.rs` and `main.rs` are not modules).
pub fn module_graph(src: &Path) -> std::io::Result<ModuleGraph> {
    let mut graph = ModuleGraph::new();
    let mut files = Vec::new();
    collect(src, &mut files)?;
    for file in files {
        let Ok(rel) = file.strip_prefix(src) else { continue };
        let Some(first) = rel.components().next() else {
            continue;
        };
        let top = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib"
            || top == "main"
            || rel
                .file_name()
                .is_some_and(|n| n == "tests.rs" || n.to_string_lossy().ends_with("_tests.rs"))
        {
            continue;
        }
        let text = std::fs::read_to_string(&file)?;
        let code = production_code(&text);
        let refs = graph.entry(top.clone()).or_default();
        for name in crate_paths(&code) {
            if name != top {
                refs.insert(name);
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for refs in graph.values_mut() {
        refs.retain(|r| modules.contains(r));
    }
    Ok(graph)
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The text before the inline `#[cfg(test)]` module, without comment lines (a
/// `#[cfg(test)] mod x;` declaration leaves out that line only).
fn production_code(text: &str) -> String {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            match lines.next() {
                Some(next) if next.trim_end().ends_with(';') => continue,
                _ => break,
            }
        }
        if !trimmed.starts_with("//") {
            out.push(line);
        }
    }
    out.join("\n")
}

/// The first segment of every `crate::` path, `crate::{a, b::c}` groups included.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `etcd_operator_crate::`, not ours
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or_default();
            for part in group.split(',') {
                let name = part.trim().split("::").next().unwrap_or_default();
                if !name.is_empty() {
                    names.insert(name.to_owned());
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

/// The cycles of `graph`: its strongly connected components of more than one module.
pub fn cycles(graph: &ModuleGraph) -> Vec<BTreeSet<String>> {
    // Two modules share a cycle when each reaches the other.
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for m in graph.keys() {
        if out.iter().any(|c| c.contains(m)) {
            continue;
        }
        let component: BTreeSet<String> = graph
            .keys()
            .filter(|o| *o == m || (reaches[m].contains(*o) && reaches[o].contains(m)))
            .cloned()
            .collect();
        if component.len() > 1 {
            out.push(component);
        }
    }
    out
}

/// `cargo metadata` could not tell.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// cargo could not be run.
    #[error("run cargo metadata")]
    Run(#[source] std::io::Error),
    /// cargo failed; its stderr.
    #[error("cargo metadata failed: {0}")]
    Failed(String),
    /// Its output is not the JSON it documents.
    #[error("parse the output of cargo metadata")]
    Parse(#[source] serde_json::Error),
    /// The package is not in the workspace.
    #[error("no package {0} in the workspace")]
    NoPackage(String),
}

/// The platform rustc builds for by default (`host:` of `rustc -vV`).
fn host_triple() -> Result<String, MetadataError> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = std::process::Command::new(rustc)
        .arg("-vV")
        .output()
        .map_err(MetadataError::Run)?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| MetadataError::Failed("rustc -vV names no host platform".to_owned()))
}

/// The packages `package` depends on for building it (normal and build dependencies, not
/// dev-dependencies) on this host, transitively, by name: from `cargo metadata` over the
/// workspace at `workspace`. Offline and for this host's platform only: the packages other
/// platforms need (e.g. Android's) are not downloaded by a build here, and need not be.
pub fn build_dependencies(workspace: &Path, package: &str) -> Result<BTreeSet<String>, MetadataError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let host = host_triple()?;
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &host,
        ])
        .current_dir(workspace)
        .output()
        .map_err(MetadataError::Run)?;
    if !out.status.success() {
        return Err(MetadataError::Failed(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(MetadataError::Parse)?;
    let name_of: BTreeMap<String, String> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_str()?.to_owned(), p["name"].as_str()?.to_owned())))
        .collect();
    let nodes: BTreeMap<String, Vec<String>> = meta["resolve"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| {
            let deps = n["deps"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|k| k["kind"].is_null() || k["kind"] == "build")
                })
                .filter_map(|d| d["pkg"].as_str().map(str::to_owned))
                .collect();
            Some((n["id"].as_str()?.to_owned(), deps))
        })
        .collect();
    let start = name_of
        .iter()
        .find(|(_, name)| *name == package)
        .map(|(id, _)| id.clone())
        .ok_or_else(|| MetadataError::NoPackage(package.to_owned()))?;
    let mut seen = BTreeSet::new();
    let mut todo = vec![start];
    while let Some(id) = todo.pop() {
        for dep in nodes.get(&id).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                todo.push(dep.clone());
            }
        }
    }
    Ok(seen
        .into_iter()
        .filter_map(|id| name_of.get(&id).cloned())
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn graph(edges: &[(&str, &str)]) -> ModuleGraph {
        let mut g = ModuleGraph::new();
        for (from, to) in edges {
            g.entry((*from).to_owned()).or_default().insert((*to).to_owned());
            g.entry((*to).to_owned()).or_default();
        }
        g
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_cycle_through_three_modules_is_found_and_a_chain_is_not() {
        let g = graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("e", "a")]);
        assert_eq!(cycles(&g), vec![set(&["a", "b", "c"])]);
        let chain = graph(&[("a", "b"), ("b", "c"), ("a", "c")]);
        assert_eq!(cycles(&chain), Vec::<BTreeSet<String>>::new());
    }

    #[test]
    fn a_synthetic_crate_with_a_cycle_is_flagged_from_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\n").unwrap();
        std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
        std::fs::create_dir(src.join("b")).unwrap();
        std::fs::write(
            src.join("b").join("mod.rs"),
            "pub struct B;\n// crate::c is only named in a comment\n",
        )
        .unwrap();
        std::fs::write(
            src.join("c.rs"),
            "pub fn c() -> crate::a::A { crate::a::A }\n#[cfg(test)]\nmod tests { use crate::b; }\n",
        )
        .unwrap();
        let g = module_graph(src).unwrap();
        assert_eq!(g["a"], set(&["b"]));
        assert_eq!(g["b"], set(&[]), "comments do not count");
        assert_eq!(g["c"], set(&["a"]), "test code does not count");
        assert!(cycles(&g).is_empty());
        std::fs::write(src.join("b").join("inner.rs"), "use crate::{c::c, a};\n").unwrap();
        let g = module_graph(src).unwrap();
        assert_eq!(g["b"], set(&["a", "c"]));
        assert_eq!(cycles(&g), vec![set(&["a", "b", "c"])]);
    }
}
