//! The chart's Grafana dashboard and alert rules cannot drift from the metrics the operator
//! serves. The chart is rendered with helm 4 (`ci/monitoring-values.yaml`: the dashboard
//! ConfigMap and the `PrometheusRule` on); every PromQL expression of the dashboard (panels and
//! `label_values` variables) and of the rules is parsed with `promql-parser`, and every metric
//! name it refers to is checked against `kubectl get --raw /metrics` of a real `etcd-operator
//! local` (real etcd 3.5.1 members) while the run produces the conditional series too: a
//! scheduled backup that succeeds and one that fails, an EtcdBackup that succeeds and one that
//! fails, a paused cluster (a wait), a cluster to restore from an EtcdBackup that does not exist
//! (a failed reconcile). Each alert links to its section of docs/day2.md.
//!
//! The pure checks (a bogus name, an unparsable expression, a sample-less family) are unit tests
//! of `etcd_operator_tests::promql_refs`.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use etcd_operator_tests::LocalOperator;
use etcd_operator_tests::kube::{helm, run};
use etcd_operator_tests::kubectl::{apply, kubectl};
use etcd_operator_tests::promql_refs::{
    Expression, Served, dashboard_expressions, metric_refs, rule_expressions,
};
use etcd_operator_tests::tools::workspace_root;
use serde_json::Value;

/// Families checked by their `# TYPE` declaration alone, each with the reason the run cannot
/// produce a sample. Empty: the run below produces a sample of every family the dashboard and
/// the rules use. (prometheus-client declares a labelled family only once it has a sample, so a
/// family listed here must still be declared by the scrape, which the test checks.)
const DECLARED_ONLY: &[(&str, &str)] = &[];

/// Families the operator serves that the dashboard and the rules leave out on purpose, each with
/// the reason. A family added to the operator fails the e2e test until it is shown (or listed
/// here).
const NOT_SHOWN: &[(&str, &str)] = &[
    ("etcd_operator_jemalloc_allocated_bytes", JEMALLOC),
    ("etcd_operator_jemalloc_active_bytes", JEMALLOC),
    ("etcd_operator_jemalloc_resident_bytes", JEMALLOC),
    ("etcd_operator_jemalloc_mapped_bytes", JEMALLOC),
    ("etcd_operator_jemalloc_retained_bytes", JEMALLOC),
    ("etcd_operator_jemalloc_metadata_bytes", JEMALLOC),
];

/// Why the allocator's series are not on the dashboard.
const JEMALLOC: &str = "the allocator's own account of the process's memory, for telling live \
     memory from pages the allocator keeps when the RSS is in question (docs/performance.md); \
     nothing about the fleet or the operator's work";

fn chart() -> PathBuf {
    workspace_root().join("charts").join("etcd-operator")
}

/// The chart rendered with the dashboard and the rules on: the dashboards (file name, JSON) and
/// the `PrometheusRule`.
fn rendered() -> (Vec<(String, Value)>, Value) {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = helm(None, home.path()).unwrap_or_else(|e| panic!("{e}"));
    cmd.args(["template", "etcd-operator"])
        .arg(chart())
        .args([
            "--namespace",
            "etcd-operator",
            "--kube-version",
            "1.35",
            "--values",
        ])
        .arg(chart().join("ci").join("monitoring-values.yaml"));
    let out = run(&mut cmd).unwrap_or_else(|e| panic!("{e}"));
    let yaml = String::from_utf8(out.stdout).unwrap();
    let mut dashboards = Vec::new();
    let mut rules = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&yaml) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
        let doc = serde_json::to_value(value).unwrap();
        match doc["kind"].as_str() {
            Some("ConfigMap") if doc["metadata"]["name"] == "etcd-operator-dashboards" => {
                for (file, json) in doc["data"].as_object().unwrap() {
                    let json: Value = serde_json::from_str(json.as_str().unwrap())
                        .unwrap_or_else(|e| panic!("dashboard {file} is not JSON: {e}"));
                    dashboards.push((file.clone(), json));
                }
            }
            Some("PrometheusRule") => rules.push(doc),
            _ => {}
        }
    }
    let [rule] = <[Value; 1]>::try_from(rules).unwrap_or_else(|r| panic!("{} PrometheusRules", r.len()));
    assert!(!dashboards.is_empty(), "no dashboard ConfigMap rendered");
    (dashboards, rule)
}

