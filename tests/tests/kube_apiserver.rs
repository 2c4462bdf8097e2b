//! The product on a real Kubernetes control plane (`make test-kube`): kube-apiserver and
//! kube-controller-manager from `KUBEBUILDER_ASSETS` (see `envtest`), the chart installed with
//! helm, `etcd-operator serve` behind the aggregator as the chart's ServiceAccount, everything
//! driven through kube-apiserver. Built only with the `kube-apiserver` feature, so `make test`
//! neither runs nor needs it; without the binaries every test fails saying how to provide them.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use etcd_operator_tests::envtest::{
    self, Assets, ControlPlane, DeployedOperator, OPERATOR_NAMESPACE, RELEASE,
};
use etcd_operator_tests::kube_client::etcd_clusters;
use etcd_operator_tests::node_agent::{NodeAgent, NodeAgentOptions};
use etcd_operator_tests::{private_hosts, tools};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(120);

async fn control_plane() -> anyhow::Result<ControlPlane> {
    Ok(ControlPlane::start(Assets::find()?).await?)
}

async fn with_operator() -> anyhow::Result<(ControlPlane, DeployedOperator)> {
    let plane = control_plane().await?;
    let operator = envtest::deploy_operator(&plane).await?;
    Ok((plane, operator))
}

fn run(cmd: Command, args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
    Ok(etcd_operator_tests::kubectl::run_with_stdin(cmd, args, stdin)?)
}

/// kubectl as the admin; stdout, or an error with stderr.
fn ok(plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let out = run(plane.kubectl(), args, stdin)?;
    ensure!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn json_of(plane: &ControlPlane, args: &[&str]) -> anyhow::Result<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    Ok(serde_json::from_str(&ok(plane, &all, None)?)?)
}

fn cluster(name: &str, namespace: &str, replicas: u32, version: &str) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  replicas: {replicas}\n  version: {version}\n"
    )
}

