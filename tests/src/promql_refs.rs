//! The metric names a Grafana dashboard and Prometheus alert rules refer to, and whether a
//! `/metrics` scrape serves them: the chart's dashboard and `PrometheusRule` cannot drift from
//! the series the operator really serves (tests/tests/monitoring_drift.rs).
//!
//! Every expression is parsed with `promql-parser` (the AST, not text matching): a metric name is
//! the name of a vector or matrix selector, or its `__name__="..."` matcher. A selector that
//! names no metric (`{__name__=~"..."}`) cannot be checked and is reported. Grafana's template
//! variables are interpolated first, as Grafana would (`$__rate_interval`, `$var`, `${var}`).
//!
//! A scrape in the OpenMetrics text format declares each family (`# TYPE name type`) even when it
//! has no sample yet; a counter family `x` serves `x_total`, a histogram `x` serves `x_bucket`,
//! `x_sum` and `x_count`. [`Served::check`] maps every referenced name to its family and
//! reports names no family serves, and families that had no sample in the run unless they are
//! listed as checked by declaration alone.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::label::MatchOp;
use promql_parser::parser::{Expr, VectorSelector};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::Value;

/// An expression and where it came from (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expression {
    /// E.g. `dashboard panel "Member health" (A)` or `alert EtcdMemberDown`.
    pub origin: String,
    /// The PromQL text, template variables already interpolated.
    pub promql: String,
}

/// A metric a selector refers to, with the label names its matchers use.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricRef {
    /// The metric name, as Prometheus stores the series (`x_total`, `x_bucket`, ...).
    pub name: String,
    /// Label names the selector matches on (`__name__` left out).
    pub labels: BTreeSet<String>,
}

struct Collect {
    refs: Vec<MetricRef>,
    unnamed: Vec<String>,
}

impl Collect {
    fn selector(&mut self, vs: &VectorSelector) {
        let by_matcher = vs
            .matchers
            .matchers
            .iter()
            .find(|m| m.name == "__name__" && matches!(m.op, MatchOp::Equal))
            .map(|m| m.value.clone());
        let labels = vs
            .matchers
            .matchers
            .iter()
            .chain(vs.matchers.or_matchers.iter().flatten())
            .filter(|m| m.name != "__name__")
            .map(|m| m.name.clone())
            .collect();
        match vs.name.clone().or(by_matcher) {
            Some(name) => self.refs.push(MetricRef { name, labels }),
            None => self.unnamed.push(vs.to_string()),
        }
    }
}

impl ExprVisitor for Collect {
    type Error = std::convert::Infallible;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
        match expr {
            Expr::VectorSelector(vs) => self.selector(vs),
            Expr::MatrixSelector(ms) => self.selector(&ms.vs),
            _ => {}
        }
        Ok(true)
    }
}

/// The metrics `promql` refers to. An expression that does not parse, or a selector that names
/// no metric, is an error saying so.
pub fn metric_refs(promql: &str) -> Result<Vec<MetricRef>, String> {
    let expr = promql_parser::parser::parse(promql).map_err(|e| format!("does not parse as PromQL: {e}"))?;
    let mut visitor = Collect {
        refs: Vec::new(),
        unnamed: Vec::new(),
    };
    let Ok(_) = walk_expr(&mut visitor, &expr);
    if !visitor.unnamed.is_empty() {
        return Err(format!(
            "selects series without naming a metric ({}): its names cannot be checked",
            visitor.unnamed.join(", ")
        ));
    }
    Ok(visitor.refs)
}

/// The value a dashboard variable stands for when an expression is checked: `.*` for a query
/// variable (a regex match on it then matches anything), the text of a textbox or constant, the
/// first option of a custom variable.
fn variable_values(dashboard: &Value) -> BTreeMap<String, String> {
    let mut values = BTreeMap::new();
    for builtin in ["__rate_interval", "__interval", "__range"] {
        values.insert(builtin.to_owned(), "5m".to_owned());
    }
    for builtin in ["__interval_ms", "__range_ms", "__range_s"] {
        values.insert(builtin.to_owned(), "300".to_owned());
    }
    for var in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        let Some(name) = var["name"].as_str() else {
            continue;
        };
        let value = match var["type"].as_str() {
            Some("textbox" | "constant") => var["query"].as_str().unwrap_or_default().to_owned(),
            Some("custom") => var["query"]
                .as_str()
                .and_then(|q| q.split(',').next())
                .unwrap_or_default()
                .trim()
                .to_owned(),
            _ => ".*".to_owned(),
        };
        values.insert(name.to_owned(), value);
    }
    values
}

