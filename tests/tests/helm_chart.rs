//! The Helm chart `charts/etcd-operator` with the real helm 4: it lints, renders with the
//! defaults and with every value set under `charts/etcd-operator/ci/`, and what it renders is
//! checked object by object: each one parses into its `k8s-openapi` type with no field left over
//! (cert-manager objects, which k8s-openapi lacks, are checked as YAML for what cert-manager
//! reads), and the wiring holds: APIService → Service → Deployment ports, selectors match Pod
//! labels, the serving certificate covers `<service>.<namespace>.svc` and is signed by the
//! APIServices' `caBundle`, the backing etcd's certificate covers every member's URL, bindings
//! name the ServiceAccount the Pods run as. `values.schema.json` holds every value: each value set
//! passes it, and an unknown key or a wrong type fails `helm lint` and `helm template` with the
//! key named. The dashboard ConfigMap and the `PrometheusRule` of `ci/monitoring-values.yaml` are
//! checked here as objects; the metric names they use in tests/tests/monitoring_drift.rs.
//! `manifests/etcd-operator.yaml` is the default
//! rendering, committed: `UPDATE_MANIFESTS=1 cargo test -p etcd-operator-tests --test helm_chart`
//! rewrites it.
//!
//! The RBAC rules against the calls the code makes, and the container arguments against the
//! real `ServeArgs`, are checked in `operator/tests/deploy_manifests.rs`.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use etcd_operator_tests::kube::{RunError, helm, run};
use etcd_operator_tests::tools::workspace_root;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolumeClaim, PodSpec, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use x509_parser::extensions::GeneralName;
use x509_parser::pem::parse_x509_pem;

const RELEASE: &str = "etcd-operator";
const NAMESPACE: &str = "etcd-operator";
const GROUP: &str = "etcd.operator.dev";
/// What the committed manifests hold instead of generated keys and certificates.
const MASK: &str = "";

fn chart() -> PathBuf {
    workspace_root().join("charts").join("etcd-operator")
}

fn manifests_file() -> PathBuf {
    workspace_root().join("manifests").join("etcd-operator.yaml")
}

/// The value sets the chart is rendered with: the defaults and each file under `ci/`.
fn value_sets() -> Vec<(String, Option<PathBuf>)> {
    let mut sets = vec![("defaults".to_owned(), None)];
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        sets.push((
            file.file_stem().unwrap().to_string_lossy().into_owned(),
            Some(file),
        ));
    }
    sets
}

fn helm_cmd(home: &Path) -> std::process::Command {
    helm(None, home).unwrap()
}

/// `helm template` with the given release, namespace, values file and `--set`s.
fn template(release: &str, namespace: &str, values: Option<&Path>, set: &[&str]) -> Result<String, RunError> {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = helm_cmd(home.path());
    cmd.args(["template", release])
        .arg(chart())
        .args(["--namespace", namespace, "--kube-version", "1.35"]);
    if let Some(values) = values {
        cmd.arg("--values").arg(values);
    }
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = run(&mut cmd)?;
    Ok(String::from_utf8(out.stdout).unwrap())
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            let value: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
            serde_json::to_value(value).unwrap()
        })
        .filter(|v| !v.is_null())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Strict parsing: k8s-openapi's deserializers skip unknown fields, so a parsed object is
// serialized again and every field of the input must still be there with the same value.

/// The paths of `input` that `output` lost or changed.
fn lost_fields(input: &Value, output: &Value, path: &str, out: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = format!("{path}.{key}");
                match b.get(key) {
                    Some(other) => lost_fields(value, other, &here, out),
                    // `key: null` or `key: {}`/`[]` that the type leaves out is no loss.
                    None if value.is_null() => {}
                    None => out.push(format!("{here} (unknown field)")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                lost_fields(x, y, &format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} became {b}")),
    }
}

/// Parses `doc` as `K`, rejecting fields `K` does not have.
fn strict<K: DeserializeOwned + Serialize>(doc: &Value) -> Result<K, String> {
    let typed: K = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut lost = Vec::new();
    lost_fields(doc, &back, "", &mut lost);
    if lost.is_empty() {
        Ok(typed)
    } else {
        Err(lost.join(", "))
    }
}

/// Every object of one rendering, typed.
#[derive(Default)]
struct Rendered {
    service_accounts: Vec<ServiceAccount>,
    secrets: Vec<Secret>,
    services: Vec<Service>,
    deployments: Vec<Deployment>,
    stateful_sets: Vec<StatefulSet>,
    claims: Vec<PersistentVolumeClaim>,
    pdbs: Vec<PodDisruptionBudget>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    api_services: Vec<APIService>,
    /// cert-manager `Issuer`s and `Certificate`s, as YAML.
    issuers: Vec<Value>,
    certificates: Vec<Value>,
    /// prometheus-operator `ServiceMonitor`s, as YAML.
    service_monitors: Vec<Value>,
    /// ConfigMaps (the Grafana dashboards).
    config_maps: Vec<ConfigMap>,
    /// prometheus-operator `PrometheusRule`s, as YAML.
    prometheus_rules: Vec<Value>,
}

fn parse_all(yaml: &str) -> Result<Rendered, String> {
    let mut r = Rendered::default();
    let mut errors = Vec::new();
    for doc in documents(yaml) {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default().to_owned();
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let result: Result<(), String> = match (api_version.as_str(), kind.as_str()) {
            ("v1", "ServiceAccount") => strict(&doc).map(|o| r.service_accounts.push(o)),
            ("v1", "Secret") => strict(&doc).map(|o| r.secrets.push(o)),
            ("v1", "Service") => strict(&doc).map(|o| r.services.push(o)),
            ("apps/v1", "Deployment") => strict(&doc).map(|o| r.deployments.push(o)),
            ("apps/v1", "StatefulSet") => strict(&doc).map(|o| r.stateful_sets.push(o)),
            ("v1", "PersistentVolumeClaim") => strict(&doc).map(|o| r.claims.push(o)),
            ("policy/v1", "PodDisruptionBudget") => strict(&doc).map(|o| r.pdbs.push(o)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => strict(&doc).map(|o| r.cluster_roles.push(o)),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                strict(&doc).map(|o| r.cluster_role_bindings.push(o))
            }
            ("rbac.authorization.k8s.io/v1", "Role") => strict(&doc).map(|o| r.roles.push(o)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => strict(&doc).map(|o| r.role_bindings.push(o)),
            ("apiregistration.k8s.io/v1", "APIService") => strict(&doc).map(|o| r.api_services.push(o)),
            ("cert-manager.io/v1", "Issuer") => check_issuer(&doc).map(|()| r.issuers.push(doc.clone())),
            ("cert-manager.io/v1", "Certificate") => {
                check_certificate(&doc).map(|()| r.certificates.push(doc.clone()))
            }
            ("monitoring.coreos.com/v1", "ServiceMonitor") => {
                check_service_monitor(&doc).map(|()| r.service_monitors.push(doc.clone()))
            }
            ("v1", "ConfigMap") => strict(&doc).map(|o| r.config_maps.push(o)),
            ("monitoring.coreos.com/v1", "PrometheusRule") => {
                check_prometheus_rule(&doc).map(|()| r.prometheus_rules.push(doc.clone()))
            }
            _ => Err("a kind this test does not know: add it to parse_all".to_owned()),
        };
        if let Err(e) = result {
            errors.push(format!("{api_version} {kind} {name}: {e}"));
        }
    }
    if errors.is_empty() {
        Ok(r)
    } else {
        Err(errors.join("\n"))
    }
}

/// The keys of `obj` must be among `allowed`.
fn only_keys(obj: &Value, allowed: &[&str], what: &str) -> Result<(), String> {
    let map = obj.as_object().ok_or(format!("{what} is not a mapping"))?;
    let unknown: Vec<&String> = map.keys().filter(|k| !allowed.contains(&k.as_str())).collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{what} has fields cert-manager does not know: {unknown:?}"
        ))
    }
}

