//! Pure backup rules: snapshot object names (sortable by time), retention, the schedule's next
//! due time, retry backoff, and the integrity check of an etcd snapshot file.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sha2::{Digest, Sha256};

/// The time format inside snapshot names: UTC, sortable as text.
const NAME_TIME_FORMAT: &str = "%Y%m%dT%H%M%SZ";
/// Length of a formatted name time (`20260102T030405Z`).
const NAME_TIME_LEN: usize = 16;
/// Suffix of snapshot objects.
pub const SNAPSHOT_SUFFIX: &str = ".db";
/// Suffix of the checksum sidecar written next to every snapshot.
pub const CHECKSUM_SUFFIX: &str = ".sha256";
/// First retry delay after a failed backup.
const BACKOFF_BASE: Duration = Duration::from_secs(2);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The directory (key prefix) holding the scheduled snapshots of one cluster:
/// `<prefix>/<namespace>/<cluster>/` (no leading `/`; empty `prefix` for the store's root).
pub fn cluster_dir(prefix: Option<&str>, namespace: &str, cluster: &str) -> String {
    let prefix = prefix.map(|p| p.trim_matches('/')).unwrap_or_default();
    if prefix.is_empty() {
        format!("{namespace}/{cluster}/")
    } else {
        format!("{prefix}/{namespace}/{cluster}/")
    }
}

/// The key of a scheduled snapshot: `<cluster_dir><UTC yyyymmddThhmmssZ>-<revision>.db`, so
/// that listing the directory sorts the snapshots by time.
pub fn scheduled_key(dir: &str, taken: chrono::DateTime<chrono::Utc>, revision: i64) -> String {
    format!(
        "{dir}{}-{revision}{SNAPSHOT_SUFFIX}",
        taken.format(NAME_TIME_FORMAT)
    )
}

/// The directory of a cluster's manual snapshots (EtcdBackups, pre-upgrade snapshots):
/// `<cluster_dir>manual/`. They are counted apart from the scheduled snapshots (see
/// [`expired_manual`]), so neither kind crowds the other out.
pub fn manual_dir(dir: &str) -> String {
    format!("{dir}manual/")
}

/// The key of a one-shot (EtcdBackup or pre-upgrade) snapshot:
/// `<cluster_dir>manual/<name>-<UTC yyyymmddThhmmssZ>-<revision>.db`.
pub fn manual_key(dir: &str, backup: &str, taken: chrono::DateTime<chrono::Utc>, revision: i64) -> String {
    format!(
        "{}{backup}-{}-{revision}{SNAPSHOT_SUFFIX}",
        manual_dir(dir),
        taken.format(NAME_TIME_FORMAT)
    )
}

/// The time in the name of a manual snapshot (`<name>-<time>-<revision>.db`), or `None` when the
/// name is not one this operator writes.
pub fn manual_time(key: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let name = key.rsplit('/').next()?;
    let stem = name.strip_suffix(SNAPSHOT_SUFFIX)?;
    let (rest, revision) = stem.rsplit_once('-')?;
    let (backup, time) = rest.rsplit_once('-')?;
    if backup.is_empty() || revision.is_empty() || !revision.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    scheduled_time(&format!("{time}-{revision}{SNAPSHOT_SUFFIX}"))
}

/// The time in the name of a scheduled snapshot (the last path segment), or `None` when the
/// name is not one this operator writes.
pub fn scheduled_time(key: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let name = key.rsplit('/').next()?;
    let stem = name.strip_suffix(SNAPSHOT_SUFFIX)?;
    let (time, revision) = stem.split_at_checked(NAME_TIME_LEN)?;
    let revision = revision.strip_prefix('-')?;
    if revision.is_empty() || !revision.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    chrono::NaiveDateTime::parse_from_str(time, NAME_TIME_FORMAT)
        .ok()
        .map(|t| t.and_utc())
}

/// Which snapshots retention deletes: `keys` are scheduled snapshot keys (any order); the
/// result keeps the newest `max_count` and deletes those older than `max_age`, but never the
/// newest one. Keys whose names carry no time are left alone.
pub fn expired(
    keys: &[String],
    now: chrono::DateTime<chrono::Utc>,
    max_count: Option<i32>,
    max_age: Option<Duration>,
) -> Vec<String> {
    expired_by(keys, now, max_count, max_age, scheduled_time)
}

