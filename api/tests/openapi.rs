//! The committed OpenAPI documents under `openapi/` are exactly what the code generates, and
//! they carry what `kubectl explain` needs.
//!
//! Regenerate with: `UPDATE_OPENAPI=1 cargo test -p etcd-operator-api --test openapi`.

// Test helpers outside `#[test]` functions unwrap too: a failed unwrap is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use etcd_operator_api::openapi;
use serde_json::Value;

fn openapi_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("openapi")
}

#[test]
fn committed_openapi_matches_generated() {
    let update = std::env::var_os("UPDATE_OPENAPI").is_some();
    let mut stale = Vec::new();
    for (relative, generated) in openapi::files().unwrap() {
        let path = openapi_dir().join(&relative);
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &generated).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == generated => {}
            Ok(_) => stale.push(format!("{} differs", path.display())),
            Err(e) => stale.push(format!("{} cannot be read: {e}", path.display())),
        }
    }
    assert!(
        stale.is_empty(),
        "the committed OpenAPI documents are out of date:\n  {}\nregenerate them with: \
         UPDATE_OPENAPI=1 cargo test -p etcd-operator-api --test openapi",
        stale.join("\n  ")
    );
}

fn v3(version: &str) -> Value {
    serde_json::to_value(openapi::v3_document(version).unwrap()).unwrap()
}

#[test]
fn top_level_kinds_carry_group_version_kind_lists() {
    for version in ["v1alpha1", "v1alpha2"] {
        let doc = v3(version);
        let schemas = &doc["components"]["schemas"];
        for kind in ["EtcdCluster", "EtcdClusterList"] {
            let name = format!("dev.operator.etcd.{version}.{kind}");
            assert_eq!(
                schemas[&name]["x-kubernetes-group-version-kind"],
                serde_json::json!([{"group": "etcd.operator.dev", "kind": kind, "version": version}]),
                "{name}"
            );
        }
    }
}

#[test]
fn operations_carry_a_single_group_version_kind_and_patch_types() {
    let doc = v3("v1alpha2");
    let item = &doc["paths"]["/apis/etcd.operator.dev/v1alpha2/namespaces/{namespace}/etcdclusters/{name}"];
    for method in ["get", "put", "patch", "delete"] {
        assert_eq!(
            item[method]["x-kubernetes-group-version-kind"],
            serde_json::json!({"group": "etcd.operator.dev", "version": "v1alpha2", "kind": "EtcdCluster"}),
            "{method}"
        );
    }
    let content = item["patch"]["requestBody"]["content"].as_object().unwrap();
    assert!(content.contains_key("application/merge-patch+json"));
    assert!(content.contains_key("application/json-patch+json"));
    // Server-side apply is served and offered, with its `force`; strategic merge is served but
    // not offered (kubectl's client-side apply would otherwise switch to it).
    assert!(content.contains_key("application/apply-patch+yaml"));
    assert!(!content.contains_key("application/strategic-merge-patch+json"));
    let params: Vec<&str> = item["patch"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(params.contains(&"fieldValidation"), "{params:?}");
    assert!(params.contains(&"force"), "{params:?}");
    assert!(params.contains(&"fieldManager"), "{params:?}");
    let scale =
        &doc["paths"]["/apis/etcd.operator.dev/v1alpha2/namespaces/{namespace}/etcdclusters/{name}/scale"];
    assert_eq!(scale["get"]["x-kubernetes-group-version-kind"]["kind"], "Scale");
    // No apply patch through /scale (the server answers 415).
    let scale_content = scale["patch"]["requestBody"]["content"].as_object().unwrap();
    assert!(!scale_content.contains_key("application/apply-patch+yaml"));
    assert!(scale_content.contains_key("application/merge-patch+json"));
}

/// Follows `$ref` / `allOf` to the named schema.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    let target = schema.get("$ref").or_else(|| {
        schema
            .get("allOf")
            .and_then(|a| a.get(0))
            .and_then(|r| r.get("$ref"))
    });
    match target.and_then(Value::as_str) {
        Some(r) => {
            let name = r.trim_start_matches("#/components/schemas/");
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => schema,
    }
}

