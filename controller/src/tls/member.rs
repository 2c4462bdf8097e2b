//! What `spec.tls` asks of a cluster's members, resolved (which planes, which provider), the
//! certificates of one member, and the operator's own client identity toward the members. Pure.

use std::net::{IpAddr, Ipv4Addr};

use etcd_operator_api::v1alpha2::{IssuerReference, TlsPlane, TlsSpec};

use super::ca::{LEAF_VALIDITY, LeafSpec, LeafUsage};

/// The common name of the operator's client certificate toward the members.
pub const OPERATOR_CLIENT_NAME: &str = "etcd-operator";

/// Where one plane's certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// The operator's own CA for this cluster and plane (`auto: {}`).
    Auto,
    /// A Secret holding `tls.crt`, `tls.key` and `ca.crt` (`secretRef`).
    Secret(String),
    /// cert-manager Certificates from an issuer (`certManager`).
    CertManager(IssuerReference),
}

impl Provider {
    fn of(plane: &TlsPlane) -> Option<Self> {
        if plane.auto.is_some() {
            Some(Self::Auto)
        } else if let Some(secret) = &plane.secret_ref {
            Some(Self::Secret(secret.name.clone()))
        } else {
            plane
                .cert_manager
                .as_ref()
                .map(|c| Self::CertManager(c.issuer_ref.clone()))
        }
    }

    /// How the spec names it, for messages.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Secret(_) => "secretRef",
            Self::CertManager(_) => "certManager",
        }
    }
}

/// The TLS planes of a cluster: `None` is plain HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsPlanes {
    /// The client plane (port 2379): members serve HTTPS and require client certificates.
    pub client: Option<Provider>,
    /// The peer plane (port 2380): mutual TLS among members.
    pub peer: Option<Provider>,
}

impl TlsPlanes {
    /// The planes `spec.tls` asks for.
    pub fn of(tls: Option<&TlsSpec>) -> Self {
        Self {
            client: tls.and_then(|t| t.client.as_ref()).and_then(Provider::of),
            peer: tls.and_then(|t| t.peer.as_ref()).and_then(Provider::of),
        }
    }

    /// `https` when the plane uses TLS, else `http`.
    pub fn client_scheme(&self) -> &'static str {
        if self.client.is_some() { "https" } else { "http" }
    }

    /// `https` when the plane uses TLS, else `http`.
    pub fn peer_scheme(&self) -> &'static str {
        if self.peer.is_some() { "https" } else { "http" }
    }
}

/// The names a member's certificates are valid for: its DNS names plus `localhost` and
/// `127.0.0.1` (health checks and the local runtime reach members on loopback).
pub fn member_names(dns_names: &[String]) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns: Vec<String> = dns_names.to_vec();
    if !dns.iter().any(|d| d == "localhost") {
        dns.push("localhost".into());
    }
    (dns, vec![IpAddr::V4(Ipv4Addr::LOCALHOST)])
}

/// The serving certificate of a member's client plane. It is for client authentication too:
/// etcd's JSON gateway dials the member's own client port with it (see
/// [`LeafUsage::ServerAndClient`]). Certificates issued before it was (servers only) keep
/// serving until their renewal; only the gateway refuses them.
pub fn server_certificate(member: &str, dns_names: &[String]) -> LeafSpec {
    let (dns, ips) = member_names(dns_names);
    LeafSpec {
        common_name: member.to_owned(),
        organizations: Vec::new(),
        dns_names: dns,
        ips,
        usage: LeafUsage::ServerAndClient,
        validity: LEAF_VALIDITY,
    }
}

/// A member's peer certificate: it serves the peer port and authenticates to the other members.
/// The same kind as the serving one, issued by the peer plane's CA.
pub fn peer_certificate(member: &str, dns_names: &[String]) -> LeafSpec {
    server_certificate(member, dns_names)
}

/// The operator's client certificate toward a cluster's client plane.
pub fn operator_certificate() -> LeafSpec {
    LeafSpec::client(OPERATOR_CLIENT_NAME, &[])
}

/// The operator's identity toward a cluster whose client plane uses TLS: the CA its members'
/// serving certificates chain to, and the client certificate and key to present.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM of the CA that issued the members' serving certificates.
    pub ca_pem: String,
    /// PEM of the operator's client certificate.
    pub cert_pem: String,
    /// PEM of its key.
    pub key_pem: String,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem", &self.ca_pem)
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl ClientTls {
    /// The etcd-client TLS options for this identity.
    pub fn options(&self) -> etcd_client::TlsOptions {
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(self.ca_pem.as_bytes()))
            .identity(etcd_client::Identity::from_pem(
                self.cert_pem.as_bytes(),
                self.key_pem.as_bytes(),
            ))
    }

    /// A short fingerprint of the identity, to tell cached connections of different identities
    /// apart (not a secret: a hash of the certificates).
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        hasher.update(self.ca_pem.as_bytes());
        hasher.update(self.cert_pem.as_bytes());
        hex::encode(&hasher.finalize()[..8])
    }
}