/// Every expression of the rendered dashboards and rules; a problem (an unknown dashboard
/// variable, a rule without an expression) fails the test.
fn expressions() -> Vec<Expression> {
    let (dashboards, rule) = rendered();
    let mut all = Vec::new();
    let mut problems = Vec::new();
    for (file, dashboard) in &dashboards {
        let (found, wrong) = dashboard_expressions(dashboard);
        assert!(found.len() >= 20, "{file}: only {} expressions", found.len());
        all.extend(found.into_iter().map(|e| Expression {
            origin: format!("{file}: {}", e.origin),
            ..e
        }));
        problems.extend(wrong);
    }
    for (file, dashboard) in &dashboards {
        problems.extend(
            layout_problems(dashboard)
                .into_iter()
                .map(|p| format!("{file}: {p}")),
        );
    }
    let (found, wrong) = rule_expressions(&rule);
    assert!(found.len() >= 10, "only {} rules", found.len());
    all.extend(found);
    problems.extend(wrong);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    all
}

/// What Grafana needs of a dashboard it is given as a file: a `uid`, panels with unique ids on
/// the 24-column grid, each query target with a `refId` unique in its panel and a data source.
fn layout_problems(dashboard: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if !dashboard["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty() && u.len() <= 40)
    {
        problems.push("no uid of at most 40 characters".to_owned());
    }
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        if !panel["id"].as_u64().is_some_and(|id| ids.insert(id)) {
            problems.push(format!("panel {title:?}: missing or repeated id"));
        }
        let g = &panel["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap_or(99), g["w"].as_u64().unwrap_or(99));
        if x + w > 24 || g["h"].as_u64().is_none() || g["y"].as_u64().is_none() {
            problems.push(format!("panel {title:?}: gridPos {g} is off the 24-column grid"));
        }
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        let refs: BTreeSet<&str> = targets.iter().filter_map(|t| t["refId"].as_str()).collect();
        if targets.is_empty() || refs.len() != targets.len() {
            problems.push(format!("panel {title:?}: targets without a unique refId"));
        }
        if targets.iter().any(|t| t["datasource"]["uid"] != "${datasource}") {
            problems.push(format!(
                "panel {title:?}: a target not on the $datasource variable"
            ));
        }
    }
    problems
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation but `-` and `_` dropped,
/// spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_expression_parses_and_every_alert_has_a_runbook_section() {
    let all = expressions();
    let unparsable: Vec<String> = all
        .iter()
        .filter_map(|e| {
            metric_refs(&e.promql)
                .err()
                .map(|why| format!("{}: {why}", e.origin))
        })
        .collect();
    assert!(unparsable.is_empty(), "{}", unparsable.join("\n"));

    let day2 = std::fs::read_to_string(workspace_root().join("docs").join("day2.md")).unwrap();
    let anchors: BTreeSet<String> = day2
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(anchor)
        .collect();
    let (_, rule) = rendered();
    let mut alerts = BTreeSet::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let alert = r["alert"].as_str().unwrap();
            alerts.insert(alert.to_owned());
            let url = r["annotations"]["runbook_url"].as_str().unwrap_or_default();
            let (page, section) = url
                .split_once('#')
                .unwrap_or_else(|| panic!("{alert}: runbook_url {url:?} has no section"));
            assert!(page.ends_with("/docs/day2.md"), "{alert}: {url}");
            assert_eq!(
                section,
                alert.to_lowercase(),
                "{alert}: the section is the alert's name"
            );
            assert!(
                anchors.contains(section),
                "{alert}: docs/day2.md has no `### {alert}` section for {url}"
            );
            assert!(
                matches!(r["labels"]["severity"].as_str(), Some("warning" | "critical")),
                "{alert}: {r}"
            );
            for key in ["summary", "description"] {
                assert!(r["annotations"][key].is_string(), "{alert}: no {key}");
            }
        }
    }
    // What issue 25 asks for: quorum at risk, member down, NOSPACE/CORRUPT, quota, backups,
    // halted upgrades, API 5xx.
    for want in [
        "EtcdClusterQuorumAtRisk",
        "EtcdMemberDown",
        "EtcdClusterNoSpaceAlarm",
        "EtcdClusterCorruptAlarm",
        "EtcdClusterDatabaseNearQuota",
        "EtcdClusterBackupTooOld",
        "EtcdClusterUpgradeHalted",
        "EtcdOperatorAPIServerErrors",
    ] {
        assert!(alerts.contains(want), "no alert {want}: {alerts:?}");
    }
}

fn cluster_yaml(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: 1\n  version: 3.5.1\n{extra}"
    )
}

fn backup_schedule(path: &str) -> String {
    format!(
        "  backup:\n    schedule: \"*/2 * * * * *\"\n    retention:\n      maxCount: 2\n    destination:\n      volume:\n        path: {path}\n"
    )
}

