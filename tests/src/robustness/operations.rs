//! Spec changes the runner makes while the load runs, each overlapped by a fault (issue 26: faults
//! overlapping a scale, a roll, a template roll, a backup; the operator killed in the middle of
//! each step kind): a scale out and back in, a version roll, a template roll (a new quota
//! re-creates every member), a scheduled defragmentation of every member, an `EtcdBackup`.
//!
//! The operator's log says when it has done a step (`added learner`, `promoted learner`,
//! `removed member from etcd`, `stopping etcd member`, `started etcd member`, …). A kill of the operator
//! "at" a step waits for the n-th step line of the phase, n picked by the seed, then SIGKILLs the
//! operator after 0–300 ms: after the step's effect on etcd and before (or while) the next one,
//! which is where a crash leaves the most half-done. [`LogCursor`] reads only the lines written
//! since the phase began, across the operator's restarts (each run logs to its own file).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

/// A spec change the runner makes under load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OperationKind {
    /// `replicas` 3 → 4 (a learner added and promoted), then 4 → 3 (leadership moved if needed, a
    /// member removed from etcd, its process deleted).
    Scale,
    /// `version` 3.5.1 ↔ 3.5.16: a pre-upgrade snapshot, then each member restarted on the other
    /// version, followers first, the leader after a leadership move.
    Roll,
    /// `maintenance.quotaBackendBytes` changed: every member re-created on the new template, one
    /// at a time, on its data.
    TemplateRoll,
    /// A defragmentation schedule every 5 s: each member defragmented, followers first, the
    /// leader after a leadership move; the schedule is removed afterwards.
    Defragment,
    /// An `EtcdBackup` to a volume destination, until `Succeeded`.
    Backup,
}

impl OperationKind {
    /// Every kind.
    pub const ALL: [OperationKind; 5] = [
        Self::Scale,
        Self::Roll,
        Self::TemplateRoll,
        Self::Defragment,
        Self::Backup,
    ];

    /// A short name for figures.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scale => "scale",
            Self::Roll => "roll",
            Self::TemplateRoll => "template-roll",
            Self::Defragment => "defragment",
            Self::Backup => "backup",
        }
    }
}

impl std::fmt::Display for OperationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The versions a roll moves between (both installed by `make tools`).
pub const ROLL_VERSIONS: [&str; 2] = ["3.5.1", "3.5.16"];

/// The quotas a template roll moves between.
pub const QUOTAS: [&str; 2] = ["3Gi", "2Gi"];

/// The operator's log lines that end a step, by what the step is (as the figures name it).
pub const STEP_LINES: [(&str, &str); 13] = [
    ("added learner", "add-learner"),
    ("stopping etcd member", "stop-member"),
    ("started etcd member", "start-member"),
    ("snapshot stored", "backup-stored"),
    ("promoted learner", "promote"),
    ("moved leadership", "move-leader"),
    ("removed member from etcd", "remove"),
    ("deleted member", "delete-member"),
    ("took the pre-upgrade snapshot", "pre-upgrade-snapshot"),
    ("restarted member on a new version", "roll-member"),
    (
        "re-creating member on the changed member template",
        "template-roll-member",
    ),
    ("defragmented", "defragment"),
    ("streaming snapshot to the destination", "backup-stream"),
];

/// One phase of an operation: the change to make and the steps it is expected to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    /// What the phase does, for the figures.
    pub what: String,
    /// A JSON merge patch of the EtcdCluster, or (for a backup) the EtcdBackup manifest.
    pub change: Change,
    /// The replicas the cluster must have when the phase is done.
    pub replicas: usize,
    /// The step lines the operator logs in this phase.
    pub steps: &'static [&'static str],
    /// How many of them the phase logs at least: an operator kill follows one of the first
    /// `kill_points`.
    pub kill_points: usize,
}

/// What a phase changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A merge patch of the EtcdCluster's spec; done when the status reaches `done`.
    Patch { patch: String, done: Done },
    /// An EtcdBackup to create; done when it says `Succeeded`.
    Backup { name: String, manifest: String },
}