/// [`expired`] for manual snapshot keys (the keys under [`manual_dir`]): the same limits,
/// counted among the manual snapshots only.
pub fn expired_manual(
    keys: &[String],
    now: chrono::DateTime<chrono::Utc>,
    max_count: Option<i32>,
    max_age: Option<Duration>,
) -> Vec<String> {
    expired_by(keys, now, max_count, max_age, manual_time)
}

/// The limits of `spec.backup.retention` as [`expired`] takes them: an unset or empty retention
/// keeps the newest [`DEFAULT_BACKUP_MAX_COUNT`](etcd_operator_api::v1alpha2::DEFAULT_BACKUP_MAX_COUNT).
pub fn retention_limits(
    retention: Option<&etcd_operator_api::v1alpha2::BackupRetention>,
) -> (Option<i32>, Option<Duration>) {
    let retention = retention.cloned().unwrap_or_default();
    let max_age = retention
        .max_age
        .as_deref()
        .and_then(|a| etcd_operator_api::validation::format::duration_seconds(a).ok())
        .map(Duration::from_secs_f64);
    let max_count = match (retention.max_count, max_age) {
        (None, None) => Some(etcd_operator_api::v1alpha2::DEFAULT_BACKUP_MAX_COUNT),
        (count, _) => count,
    };
    (max_count, max_age)
}

/// How many pre-upgrade snapshots a runtime keeps beside the members' data.
pub const LOCAL_PRE_UPGRADE_KEEP: usize = 3;

/// Which files of the snapshots kept beside the data go: `files` are (name, modification time)
/// of the `.db` files there; all but the newest `keep` (at least one) are returned.
pub fn local_expired(files: &[(String, std::time::SystemTime)], keep: usize) -> Vec<String> {
    let mut sorted: Vec<&(String, std::time::SystemTime)> = files
        .iter()
        .filter(|(name, _)| name.ends_with(SNAPSHOT_SUFFIX))
        .collect();
    // Newest first; equal times by name so the order is total.
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    sorted
        .into_iter()
        .skip(keep.max(1))
        .map(|(name, _)| name.clone())
        .collect()
}

fn expired_by(
    keys: &[String],
    now: chrono::DateTime<chrono::Utc>,
    max_count: Option<i32>,
    max_age: Option<Duration>,
    time_of: fn(&str) -> Option<chrono::DateTime<chrono::Utc>>,
) -> Vec<String> {
    let mut dated: Vec<(chrono::DateTime<chrono::Utc>, &String)> =
        keys.iter().filter_map(|k| Some((time_of(k)?, k))).collect();
    // Newest first; equal times by key so the order is total.
    dated.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(a.1)));
    let keep = max_count.map_or(usize::MAX, |n| usize::try_from(n.max(1)).unwrap_or(1));
    dated
        .iter()
        .enumerate()
        .filter(|(i, (taken, _))| {
            *i > 0
                && (*i >= keep
                    || max_age.is_some_and(|age| {
                        chrono::Duration::from_std(age).is_ok_and(|age| now - *taken > age)
                    }))
        })
        .map(|(_, (_, k))| (*k).clone())
        .collect()
}

/// Parses a cron schedule as admission validation accepts it (five fields, or six with
/// seconds).
pub fn parse_schedule(schedule: &str) -> Result<croner::Cron, croner::errors::CronError> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .year(croner::parser::Year::Disallowed)
        .build()
        .parse(schedule)
}

/// When the next scheduled snapshot is due: the first occurrence of the schedule after the last
/// snapshot (or after `since` — the cluster's creation — when there is none yet). A due time in
/// the past means "now": a missed or failed snapshot is taken, not skipped.
pub fn next_due(
    cron: &croner::Cron,
    last: Option<chrono::DateTime<chrono::Utc>>,
    since: chrono::DateTime<chrono::Utc>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    cron.find_next_occurrence(&whole_second(last.unwrap_or(since)), false)
        .ok()
}

/// `t` without its sub-second part. A schedule's times are whole seconds, as are the times
/// status records; croner keeps the sub-second part of the time it searches from, so searches
/// start from the whole second.
pub fn whole_second(t: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

/// The delay before retry number `failures` (1 for the first failure): doubling from 2 s, at
/// most 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
}

/// Why a snapshot file is not a valid etcd snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotCheckError {
    /// Too short to be a database.
    #[error("snapshot is {size} bytes: too small to be an etcd database")]
    TooSmall {
        /// The size.
        size: usize,
    },
    /// The size is not a whole number of pages plus etcd's 32-byte hash.
    #[error("snapshot of {size} bytes carries no etcd integrity hash (size is not 512·n + 32)")]
    NoHash {
        /// The size.
        size: usize,
    },
    /// The hash etcd appended does not match the content.
    #[error("snapshot content does not match the integrity hash etcd appended to it")]
    HashMismatch,
}

