//! Delegated authentication, as k8s.io/apiserver's delegating authenticator: the controller's
//! loopback identity, then request-header (front proxy), then `client-ca-file` certificates, then
//! bearer tokens through TokenReview; anything else is 401. Identity headers never survive it.

use std::collections::BTreeMap;
use std::time::Duration;

use http::header::AUTHORIZATION;
use rustls_pki_types::CertificateDer;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::cache::TtlCache;
use super::config::{AuthenticationConfig, CaBundle, ConfigReceiver, RequestHeaderConfig};
use crate::http::auth::{AuthenticateFuture, Authenticator, strip_identity_headers};
use crate::serve::auth::user_from_client_certificate;
use crate::serve::{AUTHENTICATED_GROUP, PeerCertificates, RemoteAddr, UserInfo};

/// How long TokenReview outcomes (authenticated or not) are reused (Go: `CacheTTL` 10 s).
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(10);
const TOKEN_CACHE_MAX: usize = 4096;

/// The in-process controller's identity: a certificate from a CA that exists only in this
/// process's memory, accepted only from a loopback peer and only as this exact leaf.
#[derive(Debug, Clone)]
pub struct LoopbackTrust {
    /// The in-memory CA.
    pub ca: CaBundle,
    /// The one leaf certificate it vouches for.
    pub leaf: CertificateDer<'static>,
    /// Who that leaf is.
    pub user: UserInfo,
}

/// The outcome of the certificate-based authenticators.
#[derive(Debug, PartialEq)]
enum CertificateOutcome {
    /// No certificate was presented: try a token.
    None,
    /// Authenticated.
    User(UserInfo),
    /// A certificate was presented and no certificate authenticator accepted it: 401, never
    /// anonymous, never a token (fail closed).
    Refused(String),
}

/// The cluster-mode authenticator.
pub struct DelegatedAuthenticator {
    config: ConfigReceiver,
    loopback: Option<LoopbackTrust>,
    tokens: Option<TokenReviewer>,
}

impl std::fmt::Debug for DelegatedAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedAuthenticator")
            .field("loaded", &self.config.borrow().is_some())
            .field("loopback", &self.loopback.is_some())
            .field("token_review", &self.tokens.is_some())
            .finish()
    }
}

impl DelegatedAuthenticator {
    /// Authenticates with the configuration published on `config`, the controller's `loopback`
    /// identity, and TokenReview through `tokens` (none: bearer tokens are refused).
    pub fn new(
        config: ConfigReceiver,
        loopback: Option<LoopbackTrust>,
        tokens: Option<TokenReviewer>,
    ) -> Self {
        Self {
            config,
            loopback,
            tokens,
        }
    }

    fn authenticate_certificate(
        &self,
        parts: &http::request::Parts,
        config: Option<&AuthenticationConfig>,
    ) -> CertificateOutcome {
        let Some(chain) = parts
            .extensions
            .get::<PeerCertificates>()
            .filter(|p| !p.is_empty())
        else {
            return CertificateOutcome::None;
        };
        let chain = chain.0.as_slice();
        let Some(leaf) = chain.first() else {
            return CertificateOutcome::None;
        };
        if let Some(loopback) = &self.loopback
            && loopback.ca.verify(chain).is_ok()
        {
            let from_loopback = parts
                .extensions
                .get::<RemoteAddr>()
                .is_some_and(|r| r.0.ip().is_loopback());
            return if from_loopback && *leaf == loopback.leaf {
                CertificateOutcome::User(loopback.user.clone())
            } else {
                CertificateOutcome::Refused(
                    "loopback identity presented off loopback or with another leaf".into(),
                )
            };
        }
        let Some(config) = config else {
            return CertificateOutcome::Refused("authentication configuration not loaded yet".into());
        };
        let mut errors = Vec::new();
        if let Some(rh) = &config.request_header {
            match rh.ca.verify(chain) {
                Ok(()) => {
                    let cn = common_name(leaf).unwrap_or_default();
                    if !rh.allowed_names.is_empty() && !rh.allowed_names.contains(&cn) {
                        errors.push(format!("x509: subject with cn={cn} is not in the allowed list"));
                    } else if let Some(user) = user_from_headers(rh, &parts.headers) {
                        return CertificateOutcome::User(user);
                    } else {
                        errors.push("request-header: no user name header".into());
                    }
                }
                Err(error) => errors.push(format!("verify against the request-header CA: {error}")),
            }
        }
        if let Some(ca) = &config.client_ca {
            match ca.verify(chain) {
                Ok(()) => match user_from_client_certificate(leaf) {
                    Ok(user) => return CertificateOutcome::User(user),
                    Err(error) => errors.push(error.to_string()),
                },
                Err(error) => errors.push(format!("verify against the client CA: {error}")),
            }
        }
        if errors.is_empty() {
            errors.push("no CA configured for client certificates".into());
        }
        CertificateOutcome::Refused(errors.join("; "))
    }
}

