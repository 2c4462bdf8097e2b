//! Tests of local mode: PKI, backing etcd (the installed etcd of `PREFERRED_ETCD_VERSION`), kubeconfig, prepare.

use std::ffi::OsString;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rustls_pki_types::ServerName;

use super::*;
use crate::local::backing_etcd::PREFERRED_ETCD_VERSION;
use etcd_operator_apiserver::pki::{CertificateAuthority, LeafSpec};
use etcd_operator_apiserver::serve::auth::authenticate_local;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Marks processes started by tests so the leftover check can tell them apart.
fn owner_env() -> Vec<(OsString, OsString)> {
    vec![(
        etcd_operator_tests::process::OWNER_ENV.into(),
        etcd_operator_tests::leftovers::owner_token().into(),
    )]
}

fn etcd_binary() -> std::path::PathBuf {
    EtcdSearch::from_environment(None)
        .find()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn etcd_options(dir: &Path) -> BackingEtcdOptions {
    let mut options = BackingEtcdOptions::new(dir.join("etcd"), etcd_binary());
    options.extra_env = owner_env();
    options
}

fn process_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

// ---- pki

#[test]
fn pki_is_created_once_then_reloaded_identical() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = dir.path().join("pki");
    let first = pki::ensure(&pki_dir, ip("127.0.0.1")).unwrap();
    let second = pki::ensure(&pki_dir, ip("127.0.0.1")).unwrap();
    assert_eq!(first.ca, second.ca);
    assert_eq!(first.server, second.server);
    assert_eq!(first.admin, second.admin);
    assert_eq!(first.controller, second.controller);
    assert_eq!(mode(&pki_dir), 0o700);
    for base in ["ca", "server", "admin", "controller"] {
        assert_eq!(mode(&pki_dir.join(format!("{base}.key"))), 0o600, "{base}.key");
        assert_eq!(mode(&pki_dir.join(format!("{base}.crt"))), 0o644, "{base}.crt");
    }
    assert!(
        !format!("{first:?}").contains("PRIVATE KEY"),
        "Debug redacts keys"
    );
}

#[test]
fn leaves_verify_against_the_ca_with_the_expected_identities() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = pki::ensure(dir.path(), ip("127.0.0.1")).unwrap();
    let ca = CertificateAuthority::load(&pki.ca.cert_pem, &pki.ca.key_pem).unwrap();
    let names = [
        ServerName::try_from("localhost").unwrap(),
        ServerName::from(ip("127.0.0.1")),
        ServerName::from(ip("::1")),
    ];
    ca.verify_server(&pki.server.cert_pem, &names, SystemTime::now())
        .unwrap();
    let err = ca
        .verify_server(
            &pki.server.cert_pem,
            &[ServerName::from(ip("10.9.8.7"))],
            SystemTime::now(),
        )
        .unwrap_err();
    let err = etcd_operator_api::report::chain(&err);
    assert!(err.contains("10.9.8.7"), "{err}");
    // A client certificate is no server certificate, and the reverse.
    assert!(
        ca.verify_server(&pki.admin.cert_pem, &names[..1], SystemTime::now())
            .is_err()
    );
    assert!(ca.verify_client(&pki.server.cert_pem, SystemTime::now()).is_err());
    for (pair, user) in [
        (&pki.admin, "admin"),
        (&pki.controller, "system:etcd-operator:controller"),
    ] {
        ca.verify_client(&pair.cert_pem, SystemTime::now()).unwrap();
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(pair.cert_pem.as_bytes()).unwrap();
        let peer = etcd_operator_apiserver::serve::PeerCertificates(std::sync::Arc::new(vec![der]));
        let user_info = authenticate_local(&peer).unwrap();
        assert_eq!(user_info.name, user);
        assert_eq!(user_info.groups, vec!["system:masters", "system:authenticated"]);
    }
    assert_eq!(
        authenticate_local(&etcd_operator_apiserver::serve::PeerCertificates::default()),
        None
    );
    // Certificates of another CA do not verify.
    let other = CertificateAuthority::generate("other", Duration::from_secs(86_400)).unwrap();
    assert!(
        other
            .verify_client(&pki.admin.cert_pem, SystemTime::now())
            .is_err()
    );
}

#[test]
fn serving_certificate_is_reissued_from_the_same_ca_for_a_new_listen_ip() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let first = pki::ensure(dir.path(), ip("127.0.0.1")).unwrap();
    let second = pki::ensure(dir.path(), ip("10.1.2.3")).unwrap();
    assert_eq!(first.ca, second.ca);
    assert_eq!(first.admin, second.admin);
    assert_ne!(first.server, second.server);
    let ca = CertificateAuthority::load(&second.ca.cert_pem, &second.ca.key_pem).unwrap();
    ca.verify_server(
        &second.server.cert_pem,
        &[
            ServerName::from(ip("10.1.2.3")),
            ServerName::try_from("localhost").unwrap(),
        ],
        SystemTime::now(),
    )
    .unwrap();
    // A wildcard listen address needs no further name.
    let third = pki::ensure(dir.path(), ip("0.0.0.0")).unwrap();
    assert_eq!(third.server, second.server);
}

#[test]
fn leaves_close_to_expiry_or_with_a_foreign_key_are_reissued() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let first = pki::ensure(dir.path(), ip("127.0.0.1")).unwrap();
    let ca = CertificateAuthority::load(&first.ca.cert_pem, &first.ca.key_pem).unwrap();
    // A serving certificate with 10 days left.
    let mut spec = LeafSpec::server("short", &["localhost"], &[ip("127.0.0.1"), ip("::1")]);
    spec.validity = Duration::from_secs(10 * 86_400);
    let short = ca.issue(&spec).unwrap();
    std::fs::write(dir.path().join("server.crt"), &short.cert_pem).unwrap();
    std::fs::write(dir.path().join("server.key"), &short.key_pem).unwrap();
    // The admin certificate with the controller's key.
    std::fs::write(dir.path().join("admin.key"), &first.controller.key_pem).unwrap();

    let second = pki::ensure(dir.path(), ip("127.0.0.1")).unwrap();
    assert_eq!(second.ca, first.ca);
    assert_ne!(second.server, short);
    assert_ne!(second.server, first.server);
    assert_ne!(second.admin, first.admin);
    assert_eq!(second.controller, first.controller);
    ca.verify_client(&second.admin.cert_pem, SystemTime::now())
        .unwrap();
}

