//! No process a test started may outlive its test.
//!
//! `make test` runs this once more after the whole suite with `ETCD_OPERATOR_SUITE_FINISHED=1`;
//! then any process running a binary from the tools directory counts as left over too.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use etcd_operator_tests::leftovers::{orphaned_test_processes, processes_running_from};
use etcd_operator_tests::tools::tools_dir;

#[test]
fn no_test_process_outlives_its_test() {
    let mut found = orphaned_test_processes();
    if std::env::var_os("ETCD_OPERATOR_SUITE_FINISHED").is_some() {
        found.extend(processes_running_from(&tools_dir()));
    }
    assert!(found.is_empty(), "processes left running by tests:\n{found:#?}");
}
