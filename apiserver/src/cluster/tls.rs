//! The serving TLS configuration of cluster mode, rebuilt when its inputs change: the serving
//! certificate and key (files, polled) and the client CA roots (the authentication ConfigMap).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::serve::tls::{ReloadableTls, TlsError, server_config};

use super::config::ConfigReceiver;

struct Inputs {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_cas: Vec<u8>,
}

/// The inputs of the serving configuration and the [`ReloadableTls`] built from them.
pub struct ServingTls {
    tls: ReloadableTls,
    inputs: Mutex<Inputs>,
}

impl std::fmt::Debug for ServingTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingTls").finish_non_exhaustive()
    }
}

fn build(inputs: &Inputs) -> Result<rustls::ServerConfig, TlsError> {
    // TLS 1.2+, ALPN h2/http1.1; with client CAs, certificates requested but not required, and
    // a presented one must chain to one of them (which one is checked again per request).
    let cas = (!inputs.client_cas.is_empty()).then_some(inputs.client_cas.as_slice());
    server_config(&inputs.cert, &inputs.key, cas)
}

impl ServingTls {
    /// Builds the first configuration; `client_cas` may be empty (no client certificates asked).
    pub fn new(cert: Vec<u8>, key: Vec<u8>, client_cas: Vec<u8>) -> Result<Self, TlsError> {
        let inputs = Inputs {
            cert,
            key,
            client_cas,
        };
        let tls = ReloadableTls::from(build(&inputs)?);
        Ok(Self {
            tls,
            inputs: Mutex::new(inputs),
        })
    }

    /// The handle [`crate::serve::serve`] takes.
    pub fn reloadable(&self) -> ReloadableTls {
        self.tls.clone()
    }

    fn update(&self, change: impl FnOnce(&mut Inputs)) -> Result<bool, TlsError> {
        let mut inputs = self
            .inputs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = Inputs {
            cert: inputs.cert.clone(),
            key: inputs.key.clone(),
            client_cas: inputs.client_cas.clone(),
        };
        change(&mut next);
        if next.cert == inputs.cert && next.key == inputs.key && next.client_cas == inputs.client_cas {
            return Ok(false);
        }
        // Only a configuration that builds replaces the one in force.
        let config = build(&next)?;
        self.tls.replace(Arc::new(config));
        *inputs = next;
        Ok(true)
    }

    /// New serving certificate and key. Returns whether anything changed.
    pub fn set_serving(&self, cert: Vec<u8>, key: Vec<u8>) -> Result<bool, TlsError> {
        self.update(|i| {
            i.cert = cert;
            i.key = key;
        })
    }

    /// New client CA roots (PEM, every CA concatenated). Returns whether anything changed.
    pub fn set_client_cas(&self, client_cas: Vec<u8>) -> Result<bool, TlsError> {
        self.update(|i| i.client_cas = client_cas)
    }
}

/// Re-reads the serving certificate and key every `interval` and swaps them in when their
/// content changed (Kubernetes updates mounted Secrets in place). Errors keep the pair in force.
pub async fn watch_serving_files(
    tls: Arc<ServingTls>,
    cert_path: PathBuf,
    key_path: PathBuf,
    interval: Duration,
) {
    loop {
        tokio::time::sleep(interval).await;
        let (cert, key) = match (
            tokio::fs::read(&cert_path).await,
            tokio::fs::read(&key_path).await,
        ) {
            (Ok(cert), Ok(key)) => (cert, key),
            (Err(error), _) | (_, Err(error)) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), cert = %cert_path.display(), key = %key_path.display(), "read serving certificate");
                continue;
            }
        };
        match tls.set_serving(cert, key) {
            Ok(true) => tracing::info!(cert = %cert_path.display(), "serving certificate reloaded"),
            Ok(false) => {}
            // A half-written pair (certificate updated, key not yet) fails here; the next poll
            // picks up the complete pair.
            Err(error) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "reload serving certificate; keeping the one in force")
            }
        }
    }
}

/// Rebuilds the client CA roots whenever the authentication configuration changes.
pub async fn follow_client_cas(tls: Arc<ServingTls>, mut config: ConfigReceiver) {
    loop {
        let union = config
            .borrow_and_update()
            .as_ref()
            .map(|c| c.union_pem())
            .unwrap_or_default();
        match tls.set_client_cas(union) {
            Ok(true) => tracing::info!("client CA roots of the TLS server replaced"),
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "rebuild TLS client CA roots; keeping the ones in force")
            }
        }
        if config.changed().await.is_err() {
            return;
        }
    }
}