#[test]
fn an_incomplete_ca_is_an_error_not_a_silent_new_ca() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    pki::ensure(dir.path(), ip("127.0.0.1")).unwrap();
    std::fs::remove_file(dir.path().join("ca.key")).unwrap();
    let err = pki::ensure(dir.path(), ip("127.0.0.1")).unwrap_err();
    assert!(matches!(err, PkiError::IncompleteCa { .. }), "{err}");
    assert!(err.to_string().contains("ca.key"), "{err}");
}

/// The chain a person reads when local mode cannot use its CA: each error says what failed, its
/// causes follow once each (no message repeats its source's text).
#[test]
fn an_error_chain_names_each_cause_once() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    pki::ensure(dir.path(), ip("127.0.0.1")).unwrap();
    std::fs::write(dir.path().join("ca.crt"), "not a certificate").unwrap();
    let err = LocalError::from(pki::ensure(dir.path(), ip("127.0.0.1")).unwrap_err());
    let chain = etcd_operator_api::report::chain(&err);
    println!("{chain}");
    let mut causes = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = next {
        causes.push(e.to_string());
        next = e.source();
    }
    assert!(causes.len() >= 4, "local mode -> PKI -> CA -> PEM: {causes:?}");
    for cause in &causes {
        assert_eq!(chain.matches(cause.as_str()).count(), 1, "{cause:?} in {chain:?}");
    }
    assert_eq!(chain, causes.join(": "));
}

// ---- kubeconfig

#[test]
fn kubeconfig_is_yaml_with_the_expected_fields() {
    let dir = tempfile::tempdir().unwrap();
    let identity = ClientIdentity {
        server_url: kubeconfig::server_url("0.0.0.0:8443".parse().unwrap()),
        ca_pem: "CA".into(),
        user: "admin".into(),
        cert_pem: "CERT".into(),
        key_pem: "KEY".into(),
    };
    let path = dir.path().join("kubeconfig");
    Kubeconfig::for_identity(&identity).write(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
    let yaml: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(yaml["apiVersion"], "v1");
    assert_eq!(yaml["kind"], "Config");
    assert_eq!(yaml["current-context"], "etcd-operator-local");
    assert_eq!(yaml["clusters"][0]["name"], "etcd-operator-local");
    assert_eq!(yaml["clusters"][0]["cluster"]["server"], "https://127.0.0.1:8443");
    assert_eq!(
        yaml["clusters"][0]["cluster"]["certificate-authority-data"],
        "Q0E="
    );
    assert_eq!(yaml["users"][0]["name"], "admin");
    assert_eq!(yaml["users"][0]["user"]["client-certificate-data"], "Q0VSVA==");
    assert_eq!(yaml["users"][0]["user"]["client-key-data"], "S0VZ");
    assert_eq!(yaml["contexts"][0]["name"], "etcd-operator-local");
    assert_eq!(yaml["contexts"][0]["context"]["cluster"], "etcd-operator-local");
    assert_eq!(yaml["contexts"][0]["context"]["user"], "admin");
    // kube-rs reads it as well.
    let parsed = kube::config::Kubeconfig::read_from(&path).unwrap();
    assert_eq!(parsed.current_context.as_deref(), Some("etcd-operator-local"));
    assert_eq!(
        kubeconfig::server_url("[::]:1234".parse().unwrap()),
        "https://[::1]:1234"
    );
}

// ---- backing etcd

#[test]
fn a_missing_etcd_binary_names_make_tools_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let search = EtcdSearch {
        start_dirs: vec![dir.path().to_path_buf()],
        path_var: Some(dir.path().as_os_str().to_owned()),
        ..EtcdSearch::default()
    };
    let err = search.find().unwrap_err().to_string();
    assert!(err.contains("make tools-etcd"), "{err}");
    assert!(
        err.contains(&format!(".tools/etcd/{PREFERRED_ETCD_VERSION}/etcd")),
        "{err}"
    );

    let explicit = EtcdSearch {
        explicit: Some(dir.path().join("no-etcd")),
        ..search
    };
    let err = explicit.find().unwrap_err().to_string();
    assert!(
        err.contains("make tools-etcd") && err.contains("no-etcd"),
        "{err}"
    );
}

#[test]
fn etcd_is_found_in_a_tools_directory_above_a_start_directory() {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir
        .path()
        .join(format!(".tools/etcd/{PREFERRED_ETCD_VERSION}/etcd"));
    std::fs::create_dir_all(binary.parent().unwrap()).unwrap();
    std::fs::write(&binary, "").unwrap();
    let nested = dir.path().join("a/b");
    std::fs::create_dir_all(&nested).unwrap();
    let search = EtcdSearch {
        start_dirs: vec![nested],
        ..EtcdSearch::default()
    };
    assert_eq!(search.find().unwrap(), binary);
    // The environment variable comes first.
    let env_binary = dir.path().join("my-etcd");
    std::fs::write(&env_binary, "").unwrap();
    let search = EtcdSearch {
        env_binary: Some(env_binary.clone()),
        ..search
    };
    assert_eq!(search.find().unwrap(), env_binary);
}

#[tokio::test]
async fn backing_etcd_serves_restarts_on_the_same_dir_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = BackingEtcd::start(etcd_options(dir.path())).await.unwrap();
    let first_endpoint = etcd.endpoint().to_owned();
    let first_pid = etcd.pid();
    assert!(process_running(first_pid));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("etcd/etcd.pid"))
            .unwrap()
            .trim(),
        first_pid.to_string()
    );
    let mut client = etcd.connect().await.unwrap();
    client.put("/registry/kept", "value", None).await.unwrap();
    drop(client);
    etcd.shutdown().await.unwrap();
    assert!(!process_running(first_pid), "etcd stopped");
    assert!(!dir.path().join("etcd/etcd.pid").exists());

    let etcd = BackingEtcd::start(etcd_options(dir.path())).await.unwrap();
    assert_eq!(etcd.endpoint(), first_endpoint, "the stored ports are reused");
    let mut client = etcd.connect().await.unwrap();
    let got = client.get("/registry/kept", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"value");
    let pid = etcd.pid();
    // Dropping the guard stops etcd too.
    drop(etcd);
    assert!(!process_running(pid), "etcd stopped on drop");
    let log = std::fs::read_to_string(dir.path().join("etcd/etcd.log")).unwrap();
    // The bootstrap start, the first serving start, the restart.
    assert_eq!(
        log.matches("=== etcd-operator: starting the backing etcd")
            .count(),
        3
    );
}

