//! The EtcdCluster strategy: what the server does to an object on create, update, status and
//! scale writes, in the order k8s.io/apiserver uses (prepare → validate → warnings → store).
//! Pure: no I/O, so every rule is tested without sockets.
//!
//! The metadata rules every resource shares (identity against the URL, server-owned fields,
//! resourceVersion preconditions, finalizers, deletion) are the `*_meta` functions, which the
//! EtcdBackup strategy ([`backup`]) reuses; [`kind`] is how the HTTP handlers reach the strategy
//! of the resource a request addresses.

pub mod backup;
pub mod kind;

use std::collections::BTreeMap;

use etcd_operator_api::validation::{self, FieldError};
use etcd_operator_api::{KIND, RESOURCE, VersionedCluster, convert, v1alpha2 as hub};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use rand::Rng;
use serde_json::{Value, json};

use crate::http::error::{ApiError, Cause};

/// The alphabet and length kube-apiserver uses for `generateName` suffixes.
const NAME_SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const NAME_SUFFIX_LEN: usize = 5;
const MAX_GENERATE_NAME_BASE: usize = 58;

/// Finalizers the garbage collector handles for these propagation policies.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// See [`FOREGROUND_FINALIZER`].
pub const ORPHAN_FINALIZER: &str = "orphan";

/// The annotations that carry version-specific spec fields through conversion: a change to them
/// is a change to the spec (for `generation`).
const CONVERSION_ANNOTATIONS: [&str; 2] = [
    convert::V1ALPHA1_FIELDS_ANNOTATION,
    convert::V1ALPHA2_FIELDS_ANNOTATION,
];

/// A request object after decoding: the version it was sent in, and the hub.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The hub object to store.
    pub hub: hub::EtcdCluster,
    /// The warnings for `Warning` headers.
    pub warnings: Vec<String>,
}

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

/// 422 with every cause.
pub fn invalid(name: &str, errors: &[FieldError]) -> ApiError {
    ApiError::invalid(KIND, name, causes(errors))
}

fn invalid_one(name: &str, field: &str, reason: &str, message: String) -> ApiError {
    invalid_one_of(KIND, name, field, reason, message)
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

/// Decodes a request body already parsed to JSON: it must be an EtcdCluster of the URL's version.
pub fn decode_for_version(body: Value, version: &str) -> Result<VersionedCluster, ApiError> {
    let expected = format!("{}/{version}", etcd_operator_api::GROUP);
    match body.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v == expected => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({expected})"
            )));
        }
        None => {
            return Err(ApiError::bad_request(
                "Object 'apiVersion' is missing in the request body",
            ));
        }
    }
    match body.get("kind").and_then(Value::as_str) {
        Some(KIND) => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({KIND})"
            )));
        }
        None => {
            return Err(ApiError::bad_request(
                "Object 'Kind' is missing in the request body",
            ));
        }
    }
    etcd_operator_api::decode_value(body).map_err(|e| ApiError::bad_request(e.to_string()))
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

