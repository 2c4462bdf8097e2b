//! `spec.tls` with `auto` certificates end to end in local mode: real etcd 3.5.1 members with
//! mutual TLS on both planes, reached by the operator with its own client certificate, refused to
//! plain-HTTP clients and to clients without a certificate of the cluster's CA, working for
//! etcdctl with the issued certificate; scaling, replacement, upgrades, backups and restores
//! over TLS; certificates rotated on demand under a continuous writer.

// Test code: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use etcd_operator_tests::kubectl::{Watched, apply, client_endpoints, condition, kubectl, wait_for};
use etcd_operator_tests::local_cluster::{
    available, cluster_dir, kill_member, member_dir, recorded_pid, wait_available,
};
use etcd_operator_tests::{EtcdVersion, LocalOperator, tools};
use serde_json::Value;

fn tls_cluster(name: &str, replicas: u32, peer: bool) -> String {
    let peer = if peer { "\n    peer: {auto: {}}" } else { "" };
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: {replicas}\n  version: 3.5.1\n  tls:\n    client: {{auto: {{}}}}{peer}\n"
    )
}

/// The operator's client identity toward `cluster`: (client CA, certificate, key) files.
fn operator_identity(op: &LocalOperator, cluster: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = pki(op, cluster);
    (
        dir.join("client-ca.crt"),
        dir.join("operator.crt"),
        dir.join("operator.key"),
    )
}

/// Takes a one-shot EtcdBackup `name` of `cluster` into `dir`; its status once it ended.
async fn backup_now(op: &LocalOperator, cluster: &str, name: &str, dir: &Path) -> Value {
    apply(
        op,
        &format!(
            "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdBackup\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  clusterName: {cluster}\n  destination:\n    volume:\n      path: {}\n",
            dir.display()
        ),
    )
    .unwrap();
    wait_for(
        op,
        Watched::status("etcdbackup", name),
        "the backup to end",
        Duration::from_secs(60),
        |s| s["phase"] == "Succeeded" || s["phase"] == "Failed",
    )
    .await
    .unwrap()
}

fn pki(op: &LocalOperator, cluster: &str) -> PathBuf {
    cluster_dir(op, cluster).join("pki")
}

/// The pid recorded for a member's etcd process.
fn member_pid(dir: &Path) -> u32 {
    recorded_pid(dir).unwrap()
}

/// etcdctl at `endpoint`, with `--cacert/--cert/--key` from `tls` when given.
fn etcdctl(endpoint: &str, tls: Option<(&Path, &Path, &Path)>, args: &[&str]) -> Output {
    let mut cmd = Command::new(tools::etcdctl(EtcdVersion::V3_5_1).unwrap());
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=3s")
        .arg("--dial-timeout=3s");
    if let Some((ca, cert, key)) = tls {
        cmd.arg(format!("--cacert={}", ca.display()))
            .arg(format!("--cert={}", cert.display()))
            .arg(format!("--key={}", key.display()));
    }
    cmd.args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// etcd's JSON gateway (`/v3/...` over HTTPS) answers on every member of `status` with the
/// identity `(ca, cert, key)`, and no member refused its own gateway: the gateway dials the
/// member's client port presenting the serving certificate, which must be for client
/// authentication too (etcd issue 9785).
async fn json_gateway_answers_on_every_member(
    op: &LocalOperator,
    cluster: &str,
    status: &Value,
    identity: (&Path, &Path, &Path),
) {
    use base64::Engine as _;
    let (ca, cert, key) = identity;
    let read = |p: &Path| std::fs::read(p).unwrap();
    for (ep, name) in client_endpoints(status).iter().zip(member_names(status)) {
        let gateway = etcd_operator_tests::kube_client::etcd_gateway(ep, &read(ca), &read(cert), &read(key))
            .await
            .unwrap();
        let body = serde_json::json!({"key": base64::engine::general_purpose::STANDARD.encode("secret")});
        let text = gateway
            .request_text(
                http::Request::post("/v3/kv/range")
                    .body(serde_json::to_vec(&body).unwrap())
                    .unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}'s JSON gateway at {ep}: {e}"));
        let range: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            range["kvs"][0]["value"],
            base64::engine::general_purpose::STANDARD.encode("kept"),
            "{name}: {text}"
        );
        let log = std::fs::read_to_string(member_dir(op, cluster, &name).join("etcd.log")).unwrap();
        assert!(
            !log.contains("incompatible key usage"),
            "{name} refused its own gateway's certificate: {}",
            log.lines()
                .find(|l| l.contains("incompatible key usage"))
                .unwrap_or_default()
        );
    }
}

