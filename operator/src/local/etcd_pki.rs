//! Certificates of the backing etcd of local mode: a CA of its own under `DIR/etcd/pki/`, the
//! serving and peer certificates etcd runs with, and the client certificate the API server's
//! storage presents, checked (and re-issued from the same CA) at every start of etcd.
//!
//! The CA is not the API server's (`DIR/pki/ca.crt`): that one signs the admin certificate of the
//! kubeconfig and the controller's, and etcd trusting it would make every holder of a kubeconfig
//! root on the raw storage, past validation and authorization. Here only the storage's client
//! certificate is trusted. The files are made with the same code as `DIR/pki/`
//! ([`etcd_operator_apiserver::pki::ensure_ca`], [`etcd_operator_apiserver::pki::ensure_leaf`]).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustls_pki_types::ServerName;

use etcd_operator_apiserver::files;
use etcd_operator_apiserver::pki::{self, LeafSpec, LeafUsage, PemPair, PkiError};
use etcd_operator_controller::tls::member::ClientTls;

/// The common name of the CA (followed by `@<unix time>` of its creation).
pub const CA_NAME: &str = "etcd-operator-local-etcd-ca";
/// The common name of etcd's serving and peer certificates.
pub const SERVER_NAME: &str = "etcd-operator-local-etcd";
/// The common name (etcd user name) of the API server storage's client certificate.
pub const CLIENT_USER: &str = "etcd-operator-apiserver";

/// The certificates of the backing etcd, as stored in `DIR/etcd/pki/`.
#[derive(Debug, Clone)]
pub struct EtcdPki {
    /// The directory holding the files.
    pub dir: PathBuf,
    /// The CA (`ca.crt`, `ca.key`): trusted by etcd for clients and peers, and by the storage.
    pub ca: PemPair,
    /// etcd's serving certificate (`server.crt`, `server.key`): `localhost`, `127.0.0.1`;
    /// server and client authentication (etcd's JSON gateway presents it to etcd).
    pub server: PemPair,
    /// etcd's peer certificate (`peer.crt`, `peer.key`): server and client authentication.
    pub peer: PemPair,
    /// The storage's client certificate (`client.crt`, `client.key`).
    pub client: PemPair,
}

impl EtcdPki {
    /// Paths of a pair's certificate and key, by base name (`ca`, `server`, `peer`, `client`).
    pub fn pair_paths(&self, base: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{base}.crt")),
            self.dir.join(format!("{base}.key")),
        )
    }

    /// The storage's TLS identity toward etcd: the CA and the client certificate.
    pub fn client_tls(&self) -> ClientTls {
        ClientTls {
            ca_pem: self.ca.cert_pem.clone(),
            cert_pem: self.client.cert_pem.clone(),
            key_pem: self.client.key_pem.clone(),
        }
    }
}

/// The names etcd's certificates are valid for: it serves on loopback only.
fn names() -> (Vec<&'static str>, Vec<IpAddr>) {
    (vec!["localhost"], vec![IpAddr::V4(Ipv4Addr::LOCALHOST)])
}

/// Loads the certificates from `dir`, creating what is missing. A leaf that does not chain to the
/// CA, is not for its names or usage, whose key is not its own, or that expires within 30 days is
/// issued again from the same CA. The CA is created only when neither of its files exists;
/// otherwise a broken CA is an error, never replaced silently.
pub fn ensure(dir: &Path) -> Result<EtcdPki, PkiError> {
    files::create_private_dir(dir).map_err(|source| PkiError::Io {
        action: "create the backing etcd's PKI directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let ca = pki::ensure_ca(dir, CA_NAME)?;
    let now = SystemTime::now();
    let (dns, ips) = names();
    let server_names: Vec<ServerName<'static>> = dns
        .iter()
        .filter_map(|d| ServerName::try_from(*d).ok())
        .chain(ips.iter().map(|ip| ServerName::from(*ip)))
        .collect();
    // Serving and peer certificates are for both ends: etcd's JSON gateway dials the client
    // port with the serving one (see `LeafUsage::ServerAndClient`). A serving certificate of
    // an earlier release, for servers only, is issued again here, before etcd starts.
    let spec = LeafSpec {
        usage: LeafUsage::ServerAndClient,
        ..LeafSpec::server(SERVER_NAME, &dns, &ips)
    };
    let both = |pair: &PemPair| {
        ca.verify_server(&pair.cert_pem, &server_names, now)?;
        Ok(ca.verify_client(&pair.cert_pem, now)?)
    };
    let server = pki::ensure_leaf(dir, "server", &ca, &spec, both)?;
    let peer = pki::ensure_leaf(dir, "peer", &ca, &spec, both)?;
    let client = pki::ensure_leaf(dir, "client", &ca, &LeafSpec::client(CLIENT_USER, &[]), |pair| {
        Ok(ca.verify_client(&pair.cert_pem, now)?)
    })?;
    Ok(EtcdPki {
        dir: dir.to_path_buf(),
        ca: ca.pem().clone(),
        server,
        peer,
        client,
    })
}
