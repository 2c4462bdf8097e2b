//! What `kubectl etcd status` prints, from an EtcdCluster's status alone: a summary line, the
//! members table, the conditions and the last backup. Pure: the clock comes in as an argument.

use std::fmt::Write as _;

use etcd_operator_api::status::{BackupStatus, EtcdClusterStatus, MemberStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Columns laid out like kubectl's tables: left-aligned, three spaces apart, no trailing space.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("   ");
            }
            let width = widths.get(i).copied().unwrap_or(0);
            let _ = write!(line, "{cell:<width$}");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A byte count the way people read it: `512 B`, `20 KiB`, `1.5 MiB`.
pub fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let name = UNITS.get(unit).copied().unwrap_or("B");
    if value >= 10.0 || value.fract() < 0.05 {
        format!("{value:.0} {name}")
    } else {
        format!("{value:.1} {name}")
    }
}

/// How long ago `then` was, as kubectl's AGE column says it (`45s`, `12m`, `5h`, `3d`).
pub fn age(then: jiff::Timestamp, now: jiff::Timestamp) -> String {
    let secs = now.as_second().saturating_sub(then.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn yes_no(flag: Option<bool>, yes: &str) -> String {
    match flag {
        Some(true) => yes.to_owned(),
        Some(false) => "-".to_owned(),
        None => "?".to_owned(),
    }
}

/// One row of the members table.
fn member_row(m: &MemberStatus) -> Vec<String> {
    let health = match m.healthy {
        Some(true) => "healthy",
        Some(false) => "unhealthy",
        None => "unknown",
    };
    let alarms = m
        .alarms
        .as_ref()
        .filter(|a| !a.is_empty())
        .map_or_else(|| "-".to_owned(), |a| a.join(","));
    vec![
        m.name.clone(),
        m.id.clone().unwrap_or_else(|| "-".into()),
        yes_no(m.leader, "*"),
        yes_no(m.learner, "learner"),
        m.version.clone().unwrap_or_else(|| "-".into()),
        health.to_owned(),
        m.db_size.map_or_else(|| "-".into(), bytes),
        m.db_size_in_use.map_or_else(|| "-".into(), bytes),
        alarms,
    ]
}

/// The members table.
pub fn members(members: &[MemberStatus]) -> String {
    let rows: Vec<Vec<String>> = members.iter().map(member_row).collect();
    table(
        &[
            "MEMBER", "ID", "LEADER", "LEARNER", "VERSION", "HEALTH", "DB SIZE", "IN USE", "ALARMS",
        ],
        &rows,
    )
}

/// The conditions table.
pub fn conditions(conditions: &[Condition], now: jiff::Timestamp) -> String {
    let rows: Vec<Vec<String>> = conditions
        .iter()
        .map(|c| {
            vec![
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                age(c.last_transition_time.0, now),
                c.message.clone(),
            ]
        })
        .collect();
    table(&["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], &rows)
}

/// The last backup, in one line.
pub fn last_backup(backup: Option<&BackupStatus>, now: jiff::Timestamp) -> String {
    let Some(b) = backup else {
        return "<none>".to_owned();
    };
    let mut parts = Vec::new();
    if let Some(t) = &b.time {
        parts.push(format!("{} ({} ago)", t.0, age(t.0, now)));
    }
    if let Some(r) = b.revision {
        parts.push(format!("revision {r}"));
    }
    if let Some(s) = b.size {
        parts.push(bytes(s));
    }
    if let Some(l) = &b.location {
        parts.push(format!("at {l}"));
    }
    if let Some(h) = &b.sha256 {
        parts.push(format!("sha256 {h}"));
    }
    if parts.is_empty() {
        "<none>".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The whole `status` output for cluster `namespace/name`.
pub fn status(
    namespace: &str,
    name: &str,
    status: Option<&EtcdClusterStatus>,
    now: jiff::Timestamp,
) -> String {
    let default = EtcdClusterStatus::default();
    let s = status.unwrap_or(&default);
    let mut out = String::new();
    let members_list = s.members.as_deref().unwrap_or_default();
    let _ = writeln!(
        out,
        "EtcdCluster {namespace}/{name}: phase {}, version {}, {}/{} members ready, leader {}, cluster ID {}",
        s.phase.as_ref().map_or("-", |p| p.as_str()),
        s.current_version.as_deref().unwrap_or("-"),
        s.ready_replicas.unwrap_or(0),
        s.replicas.unwrap_or(0),
        s.leader.as_deref().unwrap_or("<none>"),
        s.cluster_id.as_deref().unwrap_or("-"),
    );
    if let Some(eps) = s.client_endpoints.as_ref().filter(|e| !e.is_empty()) {
        let _ = writeln!(out, "Endpoints: {}", eps.join(","));
    }
    out.push('\n');
    if members_list.is_empty() {
        out.push_str("No members reported yet.\n");
    } else {
        out.push_str(&members(members_list));
    }
    out.push_str("\nConditions:\n");
    match s.conditions.as_deref() {
        Some(c) if !c.is_empty() => out.push_str(&conditions(c, now)),
        _ => out.push_str("<none>\n"),
    }
    let _ = writeln!(
        out,
        "\nLast backup: {}",
        last_backup(s.last_backup.as_deref(), now)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use pretty_assertions::assert_eq;

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn member(name: &str, id: &str, leader: bool, healthy: Option<bool>) -> MemberStatus {
        MemberStatus {
            name: name.into(),
            id: Some(id.into()),
            version: Some("3.5.1".into()),
            learner: Some(false),
            leader: Some(leader),
            healthy,
            db_size: Some(20_480),
            db_size_in_use: Some(16_384),
            alarms: None,
        }
    }

    #[test]
    fn sizes_and_ages_read_like_kubectl() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(20_480), "20 KiB");
        assert_eq!(bytes(1_572_864), "1.5 MiB");
        assert_eq!(bytes(805_306_368), "768 MiB");
        let now = ts("2026-11-27T01:00:00Z");
        assert_eq!(age(ts("2026-11-27T00:59:15Z"), now), "45s");
        assert_eq!(age(ts("2026-11-27T00:30:00Z"), now), "30m");
        assert_eq!(age(ts("2026-11-26T20:00:00Z"), now), "5h");
        assert_eq!(age(ts("2026-11-20T01:00:00Z"), now), "7d");
        // A clock behind the server's never says a negative age.
        assert_eq!(age(ts("2026-11-27T01:00:05Z"), now), "0s");
    }

    #[test]
    fn the_members_table_has_every_column_and_marks_the_leader() {
        let mut learner = member("demo-ccccc", "c", false, Some(false));
        learner.learner = Some(true);
        learner.alarms = Some(vec!["NOSPACE".into()]);
        learner.db_size_in_use = None;
        let out = members(&[
            member("demo-aaaaa", "8e9e05c52164694d", true, Some(true)),
            member("demo-bbbbb", "2a3c5f", false, None),
            learner,
        ]);
        assert_eq!(
            out,
            "\
MEMBER       ID                 LEADER   LEARNER   VERSION   HEALTH      DB SIZE   IN USE   ALARMS
demo-aaaaa   8e9e05c52164694d   *        -         3.5.1     healthy     20 KiB    16 KiB   -
demo-bbbbb   2a3c5f             -        -         3.5.1     unknown     20 KiB    16 KiB   -
demo-ccccc   c                  -        learner   3.5.1     unhealthy   20 KiB    -        NOSPACE
"
        );
    }

    #[test]
    fn the_whole_status_has_a_summary_conditions_and_the_last_backup() {
        let now = ts("2026-11-27T01:00:00Z");
        let s = EtcdClusterStatus {
            phase: Some(etcd_operator_api::status::ClusterPhase::Running),
            replicas: Some(1),
            ready_replicas: Some(1),
            leader: Some("demo-aaaaa".into()),
            cluster_id: Some("cdf818194e3a8c32".into()),
            current_version: Some("3.5.1".into()),
            client_endpoints: Some(vec!["http://127.0.0.1:40001".into()]),
            members: Some(vec![member("demo-aaaaa", "1", true, Some(true))]),
            conditions: Some(vec![Condition {
                type_: "Available".into(),
                status: "True".into(),
                reason: "Quorum".into(),
                message: "1/1 members healthy".into(),
                last_transition_time: Time(ts("2026-11-27T00:58:00Z")),
                observed_generation: None,
            }]),
            last_backup: Some(Box::new(BackupStatus {
                time: Some(Time(ts("2026-11-27T00:00:00Z"))),
                revision: Some(42),
                size: Some(2048),
                location: Some("/backups/demo.db".into()),
                sha256: Some("ab12".into()),
            })),
            ..Default::default()
        };
        let out = status("default", "demo", Some(&s), now);
        assert_eq!(
            out,
            "\
EtcdCluster default/demo: phase Running, version 3.5.1, 1/1 members ready, leader demo-aaaaa, cluster ID cdf818194e3a8c32
Endpoints: http://127.0.0.1:40001

MEMBER       ID   LEADER   LEARNER   VERSION   HEALTH    DB SIZE   IN USE   ALARMS
demo-aaaaa   1    *        -         3.5.1     healthy   20 KiB    16 KiB   -

Conditions:
TYPE        STATUS   REASON   AGE   MESSAGE
Available   True     Quorum   2m    1/1 members healthy

Last backup: 2026-11-27T00:00:00Z (60m ago), revision 42, 2 KiB, at /backups/demo.db, sha256 ab12
"
        );
    }

    #[test]
    fn a_cluster_without_status_says_so() {
        let out = status("ns", "new", None, ts("2026-11-27T01:00:00Z"));
        assert!(out.contains("No members reported yet."), "{out}");
        assert!(out.contains("Conditions:\n<none>"), "{out}");
        assert!(out.ends_with("Last backup: <none>\n"), "{out}");
    }
}