async fn eventually(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = e.to_string(),
        }
        if Instant::now() >= deadline {
            bail!("{what}: not within {timeout:?} (last error: {last})");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiservices_discovery_and_kubectl_through_the_aggregator() -> anyhow::Result<()> {
    let (plane, _operator) = with_operator().await?;
    for name in ["v1alpha1.etcd.operator.dev", "v1alpha2.etcd.operator.dev"] {
        assert!(
            envtest::apiservice_available(&plane, name),
            "{name} not Available"
        );
    }
    // kube-apiserver merges an aggregated group's discovery and OpenAPI in the background (and
    // backs off after the 503s it got before the operator served): Available comes first.
    let mut resources = String::new();
    eventually(
        "our resources in kubectl api-resources",
        Duration::from_secs(60),
        || {
            resources = ok(
                &plane,
                &["api-resources", "--api-group=etcd.operator.dev", "-o", "name"],
                None,
            )?;
            Ok(resources.contains("etcdclusters.etcd.operator.dev")
                && resources.contains("etcdbackups.etcd.operator.dev"))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}; last listing:\n{resources}"))?;
    for version in ["v1alpha1", "v1alpha2"] {
        let field = if version == "v1alpha1" { "size" } else { "replicas" };
        let mut explained = String::new();
        eventually(
            &format!("kubectl explain etcdclusters.spec.{field} in {version}"),
            Duration::from_secs(60),
            || {
                explained = ok(
                    &plane,
                    &[
                        "explain",
                        &format!("etcdclusters.spec.{field}"),
                        &format!("--api-version=etcd.operator.dev/{version}"),
                    ],
                    None,
                )?;
                Ok(explained.contains(&format!("FIELD: {field}")))
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}; last output:\n{explained}"))?;
    }

    // Written in v1alpha1, read in v1alpha2 (and back), through kube-apiserver.
    ok(
        &plane,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: etcd.operator.dev/v1alpha1\nkind: EtcdCluster\nmetadata:\n  name: legacy\n  namespace: default\nspec:\n  size: 3\n  version: 3.5.16\n",
        ),
    )?;
    let v2 = json_of(
        &plane,
        &["get", "etcdclusters.v1alpha2.etcd.operator.dev", "legacy"],
    )?;
    assert_eq!(v2["apiVersion"], "etcd.operator.dev/v1alpha2");
    assert_eq!(v2["spec"]["replicas"], 3);
    let v1 = json_of(
        &plane,
        &["get", "etcdclusters.v1alpha1.etcd.operator.dev", "legacy"],
    )?;
    assert_eq!(v1["spec"]["size"], 3);

    // A watch sees the change a patch and a scale make.
    let mut watch = plane
        .kubectl()
        .args([
            "get",
            "etcdclusters",
            "legacy",
            "-w",
            "-o",
            "jsonpath={.spec.replicas}{\"\\n\"}",
            "--request-timeout=30s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    // Its lines as they come; the changes are made only once it printed the current state (so
    // its GET cannot land after them).
    let (line_tx, line_rx) = std::sync::mpsc::channel::<String>();
    let stdout = watch.stdout.take().context("kubectl -w stdout")?;
    let reader = std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if line_tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = line_rx
        .recv_timeout(Duration::from_secs(30))
        .context("kubectl get -w printed nothing within 30 s")?;
    ok(
        &plane,
        &[
            "patch",
            "etcdcluster",
            "legacy",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":4}}"#,
        ],
        None,
    )?;
    ok(&plane, &["scale", "etcdcluster", "legacy", "--replicas=5"], None)?;
    ok(
        &plane,
        &[
            "wait",
            "--for=jsonpath={.spec.replicas}=5",
            "etcdcluster/legacy",
            "--timeout=30s",
        ],
        None,
    )?;
    let mut lines = vec![first];
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lines.iter().any(|l| l == "5") && Instant::now() < deadline {
        if let Ok(line) = line_rx.recv_timeout(Duration::from_millis(500)) {
            lines.push(line);
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let _ = reader.join();
    lines.extend(line_rx.try_iter());
    assert!(
        lines.first().map(String::as_str) == Some("3")
            && lines.iter().any(|l| l == "4")
            && lines.iter().any(|l| l == "5"),
        "{lines:?}"
    );

    ok(
        &plane,
        &["delete", "etcdcluster", "legacy", "--wait=true", "--timeout=60s"],
        None,
    )?;
    let gone = run(plane.kubectl(), &["get", "etcdcluster", "legacy"], None)?;
    assert!(!gone.status.success() && String::from_utf8_lossy(&gone.stderr).contains("NotFound"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_conflicts_and_force_through_the_aggregator() -> anyhow::Result<()> {
    let (plane, _operator) = with_operator().await?;
    let three = cluster("ssa", "default", 3, "3.5.16");
    ok(
        &plane,
        &["apply", "--server-side", "--field-manager=alice", "-f", "-"],
        Some(&three),
    )?;
    ok(
        &plane,
        &["apply", "--server-side", "--field-manager=alice", "-f", "-"],
        Some(&three),
    )?;
    let five = cluster("ssa", "default", 5, "3.5.16");
    let conflict = run(
        plane.kubectl(),
        &["apply", "--server-side", "--field-manager=bob", "-f", "-"],
        Some(&five),
    )?;
    let stderr = String::from_utf8_lossy(&conflict.stderr);
    assert!(!conflict.status.success(), "bob's apply took alice's field");
    assert!(
        stderr.contains("conflict") && stderr.contains("alice") && stderr.contains(".spec.replicas"),
        "{stderr}"
    );
    ok(
        &plane,
        &[
            "apply",
            "--server-side",
            "--field-manager=bob",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&five),
    )?;
    let object = json_of(&plane, &["get", "etcdcluster", "ssa", "--show-managed-fields"])?;
    assert_eq!(object["spec"]["replicas"], 5);
    let managers: Vec<&str> = object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert!(managers.contains(&"bob"), "{managers:?}");

    // kube-rs Patch::Apply through kube-apiserver.
    let client = plane.client().await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &etcd_clusters());
    let patch = json!({
        "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
        "metadata": {"name": "ssa"}, "spec": {"replicas": 3, "version": "3.5.16"},
    });
    let applied = api
        .patch("ssa", &PatchParams::apply("carol").force(), &Patch::Apply(&patch))
        .await?;
    assert_eq!(applied.data["spec"]["replicas"], 3);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_is_delegated_and_forged_identities_are_refused() -> anyhow::Result<()> {
    let (plane, operator) = with_operator().await?;
    ok(
        &plane,
        &["create", "serviceaccount", "nobody", "-n", "default"],
        None,
    )?;
    let kubeconfig =
        plane.service_account_kubeconfig("default", "nobody", &plane.dir().join("nobody.kubeconfig"))?;
    let denied = run(
        plane.kubectl_as(&kubeconfig),
        &["get", "etcdclusters", "-n", "default"],
        None,
    )?;
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        !denied.status.success() && stderr.contains("Forbidden"),
        "{stderr}"
    );

    // The chart's ClusterRoles aggregate into `edit`.
    ok(
        &plane,
        &[
            "create",
            "rolebinding",
            "nobody-edit",
            "--clusterrole=edit",
            "--serviceaccount=default:nobody",
            "-n",
            "default",
        ],
        None,
    )?;
    let manifest = cluster("by-sa", "default", 1, "3.5.16");
    eventually(
        "the ServiceAccount creates an EtcdCluster with the edit role",
        Duration::from_secs(60),
        || {
            Ok(run(
                plane.kubectl_as(&kubeconfig),
                &["create", "-f", "-"],
                Some(&manifest),
            )?
            .status
            .success())
        },
    )
    .await?;

    // Anonymous through kube-apiserver, and forged request headers straight to the server.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .build()?;
    let anonymous = http
        .get(format!(
            "{}/apis/etcd.operator.dev/v1alpha2/etcdclusters",
            plane.url()
        ))
        .send()
        .await?;
    assert!(
        matches!(anonymous.status().as_u16(), 401 | 403),
        "anonymous: {}",
        anonymous.status()
    );
    let forged = http
        .get(format!(
            "https://{}/apis/etcd.operator.dev/v1alpha2/etcdclusters",
            operator.listen
        ))
        .header("X-Remote-User", "system:admin")
        .header("X-Remote-Group", "system:masters")
        .send()
        .await?;
    assert!(
        matches!(forged.status().as_u16(), 401 | 403),
        "forged headers: {}",
        forged.status()
    );
    // A ServiceAccount with no binding at all, claiming to be an admin through headers that only
    // the front proxy may set.
    ok(
        &plane,
        &["create", "serviceaccount", "stranger", "-n", "default"],
        None,
    )?;
    let stranger =
        plane.service_account_kubeconfig("default", "stranger", &plane.dir().join("stranger.kubeconfig"))?;
    let token = std::fs::read_to_string(&stranger)?
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_owned))
        .context("token")?;
    let forged_via_apiserver = http
        .get(format!(
            "{}/apis/etcd.operator.dev/v1alpha2/namespaces/default/etcdclusters/by-sa",
            plane.url()
        ))
        .bearer_auth(token)
        .header("X-Remote-User", "system:admin")
        .header("X-Remote-Group", "system:masters")
        .send()
        .await?;
    assert_eq!(forged_via_apiserver.status().as_u16(), 403);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_and_garbage_collection_work_with_the_aggregated_resources() -> anyhow::Result<()> {
    let (plane, _operator) = with_operator().await?;
    // NamespaceLifecycle: no objects in a namespace that does not exist.
    let missing = run(
        plane.kubectl(),
        &["apply", "-f", "-"],
        Some(&cluster("c", "ghost", 1, "3.5.16")),
    )?;
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        !missing.status.success() && stderr.contains("namespaces \"ghost\" not found"),
        "{stderr}"
    );

    // The namespace controller deletes our objects through discovery and deletecollection.
    ok(&plane, &["create", "namespace", "doomed"], None)?;
    ok(
        &plane,
        &["apply", "-f", "-"],
        Some(&cluster("c", "doomed", 1, "3.5.16")),
    )?;
    ok(
        &plane,
        &["delete", "namespace", "doomed", "--wait=true", "--timeout=120s"],
        None,
    )?;
    let gone = run(plane.kubectl(), &["get", "namespace", "doomed"], None)?;
    assert!(!gone.status.success(), "namespace doomed still exists");

    // The garbage collector resolves owner references to EtcdClusters.
    ok(
        &plane,
        &["apply", "-f", "-"],
        Some(&cluster("owner", "default", 1, "3.5.16")),
    )?;
    let owner = json_of(&plane, &["get", "etcdcluster", "owner"])?;
    let uid = owner["metadata"]["uid"].as_str().context("uid")?.to_owned();
    let dependent = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "owned", "namespace": "default", "ownerReferences": [{
            "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster", "name": "owner", "uid": uid,
        }]},
    });
    ok(&plane, &["apply", "-f", "-"], Some(&dependent.to_string()))?;
    eventually("the operator's Pod, PVC and Services of `owner`", TIMEOUT, || {
        let pods = json_of(&plane, &["get", "pods", "-l", "etcd.operator.dev/cluster=owner"])?;
        let services = json_of(
            &plane,
            &["get", "services", "-l", "etcd.operator.dev/cluster=owner"],
        )?;
        Ok(pods["items"].as_array().is_some_and(|i| !i.is_empty())
            && services["items"].as_array().is_some_and(|i| i.len() == 2))
    })
    .await?;
    ok(
        &plane,
        &["delete", "etcdcluster", "owner", "--wait=true", "--timeout=60s"],
        None,
    )?;
    eventually("the EtcdCluster's dependents are gone", TIMEOUT, || {
        let mut left = 0;
        for kind in [
            "pods",
            "persistentvolumeclaims",
            "services",
            "poddisruptionbudgets",
        ] {
            let list = json_of(&plane, &["get", kind, "-l", "etcd.operator.dev/cluster=owner"])?;
            left += list["items"].as_array().map_or(0, Vec::len);
        }
        let configmap = run(plane.kubectl(), &["get", "configmap", "owned"], None)?;
        Ok(left == 0 && !configmap.status.success())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_the_chart_renders_passes_server_side_dry_run() -> anyhow::Result<()> {
    let plane = control_plane().await?;
    ok(&plane, &["create", "namespace", OPERATOR_NAMESPACE], None)?;
    // The CRDs of the optional integrations (cert-manager, Prometheus Operator), schema-less.
    for (group, kind, plural) in [
        ("cert-manager.io", "Certificate", "certificates"),
        ("cert-manager.io", "Issuer", "issuers"),
        ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
    ] {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {"group": group, "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]},
        });
        ok(&plane, &["apply", "-f", "-"], Some(&crd.to_string()))?;
    }
    ok(
        &plane,
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
        None,
    )?;
    // ci/monitoring-values.yaml puts the dashboard ConfigMap where Grafana's sidecar looks.
    ok(&plane, &["create", "namespace", "monitoring"], None)?;
    let chart = tools::workspace_root().join("charts").join("etcd-operator");
    let mut values: Vec<Option<std::path::PathBuf>> = vec![None];
    for entry in std::fs::read_dir(chart.join("ci"))? {
        values.push(Some(entry?.path()));
    }
    for file in values {
        let mut helm = plane.helm()?;
        helm.args([
            "template",
            RELEASE,
            &chart.display().to_string(),
            "--namespace",
            OPERATOR_NAMESPACE,
        ]);
        if let Some(file) = &file {
            helm.arg("-f").arg(file);
        }
        let rendered = etcd_operator_tests::kube::run(&mut helm)?;
        let manifests = String::from_utf8_lossy(&rendered.stdout).into_owned();
        let out = run(
            plane.kubectl(),
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&manifests),
        )?;
        assert!(
            out.status.success(),
            "values {file:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The status of EtcdCluster `name` once `done` holds, read through kube-apiserver.
async fn wait_status(
    plane: &ControlPlane,
    name: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let object = json_of(plane, &["get", "etcdcluster", name])?;
        if done(&object["status"]) {
            return Ok(object["status"].clone());
        }
        if Instant::now() >= deadline {
            bail!("{what}: not within {timeout:?}; last status {}", object["status"]);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_run_through_the_node_agent_and_the_real_api() -> anyhow::Result<()> {
    let Some(hosts) = private_hosts::enter("members_run_through_the_node_agent_and_the_real_api")? else {
        return Ok(());
    };
    let (plane, operator) = with_operator().await?;
    ok(
        &plane,
        &["apply", "-f", "-"],
        Some(
            r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","labels":{"kubernetes.io/hostname":"node-1"}}}"#,
        ),
    )?;
    let agent = NodeAgent::start(
        plane.client().await?,
        NodeAgentOptions {
            node: "node-1".into(),
            root: plane.dir().join("node"),
            etcd_binaries: tools::tools_dir().join("etcd"),
            hosts,
            operator: None,
        },
    );
    let name = "real";
    let available = |replicas: i64, version: &'static str| {
        move |s: &Value| {
            etcd_operator_tests::local_cluster::available(s, replicas)
                && s["members"]
                    .as_array()
                    .is_some_and(|m| m.iter().all(|m| m["version"] == version))
        }
    };
    ok(
        &plane,
        &["apply", "-f", "-"],
        Some(&cluster(name, "default", 3, "3.5.16")),
    )?;
    wait_status(
        &plane,
        name,
        "3 members Available",
        TIMEOUT,
        available(3, "3.5.16"),
    )
    .await
    .with_context(|| operator.log_tail(4000))?;
    let pods = json_of(&plane, &["get", "pods", "-l", "etcd.operator.dev/cluster=real"])?;
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(3));

    ok(&plane, &["scale", "etcdcluster", name, "--replicas=5"], None)?;
    wait_status(&plane, name, "scaled to 5", TIMEOUT, available(5, "3.5.16")).await?;

    // A deleted Pod comes back on its PVC.
    let pods = json_of(&plane, &["get", "pods", "-l", "etcd.operator.dev/cluster=real"])?;
    let victim = pods["items"][1]["metadata"]["name"]
        .as_str()
        .context("a Pod")?
        .to_owned();
    let old_uid = pods["items"][1]["metadata"]["uid"].clone();
    ok(&plane, &["delete", "pod", &victim, "--wait=false"], None)?;
    eventually("the deleted Pod is created again", TIMEOUT, || {
        let pod = json_of(&plane, &["get", "pod", &victim])?;
        Ok(pod["metadata"]["uid"] != old_uid && pod["status"]["phase"] == "Running")
    })
    .await?;
    wait_status(
        &plane,
        name,
        "5 members after the Pod came back",
        TIMEOUT,
        available(5, "3.5.16"),
    )
    .await?;
    assert!(agent.pid("default", &victim).is_some());

    ok(
        &plane,
        &[
            "patch",
            "etcdcluster",
            name,
            "--type=merge",
            "-p",
            r#"{"spec":{"version":"3.5.34"}}"#,
        ],
        None,
    )?;
    wait_status(
        &plane,
        name,
        "rolled to 3.5.34",
        TIMEOUT * 2,
        available(5, "3.5.34"),
    )
    .await?;
    Ok(())
}
