//! Tests of the storage layer against a real etcd (3.5.1 from `.tools/`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcd_client::Client;
use etcd_operator_tests::{EtcdVersion, TestEtcd};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::*;

const PREFIX: &str = "/registry/etcd.operator.dev/etcdclusters/";

struct Fixture {
    storage: Storage,
    client: Client,
    // Declared last: etcd stops after the storage is gone.
    _etcd: TestEtcd,
}

async fn fixture_with(options: StorageOptions) -> Fixture {
    let etcd = TestEtcd::start(EtcdVersion::V3_5_1).await.unwrap();
    let client = etcd.client().await.unwrap();
    let storage = Storage::new(client.clone(), PREFIX, options).await.unwrap();
    storage.wait_initialized(Duration::from_secs(10)).await.unwrap();
    Fixture {
        storage,
        client,
        _etcd: etcd,
    }
}

async fn fixture() -> Fixture {
    fixture_with(StorageOptions::default()).await
}

fn object(ns: &str, name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "etcd.operator.dev/v1alpha2",
        "kind": "EtcdCluster",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
        "spec": {"replicas": replicas},
    })
}

fn with_rv(mut v: Value, rv: u64) -> Value {
    v["metadata"]["resourceVersion"] = json!(rv.to_string());
    v
}

fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn name_of(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap().to_owned()
}

async fn next_event(stream: &mut WatchStream) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("no watch event within 5 s")
        .expect("watch stream ended")
}

async fn assert_no_event(stream: &mut WatchStream, wait: Duration) {
    if let Ok(ev) = tokio::time::timeout(wait, stream.next()).await {
        panic!("unexpected watch event {ev:?}");
    }
}

fn describe(ev: &WatchEvent) -> (String, String, u64) {
    match ev {
        WatchEvent::Added(v) => ("ADDED".into(), name_of(v), rv_of(v)),
        WatchEvent::Modified(v) => ("MODIFIED".into(), name_of(v), rv_of(v)),
        WatchEvent::Deleted(v) => ("DELETED".into(), name_of(v), rv_of(v)),
        WatchEvent::Bookmark {
            resource_version,
            initial_events_end,
        } => (
            format!("BOOKMARK end={initial_events_end}"),
            String::new(),
            *resource_version,
        ),
        WatchEvent::Error(e) => (format!("ERROR {e}"), String::new(), 0),
    }
}

async fn set_replicas(storage: &Storage, ns: &str, name: &str, replicas: i64) -> Value {
    let outcome = storage
        .guaranteed_update(ns, name, |mut cur| {
            cur["spec"]["replicas"] = json!(replicas);
            Ok::<_, std::convert::Infallible>(UpdateAction::Write(cur))
        })
        .await
        .unwrap();
    match outcome {
        UpdateOutcome::Updated(v) => v,
        other => panic!("expected Updated, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_and_already_exists() {
    let f = fixture().await;
    let created = f.storage.create("ns", "a", object("ns", "a", 3)).await.unwrap();
    let rv = rv_of(&created);
    assert_eq!(created, with_rv(object("ns", "a", 3), rv));

    // Stored without resourceVersion, at the expected key, with mod revision = rv.
    let mut client = f.client.clone();
    let raw = client.get(format!("{PREFIX}ns/a"), None).await.unwrap();
    let kv = &raw.kvs()[0];
    assert_eq!(kv.mod_revision() as u64, rv);
    assert_eq!(
        serde_json::from_slice::<Value>(kv.value()).unwrap(),
        object("ns", "a", 3)
    );

    // Read-your-writes through the cache, straight after the write.
    let got = f
        .storage
        .get("ns", "a", ReadConsistency::Consistent)
        .await
        .unwrap();
    assert_eq!(got, Some(created.clone()));
    assert_eq!(f.storage.current_revision(), rv);
    let any = f.storage.get("ns", "a", ReadConsistency::Any).await.unwrap();
    assert_eq!(any, Some(created.clone()));
    assert_eq!(
        f.storage
            .get("ns", "missing", ReadConsistency::Consistent)
            .await
            .unwrap(),
        None
    );

    let err = f
        .storage
        .create("ns", "a", object("ns", "a", 5))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StorageError::AlreadyExists { key } if key == &format!("{PREFIX}ns/a")),
        "{err:?}"
    );
    // Unchanged.
    let got = f
        .storage
        .get("ns", "a", ReadConsistency::Consistent)
        .await
        .unwrap();
    assert_eq!(got, Some(created));

    let err = f
        .storage
        .create("ns", "../x", object("ns", "x", 1))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::InvalidOptions { .. }), "{err:?}");
}

#[tokio::test]
async fn consistent_reads_see_writes_of_other_servers() {
    let f = fixture().await;
    let mut client = f.client.clone();
    // Another API server writes the same prefix.
    client
        .put(
            format!("{PREFIX}ns/other"),
            object("ns", "other", 1).to_string(),
            None,
        )
        .await
        .unwrap();
    let got = f
        .storage
        .get("ns", "other", ReadConsistency::Consistent)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got["spec"]["replicas"], json!(1));
    // A write outside the prefix moves etcd's revision; progress notifications let the cache
    // catch up quickly instead of waiting for the 5 s fallback.
    client.put("/unrelated/key", "x", None).await.unwrap();
    let start = Instant::now();
    let list = f.storage.list(&ListOptions::default()).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(list.items.len(), 1);
    let current = client.get("x", None).await.unwrap().header().unwrap().revision() as u64;
    assert_eq!(list.resource_version, current);
}

