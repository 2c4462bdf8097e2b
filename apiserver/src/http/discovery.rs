//! Discovery documents: per-version `APIResourceList`, the `APIGroup`/`APIGroupList`, and the
//! aggregated discovery `APIGroupDiscoveryList` (with its ETag) the aggregator prefers, in `v2`
//! and in `v2beta1` (what 1.26–1.29 aggregators and clients ask for; the same shape).

use base64::Engine;
use etcd_operator_api::{GROUP, SERVED_VERSIONS};
use serde_json::{Value, json};
use sha2::{Digest, Sha256, Sha512};

use crate::registry::kind::{self, Kind};

/// The content type of aggregated discovery v2.
pub const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// The content type of aggregated discovery v2beta1.
pub const AGGREGATED_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// A served version of aggregated discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregated {
    /// `apidiscovery.k8s.io/v2`.
    V2,
    /// `apidiscovery.k8s.io/v2beta1` (removed from kube-apiserver in 1.35, still asked for by
    /// 1.26–1.29 aggregators).
    V2Beta1,
}

impl Aggregated {
    /// The response's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Aggregated::V2 => AGGREGATED_V2,
            Aggregated::V2Beta1 => AGGREGATED_V2BETA1,
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Aggregated::V2 => "apidiscovery.k8s.io/v2",
            Aggregated::V2Beta1 => "apidiscovery.k8s.io/v2beta1",
        }
    }
}

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
/// Verbs on `snapshot` (read-only).
const SNAPSHOT_VERBS: [&str; 1] = ["get"];

/// The resources a version of the group serves.
fn kinds_in(version: &str) -> impl Iterator<Item = Kind> + '_ {
    kind::GROUP_KINDS.into_iter().filter(move |k| k.serves(version))
}

/// `GET /api` (local mode): the legacy core group, which serves Events only.
pub fn core_api_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    })
}

/// `GET /api/v1` (local mode): `events` and nothing else.
pub fn core_resource_list() -> Value {
    let info = Kind::EVENT.info();
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [{
            "name": info.resource, "singularName": info.singular, "namespaced": true,
            "kind": info.kind, "verbs": VERBS, "shortNames": info.short_names,
            "storageVersionHash": storage_version_hash("", info.storage_version, info.kind),
        }],
    })
}

/// `base64(sha256("group/version/kind")[:8])`, as k8s.io/apiserver computes it.
pub fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    let digest = Sha256::digest(format!("{group}/{version}/{kind}"));
    base64::engine::general_purpose::STANDARD.encode(&digest[..8])
}

