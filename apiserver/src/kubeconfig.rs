//! The kubeconfig local mode writes for its admin (`DIR/kubeconfig`), and the same shape for any
//! other client identity of the local server (the in-process controller).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::files;

/// The cluster and context name in the kubeconfig.
pub const CONTEXT_NAME: &str = "etcd-operator-local";

/// Rendering or writing a kubeconfig failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// Serialization to YAML failed.
    #[error("render kubeconfig YAML")]
    Render(#[source] serde_yaml::Error),
    /// The file could not be written.
    #[error("write kubeconfig {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One client identity of the local server: where it is, how to trust it, who to be.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// `https://host:port` of the server.
    pub server_url: String,
    /// The CA that signed the serving certificate (PEM).
    pub ca_pem: String,
    /// The user name (used as the kubeconfig user entry's name).
    pub user: String,
    /// The client certificate (PEM).
    pub cert_pem: String,
    /// The client key (PEM).
    pub key_pem: String,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("server_url", &self.server_url)
            .field("user", &self.user)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// A kubeconfig file (`apiVersion: v1`, `kind: Config`), the subset written here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kubeconfig {
    /// `v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// `Config`.
    pub kind: String,
    /// Named clusters.
    pub clusters: Vec<NamedCluster>,
    /// Named users.
    pub users: Vec<NamedUser>,
    /// Named contexts.
    pub contexts: Vec<NamedContext>,
    /// The context kubectl uses.
    #[serde(rename = "current-context")]
    pub current_context: String,
}

/// A `clusters[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedCluster {
    /// Its name.
    pub name: String,
    /// Its settings.
    pub cluster: Cluster,
}

/// A cluster's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Cluster {
    /// `https://host:port`.
    pub server: String,
    /// The CA bundle, base64 of PEM.
    pub certificate_authority_data: String,
}

/// A `users[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedUser {
    /// Its name.
    pub name: String,
    /// Its credentials.
    pub user: User,
}

/// A user's credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct User {
    /// The client certificate, base64 of PEM.
    pub client_certificate_data: String,
    /// The client key, base64 of PEM.
    pub client_key_data: String,
}

/// A `contexts[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedContext {
    /// Its name.
    pub name: String,
    /// Which cluster and user.
    pub context: Context,
}

/// A context: a cluster and a user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    /// The cluster's name.
    pub cluster: String,
    /// The user's name.
    pub user: String,
}

impl Kubeconfig {
    /// A kubeconfig with one cluster, user and context ([`CONTEXT_NAME`]), current.
    pub fn for_identity(identity: &ClientIdentity) -> Self {
        Self {
            api_version: "v1".into(),
            kind: "Config".into(),
            clusters: vec![NamedCluster {
                name: CONTEXT_NAME.into(),
                cluster: Cluster {
                    server: identity.server_url.clone(),
                    certificate_authority_data: STANDARD.encode(&identity.ca_pem),
                },
            }],
            users: vec![NamedUser {
                name: identity.user.clone(),
                user: User {
                    client_certificate_data: STANDARD.encode(&identity.cert_pem),
                    client_key_data: STANDARD.encode(&identity.key_pem),
                },
            }],
            contexts: vec![NamedContext {
                name: CONTEXT_NAME.into(),
                context: Context {
                    cluster: CONTEXT_NAME.into(),
                    user: identity.user.clone(),
                },
            }],
            current_context: CONTEXT_NAME.into(),
        }
    }

    /// The YAML text.
    pub fn to_yaml(&self) -> Result<String, KubeconfigError> {
        serde_yaml::to_string(self).map_err(KubeconfigError::Render)
    }

    /// Writes the YAML to `path` atomically, mode 0600 (it holds a private key).
    pub fn write(&self, path: &Path) -> Result<(), KubeconfigError> {
        let yaml = self.to_yaml()?;
        files::write_atomic(path, yaml.as_bytes(), files::PRIVATE).map_err(|source| KubeconfigError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// `https://<addr>` for clients of a server listening on `listen`: a wildcard address becomes the
/// loopback address of its family (which the serving certificate covers).
pub fn server_url(listen: std::net::SocketAddr) -> String {
    let ip = match listen.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        }
        ip => ip,
    };
    format!("https://{}", std::net::SocketAddr::new(ip, listen.port()))
}
