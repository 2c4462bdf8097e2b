//! The kubernetes runtime end to end without kube-apiserver (none ships in a registry this
//! machine reaches): `etcd-operator local --member-kubeconfig` serves EtcdClusters and runs
//! their members as Pods, PVCs, Services and a PDB in the in-memory Kubernetes API of
//! `fake_kube`, and the test node agent runs those Pods as real etcd processes on loopback
//! addresses. The test runs in a private mount namespace whose /etc/hosts carries the Pods'
//! `.svc` names (`private_hosts`), so the operator reaches members by the names it gives them.
//!
//! A 3-member cluster becomes Available, scales 3→5, gets back a member whose Pod is deleted
//! (same member, same data: its PVC outlives the Pod), rolls 3.5.16→3.5.34 and scales 5→3 (the
//! removed members' PVCs set aside); deleting the EtcdCluster removes every Pod, PVC (set-aside
//! ones too), Service and the PDB. The same flow against a real
//! kube-apiserver is in the `make test-kube` suite.

use std::time::Duration;

use anyhow::Context as _;
use etcd_operator_tests::fake_kube::FakeKube;
use etcd_operator_tests::kubectl::{Watched, apply, kubectl, wait_for};
use etcd_operator_tests::local_cluster::{available, etcdctl_ok, wait_available};
use etcd_operator_tests::node_agent::{KubeRuntime as Cluster, NodeAgent};
use etcd_operator_tests::{EtcdVersion, private_hosts, tools};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(120);

fn cluster_yaml(name: &str, replicas: u32, version: &str) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: {replicas}\n  version: {version}\n"
    )
}

