//! Continue tokens of paginated lists, byte-compatible with kube-apiserver's
//! (`k8s.io/apiserver/pkg/storage/continue.go`).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::error::StorageError;

const TOKEN_VERSION: &str = "meta.k8s.io/v1";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Token {
    v: String,
    rv: i64,
    start: String,
}

/// Encodes a token continuing after `last_key` (relative to the resource prefix) at `rv`.
pub(crate) fn encode_after(rv: i64, last_key: &str) -> String {
    encode_start(rv, &format!("{last_key}\u{0}"))
}

/// Encodes a token whose next page starts at `start` (relative to the resource prefix).
pub(crate) fn encode_start(rv: i64, start: &str) -> String {
    let token = Token {
        v: TOKEN_VERSION.to_owned(),
        rv,
        start: start.to_owned(),
    };
    // Serializing a struct of strings and an integer cannot fail; fall back to an empty token.
    let json = serde_json::to_vec(&token).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

/// A decoded token: the start key relative to the prefix and the list revision
/// (`-1` asks for an inconsistent continuation at the latest revision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub(crate) start: String,
    pub(crate) rv: i64,
}

/// Decodes and checks a token the way `DecodeContinue` does.
pub(crate) fn decode(value: &str) -> Result<Decoded, StorageError> {
    let invalid = |reason: String| StorageError::InvalidContinue { reason };
    let bytes = URL_SAFE_NO_PAD
        .decode(value.trim_end_matches('='))
        .map_err(|e| invalid(format!("continue key is not valid: {e}")))?;
    let token: Token =
        serde_json::from_slice(&bytes).map_err(|e| invalid(format!("continue key is not valid: {e}")))?;
    if token.v != TOKEN_VERSION {
        return Err(invalid(format!(
            "server does not recognize this encoded version {:?}",
            token.v
        )));
    }
    if token.rv == 0 {
        return Err(invalid(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
                .to_owned(),
        ));
    }
    if token.rv < -1 {
        return Err(invalid(format!(
            "continue key is not valid: negative resourceVersion {}",
            token.rv
        )));
    }
    if token.start.is_empty() {
        return Err(invalid(
            "continue key is not valid: encoded start key empty (version meta.k8s.io/v1)".to_owned(),
        ));
    }
    let key = if token.start.starts_with('/') {
        token.start.clone()
    } else {
        format!("/{}", token.start)
    };
    if clean_path(&key) != key {
        return Err(invalid(format!("continue key is not valid: {:?}", token.start)));
    }
    Ok(Decoded {
        start: key[1..].to_owned(),
        rv: token.rv,
    })
}

/// Go's `path.Clean`: the shortest equivalent path, resolving `.`, `..` and repeated slashes.
pub(crate) fn clean_path(path: &str) -> String {
    if path.is_empty() {
        return ".".to_owned();
    }
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_owned(),
        (false, false) => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_matches_kube_format() {
        let token = encode_after(42, "ns/name");
        let json = URL_SAFE_NO_PAD.decode(&token).unwrap();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"v":"meta.k8s.io/v1","rv":42,"start":"ns/name\u0000"}"#
        );
        assert_eq!(
            decode(&token).unwrap(),
            Decoded {
                start: "ns/name\u{0}".to_owned(),
                rv: 42
            }
        );
    }

    fn raw(json: &str) -> String {
        URL_SAFE_NO_PAD.encode(json)
    }

    #[test]
    fn rejects_bad_tokens() {
        for bad in [
            "!!!not base64".to_owned(),
            raw("not json"),
            raw(r#"{"v":"meta.k8s.io/v2","rv":1,"start":"a\u0000"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":0,"start":"a\u0000"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":-7,"start":"a\u0000"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":1,"start":""}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":1,"start":"../secrets/x"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":1,"start":"ns/../../x"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":1,"start":"ns//x"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":1,"start":"ns/./x"}"#),
        ] {
            assert!(
                matches!(decode(&bad), Err(StorageError::InvalidContinue { .. })),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn accepts_inconsistent_continue() {
        let t = raw(r#"{"v":"meta.k8s.io/v1","rv":-1,"start":"/ns/a\u0000"}"#);
        assert_eq!(
            decode(&t).unwrap(),
            Decoded {
                start: "ns/a\u{0}".to_owned(),
                rv: -1
            }
        );
    }

    #[test]
    fn clean_path_matches_go() {
        for (input, want) in [
            ("", "."),
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/a//b", "/a/b"),
            ("/a/./b", "/a/b"),
            ("/a/../b", "/b"),
            ("/../a", "/a"),
            ("a/../..", ".."),
            ("/a/b/", "/a/b"),
        ] {
            assert_eq!(clean_path(input), want, "{input}");
        }
    }
}
