//! The TLS objects of a cluster and how member Pods use them: the names of the Secrets, the CA
//! and member Secrets of `auto` TLS, cert-manager `Certificate`s, the Secret volumes and etcd's
//! TLS flags. Pure: the kubernetes runtime reads, checks and writes them.
//!
//! Every plane that uses TLS is mounted read-only at `/etc/etcd/tls/<plane>/` as `tls.crt`,
//! `tls.key` and `ca.crt`, whatever the provider; only the Secret (and its keys) differ:
//! - `auto`: the member's own Secret `<member>-tls` (`server.crt/key`, `peer.crt/key`,
//!   `client-ca.crt`, `peer-ca.crt`), issued from the cluster's CA Secrets `<cluster>-client-ca`
//!   and `<cluster>-peer-ca`;
//! - `secretRef`: the named Secret, shared by every member;
//! - `certManager`: the Secret `<member>-<plane>-tls` of the member's Certificate `<member>-<plane>`.

use std::collections::BTreeMap;

use etcd_operator_api::naming;
use etcd_operator_api::v1alpha2::IssuerReference;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{KeyToPath, Secret, SecretVolumeSource, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use serde_json::json;

use super::{cluster_labels, member_labels, owner_reference};
use crate::model::ClusterRef;
use crate::tls::ca::PemPair;
use crate::tls::member::{Provider, TlsPlanes};

/// Annotation on a member's Pod and PVC naming the planes that use TLS (`client`, `peer`,
/// `client,peer`), so the runtime reports `https://` URLs without the spec.
pub const TLS_ANNOTATION: &str = "etcd.operator.dev/tls";
/// Annotation on a member's `auto` Secret: the on-demand rotation its certificates were issued
/// under (the EtcdCluster's `etcd.operator.dev/rotate-certificates` value then).
pub const CERTIFICATE_ROTATION_ANNOTATION: &str = "etcd.operator.dev/certificate-rotation";
/// Annotation on a member's `auto` Secret: when its certificates were issued (RFC 3339), so a
/// Pod created before that still runs on older ones.
pub const ISSUED_AT_ANNOTATION: &str = "etcd.operator.dev/certificates-issued-at";
/// Annotation on an `auto` CA Secret: the EtcdCluster's `etcd.operator.dev/rotate-ca` value when
/// the last CA rotation began.
pub const CA_ROTATION_ANNOTATION: &str = "etcd.operator.dev/ca-rotation";
/// Key of an `auto` CA Secret: every CA certificate the plane trusts now (the bundle clients
/// should trust).
pub const CA_BUNDLE_KEY: &str = "ca.crt";
/// Keys of an `auto` CA Secret during a rotation's trusting phase: the incoming CA.
pub const NEXT_CERT_KEY: &str = "next.crt";
/// See [`NEXT_CERT_KEY`].
pub const NEXT_KEY_KEY: &str = "next.key";
/// Key of an `auto` CA Secret during a rotation's reissuing phase: the retiring CA's certificate.
pub const PREVIOUS_CERT_KEY: &str = "previous.crt";
/// Where the planes' certificates are mounted in the etcd container.
pub const TLS_MOUNT_DIR: &str = "/etc/etcd/tls";
/// The kubelet's cluster domain the members' fully qualified names are under.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// File mode of the mounted certificates and keys: readable by the etcd user's group
/// (`fsGroup`), nobody else.
const TLS_FILE_MODE: i32 = 0o440;

/// Keys of a member's `auto` Secret.
pub const SERVER_CERT_KEY: &str = "server.crt";
/// The serving key.
pub const SERVER_KEY_KEY: &str = "server.key";
/// The peer certificate.
pub const PEER_CERT_KEY: &str = "peer.crt";
/// The peer key.
pub const PEER_KEY_KEY: &str = "peer.key";
/// The client plane's CA certificate.
pub const CLIENT_CA_KEY: &str = "client-ca.crt";
/// The peer plane's CA certificate.
pub const PEER_CA_KEY: &str = "peer-ca.crt";
/// Keys of a `kubernetes.io/tls` Secret (and of cert-manager's and `secretRef` Secrets).
pub const TLS_CERT_KEY: &str = "tls.crt";
/// The key.
pub const TLS_KEY_KEY: &str = "tls.key";
/// The CA certificate.
pub const CA_CERT_KEY: &str = "ca.crt";

/// One of etcd's two TLS planes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Plane {
    /// Port 2379.
    Client,
    /// Port 2380.
    Peer,
}

impl Plane {
    /// Both planes.
    pub const ALL: [Plane; 2] = [Plane::Client, Plane::Peer];

