//! `metadata.managedFields` on every write and the server-side apply merge: the glue between
//! the pure field-set rules (`registry::fieldset`) and the resource handlers. No I/O: the
//! handlers pass the stored objects in and write what comes out.

use std::collections::BTreeMap;

use etcd_operator_api::GROUP;
use serde_json::{Value, json};

use super::error::{ApiError, Cause};
use crate::registry::fieldset::{
    self, Change, Conflict, Entry, FieldSet, Operation, Scope, Writer, decode_entries, encode_entries,
};
use crate::registry::kind::Kind;

/// Who writes, through which subresource, in which version.
#[derive(Debug, Clone)]
pub struct WriteContext {
    /// The resource.
    pub kind: Kind,
    /// The URL's version (`v1alpha2`).
    pub version: String,
    /// `fieldManager`, or the User-Agent's product.
    pub manager: String,
    /// `status` or `scale`, when written through one.
    pub subresource: Option<String>,
}

impl WriteContext {
    /// The fields this endpoint may own.
    pub fn scope(&self) -> Scope {
        if self.subresource.as_deref() == Some("status") {
            Scope::Status
        } else {
            Scope::Main
        }
    }

    fn api_version(&self) -> String {
        format!("{GROUP}/{}", self.version)
    }
}

/// The default field manager: the User-Agent up to its first `/` (`kubectl/v1.35.0 ...` is
/// `kubectl`), as kube-apiserver's `prefixFromUserAgent`.
pub fn manager_from_user_agent(user_agent: Option<&str>) -> String {
    let prefix = user_agent
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default();
    prefix.chars().take(128).collect()
}

fn now() -> String {
    let t = jiff::Timestamp::now();
    jiff::Timestamp::from_second(t.as_second())
        .unwrap_or(t)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The entries a write starts from: the ones the request carries when it sets any (a client
/// may rewrite them, e.g. kubectl's client-side to server-side apply migration; `[{}]` resets
/// them), else the stored ones. Subresources never set them.
fn base_entries(old: Option<&Value>, new: &Value, ctx: &WriteContext) -> Vec<Entry> {
    let stored =
        || decode_entries(old.and_then(|o| o.pointer("/metadata/managedFields"))).unwrap_or_default();
    if ctx.subresource.is_some() {
        return stored();
    }
    match new.pointer("/metadata/managedFields") {
        Some(Value::Array(a)) if !a.is_empty() => match decode_entries(Some(&Value::Array(a.clone()))) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::debug!(error = %etcd_operator_api::report::Chain(&e), "ignoring the request's managedFields");
                stored()
            }
        },
        _ => stored(),
    }
}

/// What the write changed in `api_version` (`<group>/<version>`), or `None` when that version
/// is not served (such entries are kept untouched).
fn change_in(
    ctx: &WriteContext,
    api_version: &str,
    old: Option<&Value>,
    new: &Value,
) -> Result<Option<Change>, ApiError> {
    let Some(version) = api_version.strip_prefix(&format!("{GROUP}/")) else {
        return Ok(None);
    };
    if !ctx.kind.serves(version) {
        return Ok(None);
    }
    if version == ctx.kind.info().storage_version {
        // Storage JSON is this version already: no copies to convert.
        let empty = json!({});
        return Ok(Some(fieldset::diff(old.unwrap_or(&empty), new, ctx.scope())));
    }
    let old_v = match old {
        Some(o) => ctx.kind.in_version(o.clone(), version)?,
        None => json!({}),
    };
    let new_v = ctx.kind.in_version(new.clone(), version)?;
    Ok(Some(fieldset::diff(&old_v, &new_v, ctx.scope())))
}

/// The 409 of an apply that would take fields from other managers.
pub fn conflict_error(ctx: &WriteContext, name: &str, conflicts: &[Conflict]) -> ApiError {
    let causes = conflicts
        .iter()
        .map(|c| Cause {
            reason: "FieldManagerConflict".into(),
            message: format!("conflict with {}", c.manager),
            field: c.field.clone(),
        })
        .collect();
    ApiError::apply_conflict(
        ctx.kind.info().resource,
        name,
        fieldset::conflict_message(conflicts),
        causes,
    )
}

/// Records the write `old` → `new` (storage JSON) in `new`'s `metadata.managedFields`.
/// `applied` is the applied configuration's field set for an apply (in the URL's version).
pub fn track(
    ctx: &WriteContext,
    name: &str,
    old: Option<&Value>,
    new: &mut Value,
    applied: Option<&FieldSet>,
    force: bool,
) -> Result<(), ApiError> {
    let entries = base_entries(old, new, ctx);
    let own_version = ctx.api_version();
    let mut changes = BTreeMap::new();
    let versions = entries
        .iter()
        .map(|e| e.api_version.clone())
        .chain(std::iter::once(own_version.clone()));
    for v in versions {
        if changes.contains_key(&v) {
            continue;
        }
        if let Some(c) = change_in(ctx, &v, old, new)? {
            changes.insert(v, c);
        }
    }
    let time = now();
    let writer = Writer {
        manager: &ctx.manager,
        operation: if applied.is_some() {
            Operation::Apply
        } else {
            Operation::Update
        },
        api_version: &own_version,
        subresource: ctx.subresource.as_deref(),
        time: &time,
    };
    let entries = fieldset::record(entries, &writer, applied, &changes, force)
        .map_err(|c| conflict_error(ctx, name, &c))?;
    if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), encode_entries(&entries));
        }
    }
    Ok(())
}