#[tokio::test]
async fn auto_tls_on_both_planes_is_applied_checked_and_used_by_the_operator() {
    let op = LocalOperator::start().await.unwrap();
    apply(&op, &tls_cluster("secure", 3, true)).unwrap();
    let s = wait_available(&op, "secure", 3, "3 healthy TLS members", Duration::from_secs(90)).await;
    let eps = client_endpoints(&s);
    assert_eq!(eps.len(), 3);
    assert!(eps.iter().all(|e| e.starts_with("https://127.0.0.1:")), "{eps:?}");

    let (ca, cert, key) = operator_identity(&op, "secure");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "private keys are private");
    // The issued client certificate works, on every member.
    let tls = Some((ca.as_path(), cert.as_path(), key.as_path()));
    let put = etcdctl(&eps[0], tls, &["put", "secret", "kept"]);
    assert!(put.status.success(), "{}", text(&put));
    for ep in &eps {
        let health = etcdctl(ep, tls, &["endpoint", "health"]);
        assert!(health.status.success(), "{ep}: {}", text(&health));
    }
    json_gateway_answers_on_every_member(&op, "secure", &s, (&ca, &cert, &key)).await;
    // Plain HTTP is refused, and so is TLS without a client certificate of the cluster's CA.
    let plain = eps[0].replacen("https://", "http://", 1);
    let out = etcdctl(&plain, None, &["get", "secret"]);
    assert!(!out.status.success(), "plain HTTP answered: {}", text(&out));
    let no_cert = Command::new(tools::etcdctl(EtcdVersion::V3_5_1).unwrap())
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", eps[0]))
        .arg("--command-timeout=3s")
        .arg("--dial-timeout=3s")
        .arg(format!("--cacert={}", ca.display()))
        .args(["get", "secret"])
        .output()
        .unwrap();
    assert!(
        !no_cert.status.success(),
        "a client without a certificate answered: {}",
        text(&no_cert)
    );
    // The peer plane is TLS too: the members advertise https peer URLs.
    let list = etcdctl(&eps[0], tls, &["member", "list", "-w", "json"]);
    assert!(list.status.success(), "{}", text(&list));
    let members: Value = serde_json::from_slice(&list.stdout).unwrap();
    for m in members["members"].as_array().unwrap() {
        assert!(m["peerURLs"][0].as_str().unwrap().starts_with("https://"), "{m}");
    }

    // Scale 3 -> 5 -> 3 over TLS: members join as learners and are promoted, then two go.
    kubectl(&op, &["scale", "ec", "secure", "--replicas=5"], None).unwrap();
    let s = wait_available(
        &op,
        "secure",
        5,
        "5 healthy TLS members",
        Duration::from_secs(150),
    )
    .await;
    let newest = client_endpoints(&s)
        .into_iter()
        .find(|e| !eps.contains(e))
        .expect("a new member");
    let got = etcdctl(
        &newest,
        tls,
        &["get", "secret", "--print-value-only", "--consistency=s"],
    );
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "kept",
        "{}",
        text(&got)
    );
    kubectl(&op, &["scale", "ec", "secure", "--replicas=3"], None).unwrap();
    let s = wait_available(
        &op,
        "secure",
        3,
        "back to 3 healthy TLS members",
        Duration::from_secs(90),
    )
    .await;

    // A member killed with its data destroyed is replaced by a fresh one with its own
    // certificates from the same CA.
    let victim = s["members"][0]["name"].as_str().unwrap().to_owned();
    let dir = member_dir(&op, "secure", &victim);
    kill_member(&dir);
    std::fs::remove_dir_all(dir.join("data")).unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "secure"),
        "the killed member replaced over TLS",
        Duration::from_secs(120),
        |s| {
            available(s, 3)
                && !s["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["name"] == victim.as_str())
        },
    )
    .await
    .unwrap();
    for ep in client_endpoints(&s) {
        let got = etcdctl(&ep, tls, &["get", "secret", "--print-value-only"]);
        assert_eq!(
            String::from_utf8_lossy(&got.stdout).trim(),
            "kept",
            "{ep}: {}",
            text(&got)
        );
    }

    // A backup is taken from the TLS members with the operator's identity.
    let backups = tempfile::tempdir().unwrap();
    let b = backup_now(&op, "secure", "secure-now", backups.path()).await;
    assert_eq!(b["phase"], "Succeeded", "{b}");
    assert!(b["size"].as_i64().unwrap_or(0) > 0, "{b}");
}

