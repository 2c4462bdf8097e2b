//! etcd's errors classified once, at the wire, into an [`EtcdErrorKind`]: the one place that
//! looks inside an `etcd_client::Error`. The API server's storage (compacted and future
//! revisions) and the controller's member operations ("not yet" answers, TLS handshakes, alarms)
//! both ask [`classify`]; neither matches an error's text.
//!
//! The gRPC status code decides where it can. Where etcd gives several errors one code and
//! nothing else to tell them apart (`OutOfRange` is both "compacted" and "future revision";
//! `FailedPrecondition`/`Unavailable` carry "not yet" and permanent refusals alike), its own
//! description (`rpctypes` in etcd's `api/v3rpc/rpctypes/error.go`) is compared here, exactly as
//! etcd's Go client does: this crate is the only place that matches etcd's text.

use etcd_client::Error;
use tonic::Code;

/// etcd's description of `ErrCompacted` (gRPC `OutOfRange`).
const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
/// etcd's description of `ErrFutureRev` (gRPC `OutOfRange`).
const FUTURE_REVISION: &str = "etcdserver: mvcc: required revision is a future revision";
/// etcd's description of `ErrRequestTooLarge` (gRPC `InvalidArgument`): a write larger than
/// its `--max-request-bytes`.
const REQUEST_TOO_LARGE: &str = "etcdserver: request is too large";
/// How gRPC's server begins its refusal (`ResourceExhausted`) of a message larger than it
/// receives: etcd's limit is `--max-request-bytes` plus 512 KiB, so a write larger still never
/// reaches etcd's own check. etcd gives `ResourceExhausted` to other errors too (too many
/// requests, no space), so the text decides.
const MESSAGE_LARGER_THAN_MAX: &str = "grpc: received message larger than max";
/// etcd's descriptions of the errors that mean "not yet": a learner not caught up, a member
/// added less than 5 s ago, a cluster not healthy enough to change its membership.
const NOT_READY_YET: [&str; 4] = [
    "etcdserver: can only promote a learner member which is in sync with leader",
    "etcdserver: unhealthy cluster",
    "etcdserver: too many learner members in cluster",
    "etcdserver: re-configuration failed due to not enough started members",
];

/// What an etcd error means to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdErrorKind {
    /// The requested revision was compacted (`ErrCompacted`).
    Compacted,
    /// The requested revision is newer than the store's (`ErrFutureRev`).
    FutureRevision,
    /// etcd answered "not yet" (see [`NOT_READY_YET`]): try again later.
    NotReadyYet,
    /// The request is larger than etcd accepts (`--max-request-bytes`): retrying cannot help.
    RequestTooLarge,
    /// The TLS handshake failed (a certificate expired, or is not from the CA the other side
    /// trusts); [`tls_failure`] has rustls' error.
    TlsHandshake,
    /// Any other failure.
    Other,
}

/// Classifies `error`.
pub fn classify(error: &Error) -> EtcdErrorKind {
    if let Error::GRpcStatus(status) = error {
        match status.code() {
            Code::OutOfRange if status.message() == COMPACTED => return EtcdErrorKind::Compacted,
            Code::OutOfRange if status.message() == FUTURE_REVISION => return EtcdErrorKind::FutureRevision,
            Code::FailedPrecondition | Code::Unavailable if NOT_READY_YET.contains(&status.message()) => {
                return EtcdErrorKind::NotReadyYet;
            }
            Code::InvalidArgument if status.message() == REQUEST_TOO_LARGE => {
                return EtcdErrorKind::RequestTooLarge;
            }
            Code::ResourceExhausted if status.message().starts_with(MESSAGE_LARGER_THAN_MAX) => {
                return EtcdErrorKind::RequestTooLarge;
            }
            _ => {}
        }
    }
    if tls_failure(error).is_some() {
        return EtcdErrorKind::TlsHandshake;
    }
    EtcdErrorKind::Other
}

