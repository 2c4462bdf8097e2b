//! Certificates for local mode (and the loopback identity of serve mode): a CA created once under
//! `DIR/pki/`, and the serving, admin and controller certificates it signs, reused across restarts
//! and re-issued from the same CA when they no longer fit (a new listen address, close to expiry,
//! a lost key).
//!
//! Certificates are made with rcgen and checked with rustls' own WebPKI verifiers, so that "this
//! certificate is still good" means exactly what a TLS peer will decide.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

use etcd_operator_pki::key_matches_certificate;
pub use etcd_operator_pki::{
    CA_VALIDITY, CertificateAuthority, CertificateError, CheckError, LEAF_VALIDITY, LeafSpec, LeafUsage,
    PemPair, RENEW_BEFORE,
};

use crate::files;
use crate::serve::auth::user_from_client_certificate;

/// The user name of the admin client certificate (written into the kubeconfig).
pub const ADMIN_USER: &str = "admin";
/// The user name of the in-process controller's client certificate.
pub const CONTROLLER_USER: &str = "system:etcd-operator:controller";
/// The group that Kubernetes authorization lets do anything; both local identities have it.
pub const MASTERS_GROUP: &str = "system:masters";

/// Creating, loading or checking certificates failed.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A state file could not be read or written.
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Only one of the CA's two files exists.
    #[error(
        "load CA: {} exists but {} does not; remove {} to start over with a new CA (and every certificate issued again from it)",
        present.display(), missing.display(), dir.display()
    )]
    IncompleteCa {
        present: PathBuf,
        missing: PathBuf,
        dir: PathBuf,
    },
    /// The stored CA cannot be used.
    #[error("load CA from {} (remove {} to start over with a new CA, and every certificate issued again from it)", path.display(), dir.display())]
    InvalidCa {
        path: PathBuf,
        dir: PathBuf,
        #[source]
        source: UnusableCa,
    },
    /// A certificate could not be made.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    /// A certificate does not verify against the CA (for the given names and time).
    #[error("verify {what} against the CA: {reason}")]
    Verify { what: String, reason: String },
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
    let ca = ensure_ca(dir, "etcd-operator-local-ca")?;
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
        |pem| Ok(ca.verify_server(&pem.cert_pem, &names, now)?),
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

/// Loads the CA `ca.{crt,key}` of `dir`, or creates one named `<name>@<unix time>` when neither
/// file exists. Half a CA, or one that cannot be used (or expires within [`RENEW_BEFORE`]), is an
/// error: a CA is never replaced silently.
pub fn ensure_ca(dir: &Path, name: &str) -> Result<CertificateAuthority, PkiError> {
    let (cert_path, key_path) = pair_paths(dir, "ca");
    let cert = read(&cert_path)?;
    let key = read(&key_path)?;
    match (cert, key) {
        (Some(cert), Some(key)) => {
            let invalid = |source: UnusableCa| PkiError::InvalidCa {
                path: cert_path.clone(),
                dir: dir.to_path_buf(),
                source,
            };
            let ca = CertificateAuthority::load(&cert, &key).map_err(|e| invalid(UnusableCa::Load(e)))?;
            check_ca_validity(&cert).map_err(invalid)?;
            tracing::debug!(path = %cert_path.display(), "reusing local CA");
            Ok(ca)
        }
        (None, None) => {
            let name = format!(
                "{name}@{}",
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default()
            );
            let ca = CertificateAuthority::generate(&name, CA_VALIDITY)?;
            write_pair(dir, "ca", ca.pem())?;
            tracing::info!(path = %cert_path.display(), "created CA");
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
fn check_ca_validity(cert_pem: &str) -> Result<(), UnusableCa> {
    let not_after = etcd_operator_pki::not_after(cert_pem).map_err(UnusableCa::Load)?;
    if not_after < SystemTime::now() + RENEW_BEFORE {
        return Err(UnusableCa::Expiring {
            at: jiff::Timestamp::try_from(not_after).map_or_else(|_| "?".to_owned(), |t| t.to_string()),
        });
    }
    Ok(())
}

/// Why the stored CA cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum UnusableCa {
    /// It does not load or parse.
    #[error("read the CA")]
    Load(#[source] CheckError),
    /// It expires too soon to sign a useful certificate.
    #[error("the CA expires at {at} (or has expired)")]
    Expiring {
        /// When.
        at: String,
    },
}

/// Why a stored certificate is not used again, but issued anew.
#[derive(Debug, thiserror::Error)]
pub enum Reissue {
    /// It does not pass the CA's checks (expired, expiring, another CA's, wrong use or name).
    #[error("the certificate is no longer good")]
    Check(#[from] CheckError),
    /// Its key is not its certificate's.
    #[error("the key does not belong to the certificate")]
    KeyMismatch,
    /// A client certificate's identity cannot be read.
    #[error("read the client identity")]
    Identity(#[from] crate::serve::auth::CertificateIdentityError),
    /// A client certificate names another user or lacks the group.
    #[error("identity {name} {groups:?} instead of {user} in {MASTERS_GROUP}")]
    WrongIdentity {
        /// The user it names.
        name: String,
        /// Its groups.
        groups: Vec<String>,
        /// The user it should name.
        user: String,
    },
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
        let der = CertificateDer::from_pem_slice(pem.cert_pem.as_bytes()).map_err(CheckError::Pem)?;
        let identity = user_from_client_certificate(&der)?;
        if identity.name != user || !identity.in_group(MASTERS_GROUP) {
            return Err(Reissue::WrongIdentity {
                name: identity.name,
                groups: identity.groups,
                user: user.to_owned(),
            });
        }
        Ok(())
    })
}

/// Reuses the stored pair `base` (`<base>.crt`, `<base>.key` in `dir`) if `check` accepts it and
/// its key matches, else issues and stores a new one (key `0600`).
pub fn ensure_leaf(
    dir: &Path,
    base: &str,
    ca: &CertificateAuthority,
    spec: &LeafSpec,
    check: impl Fn(&PemPair) -> Result<(), Reissue>,
) -> Result<PemPair, PkiError> {
    let (cert_path, key_path) = pair_paths(dir, base);
    if let (Some(cert_pem), Some(key_pem)) = (read(&cert_path)?, read(&key_path)?) {
        let stored = PemPair { cert_pem, key_pem };
        let verdict = check(&stored).and_then(|()| {
            let der = CertificateDer::from_pem_slice(stored.cert_pem.as_bytes()).map_err(CheckError::Pem)?;
            if key_matches_certificate(&der, &stored.key_pem) {
                Ok(())
            } else {
                Err(Reissue::KeyMismatch)
            }
        });
        match verdict {
            Ok(()) => {
                tracing::debug!(path = %cert_path.display(), "reusing certificate");
                return Ok(stored);
            }
            Err(reason) => {
                tracing::info!(path = %cert_path.display(), reason = %etcd_operator_api::report::chain(&reason), "re-issuing certificate");
            }
        }
    }
    let pair = ca.issue(spec)?;
    write_pair(dir, base, &pair)?;
    tracing::info!(path = %cert_path.display(), common_name = %spec.common_name, "issued certificate");
    Ok(pair)
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
