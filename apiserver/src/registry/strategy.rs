//! The strategy seam, in the spirit of k8s.io/apiserver's `RESTCreateStrategy` and
//! `RESTUpdateStrategy`: what differs per resource is a [`Strategy`]; [`Store`] fixes the order
//! every write follows, so no resource can skip or reorder a step:
//!
//! 1. identity metadata against the URL and the resourceVersion precondition (shared rules);
//! 2. defaults, in the version the client sent;
//! 3. validation, every error at once (422 with field paths), and warnings;
//! 4. the canonical, stored form (the hub), then what the server owns (uid, generation, status).
//!
//! [`Resource`] is the same store made object-safe for the HTTP layer, which serves every
//! resource of [`super::kind::ALL`] through it without knowing their types. Pure: no I/O.

use std::any::Any;

use etcd_operator_api::validation::Outcome;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::decode::Findings;
use super::kind::KindInfo;
use super::printers::Printer;
use super::{create_meta, delete_meta, deletes_now, stamp_created_meta, status_meta, update_meta};
use crate::error::ApiError;

/// What differs per resource. Every hook but the metadata accessors has a fixed place in the
/// order [`Store`] runs them in; only the `prepare_for_*` hooks and `apply_defaults` get `&mut`.
pub trait Strategy: Send + Sync + 'static {
    /// The object as a client sent it, in its version.
    type Request: Clone + Send + Sync + 'static;
    /// The internal object: what is stored, whatever version it was written in.
    type Object: Clone + Send + Sync + 'static;

    /// Names, versions and subresources.
    fn info(&self) -> &'static KindInfo;
    /// `kubectl get` columns.
    fn printer(&self) -> &'static Printer;

    /// A request body (JSON already) as an object of `version`: apiVersion and kind must match.
    /// Also what the object does not keep of the body (unknown fields, mistyped containers).
    fn decode(&self, body: &Value, version: &str) -> Result<(Self::Request, Findings), ApiError>;
    /// The request's metadata.
    fn request_meta<'a>(&self, obj: &'a Self::Request) -> &'a ObjectMeta;
    /// The request's metadata, for the shared identity rules.
    fn request_meta_mut<'a>(&self, obj: &'a mut Self::Request) -> &'a mut ObjectMeta;
    /// A stored object's metadata.
    fn object_meta<'a>(&self, obj: &'a Self::Object) -> &'a ObjectMeta;
    /// A stored object's metadata, for server-owned fields.
    fn object_meta_mut<'a>(&self, obj: &'a mut Self::Object) -> &'a mut ObjectMeta;

    /// Defaults, in the request's version (step 2).
    fn apply_defaults(&self, obj: &mut Self::Request);
    /// Validation of a new object (step 3).
    fn validate(&self, obj: &Self::Request) -> Outcome;
    /// Validation of an update against the stored object (step 3).
    fn validate_update(&self, obj: &Self::Request, old: &Self::Object) -> Outcome;
    /// The validated request in its canonical, stored form (step 4).
    fn canonicalize(&self, obj: Self::Request) -> Self::Object;
    /// Create: what the server resets (e.g. status) after step 4.
    fn prepare_for_create(&self, obj: &mut Self::Object);
    /// Update of the main resource after step 4: what is kept from `old` (status) and what follows
    /// from the change (generation).
    fn prepare_for_update(&self, obj: &mut Self::Object, old: &Self::Object);
    /// Update through `/status`: `new`'s status on top of `old`.
    fn prepare_for_status_update(&self, new: Self::Object, old: &Self::Object) -> Self::Object;

    /// The object as stored (storage JSON, no resourceVersion).
    fn to_storage(&self, obj: Self::Object) -> Result<Value, ApiError>;
    /// A stored object.
    fn read_stored(&self, stored: Value) -> Result<Self::Object, ApiError>;
    /// A stored object in a served version other than the storage version.
    fn to_version(&self, obj: Self::Object, version: &str) -> Result<Value, ApiError>;
}

/// An admitted object and the warnings for `Warning` headers.
#[derive(Debug, Clone)]
pub struct Admitted<O> {
    /// What to store.
    pub object: O,
    /// The warnings.
    pub warnings: Vec<String>,
}

