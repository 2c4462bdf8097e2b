//! The controller's way to the co-located API: a client certificate from an in-memory CA that
//! authenticates as [`CONTROLLER_USER`] in `system:masters`, presented only in process
//! ([`crate::serve::InProcess`]: no socket; the request carries the loopback peer address and
//! this exact leaf, which is all the authenticator accepts it with). The CA's key never leaves
//! this process's memory, and no listener trusts the CA, so the identity cannot come over the
//! network.

use std::time::Duration;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::authn::LoopbackTrust;
use super::config::CaBundle;
use crate::pki::{CertificateAuthority, LeafSpec, PemPair};
use crate::serve::InProcess;
use crate::serve::auth::user_from_client_certificate;

/// The controller's user name.
pub const CONTROLLER_USER: &str = "system:etcd-operator:controller";
/// The controller's group.
pub const CONTROLLER_GROUP: &str = "system:masters";
const VALIDITY: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Setting up the loopback path failed.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    /// Generating the CA or a certificate failed.
    #[error("generate loopback certificates: {0}")]
    Generate(String),
    /// The controller's kube client could not be built.
    #[error("build the controller's loopback client: {0}")]
    Client(String),
}

/// The generated loopback credentials.
pub struct Loopback {
    ca: CertificateAuthority,
    controller: PemPair,
    trust: LoopbackTrust,
}

impl std::fmt::Debug for Loopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loopback").finish_non_exhaustive()
    }
}

impl Loopback {
    /// Generates a fresh CA and the controller's client certificate.
    pub fn generate() -> Result<Self, LoopbackError> {
        let err = |e: &dyn std::fmt::Display| LoopbackError::Generate(e.to_string());
        let ca =
            CertificateAuthority::generate("etcd-operator-loopback-ca", VALIDITY).map_err(|e| err(&e))?;
        let mut client_spec = LeafSpec::client(CONTROLLER_USER, &[CONTROLLER_GROUP]);
        client_spec.validity = VALIDITY;
        let controller = ca.issue(&client_spec).map_err(|e| err(&e))?;
        let leaf = CertificateDer::from_pem_slice(controller.cert_pem.as_bytes()).map_err(|e| err(&e))?;
        let user = user_from_client_certificate(&leaf).map_err(|e| err(&e))?;
        let bundle = CaBundle::from_pem("loopback CA", ca.pem().cert_pem.as_bytes()).map_err(|e| err(&e))?;
        Ok(Self {
            ca,
            controller,
            trust: LoopbackTrust {
                ca: bundle,
                leaf,
                user,
            },
        })
    }

    /// What the authenticator trusts.
    pub fn trust(&self) -> LoopbackTrust {
        self.trust.clone()
    }

    /// A kube client for the controller, whose requests go to `app` in process as
    /// [`CONTROLLER_USER`].
    pub fn client(&self, app: axum::Router) -> Result<kube::Client, LoopbackError> {
        let service = InProcess::from_pem(app, &self.controller.cert_pem)
            .map_err(|e| LoopbackError::Client(etcd_operator_api::report::chain(&e)))?;
        Ok(kube::Client::new(service, "default"))
    }

    /// The controller's client certificate and key (for tests).
    pub fn controller_identity(&self) -> &PemPair {
        &self.controller
    }

    /// The loopback CA certificate (PEM; for tests).
    pub fn ca_pem(&self) -> &str {
        &self.ca.pem().cert_pem
    }
}