/// An applied configuration, checked as kube-apiserver checks it: a YAML or JSON object of
/// this resource's group, version and kind, without `managedFields`.
pub fn parse_applied(bytes: &[u8], ctx: &WriteContext) -> Result<Value, ApiError> {
    let applied: Value = serde_yaml::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    let text = |k: &str| applied.get(k).and_then(Value::as_str).unwrap_or_default();
    let expected = ctx.api_version();
    let info = ctx.kind.info();
    if text("kind").is_empty() {
        return Err(ApiError::bad_request(format!(
            "Object 'Kind' is missing in '{}'",
            compact(&applied)
        )));
    }
    if text("apiVersion") != expected {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({expected})",
            text("apiVersion")
        )));
    }
    if text("kind") != info.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({}) does not match the expected kind ({})",
            text("kind"),
            info.kind
        )));
    }
    if applied
        .pointer("/metadata/managedFields")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    Ok(applied)
}

fn compact(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 200 {
        format!("{}...", s.chars().take(200).collect::<String>())
    } else {
        s
    }
}

/// The object an apply asks for, in the URL's version: the applied configuration merged into
/// the live object, without the fields the applier stopped applying that nobody else owns.
/// Also returns the applied field set.
pub fn merge_for_apply(ctx: &WriteContext, live_v: &Value, applied: &Value) -> (Value, FieldSet) {
    let scope = ctx.scope();
    let applied_set = fieldset::fields_of(applied, scope);
    let entries = decode_entries(live_v.pointer("/metadata/managedFields")).unwrap_or_default();
    let api_version = ctx.api_version();
    let mine = |e: &Entry| {
        e.manager == ctx.manager
            && e.operation == Operation::Apply
            && e.subresource.as_deref() == ctx.subresource.as_deref()
    };
    let previous = entries
        .iter()
        .find(|e| mine(e) && e.api_version == api_version)
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others = entries
        .iter()
        .filter(|e| !mine(e) && e.api_version == api_version)
        .fold(FieldSet::default(), |acc, e| acc.union(&e.fields));
    // Only the endpoint's own part of the applied configuration counts.
    let mut applied_part = applied.clone();
    if let Value::Object(m) = &mut applied_part {
        match scope {
            Scope::Main => {
                m.remove("status");
            }
            Scope::Status => m.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "status")),
        }
    }
    let mut merged = fieldset::merge_applied(live_v, &applied_part);
    fieldset::remove_fields(
        &mut merged,
        &fieldset::dropped_fields(&previous, &applied_set, &others),
    );
    (merged, applied_set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(manager: &str) -> WriteContext {
        WriteContext {
            kind: Kind::CLUSTER,
            version: "v1alpha2".into(),
            manager: manager.into(),
            subresource: None,
        }
    }

    #[test]
    fn the_default_manager_is_the_user_agent_product() {
        assert_eq!(
            manager_from_user_agent(Some("kubectl/v1.35.0 (linux/amd64)")),
            "kubectl"
        );
        assert_eq!(manager_from_user_agent(None), "");
    }

    #[test]
    fn applied_configurations_are_checked() {
        let c = ctx("a");
        let ok = b"apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata: {name: a}\n";
        assert!(parse_applied(ok, &c).is_ok());
        let e =
            parse_applied(b"apiVersion: etcd.operator.dev/v1alpha1\nkind: EtcdCluster\n", &c).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.contains("does not match the expected API version"));
        assert_eq!(parse_applied(b"metadata: {}\n", &c).unwrap_err().code, 400);
        let mf = b"{\"apiVersion\":\"etcd.operator.dev/v1alpha2\",\"kind\":\"EtcdCluster\",\"metadata\":{\"managedFields\":[]}}";
        assert_eq!(
            parse_applied(mf, &c).unwrap_err().message,
            "metadata.managedFields must be nil"
        );
        assert_eq!(parse_applied(b"[1]", &c).unwrap_err().code, 400);
    }

    #[test]
    fn apply_drops_what_the_applier_stopped_applying() {
        let live = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "a", "labels": {"x": "1", "y": "2"}, "managedFields": [
                {"manager": "a", "operation": "Apply", "apiVersion": "etcd.operator.dev/v1alpha2",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:x": {}, "f:y": {}}}, "f:spec": {"f:replicas": {}}}},
                {"manager": "b", "operation": "Update", "apiVersion": "etcd.operator.dev/v1alpha2",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:y": {}}}}}]},
            "spec": {"replicas": 3, "version": "3.5.17"}});
        let applied = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "a"}, "spec": {"version": "3.5.17"}, "status": {"phase": "x"}});
        let (merged, set) = merge_for_apply(&ctx("a"), &live, &applied);
        // x dropped (only a owned it), y kept (b owns it too), replicas dropped.
        assert_eq!(merged["metadata"]["labels"], json!({"y": "2"}));
        assert!(merged["spec"].get("replicas").is_none());
        assert!(merged.get("status").is_none());
        assert_eq!(set.to_fields_v1(), json!({"f:spec": {"f:version": {}}}));
    }
}