/// Whether `pid` is an exited process nobody reaped (`<defunct>`).
fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

async fn next_state(state: &mut tokio::sync::watch::Receiver<EtcdState>, within: Duration) -> EtcdState {
    tokio::time::timeout(within, state.changed())
        .await
        .expect("the supervisor reported no change in time")
        .unwrap();
    *state.borrow_and_update()
}

#[tokio::test]
async fn a_killed_backing_etcd_is_reaped_and_restarted_on_its_data_and_ports() {
    let dir = tempfile::tempdir().unwrap();
    let options = etcd_options(dir.path());
    let etcd = BackingEtcd::start(options.clone()).await.unwrap();
    // One client for the whole test, as the storage layer has: it must recover by itself.
    let mut client = etcd.connect().await.unwrap();
    client.put("/registry/kept", "value", None).await.unwrap();
    let supervised = SupervisedEtcd::start(etcd, options);
    let endpoint = supervised.endpoint().to_owned();
    let mut state = supervised.state();
    for round in 0..2 {
        let pid = supervised.pid().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        assert_eq!(
            next_state(&mut state, Duration::from_secs(5)).await,
            EtcdState::Down
        );
        let EtcdState::Running { pid: new_pid } = next_state(&mut state, Duration::from_secs(60)).await
        else {
            panic!("round {round}: not running after the restart");
        };
        assert_ne!(new_pid, pid, "round {round}");
        assert!(process_running(new_pid), "round {round}");
        assert!(!zombie(pid), "round {round}: the killed etcd was not reaped");
        assert_eq!(supervised.endpoint(), endpoint);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("etcd/etcd.pid"))
                .unwrap()
                .trim(),
            new_pid.to_string()
        );
        // The same client works again within seconds, and the data is still there.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let got = loop {
            match client.get("/registry/kept", None).await {
                Ok(got) => break got,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("round {round}: not yet: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("round {round}: the client did not recover within 10 s: {e}"),
            }
        };
        assert_eq!(got.kvs()[0].value(), b"value", "round {round}");
        client
            .put(format!("/registry/round-{round}"), "x", None)
            .await
            .unwrap();
    }
    let pid = supervised.pid().unwrap();
    supervised.shutdown().await.unwrap();
    assert!(!process_running(pid), "etcd stopped with its supervisor");
    assert!(!zombie(pid));
    let log = std::fs::read_to_string(dir.path().join("etcd/etcd.log")).unwrap();
    // Bootstrap, first start, two restarts.
    assert_eq!(
        log.matches("=== etcd-operator: starting the backing etcd")
            .count(),
        4
    );
}

#[tokio::test]
async fn a_restart_that_fails_is_retried_on_the_same_ports_until_it_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let options = etcd_options(dir.path());
    let etcd = BackingEtcd::start(options.clone()).await.unwrap();
    let ports = etcd.ports();
    let supervised = SupervisedEtcd::start(etcd, options);
    let mut state = supervised.state();
    let pid = supervised.pid().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert_eq!(
        next_state(&mut state, Duration::from_secs(5)).await,
        EtcdState::Down
    );
    // Take the client port before the first restart (200 ms after the exit) can.
    let deadline = std::time::Instant::now() + Duration::from_millis(150);
    let squatter = loop {
        match std::net::TcpListener::bind(("127.0.0.1", ports.client)) {
            Ok(listener) => break listener,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("port not free yet: {e}");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("could not take port {}: {e}", ports.client),
        }
    };
    // Restarts fail meanwhile (etcd exits: address in use) and are retried, never on other ports.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        *state.borrow(),
        EtcdState::Down,
        "started although its port was taken"
    );
    drop(squatter);
    let EtcdState::Running { pid: new_pid } = next_state(&mut state, Duration::from_secs(60)).await else {
        panic!("not running after the port came free");
    };
    assert_ne!(new_pid, pid);
    assert_eq!(
        supervised.endpoint(),
        format!("https://127.0.0.1:{}", ports.client)
    );
    let log = std::fs::read_to_string(dir.path().join("etcd/etcd.log")).unwrap();
    assert!(
        log.contains("address already in use"),
        "no failed restart in the log"
    );
    let mut client = supervised.connect().await.unwrap();
    client.status().await.unwrap();
    supervised.shutdown().await.unwrap();
    assert!(!process_running(new_pid));
}

#[tokio::test]
async fn a_stale_etcd_of_a_crashed_run_is_stopped_first() {
    let dir = tempfile::tempdir().unwrap();
    let etcd_dir = dir.path().join("etcd");
    std::fs::create_dir_all(&etcd_dir).unwrap();
    let etcd_dir = std::fs::canonicalize(&etcd_dir).unwrap();
    let ports = etcd_operator_tests::ports::free_ports(2).unwrap();
    let peer = format!("http://127.0.0.1:{}", ports[1]);
    let mut cmd = std::process::Command::new(etcd_binary());
    cmd.arg("--name=backing")
        .arg(format!("--data-dir={}", etcd_dir.join("data").display()))
        .arg(format!("--listen-client-urls=http://127.0.0.1:{}", ports[0]))
        .arg(format!("--advertise-client-urls=http://127.0.0.1:{}", ports[0]))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=backing={peer}"));
    let mut stale =
        etcd_operator_tests::TestProcess::spawn("stale etcd", cmd, &dir.path().join("stale.log")).unwrap();
    std::fs::write(etcd_dir.join("etcd.pid"), format!("{}\n", stale.pid())).unwrap();
    // Let it bootstrap and serve, as the etcd of a run that crashed later would have.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let endpoint = format!("http://127.0.0.1:{}", ports[0]);
        if let Ok(mut client) = etcd_client::Client::connect([endpoint], None).await
            && client.status().await.is_ok()
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", stale.log_tail(2000));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let etcd = BackingEtcd::start(etcd_options(dir.path())).await.unwrap();
    assert!(stale.exited().is_some(), "the stale etcd was stopped");
    assert_ne!(etcd.pid(), stale.pid());
    let mut client = etcd.connect().await.unwrap();
    client.status().await.unwrap();
    etcd.shutdown().await.unwrap();
}