/// Create: checks identity metadata against the URL, defaults, validates in the client's version,
/// then sets what the server owns (uid, creationTimestamp, generation) and drops status.
pub fn prepare_create(mut obj: VersionedCluster, namespace: &str) -> Result<Admitted, ApiError> {
    create_meta(metadata_mut(&mut obj), namespace)?;
    obj.apply_defaults();
    let outcome = validation::validate_versioned(&obj);
    let name = metadata(&obj).name.clone().unwrap_or_default();
    if !outcome.is_valid() {
        return Err(invalid(&name, &outcome.errors));
    }
    let warnings = outcome.warning_messages();
    let mut hub = obj.into_hub();
    // Stored objects carry the hub's defaults whatever version they were written in, so a later
    // write through the other version does not see the defaults as a spec change.
    etcd_operator_api::defaults::apply_v1alpha2(&mut hub);
    stamp_created_meta(&mut hub.metadata);
    hub.status = None;
    Ok(Admitted { hub, warnings })
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

fn metadata(obj: &VersionedCluster) -> &ObjectMeta {
    match obj {
        VersionedCluster::V1alpha1(o) => &o.metadata,
        VersionedCluster::V1alpha2(o) => &o.metadata,
    }
}

fn metadata_mut(obj: &mut VersionedCluster) -> &mut ObjectMeta {
    match obj {
        VersionedCluster::V1alpha1(o) => &mut o.metadata,
        VersionedCluster::V1alpha2(o) => &mut o.metadata,
    }
}

/// What an update of the main resource decided.
#[derive(Debug, Clone)]
pub enum UpdateDecision {
    /// Store this object.
    Store(Box<Admitted>),
    /// The last finalizer of an object being deleted is gone: delete it.
    Delete,
}

/// The spec as it matters for `generation`: the hub spec plus the conversion annotations.
fn spec_fingerprint(obj: &hub::EtcdCluster) -> Value {
    let annotations: BTreeMap<&str, Option<&String>> = CONVERSION_ANNOTATIONS
        .iter()
        .map(|a| (*a, obj.metadata.annotations.as_ref().and_then(|m| m.get(*a))))
        .collect();
    json!({"spec": serde_json::to_value(&obj.spec).unwrap_or(Value::Null), "annotations": annotations})
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
        Some(_) => Err(ApiError::modified(resource, name)),
    }
}

/// Update of the main resource (PUT, or the result of a PATCH): `new` in the client's version,
/// `old` the stored hub with its resourceVersion. `require_rv` is true for PUT.
pub fn prepare_update(
    mut new: VersionedCluster,
    old: &hub::EtcdCluster,
    name: &str,
    namespace: &str,
    require_rv: bool,
) -> Result<UpdateDecision, ApiError> {
    update_meta(
        (KIND, RESOURCE),
        metadata_mut(&mut new),
        &old.metadata,
        name,
        namespace,
        require_rv,
    )?;
    new.apply_defaults();
    let outcome = validation::validate_versioned_update(&new, old);
    if !outcome.is_valid() {
        return Err(invalid(name, &outcome.errors));
    }
    let warnings = outcome.warning_messages();
    let mut hub = new.into_hub();
    etcd_operator_api::defaults::apply_v1alpha2(&mut hub);
    // The main resource ignores status.
    hub.status = old.status.clone();
    if spec_fingerprint(&hub) != spec_fingerprint(old) {
        hub.metadata.generation = Some(old.metadata.generation.unwrap_or(0) + 1);
    }
    if deletes_now(&hub.metadata) {
        return Ok(UpdateDecision::Delete);
    }
    Ok(UpdateDecision::Store(Box::new(Admitted { hub, warnings })))
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
        let before: Vec<&String> = old_meta.finalizers.iter().flatten().collect();
        let added: Vec<String> = meta
            .finalizers
            .iter()
            .flatten()
            .filter(|f| !before.contains(f))
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

/// Update through `/status`: only `status` changes; the rest is the stored object.
pub fn prepare_status_update(
    new: VersionedCluster,
    old: &hub::EtcdCluster,
    name: &str,
    require_rv: bool,
) -> Result<Admitted, ApiError> {
    status_meta((KIND, RESOURCE), metadata(&new), &old.metadata, name, require_rv)?;
    let new_hub = new.into_hub();
    let mut hub = old.clone();
    hub.metadata.resource_version = None;
    hub.status = new_hub.status;
    Ok(Admitted {
        hub,
        warnings: Vec::new(),
    })
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

/// The `autoscaling/v1` Scale of a cluster.
pub fn scale_of(obj: &hub::EtcdCluster) -> Value {
    let replicas = obj.spec.replicas.unwrap_or(hub::DEFAULT_REPLICAS);
    let status = obj.status.as_ref();
    let name = obj.metadata.name.clone().unwrap_or_default();
    let selector = status
        .and_then(|s| s.selector.clone())
        .unwrap_or_else(|| etcd_operator_api::naming::selector(&name));
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": name,
            "namespace": obj.metadata.namespace,
            "uid": obj.metadata.uid,
            "resourceVersion": obj.metadata.resource_version,
            "creationTimestamp": obj.metadata.creation_timestamp,
        },
        "spec": {"replicas": replicas},
        "status": {"replicas": status.and_then(|s| s.replicas).unwrap_or(0), "selector": selector},
    })
}

