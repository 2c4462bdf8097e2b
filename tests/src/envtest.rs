//! A real Kubernetes control plane for the `make test-kube` suite, started the way
//! controller-runtime's envtest starts one: `kube-apiserver` and `kube-controller-manager`
//! binaries from the directory `KUBEBUILDER_ASSETS` names (kubectl from there too when it is
//! there, else `.tools`), etcd from `.tools`, certificates made here (rcgen, through the
//! controller's CA), everything on loopback in a temporary directory.
//!
//! [`deploy_operator`] then installs the chart with helm (APIServices, RBAC, Service, the serving
//! certificate), runs `etcd-operator serve` from this workspace as a process with the chart's
//! ServiceAccount identity and serving certificate on loopback, and points the chart's Service at
//! it as an `ExternalName` Service for `localhost` with the APIServices on its port: kube-apiserver's
//! default service resolver dials an ExternalName Service's name (Endpoints and EndpointSlices may
//! not hold loopback addresses), and it verifies the server as `<service>.<namespace>.svc`, which
//! the chart's certificate names. No traffic leaves loopback. No Deployment or StatefulSet Pod runs: the controller manager runs only the
//! namespace, garbage-collector, clusterrole-aggregation, pvc-protection and serviceaccount
//! controllers, and the test node agent runs the etcd member Pods.
//!
//! Without the binaries, [`Assets::find`] fails saying how to provide them.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use etcd_operator_pki::{CertificateAuthority, LeafSpec, LeafUsage};
use serde_json::Value;

use crate::process::TestProcess;
use crate::tools::{self, EtcdVersion};
use crate::{TestEtcd, kube};

/// The directory of control-plane binaries (envtest's convention).
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";
/// Namespace the chart is installed in.
pub const OPERATOR_NAMESPACE: &str = "etcd-operator-system";
/// Helm release name (and so the chart's full name, Service and ServiceAccount name).
pub const RELEASE: &str = "etcd-operator";

const START_TIMEOUT: Duration = Duration::from_secs(90);

/// The kube-controller-manager controllers the suite needs: namespace deletion (through our
/// discovery and deletecollection), garbage collection of what EtcdClusters own, the chart's
/// aggregated ClusterRoles, PVC protection (as a cluster has it) and the `default`
/// ServiceAccount of new namespaces.
pub const KCM_CONTROLLERS: [&str; 5] = [
    "namespace-controller",
    "garbage-collector-controller",
    "clusterrole-aggregation-controller",
    "persistentvolumeclaim-protection-controller",
    "serviceaccount-controller",
];

/// The control-plane binaries are missing.
#[derive(Debug, thiserror::Error)]
#[error(
    "the kube-apiserver suite needs {missing}: put kube-apiserver and kube-controller-manager \
     in one directory and run `KUBEBUILDER_ASSETS=DIR make test-kube`. Both come from a \
     Kubernetes build from a git checkout (`make WHAT='cmd/kube-apiserver \
     cmd/kube-controller-manager'`, then `_output/bin`; without git metadata it reports \
     v0.0.0, which the chart's kubeVersion refuses) or from the release's server tarball \
     (kubernetes-server-linux-amd64.tar.gz, `kubernetes/server/bin`). setup-envtest \
     (`setup-envtest use 1.35 --bin-dir DIR -p path`) brings kube-apiserver but not \
     kube-controller-manager: copy that one beside it. kubectl is taken from there too when \
     it is there, else from .tools (`make tools`)"
)]
pub struct AssetsError {
    missing: String,
}

/// The binaries the suite runs.
#[derive(Debug, Clone)]
pub struct Assets {
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `kubectl`.
    pub kubectl: PathBuf,
}

impl Assets {
    /// From `$KUBEBUILDER_ASSETS`.
    pub fn find() -> Result<Self, AssetsError> {
        Self::find_in(std::env::var_os(ASSETS_ENV).map(PathBuf::from).as_deref())
    }

