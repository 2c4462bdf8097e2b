//! Field sets and managed fields (server-side apply), pure: the structured-merge-diff rules
//! kube-apiserver applies, driven by this API's own list semantics.
//!
//! Hand-written because no Rust crate implements structured-merge-diff or `managedFields`: a
//! search of the registry documentation for structured-merge-diff / managed fields /
//! server-side apply finds only Go's `sigs.k8s.io/structured-merge-diff` and, in Rust, clients
//! that *send* apply patches (kube-rs `Patch::Apply`); the wire contract notes the same. It covers what this
//! API needs: `f:` fields, `k:` keyed list items, `v:` set values; every other list is atomic,
//! as in a CRD schema without `x-kubernetes-list-type`.
//!
//! A [`FieldSet`] is a set of paths; each path element is already in its `fieldsV1` spelling
//! (`f:spec`, `k:{"type":"Ready"}`, `v:"x"`). Objects are handled as JSON in one version: the
//! HTTP layer converts them into each manager's version before asking.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;

use serde_json::{Map, Value, json};

use super::work;

/// One path: its elements in `fieldsV1` spelling.
pub type Path = Vec<String>;

/// A `fieldsV1` document with a node that is not an object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("fieldsV1 node at {path:?} is not an object")]
pub struct NotFieldsV1 {
    /// Where.
    pub path: Path,
}

/// A set of field paths, as `fieldsV1` encodes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet(pub BTreeSet<Path>);

/// Which part of an object a write may touch: the main resource never owns `status`, the
/// `status` subresource owns only `status` (kube-apiserver's reset fields for CRDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everything but `status`.
    Main,
    /// Only `status`.
    Status,
}

/// How a list is merged and tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListType {
    /// Replaced as a whole; owned as one field.
    Atomic,
    /// A set of scalars; each value owned (`v:`).
    Set,
    /// A map of items keyed by these fields (`k:`).
    Map(&'static [&'static str]),
}

/// The list semantics of this API: `ObjectMeta`'s, and the status lists the controller keeps
/// keyed. Paths are field names only (no list elements).
pub fn list_type(path: &[&str]) -> ListType {
    match path {
        ["metadata", "finalizers"] => ListType::Set,
        ["metadata", "ownerReferences"] => ListType::Map(&["uid"]),
        ["status", "conditions"] => ListType::Map(&["type"]),
        ["status", "members"] => ListType::Map(&["name"]),
        _ => ListType::Atomic,
    }
}

/// Metadata fields nobody owns (kube-apiserver's `stripmeta`).
const UNTRACKED_META: [&str; 10] = [
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "generation",
    "resourceVersion",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

fn in_scope(key: &str, scope: Scope) -> bool {
    match scope {
        Scope::Main => !matches!(key, "apiVersion" | "kind" | "status"),
        Scope::Status => key == "status",
    }
}

/// The key element of a keyed list item, `k:{"name":"x"}` (keys sorted, as Go encodes them);
/// `None` when the item lacks a key.
fn key_element(item: &Value, keys: &[&str]) -> Option<String> {
    let mut m = Map::new();
    let mut sorted: Vec<&str> = keys.to_vec();
    sorted.sort_unstable();
    for k in sorted {
        m.insert(k.to_string(), item.get(k)?.clone());
    }
    Some(format!("k:{}", Value::Object(m)))
}

/// Every owned leaf of `obj` with its value: scalars, atomic lists, empty objects, set values
/// and keyed list items (whose value is `true`: their existence, not their content).
pub fn leaves(obj: &Value, scope: Scope) -> BTreeMap<Path, Value> {
    let mut out = BTreeMap::new();
    visit_leaves(obj, scope, &mut |path, value| {
        out.insert(path.clone(), value.clone());
    });
    out
}

/// Calls `sink` with the path and value of every owned leaf of `obj` (see [`leaves`]).
fn visit_leaves(obj: &Value, scope: Scope, sink: &mut dyn FnMut(&Path, &Value)) {
    let Some(top) = obj.as_object() else {
        return;
    };
    for (k, v) in top {
        if !in_scope(k, scope) || v.is_null() {
            continue;
        }
        if k == "metadata" {
            if let Some(meta) = v.as_object() {
                for (mk, mv) in meta {
                    if UNTRACKED_META.contains(&mk.as_str()) || mv.is_null() {
                        continue;
                    }
                    walk(
                        mv,
                        &mut vec!["f:metadata".to_string(), format!("f:{mk}")],
                        &mut vec!["metadata", mk],
                        sink,
                    );
                }
            }
            continue;
        }
        walk(v, &mut vec![format!("f:{k}")], &mut vec![k.as_str()], sink);
    }
}

/// A keyed list item's or a set value's leaf: its existence.
const EXISTS: Value = Value::Bool(true);

fn walk<'a>(v: &'a Value, path: &mut Path, names: &mut Vec<&'a str>, sink: &mut dyn FnMut(&Path, &Value)) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                if child.is_null() {
                    continue;
                }
                path.push(format!("f:{k}"));
                names.push(k);
                walk(child, path, names, sink);
                names.pop();
                path.pop();
            }
        }
        Value::Array(items) => match list_type(names) {
            ListType::Atomic => sink(path, v),
            ListType::Set => {
                for item in items {
                    path.push(format!("v:{item}"));
                    sink(path, &EXISTS);
                    path.pop();
                }
            }
            ListType::Map(keys) => {
                for item in items {
                    let Some(key) = key_element(item, keys) else {
                        continue;
                    };
                    path.push(key);
                    sink(path, &EXISTS);
                    if let Value::Object(m) = item {
                        for (k, child) in m {
                            if child.is_null() {
                                continue;
                            }
                            path.push(format!("f:{k}"));
                            names.push(k);
                            walk(child, path, names, sink);
                            names.pop();
                            path.pop();
                        }
                    }
                    path.pop();
                }
            }
        },
        other => sink(path, other),
    }
}

/// The fields `obj` sets.
pub fn fields_of(obj: &Value, scope: Scope) -> FieldSet {
    let mut out = BTreeSet::new();
    visit_leaves(obj, scope, &mut |path, _| {
        out.insert(path.clone());
    });
    FieldSet(out)
}