/// Applies a written Scale to the stored cluster: only `spec.replicas` changes, validated as an
/// update of the cluster.
pub fn apply_scale(scale: &Value, old: &hub::EtcdCluster, name: &str) -> Result<UpdateDecision, ApiError> {
    if scale
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k != "Scale")
    {
        return Err(ApiError::bad_request(
            "the kind in the data does not match the expected kind (Scale)",
        ));
    }
    let old_rv = old.metadata.resource_version.clone().unwrap_or_default();
    if let Some(rv) = scale.pointer("/metadata/resourceVersion").and_then(Value::as_str)
        && !rv.is_empty()
        && rv != old_rv
    {
        return Err(ApiError::modified(RESOURCE, name));
    }
    if scale
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty() && n != name)
    {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    let replicas = match scale.pointer("/spec/replicas") {
        Some(v) => match v.as_i64().and_then(|n| i32::try_from(n).ok()) {
            Some(n) => n,
            None => {
                return Err(invalid_one(
                    name,
                    "spec.replicas",
                    "FieldValueInvalid",
                    format!("Invalid value: {v}: must be an integer"),
                ));
            }
        },
        None => 0,
    };
    let mut new = old.clone();
    new.spec.replicas = Some(replicas);
    new.metadata.resource_version = Some(old_rv);
    prepare_update(
        VersionedCluster::V1alpha2(new),
        old,
        name,
        old.metadata.namespace.as_deref().unwrap_or_default(),
        false,
    )
}

