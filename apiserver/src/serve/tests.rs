//! Tests of the HTTPS server over real loopback TLS: ALPN, client certificates, TLS 1.2,
//! streaming, shutdown, configuration reload.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

use super::*;
use crate::pki::{CertificateAuthority, LeafSpec, PemPair};

struct Pki {
    ca: CertificateAuthority,
    server: PemPair,
    alice: PemPair,
    other_ca_client: PemPair,
}

fn pki() -> Pki {
    let ca = CertificateAuthority::generate("test-ca", Duration::from_secs(86_400 * 30)).unwrap();
    let server = ca
        .issue(&LeafSpec::server(
            "server",
            &["localhost"],
            &["127.0.0.1".parse().unwrap()],
        ))
        .unwrap();
    let alice = ca.issue(&LeafSpec::client("alice", &["devs"])).unwrap();
    let other = CertificateAuthority::generate("other-ca", Duration::from_secs(86_400 * 30)).unwrap();
    let other_ca_client = other
        .issue(&LeafSpec::client("mallory", &["system:masters"]))
        .unwrap();
    Pki {
        ca,
        server,
        alice,
        other_ca_client,
    }
}

/// What the `/whoami` handler saw.
fn whoami(request: Request) -> String {
    let peer = request.extensions().get::<PeerCertificates>().cloned();
    let remote = request.extensions().get::<RemoteAddr>().copied();
    let user = peer
        .as_ref()
        .and_then(|p| p.leaf())
        .map(|leaf| auth::user_from_client_certificate(leaf).unwrap());
    format!(
        "version={:?} certs={} user={} groups={} remote={}",
        request.version(),
        peer.map(|p| p.0.len().to_string())
            .unwrap_or_else(|| "missing".into()),
        user.as_ref().map(|u| u.name.as_str()).unwrap_or("-"),
        user.as_ref().map(|u| u.groups.join(",")).unwrap_or_default(),
        remote
            .map(|r| r.0.ip().to_string())
            .unwrap_or_else(|| "missing".into()),
    )
}

fn app(gate: Arc<Notify>) -> Router {
    Router::new()
        .route("/whoami", get(|request: Request| async move { whoami(request) }))
        .route(
            "/stream",
            get(move || {
                let gate = gate.clone();
                async move {
                    let chunks = futures::stream::unfold(0u8, move |step| {
                        let gate = gate.clone();
                        async move {
                            match step {
                                0 => Some((Ok::<_, std::io::Error>(Bytes::from_static(b"first\n")), 1)),
                                1 => {
                                    gate.notified().await;
                                    Some((Ok(Bytes::from_static(b"second\n")), 2))
                                }
                                _ => None,
                            }
                        }
                    });
                    Body::from_stream(chunks)
                }
            }),
        )
}

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
    gate: Arc<Notify>,
    tls: ReloadableTls,
}

impl Server {
    async fn stop(mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("serve ends after shutdown")
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(pki: &Pki, client_ca: bool, options: ServeOptions) -> Server {
    install_crypto_provider();
    let config = server_config(
        pki.server.cert_pem.as_bytes(),
        pki.server.key_pem.as_bytes(),
        client_ca.then_some(pki.ca.pem().cert_pem.as_bytes()),
    )
    .unwrap();
    let tls = ReloadableTls::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gate = Arc::new(Notify::new());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_with(
        listener,
        tls.clone(),
        app(gate.clone()),
        async move {
            let _ = stopped.await;
        },
        options,
    ));
    Server {
        addr,
        stop: Some(stop),
        task,
        gate,
        tls,
    }
}

fn client_config(
    ca_pem: &str,
    versions: &[&'static SupportedProtocolVersion],
    alpn: &[&[u8]],
    identity: Option<&PemPair>,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let builder = ClientConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(pair) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(pair.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A TLS connection speaking HTTP/2 or HTTP/1.1 as negotiated.
enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

struct Connected {
    conn: Conn,
    alpn: Option<Vec<u8>>,
    version: Option<rustls::ProtocolVersion>,
}

async fn connect(addr: SocketAddr, config: Arc<ClientConfig>) -> Result<Connected, BoxError> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let version = tls.get_ref().1.protocol_version();
    let io = TokioIo::new(tls);
    let conn = if alpn.as_deref() == Some(b"h2") {
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        Conn::H2(send)
    } else {
        let (send, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        Conn::H1(send)
    };
    Ok(Connected { conn, alpn, version })
}

impl Connected {
    async fn get(&mut self, path: &str) -> Result<http::Response<hyper::body::Incoming>, BoxError> {
        Ok(match &mut self.conn {
            Conn::H2(send) => {
                let request = http::Request::get(format!("https://localhost{path}")).body(Empty::new())?;
                send.send_request(request).await?
            }
            Conn::H1(send) => {
                let request = http::Request::get(path)
                    .header(http::header::HOST, "localhost")
                    .body(Empty::new())?;
                send.send_request(request).await?
            }
        })
    }
}

async fn get_text(addr: SocketAddr, config: Arc<ClientConfig>, path: &str) -> Result<String, BoxError> {
    let mut conn = connect(addr, config).await?;
    let response = conn.get(path).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let text = String::from_utf8(body.to_vec())?;
    if status != http::StatusCode::OK {
        return Err(format!("status {status}: {text}").into());
    }
    Ok(text)
}

/// An error with all its sources.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

const BOTH: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13, &rustls::version::TLS12];

#[tokio::test]
async fn serves_http2_and_http1_as_negotiated_by_alpn() {
    let pki = pki();
    let server = start(&pki, true, ServeOptions::default()).await;
    let ca = &pki.ca.pem().cert_pem;

    let mut h2 = connect(server.addr, client_config(ca, BOTH, &[b"h2", b"http/1.1"], None))
        .await
        .unwrap();
    assert_eq!(h2.alpn.as_deref(), Some(&b"h2"[..]));
    let response = h2.get("/whoami").await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"version=HTTP/2.0 "), "{body:?}");

    let mut h1 = connect(server.addr, client_config(ca, BOTH, &[b"http/1.1"], None))
        .await
        .unwrap();
    assert_eq!(h1.alpn.as_deref(), Some(&b"http/1.1"[..]));
    let response = h1.get("/whoami").await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_11);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"version=HTTP/1.1 "), "{body:?}");
    // Keep-alive: a second request on the same HTTP/1.1 connection.
    let response = h1.get("/whoami").await.unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);

    server.stop().await.unwrap();
}

