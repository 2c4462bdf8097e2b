//! Discovery documents: per-version `APIResourceList`, the `APIGroup`/`APIGroupList`, and the
//! aggregated discovery v2 `APIGroupDiscoveryList` (with its ETag) the aggregator prefers.

use base64::Engine;
use etcd_operator_api::{GROUP, KIND, RESOURCE, SERVED_VERSIONS, SHORT_NAMES, SINGULAR};
use serde_json::{Value, json};
use sha2::{Digest, Sha256, Sha512};

/// The content type of aggregated discovery v2.
pub const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Verbs on the main resource.
const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// Verbs on `status` and `scale`.
const SUB_VERBS: [&str; 3] = ["get", "patch", "update"];

/// `base64(sha256("group/version/kind")[:8])`, as k8s.io/apiserver computes it.
pub fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    let digest = Sha256::digest(format!("{group}/{version}/{kind}"));
    base64::engine::general_purpose::STANDARD.encode(&digest[..8])
}

/// `GET /apis/<group>/<version>`.
pub fn api_resource_list(version: &str) -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{GROUP}/{version}"),
        "resources": [
            {
                "name": RESOURCE, "singularName": SINGULAR, "namespaced": true, "kind": KIND,
                "verbs": VERBS, "shortNames": SHORT_NAMES, "categories": ["all", "etcd"],
                // Objects are stored in the hub version whatever version they were written in.
                "storageVersionHash": storage_version_hash(GROUP, etcd_operator_api::HUB_VERSION, KIND),
            },
            {"name": format!("{RESOURCE}/status"), "singularName": "", "namespaced": true, "kind": KIND, "verbs": SUB_VERBS},
            {"name": format!("{RESOURCE}/scale"), "singularName": "", "namespaced": true,
             "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": SUB_VERBS},
        ],
    })
}

fn group_body() -> Value {
    let versions: Vec<Value> = SERVED_VERSIONS
        .iter()
        .map(|v| json!({"groupVersion": format!("{GROUP}/{v}"), "version": v}))
        .collect();
    json!({
        "name": GROUP,
        "versions": versions,
        "preferredVersion": {"groupVersion": format!("{GROUP}/{}", SERVED_VERSIONS[0]), "version": SERVED_VERSIONS[0]},
    })
}

/// `GET /apis/<group>`.
pub fn api_group() -> Value {
    let mut g = group_body();
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    g
}

/// `GET /apis` (legacy).
pub fn api_group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_body()]})
}

/// `GET /apis` with the aggregated discovery v2 Accept.
pub fn aggregated() -> Value {
    let versions: Vec<Value> = SERVED_VERSIONS
        .iter()
        .map(|v| {
            json!({
                "version": v,
                "resources": [{
                    "resource": RESOURCE,
                    "responseKind": {"group": GROUP, "version": v, "kind": KIND},
                    "scope": "Namespaced",
                    "singularResource": SINGULAR,
                    "verbs": VERBS,
                    "shortNames": SHORT_NAMES,
                    "categories": ["all", "etcd"],
                    "subresources": [
                        {"subresource": "status", "responseKind": {"group": GROUP, "version": v, "kind": KIND}, "verbs": SUB_VERBS},
                        {"subresource": "scale", "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}, "verbs": SUB_VERBS},
                    ],
                }],
                "freshness": "Current",
            })
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": [{"metadata": {"name": GROUP}, "versions": versions}],
    })
}

/// The quoted ETag of a document: `"<hex sha512>"`.
pub fn etag(body: &[u8]) -> String {
    format!("\"{}\"", hex::encode(Sha512::digest(body)))
}

/// Whether the Accept header asks for aggregated discovery v2.
pub fn wants_aggregated(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|entry| {
            let params: Vec<String> = entry.split(';').skip(1).map(|p| p.replace(' ', "")).collect();
            let has = |want: &str| params.iter().any(|p| p == want);
            has("g=apidiscovery.k8s.io") && has("v=v2") && has("as=APIGroupDiscoveryList")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_list_has_status_and_scale() {
        let list = api_resource_list("v1alpha2");
        assert_eq!(list["kind"], "APIResourceList");
        assert_eq!(list["groupVersion"], "etcd.operator.dev/v1alpha2");
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["etcdclusters", "etcdclusters/status", "etcdclusters/scale"]
        );
        assert_eq!(list["resources"][2]["group"], "autoscaling");
        assert_eq!(list["resources"][2]["kind"], "Scale");
        assert_eq!(list["resources"][0]["shortNames"], json!(["ec"]));
    }

    #[test]
    fn storage_version_hash_matches_kube_apiserver() {
        // Known value from kube-apiserver discovery: apps/v1 Deployment → "8aSe+NMegvE=".
        assert_eq!(storage_version_hash("apps", "v1", "Deployment"), "8aSe+NMegvE=");
    }

    #[test]
    fn v2_is_preferred() {
        assert_eq!(api_group()["preferredVersion"]["version"], "v1alpha2");
        let agg = aggregated();
        assert_eq!(agg["items"][0]["versions"][0]["version"], "v1alpha2");
        assert_eq!(agg["items"][0]["versions"][1]["version"], "v1alpha1");
    }

    #[test]
    fn recognises_the_aggregated_accept() {
        assert!(wants_aggregated(Some(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        )));
        assert!(!wants_aggregated(Some("application/json")));
        assert!(!wants_aggregated(None));
    }
}