/// `text` with Grafana's `$name`, `${name}` and `${name:format}` replaced from `values`; an
/// unknown variable is an error.
pub fn interpolate(text: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {text:?}"))?;
            let inner = &braced[..end];
            (inner.split(':').next().unwrap_or(inner), end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        let value = values
            .get(name)
            .ok_or_else(|| format!("refers to ${name}, which is no variable of the dashboard"))?;
        out.push_str(value);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The series selector of a Grafana variable query `label_values(selector, label)`, `None` for
/// `label_values(label)` and queries of other shapes that name no metric.
fn label_values_selector(query: &str) -> Option<&str> {
    let args = query.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, _label) = args.rsplit_once(',')?;
    Some(selector.trim())
}

/// Every PromQL expression of a Grafana dashboard (its panels' and rows' targets, and its query
/// variables' `label_values` selectors), interpolated; errors for variables that do not resolve.
pub fn dashboard_expressions(dashboard: &Value) -> (Vec<Expression>, Vec<String>) {
    let values = variable_values(dashboard);
    let mut found = Vec::new();
    let mut problems = Vec::new();
    let mut push = |origin: String, raw: &str| match interpolate(raw, &values) {
        Ok(promql) => found.push(Expression { origin, promql }),
        Err(e) => problems.push(format!("{origin}: {e}")),
    };
    let mut stack: Vec<&Value> = dashboard["panels"].as_array().into_iter().flatten().collect();
    while let Some(panel) = stack.pop() {
        stack.extend(panel["panels"].as_array().into_iter().flatten());
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let id = target["refId"].as_str().unwrap_or("?");
                push(format!("dashboard panel {title:?} ({id})"), expr);
            }
        }
    }
    for var in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] != "query" {
            continue;
        }
        let query = var["query"]["query"]
            .as_str()
            .or_else(|| var["query"].as_str())
            .unwrap_or_default();
        if let Some(selector) = label_values_selector(query) {
            let name = var["name"].as_str().unwrap_or("?");
            push(format!("dashboard variable ${name}"), selector);
        }
    }
    (found, problems)
}

/// Every rule expression of a `PrometheusRule` object (or of a rule file's `groups`); a rule
/// without a string `expr` is a problem.
pub fn rule_expressions(rules: &Value) -> (Vec<Expression>, Vec<String>) {
    let groups = rules["spec"]["groups"]
        .as_array()
        .or_else(|| rules["groups"].as_array());
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for group in groups.into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            let origin = rule["alert"]
                .as_str()
                .map(|a| format!("alert {a}"))
                .or_else(|| rule["record"].as_str().map(|r| format!("recording rule {r}")))
                .unwrap_or_else(|| "rule without a name".to_owned());
            match rule["expr"].as_str() {
                Some(expr) => found.push(Expression {
                    origin,
                    promql: expr.to_owned(),
                }),
                None => problems.push(format!("{origin}: expr is not a string: {}", rule["expr"])),
            }
        }
    }
    (found, problems)
}

/// A metric family a scrape declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Family {
    /// Its `# TYPE` (`counter`, `gauge`, `histogram`, ...).
    pub kind: String,
    /// Whether it had at least one sample.
    pub sampled: bool,
    /// The label names its samples carry (`le` of histogram buckets included).
    pub labels: BTreeSet<String>,
}

/// What one `/metrics` scrape serves, by family.
#[derive(Debug, Clone, Default)]
pub struct Served {
    /// Family name to what it served.
    pub families: BTreeMap<String, Family>,
}

/// The suffixes a family of each type serves its samples under (OpenMetrics).
fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count", "_created", "_gsum", "_gcount"],
        "summary" => &["_sum", "_count", "_created", ""],
        "info" => &["_info"],
        _ => &[""],
    }
}

/// Labels Prometheus adds to every scraped series (target labels), which `/metrics` does not
/// carry, and which expressions may match on.
pub const TARGET_LABELS: [&str; 6] = ["job", "instance", "pod", "service", "endpoint", "container"];

