//! TLS configuration for the HTTPS server: rustls with the ring provider, TLS 1.2 and 1.3, ALPN
//! `h2` and `http/1.1`, client certificates requested but not required.
//!
//! The build links both of rustls' providers (ring, and aws-lc-rs through other crates), so rustls
//! cannot pick a process default by itself: every config here names ring explicitly, and
//! [`install_crypto_provider`] sets ring as the process default for code that does not (kube's
//! client, etcd-client's TLS).

use std::sync::{Arc, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN protocols offered, most preferred first.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Building a TLS configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The serving certificate chain is not valid PEM.
    #[error("parse serving certificate chain PEM")]
    ParseCertificateChain(#[source] rustls_pki_types::pem::Error),
    /// The serving certificate PEM holds no certificate.
    #[error("parse serving certificate chain PEM: no CERTIFICATE block found")]
    EmptyCertificateChain,
    /// The private key is not valid PEM (PKCS#8, PKCS#1 or SEC1).
    #[error("parse serving private key PEM")]
    ParsePrivateKey(#[source] rustls_pki_types::pem::Error),
    /// The client CA bundle is not valid PEM.
    #[error("parse client CA bundle PEM")]
    ParseClientCa(#[source] rustls_pki_types::pem::Error),
    /// The client CA bundle holds no certificate.
    #[error("parse client CA bundle PEM: no CERTIFICATE block found")]
    EmptyClientCa,
    /// A client CA certificate is not a usable trust anchor.
    #[error("add client CA certificate to the trust store")]
    AddClientCa(#[source] rustls::Error),
    /// The ring provider does not support the requested protocol versions.
    #[error("select TLS protocol versions")]
    ProtocolVersions(#[source] rustls::Error),
    /// The client certificate verifier could not be built.
    #[error("build client certificate verifier")]
    ClientVerifier(#[source] rustls::server::VerifierBuilderError),
    /// The key does not match the certificate, or is of an unsupported type.
    #[error("load serving certificate and key")]
    CertifiedKey(#[source] rustls::Error),
}

/// The crypto provider every config of this crate uses: ring.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs ring as the process-wide default rustls provider. Idempotent: if a default is already
/// installed (by an earlier call or by another component), that one stays and this does nothing.
pub fn install_crypto_provider() {
    if CryptoProvider::get_default().is_some() {
        return;
    }
    // Losing a race against another installer is fine: some provider is then the default.
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        tracing::debug!("a rustls crypto provider was installed concurrently; keeping it");
    }
}

/// Parses every certificate of a PEM bundle.
pub fn parse_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, rustls_pki_types::pem::Error> {
    CertificateDer::pem_slice_iter(pem).collect()
}

/// Builds the server's TLS configuration.
///
/// * Protocols: TLS 1.3 and 1.2 (rustls implements nothing older, so 1.0 and 1.1 are never
///   offered; this matches Go's `MinVersion: tls.VersionTLS12` in k8s.io/apiserver).
/// * ALPN: `h2`, then `http/1.1`.
/// * Client certificates: with `client_ca_pem`, requested but **not required** (health probes come
///   without one, as Go's `tls.RequestClientCert`), and a certificate that *is* presented must chain
///   to one of those CAs with the clientAuth usage or the handshake fails. Without it, none is asked.
pub fn server_config(
    cert_chain_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let chain = parse_certificates(cert_chain_pem).map_err(TlsError::ParseCertificateChain)?;
    if chain.is_empty() {
        return Err(TlsError::EmptyCertificateChain);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(TlsError::ParsePrivateKey)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::ProtocolVersions)?;
    let builder = match client_ca_pem {
        Some(ca_pem) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(root_store(ca_pem)?), provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(TlsError::ClientVerifier)?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(TlsError::CertifiedKey)?;
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A trust store holding every certificate of a PEM bundle.
pub fn root_store(ca_pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let cas = parse_certificates(ca_pem).map_err(TlsError::ParseClientCa)?;
    if cas.is_empty() {
        return Err(TlsError::EmptyClientCa);
    }
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots.add(ca).map_err(TlsError::AddClientCa)?;
    }
    Ok(roots)
}

/// The server configuration in force, replaceable while serving (certificate rotation, a changed
/// client CA bundle). New connections use the configuration current at their accept; established
/// ones keep theirs.
#[derive(Debug, Clone)]
pub struct ReloadableTls {
    current: Arc<RwLock<Arc<ServerConfig>>>,
}

impl ReloadableTls {
    /// Starts with `config`.
    pub fn new(config: Arc<ServerConfig>) -> Self {
        Self {
            current: Arc::new(RwLock::new(config)),
        }
    }

    /// The configuration new connections get.
    pub fn current(&self) -> Arc<ServerConfig> {
        // A poisoned lock only means a writer panicked mid-assignment of an `Arc`, which cannot
        // leave it half-written: keep using the value.
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the configuration for connections accepted from now on.
    pub fn replace(&self, config: Arc<ServerConfig>) {
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = config;
        tracing::info!("TLS server configuration replaced");
    }
}

impl From<ServerConfig> for ReloadableTls {
    fn from(config: ServerConfig) -> Self {
        Self::new(Arc::new(config))
    }
}

impl From<Arc<ServerConfig>> for ReloadableTls {
    fn from(config: Arc<ServerConfig>) -> Self {
        Self::new(config)
    }
}