impl Authenticator for DelegatedAuthenticator {
    fn authenticate<'a>(&'a self, parts: &'a mut http::request::Parts) -> AuthenticateFuture<'a> {
        let config = self.config.borrow().clone();
        let outcome = self.authenticate_certificate(parts, config.as_deref());
        // Whatever happened, no identity header reaches a handler.
        strip_headers(&mut parts.headers, config.as_deref());
        let token = bearer_token(&parts.headers);
        parts.headers.remove(AUTHORIZATION);
        Box::pin(async move {
            match outcome {
                CertificateOutcome::User(user) => Ok(Some(user)),
                CertificateOutcome::Refused(reason) => {
                    tracing::debug!(%reason, "client certificate refused");
                    Ok(None)
                }
                CertificateOutcome::None => match (token, &self.tokens) {
                    (Some(token), Some(reviewer)) => Ok(reviewer.review(&token).await),
                    _ => Ok(None),
                },
            }
        })
    }

    fn not_ready(&self) -> Option<String> {
        self.config
            .borrow()
            .is_none()
            .then(|| "the authentication ConfigMap has not been loaded yet".to_owned())
    }
}

/// Removes `X-Remote-*`, `Impersonate-*` and every header the configuration names.
fn strip_headers(headers: &mut http::HeaderMap, config: Option<&AuthenticationConfig>) {
    strip_identity_headers(headers);
    let Some(rh) = config.and_then(|c| c.request_header.as_ref()) else {
        return;
    };
    let doomed: Vec<http::HeaderName> = headers
        .keys()
        .filter(|name| {
            let name = name.as_str();
            rh.header_names().any(|h| h == name)
                || rh
                    .extra_headers_prefix
                    .iter()
                    .any(|p| name.starts_with(p.as_str()))
        })
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive, as Go).
fn bearer_token(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(cert).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(cn)
}

fn header_text(value: &http::HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// The user the front proxy names in the request headers (Go `headerrequest`): the first non-empty
/// user name header, the first non-empty uid header, all values of all group headers, and extras by
/// prefix. `None` when no user name is given.
pub fn user_from_headers(rh: &RequestHeaderConfig, headers: &http::HeaderMap) -> Option<UserInfo> {
    let first_non_empty = |names: &[String]| {
        names.iter().find_map(|name| {
            headers
                .get(name.as_str())
                .map(header_text)
                .filter(|v| !v.is_empty())
        })
    };
    let name = first_non_empty(&rh.username_headers)?;
    let uid = first_non_empty(&rh.uid_headers);
    let mut groups = Vec::new();
    for header in &rh.group_headers {
        for value in headers.get_all(header.as_str()) {
            let value = header_text(value);
            if !value.is_empty() {
                groups.push(value);
            }
        }
    }
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (header, value) in headers {
        for prefix in &rh.extra_headers_prefix {
            if let Some(rest) = header.as_str().strip_prefix(prefix.as_str()) {
                extra
                    .entry(unescape_extra_key(&rest.to_ascii_lowercase()))
                    .or_default()
                    .push(header_text(value));
            }
        }
    }
    let mut user = UserInfo {
        name,
        uid,
        groups,
        extra,
    };
    user.add_group(AUTHENTICATED_GROUP);
    Some(user)
}

/// Go's `url.PathUnescape` of an extra key; a malformed escape leaves the key as it was.
pub fn unescape_extra_key(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) => {
                    out.push(b);
                    i += 3;
                }
                None => return key.to_owned(),
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| key.to_owned())
}