#[tokio::test]
async fn a_provider_the_runtime_does_not_have_is_refused_with_a_reason_and_nothing_starts() {
    let op = LocalOperator::start().await.unwrap();
    apply(
        &op,
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: byo\n  namespace: default\nspec:\n  replicas: 1\n  version: 3.5.1\n  tls:\n    client:\n      secretRef: {name: my-certs}\n",
    )
    .unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "byo"),
        "Degraded with the TLS reason",
        Duration::from_secs(30),
        |s| condition(s, "Degraded").is_some_and(|c| c["status"] == "True"),
    )
    .await
    .unwrap();
    let degraded = condition(&s, "Degraded").unwrap();
    assert_eq!(degraded["reason"], "StepFailed", "{s}");
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains("spec.tls.client.secretRef is not supported by the local runtime"),
        "{message}"
    );
    assert!(
        !op.state_dir()
            .join("members")
            .join("default")
            .join("byo")
            .exists(),
        "nothing was reserved or started"
    );
}

#[tokio::test]
async fn members_whose_certificates_the_operator_no_longer_trusts_are_reported_not_lost() {
    let op = LocalOperator::start().await.unwrap();
    apply(&op, &tls_cluster("swapped", 1, false)).unwrap();
    wait_available(&op, "swapped", 1, "1 healthy TLS member", Duration::from_secs(60)).await;
    // Someone replaces the cluster's client CA: the operator issues itself a certificate from the
    // new CA and trusts only it, while the member still serves a certificate of the old one.
    let dir = pki(&op, "swapped");
    let old = (
        std::fs::read_to_string(dir.join("client-ca.crt")).unwrap(),
        std::fs::read_to_string(dir.join("client-ca.key")).unwrap(),
    );
    let other = etcd_operator_controller::tls::ca::CertificateAuthority::generate(
        "someone else's CA",
        Duration::from_secs(3600 * 24 * 365),
    )
    .unwrap();
    std::fs::write(dir.join("client-ca.crt"), &other.pem().cert_pem).unwrap();
    std::fs::write(dir.join("client-ca.key"), &other.pem().key_pem).unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "swapped"),
        "Degraded TLSHandshakeFailed",
        Duration::from_secs(60),
        |s| condition(s, "Degraded").is_some_and(|c| c["reason"] == "TLSHandshakeFailed"),
    )
    .await
    .unwrap();
    let message = condition(&s, "Degraded").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("TLS handshake failed"), "{message}");
    // Nothing was done to the member meanwhile: the same member serves again once the CA is back.
    let member = s["members"].as_array().map(Vec::len);
    std::fs::write(dir.join("client-ca.crt"), &old.0).unwrap();
    std::fs::write(dir.join("client-ca.key"), &old.1).unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "swapped"),
        "Available again with the original CA",
        Duration::from_secs(60),
        |s| available(s, 1) && condition(s, "Degraded").is_some_and(|c| c["status"] == "False"),
    )
    .await
    .unwrap();
    assert_eq!(s["members"].as_array().map(Vec::len), Some(1), "was {member:?}");
}

#[tokio::test]
async fn a_tls_cluster_upgrades_and_its_backup_restores_into_a_new_tls_cluster() {
    let op = LocalOperator::start().await.unwrap();
    let yaml = tls_cluster("old", 3, true).replace("version: 3.5.1", "version: 3.5.0");
    apply(&op, &yaml).unwrap();
    let s = wait_available(
        &op,
        "old",
        3,
        "3 healthy TLS members on 3.5.0",
        Duration::from_secs(90),
    )
    .await;
    let (ca, cert, key) = operator_identity(&op, "old");
    let tls = Some((ca.as_path(), cert.as_path(), key.as_path()));
    let put = etcdctl(&client_endpoints(&s)[0], tls, &["put", "survives", "the-roll"]);
    assert!(put.status.success(), "{}", text(&put));

    // The roll: the pre-upgrade snapshot and every health check go over TLS.
    kubectl(
        &op,
        &[
            "patch",
            "ec",
            "old",
            "--type=merge",
            "-p",
            r#"{"spec":{"version":"3.5.1"}}"#,
        ],
        None,
    )
    .unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "old"),
        "the roll to 3.5.1 complete",
        Duration::from_secs(240),
        |s| {
            available(s, 3)
                && s["upgrade"]["phase"] == "Complete"
                && s["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|m| m["version"] == "3.5.1")
        },
    )
    .await
    .unwrap();
    let snapshot = s["upgrade"]["snapshot"].as_str().unwrap_or_default().to_owned();
    assert!(snapshot.ends_with(".db"), "a pre-upgrade snapshot was taken: {s}");
    let got = etcdctl(
        &client_endpoints(&s)[1],
        tls,
        &["get", "survives", "--print-value-only"],
    );
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "the-roll",
        "{}",
        text(&got)
    );

    // A backup of it bootstraps a new TLS cluster, with its own CA.
    let backups = tempfile::tempdir().unwrap();
    let b = backup_now(&op, "old", "old-now", backups.path()).await;
    assert_eq!(b["phase"], "Succeeded", "{b}");
    let copy = tls_cluster("copy", 3, true).replace(
        "  tls:",
        "  bootstrap:\n    restore:\n      backupName: old-now\n  tls:",
    );
    apply(&op, &copy).unwrap();
    let s = wait_available(
        &op,
        "copy",
        3,
        "the restored TLS cluster available",
        Duration::from_secs(120),
    )
    .await;
    let (ca, cert, key) = operator_identity(&op, "copy");
    let copy_tls = Some((ca.as_path(), cert.as_path(), key.as_path()));
    let got = etcdctl(
        &client_endpoints(&s)[0],
        copy_tls,
        &["get", "survives", "--print-value-only"],
    );
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "the-roll",
        "{}",
        text(&got)
    );
    // The two clusters do not trust each other's certificates.
    let crossed = etcdctl(&client_endpoints(&s)[0], tls, &["get", "survives"]);
    assert!(
        !crossed.status.success(),
        "the old cluster's certificate was accepted: {}",
        text(&crossed)
    );
}

