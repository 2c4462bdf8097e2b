//! The `ETCDCTL_*` environment `kubectl etcd endpoints` prints, as shell `export` lines, and where
//! a cluster's client certificate files are found. Pure, except for looking whether files exist,
//! which the caller does and passes in.

use std::path::{Path, PathBuf};

/// The client credentials for a cluster whose client plane uses TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFiles {
    /// Every CA the client plane trusts now (`--cacert`).
    pub ca: PathBuf,
    /// A client certificate of the cluster's client CA (`--cert`).
    pub cert: PathBuf,
    /// Its key (`--key`).
    pub key: PathBuf,
}

impl ClientFiles {
    /// The files `etcd-operator local` keeps in a cluster's PKI directory (docs/tls.md): the
    /// trust bundle, and the operator's own client certificate and key.
    pub fn in_pki_dir(dir: &Path) -> Self {
        Self {
            ca: dir.join("client-trust.crt"),
            cert: dir.join("operator.crt"),
            key: dir.join("operator.key"),
        }
    }

    /// Every path, to check they exist.
    pub fn paths(&self) -> [&Path; 3] {
        [&self.ca, &self.cert, &self.key]
    }
}

/// Where `etcd-operator local` keeps the PKI of cluster `namespace/name`, given the kubeconfig it
/// wrote (`<state>/kubeconfig`): `<state>/members/<namespace>/<name>/pki`.
pub fn local_pki_dir(kubeconfig: &Path, namespace: &str, name: &str) -> Option<PathBuf> {
    Some(
        kubeconfig
            .parent()?
            .join("members")
            .join(namespace)
            .join(name)
            .join("pki"),
    )
}

/// A value quoted for POSIX shells (single quotes; a single quote inside closes, escapes, opens).
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Whether any endpoint speaks TLS.
pub fn uses_tls(endpoints: &[String]) -> bool {
    endpoints.iter().any(|e| e.starts_with("https://"))
}

/// The `export` lines: the endpoints always, the client files when given.
pub fn render(endpoints: &[String], files: Option<&ClientFiles>) -> String {
    let mut vars = vec![
        ("ETCDCTL_API", "3".to_owned()),
        ("ETCDCTL_ENDPOINTS", endpoints.join(",")),
    ];
    if let Some(f) = files {
        vars.push(("ETCDCTL_CACERT", f.ca.display().to_string()));
        vars.push(("ETCDCTL_CERT", f.cert.display().to_string()));
        vars.push(("ETCDCTL_KEY", f.key.display().to_string()));
    }
    vars.iter()
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn plain_endpoints_need_no_files() {
        let eps = vec!["http://127.0.0.1:1".to_owned(), "http://127.0.0.1:2".to_owned()];
        assert!(!uses_tls(&eps));
        assert_eq!(
            render(&eps, None),
            "export ETCDCTL_API='3'\nexport ETCDCTL_ENDPOINTS='http://127.0.0.1:1,http://127.0.0.1:2'\n"
        );
    }

    #[test]
    fn tls_endpoints_come_with_the_local_pki_files() {
        let eps = vec!["https://127.0.0.1:1".to_owned()];
        assert!(uses_tls(&eps));
        let dir = local_pki_dir(Path::new("/s/.local/kubeconfig"), "default", "secure").unwrap();
        assert_eq!(dir, Path::new("/s/.local/members/default/secure/pki"));
        let files = ClientFiles::in_pki_dir(&dir);
        assert_eq!(
            render(&eps, Some(&files)),
            "export ETCDCTL_API='3'\nexport ETCDCTL_ENDPOINTS='https://127.0.0.1:1'\n\
             export ETCDCTL_CACERT='/s/.local/members/default/secure/pki/client-trust.crt'\n\
             export ETCDCTL_CERT='/s/.local/members/default/secure/pki/operator.crt'\n\
             export ETCDCTL_KEY='/s/.local/members/default/secure/pki/operator.key'\n"
        );
    }

    #[test]
    fn values_are_quoted_for_the_shell() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
