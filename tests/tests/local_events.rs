//! Events in local mode end to end: `etcd-operator local` serves core `v1` Events and its local
//! runtime writes them, so `kubectl describe etcdcluster` and `kubectl get events
//! --field-selector involvedObject.name=X` show a scale and a killed member; a repeat folds into
//! one Event with a count; each Event is stored under a one-hour lease of the backing etcd.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use etcd_operator_tests::LocalOperator;
use etcd_operator_tests::kubectl::{apply, kubectl, output};
use etcd_operator_tests::local_cluster::{
    cluster_yaml, kill_member, member_dir, member_names, wait_available,
};
use serde_json::Value;

/// The Events about EtcdCluster `name`, as `kubectl get events --field-selector` lists them.
fn events_of(op: &LocalOperator, name: &str) -> Vec<Value> {
    let selector = format!("involvedObject.name={name}");
    let text = kubectl(
        op,
        &["get", "events", "--field-selector", &selector, "-o", "json"],
        None,
    )
    .unwrap();
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list["kind"], "List", "{list}");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// Polls [`events_of`] until `done` holds; the Events then. Fails with what was seen.
async fn wait_events(
    op: &LocalOperator,
    name: &str,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let events = events_of(op, name);
        if done(&events) {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not seen in time; Events: {events:#?}\noperator log:\n{}",
            op.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn started_note(member: &str) -> String {
    format!("Started member process {member} (etcd 3.5.1)")
}

#[tokio::test]
async fn describe_and_get_events_show_a_scale_and_a_killed_member_with_folding_and_a_ttl() {
    let op = LocalOperator::start().await.unwrap();

    // Discovery of the core group lists Events and nothing else.
    let api: Value = serde_json::from_str(&kubectl(&op, &["get", "--raw", "/api"], None).unwrap()).unwrap();
    assert_eq!(api["versions"], serde_json::json!(["v1"]));
    let v1: Value = serde_json::from_str(&kubectl(&op, &["get", "--raw", "/api/v1"], None).unwrap()).unwrap();
    let names: Vec<&str> = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["events"]);

    apply(&op, &cluster_yaml("ev", 3)).unwrap();
    wait_available(&op, "ev", 3, "3 members", Duration::from_secs(60)).await;
    kubectl(&op, &["scale", "ec", "ev", "--replicas=4"], None).unwrap();
    let s = wait_available(&op, "ev", 4, "4 members after the scale", Duration::from_secs(90)).await;
    let members = member_names(&s);
    assert_eq!(members.len(), 4);
    // Every member, the one the scale added too, has its MemberStarted Event.
    wait_events(&op, "ev", "a MemberStarted Event per member", |events| {
        members.iter().all(|m| {
            events
                .iter()
                .any(|e| e["reason"] == "MemberStarted" && e["message"] == started_note(m).as_str())
        })
    })
    .await;

    // SIGKILL a member (its data kept): the controller starts it again, and the repeated
    // Event folds into the first one.
    let victim = members[0].clone();
    kill_member(&member_dir(&op, "ev", &victim));
    let events = wait_events(&op, "ev", "the restart folded into the first Event", |events| {
        events.iter().any(|e| {
            e["message"] == started_note(&victim).as_str() && e["count"].as_i64().is_some_and(|c| c >= 2)
        })
    })
    .await;
    let folded: Vec<&Value> = events
        .iter()
        .filter(|e| e["message"] == started_note(&victim).as_str())
        .collect();
    assert_eq!(folded.len(), 1, "one Event for the repeats: {folded:#?}");
    let folded = folded[0];
    assert_eq!(folded["type"], "Normal");
    assert_eq!(folded["involvedObject"]["kind"], "EtcdCluster");
    assert_eq!(folded["source"]["component"], "etcd-operator");
    assert!(
        folded["lastTimestamp"].as_str() >= folded["firstTimestamp"].as_str(),
        "{folded:#}"
    );
    // Its create and its bump are the controller's writes, under its field manager.
    let event_name = folded["metadata"]["name"].as_str().unwrap_or_default();
    let with_fields: Value = serde_json::from_str(
        &kubectl(
            &op,
            &["get", "event", event_name, "-o", "json", "--show-managed-fields"],
            None,
        )
        .unwrap(),
    )
    .unwrap();
    let managers: Vec<&str> = with_fields["metadata"]["managedFields"]
        .as_array()
        .map(|entries| entries.iter().filter_map(|m| m["manager"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(managers, ["etcd-operator"], "{with_fields:#}");

    // `kubectl describe` lists them in its Events section, with the fold as `(x2 over ...)`.
    let described = kubectl(&op, &["describe", "etcdcluster", "ev"], None).unwrap();
    let section = described
        .split("\nEvents:")
        .nth(1)
        .unwrap_or_else(|| panic!("no Events section:\n{described}"));
    for m in &members {
        assert!(section.contains(&started_note(m)), "{m} missing:\n{section}");
    }
    assert!(section.contains("MemberStarted"), "{section}");
    assert!(section.contains(" over "), "no folded Event shown:\n{section}");

    // The Table kubectl prints: the object as `etcdcluster/ev`.
    let table = kubectl(
        &op,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=ev,reason=MemberStarted",
        ],
        None,
    )
    .unwrap();
    assert!(table.starts_with("LAST SEEN"), "{table}");
    assert!(table.contains("etcdcluster/ev"), "{table}");
    // A selector on another object finds none of them.
    assert!(events_of(&op, "other").is_empty());

    // Each Event carries a lease of one hour in the backing etcd (kube-apiserver's event TTL).
    let endpoint = op.backing_etcd_endpoint().unwrap();
    let mut etcd = etcd_client::Client::connect([endpoint], op.backing_etcd_connect_options())
        .await
        .unwrap();
    let key = format!(
        "/registry/events/default/{}",
        folded["metadata"]["name"].as_str().unwrap()
    );
    let got = etcd.get(key.as_str(), None).await.unwrap();
    let kv = got.kvs().first().unwrap_or_else(|| panic!("{key} not stored"));
    assert_ne!(kv.lease(), 0, "{key} has no lease");
    let ttl = etcd.lease_time_to_live(kv.lease(), None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 3600);
    assert!((3000..=3600).contains(&ttl.ttl()), "{}", ttl.ttl());

    // Bad input is a 422 naming the field, and nothing is stored. (Sent raw: kubectl's
    // client-side validation wants an OpenAPI document of the core group, which is not served.)
    let bad = r#"{"apiVersion": "v1", "kind": "Event", "metadata": {"name": "bad", "namespace": "default"}, "reason": "X"}"#;
    let out = output(
        &op,
        &["create", "--raw", "/api/v1/namespaces/default/events", "-f", "-"],
        Some(bad),
    )
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Event \"bad\" is invalid: involvedObject: Required value"),
        "{stderr}"
    );
    assert!(
        output(&op, &["get", "event", "bad"], None)
            .map(|o| !o.status.success())
            .unwrap()
    );
}