/// The operator's identity toward `cluster` as etcd-client TLS options, for a test's own client.
fn client_options(op: &LocalOperator, cluster: &str) -> etcd_client::TlsOptions {
    let (ca, cert, key) = operator_identity(op, cluster);
    etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(std::fs::read(ca).unwrap()))
        .identity(etcd_client::Identity::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(key).unwrap(),
        ))
}

/// A member's certificates and process as they are now: (server.crt, peer.crt, pid).
fn member_certificates(dir: &Path) -> (String, String, u32) {
    (
        std::fs::read_to_string(dir.join("tls").join("server.crt")).unwrap(),
        std::fs::read_to_string(dir.join("tls").join("peer.crt")).unwrap(),
        member_pid(dir),
    )
}

/// Every named member's certificates and process, as [`member_certificates`].
fn certificates(op: &LocalOperator, cluster: &str, names: &[String]) -> Vec<(String, String, u32)> {
    names
        .iter()
        .map(|n| member_certificates(&member_dir(op, cluster, n)))
        .collect()
}

/// Every member has certificates other than `before`'s (and, when `restarted`, a new process).
fn assert_renewed(
    op: &LocalOperator,
    cluster: &str,
    names: &[String],
    before: &[(String, String, u32)],
    restarted: bool,
) {
    for (name, (server, peer, pid)) in names.iter().zip(before) {
        let (new_server, new_peer, new_pid) = member_certificates(&member_dir(op, cluster, name));
        assert_ne!(&new_server, server, "{name}: serving certificate not renewed");
        assert_ne!(&new_peer, peer, "{name}: peer certificate not renewed");
        if restarted {
            assert_ne!(new_pid, *pid, "{name}: not restarted on its new certificates");
        }
    }
}

/// Whether every named member of `cluster` runs on certificates of the rotation `value`.
fn all_rotated(op: &LocalOperator, cluster: &str, names: &[String], value: &str) -> bool {
    names.iter().all(|n| {
        std::fs::read_to_string(member_dir(op, cluster, n).join("tls").join("rotation"))
            .ok()
            .as_deref()
            == Some(value)
    })
}