/// The message of etcd's gRPC status, when `error` is one (what etcd said, for a person).
pub fn status_message(error: &Error) -> Option<&str> {
    match error {
        Error::GRpcStatus(status) => Some(status.message()),
        _ => None,
    }
}

/// The rustls error somewhere in `error`'s causes, if the failure was a TLS handshake. Typed:
/// the causes are walked and each downcast, including the error an `io::Error` wraps
/// (tokio-rustls reports handshake failures that way), never matched as text. etcd-client keeps
/// the gRPC status (which carries the transport error) as data, not as a source: the walk starts
/// inside it.
pub fn tls_failure(error: &Error) -> Option<&rustls::Error> {
    let inner: &(dyn std::error::Error + 'static) = match error {
        Error::GRpcStatus(status) => status,
        Error::TransportError(transport) => transport,
        Error::IoError(io) => io,
        other => other,
    };
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(inner);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(inner);
        }
        next = e.source();
    }
    None
}

/// Whether an entry of a member's `Status` errors (`StatusResponse.errors`, plain strings, not
/// an error type) is one of etcd's alarms, `memberID:<id> alarm:<type>`: those are read typed
/// from the alarm list instead. Text because etcd gives nothing else.
pub fn is_alarm_status_error(entry: &str) -> bool {
    entry.starts_with("memberID:") && entry.contains(" alarm:")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn status(code: Code, message: &str) -> Error {
        Error::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn codes_and_descriptions_map_to_kinds() {
        assert_eq!(
            classify(&status(Code::OutOfRange, COMPACTED)),
            EtcdErrorKind::Compacted
        );
        assert_eq!(
            classify(&status(Code::OutOfRange, FUTURE_REVISION)),
            EtcdErrorKind::FutureRevision
        );
        for text in NOT_READY_YET {
            assert_eq!(
                classify(&status(Code::FailedPrecondition, text)),
                EtcdErrorKind::NotReadyYet,
                "{text}"
            );
        }
        // The description alone does not classify: the code must fit too.
        assert_eq!(classify(&status(Code::Unknown, COMPACTED)), EtcdErrorKind::Other);
        assert_eq!(
            classify(&status(Code::PermissionDenied, NOT_READY_YET[0])),
            EtcdErrorKind::Other
        );
        assert_eq!(
            classify(&status(Code::Unavailable, "etcdserver: request timed out")),
            EtcdErrorKind::Other
        );
        assert_eq!(classify(&Error::InvalidArgs("x".into())), EtcdErrorKind::Other);
    }

    #[test]
    fn writes_over_the_request_limit_are_too_large() {
        assert_eq!(
            classify(&status(Code::InvalidArgument, REQUEST_TOO_LARGE)),
            EtcdErrorKind::RequestTooLarge
        );
        assert_eq!(
            classify(&status(
                Code::ResourceExhausted,
                "grpc: received message larger than max (2621500 vs. 2097152)"
            )),
            EtcdErrorKind::RequestTooLarge
        );
        // etcd's other ResourceExhausted errors are not about size.
        for text in [
            "etcdserver: too many requests",
            "etcdserver: mvcc: database space exceeded",
        ] {
            assert_eq!(
                classify(&status(Code::ResourceExhausted, text)),
                EtcdErrorKind::Other,
                "{text}"
            );
        }
        assert_eq!(
            classify(&status(Code::InvalidArgument, "etcdserver: key is not provided")),
            EtcdErrorKind::Other
        );
    }

    #[test]
    fn a_tls_failure_is_found_inside_an_io_error() {
        let io = std::io::Error::other(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Expired,
        ));
        let error = Error::IoError(io);
        assert_eq!(classify(&error), EtcdErrorKind::TlsHandshake);
        assert!(matches!(
            tls_failure(&error),
            Some(rustls::Error::InvalidCertificate(_))
        ));
    }

    #[test]
    fn alarm_entries_of_a_status() {
        assert!(is_alarm_status_error("memberID:8e9e05c52164694d alarm:NOSPACE"));
        assert!(!is_alarm_status_error("etcdserver: no leader"));
    }
}
