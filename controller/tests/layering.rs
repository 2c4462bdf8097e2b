//! The controller's modules depend downwards: `model` is plain data that imports no other module
//! (it once imported `restore::RestorePlan`, closing a cycle through `backup` and `member_ops`),
//! `outcome` and `runtime` are not tied in a cycle (they once shared a message constant), and
//! no top-level modules import each other in a cycle (`backup`, `member_ops`, `metrics`, `plan`,
//! `restore` and `validated` once did).

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;

use etcd_operator_tests::layering::{cycles, module_graph};

#[test]
fn model_imports_no_other_module() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap();
    assert_eq!(graph["model"], BTreeSet::new(), "model.rs is plain data");
}

/// No two top-level modules import each other, directly or through others. The pure backup rules
/// (`backup_policy`), the destinations (`backup_store`) and the snapshot file writer
/// (`member_ops::file`) sit below `backup`, which `member_ops`, `validated`, `restore` and
/// `metrics` (through `plan`) once reached back into.
#[test]
fn the_top_level_modules_form_no_cycle() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap();
    assert!(
        graph["backup"].contains("member_ops") && graph["plan"].contains("validated"),
        "the graph sees the controller's imports: {graph:#?}"
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "module cycles in the controller: {found:?}\n{graph:#?}"
    );
}