/// Puts `key` and reads it back through `client`, each within 10 s.
async fn put_and_get(client: &mut etcd_client::Client, key: &str) -> Result<Vec<u8>, String> {
    let within = Duration::from_secs(10);
    tokio::time::timeout(within, client.put(key, "value", None))
        .await
        .map_err(|_| format!("put {key}: no answer in {within:?}"))?
        .map_err(|e| format!("put {key}: {e}"))?;
    let got = tokio::time::timeout(within, client.get(key, None))
        .await
        .map_err(|_| format!("get {key}: no answer in {within:?}"))?
        .map_err(|e| format!("get {key}: {e}"))?;
    Ok(got
        .kvs()
        .first()
        .map(|kv| kv.value().to_vec())
        .unwrap_or_default())
}

#[tokio::test]
async fn the_storage_reaches_the_backing_etcd_over_its_private_unix_socket() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let etcd = BackingEtcd::start(etcd_options(dir.path())).await.unwrap();
    let socket = etcd
        .client_socket()
        .expect("a short directory gets a socket")
        .to_path_buf();
    assert_eq!(
        socket,
        dir.path().canonicalize().unwrap().join("etcd/client.sock:0")
    );
    assert!(std::fs::metadata(&socket).unwrap().file_type().is_socket());
    assert_eq!(
        mode(socket.parent().unwrap()),
        0o700,
        "only the owner reaches the socket"
    );
    let tls = etcd.client_tls().clone();

    // The storage's client goes over the socket: it works with a TLS endpoint nobody serves,
    let mut client = etcd.connect().await.unwrap();
    assert_eq!(put_and_get(&mut client, "/registry/a").await.unwrap(), b"value");
    let mut over_socket = backing_etcd::connect("https://127.0.0.1:1", Some(&socket), &tls)
        .await
        .unwrap();
    assert_eq!(
        put_and_get(&mut over_socket, "/registry/b").await.unwrap(),
        b"value"
    );
    // and fails with a socket that is not there, though the TLS endpoint is etcd's.
    let mut nowhere =
        backing_etcd::connect(etcd.endpoint(), Some(&dir.path().join("etcd/nothing.sock")), &tls)
            .await
            .unwrap();
    let err = put_and_get(&mut nowhere, "/registry/c").await.unwrap_err();
    assert!(err.starts_with("put /registry/c"), "{err}");
    // The TLS port still serves everyone else (members' tools, a client without the socket).
    let mut over_tls = backing_etcd::connect(etcd.endpoint(), None, &tls).await.unwrap();
    assert_eq!(put_and_get(&mut over_tls, "/registry/a").await.unwrap(), b"value");
    etcd.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_backing_etcds_json_gateway_answers_and_etcd_rejects_no_connection_of_its_own() {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let dir = tempfile::tempdir().unwrap();
    let etcd = BackingEtcd::start(etcd_options(dir.path())).await.unwrap();
    let tls = etcd.client_tls().clone();
    let gateway = etcd_operator_tests::kube_client::etcd_gateway(
        etcd.endpoint(),
        tls.ca_pem.as_bytes(),
        tls.cert_pem.as_bytes(),
        tls.key_pem.as_bytes(),
    )
    .await
    .unwrap();
    let post = |path: &str, body: serde_json::Value| {
        let gateway = gateway.clone();
        let request = http::Request::post(path)
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap();
        async move { gateway.request_text(request).await }
    };
    // etcd's gateway dials etcd's own client port with the serving certificate: with one for
    // servers only, etcd refuses it and the gateway answers 503 "connection error".
    post(
        "/v3/kv/put",
        serde_json::json!({"key": b64(b"/gateway/a"), "value": b64(b"through the gateway")}),
    )
    .await
    .unwrap();
    let text = post("/v3/kv/range", serde_json::json!({"key": b64(b"/gateway/a")}))
        .await
        .unwrap();
    let range: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(range["kvs"][0]["value"], b64(b"through the gateway"), "{text}");
    let log = std::fs::read_to_string(etcd.log_path()).unwrap();
    assert!(
        !log.contains("rejected connection") && !log.contains("bad certificate"),
        "etcd refused a connection: {}",
        log.lines()
            .filter(|l| l.contains("rejected connection") || l.contains("bad certificate"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
    etcd.shutdown().await.unwrap();
}

#[test]
fn a_serving_certificate_for_servers_only_is_issued_again_for_both_ends() {
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = dir.path().join("pki");
    let pki = etcd_pki::ensure(&pki_dir).unwrap();
    let ca = CertificateAuthority::load(&pki.ca.cert_pem, &pki.ca.key_pem).unwrap();
    let now = SystemTime::now();
    ca.verify_client(&pki.server.cert_pem, now).unwrap();
    // What earlier releases issued: valid for a year, for servers only.
    let old = ca
        .issue(&LeafSpec::server(
            etcd_pki::SERVER_NAME,
            &["localhost"],
            &[ip("127.0.0.1")],
        ))
        .unwrap();
    assert!(ca.verify_client(&old.cert_pem, now).is_err());
    std::fs::write(pki_dir.join("server.crt"), &old.cert_pem).unwrap();
    std::fs::write(pki_dir.join("server.key"), &old.key_pem).unwrap();
    let again = etcd_pki::ensure(&pki_dir).unwrap();
    assert_ne!(again.server.cert_pem, old.cert_pem);
    ca.verify_client(&again.server.cert_pem, now).unwrap();
    ca.verify_server(&again.server.cert_pem, &[ServerName::from(ip("127.0.0.1"))], now)
        .unwrap();
    assert_eq!(again.peer, pki.peer, "the peer certificate was good and is kept");
}

#[tokio::test]
async fn a_backing_etcd_in_a_directory_too_deep_for_a_socket_serves_the_storage_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    // `DIR/etcd/client.sock:0` longer than the 107 bytes a socket's path can hold.
    let deep = dir.path().join("d".repeat(60)).join("e".repeat(60));
    let etcd = BackingEtcd::start(etcd_options(&deep)).await.unwrap();
    assert_eq!(etcd.client_socket(), None);
    assert!(!deep.join("etcd/client.sock:0").exists());
    let mut client = etcd.connect().await.unwrap();
    assert_eq!(put_and_get(&mut client, "/registry/a").await.unwrap(), b"value");
    etcd.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_backing_etcd_release_that_loses_acknowledged_writes_is_refused_and_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = etcd_options(dir.path());
    // 3.5.1 loses acknowledged writes when a single member is killed (etcd issue 14370).
    options.binary = etcd_operator_tests::tools::etcd(etcd_operator_tests::tools::EtcdVersion::V3_5_1)
        .unwrap_or_else(|e| panic!("{e}"));
    let err = BackingEtcd::start(options).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, BackingEtcdError::UnsafeRelease { .. })
            && text.contains("etcd 3.5.1")
            && text.contains("14370"),
        "{text}"
    );
    // Stopped before serving anything: no pid file, no data directory to reuse.
    assert!(!dir.path().join("etcd/etcd.pid").exists());
    assert!(!dir.path().join("etcd/data/member").exists());
}

