//! `metadata.managedFields` on every write and the server-side apply merge: the glue between
//! the pure field-set rules (`registry::fieldset`) and the resource handlers. No I/O: the
//! handlers pass the stored objects in and write what comes out.

use std::collections::BTreeMap;

use etcd_operator_api::GROUP;
use serde_json::{Value, json};

use super::error::{ApiError, Cause};
use crate::registry::fieldset::{
    self, Change, Conflict, Entry, FieldSet, Operation, Scope, Writer, decode_entries,
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
    track_at(ctx, name, (old, new), applied, force, &now(), Reuse::StoredItems)
}

/// Whether [`track_at`] keeps the stored JSON of the entries a write leaves as they were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reuse {
    /// Keep it (what [`track`] does).
    StoredItems,
    /// Encode every entry again (what it did before; the tests compare the two).
    #[cfg(test)]
    Nothing,
}

/// [`track`] at the time `time`.
fn track_at(
    ctx: &WriteContext,
    name: &str,
    (old, new): (Option<&Value>, &mut Value),
    applied: Option<&FieldSet>,
    force: bool,
    time: &str,
    reuse: Reuse,
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
    let writer = Writer {
        manager: &ctx.manager,
        operation: if applied.is_some() {
            Operation::Apply
        } else {
            Operation::Update
        },
        api_version: &own_version,
        subresource: ctx.subresource.as_deref(),
        time,
    };
    let (entries, origin) = fieldset::record_tracked(entries, &writer, applied, &changes, force)
        .map_err(|c| conflict_error(ctx, name, &c))?;
    let mut stored = match reuse {
        Reuse::StoredItems => stored_items(old, new),
        #[cfg(test)]
        Reuse::Nothing => None,
    };
    if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            let items = entries
                .iter()
                .zip(&origin)
                .map(|(entry, from)| {
                    match (from, stored.as_mut()) {
                        // Left as it was: its stored JSON, not encoded again.
                        (Some(i), Some(items)) if *i < items.len() => std::mem::take(&mut items[*i]),
                        _ => entry.to_json(),
                    }
                })
                .collect();
            meta.insert("managedFields".into(), Value::Array(items));
        }
    }
    Ok(())
}