#[tokio::test]
async fn dashboard_and_rules_refer_only_to_metrics_the_operator_serves() {
    let all = expressions();
    let op = LocalOperator::start().await.unwrap();
    let backups = tempfile::tempdir().unwrap();
    let dir = backups.path().display().to_string();
    // A scheduled backup that succeeds, one that cannot write (its directory's parent is a
    // file), a paused cluster (the planner waits), a cluster to restore from an EtcdBackup that
    // does not exist (its reconciles fail), an EtcdBackup that succeeds and one of a cluster
    // without any destination (fails at once).
    let blocker = backups.path().join("a-file");
    std::fs::write(&blocker, b"not a directory").unwrap();
    apply(&op, &cluster_yaml("drift", &backup_schedule(&dir))).unwrap();
    apply(
        &op,
        &cluster_yaml("nodest", &backup_schedule(&format!("{}/sub", blocker.display()))),
    )
    .unwrap();
    apply(&op, &cluster_yaml("held", "  paused: true\n")).unwrap();
    apply(
        &op,
        &cluster_yaml(
            "unrestorable",
            "  bootstrap:\n    restore:\n      backupName: missing\n",
        ),
    )
    .unwrap();
    let backup = |name: &str, cluster: &str, destination: &str| {
        format!(
            "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdBackup\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  clusterName: {cluster}\n{destination}"
        )
    };
    apply(
        &op,
        &backup(
            "once",
            "drift",
            &format!("  destination:\n    volume:\n      path: {dir}\n"),
        ),
    )
    .unwrap();
    apply(&op, &backup("nowhere", "held", "")).unwrap();

    let declared: Vec<&str> = DECLARED_ONLY.iter().map(|(family, _)| *family).collect();
    let started = Instant::now();
    // Generous: on a loaded 2-core machine the members' first start alone can take a minute.
    let deadline = started + Duration::from_secs(180);
    let (served, problems) = loop {
        let text = kubectl(&op, &["get", "--raw", "/metrics"], None).unwrap();
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
        let served = Served::parse(&text);
        let problems = served.check(&all, &declared);
        if problems.is_empty() || Instant::now() > deadline {
            break (served, problems);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(
        problems.is_empty(),
        "the dashboard or the rules refer to metrics /metrics does not serve (after {:?}):\n{}\n\n\
         declared families: {:?}",
        started.elapsed(),
        problems.join("\n"),
        served.families.keys().collect::<Vec<_>>()
    );
    eprintln!(
        "{} expressions checked against {} families after {:?}",
        all.len(),
        served.families.len(),
        started.elapsed()
    );
    // The families checked by declaration alone are declared, and still have no sample (once
    // they do, they belong to the checked ones).
    for (family, why) in DECLARED_ONLY {
        let f = served
            .families
            .get(*family)
            .unwrap_or_else(|| panic!("{family} is not even declared ({why})"));
        assert!(!f.sampled, "{family} has samples now: drop it from DECLARED_ONLY");
    }
    // Every family the run produced is one the dashboard or the rules use, or is listed here
    // as deliberately left out: a new family is noticed.
    let referenced: BTreeSet<String> = all
        .iter()
        .flat_map(|e| metric_refs(&e.promql).unwrap())
        .filter_map(|r| served.family_of(&r.name).map(|(f, _)| f.to_owned()))
        .collect();
    let unused: Vec<&String> = served
        .families
        .keys()
        .filter(|f| !referenced.contains(*f) && !NOT_SHOWN.iter().any(|(n, _)| n == f))
        .collect();
    assert!(
        unused.is_empty(),
        "families neither the dashboard nor the rules use: {unused:?}; show them in \
         charts/etcd-operator/dashboards/etcd-operator.json or list them in NOT_SHOWN with the reason"
    );
}

#[test]
fn the_layout_check_finds_what_grafana_would_refuse() {
    let (dashboards, _) = rendered();
    for (file, dashboard) in &dashboards {
        assert_eq!(layout_problems(dashboard), Vec::<String>::new(), "{file}");
    }
    let mut broken = dashboards[0].1.clone();
    let panels = broken["panels"].as_array_mut().unwrap();
    let first_id = panels[0]["id"].clone();
    panels[1]["id"] = first_id;
    panels[2]["gridPos"]["x"] = 22.into();
    let again = panels[3]["targets"][0].clone();
    panels[3]["targets"].as_array_mut().unwrap().push(again);
    panels[4]["targets"][0]["datasource"]["uid"] = "prometheus".into();
    broken["uid"] = Value::Null;
    let problems = layout_problems(&broken).join("\n");
    for want in [
        "no uid",
        "missing or repeated id",
        "is off the 24-column grid",
        "targets without a unique refId",
        "a target not on the $datasource variable",
    ] {
        assert!(problems.contains(want), "want {want:?} in\n{problems}");
    }
}