/// Marks an object for deletion when finalizers hold it (adding the finalizer a propagation
/// policy asks for); `None` means it can be deleted now.
pub fn prepare_delete(old: &hub::EtcdCluster, propagation: Option<&str>) -> Option<hub::EtcdCluster> {
    let mut obj = old.clone();
    delete_meta(&mut obj.metadata, propagation).then_some(obj)
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

/// Refuses input whose JSON type differs from the schema's where the decoder would not notice:
/// serde builds a struct from an array (field by position), so `spec: []` would silently become
/// a defaulted spec. kube-apiserver refuses such input with 422 `FieldValueTypeInvalid`.
pub fn check_types(input: &Value, typed: &Value) -> Result<(), ApiError> {
    check_types_of(KIND, input, typed)
}

/// [`check_types`] for an object of `kind`.
pub(crate) fn check_types_of(kind: &str, input: &Value, typed: &Value) -> Result<(), ApiError> {
    fn walk(input: &Value, typed: &Value, path: &str, out: &mut Vec<Cause>) {
        let mismatch = |actual: &str, expected: &str| Cause {
            reason: "FieldValueTypeInvalid".into(),
            message: format!(
                "Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""
            ),
            field: path.to_string(),
        };
        match (input, typed) {
            (Value::Object(i), Value::Object(t)) => {
                for (k, v) in i {
                    if let Some(tv) = t.get(k) {
                        let child = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        walk(v, tv, &child, out);
                    }
                }
            }
            (Value::Array(i), Value::Array(t)) => {
                for (idx, (iv, tv)) in i.iter().zip(t).enumerate() {
                    walk(iv, tv, &format!("{path}[{idx}]"), out);
                }
            }
            (Value::Array(_), Value::Object(_)) => out.push(mismatch("array", "object")),
            (Value::Object(_), Value::Array(_)) => out.push(mismatch("object", "array")),
            _ => {}
        }
    }
    let mut causes = Vec::new();
    walk(input, typed, "", &mut causes);
    if causes.is_empty() {
        return Ok(());
    }
    let name = input
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Err(ApiError::invalid(kind, name, causes))
}

/// Lists the paths of fields in `input` that the typed object dropped (unknown fields), for
/// `fieldValidation`. Hand-written: serde reports only the first unknown field, and only when
/// every struct denies unknown fields, which would also reject them under `Ignore`.
pub fn unknown_fields(input: &Value, typed: &Value) -> Vec<String> {
    fn walk(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
        match (input, typed) {
            (Value::Object(i), Value::Object(t)) => {
                for (k, v) in i {
                    let child = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    match t.get(k) {
                        None if !v.is_null() => out.push(child),
                        Some(tv) => walk(v, tv, &child, out),
                        None => {}
                    }
                }
            }
            (Value::Array(i), Value::Array(t)) => {
                for (idx, (iv, tv)) in i.iter().zip(t).enumerate() {
                    walk(iv, tv, &format!("{path}[{idx}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(input, typed, "", &mut out);
    out
}

/// The hub object as stored: `apiVersion`/`kind` set, `resourceVersion` cleared.
pub fn to_storage(mut obj: hub::EtcdCluster) -> Result<Value, ApiError> {
    obj.api_version = hub::API_VERSION.to_string();
    obj.kind = KIND.to_string();
    obj.metadata.resource_version = None;
    serde_json::to_value(&obj).map_err(|e| ApiError::internal(format!("encode EtcdCluster: {e}")))
}

/// A stored object decoded as the hub (its `resourceVersion` is set by storage).
pub fn from_storage(value: Value) -> Result<hub::EtcdCluster, ApiError> {
    match etcd_operator_api::decode_value(value) {
        Ok(v) => Ok(v.into_hub()),
        Err(e) => Err(ApiError::internal(format!("decode stored EtcdCluster: {e}"))),
    }
}

/// The hub object in the version a client asked for, as JSON.
pub fn to_version(obj: hub::EtcdCluster, version: &str) -> Result<Value, ApiError> {
    let versioned = VersionedCluster::from_hub(obj, version)
        .map_err(|e| ApiError::internal(format!("convert EtcdCluster: {e}")))?;
    versioned
        .to_value()
        .map_err(|e| ApiError::internal(format!("encode EtcdCluster: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(version: &str, spec: Value) -> Value {
        json!({"apiVersion": format!("etcd.operator.dev/{version}"), "kind": "EtcdCluster",
               "metadata": {"name": "a"}, "spec": spec})
    }

    fn created() -> hub::EtcdCluster {
        let obj = decode_for_version(
            body("v1alpha2", json!({"replicas": 3, "version": "3.5.1"})),
            "v1alpha2",
        )
        .unwrap();
        let mut hub = prepare_create(obj, "ns").unwrap().hub;
        hub.metadata.resource_version = Some("10".into());
        hub
    }

    #[test]
    fn create_sets_server_owned_metadata_and_drops_status() {
        let mut b = body("v1alpha2", json!({"replicas": 3, "version": "3.5.1"}));
        b["status"] = json!({"phase": "Running"});
        let admitted = prepare_create(decode_for_version(b, "v1alpha2").unwrap(), "ns").unwrap();
        let m = &admitted.hub.metadata;
        assert_eq!(m.namespace.as_deref(), Some("ns"));
        assert_eq!(m.generation, Some(1));
        assert!(m.uid.as_deref().is_some_and(|u| u.len() == 36));
        assert!(m.creation_timestamp.is_some());
        assert!(admitted.hub.status.is_none());
    }

    #[test]
    fn create_rejects_wrong_identity() {
        let mut b = body("v1alpha2", json!({"replicas": 3}));
        b["metadata"]["namespace"] = json!("other");
        let err = prepare_create(decode_for_version(b, "v1alpha2").unwrap(), "ns").unwrap_err();
        assert_eq!(err.code, 400);
        let mut b = body("v1alpha2", json!({"replicas": 3}));
        b["metadata"]["resourceVersion"] = json!("5");
        assert_eq!(
            prepare_create(decode_for_version(b, "v1alpha2").unwrap(), "ns")
                .unwrap_err()
                .code,
            400
        );
        let err = decode_for_version(body("v1alpha1", json!({})), "v1alpha2").unwrap_err();
        assert_eq!(err.code, 400);
        assert!(
            err.message.contains("does not match the expected API version"),
            "{}",
            err.message
        );
        let mut b = body("v1alpha2", json!({}));
        b["kind"] = json!("Pod");
        assert_eq!(decode_for_version(b, "v1alpha2").unwrap_err().code, 400);
    }

    #[test]
    fn create_returns_every_validation_error() {
        let b = body("v1alpha2", json!({"replicas": 0, "version": "4.0.0"}));
        let err = prepare_create(decode_for_version(b, "v1alpha2").unwrap(), "ns").unwrap_err();
        assert_eq!(err.code, 422);
        let status = err.to_status();
        let fields: Vec<&str> = status["details"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["field"].as_str().unwrap())
            .collect();
        assert!(fields.contains(&"spec.replicas"), "{fields:?}");
        assert!(fields.contains(&"spec.version"), "{fields:?}");
    }

    #[test]
    fn generate_name_completes_the_base() {
        let mut b = body("v1alpha2", json!({"replicas": 3}));
        b["metadata"] = json!({"generateName": "demo-"});
        let admitted = prepare_create(decode_for_version(b, "v1alpha2").unwrap(), "ns").unwrap();
        let name = admitted.hub.metadata.name.unwrap();
        assert!(name.starts_with("demo-") && name.len() == 10, "{name}");
        assert!(name[5..].bytes().all(|c| NAME_SUFFIX_ALPHABET.contains(&c)));
    }

    #[test]
    fn update_bumps_generation_only_for_spec_changes() {
        let old = created();
        let mut same = old.clone();
        same.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        let UpdateDecision::Store(a) =
            prepare_update(VersionedCluster::V1alpha2(same), &old, "a", "ns", true).unwrap()
        else {
            panic!("expected store")
        };
        assert_eq!(a.hub.metadata.generation, Some(1));
        let mut changed = old.clone();
        changed.spec.replicas = Some(5);
        let UpdateDecision::Store(a) =
            prepare_update(VersionedCluster::V1alpha2(changed), &old, "a", "ns", true).unwrap()
        else {
            panic!("expected store")
        };
        assert_eq!(a.hub.metadata.generation, Some(2));
    }

    #[test]
    fn update_preconditions() {
        let old = created();
        let mut stale = old.clone();
        stale.metadata.resource_version = Some("9".into());
        assert_eq!(
            prepare_update(VersionedCluster::V1alpha2(stale), &old, "a", "ns", true)
                .unwrap_err()
                .code,
            409
        );
        let mut missing = old.clone();
        missing.metadata.resource_version = None;
        let err =
            prepare_update(VersionedCluster::V1alpha2(missing.clone()), &old, "a", "ns", true).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(prepare_update(VersionedCluster::V1alpha2(missing), &old, "a", "ns", false).is_ok());
        let mut renamed = old.clone();
        renamed.metadata.name = Some("b".into());
        assert_eq!(
            prepare_update(VersionedCluster::V1alpha2(renamed), &old, "a", "ns", true)
                .unwrap_err()
                .code,
            400
        );
        let mut created_at = old.clone();
        created_at.metadata.creation_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let UpdateDecision::Store(a) =
            prepare_update(VersionedCluster::V1alpha2(created_at), &old, "a", "ns", true).unwrap()
        else {
            panic!("expected store")
        };
        assert_eq!(a.hub.metadata.creation_timestamp, old.metadata.creation_timestamp);
        let mut uid = old.clone();
        uid.metadata.uid = Some("other".into());
        assert_eq!(
            prepare_update(VersionedCluster::V1alpha2(uid), &old, "a", "ns", true)
                .unwrap_err()
                .code,
            422
        );
    }

    #[test]
    fn main_resource_ignores_status_and_status_ignores_spec() {
        let old = created();
        let mut new = old.clone();
        new.status = Some(Default::default());
        let UpdateDecision::Store(a) =
            prepare_update(VersionedCluster::V1alpha2(new), &old, "a", "ns", true).unwrap()
        else {
            panic!("expected store")
        };
        assert_eq!(a.hub.status, None);

        let mut new = old.clone();
        new.spec.replicas = Some(7);
        new.status = Some(etcd_operator_api::status::EtcdClusterStatus {
            replicas: Some(3),
            ..Default::default()
        });
        let a = prepare_status_update(VersionedCluster::V1alpha2(new), &old, "a", true).unwrap();
        assert_eq!(a.hub.spec.replicas, Some(3));
        assert_eq!(a.hub.status.and_then(|s| s.replicas), Some(3));
        assert_eq!(a.hub.metadata.generation, Some(1));
    }

    #[test]
    fn finalizers_hold_deletion_and_the_last_one_removed_deletes() {
        let mut old = created();
        assert!(prepare_delete(&old, None).is_none());
        old.metadata.finalizers = Some(vec!["etcd.operator.dev/cleanup".into()]);
        let marked = prepare_delete(&old, Some("Background")).unwrap();
        assert!(marked.metadata.deletion_timestamp.is_some());
        let mut marked = marked;
        marked.metadata.resource_version = Some("11".into());
        // Adding a finalizer while deleting is forbidden.
        let mut more = marked.clone();
        more.metadata.finalizers.as_mut().unwrap().push("x".into());
        assert_eq!(
            prepare_update(VersionedCluster::V1alpha2(more), &marked, "a", "ns", true)
                .unwrap_err()
                .code,
            422
        );
        // Removing the last one deletes.
        let mut done = marked.clone();
        done.metadata.finalizers = Some(vec![]);
        assert!(matches!(
            prepare_update(VersionedCluster::V1alpha2(done), &marked, "a", "ns", true).unwrap(),
            UpdateDecision::Delete
        ));
        // Foreground propagation adds its finalizer.
        let plain = created();
        let fg = prepare_delete(&plain, Some("Foreground")).unwrap();
        assert_eq!(
            fg.metadata.finalizers,
            Some(vec![FOREGROUND_FINALIZER.to_string()])
        );
    }

    #[test]
    fn scale_reads_and_writes_replicas() {
        let old = created();
        let scale = scale_of(&old);
        assert_eq!(scale["spec"]["replicas"], 3);
        assert_eq!(scale["kind"], "Scale");
        assert_eq!(scale["metadata"]["resourceVersion"], "10");
        let UpdateDecision::Store(a) = apply_scale(&json!({"spec": {"replicas": 5}}), &old, "a").unwrap()
        else {
            panic!("expected store")
        };
        assert_eq!(a.hub.spec.replicas, Some(5));
        assert_eq!(a.hub.metadata.generation, Some(2));
        assert_eq!(
            apply_scale(&json!({"spec": {"replicas": 0}}), &old, "a")
                .unwrap_err()
                .code,
            422
        );
        let stale = json!({"metadata": {"resourceVersion": "3"}, "spec": {"replicas": 5}});
        assert_eq!(apply_scale(&stale, &old, "a").unwrap_err().code, 409);
    }

    #[test]
    fn arrays_where_objects_belong_are_type_errors() {
        let input = json!({"metadata": {"name": "a"}, "spec": [3, "3.5.1"]});
        let typed = json!({"metadata": {"name": "a"}, "spec": {"replicas": 3, "version": "3.5.1"}});
        let err = check_types(&input, &typed).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "EtcdCluster.etcd.operator.dev \"a\" is invalid: spec: Invalid value: \"array\": spec in body must be of type object: \"array\""
        );
        assert!(check_types(&typed, &typed).is_ok());
    }

    #[test]
    fn unknown_fields_are_found_with_their_paths() {
        let input =
            json!({"spec": {"replicas": 3, "bogus": 1, "podTemplate": {"nope": true}}, "extra": null});
        let typed = json!({"spec": {"replicas": 3, "podTemplate": {}}});
        assert_eq!(
            unknown_fields(&input, &typed),
            vec!["spec.bogus".to_string(), "spec.podTemplate.nope".to_string()]
        );
    }
}