/// When a patched cluster is done with the phase (beyond being available with the phase's
/// replicas at the new generation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// Available with the replicas.
    Available,
    /// Every member on `version` and the roll recorded as complete.
    Rolled { version: String },
    /// The template rollout complete.
    RolledOut,
    /// Every member defragmented since the phase began (from the operator's log).
    Defragmented,
}

/// Where the operations stand between phases: what the spec says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecState {
    /// The version the spec names.
    pub version: &'static str,
    /// The quota the spec names (none: the default).
    pub quota: Option<&'static str>,
    /// Backups created so far.
    pub backups: usize,
}

impl Default for SpecState {
    fn default() -> Self {
        Self {
            version: ROLL_VERSIONS[0],
            quota: None,
            backups: 0,
        }
    }
}

/// The phases of `kind` from `state` (updated to the state after them); `backup_dir` is the
/// backups' destination.
pub fn phases(
    kind: OperationKind,
    state: &mut SpecState,
    cluster: &str,
    backup_dir: &std::path::Path,
) -> Vec<Phase> {
    match kind {
        OperationKind::Scale => vec![
            Phase {
                what: "scale 3 -> 4".into(),
                change: Change::Patch {
                    patch: r#"{"spec":{"replicas":4}}"#.into(),
                    done: Done::Available,
                },
                replicas: 4,
                steps: &["added learner", "started etcd member", "promoted learner"],
                kill_points: 3,
            },
            Phase {
                what: "scale 4 -> 3".into(),
                change: Change::Patch {
                    patch: r#"{"spec":{"replicas":3}}"#.into(),
                    done: Done::Available,
                },
                replicas: 3,
                steps: &["moved leadership", "removed member from etcd", "deleted member"],
                kill_points: 2,
            },
        ],
        OperationKind::Roll => {
            let to = if state.version == ROLL_VERSIONS[0] {
                ROLL_VERSIONS[1]
            } else {
                ROLL_VERSIONS[0]
            };
            let from = std::mem::replace(&mut state.version, to);
            vec![Phase {
                what: format!("roll {from} -> {to}"),
                change: Change::Patch {
                    patch: format!(r#"{{"spec":{{"version":"{to}"}}}}"#),
                    done: Done::Rolled { version: to.into() },
                },
                replicas: 3,
                // Local mode: each member's process is stopped, then started on the new version.
                steps: &[
                    "took the pre-upgrade snapshot",
                    "stopping etcd member",
                    "started etcd member",
                    "moved leadership",
                ],
                kill_points: 6,
            }]
        }
        OperationKind::TemplateRoll => {
            let to = if state.quota == Some(QUOTAS[0]) {
                QUOTAS[1]
            } else {
                QUOTAS[0]
            };
            let from = state.quota.replace(to).unwrap_or("default");
            vec![Phase {
                what: format!("quota {from} -> {to}"),
                change: Change::Patch {
                    patch: format!(r#"{{"spec":{{"maintenance":{{"quotaBackendBytes":"{to}"}}}}}}"#),
                    done: Done::RolledOut,
                },
                replicas: 3,
                steps: &["stopping etcd member", "started etcd member", "moved leadership"],
                kill_points: 6,
            }]
        }
        OperationKind::Defragment => vec![Phase {
            what: "defragment every member".into(),
            change: Change::Patch {
                patch: r#"{"spec":{"maintenance":{"defragmentation":{"schedule":"*/5 * * * * *"}}}}"#.into(),
                done: Done::Defragmented,
            },
            replicas: 3,
            steps: &["defragmented", "moved leadership"],
            kill_points: 3,
        }],
        OperationKind::Backup => {
            state.backups += 1;
            let name = format!("{cluster}-b{}", state.backups);
            vec![Phase {
                what: format!("backup {name}"),
                change: Change::Backup {
                    manifest: backup_manifest(&name, cluster, backup_dir),
                    name,
                },
                replicas: 3,
                steps: &["streaming snapshot to the destination", "snapshot stored"],
                kill_points: 2,
            }]
        }
    }
}

/// The patch that ends a defragmentation phase (the schedule removed).
pub const DEFRAGMENT_OFF: &str = r#"{"spec":{"maintenance":{"defragmentation":null}}}"#;

/// An EtcdBackup of `cluster` to a volume destination.
pub fn backup_manifest(name: &str, cluster: &str, dir: &std::path::Path) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdBackup\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  clusterName: {cluster}\n  destination:\n    volume:\n      path: {}\n",
        dir.display()
    )
}

