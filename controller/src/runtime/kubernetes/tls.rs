//! Member TLS of the kubernetes runtime: the `auto` CA Secrets (created once, never replaced),
//! each member's certificates before its Pod is created (`auto`: issued into `<member>-tls`;
//! `secretRef`: checked; `certManager`: Certificates applied and their Secrets awaited), the
//! operator's own client identity, and what the members' Secrets say about their certificates.
//! The objects themselves are built by [`crate::resources::tls`].

use std::collections::BTreeMap;
use std::time::SystemTime;

use etcd_operator_api::naming::MEMBER_LABEL;
use etcd_operator_api::v1alpha2::IssuerReference;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use rustls_pki_types::ServerName;
use tracing::{info, warn};

use super::{KubernetesRuntime, is_already_exists, kube_error};
use crate::model::{ClusterRef, MemberCertificates};
use crate::resources::tls::{
    CA_BUNDLE_KEY, CA_CERT_KEY, CA_ROTATION_ANNOTATION, CERTIFICATE_ROTATION_ANNOTATION, CLIENT_CA_KEY,
    CaMaterial, CertificateUse, ISSUED_AT_ANNOTATION, MemberTlsMaterial, NEXT_CERT_KEY, NEXT_KEY_KEY,
    PEER_CA_KEY, PEER_CERT_KEY, PEER_KEY_KEY, PREVIOUS_CERT_KEY, Plane, SERVER_CERT_KEY, SERVER_KEY_KEY,
    TLS_CERT_KEY, TLS_KEY_KEY, build_ca_secret, build_certificate, build_member_secret, ca_secret_name,
    certificate_name, certificate_resource, certificate_secret_name, member_dns_names, member_secret_name,
    operator_certificate_name, operator_certificate_secret_name,
};
use crate::resources::{FIELD_MANAGER, list_selector};
use crate::runtime::{RuntimeError, ValidatedCluster};
use crate::tls::authority::{Authority, AuthorityLag, AuthorityPhase, AuthorityView};
use crate::tls::ca::{CA_VALIDITY, CertificateAuthority, PemPair, key_matches_certificate, not_after};
use crate::tls::member::{self as member_tls, ClientTls, Provider, TlsPlanes};

/// The text of a Secret's key, when present and not blank.
pub(super) fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    let value = secret.data.as_ref()?.get(key)?;
    String::from_utf8(value.0.clone())
        .ok()
        .filter(|text| !text.trim().is_empty())
}

fn secret_pair(secret: &Secret, cert: &str, key: &str) -> Option<PemPair> {
    Some(PemPair {
        cert_pem: secret_text(secret, cert)?,
        key_pem: secret_text(secret, key)?,
    })
}

/// Whether the pair's key is its certificate's key.
fn key_matches(pair: &PemPair) -> bool {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pair.cert_pem.as_bytes())
        .is_ok_and(|cert| key_matches_certificate(&cert, &pair.key_pem))
}

/// The names a member's certificates must be valid for, as rustls checks them.
pub(super) fn server_names(cluster: &ClusterRef, member: &str) -> Vec<ServerName<'static>> {
    let (dns, ips) = member_tls::member_names(&member_dns_names(cluster, member));
    dns.into_iter()
        .filter_map(|d| ServerName::try_from(d).ok())
        .chain(ips.into_iter().map(|ip| ServerName::IpAddress(ip.into())))
        .collect()
}

/// The CAs of a cluster's `auto` planes.
#[derive(Debug, Default)]
pub(super) struct AutoCas {
    client: Option<Authority>,
    peer: Option<Authority>,
}

