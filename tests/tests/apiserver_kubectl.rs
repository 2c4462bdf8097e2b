//! The API server end to end: real kubectl 1.35 against `etcd-operator local` and its real
//! backing etcd. Each test starts its own operator.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::time::Duration;

use etcd_operator_tests::LocalOperator;
use etcd_operator_tests::kubectl::{apply, get, kubectl, output, run_with_stdin};
use serde_json::Value;

const V2_CLUSTER: &str = r#"
apiVersion: etcd.operator.dev/v1alpha2
kind: EtcdCluster
metadata:
  name: alpha
  namespace: default
  labels:
    team: storage
spec:
  replicas: 3
  version: 3.5.1
"#;

const V1_CLUSTER: &str = r#"
apiVersion: etcd.operator.dev/v1alpha1
kind: EtcdCluster
metadata:
  name: legacy
  namespace: default
spec:
  size: 3
  version: 3.5.1
  pod:
    antiAffinity: true
"#;

/// Runs kubectl expecting failure; returns stderr.
fn kubectl_fails(op: &LocalOperator, args: &[&str], stdin: Option<&str>) -> String {
    let out = output(op, args, stdin).unwrap();
    assert!(
        !out.status.success(),
        "kubectl {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn apply_both_versions_get_columns_and_converted_yaml() {
    let op = LocalOperator::start().await.unwrap();
    let out = apply(&op, V2_CLUSTER).unwrap();
    assert!(
        out.contains("etcdcluster.etcd.operator.dev/alpha created"),
        "{out}"
    );
    let out = apply(&op, V1_CLUSTER).unwrap();
    assert!(
        out.contains("etcdcluster.etcd.operator.dev/legacy created"),
        "{out}"
    );
    // Applying the same manifest again changes nothing.
    let out = apply(&op, V2_CLUSTER).unwrap();
    assert!(out.contains("unchanged"), "{out}");

    // Printer columns from the server's Table.
    let table = kubectl(&op, &["get", "etcdclusters"], None).unwrap();
    let header = table.lines().next().unwrap();
    for col in ["NAME", "REPLICAS", "READY", "VERSION", "PHASE", "AGE"] {
        assert!(header.contains(col), "missing column {col}: {table}");
    }
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("alpha") && l.contains("3.5.1")),
        "{table}"
    );
    assert!(table.lines().any(|l| l.starts_with("legacy")), "{table}");
    let wide = kubectl(&op, &["get", "ec", "-o", "wide"], None).unwrap();
    assert!(wide.lines().next().unwrap().contains("LEADER"), "{wide}");

    // The same object in both versions, converted. The controller writes
    // status while members start, so the pair is read again until no write
    // fell between the two reads (same resourceVersion before and after).
    let (v2, v1) = {
        let mut attempts = 0;
        loop {
            let before = get(&op, "etcdclusters.v1alpha2.etcd.operator.dev", "legacy").unwrap();
            let v1 = get(&op, "etcdclusters.v1alpha1.etcd.operator.dev", "legacy").unwrap();
            let after = get(&op, "etcdclusters.v1alpha2.etcd.operator.dev", "legacy").unwrap();
            attempts += 1;
            if before["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"] || attempts == 20
            {
                break (after, v1);
            }
        }
    };
    assert_eq!(v2["apiVersion"], "etcd.operator.dev/v1alpha2");
    assert_eq!(v1["apiVersion"], "etcd.operator.dev/v1alpha1");
    assert_eq!(v2["spec"]["replicas"], 3);
    assert_eq!(v1["spec"]["size"], 3);
    assert_eq!(
        v1["spec"]["pod"]["antiAffinity"], true,
        "v1alpha1-only field survives the hub: {v1}"
    );
    assert_eq!(v1["metadata"]["uid"], v2["metadata"]["uid"]);
    assert_eq!(
        v1["metadata"]["resourceVersion"],
        v2["metadata"]["resourceVersion"]
    );
    let v1_of_v2 = get(&op, "etcdclusters.v1alpha1.etcd.operator.dev", "alpha").unwrap();
    assert_eq!(v1_of_v2["spec"]["size"], 3);
    let yaml = kubectl(
        &op,
        &[
            "get",
            "etcdclusters.v1alpha1.etcd.operator.dev",
            "alpha",
            "-o",
            "yaml",
        ],
        None,
    )
    .unwrap();
    assert!(
        yaml.contains("apiVersion: etcd.operator.dev/v1alpha1") && yaml.contains("size: 3"),
        "{yaml}"
    );
}

