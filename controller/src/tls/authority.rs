//! CA rotation through an overlapping trust bundle: the CAs of one `auto` plane, the bundle its
//! members trust in each phase of a rotation, the transitions between phases, and whether a
//! member runs on what the phase asks. Pure; the runtimes keep the CAs (local: files beside the
//! cluster; Kubernetes: the plane's CA Secret) and restart the members.
//!
//! A rotation has three rolls, each one member at a time under the renewal's health gate:
//!
//! 1. [`AuthorityPhase::Trusting`]: a new CA exists and is trusted next to the old one; the old
//!    one still issues. Every member restarts trusting both.
//! 2. [`AuthorityPhase::Reissuing`]: the new CA issues; the old one is still trusted. Every member
//!    gets certificates of the new CA and restarts on them (and so does the operator's identity).
//! 3. [`AuthorityPhase::Steady`] again: only the new CA is trusted. Every member restarts
//!    trusting only it.
//!
//! At every moment each pair of members (and the operator) trusts the CA the other presents, so
//! the cluster never splits over TLS and a client never loses more than the member restarting.

use std::time::{Duration, SystemTime};

use super::ca::CertificateAuthority;
use super::member::issued_by;

/// Where a plane's CA rotation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthorityPhase {
    /// One CA issues and is the only one trusted.
    Steady,
    /// A new CA is trusted beside the issuing one, which still issues.
    Trusting,
    /// The new CA issues; the old one is still trusted until every member holds new certificates.
    Reissuing,
}

impl AuthorityPhase {
    /// The phase after this one (a rotation's cycle: steady, trusting, reissuing, steady).
    pub fn next(self) -> Self {
        match self {
            Self::Steady => Self::Trusting,
            Self::Trusting => Self::Reissuing,
            Self::Reissuing => Self::Steady,
        }
    }

    /// A stable name, for conditions, Events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Steady => "Steady",
            Self::Trusting => "Trusting",
            Self::Reissuing => "Reissuing",
        }
    }
}

impl std::fmt::Display for AuthorityPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a member does not yet run on what its plane's phase asks: plain data the runtimes report
/// in `model::MemberCertificates`, so it lives in `model` (which imports no other module).
pub use crate::model::AuthorityLag;

/// A transition the rotation cannot make from where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("move the CA rotation from {from} to {to}: only {allowed} may follow {from}")]
pub struct TransitionError {
    /// Where the rotation is.
    pub from: AuthorityPhase,
    /// Where it was asked to go.
    pub to: AuthorityPhase,
    /// The only phase that may follow.
    pub allowed: AuthorityPhase,
}

/// The CAs of one `auto` plane.
#[derive(Debug)]
pub struct Authority {
    /// The CA that issues members' and the operator's certificates.
    pub issuing: CertificateAuthority,
    /// While [`AuthorityPhase::Trusting`]: the new CA, trusted, not issuing yet.
    pub incoming: Option<CertificateAuthority>,
    /// While [`AuthorityPhase::Reissuing`]: the old CA's certificate, still trusted.
    pub retiring: Option<String>,
}

impl Authority {
    /// A plane with one CA and no rotation under way.
    pub fn steady(issuing: CertificateAuthority) -> Self {
        Self {
            issuing,
            incoming: None,
            retiring: None,
        }
    }

    /// Where the rotation is. A plane holding both an incoming and a retiring CA (never written
    /// by the transitions below) counts as trusting: the earlier phase, so nothing is dropped.
    pub fn phase(&self) -> AuthorityPhase {
        match (&self.incoming, &self.retiring) {
            (Some(_), _) => AuthorityPhase::Trusting,
            (None, Some(_)) => AuthorityPhase::Reissuing,
            (None, None) => AuthorityPhase::Steady,
        }
    }

