//! The EtcdBackup strategy: create (defaults, validation), update (the spec is immutable),
//! status writes and deletion, reusing the metadata rules every resource shares. Pure.

use etcd_operator_api::backup::{self as api, EtcdBackup};
use etcd_operator_api::validation::FieldError;
use serde_json::Value;

use super::{create_meta, delete_meta, deletes_now, stamp_created_meta, status_meta, update_meta};
use crate::http::error::{ApiError, Cause};

const IDENT: (&str, &str) = (api::KIND, api::RESOURCE);

fn invalid(name: &str, errors: &[FieldError]) -> ApiError {
    ApiError::invalid(
        api::KIND,
        name,
        errors
            .iter()
            .map(|e| Cause {
                reason: e.kind.reason().to_string(),
                message: e.body(),
                field: e.field.clone(),
            })
            .collect(),
    )
}

/// Decodes a request body: it must be an EtcdBackup of `etcd.operator.dev/v1alpha2`.
pub fn decode(body: Value) -> Result<EtcdBackup, ApiError> {
    match body.get("apiVersion").and_then(Value::as_str) {
        Some(api::API_VERSION) => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({})",
                api::API_VERSION
            )));
        }
        None => {
            return Err(ApiError::bad_request(
                "Object 'apiVersion' is missing in the request body",
            ));
        }
    }
    match body.get("kind").and_then(Value::as_str) {
        Some(api::KIND) => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                api::KIND
            )));
        }
        None => {
            return Err(ApiError::bad_request(
                "Object 'Kind' is missing in the request body",
            ));
        }
    }
    serde_json::from_value(body).map_err(|e| ApiError::bad_request(format!("decode EtcdBackup: {e}")))
}

/// Create: metadata, defaults, validation; status dropped.
pub fn prepare_create(mut obj: EtcdBackup, namespace: &str) -> Result<EtcdBackup, ApiError> {
    create_meta(&mut obj.metadata, namespace)?;
    api::apply_defaults(&mut obj);
    let outcome = api::validate(&obj);
    if !outcome.is_valid() {
        return Err(invalid(
            obj.metadata.name.as_deref().unwrap_or_default(),
            &outcome.errors,
        ));
    }
    stamp_created_meta(&mut obj.metadata);
    obj.status = None;
    Ok(obj)
}

/// Update of the main resource: `None` means the last finalizer is gone (delete).
pub fn prepare_update(
    mut new: EtcdBackup,
    old: &EtcdBackup,
    name: &str,
    namespace: &str,
    require_rv: bool,
) -> Result<Option<EtcdBackup>, ApiError> {
    update_meta(
        IDENT,
        &mut new.metadata,
        &old.metadata,
        name,
        namespace,
        require_rv,
    )?;
    api::apply_defaults(&mut new);
    let outcome = api::validate_update(&new, old);
    if !outcome.is_valid() {
        return Err(invalid(name, &outcome.errors));
    }
    new.status = old.status.clone();
    if deletes_now(&new.metadata) {
        return Ok(None);
    }
    Ok(Some(new))
}

/// Status update: only the status changes.
pub fn prepare_status_update(
    new: EtcdBackup,
    old: &EtcdBackup,
    name: &str,
    require_rv: bool,
) -> Result<EtcdBackup, ApiError> {
    status_meta(IDENT, &new.metadata, &old.metadata, name, require_rv)?;
    let mut out = old.clone();
    out.metadata.resource_version = None;
    out.status = new.status;
    Ok(out)
}

/// Delete: marked when finalizers hold it, else `None` (delete now).
pub fn prepare_delete(old: &EtcdBackup, propagation: Option<&str>) -> Option<EtcdBackup> {
    let mut obj = old.clone();
    delete_meta(&mut obj.metadata, propagation).then_some(obj)
}

/// The object as stored.
pub fn to_storage(mut obj: EtcdBackup) -> Result<Value, ApiError> {
    obj.api_version = api::API_VERSION.to_string();
    obj.kind = api::KIND.to_string();
    obj.metadata.resource_version = None;
    serde_json::to_value(&obj).map_err(|e| ApiError::internal(format!("encode EtcdBackup: {e}")))
}

/// A stored object.
pub fn from_storage(value: Value) -> Result<EtcdBackup, ApiError> {
    serde_json::from_value(value).map_err(|e| ApiError::internal(format!("decode stored EtcdBackup: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body() -> Value {
        json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdBackup",
               "metadata": {"name": "b1"}, "spec": {"clusterName": "a", "destination": {"volume": {"path": "/tmp/b"}}}})
    }

    fn created() -> EtcdBackup {
        let mut b = prepare_create(decode(body()).unwrap(), "ns").unwrap();
        b.metadata.resource_version = Some("4".into());
        b
    }

    #[test]
    fn create_stamps_metadata_and_validates() {
        let b = created();
        assert_eq!(b.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(b.metadata.generation, Some(1));
        assert!(b.metadata.uid.is_some());
        let mut bad = body();
        bad["spec"]["clusterName"] = json!("");
        let err = prepare_create(decode(bad).unwrap(), "ns").unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.to_status()["details"]["causes"][0]["field"],
            "spec.clusterName"
        );
        assert_eq!(err.to_status()["details"]["kind"], "EtcdBackup");
        let mut wrong = body();
        wrong["kind"] = json!("EtcdCluster");
        assert_eq!(decode(wrong).unwrap_err().code, 400);
        let mut old_version = body();
        old_version["apiVersion"] = json!("etcd.operator.dev/v1alpha1");
        assert_eq!(decode(old_version).unwrap_err().code, 400);
    }

    #[test]
    fn the_spec_is_immutable_and_status_is_separate() {
        let old = created();
        let mut changed = old.clone();
        changed.spec.cluster_name = "other".into();
        let err = prepare_update(changed, &old, "b1", "ns", true).unwrap_err();
        assert_eq!(err.code, 422);
        let mut labelled = old.clone();
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        labelled.status = Some(Default::default());
        let stored = prepare_update(labelled, &old, "b1", "ns", true).unwrap().unwrap();
        assert!(stored.status.is_none(), "the main resource ignores status");
        let mut stale = old.clone();
        stale.metadata.resource_version = Some("3".into());
        assert_eq!(
            prepare_update(stale, &old, "b1", "ns", true).unwrap_err().code,
            409
        );
        let mut with_status = old.clone();
        with_status.spec.cluster_name = "ignored".into();
        with_status.status = Some(etcd_operator_api::backup::EtcdBackupStatus {
            size: Some(5),
            ..Default::default()
        });
        let s = prepare_status_update(with_status, &old, "b1", true).unwrap();
        assert_eq!(s.spec.cluster_name, "a");
        assert_eq!(s.status.and_then(|s| s.size), Some(5));
    }

    #[test]
    fn finalizers_hold_deletion() {
        let mut old = created();
        assert!(prepare_delete(&old, None).is_none());
        old.metadata.finalizers = Some(vec!["x".into()]);
        let marked = prepare_delete(&old, None).unwrap();
        assert!(marked.metadata.deletion_timestamp.is_some());
        let mut done = marked.clone();
        done.metadata.resource_version = Some("4".into());
        done.metadata.finalizers = Some(vec![]);
        let mut stored = marked;
        stored.metadata.resource_version = Some("4".into());
        assert!(prepare_update(done, &stored, "b1", "ns", true).unwrap().is_none());
    }
}