/// Why a member's `auto` certificates must be issued (again), `None` when the Secret holds good
/// ones: present, keys matching, issued by the cluster's issuing CAs, carrying the bundles they
/// trust now (a CA rotation changes them), valid for every name now and for
/// [`crate::tls::ca::RENEW_BEFORE`] more, and issued under the rotation asked for (when one is).
pub(super) fn reissue_reason(
    secret: Option<&Secret>,
    cas: &AutoCas,
    names: &[ServerName<'_>],
    rotation: Option<&str>,
    now: SystemTime,
) -> Option<String> {
    let Some(secret) = secret else {
        return Some("the member had no certificates yet".to_owned());
    };
    if let Some(wanted) = rotation {
        let recorded = secret.annotations().get(CERTIFICATE_ROTATION_ANNOTATION);
        if recorded.map(String::as_str) != Some(wanted) {
            return Some(format!("rotation {wanted:?} was requested"));
        }
    }
    let check = |authority: &Authority, cert: &str, key: &str, ca_key: &str, peer: bool| {
        let pair = secret_pair(secret, cert, key).ok_or_else(|| format!("{cert} or {key} is missing"))?;
        if !key_matches(&pair) {
            return Err(format!("{key} is not the key of {cert}"));
        }
        let trusted = secret_text(secret, ca_key).unwrap_or_default();
        if let Some(lag) = authority.lag(&trusted, &pair.cert_pem) {
            return Err(match lag {
                AuthorityLag::Trust => format!("{ca_key} is not what the cluster's CAs trust now"),
                AuthorityLag::Issuer => format!("{cert} is not issued by the cluster's CA"),
            });
        }
        let ca = &authority.issuing;
        ca.verify_server(&pair.cert_pem, names, now)
            .map_err(|e| format!("{cert}: {}", etcd_operator_api::report::chain(&e)))?;
        if peer {
            ca.verify_client(&pair.cert_pem, now)
                .map_err(|e| format!("{cert}: {}", etcd_operator_api::report::chain(&e)))?;
        }
        Ok(())
    };
    let result = cas
        .client
        .as_ref()
        .map_or(Ok(()), |ca| {
            check(ca, SERVER_CERT_KEY, SERVER_KEY_KEY, CLIENT_CA_KEY, false)
        })
        .and_then(|()| {
            cas.peer.as_ref().map_or(Ok(()), |ca| {
                check(ca, PEER_CERT_KEY, PEER_KEY_KEY, PEER_CA_KEY, true)
            })
        });
    result.err()
}

/// What a member's `auto` Secret says about its certificates: the earliest expiry (zero for a
/// certificate that does not parse or is not signed by a CA the plane trusts, when its CAs are
/// known), the rotation they were issued under, and whether they are what the CA rotation asks
/// (see [`Authority::lag`]). `None` when it holds no certificate.
pub(super) fn certificates_of(
    secret: &Secret,
    client: Option<&Authority>,
    peer: Option<&Authority>,
    now: SystemTime,
) -> Option<MemberCertificates> {
    let mut earliest: Option<SystemTime> = None;
    let mut lag = None;
    for (key, ca_key, authority) in [
        (SERVER_CERT_KEY, CLIENT_CA_KEY, client),
        (PEER_CERT_KEY, PEER_CA_KEY, peer),
    ] {
        let Some(pem) = secret_text(secret, key) else {
            continue;
        };
        let chains = authority.is_none_or(|a| a.trusts_issuer_of(&pem));
        let at = if chains {
            not_after(&pem).unwrap_or(SystemTime::UNIX_EPOCH)
        } else {
            SystemTime::UNIX_EPOCH
        };
        earliest = Some(earliest.map_or(at, |e| e.min(at)));
        if let Some(authority) = authority.filter(|_| chains) {
            let trusted = secret_text(secret, ca_key).unwrap_or_default();
            lag = lag.or(authority.lag(&trusted, &pem));
        }
    }
    Some(MemberCertificates {
        valid_for: earliest?.duration_since(now).unwrap_or_default(),
        rotation: secret.annotations().get(CERTIFICATE_ROTATION_ANNOTATION).cloned(),
        authority: lag,
    })
}

/// The CAs an `auto` CA Secret holds and the rotation it records, or what is wrong with it.
pub(super) fn authority_of(secret: &Secret) -> Result<(Authority, Option<String>), String> {
    let pair = secret_pair(secret, TLS_CERT_KEY, TLS_KEY_KEY)
        .ok_or_else(|| format!("it has no {TLS_CERT_KEY} or {TLS_KEY_KEY}"))?;
    let issuing = CertificateAuthority::load(&pair.cert_pem, &pair.key_pem)
        .map_err(|e| etcd_operator_api::report::chain(&e))?;
    let incoming = match secret_pair(secret, NEXT_CERT_KEY, NEXT_KEY_KEY) {
        Some(next) => Some(
            CertificateAuthority::load(&next.cert_pem, &next.key_pem)
                .map_err(|e| format!("{NEXT_CERT_KEY}: {}", etcd_operator_api::report::chain(&e)))?,
        ),
        None => None,
    };
    let retiring = secret_text(secret, PREVIOUS_CERT_KEY).filter(|p| p.trim() != pair.cert_pem.trim());
    let rotation = secret
        .annotations()
        .get(CA_ROTATION_ANNOTATION)
        .filter(|r| !r.is_empty())
        .cloned();
    Ok((
        Authority {
            issuing,
            incoming,
            retiring,
        },
        rotation,
    ))
}

/// When the Secret's certificates were issued, from [`ISSUED_AT_ANNOTATION`].
pub(super) fn issued_at(secret: &Secret) -> Option<jiff::Timestamp> {
    secret.annotations().get(ISSUED_AT_ANNOTATION)?.parse().ok()
}

/// The issuer of a `certManager` plane.
fn issuer_of(spec: &ValidatedCluster, plane: Plane) -> Option<&IssuerReference> {
    match plane.provider(&spec.tls)? {
        Provider::CertManager(issuer) => Some(issuer),
        _ => None,
    }
}

/// The identity a `tls.crt`/`tls.key`/`ca.crt` Secret holds.
fn identity_of(secret: &Secret) -> Option<ClientTls> {
    Some(ClientTls {
        ca_pem: secret_text(secret, CA_CERT_KEY)?,
        cert_pem: secret_text(secret, TLS_CERT_KEY)?,
        key_pem: secret_text(secret, TLS_KEY_KEY)?,
    })
}

/// What is wrong with a `tls.crt`/`tls.key`/`ca.crt` Secret, `None` when it is usable.
fn secret_problem(secret: &Secret) -> Option<String> {
    let missing: Vec<&str> = [TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY]
        .into_iter()
        .filter(|key| secret_text(secret, key).is_none())
        .collect();
    if !missing.is_empty() {
        return Some(format!("has no {}", missing.join(", ")));
    }
    let pair = secret_pair(secret, TLS_CERT_KEY, TLS_KEY_KEY)?;
    (!key_matches(&pair)).then(|| format!("has a {TLS_KEY_KEY} that is not the key of its {TLS_CERT_KEY}"))
}

/// A Secret of the cluster as the related object of an Event (Events about different Secrets
/// stay apart instead of being counted as one series).
fn secret_reference(cluster: &ClusterRef, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Secret".to_owned()),
        name: Some(name.to_owned()),
        namespace: Some(cluster.namespace.clone()),
        ..ObjectReference::default()
    }
}

