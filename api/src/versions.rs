//! Which etcd versions a cluster may run, and which version changes an update may make.
//!
//! Rules (from etcd's upgrade and downgrade documentation): a version is a plain semver release
//! `3.<minor>.<patch>` with minor 4..=6. An update may change the patch freely (upgrades and
//! downgrades), move up by exactly one minor, or move down from 3.6 to 3.5 (the only downgrade etcd
//! supports); it may never skip a minor or change the major.

use std::fmt;

use semver::Version;

/// The etcd version a cluster runs when `spec.version` is unset.
pub const DEFAULT_ETCD_VERSION: &str = "3.5.34";
/// The only supported etcd major version.
pub const SUPPORTED_MAJOR: u64 = 3;
/// The supported etcd minor versions.
pub const SUPPORTED_MINORS: std::ops::RangeInclusive<u64> = 4..=6;

/// Why a version string is not acceptable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The string is not `MAJOR.MINOR.PATCH`.
    #[error("must be a semantic version MAJOR.MINOR.PATCH such as 3.5.34: {0}")]
    NotSemver(String),
    /// The string starts with `v`.
    #[error("must not start with 'v': write {0}")]
    LeadingV(String),
    /// Major version other than 3.
    #[error("etcd major version {0} is not supported: the major version must be 3")]
    Major(u64),
    /// Minor version outside 4..=6.
    #[error("etcd 3.{0} is not supported: the minor version must be 4, 5 or 6")]
    Minor(u64),
    /// A pre-release such as `3.6.0-rc.1`.
    #[error("pre-release versions ({0}) are not supported")]
    PreRelease(String),
    /// Build metadata such as `3.5.1+abc`.
    #[error("build metadata ({0}) is not allowed")]
    BuildMetadata(String),
}

/// Parses and checks an etcd version.
pub fn parse(version: &str) -> Result<Version, VersionError> {
    if let Some(rest) = version.strip_prefix('v')
        && Version::parse(rest).is_ok()
    {
        return Err(VersionError::LeadingV(rest.to_owned()));
    }
    let parsed = Version::parse(version).map_err(|e| VersionError::NotSemver(e.to_string()))?;
    if !parsed.pre.is_empty() {
        return Err(VersionError::PreRelease(parsed.pre.to_string()));
    }
    if !parsed.build.is_empty() {
        return Err(VersionError::BuildMetadata(parsed.build.to_string()));
    }
    if parsed.major != SUPPORTED_MAJOR {
        return Err(VersionError::Major(parsed.major));
    }
    if !SUPPORTED_MINORS.contains(&parsed.minor) {
        return Err(VersionError::Minor(parsed.minor));
    }
    Ok(parsed)
}

/// A permitted change of version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Same version.
    Unchanged,
    /// Same minor, higher patch.
    PatchUpgrade,
    /// Same minor, lower patch.
    PatchDowngrade,
    /// Exactly one minor up.
    MinorUpgrade,
    /// 3.6 to 3.5.
    MinorDowngrade,
}

/// A forbidden change of version, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransitionError {
    /// The major version changed.
    MajorChange { from: Version, to: Version },
    /// More than one minor up.
    SkipsMinor { from: Version, to: Version },
    /// A minor downgrade other than 3.6 to 3.5.
    MinorDowngrade { from: Version, to: Version },
}

impl fmt::Display for TransitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MajorChange { from, to } => {
                write!(f, "cannot change the major version from {from} to {to}")
            }
            Self::SkipsMinor { from, to } => write!(
                f,
                "cannot upgrade from {from} to {to}: upgrades may not skip a minor version, upgrade to 3.{}.x first",
                from.minor + 1
            ),
            Self::MinorDowngrade { from, to } => write!(
                f,
                "cannot downgrade from {from} to {to}: the only supported minor downgrade is from 3.6 to 3.5"
            ),
        }
    }
}

impl std::error::Error for TransitionError {}

/// Checks a change of version on update.
pub fn check_transition(from: &Version, to: &Version) -> Result<Transition, TransitionError> {
    let err = |make: fn(Version, Version) -> TransitionError| make(from.clone(), to.clone());
    if from.major != to.major {
        return Err(err(|from, to| TransitionError::MajorChange { from, to }));
    }
    match to.minor.cmp(&from.minor) {
        std::cmp::Ordering::Equal => Ok(match to.patch.cmp(&from.patch) {
            std::cmp::Ordering::Equal => Transition::Unchanged,
            std::cmp::Ordering::Greater => Transition::PatchUpgrade,
            std::cmp::Ordering::Less => Transition::PatchDowngrade,
        }),
        std::cmp::Ordering::Greater if to.minor == from.minor + 1 => Ok(Transition::MinorUpgrade),
        std::cmp::Ordering::Greater => Err(err(|from, to| TransitionError::SkipsMinor { from, to })),
        std::cmp::Ordering::Less if from.minor == 6 && to.minor == 5 => Ok(Transition::MinorDowngrade),
        std::cmp::Ordering::Less => Err(err(|from, to| TransitionError::MinorDowngrade { from, to })),
    }
}