    /// Every CA certificate trusted now, as one PEM bundle. Sorted, so that the bundle of
    /// trusting (old, new) and of reissuing (new, old) is the same text: members that trust both
    /// are not restarted again for the order.
    pub fn bundle(&self) -> String {
        let mut certs: Vec<String> = std::iter::once(self.issuing.pem().cert_pem.as_str())
            .chain(self.incoming.as_ref().map(|ca| ca.pem().cert_pem.as_str()))
            .chain(self.retiring.as_deref())
            .map(|pem| {
                let pem = pem.trim_end();
                format!("{pem}\n")
            })
            .collect();
        certs.sort();
        certs.dedup();
        certs.concat()
    }

    /// Starts a rotation onto `incoming`: trusted from now on, issuing after the next step.
    pub fn begin(self, incoming: CertificateAuthority) -> Result<Self, TransitionError> {
        self.expect(AuthorityPhase::Trusting)?;
        Ok(Self {
            incoming: Some(incoming),
            ..self
        })
    }

    /// The incoming CA issues from now on; the old one stays trusted.
    pub fn swap(self) -> Result<Self, TransitionError> {
        self.expect(AuthorityPhase::Reissuing)?;
        let Self {
            issuing, incoming, ..
        } = self;
        let Some(incoming) = incoming else {
            return Err(TransitionError {
                from: AuthorityPhase::Steady,
                to: AuthorityPhase::Reissuing,
                allowed: AuthorityPhase::Trusting,
            });
        };
        Ok(Self {
            retiring: Some(issuing.pem().cert_pem.clone()),
            issuing: incoming,
            incoming: None,
        })
    }

    /// The old CA is trusted no more.
    pub fn finish(self) -> Result<Self, TransitionError> {
        self.expect(AuthorityPhase::Steady)?;
        Ok(Self {
            retiring: None,
            ..self
        })
    }

    /// Moves to `to`, which must be the phase after this one.
    pub fn advance(
        self,
        to: AuthorityPhase,
        incoming: impl FnOnce() -> Option<CertificateAuthority>,
    ) -> Result<Self, AdvanceError> {
        match to {
            AuthorityPhase::Trusting => {
                self.expect(to)?;
                let ca = incoming().ok_or(AdvanceError::NoIncoming)?;
                Ok(self.begin(ca)?)
            }
            AuthorityPhase::Reissuing => Ok(self.swap()?),
            AuthorityPhase::Steady => Ok(self.finish()?),
        }
    }

    fn expect(&self, to: AuthorityPhase) -> Result<(), TransitionError> {
        let from = self.phase();
        if from.next() == to {
            Ok(())
        } else {
            Err(TransitionError {
                from,
                to,
                allowed: from.next(),
            })
        }
    }

    /// Whether a member trusting `trusted` (the bundle it started with) and presenting
    /// `certificate` runs on what the phase asks; why not, when it does not. `None` for a
    /// member that does.
    pub fn lag(&self, trusted: &str, certificate: &str) -> Option<AuthorityLag> {
        if normalise(trusted) != normalise(&self.bundle()) {
            return Some(AuthorityLag::Trust);
        }
        (!issued_by(certificate, &self.issuing.pem().cert_pem)).then_some(AuthorityLag::Issuer)
    }

    /// Whether `certificate` is signed by a CA trusted now (the issuing one, the incoming or the
    /// retiring one): such a certificate is rolled by the rotation, not treated as foreign.
    pub fn trusts_issuer_of(&self, certificate: &str) -> bool {
        issued_by(certificate, &self.issuing.pem().cert_pem)
            || self
                .incoming
                .as_ref()
                .is_some_and(|ca| issued_by(certificate, &ca.pem().cert_pem))
            || self
                .retiring
                .as_deref()
                .is_some_and(|ca| issued_by(certificate, ca))
    }

    /// How long the issuing CA stays valid from `now` (zero when it does not parse or expired).
    pub fn valid_for(&self, now: SystemTime) -> Duration {
        super::ca::not_after(&self.issuing.pem().cert_pem)
            .ok()
            .and_then(|at| at.duration_since(now).ok())
            .unwrap_or_default()
    }
}

/// A transition could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AdvanceError {
    /// Not the next phase.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// Beginning a rotation needs a new CA, and none could be made.
    #[error("begin the CA rotation: no new CA was made")]
    NoIncoming,
}

