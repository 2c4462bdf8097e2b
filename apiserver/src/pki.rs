//! Certificates for local mode (and the loopback identity of serve mode): a CA created once under
//! `DIR/pki/`, and the serving, admin and controller certificates it signs, reused across restarts
//! and re-issued from the same CA when they no longer fit (a new listen address, close to expiry,
//! a lost key).
//!
//! Certificates are made with rcgen and checked with rustls' own WebPKI verifiers, so that "this
//! certificate is still good" means exactly what a TLS peer will decide.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
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

use crate::files;
use crate::serve::auth::user_from_client_certificate;
use crate::serve::tls;

/// The user name of the admin client certificate (written into the kubeconfig).
pub const ADMIN_USER: &str = "admin";
/// The user name of the in-process controller's client certificate.
pub const CONTROLLER_USER: &str = "system:etcd-operator:controller";
/// The group that Kubernetes authorization lets do anything; both local identities have it.
pub const MASTERS_GROUP: &str = "system:masters";

/// How long the CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a leaf certificate is valid.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// A certificate that expires within this is replaced at start.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Creating, loading or checking certificates failed.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A state file could not be read or written.
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Only one of the CA's two files exists.
    #[error(
        "load CA: {} exists but {} does not; remove {} to start over with a new CA (and a new kubeconfig)",
        present.display(), missing.display(), dir.display()
    )]
    IncompleteCa {
        present: PathBuf,
        missing: PathBuf,
        dir: PathBuf,
    },
    /// The stored CA cannot be used.
    #[error("load CA from {}: {reason}; remove {} to start over with a new CA (and a new kubeconfig)", path.display(), dir.display())]
    InvalidCa {
        path: PathBuf,
        dir: PathBuf,
        reason: String,
    },
    /// rcgen failed to generate a key or sign a certificate.
    #[error("generate {what}: {source}")]
    Generate {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    /// The certificate asked for cannot be made.
    #[error("generate {what}: {reason}")]
    Unsupported { what: String, reason: String },
    /// A date was out of range.
    #[error("compute validity period of {what}: {reason}")]
    Validity { what: String, reason: String },
    /// A certificate does not verify against the CA (for the given names and time).
    #[error("verify {what} against the CA: {reason}")]
    Verify { what: String, reason: String },
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
    pub fn generate(common_name: &str, validity: Duration) -> Result<Self, PkiError> {
        let what = || format!("CA {common_name}");
        let key = KeyPair::generate().map_err(|source| PkiError::Generate { what: what(), source })?;
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
            .map_err(|source| PkiError::Generate { what: what(), source })?;
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
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<Self, String> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| format!("parse CA key: {e}"))?;
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| format!("parse CA certificate: {e}"))?;
        if !key_matches_certificate(&cert, key_pem) {
            return Err("the CA key does not belong to the CA certificate".into());
        }
        let issuer = Issuer::from_ca_cert_der(&cert, key).map_err(|e| format!("read CA certificate: {e}"))?;
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
    pub fn issue(&self, spec: &LeafSpec) -> Result<PemPair, PkiError> {
        let what = || format!("certificate {}", spec.common_name);
        let key = KeyPair::generate().map_err(|source| PkiError::Generate { what: what(), source })?;
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
                return Err(PkiError::Unsupported {
                    what: what(),
                    reason: "more than one organization (rcgen keeps one value per subject attribute)".into(),
                });
            }
        }
        for name in &spec.dns_names {
            let name = name
                .clone()
                .try_into()
                .map_err(|source| PkiError::Generate { what: what(), source })?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        params
            .subject_alt_names
            .extend(spec.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![match spec.usage {
            LeafUsage::Server => ExtendedKeyUsagePurpose::ServerAuth,
            LeafUsage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, spec.validity, &what())?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| PkiError::Generate { what: what(), source })?;
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
    ) -> Result<(), String> {
        let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| format!("parse: {e}"))?;
        let verifier = WebPkiServerVerifier::builder_with_provider(self.roots()?, tls::provider())
            .build()
            .map_err(|e| format!("build verifier: {e}"))?;
        for when in [at, at + RENEW_BEFORE] {
            for name in names {
                verifier
                    .verify_server_cert(&leaf, &[], name, &[], unix_time(when))
                    .map_err(|e| format!("for {name:?} at {}: {e}", timestamp(when)))?;
            }
        }
        Ok(())
    }

    /// Checks that `cert_pem` is a client certificate this CA issued, valid both at `at` and
    /// [`RENEW_BEFORE`] later.
    pub fn verify_client(&self, cert_pem: &str, at: SystemTime) -> Result<(), String> {
        let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| format!("parse: {e}"))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots()?, tls::provider())
            .build()
            .map_err(|e| format!("build verifier: {e}"))?;
        for when in [at, at + RENEW_BEFORE] {
            verifier
                .verify_client_cert(&leaf, &[], unix_time(when))
                .map_err(|e| format!("at {}: {e}", timestamp(when)))?;
        }
        Ok(())
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, String> {
        tls::root_store(self.pem.cert_pem.as_bytes())
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }
}

