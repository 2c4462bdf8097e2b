//! The controller's way to the co-located API: a loopback-only HTTPS listener whose TLS trusts
//! one in-memory CA, and a client certificate from it that authenticates as
//! [`CONTROLLER_USER`] in `system:masters`, only from a loopback peer and only as that exact leaf.
//! The CA's key never leaves this process's memory.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::authn::LoopbackTrust;
use super::config::CaBundle;
use crate::kubeconfig::{ClientIdentity, Kubeconfig};
use crate::pki::{CertificateAuthority, LeafSpec, PemPair};
use crate::serve::auth::user_from_client_certificate;
use crate::serve::tls::{self, ALPN_PROTOCOLS};

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
    /// The TLS configuration could not be built.
    #[error("build loopback TLS configuration: {0}")]
    Tls(String),
    /// The controller's kube client could not be built.
    #[error("build the controller's loopback client: {0}")]
    Client(String),
}

/// The generated loopback credentials.
pub struct Loopback {
    ca: CertificateAuthority,
    server: PemPair,
    controller: PemPair,
    trust: LoopbackTrust,
}

impl std::fmt::Debug for Loopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loopback").finish_non_exhaustive()
    }
}

impl Loopback {
    /// Generates a fresh CA, a serving certificate for 127.0.0.1 and ::1, and the controller's
    /// client certificate.
    pub fn generate() -> Result<Self, LoopbackError> {
        let err = |e: &dyn std::fmt::Display| LoopbackError::Generate(e.to_string());
        let ca =
            CertificateAuthority::generate("etcd-operator-loopback-ca", VALIDITY).map_err(|e| err(&e))?;
        let mut server_spec = LeafSpec::server(
            "etcd-operator-loopback",
            &["localhost"],
            &[
                std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::Ipv6Addr::LOCALHOST.into(),
            ],
        );
        server_spec.validity = VALIDITY;
        let server = ca.issue(&server_spec).map_err(|e| err(&e))?;
        let mut client_spec = LeafSpec::client(CONTROLLER_USER, &[CONTROLLER_GROUP]);
        client_spec.validity = VALIDITY;
        let controller = ca.issue(&client_spec).map_err(|e| err(&e))?;
        let leaf = CertificateDer::from_pem_slice(controller.cert_pem.as_bytes()).map_err(|e| err(&e))?;
        let user = user_from_client_certificate(&leaf).map_err(|e| err(&e))?;
        let bundle = CaBundle::from_pem("loopback CA", ca.pem().cert_pem.as_bytes()).map_err(|e| err(&e))?;
        Ok(Self {
            ca,
            server,
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

    /// The loopback listener's TLS: the loopback serving certificate, and a client certificate
    /// from the loopback CA **required** (nobody else has one).
    pub fn server_config(&self) -> Result<rustls::ServerConfig, LoopbackError> {
        let err = |e: &dyn std::fmt::Display| LoopbackError::Tls(e.to_string());
        let roots = tls::root_store(self.ca.pem().cert_pem.as_bytes()).map_err(|e| err(&e))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), tls::provider())
            .build()
            .map_err(|e| err(&e))?;
        let chain = tls::parse_certificates(self.server.cert_pem.as_bytes()).map_err(|e| err(&e))?;
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(self.server.key_pem.as_bytes())
            .map_err(|e| err(&e))?;
        let mut config = rustls::ServerConfig::builder_with_provider(tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| err(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| err(&e))?;
        config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    /// A kube client for the controller, talking to the loopback listener at `addr` as
    /// [`CONTROLLER_USER`].
    pub async fn client(&self, addr: SocketAddr) -> Result<kube::Client, LoopbackError> {
        let err = |e: &dyn std::fmt::Display| LoopbackError::Client(e.to_string());
        let identity = ClientIdentity {
            server_url: format!("https://{addr}"),
            ca_pem: self.ca.pem().cert_pem.clone(),
            user: CONTROLLER_USER.to_owned(),
            cert_pem: self.controller.cert_pem.clone(),
            key_pem: self.controller.key_pem.clone(),
        };
        let yaml = Kubeconfig::for_identity(&identity)
            .to_yaml()
            .map_err(|e| err(&e))?;
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).map_err(|e| err(&e))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| err(&e))?;
        kube::Client::try_from(config).map_err(|e| err(&e))
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
