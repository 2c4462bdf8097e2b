//! The registry: the resources this server serves and what happens to their objects on create,
//! update, status and scale writes and deletes, in the order k8s.io/apiserver uses (identity →
//! defaults → validate → warnings → canonical form → store). Pure: no I/O, so every rule is tested
//! without sockets.
//!
//! - [`strategy`]: the `Strategy` trait, the one generic `Store` that fixes the call order, and
//!   the object-safe `Resource` the HTTP layer serves through;
//! - [`cluster`] and [`backup`]: the strategies of EtcdClusters and EtcdBackups; [`event`]:
//!   core Events (local mode);
//! - [`controller_init`]: what a co-located controller's new objects get at create (its
//!   finalizer, its initial status);
//! - [`decode`]: a request body into its typed object in one pass, with what the type does not
//!   keep of it (unknown fields, mistyped containers);
//! - [`kind`]: the table of served resources (adding one is one entry there);
//! - [`printers`]: `kubectl get` columns;
//! - `work`: a step count in test builds, for the tests that prove a pass linear;
//! - here: the metadata rules every resource shares (identity against the URL, server-owned
//!   fields, resourceVersion preconditions, finalizers, deletion) and the input type checks.

pub mod backup;
pub mod cluster;
pub mod controller_init;
pub mod decode;
pub mod event;
pub mod fieldset;
pub mod kind;
pub mod printers;
pub mod strategy;
pub(crate) mod work;

use etcd_operator_api::validation::FieldError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use rand::Rng;
use serde_json::Value;

pub use cluster::{apply_scale, check_types, from_storage, scale_of, to_storage, to_version};
pub use strategy::{Admitted, UpdateDecision};

use crate::error::{ApiError, Cause};

/// The alphabet and length kube-apiserver uses for `generateName` suffixes.
pub(crate) const NAME_SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const NAME_SUFFIX_LEN: usize = 5;
const MAX_GENERATE_NAME_BASE: usize = 58;

/// Finalizers the garbage collector handles for these propagation policies.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// See [`FOREGROUND_FINALIZER`].
pub const ORPHAN_FINALIZER: &str = "orphan";

fn causes(errors: &[FieldError]) -> Vec<Cause> {
    errors
        .iter()
        .map(|e| Cause {
            reason: e.kind.reason().to_string(),
            message: e.body(),
            field: e.field.clone(),
        })
        .collect()
}

/// 422 with every cause, for an object of `kind`.
pub fn invalid_of(kind: &str, name: &str, errors: &[FieldError]) -> ApiError {
    ApiError::invalid(kind, name, causes(errors))
}

/// A 422 with one cause, for an object of `kind`.
pub(crate) fn invalid_one_of(kind: &str, name: &str, field: &str, reason: &str, message: String) -> ApiError {
    ApiError::invalid(
        kind,
        name,
        vec![Cause {
            reason: reason.into(),
            message,
            field: field.into(),
        }],
    )
}

/// A random `generateName` completion.
pub fn generate_name(base: &str) -> String {
    let base: String = base.chars().take(MAX_GENERATE_NAME_BASE).collect();
    let mut rng = rand::rng();
    let suffix: String = (0..NAME_SUFFIX_LEN)
        .map(|_| NAME_SUFFIX_ALPHABET[rng.random_range(0..NAME_SUFFIX_ALPHABET.len())] as char)
        .collect();
    format!("{base}{suffix}")
}

fn now() -> Time {
    // Kubernetes timestamps have seconds precision on the wire.
    Time(
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
            .unwrap_or_else(|_| jiff::Timestamp::now()),
    )
}