/// Every certificate of local mode, as stored in `DIR/pki/`.
#[derive(Debug, Clone)]
pub struct LocalPki {
    /// The directory holding the files.
    pub dir: PathBuf,
    /// The CA (`ca.crt`, `ca.key`): trusted by the kubeconfig, and the client CA of the server.
    pub ca: PemPair,
    /// The serving certificate (`server.crt`, `server.key`).
    pub server: PemPair,
    /// The admin client certificate (`admin.crt`, `admin.key`): CN `admin`, O `system:masters`.
    pub admin: PemPair,
    /// The controller's client certificate (`controller.crt`, `controller.key`).
    pub controller: PemPair,
}

impl LocalPki {
    /// Path of the CA certificate.
    pub fn ca_cert_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Paths of a pair's certificate and key, by base name (`server`, `admin`, `controller`).
    pub fn pair_paths(&self, base: &str) -> (PathBuf, PathBuf) {
        pair_paths(&self.dir, base)
    }
}

fn pair_paths(dir: &Path, base: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{base}.crt")), dir.join(format!("{base}.key")))
}

/// The names the serving certificate must cover for `listen_ip`: `localhost`, both loopback
/// addresses, and `listen_ip` itself unless it is a wildcard.
pub fn serving_names(listen_ip: IpAddr) -> (Vec<&'static str>, Vec<IpAddr>) {
    let mut ips: Vec<IpAddr> = vec![
        IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
    ];
    if !listen_ip.is_unspecified() && !ips.contains(&listen_ip) {
        ips.push(listen_ip);
    }
    (vec!["localhost"], ips)
}

/// Loads the PKI from `dir`, creating what is missing; a leaf that does not verify against the CA,
/// does not cover the serving names for `listen_ip`, or expires within [`RENEW_BEFORE`] is
/// re-issued from the same CA. The CA itself is only created when neither of its files exists.
pub fn ensure(dir: &Path, listen_ip: IpAddr) -> Result<LocalPki, PkiError> {
    files::create_private_dir(dir).map_err(|source| PkiError::Io {
        action: "create PKI directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let ca = ensure_ca(dir)?;
    let now = SystemTime::now();

    let (dns, ips) = serving_names(listen_ip);
    let names: Vec<ServerName<'static>> = dns
        .iter()
        .filter_map(|d| ServerName::try_from(*d).ok())
        .chain(ips.iter().map(|ip| ServerName::from(*ip)))
        .collect();
    let server = ensure_leaf(
        dir,
        "server",
        &ca,
        &LeafSpec::server("etcd-operator-local", &dns, &ips),
        |pem| ca.verify_server(&pem.cert_pem, &names, now),
    )?;
    let admin = ensure_client(dir, "admin", &ca, ADMIN_USER, now)?;
    let controller = ensure_client(dir, "controller", &ca, CONTROLLER_USER, now)?;
    Ok(LocalPki {
        dir: dir.to_path_buf(),
        ca: ca.pem().clone(),
        server,
        admin,
        controller,
    })
}

fn ensure_ca(dir: &Path) -> Result<CertificateAuthority, PkiError> {
    let (cert_path, key_path) = pair_paths(dir, "ca");
    let cert = read(&cert_path)?;
    let key = read(&key_path)?;
    match (cert, key) {
        (Some(cert), Some(key)) => {
            let invalid = |reason: String| PkiError::InvalidCa {
                path: cert_path.clone(),
                dir: dir.to_path_buf(),
                reason,
            };
            let ca = CertificateAuthority::load(&cert, &key).map_err(invalid)?;
            if let Err(reason) = check_ca_validity(&cert) {
                return Err(invalid(reason));
            }
            tracing::debug!(path = %cert_path.display(), "reusing local CA");
            Ok(ca)
        }
        (None, None) => {
            let name = format!(
                "etcd-operator-local-ca@{}",
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default()
            );
            let ca = CertificateAuthority::generate(&name, CA_VALIDITY)?;
            write_pair(dir, "ca", ca.pem())?;
            tracing::info!(path = %cert_path.display(), "created local CA");
            Ok(ca)
        }
        (Some(_), None) => Err(PkiError::IncompleteCa {
            present: cert_path,
            missing: key_path,
            dir: dir.to_path_buf(),
        }),
        (None, Some(_)) => Err(PkiError::IncompleteCa {
            present: key_path,
            missing: cert_path,
            dir: dir.to_path_buf(),
        }),
    }
}

/// A CA whose own validity ends within [`RENEW_BEFORE`] cannot sign a useful leaf.
fn check_ca_validity(cert_pem: &str) -> Result<(), String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| format!("parse: {e}"))?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(|e| format!("parse: {e}"))?;
    let not_after = cert.validity().not_after.timestamp();
    let limit = SystemTime::now() + RENEW_BEFORE;
    let limit = limit
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    if not_after < i64::try_from(limit).unwrap_or(i64::MAX) {
        return Err(format!(
            "the CA expires at {} (or has expired)",
            cert.validity().not_after
        ));
    }
    Ok(())
}

