//! Format checks of Kubernetes names, label keys and values, durations, URLs and image
//! repositories. Each returns the list of problems (empty when valid), like apimachinery's
//! `IsDNS1123Label` and friends.

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// Maximum length of a DNS-1123 subdomain.
pub const DNS1123_SUBDOMAIN_MAX_LEN: usize = 253;
/// Maximum total size of all annotations of an object.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

fn dns_label_chars_ok(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.iter().all(|&b| is_lower_alnum(b) || b == b'-')
        && bytes.first().is_some_and(|&b| is_lower_alnum(b))
        && bytes.last().is_some_and(|&b| is_lower_alnum(b))
}

/// `IsDNS1123Label`.
pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > crate::naming::DNS_LABEL_MAX_LEN {
        out.push(format!(
            "must be no more than {} characters",
            crate::naming::DNS_LABEL_MAX_LEN
        ));
    }
    if !dns_label_chars_ok(s) {
        out.push(format!("{DNS1123_LABEL_MSG} (e.g. 'my-name',  or '123-abc')"));
    }
    out
}

/// `IsDNS1035Label`, with a custom maximum length.
pub fn dns1035_label(s: &str, max_len: usize) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > max_len {
        out.push(format!("must be no more than {max_len} characters"));
    }
    if !dns_label_chars_ok(s) || !s.as_bytes().first().is_some_and(u8::is_ascii_lowercase) {
        out.push(format!("{DNS1035_LABEL_MSG} (e.g. 'my-name',  or 'abc-123')"));
    }
    out
}

/// `IsDNS1123Subdomain`.
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX_LEN {
        out.push(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX_LEN} characters"
        ));
    }
    if s.is_empty() || !s.split('.').all(dns_label_chars_ok) {
        out.push(format!("{DNS1123_SUBDOMAIN_MSG} (e.g. 'example.com')"));
    }
    out
}

fn qualified_name_part_ok(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// `IsQualifiedName`: label and annotation keys, `[prefix/]name`.
pub fn qualified_name(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            out.push("prefix part must be non-empty".to_owned());
        } else {
            out.extend(
                dns1123_subdomain(prefix)
                    .into_iter()
                    .map(|m| format!("prefix part {m}")),
            );
        }
    }
    if name.is_empty() {
        out.push("name part must be non-empty".to_owned());
    } else {
        if name.len() > 63 {
            out.push("name part must be no more than 63 characters".to_owned());
        }
        if !qualified_name_part_ok(name) {
            out.push(format!(
                "{QUALIFIED_NAME_MSG} (e.g. 'MyName',  or 'my.name',  or '123-abc')"
            ));
        }
    }
    out
}

/// `IsValidLabelValue`.
pub fn label_value(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_owned());
    }
    if !s.is_empty() && !qualified_name_part_ok(s) {
        out.push(format!(
            "{LABEL_VALUE_MSG} (e.g. 'MyValue',  or 'my_value',  or '12345')"
        ));
    }
    out
}

/// A text that is not a duration [`duration_seconds`] reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("must be a duration such as 72h, 90m or 1h30m; got {text:?}")]
pub struct DurationError {
    /// The text.
    pub text: String,
}

/// Parses a Go-style duration (`90m`, `1h30m`, `72h`, `10s`) into seconds. Units: `s`, `m`,
/// `h` (fractions allowed, e.g. `1.5h`).
pub fn duration_seconds(s: &str) -> Result<f64, DurationError> {
    let err = || DurationError { text: s.to_owned() };
    if s.is_empty() {
        return Err(err());
    }
    let mut total = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(unit_len);
        let value: f64 = number.parse().map_err(|_| err())?;
        let scale = match unit {
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += value * scale;
        rest = tail;
    }
    Ok(total)
}

/// An S3 bucket name: 3 to 63 lowercase letters, digits, dots and hyphens, starting and ending
/// with a letter or digit, no `..`.
pub fn s3_bucket(s: &str) -> Vec<String> {
    let bytes = s.as_bytes();
    let ok = (3..=63).contains(&bytes.len())
        && bytes.iter().all(|&b| is_lower_alnum(b) || b == b'.' || b == b'-')
        && bytes.first().is_some_and(|&b| is_lower_alnum(b))
        && bytes.last().is_some_and(|&b| is_lower_alnum(b))
        && !s.contains("..");
    if ok {
        Vec::new()
    } else {
        vec![
            "a bucket name must be 3 to 63 lowercase letters, digits, '.' or '-', and start and end with a letter or digit"
                .to_owned(),
        ]
    }
}