fn pods_of(kube: &FakeKube, cluster: &str) -> Vec<Value> {
    kube.objects("pods")
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["etcd.operator.dev/cluster"] == cluster)
        .collect()
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// `(member id, name)` of every started member, as etcd lists them.
fn member_list(endpoint: &str) -> Vec<(String, String)> {
    let out = etcdctl_ok(endpoint, &["member", "list", "-w", "json"]);
    let list: Value = serde_json::from_str(&out).unwrap_or_default();
    let mut members: Vec<(String, String)> = list["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["name"].as_str().is_some_and(|n| !n.is_empty()))
        .map(|m| {
            (
                m["ID"].to_string(),
                m["name"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    members.sort();
    members
}

fn member_versions(agent: &NodeAgent, pods: &[Value]) -> Vec<String> {
    pods.iter()
        .map(|p| {
            let name = p["metadata"]["name"].as_str().unwrap_or_default();
            let ip = agent.address("default", name).unwrap_or_default();
            let out = etcdctl_ok(
                &format!("http://{ip}:2379"),
                &["endpoint", "status", "-w", "json"],
            );
            let status: Value = serde_json::from_str(&out).unwrap_or_default();
            status[0]["Status"]["version"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// The cluster's Pods once `count` of them are all Ready.
async fn wait_pods_ready(kube: &FakeKube, cluster: &str, count: usize) -> anyhow::Result<Vec<Value>> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let pods = pods_of(kube, cluster);
        if pods.len() == count && pods.iter().all(ready) {
            return Ok(pods);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{count} ready Pods of {cluster} not seen within {TIMEOUT:?}: {pods:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Durations of the phases of a test, printed as they end.
struct Phase(std::time::Instant);

impl Phase {
    fn start() -> Self {
        Self(std::time::Instant::now())
    }

    fn restart(&mut self) {
        self.0 = std::time::Instant::now();
    }

    fn done(&mut self, what: &str) {
        eprintln!(
            "node agent e2e: {what} in {:.1} s",
            self.0.elapsed().as_secs_f64()
        );
        self.restart();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_runs_members_through_the_node_agent() -> anyhow::Result<()> {
    let Some(hosts) = private_hosts::enter("kubernetes_runtime_runs_members_through_the_node_agent")? else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_16)?;
    tools::etcd(EtcdVersion::V3_5_34)?;
    // The operator's own volume for pre-upgrade snapshots (the chart's `--snapshot-dir`).
    let snapshots = tempfile::Builder::new()
        .prefix("etcd-operator-snapshots-")
        .tempdir()?;
    let Cluster {
        kube_api,
        agent,
        op,
        dir: _dir,
    } = Cluster::start_with(
        hosts,
        vec![(
            "ETCD_OPERATOR_SNAPSHOT_DIR".to_owned(),
            snapshots.path().display().to_string(),
        )],
    )
    .await?;
    let name = "kr";

    // 3 members through the kubernetes runtime. Each phase's duration is printed (figures for
    // the record, never asserted).
    let mut phase = Phase::start();
    apply(&op, &cluster_yaml(name, 3, "3.5.16"))?;
    let status = wait_available(
        &op,
        name,
        3,
        "3 members Available through the node agent",
        TIMEOUT,
    )
    .await;
    // The agent probes readiness on its own round, after etcd answers the operator.
    let pods = wait_pods_ready(&kube_api, name, 3).await?;
    assert_eq!(pods.len(), 3, "{pods:#?}");
    phase.done("3 members Available and their Pods Ready");
    for pod in &pods {
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
        assert_eq!(pod["spec"]["nodeName"], "node-1", "{pod}");
        assert_eq!(pod["status"]["phase"], "Running", "{pod}");
        assert!(ready(pod), "{pod}");
        assert_eq!(
            pod["status"]["podIP"].as_str(),
            agent.address("default", pod_name).as_deref()
        );
    }
    let pvcs = kube_api.objects("persistentvolumeclaims");
    assert_eq!(pvcs.len(), 3, "{pvcs:#?}");
    assert!(pvcs.iter().all(|p| p["status"]["phase"] == "Bound"), "{pvcs:#?}");
    assert_eq!(kube_api.objects("services").len(), 2, "peer and client Services");
    assert_eq!(kube_api.objects("poddisruptionbudgets").len(), 1);
    // The members reach one another by their .svc names: one cluster of three.
    let first = agent
        .address(
            "default",
            pods[0]["metadata"]["name"].as_str().unwrap_or_default(),
        )
        .context("the agent gave the first Pod no address")?;
    let endpoint = format!("http://{first}:2379");
    assert_eq!(member_list(&endpoint).len(), 3, "{status}");
    etcdctl_ok(&endpoint, &["put", "kept", "across-everything"]);

    // Scale 3 -> 5.
    kubectl(&op, &["scale", "etcdcluster", name, "--replicas=5"], None)?;
    wait_available(&op, name, 5, "scaled to 5 members", TIMEOUT).await;
    wait_pods_ready(&kube_api, name, 5).await?;
    phase.done("scaled 3 -> 5");
    let before = member_list(&endpoint);
    assert_eq!(before.len(), 5, "{before:?}");

    // A member's Pod is deleted: the node agent stops it (SIGTERM, then the final delete), the
    // controller creates the Pod again on the member's PVC.
    let victim = pods_of(&kube_api, name)
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .find(|n| agent.address("default", n).as_deref() != Some(first.as_str()))
        .context("no second Pod")?;
    let old_uid = pods_of(&kube_api, name)
        .into_iter()
        .find(|p| p["metadata"]["name"] == victim.as_str())
        .map(|p| p["metadata"]["uid"].clone())
        .context("victim Pod")?;
    let old_pid = agent
        .pid("default", &victim)
        .context("the victim runs no process")?;
    phase.restart();
    Api::<Pod>::namespaced(kube_api.client()?, "default")
        .delete(&victim, &DeleteParams::default())
        .await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let back = pods_of(&kube_api, name)
            .into_iter()
            .find(|p| p["metadata"]["name"] == victim.as_str());
        if let Some(pod) = back
            && pod["metadata"]["uid"] != old_uid
            && ready(&pod)
        {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "Pod {victim} was not created again and ready within {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_ne!(
        agent.pid("default", &victim),
        Some(old_pid),
        "the old process still runs"
    );
    wait_available(&op, name, 5, "5 members after the Pod came back", TIMEOUT).await;
    phase.done("a deleted Pod back and the cluster Available");
    assert_eq!(
        member_list(&endpoint),
        before,
        "the same members, the same ids: its data was kept"
    );
    let victim_ip = agent.address("default", &victim).context("victim address")?;
    assert_eq!(
        etcdctl_ok(
            &format!("http://{victim_ip}:2379"),
            &["get", "kept", "--print-value-only"]
        )
        .trim(),
        "across-everything"
    );

    // Rolling upgrade 3.5.16 -> 3.5.34.
    kubectl(
        &op,
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
    wait_for(
        &op,
        Watched::status("ec", name),
        "rolled to 3.5.34",
        TIMEOUT * 2,
        |s| {
            available(s, 5)
                && s["currentVersion"] == "3.5.34"
                && s["members"]
                    .as_array()
                    .is_some_and(|m| m.iter().all(|m| m["version"] == "3.5.34"))
        },
    )
    .await?;
    phase.done("rolled 5 members 3.5.16 -> 3.5.34");
    let pods = pods_of(&kube_api, name);
    assert!(
        pods.iter().all(|p| p["spec"]["containers"][0]["image"]
            .as_str()
            .is_some_and(|i| i.ends_with(":v3.5.34"))),
        "{pods:#?}"
    );
    assert_eq!(member_versions(&agent, &pods), vec!["3.5.34"; 5]);
    assert_eq!(member_list(&endpoint), before, "the roll keeps every member");
    // No backup destination: the pre-upgrade snapshot is in the operator's own volume, named in
    // status, and etcd's own tool reads it.
    let status = etcd_operator_tests::kubectl::status(&op, "ec", name)?;
    let kept = status["upgrade"]["snapshot"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let snapshot = std::path::PathBuf::from(&kept);
    assert!(
        snapshot.starts_with(snapshots.path().join("default").join(name)),
        "status.upgrade.snapshot: {kept:?}"
    );
    let file_name = snapshot
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    assert!(
        file_name.starts_with("pre-upgrade-3.5.16-to-3.5.34-") && file_name.ends_with(".db"),
        "{file_name}"
    );
    let checked = std::process::Command::new(tools::etcdutl(EtcdVersion::V3_5_16)?)
        .args(["snapshot", "status", "-w", "json"])
        .arg(&snapshot)
        .output()?;
    assert!(
        checked.status.success(),
        "etcdutl snapshot status: {}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let checked: Value = serde_json::from_slice(&checked.stdout)?;
    assert!(checked["totalKey"].as_u64().unwrap_or_default() > 0, "{checked}");

    // Scale 5 -> 3: two members leave etcd, their Pods go, the PDB follows.
    phase.restart();
    kubectl(&op, &["scale", "etcdcluster", name, "--replicas=3"], None)?;
    let status = wait_available(&op, name, 3, "scaled down to 3 members", TIMEOUT).await;
    let pods = wait_pods_ready(&kube_api, name, 3).await?;
    phase.done("scaled 5 -> 3");
    let kept = etcd_operator_tests::local_cluster::member_names(&status);
    let any = agent
        .address("default", &kept[0])
        .context("a remaining member's address")?;
    assert_eq!(member_list(&format!("http://{any}:2379")).len(), 3, "{status}");
    let mut pod_names: Vec<String> = pods
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    pod_names.sort();
    let mut kept_sorted = kept.clone();
    kept_sorted.sort();
    assert_eq!(pod_names, kept_sorted, "the Pods are the members");
    let pdb = kube_api.objects("poddisruptionbudgets");
    assert_eq!(pdb[0]["spec"]["minAvailable"], 2, "{pdb:#?}");
    // The two removed members' claims are set aside (still the cluster's, no member's); the
    // remaining members keep theirs.
    let claims = kube_api.objects("persistentvolumeclaims");
    let label = |c: &Value, key: &str| c["metadata"]["labels"][key].as_str().map(str::to_owned);
    let mut set_aside: Vec<String> = claims
        .iter()
        .filter_map(|c| label(c, "etcd.operator.dev/removed-member"))
        .collect();
    set_aside.sort();
    assert_eq!(set_aside.len(), 2, "{claims:#?}");
    assert!(
        set_aside.iter().all(|m| !kept.contains(m)),
        "{set_aside:?} vs {kept:?}"
    );
    assert!(
        claims
            .iter()
            .all(|c| label(c, "etcd.operator.dev/cluster").as_deref() == Some(name)),
        "{claims:#?}"
    );
    let mut members_claims: Vec<String> = claims
        .iter()
        .filter_map(|c| label(c, "etcd.operator.dev/member"))
        .collect();
    members_claims.sort();
    assert_eq!(members_claims, kept_sorted, "{claims:#?}");

    // Deleting the EtcdCluster removes what the runtime created.
    phase.restart();
    kubectl(
        &op,
        &["delete", "etcdcluster", name, "--wait=true", "--timeout=120s"],
        None,
    )?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !(pods_of(&kube_api, name).is_empty()
        && kube_api.objects("persistentvolumeclaims").is_empty()
        && kube_api.objects("services").is_empty()
        && kube_api.objects("poddisruptionbudgets").is_empty())
    {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "objects left after deleting the EtcdCluster: pods {:?}, pvcs {}, services {}",
            pods_of(&kube_api, name).len(),
            kube_api.objects("persistentvolumeclaims").len(),
            kube_api.objects("services").len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    phase.done("deleted the EtcdCluster and every object of its members");
    assert_eq!(
        agent.pid("default", &victim),
        None,
        "the agent stopped the members"
    );
    Ok(())
}

/// A changed `spec.podTemplate` (resources) on a running 3-member cluster under a continuous
/// writer: every member's Pod is re-created exactly once on its own PVC (same member IDs), the
/// leader last, the new Pods carry the new resources and the template hash `status.rollout`
/// reports, no acknowledged write is lost and HashKV agrees. The longest write gap is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_rolls_a_changed_pod_template_under_a_writer() -> anyhow::Result<()> {
    let Some(hosts) = private_hosts::enter("kubernetes_runtime_rolls_a_changed_pod_template_under_a_writer")?
    else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_34)?;
    let Cluster {
        kube_api,
        agent,
        op,
        dir: _dir,
    } = Cluster::start(hosts).await?;
    let name = "tr";
    apply(&op, &cluster_yaml(name, 3, "3.5.34"))?;
    let status = wait_available(&op, name, 3, "3 members Available", TIMEOUT).await;
    let pods = wait_pods_ready(&kube_api, name, 3).await?;
    let template_of = |pod: &Value| {
        pod["metadata"]["annotations"]["etcd.operator.dev/template-hash"]
            .as_str()
            .map(str::to_owned)
    };
    let before = template_of(&pods[0]).context("a member Pod without a template hash")?;
    assert!(
        pods.iter()
            .all(|p| template_of(p).as_deref() == Some(before.as_str())),
        "{pods:#?}"
    );
    let uid_of = |pod: &Value| pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    let name_of = |pod: &Value| pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let original: std::collections::BTreeMap<String, String> =
        pods.iter().map(|p| (name_of(p), uid_of(p))).collect();
    let endpoints: Vec<String> = original
        .keys()
        .filter_map(|n| agent.address("default", n))
        .map(|ip| format!("http://{ip}:2379"))
        .collect();
    assert_eq!(endpoints.len(), 3);
    let ids = member_list(&endpoints[0]);
    let leader = status["leader"]
        .as_str()
        .context("no leader in status")?
        .to_owned();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = etcd_operator_tests::writer::start_writer(endpoints.clone(), None, stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = std::time::Instant::now();
    kubectl(
        &op,
        &[
            "patch",
            "etcdcluster",
            name,
            "--type=merge",
            "-p",
            r#"{"spec":{"podTemplate":{"spec":{"resources":{"requests":{"cpu":"100m","memory":"256Mi"},"limits":{"memory":"512Mi"}}}}}}"#,
        ],
        None,
    )?;
    // Follow the Pods: the order in which each member's Pod went away (deleted for the
    // re-creation), and every uid each member had.
    let mut order: Vec<String> = Vec::new();
    let mut uids: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = original
        .iter()
        .map(|(n, u)| (n.clone(), [u.clone()].into()))
        .collect();
    let deadline = tokio::time::Instant::now() + TIMEOUT * 2;
    let status = loop {
        let now = pods_of(&kube_api, name);
        for member in original.keys() {
            let pod = now.iter().find(|p| &name_of(p) == member);
            let replaced = pod.is_none_or(|p| {
                uid_of(p) != original[member] || p["metadata"]["deletionTimestamp"].is_string()
            });
            if replaced && !order.contains(member) {
                order.push(member.clone());
            }
            if let Some(p) = pod
                && let Some(set) = uids.get_mut(member)
            {
                set.insert(uid_of(p));
            }
        }
        let s = etcd_operator_tests::kubectl::status(&op, "ec", name)?;
        if s["rollout"]["phase"] == "Complete" && available(&s, 3) && now.len() == 3 && now.iter().all(ready)
        {
            break s;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the rollout did not complete within {:?}: {s:#}",
            TIMEOUT * 2
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let writes = writer.await?;
    eprintln!(
        "node agent e2e: template rollout of 3 members in {:.1} s under a writer: {} writes acknowledged, {} failed attempts, longest write gap {:.2} s; order {order:?}, leader before {leader}",
        took.as_secs_f64(),
        writes.acknowledged.len(),
        writes.failures,
        writes.longest_gap.as_secs_f64()
    );

    // Every member re-created once, the leader last, on its own data.
    assert_eq!(order.len(), 3, "{order:?}");
    assert_eq!(order.last(), Some(&leader), "the leader goes last: {order:?}");
    for (member, seen) in &uids {
        assert_eq!(
            seen.len(),
            2,
            "member {member} had Pods {seen:?}: re-created exactly once"
        );
    }
    assert_eq!(member_list(&endpoints[0]), ids, "the same members: data kept");
    let pods = pods_of(&kube_api, name);
    let after = status["rollout"]["templateHash"]
        .as_str()
        .context("no rollout hash")?;
    assert_ne!(after, before);
    assert_eq!(status["rollout"]["updatedMembers"], 3, "{status:#}");
    for pod in &pods {
        assert_eq!(template_of(pod).as_deref(), Some(after), "{pod:#}");
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["limits"]["memory"], "512Mi",
            "{pod:#}"
        );
    }
    assert!(!writes.acknowledged.is_empty());
    etcd_operator_tests::writer::assert_no_write_lost(&endpoints, None, &writes).await;
    etcd_operator_tests::writer::assert_hash_kv_agrees(&endpoints).await;

    // Settled: the controller says nothing is in progress, and no Pod was re-created since.
    wait_for(
        &op,
        Watched::status("ec", name),
        "the cluster settled",
        TIMEOUT,
        |s| etcd_operator_tests::kubectl::condition(s, "Progressing").is_some_and(|c| c["status"] == "False"),
    )
    .await?;
    let still: std::collections::BTreeSet<String> = pods_of(&kube_api, name).iter().map(uid_of).collect();
    let settled: std::collections::BTreeSet<String> = pods.iter().map(uid_of).collect();
    assert_eq!(still, settled, "no Pod re-created after the rollout completed");
    Ok(())
}

/// Growing `spec.storage.size`: with a StorageClass that allows expansion every claim grows, the
/// members restart one at a time for the filesystem (the node agent's stand-in driver grows it
/// on mount) and roll onto the quota that follows the size, data kept. With a class that does
/// not, the cluster says so (Warning Event, `Degraded` with `VolumeExpansionNotAllowed`) and
/// nothing else changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_grows_member_volumes_when_the_storage_class_allows_it() -> anyhow::Result<()> {
    let Some(hosts) =
        private_hosts::enter("kubernetes_runtime_grows_member_volumes_when_the_storage_class_allows_it")?
    else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_34)?;
    let Cluster {
        kube_api,
        agent,
        op,
        dir: _dir,
    } = Cluster::start(hosts).await?;
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(kube_api.client()?);
    for (class, expandable) in [("expandable", true), ("fixed", false)] {
        let sc: k8s_openapi::api::storage::v1::StorageClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": class},
            "provisioner": "test.local/agent",
            "allowVolumeExpansion": expandable,
        }))?;
        classes.create(&Default::default(), &sc).await?;
    }
    let with_class = |name: &str, replicas: u32, class: &str| {
        format!(
            "{}  storage:\n    size: 1Gi\n    storageClassName: {class}\n",
            cluster_yaml(name, replicas, "3.5.34")
        )
    };
    let claims_of = |cluster: &str| -> Vec<Value> {
        kube_api
            .objects("persistentvolumeclaims")
            .into_iter()
            .filter(|c| c["metadata"]["labels"]["etcd.operator.dev/cluster"] == cluster)
            .collect()
    };
    let grow = |name: &str| {
        kubectl(
            &op,
            &[
                "patch",
                "etcdcluster",
                name,
                "--type=merge",
                "-p",
                r#"{"spec":{"storage":{"size":"2Gi"}}}"#,
            ],
            None,
        )
    };

    // A class without expansion: refused, said, nothing else changes.
    apply(&op, &with_class("fx", 1, "fixed"))?;
    wait_available(&op, "fx", 1, "1 member on the fixed class", TIMEOUT).await;
    let pods_before: Vec<Value> = wait_pods_ready(&kube_api, "fx", 1).await?;
    grow("fx")?;
    let status = wait_for(
        &op,
        Watched::status("ec", "fx"),
        "the refusal in status",
        TIMEOUT,
        |s| {
            etcd_operator_tests::kubectl::condition(s, "Degraded")
                .is_some_and(|c| c["status"] == "True" && c["reason"] == "VolumeExpansionNotAllowed")
        },
    )
    .await?;
    let degraded = etcd_operator_tests::kubectl::condition(&status, "Degraded")
        .cloned()
        .unwrap_or_default();
    assert!(
        degraded["message"]
            .as_str()
            .is_some_and(|m| m.contains("StorageClass fixed does not set allowVolumeExpansion: true")),
        "{degraded:#}"
    );
    // The Event is recorded beside the status, not before it: wait for it too.
    let warned = || {
        kube_api
            .objects("events")
            .iter()
            .any(|e| e["reason"] == "VolumeExpansionNotAllowed" && e["type"] == "Warning")
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !warned() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no Warning Event: {:#?}",
            kube_api.objects("events")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let claims = claims_of("fx");
    assert_eq!(
        claims[0]["spec"]["resources"]["requests"]["storage"], "1Gi",
        "{claims:#?}"
    );
    let pods_after = pods_of(&kube_api, "fx");
    assert_eq!(
        pods_after
            .iter()
            .map(|p| p["metadata"]["uid"].clone())
            .collect::<Vec<_>>(),
        pods_before
            .iter()
            .map(|p| p["metadata"]["uid"].clone())
            .collect::<Vec<_>>(),
        "the member was not touched"
    );
    assert!(available(&status, 1), "{status:#}");

    // A class with expansion: every claim grows, the data stays.
    let mut phase = Phase::start();
    apply(&op, &with_class("gr", 3, "expandable"))?;
    wait_available(&op, "gr", 3, "3 members on the expandable class", TIMEOUT).await;
    let pods = wait_pods_ready(&kube_api, "gr", 3).await?;
    let ip = agent
        .address(
            "default",
            pods[0]["metadata"]["name"].as_str().unwrap_or_default(),
        )
        .context("first member address")?;
    let endpoint = format!("http://{ip}:2379");
    etcdctl_ok(&endpoint, &["put", "kept", "across-the-resize"]);
    let ids = member_list(&endpoint);
    assert!(
        claims_of("gr")
            .iter()
            .all(|c| c["status"]["capacity"]["storage"] == "1Gi"),
        "{:#?}",
        claims_of("gr")
    );
    phase.restart();
    grow("gr")?;
    let deadline = tokio::time::Instant::now() + TIMEOUT * 2;
    loop {
        let claims = claims_of("gr");
        let grown = claims.len() == 3
            && claims.iter().all(|c| {
                c["spec"]["resources"]["requests"]["storage"] == "2Gi"
                    && c["status"]["capacity"]["storage"] == "2Gi"
                    && c["status"]["conditions"].as_array().is_none_or(Vec::is_empty)
            });
        let s = etcd_operator_tests::kubectl::status(&op, "ec", "gr")?;
        // The restarts for the filesystem create the Pods from the spec as it is now, so they
        // carry the quota that follows the size too (no second restart for the template).
        let on_quota = pods_of(&kube_api, "gr").iter().filter(|p| ready(p)).count() == 3
            && pods_of(&kube_api, "gr").iter().all(|p| {
                p["spec"]["containers"][0]["command"]
                    .to_string()
                    .contains("--quota-backend-bytes=1610612736")
            });
        if grown && on_quota && available(&s, 3) {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the volumes did not grow within {:?}: {claims:#?} {s:#}",
            TIMEOUT * 2
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    phase.done("grew 3 member volumes 1Gi -> 2Gi (a restart each for the filesystem, onto the new quota)");
    assert_eq!(member_list(&endpoint), ids, "the same members");
    let pods = wait_pods_ready(&kube_api, "gr", 3).await?;
    for pod in &pods {
        let ip = agent
            .address("default", pod["metadata"]["name"].as_str().unwrap_or_default())
            .context("member address")?;
        assert_eq!(
            etcdctl_ok(
                &format!("http://{ip}:2379"),
                &["get", "kept", "--print-value-only"]
            )
            .trim(),
            "across-the-resize"
        );
        // The default quota follows the size (3/4 of 2Gi).
        let command = pod["spec"]["containers"][0]["command"].to_string();
        assert!(command.contains("--quota-backend-bytes=1610612736"), "{command}");
    }
    Ok(())
}

/// A namespace-scoped controller (`--watch-namespaces default`, as the chart's `watchNamespaces`
/// sets it): a cluster in `default` runs as usual through namespaced watches; one created in
/// another namespace is stored, gets `Managed=False` and a Warning Event, no finalizer, and
/// nothing is created for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_scoped_controller_says_so_on_clusters_it_does_not_manage() -> anyhow::Result<()> {
    let Some(hosts) =
        private_hosts::enter("a_namespace_scoped_controller_says_so_on_clusters_it_does_not_manage")?
    else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_34)?;
    let Cluster {
        kube_api,
        agent: _agent,
        op,
        dir: _dir,
    } = Cluster::start_with(
        hosts,
        vec![("ETCD_OPERATOR_WATCH_NAMESPACES".to_owned(), "default".to_owned())],
    )
    .await?;
    apply(&op, &cluster_yaml("in", 1, "3.5.34"))?;
    let elsewhere = cluster_yaml("out", 1, "3.5.34").replace("namespace: default", "namespace: team-c");
    apply(&op, &elsewhere)?;
    wait_available(&op, "in", 1, "the cluster in the watched namespace", TIMEOUT).await;
    wait_pods_ready(&kube_api, "in", 1).await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let out = loop {
        let got = etcd_operator_tests::kubectl::output(
            &op,
            &["get", "ec", "out", "-n", "team-c", "-o", "json"],
            None,
        )?;
        let o: Value = serde_json::from_slice(&got.stdout).unwrap_or_default();
        if etcd_operator_tests::kubectl::condition(&o["status"], "Managed")
            .is_some_and(|c| c["status"] == "False" && c["reason"] == "NamespaceNotWatched")
        {
            break o;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the unmanaged cluster did not say so: {o:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let managed = etcd_operator_tests::kubectl::condition(&out["status"], "Managed")
        .cloned()
        .unwrap_or_default();
    assert!(
        managed["message"]
            .as_str()
            .is_some_and(|m| m.contains("only in the namespaces default")),
        "{managed:#}"
    );
    assert!(
        out["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty),
        "an unmanaged cluster gets no finalizer: {out:#}"
    );
    assert_eq!(
        etcd_operator_tests::kubectl::condition(&out["status"], "Stalled").map(|c| c["status"].clone()),
        Some(Value::from("True"))
    );
    let warned = || {
        kube_api.objects("events").into_iter().any(|e| {
            e["reason"] == "NamespaceNotWatched"
                && e["type"] == "Warning"
                && e["metadata"]["namespace"] == "team-c"
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !warned() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no Warning Event on the unmanaged cluster: {:#?}",
            kube_api.objects("events")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(pods_of(&kube_api, "out").is_empty(), "nothing is created for it");
    assert!(
        kube_api
            .objects("persistentvolumeclaims")
            .iter()
            .all(|c| c["metadata"]["namespace"] != "team-c")
    );
    // Deleting it is not held up.
    kubectl(
        &op,
        &[
            "delete",
            "etcdcluster",
            "out",
            "-n",
            "team-c",
            "--wait=true",
            "--timeout=30s",
        ],
        None,
    )?;
    Ok(())
}

/// A cluster restored from a snapshot on a volume claim in its namespace: each member Pod's
/// fetch step mounts the claim read-only and reads the snapshot from it (the node agent mounts
/// the claim's directory), then the etcd image's tool restores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_restores_from_a_snapshot_on_a_volume_claim() -> anyhow::Result<()> {
    let Some(hosts) = private_hosts::enter("kubernetes_runtime_restores_from_a_snapshot_on_a_volume_claim")?
    else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_16)?;
    tools::etcdutl(EtcdVersion::V3_5_16)?;
    let Cluster {
        kube_api,
        agent: _agent,
        op,
        dir: _dir,
    } = Cluster::start(hosts).await?;
    apply(&op, &cluster_yaml("src", 1, "3.5.16"))?;
    let src = wait_available(&op, "src", 1, "the source cluster", TIMEOUT).await;
    let src_endpoint = etcd_operator_tests::local_cluster::endpoints(&src)[0].clone();
    for i in 0..10 {
        etcdctl_ok(&src_endpoint, &["put", &format!("k{i:02}"), &format!("v{i}")]);
    }
    // A claim holding a snapshot (as a volume backup left it): the node agent keeps a claim's
    // data in <root>/volumes/<namespace>/<claim>.
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "backups", "namespace": "default"},
            "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}},
        }))?;
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(kube_api.client()?, "default")
        .create(&Default::default(), &claim)
        .await?;
    let claim_dir = _dir.path().join("node/volumes/default/backups/prod");
    std::fs::create_dir_all(&claim_dir)?;
    etcdctl_ok(
        &src_endpoint,
        &[
            "snapshot",
            "save",
            &claim_dir.join("snap.db").display().to_string(),
        ],
    );
    etcdctl_ok(&src_endpoint, &["put", "after", "the-snapshot"]);

    let mut phase = Phase::start();
    apply(
        &op,
        &format!(
            "{}  bootstrap:\n    restore:\n      source:\n        destination:\n          volume:\n            claimName: backups\n        key: prod/snap.db\n",
            cluster_yaml("dst", 3, "3.5.16")
        ),
    )?;
    let dst = wait_available(&op, "dst", 3, "the cluster restored from the claim", TIMEOUT).await;
    phase.done("3 members restored from a snapshot on a volume claim and Available");
    for endpoint in etcd_operator_tests::local_cluster::endpoints(&dst) {
        for i in [0, 9] {
            let value = etcdctl_ok(&endpoint, &["get", &format!("k{i:02}"), "--print-value-only"]);
            assert_eq!(value.trim(), format!("v{i}"), "{endpoint}");
        }
        let after = etcdctl_ok(&endpoint, &["get", "after", "--print-value-only"]);
        assert_eq!(after.trim(), "", "{endpoint}: a key written after the snapshot");
    }
    // The bootstrap members fetched it through the read-only claim mount.
    let restored: Vec<Value> = pods_of(&kube_api, "dst")
        .into_iter()
        .filter(|p| {
            p["spec"]["volumes"].as_array().is_some_and(|v| {
                v.iter().any(|v| {
                    v["persistentVolumeClaim"]["claimName"] == "backups"
                        && v["persistentVolumeClaim"]["readOnly"] == true
                })
            })
        })
        .collect();
    assert!(
        !restored.is_empty(),
        "no member mounted the claim: {:#?}",
        pods_of(&kube_api, "dst")
    );
    for pod in &restored {
        assert_eq!(
            pod["status"]["initContainerStatuses"][0]["name"], "restore-fetch",
            "{pod:#}"
        );
        assert_eq!(
            pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"], 0,
            "{pod:#}"
        );
    }
    Ok(())
}

/// TLS on both planes through the kubernetes runtime: `auto` CA and member certificates in
/// Secrets, mounted into the Pods (the node agent writes them out), members serving HTTPS for
/// their `.svc` names and requiring client certificates; the operator reaches them with its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_serves_tls_members_from_secrets() -> anyhow::Result<()> {
    let Some(hosts) = private_hosts::enter("kubernetes_runtime_serves_tls_members_from_secrets")? else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_34)?;
    let Cluster {
        kube_api,
        agent,
        op,
        dir: _dir,
    } = Cluster::start(hosts).await?;
    let name = "secure";
    apply(
        &op,
        &format!(
            "{}  tls:\n    client: {{auto: {{}}}}\n    peer: {{auto: {{}}}}\n",
            cluster_yaml(name, 3, "3.5.34")
        ),
    )?;
    let status = wait_available(&op, name, 3, "3 TLS members Available", TIMEOUT).await;
    let endpoints = etcd_operator_tests::local_cluster::endpoints(&status);
    assert!(
        endpoints.iter().all(|e| e.starts_with("https://")),
        "{endpoints:?}"
    );
    let pods = wait_pods_ready(&kube_api, name, 3).await?;
    for pod in &pods {
        let command: Vec<&str> = pod["spec"]["containers"][0]["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert!(command.contains(&"--client-cert-auth=true"), "{command:?}");
        assert!(command.contains(&"--peer-client-cert-auth=true"), "{command:?}");
        assert!(
            pod["spec"]["volumes"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v.get("secret").is_some())),
            "{pod}"
        );
    }
    let secrets = kube_api.objects("secrets");
    assert!(secrets.len() >= 2, "CA and member Secrets: {}", secrets.len());
    // A client without a certificate gets no answer from a member.
    let ip = agent
        .address(
            "default",
            pods[0]["metadata"]["name"].as_str().unwrap_or_default(),
        )
        .context("address")?;
    let plain = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?
        .get(format!("https://{ip}:2379/version"))
        .send()
        .await;
    assert!(
        plain.is_err(),
        "a member answered a client without a certificate: {plain:?}"
    );

    // A fourth member gets its certificate and joins over mutual TLS.
    kubectl(&op, &["scale", "etcdcluster", name, "--replicas=4"], None)?;
    wait_available(&op, name, 4, "4 TLS members", TIMEOUT).await;
    let before: Vec<Value> = wait_pods_ready(&kube_api, name, 4)
        .await?
        .iter()
        .map(|p| p["metadata"]["uid"].clone())
        .collect();

    // Rotation on demand: every member's certificates are issued again under the new value and
    // its Pod is recreated on them, one member at a time.
    let mut phase = Phase::start();
    kubectl(
        &op,
        &[
            "annotate",
            "ec",
            name,
            "etcd.operator.dev/rotate-certificates=r1",
            "--overwrite",
        ],
        None,
    )?;
    let deadline = tokio::time::Instant::now() + TIMEOUT * 2;
    loop {
        let secrets = kube_api.objects("secrets");
        let member_secrets: Vec<&Value> = secrets
            .iter()
            .filter(|s| s["metadata"]["labels"].get("etcd.operator.dev/member").is_some())
            .collect();
        let rotated = member_secrets.len() == 4
            && member_secrets
                .iter()
                .all(|s| s["metadata"]["annotations"]["etcd.operator.dev/certificate-rotation"] == "r1");
        let pods = pods_of(&kube_api, name);
        let restarted = pods.len() == 4
            && pods
                .iter()
                .all(|p| ready(p) && !before.contains(&p["metadata"]["uid"]));
        let status = etcd_operator_tests::kubectl::status(&op, "ec", name)?;
        if rotated && restarted && available(&status, 4) {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "rotation r1 not done: {} member Secrets, rotated {rotated}, Pods restarted {restarted}; {status}",
            member_secrets.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    phase.done("rotated the certificates of 4 TLS members");
    Ok(())
}

/// 3.6 → 3.5 through the kubernetes runtime: etcd's downgrade enabled before the first Pod is
/// re-created, then every member's Pod re-created on the 3.5 image in the roll order, data kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_downgrades_3_6_to_3_5_through_etcds_downgrade() -> anyhow::Result<()> {
    let Some(hosts) =
        private_hosts::enter("kubernetes_runtime_downgrades_3_6_to_3_5_through_etcds_downgrade")?
    else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_6_15)?;
    tools::etcd(EtcdVersion::V3_5_34)?;
    let Cluster {
        kube_api,
        agent,
        op,
        dir: _dir,
    } = Cluster::start(hosts).await?;
    let name = "dg";
    apply(&op, &cluster_yaml(name, 3, "3.6.15"))?;
    wait_available(&op, name, 3, "3 members on 3.6.15", TIMEOUT).await;
    let pods = wait_pods_ready(&kube_api, name, 3).await?;
    let endpoint = format!(
        "http://{}:2379",
        agent
            .address(
                "default",
                pods[0]["metadata"]["name"].as_str().unwrap_or_default()
            )
            .context("address")?
    );
    etcdctl_ok(&endpoint, &["put", "kept", "through-the-downgrade"]);
    let before = member_list(&endpoint);
    let mut phase = Phase::start();
    kubectl(
        &op,
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
    let mut phases: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + TIMEOUT * 2;
    loop {
        let s = etcd_operator_tests::kubectl::status(&op, "ec", name)?;
        if let Some(p) = s["upgrade"]["downgrade"].as_str()
            && phases.last().map(String::as_str) != Some(p)
        {
            phases.push(p.to_owned());
        }
        if s["upgrade"]["phase"] == "Complete" && available(&s, 3) {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the downgrade did not complete: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    phase.done(&format!(
        "downgraded 3 members 3.6.15 -> 3.5.34 (status.upgrade.downgrade seen: {phases:?})"
    ));
    assert_eq!(phases.last().map(String::as_str), Some("Complete"), "{phases:?}");
    let pods = wait_pods_ready(&kube_api, name, 3).await?;
    assert!(
        pods.iter().all(|p| p["spec"]["containers"][0]["image"]
            .as_str()
            .is_some_and(|i| i.ends_with(":v3.5.34"))),
        "{pods:#?}"
    );
    assert_eq!(member_versions(&agent, &pods), vec!["3.5.34"; 3]);
    let endpoint = format!(
        "http://{}:2379",
        agent
            .address(
                "default",
                pods[0]["metadata"]["name"].as_str().unwrap_or_default()
            )
            .context("address")?
    );
    assert_eq!(member_list(&endpoint), before, "the same members, on their data");
    let got = std::process::Command::new(tools::etcdctl(EtcdVersion::V3_5_16)?)
        .env("ETCDCTL_API", "3")
        .args([
            format!("--endpoints={endpoint}"),
            "get".into(),
            "kept".into(),
            "--print-value-only".into(),
        ])
        .output()?;
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "through-the-downgrade"
    );
    Ok(())
}

/// The text of a key of a Secret as the fake API stores it (base64 in `data`).
fn secret_key(secret: &Value, key: &str) -> Option<String> {
    use base64::Engine as _;
    let encoded = secret["data"][key].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
    String::from_utf8(bytes).ok()
}

/// The Secret named `name`, as stored now.
fn secret_named(kube: &FakeKube, name: &str) -> Option<Value> {
    kube.objects("secrets")
        .into_iter()
        .find(|s| s["metadata"]["name"] == name)
}

/// A client identity as a user would hold one: a certificate issued now by the client CA
/// Secret's issuing CA, trusting the bundle that Secret publishes (`ca.crt`).
fn client_identity_from(kube: &FakeKube, cluster: &str) -> Option<etcd_client::TlsOptions> {
    use etcd_operator_controller::tls::ca::{CertificateAuthority, LeafSpec};
    let secret = secret_named(kube, &format!("{cluster}-client-ca"))?;
    let ca = CertificateAuthority::load(&secret_key(&secret, "tls.crt")?, &secret_key(&secret, "tls.key")?)
        .ok()?;
    let pair = ca.issue(&LeafSpec::client("e2e-writer", &[])).ok()?;
    Some(
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(secret_key(&secret, "ca.crt")?))
            .identity(etcd_client::Identity::from_pem(pair.cert_pem, pair.key_pem)),
    )
}

/// Whether the member at `endpoint` answers a status call from a client with `tls`.
async fn answers(endpoint: &str, tls: etcd_client::TlsOptions) -> bool {
    let options = etcd_client::ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(2));
    match etcd_client::Client::connect([endpoint], Some(options)).await {
        Ok(mut c) => c.status().await.is_ok(),
        Err(_) => false,
    }
}

/// CA rotation through the kubernetes runtime: asked with `etcd.operator.dev/rotate-ca`, each
/// plane's CA Secret goes through trusting (old and new in `ca.crt`), reissuing (the new CA
/// issues) and steady (only the new CA), every member Pod re-created between the phases one at a
/// time. A writer whose identity follows the CA Secret (as one from cert-manager's CA issuer
/// would) keeps writing; at the end no member trusts the old CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_rotates_the_cluster_cas_under_a_tls_writer() -> anyhow::Result<()> {
    let Some(hosts) = private_hosts::enter("kubernetes_runtime_rotates_the_cluster_cas_under_a_tls_writer")?
    else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_34)?;
    let Cluster {
        kube_api,
        agent: _agent,
        op,
        dir: _dir,
    } = Cluster::start(hosts).await?;
    let name = "rca";
    apply(
        &op,
        &format!(
            "{}  tls:\n    client: {{auto: {{}}}}\n    peer: {{auto: {{}}}}\n",
            cluster_yaml(name, 3, "3.5.34")
        ),
    )?;
    let status = wait_available(&op, name, 3, "3 TLS members Available", TIMEOUT).await;
    let endpoints = etcd_operator_tests::local_cluster::endpoints(&status);
    let pods = wait_pods_ready(&kube_api, name, 3).await?;
    let uid_of = |pod: &Value| pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    let before: std::collections::BTreeSet<String> = pods.iter().map(uid_of).collect();
    let old_client = secret_named(&kube_api, &format!("{name}-client-ca"))
        .and_then(|s| secret_key(&s, "tls.crt"))
        .context("no client CA")?;
    let old_client_key =
        secret_named(&kube_api, &format!("{name}-client-ca")).and_then(|s| secret_key(&s, "tls.key"));
    let old_peer = secret_named(&kube_api, &format!("{name}-peer-ca"))
        .and_then(|s| secret_key(&s, "tls.crt"))
        .context("no peer CA")?;
    // A client certificate of the old CA, kept by a client that never renews: accepted now.
    let stale = client_identity_from(&kube_api, name).context("no identity")?;
    for ep in &endpoints {
        anyhow::ensure!(
            answers(ep, stale.clone()).await,
            "{ep} refused a certificate of its own CA"
        );
    }

    let identity = std::sync::Arc::new(std::sync::Mutex::new(client_identity_from(&kube_api, name)));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let identity = identity.clone();
        etcd_operator_tests::writer::start_reloading_writer(
            endpoints.clone(),
            move || identity.lock().ok().and_then(|i| i.clone()),
            stop.clone(),
        )
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = std::time::Instant::now();
    kubectl(
        &op,
        &["annotate", "ec", name, "etcd.operator.dev/rotate-ca=r1"],
        None,
    )?;
    let mut phases: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + TIMEOUT * 3;
    let status = loop {
        // The identity follows the CA Secret, as a mounted Secret would.
        if let Some(fresh) = client_identity_from(&kube_api, name)
            && let Ok(mut held) = identity.lock()
        {
            *held = Some(fresh);
        }
        let cas: Vec<Value> = [format!("{name}-client-ca"), format!("{name}-peer-ca")]
            .iter()
            .filter_map(|n| secret_named(&kube_api, n))
            .collect();
        let phase = match cas.first() {
            Some(ca) if ca["data"].get("next.crt").is_some() => "trusting",
            Some(ca) if ca["data"].get("previous.crt").is_some() => "reissuing",
            _ => "steady",
        };
        if phases.last().map(String::as_str) != Some(phase) {
            phases.push(phase.to_owned());
        }
        let done = cas.len() == 2
            && cas.iter().all(|ca| {
                ca["metadata"]["annotations"]["etcd.operator.dev/ca-rotation"] == "r1"
                    && ca["data"].get("next.crt").is_none()
                    && ca["data"].get("previous.crt").is_none()
            });
        let member_secrets: Vec<Value> = kube_api
            .objects("secrets")
            .into_iter()
            .filter(|s| s["metadata"]["labels"].get("etcd.operator.dev/member").is_some())
            .collect();
        let trust_new_only = member_secrets.len() == 3
            && member_secrets.iter().all(|s| {
                let client = secret_key(s, "client-ca.crt").unwrap_or_default();
                let peer = secret_key(s, "peer-ca.crt").unwrap_or_default();
                !client.is_empty() && !client.contains(old_client.trim()) && !peer.contains(old_peer.trim())
            });
        let now = pods_of(&kube_api, name);
        let s = etcd_operator_tests::kubectl::status(&op, "ec", name)?;
        if done && trust_new_only && now.len() == 3 && now.iter().all(ready) && available(&s, 3) {
            break s;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the CA rotation did not end: phases {phases:?}, CAs done {done}, members trust only the new CAs {trust_new_only}; {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let writes = writer.await?;
    eprintln!(
        "node agent e2e: CA rotation of 3 members in {:.1} s under a TLS writer (phases seen {phases:?}): {} writes acknowledged, {} failed attempts, {} reconnects, longest write gap {:.2} s",
        took.as_secs_f64(),
        writes.acknowledged.len(),
        writes.failures,
        writes.reconnects,
        writes.longest_gap.as_secs_f64()
    );
    assert_eq!(phases.first().map(String::as_str), Some("steady"));
    assert!(phases.contains(&"reissuing".to_owned()), "{phases:?}");
    assert!(writes.acknowledged.len() > 10, "the writer hardly wrote");
    assert!(
        writes.longest_gap < Duration::from_secs(5),
        "the writer failed for {:?}: {:?}",
        writes.longest_gap,
        writes.failure_log.iter().rev().take(5).collect::<Vec<_>>()
    );
    // Every Pod re-created, every certificate from the new CAs, the old ones trusted nowhere.
    let after: std::collections::BTreeSet<String> = pods_of(&kube_api, name).iter().map(uid_of).collect();
    assert!(
        after.is_disjoint(&before),
        "a Pod was never re-created: {before:?} {after:?}"
    );
    let new_client = secret_named(&kube_api, &format!("{name}-client-ca"))
        .and_then(|s| secret_key(&s, "tls.crt"))
        .context("no client CA")?;
    assert_ne!(new_client, old_client);
    for s in kube_api
        .objects("secrets")
        .iter()
        .filter(|s| s["metadata"]["labels"].get("etcd.operator.dev/member").is_some())
    {
        let server = secret_key(s, "server.crt").unwrap_or_default();
        assert!(
            etcd_operator_controller::tls::member::issued_by(&server, &new_client),
            "{}",
            s["metadata"]["name"]
        );
    }
    // A certificate of the old CA, offered with the trust of the new one: refused by every member.
    let old_key = old_client_key.context("no old CA key")?;
    let old_ca = etcd_operator_controller::tls::ca::CertificateAuthority::load(&old_client, &old_key)?;
    let kept = old_ca.issue(&etcd_operator_controller::tls::ca::LeafSpec::client("kept", &[]))?;
    let bundle = secret_named(&kube_api, &format!("{name}-client-ca"))
        .and_then(|s| secret_key(&s, "ca.crt"))
        .context("no bundle")?;
    let stale = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(bundle))
        .identity(etcd_client::Identity::from_pem(kept.cert_pem, kept.key_pem));
    for ep in &endpoints {
        assert!(
            !answers(ep, stale.clone()).await,
            "{ep} still accepts a certificate of the old CA"
        );
    }
    let fresh = client_identity_from(&kube_api, name).context("no identity")?;
    etcd_operator_tests::writer::assert_no_write_lost(&endpoints, Some(&fresh), &writes).await;
    let events = kube_api.objects("events");
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "CertificateAuthorityRotating"),
        "no CertificateAuthorityRotating Event"
    );
    assert_eq!(
        etcd_operator_tests::kubectl::condition(&status, "Degraded").map(|c| c["status"].clone()),
        Some(Value::from("False"))
    );
    Ok(())
}

/// Quorum recovery through the kubernetes runtime: two of three members lose their data (killed,
/// their data directories replaced by files, so they cannot start again). Nothing happens until
/// people ask with the recover-quorum annotation; then the other members are removed with their
/// volume claims released, the survivor starts with `--force-new-cluster`, starts again without
/// it before members are added back, and the cluster grows back to three with the survivor's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_rebuilds_a_cluster_that_lost_quorum_when_asked() -> anyhow::Result<()> {
    let Some(hosts) =
        private_hosts::enter("kubernetes_runtime_rebuilds_a_cluster_that_lost_quorum_when_asked")?
    else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_34)?;
    let Cluster {
        kube_api,
        agent,
        op,
        dir: _dir,
    } = Cluster::start(hosts).await?;
    let name = "lost";
    apply(&op, &cluster_yaml(name, 3, "3.5.34"))?;
    let status = wait_available(&op, name, 3, "3 members", TIMEOUT).await;
    let members = etcd_operator_tests::local_cluster::member_names(&status);
    let (survivor, destroyed) = (members[0].clone(), members[1..].to_vec());
    let survivor_ip = agent.address("default", &survivor).context("survivor address")?;
    let survivor_endpoint = format!("http://{survivor_ip}:2379");
    etcdctl_ok(&survivor_endpoint, &["put", "survives", "the-outage"]);

    for member in &destroyed {
        let data = _dir
            .path()
            .join("node/volumes/default")
            .join(format!("{member}-data"))
            .join("data");
        let pid = agent.pid("default", member).context("a running member")?;
        etcd_operator_tests::local_cluster::sigkill(pid);
        std::fs::remove_dir_all(&data)?;
        std::fs::write(&data, "not a data directory")?;
    }
    wait_for(
        &op,
        Watched::status("ec", name),
        "the quorum loss reported",
        TIMEOUT,
        |s| etcd_operator_tests::kubectl::condition(s, "Available").is_some_and(|c| c["status"] == "False"),
    )
    .await?;
    etcd_operator_tests::kubectl::wait_reconciles(
        &op,
        3,
        "three looks at the cluster without quorum",
        TIMEOUT,
    )
    .await
    .map_err(anyhow::Error::msg)?;
    assert_eq!(
        pods_of(&kube_api, name).len(),
        3,
        "members changed without a request"
    );

    kubectl(
        &op,
        &["annotate", "ec", name, "etcd.operator.dev/recover-quorum=auto"],
        None,
    )?;
    let mut phase = Phase::start();
    let status = wait_for(
        &op,
        Watched::status("ec", name),
        "rebuilt and grown back to 3",
        TIMEOUT * 2,
        |s| available(s, 3) && s["recovery"].is_object(),
    )
    .await?;
    phase.done("quorum recovered and grown back to 3 members");
    assert_eq!(status["recovery"]["survivor"], survivor.as_str(), "{status}");
    let names = etcd_operator_tests::local_cluster::member_names(&status);
    assert!(names.contains(&survivor), "{names:?}");
    assert!(
        destroyed.iter().all(|d| !names.contains(d)),
        "lost members are gone: {names:?}"
    );
    let pods = wait_pods_ready(&kube_api, name, 3).await?;
    assert!(
        pods.iter().all(|p| p["metadata"]["annotations"]
            .get("etcd.operator.dev/force-new-cluster")
            .is_none()),
        "a Pod still runs with --force-new-cluster: {pods:#?}"
    );
    for pod in &pods {
        let ip = agent
            .address("default", pod["metadata"]["name"].as_str().unwrap_or_default())
            .context("address")?;
        let value = etcdctl_ok(
            &format!("http://{ip}:2379"),
            &["get", "survives", "--print-value-only"],
        );
        assert_eq!(value.trim(), "the-outage");
    }
    assert_eq!(member_list(&survivor_endpoint).len(), 3);
    let events = kube_api.objects("events");
    assert!(
        events.iter().any(|e| e["reason"] == "QuorumRecovered"),
        "no QuorumRecovered Event: {events:#?}"
    );
    // The lost members' volume claims were released, not deleted.
    let claims: Vec<String> = kube_api
        .objects("persistentvolumeclaims")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    for member in &destroyed {
        assert!(claims.contains(&format!("{member}-data")), "{member}: {claims:?}");
    }
    Ok(())
}

/// Backup and restore through the kubernetes runtime: an EtcdBackup of a cluster whose members
/// run as Pods goes to S3; a new cluster restored from it starts its members with the restore
/// init containers (`etcd-operator fetch-snapshot` with the S3 keys from a Secret, the etcd
/// image's `etcdutl snapshot restore`, `etcd-operator finish-restore`) and serves the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_restores_from_s3_through_init_containers() -> anyhow::Result<()> {
    let Some(hosts) = private_hosts::enter("kubernetes_runtime_restores_from_s3_through_init_containers")?
    else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_16)?;
    tools::etcdutl(EtcdVersion::V3_5_16)?;
    let s3 = etcd_operator_tests::S3Server::start().await?;
    s3.create_bucket("restores").await?;
    let keys = vec![
        (
            "AWS_ACCESS_KEY_ID".to_owned(),
            etcd_operator_tests::s3::ACCESS_KEY.to_owned(),
        ),
        (
            "AWS_SECRET_ACCESS_KEY".to_owned(),
            etcd_operator_tests::s3::SECRET_KEY.to_owned(),
        ),
    ];
    let Cluster {
        kube_api,
        agent,
        op,
        dir: _dir,
    } = Cluster::start_with(hosts, keys).await?;
    // The member Pods' fetch step reads the keys from this Secret.
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s3-keys", "namespace": "default"},
        "data": {
            "AWS_ACCESS_KEY_ID": base64_of(etcd_operator_tests::s3::ACCESS_KEY),
            "AWS_SECRET_ACCESS_KEY": base64_of(etcd_operator_tests::s3::SECRET_KEY),
        },
    }))?;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(kube_api.client()?, "default")
        .create(&Default::default(), &secret)
        .await?;

    apply(&op, &cluster_yaml("src", 1, "3.5.16"))?;
    let src = wait_available(&op, "src", 1, "the source cluster", TIMEOUT).await;
    let src_endpoint = etcd_operator_tests::local_cluster::endpoints(&src)[0].clone();
    for i in 0..20 {
        etcdctl_ok(&src_endpoint, &["put", &format!("k{i:02}"), &format!("v{i}")]);
    }
    apply(
        &op,
        &format!(
            "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdBackup\nmetadata:\n  name: b1\n  namespace: default\nspec:\n  clusterName: src\n  destination:\n    s3:\n      bucket: restores\n      endpoint: {}\n      region: {}\n      forcePathStyle: true\n      credentialsSecret: s3-keys\n",
            s3.endpoint(),
            etcd_operator_tests::s3::REGION
        ),
    )?;
    wait_for(
        &op,
        Watched::object("etcdbackup", "b1"),
        "the backup in S3",
        TIMEOUT,
        |o| o["status"]["phase"] == "Succeeded",
    )
    .await?;
    etcdctl_ok(&src_endpoint, &["put", "after", "the-backup"]);

    let mut phase = Phase::start();
    apply(
        &op,
        &format!(
            "{}  bootstrap:\n    restore:\n      backupName: b1\n",
            cluster_yaml("dst", 3, "3.5.16")
        ),
    )?;
    let dst = wait_available(&op, "dst", 3, "the restored cluster", TIMEOUT).await;
    phase.done("3 members restored from S3 and Available");
    for endpoint in etcd_operator_tests::local_cluster::endpoints(&dst) {
        for i in [0, 7, 19] {
            let value = etcdctl_ok(&endpoint, &["get", &format!("k{i:02}"), "--print-value-only"]);
            assert_eq!(value.trim(), format!("v{i}"), "{endpoint}");
        }
        let after = etcdctl_ok(&endpoint, &["get", "after", "--print-value-only"]);
        assert_eq!(after.trim(), "", "{endpoint}: a key written after the backup");
    }
    // The restore ran in the Pods' init containers, each to completion.
    for pod in pods_of(&kube_api, "dst") {
        let inits: Vec<(String, i64)> = pod["status"]["initContainerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                (
                    s["name"].as_str().unwrap_or_default().to_owned(),
                    s["state"]["terminated"]["exitCode"].as_i64().unwrap_or(-1),
                )
            })
            .collect();
        let bootstrap_member = !inits.is_empty();
        if bootstrap_member {
            assert_eq!(
                inits,
                vec![
                    ("restore-fetch".to_owned(), 0),
                    ("restore".to_owned(), 0),
                    ("restore-finish".to_owned(), 0)
                ],
                "{pod}"
            );
        }
    }
    assert!(
        pods_of(&kube_api, "dst")
            .iter()
            .any(|p| p["status"]["initContainerStatuses"]
                .as_array()
                .is_some_and(|i| !i.is_empty())),
        "no member was restored through init containers"
    );

    // A snapshot changed in the bucket after the backup: the fetch step refuses it, its init
    // container exits with the reason, and the operator reports it; nothing starts empty.
    let backup = etcd_operator_tests::kubectl::get(&op, "etcdbackup", "b1")?;
    let location = backup["status"]["lastBackup"]["location"]
        .as_str()
        .or_else(|| backup["status"]["location"].as_str())
        .context(format!("no location in {backup}"))?
        .to_owned();
    let key = location
        .strip_prefix("s3://restores/")
        .context(format!("not in the bucket: {location}"))?;
    use object_store::ObjectStoreExt as _;
    s3.store("restores")?
        .put(
            &object_store::path::Path::from(key),
            b"not the snapshot".to_vec().into(),
        )
        .await?;
    apply(
        &op,
        &format!(
            "{}  bootstrap:\n    restore:\n      backupName: b1\n",
            cluster_yaml("bad", 1, "3.5.16")
        ),
    )?;
    let status = wait_for(
        &op,
        Watched::status("ec", "bad"),
        "the restore refused",
        TIMEOUT,
        |s| {
            etcd_operator_tests::kubectl::condition(s, "Degraded").is_some_and(|c| {
                c["reason"] == "RestoreFailed"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("SHA-256") && m.contains("restore-fetch"))
            })
        },
    )
    .await?;
    let message = etcd_operator_tests::kubectl::condition(&status, "Degraded")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        !message.contains('\u{1b}'),
        "terminal colours in a termination message: {message:?}"
    );
    let pods = pods_of(&kube_api, "bad");
    assert!(
        pods.iter()
            .all(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_null()),
        "etcd started without its data: {pods:#?} {status}"
    );
    drop(agent);
    Ok(())
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Replacement through the kubernetes runtime: a member whose database is garbage cannot start;
/// the node agent restarts its container with back-off (the Pod's restartCount grows), and after
/// `crashLoopAfter` the controller announces it (Warning Event `MemberReplacing`), removes it
/// and adds a fresh member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_runtime_replaces_a_member_whose_pod_cannot_start() -> anyhow::Result<()> {
    let Some(hosts) = private_hosts::enter("kubernetes_runtime_replaces_a_member_whose_pod_cannot_start")?
    else {
        return Ok(());
    };
    tools::etcd(EtcdVersion::V3_5_34)?;
    let Cluster {
        kube_api,
        agent,
        op,
        dir: _dir,
    } = Cluster::start(hosts).await?;
    let name = "crashy";
    apply(
        &op,
        &format!(
            "{}  replacement:\n    policy: Automatic\n    crashLoopAfter: 10s\n",
            cluster_yaml(name, 3, "3.5.34")
        ),
    )?;
    let status = wait_available(&op, name, 3, "3 members", TIMEOUT).await;
    let broken = etcd_operator_tests::local_cluster::member_names(&status)[1].clone();
    let db = _dir
        .path()
        .join("node/volumes/default")
        .join(format!("{broken}-data"))
        .join("data/member/snap/db");
    anyhow::ensure!(db.is_file(), "no database at {}", db.display());
    let pid = agent.pid("default", &broken).context("the member runs")?;
    etcd_operator_tests::local_cluster::sigkill(pid);
    std::fs::write(&db, vec![0xAB; 64 * 1024])?;
    let mut phase = Phase::start();
    let status = wait_for(
        &op,
        Watched::status("ec", name),
        "the broken member replaced by a fresh one",
        TIMEOUT,
        |s| available(s, 3) && !etcd_operator_tests::local_cluster::member_names(s).contains(&broken),
    )
    .await?;
    phase.done("a member that cannot start replaced (crashLoopAfter 10 s)");
    assert!(
        !pods_of(&kube_api, name)
            .iter()
            .any(|p| p["metadata"]["name"] == broken.as_str()),
        "the broken member's Pod is still there"
    );
    let events = kube_api.objects("events");
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "MemberReplacing"
                && e["note"].as_str().is_some_and(|n| n.contains(&broken))),
        "no MemberReplacing Event for {broken}: {events:#?}"
    );
    assert_eq!(
        etcd_operator_tests::kubectl::condition(&status, "Degraded").map(|c| c["status"].clone()),
        Some(serde_json::json!("False")),
        "{status}"
    );
    Ok(())
}

/// A `--member-kubeconfig` that does not load stops local mode before it starts anything, saying
/// which file and why.
#[tokio::test]
async fn a_member_kubeconfig_that_does_not_load_stops_local_mode() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("absent.kubeconfig");
    let out = std::process::Command::new(etcd_operator_tests::operator::operator_binary()?)
        .args(["local", "--state-dir"])
        .arg(dir.path().join("state"))
        .arg("--member-kubeconfig")
        .arg(&missing)
        .output()?;
    assert!(!out.status.success());
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        log.contains("build the client of the members' cluster from") && log.contains("absent.kubeconfig"),
        "{log}"
    );
    assert!(
        !dir.path().join("state").join("etcd").exists(),
        "the backing etcd was started"
    );
    Ok(())
}
