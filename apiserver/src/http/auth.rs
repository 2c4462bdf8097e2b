//! Authentication and authorization seams: local mode trusts client certificates of its own CA;
//! cluster mode (delegated to kube-apiserver) plugs in here too.

use std::future::Future;
use std::pin::Pin;

pub use crate::serve::auth::UserInfo;
use crate::serve::{ConnectionUser, PeerCertificates};

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
        let from_certificate = || {
            parts
                .extensions
                .get::<PeerCertificates>()
                .and_then(crate::serve::auth::authenticate_local)
        };
        // Once per connection: its certificate does not change between its requests.
        let user = match parts.extensions.get::<ConnectionUser>() {
            Some(memo) => memo.0.get_or_init(from_certificate).clone(),
            None => from_certificate(),
        };
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

    fn parts_with(peer: Option<PeerCertificates>, memo: Option<&ConnectionUser>) -> http::request::Parts {
        let mut request = http::Request::get("/").body(()).unwrap();
        if let Some(peer) = peer {
            request.extensions_mut().insert(peer);
        }
        if let Some(memo) = memo {
            request.extensions_mut().insert(memo.clone());
        }
        request.into_parts().0
    }

    fn client_chain(user: &str) -> PeerCertificates {
        let ca = crate::pki::CertificateAuthority::generate("test-ca", std::time::Duration::from_secs(3600))
            .unwrap();
        let leaf = ca.issue(&crate::pki::LeafSpec::client(user, &["devs"])).unwrap();
        let der =
            <rustls_pki_types::CertificateDer<'static> as rustls_pki_types::pem::PemObject>::from_pem_slice(
                leaf.cert_pem.as_bytes(),
            )
            .unwrap();
        PeerCertificates(std::sync::Arc::new(vec![der]))
    }

    /// The user `LocalAuthenticator` finds for a request with `parts`.
    async fn user_name(parts: &mut http::request::Parts) -> Option<String> {
        LocalAuthenticator
            .authenticate(parts)
            .await
            .unwrap()
            .map(|u| u.name)
    }

    #[tokio::test]
    async fn a_connections_certificate_user_is_worked_out_once_and_kept() {
        let memo = ConnectionUser::default();
        let mut first = parts_with(Some(client_chain("alice")), Some(&memo));
        assert_eq!(user_name(&mut first).await.as_deref(), Some("alice"));
        assert_eq!(
            memo.0.get().cloned().flatten().map(|u| u.name),
            Some("alice".to_owned())
        );
        // The next request of the connection takes the kept user: the memo is what is read.
        let kept = ConnectionUser::default();
        let _ = kept.0.set(Some(UserInfo {
            name: "kept".into(),
            ..UserInfo::default()
        }));
        let mut next = parts_with(Some(client_chain("alice")), Some(&kept));
        assert_eq!(user_name(&mut next).await.as_deref(), Some("kept"));
        // Anonymous connections are remembered as anonymous.
        let anonymous = ConnectionUser::default();
        let mut parts = parts_with(Some(PeerCertificates::default()), Some(&anonymous));
        assert_eq!(user_name(&mut parts).await, None);
        assert_eq!(anonymous.0.get(), Some(&None));
    }

    #[tokio::test]
    async fn without_a_memo_each_request_reads_its_certificate() {
        let mut parts = parts_with(Some(client_chain("bob")), None);
        assert_eq!(user_name(&mut parts).await.as_deref(), Some("bob"));
        let mut parts = parts_with(None, None);
        assert_eq!(user_name(&mut parts).await, None);
    }

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