#[tokio::test]
async fn discovery_explain_and_dry_run() {
    let op = LocalOperator::start().await.unwrap();
    let resources = kubectl(&op, &["api-resources", "--api-group=etcd.operator.dev"], None).unwrap();
    let line = resources
        .lines()
        .find(|l| l.starts_with("etcdclusters"))
        .unwrap_or_else(|| panic!("{resources}"));
    assert!(
        line.contains("ec") && line.contains("etcd.operator.dev/v1alpha2") && line.contains("true"),
        "{line}"
    );
    let versions = kubectl(&op, &["api-versions"], None).unwrap();
    assert!(
        versions.lines().any(|l| l == "etcd.operator.dev/v1alpha1"),
        "{versions}"
    );
    assert!(
        versions.lines().any(|l| l == "etcd.operator.dev/v1alpha2"),
        "{versions}"
    );

    let explain = kubectl(&op, &["explain", "etcdclusters.spec.replicas"], None).unwrap();
    assert!(
        explain.contains("KIND:") && explain.contains("EtcdCluster"),
        "{explain}"
    );
    assert!(explain.contains("FIELD: replicas"), "{explain}");

    let out = kubectl(&op, &["apply", "--dry-run=server", "-f", "-"], Some(V2_CLUSTER)).unwrap();
    assert!(out.contains("(server dry run)"), "{out}");
    let err = kubectl_fails(&op, &["get", "etcdcluster", "alpha"], None);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "dry run stored the object: {err}"
    );
    let out = kubectl(
        &op,
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(V2_CLUSTER),
    )
    .unwrap();
    let obj: Value = serde_json::from_str(&out).unwrap();
    assert!(obj["metadata"]["uid"].is_string(), "{obj}");
    assert!(obj["metadata"]["resourceVersion"].is_null(), "{obj}");
    let list: Value =
        serde_json::from_str(&kubectl(&op, &["get", "ec", "-o", "json"], None).unwrap()).unwrap();
    assert_eq!(list["items"], serde_json::json!([]), "{list}");
}

#[tokio::test]
async fn an_invalid_object_is_refused_with_every_cause() {
    let op = LocalOperator::start().await.unwrap();
    let bad = r#"
apiVersion: etcd.operator.dev/v1alpha2
kind: EtcdCluster
metadata:
  name: bad
spec:
  replicas: 12
  version: 4.0.0
  storage:
    size: lots
"#;
    let err = kubectl_fails(&op, &["apply", "-f", "-"], Some(bad));
    assert!(err.contains("is invalid"), "{err}");
    for field in ["spec.replicas", "spec.version", "spec.storage.size"] {
        assert!(err.contains(field), "cause for {field} missing: {err}");
    }
    let list: Value =
        serde_json::from_str(&kubectl(&op, &["get", "ec", "-o", "json"], None).unwrap()).unwrap();
    assert_eq!(
        list["items"],
        serde_json::json!([]),
        "an invalid object was stored: {list}"
    );

    // Unknown fields: strict validation refuses them.
    let unknown = V2_CLUSTER.replace("  replicas: 3", "  replicas: 3\n  bogus: 1");
    let err = kubectl_fails(&op, &["apply", "--validate=strict", "-f", "-"], Some(&unknown));
    assert!(err.contains("bogus"), "{err}");
}