#[tokio::test]
async fn an_etcd_that_cannot_start_reports_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = etcd_options(dir.path());
    options.quota_backend_bytes = 0;
    // An unknown flag makes etcd exit at once.
    options.binary = dir.path().join("fake-etcd");
    std::fs::write(
        &options.binary,
        "#!/bin/sh\necho 'fake etcd: cannot start' >&2\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&options.binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = BackingEtcd::start(options).await.unwrap_err().to_string();
    assert!(
        err.contains("exited") && err.contains("fake etcd: cannot start"),
        "{err}"
    );
}

#[tokio::test]
async fn a_slow_etcd_is_waited_for_until_the_ready_timeout_then_named_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = etcd_options(dir.path());
    // Runs but never serves (the owner marker in its environment lets the leftover check find
    // it; it is killed when the start gives up).
    options.binary = dir.path().join("slow-etcd");
    std::fs::write(
        &options.binary,
        "#!/bin/sh
echo 'slow etcd: still loading' >&2
exec sleep 60
",
    )
    .unwrap();
    std::fs::set_permissions(&options.binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    options.ready_timeout = Duration::from_millis(1500);
    options.progress_interval = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let err = BackingEtcd::start(options).await.unwrap_err();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1500), "gave up after {waited:?}");
    let text = err.to_string();
    assert!(
        matches!(err, BackingEtcdError::NotReady { .. })
            && text.contains("within 1.5s")
            && text.contains("slow etcd: still loading"),
        "{text}"
    );
}

#[test]
fn the_default_start_wait_is_minutes_not_seconds() {
    let options = BackingEtcdOptions::new("d".into(), "etcd".into());
    assert!(options.ready_timeout >= Duration::from_secs(120));
    assert!(options.progress_interval < options.ready_timeout);
}

// ---- prepare: everything together, and kube-rs as the client

#[tokio::test]
async fn prepare_sets_up_a_server_kube_clients_reach_with_the_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let options = LocalOptions {
        state_dir: dir.path().join("state"),
        listen: "127.0.0.1:0".parse().unwrap(),
        etcd_binary: None,
    };
    let env = prepare_with_etcd_env(options.clone(), owner_env()).await.unwrap();
    assert_ne!(env.listen.port(), 0);
    assert_eq!(env.server_url, format!("https://{}", env.listen));
    assert_eq!(env.kubeconfig_path, env.state_dir.join("kubeconfig"));
    assert_eq!(mode(&env.state_dir), 0o700);
    assert_eq!(mode(&env.kubeconfig_path), 0o600);
    env.etcd_client.clone().status().await.unwrap();

    let app = axum::Router::new().route(
        "/whoami",
        axum::routing::get(|request: axum::extract::Request| async move {
            let peer = request
                .extensions()
                .get::<etcd_operator_apiserver::serve::PeerCertificates>()
                .cloned()
                .unwrap_or_default();
            match authenticate_local(&peer) {
                Some(user) => format!("{} {}", user.name, user.groups.join(",")),
                None => "anonymous".to_owned(),
            }
        }),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(etcd_operator_apiserver::serve::serve(
        env.listener,
        env.tls,
        app,
        async move {
            let _ = stopped.await;
        },
    ));

    // The admin kubeconfig, as kubectl would use it.
    let kubeconfig = kube::config::Kubeconfig::read_from(&env.kubeconfig_path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let text = client
        .request_text(http::Request::get("/whoami").body(Vec::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(text, "admin system:masters,system:authenticated");

    // The controller's identity, rendered the same way.
    let yaml = Kubeconfig::for_identity(&env.controller_identity)
        .to_yaml()
        .unwrap();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let text = kube::Client::try_from(config)
        .unwrap()
        .request_text(http::Request::get("/whoami").body(Vec::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        text,
        "system:etcd-operator:controller system:masters,system:authenticated"
    );

    let _ = stop.send(());
    server.await.unwrap().unwrap();
    let first_ca = env.pki.ca.clone();
    env.backing_etcd.shutdown().await.unwrap();

    // A restart on the same directory keeps the CA, so the old kubeconfig still works.
    let env = prepare_with_etcd_env(options, owner_env()).await.unwrap();
    assert_eq!(env.pki.ca, first_ca);
    env.backing_etcd.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unfinished_bootstrap_is_discarded_and_done_again() {
    let dir = tempfile::tempdir().unwrap();
    let etcd_dir = dir.path().join("etcd");
    std::fs::create_dir_all(etcd_dir.join("data.bootstrap/member")).unwrap();
    std::fs::write(etcd_dir.join("data.bootstrap/member/junk"), "half a bootstrap").unwrap();
    std::fs::create_dir_all(etcd_dir.join("data")).unwrap();
    let etcd = BackingEtcd::start(etcd_options(dir.path())).await.unwrap();
    assert!(etcd_dir.join("data/member/wal").is_dir());
    assert!(!etcd_dir.join("data.bootstrap").exists());
    let mut client = etcd.connect().await.unwrap();
    client.put("k", "v", None).await.unwrap();
    etcd.shutdown().await.unwrap();
}

// ---- the backing etcd serves mutual TLS

/// A probe client's options: short timeouts, and `tls` when given.
fn probe(tls: Option<etcd_client::TlsOptions>) -> etcd_client::ConnectOptions {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(3));
    match tls {
        Some(tls) => options.with_tls(tls),
        None => options,
    }
}

/// Asserts that a client at `endpoint` with `options` gets no answer to a status request.
async fn assert_refused(endpoint: &str, options: etcd_client::ConnectOptions, what: &str) {
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        match etcd_client::Client::connect([endpoint], Some(options)).await {
            Ok(mut client) => client.status().await.map(|_| ()),
            Err(e) => Err(e),
        }
    })
    .await;
    match answered {
        Ok(Ok(())) => panic!("{what}: etcd at {endpoint} answered"),
        Ok(Err(e)) => eprintln!("{what}: refused as expected: {e}"),
        Err(_) => eprintln!("{what}: no answer within 10 s, as expected"),
    }
}

/// A plain HTTP/1.0 GET on loopback: the status code (0 when none came) and the whole answer.
async fn plain_get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut bytes)).await;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

