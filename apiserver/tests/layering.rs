//! The API server is a library below the controller, never beside it or above it: it does not
//! depend on the controller crate (nor on the binary, which does), and its top-level modules
//! import each other without cycles (`http` uses `cluster`'s code only through traits it
//! defines, such as `http::admission::CreateAdmission`).

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use etcd_operator_tests::layering::{build_dependencies, cycles, module_graph};

const FORBIDDEN: [&str; 2] = ["etcd-operator-controller", "etcd-operator"];

#[test]
fn the_manifest_names_neither_the_controller_nor_the_binary() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    for line in manifest.lines() {
        let key = line.split('=').next().unwrap_or_default().trim();
        assert!(
            !FORBIDDEN.contains(&key),
            "apiserver/Cargo.toml depends on {key}: the API server must not depend on the controller ({line})"
        );
    }
}

/// `cargo tree -p etcd-operator-apiserver` (dev-dependencies included) lists no controller:
/// the test-support crate brings it only with its `fleet` feature, which this crate does not ask
/// for.
#[test]
fn the_test_support_crate_comes_without_the_controller() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("etcd-operator-tests"))
        .unwrap();
    assert!(
        !line.contains("fleet") && !line.contains("default-features = true"),
        "{line}"
    );
    let workspace = std::fs::read_to_string(dir.join("../Cargo.toml")).unwrap();
    assert!(
        workspace
            .lines()
            .any(|l| l.starts_with("etcd-operator-tests = ") && l.contains("default-features = false")),
        "the workspace declares etcd-operator-tests without its default (fleet) feature"
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = std::process::Command::new(cargo)
        .args([
            "tree",
            "-p",
            "etcd-operator-apiserver",
            "--prefix",
            "none",
            "--offline",
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        tree.lines().any(|l| l.starts_with("etcd-operator-tests ")),
        "{tree}"
    );
    for forbidden in FORBIDDEN {
        assert!(
            !tree.lines().any(|l| l.starts_with(&format!("{forbidden} "))),
            "cargo tree -p etcd-operator-apiserver lists {forbidden}"
        );
    }
}

#[test]
fn no_build_dependency_reaches_the_controller() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let deps = build_dependencies(workspace, "etcd-operator-apiserver").unwrap();
    assert!(
        deps.contains("etcd-operator-api"),
        "the walk sees our crates: {deps:?}"
    );
    for forbidden in FORBIDDEN {
        assert!(
            !deps.contains(forbidden),
            "etcd-operator-apiserver depends on {forbidden}"
        );
    }
}

#[test]
fn the_source_names_no_controller_code_and_its_modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src).unwrap();
    assert!(
        graph.contains_key("http") && graph["cluster"].contains("http"),
        "{graph:#?}"
    );
    assert_eq!(
        cycles(&graph),
        Vec::<std::collections::BTreeSet<String>>::new(),
        "{graph:#?}"
    );
    let mut stack = vec![src];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(
                    !text.contains("etcd_operator_controller"),
                    "{} names the controller crate",
                    path.display()
                );
            }
        }
    }
}
