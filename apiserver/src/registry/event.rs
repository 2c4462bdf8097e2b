//! The strategy of core `v1` Events, served in local mode so that `kubectl describe` and
//! `kubectl get events` show what the controller reported: one version, no status, validation
//! of what kube-apiserver's `ValidateEvent` checks for core Events (an involved object, its
//! namespace the Event's, a known type, bounded reason and message). Pure.

use etcd_operator_api::validation::{FieldError, Outcome, Path};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::decode::Findings;
use super::kind::{EVENT_INFO, KindInfo};
use super::printers::{self, Printer};
use super::strategy::{Store, Strategy};
use crate::error::{ApiError, Cause};

/// The strategy of `events`.
#[derive(Debug, Clone, Copy)]
pub struct EventStrategy;

/// The store of `events`.
pub const EVENTS: Store<EventStrategy> = Store(EventStrategy);

/// The Event types kube-apiserver accepts.
pub const TYPES: [&str; 2] = ["Normal", "Warning"];
/// kube-apiserver's limit on `reason` (and `action`).
const REASON_MAX: usize = 128;
/// kube-apiserver's limit on `message` of events.k8s.io Events; core ones are truncated by
/// clients to this, so a longer one is refused here.
const MESSAGE_MAX: usize = 1024;

/// Decodes a request body: a core `v1` Event with an `involvedObject` (a missing one is a 422
/// naming the field, not a decoding error).
pub fn decode(body: &Value) -> Result<(Event, Findings), ApiError> {
    match body.get("apiVersion").and_then(Value::as_str) {
        Some("v1") => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version (v1)"
            )));
        }
        None => {
            return Err(ApiError::bad_request(
                "Object 'apiVersion' is missing in the request body",
            ));
        }
    }
    match body.get("kind").and_then(Value::as_str) {
        Some("Event") => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind (Event)"
            )));
        }
        None => {
            return Err(ApiError::bad_request(
                "Object 'Kind' is missing in the request body",
            ));
        }
    }
    if body.get("involvedObject").is_none_or(Value::is_null) {
        let name = body
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        return Err(ApiError::invalid_in(
            "",
            "Event",
            name,
            vec![Cause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: "involvedObject".into(),
            }],
        ));
    }
    super::decode::decode(body).map_err(|e| ApiError::bad_request(format!("decode Event: {e}")))
}

/// Every error of an Event, with field paths.
pub fn validate(event: &Event) -> Outcome {
    let mut errors = Vec::new();
    let involved = Path::root("involvedObject");
    let obj = &event.involved_object;
    if obj.name.as_deref().is_none_or(str::is_empty) {
        errors.push(FieldError::required(&involved.child("name"), ""));
    }
    if obj.kind.as_deref().is_none_or(str::is_empty) {
        errors.push(FieldError::required(&involved.child("kind"), ""));
    }
    let namespace = event.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(ns) = obj.namespace.as_deref().filter(|ns| !ns.is_empty())
        && ns != namespace
    {
        errors.push(FieldError::invalid(
            &involved.child("namespace"),
            ns,
            "does not match event.namespace",
        ));
    }
    if event.metadata.name.as_deref().is_none_or(str::is_empty) {
        errors.push(FieldError::required(
            &Path::root("metadata").child("name"),
            "name or generateName is required",
        ));
    }
    if let Some(t) = event.type_.as_deref().filter(|t| !t.is_empty())
        && !TYPES.contains(&t)
    {
        errors.push(FieldError::not_supported(&Path::root("type"), t, &TYPES));
    }
    if event.reason.as_deref().is_some_and(|r| r.len() > REASON_MAX) {
        errors.push(FieldError::too_long(&Path::root("reason"), REASON_MAX));
    }
    if event.action.as_deref().is_some_and(|a| a.len() > REASON_MAX) {
        errors.push(FieldError::too_long(&Path::root("action"), REASON_MAX));
    }
    if event.message.as_deref().is_some_and(|m| m.len() > MESSAGE_MAX) {
        errors.push(FieldError::too_long(&Path::root("message"), MESSAGE_MAX));
    }
    if let Some(count) = event.count.filter(|c| *c < 0) {
        errors.push(FieldError::invalid_raw(
            &Path::root("count"),
            count,
            "must be greater than or equal to 0",
        ));
    }
    Outcome {
        errors,
        ..Outcome::default()
    }
}

impl Strategy for EventStrategy {
    type Request = Event;
    type Object = Event;