/// A cert-manager `Issuer` (v1): selfSigned or ca with a secretName.
fn check_issuer(doc: &Value) -> Result<(), String> {
    only_keys(doc, &["apiVersion", "kind", "metadata"], "Issuer")
        .or_else(|_| only_keys(doc, &["apiVersion", "kind", "metadata", "spec"], "Issuer"))?;
    let spec = &doc["spec"];
    only_keys(spec, &["selfSigned", "ca"], "Issuer.spec")?;
    match (spec.get("selfSigned"), spec.get("ca")) {
        (Some(s), None) if s.is_object() => Ok(()),
        (None, Some(ca)) => {
            only_keys(ca, &["secretName"], "Issuer.spec.ca")?;
            ca["secretName"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(|_| ())
                .ok_or("Issuer.spec.ca.secretName is missing".to_owned())
        }
        _ => Err("Issuer.spec must have exactly one of selfSigned, ca".to_owned()),
    }
}

/// A prometheus-operator `ServiceMonitor` (monitoring.coreos.com/v1) with the fields this chart
/// uses, each of the type the CRD gives it.
fn check_service_monitor(doc: &Value) -> Result<(), String> {
    only_keys(doc, &["apiVersion", "kind", "metadata", "spec"], "ServiceMonitor")?;
    let spec = &doc["spec"];
    only_keys(
        spec,
        &["namespaceSelector", "selector", "endpoints"],
        "ServiceMonitor.spec",
    )?;
    only_keys(
        &spec["namespaceSelector"],
        &["matchNames"],
        "ServiceMonitor.spec.namespaceSelector",
    )?;
    only_keys(
        &spec["selector"],
        &["matchLabels"],
        "ServiceMonitor.spec.selector",
    )?;
    if !spec["selector"]["matchLabels"]
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.values().all(Value::is_string))
    {
        return Err("ServiceMonitor.spec.selector.matchLabels must be a non-empty string map".into());
    }
    let endpoints = spec["endpoints"]
        .as_array()
        .filter(|e| !e.is_empty())
        .ok_or("ServiceMonitor.spec.endpoints must be a non-empty list")?;
    for e in endpoints {
        only_keys(
            e,
            &[
                "port",
                "scheme",
                "path",
                "interval",
                "scrapeTimeout",
                "bearerTokenFile",
                "honorLabels",
                "tlsConfig",
            ],
            "ServiceMonitor endpoint",
        )?;
        if !e["honorLabels"].is_null() && !e["honorLabels"].is_boolean() {
            return Err("ServiceMonitor endpoint honorLabels must be a boolean".into());
        }
        only_keys(
            &e["tlsConfig"],
            &[
                "insecureSkipVerify",
                "ca",
                "caFile",
                "serverName",
                "cert",
                "keySecret",
            ],
            "ServiceMonitor endpoint tlsConfig",
        )?;
        for key in [
            "port",
            "scheme",
            "path",
            "interval",
            "scrapeTimeout",
            "bearerTokenFile",
        ] {
            if !e[key].is_string() {
                return Err(format!("ServiceMonitor endpoint {key} must be a string"));
            }
        }
        for key in ["interval", "scrapeTimeout"] {
            let d = e[key].as_str().unwrap_or_default();
            if !d.ends_with(['h', 'm', 's']) || d.trim_end_matches(['h', 'm', 's']).parse::<u64>().is_err() {
                return Err(format!("ServiceMonitor endpoint {key} {d:?} is not a duration"));
            }
        }
    }
    Ok(())
}

/// A prometheus-operator `PrometheusRule` (monitoring.coreos.com/v1) with the fields of the CRD:
/// groups of rules, each an alert or a recording rule with a string expression, a duration
/// `for`, and string labels and annotations. (The expressions themselves are parsed, and their
/// metric names checked, in tests/tests/monitoring_drift.rs.)
fn check_prometheus_rule(doc: &Value) -> Result<(), String> {
    only_keys(doc, &["apiVersion", "kind", "metadata", "spec"], "PrometheusRule")?;
    only_keys(&doc["spec"], &["groups"], "PrometheusRule.spec")?;
    let groups = doc["spec"]["groups"]
        .as_array()
        .filter(|g| !g.is_empty())
        .ok_or("PrometheusRule.spec.groups must be a non-empty list")?;
    for group in groups {
        only_keys(group, &["name", "interval", "rules"], "PrometheusRule group")?;
        let name = group["name"]
            .as_str()
            .ok_or("a PrometheusRule group needs a name")?;
        let rules = group["rules"]
            .as_array()
            .filter(|r| !r.is_empty())
            .ok_or(format!(
                "PrometheusRule group {name}: rules must be a non-empty list"
            ))?;
        for rule in rules {
            only_keys(
                rule,
                &[
                    "alert",
                    "record",
                    "expr",
                    "for",
                    "keep_firing_for",
                    "labels",
                    "annotations",
                ],
                &format!("PrometheusRule group {name} rule"),
            )?;
            if rule["alert"].is_string() == rule["record"].is_string() {
                return Err(format!(
                    "PrometheusRule group {name}: a rule is an alert or a record: {rule}"
                ));
            }
            if !rule["expr"].is_string() {
                return Err(format!(
                    "PrometheusRule group {name}: expr must be a string: {rule}"
                ));
            }
            if let Some(d) = rule.get("for") {
                let d = d.as_str().unwrap_or_default();
                if !d.ends_with(['h', 'm', 's'])
                    || d.trim_end_matches(['h', 'm', 's']).parse::<u64>().is_err()
                {
                    return Err(format!(
                        "PrometheusRule group {name}: for {d:?} is not a duration"
                    ));
                }
            }
            for key in ["labels", "annotations"] {
                if !rule[key].is_null()
                    && !rule[key]
                        .as_object()
                        .is_some_and(|m| m.values().all(Value::is_string))
                {
                    return Err(format!(
                        "PrometheusRule group {name}: {key} must be a string map: {rule}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A cert-manager `Certificate` (v1) with the fields this chart uses.
fn check_certificate(doc: &Value) -> Result<(), String> {
    only_keys(doc, &["apiVersion", "kind", "metadata", "spec"], "Certificate")?;
    let spec = &doc["spec"];
    only_keys(
        spec,
        &[
            "secretName",
            "commonName",
            "dnsNames",
            "ipAddresses",
            "duration",
            "renewBefore",
            "usages",
            "isCA",
            "privateKey",
            "issuerRef",
        ],
        "Certificate.spec",
    )?;
    if spec["secretName"].as_str().is_none_or(str::is_empty) {
        return Err("Certificate.spec.secretName is missing".to_owned());
    }
    only_keys(
        &spec["issuerRef"],
        &["name", "kind", "group"],
        "Certificate.spec.issuerRef",
    )?;
    if spec["issuerRef"]["name"].as_str().is_none_or(str::is_empty) {
        return Err("Certificate.spec.issuerRef.name is missing".to_owned());
    }
    for usage in spec["usages"].as_array().into_iter().flatten() {
        let known = [
            "server auth",
            "client auth",
            "digital signature",
            "key encipherment",
            "cert sign",
        ];
        if !usage.as_str().is_some_and(|u| known.contains(&u)) {
            return Err(format!(
                "Certificate.spec.usages has {usage}, not a cert-manager key usage"
            ));
        }
    }
    for duration in ["duration", "renewBefore"] {
        if let Some(d) = spec.get(duration) {
            let d = d
                .as_str()
                .ok_or(format!("Certificate.spec.{duration} is not a string"))?;
            if !d.ends_with(['h', 'm', 's']) || d.trim_end_matches(['h', 'm', 's']).parse::<u64>().is_err() {
                return Err(format!("Certificate.spec.{duration} {d:?} is not a Go duration"));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Wiring

fn name_of<K: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>>(
    obj: &K,
) -> &str {
    obj.metadata().name.as_deref().unwrap_or_default()
}

fn namespace_of<K: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>>(
    obj: &K,
) -> &str {
    obj.metadata().namespace.as_deref().unwrap_or_default()
}

/// `selector` is non-empty and every pair is in `labels`.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_labels(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> BTreeMap<String, String> {
    template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

fn arg_value<'a>(container: &'a Container, flag: &str) -> Option<&'a str> {
    container
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix(&format!("{flag}=")))
}

/// The Secret (by name) mounted at the directory of `file` in `container`.
fn secret_behind(pod: &PodSpec, container: &Container, file: &str) -> String {
    let dir = Path::new(file).parent().unwrap().to_str().unwrap();
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == dir)
        .unwrap_or_else(|| panic!("nothing is mounted at {dir} for {file}"));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap_or_else(|| panic!("no volume {}", mount.name));
    volume
        .secret
        .as_ref()
        .and_then(|s| s.secret_name.clone())
        .unwrap_or_else(|| panic!("volume {} is not a Secret", mount.name))
}

/// The DNS SANs of a PEM certificate, and its issuer and subject.
struct CertInfo {
    dns: Vec<String>,
    ips: Vec<String>,
    issuer: String,
    subject: String,
    is_ca: bool,
}

fn cert_info(pem: &[u8]) -> CertInfo {
    let (_, pem) = parse_x509_pem(pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Some(san) = cert.subject_alternative_name().unwrap() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push((*d).to_owned()),
                GeneralName::IPAddress(ip) => ips.push(format!("{ip:?}")),
                _ => {}
            }
        }
    }
    CertInfo {
        dns,
        ips,
        issuer: cert.issuer().to_string(),
        subject: cert.subject().to_string(),
        is_ca: cert.is_ca(),
    }
}

/// Whether a DNS SAN (possibly `*.` wildcard) covers `host`.
fn san_covers(sans: &[String], host: &str) -> bool {
    sans.iter().any(|san| match san.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
        None => san == host,
    })
}

fn secret_data<'a>(r: &'a Rendered, name: &str, key: &str) -> Option<&'a [u8]> {
    r.secrets
        .iter()
        .find(|s| name_of(*s) == name)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(key))
        .map(|b| b.0.as_slice())
}

fn certificate_for_secret<'a>(r: &'a Rendered, secret: &str) -> Option<&'a Value> {
    r.certificates
        .iter()
        .find(|c| c.pointer("/spec/secretName").and_then(Value::as_str) == Some(secret))
}