#[tokio::test]
async fn single_writer_mode_reads_own_writes() {
    let f = fixture_with(StorageOptions {
        consistency: ConsistencyMode::SingleWriter,
        ..StorageOptions::default()
    })
    .await;
    for i in 0..20 {
        let name = format!("o{i}");
        let created = f
            .storage
            .create("ns", &name, object("ns", &name, i))
            .await
            .unwrap();
        let got = f
            .storage
            .get("ns", &name, ReadConsistency::Consistent)
            .await
            .unwrap();
        assert_eq!(got, Some(created));
        let updated = set_replicas(&f.storage, "ns", &name, 100 + i).await;
        let list = f.storage.list(&ListOptions::default()).await.unwrap();
        assert_eq!(list.items.iter().find(|v| name_of(v) == name), Some(&updated));
    }
}

#[tokio::test]
async fn concurrent_updates_lose_nothing() {
    let f = fixture().await;
    f.storage
        .create("ns", "counter", object("ns", "counter", 0))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let storage = f.storage.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                storage
                    .guaranteed_update("ns", "counter", |mut cur| {
                        let n = cur["spec"]["replicas"].as_i64().unwrap();
                        cur["spec"]["replicas"] = json!(n + 1);
                        Ok::<_, std::convert::Infallible>(UpdateAction::Write(cur))
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let got = f
        .storage
        .get("ns", "counter", ReadConsistency::Consistent)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got["spec"]["replicas"], json!(160));
    let mut client = f.client.clone();
    let raw = client.get(format!("{PREFIX}ns/counter"), None).await.unwrap();
    assert_eq!(raw.kvs()[0].version(), 161);
    assert_eq!(rv_of(&got), raw.kvs()[0].mod_revision() as u64);
}

#[tokio::test]
async fn identical_write_is_a_noop_without_event() {
    let f = fixture().await;
    let created = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let rv = rv_of(&created);
    let mut watch = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(rv.to_string()),
            ..WatchOptions::default()
        })
        .unwrap();
    let outcome = f
        .storage
        .guaranteed_update("ns", "a", |cur| {
            Ok::<_, std::convert::Infallible>(UpdateAction::Write(cur))
        })
        .await
        .unwrap();
    assert_eq!(outcome, UpdateOutcome::Unchanged(created.clone()));
    let outcome = f
        .storage
        .guaranteed_update("ns", "a", |_| {
            Ok::<_, std::convert::Infallible>(UpdateAction::Noop)
        })
        .await
        .unwrap();
    assert_eq!(outcome, UpdateOutcome::Unchanged(created.clone()));
    // A different resourceVersion in the written object does not count as a change.
    let outcome = f
        .storage
        .guaranteed_update("ns", "a", |cur| {
            Ok::<_, std::convert::Infallible>(UpdateAction::Write(with_rv(cur, 999)))
        })
        .await
        .unwrap();
    assert_eq!(outcome, UpdateOutcome::Unchanged(created.clone()));
    assert_no_event(&mut watch, Duration::from_millis(300)).await;
    let mut client = f.client.clone();
    let raw = client.get(format!("{PREFIX}ns/a"), None).await.unwrap();
    assert_eq!(raw.kvs()[0].mod_revision() as u64, rv);

    let updated = set_replicas(&f.storage, "ns", "a", 2).await;
    assert!(rv_of(&updated) > rv);
    assert_eq!(
        describe(&next_event(&mut watch).await),
        ("MODIFIED".into(), "a".into(), rv_of(&updated))
    );
}

#[derive(Debug, PartialEq)]
struct Refused(u64);

#[tokio::test]
async fn update_closure_errors_and_missing_objects() {
    let f = fixture().await;
    let created = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    // The caller's precondition check (a stale resourceVersion) refuses: nothing written.
    let err = f
        .storage
        .guaranteed_update("ns", "a", |cur| Err::<UpdateAction, _>(Refused(rv_of(&cur))))
        .await
        .unwrap_err();
    assert!(matches!(err, GuaranteedUpdateError::Update(Refused(rv)) if rv == rv_of(&created)));
    assert_eq!(
        f.storage
            .get("ns", "a", ReadConsistency::Consistent)
            .await
            .unwrap(),
        Some(created)
    );

    let mut called = false;
    let err = f
        .storage
        .guaranteed_update("ns", "missing", |_| {
            called = true;
            Ok::<_, Refused>(UpdateAction::Noop)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, GuaranteedUpdateError::Storage(StorageError::NotFound { .. })),
        "{err:?}"
    );
    assert!(!called);
}