#[tokio::test]
async fn client_without_certificate_is_served_with_empty_peer_certificates() {
    let pki = pki();
    let server = start(&pki, true, ServeOptions::default()).await;
    let text = get_text(
        server.addr,
        client_config(&pki.ca.pem().cert_pem, BOTH, &[b"h2"], None),
        "/whoami",
    )
    .await
    .unwrap();
    assert_eq!(text, "version=HTTP/2.0 certs=0 user=- groups= remote=127.0.0.1");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn client_certificate_from_the_ca_reaches_the_handler() {
    let pki = pki();
    let server = start(&pki, true, ServeOptions::default()).await;
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let text = get_text(
            server.addr,
            client_config(&pki.ca.pem().cert_pem, BOTH, &[alpn], Some(&pki.alice)),
            "/whoami",
        )
        .await
        .unwrap();
        assert!(
            text.ends_with("certs=1 user=alice groups=devs,system:authenticated remote=127.0.0.1"),
            "{text}"
        );
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn client_certificate_from_another_ca_fails_the_handshake() {
    let pki = pki();
    let server = start(&pki, true, ServeOptions::default()).await;
    let ca = &pki.ca.pem().cert_pem;
    for versions in [&[&rustls::version::TLS13][..], &[&rustls::version::TLS12][..]] {
        // With TLS 1.3 the client finishes its side before the server rejects the certificate:
        // the failure shows on the first request instead of at connect.
        let result = get_text(
            server.addr,
            client_config(ca, versions, &[b"h2"], Some(&pki.other_ca_client)),
            "/whoami",
        )
        .await;
        let error = error_chain(&*result.expect_err("a certificate from another CA is refused"));
        assert!(
            error.contains("received fatal alert: UnknownCA"),
            "{versions:?}: {error}"
        );
    }
    // The server goes on serving others.
    let text = get_text(server.addr, client_config(ca, BOTH, &[b"h2"], None), "/whoami")
        .await
        .unwrap();
    assert!(text.contains("certs=0"), "{text}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn without_a_client_ca_no_certificate_is_requested() {
    let pki = pki();
    let server = start(&pki, false, ServeOptions::default()).await;
    // rustls clients send their certificate only when asked.
    let text = get_text(
        server.addr,
        client_config(&pki.ca.pem().cert_pem, BOTH, &[b"h2"], Some(&pki.alice)),
        "/whoami",
    )
    .await
    .unwrap();
    assert!(text.contains("certs=0 user=-"), "{text}");
    let error = pki
        .ca
        .issue(&LeafSpec::client("bob", &["a", "b"]))
        .expect_err("rcgen cannot put two organizations in a subject");
    assert!(
        error.to_string().contains("more than one organization"),
        "{error}"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn tls_1_2_is_served() {
    let pki = pki();
    let server = start(&pki, true, ServeOptions::default()).await;
    let config = client_config(
        &pki.ca.pem().cert_pem,
        &[&rustls::version::TLS12],
        &[b"h2", b"http/1.1"],
        Some(&pki.alice),
    );
    let mut conn = connect(server.addr, config).await.unwrap();
    assert_eq!(conn.version, Some(rustls::ProtocolVersion::TLSv1_2));
    let response = conn.get("/whoami").await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("user=alice"), "{body:?}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn streaming_response_arrives_incrementally_over_both_protocols() {
    let pki = pki();
    let server = start(&pki, true, ServeOptions::default()).await;
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let mut conn = connect(
            server.addr,
            client_config(&pki.ca.pem().cert_pem, BOTH, &[alpn], None),
        )
        .await
        .unwrap();
        let response = conn.get("/stream").await.unwrap();
        if alpn == b"http/1.1" {
            assert_eq!(
                response.headers().get(http::header::TRANSFER_ENCODING).unwrap(),
                "chunked"
            );
        }
        let mut body = response.into_body();
        // The first chunk arrives while the handler still holds the second back.
        let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("first chunk before the stream ends")
            .unwrap()
            .unwrap();
        assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"first\n"));
        server.gate.notify_one();
        let rest = tokio::time::timeout(Duration::from_secs(5), body.collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes();
        assert_eq!(rest, Bytes::from_static(b"second\n"));
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_ends_the_loop_with_idle_connections_open() {
    let pki = pki();
    let server = start(&pki, true, ServeOptions::default()).await;
    let ca = pki.ca.pem().cert_pem.clone();
    let mut h1 = connect(server.addr, client_config(&ca, BOTH, &[b"http/1.1"], None))
        .await
        .unwrap();
    h1.get("/whoami")
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap();
    let mut h2 = connect(server.addr, client_config(&ca, BOTH, &[b"h2"], None))
        .await
        .unwrap();
    h2.get("/whoami")
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap();
    let addr = server.addr;
    let started = std::time::Instant::now();
    server.stop().await.unwrap();
    // Idle connections close at once; nothing waits for the drain timeout.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn shutdown_drops_streams_still_open_after_the_drain_timeout() {
    let pki = pki();
    let options = ServeOptions {
        drain_timeout: Duration::from_millis(300),
        ..ServeOptions::default()
    };
    let server = start(&pki, true, options).await;
    let mut conn = connect(
        server.addr,
        client_config(&pki.ca.pem().cert_pem, BOTH, &[b"h2"], None),
    )
    .await
    .unwrap();
    let mut body = conn.get("/stream").await.unwrap().into_body();
    body.frame().await.unwrap().unwrap();
    // The stream never gets its second chunk: only the drain timeout ends it.
    let started = std::time::Instant::now();
    server.stop().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let end = tokio::time::timeout(Duration::from_secs(5), body.collect())
        .await
        .unwrap();
    assert!(end.is_err(), "the cut stream ends with an error, not a clean end");
}

#[tokio::test]
async fn replaced_tls_configuration_applies_to_new_connections() {
    let pki = pki();
    let server = start(&pki, true, ServeOptions::default()).await;
    let new_ca = CertificateAuthority::generate("rotated-ca", Duration::from_secs(86_400)).unwrap();
    let new_server = new_ca
        .issue(&LeafSpec::server("server", &["localhost"], &[]))
        .unwrap();
    server.tls.replace(Arc::new(
        server_config(
            new_server.cert_pem.as_bytes(),
            new_server.key_pem.as_bytes(),
            Some(new_ca.pem().cert_pem.as_bytes()),
        )
        .unwrap(),
    ));
    // Clients trusting only the old CA now fail; those trusting the new one succeed.
    let old = get_text(
        server.addr,
        client_config(&pki.ca.pem().cert_pem, BOTH, &[b"h2"], None),
        "/whoami",
    )
    .await;
    assert!(old.is_err());
    let new = get_text(
        server.addr,
        client_config(&new_ca.pem().cert_pem, BOTH, &[b"h2"], None),
        "/whoami",
    )
    .await
    .unwrap();
    assert!(new.contains("certs=0"), "{new}");
    server.stop().await.unwrap();
}

#[test]
fn server_config_reports_bad_input() {
    install_crypto_provider();
    let pki = pki();
    let cert = pki.server.cert_pem.as_bytes();
    let key = pki.server.key_pem.as_bytes();
    assert!(matches!(
        server_config(b"not pem", key, None),
        Err(TlsError::EmptyCertificateChain)
    ));
    assert!(matches!(
        server_config(cert, b"not pem", None),
        Err(TlsError::ParsePrivateKey(_))
    ));
    assert!(matches!(
        server_config(cert, pki.alice.key_pem.as_bytes(), None),
        Err(TlsError::CertifiedKey(_))
    ));
    assert!(matches!(
        server_config(cert, key, Some(b"")),
        Err(TlsError::EmptyClientCa)
    ));
    let config = server_config(cert, key, Some(pki.ca.pem().cert_pem.as_bytes())).unwrap();
    assert_eq!(config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
}

#[test]
fn install_crypto_provider_is_idempotent() {
    install_crypto_provider();
    install_crypto_provider();
    assert!(rustls::crypto::CryptoProvider::get_default().is_some());
}

#[test]
fn user_from_certificate_maps_cn_and_organizations() {
    let pki = pki();
    let der = CertificateDer::from_pem_slice(pki.alice.cert_pem.as_bytes()).unwrap();
    let user = auth::user_from_client_certificate(&der).unwrap();
    assert_eq!(
        user,
        UserInfo {
            name: "alice".into(),
            uid: None,
            groups: vec!["devs".into(), AUTHENTICATED_GROUP.into()],
            extra: Default::default(),
        }
    );
}