/// `GET /apis/<group>/<version>`.
pub fn api_resource_list(version: &str) -> Value {
    let mut resources = Vec::new();
    for k in kinds_in(version) {
        let info = k.info();
        resources.push(json!({
            "name": info.resource, "singularName": info.singular, "namespaced": true, "kind": info.kind,
            "verbs": VERBS, "shortNames": info.short_names, "categories": info.categories,
            // Objects are stored in the storage version whatever version they were written in.
            "storageVersionHash": storage_version_hash(GROUP, info.storage_version, info.kind),
        }));
        for sub in info.subresources {
            resources.push(match *sub {
                "scale" => json!({"name": format!("{}/scale", info.resource), "singularName": "", "namespaced": true,
                    "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": SUB_VERBS}),
                "snapshot" => json!({"name": format!("{}/snapshot", info.resource), "singularName": "", "namespaced": true,
                    "kind": info.kind, "verbs": SNAPSHOT_VERBS}),
                other => json!({"name": format!("{}/{other}", info.resource), "singularName": "", "namespaced": true,
                    "kind": info.kind, "verbs": SUB_VERBS}),
            });
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{GROUP}/{version}"),
        "resources": resources,
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
    aggregated_in(Aggregated::V2)
}

/// `GET /apis` as aggregated discovery of `version`.
pub fn aggregated_in(version: Aggregated) -> Value {
    let versions: Vec<Value> = SERVED_VERSIONS
        .iter()
        .map(|v| {
            let resources: Vec<Value> = kinds_in(v)
                .map(|k| {
                    let info = k.info();
                    let own = json!({"group": GROUP, "version": v, "kind": info.kind});
                    let subresources: Vec<Value> = info
                        .subresources
                        .iter()
                        .map(|sub| match *sub {
                            "scale" => json!({"subresource": "scale", "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}, "verbs": SUB_VERBS}),
                            "snapshot" => json!({"subresource": "snapshot", "responseKind": own, "verbs": SNAPSHOT_VERBS}),
                            other => json!({"subresource": other, "responseKind": own, "verbs": SUB_VERBS}),
                        })
                        .collect();
                    json!({
                        "resource": info.resource,
                        "responseKind": own,
                        "scope": "Namespaced",
                        "singularResource": info.singular,
                        "verbs": VERBS,
                        "shortNames": info.short_names,
                        "categories": info.categories,
                        "subresources": subresources,
                    })
                })
                .collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": version.api_version(),
        "metadata": {},
        "items": [{"metadata": {"name": GROUP}, "versions": versions}],
    })
}

/// The quoted ETag of a document: `"<hex sha512>"`.
pub fn etag(body: &[u8]) -> String {
    format!("\"{}\"", hex::encode(Sha512::digest(body)))
}

/// Whether the Accept header asks for aggregated discovery (either version).
pub fn wants_aggregated(accept: Option<&str>) -> bool {
    aggregated_version(accept).is_some()
}

/// The aggregated discovery version the Accept header asks for: the first entry (in the
/// client's order, as client-go lists its preference) naming one this server serves.
pub fn aggregated_version(accept: Option<&str>) -> Option<Aggregated> {
    accept?.split(',').find_map(|entry| {
        let mut parts = entry.split(';');
        let media = parts.next().unwrap_or_default().trim();
        if media != "application/json" {
            return None;
        }
        let params: Vec<String> = parts.map(|p| p.replace(' ', "")).collect();
        let has = |want: &str| params.iter().any(|p| p == want);
        if !(has("g=apidiscovery.k8s.io") && has("as=APIGroupDiscoveryList")) {
            return None;
        }
        if has("v=v2") {
            Some(Aggregated::V2)
        } else if has("v=v2beta1") {
            Some(Aggregated::V2Beta1)
        } else {
            None
        }
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
            [
                "etcdclusters",
                "etcdclusters/status",
                "etcdclusters/scale",
                "etcdclusters/snapshot",
                "etcdbackups",
                "etcdbackups/status"
            ]
        );
        assert_eq!(list["resources"][3]["verbs"], json!(["get"]));
        assert_eq!(list["resources"][4]["shortNames"], json!(["eb"]));
        let old: Vec<String> = api_resource_list("v1alpha1")["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect();
        assert!(!old.iter().any(|n| n.starts_with("etcdbackups")), "{old:?}");
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
        let v2_resources = agg["items"][0]["versions"][0]["resources"].as_array().unwrap();
        assert_eq!(v2_resources.len(), 2);
        assert_eq!(v2_resources[1]["resource"], "etcdbackups");
        assert_eq!(v2_resources[0]["subresources"][2]["subresource"], "snapshot");
        assert_eq!(
            agg["items"][0]["versions"][1]["resources"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn recognises_the_aggregated_accept() {
        assert!(wants_aggregated(Some(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        )));
        assert!(!wants_aggregated(Some("application/json")));
        assert!(!wants_aggregated(None));
        assert!(!wants_aggregated(Some(
            "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList"
        )));
    }

    #[test]
    fn v2beta1_is_served_when_asked_for_first() {
        let beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        let v2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        assert_eq!(aggregated_version(Some(beta)), Some(Aggregated::V2Beta1));
        assert_eq!(
            aggregated_version(Some(&format!("{beta},{v2},application/json"))),
            Some(Aggregated::V2Beta1)
        );
        assert_eq!(
            aggregated_version(Some(&format!("{v2},{beta}"))),
            Some(Aggregated::V2)
        );
        let doc = aggregated_in(Aggregated::V2Beta1);
        assert_eq!(doc["apiVersion"], "apidiscovery.k8s.io/v2beta1");
        assert_eq!(doc["items"], aggregated()["items"]);
        assert_eq!(Aggregated::V2Beta1.content_type(), beta);
    }
}
