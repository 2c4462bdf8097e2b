//! The local runtime's `auto` CAs on disk and their rotation ([`crate::tls::authority`]): per
//! plane, in the cluster's `pki/` directory,
//!
//! ```text
//! <plane>-ca.{crt,key}        the issuing CA
//! <plane>-ca-next.{crt,key}   the incoming CA (trusting phase)
//! <plane>-ca-previous.crt     the retiring CA's certificate (reissuing phase)
//! <plane>-trust.crt           every CA trusted now, one bundle: what clients should trust
//! <plane>-ca.rotation         the rotate-ca value recorded when the last rotation began
//! ```
//!
//! Every file is written whole through a rename, and each transition is ordered so that an
//! operator stopped between two writes leaves a state [`load`] reads as the phase before or after.

use std::path::{Path, PathBuf};

use super::{RuntimeError, certificates_error, ensure_pair, write_file};
use crate::tls::authority::{Authority, AuthorityPhase};
use crate::tls::ca::{CA_VALIDITY, CertificateAuthority, PemPair};
use etcd_operator_api::report::chain;

/// The files of one plane's CAs.
#[derive(Debug, Clone)]
pub(super) struct PlaneCas {
    pki: PathBuf,
    plane: &'static str,
    /// The common name of the plane's CAs (a new one gets the time it was made appended).
    name: String,
}

impl PlaneCas {
    pub(super) fn new(pki: PathBuf, plane: &'static str, cluster_key: &str) -> Self {
        Self {
            pki,
            plane,
            name: format!("etcd-operator {cluster_key} {plane} CA"),
        }
    }

    fn path(&self, suffix: &str) -> PathBuf {
        self.pki.join(format!("{}-{suffix}", self.plane))
    }

    /// The bundle clients (and new members) trust: `<plane>-trust.crt`.
    pub(super) fn trust_path(&self) -> PathBuf {
        self.path("trust.crt")
    }

    fn what(&self) -> String {
        format!("the {} CA in {}", self.plane, self.pki.display())
    }

    fn error(&self) -> impl FnOnce(String) -> RuntimeError {
        let what = self.what();
        move |detail| certificates_error(&what)(detail)
    }

    /// The plane's CAs and the recorded rotation: the issuing CA is created on first use (a CA is
    /// never replaced silently), a swap an earlier operator left half-done is completed, and the
    /// trust bundle file is rewritten when it does not say what is trusted.
    pub(super) fn load(&self) -> Result<(Authority, Option<String>), RuntimeError> {
        self.complete_swap()?;
        let base = self.path("ca");
        let pair = ensure_pair(
            &base,
            |_| Ok(()),
            || CertificateAuthority::generate(&self.name, CA_VALIDITY).map(|ca| ca.pem().clone()),
        )?;
        let issuing =
            CertificateAuthority::load(&pair.cert_pem, &pair.key_pem).map_err(|e| self.error()(chain(&e)))?;
        let incoming = read_pair(&self.path("ca-next"))
            .and_then(|p| CertificateAuthority::load(&p.cert_pem, &p.key_pem).ok())
            .filter(|ca| ca.pem().cert_pem != pair.cert_pem);
        let retiring = std::fs::read_to_string(self.path("ca-previous.crt"))
            .ok()
            .filter(|pem| pem.trim() != pair.cert_pem.trim() && !pem.trim().is_empty());
        let authority = Authority {
            issuing,
            incoming,
            retiring,
        };
        let bundle = authority.bundle();
        let trust = self.trust_path();
        if std::fs::read_to_string(&trust).ok().as_deref() != Some(bundle.as_str()) {
            write_file(&trust, &bundle, 0o644).map_err(|e| self.error()(e.to_string()))?;
        }
        let rotation = std::fs::read_to_string(self.path("ca.rotation"))
            .ok()
            .map(|r| r.trim().to_owned())
            .filter(|r| !r.is_empty());
        Ok((authority, rotation))
    }

    /// A swap moves `<plane>-ca-next.key` then `.crt` over the issuing pair: stopped between the
    /// two renames, the issuing key already belongs to the next certificate, which is moved now.
    fn complete_swap(&self) -> Result<(), RuntimeError> {
        let next_crt = self.path("ca-next.crt");
        if self.path("ca-next.key").exists() {
            return Ok(());
        }
        let (Ok(cert_pem), Ok(key_pem)) = (
            std::fs::read_to_string(&next_crt),
            std::fs::read_to_string(self.path("ca.key")),
        ) else {
            return Ok(());
        };
        if super::pair_matches(&PemPair { cert_pem, key_pem }) {
            std::fs::rename(&next_crt, self.path("ca.crt")).map_err(|e| self.error()(e.to_string()))?;
            tracing::info!(plane = self.plane, pki = %self.pki.display(), "completed an interrupted CA swap");
        }
        Ok(())
    }