/// What a write changed: fields added or given another value, and fields removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    /// Added or modified.
    pub modified: FieldSet,
    /// Present before, absent after.
    pub removed: FieldSet,
}

/// The fields that differ between `old` and `new`.
pub fn diff(old: &Value, new: &Value, scope: Scope) -> Change {
    // A create (nothing before): every field of `new` is added; no copy of it, of its values or
    // of the paths twice, as the general case below needs.
    if old.as_object().is_some_and(Map::is_empty) {
        return Change {
            modified: fields_of(new, scope),
            removed: FieldSet::default(),
        };
    }
    diff_of_leaves(old, new, scope)
}

/// [`diff`] by walking the leaves of both sides.
fn diff_of_leaves(old: &Value, new: &Value, scope: Scope) -> Change {
    // Only the parts that differ are walked: a write usually touches one of them (a status
    // write its `status`, an annotation patch `metadata.annotations`), and walking every leaf
    // of both objects was most of the cost of recording managedFields (docs/performance.md).
    let (old, new) = differing_parts(old, new);
    let before = leaves(&old, scope);
    let after = leaves(&new, scope);
    let modified = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(*v))
        .map(|(p, _)| p.clone())
        .collect();
    let removed = before
        .keys()
        .filter(|p| !after.contains_key(*p))
        .cloned()
        .collect();
    Change {
        modified: FieldSet(modified),
        removed: FieldSet(removed),
    }
}

/// `old` and `new` reduced to their top-level fields that differ (and, within `metadata`, to
/// its fields that differ). An equal part has the same leaves on both sides, so it can never
/// be in a [`Change`]: the diff of the reduced objects is the diff of the whole ones.
fn differing_parts(old: &Value, new: &Value) -> (Value, Value) {
    let (Some(o), Some(n)) = (old.as_object(), new.as_object()) else {
        return (old.clone(), new.clone());
    };
    let (mut po, mut pn) = split_differing(o, n);
    if let (Some(Value::Object(om)), Some(Value::Object(nm))) = (po.get("metadata"), pn.get("metadata")) {
        let (m_old, m_new) = split_differing(om, nm);
        po.insert("metadata".to_string(), Value::Object(m_old));
        pn.insert("metadata".to_string(), Value::Object(m_new));
    }
    (Value::Object(po), Value::Object(pn))
}

/// The entries of `o` and `n` whose values differ (or that only one side has).
fn split_differing(
    o: &Map<String, Value>,
    n: &Map<String, Value>,
) -> (Map<String, Value>, Map<String, Value>) {
    let mut po = Map::new();
    let mut pn = Map::new();
    for (k, nv) in n {
        match o.get(k) {
            Some(ov) if ov == nv => {}
            Some(ov) => {
                po.insert(k.clone(), ov.clone());
                pn.insert(k.clone(), nv.clone());
            }
            None => {
                pn.insert(k.clone(), nv.clone());
            }
        }
    }
    for (k, ov) in o {
        if !n.contains_key(k) {
            po.insert(k.clone(), ov.clone());
        }
    }
    (po, pn)
}

impl FieldSet {
    /// Whether no field is in the set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The paths in both sets.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.intersection(&other.0).cloned().collect())
    }

    /// The paths of `self` not in `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.difference(&other.0).cloned().collect())
    }

    /// The paths of either.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.union(&other.0).cloned().collect())
    }

    /// Whether a path of `self` is `path` or lies under it. The paths under `path` sort right
    /// after it, so the first path not below `path` answers (a lookup, not a scan).
    pub fn has_under(&self, path: &Path) -> bool {
        work::step();
        self.0
            .range::<[String], _>((Bound::Included(path.as_slice()), Bound::Unbounded))
            .next()
            .is_some_and(|p| p.starts_with(path))
    }

    /// The `fieldsV1` JSON: nested objects, `{}` for a leaf, `".": {}` for a node that is owned
    /// itself and has owned children. One pass in order: a path has owned children exactly
    /// when the next path lies under it (the paths under a path sort right after it).
    pub fn to_fields_v1(&self) -> Value {
        let mut root = Map::new();
        let mut paths = self.0.iter().peekable();
        while let Some(path) = paths.next() {
            work::step();
            let has_children = paths
                .peek()
                .is_some_and(|next| next.len() > path.len() && next.starts_with(path));
            insert(&mut root, path, has_children);
        }
        Value::Object(root)
    }

    /// Parses `fieldsV1`; anything that is not an object of objects is an error.
    pub fn from_fields_v1(v: &Value) -> Result<Self, NotFieldsV1> {
        fn go(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) -> Result<(), NotFieldsV1> {
            let m = v.as_object().ok_or_else(|| NotFieldsV1 { path: path.clone() })?;
            if m.is_empty() && !path.is_empty() {
                out.insert(path.clone());
            }
            for (k, child) in m {
                if k == "." {
                    out.insert(path.clone());
                    continue;
                }
                path.push(k.clone());
                go(child, path, out)?;
                path.pop();
            }
            Ok(())
        }
        let mut out = BTreeSet::new();
        go(v, &mut Vec::new(), &mut out)?;
        out.remove(&Vec::new());
        Ok(Self(out))
    }
}

/// Adds `path` to the `fieldsV1` tree at `root`; `owned_with_children` marks its node with `"."`
/// (owned itself, and owned children follow).
fn insert(root: &mut Map<String, Value>, path: &Path, owned_with_children: bool) {
    if path.is_empty() {
        return;
    }
    let mut node = root;
    for el in path {
        if !node.contains_key(el) {
            node.insert(el.clone(), json!({}));
        }
        let Some(Value::Object(child)) = node.get_mut(el) else {
            return;
        };
        node = child;
    }
    if owned_with_children {
        node.insert(".".into(), json!({}));
    }
}