#[tokio::test]
async fn the_backing_etcd_refuses_plain_http_and_foreign_clients_and_serves_metrics_in_plain_http() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let etcd = BackingEtcd::start(etcd_options(dir.path())).await.unwrap();
    let ports = etcd.ports();
    assert_eq!(etcd.endpoint(), format!("https://127.0.0.1:{}", ports.client));
    assert!(ports.metrics != 0 && ports.metrics != ports.client && ports.metrics != ports.peer);

    // The storage's identity works.
    let mut client = etcd.connect().await.unwrap();
    client.put("/registry/tls", "yes", None).await.unwrap();
    let members = client.member_list().await.unwrap();
    assert_eq!(
        members.members()[0].peer_urls(),
        [format!("https://127.0.0.1:{}", ports.peer)]
    );

    // Plain HTTP on the client port.
    assert_refused(
        &format!("http://127.0.0.1:{}", ports.client),
        probe(None),
        "plain gRPC",
    )
    .await;
    let (code, text) = plain_get(ports.client, "/version").await;
    assert_ne!(code, 200, "plain HTTP /version on the client port: {text}");
    // Plain HTTP on the peer port.
    let (code, text) = plain_get(ports.peer, "/members").await;
    assert_ne!(code, 200, "plain HTTP /members on the peer port: {text}");
    // TLS trusting etcd's CA but presenting no certificate.
    let ca = etcd_client::Certificate::from_pem(etcd.client_tls().ca_pem.as_bytes());
    assert_refused(
        etcd.endpoint(),
        probe(Some(etcd_client::TlsOptions::new().ca_certificate(ca))),
        "TLS without a client certificate",
    )
    .await;
    // TLS presenting a client certificate of another CA (same user name).
    let other = CertificateAuthority::generate("another-ca", Duration::from_secs(365 * 24 * 3600)).unwrap();
    let foreign = other
        .issue(&LeafSpec::client(etcd_pki::CLIENT_USER, &[]))
        .unwrap();
    let foreign_tls = etcd_operator_controller::tls::member::ClientTls {
        ca_pem: etcd.client_tls().ca_pem.clone(),
        cert_pem: foreign.cert_pem,
        key_pem: foreign.key_pem,
    };
    assert_refused(
        etcd.endpoint(),
        probe(Some(foreign_tls.options())),
        "TLS with a client certificate of another CA",
    )
    .await;
    // The peer certificate of another CA does not reach the peer port either: peer endpoints
    // answer nothing to a plain client, which is enough here (a single member has no peers).

    // /metrics and /health in plain HTTP on the metrics port, loopback only.
    let (code, text) = plain_get(ports.metrics, "/metrics").await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("etcd_server_has_leader 1"), "{text}");
    let (code, text) = plain_get(ports.metrics, "/health").await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains(r#""health":"true""#), "{text}");
    assert_eq!(etcd.metrics_url(), format!("http://127.0.0.1:{}", ports.metrics));
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("etcd/ports.json")).unwrap()).unwrap();
    assert_eq!(stored["metrics"], ports.metrics);

    // The files: keys 0600 in a 0700 directory.
    let pki_dir = dir.path().join("etcd/pki");
    assert_eq!(mode(&pki_dir), 0o700);
    for base in ["ca", "server", "peer", "client"] {
        assert_eq!(mode(&pki_dir.join(format!("{base}.key"))), 0o600, "{base}.key");
        assert_eq!(mode(&pki_dir.join(format!("{base}.crt"))), 0o644, "{base}.crt");
    }
    drop(client);
    etcd.shutdown().await.unwrap();
}

#[test]
fn the_backing_etcd_certificates_verify_for_loopback_and_their_usage() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = etcd_pki::ensure(dir.path()).unwrap();
    let again = etcd_pki::ensure(dir.path()).unwrap();
    assert_eq!(
        (&pki.ca, &pki.server, &pki.peer, &pki.client),
        (&again.ca, &again.server, &again.peer, &again.client)
    );
    let ca = CertificateAuthority::load(&pki.ca.cert_pem, &pki.ca.key_pem).unwrap();
    let names = [
        ServerName::try_from("localhost").unwrap(),
        ServerName::from(ip("127.0.0.1")),
    ];
    let now = SystemTime::now();
    ca.verify_server(&pki.server.cert_pem, &names, now).unwrap();
    ca.verify_server(&pki.peer.cert_pem, &names, now).unwrap();
    ca.verify_client(&pki.peer.cert_pem, now).unwrap();
    ca.verify_client(&pki.client.cert_pem, now).unwrap();
    // etcd's JSON gateway presents the serving certificate to etcd's own client port.
    ca.verify_client(&pki.server.cert_pem, now).unwrap();
    assert!(
        ca.verify_server(&pki.client.cert_pem, &names, now).is_err(),
        "client only"
    );
    assert!(
        ca.verify_server(&pki.server.cert_pem, &[ServerName::from(ip("10.1.2.3"))], now)
            .is_err(),
        "loopback only"
    );
    // Not the API server's CA: a kubeconfig's certificate is nothing to this etcd.
    let api = pki::ensure(&dir.path().join("api"), ip("127.0.0.1")).unwrap();
    assert_ne!(api.ca, pki.ca);
    assert!(ca.verify_client(&api.admin.cert_pem, now).is_err());
}