/// The figures' name of a step line.
pub fn step_name(line: &str) -> &'static str {
    STEP_LINES
        .iter()
        .find(|(needle, _)| line.contains(needle))
        .map_or("other", |(_, name)| name)
}

/// Whether the EtcdCluster `object` (with metadata) is done with a phase, given the member
/// names defragmented since the phase began.
pub fn phase_done(object: &Value, replicas: usize, done: &Done, defragmented: usize) -> bool {
    let status = &object["status"];
    let generation = object["metadata"]["generation"].as_i64().unwrap_or(i64::MAX);
    let observed = status["observedGeneration"].as_i64().unwrap_or(0);
    if observed < generation || !crate::local_cluster::available(status, replicas as i64) {
        return false;
    }
    match done {
        Done::Available => true,
        Done::Rolled { version } => {
            status["currentVersion"] == version.as_str()
                && status["members"]
                    .as_array()
                    .is_some_and(|m| m.iter().all(|m| m["version"] == version.as_str()))
                && (status["upgrade"].is_null() || status["upgrade"]["targetVersion"] == version.as_str())
        }
        Done::RolledOut => status["rollout"]["phase"] == "Complete",
        Done::Defragmented => defragmented >= replicas,
    }
}

/// Reads the operator's log lines written since it was created, across its runs (one file per
/// run, `operator-<n>.log` in the state directory).
#[derive(Debug)]
pub struct LogCursor {
    dir: PathBuf,
    seen: BTreeMap<String, usize>,
}

/// A log line without its terminal colour codes.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl LogCursor {
    /// A cursor at the start of every log in `dir`: its first read returns every line so far.
    pub fn from_start(dir: PathBuf) -> Self {
        Self {
            dir,
            seen: BTreeMap::new(),
        }
    }

    /// A cursor at the end of every log in `dir` now.
    pub fn at_end(dir: PathBuf) -> Self {
        let mut cursor = Self {
            dir,
            seen: BTreeMap::new(),
        };
        let _ = cursor.new_lines();
        cursor
    }

    /// The lines written since the last call (colour codes removed).
    pub fn new_lines(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name.starts_with("operator-") && name.ends_with(".log")).then(|| (name, e.path()))
            })
            .collect();
        files.sort();
        for (name, path) in files {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            // Only whole lines: a line being written is read next time.
            let complete = text.rfind('\n').map_or("", |end| &text[..end]);
            let lines: Vec<&str> = if complete.is_empty() {
                Vec::new()
            } else {
                complete.split('\n').collect()
            };
            let seen = self.seen.entry(name).or_insert(0);
            out.extend(lines.iter().skip(*seen).map(|l| strip_ansi(l)));
            *seen = lines.len().max(*seen);
        }
        out
    }
}

