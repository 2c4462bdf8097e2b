//! Errors of the storage layer, one variant per failure an HTTP handler must tell apart.

use std::time::Duration;

use super::backend::BackendError;

/// A storage operation failed.
///
/// HTTP mapping (done by the HTTP layer): `NotFound` → 404, `AlreadyExists` → 409,
/// `PreconditionFailed`/`Conflict` → 409, `Expired`/`ExpiredContinue` → 410,
/// `InvalidContinue`/`InvalidResourceVersion`/`InvalidOptions` → 400,
/// `TooLargeResourceVersion` → 504 (reason `Timeout`, as kube-apiserver),
/// `Timeout`/`NotReady` → 429 or 503, everything else → 500.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The object does not exist.
    #[error("get {key}: object not found")]
    NotFound { key: String },
    /// Create found the key already present.
    #[error("create {key}: object already exists")]
    AlreadyExists { key: String },
    /// A delete precondition (uid or resourceVersion) did not match the stored object.
    #[error(
        "delete {key}: precondition failed: {what} in precondition: {expected}, {what} in object meta: {actual}"
    )]
    PreconditionFailed {
        key: String,
        /// `"UID"` or `"ResourceVersion"`.
        what: &'static str,
        expected: String,
        actual: String,
    },
    /// A compare-and-swap update kept losing against concurrent writers.
    #[error("update {key}: still conflicting after {attempts} attempts")]
    Conflict { key: String, attempts: u32 },
    /// The requested resourceVersion is older than the retained history (410 Gone).
    /// `message` is the text kube-apiserver sends, e.g. `too old resource version: 5 (17)`.
    #[error("{message}")]
    Expired {
        requested: u64,
        oldest: u64,
        message: String,
    },
    /// A continue token points at a compacted revision (410 Gone). `inconsistent_continue`
    /// is a fresh token (`rv: -1`) that continues the list at the latest revision, for the
    /// Status' `metadata.continue`.
    #[error("{message}")]
    ExpiredContinue {
        requested: i64,
        message: String,
        inconsistent_continue: Option<String>,
    },
    /// The continue token is malformed or escapes the resource prefix.
    #[error("decode continue token: {reason}")]
    InvalidContinue { reason: String },
    /// A resourceVersion that is not a decimal revision.
    #[error("parse resourceVersion: invalid value {value:?}")]
    InvalidResourceVersion { value: String },
    /// A combination of list/watch options kube-apiserver forbids.
    #[error("check list options: {reason}")]
    InvalidOptions { reason: String },
    /// The requested resourceVersion is newer than anything the storage reached in time.
    #[error("Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: u64, current: u64 },
    /// A stored value is not valid JSON of an object.
    #[error("decode {key}")]
    Decode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    /// An object could not be encoded, or is not a JSON object.
    #[error("encode {key}: {reason}")]
    Encode { key: String, reason: String },
    /// The backing etcd failed.
    #[error("etcd {op}")]
    Etcd {
        op: &'static str,
        #[source]
        source: etcd_client::Error,
    },
    /// The in-memory backend refused a call (e.g. a compacted or future revision).
    #[error("store {op}")]
    Backend {
        op: &'static str,
        #[source]
        source: super::backend::BackendError,
    },
    /// An etcd call or a wait for the watch cache took too long.
    #[error("{op}: timed out after {after:?}")]
    Timeout { op: &'static str, after: Duration },
    /// The watch cache has not finished its initial list yet.
    #[error("read from watch cache: the cache is not initialized yet")]
    NotReady,
}

impl StorageError {
    /// Wraps an etcd error of operation `op`; callers that know the revision they asked for map
    /// compaction and future-revision errors with [`Self::is_compacted`] and
    /// [`Self::is_future_revision`].
    pub(crate) fn etcd(op: &'static str, source: etcd_client::Error) -> Self {
        Self::Etcd { op, source }
    }

    /// Wraps a backend error of operation `op`: etcd's errors stay [`Self::Etcd`].
    pub(crate) fn backend(op: &'static str, source: BackendError) -> Self {
        match source {
            BackendError::Etcd(source) => Self::etcd(op, source),
            source => Self::Backend { op, source },
        }
    }

    /// Whether this is a store error saying the requested revision was compacted (etcd's
    /// errors classified by [`etcd_operator_etcd_errors::classify`], through the backend's).
    pub(crate) fn is_compacted(&self) -> bool {
        match self {
            Self::Etcd { source, .. } => {
                etcd_operator_etcd_errors::classify(source)
                    == etcd_operator_etcd_errors::EtcdErrorKind::Compacted
            }
            Self::Backend { source, .. } => source.is_compacted(),
            _ => false,
        }
    }

    /// Whether this is etcd refusing a write larger than it accepts (`--max-request-bytes`),
    /// with what etcd said.
    pub(crate) fn request_too_large(&self) -> Option<&str> {
        match self {
            Self::Etcd { source, .. }
                if etcd_operator_etcd_errors::classify(source)
                    == etcd_operator_etcd_errors::EtcdErrorKind::RequestTooLarge =>
            {
                Some(etcd_operator_etcd_errors::status_message(source).unwrap_or_default())
            }
            _ => None,
        }
    }

    /// Whether this is a store error saying the requested revision is in the future.
    pub(crate) fn is_future_revision(&self) -> bool {
        match self {
            Self::Etcd { source, .. } => {
                etcd_operator_etcd_errors::classify(source)
                    == etcd_operator_etcd_errors::EtcdErrorKind::FutureRevision
            }
            Self::Backend { source, .. } => source.is_future_revision(),
            _ => false,
        }
    }
}

/// [`crate::storage::Storage::guaranteed_update`] failed: either storage, or the caller's closure.
#[derive(Debug, thiserror::Error)]
pub enum GuaranteedUpdateError<E> {
    /// Reading or writing the object failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The update closure refused the change (e.g. a stale resourceVersion → 409).
    #[error("update rejected: {0}")]
    Update(E),
}