#[test]
fn explain_paths_resolve_with_descriptions() {
    let doc = v3("v1alpha2");
    let root = &doc["components"]["schemas"]["dev.operator.etcd.v1alpha2.EtcdCluster"];
    let spec = resolve(&doc, &root["properties"]["spec"]);
    let replicas = &spec["properties"]["replicas"];
    assert!(
        replicas["description"]
            .as_str()
            .unwrap()
            .contains("Defaults to 3")
    );
    assert_eq!(replicas["type"], "integer");
    let storage = resolve(&doc, &spec["properties"]["storage"]);
    assert_eq!(
        storage["properties"]["medium"]["enum"],
        serde_json::json!(["Disk", "Memory"])
    );
    let meta = resolve(&doc, &root["properties"]["metadata"]);
    assert!(meta["properties"]["name"]["description"].is_string());

    let v1 = v3("v1alpha1");
    let root = &v1["components"]["schemas"]["dev.operator.etcd.v1alpha1.EtcdCluster"];
    let spec = resolve(&v1, &root["properties"]["spec"]);
    assert!(
        spec["properties"]["size"]["description"]
            .as_str()
            .unwrap()
            .contains("Defaults to 3")
    );
    assert!(spec["properties"].get("TLS").is_some());
}

/// Every property of every schema of ours has a description (`kubectl explain` prints it).
#[test]
fn every_field_is_described() {
    for version in ["v1alpha1", "v1alpha2"] {
        let doc = v3(version);
        let mut missing = Vec::new();
        for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
            if !name.starts_with("dev.operator.etcd.") {
                continue;
            }
            assert!(schema["description"].is_string(), "{name} has no description");
            for (field, property) in schema["properties"].as_object().into_iter().flatten() {
                if !property["description"].is_string() {
                    missing.push(format!("{name}.{field}"));
                }
            }
        }
        assert!(missing.is_empty(), "fields without description: {missing:?}");
    }
}

fn contains_null(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.iter().any(contains_null),
        Value::Object(map) => map.values().any(contains_null),
        _ => false,
    }
}

#[test]
fn no_null_types_leak_into_schemas() {
    for version in ["v1alpha1", "v1alpha2"] {
        let text = openapi::v3_json(version).unwrap();
        assert!(!text.contains("\"null\""), "{version} contains a null type");
        assert!(
            !contains_null(&serde_json::from_str(&text).unwrap()),
            "{version} contains a null value"
        );
    }
    let v2 = openapi::v2_json().unwrap();
    assert!(!v2.contains("#/components/"), "v2 refers to v3 components");
    let v2: Value = serde_json::from_str(&v2).unwrap();
    assert_eq!(v2["swagger"], "2.0");
    assert!(v2["definitions"]["dev.operator.etcd.v1alpha1.EtcdCluster"].is_object());
    assert!(v2["definitions"]["dev.operator.etcd.v1alpha2.EtcdCluster"].is_object());
}

#[test]
fn etcdbackups_are_in_v1alpha2_only_and_snapshot_in_both() {
    let doc = v3("v1alpha2");
    let schemas = &doc["components"]["schemas"];
    for kind in ["EtcdBackup", "EtcdBackupList"] {
        assert_eq!(
            schemas[&format!("dev.operator.etcd.v1alpha2.{kind}")]["x-kubernetes-group-version-kind"],
            serde_json::json!([{"group": "etcd.operator.dev", "kind": kind, "version": "v1alpha2"}]),
        );
    }
    let base = "/apis/etcd.operator.dev/v1alpha2/namespaces/{namespace}";
    let item = &doc["paths"][&format!("{base}/etcdbackups/{{name}}")];
    assert_eq!(
        item["get"]["x-kubernetes-group-version-kind"]["kind"],
        "EtcdBackup"
    );
    assert!(doc["paths"][&format!("{base}/etcdbackups/{{name}}/status")].is_object());
    assert!(doc["paths"][&format!("{base}/etcdbackups/{{name}}/scale")].is_null());
    let snapshot = &doc["paths"][&format!("{base}/etcdclusters/{{name}}/snapshot")]["get"];
    assert!(snapshot["responses"]["200"]["content"]["application/octet-stream"].is_object());
    let old = v3("v1alpha1");
    assert!(old["components"]["schemas"]["dev.operator.etcd.v1alpha1.EtcdBackup"].is_null());
    let old_base = "/apis/etcd.operator.dev/v1alpha1/namespaces/{namespace}";
    assert!(old["paths"][&format!("{old_base}/etcdbackups")].is_null());
    assert!(old["paths"][&format!("{old_base}/etcdclusters/{{name}}/snapshot")].is_object());
}
