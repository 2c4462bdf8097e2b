//! Cluster mode (`etcd-operator serve`): delegated authentication and authorization against
//! kube-apiserver, the way k8s.io/apiserver's delegating options do it, and the serve-mode wiring.
//!
//! * [`config`]: `kube-system/extension-apiserver-authentication`, kept loaded.
//! * [`authn`]: loopback controller identity → request-header → client CA → TokenReview → 401.
//! * [`authz`]: `system:masters`, else SubjectAccessReview; 403 in kube-apiserver's wording.
//! * [`tls`]: the serving configuration, rebuilt on certificate or CA changes.
//! * [`loopback`]: the controller's private path to the API.
//! * [`namespaces`]: creates in missing (404) or terminating (403) namespaces refused.
//!
//! The serve-mode wiring itself (`etcd-operator serve`, leader election) is in the binary crate.

pub mod authn;
pub mod authz;
pub mod cache;
pub mod config;
pub mod loopback;
pub mod namespaces;
pub mod tls;

pub use authn::{DelegatedAuthenticator, LoopbackTrust, TokenReviewer};
pub use authz::SubjectAccessReviewAuthorizer;
pub use config::{AuthenticationConfig, CaBundle, RequestHeaderConfig};