#[tokio::test]
async fn update_retries_when_the_cache_is_stale() {
    let f = fixture().await;
    let created = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    assert!(
        f.storage
            .inner
            .wait_for_rev(rv_of(&created), Duration::from_secs(5), false)
            .await
    );
    // Another writer changes the object; keep the cache from seeing it.
    f.storage.disconnect_cache_watch(Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut client = f.client.clone();
    let put = client
        .put(format!("{PREFIX}ns/a"), object("ns", "a", 7).to_string(), None)
        .await
        .unwrap();
    let etcd_rev = put.header().unwrap().revision() as u64;
    let mut seen = Vec::new();
    let outcome = f
        .storage
        .guaranteed_update("ns", "a", |mut cur| {
            seen.push(rv_of(&cur));
            // Like a PUT carrying the latest resourceVersion: refuses anything else.
            if rv_of(&cur) != etcd_rev {
                return Err(Refused(rv_of(&cur)));
            }
            cur["spec"]["replicas"] = json!(8);
            Ok(UpdateAction::Write(cur))
        })
        .await
        .unwrap();
    let UpdateOutcome::Updated(v) = outcome else {
        panic!("expected Updated, got {outcome:?}");
    };
    assert_eq!(v["spec"]["replicas"], json!(8));
    assert_eq!(seen.len(), 2, "cached then fresh: {seen:?}");
    assert_eq!(seen[1], etcd_rev);
}

#[tokio::test]
async fn delete_honours_preconditions() {
    let f = fixture().await;
    let created = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let rv = rv_of(&created);
    let err = f
        .storage
        .delete(
            "ns",
            "a",
            Preconditions {
                uid: Some("other-uid".into()),
                resource_version: None,
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StorageError::PreconditionFailed { what: "UID", expected, actual, .. } if expected == "other-uid" && actual == "uid-a"),
        "{err:?}"
    );
    let err = f
        .storage
        .delete(
            "ns",
            "a",
            Preconditions {
                uid: Some("uid-a".into()),
                resource_version: Some("1".into()),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StorageError::PreconditionFailed { what: "ResourceVersion", expected, actual, .. } if expected == "1" && *actual == rv.to_string()),
        "{err:?}"
    );
    assert_eq!(
        f.storage
            .get("ns", "a", ReadConsistency::Consistent)
            .await
            .unwrap(),
        Some(created.clone())
    );

    let last = f
        .storage
        .delete(
            "ns",
            "a",
            Preconditions {
                uid: Some("uid-a".into()),
                resource_version: Some(rv.to_string()),
            },
        )
        .await
        .unwrap();
    let delete_rev = rv_of(&last);
    assert!(delete_rev > rv);
    assert_eq!(last, with_rv(object("ns", "a", 1), delete_rev));
    assert_eq!(
        f.storage
            .get("ns", "a", ReadConsistency::Consistent)
            .await
            .unwrap(),
        None
    );
    let err = f
        .storage
        .delete("ns", "a", Preconditions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::NotFound { .. }), "{err:?}");
}

#[tokio::test]
async fn delete_through_guaranteed_update() {
    let f = fixture().await;
    f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let outcome = f
        .storage
        .guaranteed_update("ns", "a", |_| Ok::<_, Refused>(UpdateAction::Delete))
        .await
        .unwrap();
    let UpdateOutcome::Deleted(last) = outcome else {
        panic!("expected Deleted, got {outcome:?}");
    };
    assert_eq!(last, with_rv(object("ns", "a", 1), rv_of(&last)));
    assert_eq!(
        f.storage
            .get("ns", "a", ReadConsistency::Consistent)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn create_raw_returns_the_bytes_a_read_returns() {
    let f = fixture().await;
    let created = f
        .storage
        .create_raw("ns", "a", object("ns", "a", 3))
        .await
        .unwrap();
    assert_eq!(created.key(), "ns/a");
    assert!(created.servable());
    let got = f
        .storage
        .get_raw("ns", "a", ReadConsistency::Consistent)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(created.resource_version(), got.resource_version());
    assert_eq!(created.to_json().unwrap(), got.to_json().unwrap());
    assert_eq!(
        created.decode().unwrap(),
        with_rv(object("ns", "a", 3), created.resource_version())
    );
    let err = f
        .storage
        .create_raw("ns", "a", object("ns", "a", 5))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::AlreadyExists { .. }), "{err:?}");
}

async fn create_many(storage: &Storage, ns: &str, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("obj-{i:02}");
        storage.create(ns, &name, object(ns, &name, 1)).await.unwrap();
        names.push(name);
    }
    names
}

async fn collect_pages(storage: &Storage, base: ListOptions) -> (Vec<ListResult>, Vec<String>) {
    let mut pages = Vec::new();
    let mut names = Vec::new();
    let mut opts = base.clone();
    loop {
        let page = storage.list(&opts).await.unwrap();
        names.extend(page.items.iter().map(name_of));
        let next = page.continue_token.clone();
        pages.push(page);
        match next {
            Some(token) => {
                opts = ListOptions {
                    continue_token: Some(token),
                    resource_version: None,
                    resource_version_match: None,
                    ..base.clone()
                }
            }
            None => break,
        }
        assert!(pages.len() < 20, "pagination does not end");
    }
    (pages, names)
}