/// The member a `defragmented` line names (`member=<name>`), when it is a member-name line.
pub fn defragmented_member(line: &str) -> Option<String> {
    if !line.contains("defragmented") || !line.contains("trigger=") {
        return None;
    }
    let rest = line.split("member=").nth(1)?;
    Some(rest.split_whitespace().next()?.trim_matches('"').to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rolls_and_template_rolls_alternate_between_their_two_values() {
        let mut state = SpecState::default();
        let dir = std::path::Path::new("/b");
        let first = phases(OperationKind::Roll, &mut state, "c", dir);
        assert_eq!(first[0].what, "roll 3.5.1 -> 3.5.16");
        let second = phases(OperationKind::Roll, &mut state, "c", dir);
        assert_eq!(second[0].what, "roll 3.5.16 -> 3.5.1");
        assert_eq!(
            second[0].change,
            Change::Patch {
                patch: r#"{"spec":{"version":"3.5.1"}}"#.into(),
                done: Done::Rolled {
                    version: "3.5.1".into()
                }
            }
        );
        let q1 = phases(OperationKind::TemplateRoll, &mut state, "c", dir);
        let q2 = phases(OperationKind::TemplateRoll, &mut state, "c", dir);
        assert_eq!(q1[0].what, "quota default -> 3Gi");
        assert_eq!(q2[0].what, "quota 3Gi -> 2Gi");
        let b = phases(OperationKind::Backup, &mut state, "c", dir);
        let b2 = phases(OperationKind::Backup, &mut state, "c", dir);
        assert_ne!(b[0].what, b2[0].what, "each backup has its own name");
        assert_eq!(phases(OperationKind::Scale, &mut state, "c", dir).len(), 2);
    }

    fn cluster(generation: i64, observed: i64, members: usize, version: &str) -> Value {
        let members: Vec<Value> = (0..members)
            .map(|i| json!({"name": format!("m{i}"), "healthy": true, "learner": false, "version": version}))
            .collect();
        json!({
            "metadata": {"generation": generation},
            "status": {
                "observedGeneration": observed,
                "readyReplicas": members.len(),
                "members": members,
                "conditions": [{"type": "Available", "status": "True"}],
                "currentVersion": version,
                "rollout": {"phase": "Complete"},
            }
        })
    }

    #[test]
    fn a_phase_is_done_only_at_the_new_generation_with_its_replicas_and_version() {
        let done = cluster(2, 2, 4, "3.5.1");
        assert!(phase_done(&done, 4, &Done::Available, 0));
        assert!(
            !phase_done(&cluster(3, 2, 4, "3.5.1"), 4, &Done::Available, 0),
            "stale status"
        );
        assert!(!phase_done(&done, 3, &Done::Available, 0), "wrong replicas");
        let rolled = Done::Rolled {
            version: "3.5.16".into(),
        };
        assert!(!phase_done(&cluster(2, 2, 3, "3.5.1"), 3, &rolled, 0));
        assert!(phase_done(&cluster(2, 2, 3, "3.5.16"), 3, &rolled, 0));
        assert!(!phase_done(&cluster(2, 2, 3, "3.5.1"), 3, &Done::Defragmented, 2));
        assert!(phase_done(&cluster(2, 2, 3, "3.5.1"), 3, &Done::Defragmented, 3));
    }

    #[test]
    fn step_lines_are_named_and_defragmented_members_read() {
        let line = "2026-11-27T00:00:00Z  INFO etcd_operator_controller::reconcile::act: defragmented cluster=default/robust member=robust-x2 trigger=schedule db_size=1 db_size_in_use=1";
        assert_eq!(step_name(line), "defragment");
        assert_eq!(defragmented_member(line).as_deref(), Some("robust-x2"));
        assert_eq!(defragmented_member("defragmented member=http://x"), None);
        assert_eq!(step_name("promoted learner cluster=x"), "promote");
        assert_eq!(step_name("something else"), "other");
        assert_eq!(strip_ansi("\u{1b}[2mdim\u{1b}[0m text"), "dim text");
    }

    #[test]
    fn the_log_cursor_reads_only_new_whole_lines_across_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("operator-0.log"), "old 1\nold 2\n").unwrap();
        let mut cursor = LogCursor::at_end(dir.path().to_path_buf());
        assert!(cursor.new_lines().is_empty());
        std::fs::write(dir.path().join("operator-0.log"), "old 1\nold 2\nnew 3\npart").unwrap();
        std::fs::write(dir.path().join("operator-1.log"), "next run\n").unwrap();
        assert_eq!(cursor.new_lines(), vec!["new 3", "next run"]);
        std::fs::write(
            dir.path().join("operator-0.log"),
            "old 1\nold 2\nnew 3\npartial done\n",
        )
        .unwrap();
        assert_eq!(cursor.new_lines(), vec!["partial done"]);
    }
}
