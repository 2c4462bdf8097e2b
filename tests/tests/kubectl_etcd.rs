//! The `kubectl etcd` plugin end to end against `etcd-operator local` and a real 3-member etcd
//! 3.5.1 cluster with TLS on both planes: each subcommand is run as a user would (the built
//! `kubectl-etcd` binary with the operator's kubeconfig) and its effect checked — `status` lists
//! three members and one leader; `endpoints`, evaluated by a shell, lets etcdctl write and read;
//! `snapshot` gives a file `etcdutl snapshot status` accepts, with the SHA-256 printed; `defrag`
//! gets every member defragmented (`status.maintenance`, trigger `Requested`); `move-leader`
//! moves leadership; `rotate-certs` restarts every member on new certificates; `replace-member`
//! replaces a member (new name and ID, three members again); `recover-quorum` without `--yes` on
//! a non-terminal stdin refuses with exit code 3 and changes nothing. Errors read as kubectl's,
//! with the documented exit codes. On a plain 3-member cluster that lost two members' data,
//! `recover-quorum --survivor M` lists the lost members and refuses without `--yes`; with it the
//! cluster is rebuilt from M, back to 3 members with the key written before.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};
use std::time::Duration;

use etcd_operator_tests::kubectl::{Watched, apply, client_endpoints, condition, get, wait_for};
use etcd_operator_tests::local_cluster::{
    available, cluster_dir, cluster_yaml, kill_member, member_dir, member_names, recorded_pid,
};
use etcd_operator_tests::{EtcdVersion, LocalOperator, plugin, tools};
use serde_json::Value;
use sha2::Digest as _;

const WAIT: Duration = Duration::from_secs(180);

fn tls_cluster(name: &str) -> String {
    format!(
        "apiVersion: etcd.operator.dev/v1alpha2\nkind: EtcdCluster\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: 3\n  version: 3.5.1\n  tls:\n    client: {{auto: {{}}}}\n    peer: {{auto: {{}}}}\n"
    )
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the plugin and expects exit code `code`; its (stdout, stderr).
fn plugin_expect(op: &LocalOperator, args: &[&str], code: i32) -> (String, String) {
    let out = plugin::run(op, args, None).unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "kubectl-etcd {args:?}\nstdout:\n{stdout}\nstderr:\n{stderr}\noperator log:\n{}",
        op.log_tail()
    );
    (stdout, stderr)
}

fn members(status: &Value) -> Vec<Value> {
    status["members"].as_array().cloned().unwrap_or_default()
}

fn leader(status: &Value) -> String {
    status["leader"].as_str().unwrap_or_default().to_owned()
}

fn annotations(op: &LocalOperator, name: &str) -> Value {
    get(op, "ec", name).unwrap()["metadata"]["annotations"].clone()
}

/// etcdctl 3.5.1 in a shell that first evaluates `env` (what `kubectl etcd endpoints` printed).
fn etcdctl_with(env: &str, args: &str) -> Output {
    let etcdctl = tools::etcdctl(EtcdVersion::V3_5_1).expect("etcdctl 3.5.1 (install it with `make tools`)");
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -eu\n{env}\nexec {} --dial-timeout=3s --command-timeout=5s {args}",
            etcdctl.display()
        ))
        .env_remove("ETCDCTL_ENDPOINTS")
        .output()
        .unwrap()
}

fn rotation_of(op: &LocalOperator, cluster: &str, member: &str) -> Option<String> {
    std::fs::read_to_string(member_dir(op, cluster, member).join("tls").join("rotation")).ok()
}

