//! Request bodies and options: the 3 MiB limit, JSON and YAML decoding, patch types, and the
//! `dryRun` / `fieldValidation` / `fieldManager` query parameters.

use std::collections::{HashMap, HashSet, VecDeque};

use axum::body::Body;
use serde_json::Value;

use super::error::{ApiError, Cause};
use super::request_info::query_value;
use crate::registry::work;

/// kube-apiserver's default `MaxRequestBodyBytes`.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Reads the whole body, refusing more than [`MAX_BODY_BYTES`] with 413.
pub async fn read(body: Body) -> Result<bytes::Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|e| {
        // http-body-util reports the limit as a boxed LengthLimitError somewhere in the chain.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                return ApiError::too_large(MAX_BODY_BYTES);
            }
            source = err.source();
        }
        ApiError::bad_request(format!("read request body: {e}"))
    })
}

/// The media type of a `Content-Type` header, lower-cased, without parameters.
pub fn media_type(content_type: Option<&str>) -> String {
    content_type
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The media types of object bodies (create, update).
pub const OBJECT_MEDIA_TYPES: [&str; 2] = ["application/json", "application/yaml"];
/// The media types of patches.
pub const PATCH_MEDIA_TYPES: [&str; 4] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// Decodes an object body: JSON, or YAML when the content type says so.
pub fn decode_object(bytes: &[u8], content_type: Option<&str>) -> Result<Value, ApiError> {
    let media = media_type(content_type);
    let value: Value = match media.as_str() {
        "application/json" | "" | "*/*" => serde_json::from_slice(bytes).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?,
        "application/yaml" | "application/x-yaml" | "text/yaml" => serde_yaml::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?,
        other => return Err(ApiError::unsupported_media_type(other, &OBJECT_MEDIA_TYPES)),
    };
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    Ok(value)
}

/// `fieldValidation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop them with a `Warning` header (the server default).
    Warn,
    /// Refuse the request with 400.
    Strict,
}

/// Options common to writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOptions {
    /// `dryRun=All`: do everything but store.
    pub dry_run: bool,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
    /// `fieldManager`, when given.
    pub field_manager: Option<String>,
    /// `force`: `None` when absent, else whether it is `true`.
    pub force: Option<bool>,
}

/// The `dryRun` cause of kube-apiserver's option validation (`field.NotSupported` of a
/// `[]string`, printed the way Go prints it).
pub fn dry_run_unsupported(values: &[&str]) -> Cause {
    let shown = values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    Cause {
        reason: "FieldValueNotSupported".into(),
        message: format!("Unsupported value: []string{{{shown}}}: supported values: \"All\""),
        field: "dryRun".into(),
    }
}

impl WriteOptions {
    /// Parses the query string of a write whose options are `kind` (`CreateOptions`,
    /// `UpdateOptions`, `PatchOptions`, `DeleteOptions`). Unsupported values are a 422 about
    /// that kind with every cause, as kube-apiserver's option validation reports them.
    pub fn parse(query: Option<&str>, kind: &str) -> Result<Self, ApiError> {
        let mut causes = Vec::new();
        if let Some(manager) = query_value(query, "fieldManager") {
            if manager.len() > 128 {
                causes.push(Cause {
                    reason: "FieldValueTooLong".into(),
                    message: "Too long: may not be more than 128 bytes".into(),
                    field: "fieldManager".into(),
                });
            }
            if let Some((i, c)) = manager.chars().enumerate().find(|(_, c)| c.is_control()) {
                causes.push(Cause {
                    reason: "FieldValueInvalid".into(),
                    message: format!(
                        "Invalid value: {manager:?}: invalid character U+{:04X} (at position {i})",
                        u32::from(c)
                    ),
                    field: "fieldManager".into(),
                });
            }
        }
        let dry_run = match query_value(query, "dryRun").as_deref() {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                causes.push(dry_run_unsupported(&[other]));
                false
            }
        };
        let field_validation = match query_value(query, "fieldValidation").as_deref() {
            None | Some("") | Some("Warn") => FieldValidation::Warn,
            Some("Ignore") => FieldValidation::Ignore,
            Some("Strict") => FieldValidation::Strict,
            Some(other) => {
                causes.push(Cause {
                    reason: "FieldValueNotSupported".into(),
                    message: format!(
                        "Unsupported value: {other:?}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
                    ),
                    field: "fieldValidation".into(),
                });
                FieldValidation::Warn
            }
        };
        if !causes.is_empty() {
            return Err(ApiError::invalid_options(kind, causes));
        }
        Ok(Self {
            dry_run,
            field_validation,
            field_manager: query_value(query, "fieldManager").filter(|m| !m.is_empty()),
            force: query_value(query, "force").map(|v| v == "true" || v == "1"),
        })
    }
}