/// What an update of the main resource decided.
#[derive(Debug, Clone)]
pub enum UpdateDecision<O> {
    /// Store this object.
    Store(Box<Admitted<O>>),
    /// The last finalizer of an object being deleted is gone: delete it.
    Delete,
}

/// The one generic store over a [`Strategy`]: the call order of every write.
#[derive(Debug, Clone, Copy)]
pub struct Store<S>(pub S);

impl<S: Strategy> Store<S> {
    fn ident(&self) -> (&'static str, &'static str) {
        let info = self.0.info();
        (info.kind, info.resource)
    }

    fn refuse(&self, name: &str, outcome: &Outcome) -> Result<Vec<String>, ApiError> {
        if outcome.is_valid() {
            Ok(outcome.warning_messages())
        } else {
            let info = self.0.info();
            Err(ApiError::invalid_in(
                info.group,
                info.kind,
                name,
                super::causes(&outcome.errors),
            ))
        }
    }

    /// Create in `namespace`.
    pub fn create(&self, mut obj: S::Request, namespace: &str) -> Result<Admitted<S::Object>, ApiError> {
        let s = &self.0;
        create_meta(s.request_meta_mut(&mut obj), namespace)?;
        s.apply_defaults(&mut obj);
        let name = s.request_meta(&obj).name.clone().unwrap_or_default();
        let warnings = self.refuse(&name, &s.validate(&obj))?;
        let mut object = s.canonicalize(obj);
        stamp_created_meta(s.object_meta_mut(&mut object));
        s.prepare_for_create(&mut object);
        Ok(Admitted { object, warnings })
    }

    /// Update of the main resource (PUT, or the result of a PATCH) against the stored `old`.
    /// `require_rv` is true for PUT.
    pub fn update(
        &self,
        mut new: S::Request,
        old: &S::Object,
        name: &str,
        namespace: &str,
        require_rv: bool,
    ) -> Result<UpdateDecision<S::Object>, ApiError> {
        let s = &self.0;
        update_meta(
            self.ident(),
            s.request_meta_mut(&mut new),
            s.object_meta(old),
            name,
            namespace,
            require_rv,
        )?;
        s.apply_defaults(&mut new);
        let warnings = self.refuse(name, &s.validate_update(&new, old))?;
        let mut object = s.canonicalize(new);
        s.prepare_for_update(&mut object, old);
        if deletes_now(s.object_meta(&object)) {
            return Ok(UpdateDecision::Delete);
        }
        Ok(UpdateDecision::Store(Box::new(Admitted { object, warnings })))
    }

    /// Update through `/status`: only the status changes.
    pub fn update_status(
        &self,
        new: S::Request,
        old: &S::Object,
        name: &str,
        require_rv: bool,
    ) -> Result<S::Object, ApiError> {
        let s = &self.0;
        status_meta(
            self.ident(),
            s.request_meta(&new),
            s.object_meta(old),
            name,
            require_rv,
        )?;
        let mut object = s.prepare_for_status_update(s.canonicalize(new), old);
        s.object_meta_mut(&mut object).resource_version = None;
        Ok(object)
    }

    /// Delete: the object marked for deletion when finalizers hold it, else `None` (delete now).
    pub fn delete(&self, old: &S::Object, propagation: Option<&str>) -> Option<S::Object> {
        let mut object = old.clone();
        delete_meta(self.0.object_meta_mut(&mut object), propagation).then_some(object)
    }
}

/// A decoded request object of some resource (its [`Strategy::Request`]).
#[derive(Clone)]
pub struct RequestObject(std::sync::Arc<dyn Any + Send + Sync>);

impl std::fmt::Debug for RequestObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestObject")
    }
}

/// What a write decided, as storage JSON.
#[derive(Debug, Clone)]
pub enum Write {
    /// Store this (storage JSON), returning these warnings.
    Store(Value, Vec<String>),
    /// Delete the object (its last finalizer is gone).
    Delete,
}

