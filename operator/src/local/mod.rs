//! Local mode: PKI, the backing etcd process and the kubeconfig, all under one state directory.
//!
//! `etcd-operator local --state-dir DIR` keeps everything in DIR:
//!
//! ```text
//! DIR/pki/{ca,server,admin,controller}.{crt,key}   certificates (keys 0600), reused on restart
//! DIR/etcd/{data/,etcd.log,ports.json,etcd.pid}    the backing etcd (supervised: restarted on
//!                                                  the same data and ports when it exits)
//! DIR/etcd/pki/{ca,server,peer,client}.{crt,key}   its own CA and certificates: mutual TLS on
//!                                                  loopback (keys 0600), checked at every start
//! DIR/kubeconfig                                   admin access for kubectl (0600)
//! ```
//!
//! [`prepare`] sets all of it up and returns a [`LocalEnv`] with everything `main` needs to serve.

pub mod backing_etcd;
pub mod etcd_pki;
pub mod supervise;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use backing_etcd::{BackingEtcd, BackingEtcdError, BackingEtcdOptions, EtcdSearch};
pub use etcd_operator_apiserver::kubeconfig::{self, ClientIdentity, Kubeconfig, KubeconfigError};
pub use etcd_operator_apiserver::pki::{self, LocalPki, PemPair, PkiError};
pub use supervise::{EtcdState, SupervisedEtcd};

use etcd_operator_apiserver::files;
use etcd_operator_apiserver::serve::TlsError;

/// What `etcd-operator local` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptions {
    /// The state directory (created if missing).
    pub state_dir: PathBuf,
    /// Where to serve HTTPS (port 0: any free port; [`LocalEnv::listen`] tells which).
    pub listen: SocketAddr,
    /// `--etcd-binary`: the etcd to run instead of the one searched for.
    pub etcd_binary: Option<PathBuf>,
}

/// Preparing local mode failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The state directory could not be created.
    #[error("create state directory {}", path.display())]
    CreateStateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The HTTPS address could not be bound.
    #[error("listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The certificates could not be set up.
    #[error("set up local certificates")]
    Pki(#[from] PkiError),
    /// The TLS configuration could not be built from them.
    #[error("build TLS configuration")]
    Tls(#[from] TlsError),
    /// The backing etcd could not be found or started.
    #[error("start backing etcd")]
    BackingEtcd(#[from] BackingEtcdError),
    /// The backing etcd started but the storage client could not connect.
    #[error("connect to backing etcd at {endpoint}")]
    ConnectEtcd {
        endpoint: String,
        #[source]
        source: etcd_client::Error,
    },
    /// The kubeconfig could not be written.
    #[error("write kubeconfig")]
    Kubeconfig(#[from] KubeconfigError),
}

/// Everything local mode runs on, ready to serve.
pub struct LocalEnv {
    /// The state directory, absolute.
    pub state_dir: PathBuf,
    /// The bound HTTPS listener: hand it to [`etcd_operator_apiserver::serve::serve`].
    pub listener: tokio::net::TcpListener,
    /// The address actually bound.
    pub listen: SocketAddr,
    /// `https://...` as clients reach the server.
    pub server_url: String,
    /// The certificates.
    pub pki: LocalPki,
    /// The server's TLS configuration: serving certificate, client certificates from the local CA
    /// requested but not required.
    pub tls: rustls::ServerConfig,
    /// The backing etcd process under supervision (restarted when it exits); call
    /// [`SupervisedEtcd::shutdown`] after serving stops.
    pub backing_etcd: SupervisedEtcd,
    /// A client of the backing etcd for storage.
    pub etcd_client: etcd_client::Client,
    /// `DIR/kubeconfig` (admin).
    pub kubeconfig_path: PathBuf,
    /// The co-located controller's identity: its certificate goes with its in-process requests
    /// (`serve::InProcess`); `Kubeconfig::for_identity(&env.controller_identity)` renders it as
    /// a kubeconfig for a client over HTTPS.
    pub controller_identity: ClientIdentity,
}

impl std::fmt::Debug for LocalEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEnv")
            .field("state_dir", &self.state_dir)
            .field("listen", &self.listen)
            .field("server_url", &self.server_url)
            .field("pki", &self.pki)
            .field("backing_etcd", &self.backing_etcd)
            .field("kubeconfig_path", &self.kubeconfig_path)
            .field("controller_identity", &self.controller_identity)
            .finish_non_exhaustive()
    }
}

/// Sets up local mode in `options.state_dir`: binds the listener (first, so a busy port fails
/// fast), creates or reuses the PKI, starts the backing etcd, connects to it, writes the
/// kubeconfig. Calls [`etcd_operator_apiserver::serve::install_crypto_provider`].
pub async fn prepare(options: LocalOptions) -> Result<LocalEnv, LocalError> {
    prepare_with_etcd_env(options, Vec::new()).await
}

pub(crate) async fn prepare_with_etcd_env(
    options: LocalOptions,
    etcd_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
) -> Result<LocalEnv, LocalError> {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let state_dir_err = |source| LocalError::CreateStateDir {
        path: options.state_dir.clone(),
        source,
    };
    files::create_private_dir(&options.state_dir).map_err(state_dir_err)?;
    let state_dir = std::fs::canonicalize(&options.state_dir).map_err(state_dir_err)?;

    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|source| LocalError::Listen {
            addr: options.listen,
            source,
        })?;
    let listen = listener.local_addr().map_err(|source| LocalError::Listen {
        addr: options.listen,
        source,
    })?;
    let server_url = kubeconfig::server_url(listen);

    let pki = pki::ensure(&state_dir.join("pki"), listen.ip())?;
    let tls = etcd_operator_apiserver::serve::server_config(
        pki.server.cert_pem.as_bytes(),
        pki.server.key_pem.as_bytes(),
        Some(pki.ca.cert_pem.as_bytes()),
    )?;

    let binary = EtcdSearch::from_environment(options.etcd_binary.clone()).find()?;
    let mut etcd_options = BackingEtcdOptions::new(state_dir.join("etcd"), binary);
    etcd_options.extra_env = etcd_env;
    let backing_etcd = BackingEtcd::start(etcd_options.clone()).await?;
    let etcd_client = backing_etcd
        .connect()
        .await
        .map_err(|source| LocalError::ConnectEtcd {
            endpoint: backing_etcd.endpoint().to_owned(),
            source,
        })?;
    let backing_etcd = SupervisedEtcd::start(backing_etcd, etcd_options);

    let identity = |user: &str, pair: &PemPair| ClientIdentity {
        server_url: server_url.clone(),
        ca_pem: pki.ca.cert_pem.clone(),
        user: user.to_owned(),
        cert_pem: pair.cert_pem.clone(),
        key_pem: pair.key_pem.clone(),
    };
    let kubeconfig_path = state_dir.join("kubeconfig");
    Kubeconfig::for_identity(&identity(pki::ADMIN_USER, &pki.admin)).write(&kubeconfig_path)?;
    let controller_identity = identity(pki::CONTROLLER_USER, &pki.controller);
    tracing::info!(
        %server_url,
        kubeconfig = %kubeconfig_path.display(),
        etcd = %backing_etcd.endpoint(),
        "local mode ready"
    );
    Ok(LocalEnv {
        state_dir,
        listener,
        listen,
        server_url,
        pki,
        tls,
        backing_etcd,
        etcd_client,
        kubeconfig_path,
        controller_identity,
    })
}

#[cfg(test)]
mod tests;
