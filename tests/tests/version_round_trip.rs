//! An object that uses settings only v1alpha2 has, read and written back through v1alpha1 with
//! real kubectl 1.35 against `etcd-operator local`: `kubectl get … v1alpha1 -o yaml | kubectl
//! replace -f -` is accepted and leaves the v1alpha2 spec as it was, and a v1alpha1 edit of a
//! v1alpha1 field keeps every v1alpha2-only setting, whether the edit is a replace, a
//! client-side `kubectl apply` of the manifest read in v1alpha1, or a `kubectl patch
//! --type=merge` of the v1alpha1 resource. The cluster is paused: the test is about the API, and
//! the controller leaves a paused cluster's members alone.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use etcd_operator_tests::LocalOperator;
use etcd_operator_tests::kubectl::{apply, get, kubectl, output};
use serde_json::Value;

const V1: &str = "etcdclusters.v1alpha1.etcd.operator.dev";
const V2: &str = "etcdclusters.v1alpha2.etcd.operator.dev";

const CLUSTER: &str = r#"
apiVersion: etcd.operator.dev/v1alpha2
kind: EtcdCluster
metadata:
  name: cron
  namespace: default
spec:
  replicas: 3
  version: 3.5.1
  paused: true
  storage:
    medium: Memory
  backup:
    schedule: "17 3 * * 1"
    retention:
      maxAge: 72h
    destination:
      s3:
        bucket: team-backups
        prefix: clusters/cron
        endpoint: http://127.0.0.1:9000
        credentialsSecret: s3-keys
        forcePathStyle: true
  tls:
    client:
      auto: {}
"#;

/// `kubectl get <v1alpha1> cron -o yaml | <edit> | kubectl replace -f -`, read again on a
/// conflict (the controller may write the status between the two, as it may for any user).
fn replace_through_v1alpha1(op: &LocalOperator, edit: impl Fn(String) -> String) {
    let mut last = String::new();
    for _ in 0..5 {
        let yaml = kubectl(op, &["get", V1, "cron", "-o", "yaml"], None).unwrap();
        assert!(yaml.contains("apiVersion: etcd.operator.dev/v1alpha1"), "{yaml}");
        let out = output(op, &["replace", "-f", "-"], Some(&edit(yaml))).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            assert!(
                stdout.contains("etcdcluster.etcd.operator.dev/cron replaced"),
                "{stdout}"
            );
            return;
        }
        assert!(
            stderr.contains("the object has been modified"),
            "kubectl replace of the object read in v1alpha1 was refused: {stderr}\n{}",
            op.log_tail()
        );
        last = stderr;
    }
    panic!("kubectl replace kept conflicting: {last}");
}

/// `kubectl get <v1alpha1> cron -o yaml | <edit> | kubectl apply -f -` (client-side apply: a
/// three-way merge patch of the v1alpha1 resource against the last applied configuration),
/// read again on a conflict.
fn apply_through_v1alpha1(op: &LocalOperator, edit: impl Fn(String) -> String) {
    let mut last = String::new();
    for _ in 0..5 {
        let yaml = kubectl(op, &["get", V1, "cron", "-o", "yaml"], None).unwrap();
        assert!(yaml.contains("apiVersion: etcd.operator.dev/v1alpha1"), "{yaml}");
        let edited = edit(yaml.clone());
        assert_ne!(edited, yaml, "the edit changes the manifest");
        let out = output(op, &["apply", "-f", "-"], Some(&edited)).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            assert!(
                stdout.contains("etcdcluster.etcd.operator.dev/cron configured"),
                "{stdout}"
            );
            return;
        }
        assert!(
            stderr.contains("the object has been modified"),
            "kubectl apply of the manifest read in v1alpha1 was refused: {stderr}\n{}",
            op.log_tail()
        );
        last = stderr;
    }
    panic!("kubectl apply kept conflicting: {last}");
}

