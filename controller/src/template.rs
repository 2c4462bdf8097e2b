//! The member template: what every member of a cluster is created from except its own identity
//! (name, addresses, start configuration). Each runtime renders the template of a placeholder
//! member and hashes it; a member records the hash it was created with, and a member whose hash
//! differs from the spec's is re-created by the template roll (see [`crate::plan`]).

use serde::Serialize;

use crate::model::{InitialState, MemberConfig};

/// The name the placeholder member is rendered under.
pub const PLACEHOLDER_MEMBER: &str = "template";

/// The start configuration the placeholder member is rendered with. Its version is fixed: a
/// version change is the version roll's business, not the template's.
pub fn placeholder_config() -> MemberConfig {
    MemberConfig {
        version: "0.0.0".to_owned(),
        initial_cluster: Vec::new(),
        initial_state: InitialState::New,
        cluster_token: String::new(),
        previous_version: None,
        restore: None,
    }
}

/// The hash of a rendered template: the first 16 hex digits of the SHA-256 of its JSON form.
/// `None` only when it cannot be serialised (then nothing is rolled).
pub fn hash_of(rendered: &impl Serialize) -> Option<String> {
    use sha2::Digest;
    let bytes = serde_json::to_vec(rendered).ok()?;
    let digest = sha2::Sha256::digest(&bytes);
    Some(hex::encode(&digest[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_stable_and_tells_renderings_apart() {
        let a = hash_of(&vec!["--quota-backend-bytes=1"]);
        assert_eq!(a, hash_of(&vec!["--quota-backend-bytes=1"]));
        assert_ne!(a, hash_of(&vec!["--quota-backend-bytes=2"]));
        assert_eq!(a.map(|h| h.len()), Some(16));
    }
}
