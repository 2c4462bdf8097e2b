//! Authentication and authorization seams: local mode trusts client certificates of its own CA;
//! cluster mode (delegated to kube-apiserver) plugs in here too.

use std::future::Future;
use std::pin::Pin;

use crate::serve::PeerCertificates;
pub use crate::serve::auth::UserInfo;

use super::error::ApiError;
use super::request_info::RequestInfo;

/// The future an [`Authenticator`] returns.
pub type AuthenticateFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<UserInfo>, ApiError>> + Send + 'a>>;

/// Establishes who sent a request. `Ok(None)` means anonymous (answered with 401).
/// Implementations remove every identity header they consumed or distrust from `parts`.
pub trait Authenticator: Send + Sync {
    /// Authenticates one request (async: cluster mode asks kube-apiserver via TokenReview).
    fn authenticate<'a>(&'a self, parts: &'a mut http::request::Parts) -> AuthenticateFuture<'a>;

    /// Why this authenticator cannot authenticate yet (e.g. its configuration is not loaded), for
    /// `/readyz`; `None` when ready.
    fn not_ready(&self) -> Option<String> {
        None
    }
}

/// Decides whether a user may do what a request asks; an error is the response (403).
pub trait Authorizer: Send + Sync {
    /// Authorizes one request.
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        info: &'a RequestInfo,
    ) -> Pin<Box<dyn Future<Output = Result<(), ApiError>> + Send + 'a>>;
}

/// Headers that claim an identity; only a verified front proxy may send them.
const IDENTITY_HEADER_PREFIXES: [&str; 2] = ["x-remote-", "impersonate-"];

/// Removes every identity-claiming header.
pub fn strip_identity_headers(headers: &mut http::HeaderMap) {
    let names: Vec<http::HeaderName> = headers
        .keys()
        .filter(|name| {
            IDENTITY_HEADER_PREFIXES
                .iter()
                .any(|p| name.as_str().starts_with(p))
        })
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// Local mode: the user is the subject of a client certificate that rustls verified against the
/// local CA. Identity headers are never trusted here.
#[derive(Debug, Default)]
pub struct LocalAuthenticator;

impl Authenticator for LocalAuthenticator {
    fn authenticate<'a>(&'a self, parts: &'a mut http::request::Parts) -> AuthenticateFuture<'a> {
        strip_identity_headers(&mut parts.headers);
        let user = parts
            .extensions
            .get::<PeerCertificates>()
            .and_then(crate::serve::auth::authenticate_local);
        Box::pin(async move { Ok(user) })
    }
}

/// Local mode: every user the local CA vouches for is an administrator.
#[derive(Debug, Default)]
pub struct AllowAuthenticated;

impl Authorizer for AllowAuthenticated {
    fn authorize<'a>(
        &'a self,
        _user: &'a UserInfo,
        _info: &'a RequestInfo,
    ) -> Pin<Box<dyn Future<Output = Result<(), ApiError>> + Send + 'a>> {
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_headers_are_stripped() {
        let mut h = http::HeaderMap::new();
        h.insert("X-Remote-User", "mallory".parse().unwrap());
        h.insert("x-remote-group", "system:masters".parse().unwrap());
        h.insert("X-Remote-Extra-Scopes", "x".parse().unwrap());
        h.insert("Impersonate-User", "root".parse().unwrap());
        h.insert("Accept", "application/json".parse().unwrap());
        strip_identity_headers(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("accept"));
    }
}
