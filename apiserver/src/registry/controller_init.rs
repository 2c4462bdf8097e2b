//! What the server sets on a new object for the controller that manages it, the way
//! kube-apiserver's create strategies (`PrepareForCreate`) set what the server owns: the
//! controller's finalizer, and the status the controller's first look would write (computed by
//! the controller's own code, which the binary injects). The controller then need not write the
//! object once more just for those. Pure.
//!
//! Only a server whose deployment runs the controller may set them (the binary says so when it
//! runs the controller): a finalizer nobody removes would hold every delete forever, and a status
//! nobody maintains would claim a look that never happens. Like the fields a kube-apiserver
//! strategy sets, they are set after `managedFields` are recorded, so no client's field manager
//! owns them (a server-side apply that leaves them out does not remove them).

use std::sync::Arc;

use serde_json::Value;

use super::kind::Kind;

/// The status a new object starts with, from the controller that manages it.
pub trait InitialStatus: Send + Sync {
    /// The `status` for `stored` (the storage JSON of an object being created, its server-owned
    /// metadata set); `None` leaves the status the create strategy set.
    fn initial_status(&self, stored: &Value) -> Option<Value>;
}

/// New objects of one resource, in the namespaces a controller manages, get its finalizer and,
/// when it provides one, its initial status.
#[derive(Clone)]
pub struct ControllerInit {
    kind: Kind,
    finalizer: String,
    namespaces: Vec<String>,
    status: Option<Arc<dyn InitialStatus>>,
}

impl std::fmt::Debug for ControllerInit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerInit")
            .field("kind", &self.kind)
            .field("finalizer", &self.finalizer)
            .field("namespaces", &self.namespaces)
            .field("initial_status", &self.status.is_some())
            .finish()
    }
}

impl ControllerInit {
    /// `finalizer` on new objects of `kind` in `namespaces` (empty: in every namespace), the
    /// namespaces the controller manages.
    pub fn new(kind: Kind, finalizer: impl Into<String>, namespaces: Vec<String>) -> Self {
        Self {
            kind,
            finalizer: finalizer.into(),
            namespaces,
            status: None,
        }
    }

    /// The co-located controller's cleanup finalizer on new EtcdClusters in `namespaces`
    /// (empty: every namespace; the controller's `--watch-namespaces`).
    pub fn cluster_cleanup(namespaces: Vec<String>) -> Self {
        Self::new(Kind::CLUSTER, etcd_operator_api::CLEANUP_FINALIZER, namespaces)
    }

    /// New objects also start with the status `status` computes.
    #[must_use]
    pub fn with_initial_status(mut self, status: Arc<dyn InitialStatus>) -> Self {
        self.status = Some(status);
        self
    }

    /// The finalizer new objects get.
    pub fn finalizer(&self) -> &str {
        &self.finalizer
    }

    /// The namespaces whose new objects get it (empty: every namespace).
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// Whether new objects also get an initial status.
    pub fn sets_status(&self) -> bool {
        self.status.is_some()
    }

    /// Whether a new object of `kind` in `namespace` gets the finalizer.
    pub fn applies_to(&self, kind: Kind, namespace: &str) -> bool {
        self.kind == kind && (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
    }

    /// Adds the finalizer to `stored` (storage JSON of an object being created) when it applies
    /// and the object does not carry it yet; the client's finalizers keep their order. Then sets
    /// the initial status, when there is one for this object.
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
        if let Some(status) = self.status.as_ref().and_then(|s| s.initial_status(stored))
            && let Some(obj) = stored.as_object_mut()
        {
            obj.insert("status".to_owned(), status);
        }
    }
}

/// [`ControllerInit::prepare`] of each of `inits`.
pub fn prepare_create(inits: &[ControllerInit], kind: Kind, namespace: &str, stored: &mut Value) {
    for init in inits {
        init.prepare(kind, namespace, stored);
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
        let f = ControllerInit::cluster_cleanup(Vec::new());
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
        let f = ControllerInit::cluster_cleanup(Vec::new());
        let mut obj = stored(Some(json!(["etcd.operator.dev/cleanup", "example.com/hold"])));
        f.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!(["etcd.operator.dev/cleanup", "example.com/hold"])
        );
    }

    #[test]
    fn other_resources_and_unmanaged_namespaces_get_nothing() {
        let f = ControllerInit::cluster_cleanup(vec!["prod".into(), "staging".into()]);
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
        let f = ControllerInit::cluster_cleanup(Vec::new());
        let mut obj = json!({"metadata": "x"});
        f.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(obj, json!({"metadata": "x"}));
        let mut obj = stored(Some(json!("not-a-list")));
        f.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(obj["metadata"]["finalizers"], json!("not-a-list"));
    }

    /// A controller's initial status that names what it was given, and has none for objects
    /// labelled `skip`.
    struct Echo;

    impl InitialStatus for Echo {
        fn initial_status(&self, stored: &Value) -> Option<Value> {
            if stored.pointer("/metadata/labels/skip").is_some() {
                return None;
            }
            Some(json!({"observedGeneration": 1, "seen": stored["metadata"]["name"]}))
        }
    }

    #[test]
    fn a_new_object_starts_with_the_controllers_status_where_it_manages_it() {
        let init = ControllerInit::cluster_cleanup(vec!["ns".into()]).with_initial_status(Arc::new(Echo));
        assert!(init.sets_status());
        let mut obj = stored(None);
        obj["status"] = json!({"observedGeneration": 0});
        init.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(obj["status"], json!({"observedGeneration": 1, "seen": "a"}));
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!(["etcd.operator.dev/cleanup"])
        );
        // None from the controller: the strategy's status stays.
        let mut obj = stored(None);
        obj["metadata"]["labels"] = json!({"skip": "yes"});
        obj["status"] = json!({"observedGeneration": 0});
        init.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert_eq!(obj["status"], json!({"observedGeneration": 0}));
        // Nothing in a namespace it does not manage, nor for another resource.
        for (kind, ns) in [(Kind::CLUSTER, "other"), (Kind::BACKUP, "ns")] {
            let mut obj = stored(None);
            obj["status"] = json!({"observedGeneration": 0});
            init.prepare(kind, ns, &mut obj);
            assert_eq!(
                obj["status"],
                json!({"observedGeneration": 0}),
                "{kind:?} in {ns}"
            );
        }
        // Without the hook, only the finalizer.
        let plain = ControllerInit::cluster_cleanup(Vec::new());
        assert!(!plain.sets_status());
        let mut obj = stored(None);
        plain.prepare(Kind::CLUSTER, "ns", &mut obj);
        assert!(obj.get("status").is_none());
    }
}
