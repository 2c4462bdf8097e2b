//! OpenAPI documents generated from the types: v3 per group-version (what `kubectl explain` and
//! `kubectl apply` read) and one v2 document (the aggregator's optional fallback).
//!
//! Schemas come from `schemars` (field doc comments become descriptions; Kubernetes types bring
//! their own schemas, named `io.k8s....`). Our types are named `dev.operator.etcd.<version>.<Type>`.
//! Following the contract (section 1.4): every operation carries `x-kubernetes-group-version-kind`
//! as a single object and `x-kubernetes-action`; the top-level schemas carry it as a list; PATCH
//! accepts JSON patch, merge patch and apply patch (server-side apply, with its `force`
//! parameter; `/scale` takes no apply patch). Strategic merge patch is served but deliberately
//! not listed: kubectl's client-side apply picks strategic merge when the document lists it and
//! then needs per-field patch metadata these types do not carry, so it keeps using the 3-way JSON
//! merge patch, as for CRDs (`kubectl patch` sends strategic merge without reading the document).
//! Writes advertise the `fieldValidation` query parameter. The v3 documents are checked by parsing them into
//! [`openapiv3::OpenAPI`].
//!
//! The committed copies live in `openapi/` at the workspace root; regenerate them with
//! `UPDATE_OPENAPI=1 cargo test -p etcd-operator-api --test openapi`.

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::{GROUP, KIND, LIST_KIND, RESOURCE, v1alpha1, v1alpha2};

/// Why a document could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum OpenApiError {
    /// The version is not served.
    #[error("version {0:?} is not served")]
    UnknownVersion(String),
    /// The generated document does not parse as OpenAPI 3.
    #[error("generated document is not valid OpenAPI 3")]
    Invalid(#[from] serde_json::Error),
}

const REF_PREFIX: &str = "#/components/schemas/";
const SCALE: &str = "io.k8s.api.autoscaling.v1.Scale";
const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";

/// The schema name of a type of this API in the given version, e.g.
/// `dev.operator.etcd.v1alpha2.EtcdCluster`.
pub fn schema_name(version: &str, type_name: &str) -> String {
    let reversed: Vec<&str> = GROUP.split('.').rev().collect();
    format!("{}.{version}.{type_name}", reversed.join("."))
}

/// The component schemas of a version: our types, renamed, and the Kubernetes types they use.
pub fn schemas(version: &str) -> Result<Map<String, Value>, OpenApiError> {
    let settings = SchemaSettings::draft07().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
        s.transforms = Vec::new();
    });
    let mut generator = settings.into_generator();
    match version {
        v1alpha1::VERSION => {
            generator.subschema_for::<v1alpha1::EtcdCluster>();
            generator.subschema_for::<v1alpha1::EtcdClusterList>();
        }
        v1alpha2::VERSION => {
            generator.subschema_for::<v1alpha2::EtcdCluster>();
            generator.subschema_for::<v1alpha2::EtcdClusterList>();
            generator.subschema_for::<crate::backup::EtcdBackup>();
            generator.subschema_for::<crate::backup::EtcdBackupList>();
        }
        other => return Err(OpenApiError::UnknownVersion(other.to_owned())),
    }
    generator.subschema_for::<k8s_openapi::api::autoscaling::v1::Scale>();
    generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>();
    generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions>();
    let definitions = generator.take_definitions(true);

    let ours = schema_name(version, "");
    let rename = |name: &str| {
        if name.starts_with("io.k8s.") || name.starts_with(&ours) {
            name.to_owned()
        } else {
            schema_name(version, name)
        }
    };
    let mut out = Map::new();
    for (name, mut schema) in definitions {
        normalize(&mut schema, &|r: &str| {
            r.strip_prefix(REF_PREFIX)
                .map(|n| format!("{REF_PREFIX}{}", rename(n)))
                .unwrap_or_else(|| r.to_owned())
        });
        if !name.starts_with("io.k8s.") {
            unwrap_descriptions(&mut schema);
        }
        out.insert(rename(&name), schema);
    }
    let gvk = |group: &str, version: &str, kind: &str| json!([{ "group": group, "kind": kind, "version": version }]);
    let tags: [(String, Value); 7] = [
        (schema_name(version, KIND), gvk(GROUP, version, KIND)),
        (schema_name(version, LIST_KIND), gvk(GROUP, version, LIST_KIND)),
        (
            schema_name(version, crate::backup::KIND),
            gvk(GROUP, version, crate::backup::KIND),
        ),
        (
            schema_name(version, crate::backup::LIST_KIND),
            gvk(GROUP, version, crate::backup::LIST_KIND),
        ),
        (SCALE.to_owned(), gvk("autoscaling", "v1", "Scale")),
        (STATUS.to_owned(), gvk("", "v1", "Status")),
        (DELETE_OPTIONS.to_owned(), gvk("", "v1", "DeleteOptions")),
    ];
    for (name, tag) in tags {
        if let Some(Value::Object(schema)) = out.get_mut(&name) {
            schema.insert("x-kubernetes-group-version-kind".to_owned(), tag);
        }
    }
    out.insert(
        PATCH.to_owned(),
        json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}),
    );
    out.insert(
        WATCH_EVENT.to_owned(),
        json!({
            "type": "object",
            "description": "Event represents a single event to a watched resource.",
            "required": ["type", "object"],
            "properties": {
                "type": {"type": "string", "description": "ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."},
                "object": {"type": "object", "description": "The object (or a Status for ERROR)."}
            }
        }),
    );
    Ok(out)
}