#[tokio::test]
async fn list_filters_namespaces_and_paginates() {
    let f = fixture().await;
    let names = create_many(&f.storage, "a", 25).await;
    create_many(&f.storage, "ab", 3).await;
    create_many(&f.storage, "b", 2).await;

    let all = f.storage.list(&ListOptions::default()).await.unwrap();
    assert_eq!(all.items.len(), 30);
    assert_eq!(all.continue_token, None);
    assert_eq!(all.remaining_item_count, None);
    let keys: Vec<String> = all
        .items
        .iter()
        .map(|v| format!("{}/{}", v["metadata"]["namespace"].as_str().unwrap(), name_of(v)))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);

    let only_b = f
        .storage
        .list(&ListOptions {
            namespace: Some("b".into()),
            ..ListOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(
        only_b.items.iter().map(name_of).collect::<Vec<_>>(),
        vec!["obj-00", "obj-01"]
    );

    // Pages of 10 over namespace "a" (not "ab"), served from the cache.
    let base = ListOptions {
        namespace: Some("a".into()),
        limit: Some(10),
        ..ListOptions::default()
    };
    let (pages, got) = collect_pages(&f.storage, base.clone()).await;
    assert_eq!(got, names);
    assert_eq!(pages.len(), 3);
    let rv = pages[0].resource_version;
    assert!(pages.iter().all(|p| p.resource_version == rv));
    assert_eq!(
        pages.iter().map(|p| p.remaining_item_count).collect::<Vec<_>>(),
        vec![Some(15), Some(5), None]
    );

    // A change between pages: the later pages still show the first page's snapshot (from etcd).
    let first = f.storage.list(&base).await.unwrap();
    set_replicas(&f.storage, "a", "obj-15", 9).await;
    f.storage
        .delete("a", "obj-24", Preconditions::default())
        .await
        .unwrap();
    f.storage
        .create("a", "obj-99", object("a", "obj-99", 1))
        .await
        .unwrap();
    let (rest, rest_names) = collect_pages(
        &f.storage,
        ListOptions {
            continue_token: first.continue_token.clone(),
            ..base.clone()
        },
    )
    .await;
    assert_eq!(rest_names, names[10..].to_vec());
    assert!(rest.iter().all(|p| p.resource_version == first.resource_version));
    let obj15 = rest[0].items.iter().find(|v| name_of(v) == "obj-15").unwrap();
    assert_eq!(obj15["spec"]["replicas"], json!(1));

    // A resourceVersion=0 list with a limit also pages consistently.
    let (_, zero_names) = collect_pages(
        &f.storage,
        ListOptions {
            resource_version: Some("0".into()),
            ..base.clone()
        },
    )
    .await;
    let mut now: Vec<String> = names[..24].to_vec();
    now.push("obj-99".into());
    assert_eq!(zero_names, now);
}

#[tokio::test]
async fn list_rejects_bad_tokens_and_options() {
    use base64::Engine as _;
    let f = fixture().await;
    create_many(&f.storage, "ns", 3).await;
    let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    for token in [
        "garbage!!".to_owned(),
        enc("{}"),
        enc(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"../../secrets/x\u0000"}"#),
        enc(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"/ns/../../../x"}"#),
    ] {
        let err = f
            .storage
            .list(&ListOptions {
                continue_token: Some(token.clone()),
                ..ListOptions::default()
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, StorageError::InvalidContinue { .. }),
            "{token}: {err:?}"
        );
    }
    let page = f
        .storage
        .list(&ListOptions {
            limit: Some(1),
            ..ListOptions::default()
        })
        .await
        .unwrap();
    for (opts, what) in [
        (
            ListOptions {
                continue_token: page.continue_token.clone(),
                resource_version: Some("5".into()),
                ..ListOptions::default()
            },
            "rv with continue",
        ),
        (
            ListOptions {
                continue_token: page.continue_token.clone(),
                resource_version_match: Some(RvMatch::NotOlderThan),
                ..ListOptions::default()
            },
            "match with continue",
        ),
        (
            ListOptions {
                resource_version_match: Some(RvMatch::Exact),
                ..ListOptions::default()
            },
            "match without rv",
        ),
        (
            ListOptions {
                resource_version: Some("0".into()),
                resource_version_match: Some(RvMatch::Exact),
                ..ListOptions::default()
            },
            "exact 0",
        ),
    ] {
        let err = f.storage.list(&opts).await.unwrap_err();
        assert!(
            matches!(err, StorageError::InvalidOptions { .. }),
            "{what}: {err:?}"
        );
    }
    let err = f
        .storage
        .list(&ListOptions {
            resource_version: Some("abc".into()),
            ..ListOptions::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, StorageError::InvalidResourceVersion { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn list_exact_not_older_than_and_compaction() {
    let f = fixture_with(StorageOptions {
        resource_version_wait: Duration::from_millis(300),
        ..StorageOptions::default()
    })
    .await;
    let created = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let rv1 = rv_of(&created);
    let updated = set_replicas(&f.storage, "ns", "a", 2).await;
    let rv2 = rv_of(&updated);

    let exact = |rv: u64| ListOptions {
        resource_version: Some(rv.to_string()),
        resource_version_match: Some(RvMatch::Exact),
        ..ListOptions::default()
    };
    let old = f.storage.list(&exact(rv1)).await.unwrap();
    assert_eq!(old.resource_version, rv1);
    assert_eq!(old.items, vec![created.clone()]);
    let at2 = f.storage.list(&exact(rv2)).await.unwrap();
    assert_eq!(at2.items, vec![updated.clone()]);

    let not_older = f
        .storage
        .list(&ListOptions {
            resource_version: Some(rv1.to_string()),
            resource_version_match: Some(RvMatch::NotOlderThan),
            ..ListOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(not_older.items, vec![updated.clone()]);
    assert!(not_older.resource_version >= rv2);

    let err = f
        .storage
        .list(&ListOptions {
            resource_version: Some((rv2 + 100).to_string()),
            resource_version_match: Some(RvMatch::NotOlderThan),
            ..ListOptions::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, StorageError::TooLargeResourceVersion { requested, .. } if requested == rv2 + 100),
        "{err:?}"
    );
    let err = f.storage.list(&exact(rv2 + 100)).await.unwrap_err();
    assert!(
        matches!(err, StorageError::TooLargeResourceVersion { .. }),
        "{err:?}"
    );

    // A paged list started before a compaction cannot continue consistently.
    create_many(&f.storage, "p", 5).await;
    let first = f
        .storage
        .list(&ListOptions {
            namespace: Some("p".into()),
            limit: Some(2),
            ..ListOptions::default()
        })
        .await
        .unwrap();
    set_replicas(&f.storage, "ns", "a", 3).await;
    let mut client = f.client.clone();
    let current = client.get("x", None).await.unwrap().header().unwrap().revision();
    client.compact(current, None).await.unwrap();

    let err = f.storage.list(&exact(rv1)).await.unwrap_err();
    assert!(
        matches!(&err, StorageError::Expired { requested, message, .. } if *requested == rv1 && message == "The resourceVersion for the provided list is too old."),
        "{err:?}"
    );
    let err = f
        .storage
        .list(&ListOptions {
            namespace: Some("p".into()),
            continue_token: first.continue_token.clone(),
            limit: Some(2),
            ..ListOptions::default()
        })
        .await
        .unwrap_err();
    let StorageError::ExpiredContinue {
        inconsistent_continue: Some(token),
        ..
    } = err
    else {
        panic!("expected ExpiredContinue, got {err:?}");
    };
    // The inconsistent continuation lists the rest at the latest revision.
    let (_, rest) = collect_pages(
        &f.storage,
        ListOptions {
            namespace: Some("p".into()),
            continue_token: Some(token),
            limit: Some(2),
            ..ListOptions::default()
        },
    )
    .await;
    assert_eq!(rest, vec!["obj-02", "obj-03", "obj-04"]);
    // Lists from the cache still work.
    let zero = f
        .storage
        .list(&ListOptions {
            resource_version: Some("0".into()),
            namespace: Some("ns".into()),
            ..ListOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(zero.items[0]["spec"]["replicas"], json!(3));
}

#[tokio::test]
async fn watch_from_zero_sends_state_then_changes() {
    let f = fixture().await;
    let b = f.storage.create("ns", "b", object("ns", "b", 1)).await.unwrap();
    let a = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let c = f
        .storage
        .create("other", "c", object("other", "c", 1))
        .await
        .unwrap();
    // Unset and 0 serve the cache's current state (as the watch cache of kube-apiserver does):
    // let the cache catch up with the writes first, or a write may come as an event after the
    // initial state instead of in it (seen on a loaded machine).
    let written = rv_of(&c);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while f.storage.current_revision() < written {
        assert!(std::time::Instant::now() < deadline, "the cache never caught up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for rv in [None, Some("0".to_owned())] {
        let mut w = f
            .storage
            .watch(&WatchOptions {
                namespace: Some("ns".into()),
                resource_version: rv.clone(),
                ..WatchOptions::default()
            })
            .unwrap();
        assert_eq!(
            describe(&next_event(&mut w).await),
            ("ADDED".into(), "a".into(), rv_of(&a))
        );
        assert_eq!(
            describe(&next_event(&mut w).await),
            ("ADDED".into(), "b".into(), rv_of(&b))
        );
        assert_no_event(&mut w, Duration::from_millis(200)).await;
    }
    let mut w = f
        .storage
        .watch(&WatchOptions {
            namespace: Some("ns".into()),
            ..WatchOptions::default()
        })
        .unwrap();
    next_event(&mut w).await;
    next_event(&mut w).await;
    f.storage
        .create("other", "d", object("other", "d", 1))
        .await
        .unwrap();
    let e = f.storage.create("ns", "e", object("ns", "e", 1)).await.unwrap();
    let a2 = set_replicas(&f.storage, "ns", "a", 5).await;
    let gone = f
        .storage
        .delete("ns", "a", Preconditions::default())
        .await
        .unwrap();
    match next_event(&mut w).await {
        WatchEvent::Added(v) => assert_eq!(v, e),
        other => panic!("{other:?}"),
    }
    match next_event(&mut w).await {
        WatchEvent::Modified(v) => assert_eq!(v, a2),
        other => panic!("{other:?}"),
    }
    match next_event(&mut w).await {
        // The last state, with the revision of the delete.
        WatchEvent::Deleted(v) => {
            assert_eq!(v, with_rv(object("ns", "a", 5), rv_of(&gone)));
            assert!(rv_of(&v) > rv_of(&a2));
        }
        other => panic!("{other:?}"),
    }
    assert_no_event(&mut w, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn watch_from_resource_version_sends_only_later_changes() {
    let f = fixture().await;
    f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let b = f.storage.create("ns", "b", object("ns", "b", 1)).await.unwrap();
    let a2 = set_replicas(&f.storage, "ns", "a", 2).await;
    let mut w = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(rv_of(&b).to_string()),
            ..WatchOptions::default()
        })
        .unwrap();
    assert_eq!(
        describe(&next_event(&mut w).await),
        ("MODIFIED".into(), "a".into(), rv_of(&a2))
    );
    assert_no_event(&mut w, Duration::from_millis(200)).await;
    let c = f.storage.create("ns", "c", object("ns", "c", 1)).await.unwrap();
    assert_eq!(
        describe(&next_event(&mut w).await),
        ("ADDED".into(), "c".into(), rv_of(&c))
    );

    // A future resourceVersion waits for the cache to get there.
    let future = rv_of(&c) + 1;
    let mut w = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(future.to_string()),
            ..WatchOptions::default()
        })
        .unwrap();
    let d = f.storage.create("ns", "d", object("ns", "d", 1)).await.unwrap();
    assert_eq!(rv_of(&d), future);
    // Events after `future` only: d itself is at `future`.
    assert_no_event(&mut w, Duration::from_millis(200)).await;
    let e = f.storage.create("ns", "e", object("ns", "e", 1)).await.unwrap();
    assert_eq!(
        describe(&next_event(&mut w).await),
        ("ADDED".into(), "e".into(), rv_of(&e))
    );
}

/// Waits until the cache has opened `n` etcd watches in all.
async fn wait_backing_watches(storage: &Storage, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let opened = storage
            .inner
            .backing_watches
            .load(std::sync::atomic::Ordering::Relaxed);
        if opened == n {
            return;
        }
        assert!(
            opened < n && Instant::now() < deadline,
            "the cache opened {opened} etcd watches, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_outsized_event_reopens_the_etcd_watch_and_loses_nothing() {
    let f = fixture_with(StorageOptions {
        watch_reopen_bytes: 64 * 1024,
        watch_reopen_quiet: Duration::from_secs(2),
        ..StorageOptions::default()
    })
    .await;
    let first = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    wait_backing_watches(&f.storage, 1).await;
    let mut w = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(rv_of(&first).to_string()),
            ..WatchOptions::default()
        })
        .unwrap();

    // A 100 KB object, and behind it writes by another server (straight to etcd), each within
    // the quiet time of the one before: the watch stays open while events keep coming.
    let mut huge = object("ns", "huge", 1);
    huge["metadata"]["annotations"] = json!({"big": "x".repeat(100 * 1024)});
    let huge = f.storage.create("ns", "huge", huge).await.unwrap();
    let mut client = f.client.clone();
    let mut expected = vec![("ADDED".to_owned(), "huge".to_owned(), rv_of(&huge))];
    let opened = || {
        f.storage
            .inner
            .backing_watches
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    for name in ["b", "c", "d"] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let put = client
            .put(
                format!("{PREFIX}ns/{name}"),
                object("ns", name, 1).to_string(),
                None,
            )
            .await
            .unwrap();
        expected.push((
            "ADDED".to_owned(),
            name.to_owned(),
            put.header().unwrap().revision() as u64,
        ));
    }
    assert_eq!(opened(), 1, "reopened while events kept coming");
    let mut seen = Vec::new();
    for _ in 0..expected.len() {
        seen.push(describe(&next_event(&mut w).await));
    }
    assert_eq!(seen, expected);
    // Quiet: reopened, once, for the outsized message only; a write right after is seen.
    wait_backing_watches(&f.storage, 2).await;
    let put = client
        .put(format!("{PREFIX}ns/e"), object("ns", "e", 1).to_string(), None)
        .await
        .unwrap();
    assert_eq!(
        describe(&next_event(&mut w).await),
        (
            "ADDED".into(),
            "e".into(),
            put.header().unwrap().revision() as u64
        )
    );
    assert_no_event(&mut w, Duration::from_millis(200)).await;
    let list = f.storage.list(&ListOptions::default()).await.unwrap();
    let names: Vec<String> = list.items.iter().map(name_of).collect();
    assert_eq!(names, ["a", "b", "c", "d", "e", "huge"]);

    // The reopened watch goes on: a change, and the huge object's deletion.
    set_replicas(&f.storage, "ns", "a", 2).await;
    let deleted = client.delete(format!("{PREFIX}ns/huge"), None).await.unwrap();
    let deleted_rev = deleted.header().unwrap().revision() as u64;
    assert_eq!(describe(&next_event(&mut w).await).1, "a");
    assert_eq!(
        describe(&next_event(&mut w).await),
        ("DELETED".into(), "huge".into(), deleted_rev)
    );
}

#[tokio::test]
async fn watch_bookmarks_only_when_allowed() {
    let f = fixture_with(StorageOptions {
        bookmark_interval: Duration::from_millis(100),
        ..StorageOptions::default()
    })
    .await;
    let a = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let mut with = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(rv_of(&a).to_string()),
            allow_bookmarks: true,
            ..WatchOptions::default()
        })
        .unwrap();
    let mut without = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(rv_of(&a).to_string()),
            ..WatchOptions::default()
        })
        .unwrap();
    assert_eq!(
        describe(&next_event(&mut with).await),
        ("BOOKMARK end=false".into(), String::new(), rv_of(&a))
    );
    let b = f.storage.create("ns", "b", object("ns", "b", 1)).await.unwrap();
    // The change first, then bookmarks at its revision.
    loop {
        let ev = describe(&next_event(&mut with).await);
        if ev.0 == "ADDED" {
            assert_eq!(ev, ("ADDED".into(), "b".into(), rv_of(&b)));
            break;
        }
        assert_eq!(ev, ("BOOKMARK end=false".into(), String::new(), rv_of(&a)));
    }
    assert_eq!(
        describe(&next_event(&mut with).await),
        ("BOOKMARK end=false".into(), String::new(), rv_of(&b))
    );
    assert_eq!(
        describe(&next_event(&mut without).await),
        ("ADDED".into(), "b".into(), rv_of(&b))
    );
    assert_no_event(&mut without, Duration::from_millis(400)).await;
}

#[tokio::test]
async fn watch_send_initial_events_ends_with_bookmark() {
    let f = fixture().await;
    let a = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let b = f.storage.create("ns", "b", object("ns", "b", 1)).await.unwrap();
    for rv in [None, Some("0".to_owned()), Some(rv_of(&a).to_string())] {
        let mut w = f
            .storage
            .watch(&WatchOptions {
                resource_version: rv.clone(),
                send_initial_events: true,
                allow_bookmarks: true,
                ..WatchOptions::default()
            })
            .unwrap();
        let got = vec![
            describe(&next_event(&mut w).await),
            describe(&next_event(&mut w).await),
            describe(&next_event(&mut w).await),
        ];
        let state_rv = f.storage.current_revision();
        assert_eq!(
            got,
            vec![
                ("ADDED".into(), "a".into(), rv_of(&a)),
                ("ADDED".into(), "b".into(), rv_of(&b)),
                ("BOOKMARK end=true".into(), String::new(), state_rv),
            ],
            "rv {rv:?}"
        );
    }
    let mut w = f
        .storage
        .watch(&WatchOptions {
            send_initial_events: true,
            allow_bookmarks: true,
            ..WatchOptions::default()
        })
        .unwrap();
    for _ in 0..3 {
        next_event(&mut w).await;
    }
    let c = f.storage.create("ns", "c", object("ns", "c", 1)).await.unwrap();
    assert_eq!(
        describe(&next_event(&mut w).await),
        ("ADDED".into(), "c".into(), rv_of(&c))
    );
}

#[tokio::test]
async fn reads_from_etcd_observe_the_prefix_not_another_prefix_s_revision() {
    // etcd 3.5.1: progress notifications are not trusted, so a consistent read waits in full
    // for the observed revision, which the cache must be able to reach through the prefix's
    // own events.
    let f = fixture_with(StorageOptions {
        consistent_read_timeout: Duration::from_secs(30),
        ..StorageOptions::default()
    })
    .await;
    let a = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let mut client = f.client.clone();
    client.put("/elsewhere/x", "1", None).await.unwrap();
    let (items, header) = f.storage.inner.list_raw_from_etcd(None).await.unwrap();
    assert_eq!(items.len(), 1);
    assert!(header > rv_of(&a), "etcd moved on through another prefix");
    assert_eq!(
        f.storage
            .inner
            .observed_rev
            .load(std::sync::atomic::Ordering::SeqCst),
        rv_of(&a),
        "only the prefix's newest object is observed"
    );
    // So the next consistent watch-list starts straight away rather than waiting the whole
    // (here 30 s) timeout for a revision no event of the prefix brings: its initial events
    // arrive while the test's own 10 s bound holds.
    client.put("/elsewhere/y", "2", None).await.unwrap();
    let mut w = f
        .storage
        .watch(&WatchOptions {
            send_initial_events: true,
            allow_bookmarks: true,
            ..WatchOptions::default()
        })
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("the watch-list waited for another prefix's revision");
    assert_eq!(describe(&first.unwrap()).1, "a");
}

#[tokio::test]
async fn watch_from_compacted_or_evicted_revision_is_expired() {
    let f = fixture_with(StorageOptions {
        event_buffer_capacity: 5,
        ..StorageOptions::default()
    })
    .await;
    let a = f.storage.create("ns", "a", object("ns", "a", 0)).await.unwrap();
    let mut last = a.clone();
    for i in 1..=10 {
        last = set_replicas(&f.storage, "ns", "a", i).await;
    }
    // The cache follows etcd's watch: until it has seen the last write, its ring buffer may still
    // hold the creation (this raced on a loaded machine).
    assert!(
        f.storage
            .inner
            .wait_for_rev(rv_of(&last), Duration::from_secs(5), false)
            .await
    );
    // Older than the ring buffer of 5 events.
    let err = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(rv_of(&a).to_string()),
            ..WatchOptions::default()
        })
        .unwrap_err();
    let StorageError::Expired {
        requested,
        oldest,
        message,
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*requested, rv_of(&a));
    assert_eq!(
        message,
        &format!("too old resource version: {requested} ({oldest})")
    );
    assert!(*oldest > rv_of(&a));
    // Within the buffer: fine.
    let recent = f.storage.current_revision() - 2;
    let mut w = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(recent.to_string()),
            ..WatchOptions::default()
        })
        .unwrap();
    assert_eq!(describe(&next_event(&mut w).await).2, recent + 1);

    // Compaction through the storage forgets the history before it.
    assert_eq!(f.storage.compact().await.unwrap(), None);
    let before = f.storage.current_revision();
    set_replicas(&f.storage, "ns", "a", 100).await;
    let compacted = f.storage.compact().await.unwrap().unwrap();
    assert!(compacted >= before as i64);
    let err = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some((compacted - 1).to_string()),
            ..WatchOptions::default()
        })
        .unwrap_err();
    assert!(matches!(err, StorageError::Expired { .. }), "{err:?}");
    // etcd itself was compacted.
    let mut client = f.client.clone();
    let err = client
        .get(
            format!("{PREFIX}ns/a"),
            Some(etcd_client::GetOptions::new().with_revision(compacted - 1)),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("compacted"), "{err}");
}