#[tokio::test]
async fn patch_scale_label_annotate_edit_wait_and_delete() {
    let op = LocalOperator::start().await.unwrap();
    apply(&op, V2_CLUSTER).unwrap();
    let before = get(&op, "ec", "alpha").unwrap();
    assert_eq!(before["metadata"]["generation"], 1);

    kubectl(
        &op,
        &[
            "patch",
            "ec",
            "alpha",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":5}}"#,
        ],
        None,
    )
    .unwrap();
    let after = get(&op, "ec", "alpha").unwrap();
    assert_eq!(after["spec"]["replicas"], 5);
    assert_eq!(after["metadata"]["generation"], 2);

    kubectl(
        &op,
        &[
            "patch",
            "ec",
            "alpha",
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
        ],
        None,
    )
    .unwrap();
    assert_eq!(get(&op, "ec", "alpha").unwrap()["spec"]["replicas"], 3);
    // `kubectl patch` without --type sends a strategic merge patch: served for these types.
    let out = kubectl(
        &op,
        &["patch", "ec", "alpha", "-p", r#"{"spec":{"replicas":5}}"#],
        None,
    )
    .unwrap();
    assert!(out.contains("patched"), "{out}");
    assert_eq!(get(&op, "ec", "alpha").unwrap()["spec"]["replicas"], 5);
    kubectl(
        &op,
        &["patch", "ec", "alpha", "-p", r#"{"spec":{"replicas":3}}"#],
        None,
    )
    .unwrap();

    let out = kubectl(&op, &["scale", "ec", "alpha", "--replicas=5"], None).unwrap();
    assert!(out.contains("scaled"), "{out}");
    assert_eq!(get(&op, "ec", "alpha").unwrap()["spec"]["replicas"], 5);
    let scale: Value = serde_json::from_str(
        &kubectl(
            &op,
            &[
                "get",
                "--raw",
                "/apis/etcd.operator.dev/v1alpha2/namespaces/default/etcdclusters/alpha/scale",
            ],
            None,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 5);

    kubectl(&op, &["label", "ec", "alpha", "tier=db"], None).unwrap();
    kubectl(&op, &["annotate", "ec", "alpha", "note=hello"], None).unwrap();
    let obj = get(&op, "ec", "alpha").unwrap();
    assert_eq!(obj["metadata"]["labels"]["tier"], "db");
    assert_eq!(obj["metadata"]["annotations"]["note"], "hello");
    let generation = obj["metadata"]["generation"].clone();
    let selected = kubectl(&op, &["get", "ec", "-l", "tier=db", "-o", "name"], None).unwrap();
    assert_eq!(selected.trim(), "etcdcluster.etcd.operator.dev/alpha");
    assert_eq!(
        kubectl(&op, &["get", "ec", "-l", "tier=web", "-o", "name"], None)
            .unwrap()
            .trim(),
        ""
    );

    // kubectl edit with a scripted editor.
    let dir = tempfile::tempdir().unwrap();
    let editor = dir.path().join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/replicas: 5/replicas: 7/' \"$1\"\n").unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&editor)
        .status()
        .unwrap();
    let mut cmd = op.kubectl().unwrap();
    cmd.args(["edit", "ec", "alpha"]).env("KUBE_EDITOR", &editor);
    let out = run_with_stdin(cmd, &["edit", "ec", "alpha"], None).unwrap();
    assert!(
        out.status.success(),
        "edit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let obj = get(&op, "ec", "alpha").unwrap();
    assert_eq!(obj["spec"]["replicas"], 7);
    assert_ne!(
        obj["metadata"]["generation"], generation,
        "a spec edit bumps the generation"
    );

    kubectl(
        &op,
        &[
            "wait",
            "ec/alpha",
            "--for=jsonpath={.spec.replicas}=7",
            "--timeout=20s",
        ],
        None,
    )
    .unwrap();

    let out = kubectl(&op, &["delete", "ec", "alpha", "--wait", "--timeout=30s"], None).unwrap();
    assert!(out.contains("deleted"), "{out}");
    let err = kubectl_fails(&op, &["get", "ec", "alpha"], None);
    assert!(err.contains("not found"), "{err}");
}

#[tokio::test]
async fn get_watch_sees_another_clients_change() {
    let op = LocalOperator::start().await.unwrap();
    apply(&op, V2_CLUSTER).unwrap();
    let mut cmd = op.kubectl().unwrap();
    cmd.args([
        "get",
        "ec",
        "alpha",
        "-w",
        "-o",
        "jsonpath={.spec.replicas}{\"\\n\"}",
        "--request-timeout=30s",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut watcher = cmd.spawn().unwrap();
    let stdout = watcher.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(20)).unwrap(),
        "3",
        "initial state"
    );
    kubectl(
        &op,
        &[
            "patch",
            "ec",
            "alpha",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":5}}"#,
        ],
        None,
    )
    .unwrap();
    // Events before the patch's may come first (the controller writes the status as the
    // cluster starts, with the spec still at 3); the change must follow within the deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) if line == "5" => {
                seen.push(line);
                break;
            }
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert_eq!(
        seen.last().map(String::as_str),
        Some("5"),
        "the watch delivered the change: {seen:?}"
    );
    assert!(seen.iter().all(|l| l == "3" || l == "5"), "{seen:?}");
}

#[tokio::test]
async fn restart_keeps_every_object() {
    let mut op = LocalOperator::start().await.unwrap();
    apply(&op, V2_CLUSTER).unwrap();
    apply(&op, V1_CLUSTER).unwrap();
    let before = get(&op, "ec", "alpha").unwrap();
    op.restart().await.unwrap();
    let after = get(&op, "ec", "alpha").unwrap();
    assert_eq!(before["metadata"]["uid"], after["metadata"]["uid"]);
    assert_eq!(
        before["metadata"]["creationTimestamp"],
        after["metadata"]["creationTimestamp"]
    );
    assert_eq!(before["spec"], after["spec"]);
    // (The resourceVersion moves on: the controller writes status.)
    assert_eq!(after["spec"]["replicas"], 3);
    let names = kubectl(&op, &["get", "ec", "-o", "name"], None).unwrap();
    assert_eq!(names.lines().count(), 2, "{names}");
}

const SSA_CLUSTER: &str = r#"
apiVersion: etcd.operator.dev/v1alpha2
kind: EtcdCluster
metadata:
  name: ssa
  namespace: default
  labels:
    team: storage
spec:
  replicas: 3
  version: 3.5.1
"#;

/// `kubectl get ec NAME -o json --show-managed-fields`: the managedFields entries as
/// (manager, operation).
fn managers(op: &LocalOperator, name: &str) -> Vec<(String, String)> {
    let obj: Value = serde_json::from_str(
        &kubectl(
            op,
            &["get", "ec", name, "-o", "json", "--show-managed-fields"],
            None,
        )
        .unwrap(),
    )
    .unwrap();
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["manager"].as_str().unwrap_or_default().to_string(),
                e["operation"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn server_side_apply_field_managers_migration_and_diff() {
    let op = LocalOperator::start().await.unwrap();
    // Two field managers setting the same field: the second gets kubectl's conflict message.
    let out = kubectl(
        &op,
        &["apply", "--server-side", "--field-manager=a", "-f", "-"],
        Some(SSA_CLUSTER),
    )
    .unwrap();
    assert!(out.contains("serverside-applied"), "{out}");
    let five = SSA_CLUSTER.replace("replicas: 3", "replicas: 5");
    let err = kubectl_fails(
        &op,
        &["apply", "--server-side", "--field-manager=b", "-f", "-"],
        Some(&five),
    );
    assert!(
        err.contains(r#"Apply failed with 1 conflict: conflict with "a": .spec.replicas"#),
        "{err}"
    );
    assert_eq!(get(&op, "ec", "ssa").unwrap()["spec"]["replicas"], 3);
    // --force-conflicts wins.
    kubectl(
        &op,
        &[
            "apply",
            "--server-side",
            "--field-manager=b",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&five),
    )
    .unwrap();
    assert_eq!(get(&op, "ec", "ssa").unwrap()["spec"]["replicas"], 5);
    let m = managers(&op, "ssa");
    assert!(m.contains(&("a".into(), "Apply".into())), "{m:?}");
    assert!(m.contains(&("b".into(), "Apply".into())), "{m:?}");
    // Without --show-managed-fields kubectl hides them.
    let plain = kubectl(&op, &["get", "ec", "ssa", "-o", "yaml"], None).unwrap();
    assert!(!plain.contains("managedFields"), "{plain}");
    let shown = kubectl(
        &op,
        &["get", "ec", "ssa", "-o", "yaml", "--show-managed-fields"],
        None,
    )
    .unwrap();
    assert!(shown.contains("f:replicas: {}"), "{shown}");

    // kubectl diff, server-side (a dry-run apply) and client-side: the change shows, nothing
    // is stored.
    let seven = SSA_CLUSTER.replace("replicas: 3", "replicas: 7");
    for args in [
        vec!["diff", "--server-side", "--field-manager=b", "-f", "-"],
        vec!["diff", "-f", "-"],
    ] {
        let out = output(&op, &args, Some(&seven)).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("+  replicas: 7"), "{args:?}: {stdout}");
    }
    assert_eq!(get(&op, "ec", "ssa").unwrap()["spec"]["replicas"], 5);

    // Client-side to server-side migration: an object created by `kubectl apply` is taken over
    // by `kubectl apply --server-side` (kubectl moves the client-side manager's fields to its
    // apply entry), after which a dropped label is removed; a later client-side apply works.
    let legacy = SSA_CLUSTER.replace("name: ssa", "name: csa");
    let out = apply(&op, &legacy).unwrap();
    assert!(out.contains("created"), "{out}");
    let m = managers(&op, "csa");
    assert!(
        m.contains(&("kubectl-client-side-apply".into(), "Update".into())),
        "{m:?}"
    );
    let out = kubectl(&op, &["apply", "--server-side", "-f", "-"], Some(&legacy)).unwrap();
    assert!(out.contains("serverside-applied"), "{out}");
    let m = managers(&op, "csa");
    assert!(m.contains(&("kubectl".into(), "Apply".into())), "{m:?}");
    assert!(
        !m.iter().any(|(name, _)| name == "kubectl-client-side-apply"),
        "{m:?}"
    );
    let unlabelled = legacy.replace("  labels:\n    team: storage\n", "");
    kubectl(&op, &["apply", "--server-side", "-f", "-"], Some(&unlabelled)).unwrap();
    let obj = get(&op, "ec", "csa").unwrap();
    assert!(obj["metadata"]["labels"].get("team").is_none(), "{obj:#}");
    let four = unlabelled.replace("replicas: 3", "replicas: 4");
    let out = apply(&op, &four).unwrap();
    assert!(out.contains("configured"), "{out}");
    assert_eq!(get(&op, "ec", "csa").unwrap()["spec"]["replicas"], 4);
}

#[tokio::test]
async fn kube_rs_patch_apply_creates_and_conflicts() {
    use etcd_operator_tests::kube_client::{connect, etcd_clusters};
    use kube::api::{Api, DynamicObject, Patch, PatchParams};

    let op = LocalOperator::start().await.unwrap();
    let client = connect(&op.kubeconfig(), Default::default()).await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &etcd_clusters());
    let body = |replicas: u32| {
        serde_json::json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "rs"}, "spec": {"replicas": replicas, "version": "3.5.1"}})
    };
    let created = api
        .patch("rs", &PatchParams::apply("rust-a"), &Patch::Apply(body(3)))
        .await
        .unwrap();
    let entries = created.metadata.managed_fields.unwrap_or_default();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].manager.as_deref(), Some("rust-a"));
    assert_eq!(entries[0].operation.as_deref(), Some("Apply"));
    match api
        .patch("rs", &PatchParams::apply("rust-b"), &Patch::Apply(body(5)))
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 409, "{s:?}");
            assert_eq!(s.reason, "Conflict", "{s:?}");
            assert!(s.message.contains(".spec.replicas"), "{s:?}");
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    let forced = api
        .patch(
            "rs",
            &PatchParams::apply("rust-b").force(),
            &Patch::Apply(body(5)),
        )
        .await
        .unwrap();
    assert_eq!(forced.data["spec"]["replicas"], 5);
}