impl Served {
    /// Parses a scrape in the (OpenMetrics or Prometheus) text format.
    pub fn parse(text: &str) -> Self {
        let mut served = Self::default();
        for line in text.lines() {
            if let Some(decl) = line.strip_prefix("# TYPE ") {
                let mut parts = decl.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    served.families.entry(name.to_owned()).or_default().kind = kind.to_owned();
                }
            }
        }
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let series = &line[..end];
            let labels: BTreeSet<String> = match line[end..].strip_prefix('{') {
                Some(rest) => label_names(rest),
                None => BTreeSet::new(),
            };
            if let Some(family) = served.family_of_mut(series) {
                family.sampled = true;
                family.labels.extend(labels);
            }
        }
        served
    }

    /// The family a stored series name belongs to.
    pub fn family_of(&self, series: &str) -> Option<(&str, &Family)> {
        self.families
            .iter()
            .filter(|(name, family)| {
                series
                    .strip_prefix(name.as_str())
                    .is_some_and(|suffix| suffixes(&family.kind).contains(&suffix))
            })
            // `x_total` of a counter `x` over a gauge named `x_total`: the longest name wins.
            .max_by_key(|(name, _)| name.len())
            .map(|(name, family)| (name.as_str(), family))
    }

    fn family_of_mut(&mut self, series: &str) -> Option<&mut Family> {
        let name = self.family_of(series)?.0.to_owned();
        self.families.get_mut(&name)
    }

    /// The problems of `expressions` against this scrape: expressions that do not parse, metric
    /// names no family serves, label names no sample of the family carries (target labels
    /// aside), and families without a sample in this run unless `declared_only` lists them.
    pub fn check(&self, expressions: &[Expression], declared_only: &[&str]) -> Vec<String> {
        let mut problems = Vec::new();
        for e in expressions {
            let refs = match metric_refs(&e.promql) {
                Ok(refs) => refs,
                Err(why) => {
                    problems.push(format!("{}: `{}` {why}", e.origin, e.promql));
                    continue;
                }
            };
            for r in refs {
                let Some((family, served)) = self.family_of(&r.name) else {
                    problems.push(format!(
                        "{}: refers to `{}`, which /metrics does not serve (no family declares it)",
                        e.origin, r.name
                    ));
                    continue;
                };
                if !served.sampled {
                    if !declared_only.contains(&family) {
                        problems.push(format!(
                            "{}: `{}` (family `{family}`) is declared but had no sample in this run: \
                             make the run produce it, or list the family as checked by declaration alone \
                             with the reason",
                            e.origin, r.name
                        ));
                    }
                    continue;
                }
                for label in &r.labels {
                    if !served.labels.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
                        problems.push(format!(
                            "{}: matches `{}` on label `{label}`, which no sample of `{family}` carries \
                             (it has: {})",
                            e.origin,
                            r.name,
                            served.labels.iter().cloned().collect::<Vec<_>>().join(", ")
                        ));
                    }
                }
            }
        }
        problems
    }
}