/// Patch types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 6902.
    Json,
    /// RFC 7386.
    Merge,
    /// Strategic merge patch, with this API's list semantics (see [`strategic_merge`]).
    Strategic,
    /// Server-side apply (handled apart: it is not a patch of the live object).
    Apply,
}

/// The patch type of a `Content-Type`; anything else (CBOR apply included) is 415.
pub fn patch_type(content_type: Option<&str>) -> Result<PatchType, ApiError> {
    match media_type(content_type).as_str() {
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/apply-patch+yaml" => Ok(PatchType::Apply),
        other => Err(ApiError::unsupported_media_type(other, &PATCH_MEDIA_TYPES)),
    }
}

/// kube-apiserver's `ValidatePatchOptions`: `fieldManager` is required for apply, `force` is
/// only for apply; both at once as one 422 about `PatchOptions`.
pub fn check_patch_options(opts: &WriteOptions, patch_type: PatchType) -> Result<(), ApiError> {
    let cause = if patch_type == PatchType::Apply {
        opts.field_manager.is_none().then(|| Cause {
            reason: "FieldValueRequired".into(),
            message: "Required value: is required for apply patch".into(),
            field: "fieldManager".into(),
        })
    } else {
        opts.force.is_some().then(|| Cause {
            reason: "FieldValueForbidden".into(),
            message: "Forbidden: may not be specified for non-apply patch".into(),
            field: "force".into(),
        })
    };
    match cause {
        Some(c) => Err(ApiError::invalid_options("PatchOptions", vec![c])),
        None => Ok(()),
    }
}

/// A strategic merge patch on this API's objects. The types carry no per-field patch strategy
/// beyond the list semantics of `registry::fieldset::list_type`, so it is a JSON merge patch
/// (RFC 7386) except that keyed lists (`metadata.ownerReferences`, `status.conditions`,
/// `status.members`) merge item by item and sets (`metadata.finalizers`) value by value, and the
/// directives kubectl sends are honoured: `$patch: replace|delete|merge` on maps and list items,
/// `$retainKeys`, `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` (ignored: order
/// is the server's).
pub fn strategic_merge(target: &Value, patch: &Value) -> Result<Value, ApiError> {
    smp_at(Some(target), patch, &mut Vec::new())
}