/// Rewrites schemars output into the form Kubernetes publishes: no `null` alternatives for
/// optional fields, `$ref` siblings moved next to an `allOf`, `const` as a one-value `enum`.
fn normalize(value: &mut Value, rename_ref: &dyn Fn(&str) -> String) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(|v| normalize(v, rename_ref)),
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get("type") {
                let non_null: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if let [single] = non_null.as_slice() {
                    map.insert("type".to_owned(), single.clone());
                }
            }
            for key in ["anyOf", "oneOf"] {
                let replacement = match map.get(key) {
                    Some(Value::Array(options)) => {
                        let non_null: Vec<&Value> = options
                            .iter()
                            .filter(|o| o.get("type") != Some(&json!("null")))
                            .collect();
                        match non_null.as_slice() {
                            [single] if options.len() == 2 => Some((*single).clone()),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                if let Some(Value::Object(inner)) = replacement {
                    map.remove(key);
                    for (k, v) in inner {
                        map.entry(k).or_insert(v);
                    }
                }
            }
            if let Some(Value::Array(values)) = map.get_mut("enum") {
                values.retain(|v| !v.is_null());
            }
            if let Some(constant) = map.remove("const") {
                map.insert("enum".to_owned(), json!([constant]));
            }
            if let Some(Value::String(target)) = map.get("$ref").cloned() {
                let target = rename_ref(&target);
                if map.len() > 1 {
                    map.remove("$ref");
                    map.insert("allOf".to_owned(), json!([{ "$ref": target }]));
                } else {
                    map.insert("$ref".to_owned(), Value::String(target));
                }
            }
            map.values_mut().for_each(|v| normalize(v, rename_ref));
        }
        _ => {}
    }
}

/// Joins the hard-wrapped lines of doc comments into paragraphs, as Kubernetes descriptions are.
fn unwrap_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    Value::String(text) if key == "description" => {
                        let paragraphs: Vec<String> = text
                            .split("\n\n")
                            .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
                            .collect();
                        *text = paragraphs.join("\n\n");
                    }
                    other => unwrap_descriptions(other),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(unwrap_descriptions),
        _ => {}
    }
}

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("{REF_PREFIX}{name}") })
}

fn query(name: &str, kind: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": kind}, "uniqueItems": true})
}

