//! TLS for the etcd clusters the operator runs: the certificate authority code shared with the
//! API server ([`ca`]) and what a cluster's members and the operator present ([`member`]).

pub mod ca;
pub mod member;
