//! A certificate authority made with rcgen: generate or load a CA, issue server, client and peer
//! certificates with ECDSA P-256 keys, and check a certificate with rustls' own WebPKI verifiers,
//! so that "this certificate is still good" means exactly what a TLS peer will decide. Used for
//! the API server's own certificates and for the etcd clusters the operator runs. Pure: no I/O.
//! A crate of its own so that the API server and the controller both use it and neither depends on
//! the other.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// How long the CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a leaf certificate is valid.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// A certificate that expires within this is replaced at start.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Making a certificate failed.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// rcgen failed to generate a key or sign a certificate.
    #[error("generate {what}")]
    Generate {
        /// What was being made.
        what: String,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// The certificate asked for cannot be made.
    #[error("generate {what}: {reason}")]
    Unsupported {
        /// What was being made.
        what: String,
        /// Why not.
        reason: String,
    },
    /// A date was out of range.
    #[error("compute validity period of {what}: {reason}")]
    Validity {
        /// What was being made.
        what: String,
        /// Why.
        reason: String,
    },
}

/// A certificate or key could not be read, or a certificate did not pass a check.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The text holds no PEM certificate that parses.
    #[error("parse the certificate PEM")]
    Pem(#[source] rustls_pki_types::pem::Error),
    /// The CA key does not parse.
    #[error("parse the CA key")]
    Key(#[source] rcgen::Error),
    /// The CA key is another certificate's.
    #[error("the CA key does not belong to the CA certificate")]
    KeyMismatch,
    /// rcgen cannot sign with the CA certificate.
    #[error("read the CA certificate")]
    Issuer(#[source] rcgen::Error),
    /// rustls does not accept the CA as a trust anchor.
    #[error("trust the CA certificate")]
    Roots(#[source] rustls::Error),
    /// rustls could not build a verifier from the CA.
    #[error("build the certificate verifier")]
    Verifier(#[source] rustls::client::VerifierBuilderError),
    /// The certificate is not valid for a use, a name or a time.
    #[error("not a valid {usage} certificate{} at {at}", name.as_ref().map(|n| format!(" for {n}")).unwrap_or_default())]
    NotValid {
        /// `server` or `client`.
        usage: &'static str,
        /// The server name checked.
        name: Option<String>,
        /// When.
        at: String,
        /// What rustls decided.
        #[source]
        source: Box<rustls::Error>,
    },
    /// The certificate's DER does not parse as X.509.
    #[error("parse the certificate")]
    X509(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
}

/// The rustls crypto provider certificates are checked with (ring, as everywhere here).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate and its private key, PEM-encoded. `Debug` leaves the key out.
#[derive(Clone, PartialEq, Eq)]
pub struct PemPair {
    /// The certificate (a single PEM block).
    pub cert_pem: String,
    /// The PKCS#8 private key.
    pub key_pem: String,
}

impl fmt::Debug for PemPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemPair")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafUsage {
    /// TLS server authentication.
    Server,
    /// TLS client authentication.
    Client,
    /// Both. An etcd peer certificate serves the peer port and authenticates to the other
    /// members' peer ports. An etcd serving certificate needs both too: etcd's JSON gateway
    /// (`/v3/...` over HTTPS) dials etcd's own client port presenting the serving certificate,
    /// and with client certificates required, one for servers only is refused there (etcd
    /// issue 9785: the gateway answers nothing and etcd logs "rejected connection" warnings).
    ServerAndClient,
}

/// A leaf certificate to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSpec {
    /// Subject common name (a client certificate's user name).
    pub common_name: String,
    /// Subject organizations (a client certificate's groups). At most one: rcgen keeps one value
    /// per attribute type in a subject.
    pub organizations: Vec<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// IP subject alternative names.
    pub ips: Vec<IpAddr>,
    /// Server or client authentication.
    pub usage: LeafUsage,
    /// Validity from now.
    pub validity: Duration,
}

impl LeafSpec {
    /// A server certificate for the given names.
    pub fn server(common_name: &str, dns_names: &[&str], ips: &[IpAddr]) -> Self {
        Self {
            common_name: common_name.to_owned(),
            organizations: Vec::new(),
            dns_names: dns_names.iter().map(|s| (*s).to_owned()).collect(),
            ips: ips.to_vec(),
            usage: LeafUsage::Server,
            validity: LEAF_VALIDITY,
        }
    }

    /// A client certificate for user `user` in `groups`.
    pub fn client(user: &str, groups: &[&str]) -> Self {
        Self {
            common_name: user.to_owned(),
            organizations: groups.iter().map(|s| (*s).to_owned()).collect(),
            dns_names: Vec::new(),
            ips: Vec::new(),
            usage: LeafUsage::Client,
            validity: LEAF_VALIDITY,
        }
    }
}

/// A CA able to issue certificates.
pub struct CertificateAuthority {
    pem: PemPair,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("pem", &self.pem)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Generates a new self-signed CA named `common_name`, valid for `validity` (ECDSA P-256).
    pub fn generate(common_name: &str, validity: Duration) -> Result<Self, CertificateError> {
        let what = || format!("CA {common_name}");
        let key =
            KeyPair::generate().map_err(|source| CertificateError::Generate { what: what(), source })?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, validity, &what())?;
        let cert = params
            .self_signed(&key)
            .map_err(|source| CertificateError::Generate { what: what(), source })?;
        let pem = PemPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        Ok(Self {
            pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA from its certificate and key.
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<Self, CheckError> {
        let key = KeyPair::from_pem(key_pem).map_err(CheckError::Key)?;
        let cert = parse_pem(cert_pem)?;
        if !key_matches_certificate(&cert, key_pem) {
            return Err(CheckError::KeyMismatch);
        }
        let issuer = Issuer::from_ca_cert_der(&cert, key).map_err(CheckError::Issuer)?;
        Ok(Self {
            pem: PemPair {
                cert_pem: cert_pem.to_owned(),
                key_pem: key_pem.to_owned(),
            },
            issuer,
        })
    }

    /// The CA certificate and key.
    pub fn pem(&self) -> &PemPair {
        &self.pem
    }

    /// Issues a leaf certificate with a fresh ECDSA P-256 key.
    pub fn issue(&self, spec: &LeafSpec) -> Result<PemPair, CertificateError> {
        let what = || format!("certificate {}", spec.common_name);
        let key =
            KeyPair::generate().map_err(|source| CertificateError::Generate { what: what(), source })?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, spec.common_name.as_str());
        match spec.organizations.as_slice() {
            [] => {}
            [org] => params
                .distinguished_name
                .push(DnType::OrganizationName, org.as_str()),
            _ => {
                return Err(CertificateError::Unsupported {
                    what: what(),
                    reason: "more than one organization (rcgen keeps one value per subject attribute)".into(),
                });
            }
        }
        for name in &spec.dns_names {
            let name = name
                .clone()
                .try_into()
                .map_err(|source| CertificateError::Generate { what: what(), source })?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        params
            .subject_alt_names
            .extend(spec.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match spec.usage {
            LeafUsage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            LeafUsage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            LeafUsage::ServerAndClient => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, spec.validity, &what())?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| CertificateError::Generate { what: what(), source })?;
        Ok(PemPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Checks that `cert_pem` is a server certificate this CA issued, valid for every name in
    /// `names` both at `at` and [`RENEW_BEFORE`] later.
    pub fn verify_server(
        &self,
        cert_pem: &str,
        names: &[ServerName<'_>],
        at: SystemTime,
    ) -> Result<(), CheckError> {
        let leaf = parse_pem(cert_pem)?;
        let verifier = WebPkiServerVerifier::builder_with_provider(self.roots()?, provider())
            .build()
            .map_err(CheckError::Verifier)?;
        for when in [at, at + RENEW_BEFORE] {
            for name in names {
                verifier
                    .verify_server_cert(&leaf, &[], name, &[], unix_time(when))
                    .map_err(|source| CheckError::NotValid {
                        usage: "server",
                        name: Some(format!("{name:?}")),
                        at: timestamp(when),
                        source: Box::new(source),
                    })?;
            }
        }
        Ok(())
    }

    /// Checks that `cert_pem` is a client certificate this CA issued, valid both at `at` and
    /// [`RENEW_BEFORE`] later.
    pub fn verify_client(&self, cert_pem: &str, at: SystemTime) -> Result<(), CheckError> {
        let leaf = parse_pem(cert_pem)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots()?, provider())
            .build()
            .map_err(CheckError::Verifier)?;
        for when in [at, at + RENEW_BEFORE] {
            verifier
                .verify_client_cert(&leaf, &[], unix_time(when))
                .map_err(|source| CheckError::NotValid {
                    usage: "client",
                    name: None,
                    at: timestamp(when),
                    source: Box::new(source),
                })?;
        }
        Ok(())
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, CheckError> {
        let mut roots = rustls::RootCertStore::empty();
        let ca = parse_pem(&self.pem.cert_pem)?;
        roots.add(ca).map_err(CheckError::Roots)?;
        Ok(Arc::new(roots))
    }
}

/// The first certificate of a PEM text.
fn parse_pem(cert_pem: &str) -> Result<CertificateDer<'static>, CheckError> {
    CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(CheckError::Pem)
}

/// Whether `key_pem` is the private key of `cert` (rustls compares the public keys).
pub fn key_matches_certificate(cert: &CertificateDer<'_>, key_pem: &str) -> bool {
    let Ok(key) = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()) else {
        return false;
    };
    let provider = provider();
    rustls::sign::CertifiedKey::from_der(vec![cert.clone().into_owned()], key, &provider).is_ok()
}

/// When the (first) certificate in `cert_pem` stops being valid.
pub fn not_after(cert_pem: &str) -> Result<SystemTime, CheckError> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let der = parse_pem(cert_pem)?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(CheckError::X509)?;
    let seconds = u64::try_from(cert.validity().not_after.timestamp()).unwrap_or_default();
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
}

/// Sets `not_before` to yesterday (tolerating clock skew) and `not_after` to now + `validity`, at
/// day precision (what `rcgen::date_time_ymd` offers without a direct dependency on `time`).
fn set_validity(
    params: &mut CertificateParams,
    validity: Duration,
    what: &str,
) -> Result<(), CertificateError> {
    let err = |e: jiff::Error| CertificateError::Validity {
        what: what.to_owned(),
        reason: e.to_string(),
    };
    let today = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
    let days = i64::try_from(validity.as_secs() / 86_400).unwrap_or(i64::MAX);
    let start = today.yesterday().map_err(err)?;
    let end = today
        .checked_add(jiff::Span::new().try_days(days).map_err(err)?)
        .map_err(err)?;
    let ymd = |d: jiff::civil::Date| {
        // jiff dates are always valid calendar dates with month 1..=12 and day 1..=31, so
        // date_time_ymd's own range checks cannot fail for them.
        rcgen::date_time_ymd(
            i32::from(d.year()),
            d.month().unsigned_abs(),
            d.day().unsigned_abs(),
        )
    };
    params.not_before = ymd(start);
    params.not_after = ymd(end);
    Ok(())
}

fn unix_time(at: SystemTime) -> UnixTime {
    UnixTime::since_unix_epoch(at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default())
}

fn timestamp(at: SystemTime) -> String {
    jiff::Timestamp::try_from(at)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{at:?}"))
}
