//! Finalizers the server adds to new objects for the controller that manages them, the way
//! kube-apiserver's create strategies (`PrepareForCreate`) set what the server owns: the
//! controller then need not write the object once more just to add its finalizer. Pure.
//!
//! Only a server whose controller manages the objects may add one (the binary says so when it
//! runs the controller): a finalizer nobody removes would hold every delete forever. Like the
//! fields a kube-apiserver strategy sets, the finalizer is added after `managedFields` are
//! recorded, so no client's field manager owns it (a server-side apply that leaves it out does
//! not remove it).

use serde_json::Value;

use super::kind::Kind;

/// New objects of one resource get `finalizer` when their namespace is managed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateFinalizer {
    kind: Kind,
    finalizer: String,
    namespaces: Vec<String>,
}

impl CreateFinalizer {
    /// `finalizer` on new objects of `kind` in `namespaces` (empty: in every namespace), the
    /// namespaces the controller manages.
    pub fn new(kind: Kind, finalizer: impl Into<String>, namespaces: Vec<String>) -> Self {
        Self {
            kind,
            finalizer: finalizer.into(),
            namespaces,
        }
    }

    /// The co-located controller's cleanup finalizer on new EtcdClusters in `namespaces`
    /// (empty: every namespace; the controller's `--watch-namespaces`).
    pub fn cluster_cleanup(namespaces: Vec<String>) -> Self {
        Self::new(Kind::CLUSTER, etcd_operator_api::CLEANUP_FINALIZER, namespaces)
    }

    /// Whether a new object of `kind` in `namespace` gets the finalizer.
    pub fn applies_to(&self, kind: Kind, namespace: &str) -> bool {
        self.kind == kind && (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
    }

    /// Adds the finalizer to `stored` (storage JSON of an object being created) when it applies
    /// and the object does not carry it yet; the client's finalizers keep their order.
    pub fn prepare(&self, kind: Kind, namespace: &str, stored: &mut Value) {
        if !self.applies_to(kind, namespace) {
            return;
        }
        let Some(meta) = stored.get_mut("metadata").and_then(Value::as_object_mut) else {
            return;
        };
        let finalizers = meta
            .entry("finalizers")
            .or_insert_with(|| Value::Array(Vec::new()));
        if !finalizers.is_array() {
            // A stored object's finalizers are a list; anything else was refused before.
            return;
        }
        if let Value::Array(list) = finalizers
            && !list.iter().any(|f| f.as_str() == Some(self.finalizer.as_str()))
        {
            list.push(Value::String(self.finalizer.clone()));
        }
    }
}

/// [`CreateFinalizer::prepare`] of each of `finalizers`.
pub fn prepare_create(finalizers: &[CreateFinalizer], kind: Kind, namespace: &str, stored: &mut Value) {
    for f in finalizers {
        f.prepare(kind, namespace, stored);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(finalizers: Option<Value>) -> Value {
        let mut v = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "ns"}, "spec": {"replicas": 3}});
        if let Some(f) = finalizers {
            v["metadata"]["finalizers"] = f;
        }
        v
    }

    #[test]
    fn a_new_cluster_gets_the_cleanup_finalizer_after_the_clients_own() {
        let f = CreateFinalizer::cluster_cleanup(Vec::new());
        let mut obj = stored(None);
        f.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!(["etcd.operator.dev/cleanup"])
        );
        let mut obj = stored(Some(json!(["example.com/hold"])));
        f.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!(["example.com/hold", "etcd.operator.dev/cleanup"])
        );
        // The rest of the object is left as it was.
        assert_eq!(obj["spec"], json!({"replicas": 3}));
    }

    #[test]
    fn a_finalizer_the_client_sent_is_not_added_twice() {
        let f = CreateFinalizer::cluster_cleanup(Vec::new());
        let mut obj = stored(Some(json!(["etcd.operator.dev/cleanup", "example.com/hold"])));
        f.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!(["etcd.operator.dev/cleanup", "example.com/hold"])
        );
    }

    #[test]
    fn other_resources_and_unmanaged_namespaces_get_nothing() {
        let f = CreateFinalizer::cluster_cleanup(vec!["prod".into(), "staging".into()]);
        for (kind, ns) in [
            (Kind::CLUSTER, "dev"),
            (Kind::BACKUP, "prod"),
            (Kind::EVENT, "prod"),
        ] {
            let mut obj = stored(None);
            prepare_create(std::slice::from_ref(&f), kind, ns, &mut obj);
            assert!(obj["metadata"].get("finalizers").is_none(), "{kind:?} in {ns}");
        }
        let mut obj = stored(None);
        prepare_create(&[f], Kind::CLUSTER, "staging", &mut obj);
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!(["etcd.operator.dev/cleanup"])
        );
        // No policy (the controller is not in this process): nothing, anywhere.
        let mut obj = stored(None);
        prepare_create(&[], Kind::CLUSTER, "staging", &mut obj);
        assert!(obj["metadata"].get("finalizers").is_none());
    }

    #[test]
    fn objects_without_object_metadata_or_with_odd_finalizers_are_left_alone() {
        let f = CreateFinalizer::cluster_cleanup(Vec::new());
        let mut obj = json!({"metadata": "x"});
        f.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(obj, json!({"metadata": "x"}));
        let mut obj = stored(Some(json!("not-a-list")));
        f.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(obj["metadata"]["finalizers"], json!("not-a-list"));
    }
}
