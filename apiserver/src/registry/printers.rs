//! `kubectl get` columns of each resource: the column definitions and the cells of one object.
//! The HTTP layer assembles them into a `meta.k8s.io` Table. Pure.

use serde_json::{Value, json};

/// The printer columns of a resource.
#[derive(Debug)]
pub struct Printer {
    /// The column definitions (`priority: 1` columns show with `-o wide`).
    pub columns: fn() -> Value,
    /// The cells of one object (in its served version), as a JSON array.
    pub cells: fn(&Value, jiff::Timestamp) -> Value,
}

/// EtcdClusters.
pub static CLUSTERS: Printer = Printer {
    columns: cluster_columns,
    cells: cluster_cells,
};

/// EtcdBackups.
pub static BACKUPS: Printer = Printer {
    columns: backup_columns,
    cells: backup_cells,
};

/// Core Events.
pub static EVENTS: Printer = Printer {
    columns: event_columns,
    cells: event_cells,
};

/// kube-apiserver's Event columns.
pub fn event_columns() -> Value {
    let col = |name: &str, ty: &str, format: &str, description: &str, priority: i32| json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority});
    json!([
        col(
            "Last Seen",
            "string",
            "",
            "Time since the event was last seen.",
            0
        ),
        col("Type", "string", "", "Type of this event (Normal, Warning).", 0),
        col("Reason", "string", "", "Why the action was taken.", 0),
        col("Object", "string", "", "The object this event is about.", 0),
        col(
            "Subobject",
            "string",
            "",
            "The part of the object this event is about.",
            1
        ),
        col("Source", "string", "", "The component reporting this event.", 1),
        col(
            "Message",
            "string",
            "",
            "A description of the status of this operation.",
            0
        ),
        col(
            "First Seen",
            "string",
            "",
            "Time since the event was first seen.",
            1
        ),
        col("Count", "string", "", "How many times this event was seen.", 1),
        col(
            "Name",
            "string",
            "name",
            "Name must be unique within a namespace.",
            1
        ),
    ])
}

/// The time since `t` (an RFC 3339 timestamp), `<unknown>` when absent.
fn since(t: &Value, now: jiff::Timestamp) -> Option<String> {
    t.as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|at| human_duration(now.as_second() - at.as_second()))
}

/// The cells of one Event, as kube-apiserver prints them: the last time seen with
/// `(x<count> over <first seen>)` once folded, and `<kind>/<name>` of the object.
pub fn event_cells(obj: &Value, now: jiff::Timestamp) -> Value {
    let s = |v: &Value| v.as_str().map(str::to_string).unwrap_or_default();
    let first = since(&obj["firstTimestamp"], now)
        .or_else(|| since(&obj["eventTime"], now))
        .or_else(|| since(&obj["metadata"]["creationTimestamp"], now))
        .unwrap_or_else(|| "<unknown>".into());
    let last = since(&obj["lastTimestamp"], now)
        .or_else(|| since(&obj["series"]["lastObservedTime"], now))
        .unwrap_or_else(|| first.clone());
    let count = obj["count"]
        .as_i64()
        .or_else(|| obj["series"]["count"].as_i64())
        .unwrap_or(1);
    let last_seen = if count > 1 {
        format!("{last} (x{count} over {first})")
    } else {
        last
    };
    let involved = &obj["involvedObject"];
    let object = format!("{}/{}", s(&involved["kind"]).to_lowercase(), s(&involved["name"]));
    let source = match (
        obj["source"]["component"].as_str().filter(|c| !c.is_empty()),
        obj["reportingComponent"].as_str().filter(|c| !c.is_empty()),
    ) {
        (Some(c), _) | (None, Some(c)) => match obj["source"]["host"].as_str().filter(|h| !h.is_empty()) {
            Some(host) => format!("{c}, {host}"),
            None => c.to_owned(),
        },
        (None, None) => String::new(),
    };
    json!([
        last_seen,
        s(&obj["type"]),
        s(&obj["reason"]),
        object,
        s(&involved["fieldPath"]),
        source,
        s(&obj["message"]).trim(),
        first,
        count.to_string(),
        s(&obj["metadata"]["name"]),
    ])
}

/// The column definitions (`priority: 1` columns show with `-o wide`).
pub fn cluster_columns() -> Value {
    let col = |name: &str, ty: &str, format: &str, description: &str, priority: i32| json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority});
    json!([
        col(
            "Name",
            "string",
            "name",
            "Name must be unique within a namespace.",
            0
        ),
        col("Replicas", "integer", "", "Desired number of etcd members.", 0),
        col("Ready", "string", "", "Ready members out of members present.", 0),
        col("Version", "string", "", "Desired etcd version.", 0),
        col("Phase", "string", "", "Lifecycle phase of the cluster.", 0),
        col("Age", "date", "", "Time since creation.", 0),
        col("Available", "string", "", "The Available condition.", 1),
        col("Leader", "string", "", "The member currently leading.", 1),
        col(
            "Current Version",
            "string",
            "",
            "The etcd version the members run.",
            1
        ),
    ])
}

