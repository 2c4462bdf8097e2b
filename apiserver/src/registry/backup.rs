//! The EtcdBackup strategy: one served version (so the request is the stored type), defaults and
//! validation, an immutable spec, status written only through `/status`. Pure.

use etcd_operator_api::backup::{self as api, EtcdBackup};
use etcd_operator_api::validation::Outcome;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::decode::Findings;
use super::kind::{BACKUP_INFO, KindInfo};
use super::printers::{self, Printer};
use super::strategy::{Store, Strategy, UpdateDecision};
use crate::error::ApiError;

/// The strategy of `etcdbackups`.
#[derive(Debug, Clone, Copy)]
pub struct BackupStrategy;

/// The store of `etcdbackups`.
pub const BACKUPS: Store<BackupStrategy> = Store(BackupStrategy);

/// Decodes a request body: it must be an EtcdBackup of `etcd.operator.dev/v1alpha2`.
pub fn decode(body: &Value) -> Result<(EtcdBackup, Findings), ApiError> {
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
    super::decode::decode(body).map_err(|e| ApiError::bad_request(format!("decode EtcdBackup: {e}")))
}

impl Strategy for BackupStrategy {
    type Request = EtcdBackup;
    type Object = EtcdBackup;

    fn info(&self) -> &'static KindInfo {
        &BACKUP_INFO
    }

    fn printer(&self) -> &'static Printer {
        &printers::BACKUPS
    }

    fn decode(&self, body: &Value, _version: &str) -> Result<(EtcdBackup, Findings), ApiError> {
        decode(body)
    }

    fn request_meta<'a>(&self, obj: &'a EtcdBackup) -> &'a ObjectMeta {
        &obj.metadata
    }

    fn request_meta_mut<'a>(&self, obj: &'a mut EtcdBackup) -> &'a mut ObjectMeta {
        &mut obj.metadata
    }

    fn object_meta<'a>(&self, obj: &'a EtcdBackup) -> &'a ObjectMeta {
        &obj.metadata
    }

    fn object_meta_mut<'a>(&self, obj: &'a mut EtcdBackup) -> &'a mut ObjectMeta {
        &mut obj.metadata
    }

    fn apply_defaults(&self, obj: &mut EtcdBackup) {
        api::apply_defaults(obj);
    }

    fn validate(&self, obj: &EtcdBackup) -> Outcome {
        api::validate(obj)
    }

    fn validate_update(&self, obj: &EtcdBackup, old: &EtcdBackup) -> Outcome {
        api::validate_update(obj, old)
    }

    fn canonicalize(&self, obj: EtcdBackup) -> EtcdBackup {
        obj
    }

    fn prepare_for_create(&self, obj: &mut EtcdBackup) {
        obj.status = None;
    }

    fn prepare_for_update(&self, obj: &mut EtcdBackup, old: &EtcdBackup) {
        obj.status = old.status.clone();
    }

    fn prepare_for_status_update(&self, new: EtcdBackup, old: &EtcdBackup) -> EtcdBackup {
        let mut obj = old.clone();
        obj.status = new.status;
        obj
    }

    fn to_storage(&self, obj: EtcdBackup) -> Result<Value, ApiError> {
        to_storage(obj)
    }

    fn read_stored(&self, stored: Value) -> Result<EtcdBackup, ApiError> {
        from_storage(stored)
    }

    fn to_version(&self, _obj: EtcdBackup, version: &str) -> Result<Value, ApiError> {
        Err(ApiError::internal(format!(
            "EtcdBackup is not served in {version}"
        )))
    }
}

/// Create: metadata, defaults, validation; status dropped.
pub fn prepare_create(obj: EtcdBackup, namespace: &str) -> Result<EtcdBackup, ApiError> {
    BACKUPS.create(obj, namespace).map(|a| a.object)
}

/// Update of the main resource: `None` means the last finalizer is gone (delete).
pub fn prepare_update(
    new: EtcdBackup,
    old: &EtcdBackup,
    name: &str,
    namespace: &str,
    require_rv: bool,
) -> Result<Option<EtcdBackup>, ApiError> {
    Ok(match BACKUPS.update(new, old, name, namespace, require_rv)? {
        UpdateDecision::Store(a) => Some(a.object),
        UpdateDecision::Delete => None,
    })
}

/// Status update: only the status changes.
pub fn prepare_status_update(
    new: EtcdBackup,
    old: &EtcdBackup,
    name: &str,
    require_rv: bool,
) -> Result<EtcdBackup, ApiError> {
    BACKUPS.update_status(new, old, name, require_rv)
}

/// Delete: marked when finalizers hold it, else `None` (delete now).
pub fn prepare_delete(old: &EtcdBackup, propagation: Option<&str>) -> Option<EtcdBackup> {
    BACKUPS.delete(old, propagation)
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
        let mut b = prepare_create(decode(&body()).unwrap().0, "ns").unwrap();
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
        let err = prepare_create(decode(&bad).unwrap().0, "ns").unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.to_status()["details"]["causes"][0]["field"],
            "spec.clusterName"
        );
        assert_eq!(err.to_status()["details"]["kind"], "EtcdBackup");
        let mut wrong = body();
        wrong["kind"] = json!("EtcdCluster");
        assert_eq!(decode(&wrong).unwrap_err().code, 400);
        let mut old_version = body();
        old_version["apiVersion"] = json!("etcd.operator.dev/v1alpha1");
        assert_eq!(decode(&old_version).unwrap_err().code, 400);
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