const PAUSED_CLUSTER: &str = r#"
apiVersion: etcd.operator.dev/v1alpha2
kind: EtcdCluster
metadata:
  name: held
  namespace: default
spec:
  replicas: 3
  version: 3.5.1
  paused: true
"#;

/// (reconciles that waited because their cluster is paused, reconciles finished, status
/// write included), from `/metrics`.
fn paused_reconciles(op: &LocalOperator) -> (u64, u64) {
    let text = kubectl(op, &["get", "--raw", "/metrics"], None).unwrap();
    let sum = |keep: &dyn Fn(&str) -> bool| {
        text.lines()
            .filter(|l| keep(l))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    (
        sum(&|l| l.starts_with("etcd_operator_reconcile_waits_total{") && l.contains("reason=\"Paused\"")),
        sum(&|l| l.starts_with("etcd_operator_reconcile_duration_seconds_count")),
    )
}

/// With its controller, local mode creates a cluster with the controller's cleanup finalizer
/// and its first status already on (the controller need not write them, issue 24): after the
/// controller looked at the paused cluster, the object is still the one the create stored. With
/// `--no-controller` it adds neither, since nothing would remove the finalizer or keep the
/// status (`observedGeneration: 0`: nobody looked). A delete completes either way: the
/// controller runs its cleanup and takes the finalizer off.
#[tokio::test]
async fn the_cleanup_finalizer_and_first_status_come_with_the_create_only_when_the_controller_runs() {
    for (args, expected) in [
        (Vec::new(), serde_json::json!(["etcd.operator.dev/cleanup"])),
        (vec!["--no-controller".to_string()], Value::Null),
    ] {
        let op = LocalOperator::start_with(etcd_operator_tests::operator::OperatorOptions {
            args: args.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
        let out = kubectl(&op, &["create", "-o", "json", "-f", "-"], Some(PAUSED_CLUSTER)).unwrap();
        let created: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            created["metadata"]["finalizers"], expected,
            "{args:?}: {created:#}"
        );
        assert_eq!(
            get(&op, "ec", "held").unwrap()["metadata"]["finalizers"],
            expected,
            "{args:?}"
        );
        let status = &created["status"];
        if args.is_empty() {
            assert_eq!(status["phase"], "Paused", "{created:#}");
            assert_eq!(status["observedGeneration"], 1, "{created:#}");
            let types: Vec<&str> = status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|c| c["type"].as_str())
                .collect();
            for t in [
                "Available",
                "Progressing",
                "Degraded",
                "Ready",
                "Reconciling",
                "Stalled",
            ] {
                assert!(types.contains(&t), "{t} in {types:?}");
            }
            // The controller looks at the cluster (its only one) and has nothing to add.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let (waits, done) = paused_reconciles(&op);
                if waits >= 1 && done >= 1 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the controller never looked at the paused cluster"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let now: Value = serde_json::from_str(
                &kubectl(
                    &op,
                    &["get", "ec", "held", "-o", "json", "--show-managed-fields"],
                    None,
                )
                .unwrap(),
            )
            .unwrap();
            assert_eq!(
                now["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"],
                "the controller wrote the cluster again: {now:#}"
            );
            let managers: Vec<&str> = now["metadata"]["managedFields"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["manager"].as_str())
                .collect();
            assert_eq!(managers, ["kubectl-create"], "{now:#}");
        } else {
            assert_eq!(
                status,
                &serde_json::json!({"observedGeneration": 0}),
                "{created:#}"
            );
        }
        kubectl(&op, &["delete", "ec", "held", "--wait", "--timeout=60s"], None).unwrap();
        let err = kubectl_fails(&op, &["get", "ec", "held"], None);
        assert!(err.contains("NotFound"), "{args:?}: {err}");
    }
}