    /// `client` or `peer`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Peer => "peer",
        }
    }

    /// The provider of this plane, `None` for plain HTTP.
    pub fn provider(self, planes: &TlsPlanes) -> Option<&Provider> {
        match self {
            Self::Client => planes.client.as_ref(),
            Self::Peer => planes.peer.as_ref(),
        }
    }

    fn volume(self) -> String {
        format!("{}-tls", self.as_str())
    }

    fn mount_dir(self) -> String {
        format!("{TLS_MOUNT_DIR}/{}", self.as_str())
    }
}

/// Which planes of a member use TLS, as its [`TLS_ANNOTATION`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TlsSchemes {
    /// The client plane is HTTPS.
    pub client: bool,
    /// The peer plane is HTTPS.
    pub peer: bool,
}

impl TlsSchemes {
    /// The schemes `planes` ask for.
    pub fn of(planes: &TlsPlanes) -> Self {
        Self {
            client: planes.client.is_some(),
            peer: planes.peer.is_some(),
        }
    }

    /// Whether any plane uses TLS.
    pub fn any(self) -> bool {
        self.client || self.peer
    }

    /// The [`TLS_ANNOTATION`] value, `None` without TLS.
    pub fn annotation(self) -> Option<String> {
        match (self.client, self.peer) {
            (false, false) => None,
            (true, false) => Some("client".to_owned()),
            (false, true) => Some("peer".to_owned()),
            (true, true) => Some("client,peer".to_owned()),
        }
    }

    /// Reads a [`TLS_ANNOTATION`] value back (unknown words are ignored).
    pub fn parse(value: &str) -> Self {
        let words: Vec<&str> = value.split(',').map(str::trim).collect();
        Self {
            client: words.contains(&"client"),
            peer: words.contains(&"peer"),
        }
    }

    fn scheme(tls: bool) -> &'static str {
        if tls { "https" } else { "http" }
    }
}

/// Peer URL of a member: `http(s)://<member host>:2380`.
pub fn peer_url_for(cluster: &ClusterRef, member: &str, schemes: TlsSchemes) -> String {
    format!(
        "{}://{}:{}",
        TlsSchemes::scheme(schemes.peer),
        super::member_host(cluster, member),
        super::PEER_PORT
    )
}

/// Client URL of a member: `http(s)://<member host>:2379`.
pub fn client_url_for(cluster: &ClusterRef, member: &str, schemes: TlsSchemes) -> String {
    format!(
        "{}://{}:{}",
        TlsSchemes::scheme(schemes.client),
        super::member_host(cluster, member),
        super::CLIENT_PORT
    )
}

/// The DNS names a member's certificates are issued for: the Pod's name, its names under the
/// headless peer Service (short, namespaced, `.svc` and `.svc.cluster.local`) and the client
/// Service's names. `localhost` and `127.0.0.1` are added by [`crate::tls::member`].
pub fn member_dns_names(cluster: &ClusterRef, member: &str) -> Vec<String> {
    let ns = &cluster.namespace;
    let peer = naming::peer_service_name(&cluster.name);
    let client = naming::client_service_name(&cluster.name);
    vec![
        member.to_owned(),
        format!("{member}.{peer}"),
        format!("{member}.{peer}.{ns}"),
        format!("{member}.{peer}.{ns}.svc"),
        format!("{member}.{peer}.{ns}.svc.{CLUSTER_DOMAIN}"),
        client.clone(),
        format!("{client}.{ns}"),
        format!("{client}.{ns}.svc"),
        format!("{client}.{ns}.svc.{CLUSTER_DOMAIN}"),
    ]
}

/// The CA Secret of an `auto` plane: `<cluster>-<plane>-ca`.
pub fn ca_secret_name(cluster: &ClusterRef, plane: Plane) -> String {
    format!("{}-{}-ca", cluster.name, plane.as_str())
}

/// A member's `auto` Secret: `<member>-tls`.
pub fn member_secret_name(member: &str) -> String {
    format!("{member}-tls")
}

/// The cert-manager Certificate of a member's plane: `<member>-<plane>`.
pub fn certificate_name(member: &str, plane: Plane) -> String {
    format!("{member}-{}", plane.as_str())
}

/// The Secret cert-manager writes for [`certificate_name`]: `<member>-<plane>-tls`.
pub fn certificate_secret_name(member: &str, plane: Plane) -> String {
    format!("{member}-{}-tls", plane.as_str())
}

