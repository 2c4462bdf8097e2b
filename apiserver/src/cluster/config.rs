//! The delegated authentication configuration: `kube-system/extension-apiserver-authentication`,
//! read at startup and re-read periodically so that a changed ConfigMap (rotated CAs, new allowed
//! names, header names) takes effect without a restart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use rustls::pki_types::UnixTime;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::CertificateDer;
use tokio::sync::watch;

use crate::serve::tls::{self, TlsError};

/// The ConfigMap's name.
pub const CONFIGMAP_NAME: &str = "extension-apiserver-authentication";
/// The namespace kube-apiserver writes it to.
pub const DEFAULT_NAMESPACE: &str = "kube-system";

/// Default request-header names when the ConfigMap does not name any (k8s.io/apiserver
/// `pkg/server/options/authentication.go`; UID headers are deliberately not defaulted).
const DEFAULT_USERNAME_HEADERS: &[&str] = &["x-remote-user"];
const DEFAULT_GROUP_HEADERS: &[&str] = &["x-remote-group"];
const DEFAULT_EXTRA_PREFIXES: &[&str] = &["x-remote-extra-"];

/// Reading the configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A CA bundle key is not a usable PEM bundle.
    #[error("parse {key} of the authentication ConfigMap")]
    ParseCa {
        key: &'static str,
        #[source]
        source: TlsError,
    },
    /// The verifier for a CA bundle could not be built.
    #[error("build a verifier for {key} of the authentication ConfigMap")]
    BuildVerifier {
        key: &'static str,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    /// A `requestheader-*` key is not a JSON array of strings.
    #[error("parse {key} of the authentication ConfigMap as a JSON array of strings")]
    ParseList {
        key: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A header name is not a valid HTTP header name.
    #[error("parse {key} of the authentication ConfigMap: {name:?} is not a valid header name")]
    HeaderName { key: &'static str, name: String },
    /// The ConfigMap could not be fetched.
    #[error("get ConfigMap {namespace}/{CONFIGMAP_NAME}")]
    Fetch {
        namespace: String,
        #[source]
        source: kube::Error,
    },
}

/// A CA bundle with a verifier of client certificates against exactly these roots (clientAuth
/// usage required, as Go's `x509.Verify` with `ExtKeyUsageClientAuth`).
#[derive(Clone)]
pub struct CaBundle {
    pem: Vec<u8>,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle")
            .field("pem_len", &self.pem.len())
            .finish_non_exhaustive()
    }
}

impl PartialEq for CaBundle {
    fn eq(&self, other: &Self) -> bool {
        self.pem == other.pem
    }
}

impl CaBundle {
    /// Parses a PEM bundle (`key` names it in errors).
    pub fn from_pem(key: &'static str, pem: &[u8]) -> Result<Self, ConfigError> {
        let roots = tls::root_store(pem).map_err(|source| ConfigError::ParseCa { key, source })?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), tls::provider())
            .build()
            .map_err(|source| ConfigError::BuildVerifier { key, source })?;
        Ok(Self {
            pem: pem.to_vec(),
            verifier,
        })
    }

    /// The bundle as given.
    pub fn pem(&self) -> &[u8] {
        &self.pem
    }

    /// Verifies a presented chain (leaf first, then intermediates) against these roots alone.
    pub fn verify(&self, chain: &[CertificateDer<'static>]) -> Result<(), rustls::Error> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err(rustls::Error::NoCertificatesPresented);
        };
        self.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map(|_| ())
    }
}

/// Front-proxy (request-header) authentication settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestHeaderConfig {
    /// `requestheader-client-ca-file`.
    pub ca: CaBundle,
    /// Header names (lower case) holding the user name; the first non-empty one wins.
    pub username_headers: Vec<String>,
    /// Header names (lower case) holding the uid.
    pub uid_headers: Vec<String>,
    /// Header names (lower case) holding groups; all values of all of them.
    pub group_headers: Vec<String>,
    /// Header name prefixes (lower case) of extra attributes.
    pub extra_headers_prefix: Vec<String>,
    /// Common names the front proxy's certificate may have; empty means any.
    pub allowed_names: Vec<String>,
}

impl RequestHeaderConfig {
    /// Every header this configuration reads (names and prefixes), lower case: what must be
    /// stripped from every request.
    pub fn header_names(&self) -> impl Iterator<Item = &str> {
        self.username_headers
            .iter()
            .chain(&self.uid_headers)
            .chain(&self.group_headers)
            .map(String::as_str)
    }
}