#[tokio::test]
async fn slow_watcher_gets_expired_event() {
    let f = fixture_with(StorageOptions {
        event_buffer_capacity: 5,
        ..StorageOptions::default()
    })
    .await;
    let a = f.storage.create("ns", "a", object("ns", "a", 0)).await.unwrap();
    let mut w = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(rv_of(&a).to_string()),
            ..WatchOptions::default()
        })
        .unwrap();
    let mut last = a.clone();
    for i in 1..=20 {
        last = set_replicas(&f.storage, "ns", "a", i).await;
    }
    f.storage.wait_initialized(Duration::from_secs(1)).await.unwrap();
    assert!(
        f.storage
            .inner
            .wait_for_rev(rv_of(&last), Duration::from_secs(5), false)
            .await
    );
    match next_event(&mut w).await {
        WatchEvent::Error(StorageError::Expired {
            requested, message, ..
        }) => {
            assert_eq!(requested, rv_of(&a));
            assert!(
                message.starts_with(&format!("too old resource version: {}", rv_of(&a))),
                "{message}"
            );
        }
        other => panic!("expected Expired, got {other:?}"),
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(1), w.next())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn cache_relists_after_its_watch_is_compacted() {
    let f = fixture().await;
    f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    f.storage.create("ns", "b", object("ns", "b", 1)).await.unwrap();
    let mut w = f.storage.watch(&WatchOptions::default()).unwrap();
    next_event(&mut w).await;
    next_event(&mut w).await;

    f.storage.disconnect_cache_watch(Duration::from_millis(500));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Meanwhile: another writer changes things, and etcd is compacted past the cache.
    let mut client = f.client.clone();
    client
        .put(format!("{PREFIX}ns/a"), object("ns", "a", 9).to_string(), None)
        .await
        .unwrap();
    client.delete(format!("{PREFIX}ns/b"), None).await.unwrap();
    let put = client
        .put(format!("{PREFIX}ns/c"), object("ns", "c", 1).to_string(), None)
        .await
        .unwrap();
    let rev = put.header().unwrap().revision();
    client.compact(rev, None).await.unwrap();

    // Existing watchers are told to relist.
    match next_event(&mut w).await {
        WatchEvent::Error(StorageError::Expired { .. }) => {}
        other => panic!("expected Expired, got {other:?}"),
    }
    // The cache has the new state.
    assert!(
        f.storage
            .inner
            .wait_for_rev(rev as u64, Duration::from_secs(5), false)
            .await
    );
    let list = f
        .storage
        .list(&ListOptions {
            resource_version: Some("0".into()),
            ..ListOptions::default()
        })
        .await
        .unwrap();
    let got: Vec<(String, Value)> = list
        .items
        .iter()
        .map(|v| (name_of(v), v["spec"]["replicas"].clone()))
        .collect();
    assert_eq!(got, vec![("a".into(), json!(9)), ("c".into(), json!(1))]);
    // And watching works again.
    let mut w = f
        .storage
        .watch(&WatchOptions {
            resource_version: Some(list.resource_version.to_string()),
            ..WatchOptions::default()
        })
        .unwrap();
    let d = f.storage.create("ns", "d", object("ns", "d", 1)).await.unwrap();
    assert_eq!(
        describe(&next_event(&mut w).await),
        ("ADDED".into(), "d".into(), rv_of(&d))
    );
}

