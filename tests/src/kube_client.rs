//! kube-rs clients of `etcd-operator local` for the suites and benches that speak to its API
//! directly (watches, reflectors, raw status codes) instead of through kubectl.

use std::path::Path;
use std::time::Duration;

use kube::api::ApiResource;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// A kube client could not be built from a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The kubeconfig file could not be read or parsed.
    #[error("read kubeconfig {path}")]
    ReadKubeconfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig did not make a client configuration.
    #[error("client configuration from {path}")]
    Configure {
        path: String,
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from its configuration.
    #[error("build the kube client")]
    Build(#[from] kube::Error),
}

/// How the client behaves beyond the kubeconfig.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientOptions {
    /// Never retry: a 429 or 5xx reaches the caller (kube retries those by default).
    pub no_retry: bool,
    /// The longest a response may take to arrive (kube's default otherwise).
    pub read_timeout: Option<Duration>,
}

/// The EtcdCluster resource in v1alpha2, for `Api::<DynamicObject>`.
pub fn etcd_clusters() -> ApiResource {
    ApiResource {
        group: "etcd.operator.dev".into(),
        version: "v1alpha2".into(),
        api_version: "etcd.operator.dev/v1alpha2".into(),
        kind: "EtcdCluster".into(),
        plural: "etcdclusters".into(),
    }
}

/// A kube client of the server `kubeconfig` names.
pub async fn connect(kubeconfig: &Path, options: ClientOptions) -> Result<kube::Client, ConnectError> {
    // kube (ring) and object_store (aws-lc-rs) both enable a rustls provider: pick one. An error
    // only says one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let path = kubeconfig.display().to_string();
    let parsed = Kubeconfig::read_from(kubeconfig).map_err(|source| ConnectError::ReadKubeconfig {
        path: path.clone(),
        source,
    })?;
    let mut config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .map_err(|source| ConnectError::Configure { path, source })?;
    if options.no_retry {
        config.default_retry = false;
    }
    if let Some(timeout) = options.read_timeout {
        config.read_timeout = Some(timeout);
    }
    Ok(kube::Client::try_from(config)?)
}
