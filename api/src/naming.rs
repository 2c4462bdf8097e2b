//! Names of the objects the controller derives from a cluster, the labels it puts on them, and
//! the longest cluster name for which every derived name is still valid.
//!
//! Every child whose name must be a DNS label (at most 63 characters) is listed here, so that
//! [`MAX_CLUSTER_NAME_LEN`] follows from the naming scheme instead of being a guess.

/// Label on every child object: the name of the owning cluster.
pub const CLUSTER_LABEL: &str = "etcd.operator.dev/cluster";
/// Label on member Pods and PVCs: the member name.
pub const MEMBER_LABEL: &str = "etcd.operator.dev/member";
/// Prefix of labels and annotations reserved for the operator.
pub const RESERVED_PREFIX: &str = "etcd.operator.dev/";

/// Maximum length of a DNS-1123 / DNS-1035 label.
pub const DNS_LABEL_MAX_LEN: usize = 63;
/// Length of the random suffix of a member name.
pub const MEMBER_SUFFIX_LEN: usize = 5;
/// The alphabet of member suffixes (that of Kubernetes `generateName`: no vowels, no look-alikes).
pub const MEMBER_SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

const MEMBER_SEP_LEN: usize = 1;
const CLIENT_SERVICE_SUFFIX: &str = "-client";
const MEMBER_PVC_SUFFIX: &str = "-data";
const BACKUP_CLAIM_SUFFIX: &str = "-backup";

/// The longest suffix appended to a cluster name among children whose name must be a DNS label
/// (member Pods are hostnames, PVC and Service names are also used as label values):
/// `<cluster>-<suffix>-data`, `<cluster>-client`, `<cluster>-backup`.
pub const LONGEST_CHILD_SUFFIX: usize = max(
    MEMBER_SEP_LEN + MEMBER_SUFFIX_LEN + MEMBER_PVC_SUFFIX.len(),
    max(CLIENT_SERVICE_SUFFIX.len(), BACKUP_CLAIM_SUFFIX.len()),
);

/// The longest valid cluster name: every derived name stays within [`DNS_LABEL_MAX_LEN`].
pub const MAX_CLUSTER_NAME_LEN: usize = DNS_LABEL_MAX_LEN - LONGEST_CHILD_SUFFIX;

const fn max(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

/// Headless Service of the peers (`publishNotReadyAddresses`); members resolve as
/// `<member>.<cluster>.<namespace>.svc`.
pub fn peer_service_name(cluster: &str) -> String {
    cluster.to_owned()
}

/// Service clients connect to.
pub fn client_service_name(cluster: &str) -> String {
    format!("{cluster}{CLIENT_SERVICE_SUFFIX}")
}

/// PodDisruptionBudget of the members.
pub fn pdb_name(cluster: &str) -> String {
    cluster.to_owned()
}

/// Name of a member (and of its Pod): `<cluster>-<suffix>`.
pub fn member_name(cluster: &str, suffix: &str) -> String {
    format!("{cluster}-{suffix}")
}

/// A member suffix of [`MEMBER_SUFFIX_LEN`] characters derived from `seed` (the controller
/// passes a random number, tests a fixed one).
pub fn member_suffix(seed: u64) -> String {
    let base = MEMBER_SUFFIX_ALPHABET.len() as u64;
    let mut rest = seed;
    let mut out = String::with_capacity(MEMBER_SUFFIX_LEN);
    for _ in 0..MEMBER_SUFFIX_LEN {
        let index = usize::try_from(rest % base).unwrap_or(0);
        out.push(char::from(
            MEMBER_SUFFIX_ALPHABET.get(index).copied().unwrap_or(b'b'),
        ));
        rest /= base;
    }
    out
}

/// PersistentVolumeClaim holding a member's data: `<member>-data`.
pub fn member_pvc_name(member: &str) -> String {
    format!("{member}{MEMBER_PVC_SUFFIX}")
}

/// PersistentVolumeClaim for backups of a cluster converted from v1alpha1
/// `storageType: PersistentVolume`.
pub fn backup_claim_name(cluster: &str) -> String {
    format!("{cluster}{BACKUP_CLAIM_SUFFIX}")
}

/// Secret of an operator-managed (`auto`) TLS plane, e.g. `<cluster>-peer-tls`.
pub fn auto_tls_secret_name(cluster: &str, plane: &str) -> String {
    format!("{cluster}-{plane}-tls")
}

/// Label selector of a cluster's member Pods, as `status.selector` and `/scale` report it.
pub fn selector(cluster: &str) -> String {
    format!("{CLUSTER_LABEL}={cluster}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_name_leaves_room_for_every_child() {
        assert_eq!(MAX_CLUSTER_NAME_LEN, 52);
        let cluster = "a".repeat(MAX_CLUSTER_NAME_LEN);
        let member = member_name(&cluster, &member_suffix(u64::MAX));
        for name in [
            member.clone(),
            member_pvc_name(&member),
            client_service_name(&cluster),
            peer_service_name(&cluster),
            backup_claim_name(&cluster),
            pdb_name(&cluster),
        ] {
            assert!(name.len() <= DNS_LABEL_MAX_LEN, "{name} is {} long", name.len());
        }
        assert_eq!(member_pvc_name(&member).len(), DNS_LABEL_MAX_LEN);
    }

    #[test]
    fn member_suffixes_are_stable_and_well_formed() {
        assert_eq!(member_suffix(0), "bbbbb");
        assert_ne!(member_suffix(1), member_suffix(2));
        for seed in [0, 1, 26, 27, 12345, u64::MAX] {
            let suffix = member_suffix(seed);
            assert_eq!(suffix.len(), MEMBER_SUFFIX_LEN);
            assert!(suffix.bytes().all(|b| MEMBER_SUFFIX_ALPHABET.contains(&b)));
        }
        assert_eq!(member_name("example", "x2b4c"), "example-x2b4c");
        assert_eq!(selector("example"), "etcd.operator.dev/cluster=example");
    }
}
