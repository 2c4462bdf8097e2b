//! Checks a create passes before it is admitted, implemented outside the HTTP layer: serve mode's
//! namespace lifecycle (`crate::cluster::namespaces`, which reads Namespaces from kube-apiserver)
//! is injected as a [`CreateAdmission`], so that `http` does not depend on `cluster`.

use futures::future::BoxFuture;

use super::error::ApiError;

/// Decides whether an object may be created in a namespace (the `Status` to answer otherwise).
pub trait CreateAdmission: Send + Sync {
    /// Whether `name` of `resource` may be created in `namespace`.
    fn admit_create<'a>(
        &'a self,
        resource: &'a str,
        name: &'a str,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
}