/// The length of the SHA-256 etcd appends to every snapshot it streams.
const SNAPSHOT_HASH_LEN: usize = 32;

/// Checks a snapshot as etcd streams it: a bbolt database followed by the SHA-256 of the
/// database (etcd's `snapshot` RPC appends it; `etcdutl snapshot restore` verifies it the same
/// way). Hand-written: no library exposes this check.
pub fn check_snapshot(data: &[u8]) -> Result<(), SnapshotCheckError> {
    let mut digest = SnapshotDigest::default();
    digest.update(data);
    digest.finish().map(|_| ())
}

/// The integrity check of [`check_snapshot`] and the SHA-256 of the whole file, computed chunk by
/// chunk while a snapshot streams, so nothing needs the whole file in memory: only etcd's trailing
/// hash (the last 32 bytes seen) is held back from the database digest.
#[derive(Debug, Clone, Default)]
pub struct SnapshotDigest {
    /// The database part (everything but the last 32 bytes seen so far).
    database: Sha256,
    /// The whole file, for the checksum sidecar.
    whole: Sha256,
    /// The last bytes seen: at most [`SNAPSHOT_HASH_LEN`] after every update.
    tail: Vec<u8>,
    /// Bytes seen.
    size: u64,
}

impl SnapshotDigest {
    /// Feeds the next chunk of the stream.
    pub fn update(&mut self, chunk: &[u8]) {
        self.whole.update(chunk);
        self.size = self.size.saturating_add(chunk.len() as u64);
        if chunk.len() >= SNAPSHOT_HASH_LEN {
            // Everything held back so far, and the chunk but its last 32 bytes, is database.
            self.database.update(&self.tail);
            let (db, tail) = chunk.split_at(chunk.len() - SNAPSHOT_HASH_LEN);
            self.database.update(db);
            self.tail.clear();
            self.tail.extend_from_slice(tail);
        } else {
            self.tail.extend_from_slice(chunk);
            let over = self.tail.len().saturating_sub(SNAPSHOT_HASH_LEN);
            if over > 0 {
                self.database.update(&self.tail[..over]);
                self.tail.drain(..over);
            }
        }
    }

    /// Bytes seen so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Checks the stream as a whole; on success, the SHA-256 of every byte seen (lowercase hex).
    pub fn finish(self) -> Result<String, SnapshotCheckError> {
        let (sha256, check) = self.finish_both();
        check.map(|()| sha256)
    }

    /// The SHA-256 of every byte seen (lowercase hex), whatever the integrity check says, and
    /// the check's verdict: for callers that compare the checksum first.
    pub fn finish_both(self) -> (String, Result<(), SnapshotCheckError>) {
        let size = usize::try_from(self.size).unwrap_or(usize::MAX);
        let whole = hex::encode(self.whole.finalize());
        let check = if size < 512 + SNAPSHOT_HASH_LEN {
            Err(SnapshotCheckError::TooSmall { size })
        } else if size % 512 != SNAPSHOT_HASH_LEN {
            Err(SnapshotCheckError::NoHash { size })
        } else if self.database.finalize().as_slice() != self.tail.as_slice() {
            Err(SnapshotCheckError::HashMismatch)
        } else {
            Ok(())
        };
        (whole, check)
    }
}

/// The SHA-256 of a whole file's bytes, lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The text of a checksum sidecar (`sha256sum` format): `<hex>  <file name>\n`.
pub fn checksum_file(sha256: &str, key: &str) -> String {
    format!("{sha256}  {}\n", key.rsplit('/').next().unwrap_or(key))
}

/// The checksum in a sidecar's text, if it holds one.
pub fn parse_checksum_file(text: &str) -> Option<String> {
    let hex = text.split_whitespace().next()?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| hex.to_ascii_lowercase())
}