    /// Moves the plane to `to` (nothing when it is there already); see
    /// [`crate::runtime::Runtime::advance_authority`].
    /// Moves the plane's CA rotation to `to`; the phase it moved from, or `None` when it was
    /// there already.
    pub(super) fn advance(
        &self,
        to: AuthorityPhase,
        rotation: Option<&str>,
    ) -> Result<Option<AuthorityPhase>, RuntimeError> {
        let (authority, _) = self.load()?;
        let from = authority.phase();
        if from == to {
            return Ok(None);
        }
        // Refused before anything is written.
        let moved = authority
            .advance(to, || {
                let stamp = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
                CertificateAuthority::generate(&format!("{} {stamp}", self.name), CA_VALIDITY).ok()
            })
            .map_err(|e| self.error()(chain(&e)))?;
        let err = |e: std::io::Error| self.error()(e.to_string());
        match to {
            AuthorityPhase::Trusting => {
                let Some(incoming) = &moved.incoming else {
                    return Err(self.error()("the new CA was not made".to_owned()));
                };
                let base = self.path("ca-next");
                write_file(&base.with_extension("key"), &incoming.pem().key_pem, 0o600).map_err(err)?;
                write_file(&base.with_extension("crt"), &incoming.pem().cert_pem, 0o644).map_err(err)?;
                write_file(&self.path("ca.rotation"), rotation.unwrap_or_default(), 0o644).map_err(err)?;
            }
            AuthorityPhase::Reissuing => {
                let retiring = moved.retiring.clone().unwrap_or_default();
                write_file(&self.path("ca-previous.crt"), &retiring, 0o644).map_err(err)?;
                std::fs::rename(self.path("ca-next.key"), self.path("ca.key")).map_err(err)?;
                std::fs::rename(self.path("ca-next.crt"), self.path("ca.crt")).map_err(err)?;
            }
            AuthorityPhase::Steady => match std::fs::remove_file(self.path("ca-previous.crt")) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(err(e)),
            },
        }
        write_file(&self.trust_path(), &moved.bundle(), 0o644).map_err(err)?;
        tracing::info!(plane = self.plane, pki = %self.pki.display(), %from, %to, "CA rotation moved on");
        Ok(Some(from))
    }
}

/// `<base>.crt` and `<base>.key` when both are there.
fn read_pair(base: &Path) -> Option<PemPair> {
    Some(PemPair {
        cert_pem: std::fs::read_to_string(base.with_extension("crt")).ok()?,
        key_pem: std::fs::read_to_string(base.with_extension("key")).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::member::issued_by;

    fn cas(dir: &Path) -> PlaneCas {
        PlaneCas::new(dir.to_path_buf(), "client", "ns/c")
    }

    #[test]
    fn a_rotation_on_disk_walks_its_phases_and_keeps_the_trust_file_true() {
        let tmp = tempfile::tempdir().unwrap();
        let cas = cas(tmp.path());
        let (first, rotation) = cas.load().unwrap();
        assert_eq!((first.phase(), rotation), (AuthorityPhase::Steady, None));
        let old = first.issuing.pem().cert_pem.clone();
        assert_eq!(std::fs::read_to_string(cas.trust_path()).unwrap(), first.bundle());
        // Loading again keeps the same CA.
        assert_eq!(cas.load().unwrap().0.issuing.pem().cert_pem, old);

        cas.advance(AuthorityPhase::Trusting, Some("r1")).unwrap();
        let (trusting, rotation) = cas.load().unwrap();
        assert_eq!(
            (trusting.phase(), rotation.as_deref()),
            (AuthorityPhase::Trusting, Some("r1"))
        );
        assert_eq!(trusting.issuing.pem().cert_pem, old, "the old CA still issues");
        let new = trusting.incoming.as_ref().unwrap().pem().cert_pem.clone();
        let trust = std::fs::read_to_string(cas.trust_path()).unwrap();
        assert!(trust.contains(old.trim()) && trust.contains(new.trim()));
        // Asked again: already there, nothing new made.
        cas.advance(AuthorityPhase::Trusting, Some("r1")).unwrap();
        assert_eq!(cas.load().unwrap().0.incoming.unwrap().pem().cert_pem, new);

        cas.advance(AuthorityPhase::Reissuing, Some("r1")).unwrap();
        let (reissuing, _) = cas.load().unwrap();
        assert_eq!(reissuing.phase(), AuthorityPhase::Reissuing);
        assert_eq!(reissuing.issuing.pem().cert_pem, new, "the new CA issues");
        assert_eq!(
            std::fs::read_to_string(cas.trust_path()).unwrap(),
            trust,
            "still both trusted"
        );

        cas.advance(AuthorityPhase::Steady, Some("r1")).unwrap();
        let (done, rotation) = cas.load().unwrap();
        assert_eq!(
            (done.phase(), rotation.as_deref()),
            (AuthorityPhase::Steady, Some("r1"))
        );
        let trust = std::fs::read_to_string(cas.trust_path()).unwrap();
        assert!(!trust.contains(old.trim()), "the old CA is trusted no more");
        assert!(issued_by(
            &done
                .issuing
                .issue(&crate::tls::member::operator_certificate())
                .unwrap()
                .cert_pem,
            &new
        ));
    }

    #[test]
    fn a_move_out_of_order_is_refused_and_writes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let cas = cas(tmp.path());
        cas.load().unwrap();
        let before: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        let err = cas.advance(AuthorityPhase::Reissuing, None).unwrap_err();
        assert!(matches!(err, RuntimeError::Certificates { .. }), "{err}");
        assert!(
            chain(&err).contains("only Trusting may follow Steady"),
            "{}",
            chain(&err)
        );
        let after: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(before, after);
    }

    #[test]
    fn a_swap_stopped_between_its_renames_is_completed_on_load() {
        let tmp = tempfile::tempdir().unwrap();
        let cas = cas(tmp.path());
        cas.load().unwrap();
        cas.advance(AuthorityPhase::Trusting, None).unwrap();
        let new = std::fs::read_to_string(cas.path("ca-next.crt")).unwrap();
        // The swap's first writes, then a stop: the issuing key is the new CA's, its cert not.
        std::fs::copy(cas.path("ca.crt"), cas.path("ca-previous.crt")).unwrap();
        std::fs::rename(cas.path("ca-next.key"), cas.path("ca.key")).unwrap();
        let (authority, _) = cas.load().unwrap();
        assert_eq!(authority.phase(), AuthorityPhase::Reissuing);
        assert_eq!(authority.issuing.pem().cert_pem, new);
    }
}
