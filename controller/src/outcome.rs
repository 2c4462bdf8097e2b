//! Typed outcomes of a reconcile: the step taken and, when it failed, a [`StepError`] whose
//! stable [`reason`](StepError::reason) feeds the `Degraded` condition and whose
//! [`code`](StepError::code) names the cause for logs and Events. Nothing downstream reads an
//! error's text to decide anything.

use crate::member_ops::{MemberOpError, SnapshotError};
use crate::plan::{RollRecord, Step};
use crate::restore::RestoreError;
use crate::runtime::RuntimeError;

/// What the reconcile did, for status.
#[derive(Debug)]
pub struct Outcome {
    /// The last step planned.
    pub step: Step,
    /// The error the step ran into, if any.
    pub error: Option<StepError>,
    /// The rolling version change as the reconcile left it (persisted in `status.upgrade`).
    pub roll: Option<RollRecord>,
    /// The template rollout as the reconcile left it (persisted in `status.rollout`).
    pub rollout: Option<crate::validated::RolloutRecord>,
    /// The maintenance record as the reconcile left it (persisted in `status.maintenance`);
    /// `None` keeps the previous one.
    pub maintenance: Option<etcd_operator_api::status::MaintenanceStatus>,
}

impl Outcome {
    /// The outcome of a reconcile that did nothing (yet).
    pub fn idle() -> Self {
        Self {
            step: Step::Idle,
            error: None,
            roll: None,
            rollout: None,
            maintenance: None,
        }
    }
}

