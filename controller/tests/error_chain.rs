//! What a person reads when a controller step fails (the Degraded condition, the Warning Event,
//! the log line): `api::report::chain` of the step's error, where each error says what failed
//! and its causes follow once each, none repeated by the message above it.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::error::Error;

use etcd_operator_controller::member_ops::{MemberOpError, SnapshotError};
use etcd_operator_controller::outcome::StepError;

/// A pre-upgrade snapshot that etcd refused: step -> snapshot -> member call -> etcd.
fn refused_snapshot() -> StepError {
    StepError::Snapshot(SnapshotError::Etcd {
        endpoint: "https://c-1.c:2379".into(),
        source: MemberOpError::Etcd {
            op: "snapshot",
            source: etcd_client::Error::InvalidArgs("the member is shutting down".into()),
        },
    })
}

#[test]
fn a_step_error_chain_names_each_cause_once() {
    let err = refused_snapshot();
    let chain = etcd_operator_api::report::chain(&err);
    println!("{chain}");
    let mut causes = Vec::new();
    let mut next: Option<&(dyn Error + 'static)> = Some(&err);
    while let Some(e) = next {
        causes.push(e.to_string());
        next = e.source();
    }
    assert_eq!(
        causes.len(),
        4,
        "step -> snapshot -> member call -> etcd: {causes:?}"
    );
    // Each message is printed once, in order, and none repeats a deeper cause's message.
    assert_eq!(chain, causes.join(": "));
    for (i, cause) in causes.iter().enumerate() {
        for deeper in &causes[i + 1..] {
            assert!(
                !cause.contains(deeper.as_str()),
                "{cause:?} repeats its cause {deeper:?}"
            );
        }
    }
    assert_eq!(chain.matches("the member is shutting down").count(), 1, "{chain}");
    assert_eq!(chain.matches("https://c-1.c:2379").count(), 1, "{chain}");
}