/// The checks every rendering must pass; `Err` lists what is wrong.
fn check_wiring(r: &Rendered) -> Vec<String> {
    let mut problems = Vec::new();
    let mut fail = |p: String| problems.push(p);

    // -- the Deployment
    let [deployment] = r.deployments.as_slice() else {
        return vec![format!("expected one Deployment, found {}", r.deployments.len())];
    };
    let ns = namespace_of(deployment).to_owned();
    let dspec = deployment.spec.as_ref().unwrap();
    let labels = pod_labels(&dspec.template);
    if !selects(
        dspec.selector.match_labels.as_ref().unwrap_or(&BTreeMap::new()),
        &labels,
    ) {
        fail("the Deployment's selector does not select its Pod template".into());
    }
    let pod = dspec.template.spec.as_ref().unwrap();
    let [container] = pod.containers.as_slice() else {
        return vec!["expected one container in the Deployment".into()];
    };
    let args = container.args.clone().unwrap_or_default();
    if args.first().map(String::as_str) != Some("serve") {
        fail(format!(
            "the container does not run `etcd-operator serve`: {args:?}"
        ));
    }
    let https = container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("https"));
    let Some(https) = https else {
        return vec!["the container has no port named https".into()];
    };
    let listen = arg_value(container, "--listen").unwrap_or("0.0.0.0:8443");
    if !listen.ends_with(&format!(":{}", https.container_port)) {
        fail(format!(
            "--listen={listen} is not the https port {}",
            https.container_port
        ));
    }
    for (probe, path) in [
        (&container.readiness_probe, "/readyz"),
        (&container.liveness_probe, "/livez"),
    ] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref());
        match get {
            Some(g)
                if g.path.as_deref() == Some(path)
                    && g.scheme.as_deref() == Some("HTTPS")
                    && g.port == IntOrString::String("https".into()) => {}
            _ => fail(format!(
                "probe on {path}: expected HTTPS GET on port https, got {probe:?}"
            )),
        }
    }
    let resources = container.resources.as_ref();
    if resources
        .and_then(|r| r.requests.as_ref())
        .is_none_or(BTreeMap::is_empty)
        || resources
            .and_then(|r| r.limits.as_ref())
            .is_none_or(BTreeMap::is_empty)
    {
        fail("the container has no resource requests and limits".into());
    }
    check_restricted(pod, &mut fail, "Deployment");
    if dspec.replicas.unwrap_or(1) > 1 && !args.iter().any(|a| a == "--leader-elect") {
        fail("more than one replica without --leader-elect".into());
    }

    // -- the ServiceAccount and what is bound to it
    let sa = pod.service_account_name.clone().unwrap_or_default();
    let created_sa = r
        .service_accounts
        .iter()
        .any(|s| name_of(s) == sa && namespace_of(s) == ns);
    if !r.service_accounts.is_empty() && !created_sa {
        fail(format!(
            "the Pods run as ServiceAccount {sa}, which the chart does not create"
        ));
    }
    let subjects_ok = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(ns.as_str())
        })
    };
    // The metrics-reader ClusterRole is bound to Prometheus, not to the server (checked below).
    let metrics_reader = |name: &str| name.ends_with("-metrics-reader");
    for b in &r.cluster_role_bindings {
        if metrics_reader(&b.role_ref.name) {
            continue;
        }
        if !subjects_ok(&b.subjects) {
            fail(format!(
                "ClusterRoleBinding {} does not bind {ns}/{sa}",
                name_of(b)
            ));
        }
        let system = b.role_ref.name.starts_with("system:");
        if !system && !r.cluster_roles.iter().any(|c| name_of(c) == b.role_ref.name) {
            fail(format!(
                "ClusterRoleBinding {} refers to a missing ClusterRole",
                name_of(b)
            ));
        }
    }
    for b in &r.role_bindings {
        if !subjects_ok(&b.subjects) {
            fail(format!("RoleBinding {} does not bind {ns}/{sa}", name_of(b)));
        }
        let builtin = b.role_ref.name == "extension-apiserver-authentication-reader";
        let exists = r
            .roles
            .iter()
            .any(|role| name_of(role) == b.role_ref.name && namespace_of(role) == namespace_of(b));
        if !builtin && !exists {
            fail(format!("RoleBinding {} refers to a missing Role", name_of(b)));
        }
    }
    if !r.cluster_role_bindings.is_empty() {
        let reader = r.role_bindings.iter().any(|b| {
            namespace_of(b) == "kube-system" && b.role_ref.name == "extension-apiserver-authentication-reader"
        });
        let delegator = r
            .cluster_role_bindings
            .iter()
            .any(|b| b.role_ref.name == "system:auth-delegator");
        if !reader || !delegator {
            fail("missing the auth-delegator or extension-apiserver-authentication-reader binding".into());
        }
    }

    // -- ServiceMonitor → Service → the https container port; the metrics-reader ClusterRole
    for sm in &r.service_monitors {
        let name = sm["metadata"]["name"].as_str().unwrap_or_default();
        if sm["metadata"]["namespace"].as_str() != Some(ns.as_str())
            || sm["spec"]["namespaceSelector"]["matchNames"][0].as_str() != Some(ns.as_str())
        {
            fail(format!(
                "ServiceMonitor {name} is not in and for the release namespace"
            ));
        }
        let wanted: BTreeMap<String, String> =
            serde_json::from_value(sm["spec"]["selector"]["matchLabels"].clone()).unwrap_or_default();
        let services: Vec<&Service> = r
            .services
            .iter()
            .filter(|s| {
                namespace_of(*s) == ns
                    && selects(&wanted, s.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
            })
            .collect();
        let [service] = services.as_slice() else {
            fail(format!(
                "ServiceMonitor {name} selects {} Services, not the API server's one",
                services.len()
            ));
            continue;
        };
        let sspec = service.spec.as_ref().unwrap();
        if !selects(sspec.selector.as_ref().unwrap_or(&BTreeMap::new()), &labels) {
            fail(format!(
                "ServiceMonitor {name} selects Service {}, which does not select the Deployment's Pods",
                name_of(*service)
            ));
        }
        for e in sm["spec"]["endpoints"].as_array().into_iter().flatten() {
            let port = e["port"].as_str().unwrap_or_default();
            let target = sspec
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(port))
                .and_then(|p| p.target_port.clone());
            if target != Some(IntOrString::String("https".into())) {
                fail(format!(
                    "ServiceMonitor {name} scrapes port {port:?}, not the Service's port to https"
                ));
            }
            if e["scheme"].as_str() != Some("https") || e["path"].as_str() != Some("/metrics") {
                fail(format!("ServiceMonitor {name} does not scrape https /metrics"));
            }
            if e["bearerTokenFile"].as_str() != Some("/var/run/secrets/kubernetes.io/serviceaccount/token") {
                fail(format!(
                    "ServiceMonitor {name} does not send Prometheus's ServiceAccount token"
                ));
            }
        }
        let role = r.cluster_roles.iter().find(|c| metrics_reader(name_of(*c)));
        let grants = role.and_then(|c| c.rules.as_ref()).is_some_and(|rules| {
            rules.iter().any(|rule| {
                rule.non_resource_urls.as_deref() == Some(&["/metrics".to_owned()][..])
                    && rule.verbs == ["get"]
            })
        });
        if r.cluster_role_bindings.is_empty() {
            // rbac.create=false: nothing of the chart's RBAC
        } else if !grants {
            fail("no metrics-reader ClusterRole granting get on /metrics beside the ServiceMonitor".into());
        }
    }
    for b in r
        .cluster_role_bindings
        .iter()
        .filter(|b| metrics_reader(&b.role_ref.name))
    {
        if r.service_monitors.is_empty() || !r.cluster_roles.iter().any(|c| name_of(c) == b.role_ref.name) {
            fail(format!(
                "ClusterRoleBinding {} binds a metrics reader the chart does not render",
                name_of(b)
            ));
        }
        if !b
            .subjects
            .iter()
            .flatten()
            .all(|s| s.kind == "ServiceAccount" && s.namespace.is_some())
        {
            fail(format!(
                "ClusterRoleBinding {} binds something other than a ServiceAccount",
                name_of(b)
            ));
        }
    }

    // -- APIServices → Service → container port; caBundle → serving certificate
    let mut versions = BTreeMap::new();
    let tls_cert = arg_value(container, "--tls-cert-file")
        .unwrap_or_default()
        .to_owned();
    let serving_secret = secret_behind(pod, container, &tls_cert);
    for api in &r.api_services {
        let spec = api.spec.as_ref().unwrap();
        if spec.group.as_deref() != Some(GROUP) {
            fail(format!(
                "APIService {} is for group {:?}",
                name_of(api),
                spec.group
            ));
        }
        let version = spec.version.clone().unwrap_or_default();
        if name_of(api) != format!("{version}.{GROUP}") {
            fail(format!(
                "APIService {} is named not after {version}.{GROUP}",
                name_of(api)
            ));
        }
        versions.insert(version, spec.version_priority);
        let svc_ref = spec.service.as_ref().unwrap();
        let service = r.services.iter().find(|s| {
            Some(name_of(*s)) == svc_ref.name.as_deref()
                && Some(namespace_of(*s)) == svc_ref.namespace.as_deref()
        });
        let Some(service) = service else {
            fail(format!("APIService {} points at a missing Service", name_of(api)));
            continue;
        };
        let sspec = service.spec.as_ref().unwrap();
        if !selects(sspec.selector.as_ref().unwrap_or(&BTreeMap::new()), &labels) {
            fail(format!(
                "Service {} does not select the Deployment's Pods",
                name_of(service)
            ));
        }
        let port = sspec
            .ports
            .iter()
            .flatten()
            .find(|p| Some(p.port) == svc_ref.port);
        match port {
            Some(p) => {
                let target_ok = match &p.target_port {
                    Some(IntOrString::String(n)) => n == "https",
                    Some(IntOrString::Int(n)) => *n == https.container_port,
                    None => p.port == https.container_port,
                };
                if !target_ok {
                    fail(format!(
                        "Service port {} does not reach container port https",
                        p.port
                    ));
                }
            }
            None => fail(format!(
                "Service {} has no port {:?}",
                name_of(service),
                svc_ref.port
            )),
        }
        let host = format!("{}.{}.svc", name_of(service), namespace_of(service));
        let injected = api
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("cert-manager.io/inject-ca-from"));
        match (&spec.ca_bundle, injected) {
            (Some(ca), None) => {
                let ca = cert_info(&ca.0);
                let Some(crt) = secret_data(r, &serving_secret, "tls.crt") else {
                    fail(format!("the serving Secret {serving_secret} has no tls.crt"));
                    continue;
                };
                let leaf = cert_info(crt);
                if !ca.is_ca || leaf.issuer != ca.subject {
                    fail(format!(
                        "the serving certificate (issuer {}) is not from the caBundle ({})",
                        leaf.issuer, ca.subject
                    ));
                }
                if !san_covers(&leaf.dns, &host) {
                    fail(format!(
                        "the serving certificate's SANs {:?} do not cover {host}",
                        leaf.dns
                    ));
                }
            }
            (None, Some(from)) => {
                let Some(cert) = certificate_for_secret(r, &serving_secret) else {
                    fail(format!(
                        "no cert-manager Certificate writes Secret {serving_secret}"
                    ));
                    continue;
                };
                let cert_ref = format!(
                    "{}/{}",
                    cert["metadata"]["namespace"].as_str().unwrap_or_default(),
                    cert["metadata"]["name"].as_str().unwrap_or_default()
                );
                if from != &cert_ref {
                    fail(format!(
                        "inject-ca-from {from} is not the serving Certificate {cert_ref}"
                    ));
                }
                let dns: Vec<String> = cert["spec"]["dnsNames"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d.as_str().map(str::to_owned))
                    .collect();
                if !san_covers(&dns, &host) {
                    fail(format!(
                        "the serving Certificate's dnsNames {dns:?} do not cover {host}"
                    ));
                }
                check_issuer_chain(r, cert, &mut fail);
            }
            _ => fail(format!(
                "APIService {} needs exactly one of caBundle, inject-ca-from",
                name_of(api)
            )),
        }
        if spec.insecure_skip_tls_verify == Some(true) {
            fail(format!("APIService {} skips TLS verification", name_of(api)));
        }
    }
    match (versions.get("v1alpha1"), versions.get("v1alpha2")) {
        (Some(a1), Some(a2)) if a2 > a1 => {}
        _ => fail(format!(
            "want APIServices v1alpha1 and v1alpha2 with v1alpha2 preferred, got {versions:?}"
        )),
    }

    // -- the backing etcd
    let servers: Vec<String> = arg_value(container, "--etcd-servers")
        .unwrap_or_default()
        .split(',')
        .map(str::to_owned)
        .collect();
    if servers.iter().any(String::is_empty) {
        fail("--etcd-servers is empty".into());
    }
    for sts in &r.stateful_sets {
        check_backing_etcd(r, sts, &servers, pod, container, &mut fail);
    }
    if !r.stateful_sets.is_empty() && arg_value(container, "--etcd-certfile").is_none() {
        fail("the server has no client certificate for the backing etcd".into());
    }

    // -- PodDisruptionBudgets select a workload
    for pdb in &r.pdbs {
        let selector = pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default();
        let workloads = std::iter::once(labels.clone()).chain(
            r.stateful_sets
                .iter()
                .map(|s| pod_labels(&s.spec.as_ref().unwrap().template)),
        );
        let mut selected = 0;
        for l in workloads {
            if selects(&selector, &l) {
                selected += 1;
            }
        }
        if selected != 1 {
            fail(format!(
                "PodDisruptionBudget {} selects {selected} workloads",
                name_of(pdb)
            ));
        }
    }
    problems
}