/// A served resource for the HTTP layer: a [`Store`] without its types.
pub trait Resource: Send + Sync + 'static {
    /// Names, versions and subresources.
    fn info(&self) -> &'static KindInfo;
    /// `kubectl get` columns.
    fn printer(&self) -> &'static Printer;
    /// Decodes a request body for `version`; also returns what the typed object does not keep
    /// of it (unknown fields, mistyped containers).
    fn decode(&self, body: &Value, version: &str) -> Result<(RequestObject, Findings), ApiError>;
    /// Create: the object to store, its name and the warnings.
    fn create(&self, obj: RequestObject, namespace: &str) -> Result<(Value, String, Vec<String>), ApiError>;
    /// Update of the main resource against the stored object `current`.
    fn update(
        &self,
        obj: &RequestObject,
        current: Value,
        name: &str,
        namespace: &str,
        require_rv: bool,
    ) -> Result<Write, ApiError>;
    /// Update of the `status` subresource: the object to store.
    fn update_status(
        &self,
        obj: &RequestObject,
        current: Value,
        name: &str,
        require_rv: bool,
    ) -> Result<Value, ApiError>;
    /// Delete: the object marked for deletion, or `None` to delete it now.
    fn delete(&self, current: Value, propagation: Option<&str>) -> Result<Option<Value>, ApiError>;
    /// A stored object in the version a client asked for.
    fn in_version(&self, stored: Value, version: &str) -> Result<Value, ApiError>;
}

impl<S: Strategy> Store<S> {
    fn typed_request(&self, obj: &RequestObject) -> Result<S::Request, ApiError> {
        obj.0.downcast_ref::<S::Request>().cloned().ok_or_else(|| {
            ApiError::internal(format!(
                "a request object of another resource was sent to {}",
                self.0.info().resource
            ))
        })
    }
}

impl<S: Strategy> Resource for Store<S> {
    fn info(&self) -> &'static KindInfo {
        self.0.info()
    }

    fn printer(&self) -> &'static Printer {
        self.0.printer()
    }

    fn decode(&self, body: &Value, version: &str) -> Result<(RequestObject, Findings), ApiError> {
        let (obj, findings) = self.0.decode(body, version)?;
        Ok((RequestObject(std::sync::Arc::new(obj)), findings))
    }

    fn create(&self, obj: RequestObject, namespace: &str) -> Result<(Value, String, Vec<String>), ApiError> {
        let admitted = Store::create(self, self.typed_request(&obj)?, namespace)?;
        let name = self
            .0
            .object_meta(&admitted.object)
            .name
            .clone()
            .unwrap_or_default();
        Ok((self.0.to_storage(admitted.object)?, name, admitted.warnings))
    }

    fn update(
        &self,
        obj: &RequestObject,
        current: Value,
        name: &str,
        namespace: &str,
        require_rv: bool,
    ) -> Result<Write, ApiError> {
        let old = self.0.read_stored(current)?;
        match Store::update(self, self.typed_request(obj)?, &old, name, namespace, require_rv)? {
            UpdateDecision::Store(a) => Ok(Write::Store(self.0.to_storage(a.object)?, a.warnings)),
            UpdateDecision::Delete => Ok(Write::Delete),
        }
    }

    fn update_status(
        &self,
        obj: &RequestObject,
        current: Value,
        name: &str,
        require_rv: bool,
    ) -> Result<Value, ApiError> {
        let old = self.0.read_stored(current)?;
        let object = Store::update_status(self, self.typed_request(obj)?, &old, name, require_rv)?;
        self.0.to_storage(object)
    }

    fn delete(&self, current: Value, propagation: Option<&str>) -> Result<Option<Value>, ApiError> {
        let old = self.0.read_stored(current)?;
        Store::delete(self, &old, propagation)
            .map(|o| self.0.to_storage(o))
            .transpose()
    }

    fn in_version(&self, stored: Value, version: &str) -> Result<Value, ApiError> {
        if version == self.0.info().storage_version {
            // Stored objects are storage JSON already: no decode/encode round trip.
            return Ok(stored);
        }
        self.0.to_version(self.0.read_stored(stored)?, version)
    }
}