#[tokio::test]
async fn ready_follows_etcd() {
    let etcd = TestEtcd::start(EtcdVersion::V3_5_1).await.unwrap();
    let client = etcd.client().await.unwrap();
    let storage = Storage::new(
        client,
        PREFIX,
        StorageOptions {
            ready_timeout: Duration::from_millis(500),
            ..StorageOptions::default()
        },
    )
    .await
    .unwrap();
    storage.wait_initialized(Duration::from_secs(10)).await.unwrap();
    assert!(storage.ready().await);
    drop(etcd);
    assert!(!storage.ready().await);
}

#[tokio::test]
async fn watch_namespace_filter_and_many_objects() {
    let f = fixture().await;
    let names: BTreeSet<String> = create_many(&f.storage, "x", 12).await.into_iter().collect();
    let mut w = f
        .storage
        .watch(&WatchOptions {
            namespace: Some("x".into()),
            resource_version: Some("0".into()),
            ..WatchOptions::default()
        })
        .unwrap();
    let mut seen = BTreeSet::new();
    for _ in 0..12 {
        seen.insert(describe(&next_event(&mut w).await).1);
    }
    assert_eq!(seen, names);
}

#[tokio::test]
async fn initial_events_after_writes_outside_the_prefix() {
    let f = fixture().await;
    let a = f.storage.create("ns", "a", object("ns", "a", 1)).await.unwrap();
    let mut client = f.client.clone();
    let put = client.put("/unrelated/key", "x", None).await.unwrap();
    let etcd_rev = put.header().unwrap().revision() as u64;
    let mut w = f
        .storage
        .watch(&WatchOptions {
            send_initial_events: true,
            allow_bookmarks: true,
            ..WatchOptions::default()
        })
        .unwrap();
    assert_eq!(
        describe(&next_event(&mut w).await),
        ("ADDED".into(), "a".into(), rv_of(&a))
    );
    // The initial state is at least as new as etcd's revision when the watch started.
    let (kind, _, rv) = describe(&next_event(&mut w).await);
    assert_eq!(kind, "BOOKMARK end=true");
    assert!(rv >= etcd_rev, "{rv} < {etcd_rev}");
    let b = f.storage.create("ns", "b", object("ns", "b", 1)).await.unwrap();
    assert_eq!(
        describe(&next_event(&mut w).await),
        ("ADDED".into(), "b".into(), rv_of(&b))
    );
}

#[test]
fn progress_notify_versions() {
    for (v, want) in [
        ("3.4.23", false),
        ("3.4.31", true),
        ("3.5.0", false),
        ("3.5.1", false),
        ("3.5.13", true),
        ("3.6.0", true),
        ("4.0.0", true),
    ] {
        assert_eq!(cache::progress_notify_reliable(v), want, "{v}");
    }
}
