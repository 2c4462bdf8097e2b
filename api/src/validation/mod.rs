//! Admission validation of `EtcdCluster`: every error at once, with Kubernetes field paths and
//! reasons, plus warnings.
//!
//! Validation runs on the hub ([`validate`], [`validate_update`]). For an object a client sent in
//! another version, [`validate_versioned`] / [`validate_versioned_update`] convert it, validate
//! the hub and report paths **in the version the client sent** (`spec.size` rather than
//! `spec.replicas` for v1alpha1). A rule about a v1alpha2-only setting that a v1alpha1 object
//! carries in its conversion annotation is reported at
//! `metadata.annotations[etcd.operator.dev/v1alpha2-fields]`, its detail naming the v1alpha2 field.
//! The rules on v1alpha1-only fields (a backup interval, for example) apply only to the parts the
//! conversion takes from those fields: a part restored from the annotation (a v1alpha2 cron
//! schedule that v1alpha1 shows as an approximate interval, or not at all) is validated as the
//! hub part it is, so that an object read in v1alpha1 can be written back unchanged.
//!
//! Unset fields that have defaults are accepted: the API server applies defaults before it
//! validates, and an unset value means the documented default.

mod field;
pub mod format;
pub(crate) mod spec;
mod update;
mod v1alpha1;

pub use field::{ErrorType, FieldError, FieldWarning, Path, invalid_status};

use crate::{VersionedCluster, v1alpha2 as v2};

/// The result of validating an object: the errors (the object must be rejected when there is
/// any) and the warnings (returned in `Warning` headers either way).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Every error found.
    pub errors: Vec<FieldError>,
    /// Every warning.
    pub warnings: Vec<FieldWarning>,
}

impl Outcome {
    /// Whether the object may be stored.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    /// The warnings as the text of `Warning: 299 - "<text>"` headers.
    pub fn warning_messages(&self) -> Vec<String> {
        self.warnings.iter().map(ToString::to_string).collect()
    }

    /// `Ok(warnings)` when valid; otherwise the `422 Invalid` Status for the object `name`.
    pub fn into_result(
        self,
        name: &str,
    ) -> Result<Vec<FieldWarning>, Box<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>> {
        if self.errors.is_empty() {
            Ok(self.warnings)
        } else {
            Err(Box::new(invalid_status(name, &self.errors)))
        }
    }
}

impl From<spec::Report> for Outcome {
    fn from(report: spec::Report) -> Self {
        Self {
            errors: report.errors,
            warnings: report.warnings,
        }
    }
}

/// Validates a hub object on create.
pub fn validate(obj: &v2::EtcdCluster) -> Outcome {
    let mut report = spec::Report::default();
    spec::metadata(&mut report, &obj.metadata);
    spec::spec(&mut report, &obj.spec);
    report.into()
}

/// Validates a hub object on update: the create rules on `new`, plus the rules about changes
/// from `old` (version moves, immutable storage, TLS and bootstrap).
pub fn validate_update(new: &v2::EtcdCluster, old: &v2::EtcdCluster) -> Outcome {
    let mut outcome = validate(new);
    let mut report = spec::Report::default();
    update::changes(&mut report, &new.spec, &old.spec);
    outcome.errors.extend(report.errors);
    outcome.warnings.extend(report.warnings);
    outcome
}

/// Validates an object in the version the client sent, on create. Paths are in that version.
pub fn validate_versioned(obj: &VersionedCluster) -> Outcome {
    match obj {
        VersionedCluster::V1alpha2(hub) => validate(hub),
        VersionedCluster::V1alpha1(old_shape) => {
            let (hub, restored) = crate::convert::v1alpha1_to_hub(old_shape.clone());
            v1alpha1::translate(validate(&hub), old_shape, restored)
        }
    }
}

/// Validates an object in the version the client sent, on update of the stored hub object
/// `old`. Paths are in the version the client sent.
pub fn validate_versioned_update(new: &VersionedCluster, old: &v2::EtcdCluster) -> Outcome {
    match new {
        VersionedCluster::V1alpha2(hub) => validate_update(hub, old),
        VersionedCluster::V1alpha1(old_shape) => {
            let (hub, restored) = crate::convert::v1alpha1_to_hub(old_shape.clone());
            v1alpha1::translate(validate_update(&hub, old), old_shape, restored)
        }
    }
}
