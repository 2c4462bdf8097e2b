//! Parses a request path and method into the Kubernetes request attributes (verb, group, version,
//! namespace, resource, subresource, name), as k8s.io/apiserver's `RequestInfoFactory` does.

use http::Method;

/// What a request addresses and which verb it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// Whether the path is a resource path (`/apis/<g>/<v>/...` below the version).
    pub is_resource_request: bool,
    /// The request path.
    pub path: String,
    /// The Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection
    /// (resource requests) or the lower-case HTTP method (other paths).
    pub verb: String,
    /// API group (resource requests).
    pub group: String,
    /// API version (resource requests).
    pub version: String,
    /// Namespace, when the path names one.
    pub namespace: Option<String>,
    /// Resource, e.g. `etcdclusters`.
    pub resource: String,
    /// Subresource, e.g. `status` or `scale`.
    pub subresource: Option<String>,
    /// Object name, when the path names one (or a list/watch selects exactly one by
    /// `fieldSelector=metadata.name=<name>`).
    pub name: Option<String>,
}

impl RequestInfo {
    /// Derives the attributes from the method, path and query string.
    pub fn parse(method: &Method, path: &str, query: Option<&str>) -> Self {
        let non_resource = |path: &str| RequestInfo {
            is_resource_request: false,
            path: path.to_string(),
            verb: method.as_str().to_ascii_lowercase(),
            group: String::new(),
            version: String::new(),
            namespace: None,
            resource: String::new(),
            subresource: None,
            name: None,
        };
        let parts: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|p| !p.is_empty())
            .collect();
        // /apis/<group>/<version>/<rest...>, or /api/<version>/<rest...> for the core group.
        let (group, version, mut rest) = match parts.first() {
            Some(&"apis") if parts.len() >= 4 => (parts[1], parts[2], &parts[3..]),
            Some(&"api") if parts.len() >= 3 => ("", parts[1], &parts[2..]),
            _ => return non_resource(path),
        };
        let mut watch_prefix = false;
        if rest.first() == Some(&"watch") {
            watch_prefix = true;
            rest = &rest[1..];
        }
        let mut namespace = None;
        // `namespaces/<ns>/<resource>...`; `namespaces` alone or `namespaces/<ns>` is the
        // namespaces resource itself.
        if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
            namespace = Some(rest[1].to_string());
            rest = &rest[2..];
        }
        let resource = rest.first().map(|s| s.to_string()).unwrap_or_default();
        let mut name = rest.get(1).map(|s| s.to_string());
        let subresource = rest.get(2).map(|s| s.to_string());

        let watch_param = query_value(query, "watch").is_some_and(|v| v == "true" || v == "1");
        let verb = match *method {
            Method::GET | Method::HEAD if watch_prefix || (name.is_none() && watch_param) => "watch",
            Method::GET | Method::HEAD if name.is_none() => "list",
            Method::GET | Method::HEAD => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if name.is_none() => "deletecollection",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_string();
        let verb = if verb.is_empty() {
            method.as_str().to_ascii_lowercase()
        } else {
            verb
        };
        // A list or watch of exactly one name by field selector is authorized as that name.
        if name.is_none()
            && (verb == "list" || verb == "watch")
            && let Some(selector) = query_value(query, "fieldSelector")
        {
            name = single_name_selector(&selector);
        }
        RequestInfo {
            is_resource_request: true,
            path: path.to_string(),
            verb,
            group: group.to_string(),
            version: version.to_string(),
            namespace,
            resource,
            subresource,
            name,
        }
    }
}

/// `metadata.name=<x>` (or `==`) as the only requirement of a field selector.
fn single_name_selector(selector: &str) -> Option<String> {
    let mut names = selector.split(',').filter_map(|req| {
        let req = req.trim();
        req.strip_prefix("metadata.name==")
            .or_else(|| req.strip_prefix("metadata.name="))
            .map(str::to_string)
    });
    let first = names.next()?;
    (selector.split(',').count() == 1 && !first.is_empty()).then_some(first)
}

/// The first value of a query parameter, percent-decoded.
pub fn query_value(query: Option<&str>, key: &str) -> Option<String> {
    form_pairs(query?).find(|(k, _)| k == key).map(|(_, v)| v)
}

/// All `key=value` pairs of a query string, percent-decoded (`+` is a space).
pub fn form_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k), percent_decode(v))
    })
}