fn spec(op: &LocalOperator) -> Value {
    get(op, V2, "cron").unwrap()["spec"].clone()
}

#[tokio::test]
async fn v1alpha2_only_settings_survive_a_v1alpha1_replace_and_edit() {
    let op = LocalOperator::start().await.unwrap();
    let out = apply(&op, CLUSTER).unwrap();
    assert!(
        out.contains("etcdcluster.etcd.operator.dev/cron created"),
        "{out}"
    );
    let created = spec(&op);
    assert_eq!(created["backup"]["schedule"], "17 3 * * 1", "{created:#}");

    // Read in v1alpha1 and written back unchanged: accepted, and the v1alpha2 spec is as it was.
    replace_through_v1alpha1(&op, |yaml| yaml);
    assert_eq!(spec(&op), created);

    // A v1alpha1 client changes a v1alpha1 field: the change lands, the rest is kept.
    replace_through_v1alpha1(&op, |yaml| yaml.replace("\n  size: 3\n", "\n  size: 5\n"));
    let mut want = created.clone();
    want["replicas"] = 5.into();
    assert_eq!(spec(&op), want);
    let v1 = get(&op, V1, "cron").unwrap();
    assert_eq!(v1["spec"]["size"], 5, "{v1:#}");
}

/// The v1alpha2-only settings of [`CLUSTER`], checked one by one (beside the whole spec).
fn assert_v1alpha2_settings_kept(spec: &Value) {
    let backup = &spec["backup"];
    assert_eq!(backup["schedule"], "17 3 * * 1", "{spec:#}");
    assert_eq!(backup["retention"]["maxAge"], "72h", "{spec:#}");
    let s3 = &backup["destination"]["s3"];
    assert_eq!(s3["bucket"], "team-backups", "{spec:#}");
    assert_eq!(s3["prefix"], "clusters/cron", "{spec:#}");
    assert_eq!(s3["endpoint"], "http://127.0.0.1:9000", "{spec:#}");
    assert_eq!(s3["credentialsSecret"], "s3-keys", "{spec:#}");
    assert_eq!(s3["forcePathStyle"], true, "{spec:#}");
}

#[tokio::test]
async fn a_v1alpha1_apply_or_merge_patch_of_size_keeps_the_v1alpha2_only_settings() {
    let op = LocalOperator::start().await.unwrap();
    apply(&op, CLUSTER).unwrap();
    let created = spec(&op);
    assert_v1alpha2_settings_kept(&created);

    // `kubectl apply` of the manifest read in v1alpha1, with a new size.
    apply_through_v1alpha1(&op, |yaml| yaml.replace("\n  size: 3\n", "\n  size: 5\n"));
    let mut want = created.clone();
    want["replicas"] = 5.into();
    let after_apply = spec(&op);
    assert_v1alpha2_settings_kept(&after_apply);
    assert_eq!(after_apply, want);
    assert_eq!(get(&op, V1, "cron").unwrap()["spec"]["size"], 5);

    // `kubectl patch --type=merge` of the v1alpha1 resource's size.
    let out = kubectl(
        &op,
        &[
            "patch",
            V1,
            "cron",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":7}}"#,
        ],
        None,
    )
    .unwrap();
    assert!(
        out.contains("etcdcluster.etcd.operator.dev/cron patched"),
        "{out}"
    );
    want["replicas"] = 7.into();
    let after_patch = spec(&op);
    assert_v1alpha2_settings_kept(&after_patch);
    assert_eq!(after_patch, want);
    assert_eq!(get(&op, V1, "cron").unwrap()["spec"]["size"], 7);

    // And apply again, now that the last applied configuration is the v1alpha1 manifest.
    apply_through_v1alpha1(&op, |yaml| yaml.replace("\n  size: 7\n", "\n  size: 3\n"));
    want["replicas"] = 3.into();
    let again = spec(&op);
    assert_v1alpha2_settings_kept(&again);
    assert_eq!(again, want);
}