fn smp_at(target: Option<&Value>, patch: &Value, names: &mut Vec<String>) -> Result<Value, ApiError> {
    use crate::registry::fieldset::{ListType, list_type};
    let Value::Object(p) = patch else {
        return Ok(patch.clone());
    };
    let mut out = match target {
        Some(Value::Object(t)) => t.clone(),
        _ => serde_json::Map::new(),
    };
    match p.get("$patch").and_then(Value::as_str) {
        None | Some("merge") => {}
        Some("replace") => {
            out.clear();
        }
        Some("delete") => return Ok(Value::Null),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other:?} in map: {patch}"
            )));
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: HashSet<&str> = keep.iter().filter_map(Value::as_str).collect();
        out.retain(|k, _| {
            work::step();
            keep.contains(k.as_str())
        });
    }
    for (k, pv) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(gone)) = (out.get_mut(field), pv) {
                // Values told apart by their JSON text (maps are sorted): one lookup per item.
                let gone: HashSet<String> = gone.iter().map(Value::to_string).collect();
                items.retain(|i| {
                    work::step();
                    !gone.contains(&i.to_string())
                });
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if pv.is_null() {
            out.remove(k);
            continue;
        }
        names.push(k.clone());
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let merged = match (out.get(k), pv) {
            (Some(Value::Array(current)), Value::Array(items)) => match list_type(&name_refs) {
                ListType::Atomic => Value::Array(items.clone()),
                ListType::Set => {
                    let mut all = current.clone();
                    let mut seen: HashSet<String> = all.iter().map(Value::to_string).collect();
                    for i in items {
                        work::step();
                        if seen.insert(i.to_string()) {
                            all.push(i.clone());
                        }
                    }
                    Value::Array(all)
                }
                ListType::Map(keys) => merge_keyed(current, items, keys)?,
            },
            (current, Value::Object(_)) => smp_at(current, pv, names)?,
            (_, other) => other.clone(),
        };
        names.pop();
        if merged.is_null() {
            out.remove(k);
        } else {
            out.insert(k.clone(), merged);
        }
    }
    Ok(Value::Object(out))
}

/// The item key of a keyed list as text: each key field's value, or its absence, in the order
/// of `keys`. Two items are the same item when their key texts are equal.
fn item_key(item: &Value, keys: &[&str]) -> String {
    let fields: Vec<(bool, &Value)> = keys
        .iter()
        .map(|k| item.get(*k).map_or((false, &Value::Null), |v| (true, v)))
        .collect();
    serde_json::to_string(&fields).unwrap_or_default()
}

/// A keyed list patched item by item: each patch item merges into the first current item with
/// its key (or is appended), `$patch: delete` removes that item, `$patch: replace` empties the
/// list. Items are found through an index of their keys, not by a scan per patch item.
fn merge_keyed(current: &[Value], items: &[Value], keys: &[&str]) -> Result<Value, ApiError> {
    // Merged items by position; a removed one is `None` (positions stay valid for the index).
    let mut all: Vec<Option<Value>> = current.iter().cloned().map(Some).collect();
    // Per key, the positions of its items in order; removed ones leave from the front.
    let mut index: HashMap<String, VecDeque<usize>> = HashMap::new();
    for (i, item) in current.iter().enumerate() {
        index.entry(item_key(item, keys)).or_default().push_back(i);
    }
    for item in items {
        work::step();
        let directive = item.get("$patch").and_then(Value::as_str);
        if directive == Some("replace") {
            all.clear();
            index.clear();
            continue;
        }
        let key = item_key(item, keys);
        // The first item with this key that is still there.
        let first = index.get_mut(&key).and_then(|at| {
            while at
                .front()
                .is_some_and(|&i| all.get(i).is_none_or(Option::is_none))
            {
                at.pop_front();
            }
            at.front().copied()
        });
        match first {
            Some(i) if directive == Some("delete") => {
                all[i] = None;
            }
            Some(i) => {
                let merged = smp_at(all[i].as_ref(), item, &mut Vec::new())?;
                all[i] = Some(merged);
            }
            None if directive == Some("delete") => {}
            None => {
                index.entry(key).or_default().push_back(all.len());
                all.push(Some(smp_at(None, item, &mut Vec::new())?));
            }
        }
    }
    Ok(Value::Array(all.into_iter().flatten().collect()))
}

