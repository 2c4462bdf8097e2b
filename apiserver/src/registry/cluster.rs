//! The EtcdCluster strategy: decoding either served version, defaults and validation in the
//! client's version, the hub as the stored form with its defaults, `generation` on spec changes,
//! and the `scale` subresource. Pure.

use std::collections::BTreeMap;

use etcd_operator_api::validation::{self, Outcome};
use etcd_operator_api::{KIND, RESOURCE, VersionedCluster, convert, v1alpha2 as hub};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::decode::{self, Findings};
use super::kind::{CLUSTER_INFO, KindInfo};
use super::printers::{self, Printer};
use super::strategy::{Admitted, Store, Strategy, UpdateDecision};
use super::{check_types_of, invalid_of, invalid_one_of};
use crate::error::ApiError;

/// The annotations that carry version-specific spec fields through conversion: a change to them
/// is a change to the spec (for `generation`).
const CONVERSION_ANNOTATIONS: [&str; 2] = [
    convert::V1ALPHA1_FIELDS_ANNOTATION,
    convert::V1ALPHA2_FIELDS_ANNOTATION,
];

/// The strategy of `etcdclusters`.
#[derive(Debug, Clone, Copy)]
pub struct ClusterStrategy;

/// The store of `etcdclusters`.
pub const CLUSTERS: Store<ClusterStrategy> = Store(ClusterStrategy);

/// 422 with every cause, about an EtcdCluster.
pub fn invalid(name: &str, errors: &[etcd_operator_api::validation::FieldError]) -> ApiError {
    invalid_of(KIND, name, errors)
}

fn invalid_one(name: &str, field: &str, reason: &str, message: String) -> ApiError {
    invalid_one_of(KIND, name, field, reason, message)
}

/// Decodes a request body already parsed to JSON: it must be an EtcdCluster of the URL's version.
pub fn decode_for_version(body: Value, version: &str) -> Result<VersionedCluster, ApiError> {
    decode_tracked(&body, version).map(|(obj, _)| obj)
}

/// [`decode_for_version`] in one pass over the body, with what the typed object does not keep
/// of it (unknown fields, mistyped containers).
pub fn decode_tracked(body: &Value, version: &str) -> Result<(VersionedCluster, Findings), ApiError> {
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
    let refused = |e: serde_json::Error| {
        ApiError::bad_request(crate::error::chain(&etcd_operator_api::DecodeError::Json(e)))
    };
    match version {
        etcd_operator_api::v1alpha1::VERSION => decode::decode(body)
            .map(|(obj, findings)| (VersionedCluster::V1alpha1(obj), findings))
            .map_err(refused),
        etcd_operator_api::v1alpha2::VERSION => decode::decode(body)
            .map(|(obj, findings)| (VersionedCluster::V1alpha2(obj), findings))
            .map_err(refused),
        // Not a served version (the router serves none other): the API crate's error.
        _ => etcd_operator_api::decode_value(body.clone())
            .map(|obj| (obj, Findings::default()))
            .map_err(|e| ApiError::bad_request(crate::error::chain(&e))),
    }
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

/// The spec as it matters for `generation`: the hub spec plus the conversion annotations.
fn spec_fingerprint(obj: &hub::EtcdCluster) -> Value {
    let annotations: BTreeMap<&str, Option<&String>> = CONVERSION_ANNOTATIONS
        .iter()
        .map(|a| (*a, obj.metadata.annotations.as_ref().and_then(|m| m.get(*a))))
        .collect();
    json!({"spec": serde_json::to_value(&obj.spec).unwrap_or(Value::Null), "annotations": annotations})
}

impl Strategy for ClusterStrategy {
    type Request = VersionedCluster;
    type Object = hub::EtcdCluster;

    fn info(&self) -> &'static KindInfo {
        &CLUSTER_INFO
    }

    fn printer(&self) -> &'static Printer {
        &printers::CLUSTERS
    }

    fn decode(&self, body: &Value, version: &str) -> Result<(VersionedCluster, Findings), ApiError> {
        decode_tracked(body, version)
    }

    fn request_meta<'a>(&self, obj: &'a VersionedCluster) -> &'a ObjectMeta {
        metadata(obj)
    }

    fn request_meta_mut<'a>(&self, obj: &'a mut VersionedCluster) -> &'a mut ObjectMeta {
        metadata_mut(obj)
    }

    fn object_meta<'a>(&self, obj: &'a hub::EtcdCluster) -> &'a ObjectMeta {
        &obj.metadata
    }

    fn object_meta_mut<'a>(&self, obj: &'a mut hub::EtcdCluster) -> &'a mut ObjectMeta {
        &mut obj.metadata
    }

    fn apply_defaults(&self, obj: &mut VersionedCluster) {
        obj.apply_defaults();
    }

    fn validate(&self, obj: &VersionedCluster) -> Outcome {
        validation::validate_versioned(obj)
    }

    fn validate_update(&self, obj: &VersionedCluster, old: &hub::EtcdCluster) -> Outcome {
        validation::validate_versioned_update(obj, old)
    }

    fn canonicalize(&self, obj: VersionedCluster) -> hub::EtcdCluster {
        let mut hub = obj.into_hub();
        // Stored objects carry the hub's defaults whatever version they were written in, so a
        // later write through the other version does not see the defaults as a spec change.
        etcd_operator_api::defaults::apply_v1alpha2(&mut hub);
        hub
    }

    fn prepare_for_create(&self, obj: &mut hub::EtcdCluster) {
        // Whatever status the request carried is dropped. What is left says that no generation
        // was observed yet: kstatus (Flux's health checks and `dependsOn`) takes an object
        // without `status.observedGeneration` as reconciled, so without this a new cluster
        // would count as healthy before the controller ever looked at it.
        obj.status = Some(etcd_operator_api::status::EtcdClusterStatus {
            observed_generation: Some(0),
            ..Default::default()
        });
    }

    fn prepare_for_update(&self, obj: &mut hub::EtcdCluster, old: &hub::EtcdCluster) {
        // The main resource ignores status.
        obj.status = old.status.clone();
        if spec_fingerprint(obj) != spec_fingerprint(old) {
            obj.metadata.generation = Some(old.metadata.generation.unwrap_or(0) + 1);
        }
    }

    fn prepare_for_status_update(&self, new: hub::EtcdCluster, old: &hub::EtcdCluster) -> hub::EtcdCluster {
        let mut obj = old.clone();
        obj.status = new.status;
        obj
    }

    fn to_storage(&self, obj: hub::EtcdCluster) -> Result<Value, ApiError> {
        to_storage(obj)
    }

    fn read_stored(&self, stored: Value) -> Result<hub::EtcdCluster, ApiError> {
        from_storage(stored)
    }

    fn to_version(&self, obj: hub::EtcdCluster, version: &str) -> Result<Value, ApiError> {
        to_version(obj, version)
    }
}