/// The cert-manager Certificate of the operator's client identity: `<cluster>-operator`.
pub fn operator_certificate_name(cluster: &ClusterRef) -> String {
    format!("{}-operator", cluster.name)
}

/// Its Secret: `<cluster>-operator-tls`.
pub fn operator_certificate_secret_name(cluster: &ClusterRef) -> String {
    format!("{}-operator-tls", cluster.name)
}

/// The Secret a member's plane is mounted from, and which of its keys become `tls.crt`,
/// `tls.key` and `ca.crt`; `None` for a plane without TLS.
pub fn plane_secret(planes: &TlsPlanes, plane: Plane, member: &str) -> Option<(String, [&'static str; 3])> {
    Some(match plane.provider(planes)? {
        Provider::Auto => (
            member_secret_name(member),
            match plane {
                Plane::Client => [SERVER_CERT_KEY, SERVER_KEY_KEY, CLIENT_CA_KEY],
                Plane::Peer => [PEER_CERT_KEY, PEER_KEY_KEY, PEER_CA_KEY],
            },
        ),
        Provider::Secret(name) => (name.clone(), [TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY]),
        Provider::CertManager(_) => (
            certificate_secret_name(member, plane),
            [TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY],
        ),
    })
}

/// The read-only Secret volumes of a member's TLS planes.
pub fn tls_volumes(planes: &TlsPlanes, member: &str) -> Vec<Volume> {
    Plane::ALL
        .into_iter()
        .filter_map(|plane| {
            let (secret, keys) = plane_secret(planes, plane, member)?;
            let items = keys
                .iter()
                .zip([TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY])
                .map(|(key, path)| KeyToPath {
                    key: (*key).to_owned(),
                    path: path.to_owned(),
                    mode: None,
                })
                .collect();
            Some(Volume {
                name: plane.volume(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret),
                    items: Some(items),
                    default_mode: Some(TLS_FILE_MODE),
                    optional: Some(false),
                }),
                ..Volume::default()
            })
        })
        .collect()
}

/// The mounts of [`tls_volumes`] in the etcd container.
pub fn tls_mounts(planes: &TlsPlanes) -> Vec<VolumeMount> {
    Plane::ALL
        .into_iter()
        .filter(|plane| plane.provider(planes).is_some())
        .map(|plane| VolumeMount {
            name: plane.volume(),
            mount_path: plane.mount_dir(),
            read_only: Some(true),
            ..VolumeMount::default()
        })
        .collect()
}

/// Where a member Pod finds the certificate files of `plane`, when it uses TLS (its Secret is
/// mounted read-only at the plane's directory).
pub fn tls_files(planes: &TlsPlanes, plane: Plane) -> Option<crate::etcd_args::TlsFiles> {
    plane.provider(planes)?;
    let dir = plane.mount_dir();
    Some(crate::etcd_args::TlsFiles {
        cert: format!("{dir}/{TLS_CERT_KEY}"),
        key: format!("{dir}/{TLS_KEY_KEY}"),
        trusted_ca: format!("{dir}/{CA_CERT_KEY}"),
    })
}

fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