/// Carrying out a step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The runtime (processes, Pods, volumes) failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// An etcd membership call failed.
    #[error(transparent)]
    Member(#[from] MemberOpError),
    /// Leadership is to move but the leader advertises no client URL to ask.
    #[error("move leader: member {id:x} (the leader) has no client URL")]
    LeaderUnreachable {
        /// The leader's ID.
        id: u64,
    },
    /// A member to defragment advertises no client URL to ask.
    #[error("defragment: member {name} has no client URL")]
    DefragmentUnreachable {
        /// The member name.
        name: String,
    },
    /// The pre-upgrade snapshot could not be taken.
    #[error("take the pre-upgrade snapshot")]
    Snapshot(#[source] SnapshotError),
    /// The pre-upgrade snapshot could not be taken: no member answers or none is healthy.
    #[error("pre-upgrade snapshot: no healthy member to take it from")]
    NoSnapshotSource,
    /// The pre-upgrade snapshot could not be read back from where it was saved.
    #[error("read the pre-upgrade snapshot {}", path.display())]
    ReadSnapshot {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The pre-upgrade snapshot could not be sent to the backup destination.
    #[error("send the pre-upgrade snapshot")]
    SendSnapshot(#[source] crate::backup_store::DestinationError),
    /// The snapshot the cluster is to bootstrap from cannot be resolved or fetched.
    #[error("restore from snapshot")]
    Restore(#[source] RestoreError),
}

/// The `Degraded` reason of a failed restore.
pub const REASON_RESTORE_FAILED: &str = "RestoreFailed";
/// The `Degraded` reason when the members cannot be reached because the TLS handshake fails
/// (a certificate expired, or is not from the CA the other side trusts).
pub const REASON_TLS_HANDSHAKE_FAILED: &str = "TLSHandshakeFailed";
/// The `Degraded` reason when the certificates the cluster's TLS needs are not there: a
/// `secretRef` Secret missing or unusable, a cert-manager Certificate not issued yet, or
/// certificates that could not be made.
pub const REASON_CERTIFICATES_UNAVAILABLE: &str = "CertificatesUnavailable";
/// The `Degraded` reason when a member's volume cannot grow to `spec.storage.size`: its
/// StorageClass does not allow expansion.
pub const REASON_VOLUME_EXPANSION_NOT_ALLOWED: &str = "VolumeExpansionNotAllowed";
/// The `Degraded` reason of any other failed step.
pub const REASON_STEP_FAILED: &str = "StepFailed";

impl StepError {
    /// Whether the step is under way rather than failed: something it started takes time (a
    /// Pod stopping, a certificate being issued). Looked at again soon, without backing off.
    pub fn is_waiting(&self) -> bool {
        matches!(
            self,
            Self::Runtime(RuntimeError::Waiting { .. } | RuntimeError::CertificateNotReady { .. })
        )
    }

    /// Whether retrying cannot help and only a person can (the spec names a version that is not
    /// installed, a snapshot is corrupt or not the one backed up, a restore tool or the
    /// operator's image is missing). Failures that may clear by themselves (a destination
    /// unreachable, an EtcdBackup not finished yet, a Secret not created yet) are not.
    pub fn needs_a_person(&self) -> bool {
        use crate::restore::RestoreError as R;
        let permanent_restore = |e: &R| {
            matches!(
                e,
                R::ChecksumMismatch { .. }
                    | R::Corrupt { .. }
                    | R::ToolMissing { .. }
                    | R::OperatorImageUnknown(_)
            )
        };
        match self {
            Self::Restore(e) => permanent_restore(e),
            Self::Runtime(RuntimeError::Restore { source, .. }) => permanent_restore(source),
            Self::Runtime(
                RuntimeError::VersionUnavailable { .. } | RuntimeError::VolumeExpansionNotAllowed { .. },
            ) => true,
            _ => false,
        }
    }

    /// The `Degraded` condition's reason: `RestoreFailed` for a cluster that cannot start from
    /// its snapshot, `TLSHandshakeFailed` and `CertificatesUnavailable` for TLS,
    /// `VolumeExpansionNotAllowed` for a volume that cannot grow, `StepFailed` for everything
    /// else (documented and stable).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Restore(_) | Self::Runtime(RuntimeError::Restore { .. }) => REASON_RESTORE_FAILED,
            Self::Member(MemberOpError::Tls { .. }) => REASON_TLS_HANDSHAKE_FAILED,
            Self::Runtime(
                RuntimeError::TlsSecret { .. }
                | RuntimeError::CertificateNotReady { .. }
                | RuntimeError::Certificates { .. },
            ) => REASON_CERTIFICATES_UNAVAILABLE,
            Self::Runtime(RuntimeError::VolumeExpansionNotAllowed { .. }) => {
                REASON_VOLUME_EXPANSION_NOT_ALLOWED
            }
            _ => REASON_STEP_FAILED,
        }
    }

    /// The cause, finer than [`reason`](Self::reason), for logs, Events and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Restore(_) | Self::Runtime(RuntimeError::Restore { .. }) => "RestoreFailed",
            Self::Runtime(RuntimeError::VersionUnavailable { .. }) => "VersionUnavailable",
            Self::Runtime(RuntimeError::TlsSecret { .. }) => "TLSSecretInvalid",
            Self::Runtime(RuntimeError::CertificateNotReady { .. }) => "WaitingForCertificate",
            Self::Runtime(RuntimeError::Certificates { .. }) => "CertificatesFailed",
            Self::Runtime(RuntimeError::TlsUnsupported { .. }) => "TLSProviderUnsupported",
            Self::Runtime(RuntimeError::Waiting { .. }) => "RuntimeWaiting",
            Self::Runtime(RuntimeError::VolumeExpansionNotAllowed { .. }) => {
                REASON_VOLUME_EXPANSION_NOT_ALLOWED
            }
            Self::Runtime(_) => "RuntimeFailed",
            Self::Member(MemberOpError::NotReadyYet { .. }) => "EtcdNotReady",
            Self::Member(MemberOpError::Timeout { .. }) => "EtcdTimeout",
            Self::Member(MemberOpError::Tls { .. }) => REASON_TLS_HANDSHAKE_FAILED,
            Self::Member(_) | Self::LeaderUnreachable { .. } | Self::DefragmentUnreachable { .. } => {
                "EtcdCallFailed"
            }
            Self::Snapshot(_) | Self::NoSnapshotSource | Self::ReadSnapshot { .. } => "SnapshotFailed",
            Self::SendSnapshot(_) => "BackupDestinationFailed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restores_fail_as_restore_failed_and_everything_else_as_step_failed() {
        let in_runtime = StepError::Runtime(RuntimeError::Restore {
            member: "m".into(),
            source: Box::new(RestoreError::Source("EtcdBackup b1 was not found".into())),
        });
        let resolving = StepError::Restore(RestoreError::Source("no snapshot".into()));
        for e in [&in_runtime, &resolving] {
            assert_eq!((e.reason(), e.code()), ("RestoreFailed", "RestoreFailed"), "{e}");
        }
        let text = etcd_operator_api::report::chain(&resolving);
        assert!(
            text.starts_with("restore from snapshot: ") && text.ends_with("no snapshot"),
            "{text}"
        );
        let cases = [
            (
                StepError::Member(MemberOpError::Timeout {
                    op: "member remove",
                    after: std::time::Duration::from_secs(3),
                }),
                "EtcdTimeout",
            ),
            (StepError::LeaderUnreachable { id: 7 }, "EtcdCallFailed"),
            (StepError::NoSnapshotSource, "SnapshotFailed"),
            (
                StepError::Runtime(RuntimeError::VersionUnavailable {
                    version: "3.9.9".into(),
                    detail: "no binary".into(),
                }),
                "VersionUnavailable",
            ),
            (
                StepError::Runtime(RuntimeError::UnknownMember { name: "x".into() }),
                "RuntimeFailed",
            ),
            (
                StepError::Runtime(RuntimeError::Waiting {
                    member: "m".into(),
                    detail: "its Pod is stopping".into(),
                }),
                "RuntimeWaiting",
            ),
        ];
        for (e, code) in cases {
            assert_eq!((e.reason(), e.code()), ("StepFailed", code), "{e}");
        }
        let tls = StepError::Member(MemberOpError::Tls {
            op: "member list",
            detail: "invalid peer certificate: UnknownIssuer".into(),
        });
        assert_eq!(
            (tls.reason(), tls.code()),
            ("TLSHandshakeFailed", "TLSHandshakeFailed")
        );
        let missing = StepError::Runtime(RuntimeError::TlsSecret {
            plane: "client",
            provider: "secretRef",
            secret: "ns/mine".into(),
            detail: "does not exist".into(),
        });
        let pending = StepError::Runtime(RuntimeError::CertificateNotReady {
            certificate: "ns/m-client".into(),
            secret: "ns/m-client-tls".into(),
        });
        assert_eq!(
            (missing.reason(), missing.code()),
            ("CertificatesUnavailable", "TLSSecretInvalid")
        );
        assert_eq!(
            (pending.reason(), pending.code()),
            ("CertificatesUnavailable", "WaitingForCertificate")
        );
    }
}