fn certificates_error(what: String) -> impl FnOnce(String) -> RuntimeError {
    move |detail| RuntimeError::Certificates { what, detail }
}

impl KubernetesRuntime {
    /// The CA of an `auto` plane, from its Secret `<cluster>-<plane>-ca`, generated and created
    /// when there is none. A CA is never replaced: one that does not load is an error, and so is
    /// a missing CA while members hold certificates of the plane (they would no longer be
    /// trusted).
    pub(super) async fn ensure_ca(
        &self,
        cluster: &ClusterRef,
        plane: Plane,
    ) -> Result<(Authority, Option<String>), RuntimeError> {
        let secrets = self.api::<Secret>(cluster);
        let name = ca_secret_name(cluster, plane);
        // A settled cluster's CA comes from the controller's watches; a missing one is looked
        // up in the API before anything is created.
        if let Some(secret) = self
            .cache
            .read_secrets(cluster)
            .and_then(|all| all.into_iter().find(|s| s.name_any() == name))
        {
            return self.load_ca(cluster, &name, &secret).await;
        }
        if let Some(secret) = secrets
            .get_opt(&name)
            .await
            .map_err(kube_error("read the CA Secret"))?
        {
            return self.load_ca(cluster, &name, &secret).await;
        }
        let ca_key = match plane {
            Plane::Client => CLIENT_CA_KEY,
            Plane::Peer => PEER_CA_KEY,
        };
        let holders: Vec<String> = secrets
            .list(&ListParams::default().labels(&list_selector(cluster)))
            .await
            .map_err(kube_error("list the cluster's certificate Secrets"))?
            .items
            .iter()
            .filter(|s| secret_text(s, ca_key).is_some())
            .map(ResourceExt::name_any)
            .collect();
        let what = format!("the {} CA of {}", plane.as_str(), cluster.key());
        if !holders.is_empty() {
            let detail = format!(
                "its Secret {}/{name} is missing while {} hold certificates it issued; restore it (a new CA would not be trusted by the running members)",
                cluster.namespace,
                holders.join(", ")
            );
            self.publish_warning(
                cluster,
                "CertificateAuthorityMissing",
                "IssueCertificates",
                detail.clone(),
                Some(secret_reference(cluster, &name)),
            )
            .await;
            return Err(RuntimeError::Certificates { what, detail });
        }
        let ca = CertificateAuthority::generate(
            &format!("etcd-operator {} {} CA", cluster.key(), plane.as_str()),
            CA_VALIDITY,
        )
        .map_err(|e| certificates_error(what.clone())(e.to_string()))?;
        match secrets
            .create(
                &crate::resources::post_params(),
                &build_ca_secret(cluster, plane, &CaMaterial::steady(ca.pem())),
            )
            .await
        {
            Ok(_) => {
                info!(cluster = %cluster.key(), secret = %name, "created the cluster's CA");
                self.publish(
                    cluster,
                    "CertificateAuthorityCreated",
                    "IssueCertificates",
                    format!("Created the {} plane's CA in Secret {name}", plane.as_str()),
                    Some(secret_reference(cluster, &name)),
                )
                .await;
                Ok((Authority::steady(ca), None))
            }
            // Created meanwhile (another operator instance): that one is the CA.
            Err(error) if is_already_exists(&error) => {
                let secret = secrets
                    .get(&name)
                    .await
                    .map_err(kube_error("read the CA Secret"))?;
                self.load_ca(cluster, &name, &secret).await
            }
            Err(source) => Err(RuntimeError::Kube {
                op: "create the CA Secret",
                source,
            }),
        }
    }

