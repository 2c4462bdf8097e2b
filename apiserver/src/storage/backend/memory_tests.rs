//! Unit tests of the in-memory backend: revisions, compare-and-swap, ranges at a revision,
//! watches from a revision with progress, compaction.

use std::time::Duration;

use pretty_assertions::assert_eq;

use super::*;

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn prefix_range(prefix: &str, revision: Option<u64>, limit: Option<usize>) -> RangeRequest {
    RangeRequest {
        key: b(prefix),
        range_end: prefix_end(prefix.as_bytes()),
        revision,
        limit,
    }
}

fn done(outcome: CasOutcome) -> u64 {
    match outcome {
        CasOutcome::Done(rev) => rev,
        CasOutcome::Failed(current) => panic!("compare failed; current {current:?}"),
    }
}

async fn next(watch: &mut Box<dyn BackendWatch>) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(1), watch.next())
        .await
        .expect("a watch message within 1 s")
        .unwrap()
        .expect("the watch goes on")
}

fn puts(resp: WatchResponse) -> Vec<(WatchEventKind, String, u64)> {
    match resp {
        WatchResponse::Events(events) => events
            .into_iter()
            .map(|e| (e.kind, String::from_utf8(e.kv.key).unwrap(), e.kv.mod_revision))
            .collect(),
        other => panic!("expected events, got {other:?}"),
    }
}

#[tokio::test]
async fn revisions_versions_and_reads() {
    let m = MemoryBackend::new();
    assert_eq!(
        m.revision().await.unwrap(),
        1,
        "an empty store is at revision 1, as etcd"
    );
    let r2 = done(m.create(b("/p/a"), b("1")).await.unwrap());
    let r3 = done(m.create(b("/p/b"), b("2")).await.unwrap());
    let r4 = done(m.update(b("/p/a"), b("3"), r2).await.unwrap());
    assert_eq!((r2, r3, r4), (2, 3, 4));
    assert_eq!(m.revision().await.unwrap(), 4);

    let a = m.get(b("/p/a")).await.unwrap().unwrap();
    assert_eq!(
        a,
        KeyValue {
            key: b("/p/a"),
            value: b("3"),
            create_revision: 2,
            mod_revision: 4,
            version: 2,
        }
    );
    assert_eq!(m.get(b("/p/x")).await.unwrap(), None);

    // Latest, at an old revision, with a limit, outside the prefix.
    done(m.create(b("/q/z"), b("z")).await.unwrap());
    let latest = m.range(prefix_range("/p/", None, None)).await.unwrap();
    assert_eq!(latest.revision, 5);
    assert_eq!(latest.count, 2);
    assert!(!latest.more);
    assert_eq!(
        latest.kvs.iter().map(|kv| kv.value.clone()).collect::<Vec<_>>(),
        [b("3"), b("2")]
    );
    let old = m.range(prefix_range("/p/", Some(2), None)).await.unwrap();
    assert_eq!(old.revision, 5, "the header carries the current revision");
    assert_eq!(old.kvs.len(), 1);
    assert_eq!(old.kvs[0].value, b("1"));
    let page = m.range(prefix_range("/p/", None, Some(1))).await.unwrap();
    assert_eq!((page.kvs.len(), page.count, page.more), (1, 2, true));
    let err = m.range(prefix_range("/p/", Some(99), None)).await.unwrap_err();
    assert!(err.is_future_revision(), "{err}");

    // A delete is a revision too; reads before it still see the key.
    done(m.delete(b("/p/a"), 4).await.unwrap());
    assert_eq!(m.revision().await.unwrap(), 6);
    assert_eq!(m.get(b("/p/a")).await.unwrap(), None);
    let before = m.range(prefix_range("/p/", Some(5), None)).await.unwrap();
    assert_eq!(before.kvs.len(), 2);
    // Re-created: a new create revision and version 1.
    done(m.create(b("/p/a"), b("4")).await.unwrap());
    let a = m.get(b("/p/a")).await.unwrap().unwrap();
    assert_eq!((a.create_revision, a.mod_revision, a.version), (7, 7, 1));
}