/// The CA Secret of an `auto` plane (`kubernetes.io/tls`, owned by the EtcdCluster).
pub fn build_ca_secret(cluster: &ClusterRef, plane: Plane, ca: &CaMaterial) -> Secret {
    let mut data = BTreeMap::from([
        (TLS_CERT_KEY.to_owned(), bytes(&ca.issuing.cert_pem)),
        (TLS_KEY_KEY.to_owned(), bytes(&ca.issuing.key_pem)),
        (CA_BUNDLE_KEY.to_owned(), bytes(&ca.bundle)),
    ]);
    if let Some(next) = &ca.incoming {
        data.insert(NEXT_CERT_KEY.to_owned(), bytes(&next.cert_pem));
        data.insert(NEXT_KEY_KEY.to_owned(), bytes(&next.key_pem));
    }
    if let Some(previous) = &ca.retiring {
        data.insert(PREVIOUS_CERT_KEY.to_owned(), bytes(previous));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(ca_secret_name(cluster, plane)),
            namespace: Some(cluster.namespace.clone()),
            labels: Some(cluster_labels(cluster)),
            annotations: ca
                .rotation
                .as_ref()
                .map(|r| BTreeMap::from([(CA_ROTATION_ANNOTATION.to_owned(), r.clone())])),
            owner_references: Some(vec![owner_reference(cluster)]),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// What an `auto` CA Secret holds (see [`crate::tls::authority`]): the issuing CA, during a
/// rotation the incoming or the retiring one, the bundle trusted now, and the rotation recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaMaterial {
    /// The CA that issues (`tls.crt`, `tls.key`).
    pub issuing: PemPair,
    /// The incoming CA (`next.crt`, `next.key`).
    pub incoming: Option<PemPair>,
    /// The retiring CA's certificate (`previous.crt`).
    pub retiring: Option<String>,
    /// Every CA certificate trusted now (`ca.crt`).
    pub bundle: String,
    /// The rotate-ca value recorded when the last rotation began.
    pub rotation: Option<String>,
}

impl CaMaterial {
    /// A plane with one CA and no rotation recorded.
    pub fn steady(issuing: &PemPair) -> Self {
        Self {
            bundle: issuing.cert_pem.clone(),
            issuing: issuing.clone(),
            incoming: None,
            retiring: None,
            rotation: None,
        }
    }

    /// What `authority` is, with `rotation` recorded.
    pub fn of(authority: &crate::tls::authority::Authority, rotation: Option<&str>) -> Self {
        Self {
            issuing: authority.issuing.pem().clone(),
            incoming: authority.incoming.as_ref().map(|ca| ca.pem().clone()),
            retiring: authority.retiring.clone(),
            bundle: authority.bundle(),
            rotation: rotation.map(str::to_owned),
        }
    }
}

/// What a member's `auto` Secret holds: the certificates of its `auto` planes and their CAs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberTlsMaterial {
    /// Serving certificate and key of the client plane.
    pub server: Option<PemPair>,
    /// Peer certificate and key.
    pub peer: Option<PemPair>,
    /// The client plane's CA certificate.
    pub client_ca: Option<String>,
    /// The peer plane's CA certificate.
    pub peer_ca: Option<String>,
    /// The on-demand rotation they were issued under.
    pub rotation: Option<String>,
    /// When they were issued (RFC 3339).
    pub issued_at: Option<String>,
}