/// Percent-decodes a query component. Hand-written: a dozen lines, and the URL crates decode
/// whole URLs rather than one already-split component.
fn percent_decode(input: &str) -> String {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(method: Method, uri: &str) -> RequestInfo {
        let (path, query) = uri.split_once('?').map_or((uri, None), |(p, q)| (p, Some(q)));
        RequestInfo::parse(&method, path, query)
    }

    #[test]
    fn verbs_follow_kube_apiserver() {
        let base = "/apis/etcd.operator.dev/v1alpha2";
        let cases = [
            (
                Method::GET,
                format!("{base}/namespaces/ns/etcdclusters/a"),
                "get",
                Some("a"),
                None,
            ),
            (
                Method::GET,
                format!("{base}/namespaces/ns/etcdclusters"),
                "list",
                None,
                None,
            ),
            (Method::GET, format!("{base}/etcdclusters"), "list", None, None),
            (
                Method::GET,
                format!("{base}/etcdclusters?watch=true"),
                "watch",
                None,
                None,
            ),
            (
                Method::GET,
                format!("{base}/etcdclusters?watch=1"),
                "watch",
                None,
                None,
            ),
            (
                Method::GET,
                format!("{base}/etcdclusters?watch=false"),
                "list",
                None,
                None,
            ),
            (
                Method::GET,
                format!("{base}/watch/namespaces/ns/etcdclusters"),
                "watch",
                None,
                None,
            ),
            (
                Method::POST,
                format!("{base}/namespaces/ns/etcdclusters"),
                "create",
                None,
                None,
            ),
            (
                Method::PUT,
                format!("{base}/namespaces/ns/etcdclusters/a"),
                "update",
                Some("a"),
                None,
            ),
            (
                Method::PATCH,
                format!("{base}/namespaces/ns/etcdclusters/a/scale"),
                "patch",
                Some("a"),
                Some("scale"),
            ),
            (
                Method::PUT,
                format!("{base}/namespaces/ns/etcdclusters/a/status"),
                "update",
                Some("a"),
                Some("status"),
            ),
            (
                Method::DELETE,
                format!("{base}/namespaces/ns/etcdclusters/a"),
                "delete",
                Some("a"),
                None,
            ),
            (
                Method::DELETE,
                format!("{base}/namespaces/ns/etcdclusters"),
                "deletecollection",
                None,
                None,
            ),
            (
                Method::GET,
                format!("{base}/namespaces/ns/etcdclusters/a/snapshot"),
                "get",
                Some("a"),
                Some("snapshot"),
            ),
            (
                Method::GET,
                format!("{base}/namespaces/ns/etcdclusters?fieldSelector=metadata.name%3Da&watch=1"),
                "watch",
                Some("a"),
                None,
            ),
        ];
        for (method, uri, verb, name, sub) in cases {
            let info = parse(method, &uri);
            assert!(info.is_resource_request, "{uri}");
            assert_eq!(info.verb, verb, "{uri}");
            assert_eq!(info.name.as_deref(), name, "{uri}");
            assert_eq!(info.subresource.as_deref(), sub, "{uri}");
            assert_eq!(info.resource, "etcdclusters", "{uri}");
            assert_eq!(info.group, "etcd.operator.dev");
            assert_eq!(info.version, "v1alpha2");
        }
        assert_eq!(
            parse(Method::GET, &format!("{base}/namespaces/ns/etcdclusters"))
                .namespace
                .as_deref(),
            Some("ns")
        );
        assert_eq!(
            parse(Method::GET, &format!("{base}/etcdclusters")).namespace,
            None
        );
    }

    #[test]
    fn core_group_paths_are_resource_requests_of_the_empty_group() {
        let info = parse(
            Method::GET,
            "/api/v1/namespaces/ns/events?fieldSelector=involvedObject.name%3Da",
        );
        assert!(info.is_resource_request);
        assert_eq!((info.group.as_str(), info.version.as_str()), ("", "v1"));
        assert_eq!(info.resource, "events");
        assert_eq!(info.namespace.as_deref(), Some("ns"));
        assert_eq!(info.verb, "list");
        assert_eq!(info.name, None);
        let info = parse(Method::GET, "/api/v1/watch/events");
        assert_eq!((info.verb.as_str(), info.namespace.as_deref()), ("watch", None));
        let info = parse(Method::PATCH, "/api/v1/namespaces/ns/events/a.1");
        assert_eq!((info.verb.as_str(), info.name.as_deref()), ("patch", Some("a.1")));
        for path in ["/api", "/api/v1"] {
            assert!(!parse(Method::GET, path).is_resource_request, "{path}");
        }
    }

    #[test]
    fn non_resource_paths_use_the_method() {
        for path in [
            "/healthz",
            "/apis",
            "/apis/etcd.operator.dev",
            "/apis/etcd.operator.dev/v1alpha2",
            "/openapi/v3",
        ] {
            let info = parse(Method::GET, path);
            assert!(!info.is_resource_request, "{path}");
            assert_eq!(info.verb, "get");
        }
    }

    #[test]
    fn a_selector_on_more_than_the_name_does_not_name_the_object() {
        let info = parse(
            Method::GET,
            "/apis/g/v/namespaces/ns/etcdclusters?fieldSelector=metadata.name%3Da%2Cmetadata.namespace%3Dns",
        );
        assert_eq!(info.name, None);
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%3Db%2Cc+d"), "a=b,c d");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%4"), "%4");
    }
}