/// The items of `new`'s `metadata.managedFields`, taken out of it, when they are the stored
/// object's (every write through a subresource, a patch or a PUT that leaves them alone): the
/// entries [`track`] started from were decoded from them, one per non-empty item, and the
/// server encoded them itself, so an entry the write leaves as it was is its item.
fn stored_items(old: Option<&Value>, new: &mut Value) -> Option<Vec<Value>> {
    let stored = old?.pointer("/metadata/managedFields")?;
    let carried = new.pointer_mut("/metadata/managedFields")?;
    if !stored.is_array() || *carried != *stored {
        return None;
    }
    match std::mem::take(carried) {
        Value::Array(items) => Some(
            items
                .into_iter()
                .filter(|i| i.as_object().is_some_and(|m| !m.is_empty()))
                .collect(),
        ),
        _ => None,
    }
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

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:00:01Z";

    fn sub(manager: &str, subresource: &str) -> WriteContext {
        WriteContext {
            subresource: Some(subresource.into()),
            ..ctx(manager)
        }
    }

    /// `new` tracked against `old` both ways: keeping unchanged entries' stored JSON, and
    /// encoding every entry again. Both results, as bytes.
    fn both_ways(
        c: &WriteContext,
        old: Option<&Value>,
        new: &Value,
        applied: Option<&FieldSet>,
    ) -> (String, String) {
        let (mut kept, mut encoded) = (new.clone(), new.clone());
        track_at(c, "a", (old, &mut kept), applied, false, T1, Reuse::StoredItems).unwrap();
        track_at(c, "a", (old, &mut encoded), applied, false, T1, Reuse::Nothing).unwrap();
        (kept.to_string(), encoded.to_string())
    }

    /// A stored object: a creator owning `labels` labels and the spec, the controller owning
    /// its status.
    fn stored_object(labels: usize) -> Value {
        let labels: serde_json::Map<String, Value> =
            (0..labels).map(|i| (format!("k{i}"), json!("v"))).collect();
        let mut obj = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "a", "labels": labels}, "spec": {"replicas": 3}});
        track_at(
            &ctx("creator"),
            "a",
            (None, &mut obj),
            None,
            false,
            T0,
            Reuse::StoredItems,
        )
        .unwrap();
        let before = obj.clone();
        obj["status"] = json!({"phase": "Creating", "conditions": [{"type": "Ready", "status": "False"}]});
        track_at(
            &sub("controller", "status"),
            "a",
            (Some(&before), &mut obj),
            None,
            false,
            T0,
            Reuse::StoredItems,
        )
        .unwrap();
        obj
    }

    #[test]
    fn entries_a_write_leaves_as_they_were_keep_their_stored_json_byte_for_byte() {
        let stored = stored_object(50);
        assert_eq!(
            stored["metadata"]["managedFields"].as_array().map(Vec::len),
            Some(2)
        );
        let mut writes: Vec<(WriteContext, Value, Option<FieldSet>)> = Vec::new();
        // The controller's next status write (its entry changes, the creator's does not).
        let mut w = stored.clone();
        w["status"]["phase"] = json!("Running");
        writes.push((sub("controller", "status"), w, None));
        // A status write that changes nothing.
        writes.push((sub("controller", "status"), stored.clone(), None));
        // Another manager takes one label (the creator's entry changes too).
        let mut w = stored.clone();
        w["metadata"]["labels"]["k1"] = json!("w");
        writes.push((ctx("patcher"), w, None));
        // A new label only: the creator's entry is left as it was.
        let mut w = stored.clone();
        w["metadata"]["labels"]["new"] = json!("x");
        writes.push((ctx("patcher"), w, None));
        // The request rewrites managedFields itself (nothing is reused from it).
        let mut w = stored.clone();
        w["metadata"]["managedFields"][0]["manager"] = json!("renamed");
        writes.push((ctx("patcher"), w, None));
        // An apply of a spec field nobody owns yet.
        let applied = json!({"spec": {"paused": true}});
        let mut w = stored.clone();
        w["spec"]["paused"] = json!(true);
        writes.push((
            ctx("applier"),
            w,
            Some(fieldset::fields_of(&applied, Scope::Main)),
        ));
        for (c, new, applied) in &writes {
            let (kept, encoded) = both_ways(c, Some(&stored), new, applied.as_ref());
            assert_eq!(kept, encoded, "{} {:?}", c.manager, c.subresource);
        }
        // Nothing stored before: nothing to keep.
        let fresh = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "a"}, "spec": {}});
        let (kept, encoded) = both_ways(&ctx("creator"), None, &fresh, None);
        assert_eq!(kept, encoded);
    }

    #[test]
    fn a_status_write_does_not_encode_the_entry_of_thousands_of_labels_again() {
        let stored = stored_object(5_000);
        let mut new = stored.clone();
        new["status"]["phase"] = json!("Running");
        let c = sub("controller", "status");
        let (_, kept) = crate::registry::work::counted(|| {
            let mut v = new.clone();
            track_at(
                &c,
                "a",
                (Some(&stored), &mut v),
                None,
                false,
                T1,
                Reuse::StoredItems,
            )
            .unwrap();
        });
        let (_, encoded) = crate::registry::work::counted(|| {
            let mut v = new.clone();
            track_at(&c, "a", (Some(&stored), &mut v), None, false, T1, Reuse::Nothing).unwrap();
        });
        // Encoding a field set counts a step per field: the creator's 5,000 labels again.
        assert!(encoded >= 5_000, "{encoded}");
        assert!(kept < 100, "{kept} steps: the creator's entry was encoded again");
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
