//! The API server against programmatic clients: kube-rs's watcher across a compaction and a
//! restart (relist on 410), and concurrent read-modify-write updates that must lose nothing.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use etcd_operator_tests::LocalOperator;
use etcd_operator_tests::kube_client::{ClientOptions, connect, etcd_clusters};
use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

async fn client(op: &LocalOperator) -> kube::Client {
    connect(&op.kubeconfig(), ClientOptions::default()).await.unwrap()
}

fn cluster(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 3, "version": "3.5.1"},
    }))
    .unwrap()
}

#[tokio::test]
async fn sixteen_concurrent_read_modify_write_writers_lose_no_update() {
    let op = LocalOperator::start().await.unwrap();
    let client = client(&op).await;
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &etcd_clusters());
    api.create(&PostParams::default(), &cluster("counter"))
        .await
        .unwrap();

    const WRITERS: usize = 16;
    const INCREMENTS: usize = 10;
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0u32;
            for _ in 0..INCREMENTS {
                loop {
                    let mut obj = api.get("counter").await.unwrap();
                    let annotations = obj.metadata.annotations.get_or_insert_with(Default::default);
                    let n: u64 = annotations.get("count").map_or(0, |c| c.parse().unwrap());
                    annotations.insert("count".into(), (n + 1).to_string());
                    match api.replace("counter", &PostParams::default(), &obj).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 => conflicts += 1,
                        Err(e) => panic!("update failed: {e}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    let obj = api.get("counter").await.unwrap();
    let count: usize = obj.metadata.annotations.unwrap()["count"].parse().unwrap();
    assert_eq!(
        count,
        WRITERS * INCREMENTS,
        "lost updates ({conflicts} conflicts were retried)"
    );
    assert!(
        conflicts > 0,
        "16 writers never conflicted: the test did not exercise the CAS"
    );
}

#[tokio::test]
async fn kube_watcher_stays_in_sync_across_restart_and_compaction() {
    let mut op = LocalOperator::start().await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client(&op).await, "default", &etcd_clusters());
    api.create(&PostParams::default(), &cluster("one")).await.unwrap();

    let writer = reflector::store::Writer::<DynamicObject>::new(etcd_clusters());
    let store = writer.as_reader();
    let stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let watch_task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                eprintln!("watcher: {e}");
            }
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(20), store.wait_until_ready())
        .await
        .unwrap();
    let old_rv = api.get("one").await.unwrap().metadata.resource_version.unwrap();

    // The operator crashes; while it is down, the backing etcd moves on (another writer) and is
    // compacted, so the watcher's resourceVersion is gone from etcd and from the new server's
    // history alike.
    let endpoint = op.backing_etcd_endpoint().unwrap();
    op.crash();
    let mut etcd = etcd_client::Client::connect([endpoint.as_str()], op.backing_etcd_connect_options())
        .await
        .unwrap();
    let mut rev = 0;
    for i in 0..10 {
        rev = etcd
            .put(format!("/unrelated/{i}"), "x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
    }
    etcd.compact(rev, None).await.unwrap();
    op.start_again().await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client(&op).await, "default", &etcd_clusters());
    let mut raw = op.kubectl().unwrap();
    raw.args([
        "get",
        "--raw",
        &format!("/apis/etcd.operator.dev/v1alpha2/namespaces/default/etcdclusters?watch=1&resourceVersion={old_rv}&timeoutSeconds=2"),
    ]);
    let out = raw.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(r#""type":"ERROR""#) && text.contains(r#""code":410"#),
        "an old watch was not expired: {text}"
    );
    for i in 0..5 {
        api.create(&PostParams::default(), &cluster(&format!("n{i}")))
            .await
            .unwrap();
    }
    api.delete("one", &Default::default()).await.unwrap();

    // The watcher relists and converges on the server's state.
    let want: Vec<String> = (0..5).map(|i| format!("n{i}")).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut names: Vec<String> = store
            .state()
            .iter()
            .filter_map(|o| o.metadata.name.clone())
            .collect();
        names.sort();
        if names == want {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "watcher out of sync: has {names:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let listed = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 5);
    watch_task.abort();
}