/// Create: checks identity metadata against the URL, defaults, validates in the client's version,
/// then sets what the server owns (uid, creationTimestamp, generation) and drops status.
pub fn prepare_create(
    obj: VersionedCluster,
    namespace: &str,
) -> Result<Admitted<hub::EtcdCluster>, ApiError> {
    CLUSTERS.create(obj, namespace)
}

/// Update of the main resource (PUT, or the result of a PATCH): `new` in the client's version,
/// `old` the stored hub with its resourceVersion. `require_rv` is true for PUT.
pub fn prepare_update(
    new: VersionedCluster,
    old: &hub::EtcdCluster,
    name: &str,
    namespace: &str,
    require_rv: bool,
) -> Result<UpdateDecision<hub::EtcdCluster>, ApiError> {
    CLUSTERS.update(new, old, name, namespace, require_rv)
}

/// Update through `/status`: only `status` changes; the rest is the stored object.
pub fn prepare_status_update(
    new: VersionedCluster,
    old: &hub::EtcdCluster,
    name: &str,
    require_rv: bool,
) -> Result<hub::EtcdCluster, ApiError> {
    CLUSTERS.update_status(new, old, name, require_rv)
}

/// Marks an object for deletion when finalizers hold it (adding the finalizer a propagation
/// policy asks for); `None` means it can be deleted now.
pub fn prepare_delete(old: &hub::EtcdCluster, propagation: Option<&str>) -> Option<hub::EtcdCluster> {
    CLUSTERS.delete(old, propagation)
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
pub fn apply_scale(
    scale: &Value,
    old: &hub::EtcdCluster,
    name: &str,
) -> Result<UpdateDecision<hub::EtcdCluster>, ApiError> {
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
        // Not a version this server could have returned: invalid input, not a conflict.
        if rv.parse::<u64>().is_err() {
            return Err(invalid_one(
                name,
                "metadata.resourceVersion",
                "FieldValueInvalid",
                format!(
                    "Invalid value: {rv:?}: must be a resourceVersion returned by the server (a decimal number)"
                ),
            ));
        }
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

/// Refuses input whose JSON type differs from the schema's where the decoder would not notice:
/// serde builds a struct from an array (field by position), so `spec: []` would silently become
/// a defaulted spec. kube-apiserver refuses such input with 422 `FieldValueTypeInvalid`.
/// `findings` are what [`decode_tracked`] found in `input`.
pub fn check_types(input: &Value, findings: &Findings) -> Result<(), ApiError> {
    check_types_of(KIND, input, findings)
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
        Err(e) => Err(ApiError::internal(format!(
            "decode stored EtcdCluster: {}",
            crate::error::chain(&e)
        ))),
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
    use crate::registry::{FOREGROUND_FINALIZER, NAME_SUFFIX_ALPHABET};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
        let mut hub = prepare_create(obj, "ns").unwrap().object;
        hub.metadata.resource_version = Some("10".into());
        hub
    }

    #[test]
    fn create_sets_server_owned_metadata_and_drops_status() {
        let mut b = body("v1alpha2", json!({"replicas": 3, "version": "3.5.1"}));
        b["status"] = json!({"phase": "Running"});
        let admitted = prepare_create(decode_for_version(b, "v1alpha2").unwrap(), "ns").unwrap();
        let m = &admitted.object.metadata;
        assert_eq!(m.namespace.as_deref(), Some("ns"));
        assert_eq!(m.generation, Some(1));
        assert!(m.uid.as_deref().is_some_and(|u| u.len() == 36));
        assert!(m.creation_timestamp.is_some());
        let status = admitted.object.status.as_ref().unwrap();
        assert_eq!(
            status,
            &etcd_operator_api::status::EtcdClusterStatus {
                observed_generation: Some(0),
                ..Default::default()
            },
            "the request's status is dropped; no generation is observed yet"
        );
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
        let name = admitted.object.metadata.name.unwrap();
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
        assert_eq!(a.object.metadata.generation, Some(1));
        let mut changed = old.clone();
        changed.spec.replicas = Some(5);
        let UpdateDecision::Store(a) =
            prepare_update(VersionedCluster::V1alpha2(changed), &old, "a", "ns", true).unwrap()
        else {
            panic!("expected store")
        };
        assert_eq!(a.object.metadata.generation, Some(2));
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
        assert_eq!(
            a.object.metadata.creation_timestamp,
            old.metadata.creation_timestamp
        );
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
        new.status = Some(etcd_operator_api::status::EtcdClusterStatus {
            observed_generation: Some(9),
            ..Default::default()
        });
        let UpdateDecision::Store(a) =
            prepare_update(VersionedCluster::V1alpha2(new), &old, "a", "ns", true).unwrap()
        else {
            panic!("expected store")
        };
        assert_eq!(a.object.status, old.status, "the stored status stays");

        let mut new = old.clone();
        new.spec.replicas = Some(7);
        new.status = Some(etcd_operator_api::status::EtcdClusterStatus {
            replicas: Some(3),
            ..Default::default()
        });
        let a = prepare_status_update(VersionedCluster::V1alpha2(new), &old, "a", true).unwrap();
        assert_eq!(a.spec.replicas, Some(3));
        assert_eq!(a.status.and_then(|s| s.replicas), Some(3));
        assert_eq!(a.metadata.generation, Some(1));
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
    fn a_deleting_object_with_many_finalizers_is_checked_for_new_ones_in_one_pass() {
        crate::registry::work::assert_linear(1_000, |n| {
            let mut old = created();
            old.metadata.finalizers = Some((0..n).map(|i| format!("example.com/f{i}")).collect());
            let mut marked = prepare_delete(&old, None).unwrap();
            marked.metadata.resource_version = Some("11".into());
            // Half of them removed: allowed.
            let mut fewer = marked.clone();
            fewer.metadata.finalizers.as_mut().unwrap().truncate(n / 2);
            assert!(prepare_update(VersionedCluster::V1alpha2(fewer), &marked, "a", "ns", true).is_ok());
            // One new one among them all: refused, naming it.
            let mut more = marked.clone();
            more.metadata
                .finalizers
                .as_mut()
                .unwrap()
                .push("example.com/new".into());
            let err = prepare_update(VersionedCluster::V1alpha2(more), &marked, "a", "ns", true).unwrap_err();
            assert_eq!(err.code, 422);
            assert!(
                err.message
                    .ends_with("found new finalizers []string{\"example.com/new\"}"),
                "{}",
                err.message
            );
        });
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
        assert_eq!(a.object.spec.replicas, Some(5));
        assert_eq!(a.object.metadata.generation, Some(2));
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
        let input = body("v1alpha2", json!([3, "3.5.1"]));
        let (obj, findings) = decode_tracked(&input, "v1alpha2").unwrap();
        // serde took the array as the spec's fields by position.
        let VersionedCluster::V1alpha2(obj) = obj else {
            panic!("decoded in another version")
        };
        assert_eq!(obj.spec.replicas, Some(3));
        let err = check_types(&input, &findings).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "EtcdCluster.etcd.operator.dev \"a\" is invalid: spec: Invalid value: \"array\": spec in body must be of type object: \"array\""
        );
        let fine = body("v1alpha2", json!({"replicas": 3, "version": "3.5.1"}));
        let (_, findings) = decode_tracked(&fine, "v1alpha2").unwrap();
        assert!(check_types(&fine, &findings).is_ok());
    }

    #[test]
    fn unknown_fields_are_found_with_their_paths() {
        let input = body(
            "v1alpha2",
            json!({"replicas": 3, "bogus": 1, "podTemplate": {"nope": true}, "extra": null}),
        );
        let (_, findings) = decode_tracked(&input, "v1alpha2").unwrap();
        assert_eq!(
            findings.unknown,
            vec!["spec.bogus".to_string(), "spec.podTemplate.nope".to_string()]
        );
    }
}
