//! The co-located controller's way to this server without a socket: its requests go straight into
//! the router, carrying the extensions the accept loop gives a TLS connection from the loopback
//! address that presented the controller's certificate. Authentication, authorization, admission,
//! metrics and everything after them are the network path's; only TLS, TCP and HTTP framing are
//! skipped. kube-apiserver's loopback client (an in-process transport with a privileged
//! identity) is the precedent.
//!
//! Hand-written: hyper and tower have no in-process transport for an axum router with the
//! request extensions of a TLS connection; this is the thin adapter between kube's client
//! service and the router.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tower::ServiceExt;

use super::{ConnectionUser, PeerCertificates, RemoteAddr};

/// The peer address in-process requests carry: the loopback address, port 0 (no socket).
pub const IN_PROCESS_PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// Reading the in-process client's certificate failed.
#[derive(Debug, thiserror::Error)]
#[error("read the in-process client's certificate chain")]
pub struct InProcessCertificateError(#[source] rustls_pki_types::pem::Error);

/// A [`tower::Service`] that hands requests to `app` as if they came over a TLS connection from
/// the loopback address presenting `chain`. Cheap to clone (the router and the chain are shared).
#[derive(Clone)]
pub struct InProcess {
    app: Router,
    peer: PeerCertificates,
    /// One "connection" for all its clones: the certificate's user is worked out once.
    user: ConnectionUser,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess")
            .field("client_certificates", &self.peer.0.len())
            .finish_non_exhaustive()
    }
}

impl InProcess {
    /// Requests to `app` presenting `chain` (leaf first).
    pub fn new(app: Router, chain: Vec<CertificateDer<'static>>) -> Self {
        Self {
            app,
            peer: PeerCertificates(Arc::new(chain)),
            user: ConnectionUser::default(),
        }
    }

    /// Requests to `app` presenting the certificates of `cert_pem` (leaf first), as a client
    /// configured with that PEM would over TLS.
    pub fn from_pem(app: Router, cert_pem: &str) -> Result<Self, InProcessCertificateError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(InProcessCertificateError)?;
        Ok(Self::new(app, chain))
    }
}

impl<B> tower::Service<http::Request<B>> for InProcess
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = http::Response<axum::body::Body>;
    type Error = Infallible;
    type Future = tower::util::Oneshot<Router, http::Request<axum::body::Body>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The router is always ready (axum's `Router::poll_ready`); each call gets its own clone.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let mut request = request.map(axum::body::Body::new);
        // What the accept loop puts on every request of a connection (see `server`).
        request.extensions_mut().insert(self.peer.clone());
        request.extensions_mut().insert(self.user.clone());
        request.extensions_mut().insert(RemoteAddr(IN_PROCESS_PEER));
        self.app.clone().oneshot(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use http_body_util::BodyExt;

    fn echo() -> Router {
        Router::new().route(
            "/who",
            get(|request: http::Request<axum::body::Body>| async move {
                let peer = request
                    .extensions()
                    .get::<PeerCertificates>()
                    .map(|p| p.0.iter().map(|c| c.as_ref().len()).collect::<Vec<_>>());
                let remote = request.extensions().get::<RemoteAddr>().map(|r| r.0);
                format!("{peer:?} {remote:?}")
            }),
        )
    }

    #[tokio::test]
    async fn requests_carry_the_connection_extensions_of_a_loopback_tls_client() {
        let chain = vec![
            CertificateDer::from(vec![1_u8; 3]),
            CertificateDer::from(vec![2_u8; 5]),
        ];
        let service = InProcess::new(echo(), chain);
        let request = http::Request::get("/who")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            "Some([3, 5]) Some(127.0.0.1:0)"
        );
    }

    #[tokio::test]
    async fn unknown_paths_get_the_routers_answer() {
        let service = InProcess::new(echo(), Vec::new());
        let request = http::Request::get("/nothing")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_certificate_that_is_not_pem_is_refused() {
        let pem = "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n";
        let error = InProcess::from_pem(echo(), pem).unwrap_err();
        assert!(
            error.to_string().contains("in-process client's certificate"),
            "{error}"
        );
    }

    #[test]
    fn a_pem_chain_is_read_leaf_first() {
        let ca = crate::pki::CertificateAuthority::generate("test-ca", std::time::Duration::from_secs(3600))
            .unwrap();
        let leaf = ca
            .issue(&crate::pki::LeafSpec::client("someone", &["group"]))
            .unwrap();
        let pem = format!("{}{}", leaf.cert_pem, ca.pem().cert_pem);
        let service = InProcess::from_pem(echo(), &pem).unwrap();
        assert_eq!(service.peer.0.len(), 2);
        let user = crate::serve::auth::authenticate_local(&service.peer).unwrap();
        assert_eq!(user.name, "someone");
    }
}