    /// From `dir` (`None`: the variable is not set).
    pub fn find_in(dir: Option<&Path>) -> Result<Self, AssetsError> {
        let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) else {
            return Err(AssetsError {
                missing: format!("{ASSETS_ENV}, which is not set"),
            });
        };
        let binary = |name: &str| {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(AssetsError {
                    missing: format!("{name} in {ASSETS_ENV}={}", dir.display()),
                })
            }
        };
        // The two the directory must have first: their absence is the message that helps.
        let kube_apiserver = binary("kube-apiserver")?;
        let kube_controller_manager = binary("kube-controller-manager")?;
        let kubectl = match binary("kubectl") {
            Ok(path) => path,
            Err(_) => tools::kubectl().map_err(|e| AssetsError {
                missing: e.to_string(),
            })?,
        };
        Ok(Self {
            kube_apiserver,
            kube_controller_manager,
            kubectl,
        })
    }
}

/// Starting the control plane or the operator failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// A binary is missing.
    #[error(transparent)]
    Assets(#[from] AssetsError),
    /// A file or directory could not be written.
    #[error("prepare the control plane's files")]
    Io(#[from] std::io::Error),
    /// A certificate could not be made.
    #[error("make the control plane's certificates: {0}")]
    Certificates(String),
    /// etcd did not start.
    #[error("start etcd: {0}")]
    Etcd(String),
    /// A process could not be started.
    #[error(transparent)]
    Spawn(#[from] crate::process::SpawnError),
    /// A component did not become ready.
    #[error("{what} did not become ready within {timeout:?}: {last}\nlog tail:\n{log}")]
    NotReady {
        what: String,
        timeout: Duration,
        last: String,
        log: String,
    },
    /// A kubectl or helm command failed.
    #[error(transparent)]
    Command(#[from] kube::RunError),
    /// Something the harness reads was not in the expected shape.
    #[error("{0}")]
    Unexpected(String),
    /// The operator binary could not be built.
    #[error(transparent)]
    Operator(#[from] crate::operator::OperatorError),
}

fn certificate_error(e: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::Certificates(e.to_string())
}

/// A running kube-apiserver (with its etcd) and kube-controller-manager.
#[derive(Debug)]
pub struct ControlPlane {
    assets: Assets,
    port: u16,
    ca_pem: String,
    // Started once kube-apiserver is ready; dropped (stopped) before it.
    controller_manager: Option<TestProcess>,
    apiserver: TestProcess,
    _etcd: TestEtcd,
    // Declared last: removed after the processes are gone.
    dir: tempfile::TempDir,
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, ControlPlaneError> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

fn leaf(
    ca: &CertificateAuthority,
    common_name: &str,
    organizations: &[&str],
    dns_names: &[&str],
    ips: &[IpAddr],
    usage: LeafUsage,
) -> Result<etcd_operator_pki::PemPair, ControlPlaneError> {
    ca.issue(&LeafSpec {
        common_name: common_name.to_owned(),
        organizations: organizations.iter().map(|o| (*o).to_owned()).collect(),
        dns_names: dns_names.iter().map(|d| (*d).to_owned()).collect(),
        ips: ips.to_vec(),
        usage,
        validity: Duration::from_secs(24 * 3600),
    })
    .map_err(certificate_error)
}

/// A kubeconfig for `server` trusting `ca`, as a client certificate or a bearer token.
pub fn kubeconfig_yaml(server: &str, ca_pem: &str, user: &KubeconfigUser) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = match user {
        KubeconfigUser::Certificate { cert_pem, key_pem } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert_pem),
            b64(key_pem)
        ),
        KubeconfigUser::Token(token) => format!("    token: {token}\n"),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\n\
         contexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: envtest\n    namespace: default\n\
         current-context: envtest\nusers:\n- name: envtest\n  user:\n{user}",
        b64(ca_pem)
    )
}

/// Who a kubeconfig authenticates as.
#[derive(Debug, Clone)]
pub enum KubeconfigUser {
    /// A client certificate.
    Certificate { cert_pem: String, key_pem: String },
    /// A bearer token (e.g. a ServiceAccount's, from `kubectl create token`).
    Token(String),
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager and waits for `/readyz`.
    pub async fn start(assets: Assets) -> Result<Self, ControlPlaneError> {
        let dir = tempfile::Builder::new()
            .prefix("etcd-operator-envtest-")
            .tempdir()?;
        let d = dir.path();
        let etcd = TestEtcd::start(EtcdVersion::V3_5_34)
            .await
            .map_err(|e| ControlPlaneError::Etcd(e.to_string()))?;

        let ca = CertificateAuthority::generate("envtest-ca", Duration::from_secs(24 * 3600))
            .map_err(certificate_error)?;
        let front_proxy_ca =
            CertificateAuthority::generate("envtest-front-proxy-ca", Duration::from_secs(24 * 3600))
                .map_err(certificate_error)?;
        let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let service_ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let serving = leaf(
            &ca,
            "kube-apiserver",
            &[],
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
            &[localhost, service_ip],
            LeafUsage::Server,
        )?;
        let admin = leaf(
            &ca,
            "envtest-admin",
            &["system:masters"],
            &[],
            &[],
            LeafUsage::Client,
        )?;
        let proxy = leaf(
            &front_proxy_ca,
            "front-proxy-client",
            &[],
            &[],
            &[],
            LeafUsage::Client,
        )?;
        // The ServiceAccount token key: an ECDSA P-256 key (kube-apiserver signs ES256 with it).
        let sa = CertificateAuthority::generate("envtest-service-accounts", Duration::from_secs(24 * 3600))
            .map_err(certificate_error)?;

        let ca_file = write(d, "ca.crt", &ca.pem().cert_pem)?;
        let serving_cert = write(d, "apiserver.crt", &serving.cert_pem)?;
        let serving_key = write(d, "apiserver.key", &serving.key_pem)?;
        let front_proxy_ca_file = write(d, "front-proxy-ca.crt", &front_proxy_ca.pem().cert_pem)?;
        let proxy_cert = write(d, "front-proxy-client.crt", &proxy.cert_pem)?;
        let proxy_key = write(d, "front-proxy-client.key", &proxy.key_pem)?;
        let sa_key = write(d, "sa.key", &sa.pem().key_pem)?;
        // The verifying side as a certificate: kube-apiserver's key-file reader takes PKCS#8 only
        // for RSA (an EC key must be SEC1 or a public key or certificate), and rcgen writes
        // PKCS#8; the signing key file takes PKCS#8 of any kind.
        let sa_verify = write(d, "sa.crt", &sa.pem().cert_pem)?;

        let ports = crate::ports::free_ports(2)?;
        let (port, kcm_port) = (ports[0], ports[1]);
        let server = format!("https://127.0.0.1:{port}");
        let admin_kubeconfig = write(
            d,
            "admin.kubeconfig",
            &kubeconfig_yaml(
                &server,
                &ca.pem().cert_pem,
                &KubeconfigUser::Certificate {
                    cert_pem: admin.cert_pem.clone(),
                    key_pem: admin.key_pem.clone(),
                },
            ),
        )?;

        let p = |path: &Path| path.display().to_string();
        let mut cmd = Command::new(&assets.kube_apiserver);
        cmd.args([
            format!("--etcd-servers={}", etcd.endpoint()),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", p(&serving_cert)),
            format!("--tls-private-key-file={}", p(&serving_key)),
            format!("--client-ca-file={}", p(&ca_file)),
            "--authorization-mode=RBAC".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--allow-privileged=true".to_owned(),
            // As envtest: Pods need no token Secret of a ServiceAccount controller.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            format!("--service-account-issuer={server}"),
            format!("--service-account-key-file={}", p(&sa_verify)),
            format!("--service-account-signing-key-file={}", p(&sa_key)),
            // The aggregator: front-proxy identity and request-header authentication for the
            // extension servers (the extension-apiserver-authentication ConfigMap carries these).
            format!("--requestheader-client-ca-file={}", p(&front_proxy_ca_file)),
            "--requestheader-allowed-names=front-proxy-client".to_owned(),
            "--requestheader-username-headers=X-Remote-User".to_owned(),
            "--requestheader-group-headers=X-Remote-Group".to_owned(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
            format!("--proxy-client-cert-file={}", p(&proxy_cert)),
            format!("--proxy-client-key-file={}", p(&proxy_key)),
        ]);
        // Proxy settings of the machine must not send kube-apiserver's calls to the operator (on
        // this host's address) anywhere else.
        for var in [
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            cmd.env_remove(var);
        }
        let apiserver = TestProcess::spawn("kube-apiserver", cmd, &d.join("kube-apiserver.log"))?;
        let mut plane = Self {
            assets,
            port,
            ca_pem: ca.pem().cert_pem.clone(),
            controller_manager: None,
            apiserver,
            _etcd: etcd,
            dir,
        };
        plane.wait_apiserver_ready().await?;

        // Only now: kube-controller-manager reads the extension-apiserver-authentication
        // ConfigMap as it starts and exits when kube-apiserver does not answer yet.
        let mut cmd = Command::new(&plane.assets.kube_controller_manager);
        cmd.args([
            format!("--kubeconfig={}", p(&admin_kubeconfig)),
            format!("--authentication-kubeconfig={}", p(&admin_kubeconfig)),
            format!("--authorization-kubeconfig={}", p(&admin_kubeconfig)),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={kcm_port}"),
            "--leader-elect=false".to_owned(),
            // The names 1.28 and later print in their help (they still take the short aliases
            // `namespace`, `garbagecollector`, ... too); releases before 1.28 know only those.
            format!("--controllers={}", KCM_CONTROLLERS.join(",")),
        ]);
        plane.controller_manager = Some(TestProcess::spawn(
            "kube-controller-manager",
            cmd,
            &plane.dir.path().join("kube-controller-manager.log"),
        )?);
        plane.wait_controller_manager_ready(kcm_port).await?;
        Ok(plane)
    }

    async fn wait_apiserver_ready(&mut self) -> Result<(), ControlPlaneError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::from("no attempt yet");
        while Instant::now() < deadline {
            if let Some(status) = self.apiserver.exited() {
                last = format!("kube-apiserver exited ({status})");
                break;
            }
            match self.kubectl().args(["get", "--raw", "/readyz"]).output() {
                Ok(out) if out.status.success() => return Ok(()),
                Ok(out) => last = String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(ControlPlaneError::NotReady {
            what: "kube-apiserver".into(),
            timeout: START_TIMEOUT,
            last,
            log: self.apiserver.log_tail(6000),
        })
    }

    /// Until kube-controller-manager answers `/healthz` on its own port.
    async fn wait_controller_manager_ready(&mut self, port: u16) -> Result<(), ControlPlaneError> {
        let Some(kcm) = self.controller_manager.as_mut() else {
            return Err(ControlPlaneError::Unexpected(
                "kube-controller-manager was not started".into(),
            ));
        };
        wait_answering(
            "kube-controller-manager",
            kcm,
            &format!("https://127.0.0.1:{port}/healthz"),
        )
        .await
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The cluster CA (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The temporary directory of this control plane.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin (system:masters) kubeconfig.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// kubectl as the admin.
    pub fn kubectl(&self) -> Command {
        self.kubectl_as(&self.admin_kubeconfig())
    }

    /// kubectl with `kubeconfig`.
    pub fn kubectl_as(&self, kubeconfig: &Path) -> Command {
        let mut cmd = Command::new(&self.assets.kubectl);
        cmd.env("KUBECONFIG", kubeconfig);
        // Its discovery cache in this control plane's directory, not the machine's ~/.kube.
        cmd.arg(format!(
            "--cache-dir={}",
            self.dir.path().join("kube-cache").display()
        ));
        cmd
    }

    /// helm with the admin kubeconfig.
    pub fn helm(&self) -> Result<Command, ControlPlaneError> {
        let home = self.dir.path().join("helm");
        std::fs::create_dir_all(&home)?;
        kube::helm(Some(&self.admin_kubeconfig()), &home)
            .map_err(|e| ControlPlaneError::Unexpected(e.to_string()))
    }

    /// A kube client as the admin.
    pub async fn client(&self) -> Result<::kube::Client, ControlPlaneError> {
        crate::kube_client::connect(&self.admin_kubeconfig(), Default::default())
            .await
            .map_err(|e| ControlPlaneError::Unexpected(e.to_string()))
    }

    /// A kubeconfig authenticating with the token of ServiceAccount `namespace/name`
    /// (`kubectl create token`), written to `path`.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        path: &Path,
    ) -> Result<PathBuf, ControlPlaneError> {
        let out =
            kube::run(
                self.kubectl()
                    .args(["create", "token", name, "-n", namespace, "--duration=2h"]),
            )?;
        let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        std::fs::write(
            path,
            kubeconfig_yaml(&self.url(), &self.ca_pem, &KubeconfigUser::Token(token)),
        )?;
        Ok(path.to_path_buf())
    }
}

/// `etcd-operator serve`, installed by the chart and running here as the chart's ServiceAccount.
#[derive(Debug)]
pub struct DeployedOperator {
    process: TestProcess,
    _backing: TestEtcd,
    /// Where it serves.
    pub listen: String,
}

impl DeployedOperator {
    /// The last `max` bytes of its log.
    pub fn log_tail(&self, max: usize) -> String {
        self.process.log_tail(max)
    }
}

fn object(out: &std::process::Output) -> Result<Value, ControlPlaneError> {
    serde_json::from_slice(&out.stdout).map_err(|e| ControlPlaneError::Unexpected(format!("not JSON: {e}")))
}

/// `Available=True` on APIService `name`.
pub fn apiservice_available(plane: &ControlPlane, name: &str) -> bool {
    plane
        .kubectl()
        .args(["get", "apiservice", name, "-o", "json"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
        .is_some_and(|v| {
            v["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Available" && c["status"] == "True")
            })
        })
}

/// Installs the chart, runs `etcd-operator serve` here as the chart's ServiceAccount with the
/// chart's serving certificate, points the chart's Service at it and waits until both
/// APIServices are Available.
pub async fn deploy_operator(plane: &ControlPlane) -> Result<DeployedOperator, ControlPlaneError> {
    let chart = tools::workspace_root().join("charts").join("etcd-operator");
    kube::run(plane.helm()?.args([
        "install",
        RELEASE,
        &chart.display().to_string(),
        "--namespace",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        "--set",
        "replicaCount=1,leaderElection.enabled=false",
    ]))?;

    // The serving certificate the chart generated (its CA is the APIServices' caBundle).
    let secret = object(&kube::run(plane.kubectl().args([
        "get",
        "secret",
        &format!("{RELEASE}-serving-cert"),
        "-n",
        OPERATOR_NAMESPACE,
        "-o",
        "json",
    ]))?)?;
    let decode = |key: &str| -> Result<Vec<u8>, ControlPlaneError> {
        use base64::Engine as _;
        let text = secret["data"][key]
            .as_str()
            .ok_or_else(|| ControlPlaneError::Unexpected(format!("the serving Secret has no {key}")))?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| ControlPlaneError::Unexpected(format!("{key}: {e}")))
    };
    let dir = plane.dir().join("operator");
    std::fs::create_dir_all(&dir)?;
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::write(&cert, decode("tls.crt")?)?;
    std::fs::write(&key, decode("tls.key")?)?;
    let kubeconfig =
        plane.service_account_kubeconfig(OPERATOR_NAMESPACE, RELEASE, &dir.join("operator.kubeconfig"))?;

    let backing = TestEtcd::start(EtcdVersion::V3_5_34)
        .await
        .map_err(|e| ControlPlaneError::Etcd(e.to_string()))?;
    let port = crate::ports::free_ports(1)?[0];
    let listen = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(crate::operator::operator_binary()?);
    cmd.args(["serve", "--listen", &listen, "--etcd-servers", backing.endpoint()])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-private-key-file")
        .arg(&key)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("RUST_LOG", "info");
    let mut process = TestProcess::spawn("etcd-operator serve", cmd, &dir.join("operator.log"))?;
    // Serving before the Service points at it: kube-apiserver backs off (up to tens of seconds)
    // after a failed availability check, so it should not see one.
    wait_answering(
        "etcd-operator serve",
        &mut process,
        &format!("https://{listen}/readyz"),
    )
    .await?;

    // The chart's Service, for this process (no Pod of the Deployment runs): ExternalName
    // `localhost`, which the aggregator dials on the APIService's port.
    kube::run(plane.kubectl().args([
        "delete",
        "service",
        RELEASE,
        "-n",
        OPERATOR_NAMESPACE,
        "--wait=true",
    ]))?;
    apply_json(
        plane,
        &format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{RELEASE}","namespace":"{OPERATOR_NAMESPACE}"}},"spec":{{"type":"ExternalName","externalName":"localhost","ports":[{{"name":"https","port":{port},"protocol":"TCP"}}]}}}}"#
        ),
    )?;
    for version in ["v1alpha1", "v1alpha2"] {
        kube::run(plane.kubectl().args([
            "patch",
            "apiservice",
            &format!("{version}.etcd.operator.dev"),
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"service":{{"port":{port}}}}}}}"#),
        ]))?;
    }

    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = process.exited() {
            return Err(ControlPlaneError::NotReady {
                what: "etcd-operator serve".into(),
                timeout: START_TIMEOUT,
                last: format!("exited ({status})"),
                log: process.log_tail(6000),
            });
        }
        if apiservice_available(plane, "v1alpha1.etcd.operator.dev")
            && apiservice_available(plane, "v1alpha2.etcd.operator.dev")
        {
            break;
        }
        if Instant::now() >= deadline {
            let last = plane
                .kubectl()
                .args(["get", "apiservices", "-o", "wide"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            return Err(ControlPlaneError::NotReady {
                what: "the etcd.operator.dev APIServices".into(),
                timeout: START_TIMEOUT,
                last,
                log: process.log_tail(6000),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(DeployedOperator {
        process,
        _backing: backing,
        listen,
    })
}

/// Until `process` answers `url` (a health path, always allowed) with a success; its
/// certificate is not checked (self-signed, or naming a Service rather than this address): only
/// the answer matters here.
async fn wait_answering(what: &str, process: &mut TestProcess, url: &str) -> Result<(), ControlPlaneError> {
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| ControlPlaneError::Unexpected(format!("build an HTTP client: {e}")))?;
    let deadline = Instant::now() + START_TIMEOUT;
    let mut last = String::from("no attempt yet");
    while Instant::now() < deadline {
        if let Some(status) = process.exited() {
            last = format!("exited ({status})");
            break;
        }
        match http.get(url).send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => last = format!("{url}: {}", r.status()),
            Err(e) => last = format!("{url}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(ControlPlaneError::NotReady {
        what: what.to_owned(),
        timeout: START_TIMEOUT,
        last,
        log: process.log_tail(6000),
    })
}

/// `kubectl apply -f -` of one JSON object as the admin.
pub fn apply_json(plane: &ControlPlane, json: &str) -> Result<(), ControlPlaneError> {
    crate::kubectl::run_with_stdin(plane.kubectl(), &["apply", "-f", "-"], Some(json))
        .map_err(|e| ControlPlaneError::Unexpected(e.to_string()))
        .and_then(|out| {
            if out.status.success() {
                Ok(())
            } else {
                Err(ControlPlaneError::Unexpected(format!(
                    "kubectl apply: {}",
                    String::from_utf8_lossy(&out.stderr)
                )))
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_assets_say_how_to_provide_them() {
        let unset = Assets::find_in(None).unwrap_err().to_string();
        assert!(unset.contains("KUBEBUILDER_ASSETS, which is not set"), "{unset}");
        assert!(unset.contains("make test-kube"), "{unset}");
        let dir = tempfile::tempdir().unwrap();
        let empty = Assets::find_in(Some(dir.path())).unwrap_err().to_string();
        assert!(empty.contains("kube-apiserver in KUBEBUILDER_ASSETS="), "{empty}");
        // Where each binary comes from, including the one setup-envtest does not bring.
        assert!(empty.contains("server tarball"), "{empty}");
        assert!(empty.contains("but not kube-controller-manager"), "{empty}");
        std::fs::write(dir.path().join("kube-apiserver"), "").unwrap();
        let half = Assets::find_in(Some(dir.path())).unwrap_err().to_string();
        assert!(
            half.contains("kube-controller-manager in KUBEBUILDER_ASSETS="),
            "{half}"
        );
        std::fs::write(dir.path().join("kube-controller-manager"), "").unwrap();
        let found = Assets::find_in(Some(dir.path())).unwrap();
        assert_eq!(found.kube_apiserver, dir.path().join("kube-apiserver"));
    }

    #[test]
    fn kubeconfigs_carry_the_ca_and_the_identity() {
        let yaml = kubeconfig_yaml("https://127.0.0.1:1", "CA", &KubeconfigUser::Token("t0k".into()));
        let parsed: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(parsed["clusters"][0]["cluster"]["server"], "https://127.0.0.1:1");
        assert_eq!(
            parsed["clusters"][0]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        assert_eq!(parsed["users"][0]["user"]["token"], "t0k");
    }
}