fn list_parameters() -> Vec<Value> {
    vec![
        query(
            "allowWatchBookmarks",
            "boolean",
            "Request watch events with type BOOKMARK.",
        ),
        query(
            "continue",
            "string",
            "The continue token of the previous page of a paginated list.",
        ),
        query(
            "fieldSelector",
            "string",
            "A selector restricting the returned objects by their fields.",
        ),
        query(
            "labelSelector",
            "string",
            "A selector restricting the returned objects by their labels.",
        ),
        query(
            "limit",
            "integer",
            "The maximum number of objects to return in one page.",
        ),
        query(
            "resourceVersion",
            "string",
            "Constrains which resource versions the request may be served from.",
        ),
        query(
            "resourceVersionMatch",
            "string",
            "How resourceVersion is applied: Exact or NotOlderThan.",
        ),
        query(
            "sendInitialEvents",
            "boolean",
            "With watch=true, start the watch with synthetic events for the current state.",
        ),
        query("timeoutSeconds", "integer", "Timeout of the list or watch call."),
        query(
            "watch",
            "boolean",
            "Watch for changes and return them as a stream of add, update and remove notifications.",
        ),
    ]
}

/// The query parameters of a PATCH: those of writes and, where apply patches are accepted,
/// `force`.
fn patch_parameters(apply: bool) -> Vec<Value> {
    let mut params = write_parameters();
    if apply {
        params.push(query(
            "force",
            "boolean",
            "Force is going to \"force\" Apply requests: re-acquire conflicting fields owned by other managers. Only for apply patches.",
        ));
    }
    params
}

/// The query parameters of writes.
fn write_parameters() -> Vec<Value> {
    vec![
        query(
            "dryRun",
            "string",
            "When present (value All), the modifications are not persisted.",
        ),
        query(
            "fieldManager",
            "string",
            "The name of the actor making the change.",
        ),
        query(
            "fieldValidation",
            "string",
            "How the server handles unknown and duplicate fields: Ignore, Warn (default) or Strict.",
        ),
    ]
}

fn delete_parameters() -> Vec<Value> {
    vec![
        query(
            "dryRun",
            "string",
            "When present (value All), the deletion is not persisted.",
        ),
        query(
            "gracePeriodSeconds",
            "integer",
            "Seconds before the object is deleted.",
        ),
        query(
            "propagationPolicy",
            "string",
            "Garbage collection of dependents: Orphan, Background or Foreground.",
        ),
    ]
}

fn path_parameter(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": description, "schema": {"type": "string"}, "uniqueItems": true})
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema.clone() }, "application/yaml": { "schema": schema } })
}

struct Op<'a> {
    action: &'a str,
    id: String,
    description: String,
    gvk: (&'a str, &'a str, &'a str),
    parameters: Vec<Value>,
    body: Option<Value>,
    response: Value,
    created: bool,
}

fn operation(op: Op<'_>) -> Value {
    let (group, version, kind) = op.gvk;
    let mut responses = Map::new();
    responses.insert(
        "200".to_owned(),
        json!({"description": "OK", "content": json_content(op.response.clone())}),
    );
    if op.created {
        responses.insert(
            "201".to_owned(),
            json!({"description": "Created", "content": json_content(op.response.clone())}),
        );
    }
    responses.insert("401".to_owned(), json!({"description": "Unauthorized"}));
    let mut out = json!({
        "operationId": op.id,
        "description": op.description,
        "tags": [format!("{}_{version}", camel_group())],
        "parameters": op.parameters,
        "responses": responses,
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": kind},
    });
    if let (Some(body), Value::Object(map)) = (op.body, &mut out) {
        map.insert("requestBody".to_owned(), body);
    }
    out
}

fn camel_group() -> String {
    GROUP
        .split('.')
        .enumerate()
        .map(|(i, part)| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) if i > 0 => first.to_uppercase().chain(chars).collect(),
                Some(first) => std::iter::once(first).chain(chars).collect(),
                None => String::new(),
            }
        })
        .collect()
}