/// A Kubernetes time (seconds precision) from a chrono time.
pub fn to_time(t: chrono::DateTime<chrono::Utc>) -> Time {
    Time(jiff::Timestamp::from_second(t.timestamp()).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

/// A chrono time from a Kubernetes time.
pub fn from_time(t: &Time) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(t.0.as_second(), 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32, s: u32) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc.with_ymd_and_hms(2026, 1, 2, h, m, s).unwrap()
    }

    #[test]
    fn names_sort_by_time_and_parse_back() {
        let dir = cluster_dir(Some("/prod/etcd/"), "ns", "main");
        assert_eq!(dir, "prod/etcd/ns/main/");
        assert_eq!(cluster_dir(None, "ns", "main"), "ns/main/");
        let a = scheduled_key(&dir, at(3, 4, 5), 17);
        assert_eq!(a, "prod/etcd/ns/main/20260102T030405Z-17.db");
        let b = scheduled_key(&dir, at(13, 0, 0), 9);
        assert!(a < b, "text order is time order");
        assert_eq!(scheduled_time(&a), Some(at(3, 4, 5)));
        let manual = manual_key(&dir, "b1", at(3, 4, 5), 17);
        assert_eq!(manual, "prod/etcd/ns/main/manual/b1-20260102T030405Z-17.db");
        assert_eq!(scheduled_time(&manual), None);
        assert_eq!(scheduled_time("x/20260102T030405Z-17.db.sha256"), None);
        assert_eq!(scheduled_time("x/20260102T030405Z-.db"), None);
        assert_eq!(scheduled_time("x/notatime-17.db"), None);
    }

    #[test]
    fn retention_keeps_the_newest_count_and_drops_the_old() {
        let keys: Vec<String> = (0..5).map(|i| scheduled_key("d/", at(1, i, 0), 1)).collect();
        let mut by_count = expired(&keys, at(2, 0, 0), Some(3), None);
        by_count.sort();
        assert_eq!(by_count, vec![keys[0].clone(), keys[1].clone()]);
        let by_age = expired(&keys, at(1, 4, 30), None, Some(Duration::from_secs(150)));
        assert_eq!(by_age.len(), 2, "{by_age:?}"); // 01:00 and 01:01 are older than 2.5 min
        // The newest one is never deleted, whatever its age.
        assert_eq!(
            expired(&keys, at(9, 0, 0), None, Some(Duration::from_secs(60))).len(),
            4
        );
        // Foreign objects are not touched.
        let mut with_foreign = keys.clone();
        with_foreign.push("d/readme.txt".into());
        assert!(!expired(&with_foreign, at(2, 0, 0), Some(1), None).contains(&"d/readme.txt".to_string()));
    }

    #[test]
    fn manual_snapshots_are_dated_by_name_and_retained_apart_from_scheduled_ones() {
        let dir = cluster_dir(None, "ns", "main");
        assert_eq!(manual_dir(&dir), "ns/main/manual/");
        let pre = manual_key(&dir, "pre-upgrade-3.5.0-to-3.5.1", at(3, 4, 5), 17);
        assert_eq!(
            pre,
            "ns/main/manual/pre-upgrade-3.5.0-to-3.5.1-20260102T030405Z-17.db"
        );
        assert_eq!(manual_time(&pre), Some(at(3, 4, 5)));
        assert_eq!(manual_time("ns/main/manual/b1-20260102T030405Z-x.db"), None);
        assert_eq!(
            manual_time("ns/main/manual/20260102T030405Z-17.db"),
            None,
            "no name"
        );
        assert_eq!(manual_time("ns/main/manual/readme.txt"), None);
        // Five manual snapshots (EtcdBackups and pre-upgrade ones alike): keep the newest 3.
        let keys: Vec<String> = (0..5)
            .map(|i| {
                manual_key(
                    &dir,
                    if i % 2 == 0 {
                        "b1"
                    } else {
                        "pre-upgrade-3.5.0-to-3.5.1"
                    },
                    at(1, i, 0),
                    1,
                )
            })
            .collect();
        let mut gone = expired_manual(&keys, at(2, 0, 0), Some(3), None);
        gone.sort();
        let mut oldest = vec![keys[0].clone(), keys[1].clone()];
        oldest.sort();
        assert_eq!(gone, oldest);
        // By age, never the newest; the scheduled rule ignores manual names and vice versa.
        assert_eq!(
            expired_manual(&keys, at(9, 0, 0), None, Some(Duration::from_secs(60))).len(),
            4
        );
        assert!(expired(&keys, at(9, 0, 0), Some(1), None).is_empty());
        let scheduled = vec![
            scheduled_key(&dir, at(1, 0, 0), 1),
            scheduled_key(&dir, at(1, 1, 0), 1),
        ];
        assert!(expired_manual(&scheduled, at(9, 0, 0), Some(1), None).is_empty());
    }

    #[test]
    fn retention_limits_default_to_the_newest_seven() {
        use etcd_operator_api::v1alpha2::BackupRetention;
        assert_eq!(retention_limits(None), (Some(7), None));
        let age = BackupRetention {
            max_count: None,
            max_age: Some("90m".into()),
        };
        assert_eq!(
            retention_limits(Some(&age)),
            (None, Some(Duration::from_secs(5400)))
        );
        let both = BackupRetention {
            max_count: Some(2),
            max_age: Some("1h".into()),
        };
        assert_eq!(
            retention_limits(Some(&both)),
            (Some(2), Some(Duration::from_secs(3600)))
        );
    }

    #[test]
    fn beside_the_data_only_the_newest_few_pre_upgrade_snapshots_stay() {
        let t = |s: u64| std::time::UNIX_EPOCH + Duration::from_secs(s);
        let files = vec![
            ("pre-upgrade-3.4.23-to-3.5.0-10.db".to_owned(), t(100)),
            ("pre-upgrade-3.5.0-to-3.5.1-20.db".to_owned(), t(300)),
            ("pre-upgrade-3.5.1-to-3.5.0-30.db".to_owned(), t(200)),
            ("pre-upgrade-3.5.0-to-3.5.1-40.db".to_owned(), t(400)),
            (".pre-upgrade-x.db.0123.partial".to_owned(), t(50)),
        ];
        assert_eq!(
            local_expired(&files, 2),
            vec![
                "pre-upgrade-3.5.1-to-3.5.0-30.db".to_owned(),
                "pre-upgrade-3.4.23-to-3.5.0-10.db".to_owned()
            ]
        );
        assert_eq!(local_expired(&files, 0).len(), 3, "the newest always stays");
        assert!(local_expired(&files, LOCAL_PRE_UPGRADE_KEEP).len() == 1);
    }

    #[test]
    fn schedules_with_seconds_and_missed_runs_are_due_now() {
        let cron = parse_schedule("*/5 * * * * *").unwrap();
        assert_eq!(next_due(&cron, Some(at(1, 0, 2)), at(0, 0, 0)), Some(at(1, 0, 5)));
        let hourly = parse_schedule("0 * * * *").unwrap();
        assert_eq!(next_due(&hourly, None, at(1, 30, 0)), Some(at(2, 0, 0)));
        assert!(parse_schedule("every hour").is_err());
    }

    #[test]
    fn backoff_doubles_up_to_a_limit() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(4), Duration::from_secs(16));
        assert_eq!(backoff(40), Duration::from_secs(300));
    }

    #[test]
    fn snapshots_are_checked_against_etcds_hash() {
        let db = vec![7u8; 1024];
        let mut good = db.clone();
        good.extend_from_slice(&Sha256::digest(&db));
        assert_eq!(check_snapshot(&good), Ok(()));
        let mut bad = good.clone();
        bad[10] ^= 1;
        assert_eq!(check_snapshot(&bad), Err(SnapshotCheckError::HashMismatch));
        assert_eq!(
            check_snapshot(&db),
            Err(SnapshotCheckError::NoHash { size: 1024 })
        );
        assert_eq!(
            check_snapshot(&[0; 10]),
            Err(SnapshotCheckError::TooSmall { size: 10 })
        );
    }

    #[test]
    fn the_streaming_digest_agrees_with_the_whole_file_check_whatever_the_chunking() {
        let db: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let mut good = db.clone();
        good.extend_from_slice(&Sha256::digest(&db));
        let mut bad = good.clone();
        bad[4100] ^= 1; // inside etcd's trailing hash
        for chunk in [1, 7, 31, 32, 33, 512, 1000, good.len()] {
            let digest = |data: &[u8]| {
                let mut d = SnapshotDigest::default();
                for piece in data.chunks(chunk) {
                    d.update(piece);
                }
                assert_eq!(d.size(), data.len() as u64);
                d.finish()
            };
            assert_eq!(digest(&good), Ok(sha256_hex(&good)), "chunks of {chunk}");
            assert_eq!(
                digest(&bad),
                Err(SnapshotCheckError::HashMismatch),
                "chunks of {chunk}"
            );
            assert_eq!(
                digest(&db),
                Err(SnapshotCheckError::NoHash { size: 4096 }),
                "chunks of {chunk}"
            );
        }
    }

    #[test]
    fn checksum_sidecars_round_trip() {
        let sum = sha256_hex(b"abc");
        let text = checksum_file(&sum, "a/b/c.db");
        assert_eq!(text, format!("{sum}  c.db\n"));
        assert_eq!(parse_checksum_file(&text), Some(sum));
        assert_eq!(parse_checksum_file("nope"), None);
    }
}