    fn info(&self) -> &'static KindInfo {
        &EVENT_INFO
    }

    fn printer(&self) -> &'static Printer {
        &printers::EVENTS
    }

    fn decode(&self, body: &Value, _version: &str) -> Result<(Event, Findings), ApiError> {
        decode(body)
    }

    fn request_meta<'a>(&self, obj: &'a Event) -> &'a ObjectMeta {
        &obj.metadata
    }

    fn request_meta_mut<'a>(&self, obj: &'a mut Event) -> &'a mut ObjectMeta {
        &mut obj.metadata
    }

    fn object_meta<'a>(&self, obj: &'a Event) -> &'a ObjectMeta {
        &obj.metadata
    }

    fn object_meta_mut<'a>(&self, obj: &'a mut Event) -> &'a mut ObjectMeta {
        &mut obj.metadata
    }

    fn apply_defaults(&self, _obj: &mut Event) {}

    fn validate(&self, obj: &Event) -> Outcome {
        validate(obj)
    }

    fn validate_update(&self, obj: &Event, _old: &Event) -> Outcome {
        validate(obj)
    }

    fn canonicalize(&self, obj: Event) -> Event {
        obj
    }

    fn prepare_for_create(&self, _obj: &mut Event) {}

    fn prepare_for_update(&self, _obj: &mut Event, _old: &Event) {}

    fn prepare_for_status_update(&self, new: Event, _old: &Event) -> Event {
        new
    }

    fn to_storage(&self, mut obj: Event) -> Result<Value, ApiError> {
        obj.metadata.resource_version = None;
        serde_json::to_value(&obj).map_err(|e| ApiError::internal(format!("encode Event: {e}")))
    }

    fn read_stored(&self, stored: Value) -> Result<Event, ApiError> {
        serde_json::from_value(stored).map_err(|e| ApiError::internal(format!("decode stored Event: {e}")))
    }

    fn to_version(&self, _obj: Event, version: &str) -> Result<Value, ApiError> {
        Err(ApiError::internal(format!("Event is not served in {version}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body() -> Value {
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "a.1", "namespace": "ns"},
            "involvedObject": {"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "name": "a", "namespace": "ns"},
            "reason": "MemberReplacing", "message": "replacing", "type": "Warning", "count": 1})
    }

    fn refused(body: Value) -> ApiError {
        let event = match decode(&body) {
            Ok((e, _)) => e,
            Err(e) => return e,
        };
        match EVENTS.create(event, "ns") {
            Ok(_) => panic!("accepted"),
            Err(e) => e,
        }
    }

    fn fields(e: &ApiError) -> Vec<String> {
        e.to_status()["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["field"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn a_valid_event_is_stored_with_server_metadata() {
        let admitted = EVENTS.create(decode(&body()).unwrap().0, "ns").unwrap();
        assert!(admitted.object.metadata.uid.is_some());
        let stored = EventStrategy.to_storage(admitted.object).unwrap();
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["kind"], "Event");
        assert_eq!(stored["involvedObject"]["name"], "a");
    }

    #[test]
    fn a_missing_involved_object_is_a_422_naming_it() {
        let mut b = body();
        b.as_object_mut().unwrap().remove("involvedObject");
        let e = refused(b);
        assert_eq!(e.code, 422);
        assert_eq!(fields(&e), ["involvedObject"]);
        assert!(e.message.starts_with("Event \"a.1\" is invalid"), "{}", e.message);
    }

    #[test]
    fn an_involved_object_without_name_or_kind_is_refused() {
        let mut b = body();
        b["involvedObject"] = json!({"namespace": "ns"});
        let e = refused(b);
        assert_eq!(e.code, 422);
        assert_eq!(fields(&e), ["involvedObject.name", "involvedObject.kind"]);
    }

    #[test]
    fn an_involved_object_in_another_namespace_is_refused() {
        let mut b = body();
        b["involvedObject"]["namespace"] = json!("other");
        let e = refused(b);
        assert_eq!(fields(&e), ["involvedObject.namespace"]);
        assert!(
            e.message.contains("does not match event.namespace"),
            "{}",
            e.message
        );
    }

    #[test]
    fn an_unknown_type_is_refused() {
        let mut b = body();
        b["type"] = json!("Fatal");
        assert_eq!(fields(&refused(b)), ["type"]);
    }

    #[test]
    fn long_reasons_and_messages_and_negative_counts_are_refused() {
        let mut b = body();
        b["reason"] = json!("R".repeat(REASON_MAX + 1));
        b["message"] = json!("m".repeat(MESSAGE_MAX + 1));
        b["count"] = json!(-1);
        assert_eq!(fields(&refused(b)), ["reason", "message", "count"]);
    }

    #[test]
    fn a_nameless_event_is_refused() {
        let mut b = body();
        b["metadata"] = json!({"namespace": "ns"});
        assert_eq!(fields(&refused(b)), ["metadata.name"]);
    }

    #[test]
    fn the_wrong_kind_or_version_is_a_400() {
        let mut b = body();
        b["apiVersion"] = json!("events.k8s.io/v1");
        assert_eq!(refused(b).code, 400);
        let mut b = body();
        b["kind"] = json!("Pod");
        assert_eq!(refused(b).code, 400);
    }
}
