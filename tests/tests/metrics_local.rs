//! `/metrics` end to end: `etcd-operator local` with real etcd 3.5.1 members, driven with kubectl,
//! scraped with `kubectl get --raw /metrics` through the local kubeconfig (the same client
//! certificate that may call the API) before and after a cluster is created, scaled and deleted.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use etcd_operator_tests::LocalOperator;
use etcd_operator_tests::kubectl::{Watched, apply, condition, kubectl, wait_for};
use serde_json::Value;

const GROUP_LABELS: &str = r#"group="etcd.operator.dev",version="v1alpha2",resource="etcdclusters""#;

fn cluster_yaml(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: {replicas}\n  version: 3.5.1\n"
    )
}

fn available(s: &Value, replicas: i64) -> bool {
    condition(s, "Available").is_some_and(|c| c["status"] == "True")
        && s["readyReplicas"] == replicas
        && s["members"].as_array().is_some_and(|m| {
            m.len() as i64 == replicas && m.iter().all(|m| m["healthy"] == true && m["learner"] == false)
        })
}

/// One scrape: every sample line, `name{labels}` to value.
#[derive(Debug)]
struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn take(op: &LocalOperator) -> Self {
        let text = kubectl(op, &["get", "--raw", "/metrics"], None).unwrap();
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').unwrap();
                (series.to_owned(), value.parse().unwrap())
            })
            .collect();
        Self(samples)
    }

    fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }

    /// Every series of `name` whose labels contain `having`.
    fn matching(&self, name: &str, having: &str) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .filter(|(s, _)| s.starts_with(&format!("{name}{{")) && s.contains(having))
            .map(|(s, v)| (s.clone(), *v))
            .collect()
    }

    /// The sum over every series of `name` whose labels contain `having`.
    fn sum(&self, name: &str, having: &str) -> f64 {
        self.matching(name, having).values().sum()
    }
}

fn requests(verb: &str, subresource: &str, code: u16) -> String {
    format!(
        r#"apiserver_request_total{{verb="{verb}",{GROUP_LABELS},subresource="{subresource}",code="{code}"}}"#
    )
}

#[tokio::test]
async fn metrics_follow_a_cluster_created_scaled_and_deleted() {
    let op = LocalOperator::start().await.unwrap();
    let started = Instant::now();
    let before = Scrape::take(&op);
    // The controller lists and watches EtcdClusters from the start.
    assert!(
        before.sum("apiserver_registered_watchers", r#"resource="etcdclusters""#) >= 1.0,
        "{before:#?}"
    );
    assert!(before.matching("etcd_operator_member_healthy", "").is_empty());

    apply(&op, &cluster_yaml("mx", 1)).unwrap();
    wait_for(
        &op,
        Watched::status("ec", "mx"),
        "1 healthy member",
        Duration::from_secs(60),
        |s| available(s, 1),
    )
    .await
    .unwrap();
    eprintln!("1 member available after {:?}", started.elapsed());
    let one = Scrape::take(&op);
    assert_eq!(
        one.get(&requests("create", "", 201)) - before.get(&requests("create", "", 201)),
        1.0,
        "{one:#?}"
    );
    let cluster = r#"{namespace="default",cluster="mx"}"#;
    assert_eq!(
        one.get(&format!("etcd_operator_cluster_desired_members{cluster}")),
        1.0
    );
    assert_eq!(one.get(&format!("etcd_operator_cluster_members{cluster}")), 1.0);
    assert_eq!(one.get(&format!("etcd_operator_cluster_quorum{cluster}")), 1.0);
    assert_eq!(
        one.get(r#"etcd_operator_cluster_alarm{namespace="default",cluster="mx",alarm="NOSPACE"}"#),
        0.0
    );
    let healthy = one.matching("etcd_operator_member_healthy", r#"cluster="mx""#);
    assert_eq!(healthy.len(), 1, "{one:#?}");
    assert!(healthy.values().all(|v| *v == 1.0), "{healthy:?}");
    let sizes = one.matching("etcd_operator_member_db_size_bytes", r#"cluster="mx""#);
    assert_eq!(sizes.len(), 1, "{one:#?}");
    assert!(sizes.values().all(|v| *v > 0.0), "{sizes:?}");
    let reconciles = one.get("etcd_operator_reconcile_duration_seconds_count");
    assert!(reconciles >= 1.0, "{one:#?}");
    for step in ["ReserveForBootstrap", "Start"] {
        assert!(
            one.get(&format!(r#"etcd_operator_steps_total{{step="{step}"}}"#)) >= 1.0,
            "{step}: {one:#?}"
        );
    }
    // The controller's status writes are counted as updates or patches of status.
    let status_writes = |s: &Scrape| s.sum("apiserver_request_total", r#"subresource="status",code="200""#);
    assert!(status_writes(&one) > status_writes(&before), "{one:#?}");

    kubectl(&op, &["scale", "ec", "mx", "--replicas=3"], None).unwrap();
    wait_for(
        &op,
        Watched::status("ec", "mx"),
        "3 healthy members",
        Duration::from_secs(90),
        |s| available(s, 3),
    )
    .await
    .unwrap();
    eprintln!("3 members available after {:?}", started.elapsed());
    let three = Scrape::take(&op);
    assert!(
        three.sum("apiserver_request_total", r#"subresource="scale""#) >= 1.0,
        "kubectl scale went through /scale: {three:#?}"
    );
    assert_eq!(
        three.get(&format!("etcd_operator_cluster_desired_members{cluster}")),
        3.0
    );
    assert_eq!(three.get(&format!("etcd_operator_cluster_members{cluster}")), 3.0);
    let healthy = three.matching("etcd_operator_member_healthy", r#"cluster="mx""#);
    assert_eq!(healthy.len(), 3, "{three:#?}");
    assert!(healthy.values().all(|v| *v == 1.0), "{healthy:?}");
    let sizes = three.matching("etcd_operator_member_db_size_in_use_bytes", r#"cluster="mx""#);
    assert_eq!(sizes.len(), 3, "{three:#?}");
    assert!(sizes.values().all(|v| *v > 0.0), "{sizes:?}");
    // Scaling up goes through learners: two added and two promoted.
    for step in ["AddLearner", "Promote"] {
        let series = format!(r#"etcd_operator_steps_total{{step="{step}"}}"#);
        assert!(three.get(&series) - one.get(&series) >= 2.0, "{step}: {three:#?}");
    }
    assert!(three.get("etcd_operator_reconcile_duration_seconds_count") > reconciles);
    // A reconcile takes one step and never waits for the world: the longest one, bootstrap and
    // two learners joining included, is reported (a figure, not a timed assertion).
    let longest = three.get("etcd_operator_reconcile_longest_seconds");
    assert!(longest > 0.0, "{three:#?}");
    eprintln!(
        "longest reconcile: {longest:.3} s over {} reconciles",
        three.get("etcd_operator_reconcile_duration_seconds_count")
    );

    kubectl(&op, &["delete", "ec", "mx", "--timeout=60s"], None).unwrap();
    eprintln!("deleted after {:?}", started.elapsed());
    let gone = Scrape::take(&op);
    let left: Vec<&String> = gone.0.keys().filter(|s| s.contains(r#"cluster="mx""#)).collect();
    assert!(left.is_empty(), "series of the deleted cluster remain: {left:?}");
    assert!(
        gone.sum(
            "apiserver_request_total",
            r#"verb="delete",group="etcd.operator.dev""#
        ) >= 1.0,
        "{gone:#?}"
    );
}