    async fn load_ca(
        &self,
        cluster: &ClusterRef,
        name: &str,
        secret: &Secret,
    ) -> Result<(Authority, Option<String>), RuntimeError> {
        match authority_of(secret) {
            Ok(loaded) => Ok(loaded),
            Err(detail) => {
                let detail = format!(
                    "Secret {}/{name} does not hold a usable CA: {detail}",
                    cluster.namespace
                );
                self.publish_warning(
                    cluster,
                    "CertificatesInvalid",
                    "IssueCertificates",
                    detail.clone(),
                    Some(secret_reference(cluster, name)),
                )
                .await;
                Err(RuntimeError::Certificates {
                    what: format!("the CA of {}", cluster.key()),
                    detail,
                })
            }
        }
    }

    /// The CAs of the cluster's `auto` planes.
    async fn auto_cas(&self, cluster: &ClusterRef, planes: &TlsPlanes) -> Result<AutoCas, RuntimeError> {
        let mut cas = AutoCas::default();
        if planes.client == Some(Provider::Auto) {
            cas.client = Some(self.ensure_ca(cluster, Plane::Client).await?.0);
        }
        if planes.peer == Some(Provider::Auto) {
            cas.peer = Some(self.ensure_ca(cluster, Plane::Peer).await?.0);
        }
        Ok(cas)
    }

    /// Makes sure the certificates the member's Pod mounts are there and good, before the Pod is
    /// created: `auto` ones are issued (again) when [`reissue_reason`] says so, `secretRef`
    /// Secrets are checked, `certManager` Certificates are applied and their Secrets awaited.
    /// Returns why certificates were issued, when they were.
    pub(super) async fn ensure_member_tls(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<Option<String>, RuntimeError> {
        let planes = spec.tls.clone();
        let mut issued = None;
        if planes.client == Some(Provider::Auto) || planes.peer == Some(Provider::Auto) {
            issued = self
                .ensure_auto_secret(cluster, &planes, name, spec.certificate_rotation.as_deref())
                .await?;
        }
        for plane in Plane::ALL {
            match plane.provider(&planes) {
                Some(Provider::Secret(secret)) => {
                    self.checked_secret(cluster, plane, secret).await?;
                }
                Some(Provider::CertManager(_)) => {
                    self.ensure_certificate(cluster, spec, Some(name), plane).await?;
                }
                Some(Provider::Auto) | None => {}
            }
        }
        Ok(issued)
    }

    /// The member's `auto` Secret `<member>-tls`, issued (again) unless it holds good
    /// certificates.
    async fn ensure_auto_secret(
        &self,
        cluster: &ClusterRef,
        planes: &TlsPlanes,
        name: &str,
        rotation: Option<&str>,
    ) -> Result<Option<String>, RuntimeError> {
        let cas = self.auto_cas(cluster, planes).await?;
        let secrets = self.api::<Secret>(cluster);
        let secret_name = member_secret_name(name);
        let existing = secrets
            .get_opt(&secret_name)
            .await
            .map_err(kube_error("read the member's certificate Secret"))?;
        let now = SystemTime::now();
        let Some(reason) = reissue_reason(
            existing.as_ref(),
            &cas,
            &server_names(cluster, name),
            rotation,
            now,
        ) else {
            return Ok(None);
        };
        let what = format!("member {name}");
        let dns = member_dns_names(cluster, name);
        let issue = |authority: &Authority, spec| {
            authority
                .issuing
                .issue(&spec)
                .map_err(|e| certificates_error(what.clone())(e.to_string()))
        };
        let material = MemberTlsMaterial {
            server: cas
                .client
                .as_ref()
                .map(|ca| issue(ca, member_tls::server_certificate(name, &dns)))
                .transpose()?,
            peer: cas
                .peer
                .as_ref()
                .map(|ca| issue(ca, member_tls::peer_certificate(name, &dns)))
                .transpose()?,
            // Every CA the plane trusts now: during a CA rotation, the old and the new one.
            client_ca: cas.client.as_ref().map(Authority::bundle),
            peer_ca: cas.peer.as_ref().map(Authority::bundle),
            rotation: rotation.map(str::to_owned),
            issued_at: Some(jiff::Timestamp::now().to_string()),
        };
        secrets
            .patch(
                &secret_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&build_member_secret(cluster, name, &material)),
            )
            .await
            .map_err(kube_error("write the member's certificate Secret"))?;
        info!(cluster = %cluster.key(), member = name, secret = %secret_name, %reason, "issued member certificates");
        self.publish(
            cluster,
            "CertificatesIssued",
            "IssueCertificates",
            format!("Issued certificates for member {name} into Secret {secret_name}: {reason}"),
            Some(secret_reference(cluster, &secret_name)),
        )
        .await;
        Ok(Some(reason))
    }