fn check_restricted(pod: &PodSpec, fail: &mut impl FnMut(String), what: &str) {
    let psc = pod.security_context.as_ref();
    if psc.and_then(|s| s.run_as_non_root) != Some(true) {
        fail(format!("{what}: runAsNonRoot is not set"));
    }
    if psc
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str())
        != Some("RuntimeDefault")
    {
        fail(format!("{what}: seccompProfile is not RuntimeDefault"));
    }
    for c in &pod.containers {
        let sc = c.security_context.as_ref();
        if sc.and_then(|s| s.allow_privilege_escalation) != Some(false) {
            fail(format!(
                "{what}/{}: allowPrivilegeEscalation is not false",
                c.name
            ));
        }
        let dropped = sc
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.drop.clone())
            .unwrap_or_default();
        if dropped != ["ALL"] {
            fail(format!("{what}/{}: capabilities do not drop ALL", c.name));
        }
    }
}

fn check_issuer_chain(r: &Rendered, cert: &Value, fail: &mut impl FnMut(String)) {
    let issuer = cert["spec"]["issuerRef"]["name"].as_str().unwrap_or_default();
    let kind = cert["spec"]["issuerRef"]["kind"].as_str().unwrap_or("Issuer");
    if kind != "Issuer" {
        return;
    }
    let Some(found) = r.issuers.iter().find(|i| i["metadata"]["name"] == issuer) else {
        fail(format!(
            "Certificate {} refers to a missing Issuer {issuer}",
            cert["metadata"]["name"]
        ));
        return;
    };
    if let Some(secret) = found.pointer("/spec/ca/secretName").and_then(Value::as_str) {
        match certificate_for_secret(r, secret) {
            Some(ca) if ca["spec"]["isCA"] == true => check_issuer_chain(r, ca, fail),
            _ => fail(format!(
                "Issuer {issuer} uses Secret {secret}, which no CA Certificate writes"
            )),
        }
    }
}

