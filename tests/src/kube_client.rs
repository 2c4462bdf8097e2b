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

/// An HTTPS client of etcd's JSON gateway (grpc-gateway, served on etcd's client port beside
/// gRPC: `POST /v3/kv/range` and the like) at `endpoint` (`https://host:port`), trusting
/// `ca_pem` and presenting `cert_pem`/`key_pem`. The same client stack as [`connect`]'s
/// (hyper-util, HTTP/1.1 keep-alive over rustls), so the benches compare like with like.
pub async fn etcd_gateway(
    endpoint: &str,
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<kube::Client, ConnectError> {
    use base64::Engine as _;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let b64 = |pem: &[u8]| base64::engine::general_purpose::STANDARD.encode(pem);
    let path = format!("the etcd gateway at {endpoint}");
    // JSON is YAML: the kubeconfig's own parser reads it.
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "etcd", "cluster": {
            "server": endpoint,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": "etcd", "user": {
            "client-certificate-data": b64(cert_pem),
            "client-key-data": b64(key_pem),
        }}],
        "contexts": [{"name": "etcd", "context": {"cluster": "etcd", "user": "etcd"}}],
        "current-context": "etcd",
    });
    let kubeconfig =
        Kubeconfig::from_yaml(&kubeconfig.to_string()).map_err(|source| ConnectError::Configure {
            path: path.clone(),
            source,
        })?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| ConnectError::Configure { path, source })?;
    // The gateway's 503 (its own connection to etcd failed) reaches the caller, not a retry.
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}