/// Versions with a known serious defect, and the advice given as a warning.
pub fn known_issue(version: &Version) -> Option<&'static str> {
    if version.major == 3 && version.minor == 5 && version.patch <= 2 {
        return Some(
            "etcd 3.5.0 to 3.5.2 can corrupt data under load (etcd issue 13766); use 3.5.3 or later",
        );
    }
    None
}

/// Versions whose single-member cluster can lose a write it acknowledged when the member crashes
/// right after answering (etcd issue 14370: the entry was applied before it reached the WAL;
/// fixed in 3.4.21 and 3.5.5). With more members the others hold the write; a single member, such
/// as local mode's backing etcd, loses it. Seen here: etcd 3.5.1 lost one acknowledged put in 40
/// SIGKILLs under load.
pub fn single_member_durability_issue(version: &Version) -> Option<&'static str> {
    let affected = version.major == 3
        && ((version.minor == 4 && version.patch < 21) || (version.minor == 5 && version.patch < 5));
    affected.then_some(
        "a single etcd member of 3.4.0 to 3.4.20 or 3.5.0 to 3.5.4 can lose acknowledged writes when it crashes (etcd issue 14370); use 3.4.21, 3.5.5 or later",
    )
}

/// Every known defect of `version` that matters for a cluster of `members`, most serious first.
pub fn known_issues(version: &Version, members: i32) -> Vec<&'static str> {
    let mut issues: Vec<&'static str> = known_issue(version).into_iter().collect();
    if members == 1 {
        issues.extend(single_member_durability_issue(version));
    }
    issues
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        parse(s).unwrap()
    }

    #[test]
    fn parse_accepts_supported_releases() {
        for ok in ["3.4.0", "3.4.23", "3.5.1", "3.6.0", DEFAULT_ETCD_VERSION] {
            assert!(parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn parse_rejects_with_reason() {
        assert!(matches!(parse("v3.5.1"), Err(VersionError::LeadingV(_))));
        assert!(matches!(parse("3.5"), Err(VersionError::NotSemver(_))));
        assert!(matches!(parse(""), Err(VersionError::NotSemver(_))));
        assert_eq!(parse("2.3.8"), Err(VersionError::Major(2)));
        assert_eq!(parse("3.3.27"), Err(VersionError::Minor(3)));
        assert_eq!(parse("3.7.0"), Err(VersionError::Minor(7)));
        assert!(matches!(parse("3.6.0-rc.1"), Err(VersionError::PreRelease(_))));
        assert!(matches!(parse("3.5.1+git"), Err(VersionError::BuildMetadata(_))));
    }

    #[test]
    fn transitions() {
        use Transition::*;
        let ok = [
            ("3.5.1", "3.5.1", Unchanged),
            ("3.5.1", "3.5.9", PatchUpgrade),
            ("3.5.9", "3.5.1", PatchDowngrade),
            ("3.4.23", "3.5.0", MinorUpgrade),
            ("3.5.21", "3.6.4", MinorUpgrade),
            ("3.6.4", "3.5.21", MinorDowngrade),
        ];
        for (from, to, want) in ok {
            assert_eq!(check_transition(&v(from), &v(to)), Ok(want), "{from} -> {to}");
        }
        assert!(matches!(
            check_transition(&v("3.4.1"), &v("3.6.0")),
            Err(TransitionError::SkipsMinor { .. })
        ));
        assert!(matches!(
            check_transition(&v("3.5.1"), &v("3.4.23")),
            Err(TransitionError::MinorDowngrade { .. })
        ));
        assert!(matches!(
            check_transition(&Version::new(4, 0, 0), &v("3.5.1")),
            Err(TransitionError::MajorChange { .. })
        ));
        let message = check_transition(&v("3.4.1"), &v("3.6.0"))
            .unwrap_err()
            .to_string();
        assert!(message.contains("upgrade to 3.5.x first"), "{message}");
    }

    #[test]
    fn known_issues_by_version() {
        assert!(known_issue(&v("3.5.0")).is_some());
        assert!(known_issue(&v("3.5.3")).is_none());
        assert!(known_issue(&v("3.4.23")).is_none());
    }

    #[test]
    fn single_member_durability_by_version() {
        for affected in ["3.4.0", "3.4.20", "3.5.0", "3.5.1", "3.5.4"] {
            let issue = single_member_durability_issue(&v(affected));
            assert!(issue.is_some_and(|i| i.contains("14370")), "{affected}");
        }
        for fixed in ["3.4.21", "3.4.23", "3.5.5", "3.5.34", "3.6.0", "3.6.15"] {
            assert_eq!(single_member_durability_issue(&v(fixed)), None, "{fixed}");
        }
    }

    #[test]
    fn known_issues_depend_on_the_member_count() {
        assert_eq!(known_issues(&v("3.5.1"), 3).len(), 1, "corruption only");
        assert_eq!(known_issues(&v("3.5.1"), 1).len(), 2, "corruption and durability");
        assert_eq!(known_issues(&v("3.5.4"), 3), Vec::<&str>::new());
        assert_eq!(known_issues(&v("3.5.4"), 1).len(), 1);
        assert_eq!(known_issues(&v("3.5.34"), 1), Vec::<&str>::new());
    }
}