/// The whole delegated authentication configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuthenticationConfig {
    /// `client-ca-file`: ordinary client certificates (user = CN, groups = O).
    pub client_ca: Option<CaBundle>,
    /// The front-proxy settings, when `requestheader-client-ca-file` is present.
    pub request_header: Option<RequestHeaderConfig>,
}

impl AuthenticationConfig {
    /// Parses the ConfigMap's `data`.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let present = |key: &str| data.get(key).filter(|v| !v.trim().is_empty());
        let client_ca = present("client-ca-file")
            .map(|pem| CaBundle::from_pem("client-ca-file", pem.as_bytes()))
            .transpose()?;
        let request_header = match present("requestheader-client-ca-file") {
            None => None,
            Some(pem) => Some(RequestHeaderConfig {
                ca: CaBundle::from_pem("requestheader-client-ca-file", pem.as_bytes())?,
                username_headers: header_list(
                    data,
                    "requestheader-username-headers",
                    DEFAULT_USERNAME_HEADERS,
                )?,
                uid_headers: header_list(data, "requestheader-uid-headers", &[])?,
                group_headers: header_list(data, "requestheader-group-headers", DEFAULT_GROUP_HEADERS)?,
                extra_headers_prefix: header_list(
                    data,
                    "requestheader-extra-headers-prefix",
                    DEFAULT_EXTRA_PREFIXES,
                )?,
                allowed_names: string_list(data, "requestheader-allowed-names")?.unwrap_or_default(),
            }),
        };
        Ok(Self {
            client_ca,
            request_header,
        })
    }

    /// Every CA bundle concatenated: the roots the TLS layer accepts a presented certificate
    /// from. Which of them signed it is checked again per request ([`CaBundle::verify`]).
    pub fn union_pem(&self) -> Vec<u8> {
        let mut pem = Vec::new();
        for bundle in self
            .client_ca
            .iter()
            .chain(self.request_header.as_ref().map(|rh| &rh.ca))
        {
            pem.extend_from_slice(bundle.pem());
            if !pem.ends_with(b"\n") {
                pem.push(b'\n');
            }
        }
        pem
    }
}

/// A JSON array of strings, `None` when the key is absent.
fn string_list(
    data: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Option<Vec<String>>, ConfigError> {
    data.get(key)
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            serde_json::from_str::<Vec<String>>(v).map_err(|source| ConfigError::ParseList { key, source })
        })
        .transpose()
}

/// A JSON array of header names (or prefixes), lower-cased; `defaults` when the key is absent.
fn header_list(
    data: &BTreeMap<String, String>,
    key: &'static str,
    defaults: &[&str],
) -> Result<Vec<String>, ConfigError> {
    let names = string_list(data, key)?.unwrap_or_else(|| defaults.iter().map(|s| (*s).to_owned()).collect());
    names
        .into_iter()
        .filter(|n| !n.trim().is_empty())
        .map(|name| {
            let lower = name.trim().to_ascii_lowercase();
            match http::HeaderName::from_bytes(lower.as_bytes()) {
                Ok(_) => Ok(lower),
                Err(_) => Err(ConfigError::HeaderName { key, name }),
            }
        })
        .collect()
}

/// The current configuration: `None` until the ConfigMap was first loaded.
pub type ConfigReceiver = watch::Receiver<Option<Arc<AuthenticationConfig>>>;
/// Where a new configuration is published.
pub type ConfigSender = watch::Sender<Option<Arc<AuthenticationConfig>>>;

/// A channel for the configuration, empty until loaded.
pub fn channel() -> (ConfigSender, ConfigReceiver) {
    watch::channel(None)
}

/// Fetches the ConfigMap's data.
pub async fn fetch(client: &kube::Client, namespace: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), namespace);
    let cm = api
        .get(CONFIGMAP_NAME)
        .await
        .map_err(|source| ConfigError::Fetch {
            namespace: namespace.to_owned(),
            source,
        })?;
    Ok(cm.data.unwrap_or_default())
}