/// A member's `auto` Secret `<member>-tls` (Opaque, member labels, owned by the EtcdCluster),
/// with [`CERTIFICATE_ROTATION_ANNOTATION`] when issued under a rotation and
/// [`ISSUED_AT_ANNOTATION`].
pub fn build_member_secret(cluster: &ClusterRef, member: &str, material: &MemberTlsMaterial) -> Secret {
    let mut data = BTreeMap::new();
    if let Some(server) = &material.server {
        data.insert(SERVER_CERT_KEY.to_owned(), bytes(&server.cert_pem));
        data.insert(SERVER_KEY_KEY.to_owned(), bytes(&server.key_pem));
    }
    if let Some(peer) = &material.peer {
        data.insert(PEER_CERT_KEY.to_owned(), bytes(&peer.cert_pem));
        data.insert(PEER_KEY_KEY.to_owned(), bytes(&peer.key_pem));
    }
    if let Some(ca) = &material.client_ca {
        data.insert(CLIENT_CA_KEY.to_owned(), bytes(ca));
    }
    if let Some(ca) = &material.peer_ca {
        data.insert(PEER_CA_KEY.to_owned(), bytes(ca));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(member_secret_name(member)),
            namespace: Some(cluster.namespace.clone()),
            labels: Some(member_labels(cluster, member)),
            annotations: Some(
                [
                    (CERTIFICATE_ROTATION_ANNOTATION, &material.rotation),
                    (ISSUED_AT_ANNOTATION, &material.issued_at),
                ]
                .into_iter()
                .filter_map(|(key, value)| Some((key.to_owned(), value.clone()?)))
                .collect(),
            )
            .filter(|a: &BTreeMap<String, String>| !a.is_empty()),
            owner_references: Some(vec![owner_reference(cluster)]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// cert-manager's `Certificate` (`cert-manager.io/v1`).
pub fn certificate_resource() -> ApiResource {
    ApiResource {
        group: "cert-manager.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "cert-manager.io/v1".to_owned(),
        kind: "Certificate".to_owned(),
        plural: "certificates".to_owned(),
    }
}

/// What a cert-manager Certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateUse {
    /// A member's client plane: serving, and client authentication for etcd's JSON gateway,
    /// which dials the member's own client port with it (see `LeafUsage::ServerAndClient`).
    Server,
    /// A member's peer plane: serving and authenticating to the other members.
    Peer,
    /// The operator's client identity toward the members.
    Client,
}

impl CertificateUse {
    fn usages(self) -> &'static [&'static str] {
        match self {
            Self::Server | Self::Peer => &[
                "digital signature",
                "key encipherment",
                "server auth",
                "client auth",
            ],
            Self::Client => &["digital signature", "key encipherment", "client auth"],
        }
    }
}

/// A cert-manager `Certificate` named `name`, written by cert-manager into `secret_name`
/// (labelled like the certificate, so it is listed and removed with the member), issued by
/// `issuer` (`Issuer` of `cert-manager.io` unless it says otherwise) for `dns_names` (plus
/// `localhost` and `127.0.0.1` for member certificates), with an ECDSA P-256 key.
pub fn build_certificate(
    cluster: &ClusterRef,
    member: Option<&str>,
    name: &str,
    secret_name: &str,
    use_: CertificateUse,
    dns_names: &[String],
    issuer: &IssuerReference,
) -> DynamicObject {
    let labels = member.map_or_else(|| cluster_labels(cluster), |m| member_labels(cluster, m));
    let common_name = member.unwrap_or(crate::tls::member::OPERATOR_CLIENT_NAME);
    let mut spec = json!({
        "secretName": secret_name,
        "secretTemplate": {"labels": labels},
        "commonName": common_name,
        "usages": use_.usages(),
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "issuerRef": {
            "name": issuer.name,
            "kind": issuer.kind.as_deref().unwrap_or("Issuer"),
            "group": issuer.group.as_deref().unwrap_or("cert-manager.io"),
        },
    });
    if use_ != CertificateUse::Client {
        let (dns, ips) = crate::tls::member::member_names(dns_names);
        spec["dnsNames"] = json!(dns);
        spec["ipAddresses"] = json!(ips.iter().map(ToString::to_string).collect::<Vec<_>>());
    }
    let mut certificate = DynamicObject::new(name, &certificate_resource())
        .within(&cluster.namespace)
        .data(json!({ "spec": spec }));
    certificate.metadata.labels = Some(labels);
    certificate.metadata.owner_references = Some(vec![owner_reference(cluster)]);
    certificate
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_api::v1alpha2::{AutoTls, CertManagerTls, SecretReference, TlsPlane, TlsSpec};

    fn cluster() -> ClusterRef {
        ClusterRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
        }
    }

    #[test]
    fn schemes_round_trip_through_the_annotation() {
        for schemes in [
            TlsSchemes::default(),
            TlsSchemes {
                client: true,
                peer: false,
            },
            TlsSchemes {
                client: false,
                peer: true,
            },
            TlsSchemes {
                client: true,
                peer: true,
            },
        ] {
            let parsed = schemes
                .annotation()
                .map_or_else(TlsSchemes::default, |a| TlsSchemes::parse(&a));
            assert_eq!(parsed, schemes);
        }
        let both = TlsSchemes {
            client: true,
            peer: true,
        };
        assert_eq!(peer_url_for(&cluster(), "c-a", both), "https://c-a.c.ns.svc:2380");
        assert_eq!(
            client_url_for(&cluster(), "c-a", TlsSchemes::default()),
            "http://c-a.c.ns.svc:2379"
        );
    }

    #[test]
    fn each_provider_mounts_its_own_secret_under_the_same_file_names() {
        let planes = TlsPlanes::of(Some(&TlsSpec {
            client: Some(TlsPlane {
                secret_ref: Some(SecretReference { name: "mine".into() }),
                ..Default::default()
            }),
            peer: Some(TlsPlane {
                cert_manager: Some(CertManagerTls::default()),
                ..Default::default()
            }),
        }));
        let volumes = tls_volumes(&planes, "c-a");
        let secrets: Vec<_> = volumes
            .iter()
            .map(|v| {
                v.secret
                    .as_ref()
                    .and_then(|s| s.secret_name.clone())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(secrets, ["mine", "c-a-peer-tls"]);
        let auto = TlsPlanes::of(Some(&TlsSpec {
            client: None,
            peer: Some(TlsPlane {
                auto: Some(AutoTls {}),
                ..Default::default()
            }),
        }));
        let volumes = tls_volumes(&auto, "c-a");
        assert_eq!(volumes.len(), 1);
        let items = volumes[0]
            .secret
            .as_ref()
            .and_then(|s| s.items.clone())
            .unwrap_or_default();
        let pairs: Vec<(&str, &str)> = items.iter().map(|i| (i.key.as_str(), i.path.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("peer.crt", "tls.crt"),
                ("peer.key", "tls.key"),
                ("peer-ca.crt", "ca.crt")
            ]
        );
        assert_eq!(
            tls_files(&auto, Plane::Peer).map(|f| f.trusted_ca),
            Some(format!("{TLS_MOUNT_DIR}/peer/ca.crt"))
        );
        assert_eq!(tls_files(&TlsPlanes::default(), Plane::Client), None);
    }
}