/// The resources of a version, with what each one serves.
fn resources(version: &str) -> Vec<PathResource> {
    let mut out = vec![PathResource {
        kind: KIND,
        list_kind: LIST_KIND,
        resource: RESOURCE,
        scale: true,
        snapshot: true,
    }];
    if version == crate::backup::VERSION {
        out.push(PathResource {
            kind: crate::backup::KIND,
            list_kind: crate::backup::LIST_KIND,
            resource: crate::backup::RESOURCE,
            scale: false,
            snapshot: false,
        });
    }
    out
}

/// One resource in [`paths`].
#[derive(Clone, Copy)]
struct PathResource {
    kind: &'static str,
    list_kind: &'static str,
    resource: &'static str,
    scale: bool,
    snapshot: bool,
}

fn paths(version: &str) -> Value {
    let mut out = Map::new();
    for r in resources(version) {
        if let Value::Object(map) = resource_paths(version, r) {
            out.extend(map);
        }
    }
    Value::Object(out)
}

fn resource_paths(version: &str, r: PathResource) -> Value {
    let PathResource {
        kind,
        list_kind,
        resource,
        ..
    } = r;
    let object = reference(&schema_name(version, kind));
    let list = reference(&schema_name(version, list_kind));
    let ident = format!("{}{}", upper_first(&camel_group()), upper_first(version));
    let gvk = (GROUP, version, kind);
    let scale_gvk = ("autoscaling", "v1", "Scale");
    let body = |schema: Value| json!({"required": true, "content": {"application/json": {"schema": schema.clone()}, "application/yaml": {"schema": schema}}});
    let scale_patch_body = json!({"required": true, "content": {
        "application/json-patch+json": {"schema": reference(PATCH)},
        "application/merge-patch+json": {"schema": reference(PATCH)}
    }});
    let patch_body = json!({"required": true, "content": {
        "application/json-patch+json": {"schema": reference(PATCH)},
        "application/merge-patch+json": {"schema": reference(PATCH)},
        "application/apply-patch+yaml": {"schema": reference(PATCH)}
    }});
    let base = format!("/apis/{GROUP}/{version}");
    let namespaced = format!("{base}/namespaces/{{namespace}}/{resource}");
    let pretty = query("pretty", "string", "If 'true', the output is pretty printed.");
    let namespace = path_parameter(
        "namespace",
        "object name and auth scope, such as for teams and projects",
    );
    let name = path_parameter("name", &format!("name of the {kind}"));

    let op = |action: &str,
              id: String,
              description: String,
              parameters: Vec<Value>,
              body: Option<Value>,
              response: Value,
              created: bool| {
        operation(Op {
            action,
            id,
            description,
            gvk,
            parameters,
            body,
            response,
            created,
        })
    };
    let mut collection = json!({
        "get": op("list", format!("list{ident}Namespaced{kind}"), format!("list or watch objects of kind {kind}"), list_parameters(), None, list.clone(), false),
        "post": op("post", format!("create{ident}Namespaced{kind}"), format!("create {}", article(kind)), write_parameters(), Some(body(object.clone())), object.clone(), true),
        "delete": op("deletecollection", format!("deleteCollection{ident}Namespaced{kind}"), format!("delete collection of {kind}"), [list_parameters(), delete_parameters()].concat(), Some(body(reference(DELETE_OPTIONS))), reference(STATUS), false),
    });
    let item_ops = |suffix: &str, what: &str, response: &Value, gvk| {
        let apply = suffix != "Scale";
        item_operations(ItemOps {
            kind,
            ident: &ident,
            suffix,
            what,
            response,
            gvk,
            body: &body,
            patch_body: if apply { &patch_body } else { &scale_patch_body },
            apply,
        })
    };
    let mut item = item_ops("", "the state", &object, gvk);
    if let Value::Object(map) = &mut item {
        map.insert(
            "delete".to_owned(),
            op(
                "delete",
                format!("delete{ident}Namespaced{kind}"),
                format!("delete {}", article(kind)),
                delete_parameters(),
                Some(body(reference(DELETE_OPTIONS))),
                reference(STATUS),
                false,
            ),
        );
    }
    let mut status = item_ops("Status", "status", &object, gvk);
    let mut scale = item_ops("Scale", "scale", &reference(SCALE), scale_gvk);
    let mut snapshot = json!({
        "get": {
            "operationId": format!("read{ident}Namespaced{kind}Snapshot"),
            "description": format!("stream a fresh etcd snapshot (the bbolt database file) of the specified {kind}"),
            "tags": [format!("{}_{version}", camel_group())],
            "responses": {
                "200": {"description": "OK", "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                "401": {"description": "Unauthorized"},
            },
            "x-kubernetes-action": "get",
            "x-kubernetes-group-version-kind": {"group": GROUP, "version": version, "kind": kind},
        }
    });
    for (value, params) in [
        (&mut collection, vec![namespace.clone(), pretty.clone()]),
        (&mut item, vec![name.clone(), namespace.clone(), pretty.clone()]),
        (&mut status, vec![name.clone(), namespace.clone(), pretty.clone()]),
        (&mut scale, vec![name.clone(), namespace.clone(), pretty.clone()]),
        (&mut snapshot, vec![name.clone(), namespace.clone()]),
    ] {
        if let Value::Object(map) = value {
            map.insert("parameters".to_owned(), Value::Array(params));
        }
    }
    let all = json!({
        "get": op("list", format!("list{ident}{kind}ForAllNamespaces"), format!("list or watch objects of kind {kind} in all namespaces"), list_parameters(), None, list, false),
        "parameters": [pretty],
    });
    let mut out = json!({
        format!("{base}/{resource}"): all,
        namespaced.clone(): collection,
        format!("{namespaced}/{{name}}"): item,
        format!("{namespaced}/{{name}}/status"): status,
    });
    if let Value::Object(map) = &mut out {
        if r.scale {
            map.insert(format!("{namespaced}/{{name}}/scale"), scale);
        }
        if r.snapshot {
            map.insert(format!("{namespaced}/{{name}}/snapshot"), snapshot);
        }
    }
    out
}

/// `a`/`an` and the kind, as descriptions read.
fn article(kind: &str) -> String {
    if kind.starts_with(['A', 'E', 'I', 'O', 'U']) {
        format!("an {kind}")
    } else {
        format!("a {kind}")
    }
}

struct ItemOps<'a> {
    kind: &'a str,
    ident: &'a str,
    suffix: &'a str,
    what: &'a str,
    response: &'a Value,
    gvk: (&'a str, &'a str, &'a str),
    body: &'a dyn Fn(Value) -> Value,
    patch_body: &'a Value,
    apply: bool,
}

/// get/put/patch of one object or of one of its subresources.
fn item_operations(ops: ItemOps<'_>) -> Value {
    let mk = |action: &str, verb: &str, parameters: Vec<Value>, body: Option<Value>| {
        operation(Op {
            action,
            id: format!("{verb}{}Namespaced{}{}", ops.ident, ops.kind, ops.suffix),
            description: format!("{verb} {} of the specified {}", ops.what, ops.kind),
            gvk: ops.gvk,
            parameters,
            body,
            response: ops.response.clone(),
            created: action == "put",
        })
    };
    json!({
        "get": mk("get", "read", vec![], None),
        "put": mk("put", "replace", write_parameters(), Some((ops.body)(ops.response.clone()))),
        "patch": mk("patch", "patch", patch_parameters(ops.apply), Some(ops.patch_body.clone())),
    })
}

fn upper_first(s: &str) -> String {
    let mut chars = s.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The OpenAPI v3 document of one group-version (`/openapi/v3/apis/etcd.operator.dev/<version>`).
pub fn v3_document(version: &str) -> Result<openapiv3::OpenAPI, OpenApiError> {
    let document = json!({
        "openapi": "3.0.0",
        "info": {"title": "etcd-operator", "version": format!("{GROUP}/{version}")},
        "paths": paths(version),
        "components": {"schemas": schemas(version)?},
    });
    Ok(serde_json::from_value(document)?)
}

/// [`v3_document`] as pretty JSON with a trailing newline, as committed under `openapi/`.
pub fn v3_json(version: &str) -> Result<String, OpenApiError> {
    Ok(format!(
        "{}\n",
        serde_json::to_string_pretty(&v3_document(version)?)?
    ))
}

/// The OpenAPI v2 document (`/openapi/v2`) covering both versions, derived from the v3 documents:
/// `definitions` instead of `components.schemas`, body parameters, `consumes`/`produces`.
pub fn v2_document() -> Result<Value, OpenApiError> {
    let mut definitions = Map::new();
    let mut paths = Map::new();
    for version in crate::SERVED_VERSIONS.iter().rev() {
        let mut v3 = serde_json::to_value(v3_document(version)?)?;
        rewrite_refs(&mut v3);
        if let Some(Value::Object(schemas)) = v3.pointer_mut("/components/schemas").map(Value::take) {
            definitions.extend(schemas);
        }
        if let Some(Value::Object(v3_paths)) = v3.get_mut("paths").map(Value::take) {
            for (path, item) in v3_paths {
                paths.insert(path, v2_path_item(item));
            }
        }
    }
    Ok(json!({
        "swagger": "2.0",
        "info": {"title": "etcd-operator", "version": GROUP},
        "paths": paths,
        "definitions": definitions,
    }))
}

/// [`v2_document`] as pretty JSON with a trailing newline.
pub fn v2_json() -> Result<String, OpenApiError> {
    Ok(format!("{}\n", serde_json::to_string_pretty(&v2_document()?)?))
}

/// Every committed file: its path relative to `openapi/` and its contents.
pub fn files() -> Result<Vec<(String, String)>, OpenApiError> {
    let mut out = Vec::new();
    for version in crate::SERVED_VERSIONS.iter().rev() {
        out.push((format!("v3/apis/{GROUP}/{version}.json"), v3_json(version)?));
    }
    out.push(("v2.json".to_owned(), v2_json()?));
    Ok(out)
}

fn rewrite_refs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get_mut("$ref")
                && let Some(name) = target.strip_prefix(REF_PREFIX)
            {
                *target = format!("#/definitions/{name}");
            }
            map.values_mut().for_each(rewrite_refs);
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

fn v2_parameter(mut parameter: Value) -> Value {
    if let Value::Object(map) = &mut parameter
        && let Some(Value::Object(schema)) = map.remove("schema")
    {
        map.extend(schema);
    }
    parameter
}

fn v2_path_item(item: Value) -> Value {
    let Value::Object(item) = item else { return item };
    let mut out = Map::new();
    for (key, value) in item {
        if key == "parameters" {
            let params = value
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(v2_parameter)
                .collect();
            out.insert(key, Value::Array(params));
            continue;
        }
        let Value::Object(mut op) = value else { continue };
        let mut parameters: Vec<Value> = op
            .remove("parameters")
            .and_then(|p| p.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .map(v2_parameter)
            .collect();
        let mut consumes = Vec::new();
        if let Some(body) = op.remove("requestBody") {
            let content = body
                .get("content")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            consumes = content.keys().cloned().collect();
            let schema = content
                .values()
                .next()
                .and_then(|c| c.get("schema"))
                .cloned()
                .unwrap_or(json!({}));
            parameters.insert(
                0,
                json!({"name": "body", "in": "body", "required": true, "schema": schema}),
            );
        }
        if let Some(Value::Object(responses)) = op.get_mut("responses") {
            for response in responses.values_mut() {
                let schema = response.pointer("/content/application~1json/schema").cloned();
                if let Value::Object(r) = response {
                    r.remove("content");
                    if let Some(schema) = schema {
                        r.insert("schema".to_owned(), schema);
                    }
                }
            }
        }
        op.insert("parameters".to_owned(), Value::Array(parameters));
        if !consumes.is_empty() {
            op.insert("consumes".to_owned(), json!(consumes));
        }
        op.insert(
            "produces".to_owned(),
            json!(["application/json", "application/yaml"]),
        );
        op.insert("schemes".to_owned(), json!(["https"]));
        out.insert(key, Value::Object(op));
    }
    Value::Object(out)
}