/// Applies a patch to the object `name`; a malformed patch (400) or one that cannot apply (422)
/// is an error.
pub fn apply_patch(
    target: &Value,
    name: &str,
    patch_bytes: &[u8],
    patch_type: PatchType,
) -> Result<Value, ApiError> {
    let mut doc = target.clone();
    match patch_type {
        PatchType::Json => {
            let mut patch: json_patch::Patch = serde_json::from_slice(patch_bytes)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            // kube-apiserver's JSON patch library treats a missing value as null, so
            // `{"op":"test","path":"/metadata/finalizers","value":null}` passes when the object
            // has no finalizers (kube-runtime's finalizer helper relies on it). json-patch
            // fails it instead; drop exactly those tests.
            patch.0.retain(|op| match op {
                json_patch::PatchOperation::Test(t) => {
                    !(t.value.is_null() && doc.pointer(t.path.as_str()).is_none_or(Value::is_null))
                }
                _ => true,
            });
            if patch.0.len() > 10_000 {
                return Err(ApiError::invalid(
                    etcd_operator_api::KIND,
                    name,
                    vec![super::error::Cause {
                        reason: "FieldValueTooMany".into(),
                        message: "The allowed maximum operations in a JSON patch is 10000".into(),
                        field: String::new(),
                    }],
                ));
            }
            json_patch::patch(&mut doc, &patch).map_err(|e| {
                ApiError::invalid(
                    etcd_operator_api::KIND,
                    name,
                    vec![super::error::Cause {
                        reason: "FieldValueInvalid".into(),
                        message: format!("the JSON patch could not be applied: {e}"),
                        field: String::new(),
                    }],
                )
            })?;
        }
        PatchType::Merge => {
            let patch: Value = serde_json::from_slice(patch_bytes)
                .map_err(|e| ApiError::bad_request(format!("invalid merge patch: {e}")))?;
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(&mut doc, &patch);
        }
        PatchType::Strategic => {
            let patch: Value = serde_json::from_slice(patch_bytes)
                .map_err(|e| ApiError::bad_request(format!("invalid strategic merge patch: {e}")))?;
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "a strategic merge patch must be a JSON object",
                ));
            }
            doc = strategic_merge(&doc, &patch)?;
        }
        PatchType::Apply => {
            return Err(ApiError::internal("an apply patch is not applied as a patch"));
        }
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn bodies_over_the_limit_are_413() {
        let big = vec![b' '; MAX_BODY_BYTES + 1];
        let err = read(Body::from(big)).await.unwrap_err();
        assert_eq!(err.code, http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(read(Body::from(vec![b' '; 10])).await.is_ok());
    }

    #[test]
    fn decoding() {
        assert_eq!(decode_object(b"{\"a\":1}", None).unwrap(), json!({"a": 1}));
        assert_eq!(
            decode_object(b"a: 1\n", Some("application/yaml")).unwrap(),
            json!({"a": 1})
        );
        assert_eq!(decode_object(b"{not json", None).unwrap_err().code, 400);
        assert_eq!(decode_object(b"[1]", None).unwrap_err().code, 400);
        assert_eq!(decode_object(b"x", Some("text/plain")).unwrap_err().code, 415);
    }

    #[test]
    fn options() {
        assert!(
            WriteOptions::parse(Some("dryRun=All"), "CreateOptions")
                .unwrap()
                .dry_run
        );
        assert_eq!(
            WriteOptions::parse(None, "CreateOptions")
                .unwrap()
                .field_validation,
            FieldValidation::Warn
        );
        assert_eq!(
            WriteOptions::parse(Some("fieldValidation=Strict"), "UpdateOptions")
                .unwrap()
                .field_validation,
            FieldValidation::Strict
        );
    }

    #[test]
    fn unsupported_options_are_422_about_the_options_kind_with_every_cause() {
        let err = WriteOptions::parse(Some("dryRun=Some&fieldValidation=Loose"), "PatchOptions").unwrap_err();
        assert_eq!(err.code, 422);
        let status = err.to_status();
        assert_eq!(
            status["message"],
            "PatchOptions.meta.k8s.io \"\" is invalid: [dryRun: Unsupported value: []string{\"Some\"}: supported values: \"All\", fieldValidation: Unsupported value: \"Loose\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"]"
        );
        assert_eq!(status["details"]["kind"], "PatchOptions");
        assert_eq!(status["details"]["group"], "meta.k8s.io");
        let long = "m".repeat(129);
        let err = WriteOptions::parse(Some(&format!("fieldManager={long}")), "CreateOptions").unwrap_err();
        assert_eq!(err.to_status()["details"]["causes"][0]["field"], "fieldManager");
    }

    #[test]
    fn apply_needs_a_field_manager_and_only_apply_may_force() {
        let opts = WriteOptions::parse(Some("force=true"), "PatchOptions").unwrap();
        let err = check_patch_options(&opts, PatchType::Apply).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
        );
        let err = check_patch_options(&opts, PatchType::Merge).unwrap_err();
        assert_eq!(err.to_status()["details"]["causes"][0]["field"], "force");
        let opts = WriteOptions::parse(Some("fieldManager=a&force=false"), "PatchOptions").unwrap();
        assert!(check_patch_options(&opts, PatchType::Apply).is_ok());
        assert_eq!(opts.field_manager.as_deref(), Some("a"));
        assert_eq!(opts.force, Some(false));
    }

    #[test]
    fn strategic_merge_patches_follow_the_list_semantics_and_directives() {
        let target = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}},
            "spec": {"replicas": 3, "tls": {"a": 1, "b": 2}, "tolerations": [{"key": "a"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Gone", "status": "True"}]}});
        let patch = json!({"metadata": {"finalizers": ["b"], "labels": {"x": null},
                "$deleteFromPrimitiveList/finalizers": ["a"], "$setElementOrder/finalizers": ["b"]},
            "spec": {"replicas": 5, "tls": {"$patch": "replace", "c": 3}, "tolerations": [{"key": "b"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Gone", "$patch": "delete"}]}});
        let out = strategic_merge(&target, &patch).unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"finalizers": ["b"], "labels": {"y": "2"}},
                "spec": {"replicas": 5, "tls": {"c": 3}, "tolerations": [{"key": "b"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        );
        let out = strategic_merge(
            &json!({"spec": {"a": 1, "b": 2}}),
            &json!({"spec": {"$retainKeys": ["a"], "a": 5}}),
        )
        .unwrap();
        assert_eq!(out, json!({"spec": {"a": 5}}));
        assert_eq!(
            strategic_merge(&target, &json!({"spec": {"$patch": "explode"}}))
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            apply_patch(&target, "a", b"[1]", PatchType::Strategic)
                .unwrap_err()
                .code,
            400
        );
    }

    /// A keyed list patched as it was: a scan of the list for every patch item.
    fn keyed_by_scans(current: &[Value], items: &[Value], keys: &[&str]) -> Vec<Value> {
        let mut all = current.to_vec();
        for item in items {
            if item.get("$patch").and_then(Value::as_str) == Some("replace") {
                all.clear();
                continue;
            }
            let same = |o: &Value| keys.iter().all(|key| o.get(key) == item.get(key));
            let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
            match all.iter().position(same) {
                Some(i) if delete => {
                    all.remove(i);
                }
                Some(i) => all[i] = smp_at(Some(&all[i]), item, &mut Vec::new()).unwrap(),
                None if delete => {}
                None => all.push(smp_at(None, item, &mut Vec::new()).unwrap()),
            }
        }
        all
    }

    #[test]
    fn keyed_lists_are_patched_through_an_index_with_the_same_result() {
        let current = vec![
            json!({"uid": "a", "n": 1}),
            json!({"uid": "a", "n": "second a"}),
            json!({"n": "no uid"}),
            json!({"uid": null, "n": "null uid"}),
            json!({"uid": "b"}),
        ];
        let cases = [
            vec![json!({"uid": "a", "m": 1}), json!({"uid": "a", "m": 2})],
            vec![
                json!({"uid": "a", "$patch": "delete"}),
                json!({"uid": "a", "m": "into the second"}),
            ],
            vec![
                json!({"uid": "a", "$patch": "delete"}),
                json!({"uid": "a", "$patch": "delete"}),
                json!({"uid": "a", "$patch": "delete"}),
                json!({"uid": "a", "m": "new a"}),
                json!({"uid": "a", "m2": "merged into the new a"}),
            ],
            vec![json!({"m": "no uid either"}), json!({"uid": null, "m": "null"})],
            vec![
                json!({"uid": "c"}),
                json!({"$patch": "replace"}),
                json!({"uid": "b", "m": 1}),
            ],
            vec![
                json!({"uid": "x", "$patch": "delete"}),
                json!({"uid": "b", "$patch": "delete"}),
            ],
        ];
        for items in cases {
            let target = json!({"metadata": {"ownerReferences": current.clone()}});
            let patch = json!({"metadata": {"ownerReferences": items.clone()}});
            assert_eq!(
                strategic_merge(&target, &patch).unwrap()["metadata"]["ownerReferences"],
                json!(keyed_by_scans(&current, &items, &["uid"])),
                "{items:?}"
            );
        }
    }

    #[test]
    fn huge_lists_and_maps_are_patched_in_one_pass() {
        let names = |from: usize, n: usize| (from..from + n).map(|i| format!("f{i}")).collect::<Vec<_>>();
        let owners = |from: usize, n: usize| {
            (from..from + n)
                .map(|i| json!({"uid": format!("u{i}")}))
                .collect::<Vec<_>>()
        };
        let labels = |n: usize| {
            (0..n)
                .map(|i| (format!("k{i}"), json!("v")))
                .collect::<serde_json::Map<_, _>>()
        };
        crate::registry::work::assert_linear(1_000, |n| {
            let target = json!({"metadata": {"finalizers": names(0, n), "ownerReferences": owners(0, n),
                "labels": labels(n)}});
            let patch = json!({"metadata": {"finalizers": names(n / 2, n),
                "$deleteFromPrimitiveList/finalizers": names(0, n / 4),
                "ownerReferences": owners(n / 2, n),
                "labels": {"$retainKeys": names(0, n)}}});
            let out = strategic_merge(&target, &patch).unwrap();
            assert_eq!(
                out["metadata"]["finalizers"].as_array().map(Vec::len),
                Some(n + n / 4)
            );
            assert_eq!(
                out["metadata"]["ownerReferences"].as_array().map(Vec::len),
                Some(n + n / 2)
            );
        });
    }

    #[test]
    fn patches() {
        assert_eq!(
            patch_type(Some("application/strategic-merge-patch+json")).unwrap(),
            PatchType::Strategic
        );
        assert_eq!(
            patch_type(Some("application/apply-patch+yaml; charset=utf-8")).unwrap(),
            PatchType::Apply
        );
        assert_eq!(
            patch_type(Some("application/apply-patch+cbor")).unwrap_err().code,
            415
        );
        let target = json!({"spec": {"replicas": 3, "version": "3.5.1"}});
        let merged = apply_patch(
            &target,
            "a",
            br#"{"spec":{"replicas":5,"version":null}}"#,
            PatchType::Merge,
        )
        .unwrap();
        assert_eq!(merged, json!({"spec": {"replicas": 5}}));
        let patched = apply_patch(
            &target,
            "a",
            br#"[{"op":"replace","path":"/spec/replicas","value":1}]"#,
            PatchType::Json,
        )
        .unwrap();
        assert_eq!(patched["spec"]["replicas"], 1);
        let failing = apply_patch(
            &target,
            "a",
            br#"[{"op":"test","path":"/spec/replicas","value":9}]"#,
            PatchType::Json,
        );
        let failing = failing.unwrap_err();
        assert_eq!(failing.code, 422);
        assert!(
            failing
                .message
                .starts_with("EtcdCluster.etcd.operator.dev \"a\" is invalid: "),
            "{}",
            failing.message
        );
        assert_eq!(
            apply_patch(&target, "a", b"not json", PatchType::Json)
                .unwrap_err()
                .code,
            400
        );
    }
}
