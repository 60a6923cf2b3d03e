//! The chart's monitoring, no API server: every metric its Grafana dashboard and its alerts name
//! is one the operator exports; the rule file, the PrometheusRule (with additional rules) and the
//! dashboard's queries (Grafana's variables replaced by placeholders) pass Prometheus' own parsers
//! (tests/promcheck); the chart ships both files unchanged; each alert has a severity,
//! annotations and a `for`.

mod ops;
mod support;

use std::collections::BTreeSet;

use ops::DASHBOARD;
use serde_json::Value;

/// The chart's alerting rules, relative to the chart's directory.
const ALERTS: &str = "alerts/briq-operator.rules.yaml";

/// Every series name the operator exports, from its own registry's text encoding: a counter
/// `x` is scraped as `x_total`, a histogram `x` as `x_bucket`, `x_sum` and `x_count`.
fn exported_metric_names() -> BTreeSet<String> {
    let text = briq_operator::metrics::Metrics::default().render();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(declared) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = declared.split_once(' ').expect("# TYPE name kind");
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "gauge" => &[""],
            other => panic!("{name}: a metric of type {other}: teach this test its series"),
        };
        names.extend(suffixes.iter().map(|suffix| format!("{name}{suffix}")));
    }
    assert!(names.len() > 10, "{text}");
    names
}

/// Runs tests/promcheck with `args` and `stdin`; the metric names it prints, or its error.
fn promcheck(args: &[&str], stdin: &str) -> Result<BTreeSet<String>, String> {
    use std::io::Write;
    let mut child = std::process::Command::new(ops::tool("promcheck"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running promcheck (tests/tools/build.sh builds it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// A Grafana query with its variables replaced by something PromQL parses: `$__rate_interval`,
/// `$__interval`, `$__range` (and any `$__…`) by a duration, `$namespace`, `${pod}`, … by a
/// label value.
fn without_grafana_variables(query: &str) -> String {
    let mut out = String::new();
    let mut rest = query;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let braced = after.starts_with('{');
        let name_start = usize::from(braced);
        let name_len = after[name_start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len() - name_start);
        let name = &after[name_start..name_start + name_len];
        assert!(!name.is_empty(), "a lone $ in {query}");
        let mut end = name_start + name_len;
        if braced {
            assert!(after[end..].starts_with('}'), "unclosed ${{ in {query}");
            end += 1;
        }
        out.push_str(if name.starts_with("__") { "5m" } else { "x" });
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The PromQL of a dashboard: every panel target's `expr` (rows' panels too) and the selector
/// of every `label_values(selector, label)` variable query.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn walk(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(fields) => {
                if let Some(Value::Array(targets)) = fields.get("targets") {
                    for target in targets {
                        let expr = target["expr"].as_str().expect("a target without expr");
                        found.push(expr.to_owned());
                    }
                }
                fields.values().for_each(|v| walk(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(&dashboard["panels"], &mut found);
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .expect("a query variable's query");
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable query {query}: only label_values(…) is checked"));
        let (selector, _label) = inner
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        found.push(selector.trim().to_owned());
    }
    found
}

#[test]
fn every_metric_the_dashboard_and_alerts_name_is_one_the_operator_exports() {
    let chart = ops::chart_dir();
    let dashboard_text = std::fs::read_to_string(chart.join(DASHBOARD)).unwrap();
    let alerts_text = std::fs::read_to_string(chart.join(ALERTS)).unwrap();
    let dashboard: Value = serde_json::from_str(&dashboard_text).expect("the dashboard is JSON");
    let alerts: Value = serde_yaml_ng::from_str(&alerts_text).expect("the rule file is YAML");

    // The chart ships both files unchanged.
    let documents = ops::template(
        "obs",
        "briq-system",
        &[
            "--set",
            "grafanaDashboard.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
            "--set-json",
            r#"prometheusRule.additionalRules=[{"alert":"Extra","expr":"up == 0","for":"5m"}]"#,
        ],
    );
    let configmap = ops::find(&documents, "ConfigMap");
    assert_eq!(configmap.len(), 1);
    assert_eq!(configmap[0]["metadata"]["labels"]["grafana_dashboard"], "1");
    assert!(
        configmap[0]["data"]["briq-operator.json"] == dashboard_text.as_str(),
        "the ConfigMap's briq-operator.json differs from {DASHBOARD}"
    );
    let rule = ops::find(&documents, "PrometheusRule");
    assert_eq!(rule.len(), 1);
    let groups = rule[0]["spec"]["groups"].as_array().unwrap();
    let shipped = alerts["groups"].as_array().unwrap();
    assert_eq!(&groups[..shipped.len()], &shipped[..], "{ALERTS} changed");
    assert_eq!(
        groups.len(),
        shipped.len() + 1,
        "the additional rules' group"
    );
    assert_eq!(groups[shipped.len()]["rules"][0]["alert"], "Extra");

    // Each alert says how urgent it is, what it means and what to do, after a while.
    let mut alert_names = Vec::new();
    for group in shipped {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().expect("only alerts");
            alert_names.push(name);
            assert!(rule["for"].is_string(), "{name}: for");
            for field in ["summary", "description", "runbook", "runbook_url"] {
                assert!(rule["annotations"][field].is_string(), "{name}: {field}");
            }
            assert!(
                ["info", "warning", "critical"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{name}: severity"
            );
        }
    }
    assert!(alert_names.len() >= 5, "{alert_names:?}");

    // Prometheus' own parsers: the rule file as Prometheus loads it (strictly, every expr and
    // template too), the PrometheusRule's groups (with the additional rules) likewise, and the
    // dashboard's queries.
    let from_alerts = promcheck(&["rules", chart.join(ALERTS).to_str().unwrap()], "")
        .unwrap_or_else(|error| panic!("{ALERTS}: {error}"));
    let deployed = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    let spec = serde_yaml_ng::to_string(&rule[0]["spec"]).unwrap();
    std::fs::write(deployed.path(), spec).unwrap();
    promcheck(&["rules", deployed.path().to_str().unwrap()], "")
        .unwrap_or_else(|error| panic!("the PrometheusRule's groups: {error}"));
    let queries: Vec<String> = dashboard_queries(&dashboard)
        .iter()
        .map(|query| without_grafana_variables(query).replace('\n', " "))
        .collect();
    assert!(queries.len() >= 15, "{queries:#?}");
    let from_dashboard = promcheck(&["exprs"], &queries.join("\n"))
        .unwrap_or_else(|error| panic!("{DASHBOARD}: {error}"));
    assert!(promcheck(&["exprs"], "sum(rate(x[5m]").is_err());

    let exported = exported_metric_names();
    for (source, names) in [(ALERTS, &from_alerts), (DASHBOARD, &from_dashboard)] {
        assert!(!names.is_empty(), "{source} names no metric");
        let unknown: Vec<&String> = names.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{source} names metrics the operator does not export: {unknown:?}\nexported: {exported:#?}"
        );
    }
}

#[test]
fn grafana_variables_become_parseable_placeholders() {
    assert_eq!(
        without_grafana_variables(
            r#"rate(m{namespace=~"$namespace", pod=~"${pod}"}[$__rate_interval])"#
        ),
        r#"rate(m{namespace=~"x", pod=~"x"}[5m])"#
    );
}