fn ensure_client(
    dir: &Path,
    base: &str,
    ca: &CertificateAuthority,
    user: &str,
    now: SystemTime,
) -> Result<PemPair, PkiError> {
    ensure_leaf(dir, base, ca, &LeafSpec::client(user, &[MASTERS_GROUP]), |pem| {
        ca.verify_client(&pem.cert_pem, now)?;
        let der = CertificateDer::from_pem_slice(pem.cert_pem.as_bytes()).map_err(|e| e.to_string())?;
        let identity = user_from_client_certificate(&der).map_err(|e| e.to_string())?;
        if identity.name != user || !identity.in_group(MASTERS_GROUP) {
            return Err(format!(
                "identity {} {:?} instead of {user} in {MASTERS_GROUP}",
                identity.name, identity.groups
            ));
        }
        Ok(())
    })
}

/// Reuses the stored pair `base` if `check` accepts it and its key matches, else issues and stores
/// a new one.
fn ensure_leaf(
    dir: &Path,
    base: &str,
    ca: &CertificateAuthority,
    spec: &LeafSpec,
    check: impl Fn(&PemPair) -> Result<(), String>,
) -> Result<PemPair, PkiError> {
    let (cert_path, key_path) = pair_paths(dir, base);
    if let (Some(cert_pem), Some(key_pem)) = (read(&cert_path)?, read(&key_path)?) {
        let stored = PemPair { cert_pem, key_pem };
        let verdict = check(&stored).and_then(|()| {
            let der =
                CertificateDer::from_pem_slice(stored.cert_pem.as_bytes()).map_err(|e| e.to_string())?;
            if key_matches_certificate(&der, &stored.key_pem) {
                Ok(())
            } else {
                Err("the key does not belong to the certificate".into())
            }
        });
        match verdict {
            Ok(()) => {
                tracing::debug!(path = %cert_path.display(), "reusing certificate");
                return Ok(stored);
            }
            Err(reason) => {
                tracing::info!(path = %cert_path.display(), %reason, "re-issuing certificate");
            }
        }
    }
    let pair = ca.issue(spec)?;
    write_pair(dir, base, &pair)?;
    tracing::info!(path = %cert_path.display(), common_name = %spec.common_name, "issued certificate");
    Ok(pair)
}

/// Whether `key_pem` is the private key of `cert` (rustls compares the public keys).
fn key_matches_certificate(cert: &CertificateDer<'_>, key_pem: &str) -> bool {
    let Ok(key) = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()) else {
        return false;
    };
    let provider = tls::provider();
    rustls::sign::CertifiedKey::from_der(vec![cert.clone().into_owned()], key, &provider).is_ok()
}

fn read(path: &Path) -> Result<Option<String>, PkiError> {
    files::read_optional(path).map_err(|source| PkiError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })
}

fn write_pair(dir: &Path, base: &str, pair: &PemPair) -> Result<(), PkiError> {
    let (cert_path, key_path) = pair_paths(dir, base);
    // Key first: a crash in between leaves a key without its certificate, which is re-issued.
    for (path, contents, mode) in [
        (&key_path, &pair.key_pem, files::PRIVATE),
        (&cert_path, &pair.cert_pem, files::PUBLIC),
    ] {
        files::write_atomic(path, contents.as_bytes(), mode).map_err(|source| PkiError::Io {
            action: "write",
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Sets `not_before` to yesterday (tolerating clock skew) and `not_after` to now + `validity`, at
/// day precision (what `rcgen::date_time_ymd` offers without a direct dependency on `time`).
fn set_validity(params: &mut CertificateParams, validity: Duration, what: &str) -> Result<(), PkiError> {
    let err = |e: jiff::Error| PkiError::Validity {
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