/// A path as kube-apiserver prints it in conflicts: `.spec.replicas`,
/// `.status.conditions[type="Ready"]`, `.metadata.finalizers[="x"]`.
pub fn path_string(path: &Path) -> String {
    let mut s = String::new();
    for el in path {
        if let Some(f) = el.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = el.strip_prefix("k:") {
            let keys: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let shown: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", shown.join(",")));
        } else if let Some(v) = el.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        } else if let Some(i) = el.strip_prefix("i:") {
            s.push_str(&format!("[{i}]"));
        }
    }
    s
}

/// Merges an applied configuration into the live object with this API's list semantics: maps
/// merge field by field, keyed lists item by item, sets value by value, the rest is replaced.
pub fn merge_applied(live: &Value, applied: &Value) -> Value {
    merge_at(live, applied, &mut Vec::new())
}

fn merge_at<'a>(live: &Value, applied: &'a Value, names: &mut Vec<&'a str>) -> Value {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            let mut out = l.clone();
            for (k, av) in a {
                if av.is_null() {
                    out.remove(k);
                    continue;
                }
                names.push(k);
                let merged = match l.get(k) {
                    Some(lv) => merge_at(lv, av, names),
                    None => av.clone(),
                };
                names.pop();
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(a)) => match list_type(names) {
            ListType::Atomic => applied.clone(),
            ListType::Set => {
                // Values are told apart by their JSON text (equal values, equal text: maps are
                // sorted), so each is looked up once instead of compared with every other.
                let mut out = l.clone();
                let mut seen: HashSet<String> = out.iter().map(Value::to_string).collect();
                for v in a {
                    work::step();
                    if seen.insert(v.to_string()) {
                        out.push(v.clone());
                    }
                }
                Value::Array(out)
            }
            ListType::Map(keys) => {
                // The first item with each key, by index: an applied item merges into it.
                let mut out = l.clone();
                let mut index: HashMap<String, usize> = HashMap::new();
                for (i, o) in out.iter().enumerate() {
                    if let Some(k) = key_element(o, keys) {
                        index.entry(k).or_insert(i);
                    }
                }
                for item in a {
                    work::step();
                    let key = key_element(item, keys);
                    match key.as_ref().and_then(|k| index.get(k)).copied() {
                        Some(i) => out[i] = merge_at(&out[i], item, &mut Vec::new()),
                        None => {
                            if let Some(k) = key {
                                index.insert(k, out.len());
                            }
                            out.push(item.clone());
                        }
                    }
                }
                Value::Array(out)
            }
        },
        _ => applied.clone(),
    }
}

/// Removes the fields at `paths` from `obj` (fields an applier stopped applying). One walk of
/// the object along the sorted paths: each list is gone through once for all the paths into it
/// (a path per item, looked up by the item's own element), not once per path.
///
/// List items match as structured-merge-diff matches them: `v:` by value in any list, `k:` by
/// the key fields of a keyed list ([`list_type`]), compared in their canonical spelling.
pub fn remove_fields(obj: &mut Value, paths: &FieldSet) {
    let paths: Vec<&[String]> = paths
        .0
        .iter()
        .map(Vec::as_slice)
        .filter(|p| !p.is_empty())
        .collect();
    remove_under(obj, &paths, &mut Vec::new());
}

/// The paths that start with one element: whether that element itself goes, and the rest of the
/// paths that go on below it.
struct Group<'a> {
    first: &'a str,
    whole: bool,
    below: Vec<&'a [String]>,
}

/// Groups sorted, non-empty paths by their first element (equal first elements are adjacent).
fn group_by_first<'a>(paths: &[&'a [String]]) -> Vec<Group<'a>> {
    let mut groups: Vec<Group<'a>> = Vec::new();
    for path in paths {
        work::step();
        let Some((first, rest)) = path.split_first() else {
            continue;
        };
        let group = match groups.last_mut() {
            Some(g) if g.first == first.as_str() => g,
            _ => {
                groups.push(Group {
                    first,
                    whole: false,
                    below: Vec::new(),
                });
                let last = groups.len() - 1;
                &mut groups[last]
            }
        };
        if rest.is_empty() {
            group.whole = true;
        } else {
            group.below.push(rest);
        }
    }
    groups
}

/// A `v:` or `k:` element in the spelling [`walk`] gives an item (`None`: it names no item).
fn canonical_item_element(el: &str, keyed: bool) -> Option<String> {
    if let Some(v) = el.strip_prefix("v:") {
        return serde_json::from_str::<Value>(v).ok().map(|v| format!("v:{v}"));
    }
    let k = el.strip_prefix("k:").filter(|_| keyed)?;
    let keys: Map<String, Value> = serde_json::from_str(k).ok()?;
    (!keys.is_empty()).then(|| format!("k:{}", Value::Object(keys)))
}

fn remove_under(obj: &mut Value, paths: &[&[String]], names: &mut Vec<String>) {
    let groups = group_by_first(paths);
    match obj {
        Value::Object(m) => {
            for g in &groups {
                let Some(f) = g.first.strip_prefix("f:") else {
                    continue;
                };
                if g.whole {
                    m.remove(f);
                } else if let Some(child) = m.get_mut(f) {
                    names.push(f.to_string());
                    remove_under(child, &g.below, names);
                    names.pop();
                }
            }
        }
        Value::Array(items) => {
            let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let keys = match list_type(&name_refs) {
                ListType::Map(keys) => Some(keys),
                ListType::Atomic | ListType::Set => None,
            };
            let mut wanted: HashMap<String, Vec<usize>> = HashMap::new();
            for (i, g) in groups.iter().enumerate() {
                if let Some(el) = canonical_item_element(g.first, keys.is_some()) {
                    wanted.entry(el).or_default().push(i);
                }
            }
            if wanted.is_empty() {
                return;
            }
            let by_value = wanted.keys().any(|el| el.starts_with("v:"));
            let mut descended = vec![false; groups.len()];
            let mut keep = Vec::with_capacity(items.len());
            for item in items.iter_mut() {
                work::step();
                let own = [
                    by_value.then(|| format!("v:{item}")),
                    keys.and_then(|keys| key_element(item, keys)),
                ];
                let mut removed = false;
                for group in own.iter().flatten().filter_map(|el| wanted.get(el)).flatten() {
                    let g = &groups[*group];
                    if g.whole {
                        removed = true;
                    } else if !descended[*group] {
                        // As for a single path: into the first item it names.
                        descended[*group] = true;
                        remove_under(item, &g.below, &mut Vec::new());
                    }
                }
                keep.push(!removed);
            }
            let mut keep = keep.into_iter();
            items.retain(|_| keep.next().unwrap_or(true));
        }
        _ => {}
    }
}