/// The label names of a sample's `{...}` part (values may hold any character, quoted).
fn label_names(rest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = rest.char_indices().peekable();
    let mut start = 0;
    while let Some((i, c)) = chars.next() {
        match c {
            '=' => {
                names.insert(rest[start..i].trim().trim_start_matches(',').trim().to_owned());
                // Skip the quoted value, escapes included.
                if chars.next_if(|(_, c)| *c == '"').is_some() {
                    let mut escaped = false;
                    for (_, c) in chars.by_ref() {
                        if escaped {
                            escaped = false;
                        } else if c == '\\' {
                            escaped = true;
                        } else if c == '"' {
                            break;
                        }
                    }
                }
                start = chars.peek().map_or(rest.len(), |(j, _)| *j);
            }
            '}' => break,
            _ => {}
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    const SCRAPE: &str = "\
# HELP apiserver_request Requests answered.
# TYPE apiserver_request counter
apiserver_request_total{verb=\"get\",code=\"200\"} 3
# HELP apiserver_request_duration_seconds Time.
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_sum{verb=\"get\"} 0.1
apiserver_request_duration_seconds_count{verb=\"get\"} 3
apiserver_request_duration_seconds_bucket{le=\"0.005\",verb=\"get\"} 3
# HELP etcd_operator_member_healthy Health.
# TYPE etcd_operator_member_healthy gauge
etcd_operator_member_healthy{namespace=\"d\",cluster=\"x\",member=\"a=b\\\"c\"} 1
# HELP etcd_operator_reconcile_errors Errors.
# TYPE etcd_operator_reconcile_errors counter
# EOF
";

    fn exprs(list: &[&str]) -> Vec<Expression> {
        list.iter()
            .map(|e| Expression {
                origin: "test".into(),
                promql: (*e).into(),
            })
            .collect()
    }

    #[test]
    fn a_scrape_is_read_by_family_with_its_labels() {
        let s = Served::parse(SCRAPE);
        assert_eq!(
            s.family_of("apiserver_request_total").unwrap().0,
            "apiserver_request"
        );
        assert_eq!(
            s.family_of("apiserver_request_duration_seconds_bucket")
                .unwrap()
                .0,
            "apiserver_request_duration_seconds"
        );
        // A histogram family has no series of its bare name; a counter none without `_total`.
        assert!(s.family_of("apiserver_request_duration_seconds").is_none());
        assert!(s.family_of("apiserver_request").is_none());
        let healthy = &s.families["etcd_operator_member_healthy"];
        assert!(healthy.sampled);
        assert_eq!(
            healthy.labels.iter().map(String::as_str).collect::<Vec<_>>(),
            ["cluster", "member", "namespace"]
        );
        assert!(!s.families["etcd_operator_reconcile_errors"].sampled);
    }

    #[test]
    fn served_names_pass_and_bogus_names_unparsable_expressions_and_missing_samples_fail() {
        let s = Served::parse(SCRAPE);
        let good = exprs(&[
            "sum by (verb) (rate(apiserver_request_total{job=\"x\",code=~\"5..\"}[5m]))",
            "histogram_quantile(0.99, sum by (le) (rate(apiserver_request_duration_seconds_bucket[5m])))",
            "min by (namespace, cluster) (etcd_operator_member_healthy) == 0",
            "{__name__=\"etcd_operator_member_healthy\", member!=\"\"}",
            // A constant line (a threshold drawn beside a series) names no metric: nothing to check.
            "vector(805306368)",
        ]);
        assert_eq!(s.check(&good, &[]), Vec::<String>::new());

        let bad = exprs(&[
            "etcd_operator_member_healthyy == 0",
            "sum(rate(apiserver_request_total[5m]) by (verb)",
            "apiserver_request_duration_seconds > 1",
            "{__name__=~\"etcd_operator_.*\"}",
            "etcd_operator_member_healthy{etcdcluster=\"x\"}",
            "rate(etcd_operator_reconcile_errors_total[5m])",
        ]);
        let problems = s.check(&bad, &[]);
        let want = [
            "refers to `etcd_operator_member_healthyy`, which /metrics does not serve",
            "does not parse as PromQL",
            "refers to `apiserver_request_duration_seconds`, which /metrics does not serve",
            "selects series without naming a metric",
            "on label `etcdcluster`, which no sample of `etcd_operator_member_healthy` carries",
            "(family `etcd_operator_reconcile_errors`) is declared but had no sample in this run",
        ];
        assert_eq!(problems.len(), want.len(), "{problems:#?}");
        for (p, w) in problems.iter().zip(want) {
            assert!(p.contains(w), "want {w:?} in {p:?}");
        }
        // Listed as checked by declaration alone, the sample-less family passes.
        let declared = exprs(&["rate(etcd_operator_reconcile_errors_total[5m])"]);
        assert_eq!(
            s.check(&declared, &["etcd_operator_reconcile_errors"]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn dashboards_and_rules_give_their_expressions_interpolated() {
        let dashboard = serde_json::json!({
            "templating": {"list": [
                {"name": "cluster", "type": "query",
                 "query": {"query": "label_values(etcd_operator_member_healthy{namespace=~\"$ns\"}, cluster)"}},
                {"name": "ns", "type": "query", "query": "label_values(namespace)"},
                {"name": "quota", "type": "textbox", "query": "1024"}
            ]},
            "panels": [
                {"type": "row", "title": "r", "panels": [
                    {"title": "inner", "targets": [{"refId": "A",
                      "expr": "rate(apiserver_request_total{cluster=~\"${cluster:regex}\"}[$__rate_interval])"}]}
                ]},
                {"title": "quota", "targets": [{"refId": "B", "expr": "vector($quota)"}]},
                {"title": "typo", "targets": [{"refId": "C", "expr": "up{x=\"$nope\"}"}]}
            ]
        });
        let (found, problems) = dashboard_expressions(&dashboard);
        let got: Vec<(&str, &str)> = found
            .iter()
            .map(|e| (e.origin.as_str(), e.promql.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("dashboard panel \"quota\" (B)", "vector(1024)"),
                (
                    "dashboard panel \"inner\" (A)",
                    "rate(apiserver_request_total{cluster=~\".*\"}[5m])"
                ),
                (
                    "dashboard variable $cluster",
                    "etcd_operator_member_healthy{namespace=~\".*\"}"
                ),
            ]
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("$nope, which is no variable"),
            "{problems:?}"
        );

        let rules = serde_json::json!({"spec": {"groups": [{"name": "g", "rules": [
            {"alert": "A", "expr": "up == 0"},
            {"record": "r", "expr": "sum(up)"},
            {"alert": "NoExpr"}
        ]}]}});
        let (found, problems) = rule_expressions(&rules);
        assert_eq!(
            found.iter().map(|e| e.origin.as_str()).collect::<Vec<_>>(),
            ["alert A", "recording rule r"]
        );
        assert_eq!(problems, ["alert NoExpr: expr is not a string: null"]);
    }
}