#[tokio::test]
async fn expiring_foreign_or_mismatched_backing_etcd_certificates_are_issued_again_at_start() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let etcd = BackingEtcd::start(etcd_options(dir.path())).await.unwrap();
    etcd.connect()
        .await
        .unwrap()
        .put("kept", "1", None)
        .await
        .unwrap();
    etcd.shutdown().await.unwrap();

    let pki_dir = dir.path().join("etcd/pki");
    let pki = etcd_pki::ensure(&pki_dir).unwrap();
    let ca = CertificateAuthority::load(&pki.ca.cert_pem, &pki.ca.key_pem).unwrap();
    let write = |base: &str, pair: &PemPair| {
        std::fs::write(pki_dir.join(format!("{base}.crt")), &pair.cert_pem).unwrap();
        std::fs::write(pki_dir.join(format!("{base}.key")), &pair.key_pem).unwrap();
    };
    // Serving: of the CA, but expiring in 10 days.
    let expiring = ca
        .issue(&LeafSpec {
            validity: Duration::from_secs(10 * 24 * 3600),
            ..LeafSpec::server(etcd_pki::SERVER_NAME, &["localhost"], &[ip("127.0.0.1")])
        })
        .unwrap();
    write("server", &expiring);
    // Client: of another CA.
    let other = CertificateAuthority::generate("another-ca", Duration::from_secs(365 * 24 * 3600)).unwrap();
    let foreign = other
        .issue(&LeafSpec::client(etcd_pki::CLIENT_USER, &[]))
        .unwrap();
    write("client", &foreign);
    // Peer: its certificate with another key.
    let stray = ca.issue(&LeafSpec::client("stray", &[])).unwrap();
    std::fs::write(pki_dir.join("peer.key"), &stray.key_pem).unwrap();

    let etcd = BackingEtcd::start(etcd_options(dir.path())).await.unwrap();
    let got = etcd.connect().await.unwrap().get("kept", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"1");
    let now = etcd_pki::ensure(&pki_dir).unwrap();
    assert_eq!(now.ca, pki.ca, "the CA is kept");
    assert_ne!(now.server.cert_pem, expiring.cert_pem);
    let not_after = etcd_operator_controller::tls::ca::not_after(&now.server.cert_pem).unwrap();
    assert!(not_after > SystemTime::now() + Duration::from_secs(300 * 24 * 3600));
    assert_ne!(now.client.cert_pem, foreign.cert_pem);
    ca.verify_client(&now.client.cert_pem, SystemTime::now()).unwrap();
    assert_ne!(now.peer, pki.peer);
    assert_ne!(now.peer.key_pem, stray.key_pem);
    assert_eq!(mode(&pki_dir.join("server.key")), 0o600);
    etcd.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_broken_ca_of_the_backing_etcd_stops_the_start_and_is_not_replaced() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    BackingEtcd::start(etcd_options(dir.path()))
        .await
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    let pki_dir = dir.path().join("etcd/pki");
    let ca_cert = std::fs::read_to_string(pki_dir.join("ca.crt")).unwrap();
    std::fs::remove_file(pki_dir.join("ca.key")).unwrap();
    let err = BackingEtcd::start(etcd_options(dir.path())).await.unwrap_err();
    let text = etcd_operator_api::report::chain(&err);
    assert!(
        matches!(err, BackingEtcdError::Pki(PkiError::IncompleteCa { .. }))
            && text.contains("backing etcd's certificates")
            && text.contains("ca.key")
            && text.contains("remove"),
        "{text}"
    );
    assert_eq!(std::fs::read_to_string(pki_dir.join("ca.crt")).unwrap(), ca_cert);
    assert!(!pki_dir.join("ca.key").exists());

    // A CA certificate that is no certificate.
    std::fs::write(pki_dir.join("ca.key"), "not a key").unwrap();
    let err = BackingEtcd::start(etcd_options(dir.path())).await.unwrap_err();
    assert!(
        matches!(err, BackingEtcdError::Pki(PkiError::InvalidCa { .. })),
        "{err}"
    );
}