fn check_backing_etcd(
    r: &Rendered,
    sts: &StatefulSet,
    servers: &[String],
    operator_pod: &PodSpec,
    operator: &Container,
    fail: &mut impl FnMut(String),
) {
    let name = name_of(sts);
    let ns = namespace_of(sts);
    let spec = sts.spec.as_ref().unwrap();
    let labels = pod_labels(&spec.template);
    if !selects(
        spec.selector.match_labels.as_ref().unwrap_or(&BTreeMap::new()),
        &labels,
    ) {
        fail(format!("StatefulSet {name}'s selector does not select its Pods"));
    }
    let replicas = spec.replicas.unwrap_or(1);
    if ![1, 3].contains(&replicas) {
        fail(format!("StatefulSet {name} has {replicas} members"));
    }
    let headless = r
        .services
        .iter()
        .find(|s| name_of(*s) == spec.service_name.as_deref().unwrap_or_default());
    match headless.and_then(|s| s.spec.as_ref()) {
        Some(s)
            if s.cluster_ip.as_deref() == Some("None")
                && s.publish_not_ready_addresses == Some(true)
                && selects(s.selector.as_ref().unwrap_or(&BTreeMap::new()), &labels) => {}
        _ => fail(format!(
            "StatefulSet {name} needs a headless Service selecting its Pods"
        )),
    }
    let want: Vec<String> = (0..replicas)
        .map(|i| {
            format!(
                "https://{name}-{i}.{}.{ns}.svc:2379",
                spec.service_name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    if servers != want {
        fail(format!("--etcd-servers {servers:?} are not the members {want:?}"));
    }
    if spec.volume_claim_templates.as_ref().is_none_or(Vec::is_empty) {
        fail(format!(
            "StatefulSet {name} has no PersistentVolumeClaim template"
        ));
    }
    let pod = spec.template.spec.as_ref().unwrap();
    check_restricted(pod, fail, "StatefulSet");
    let etcd = &pod.containers[0];
    let flag = |f: &str| {
        etcd.args
            .iter()
            .flatten()
            .find_map(|a| a.strip_prefix(&format!("{f}=")).map(str::to_owned))
    };
    let has = |f: &str| etcd.args.iter().flatten().any(|a| a == f);
    if !has("--client-cert-auth") || !has("--peer-client-cert-auth") {
        fail("the backing etcd does not require client certificates".into());
    }
    let initial = flag("--initial-cluster").unwrap_or_default();
    if initial.split(',').count() != usize::try_from(replicas).unwrap() {
        fail(format!(
            "--initial-cluster {initial} does not list {replicas} members"
        ));
    }
    // The server certificate the members use covers every member host, and the client
    // certificate the API server uses comes from the CA the members trust.
    let cert_file = flag("--cert-file").unwrap_or_default();
    let server_secret = secret_behind(pod, etcd, &cert_file);
    let client_secret = secret_behind(
        operator_pod,
        operator,
        arg_value(operator, "--etcd-certfile").unwrap_or("/x/none"),
    );
    match (
        secret_data(r, &server_secret, "tls.crt"),
        secret_data(r, &client_secret, "tls.crt"),
    ) {
        (Some(server), Some(client)) => {
            let server = cert_info(server);
            let client = cert_info(client);
            let ca = cert_info(secret_data(r, &server_secret, "ca.crt").unwrap());
            for url in servers {
                let host = url.trim_start_matches("https://").split(':').next().unwrap();
                if !san_covers(&server.dns, host) {
                    fail(format!(
                        "the etcd server certificate {:?} does not cover {host}",
                        server.dns
                    ));
                }
            }
            if !san_covers(&server.dns, "localhost") || server.ips.is_empty() {
                fail("the etcd server certificate does not cover localhost".into());
            }
            if server.issuer != ca.subject || client.issuer != ca.subject {
                fail("the etcd server and client certificates are not from the same CA".into());
            }
            if secret_data(r, &client_secret, "ca.crt") != secret_data(r, &server_secret, "ca.crt") {
                fail("the API server does not trust the backing etcd's CA".into());
            }
        }
        _ => {
            // cert-manager writes the Secrets: its Certificates must.
            for secret in [&server_secret, &client_secret] {
                match certificate_for_secret(r, secret) {
                    Some(cert) => check_issuer_chain(r, cert, fail),
                    None => fail(format!("nothing writes the etcd TLS Secret {secret}")),
                }
            }
            if let Some(cert) = certificate_for_secret(r, &server_secret) {
                let dns: Vec<String> = cert["spec"]["dnsNames"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d.as_str().map(str::to_owned))
                    .collect();
                for url in servers {
                    let host = url.trim_start_matches("https://").split(':').next().unwrap();
                    if !san_covers(&dns, host) {
                        fail(format!(
                            "the etcd server Certificate {dns:?} does not cover {host}"
                        ));
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn helm_lint_passes_for_every_value_set() {
    let home = tempfile::tempdir().unwrap();
    for (name, values) in value_sets() {
        let mut cmd = helm_cmd(home.path());
        cmd.args(["lint", "--strict", "--kube-version", "1.35"])
            .arg(chart());
        if let Some(values) = &values {
            cmd.arg("--values").arg(values);
        }
        if let Err(e) = run(&mut cmd) {
            panic!("helm lint with {name}: {e}");
        }
    }
}

#[test]
fn every_value_set_renders_typed_objects_that_are_wired_together() {
    let sets = value_sets();
    assert!(
        sets.len() >= 5,
        "the defaults and at least four value sets: {sets:?}"
    );
    for (name, values) in sets {
        let namespace = if name == "defaults" { NAMESPACE } else { "team-x" };
        let yaml = template("prod", namespace, values.as_deref(), &[]).unwrap();
        let rendered = parse_all(&yaml).unwrap_or_else(|e| panic!("{name}: {e}"));
        let problems = check_wiring(&rendered);
        assert!(problems.is_empty(), "{name}:\n  {}", problems.join("\n  "));
        for obj in rendered
            .secrets
            .iter()
            .map(namespace_of)
            .chain(rendered.services.iter().map(namespace_of))
        {
            assert_eq!(
                obj, namespace,
                "{name}: every namespaced object is in the release namespace"
            );
        }
    }
}

#[test]
fn value_sets_render_what_they_select() {
    let render = |file: &str| {
        let path = chart().join("ci").join(file);
        parse_all(&template("prod", "team-x", Some(&path), &[]).unwrap()).unwrap()
    };
    let defaults = parse_all(&template("prod", "team-x", None, &[]).unwrap()).unwrap();
    assert_eq!(defaults.stateful_sets.len(), 1);
    assert_eq!(defaults.stateful_sets[0].spec.as_ref().unwrap().replicas, Some(1));
    let image = defaults.deployments[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap();
    let chart_yaml: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap()).unwrap();
    let app_version = chart_yaml["appVersion"].as_str().unwrap();
    assert_eq!(
        image,
        format!("ghcr.io/etcd-operator/etcd-operator:{app_version}")
    );

    let external = render("external-etcd-values.yaml");
    assert!(
        external.stateful_sets.is_empty(),
        "no backing etcd with an external one"
    );
    assert!(!external.secrets.iter().any(|s| name_of(s).ends_with("-tls")));
    let container = &external.deployments[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    assert_eq!(
        arg_value(container, "--etcd-servers"),
        Some(
            "https://etcd-a.storage.svc:2379,https://etcd-b.storage.svc:2379,https://etcd-c.storage.svc:2379"
        )
    );

    // Pre-upgrade snapshots: `--snapshot-dir` is where a volume is mounted; by default an
    // emptyDir, with persistence the chart's own claim (kept on uninstall).
    let snapshot_volume = |r: &Rendered| {
        let pod = r.deployments[0]
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .clone()
            .unwrap();
        let container = &pod.containers[0];
        let dir = arg_value(container, "--snapshot-dir")
            .expect("--snapshot-dir")
            .to_owned();
        let mount = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == dir)
            .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
        assert_ne!(mount.read_only, Some(true));
        pod.volumes
            .into_iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .expect("the mounted volume")
    };
    let default_volume = snapshot_volume(&defaults);
    assert!(default_volume.empty_dir.is_some(), "{default_volume:?}");
    assert!(defaults.claims.is_empty());
    let kept = render("snapshots-values.yaml");
    let volume = snapshot_volume(&kept);
    let claim_name = volume.persistent_volume_claim.expect("a claim").claim_name;
    assert_eq!(kept.claims.len(), 1);
    let claim = &kept.claims[0];
    assert_eq!(name_of(claim), claim_name);
    let spec = claim.spec.as_ref().unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("shared-nfs"));
    assert_eq!(
        spec.access_modes.as_deref(),
        Some(&["ReadWriteMany".to_owned()][..])
    );
    assert_eq!(
        claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helm.sh/resource-policy"))
            .map(String::as_str),
        Some("keep")
    );

    let ha = render("ha-etcd-values.yaml");
    assert_eq!(ha.stateful_sets[0].spec.as_ref().unwrap().replicas, Some(3));
    // A backup claim is mounted where the controller looks for `volume.claimName` destinations.
    let pod = ha.deployments[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let mount = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path.ends_with("/etcd-backups"))
        .expect("the backup claim is mounted");
    assert_eq!(
        Path::new(&mount.mount_path),
        Path::new(etcd_operator_controller::backup_store::CLAIM_MOUNT_ROOT).join("etcd-backups")
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(
        volume
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.as_str()),
        Some("etcd-backups")
    );
    assert_eq!(
        ha.pdbs.len(),
        2,
        "a PDB for the API server and one for the 3 etcd members"
    );

    let cm = render("cert-manager-values.yaml");
    assert!(cm.secrets.is_empty(), "cert-manager writes the Secrets");
    assert_eq!(cm.certificates.len(), 4, "CA, serving, etcd server, etcd client");
    assert!(
        cm.api_services
            .iter()
            .all(|a| a.spec.as_ref().unwrap().ca_bundle.is_none())
    );

    let custom = render("custom-names-values.yaml");
    assert!(custom.service_accounts.is_empty());
    assert_eq!(name_of(&custom.deployments[0]), "etcd-api");
    assert!(
        custom
            .issuers
            .iter()
            .all(|i| i["spec"].get("selfSigned").is_none())
    );
    assert!(custom.roles.is_empty(), "no lease Role without leader election");

    // One Lease by name without sharding; with it, the shard and presence Leases (named after
    // the Pods) need list and rules without names.
    let lease_rules = |r: &Rendered| {
        let [role] = r.roles.as_slice() else {
            panic!("expected one Role, found {}", r.roles.len());
        };
        role.rules.clone().unwrap_or_default()
    };
    let leader_args = |r: &Rendered| {
        r.deployments[0]
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap_or_default()
    };
    let single = lease_rules(&defaults);
    assert!(single.iter().all(|rule| !rule.verbs.contains(&"list".to_owned())));
    assert!(leader_args(&defaults).contains(&"--shards=1".to_owned()));
    let sharded = render("sharded-values.yaml");
    let rules = lease_rules(&sharded);
    assert!(
        rules.iter().any(|rule| rule.resource_names.is_none()
            && ["get", "list", "update", "delete"]
                .iter()
                .all(|v| rule.verbs.contains(&(*v).to_owned()))),
        "{rules:?}"
    );
    let args = leader_args(&sharded);
    assert!(args.contains(&"--shards=6".to_owned()), "{args:?}");
    assert!(args.contains(&"--leader-elect-lease-name=etcd-operator-controllers".to_owned()));

    // Dashboards and alert rules are off by default; on, the dashboard is the chart's file in a
    // ConfigMap the Grafana sidecar selects, and the rules carry the labels asked for.
    assert!(defaults.config_maps.is_empty() && defaults.prometheus_rules.is_empty());
    let monitoring = render("monitoring-values.yaml");
    let [dashboards] = monitoring.config_maps.as_slice() else {
        panic!("expected one ConfigMap");
    };
    assert_eq!(name_of(dashboards), "prod-etcd-operator-dashboards");
    assert_eq!(namespace_of(dashboards), "monitoring");
    let meta = &dashboards.metadata;
    assert_eq!(
        meta.labels
            .as_ref()
            .unwrap()
            .get("grafana_dashboard")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        meta.annotations
            .as_ref()
            .unwrap()
            .get("grafana_folder")
            .map(String::as_str),
        Some("etcd")
    );
    let file = std::fs::read_to_string(chart().join("dashboards").join("etcd-operator.json")).unwrap();
    assert_eq!(
        dashboards.data.as_ref().unwrap().get("etcd-operator.json"),
        Some(&file),
        "the ConfigMap carries the chart's dashboard file as it is"
    );
    let [rules] = monitoring.prometheus_rules.as_slice() else {
        panic!("expected one PrometheusRule");
    };
    assert_eq!(
        rules["metadata"]["labels"]["release"].as_str(),
        Some("kube-prometheus-stack")
    );
    let alert = |name: &str| {
        rules["spec"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .find(|r| r["alert"] == name)
            .unwrap_or_else(|| panic!("no alert {name}"))
            .clone()
    };
    // The thresholds come from the values.
    assert_eq!(alert("EtcdMemberDown")["for"].as_str(), Some("10m"));
    assert_eq!(
        alert("EtcdMemberDown")["labels"]["team"].as_str(),
        Some("platform")
    );
    assert!(
        alert("EtcdClusterDatabaseNearQuota")["expr"]
            .as_str()
            .unwrap()
            .ends_with("> 0.8 * 2147483648"),
        "{}",
        alert("EtcdClusterDatabaseNearQuota")
    );
    assert!(
        alert("EtcdClusterBackupTooOld")["expr"]
            .as_str()
            .unwrap()
            .ends_with("> 2 * 3600"),
        "{}",
        alert("EtcdClusterBackupTooOld")
    );
    assert!(
        alert("EtcdOperatorAPIServerErrors")["expr"]
            .as_str()
            .unwrap()
            .contains(r#"job="prod-etcd-operator""#),
        "the API alert counts the operator's job only (kube-apiserver serves the same name)"
    );

    // Prometheus scraping is off by default and, when on, bound to the Prometheus named.
    assert!(defaults.service_monitors.is_empty());
    assert!(
        !defaults
            .cluster_roles
            .iter()
            .any(|c| name_of(c).ends_with("-metrics-reader"))
    );
    let monitored = render("service-monitor-values.yaml");
    let [sm] = monitored.service_monitors.as_slice() else {
        panic!("expected one ServiceMonitor");
    };
    assert_eq!(
        sm["metadata"]["labels"]["release"].as_str(),
        Some("kube-prometheus-stack")
    );
    assert_eq!(sm["spec"]["endpoints"][0]["interval"].as_str(), Some("15s"));
    // The series' own `namespace` label (the EtcdCluster's) is kept, not renamed.
    assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"].as_bool(), Some(true));
    assert_eq!(
        sm["spec"]["endpoints"][0]["tlsConfig"]["insecureSkipVerify"].as_bool(),
        Some(true)
    );
    let binding = monitored
        .cluster_role_bindings
        .iter()
        .find(|b| b.role_ref.name == "prod-etcd-operator-metrics-reader")
        .expect("the metrics reader is bound");
    let subjects: Vec<(String, String, Option<String>)> = binding
        .subjects
        .iter()
        .flatten()
        .map(|s| (s.kind.clone(), s.name.clone(), s.namespace.clone()))
        .collect();
    assert_eq!(
        subjects,
        [(
            "ServiceAccount".to_owned(),
            "kube-prometheus-stack-prometheus".to_owned(),
            Some("monitoring".to_owned())
        )]
    );
}

#[test]
fn watch_namespaces_render_roles_there_and_no_cluster_wide_write_to_member_objects() {
    let member_resources = [
        "pods",
        "persistentvolumeclaims",
        "services",
        "poddisruptionbudgets",
        "secrets",
        "certificates",
    ];
    let writes = ["create", "patch", "update", "delete", "deletecollection", "*"];
    let writes_members = |rules: &Option<Vec<k8s_openapi::api::rbac::v1::PolicyRule>>| {
        rules.iter().flatten().any(|r| {
            r.resources
                .iter()
                .flatten()
                .any(|res| member_resources.contains(&res.as_str()) || res == "*")
                && r.verbs.iter().any(|v| writes.contains(&v.as_str()))
        })
    };
    // Defaults: the ClusterRole holds the member rules, no Role outside the release namespace.
    let defaults = parse_all(&template("prod", "ops", None, &[]).unwrap()).unwrap();
    assert!(defaults.cluster_roles.iter().any(|c| writes_members(&c.rules)));

    let scoped =
        parse_all(&template("prod", "ops", None, &["watchNamespaces={team-a,team-b}"]).unwrap()).unwrap();
    for role in &scoped.cluster_roles {
        assert!(
            !writes_members(&role.rules),
            "ClusterRole {} writes member objects: {:#?}",
            name_of(role),
            role.rules
        );
    }
    for namespace in ["team-a", "team-b"] {
        let role = scoped
            .roles
            .iter()
            .find(|r| namespace_of(*r) == namespace)
            .unwrap_or_else(|| panic!("no Role in {namespace}"));
        assert!(writes_members(&role.rules), "{:#?}", role.rules);
        assert!(
            scoped
                .role_bindings
                .iter()
                .any(|b| namespace_of(b) == namespace && b.role_ref.name == name_of(role)),
            "no RoleBinding in {namespace}"
        );
    }
    // What the aggregation layer and Events need stays cluster-wide.
    let cluster_rules: Vec<String> = scoped
        .cluster_roles
        .iter()
        .flat_map(|c| c.rules.iter().flatten())
        .flat_map(|r| r.resources.iter().flatten().cloned())
        .collect();
    for needed in ["namespaces", "storageclasses", "events"] {
        assert!(
            cluster_rules.iter().any(|r| r == needed),
            "{needed}: {cluster_rules:?}"
        );
    }
    let container = &scoped.deployments[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    assert_eq!(arg_value(container, "--watch-namespaces"), Some("team-a,team-b"));
    assert_eq!(
        arg_value(
            &defaults.deployments[0]
                .spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0],
            "--watch-namespaces"
        ),
        None
    );
}

/// `helm lint --strict` and `helm template` of the chart with `args`: the failure text of each
/// (stdout and stderr), `None` where it passed.
fn lint_and_template(args: &[&str]) -> [Option<String>; 2] {
    let home = tempfile::tempdir().unwrap();
    let mut lint = helm_cmd(home.path());
    lint.args(["lint", "--strict", "--kube-version", "1.35"])
        .arg(chart())
        .args(args);
    let mut template = helm_cmd(home.path());
    template
        .args(["template", "prod"])
        .arg(chart())
        .args(["--namespace", NAMESPACE, "--kube-version", "1.35"])
        .args(args);
    [lint, template].map(|mut cmd| match run(&mut cmd) {
        Ok(_) => None,
        Err(RunError::Failed { stdout, stderr, .. }) => Some(format!("{stdout}\n{stderr}")),
        Err(e) => panic!("{e}"),
    })
}

#[test]
fn the_values_schema_covers_every_value_and_refuses_unknown_top_level_keys() {
    let text = std::fs::read_to_string(chart().join("values.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        schema["$schema"].as_str(),
        Some("http://json-schema.org/draft-07/schema#")
    );
    assert_eq!(schema["additionalProperties"], Value::Bool(false));
    // Every value of values.yaml, at every depth, has its place in the schema: a value added
    // without one fails here with its path (and helm lint fails on the defaults).
    let values: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap()).unwrap();
    let values = serde_json::to_value(values).unwrap();
    fn walk(value: &Value, schema: &Value, path: &str, missing: &mut Vec<String>) {
        let Value::Object(map) = value else { return };
        for (key, v) in map {
            let here = format!("{path}.{key}");
            match schema["properties"].get(key) {
                Some(sub) => walk(v, sub, &here, missing),
                // A free-form map (labels, resources, affinity) takes any key.
                None if schema["additionalProperties"] != Value::Bool(false) => {}
                None => missing.push(here),
            }
        }
    }
    let mut missing = Vec::new();
    walk(&values, &schema, "", &mut missing);
    assert!(missing.is_empty(), "values without a schema: {missing:?}");
}

#[test]
fn values_of_the_wrong_type_or_unknown_keys_fail_lint_and_template_naming_the_key() {
    let typo = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(typo.path(), "replicaCount: 2\nreplicaCont: 3\n").unwrap();
    let typo_path = typo.path().to_str().unwrap().to_owned();
    let cases: [(Vec<&str>, &str); 6] = [
        (
            vec!["--set", "etcdd.replicas=3"],
            "additional properties 'etcdd' not allowed",
        ),
        (
            vec!["--values", &typo_path],
            "additional properties 'replicaCont' not allowed",
        ),
        (
            vec!["--set", "replicaCount=two"],
            "at '/replicaCount': got string, want integer",
        ),
        (
            vec!["--set", "metrics.prometheusRule.enabled=yes"],
            "at '/metrics/prometheusRule/enabled': got string, want boolean",
        ),
        (
            vec!["--set", "metrics.serviceMonitor.intervall=1m"],
            "at '/metrics/serviceMonitor': additional properties 'intervall' not allowed",
        ),
        (
            vec!["--set-json", r#"watchNamespaces="team-a""#],
            "at '/watchNamespaces': got string, want array",
        ),
    ];
    for (args, want) in &cases {
        let [lint, template] = lint_and_template(args);
        for (what, failure) in [("helm lint", lint), ("helm template", template)] {
            let failure = failure.unwrap_or_else(|| panic!("{what} {args:?} passed"));
            assert!(
                failure.contains(want),
                "{what} {args:?}: want {want:?} in\n{failure}"
            );
        }
    }
    // The same values, correct, pass both: the failures above come from the schema alone.
    for args in [
        vec!["--set", "replicaCount=3"],
        vec!["--set", "metrics.prometheusRule.enabled=true"],
        vec!["--set", "metrics.serviceMonitor.interval=1m"],
        vec!["--set-json", r#"watchNamespaces=["team-a"]"#],
    ] {
        let [lint, template] = lint_and_template(&args);
        assert_eq!((lint, template), (None, None), "{args:?}");
    }
}

#[test]
fn invalid_values_fail_to_render_with_the_reason() {
    let cases: [(&[&str], &str); 6] = [
        (&["etcd.replicas=2"], "etcd.replicas must be 1 or 3"),
        (&["etcd.mode=embedded"], "etcd.mode must be internal or external"),
        (&["etcd.mode=external"], "etcd.external.endpoints must list"),
        (
            &["replicaCount=2", "leaderElection.enabled=false"],
            "replicaCount > 1 needs leaderElection",
        ),
        (
            &["replicaCount=1", "leaderElection.enabled=false", "shards=4"],
            "shards > 1 needs leaderElection",
        ),
        (&["shards=0"], "shards must be between 1 and 1024"),
    ];
    for (set, reason) in cases {
        match template("prod", "team-x", None, set) {
            Err(RunError::Failed { stderr, .. }) => {
                assert!(stderr.contains(reason), "{set:?}: want {reason:?} in {stderr}");
            }
            other => panic!("{set:?} rendered: {:?}", other.map(|s| s.len())),
        }
    }
}

#[test]
fn the_checks_catch_unknown_fields_and_broken_wiring() {
    // An unknown field is rejected even though k8s-openapi would ignore it.
    let service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 443, "targetPorts": "https"}]}
    });
    let err = strict::<Service>(&service).unwrap_err();
    assert!(
        err.contains(".spec.ports[0].targetPorts (unknown field)"),
        "{err}"
    );

    let yaml = template("prod", NAMESPACE, None, &[]).unwrap();
    // A Service that no longer selects the Pods, and a port that misses the APIService's.
    let broken = yaml.replace("      port: 443\n", "      port: 8443\n").replace(
        "    app.kubernetes.io/component: apiserver\n  ports:",
        "    app.kubernetes.io/component: other\n  ports:",
    );
    assert_ne!(broken, yaml);
    let problems = check_wiring(&parse_all(&broken).unwrap()).join("\n");
    assert!(
        problems.contains("does not select the Deployment's Pods"),
        "{problems}"
    );
    assert!(problems.contains("has no port Some(443)"), "{problems}");

    // A ServiceMonitor on a port that does not lead to https, without its reader role.
    let values = chart().join("ci").join("service-monitor-values.yaml");
    let monitored = template("prod", NAMESPACE, Some(&values), &[]).unwrap();
    assert_eq!(
        check_wiring(&parse_all(&monitored).unwrap()),
        Vec::<String>::new()
    );
    let broken = monitored
        .replace(
            "    - port: https
      scheme: https",
            "    - port: metrics
      scheme: https",
        )
        .replace(
            "  - nonResourceURLs: [\"/metrics\"]",
            "  - nonResourceURLs: [\"/debug\"]",
        );
    assert_ne!(broken, monitored);
    let problems = check_wiring(&parse_all(&broken).unwrap()).join("\n");
    assert!(problems.contains("scrapes port \"metrics\""), "{problems}");
    assert!(problems.contains("no metrics-reader ClusterRole"), "{problems}");
    let unknown = monitored.replace("      scrapeTimeout:", "      scrapeTimeoutt:");
    assert!(
        parse_all(&unknown)
            .err()
            .unwrap_or_default()
            .contains("scrapeTimeoutt")
    );

    // A serving certificate for another name.
    let other = template("other", NAMESPACE, None, &[]).unwrap();
    let other = parse_all(&other).unwrap();
    let mut r = parse_all(&yaml).unwrap();
    let foreign = other
        .secrets
        .iter()
        .find(|s| name_of(*s) == "other-etcd-operator-serving-cert")
        .unwrap();
    let mine = r
        .secrets
        .iter_mut()
        .find(|s| name_of(*s) == "prod-etcd-operator-serving-cert")
        .unwrap();
    mine.data = foreign.data.clone();
    let problems = check_wiring(&r).join("\n");
    assert!(
        problems.contains("do not cover prod-etcd-operator.etcd-operator.svc"),
        "{problems}"
    );
    assert!(problems.contains("is not from the caBundle"), "{problems}");

    // A PrometheusRule with a misspelt field, a rule that is both alert and record, a bad `for`.
    let values = chart().join("ci").join("monitoring-values.yaml");
    let monitoring = template("prod", NAMESPACE, Some(&values), &[]).unwrap();
    parse_all(&monitoring).unwrap();
    for (from, to, want) in [
        (
            "          expr: etcd_operator_cluster_quorum == 0\n",
            "          exp: etcd_operator_cluster_quorum == 0\n",
            "exp",
        ),
        (
            "        - alert: EtcdClusterCorruptAlarm\n",
            "        - alert: EtcdClusterCorruptAlarm\n          record: x\n",
            "an alert or a record",
        ),
        (
            "          for: 2m\n",
            "          for: two minutes\n",
            "is not a duration",
        ),
    ] {
        let broken = monitoring.replacen(from, to, 1);
        assert_ne!(broken, monitoring, "{from:?}");
        let err = parse_all(&broken).err().unwrap_or_default();
        assert!(err.contains(want), "{to:?}: want {want:?} in {err:?}");
    }

    // An unknown cert-manager field.
    let mut cert = serde_json::json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "c"},
        "spec": {"secretName": "s", "issuerRef": {"name": "i"}, "dnsName": ["x"]}
    });
    assert!(check_certificate(&cert).unwrap_err().contains("dnsName"));
    cert["spec"].as_object_mut().unwrap().remove("dnsName");
    check_certificate(&cert).unwrap();
}

/// Secrets' keys and certificates and the APIServices' caBundle are generated anew by every
/// `helm template`; the committed manifests hold them empty (helm, or cert-manager, fills them).
fn mask_generated(yaml: &str) -> String {
    let mut out = String::new();
    let mut in_secret_data = false;
    let mut is_secret = false;
    for line in yaml.lines() {
        if line == "---" {
            is_secret = false;
            in_secret_data = false;
        }
        if line == "kind: Secret" {
            is_secret = true;
        }
        if is_secret && line == "data:" {
            in_secret_data = true;
        } else if in_secret_data && !line.starts_with("  ") {
            in_secret_data = false;
        }
        let masked = if in_secret_data && line.starts_with("  ") {
            let (key, _) = line.split_once(": ").unwrap();
            format!("{key}: \"{MASK}\"")
        } else if let Some((key, _)) = line.split_once("caBundle: ") {
            format!("{key}caBundle: \"{MASK}\"")
        } else {
            line.to_owned()
        };
        out.push_str(&masked);
        out.push('\n');
    }
    out
}

const MANIFEST_HEADER: &str = "\
# etcd-operator: `helm template etcd-operator charts/etcd-operator --namespace etcd-operator`
# with the default values. Generated; do not edit: regenerate with
#   UPDATE_MANIFESTS=1 cargo test -p etcd-operator-tests --test helm_chart
# The Secrets' certificates and keys and the APIServices' caBundle are left empty here: helm
# generates them at install time (see README, \"Install on Kubernetes\"). To apply this file
# without helm, fill them from a CA of your own first.
";

#[test]
fn committed_manifests_are_the_default_rendering() {
    let rendered = template(RELEASE, NAMESPACE, None, &[]).unwrap();
    let generated = format!("{MANIFEST_HEADER}{}", mask_generated(&rendered));
    let path = manifests_file();
    if std::env::var_os("UPDATE_MANIFESTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the chart; regenerate it with: \
         UPDATE_MANIFESTS=1 cargo test -p etcd-operator-tests --test helm_chart",
        path.display()
    );
    // Masking leaves nothing generated: two renderings mask to the same text, and the
    // masked manifests still parse strictly.
    let again = template(RELEASE, NAMESPACE, None, &[]).unwrap();
    assert_ne!(again, rendered, "helm generates new certificates each time");
    assert_eq!(mask_generated(&again), mask_generated(&rendered));
    parse_all(&committed).unwrap();
}

/// No Docker here: the root `Dockerfile` is checked against the chart and the workspace it
/// builds (binary name, user, Rust version), not built.
#[test]
fn dockerfile_agrees_with_the_chart_and_the_workspace() {
    let root = workspace_root();
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let stages: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(stages.len(), 2, "a build stage and a runtime stage: {stages:?}");

    // The build stage's Rust is at least the workspace's rust-version.
    let workspace: toml_like::Table =
        toml_like::parse(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap());
    let rust_version = workspace.get("rust-version").unwrap();
    let image_version = stages[0]
        .strip_prefix("FROM rust:")
        .and_then(|s| s.split('-').next())
        .unwrap();
    let parse = |v: &str| -> Vec<u32> { v.split('.').map(|n| n.parse().unwrap()).collect() };
    assert!(
        parse(image_version) >= parse(rust_version),
        "rust:{image_version} < {rust_version}"
    );

    // It builds the binary the chart runs, and runs it as the chart's user.
    let operator = std::fs::read_to_string(root.join("operator/Cargo.toml")).unwrap();
    assert!(
        operator.contains("[[bin]]\nname = \"etcd-operator\""),
        "the binary is etcd-operator, in operator/"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("RUN cargo build") && l.contains("-p etcd-operator --bin etcd-operator")),
        "the build stage builds etcd-operator"
    );
    assert!(lines.contains(&"ENTRYPOINT [\"/usr/local/bin/etcd-operator\"]"));
    let defaults = parse_all(&template(RELEASE, NAMESPACE, None, &[]).unwrap()).unwrap();
    let pod = defaults.deployments[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let uid = pod.security_context.as_ref().and_then(|s| s.run_as_user).unwrap();
    let gid = pod
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_group)
        .unwrap();
    assert!(
        lines.contains(&format!("USER {uid}:{gid}").as_str()),
        "USER {uid}:{gid}"
    );
    // The chart's default image is the one this file documents.
    let image = pod.containers[0].image.clone().unwrap();
    assert!(
        dockerfile.contains(&format!("docker build -t {image} .")),
        "{image}"
    );
}

/// Reads `key = "value"` lines of a TOML file (enough for `rust-version`; the workspace has no
/// TOML parser among its dependencies).
mod toml_like {
    pub(crate) type Table = std::collections::BTreeMap<String, String>;

    pub(crate) fn parse(text: &str) -> Table {
        text.lines()
            .filter_map(|l| l.split_once(" = "))
            .filter_map(|(k, v)| {
                let v = v.trim().strip_prefix('"')?.strip_suffix('"')?;
                Some((k.trim().to_owned(), v.to_owned()))
            })
            .collect()
    }
}

/// The backing etcd's TLS as the chart renders it works with a real etcd: its server
/// certificate, CA and client-certificate requirement, taken from the rendered StatefulSet's
/// flags and Secrets, accept the API server's client certificate from the rendered client
/// Secret and refuse a client without one.
#[test]
fn chart_generated_etcd_tls_secures_a_real_etcd() {
    use etcd_operator_tests::tools::{self, EtcdVersion};
    use etcd_operator_tests::{TestProcess, ports::free_ports};

    let rendered = parse_all(&template(RELEASE, NAMESPACE, None, &[]).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write = |secret: &str, key: &str, file: &str| {
        let data = secret_data(&rendered, secret, key).unwrap();
        std::fs::write(dir.path().join(file), data).unwrap();
        dir.path().join(file)
    };
    let sts = &rendered.stateful_sets[0];
    let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let etcd = &pod.containers[0];
    // The files the chart mounts, from the Secret the chart mounts there.
    let tls_dir = "/var/run/etcd/tls";
    let server_secret = secret_behind(pod, etcd, &format!("{tls_dir}/tls.crt"));
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        write(&server_secret, key, key);
    }
    let client_secret = "etcd-operator-etcd-client-tls";
    let client_ca = write(client_secret, "ca.crt", "client-ca.crt");
    let client_crt = write(client_secret, "tls.crt", "client.crt");
    let client_key = write(client_secret, "tls.key", "client.key");

    // The rendered TLS flags, pointed at the written files; addresses on free loopback ports.
    let tls_flags: Vec<String> = etcd
        .args
        .iter()
        .flatten()
        .filter(|a| {
            [
                "--client-cert-auth",
                "--peer-client-cert-auth",
                "--trusted-ca-file",
                "--cert-file",
                "--key-file",
            ]
            .iter()
            .chain(&["--peer-trusted-ca-file", "--peer-cert-file", "--peer-key-file"])
            .any(|f| a.as_str() == *f || a.starts_with(&format!("{f}=")))
        })
        .map(|a| a.replace(tls_dir, dir.path().to_str().unwrap()))
        .collect();
    assert_eq!(tls_flags.len(), 8, "{tls_flags:?}");
    let ports = free_ports(2).unwrap();
    let client_url = format!("https://localhost:{}", ports[0]);
    let peer_url = format!("https://localhost:{}", ports[1]);
    let mut cmd = std::process::Command::new(tools::etcd(EtcdVersion::V3_5_1).unwrap());
    cmd.args([
        "--name=m0".to_owned(),
        format!("--data-dir={}", dir.path().join("data").display()),
        format!("--listen-client-urls=https://127.0.0.1:{}", ports[0]),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls=https://127.0.0.1:{}", ports[1]),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=m0={peer_url}"),
    ])
    .args(&tls_flags);
    let mut server = TestProcess::spawn("etcd", cmd, &dir.path().join("etcd.log")).unwrap();

    let etcdctl = |with_cert: bool| {
        let mut cmd = std::process::Command::new(tools::etcdctl(EtcdVersion::V3_5_1).unwrap());
        cmd.args([
            "--endpoints",
            &client_url,
            "--dial-timeout=2s",
            "--command-timeout=3s",
        ])
        .arg("--cacert")
        .arg(&client_ca);
        if with_cert {
            cmd.arg("--cert").arg(&client_crt).arg("--key").arg(&client_key);
        }
        cmd.args(["put", "/registry/probe", "ok"]);
        cmd.output().unwrap()
    };
    let mut healthy = false;
    for _ in 0..50 {
        if etcdctl(true).status.success() {
            healthy = true;
            break;
        }
        assert!(
            server.exited().is_none(),
            "etcd exited:\n{}",
            server.log_tail(4000)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        healthy,
        "the client certificate is not accepted:\n{}",
        server.log_tail(4000)
    );
    let refused = etcdctl(false);
    assert!(!refused.status.success(), "a client without a certificate got in");
    server.kill();
}