/// A URL with one of the given schemes and a host.
pub fn url_with_scheme(s: &str, schemes: &[&str]) -> Vec<String> {
    match url::Url::parse(s) {
        Err(e) => vec![format!("must be a URL: {e}")],
        Ok(url) if !schemes.contains(&url.scheme()) => {
            vec![format!("scheme must be one of {}", schemes.join(", "))]
        }
        Ok(url) if url.host_str().is_none_or(str::is_empty) => vec!["must name a host".to_owned()],
        Ok(_) => Vec::new(),
    }
}

/// A container image repository without tag or digest, e.g. `gcr.io/etcd-development/etcd` or
/// `registry.local:5000/etcd`.
pub fn image_repository(s: &str) -> Vec<String> {
    if s.contains('@') {
        return vec!["must not contain a digest: the image is chosen by spec.version".to_owned()];
    }
    let last = s.rsplit('/').next().unwrap_or(s);
    if last.contains(':') {
        return vec!["must not contain a tag: the tag is v<spec.version>".to_owned()];
    }
    let (host, path) = match s.split_once('/') {
        Some((host, path)) if host.contains(['.', ':']) || host == "localhost" => (Some(host), path),
        _ => (None, s),
    };
    let host_ok = host.is_none_or(|h| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'))
    });
    let component_ok = |c: &str| {
        let bytes = c.as_bytes();
        !bytes.is_empty()
            && bytes
                .iter()
                .all(|&b| is_lower_alnum(b) || matches!(b, b'.' | b'_' | b'-'))
            && bytes.first().is_some_and(|&b| is_lower_alnum(b))
            && bytes.last().is_some_and(|&b| is_lower_alnum(b))
    };
    if s.len() > 255 || !host_ok || !path.split('/').all(component_ok) {
        return vec![
            "must be an image repository such as gcr.io/etcd-development/etcd (lowercase path components separated by '/')"
                .to_owned(),
        ];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(dns1123_label("a-1").is_empty());
        assert!(!dns1123_label("A").is_empty());
        assert!(!dns1123_label("-a").is_empty());
        assert!(dns1035_label("abc", 52).is_empty());
        assert!(!dns1035_label("1abc", 52).is_empty());
        assert!(!dns1035_label(&"a".repeat(53), 52).is_empty());
        assert!(dns1123_subdomain("a.b-c.d").is_empty());
        assert!(!dns1123_subdomain("a..b").is_empty());
        assert!(!dns1123_subdomain("").is_empty());
    }

    #[test]
    fn labels() {
        assert!(qualified_name("app").is_empty());
        assert!(qualified_name("example.com/App_1").is_empty());
        assert!(!qualified_name("/app").is_empty());
        assert!(!qualified_name("a/b/c").is_empty());
        assert!(!qualified_name("Example.com/app").is_empty());
        assert!(!qualified_name("-app").is_empty());
        assert!(label_value("").is_empty());
        assert!(label_value("v1.2_3").is_empty());
        assert!(!label_value("a b").is_empty());
        assert!(!label_value(&"a".repeat(64)).is_empty());
    }

    #[test]
    fn durations() {
        assert_eq!(duration_seconds("72h"), Ok(259_200.0));
        assert_eq!(duration_seconds("1h30m"), Ok(5400.0));
        assert_eq!(duration_seconds("1.5h"), Ok(5400.0));
        for bad in ["", "72", "h", "3d", "1h 30m", "-1h"] {
            assert!(duration_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_buckets_images() {
        assert!(url_with_scheme("https://minio.local:9000", &["http", "https"]).is_empty());
        assert!(!url_with_scheme("ftp://x", &["http", "https"]).is_empty());
        assert!(!url_with_scheme("minio.local", &["http", "https"]).is_empty());
        assert!(s3_bucket("my-backups.eu").is_empty());
        assert!(!s3_bucket("My_Bucket").is_empty());
        assert!(!s3_bucket("ab").is_empty());
        assert!(image_repository("gcr.io/etcd-development/etcd").is_empty());
        assert!(image_repository("localhost:5000/etcd").is_empty());
        assert!(image_repository("etcd").is_empty());
        assert!(!image_repository("quay.io/coreos/etcd:v3.5.1").is_empty());
        assert!(!image_repository("quay.io/coreos/etcd@sha256:abc").is_empty());
        assert!(!image_repository("Quay.io/CoreOS/etcd").is_empty());
        assert!(!image_repository("").is_empty());
    }
}