/// Create, metadata part (every resource): no resourceVersion, the URL's namespace, and a name
/// completed from `generateName`.
pub(crate) fn create_meta(meta: &mut ObjectMeta, namespace: &str) -> Result<(), ApiError> {
    {
        if meta.resource_version.as_deref().is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        match meta.namespace.as_deref() {
            None | Some("") => meta.namespace = Some(namespace.to_string()),
            Some(ns) if ns == namespace => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        if meta.name.as_deref().is_none_or(str::is_empty)
            && let Some(base) = meta.generate_name.clone().filter(|b| !b.is_empty())
        {
            meta.name = Some(generate_name(&base));
        }
    }
    Ok(())
}

/// Create, after validation (every resource): what the server owns — uid, creationTimestamp,
/// generation 1 — and nothing of deletion or resourceVersion.
pub(crate) fn stamp_created_meta(meta: &mut ObjectMeta) {
    meta.uid = Some(uuid::Uuid::new_v4().to_string());
    meta.creation_timestamp = Some(now());
    meta.generation = Some(1);
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.resource_version = None;
    meta.self_link = None;
}

/// The optimistic-concurrency precondition of an update: the resourceVersion the client sent
/// must be the stored one (409 otherwise); a PUT must send one (422).
fn check_resource_version(
    (kind, resource): (&str, &str),
    sent: Option<&str>,
    stored: &str,
    name: &str,
    require_rv: bool,
) -> Result<(), ApiError> {
    match sent {
        None | Some("") if require_rv => Err(invalid_one_of(
            kind,
            name,
            "metadata.resourceVersion",
            "FieldValueInvalid",
            "Invalid value: 0x0: must be specified for an update".into(),
        )),
        None | Some("") => Ok(()),
        Some(rv) if rv == stored => Ok(()),
        // Not a version this server could have returned: invalid input, not a conflict.
        Some(rv) if rv.parse::<u64>().is_err() => Err(invalid_one_of(
            kind,
            name,
            "metadata.resourceVersion",
            "FieldValueInvalid",
            format!(
                "Invalid value: {rv:?}: must be a resourceVersion returned by the server (a decimal number)"
            ),
        )),
        Some(_) => Err(ApiError::modified(resource, name)),
    }
}

/// Whether an object being deleted has lost its last finalizer (it is then deleted).
pub(crate) fn deletes_now(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some() && meta.finalizers.as_ref().is_none_or(Vec::is_empty)
}

/// Update, metadata part (every resource): identity against the URL, the resourceVersion
/// precondition, server-owned fields copied from the stored object, and no new finalizers while
/// deleting. `(kind, resource)` name the resource in errors.
pub(crate) fn update_meta(
    (kind, resource): (&str, &str),
    meta: &mut ObjectMeta,
    old_meta: &ObjectMeta,
    name: &str,
    namespace: &str,
    require_rv: bool,
) -> Result<(), ApiError> {
    let old_rv = old_meta.resource_version.clone().unwrap_or_default();
    {
        match meta.name.as_deref() {
            Some(n) if n == name => {}
            Some(n) if !n.is_empty() => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            _ => meta.name = Some(name.to_string()),
        }
        match meta.namespace.as_deref() {
            None | Some("") => meta.namespace = Some(namespace.to_string()),
            Some(ns) if ns == namespace => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        check_resource_version(
            (kind, resource),
            meta.resource_version.as_deref(),
            &old_rv,
            name,
            require_rv,
        )?;
        // Identity metadata is owned by the server: a different uid is an error, an absent one is
        // filled from the stored object. A different creationTimestamp is silently replaced, as
        // k8s.io/apiserver's `BeforeUpdate` does ("ignore changes to timestamp"), so that
        // re-sending an object with a reformatted timestamp still works.
        let mut errors = Vec::new();
        if meta
            .uid
            .as_deref()
            .is_some_and(|u| !u.is_empty() && Some(u) != old_meta.uid.as_deref())
        {
            errors.push(("metadata.uid", meta.uid.clone().unwrap_or_default()));
        }
        if let Some((field, value)) = errors.first() {
            let shown = if value.is_empty() {
                String::new()
            } else {
                format!("\"{value}\": ")
            };
            return Err(invalid_one_of(
                kind,
                name,
                field,
                "FieldValueInvalid",
                format!("Invalid value: {shown}field is immutable"),
            ));
        }
        meta.uid = old_meta.uid.clone();
        meta.creation_timestamp = old_meta.creation_timestamp.clone();
        meta.deletion_timestamp = old_meta.deletion_timestamp.clone();
        meta.deletion_grace_period_seconds = old_meta.deletion_grace_period_seconds;
        meta.generation = old_meta.generation;
        meta.resource_version = None;
        meta.self_link = None;
    }
    // While deleting, no new finalizer may be added.
    if old_meta.deletion_timestamp.is_some() {
        let before: std::collections::HashSet<&String> = old_meta.finalizers.iter().flatten().collect();
        let added: Vec<String> = meta
            .finalizers
            .iter()
            .flatten()
            .filter(|f| {
                work::step();
                !before.contains(f)
            })
            .cloned()
            .collect();
        if !added.is_empty() {
            return Err(invalid_one_of(
                kind,
                name,
                "metadata.finalizers",
                "FieldValueForbidden",
                format!(
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    added
                        .iter()
                        .map(|f| format!("{f:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Status update, metadata part (every resource): the name matches the URL and the
/// resourceVersion precondition holds.
pub(crate) fn status_meta(
    (kind, resource): (&str, &str),
    meta: &ObjectMeta,
    old_meta: &ObjectMeta,
    name: &str,
    require_rv: bool,
) -> Result<(), ApiError> {
    let old_rv = old_meta.resource_version.clone().unwrap_or_default();
    if meta.name.as_deref().is_some_and(|n| !n.is_empty() && n != name) {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta.name.clone().unwrap_or_default()
        )));
    }
    check_resource_version(
        (kind, resource),
        meta.resource_version.as_deref(),
        &old_rv,
        name,
        require_rv,
    )
}

/// Delete, metadata part (every resource): adds the finalizer a propagation policy asks for and
/// marks the object deleted; `false` when no finalizer holds it (delete it now).
pub(crate) fn delete_meta(meta: &mut ObjectMeta, propagation: Option<&str>) -> bool {
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    let policy_finalizer = match propagation {
        Some("Foreground") => Some(FOREGROUND_FINALIZER),
        Some("Orphan") => Some(ORPHAN_FINALIZER),
        _ => None,
    };
    if let Some(f) = policy_finalizer
        && meta.deletion_timestamp.is_none()
        && !finalizers.iter().any(|x| x == f)
    {
        finalizers.push(f.to_string());
    }
    if meta.finalizers.as_ref().is_none_or(Vec::is_empty) {
        return false;
    }
    if meta.deletion_timestamp.is_none() {
        meta.deletion_timestamp = Some(now());
        meta.deletion_grace_period_seconds = Some(0);
    }
    meta.resource_version = None;
    true
}

/// [`check_types`] for an object of `kind`: a 422 naming every container of the wrong JSON type
/// that decoding took anyway (`findings` of [`decode::decode`]), as kube-apiserver's schema
/// check refuses them.
pub(crate) fn check_types_of(kind: &str, input: &Value, findings: &decode::Findings) -> Result<(), ApiError> {
    if findings.mismatches.is_empty() {
        return Ok(());
    }
    let causes = findings
        .mismatches
        .iter()
        .map(|m| Cause {
            reason: "FieldValueTypeInvalid".into(),
            message: format!(
                "Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\"",
                actual = m.actual,
                path = m.path,
                expected = m.expected,
            ),
            field: m.path.clone(),
        })
        .collect();
    let name = input
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Err(ApiError::invalid(kind, name, causes))
}