/// The cells of one EtcdCluster (in its served version).
pub fn cluster_cells(obj: &Value, now: jiff::Timestamp) -> Value {
    let s = |v: &Value| v.as_str().map(str::to_string).unwrap_or_default();
    let status = &obj["status"];
    let replicas = obj["spec"]["replicas"]
        .as_i64()
        .or_else(|| obj["spec"]["size"].as_i64());
    let ready = format!(
        "{}/{}",
        status["readyReplicas"].as_i64().unwrap_or(0),
        status["replicas"].as_i64().unwrap_or(0)
    );
    let available = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
        .map(|c| s(&c["status"]))
        .unwrap_or_default();
    let age = age(obj, now);
    json!([
        s(&obj["metadata"]["name"]),
        replicas,
        ready,
        s(&obj["spec"]["version"]),
        s(&status["phase"]),
        age,
        available,
        s(&status["leader"]),
        s(&status["currentVersion"]),
    ])
}

/// The column definitions of EtcdBackups.
pub fn backup_columns() -> Value {
    let col = |name: &str, ty: &str, format: &str, description: &str, priority: i32| json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority});
    json!([
        col(
            "Name",
            "string",
            "name",
            "Name must be unique within a namespace.",
            0
        ),
        col("Cluster", "string", "", "The EtcdCluster backed up.", 0),
        col("Phase", "string", "", "Pending, Running, Succeeded or Failed.", 0),
        col("Size", "integer", "", "Snapshot size in bytes.", 0),
        col(
            "Revision",
            "integer",
            "",
            "The etcd revision the snapshot holds.",
            0
        ),
        col("Age", "date", "", "Time since creation.", 0),
        col("Location", "string", "", "Where the snapshot was written.", 1),
        col("Message", "string", "", "Why the backup is in its phase.", 1),
    ])
}

fn age(obj: &Value, now: jiff::Timestamp) -> String {
    obj["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|created| human_duration(now.as_second() - created.as_second()))
        .unwrap_or_else(|| "<unknown>".into())
}

/// The cells of one EtcdBackup.
pub fn backup_cells(obj: &Value, now: jiff::Timestamp) -> Value {
    let s = |v: &Value| v.as_str().map(str::to_string).unwrap_or_default();
    let status = &obj["status"];
    json!([
        s(&obj["metadata"]["name"]),
        s(&obj["spec"]["clusterName"]),
        s(&status["phase"]),
        status["size"].as_i64(),
        status["revision"].as_i64(),
        age(obj, now),
        s(&status["location"]),
        s(&status["message"]),
    ])
}

/// Kubernetes' `HumanDuration`: "45s", "3m20s", "5h", "12d", "2y30d".
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let seconds = seconds.max(0);
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{d}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_rows_show_the_object_and_the_folded_count() {
        let now: jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let event = json!({
            "metadata": {"name": "a.1", "namespace": "ns", "creationTimestamp": "2026-01-01T00:50:00Z"},
            "involvedObject": {"kind": "EtcdCluster", "name": "a"},
            "reason": "MemberReplacing", "type": "Warning", "message": "replacing m-1\n",
            "firstTimestamp": "2026-01-01T00:50:00Z", "lastTimestamp": "2026-01-01T00:58:00Z",
            "count": 3, "source": {"component": "etcd-operator"},
        });
        let cells = event_cells(&event, now);
        assert_eq!(cells[0], "2m (x3 over 10m)");
        assert_eq!(cells[1], "Warning");
        assert_eq!(cells[2], "MemberReplacing");
        assert_eq!(cells[3], "etcdcluster/a");
        assert_eq!(cells[5], "etcd-operator");
        assert_eq!(cells[6], "replacing m-1");
        assert_eq!(cells[8], "3");
        assert_eq!(
            cells.as_array().map(Vec::len),
            event_columns().as_array().map(Vec::len)
        );
        // Seen once: the last time alone; no timestamps: the creation time.
        let once = json!({"metadata": {"name": "b", "creationTimestamp": "2026-01-01T00:59:00Z"},
            "involvedObject": {"kind": "EtcdCluster", "name": "b"}});
        let cells = event_cells(&once, now);
        assert_eq!(cells[0], "60s");
        assert_eq!(cells[8], "1");
    }

    #[test]
    fn human_durations() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (200, "3m20s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (20 * 3600, "20h"),
            (3 * 86400 + 3600, "3d1h"),
            (40 * 86400, "40d"),
            (3 * 365 * 86400 + 30 * 86400, "3y30d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn cells_hold_the_printer_columns() {
        let obj = json!({
            "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"replicas": 3, "version": "3.5.1"},
            "status": {"phase": "Running", "replicas": 3, "readyReplicas": 2, "leader": "a-x",
                       "conditions": [{"type": "Available", "status": "True"}]}
        });
        let now: jiff::Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        assert_eq!(
            (CLUSTERS.cells)(&obj, now),
            json!(["a", 3, "2/3", "3.5.1", "Running", "5m", "True", "a-x", ""])
        );
        assert_eq!((CLUSTERS.columns)().as_array().map(Vec::len), Some(9));
        let backup = json!({
            "metadata": {"name": "b", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"clusterName": "a"},
            "status": {"phase": "Succeeded", "size": 4128, "revision": 9, "location": "/x/y.db"}
        });
        let now: jiff::Timestamp = "2026-01-01T00:00:30Z".parse().unwrap();
        assert_eq!(
            (BACKUPS.cells)(&backup, now),
            json!(["b", "a", "Succeeded", 4128, 9, "30s", "/x/y.db", ""])
        );
        assert_eq!((BACKUPS.columns)().as_array().map(Vec::len), Some(8));
    }
}
