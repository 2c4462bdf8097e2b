//! TLS for the etcd clusters the operator runs: the certificate authority code shared with the
//! API server ([`ca`], the `etcd-operator-pki` crate) and what a cluster's members and the
//! operator present ([`member`]), and the rotation of a cluster's CAs ([`authority`]).

pub use etcd_operator_pki as ca;
pub mod authority;
pub mod member;
