//! No `#[error]` in the workspace repeats its own source (docs/architecture.md, "Errors"): each
//! crate's `src/` is read with `syn` (`etcd_operator_tests::error_messages`), test modules
//! included, since their errors are printed as chains too.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use etcd_operator_tests::error_messages::repeats_under;

#[test]
fn no_error_message_repeats_its_source() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut crates = 0;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(workspace).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
            crates += 1;
            found.extend(repeats_under(&dir.join("src")).unwrap());
        }
    }
    assert!(crates >= 7, "found the workspace's crates ({crates})");
    let lines: Vec<String> = found
        .iter()
        .map(|(path, r)| {
            format!(
                "{}: {} #[error({:?})] names its source field `{}`",
                path.strip_prefix(workspace).unwrap_or(path).display(),
                r.item,
                r.message,
                r.field
            )
        })
        .collect();
    assert!(
        lines.is_empty(),
        "{} #[error] messages repeat their source (name what failed; the chain prints the cause):\n{}",
        lines.len(),
        lines.join("\n")
    );
}