/// Bearer tokens checked by kube-apiserver (`authentication.k8s.io/v1` TokenReview, no audiences),
/// outcomes cached for [`TOKEN_CACHE_TTL`] under the token's SHA-256.
pub struct TokenReviewer {
    client: kube::Client,
    cache: TtlCache<[u8; 32], Option<UserInfo>>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer").finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// Reviews through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self::with_ttl(client, TOKEN_CACHE_TTL)
    }

    /// Reviews through `client`, caching for `ttl`.
    pub fn with_ttl(client: kube::Client, ttl: Duration) -> Self {
        Self {
            client,
            cache: TtlCache::new(ttl, TOKEN_CACHE_MAX),
        }
    }

    /// The user `token` belongs to, `None` when kube-apiserver does not vouch for it (or cannot be
    /// asked: a failed review is not cached).
    pub async fn review(&self, token: &str) -> Option<UserInfo> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cache.get(&key) {
            return hit;
        }
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        });
        let request = http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string().into_bytes());
        let request = match request {
            Ok(r) => r,
            Err(error) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "build TokenReview request");
                return None;
            }
        };
        match self.client.request::<Value>(request).await {
            Ok(review) => {
                let user = user_from_token_review(&review);
                self.cache.insert(key, user.clone());
                user
            }
            Err(error) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "TokenReview failed");
                None
            }
        }
    }
}