    /// A `secretRef` Secret with `tls.crt`, `tls.key` (its key) and `ca.crt`; anything else is
    /// an error naming the Secret, with a Warning Event.
    async fn checked_secret(
        &self,
        cluster: &ClusterRef,
        plane: Plane,
        secret_name: &str,
    ) -> Result<Secret, RuntimeError> {
        let secret = self
            .api::<Secret>(cluster)
            .get_opt(secret_name)
            .await
            .map_err(kube_error("read the spec.tls secretRef Secret"))?;
        let problem = match &secret {
            None => Some("does not exist".to_owned()),
            Some(secret) => secret_problem(secret),
        };
        match (secret, problem) {
            (Some(secret), None) => Ok(secret),
            (_, problem) => {
                let error = RuntimeError::TlsSecret {
                    plane: plane.as_str(),
                    provider: "secretRef",
                    secret: format!("{}/{secret_name}", cluster.namespace),
                    detail: problem.unwrap_or_default(),
                };
                warn!(cluster = %cluster.key(), error = %etcd_operator_api::report::Chain(&error), "the cluster's certificates are missing");
                self.publish_warning(
                    cluster,
                    "CertificatesMissing",
                    "CheckCertificates",
                    etcd_operator_api::report::chain(&error),
                    Some(secret_reference(cluster, secret_name)),
                )
                .await;
                Err(error)
            }
        }
    }