/// Established TCP connections whose server side is `port` on this machine (`/proc/net/tcp`
/// and `tcp6`: state `01`, local port `port`).
fn established_to(port: u16) -> usize {
    let local_port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|table| {
            table
                .lines()
                .skip(1)
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.get(1).is_some_and(|local| local.ends_with(&local_port))
                        && fields.get(3) == Some(&"01")
                })
                .count()
        })
        .sum()
}

/// The co-located controller reaches the API in process (issue 24): while its watch of the
/// EtcdClusters is open (the server counts it) and it has looked at a cluster, no TCP
/// connection to the server is open once kubectl's have closed. Over loopback HTTPS, the
/// controller's watch held one for as long as it ran.
#[tokio::test]
async fn the_controller_reaches_the_api_in_process_and_holds_no_connection() {
    let op = LocalOperator::start().await.unwrap();
    let port: u16 = op
        .listen()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {}", op.listen()));
    kubectl(&op, &["create", "-f", "-"], Some(PAUSED_CLUSTER)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let watchers = loop {
        let (waits, done) = paused_reconciles(&op);
        let text = kubectl(&op, &["get", "--raw", "/metrics"], None).unwrap();
        let watchers: u64 = text
            .lines()
            .filter(|l| {
                l.starts_with("apiserver_registered_watchers{") && l.contains("resource=\"etcdclusters\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        if waits >= 1 && done >= 1 && watchers >= 1 {
            break watchers;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the controller never watched and looked at the cluster: {waits} waits, {done} reconciles, {watchers} watches"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // kubectl has exited: its connections close within moments; the controller's would not.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let open = established_to(port);
        if open == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{open} connections to the server stay open with {watchers} watches and no client running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