/// `Apply` or `Update`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Server-side apply.
    Apply,
    /// Every other write.
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `manager`.
    pub manager: String,
    /// `operation`.
    pub operation: Operation,
    /// `apiVersion`: the version `fields` are spelled in.
    pub api_version: String,
    /// `time`, RFC 3339.
    pub time: Option<String>,
    /// `subresource`, when the write went through one.
    pub subresource: Option<String>,
    /// `fieldsV1`.
    pub fields: FieldSet,
}

/// Who writes: the identity of the entry a write records.
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    /// `fieldManager`.
    pub manager: &'a str,
    /// The operation.
    pub operation: Operation,
    /// The request's version (`<group>/<version>`).
    pub api_version: &'a str,
    /// The subresource written through.
    pub subresource: Option<&'a str>,
    /// Now, RFC 3339.
    pub time: &'a str,
}

impl Entry {
    /// Whether this entry is the one `w` records into: apply entries are one per manager (and
    /// subresource), update entries one per manager, version and subresource.
    fn is_of(&self, w: &Writer<'_>) -> bool {
        self.manager == w.manager
            && self.operation == w.operation
            && self.subresource.as_deref() == w.subresource
            && (w.operation == Operation::Apply || self.api_version == w.api_version)
    }

    /// The manager as kube-apiserver names it in conflicts.
    fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            s.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == Operation::Update {
            s.push_str(&format!(" using {}", self.api_version));
            if let Some(t) = &self.time {
                s.push_str(&format!(" at {t}"));
            }
        }
        s
    }

    /// The entry as JSON.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation.as_str()));
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), self.fields.to_fields_v1());
        if let Some(s) = &self.subresource {
            m.insert("subresource".into(), json!(s));
        }
        Value::Object(m)
    }
}

/// A malformed `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("decode managedFields: entry {index}: {reason}")]
pub struct DecodeManagedFieldsError {
    /// Which entry.
    pub index: usize,
    /// What is wrong.
    pub reason: String,
}

/// Parses `metadata.managedFields` (absent is empty). Empty entries (`{}`) are dropped: that is
/// how a client resets the field (`[{}]`), as with kube-apiserver.
pub fn decode_entries(v: Option<&Value>) -> Result<Vec<Entry>, DecodeManagedFieldsError> {
    let Some(Value::Array(items)) = v else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let err = |reason: &str| DecodeManagedFieldsError {
            index,
            reason: reason.to_string(),
        };
        let Some(m) = item.as_object() else {
            return Err(err("not an object"));
        };
        if m.is_empty() {
            continue;
        }
        let s = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
        let operation = match s("operation").as_deref() {
            Some("Apply") => Operation::Apply,
            Some("Update") => Operation::Update,
            other => return Err(err(&format!("unknown operation {other:?}"))),
        };
        if let Some(t) = s("fieldsType")
            && t != "FieldsV1"
        {
            return Err(err(&format!("unknown fieldsType {t:?}")));
        }
        let fields = match m.get("fieldsV1") {
            None | Some(Value::Null) => FieldSet::default(),
            Some(f) => FieldSet::from_fields_v1(f).map_err(|e| err(&e.to_string()))?,
        };
        out.push(Entry {
            manager: s("manager").unwrap_or_default(),
            operation,
            api_version: s("apiVersion").unwrap_or_default(),
            time: s("time"),
            subresource: s("subresource").filter(|s| !s.is_empty()),
            fields,
        });
    }
    Ok(out)
}

/// Entries as `metadata.managedFields` JSON.
pub fn encode_entries(entries: &[Entry]) -> Value {
    Value::Array(entries.iter().map(Entry::to_json).collect())
}

/// One field an applier would take from another manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The other manager, as kube-apiserver prints it.
    pub manager: String,
    /// The field, `.spec.replicas`.
    pub field: String,
}