#[tokio::test]
async fn every_subcommand_works_through_the_api_and_has_its_effect() {
    let op = LocalOperator::start().await.unwrap();
    apply(&op, &tls_cluster("pl")).unwrap();
    let s = wait_for(
        &op,
        Watched::status("ec", "pl"),
        "3 healthy TLS members",
        WAIT,
        |s| available(s, 3),
    )
    .await
    .unwrap();

    // --- status: a row per member, exactly one leader, the one status names.
    let (out, _) = plugin_expect(&op, &["status", "pl"], 0);
    let names = member_names(&s);
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| names.iter().any(|n| l.starts_with(n.as_str())))
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    let leaders: Vec<&str> = rows
        .iter()
        .filter(|r| r.split_whitespace().nth(2) == Some("*"))
        .copied()
        .collect();
    assert_eq!(leaders.len(), 1, "one leader row:\n{out}");
    assert!(
        out.contains("MEMBER ") && out.contains("DB SIZE") && out.contains("ALARMS"),
        "{out}"
    );
    assert!(out.contains("Conditions:") && out.contains("Available"), "{out}");
    assert!(out.contains("Last backup: <none>"), "{out}");
    for r in &rows {
        assert!(r.contains("3.5.1") && r.contains("healthy"), "{r}");
    }

    // --- errors as kubectl prints them, with their exit codes.
    let (_, err) = plugin_expect(&op, &["status", "nope"], 1);
    assert_eq!(
        err.trim_end(),
        r#"error: etcdclusters.etcd.operator.dev "nope" not found"#
    );
    let (_, err) = plugin_expect(&op, &["replace-member", "pl", "no-such-member"], 1);
    assert!(
        err.starts_with("error: ") && err.contains("no member \"no-such-member\""),
        "{err}"
    );
    plugin_expect(&op, &["snapshot", "pl"], 2);
    let work = tempfile::tempdir().unwrap();
    let missing = work.path().join("nope.db");
    let (_, err) = plugin_expect(&op, &["snapshot", "nope", "-o", missing.to_str().unwrap()], 1);
    assert_eq!(
        err.trim_end(),
        r#"error: etcdclusters.etcd.operator.dev "nope" not found"#
    );
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "nothing written"
    );

    // --- endpoints: evaluated by a shell, etcdctl reaches the TLS cluster with them.
    let (env, _) = plugin_expect(&op, &["endpoints", "pl"], 0);
    assert!(env.contains("export ETCDCTL_ENDPOINTS='https://"), "{env}");
    assert!(
        env.contains("ETCDCTL_CACERT=") && env.contains("ETCDCTL_KEY="),
        "{env}"
    );
    let put = etcdctl_with(&env, "put plugin-key plugin-value");
    assert!(put.status.success(), "{:?}", text(&put));
    let got = etcdctl_with(&env, "get plugin-key --print-value-only");
    assert_eq!(text(&got).0.trim(), "plugin-value", "{:?}", text(&got));

    // --- snapshot: whole, checked, accepted by etcdutl.
    let file = work.path().join("pl.db");
    let (out, _) = plugin_expect(&op, &["snapshot", "pl", "-o", file.to_str().unwrap()], 0);
    let data = std::fs::read(&file).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&data));
    assert!(out.contains(&format!("sha256 {sha}, verified")), "{out}");
    let leftovers: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("pl.db")],
        "no partial file left"
    );
    let etcdutl = tools::etcdutl(EtcdVersion::V3_5_1).expect("etcdutl 3.5.1 (install it with `make tools`)");
    let status = Command::new(&etcdutl)
        .args(["snapshot", "status", "-w", "json"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "etcdutl snapshot status: {:?}",
        text(&status)
    );
    let info: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(info["totalKey"].as_i64().unwrap() >= 1, "{info}");

    // --- defrag: every member defragmented on request.
    plugin_expect(&op, &["defrag", "pl"], 0);
    let requested = |s: &Value| {
        let done: Vec<String> = s["maintenance"]["defragmentations"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter(|d| d["trigger"] == "Requested")
                    .filter_map(|d| d["member"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        member_names(s).iter().all(|m| done.contains(m))
    };
    let s = wait_for(
        &op,
        Watched::status("ec", "pl"),
        "every member defragmented on request",
        WAIT,
        |s| requested(s) && available(s, 3),
    )
    .await
    .unwrap();
    assert!(
        op.log_tail().contains("defragmented"),
        "the operator logs each defragmentation"
    );

    // --- move-leader: leadership goes to the member asked for, and the request is recorded.
    let target = member_names(&s).into_iter().find(|m| *m != leader(&s)).unwrap();
    let (out, _) = plugin_expect(&op, &["move-leader", "pl", &target], 0);
    assert!(out.contains("etcd.operator.dev/move-leader="), "{out}");
    let s = wait_for(
        &op,
        Watched::status("ec", "pl"),
        "the requested member to lead",
        WAIT,
        |s| leader(s) == target && s["maintenance"]["lastLeaderTransfer"]["leader"] == target.as_str(),
    )
    .await
    .unwrap();
    let (out, _) = plugin_expect(&op, &["move-leader", "pl", &target], 0);
    assert!(out.contains("already leads"), "{out}");

    // --- rotate-certs: every member restarted on certificates issued under the new value.
    let names = member_names(&s);
    let pids: Vec<Option<u32>> = names
        .iter()
        .map(|n| recorded_pid(&member_dir(&op, "pl", n)))
        .collect();
    plugin_expect(&op, &["rotate-certs", "pl"], 0);
    let value = annotations(&op, "pl")["etcd.operator.dev/rotate-certificates"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_for(
        &op,
        Watched::status("ec", "pl"),
        "every member restarted on new certificates",
        WAIT,
        |s| {
            available(s, 3)
                && names
                    .iter()
                    .all(|n| rotation_of(&op, "pl", n).as_deref() == Some(value.as_str()))
        },
    )
    .await
    .unwrap();
    for (name, pid) in names.iter().zip(&pids) {
        assert_ne!(
            recorded_pid(&member_dir(&op, "pl", name)),
            *pid,
            "{name}: not restarted on its new certificates"
        );
    }

    // --- replace-member: a follower replaced by a fresh member with a new ID.
    let s = get(&op, "ec", "pl").unwrap()["status"].clone();
    let ids: Vec<String> = members(&s)
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect();
    let victim = member_names(&s).into_iter().find(|m| *m != leader(&s)).unwrap();
    plugin_expect(&op, &["replace-member", "pl", &victim], 0);
    let s = wait_for(
        &op,
        Watched::status("ec", "pl"),
        "the member replaced, 3 members again",
        WAIT,
        |s| available(s, 3) && !member_names(s).contains(&victim),
    )
    .await
    .unwrap();
    let new_ids: Vec<String> = members(&s)
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        new_ids.iter().filter(|id| !ids.contains(id)).count(),
        1,
        "one new member ID: {ids:?} -> {new_ids:?}"
    );
    // The data is still there.
    let got = etcdctl_with(&env, "get plugin-key --print-value-only");
    assert_eq!(text(&got).0.trim(), "plugin-value", "{:?}", text(&got));

    // --- recover-quorum: no terminal, no --yes: refused, exit 3, nothing changed; with --yes on a
    //     cluster that has quorum: refused too.
    let before = annotations(&op, "pl");
    let (_, err) = plugin_expect(&op, &["recover-quorum", "pl"], 3);
    assert!(
        err.contains("data given up"),
        "what will be lost is shown first: {err}"
    );
    assert!(
        err.contains("error: not confirmed: standard input is not a terminal"),
        "{err}"
    );
    let (_, err) = plugin_expect(&op, &["recover-quorum", "pl", "--yes"], 3);
    assert!(err.contains("has quorum"), "{err}");
    let after = annotations(&op, "pl");
    assert_eq!(before, after, "recover-quorum changed the object");
    assert!(after.get("etcd.operator.dev/recover-quorum").is_none(), "{after}");
    assert_eq!(client_endpoints(&s).len(), 3);
}

#[tokio::test]
async fn recover_quorum_refuses_without_confirmation_then_rebuilds_from_the_named_survivor() {
    let op = LocalOperator::start().await.unwrap();
    apply(&op, &cluster_yaml("rq", 3)).unwrap();
    let s = wait_for(&op, Watched::status("ec", "rq"), "3 healthy members", WAIT, |s| {
        available(s, 3)
    })
    .await
    .unwrap();
    // Plain endpoints: no certificate files, and etcdctl reaches the cluster with them.
    let (env, _) = plugin_expect(&op, &["endpoints", "rq"], 0);
    assert!(env.contains("export ETCDCTL_ENDPOINTS='http://"), "{env}");
    assert!(!env.contains("ETCDCTL_CERT"), "{env}");
    let put = etcdctl_with(&env, "put survives the-outage");
    assert!(put.status.success(), "{:?}", text(&put));

    // Two of three members destroyed: quorum is lost.
    let names = member_names(&s);
    let (survivor, destroyed) = (names[0].clone(), names[1..].to_vec());
    for name in &destroyed {
        let dir = cluster_dir(&op, "rq").join(name);
        kill_member(&dir);
        std::fs::remove_dir_all(dir.join("data")).unwrap();
    }
    wait_for(
        &op,
        Watched::status("ec", "rq"),
        "the quorum loss reported",
        WAIT,
        |s| condition(s, "Available").is_some_and(|c| c["status"] == "False"),
    )
    .await
    .unwrap();

    // No terminal and no --yes: what would be lost is shown, nothing is asked for.
    let (_, err) = plugin_expect(&op, &["recover-quorum", "rq", "--survivor", &survivor], 3);
    for name in &destroyed {
        assert!(
            err.contains(&format!("  - {name}\n")),
            "{name} listed as lost:\n{err}"
        );
    }
    assert!(!err.contains(&format!("  - {survivor}\n")), "{err}");
    assert!(err.contains("not a terminal"), "{err}");
    assert!(
        annotations(&op, "rq")
            .get("etcd.operator.dev/recover-quorum")
            .is_none(),
        "nothing asked for"
    );

    // Confirmed: rebuilt from that member, grown back to 3, the key kept.
    let (out, _) = plugin_expect(
        &op,
        &["recover-quorum", "rq", "--survivor", &survivor, "--yes"],
        0,
    );
    assert!(
        out.contains(&format!("etcd.operator.dev/recover-quorum={survivor}")),
        "{out}"
    );
    let s = wait_for(
        &op,
        Watched::status("ec", "rq"),
        "rebuilt from the survivor and grown back",
        WAIT,
        |s| available(s, 3) && s["recovery"]["survivor"] == survivor.as_str(),
    )
    .await
    .unwrap();
    let mut lost: Vec<String> = s["recovery"]["lostMembers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    lost.sort();
    let mut want = destroyed.clone();
    want.sort();
    assert_eq!(lost, want, "{s}");
    let (env, _) = plugin_expect(&op, &["endpoints", "rq"], 0);
    let got = etcdctl_with(&env, "get survives --print-value-only");
    assert_eq!(text(&got).0.trim(), "the-outage", "{:?}", text(&got));
}

#[test]
fn help_documents_the_exit_codes() {
    let out = Command::new(plugin::plugin_binary().unwrap())
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for line in ["Exit codes:", "0  done", "1  error", "2  usage", "3  refused"] {
        assert!(help.contains(line), "{line:?} missing from --help:\n{help}");
    }
    for sub in [
        "status",
        "snapshot",
        "defrag",
        "replace-member",
        "rotate-certs",
        "move-leader",
        "recover-quorum",
        "endpoints",
    ] {
        assert!(help.contains(sub), "{sub} missing from --help:\n{help}");
    }
}

#[test]
fn the_krew_manifest_names_the_plugin_and_the_archive_make_builds() {
    let root = tools::workspace_root();
    let text = std::fs::read_to_string(root.join("plugins/krew/etcd.yaml")).unwrap();
    let m: Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(m["apiVersion"], "krew.googlecontainertools.github.com/v1alpha2");
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(m["metadata"]["name"], "etcd", "kubectl etcd");
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let version = workspace
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap();
    assert_eq!(m["spec"]["version"], format!("v{version}").as_str());
    let platforms = m["spec"]["platforms"].as_array().unwrap();
    assert_eq!(platforms.len(), 1, "only the platform built and tested here");
    let p = &platforms[0];
    assert_eq!(p["selector"]["matchLabels"]["os"], "linux");
    assert_eq!(p["selector"]["matchLabels"]["arch"], "amd64");
    assert_eq!(p["bin"], "kubectl-etcd");
    assert_eq!(p["files"][0]["from"], "kubectl-etcd");
    // The archive the Makefile's krew-archive target builds is the one the URI names.
    let makefile = std::fs::read_to_string(root.join("Makefile")).unwrap();
    let archive = p["uri"].as_str().unwrap().rsplit('/').next().unwrap();
    assert!(
        makefile.contains(&format!("dist/{archive} -C")),
        "make krew-archive builds {archive}"
    );
    assert!(
        p["uri"]
            .as_str()
            .unwrap()
            .contains(&format!("/download/v{version}/")),
        "the URI names this version's release"
    );
    assert_eq!(p["sha256"].as_str().unwrap().len(), 64);
}
