//! Label and field selectors with the grammar and meaning of apimachinery's `labels` and
//! `fields` packages. Hand-written: no Rust crate parses Kubernetes selectors on the server side.

use std::collections::BTreeMap;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
    GreaterThan(String, i64),
    LessThan(String, i64),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelRequirement>);

/// A parsed field selector over `metadata.name`, `metadata.namespace`, and the fields a
/// resource adds (Events: `involvedObject.name`, `reason`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(FieldName, bool, String)>);

/// The fields a selector may use: the set CRDs support, plus a resource's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldName {
    Name,
    Namespace,
    /// A dotted path of string fields, e.g. `involvedObject.name`.
    Path(&'static str),
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn valid_key(key: &str) -> bool {
    // prefix/name, name: [A-Za-z0-9] at the ends, -_. inside, at most 63; prefix a DNS subdomain.
    let name = key
        .rsplit_once('/')
        .map_or(key, |(prefix, name)| if prefix.is_empty() { "" } else { name });
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn valid_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// A label or field selector that does not parse (the text kube-apiserver answers with).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A key that is not a label key.
    #[error("invalid label key \"{0}\"")]
    LabelKey(String),
    /// A value that is not a label value.
    #[error("invalid label value: \"{0}\"")]
    LabelValue(String),
    /// `in`/`notin` without a parenthesised set.
    #[error("found '{0}', expected: '(' ... ')'")]
    Set(String),
    /// An empty set.
    #[error("for '{0}', set must have at least one value")]
    EmptySet(&'static str),
    /// `>`/`<` with a value that is not an integer.
    #[error("for '{0}', value must be an integer")]
    NotAnInteger(char),
    /// A field requirement without an operator.
    #[error("invalid selector: '{0}'; can't understand '{0}'")]
    Unreadable(String),
    /// A field other than `metadata.name` and `metadata.namespace`.
    #[error("field label not supported: {0}")]
    FieldNotSupported(String),
}

impl From<SelectorError> for super::error::ApiError {
    fn from(e: SelectorError) -> Self {
        Self::bad_request(e.to_string())
    }
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),!h,i>3`.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top_level(input) {
            reqs.push(Self::parse_requirement(part)?);
        }
        Ok(Self(reqs))
    }

    fn parse_requirement(part: &str) -> Result<LabelRequirement, SelectorError> {
        let key_ok = |k: &str| -> Result<String, SelectorError> {
            let k = k.trim();
            if valid_key(k) {
                Ok(k.to_string())
            } else {
                Err(SelectorError::LabelKey(k.to_owned()))
            }
        };
        let value_ok = |v: &str| -> Result<String, SelectorError> {
            let v = v.trim();
            if valid_value(v) {
                Ok(v.to_string())
            } else {
                Err(SelectorError::LabelValue(v.to_owned()))
            }
        };
        if let Some(key) = part.strip_prefix('!') {
            return Ok(LabelRequirement::DoesNotExist(key_ok(key)?));
        }
        for (op, is_in) in [(" notin ", false), (" in ", true)] {
            if let Some((key, rest)) = part.split_once(op) {
                let rest = rest.trim();
                let inner = rest
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| SelectorError::Set(rest.to_owned()))?;
                let values = inner.split(',').map(value_ok).collect::<Result<Vec<_>, _>>()?;
                if values.is_empty()
                    || values.iter().all(String::is_empty) && values.len() == 1 && inner.trim().is_empty()
                {
                    return Err(SelectorError::EmptySet(op.trim()));
                }
                let key = key_ok(key)?;
                return Ok(if is_in {
                    LabelRequirement::In(key, values)
                } else {
                    LabelRequirement::NotIn(key, values)
                });
            }
        }
        if let Some((key, value)) = part.split_once("!=") {
            return Ok(LabelRequirement::NotEquals(key_ok(key)?, value_ok(value)?));
        }
        if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
            return Ok(LabelRequirement::Equals(key_ok(key)?, value_ok(value)?));
        }
        for (op, greater) in [('>', true), ('<', false)] {
            if let Some((key, value)) = part.split_once(op) {
                let n: i64 = value
                    .trim()
                    .parse()
                    .map_err(|_| SelectorError::NotAnInteger(op))?;
                let key = key_ok(key)?;
                return Ok(if greater {
                    LabelRequirement::GreaterThan(key, n)
                } else {
                    LabelRequirement::LessThan(key, n)
                });
            }
        }
        Ok(LabelRequirement::Exists(key_ok(part)?))
    }

    /// Whether labels satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|req| match req {
            LabelRequirement::Equals(k, v) => labels.get(k) == Some(v),
            LabelRequirement::NotEquals(k, v) => labels.get(k) != Some(v),
            LabelRequirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            LabelRequirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            LabelRequirement::Exists(k) => labels.contains_key(k),
            LabelRequirement::DoesNotExist(k) => !labels.contains_key(k),
            LabelRequirement::GreaterThan(k, n) => labels
                .get(k)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l > *n),
            LabelRequirement::LessThan(k, n) => labels
                .get(k)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l < *n),
        })
    }

    /// Whether the selector is empty (matches everything).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FieldSelector {
    /// Parses `metadata.name=a,metadata.namespace!=b`; other fields are a 400 in the caller.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        Self::parse_with(input, &[])
    }

    /// [`FieldSelector::parse`], also accepting the dotted paths of `extra`.
    pub fn parse_with(input: &str, extra: &'static [&'static str]) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top_level(input) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(SelectorError::Unreadable(part.to_owned()));
            };
            let field = match field.trim() {
                "metadata.name" => FieldName::Name,
                "metadata.namespace" => FieldName::Namespace,
                other => match extra.iter().find(|f| **f == other) {
                    Some(f) => FieldName::Path(f),
                    None => return Err(SelectorError::FieldNotSupported(other.to_owned())),
                },
            };
            reqs.push((field, equal, value.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    /// Whether an object with this name and namespace satisfies every requirement (a
    /// requirement on another field sees it empty).
    pub fn matches(&self, name: &str, namespace: &str) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let actual = match field {
                FieldName::Name => name,
                FieldName::Namespace => namespace,
                FieldName::Path(_) => "",
            };
            (actual == value) == *equal
        })
    }

    /// Whether an object satisfies every requirement; a missing field is the empty string, as
    /// kube-apiserver's field sets have it.
    pub fn matches_object(&self, obj: &serde_json::Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let path = match field {
                FieldName::Name => "metadata.name",
                FieldName::Namespace => "metadata.namespace",
                FieldName::Path(p) => p,
            };
            let actual = path
                .split('.')
                .try_fold(obj, |v, key| v.get(key))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default();
            (actual == value) == *equal
        })
    }

    /// Whether the selector is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENT_FIELDS: &[&str] = &["involvedObject.name", "involvedObject.kind", "reason", "type"];

    #[test]
    fn event_field_selectors_match_the_involved_object() {
        let event = serde_json::json!({
            "metadata": {"name": "a.1", "namespace": "ns"},
            "involvedObject": {"kind": "EtcdCluster", "name": "a", "namespace": "ns"},
            "reason": "MemberReplacing", "type": "Warning",
        });
        let sel = |s: &str| FieldSelector::parse_with(s, EVENT_FIELDS).unwrap();
        assert!(sel("involvedObject.name=a,involvedObject.kind=EtcdCluster").matches_object(&event));
        assert!(sel("metadata.namespace=ns,type==Warning").matches_object(&event));
        assert!(!sel("involvedObject.name=b").matches_object(&event));
        assert!(sel("reason!=Other").matches_object(&event));
        assert!(!sel("reason!=MemberReplacing").matches_object(&event));
        // A field the event lacks is the empty string.
        let bare = serde_json::json!({"metadata": {"name": "x"}});
        assert!(sel("involvedObject.name=").matches_object(&bare));
        assert!(!sel("involvedObject.name=a").matches_object(&bare));
        // Fields other resources do not have stay refused.
        assert_eq!(
            FieldSelector::parse("involvedObject.name=a"),
            Err(SelectorError::FieldNotSupported("involvedObject.name".into()))
        );
        assert_eq!(
            FieldSelector::parse_with("source=x", EVENT_FIELDS),
            Err(SelectorError::FieldNotSupported("source".into()))
        );
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_operators() {
        let l = labels(&[
            ("app", "etcd"),
            ("tier", "db"),
            ("size", "5"),
            ("example.com/team", "a"),
        ]);
        let yes = [
            "",
            "app=etcd",
            "app==etcd",
            "app!=web",
            "missing!=x",
            "app in (etcd, web)",
            "app notin (web)",
            "missing notin (web)",
            "app",
            "!missing",
            "size>3",
            "size<6",
            "app=etcd,tier=db",
            "example.com/team=a",
        ];
        let no = [
            "app=web",
            "app!=etcd",
            "app in (web)",
            "app notin (etcd,web)",
            "missing",
            "!app",
            "size>5",
            "app=etcd,tier=web",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&l), "{s} should match");
        }
        for s in no {
            assert!(
                !LabelSelector::parse(s).unwrap().matches(&l),
                "{s} should not match"
            );
        }
    }

    #[test]
    fn bad_label_selectors_are_errors() {
        for s in ["a in b", "a>x", "-bad=1", "a=b c", "a in (b", "!!a"] {
            assert!(LabelSelector::parse(s).is_err(), "{s} should be rejected");
        }
    }

    #[test]
    fn field_selectors() {
        let s = FieldSelector::parse("metadata.name=a,metadata.namespace!=kube-system").unwrap();
        assert!(s.matches("a", "default"));
        assert!(!s.matches("b", "default"));
        assert!(!s.matches("a", "kube-system"));
        assert_eq!(
            FieldSelector::parse("spec.replicas=3").unwrap_err().to_string(),
            "field label not supported: spec.replicas"
        );
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