/// The certificate etcd at `endpoint` (`https://127.0.0.1:<port>`) presents to a new TLS
/// connection, as DER: the client verifies it with `tls`'s CA and presents its certificate.
async fn presented_certificate(
    endpoint: &str,
    tls: &etcd_operator_controller::tls::member::ClientTls,
) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(tls.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(tls.cert_pem.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(tls.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    let addr = endpoint.trim_start_matches("https://");
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let conn = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::from(ip("127.0.0.1")), tcp)
        .await
        .unwrap();
    conn.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// Replaces the serving certificate in `pki_dir` by one of the same CA, good in every other way,
/// that expires within 30 days (in 5 days), as a year-old one would; returns the CA and it.
fn write_an_expiring_serving_certificate(pki_dir: &Path) -> (CertificateAuthority, PemPair) {
    let pki = etcd_pki::ensure(pki_dir).unwrap();
    let ca = CertificateAuthority::load(&pki.ca.cert_pem, &pki.ca.key_pem).unwrap();
    let expiring = ca
        .issue(&LeafSpec {
            validity: Duration::from_secs(5 * 24 * 3600),
            usage: etcd_operator_apiserver::pki::LeafUsage::ServerAndClient,
            ..LeafSpec::server(etcd_pki::SERVER_NAME, &["localhost"], &[ip("127.0.0.1")])
        })
        .unwrap();
    std::fs::write(pki_dir.join("server.key"), &expiring.key_pem).unwrap();
    std::fs::write(pki_dir.join("server.crt"), &expiring.cert_pem).unwrap();
    (ca, expiring)
}

#[tokio::test]
async fn the_supervisor_renews_an_expiring_certificate_while_etcd_runs_and_etcd_serves_it() {
    use rustls_pki_types::pem::PemObject;
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut options = etcd_options(dir.path());
    options.certificate_check_interval = Duration::from_millis(200);
    let etcd = BackingEtcd::start(options.clone()).await.unwrap();
    let (pid, endpoint, tls) = (etcd.pid(), etcd.endpoint().to_owned(), etcd.client_tls().clone());
    let supervised = SupervisedEtcd::start(etcd, options);
    let pki_dir = dir.path().join("etcd/pki");
    let (_, expiring) = write_an_expiring_serving_certificate(&pki_dir);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let renewed = loop {
        let now = std::fs::read_to_string(pki_dir.join("server.crt")).unwrap();
        if now != expiring.cert_pem {
            break now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not issued again while etcd runs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let not_after = etcd_operator_controller::tls::ca::not_after(&renewed).unwrap();
    assert!(not_after > SystemTime::now() + Duration::from_secs(300 * 24 * 3600));
    // The same process serves the new certificate to a new connection (a renewal written
    // between its two files may be checked twice: wait for the pair to settle).
    let renewed_der = rustls_pki_types::CertificateDer::from_pem_slice(renewed.as_bytes())
        .unwrap()
        .to_vec();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while presented_certificate(&endpoint, &tls).await != renewed_der {
        assert!(
            std::time::Instant::now() < deadline,
            "etcd still presents another certificate"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(supervised.pid(), Some(pid), "etcd was restarted");
    let mut client = supervised.connect().await.unwrap();
    assert_eq!(
        put_and_get(&mut client, "/registry/renewed").await.unwrap(),
        b"value"
    );
    supervised.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_restart_by_the_supervisor_checks_the_certificates_again() {
    etcd_operator_apiserver::serve::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let options = etcd_options(dir.path());
    let etcd = BackingEtcd::start(options.clone()).await.unwrap();
    let supervised = SupervisedEtcd::start(etcd, options);
    let mut state = supervised.state();
    let pid = supervised.pid().unwrap();
    let pki_dir = dir.path().join("etcd/pki");
    let (ca, expiring) = write_an_expiring_serving_certificate(&pki_dir);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert_eq!(
        next_state(&mut state, Duration::from_secs(5)).await,
        EtcdState::Down
    );
    let EtcdState::Running { pid: new_pid } = next_state(&mut state, Duration::from_secs(60)).await else {
        panic!("not restarted");
    };
    assert_ne!(new_pid, pid);
    let renewed = std::fs::read_to_string(pki_dir.join("server.crt")).unwrap();
    assert_ne!(renewed, expiring.cert_pem, "the expiring certificate was kept");
    ca.verify_server(&renewed, &[ServerName::from(ip("127.0.0.1"))], SystemTime::now())
        .unwrap();
    // The client certificate of the first start still opens it.
    supervised.connect().await.unwrap().status().await.unwrap();
    supervised.shutdown().await.unwrap();
}

/// Starts etcd as the releases before TLS did (plain HTTP on both planes, the same flags) in
/// `DIR/etcd/data`, with their `ports.json`, and puts a key; returns the ports.
async fn plain_state_dir_of_an_earlier_release(state: &Path) -> (u16, u16) {
    let etcd_dir = state.join("etcd");
    std::fs::create_dir_all(&etcd_dir).unwrap();
    let etcd_dir = std::fs::canonicalize(&etcd_dir).unwrap();
    let ports = etcd_operator_tests::ports::free_ports(2).unwrap();
    let (client_port, peer_port) = (ports[0], ports[1]);
    std::fs::write(
        etcd_dir.join("ports.json"),
        format!(r#"{{"client":{client_port},"peer":{peer_port}}}"#),
    )
    .unwrap();
    let endpoint = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = std::process::Command::new(etcd_binary());
    cmd.arg("--name=backing")
        .arg(format!("--data-dir={}", etcd_dir.join("data").display()))
        .arg(format!("--listen-client-urls={endpoint}"))
        .arg(format!("--advertise-client-urls={endpoint}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=backing={peer}"))
        .arg("--initial-cluster-state=new")
        .arg("--initial-cluster-token=etcd-operator-local");
    let mut old =
        etcd_operator_tests::TestProcess::spawn("plain etcd", cmd, &state.join("plain.log")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut client) = etcd_client::Client::connect([endpoint.as_str()], Some(probe(None))).await
            && client
                .put(
                    "/registry/etcd.operator.dev/etcdclusters/default/old",
                    "kept",
                    None,
                )
                .await
                .is_ok()
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", old.log_tail(2000));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while old.exited().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the plain etcd did not stop"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (client_port, peer_port)
}

#[tokio::test]
async fn a_plain_http_state_dir_of_an_earlier_release_is_upgraded_to_tls_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (client_port, peer_port) = plain_state_dir_of_an_earlier_release(&state).await;
    let options = LocalOptions {
        state_dir: state.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        etcd_binary: None,
    };
    let env = prepare_with_etcd_env(options.clone(), owner_env()).await.unwrap();
    // The same ports, a metrics port added.
    assert_eq!(
        env.backing_etcd.endpoint(),
        format!("https://127.0.0.1:{client_port}")
    );
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("etcd/ports.json")).unwrap()).unwrap();
    assert_eq!(stored["client"], client_port);
    assert_eq!(stored["peer"], peer_port);
    let metrics = u16::try_from(stored["metrics"].as_u64().unwrap()).unwrap();
    assert!(metrics != 0 && metrics != client_port && metrics != peer_port);
    // The data, through the storage's TLS client.
    let mut client = env.etcd_client.clone();
    let got = client
        .get("/registry/etcd.operator.dev/etcdclusters/default/old", None)
        .await
        .unwrap();
    assert_eq!(got.kvs()[0].value(), b"kept");
    // The member's peer URL in the data is brought to https.
    let members = client.member_list().await.unwrap();
    assert_eq!(members.members().len(), 1);
    assert_eq!(
        members.members()[0].peer_urls(),
        [format!("https://127.0.0.1:{peer_port}")]
    );
    assert_eq!(
        members.members()[0].client_urls(),
        [format!("https://127.0.0.1:{client_port}")]
    );
    // Plain HTTP is refused now.
    assert_refused(
        &format!("http://127.0.0.1:{client_port}"),
        probe(None),
        "plain gRPC after the upgrade",
    )
    .await;
    let log = std::fs::read_to_string(state.join("etcd/etcd.log")).unwrap_or_default();
    drop(client);
    env.backing_etcd.shutdown().await.unwrap();

    // And it starts again as any TLS state dir (nothing left to update).
    let env = prepare_with_etcd_env(options, owner_env()).await.unwrap();
    let got = env
        .etcd_client
        .clone()
        .get("/registry/etcd.operator.dev/etcdclusters/default/old", None)
        .await
        .unwrap();
    assert_eq!(got.kvs()[0].value(), b"kept", "etcd log:\n{log}");
    env.backing_etcd.shutdown().await.unwrap();
}