/// The user of a TokenReview response, when `status.authenticated` is true.
pub fn user_from_token_review(review: &Value) -> Option<UserInfo> {
    let status = review.get("status")?;
    if status.get("authenticated").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    let user = status.get("user")?;
    let name = user
        .get("username")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())?;
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let extra = user
        .get("extra")
        .and_then(Value::as_object)
        .map(|o| o.iter().map(|(k, v)| (k.clone(), strings(Some(v)))).collect())
        .unwrap_or_default();
    let mut info = UserInfo {
        name: name.to_owned(),
        uid: user
            .get("uid")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        groups: strings(user.get("groups")),
        extra,
    };
    info.add_group(AUTHENTICATED_GROUP);
    Some(info)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::pki::{CertificateAuthority, LeafSpec};
    use rustls_pki_types::pem::PemObject;

    fn rh_config(ca: &CaBundle) -> RequestHeaderConfig {
        RequestHeaderConfig {
            ca: ca.clone(),
            username_headers: vec!["x-remote-user".into(), "x-other-user".into()],
            uid_headers: vec!["x-remote-uid".into()],
            group_headers: vec!["x-remote-group".into(), "x-other-group".into()],
            extra_headers_prefix: vec!["x-remote-extra-".into()],
            allowed_names: vec!["front-proxy-client".into()],
        }
    }

    fn ca() -> (CertificateAuthority, CaBundle) {
        crate::serve::install_crypto_provider();
        let ca = CertificateAuthority::generate("ca", Duration::from_secs(3600)).unwrap();
        let bundle = CaBundle::from_pem("test", ca.pem().cert_pem.as_bytes()).unwrap();
        (ca, bundle)
    }

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn extra_keys_are_path_unescaped() {
        assert_eq!(unescape_extra_key("scopes"), "scopes");
        assert_eq!(unescape_extra_key("example.com%2fkey"), "example.com/key");
        assert_eq!(unescape_extra_key("a%20b+c"), "a b+c");
        // Malformed escapes keep the key as it came (Go: PathUnescape error).
        assert_eq!(unescape_extra_key("bad%zzkey"), "bad%zzkey");
        assert_eq!(unescape_extra_key("trailing%2"), "trailing%2");
    }

    #[test]
    fn headers_map_to_a_user_as_go_does() {
        let (_, bundle) = ca();
        let rh = rh_config(&bundle);
        let h = headers(&[
            ("x-remote-user", ""),
            ("x-other-user", "alice"),
            ("x-remote-uid", "u-1"),
            ("x-remote-group", "g1"),
            ("x-remote-group", "g2"),
            ("x-remote-group", ""),
            ("x-other-group", "g3"),
            ("x-remote-extra-scopes", "read"),
            ("x-remote-extra-scopes", "write"),
            ("x-remote-extra-example.com%2Fkey", "v"),
        ]);
        let user = user_from_headers(&rh, &h).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.uid.as_deref(), Some("u-1"));
        assert_eq!(user.groups, ["g1", "g2", "g3", AUTHENTICATED_GROUP]);
        assert_eq!(
            user.extra,
            BTreeMap::from([
                ("example.com/key".to_owned(), vec!["v".to_owned()]),
                ("scopes".to_owned(), vec!["read".to_owned(), "write".to_owned()]),
            ])
        );
        assert_eq!(user_from_headers(&rh, &headers(&[("x-remote-group", "g")])), None);
    }

    #[test]
    fn configured_headers_are_stripped() {
        let (_, bundle) = ca();
        let config = AuthenticationConfig {
            client_ca: None,
            request_header: Some(RequestHeaderConfig {
                username_headers: vec!["x-proxy-user".into()],
                extra_headers_prefix: vec!["x-proxy-extra-".into()],
                ..rh_config(&bundle)
            }),
        };
        let mut h = headers(&[
            ("x-proxy-user", "a"),
            ("x-proxy-extra-k", "v"),
            ("x-remote-user", "b"),
            ("impersonate-user", "c"),
            ("accept", "application/json"),
        ]);
        strip_headers(&mut h, Some(&config));
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["accept"]);
    }

    #[test]
    fn bearer_tokens_are_parsed() {
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer abc")])).as_deref(),
            Some("abc")
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "bearer  abc ")])).as_deref(),
            Some("abc")
        );
        assert_eq!(bearer_token(&headers(&[("authorization", "Basic abc")])), None);
        assert_eq!(bearer_token(&headers(&[("authorization", "Bearer ")])), None);
    }

    #[test]
    fn token_review_status_maps_to_a_user() {
        let review = json!({"status": {"authenticated": true, "user": {
            "username": "system:serviceaccount:ns:sa", "uid": "42",
            "groups": ["system:serviceaccounts"], "extra": {"k": ["v"]}}}});
        let user = user_from_token_review(&review).unwrap();
        assert_eq!(user.name, "system:serviceaccount:ns:sa");
        assert_eq!(user.uid.as_deref(), Some("42"));
        assert_eq!(user.groups, ["system:serviceaccounts", AUTHENTICATED_GROUP]);
        assert_eq!(user.extra["k"], ["v"]);
        assert_eq!(
            user_from_token_review(&json!({"status": {"authenticated": false}})),
            None
        );
        assert_eq!(user_from_token_review(&json!({})), None);
    }

    fn parts_with(
        chain: Vec<CertificateDer<'static>>,
        remote: &str,
        extra: &[(&str, &str)],
    ) -> http::request::Parts {
        let mut req = http::Request::get("/apis").body(()).unwrap();
        *req.headers_mut() = headers(extra);
        req.extensions_mut().insert(PeerCertificates(Arc::new(chain)));
        req.extensions_mut().insert(RemoteAddr(remote.parse().unwrap()));
        req.into_parts().0
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[tokio::test]
    async fn the_loopback_identity_is_honoured_only_from_loopback_and_only_for_its_leaf() {
        let (lb_ca, lb_bundle) = ca();
        let controller = lb_ca
            .issue(&LeafSpec::client(
                "system:etcd-operator:controller",
                &["system:masters"],
            ))
            .unwrap();
        let impostor = lb_ca
            .issue(&LeafSpec::client("someone", &["system:masters"]))
            .unwrap();
        let leaf = der(&controller.cert_pem);
        let trust = LoopbackTrust {
            ca: lb_bundle,
            leaf: leaf.clone(),
            user: user_from_client_certificate(&leaf).unwrap(),
        };
        let (_tx, rx) = super::super::config::channel();
        let authn = DelegatedAuthenticator::new(rx, Some(trust.clone()), None);

        let mut ok = parts_with(vec![leaf.clone()], "127.0.0.1:5000", &[("x-remote-user", "x")]);
        assert_eq!(
            authn.authenticate(&mut ok).await.unwrap(),
            Some(trust.user.clone())
        );
        assert!(ok.headers.is_empty());
        let mut v6 = parts_with(vec![leaf.clone()], "[::1]:5000", &[]);
        assert_eq!(
            authn.authenticate(&mut v6).await.unwrap(),
            Some(trust.user.clone())
        );
        let mut remote = parts_with(vec![leaf], "10.0.0.7:5000", &[]);
        assert_eq!(authn.authenticate(&mut remote).await.unwrap(), None);
        let mut other = parts_with(vec![der(&impostor.cert_pem)], "127.0.0.1:5000", &[]);
        assert_eq!(authn.authenticate(&mut other).await.unwrap(), None);
    }

    #[tokio::test]
    async fn certificates_follow_the_request_header_then_client_ca_order() {
        let (rh_ca, rh_bundle) = ca();
        let (client_ca, client_bundle) = ca();
        let (other_ca, _) = ca();
        let config = AuthenticationConfig {
            client_ca: Some(client_bundle),
            request_header: Some(rh_config(&rh_bundle)),
        };
        let (_tx, rx) = tokio::sync::watch::channel(Some(Arc::new(config)));
        let authn = DelegatedAuthenticator::new(rx, None, None);
        let proxy = der(&rh_ca
            .issue(&LeafSpec::client("front-proxy-client", &[]))
            .unwrap()
            .cert_pem);
        let bad_proxy = der(&rh_ca.issue(&LeafSpec::client("intruder", &[])).unwrap().cert_pem);
        let alice = der(&client_ca
            .issue(&LeafSpec::client("alice", &["devs"]))
            .unwrap()
            .cert_pem);
        let stranger = der(&other_ca.issue(&LeafSpec::client("bob", &[])).unwrap().cert_pem);
        let forged = [
            ("x-remote-user", "admin"),
            ("x-remote-group", "system:masters"),
            ("authorization", "Bearer t"),
        ];

        let mut p = parts_with(vec![proxy.clone()], "10.0.0.1:1", &forged);
        let user = authn.authenticate(&mut p).await.unwrap().unwrap();
        assert_eq!(
            (user.name.as_str(), user.groups.clone()),
            ("admin", vec!["system:masters".into(), AUTHENTICATED_GROUP.into()])
        );
        assert!(p.headers.is_empty());

        // The proxy's certificate without a user header: not a request-header user, and not a client-CA cert.
        let mut p = parts_with(vec![proxy], "10.0.0.1:1", &[]);
        assert_eq!(authn.authenticate(&mut p).await.unwrap(), None);
        for cert in [bad_proxy, stranger] {
            let mut p = parts_with(vec![cert], "10.0.0.1:1", &forged);
            assert_eq!(authn.authenticate(&mut p).await.unwrap(), None);
            assert!(p.headers.is_empty());
        }
        let mut p = parts_with(vec![alice], "10.0.0.1:1", &forged);
        let user = authn.authenticate(&mut p).await.unwrap().unwrap();
        assert_eq!(
            (user.name.as_str(), user.groups.clone()),
            ("alice", vec!["devs".into(), AUTHENTICATED_GROUP.into()])
        );
        assert!(p.headers.is_empty());
        // Nothing presented and no token reviewer: anonymous, i.e. 401.
        let mut p = parts_with(vec![], "10.0.0.1:1", &forged);
        assert_eq!(authn.authenticate(&mut p).await.unwrap(), None);
    }

    #[test]
    fn not_ready_until_the_configuration_is_loaded() {
        let (tx, rx) = super::super::config::channel();
        let authn = DelegatedAuthenticator::new(rx, None, None);
        assert!(authn.not_ready().is_some());
        tx.send_replace(Some(Arc::new(AuthenticationConfig::default())));
        assert_eq!(authn.not_ready(), None);
    }
}