    /// Applies the cert-manager Certificate of a member's plane (or, with no member, the
    /// operator's client certificate) and returns its Secret once cert-manager wrote it.
    async fn ensure_certificate(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        member: Option<&str>,
        plane: Plane,
    ) -> Result<Secret, RuntimeError> {
        let Some(issuer) = issuer_of(spec, plane) else {
            return Err(RuntimeError::Certificates {
                what: format!("the {} plane of {}", plane.as_str(), cluster.key()),
                detail: "spec.tls has no certManager issuer for it".to_owned(),
            });
        };
        let (name, secret_name, use_, dns) = match member {
            Some(m) => (
                certificate_name(m, plane),
                certificate_secret_name(m, plane),
                match plane {
                    Plane::Client => CertificateUse::Server,
                    Plane::Peer => CertificateUse::Peer,
                },
                member_dns_names(cluster, m),
            ),
            None => (
                operator_certificate_name(cluster),
                operator_certificate_secret_name(cluster),
                CertificateUse::Client,
                Vec::new(),
            ),
        };
        let certificate = build_certificate(cluster, member, &name, &secret_name, use_, &dns, issuer);
        let certificates: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &cluster.namespace, &certificate_resource());
        certificates
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&certificate),
            )
            .await
            .map_err(kube_error("apply the cert-manager Certificate"))?;
        let secret = self
            .api::<Secret>(cluster)
            .get_opt(&secret_name)
            .await
            .map_err(kube_error("read the cert-manager Certificate's Secret"))?;
        let pending = || RuntimeError::CertificateNotReady {
            certificate: format!("{}/{name}", cluster.namespace),
            secret: format!("{}/{secret_name}", cluster.namespace),
        };
        let secret = secret.ok_or_else(pending)?;
        if secret_pair(&secret, TLS_CERT_KEY, TLS_KEY_KEY).is_none() {
            return Err(pending());
        }
        if let Some(detail) = secret_problem(&secret) {
            let error = RuntimeError::TlsSecret {
                plane: plane.as_str(),
                provider: "certManager",
                secret: format!("{}/{secret_name}", cluster.namespace),
                detail,
            };
            self.publish_warning(
                cluster,
                "CertificatesInvalid",
                "CheckCertificates",
                etcd_operator_api::report::chain(&error),
                Some(secret_reference(cluster, &secret_name)),
            )
            .await;
            return Err(error);
        }
        Ok(secret)
    }

    /// The operator's identity toward the members' client plane: a client certificate of the
    /// `auto` CA (issued in memory, kept while it is good), the `secretRef` Secret's own pair
    /// (which must then be valid for client authentication too), or the operator's cert-manager
    /// Certificate.
    pub(super) async fn operator_identity(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> Result<Option<ClientTls>, RuntimeError> {
        let planes = spec.tls.clone();
        match &planes.client {
            None => Ok(None),
            Some(Provider::Auto) => {
                let (authority, _) = self.ensure_ca(cluster, Plane::Client).await?;
                let bundle = authority.bundle();
                let ca = &authority.issuing;
                let now = SystemTime::now();
                let mut identities = self
                    .identities
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // Kept while it trusts what the members may present and the issuing CA vouches
                // for it: a CA rotation renews it when the new CA starts issuing.
                if let Some(identity) = identities
                    .get(&cluster.key())
                    .filter(|id| id.ca_pem == bundle && ca.verify_client(&id.cert_pem, now).is_ok())
                {
                    return Ok(Some(identity.clone()));
                }
                let pair = ca.issue(&member_tls::operator_certificate()).map_err(|e| {
                    certificates_error(format!("the operator's identity toward {}", cluster.key()))(
                        e.to_string(),
                    )
                })?;
                let identity = ClientTls {
                    ca_pem: bundle,
                    cert_pem: pair.cert_pem,
                    key_pem: pair.key_pem,
                };
                identities.insert(cluster.key(), identity.clone());
                info!(cluster = %cluster.key(), "issued the operator's client certificate toward the members");
                Ok(Some(identity))
            }
            Some(Provider::Secret(name)) => {
                let secret = self.checked_secret(cluster, Plane::Client, name).await?;
                Ok(identity_of(&secret))
            }
            Some(Provider::CertManager(_)) => {
                let secret = self
                    .ensure_certificate(cluster, spec, None, Plane::Client)
                    .await?;
                Ok(identity_of(&secret))
            }
        }
    }

    /// The CA Secret of an `auto` plane when it exists (the controller's watch first, then the
    /// API).
    async fn ca_secret(&self, cluster: &ClusterRef, plane: Plane) -> Result<Option<Secret>, RuntimeError> {
        let name = ca_secret_name(cluster, plane);
        if let Some(secret) = self
            .cache
            .read_secrets(cluster)
            .and_then(|all| all.into_iter().find(|s| s.name_any() == name))
        {
            return Ok(Some(secret));
        }
        self.api::<Secret>(cluster)
            .get_opt(&name)
            .await
            .map_err(kube_error("read the CA Secret"))
    }

    /// See [`crate::runtime::Runtime::authority`].
    pub(super) async fn authority_view(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> Result<Option<AuthorityView>, RuntimeError> {
        let now = SystemTime::now();
        let mut seen = Vec::new();
        for plane in Plane::ALL {
            if plane.provider(&spec.tls) != Some(&Provider::Auto) {
                continue;
            }
            let Some(secret) = self.ca_secret(cluster, plane).await? else {
                continue;
            };
            let (authority, rotation) = self.load_ca(cluster, &secret.name_any(), &secret).await?;
            seen.push((authority.phase(), rotation, authority.valid_for(now)));
        }
        Ok(AuthorityView::of(&seen))
    }

    /// See [`crate::runtime::Runtime::advance_authority`]: each `auto` plane's CA Secret is
    /// replaced whole at the resourceVersion read (a concurrent writer makes it a conflict, tried
    /// again by the next reconcile), with a Normal Event per plane moved.
    pub(super) async fn advance_authority_to(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        to: AuthorityPhase,
        rotation: Option<&str>,
    ) -> Result<(), RuntimeError> {
        self.cache.wrote(cluster);
        let secrets = self.api::<Secret>(cluster);
        for plane in Plane::ALL {
            if plane.provider(&spec.tls) != Some(&Provider::Auto) {
                continue;
            }
            let name = ca_secret_name(cluster, plane);
            let Some(secret) = secrets
                .get_opt(&name)
                .await
                .map_err(kube_error("read the CA Secret"))?
            else {
                return Err(RuntimeError::Certificates {
                    what: format!("the {} CA of {}", plane.as_str(), cluster.key()),
                    detail: format!(
                        "its Secret {}/{name} does not exist, so it cannot be rotated",
                        cluster.namespace
                    ),
                });
            };
            let (authority, recorded) = self.load_ca(cluster, &name, &secret).await?;
            let from = authority.phase();
            if from == to {
                continue;
            }
            let what = format!("the {} CA of {}", plane.as_str(), cluster.key());
            let moved = authority
                .advance(to, || {
                    let stamp = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
                    CertificateAuthority::generate(
                        &format!("etcd-operator {} {} CA {stamp}", cluster.key(), plane.as_str()),
                        CA_VALIDITY,
                    )
                    .ok()
                })
                .map_err(|e| certificates_error(what.clone())(etcd_operator_api::report::chain(&e)))?;
            let record = if to == AuthorityPhase::Trusting {
                rotation.map(str::to_owned)
            } else {
                recorded
            };
            // A merge patch conditional on the resourceVersion read: keys the phase no longer
            // has are removed (null), and a concurrent writer makes it a 409.
            let next = build_ca_secret(cluster, plane, &CaMaterial::of(&moved, record.as_deref()));
            let data = next.data.unwrap_or_default();
            let mut patch_data = serde_json::Map::new();
            for key in [
                TLS_CERT_KEY,
                TLS_KEY_KEY,
                CA_BUNDLE_KEY,
                NEXT_CERT_KEY,
                NEXT_KEY_KEY,
                PREVIOUS_CERT_KEY,
            ] {
                patch_data.insert(
                    key.to_owned(),
                    data.get(key)
                        .map_or(serde_json::Value::Null, |v| serde_json::json!(v)),
                );
            }
            let patch = serde_json::json!({
                "metadata": {
                    "resourceVersion": secret.metadata.resource_version,
                    "annotations": {CA_ROTATION_ANNOTATION: record},
                },
                "data": patch_data,
            });
            secrets
                .patch(&name, &crate::resources::patch_params(), &Patch::Merge(&patch))
                .await
                .map_err(kube_error("write the CA Secret"))?;
            info!(cluster = %cluster.key(), secret = %name, %from, %to, "CA rotation moved on");
            let report = super::super::events::Report::authority_moved(plane.as_str(), from, to);
            self.publish(
                cluster,
                &report.reason,
                &report.action,
                report.note,
                Some(secret_reference(cluster, &name)),
            )
            .await;
        }
        Ok(())
    }

    /// The `auto` Secrets of the cluster's members: certificates (see [`certificates_of`]) and
    /// when they were issued, by member.
    pub(super) async fn member_secrets(
        &self,
        cluster: &ClusterRef,
    ) -> Result<BTreeMap<String, (MemberCertificates, Option<jiff::Timestamp>)>, RuntimeError> {
        let secrets = match self.cache.read_secrets(cluster) {
            Some(cached) => cached,
            None => {
                self.api::<Secret>(cluster)
                    .list(&ListParams::default().labels(&list_selector(cluster)))
                    .await
                    .map_err(kube_error("list the cluster's certificate Secrets"))?
                    .items
            }
        };
        let ca = |plane| {
            secrets
                .iter()
                .find(|s| s.name_any() == ca_secret_name(cluster, plane))
                .and_then(|s| authority_of(s).ok())
                .map(|(authority, _)| authority)
        };
        let (client_ca, peer_ca) = (ca(Plane::Client), ca(Plane::Peer));
        let now = SystemTime::now();
        let mut out = BTreeMap::new();
        for secret in &secrets {
            let Some(member) = secret.labels().get(MEMBER_LABEL) else {
                continue;
            };
            if secret.name_any() != member_secret_name(member) {
                continue;
            }
            if let Some(certs) = certificates_of(secret, client_ca.as_ref(), peer_ca.as_ref(), now) {
                out.insert(member.clone(), (certs, issued_at(secret)));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::tls::{CA_BUNDLE_KEY, build_member_secret, member_secret_name};
    use std::time::Duration;

    fn cluster() -> ClusterRef {
        ClusterRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
        }
    }

    fn material(ca: &CertificateAuthority, rotation: Option<&str>) -> MemberTlsMaterial {
        let dns = member_dns_names(&cluster(), "c-a");
        MemberTlsMaterial {
            server: Some(ca.issue(&member_tls::server_certificate("c-a", &dns)).unwrap()),
            peer: None,
            client_ca: Some(ca.pem().cert_pem.clone()),
            peer_ca: None,
            rotation: rotation.map(str::to_owned),
            issued_at: Some("2026-01-02T03:04:05Z".into()),
        }
    }

    #[test]
    fn good_certificates_are_kept_and_every_fault_is_named() {
        let ca = CertificateAuthority::generate("c client CA", CA_VALIDITY).unwrap();
        let cas = AutoCas {
            client: Some(Authority::steady(ca)),
            peer: None,
        };
        let authority = cas.client.as_ref().unwrap();
        let ca = &authority.issuing;
        let names = server_names(&cluster(), "c-a");
        let now = SystemTime::now();
        let good = build_member_secret(&cluster(), "c-a", &material(ca, Some("r1")));
        assert_eq!(reissue_reason(Some(&good), &cas, &names, Some("r1"), now), None);
        assert_eq!(reissue_reason(Some(&good), &cas, &names, None, now), None);
        assert!(reissue_reason(None, &cas, &names, None, now).is_some());
        let rotated = reissue_reason(Some(&good), &cas, &names, Some("r2"), now).unwrap();
        assert!(rotated.contains("r2"), "{rotated}");
        // Another CA's certificate.
        let other = CertificateAuthority::generate("other", CA_VALIDITY).unwrap();
        let mut foreign = material(&other, None);
        foreign.client_ca = Some(ca.pem().cert_pem.clone());
        let foreign = build_member_secret(&cluster(), "c-a", &foreign);
        assert!(reissue_reason(Some(&foreign), &cas, &names, None, now).is_some());
        // Expiring within the renewal window.
        let later = now + Duration::from_secs(340 * 24 * 3600);
        assert!(reissue_reason(Some(&good), &cas, &names, None, later).is_some());
        // Its reported state.
        let certs = certificates_of(&good, Some(authority), None, now).unwrap();
        assert!(certs.valid_for > Duration::from_secs(360 * 24 * 3600));
        assert_eq!(certs.rotation.as_deref(), Some("r1"));
        assert_eq!(certs.authority, None);
        let certs = certificates_of(&foreign, Some(authority), None, now).unwrap();
        assert_eq!(
            certs.valid_for,
            Duration::ZERO,
            "a certificate of another CA counts as expired"
        );
        assert_eq!(member_secret_name("c-a"), good.name_any());
        assert!(issued_at(&good).is_some());
    }

    #[test]
    fn a_ca_rotation_changes_what_a_member_secret_must_hold_phase_by_phase() {
        let old = CertificateAuthority::generate("c client CA", CA_VALIDITY).unwrap();
        let good = build_member_secret(&cluster(), "c-a", &material(&old, None));
        let names = server_names(&cluster(), "c-a");
        let now = SystemTime::now();
        let new = CertificateAuthority::generate("c client CA 2", CA_VALIDITY).unwrap();
        let trusting = Authority::steady(old).begin(new).unwrap();
        // The CA Secret round-trips every phase.
        let secret = build_ca_secret(&cluster(), Plane::Client, &CaMaterial::of(&trusting, Some("r1")));
        let (read, rotation) = authority_of(&secret).unwrap();
        assert_eq!(
            (read.phase(), rotation.as_deref()),
            (AuthorityPhase::Trusting, Some("r1"))
        );
        assert_eq!(read.bundle(), trusting.bundle());
        assert_eq!(secret_text(&secret, CA_BUNDLE_KEY), Some(trusting.bundle()));
        // Trusting: the member's Secret carries the old CA only, so it is issued again with
        // the bundle; what it reports says why.
        let cas = AutoCas {
            client: Some(trusting),
            peer: None,
        };
        let reason = reissue_reason(Some(&good), &cas, &names, None, now).unwrap();
        assert!(
            reason.contains("not what the cluster's CAs trust now"),
            "{reason}"
        );
        let certs = certificates_of(&good, cas.client.as_ref(), None, now).unwrap();
        assert_eq!(certs.authority, Some(AuthorityLag::Trust));
        assert!(
            certs.valid_for > Duration::ZERO,
            "a certificate of a trusted CA is not expired"
        );
        // Reissuing: the old CA's certificate is rolled (not treated as expired).
        let Some(trusting) = cas.client else {
            unreachable!()
        };
        let reissuing = trusting.swap().unwrap();
        let cas = AutoCas {
            client: Some(reissuing),
            peer: None,
        };
        let mut on_bundle = good.clone();
        if let Some(data) = on_bundle.data.as_mut() {
            let bundle = cas.client.as_ref().map(Authority::bundle).unwrap_or_default();
            data.insert(
                CLIENT_CA_KEY.to_owned(),
                k8s_openapi::ByteString(bundle.into_bytes()),
            );
        }
        let certs = certificates_of(&on_bundle, cas.client.as_ref(), None, now).unwrap();
        assert_eq!(certs.authority, Some(AuthorityLag::Issuer));
        assert!(certs.valid_for > Duration::ZERO);
        let reason = reissue_reason(Some(&on_bundle), &cas, &names, None, now).unwrap();
        assert!(reason.contains("not issued by the cluster's CA"), "{reason}");
        // A Secret issued now holds what the phase asks.
        let authority = cas.client.as_ref().unwrap();
        let mut issued = material(&authority.issuing, None);
        issued.client_ca = Some(authority.bundle());
        let issued = build_member_secret(&cluster(), "c-a", &issued);
        assert_eq!(reissue_reason(Some(&issued), &cas, &names, None, now), None);
        assert_eq!(
            certificates_of(&issued, Some(authority), None, now)
                .unwrap()
                .authority,
            None
        );
        // A CA Secret without a usable pair is named.
        let mut broken = secret.clone();
        if let Some(data) = broken.data.as_mut() {
            data.remove(TLS_KEY_KEY);
        }
        assert!(
            authority_of(&broken)
                .unwrap_err()
                .contains("no tls.crt or tls.key")
        );
    }
}