/// kube-apiserver's conflict message (`util/managedfields/internal/conflict.go`).
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            c.manager, c.field
        );
    }
    let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by_manager.entry(&c.manager).or_default().push(&c.field);
    }
    let mut lines = Vec::new();
    for (m, fields) in by_manager {
        lines.push(format!("conflicts with {m}:"));
        lines.extend(fields.iter().map(|f| format!("- {f}")));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Records a write in the managed fields, as structured-merge-diff's `Updater` does.
///
/// `changes` holds, per `apiVersion` of an entry (and the writer's), what the write changed in
/// that version. Every other manager loses the fields the write modified or removed; an apply
/// that modifies another manager's field without `force` fails with the conflicts instead. The
/// writer's entry becomes `applied` (apply) or gains the modified fields (update). Empty entries
/// are dropped; an entry's time moves only when its fields change.
pub fn record(
    entries: Vec<Entry>,
    writer: &Writer<'_>,
    applied: Option<&FieldSet>,
    changes: &BTreeMap<String, Change>,
    force: bool,
) -> Result<Vec<Entry>, Vec<Conflict>> {
    record_tracked(entries, writer, applied, changes, force).map(|(entries, _)| entries)
}

/// The entries after a write, and for each the index of the entry it was when the write left it
/// exactly as it was ([`record_tracked`]).
pub type Recorded = (Vec<Entry>, Vec<Option<usize>>);

/// [`record`], also telling for each resulting entry the index of the given entry it is, when
/// the write left that entry exactly as it was (`None`: new or changed). An unchanged entry's
/// stored JSON can be kept as it is instead of being encoded again.
pub fn record_tracked(
    mut entries: Vec<Entry>,
    writer: &Writer<'_>,
    applied: Option<&FieldSet>,
    changes: &BTreeMap<String, Change>,
    force: bool,
) -> Result<Recorded, Vec<Conflict>> {
    let mut origin: Vec<Option<usize>> = (0..entries.len()).map(Some).collect();
    let mut conflicts = Vec::new();
    for (i, e) in entries.iter_mut().enumerate().filter(|(_, e)| !e.is_of(writer)) {
        let Some(change) = changes.get(&e.api_version) else {
            continue;
        };
        let taken = e.fields.intersection(&change.modified);
        if writer.operation == Operation::Apply && !force {
            conflicts.extend(taken.0.iter().map(|p| Conflict {
                manager: e.describe(),
                field: path_string(p),
            }));
        }
        let kept = e.fields.difference(&taken).difference(&change.removed);
        if kept != e.fields {
            e.fields = kept;
            origin[i] = None;
        }
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let own = changes.get(writer.api_version).cloned().unwrap_or_default();
    let position = entries.iter().position(|e| e.is_of(writer));
    let previous = position.map(|i| entries[i].clone());
    let fields = match applied {
        Some(set) => set.clone(),
        None => previous
            .as_ref()
            .map(|p| p.fields.clone())
            .unwrap_or_default()
            .union(&own.modified)
            .difference(&own.removed),
    };
    let entry = Entry {
        manager: writer.manager.to_string(),
        operation: writer.operation,
        api_version: writer.api_version.to_string(),
        time: match &previous {
            Some(p) if p.fields == fields && p.api_version == writer.api_version => p.time.clone(),
            _ => Some(writer.time.to_string()),
        },
        subresource: writer.subresource.map(str::to_string),
        fields,
    };
    match position {
        Some(i) => {
            if previous.as_ref() != Some(&entry) {
                origin[i] = None;
            }
            entries[i] = entry;
        }
        None => {
            entries.push(entry);
            origin.push(None);
        }
    }
    let (entries, origin) = entries
        .into_iter()
        .zip(origin)
        .filter(|(e, _)| !e.fields.is_empty())
        .unzip();
    Ok((entries, origin))
}

/// The fields an applier stopped applying and nobody else owns: what apply removes from the
/// object. `others` are the other managers' fields in the same version.
pub fn dropped_fields(previous: &FieldSet, applied: &FieldSet, others: &FieldSet) -> FieldSet {
    FieldSet(
        previous
            .difference(applied)
            .0
            .into_iter()
            .filter(|p| !others.has_under(p) && !applied.has_under(p))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`diff`] as it was: every leaf of both whole objects.
    fn whole_diff(old: &Value, new: &Value, scope: Scope) -> Change {
        let before = leaves(old, scope);
        let after = leaves(new, scope);
        Change {
            modified: FieldSet(
                after
                    .iter()
                    .filter(|(p, v)| before.get(*p) != Some(*v))
                    .map(|(p, _)| p.clone())
                    .collect(),
            ),
            removed: FieldSet(
                before
                    .keys()
                    .filter(|p| !after.contains_key(*p))
                    .cloned()
                    .collect(),
            ),
        }
    }

    #[test]
    fn a_diff_of_the_differing_parts_is_the_diff_of_the_whole_objects() {
        let base = json!({"apiVersion": "x/v1", "kind": "K",
            "metadata": {"name": "a", "labels": {"app": "x", "tier": "db"}, "annotations": {"n": "1"},
                "finalizers": ["f1"]},
            "spec": {"replicas": 3, "tolerations": [{"key": "k", "value": "v"}], "tls": {}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"}});
        let mut changes = Vec::new();
        let mut c = base.clone();
        c["metadata"]["annotations"]["n"] = json!("2");
        changes.push(c);
        let mut c = base.clone();
        c["status"]["phase"] = json!("Failed");
        c["status"]["conditions"][0]["status"] = json!("False");
        changes.push(c);
        let mut c = base.clone();
        c["spec"]["tolerations"] = json!([{"key": "other"}]);
        c["spec"]["version"] = json!("3.5.1");
        changes.push(c);
        let mut c = base.clone();
        c["metadata"].as_object_mut().unwrap().remove("labels");
        c["metadata"]["finalizers"] = json!(["f1", "f2"]);
        changes.push(c);
        let mut c = base.clone();
        c.as_object_mut().unwrap().remove("metadata");
        c["spec"] = json!(null);
        c["extra"] = json!({"a": [1, 2]});
        changes.push(c);
        changes.push(base.clone());
        changes.push(json!({}));
        let nothing = json!({});
        for new in &changes {
            // The last pair is a create's: nothing before (`diff`'s shortcut).
            for (old, new) in [(&base, new), (new, &base), (&nothing, new)] {
                for scope in [Scope::Main, Scope::Status] {
                    assert_eq!(
                        diff(old, new, scope),
                        whole_diff(old, new, scope),
                        "{old} -> {new}"
                    );
                }
            }
        }
    }

    fn set(paths: &[&[&str]]) -> FieldSet {
        FieldSet(
            paths
                .iter()
                .map(|p| p.iter().map(|s| (*s).to_string()).collect())
                .collect(),
        )
    }

    #[test]
    fn field_sets_skip_identity_metadata_and_status_and_key_lists() {
        let obj = json!({"apiVersion": "x/v1", "kind": "K",
            "metadata": {"name": "a", "namespace": "n", "uid": "u", "resourceVersion": "5",
                "labels": {"app": "x"}, "finalizers": ["f1"]},
            "spec": {"replicas": 3, "tls": {}, "tolerations": [{"key": "k"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let main = fields_of(&obj, Scope::Main);
        assert_eq!(
            main,
            set(&[
                &["f:metadata", "f:finalizers", "v:\"f1\""],
                &["f:metadata", "f:labels", "f:app"],
                &["f:spec", "f:replicas"],
                &["f:spec", "f:tls"],
                &["f:spec", "f:tolerations"],
            ])
        );
        let status = fields_of(&obj, Scope::Status);
        assert_eq!(
            status,
            set(&[
                &["f:status", "f:conditions", "k:{\"type\":\"Ready\"}"],
                &["f:status", "f:conditions", "k:{\"type\":\"Ready\"}", "f:status"],
                &["f:status", "f:conditions", "k:{\"type\":\"Ready\"}", "f:type"],
            ])
        );
        assert_eq!(
            status.to_fields_v1(),
            json!({"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}})
        );
    }

    #[test]
    fn fields_v1_round_trips() {
        let v = json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:replicas": {}, "f:x": {".": {}, "f:y": {}}}});
        let s = FieldSet::from_fields_v1(&v).unwrap();
        assert!(s.0.contains(&vec!["f:spec".to_string(), "f:x".to_string()]));
        assert_eq!(s.to_fields_v1(), v);
        assert!(FieldSet::from_fields_v1(&json!({"f:a": 1})).is_err());
    }

    #[test]
    fn diff_finds_modified_and_removed_fields() {
        let old = json!({"spec": {"replicas": 3, "version": "3.5.0", "x": 1}});
        let new = json!({"spec": {"replicas": 5, "version": "3.5.0", "y": 1}});
        let d = diff(&old, &new, Scope::Main);
        assert_eq!(d.modified, set(&[&["f:spec", "f:replicas"], &["f:spec", "f:y"]]));
        assert_eq!(d.removed, set(&[&["f:spec", "f:x"]]));
    }

    #[test]
    fn merging_an_applied_configuration_follows_list_semantics() {
        let live = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
            "spec": {"replicas": 3, "tolerations": [{"key": "a"}, {"key": "b"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "R"}]}});
        let applied = json!({"metadata": {"finalizers": ["b"], "labels": {"y": "2"}},
            "spec": {"tolerations": [{"key": "c"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "True"}]}});
        let merged = merge_applied(&live, &applied);
        assert_eq!(merged["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(merged["metadata"]["labels"], json!({"x": "1", "y": "2"}));
        assert_eq!(merged["spec"]["replicas"], 3);
        assert_eq!(merged["spec"]["tolerations"], json!([{"key": "c"}]));
        assert_eq!(
            merged["status"]["conditions"],
            json!([{"type": "Ready", "status": "True", "reason": "R"}, {"type": "Other", "status": "True"}])
        );
    }

    #[test]
    fn removing_fields_reaches_into_keyed_lists_and_sets() {
        let mut obj = json!({"metadata": {"finalizers": ["a", "b"]},
            "spec": {"replicas": 3, "version": "v"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "R"}]}});
        remove_fields(
            &mut obj,
            &set(&[
                &["f:metadata", "f:finalizers", "v:\"a\""],
                &["f:spec", "f:replicas"],
                &["f:status", "f:conditions", "k:{\"type\":\"Ready\"}", "f:reason"],
            ]),
        );
        assert_eq!(
            obj,
            json!({"metadata": {"finalizers": ["b"]}, "spec": {"version": "v"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        );
    }

    #[test]
    fn paths_print_as_kube_apiserver_prints_them() {
        assert_eq!(
            path_string(&vec!["f:spec".into(), "f:replicas".into()]),
            ".spec.replicas"
        );
        assert_eq!(
            path_string(&vec![
                "f:status".into(),
                "f:conditions".into(),
                "k:{\"type\":\"Ready\"}".into()
            ]),
            ".status.conditions[type=\"Ready\"]"
        );
        assert_eq!(
            path_string(&vec![
                "f:metadata".into(),
                "f:finalizers".into(),
                "v:\"x\"".into()
            ]),
            ".metadata.finalizers[=\"x\"]"
        );
    }

    fn writer<'a>(manager: &'a str, operation: Operation) -> Writer<'a> {
        Writer {
            manager,
            operation,
            api_version: "g/v2",
            subresource: None,
            time: "2026-01-01T00:00:00Z",
        }
    }

    fn changes(old: &Value, new: &Value) -> BTreeMap<String, Change> {
        BTreeMap::from([("g/v2".to_string(), diff(old, new, Scope::Main))])
    }

    #[test]
    fn updates_take_the_fields_they_change_from_other_managers() {
        let v0 = json!({});
        let v1 = json!({"spec": {"replicas": 3, "version": "3.5.0"}});
        let e = record(
            Vec::new(),
            &writer("create", Operation::Update),
            None,
            &changes(&v0, &v1),
            false,
        )
        .unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(
            e[0].fields,
            set(&[&["f:spec", "f:replicas"], &["f:spec", "f:version"]])
        );
        let v2 = json!({"spec": {"replicas": 5, "version": "3.5.0"}});
        let e = record(
            e,
            &writer("scaler", Operation::Update),
            None,
            &changes(&v1, &v2),
            false,
        )
        .unwrap();
        assert_eq!(e[0].fields, set(&[&["f:spec", "f:version"]]));
        assert_eq!(e[1].fields, set(&[&["f:spec", "f:replicas"]]));
        // Nothing changed: no entry, no time moved.
        let again = record(
            e.clone(),
            &writer("scaler", Operation::Update),
            None,
            &changes(&v2, &v2),
            false,
        )
        .unwrap();
        assert_eq!(again, e);
        // Removing every field of a manager drops its entry.
        let v3 = json!({"spec": {"replicas": 5}});
        let e = record(
            e,
            &writer("scaler", Operation::Update),
            None,
            &changes(&v2, &v3),
            false,
        )
        .unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].manager, "scaler");
    }

    #[test]
    fn apply_conflicts_with_other_managers_unless_forced() {
        let live = json!({"spec": {"replicas": 3}});
        let a = record(
            Vec::new(),
            &writer("a", Operation::Apply),
            Some(&fields_of(&live, Scope::Main)),
            &changes(&json!({}), &live),
            false,
        )
        .unwrap();
        let new = json!({"spec": {"replicas": 5}});
        let applied = fields_of(&new, Scope::Main);
        let err = record(
            a.clone(),
            &writer("b", Operation::Apply),
            Some(&applied),
            &changes(&live, &new),
            false,
        )
        .unwrap_err();
        assert_eq!(
            err,
            [Conflict {
                manager: "\"a\"".into(),
                field: ".spec.replicas".into()
            }]
        );
        assert_eq!(
            conflict_message(&err),
            "Apply failed with 1 conflict: conflict with \"a\": .spec.replicas"
        );
        // Same value: shared ownership, no conflict.
        let shared = record(
            a.clone(),
            &writer("b", Operation::Apply),
            Some(&fields_of(&live, Scope::Main)),
            &changes(&live, &live),
            false,
        )
        .unwrap();
        assert_eq!(shared.len(), 2);
        // Forced: b takes the field, a's entry is gone.
        let forced = record(
            a,
            &writer("b", Operation::Apply),
            Some(&applied),
            &changes(&live, &new),
            true,
        )
        .unwrap();
        assert_eq!(forced.len(), 1);
        assert_eq!(forced[0].manager, "b");
        assert_eq!(
            forced[0].to_json()["fieldsV1"],
            json!({"f:spec": {"f:replicas": {}}})
        );
        assert_eq!(forced[0].to_json()["operation"], "Apply");
    }

    #[test]
    fn update_managers_are_named_with_version_and_time_in_conflicts() {
        let e = Entry {
            manager: "kubectl-edit".into(),
            operation: Operation::Update,
            api_version: "g/v2".into(),
            time: Some("2026-01-01T00:00:00Z".into()),
            subresource: Some("status".into()),
            fields: FieldSet::default(),
        };
        assert_eq!(
            e.describe(),
            "\"kubectl-edit\" with subresource \"status\" using g/v2 at 2026-01-01T00:00:00Z"
        );
        let many = [
            Conflict {
                manager: "\"b\"".into(),
                field: ".spec.x".into(),
            },
            Conflict {
                manager: "\"a\"".into(),
                field: ".spec.y".into(),
            },
        ];
        assert_eq!(
            conflict_message(&many),
            "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.y\nconflicts with \"b\":\n- .spec.x"
        );
    }

    #[test]
    fn fields_an_applier_stops_applying_are_dropped_unless_another_owns_them() {
        let previous = set(&[
            &["f:spec", "f:replicas"],
            &["f:spec", "f:version"],
            &["f:spec", "f:x"],
        ]);
        let applied = set(&[&["f:spec", "f:replicas"]]);
        let others = set(&[&["f:spec", "f:x"]]);
        assert_eq!(
            dropped_fields(&previous, &applied, &others),
            set(&[&["f:spec", "f:version"]])
        );
        // An item another manager owns a field of is kept.
        let previous = set(&[&["f:status", "f:conditions", "k:{\"type\":\"A\"}"]]);
        let others = set(&[&["f:status", "f:conditions", "k:{\"type\":\"A\"}", "f:reason"]]);
        assert!(dropped_fields(&previous, &FieldSet::default(), &others).is_empty());
    }

    /// [`FieldSet::to_fields_v1`] as it was: a scan of the whole set for every path.
    fn fields_v1_by_scans(set: &FieldSet) -> Value {
        let mut root = Map::new();
        for path in &set.0 {
            let mut node = &mut root;
            for (i, el) in path.iter().enumerate() {
                let entry = node.entry(el.clone()).or_insert_with(|| json!({}));
                let Value::Object(child) = entry else {
                    break;
                };
                let prefix: Path = path[..=i].to_vec();
                let is_last = i + 1 == path.len();
                if (is_last
                    && set
                        .0
                        .iter()
                        .any(|p| p.len() > prefix.len() && p.starts_with(&prefix)))
                    || (!is_last && set.0.contains(&prefix))
                {
                    child.insert(".".into(), json!({}));
                }
                node = child;
            }
        }
        Value::Object(root)
    }

    /// A deterministic pseudo-random field set: paths of 1 to 4 elements over a small alphabet,
    /// so that many paths are prefixes of others.
    fn scrambled_set(seed: u64, n: usize) -> FieldSet {
        let mut x = seed;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as usize
        };
        let elements = ["f:a", "f:b", "f:c", "k:{\"name\":\"m\"}", "v:\"x\"", "f:spec"];
        FieldSet(
            (0..n)
                .map(|_| {
                    let len = 1 + next() % 4;
                    (0..len)
                        .map(|_| elements[next() % elements.len()].to_string())
                        .collect()
                })
                .collect(),
        )
    }

    /// `metadata.labels` of `n` labels, plus `spec.replicas`, as field paths.
    fn labels_set(n: usize, from: usize) -> FieldSet {
        let mut set: BTreeSet<Path> = (from..from + n)
            .map(|i| vec!["f:metadata".into(), "f:labels".into(), format!("f:k{i:07}")])
            .collect();
        set.insert(vec!["f:spec".into(), "f:replicas".into()]);
        FieldSet(set)
    }

    #[test]
    fn fields_v1_is_built_in_one_pass_with_the_same_result() {
        for seed in 0..50 {
            let set = scrambled_set(seed, 40);
            assert_eq!(set.to_fields_v1(), fields_v1_by_scans(&set), "{:?}", set.0);
            assert_eq!(FieldSet::from_fields_v1(&set.to_fields_v1()).unwrap(), set);
        }
        work::assert_linear(2_000, |n| {
            labels_set(n, 0).to_fields_v1();
        });
    }

    #[test]
    fn has_under_is_a_lookup_with_the_same_answer_as_a_scan() {
        for seed in 0..50 {
            let set = scrambled_set(seed, 30);
            for probe in scrambled_set(seed + 1_000, 30).0.iter().chain(&set.0) {
                assert_eq!(
                    set.has_under(probe),
                    set.0.iter().any(|p| p.starts_with(probe)),
                    "{probe:?} in {:?}",
                    set.0
                );
            }
        }
        // An applier that stopped applying half of many labels another manager owns a quarter of.
        work::assert_linear(2_000, |n| {
            let previous = labels_set(n, 0);
            let applied = labels_set(n / 2, 0);
            let others = labels_set(n / 4, n / 2);
            let dropped = dropped_fields(&previous, &applied, &others);
            assert_eq!(dropped.0.len(), n - n / 2 - n / 4);
        });
    }

    /// [`merge_applied`]'s lists as they were: a scan of the list for every applied item.
    fn merge_lists_by_scans(l: &[Value], a: &[Value], keys: Option<&[&str]>) -> Vec<Value> {
        let mut out = l.to_vec();
        for item in a {
            match keys {
                None if !out.contains(item) => out.push(item.clone()),
                None => {}
                Some(keys) => {
                    let key = key_element(item, keys);
                    match out
                        .iter_mut()
                        .find(|o| key.is_some() && key_element(o, keys) == key)
                    {
                        Some(existing) => *existing = merge_applied(existing, item),
                        None => out.push(item.clone()),
                    }
                }
            }
        }
        out
    }

    fn huge_lists(n: usize) -> (Value, Value) {
        let live = json!({"metadata": {
                "finalizers": (0..n).map(|i| format!("f{i}")).collect::<Vec<_>>(),
                "ownerReferences": (0..n).map(|i| json!({"uid": format!("u{i}"), "name": "a"})).collect::<Vec<_>>()}});
        let applied = json!({"metadata": {
                "finalizers": (n / 2..n + n / 2).map(|i| format!("f{i}")).collect::<Vec<_>>(),
                "ownerReferences": (n / 2..n + n / 2).map(|i| json!({"uid": format!("u{i}"), "name": "b"})).collect::<Vec<_>>()}});
        (live, applied)
    }

    #[test]
    fn applied_sets_and_keyed_lists_merge_through_an_index_with_the_same_result() {
        let l = vec![json!("a"), json!("b"), json!("a"), json!(1), json!({"x": [1]})];
        let a = vec![
            json!("c"),
            json!("a"),
            json!("c"),
            json!(1.0),
            json!({"x": [1]}),
            json!(1),
        ];
        let live = json!({"metadata": {"finalizers": l.clone()}});
        let applied = json!({"metadata": {"finalizers": a.clone()}});
        assert_eq!(
            merge_applied(&live, &applied)["metadata"]["finalizers"],
            json!(merge_lists_by_scans(&l, &a, None))
        );
        let keys: &[&str] = &["type"];
        let l = vec![
            json!({"type": "A", "status": "1"}),
            json!({"status": "no key"}),
            json!({"type": "A", "status": "second A"}),
            json!({"type": null, "status": "null key"}),
        ];
        let a = vec![
            json!({"type": "A", "reason": "r"}),
            json!({"type": "B", "status": "new"}),
            json!({"type": "B", "reason": "merged into the new B"}),
            json!({"status": "no key either"}),
            json!({"type": null, "reason": "n"}),
        ];
        let live = json!({"status": {"conditions": l.clone()}});
        let applied = json!({"status": {"conditions": a.clone()}});
        assert_eq!(
            merge_applied(&live, &applied)["status"]["conditions"],
            json!(merge_lists_by_scans(&l, &a, Some(keys)))
        );
        work::assert_linear(1_000, |n| {
            let (live, applied) = huge_lists(n);
            let merged = merge_applied(&live, &applied);
            assert_eq!(
                merged["metadata"]["finalizers"].as_array().map(Vec::len),
                Some(n + n / 2)
            );
        });
    }

    #[test]
    fn removing_many_list_items_is_one_pass_over_the_list() {
        // Items named in their canonical spelling or not, an item kept because the path goes
        // below it, a `k:` that is not this list's key (it names no item, as in
        // structured-merge-diff), and duplicates (all go).
        let mut obj = json!({"metadata": {"finalizers": ["a", "b", "a", "c"],
                "ownerReferences": [{"uid": "1", "name": "x"}, {"uid": "2", "name": "y", "kind": "K"},
                    {"uid": "3"}]},
            "status": {"conditions": [{"type": "A", "reason": "r"}, {"type": "B", "reason": "r"}]}});
        remove_fields(
            &mut obj,
            &set(&[
                &["f:metadata", "f:finalizers", "v:\"a\""],
                &["f:metadata", "f:finalizers", "v: \"c\""],
                &["f:metadata", "f:ownerReferences", "k:{\"uid\":\"1\"}"],
                &[
                    "f:metadata",
                    "f:ownerReferences",
                    "k:{ \"uid\": \"2\" }",
                    "f:kind",
                ],
                &["f:metadata", "f:ownerReferences", "k:{\"name\":\"y\"}"],
                &["f:status", "f:conditions", "k:{\"type\":\"B\"}"],
                &["f:status", "f:conditions", "k:{\"type\":\"B\"}", "f:reason"],
                &["f:status", "f:conditions", "k:{\"type\":\"A\"}", "f:reason"],
                &["f:status", "f:missing", "f:x"],
            ]),
        );
        assert_eq!(
            obj,
            json!({"metadata": {"finalizers": ["b"],
                    "ownerReferences": [{"uid": "2", "name": "y"}, {"uid": "3"}]},
                "status": {"conditions": [{"type": "A"}]}})
        );
        work::assert_linear(1_000, |n| {
            let (mut live, _) = huge_lists(n);
            let gone = FieldSet(
                (0..n)
                    .step_by(2)
                    .flat_map(|i| {
                        [
                            vec!["f:metadata".into(), "f:finalizers".into(), format!("v:\"f{i}\"")],
                            vec![
                                "f:metadata".into(),
                                "f:ownerReferences".into(),
                                format!("k:{{\"uid\":\"u{i}\"}}"),
                            ],
                        ]
                    })
                    .collect(),
            );
            remove_fields(&mut live, &gone);
            assert_eq!(
                live["metadata"]["finalizers"].as_array().map(Vec::len),
                Some(n / 2)
            );
        });
    }

    #[test]
    fn managed_fields_decode_and_reset() {
        let v = json!([{"manager": "m", "operation": "Update", "apiVersion": "g/v2", "time": "t",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]);
        let e = decode_entries(Some(&v)).unwrap();
        assert_eq!(encode_entries(&e), v);
        assert!(decode_entries(Some(&json!([{}]))).unwrap().is_empty());
        assert!(decode_entries(Some(&json!([{"operation": "Merge"}]))).is_err());
        assert!(decode_entries(Some(&json!([1]))).is_err());
    }
}