/// Keeps `sender` up to date with the ConfigMap: fetches it now and every `interval`; publishes a
/// new configuration whenever the data changes and parses. A fetch or parse failure keeps the
/// configuration in force (and is logged).
pub async fn keep_loaded(client: kube::Client, namespace: String, interval: Duration, sender: ConfigSender) {
    let mut last: Option<BTreeMap<String, String>> = None;
    loop {
        match fetch(&client, &namespace).await {
            Ok(data) if last.as_ref() == Some(&data) => {}
            Ok(data) => match AuthenticationConfig::from_data(&data) {
                Ok(config) => {
                    tracing::info!(
                        client_ca = config.client_ca.is_some(),
                        request_header = config.request_header.is_some(),
                        allowed_names = ?config.request_header.as_ref().map(|rh| &rh.allowed_names),
                        "authentication configuration loaded"
                    );
                    sender.send_replace(Some(Arc::new(config)));
                    last = Some(data);
                }
                Err(error) => {
                    tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "authentication ConfigMap is invalid; keeping the configuration in force");
                    last = Some(data);
                }
            },
            Err(error) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "read the authentication ConfigMap")
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::CertificateAuthority;

    fn ca_pem() -> String {
        CertificateAuthority::generate("test-ca", Duration::from_secs(3600))
            .unwrap()
            .pem()
            .cert_pem
            .clone()
    }

    #[test]
    fn request_header_defaults_apply_when_keys_are_absent() {
        crate::serve::install_crypto_provider();
        let data = BTreeMap::from([("requestheader-client-ca-file".to_owned(), ca_pem())]);
        let config = AuthenticationConfig::from_data(&data).unwrap();
        assert!(config.client_ca.is_none());
        let rh = config.request_header.unwrap();
        assert_eq!(rh.username_headers, ["x-remote-user"]);
        assert!(rh.uid_headers.is_empty());
        assert_eq!(rh.group_headers, ["x-remote-group"]);
        assert_eq!(rh.extra_headers_prefix, ["x-remote-extra-"]);
        assert!(rh.allowed_names.is_empty());
    }

    #[test]
    fn lists_are_json_arrays_and_lower_cased() {
        crate::serve::install_crypto_provider();
        let data = BTreeMap::from([
            ("client-ca-file".to_owned(), ca_pem()),
            ("requestheader-client-ca-file".to_owned(), ca_pem()),
            (
                "requestheader-username-headers".to_owned(),
                r#"["X-Remote-User","X-Other-User"]"#.to_owned(),
            ),
            (
                "requestheader-uid-headers".to_owned(),
                r#"["X-Remote-Uid"]"#.to_owned(),
            ),
            (
                "requestheader-group-headers".to_owned(),
                r#"["X-Remote-Group"]"#.to_owned(),
            ),
            (
                "requestheader-extra-headers-prefix".to_owned(),
                r#"["X-Remote-Extra-"]"#.to_owned(),
            ),
            (
                "requestheader-allowed-names".to_owned(),
                r#"["front-proxy-client"]"#.to_owned(),
            ),
        ]);
        let config = AuthenticationConfig::from_data(&data).unwrap();
        assert!(config.client_ca.is_some());
        let rh = config.request_header.clone().unwrap();
        assert_eq!(rh.username_headers, ["x-remote-user", "x-other-user"]);
        assert_eq!(rh.uid_headers, ["x-remote-uid"]);
        assert_eq!(rh.allowed_names, ["front-proxy-client"]);
        assert_eq!(
            rh.header_names().collect::<Vec<_>>(),
            ["x-remote-user", "x-other-user", "x-remote-uid", "x-remote-group"]
        );
        let union = config.union_pem();
        assert_eq!(tls::parse_certificates(&union).unwrap().len(), 2);
    }

    #[test]
    fn malformed_values_are_errors() {
        crate::serve::install_crypto_provider();
        let bad_list = BTreeMap::from([
            ("requestheader-client-ca-file".to_owned(), ca_pem()),
            (
                "requestheader-allowed-names".to_owned(),
                "front-proxy-client".to_owned(),
            ),
        ]);
        assert!(matches!(
            AuthenticationConfig::from_data(&bad_list),
            Err(ConfigError::ParseList {
                key: "requestheader-allowed-names",
                ..
            })
        ));
        let bad_header = BTreeMap::from([
            ("requestheader-client-ca-file".to_owned(), ca_pem()),
            (
                "requestheader-username-headers".to_owned(),
                r#"["bad header"]"#.to_owned(),
            ),
        ]);
        assert!(matches!(
            AuthenticationConfig::from_data(&bad_header),
            Err(ConfigError::HeaderName { .. })
        ));
        let bad_ca = BTreeMap::from([("client-ca-file".to_owned(), "not pem".to_owned())]);
        assert!(matches!(
            AuthenticationConfig::from_data(&bad_ca),
            Err(ConfigError::ParseCa {
                key: "client-ca-file",
                ..
            })
        ));
        // No CA at all: nothing is trusted, which is valid.
        assert_eq!(
            AuthenticationConfig::from_data(&BTreeMap::new()).unwrap(),
            AuthenticationConfig::default()
        );
    }
}