/// A bundle's text without the differences that do not matter (line endings, trailing space).
fn normalise(pem: &str) -> String {
    pem.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A cluster's rotation as the planner sees it: the phase of its `auto` planes, the rotation
/// value recorded when the last one began, and how long its issuing CAs stay valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorityView {
    /// Where the rotation is. When the planes differ (an operator stopped between writing one
    /// plane's CA and the other's), the phase the later of them reached.
    pub phase: AuthorityPhase,
    /// Whether every plane is at [`AuthorityView::phase`]; when not, the planner completes the
    /// transition before anything else.
    pub settled: bool,
    /// The `etcd.operator.dev/rotate-ca` value recorded when the last rotation began, when every
    /// plane records the same.
    pub rotation: Option<String>,
    /// How long the earliest-expiring issuing CA stays valid.
    pub valid_for: Duration,
}

impl AuthorityView {
    /// The view over the planes' `(phase, recorded rotation, issuing CA validity)`; `None` for
    /// a cluster without an `auto` plane.
    pub fn of(planes: &[(AuthorityPhase, Option<String>, Duration)]) -> Option<Self> {
        let (first, rest) = planes.split_first()?;
        let mut phase = first.0;
        for (other, _, _) in rest {
            // Phases of two planes are equal or adjacent in the cycle: the later one wins.
            if phase.next() == *other {
                phase = *other;
            }
        }
        Some(Self {
            phase,
            settled: planes.iter().all(|p| p.0 == phase),
            rotation: if rest.iter().all(|p| p.1 == first.1) {
                first.1.clone()
            } else {
                None
            },
            valid_for: planes.iter().map(|p| p.2).min().unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::ca::CA_VALIDITY;
    use crate::tls::member::{operator_certificate, peer_certificate};

    fn ca(name: &str) -> CertificateAuthority {
        CertificateAuthority::generate(name, CA_VALIDITY).unwrap()
    }

    #[test]
    fn a_rotation_walks_three_phases_and_each_bundle_trusts_what_is_presented() {
        let old = ca("old");
        let old_cert = old.pem().cert_pem.clone();
        let member_old = old.issue(&peer_certificate("m", &[])).unwrap();
        let steady = Authority::steady(old);
        assert_eq!(steady.phase(), AuthorityPhase::Steady);
        assert_eq!(steady.bundle(), format!("{}\n", old_cert.trim_end()));
        // A member on the steady CA runs on what the phase asks.
        assert_eq!(steady.lag(&steady.bundle(), &member_old.cert_pem), None);

        let new = ca("new");
        let new_cert = new.pem().cert_pem.clone();
        let trusting = steady.begin(new).unwrap();
        assert_eq!(trusting.phase(), AuthorityPhase::Trusting);
        let both = trusting.bundle();
        assert!(both.contains(old_cert.trim_end()) && both.contains(new_cert.trim_end()));
        // Trusting: members must restart on the bundle; certificates of the old CA are fine.
        let old_only = format!("{old_cert}\n");
        assert_eq!(
            trusting.lag(&old_only, &member_old.cert_pem),
            Some(AuthorityLag::Trust)
        );
        assert_eq!(trusting.lag(&both, &member_old.cert_pem), None);
        // New members still get certificates of the old CA (not every member trusts the new).
        assert!(issued_by(
            &trusting.issuing.issue(&operator_certificate()).unwrap().cert_pem,
            &old_cert
        ));

        let reissuing = trusting.swap().unwrap();
        assert_eq!(reissuing.phase(), AuthorityPhase::Reissuing);
        // The same bundle (sorted): members trusting both are not restarted for the order.
        assert_eq!(reissuing.bundle(), both);
        assert_eq!(
            reissuing.lag(&both, &member_old.cert_pem),
            Some(AuthorityLag::Issuer)
        );
        let member_new = reissuing.issuing.issue(&peer_certificate("m", &[])).unwrap();
        assert!(issued_by(&member_new.cert_pem, &new_cert));
        assert_eq!(reissuing.lag(&both, &member_new.cert_pem), None);
        assert!(reissuing.trusts_issuer_of(&member_old.cert_pem));

        let done = reissuing.finish().unwrap();
        assert_eq!(done.phase(), AuthorityPhase::Steady);
        assert!(
            !done.bundle().contains(old_cert.trim_end()),
            "the old CA is trusted no more"
        );
        assert_eq!(done.lag(&both, &member_new.cert_pem), Some(AuthorityLag::Trust));
        assert_eq!(done.lag(&done.bundle(), &member_new.cert_pem), None);
        assert!(!done.trusts_issuer_of(&member_old.cert_pem));
    }

    #[test]
    fn only_the_next_phase_may_follow() {
        let steady = Authority::steady(ca("a"));
        let err = steady.swap().unwrap_err();
        assert_eq!(
            err,
            TransitionError {
                from: AuthorityPhase::Steady,
                to: AuthorityPhase::Reissuing,
                allowed: AuthorityPhase::Trusting
            }
        );
        assert!(
            err.to_string().contains("only Trusting may follow Steady"),
            "{err}"
        );
        let steady = Authority::steady(ca("a"));
        assert!(steady.finish().is_err());
        let trusting = Authority::steady(ca("a")).begin(ca("b")).unwrap();
        assert!(trusting.begin(ca("c")).is_err());
        let trusting = Authority::steady(ca("a")).begin(ca("b")).unwrap();
        assert!(matches!(
            trusting.advance(AuthorityPhase::Steady, || None),
            Err(AdvanceError::Transition(_))
        ));
        assert!(matches!(
            Authority::steady(ca("a")).advance(AuthorityPhase::Trusting, || None),
            Err(AdvanceError::NoIncoming)
        ));
        let begun = Authority::steady(ca("a"))
            .advance(AuthorityPhase::Trusting, || Some(ca("b")))
            .unwrap();
        assert_eq!(begun.phase(), AuthorityPhase::Trusting);
    }

    #[test]
    fn bundles_compare_without_line_ending_noise_and_a_foreign_certificate_is_not_trusted() {
        let a = Authority::steady(ca("a"));
        let crlf = a.bundle().replace('\n', "\r\n");
        let foreign = ca("x").issue(&peer_certificate("m", &[])).unwrap();
        assert_eq!(
            a.lag(
                &crlf,
                &a.issuing.issue(&peer_certificate("m", &[])).unwrap().cert_pem
            ),
            None
        );
        assert_eq!(a.lag(&crlf, &foreign.cert_pem), Some(AuthorityLag::Issuer));
        assert!(!a.trusts_issuer_of(&foreign.cert_pem));
        let left = a.valid_for(SystemTime::now());
        // rcgen dates the CA from the start of the day it was made.
        assert!(
            left > CA_VALIDITY - Duration::from_secs(2 * 86_400) && left <= CA_VALIDITY,
            "{left:?}"
        );
    }

    #[test]
    fn the_view_of_two_planes_takes_the_later_adjacent_phase_and_the_common_rotation() {
        use AuthorityPhase::{Reissuing, Steady, Trusting};
        let day = Duration::from_secs(86_400);
        let r = |s: &str| Some(s.to_owned());
        assert_eq!(AuthorityView::of(&[]), None);
        let v = AuthorityView::of(&[(Steady, r("1"), day), (Steady, r("1"), 2 * day)]).unwrap();
        assert_eq!(
            (v.phase, v.settled, v.rotation.as_deref(), v.valid_for),
            (Steady, true, Some("1"), day)
        );
        // Interrupted transitions: the later phase, not settled.
        for (a, b, later) in [
            (Steady, Trusting, Trusting),
            (Trusting, Reissuing, Reissuing),
            (Reissuing, Steady, Steady),
        ] {
            for planes in [[(a, None, day), (b, None, day)], [(b, None, day), (a, None, day)]] {
                let v = AuthorityView::of(&planes).unwrap();
                assert_eq!((v.phase, v.settled), (later, false), "{planes:?}");
            }
        }
        let v = AuthorityView::of(&[(Trusting, r("2"), day), (Trusting, r("1"), day)]).unwrap();
        assert_eq!(v.rotation, None, "planes that disagree record no rotation");
    }
}
