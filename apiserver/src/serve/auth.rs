//! Who a request comes from: the [`UserInfo`] every authenticator produces (client certificate,
//! request header, token review), and the x509 mapping from a verified client certificate.

use std::collections::BTreeMap;

use rustls_pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The group every authenticated identity belongs to.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// An authenticated identity, as Kubernetes' `user.Info`: what authorization (SubjectAccessReview)
/// and audit see.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    /// The user name, e.g. `admin` or `system:serviceaccount:ns:name`.
    pub name: String,
    /// A unique id, when the authenticator knows one.
    pub uid: Option<String>,
    /// Group memberships, including [`AUTHENTICATED_GROUP`].
    pub groups: Vec<String>,
    /// Further attributes (request-header `X-Remote-Extra-*`, token review `extra`).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// Adds `group` unless the user already has it.
    pub fn add_group(&mut self, group: &str) {
        if !self.groups.iter().any(|g| g == group) {
            self.groups.push(group.to_owned());
        }
    }

    /// Whether the user belongs to `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// The identity in a client certificate could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CertificateIdentityError {
    /// The certificate is not valid DER X.509.
    #[error("parse client certificate: {0}")]
    Parse(String),
    /// The subject has no common name, or it is empty.
    #[error("read client certificate subject: no common name")]
    NoCommonName,
    /// A common name or organization is not a string.
    #[error("read client certificate subject: {0}")]
    Attribute(String),
}

/// Maps a client certificate that TLS already verified to a user the way Kubernetes'
/// `CommonNameUserConversion` does: the name is the subject's common name, the groups are its
/// organization values, plus [`AUTHENTICATED_GROUP`].
///
/// This does no chain verification: call it only with a certificate rustls verified against the
/// CA that this identity mapping is meant for.
pub fn user_from_client_certificate(cert: &CertificateDer<'_>) -> Result<UserInfo, CertificateIdentityError> {
    let (_, cert) =
        X509Certificate::from_der(cert).map_err(|e| CertificateIdentityError::Parse(e.to_string()))?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .ok_or(CertificateIdentityError::NoCommonName)?
        .as_str()
        .map_err(|e| CertificateIdentityError::Attribute(e.to_string()))?
        .to_owned();
    if name.is_empty() {
        return Err(CertificateIdentityError::NoCommonName);
    }
    let mut user = UserInfo {
        name,
        ..UserInfo::default()
    };
    for org in subject.iter_organization() {
        let org = org
            .as_str()
            .map_err(|e| CertificateIdentityError::Attribute(e.to_string()))?;
        user.add_group(org);
    }
    user.add_group(AUTHENTICATED_GROUP);
    Ok(user)
}

/// Local-mode authentication: the identity in the client certificate, if the client presented
/// one (rustls has then verified it against the local CA, the server's only client CA): user =
/// subject CN, groups = subject O values + `system:authenticated`. `None` for anonymous clients
/// and for a certificate without a usable subject.
pub fn authenticate_local(peer: &super::PeerCertificates) -> Option<UserInfo> {
    let leaf = peer.leaf()?;
    match user_from_client_certificate(leaf) {
        Ok(user) => Some(user),
        Err(error) => {
            tracing::debug!(error = %etcd_operator_api::report::Chain(&error), "client certificate carries no usable identity");
            None
        }
    }
}