/// The Events on EtcdCluster `cluster` (local mode serves them).
fn events_on(op: &LocalOperator, cluster: &str) -> Vec<Value> {
    let selector = format!("involvedObject.name={cluster}");
    let list: Value = serde_json::from_str(
        &kubectl(
            op,
            &["get", "events", "--field-selector", &selector, "-o", "json"],
            None,
        )
        .unwrap(),
    )
    .unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The names of the members in a status.
fn member_names(status: &Value) -> Vec<String> {
    status["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Applies a 3-member cluster with TLS on both planes and waits until it is Available; returns
/// its status.
async fn three_tls_members(op: &LocalOperator, cluster: &str) -> Value {
    apply(op, &tls_cluster(cluster, 3, true)).unwrap();
    wait_available(op, cluster, 3, "3 healthy TLS members", Duration::from_secs(90)).await
}

#[tokio::test]
#[allow(clippy::print_stdout)]
async fn a_rotation_on_demand_rolls_every_member_under_a_writer_and_loses_no_write() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

    let op = LocalOperator::start().await.unwrap();
    let s = three_tls_members(&op, "rot").await;
    let eps = client_endpoints(&s);
    let names = member_names(&s);
    let before = certificates(&op, "rot", &names);

    // A continuous writer with the operator's identity, and a sampler asking every member for
    // its status every 100 ms: the most members that did not answer at the same moment.
    let stop = Arc::new(AtomicBool::new(false));
    let tls = client_options(&op, "rot");
    let writer = etcd_operator_tests::writer::start_writer(eps.clone(), Some(tls.clone()), stop.clone());
    let most_down = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (stop, most_down, eps, tls) = (stop.clone(), most_down.clone(), eps.clone(), tls.clone());
        tokio::spawn(async move {
            let options = etcd_client::ConnectOptions::new()
                .with_tls(tls)
                .with_connect_timeout(Duration::from_millis(500))
                .with_timeout(Duration::from_millis(500));
            while !stop.load(Ordering::SeqCst) {
                let mut down = 0;
                for ep in &eps {
                    let answered = match etcd_client::Client::connect([ep], Some(options.clone())).await {
                        Ok(mut c) => c.status().await.is_ok(),
                        Err(_) => false,
                    };
                    down += i64::from(!answered);
                }
                most_down.fetch_max(down, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    let started = std::time::Instant::now();
    kubectl(
        &op,
        &[
            "annotate",
            "ec",
            "rot",
            "etcd.operator.dev/rotate-certificates=2026-11-25T13:00:00Z",
        ],
        None,
    )
    .unwrap();
    let rotated = |op: &LocalOperator| all_rotated(op, "rot", &names, "2026-11-25T13:00:00Z");
    let s = wait_for(
        &op,
        Watched::status("ec", "rot"),
        "every member restarted on new certificates",
        Duration::from_secs(180),
        |s| available(s, 3) && rotated(&op),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    // Let the writer see the last restarted member serve, then stop it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let writes = writer.await.unwrap();
    sampler.await.unwrap();
    println!(
        "rotation of 3 members: {:.1}s; {} writes acknowledged, {} failed attempts; longest gap between successful writes: {} ms; most members down at once: {}",
        took.as_secs_f64(),
        writes.acknowledged.len(),
        writes.failures,
        writes.longest_gap.as_millis(),
        most_down.load(Ordering::SeqCst)
    );
    assert!(
        writes.acknowledged.len() > 10,
        "the writer hardly wrote ({} writes)",
        writes.acknowledged.len()
    );
    assert_eq!(
        most_down.load(Ordering::SeqCst),
        1,
        "the sampler saw a restarted member down, and never two at a time"
    );
    assert_eq!(condition(&s, "Degraded").unwrap()["status"], "False", "{s}");
    // Every member got new certificates and was restarted on them; same members, same data.
    assert_renewed(&op, "rot", &names, &before, true);
    // And an Event says so for each, with why.
    let events = events_on(&op, "rot");
    for name in &names {
        let note = format!(
            "Stopped member process {name} to restart it with new certificates (rotation \"2026-11-25T13:00:00Z\" was requested)"
        );
        assert!(
            events
                .iter()
                .any(|e| e["reason"] == "MemberCertificatesRenewed" && e["message"] == note.as_str()),
            "no Event {note:?} in {events:?}"
        );
    }
    assert_eq!(client_endpoints(&s), eps, "the same members serve");
    etcd_operator_tests::writer::assert_no_write_lost(&eps, Some(&tls), &writes).await;

    // Asked again with the same value, nothing restarts.
    let pids: Vec<u32> = names
        .iter()
        .map(|n| member_pid(&member_dir(&op, "rot", n)))
        .collect();
    etcd_operator_tests::kubectl::wait_reconciles(
        &op,
        3,
        "three more looks at the cluster",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let again: Vec<u32> = names
        .iter()
        .map(|n| member_pid(&member_dir(&op, "rot", n)))
        .collect();
    assert_eq!(pids, again, "members restarted without a new rotation");
}

/// The robustness suite's renewal case (issue 26: the operator killed in the middle of every step
/// kind): one rotation on demand while the operator is SIGKILLed right after the 1st, 3rd and 5th
/// step it logs (a member's process stopping, started again on its new certificates, leadership
/// moved off the last one); every member still ends on new certificates, and a TLS writer loses
/// no acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::print_stdout)]
async fn a_rotation_survives_an_operator_killed_after_its_steps() {
    use etcd_operator_tests::robustness::operations::LogCursor;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    const STEPS: [&str; 3] = ["stopping etcd member", "started etcd member", "moved leadership"];
    let mut op = LocalOperator::start().await.unwrap();
    let s = three_tls_members(&op, "rk").await;
    let eps = client_endpoints(&s);
    let names = member_names(&s);
    let before = certificates(&op, "rk", &names);
    let stop = Arc::new(AtomicBool::new(false));
    let tls = client_options(&op, "rk");
    let writer = etcd_operator_tests::writer::start_writer(eps.clone(), Some(tls.clone()), stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut cursor = LogCursor::at_end(op.state_dir().to_path_buf());
    kubectl(
        &op,
        &["annotate", "ec", "rk", "etcd.operator.dev/rotate-certificates=k1"],
        None,
    )
    .unwrap();
    let rotated = |op: &LocalOperator| all_rotated(op, "rk", &names, "k1");
    let started = std::time::Instant::now();
    let mut seen: Vec<String> = Vec::new();
    let mut kills = Vec::new();
    for kill_at in [1_usize, 3, 5] {
        while seen.len() < kill_at && !rotated(&op) {
            for line in cursor.new_lines() {
                if let Some(step) = STEPS.iter().find(|s| line.contains(*s)) {
                    seen.push((*step).to_owned());
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "only {seen:?} logged; operator log:\n{}",
                op.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if seen.len() < kill_at {
            break;
        }
        op.crash();
        op.start_again().await.unwrap();
        kills.push(format!("after step {kill_at} ({})", seen[kill_at - 1]));
    }
    let s = wait_for(
        &op,
        Watched::status("ec", "rk"),
        "every member restarted on new certificates",
        Duration::from_secs(180),
        |s| available(s, 3) && rotated(&op),
    )
    .await
    .unwrap();
    println!(
        "rotation with the operator killed {kills:?}: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(kills.len(), 3, "the rotation ended before the 5th step: {seen:?}");
    stop.store(true, Ordering::SeqCst);
    let writes = writer.await.unwrap();
    assert_renewed(&op, "rk", &names, &before, false);
    assert_eq!(client_endpoints(&s), eps, "the same members serve");
    assert!(writes.acknowledged.len() > 10, "the writer hardly wrote");
    etcd_operator_tests::writer::assert_no_write_lost(&eps, Some(&tls), &writes).await;
}

/// Replaces a member's serving and peer certificates with ones from the cluster's own CAs that
/// expired at midnight (UTC) today, as if the cluster had been left alone for a year.
fn expire_member_certificates(op: &LocalOperator, cluster: &str, member: &str) {
    use etcd_operator_controller::tls::ca::{CertificateAuthority, LeafSpec};
    use etcd_operator_controller::tls::member::{peer_certificate, server_certificate};
    let ca = |plane: &str| {
        let dir = pki(op, cluster);
        CertificateAuthority::load(
            &std::fs::read_to_string(dir.join(format!("{plane}-ca.crt"))).unwrap(),
            &std::fs::read_to_string(dir.join(format!("{plane}-ca.key"))).unwrap(),
        )
        .unwrap()
    };
    let names = [member.to_owned()];
    let tls = member_dir(op, cluster, member).join("tls");
    for (file, plane, spec) in [
        ("server", "client", server_certificate(member, &names)),
        ("peer", "peer", peer_certificate(member, &names)),
    ] {
        let expired = ca(plane)
            .issue(&LeafSpec {
                validity: Duration::ZERO,
                ..spec
            })
            .unwrap();
        let not_after = etcd_operator_controller::tls::ca::not_after(&expired.cert_pem).unwrap();
        assert!(
            not_after <= std::time::SystemTime::now(),
            "the certificate has expired"
        );
        std::fs::write(tls.join(format!("{file}.key")), &expired.key_pem).unwrap();
        std::fs::write(tls.join(format!("{file}.crt")), &expired.cert_pem).unwrap();
    }
}

#[tokio::test]
async fn members_whose_certificates_expired_get_new_ones_and_the_cluster_comes_back() {
    let op = LocalOperator::start().await.unwrap();
    let s = three_tls_members(&op, "lapsed").await;
    let (ca, cert, key) = operator_identity(&op, "lapsed");
    let tls = Some((ca.as_path(), cert.as_path(), key.as_path()));
    let eps = client_endpoints(&s);
    let put = etcdctl(&eps[0], tls, &["put", "outlives", "the-certificates"]);
    assert!(put.status.success(), "{}", text(&put));
    let names = member_names(&s);

    // Every member's certificates expire at once (etcd reads them at every handshake).
    for name in &names {
        expire_member_certificates(&op, "lapsed", name);
    }
    let out = etcdctl(&eps[0], tls, &["get", "outlives"]);
    assert!(
        !out.status.success(),
        "a member with an expired certificate answered: {}",
        text(&out)
    );
    let fresh = |op: &LocalOperator| {
        names.iter().all(|n| {
            let pem =
                std::fs::read_to_string(member_dir(op, "lapsed", n).join("tls").join("server.crt")).unwrap();
            etcd_operator_controller::tls::ca::not_after(&pem)
                .is_ok_and(|t| t > std::time::SystemTime::now() + Duration::from_secs(300 * 24 * 3600))
        })
    };
    let s = wait_for(
        &op,
        Watched::status("ec", "lapsed"),
        "every member on new certificates and the cluster available",
        Duration::from_secs(120),
        |s| available(s, 3) && fresh(&op),
    )
    .await
    .unwrap();
    assert_eq!(client_endpoints(&s), eps, "the same members, renewed in place");
    for ep in &eps {
        let got = etcdctl(ep, tls, &["get", "outlives", "--print-value-only"]);
        assert_eq!(
            String::from_utf8_lossy(&got.stdout).trim(),
            "the-certificates",
            "{ep}: {}",
            text(&got)
        );
    }
}

/// The TLS options of a client holding `cert`/`key` and trusting the bundle in `trust`.
fn tls_from(trust: &Path, cert: &str, key: &str) -> etcd_client::TlsOptions {
    etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(std::fs::read(trust).unwrap()))
        .identity(etcd_client::Identity::from_pem(cert, key))
}

/// The operator's identity read from its files now, trusting the plane's bundle (`None` while a
/// file is being rewritten).
fn current_identity(pki: &Path) -> Option<etcd_client::TlsOptions> {
    let trust = std::fs::read(pki.join("client-trust.crt")).ok()?;
    let cert = std::fs::read(pki.join("operator.crt")).ok()?;
    let key = std::fs::read(pki.join("operator.key")).ok()?;
    Some(
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(trust))
            .identity(etcd_client::Identity::from_pem(cert, key)),
    )
}

/// Whether the member at `endpoint` answers a status call from a client with `tls`.
async fn answers(endpoint: &str, tls: etcd_client::TlsOptions) -> bool {
    let options = etcd_client::ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(2));
    match etcd_client::Client::connect([endpoint], Some(options)).await {
        Ok(mut c) => c.status().await.is_ok(),
        Err(_) => false,
    }
}

#[tokio::test]
#[allow(clippy::print_stdout)]
async fn a_ca_rotation_rolls_in_a_new_ca_under_a_tls_writer_and_the_old_ca_is_trusted_nowhere() {
    use etcd_operator_controller::tls::ca::{CertificateAuthority, LeafSpec};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

    let op = LocalOperator::start().await.unwrap();
    let s = three_tls_members(&op, "rca").await;
    let eps = client_endpoints(&s);
    let names = member_names(&s);
    let pki = pki(&op, "rca");
    let read = |file: &str| std::fs::read_to_string(pki.join(file)).unwrap();
    let (old_client, old_peer) = (read("client-ca.crt"), read("peer-ca.crt"));
    // A client certificate of the old CA, as a client that kept it would hold: accepted now
    // (so the check at the end can tell).
    let old_ca = CertificateAuthority::load(&old_client, &read("client-ca.key")).unwrap();
    let stale = old_ca.issue(&LeafSpec::client("stale-client", &[])).unwrap();
    let stale_tls = |trust: &Path| tls_from(trust, &stale.cert_pem, &stale.key_pem);
    for ep in &eps {
        assert!(
            answers(ep, stale_tls(&pki.join("client-trust.crt"))).await,
            "{ep} refused a certificate of its own CA before the rotation"
        );
    }

    // A writer and a sampler that read the client identity anew after a failure, as clients
    // mounting the bundle and their certificate do.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let pki = pki.clone();
        etcd_operator_tests::writer::start_reloading_writer(
            eps.clone(),
            move || current_identity(&pki),
            stop.clone(),
        )
    };
    let most_down = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (stop, most_down, eps, pki) = (stop.clone(), most_down.clone(), eps.clone(), pki.clone());
        tokio::spawn(async move {
            // A member counts as down when it misses two rounds in a row: one slow answer on
            // this loaded 2-core machine is not an outage, a restarting member misses several.
            let mut missed = vec![0u32; eps.len()];
            while !stop.load(Ordering::SeqCst) {
                if let Some(tls) = current_identity(&pki) {
                    for (ep, missed) in eps.iter().zip(missed.iter_mut()) {
                        *missed = if answers(ep, tls.clone()).await {
                            0
                        } else {
                            *missed + 1
                        };
                    }
                    let down = missed.iter().filter(|m| **m >= 2).count();
                    most_down.fetch_max(i64::try_from(down).unwrap_or(i64::MAX), Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    let started = std::time::Instant::now();
    kubectl(
        &op,
        &["annotate", "ec", "rca", "etcd.operator.dev/rotate-ca=r1"],
        None,
    )
    .unwrap();
    let trusts_old = |op: &LocalOperator| {
        names.iter().any(|n| {
            let tls = member_dir(op, "rca", n).join("tls");
            let client = std::fs::read_to_string(tls.join("client-trust.crt")).unwrap_or_default();
            let peer = std::fs::read_to_string(tls.join("peer-trust.crt")).unwrap_or_default();
            client.is_empty() || client.contains(old_client.trim()) || peer.contains(old_peer.trim())
        })
    };
    let s = wait_for(
        &op,
        Watched::status("ec", "rca"),
        "every member on the new CAs, trusting only them",
        Duration::from_secs(240),
        |s| {
            available(s, 3)
                && std::fs::read_to_string(pki.join("client-ca.rotation"))
                    .ok()
                    .as_deref()
                    == Some("r1")
                && !pki.join("client-ca-previous.crt").exists()
                && !pki.join("peer-ca-previous.crt").exists()
                && !pki.join("client-ca-next.crt").exists()
                && !trusts_old(&op)
        },
    )
    .await
    .unwrap();
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let writes = writer.await.unwrap();
    sampler.await.unwrap();
    println!(
        "CA rotation of 3 members (3 rolls): {:.1}s; {} writes acknowledged, {} failed attempts, {} reconnects; longest gap between successful writes: {} ms; most members down at once: {}",
        took.as_secs_f64(),
        writes.acknowledged.len(),
        writes.failures,
        writes.reconnects,
        writes.longest_gap.as_millis(),
        most_down.load(Ordering::SeqCst)
    );
    assert!(
        writes.acknowledged.len() > 10,
        "the writer hardly wrote ({} writes)",
        writes.acknowledged.len()
    );
    // One member restarting at a time costs the writer at most a leadership move, never an
    // outage: a cluster split over trust would stop every write until the end.
    assert!(
        writes.longest_gap < Duration::from_secs(5),
        "the writer failed for {:?} at {:?}: {:?}",
        writes.longest_gap,
        writes.longest_gap_at,
        writes.failure_log.iter().rev().take(5).collect::<Vec<_>>()
    );
    assert!(
        most_down.load(Ordering::SeqCst) <= 1,
        "two members were down at once"
    );
    assert_eq!(condition(&s, "Degraded").unwrap()["status"], "False", "{s}");
    assert_eq!(client_endpoints(&s), eps, "the same members serve");

    // The new CAs issue everything; the old ones are trusted nowhere.
    let (new_client, new_peer) = (read("client-ca.crt"), read("peer-ca.crt"));
    assert_ne!(new_client, old_client);
    assert_ne!(new_peer, old_peer);
    for file in ["client-trust.crt", "peer-trust.crt"] {
        let bundle = read(file);
        assert!(
            !bundle.contains(old_client.trim()) && !bundle.contains(old_peer.trim()),
            "{file}"
        );
    }
    for n in &names {
        let tls = member_dir(&op, "rca", n).join("tls");
        let server = std::fs::read_to_string(tls.join("server.crt")).unwrap();
        let peer = std::fs::read_to_string(tls.join("peer.crt")).unwrap();
        assert!(
            etcd_operator_controller::tls::member::issued_by(&server, &new_client),
            "{n}: serving certificate"
        );
        assert!(
            etcd_operator_controller::tls::member::issued_by(&peer, &new_peer),
            "{n}: peer certificate"
        );
    }
    for ep in &eps {
        assert!(
            !answers(ep, stale_tls(&pki.join("client-trust.crt"))).await,
            "{ep} still accepts a client certificate of the old CA"
        );
        assert!(
            answers(ep, current_identity(&pki).unwrap()).await,
            "{ep} refuses the operator's new identity"
        );
    }
    etcd_operator_tests::writer::assert_no_write_lost(&eps, current_identity(&pki).as_ref(), &writes).await;
    // Each plane's three moves were told as Events.
    let events = events_on(&op, "rca");
    let moves: Vec<&str> = events
        .iter()
        .filter(|e| e["reason"] == "CertificateAuthorityRotating")
        .filter_map(|e| e["message"].as_str())
        .collect();
    for plane in ["client", "peer"] {
        for (from, to) in [
            ("Steady", "Trusting"),
            ("Trusting", "Reissuing"),
            ("Reissuing", "Steady"),
        ] {
            let told = format!("The {plane} plane's CA rotation moved from {from} to {to}: ");
            assert!(
                moves.iter().any(|m| m.starts_with(&told)),
                "no Event {told:?} among {moves:?}"
            );
        }
    }

    // Asked again with the same value, nothing restarts.
    let pids: Vec<u32> = names
        .iter()
        .map(|n| member_pid(&member_dir(&op, "rca", n)))
        .collect();
    etcd_operator_tests::kubectl::wait_reconciles(
        &op,
        3,
        "three more looks at the cluster",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let again: Vec<u32> = names
        .iter()
        .map(|n| member_pid(&member_dir(&op, "rca", n)))
        .collect();
    assert_eq!(pids, again, "members restarted without a new rotation");
}
