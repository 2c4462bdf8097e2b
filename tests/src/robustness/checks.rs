//! The checks run after a scenario, each returning its findings (empty: passed): the watch
//! stream against the writes, every acknowledged write read back at its revision, and HashKV
//! compared across members.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};

use super::RobustnessError;
use super::history::History;
use super::watch::WatchLog;

/// The watch saw every revision in order, no revision twice, every acknowledged write at its
/// revision with its value, and nothing no client wrote.
pub fn check_watch(history: &History, log: &WatchLog) -> Vec<String> {
    let mut findings = Vec::new();
    if let Some(why) = &log.incomplete {
        findings.push(format!("watch incomplete: {why}"));
    }
    let mut by_revision: BTreeMap<i64, &super::watch::WatchedEvent> = BTreeMap::new();
    let mut previous = 0i64;
    for event in &log.events {
        if event.revision == previous {
            findings.push(format!("watch delivered revision {} twice", event.revision));
        } else if event.revision < previous {
            findings.push(format!(
                "watch went back from revision {previous} to {}",
                event.revision
            ));
        }
        previous = previous.max(event.revision);
        by_revision.insert(event.revision, event);
    }
    for write in history.acknowledged_writes() {
        match by_revision.get(&write.revision) {
            None => findings.push(format!(
                "acknowledged write {}={} at revision {} never seen by the watch",
                write.key, write.value, write.revision
            )),
            Some(e) if e.key != write.key || e.value != write.value || !e.put => findings.push(format!(
                "revision {} acknowledged as {}={} but watched as {:?}",
                write.revision, write.key, write.value, e
            )),
            Some(_) => {}
        }
    }
    let attempted = history.attempted_writes();
    for event in &log.events {
        if !event.put || !attempted.contains(&(event.key.as_str(), event.value.as_str())) {
            findings.push(format!("watch saw a change no client made: {event:?}"));
        }
    }
    findings
}

/// Every acknowledged write reads back at its revision, with its value (a linearizable read of
/// the history etcd keeps until it compacts).
pub async fn check_writes_readable(
    endpoints: &[String],
    history: &History,
) -> Result<Vec<String>, RobustnessError> {
    let mut client = Client::connect(endpoints, Some(super::client_options(Duration::from_secs(5))))
        .await
        .map_err(|source| RobustnessError::Connect {
            endpoints: endpoints.to_vec(),
            source,
        })?;
    let mut findings = Vec::new();
    for write in history.acknowledged_writes() {
        // A read refused by a member that is restarting is asked again (this checks data, not
        // availability).
        let mut read = Err(etcd_client::Error::InvalidArgs("not read yet".into()));
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            read = client
                .get(
                    write.key.as_str(),
                    Some(GetOptions::new().with_revision(write.revision)),
                )
                .await;
            if read.is_ok() {
                break;
            }
        }
        match read {
            Ok(r) => match r.kvs().first() {
                Some(kv) if kv.value() == write.value.as_bytes() && kv.mod_revision() == write.revision => {}
                other => findings.push(format!(
                    "acknowledged write {}={} at revision {} reads back as {:?}",
                    write.key,
                    write.value,
                    write.revision,
                    other.map(|kv| (
                        String::from_utf8_lossy(kv.value()).into_owned(),
                        kv.mod_revision()
                    ))
                )),
            },
            Err(e) => findings.push(format!(
                "acknowledged write {}={} at revision {} cannot be read back: {}",
                write.key,
                write.value,
                write.revision,
                etcd_operator_api::report::chain(&e)
            )),
        }
    }
    Ok(findings)
}

/// The current revision of the cluster (a linearizable read).
pub async fn current_revision(endpoints: &[String]) -> Result<i64, RobustnessError> {
    let mut client = Client::connect(endpoints, Some(super::client_options(Duration::from_secs(5))))
        .await
        .map_err(|source| RobustnessError::Connect {
            endpoints: endpoints.to_vec(),
            source,
        })?;
    let r = client
        .get("robust/", None)
        .await
        .map_err(|source| RobustnessError::Read {
            what: "the revision",
            source,
        })?;
    Ok(r.header().map_or(0, |h| h.revision()))
}

/// HashKV at `revision` is the same on every member (asked for 20 s while members catch up); the
/// finding names each member's answer when it never is.
pub async fn check_hash_kv(endpoints: &[String], revision: i64) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut hashes: HashMap<String, Result<u32, String>> = HashMap::new();
        for endpoint in endpoints {
            let options = super::client_options(Duration::from_secs(2));
            let answer = match Client::connect([endpoint.as_str()], Some(options)).await {
                Ok(mut one) => one
                    .hash_kv(revision)
                    .await
                    .map(|h| h.hash())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            hashes.insert(endpoint.clone(), answer);
        }
        let first = hashes.values().next().cloned();
        if let Some(Ok(first)) = first
            && hashes.values().all(|h| h.as_ref().ok() == Some(&first))
        {
            return Vec::new();
        }
        if Instant::now() > deadline {
            return vec![format!("HashKV at revision {revision} differs: {hashes:?}")];
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::robustness::history::{Recorded, Request, Response};
    use crate::robustness::watch::WatchedEvent;

    fn put(key: &str, value: &str, revision: i64) -> Recorded {
        Recorded {
            client: 0,
            key: key.into(),
            request: Request::Put { value: value.into() },
            response: Response::Put { revision },
            call: Duration::ZERO,
            ret: Some(Duration::ZERO),
        }
    }

    fn event(key: &str, value: &str, revision: i64) -> WatchedEvent {
        WatchedEvent {
            revision,
            key: key.into(),
            value: value.into(),
            put: true,
        }
    }

    #[test]
    fn a_complete_watch_passes_and_each_fault_of_a_watch_is_named() {
        let history = History {
            ops: vec![put("a", "1", 2), put("b", "2", 3), put("a", "3", 4)],
        };
        let good = WatchLog {
            events: vec![event("a", "1", 2), event("b", "2", 3), event("a", "3", 4)],
            ..Default::default()
        };
        assert_eq!(check_watch(&history, &good), Vec::<String>::new());

        let missed = WatchLog {
            events: vec![event("a", "1", 2), event("a", "3", 4)],
            ..Default::default()
        };
        let f = check_watch(&history, &missed);
        assert!(f.len() == 1 && f[0].contains("never seen"), "{f:?}");

        let twice = WatchLog {
            events: vec![
                event("a", "1", 2),
                event("b", "2", 3),
                event("b", "2", 3),
                event("a", "3", 4),
            ],
            ..Default::default()
        };
        let f = check_watch(&history, &twice);
        assert!(f.len() == 1 && f[0].contains("twice"), "{f:?}");

        let back = WatchLog {
            events: vec![event("a", "1", 2), event("a", "3", 4), event("b", "2", 3)],
            ..Default::default()
        };
        let f = check_watch(&history, &back);
        assert!(f.len() == 1 && f[0].contains("went back"), "{f:?}");

        let wrong = WatchLog {
            events: vec![event("a", "1", 2), event("b", "9", 3), event("a", "3", 4)],
            ..Default::default()
        };
        let f = check_watch(&history, &wrong);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[1].contains("no client made"), "{f:?}");

        let cut = WatchLog {
            incomplete: Some("canceled".into()),
            ..good
        };
        assert!(check_watch(&history, &cut)[0].contains("incomplete"));
    }
}