#[tokio::test]
async fn compare_and_swap_conflicts_return_the_current_state() {
    let m = MemoryBackend::new();
    let r = done(m.create(b("/p/a"), b("1")).await.unwrap());
    let current = m.get(b("/p/a")).await.unwrap();
    assert_eq!(
        m.create(b("/p/a"), b("2")).await.unwrap(),
        CasOutcome::Failed(current.clone())
    );
    assert_eq!(
        m.update(b("/p/a"), b("2"), r + 1).await.unwrap(),
        CasOutcome::Failed(current.clone())
    );
    assert_eq!(
        m.delete(b("/p/a"), r + 1).await.unwrap(),
        CasOutcome::Failed(current)
    );
    assert_eq!(
        m.update(b("/p/x"), b("2"), r).await.unwrap(),
        CasOutcome::Failed(None)
    );
    assert_eq!(m.revision().await.unwrap(), r, "failed compares write nothing");

    // put_if_version: the compaction clock.
    let first = m.put_if_version(b("k"), 0, b("5")).await.unwrap();
    assert!(first.succeeded);
    assert_eq!(first.revision, r + 1);
    let stale = m.put_if_version(b("k"), 0, b("6")).await.unwrap();
    assert_eq!(
        stale,
        VersionCas {
            succeeded: false,
            revision: r + 1,
            version: 1,
        }
    );
    assert!(m.put_if_version(b("k"), 1, b("6")).await.unwrap().succeeded);
}

#[tokio::test]
async fn watch_from_a_revision_replays_then_follows_with_ordered_progress() {
    let m = MemoryBackend::new();
    let r2 = done(m.create(b("/p/a"), b("1")).await.unwrap());
    done(m.create(b("/q/x"), b("x")).await.unwrap());
    let r4 = done(m.update(b("/p/a"), b("2"), r2).await.unwrap());

    let mut w = m.watch(b("/p/"), r2).await.unwrap();
    assert_eq!(
        puts(next(&mut w).await),
        [
            (WatchEventKind::Put, "/p/a".into(), 2),
            (WatchEventKind::Put, "/p/a".into(), 4)
        ]
    );
    done(m.delete(b("/p/a"), r4).await.unwrap());
    done(m.create(b("/q/y"), b("y")).await.unwrap());
    w.request_progress().await.unwrap();
    let deleted = next(&mut w).await;
    let WatchResponse::Events(events) = &deleted else {
        panic!("{deleted:?}")
    };
    assert_eq!(events[0].kind, WatchEventKind::Delete);
    assert_eq!(events[0].kv.mod_revision, 5);
    assert_eq!(events[0].prev.as_ref().map(|p| p.value.clone()), Some(b("2")));
    assert_eq!(next(&mut w).await, WatchResponse::Progress(6));

    // From 0: only what comes next.
    let mut now = m.watch(b("/p/"), 0).await.unwrap();
    done(m.create(b("/p/b"), b("b")).await.unwrap());
    assert_eq!(
        puts(next(&mut now).await),
        [(WatchEventKind::Put, "/p/b".into(), 7)]
    );
}

