//! `etcd-operator local` under faults and load, over HTTPS against the real binary: the backing
//! etcd SIGKILLed (under concurrent writers, no acknowledged write may be lost and writes must
//! succeed again within 10 s of etcd serving again, without restarting the operator), and a burst
//! of creates beyond the in-flight limit (every request gets an HTTP answer: 201 or a 429 Status).

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_operator_tests::LocalOperator;
use etcd_operator_tests::kube_client::{ClientOptions, connect, etcd_clusters};
use etcd_operator_tests::operator::OperatorOptions;
use http_body_util::BodyExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::sync::Mutex;

const PREFIX: &str = "/registry/etcd.operator.dev/etcdclusters/default/";

/// A kube client of the operator that never retries (a 429 or 5xx must reach the test).
async fn client(op: &LocalOperator) -> kube::Client {
    let options = ClientOptions {
        no_retry: true,
        read_timeout: Some(Duration::from_secs(120)),
    };
    connect(&op.kubeconfig(), options).await.unwrap()
}

/// A paused cluster: stored and served like any other, but the controller starts no members.
fn cluster(name: &str) -> Value {
    json!({
        "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 1, "version": "3.5.1", "paused": true},
    })
}

fn etcd_pid(op: &LocalOperator) -> Option<u32> {
    std::fs::read_to_string(op.state_dir().join("etcd").join("etcd.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// The whole operator log of its first run (the tail is not enough: every failed write logs).
fn operator_log(op: &LocalOperator) -> String {
    std::fs::read_to_string(op.state_dir().join("operator-0.log")).unwrap_or_default()
}

/// Whether the backing etcd at `endpoint` answers, asked directly.
async fn etcd_answers(op: &LocalOperator, endpoint: &str) -> bool {
    let Some(options) = op.backing_etcd_connect_options() else {
        return false;
    };
    let options = options
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(Duration::from_secs(1));
    match etcd_client::Client::connect([endpoint], Some(options)).await {
        Ok(mut client) => client.status().await.is_ok(),
        Err(_) => false,
    }
}

/// GET `/readyz`: its HTTP code, or `None` when no answer came.
async fn readyz(client: &kube::Client) -> Option<u16> {
    let request = http::Request::get("/readyz")
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), client.send(request)).await {
        Ok(Ok(response)) => Some(response.status().as_u16()),
        _ => None,
    }
}

async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check().await {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within {timeout:?}");
}

#[tokio::test]
async fn a_killed_backing_etcd_is_restarted_and_readyz_goes_not_ready_then_ready() {
    let op = LocalOperator::start().await.unwrap();
    let client = client(&op).await;
    let endpoint = op.backing_etcd_endpoint().unwrap();
    let pid = etcd_pid(&op).unwrap();
    assert_eq!(readyz(&client).await, Some(200));

    // Poll /readyz all along.
    let seen = Arc::new(Mutex::new(Vec::<Option<u16>>::new()));
    let stop = stop_flag();
    let poller = {
        let (client, seen, stop) = (client.clone(), seen.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let code = readyz(&client).await;
                seen.lock().await.push(code);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let restarted_after = wait_for("a new backing etcd", Duration::from_secs(60), || async {
        etcd_pid(&op).is_some_and(|p| p != pid && etcd_operator_tests::leftovers::is_running(p))
    })
    .await;
    let new_pid = etcd_pid(&op).unwrap();
    let ready_after = wait_for("/readyz ok again", Duration::from_secs(60), || async {
        readyz(&client).await == Some(200)
    })
    .await;
    // The poller's own samples show the recovery too (it samples every 20 ms; give it time to
    // record a 200 after the 503s before it stops).
    wait_for(
        "the poller to see /readyz ok again",
        Duration::from_secs(10),
        || async {
            let seen = seen.lock().await;
            seen.iter()
                .position(|c| *c == Some(503))
                .is_some_and(|i| seen[i..].contains(&Some(200)))
        },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poller.await.unwrap();
    eprintln!(
        "etcd pid {pid} -> {new_pid}: new process after {restarted_after:?}, /readyz ok {ready_after:?} later"
    );

    let seen = seen.lock().await.clone();
    let first_not_ready = seen.iter().position(|c| *c == Some(503));
    assert!(
        first_not_ready.is_some(),
        "/readyz never said not ready: {seen:?}"
    );
    assert!(
        seen[first_not_ready.unwrap()..].contains(&Some(200)),
        "/readyz did not become ready again: {seen:?}"
    );
    assert!(
        !seen.contains(&None),
        "/readyz went unanswered while etcd was down: {seen:?}"
    );
    assert!(!zombie(pid), "the killed etcd was left <defunct>");
    assert_eq!(op.backing_etcd_endpoint().unwrap(), endpoint, "same ports");
    assert!(etcd_answers(&op, &endpoint).await);
    let log = operator_log(&op);
    assert!(
        log.contains("ERROR") && log.contains("the backing etcd exited") && log.contains("signal: 9"),
        "the exit was not logged as an error with its status:\n{}",
        op.log_tail()
    );
    // The operator was not restarted, and it serves writes.
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &etcd_clusters());
    let obj: DynamicObject = serde_json::from_value(cluster("after-restart")).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// A stop flag (an atomic: the suite needs nothing more).
fn stop_flag() -> Arc<std::sync::atomic::AtomicBool> {
    Arc::new(std::sync::atomic::AtomicBool::new(false))
}

/// What the writers saw.
#[derive(Debug, Default)]
struct Seen {
    /// Objects whose create was answered 2xx.
    created: BTreeSet<String>,
    /// Per object, the last annotation value an update of it was answered 2xx for.
    updated: BTreeMap<String, u64>,
    /// Answers by HTTP code.
    codes: BTreeMap<u16, usize>,
    /// Requests that got no HTTP answer.
    unanswered: Vec<String>,
    /// Per writer, when its writes (started after etcd served again) first succeeded.
    recovered: BTreeMap<usize, Instant>,
}

#[tokio::test]
async fn no_acknowledged_write_is_lost_when_the_backing_etcd_is_killed_under_eight_writers() {
    const WRITERS: usize = 8;
    let op = LocalOperator::start().await.unwrap();
    let client = client(&op).await;
    let endpoint = op.backing_etcd_endpoint().unwrap();
    let pid = etcd_pid(&op).unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &etcd_clusters());

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = stop_flag();
    // Set once etcd serves again: writes started after it count towards recovery.
    let back = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (api, seen, stop, back) = (api.clone(), seen.clone(), stop.clone(), back.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut mine: Option<String> = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let started = Instant::now();
                // Alternate: create a new object, then update the last one created.
                let (result, name, update) = match (&mine, n % 2) {
                    (Some(name), 0) => {
                        let patch = json!({"metadata": {"annotations": {"n": n.to_string()}}});
                        let r = api
                            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                            .map(|_| ());
                        (r, name.clone(), true)
                    }
                    _ => {
                        let name = format!("w{w}-{n}");
                        let obj: DynamicObject = serde_json::from_value(cluster(&name)).unwrap();
                        let r = api.create(&PostParams::default(), &obj).await.map(|_| ());
                        (r, name, false)
                    }
                };
                let mut s = seen.lock().await;
                match result {
                    Ok(()) => {
                        *s.codes.entry(if update { 200 } else { 201 }).or_default() += 1;
                        if update {
                            s.updated.insert(name, n);
                        } else {
                            s.created.insert(name.clone());
                            mine = Some(name);
                        }
                        if back.get().is_some_and(|b| started >= *b) {
                            s.recovered.entry(w).or_insert_with(Instant::now);
                        }
                    }
                    Err(kube::Error::Api(status)) => {
                        *s.codes.entry(status.code).or_default() += 1;
                    }
                    Err(other) => s.unanswered.push(format!("{name}: {other}")),
                }
                drop(s);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }

    tokio::time::sleep(Duration::from_secs(3)).await;
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    wait_for("the backing etcd serving again", Duration::from_secs(60), || {
        let (op, endpoint) = (&op, endpoint.clone());
        async move { etcd_answers(op, &endpoint).await }
    })
    .await;
    let back_at = Instant::now();
    back.set(back_at).unwrap();
    // Every writer succeeds again within 10 s of etcd serving again.
    let deadline = back_at + Duration::from_secs(10);
    while Instant::now() < deadline && seen.lock().await.recovered.len() < WRITERS {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Some more writes after recovery, then stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let seen = seen.lock().await;
    let recovery: BTreeMap<usize, Duration> = seen
        .recovered
        .iter()
        .map(|(w, at)| (*w, at.duration_since(back_at)))
        .collect();
    eprintln!(
        "etcd down for {:?}; answers {:?}; writers recovered after {:?}; {} creates and {} updated objects acknowledged",
        back_at.duration_since(killed),
        seen.codes,
        recovery,
        seen.created.len(),
        seen.updated.len()
    );
    assert_eq!(
        seen.recovered.len(),
        WRITERS,
        "not every writer succeeded within 10 s of etcd serving again: {recovery:?}\n{}",
        op.log_tail()
    );
    assert!(
        recovery.values().all(|d| *d <= Duration::from_secs(10)),
        "{recovery:?}"
    );
    assert!(
        seen.unanswered.is_empty(),
        "requests without an HTTP answer: {:?}",
        seen.unanswered
    );
    assert!(
        seen.codes.keys().any(|c| *c >= 500),
        "no write failed while etcd was down: did the kill happen? {:?}",
        seen.codes
    );
    assert_eq!(etcd_pid(&op).map(|p| p != pid), Some(true));

    // Nothing acknowledged is lost: in etcd itself...
    let mut etcd = etcd_client::Client::connect([endpoint.as_str()], op.backing_etcd_connect_options())
        .await
        .unwrap();
    let stored = etcd
        .get(PREFIX, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let in_etcd: BTreeMap<String, Value> = stored
        .kvs()
        .iter()
        .map(|kv| {
            let key = kv.key_str().unwrap().trim_start_matches(PREFIX).to_owned();
            let mut object: Value = serde_json::from_slice(kv.value()).unwrap();
            // What etcd knows of the key's history, for the message of a lost update: how many
            // writes it saw (a lost write either never reached etcd or was overwritten).
            object["etcd"] = json!({
                "createRevision": kv.create_revision(),
                "modRevision": kv.mod_revision(),
                "version": kv.version(),
            });
            (key, object)
        })
        .collect();
    // ... and as the API serves it.
    let listed: BTreeMap<String, Value> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| (o.metadata.name.clone().unwrap(), serde_json::to_value(o).unwrap()))
        .collect();
    for (source, objects) in [("etcd", &in_etcd), ("the API", &listed)] {
        let missing: Vec<&String> = seen
            .created
            .iter()
            .filter(|n| !objects.contains_key(*n))
            .collect();
        assert!(
            missing.is_empty(),
            "acknowledged creates missing in {source}: {missing:?}"
        );
        for (name, acked) in &seen.updated {
            let stored: u64 = objects[name]["metadata"]["annotations"]["n"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            assert!(
                stored >= *acked,
                "{name} in {source}: acknowledged update n={acked} lost (stored n={stored}); etcd's revisions {}, managedFields {}\n{}",
                objects[name]["etcd"],
                objects[name]["metadata"]["managedFields"],
                op.log_tail()
            );
        }
    }
}

#[tokio::test]
async fn a_burst_beyond_the_in_flight_limit_gets_only_201s_and_429_statuses() {
    const BURST: usize = 100;
    let op = LocalOperator::start_with(OperatorOptions {
        args: vec!["--max-mutating-requests-inflight=1".into()],
        ..OperatorOptions::default()
    })
    .await
    .unwrap();
    let client = client(&op).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(BURST));
    let mut tasks = Vec::new();
    for i in 0..BURST {
        let (client, barrier) = (client.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let name = format!("burst-{i}");
            let request =
                http::Request::post("/apis/etcd.operator.dev/v1alpha2/namespaces/default/etcdclusters")
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(cluster(&name).to_string().into_bytes()))
                    .unwrap();
            barrier.wait().await;
            let response = match client.send(request).await {
                Ok(response) => response,
                Err(error) => return (name, Err(error.to_string())),
            };
            let code = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = response.into_body().collect().await.map(|b| b.to_bytes());
            match body {
                Ok(body) => (name, Ok((code, retry_after, body))),
                Err(error) => (name, Err(format!("{code}, body cut: {error}"))),
            }
        }));
    }
    let mut codes = BTreeMap::<u16, usize>::new();
    let mut created = BTreeSet::new();
    let mut refused = BTreeSet::new();
    let mut unanswered = Vec::new();
    for task in tasks {
        let (name, outcome) = task.await.unwrap();
        match outcome {
            Ok((code, retry_after, body)) => {
                *codes.entry(code).or_default() += 1;
                match code {
                    201 => {
                        created.insert(name);
                    }
                    429 => {
                        let status: Value = serde_json::from_slice(&body).unwrap();
                        assert_eq!(status["kind"], "Status", "{status}");
                        assert_eq!(status["reason"], "TooManyRequests", "{status}");
                        assert_eq!(status["code"], 429, "{status}");
                        assert_eq!(retry_after.as_deref(), Some("1"));
                        refused.insert(name);
                    }
                    other => panic!("{name}: unexpected {other}: {}", String::from_utf8_lossy(&body)),
                }
            }
            Err(error) => unanswered.push(format!("{name}: {error}")),
        }
    }
    eprintln!("burst of {BURST} creates with 1 mutating request in flight: {codes:?}");
    assert!(
        unanswered.is_empty(),
        "requests without an HTTP answer: {unanswered:?}"
    );
    assert_eq!(created.len() + refused.len(), BURST, "{codes:?}");
    assert!(!created.is_empty(), "{codes:?}");
    assert!(!refused.is_empty(), "the limit refused nothing: {codes:?}");
    // Exactly the accepted ones are stored.
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &etcd_clusters());
    let stored: BTreeSet<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .filter(|n| n.starts_with("burst-"))
        .collect();
    assert_eq!(stored, created);
}