/// Whether `cert_pem` is signed by the CA certificate `ca_pem`: the signature only (no dates,
/// names or usages), to tell a certificate of another CA from one that merely expires soon.
pub fn issued_by(cert_pem: &str, ca_pem: &str) -> bool {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (Ok(cert), Ok(ca)) = (
        CertificateDer::from_pem_slice(cert_pem.as_bytes()),
        CertificateDer::from_pem_slice(ca_pem.as_bytes()),
    ) else {
        return false;
    };
    let (Ok((_, cert)), Ok((_, ca))) = (X509Certificate::from_der(&cert), X509Certificate::from_der(&ca))
    else {
        return false;
    };
    cert.issuer() == ca.subject() && cert.verify_signature(Some(ca.public_key())).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::ca::CertificateAuthority;
    use etcd_operator_api::v1alpha2::{AutoTls, CertManagerTls, IssuerReference, SecretReference};
    use rustls_pki_types::ServerName;

    #[test]
    fn each_plane_resolves_to_its_provider() {
        assert_eq!(TlsPlanes::of(None), TlsPlanes::default());
        let spec = TlsSpec {
            client: Some(TlsPlane {
                auto: Some(AutoTls {}),
                ..Default::default()
            }),
            peer: Some(TlsPlane {
                secret_ref: Some(SecretReference { name: "peer".into() }),
                ..Default::default()
            }),
        };
        let planes = TlsPlanes::of(Some(&spec));
        assert_eq!(planes.client, Some(Provider::Auto));
        assert_eq!(planes.peer, Some(Provider::Secret("peer".into())));
        assert_eq!((planes.client_scheme(), planes.peer_scheme()), ("https", "https"));
        let cm = TlsSpec {
            client: Some(TlsPlane {
                cert_manager: Some(CertManagerTls {
                    issuer_ref: IssuerReference {
                        name: "ca".into(),
                        ..Default::default()
                    },
                }),
                ..Default::default()
            }),
            peer: None,
        };
        let planes = TlsPlanes::of(Some(&cm));
        assert_eq!(planes.client.as_ref().map(Provider::field), Some("certManager"));
        assert_eq!((planes.client_scheme(), planes.peer_scheme()), ("https", "http"));
    }

    #[test]
    fn member_certificates_verify_for_every_name_and_are_also_clients() {
        let ca = CertificateAuthority::generate("demo client CA", crate::tls::ca::CA_VALIDITY).unwrap();
        let names = vec!["demo-abcde.demo.ns.svc".to_string()];
        let server = ca.issue(&server_certificate("demo-abcde", &names)).unwrap();
        let now = std::time::SystemTime::now();
        let all: Vec<ServerName<'_>> = vec![
            ServerName::try_from("demo-abcde.demo.ns.svc").unwrap(),
            ServerName::try_from("localhost").unwrap(),
            ServerName::try_from("127.0.0.1").unwrap(),
        ];
        ca.verify_server(&server.cert_pem, &all, now).unwrap();
        // etcd's JSON gateway presents the serving certificate to its own client port.
        ca.verify_client(&server.cert_pem, now).unwrap();
        assert!(
            ca.verify_server(&server.cert_pem, &[ServerName::try_from("other").unwrap()], now)
                .is_err()
        );
        let peer = ca.issue(&peer_certificate("demo-abcde", &names)).unwrap();
        ca.verify_server(&peer.cert_pem, &all, now).unwrap();
        ca.verify_client(&peer.cert_pem, now).unwrap();
        let operator = ca.issue(&operator_certificate()).unwrap();
        ca.verify_client(&operator.cert_pem, now).unwrap();
        // Another cluster's CA does not vouch for them.
        let other = CertificateAuthority::generate("other", crate::tls::ca::CA_VALIDITY).unwrap();
        assert!(other.verify_client(&operator.cert_pem, now).is_err());
        assert!(issued_by(&peer.cert_pem, &ca.pem().cert_pem));
        assert!(!issued_by(&peer.cert_pem, &other.pem().cert_pem));
        assert!(!issued_by("not a certificate", &ca.pem().cert_pem));
    }

    #[test]
    fn identities_differ_by_fingerprint_and_keys_stay_out_of_debug() {
        let a = ClientTls {
            ca_pem: "ca".into(),
            cert_pem: "a".into(),
            key_pem: "SECRET".into(),
        };
        let b = ClientTls {
            cert_pem: "b".into(),
            ..a.clone()
        };
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().len(), 16);
        assert!(!format!("{a:?}").contains("SECRET"));
    }
}