#[tokio::test]
async fn compaction_fails_older_reads_and_watches_like_etcd() {
    let m = MemoryBackend::new();
    let r2 = done(m.create(b("/p/a"), b("1")).await.unwrap());
    let r3 = done(m.update(b("/p/a"), b("2"), r2).await.unwrap());
    done(m.create(b("/p/b"), b("b")).await.unwrap());
    let r5 = done(m.delete(b("/p/b"), 4).await.unwrap());
    m.compact(r3).await.unwrap();

    let err = m.range(prefix_range("/p/", Some(r2), None)).await.unwrap_err();
    assert!(err.is_compacted(), "{err}");
    assert!(
        err.to_string().contains("required revision has been compacted"),
        "etcd's wording: {err}"
    );
    // The compacted revision itself is still readable, and so is later history.
    let at3 = m.range(prefix_range("/p/", Some(r3), None)).await.unwrap();
    assert_eq!(at3.kvs.len(), 1);
    assert_eq!(at3.kvs[0].value, b("2"));
    let at4 = m.range(prefix_range("/p/", Some(4), None)).await.unwrap();
    assert_eq!(at4.kvs.len(), 2);
    assert_eq!(
        m.range(prefix_range("/p/", Some(r5), None))
            .await
            .unwrap()
            .kvs
            .len(),
        1
    );

    // A watch from before the compaction is cancelled with the compacted revision.
    let mut old = m.watch(b("/p/"), r2).await.unwrap();
    assert_eq!(next(&mut old).await, WatchResponse::Compacted(r3));
    assert_eq!(old.next().await.unwrap(), None);
    // From the compacted revision on it still replays.
    let mut from3 = m.watch(b("/p/"), r3).await.unwrap();
    assert_eq!(
        puts(next(&mut from3).await),
        [
            (WatchEventKind::Put, "/p/a".into(), 3),
            (WatchEventKind::Put, "/p/b".into(), 4),
            (WatchEventKind::Delete, "/p/b".into(), 5),
        ]
    );
    // Compacting again to the same (or an older) revision is etcd's compacted error.
    assert!(m.compact(r3).await.unwrap_err().is_compacted());
    assert!(m.compact(99).await.unwrap_err().is_future_revision());
    // Compacting past a delete forgets the key entirely.
    m.compact(r5).await.unwrap();
    assert_eq!(
        m.range(prefix_range("/p/", None, None)).await.unwrap().kvs.len(),
        1
    );
}

#[tokio::test]
async fn storage_on_memory_creates_updates_lists_and_watches() {
    use futures::StreamExt;

    use crate::storage::{ListOptions, ReadConsistency, Storage, StorageOptions, UpdateAction, WatchEvent};

    let storage = Storage::in_memory("/registry/x/things", StorageOptions::default())
        .await
        .unwrap();
    storage.wait_initialized(Duration::from_secs(1)).await.unwrap();
    assert!(storage.ready().await);
    let created = storage
        .create("ns", "a", serde_json::json!({"metadata": {"name": "a"}, "n": 1}))
        .await
        .unwrap();
    assert_eq!(created["metadata"]["resourceVersion"], "2");
    let mut watch = storage
        .watch(&crate::storage::WatchOptions {
            resource_version: Some("2".into()),
            ..Default::default()
        })
        .unwrap();
    storage
        .guaranteed_update("ns", "a", |mut v| {
            v["n"] = 2.into();
            Ok::<_, std::convert::Infallible>(UpdateAction::Write(v))
        })
        .await
        .unwrap();
    let got = storage
        .get("ns", "a", ReadConsistency::Consistent)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got["n"], 2);
    assert_eq!(got["metadata"]["resourceVersion"], "3");
    let list = storage.list(&ListOptions::default()).await.unwrap();
    assert_eq!((list.items.len(), list.resource_version), (1, 3));
    let ev = tokio::time::timeout(Duration::from_secs(1), watch.next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(&ev, WatchEvent::Modified(v) if v["n"] == 2), "{ev:?}");
    // Compaction through the storage's own coordinated steps.
    assert_eq!(
        storage.compact().await.unwrap(),
        None,
        "the first round only records"
    );
    // The second round compacts to the revision the first saw (its own compact-key write, 4).
    assert_eq!(storage.compact().await.unwrap(), Some(4));
    let err = storage
        .backend()
        .range(prefix_range("/registry/", Some(3), None))
        .await
        .unwrap_err();
    assert!(err.is_compacted(), "{err}");
}
