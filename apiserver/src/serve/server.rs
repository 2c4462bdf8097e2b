//! The HTTPS accept loop: tokio-rustls handshakes, HTTP/1.1 and HTTP/2 through hyper-util's
//! auto builder, graceful shutdown with a bounded drain.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use rustls_pki_types::CertificateDer;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tower::ServiceExt;

use super::tls::ReloadableTls;

/// The client certificate chain the peer presented and rustls verified, leaf first; empty when the
/// client sent none. Put on every request as an extension.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

impl PeerCertificates {
    /// The client's own certificate, if it presented one.
    pub fn leaf(&self) -> Option<&CertificateDer<'static>> {
        self.0.first()
    }

    /// Whether the client presented no certificate.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What local-mode authentication derived from a connection's client certificate, worked out on
/// the connection's first request and kept for its others (parsing the certificate is a
/// noticeable share of a small request's CPU). Put on every request of a connection as an
/// extension; a TLS connection's certificate cannot change (rustls does no renegotiation).
#[derive(Debug, Clone, Default)]
pub struct ConnectionUser(pub Arc<std::sync::OnceLock<Option<super::UserInfo>>>);

/// The TCP peer address of the connection a request came on. Put on every request as an extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr(pub SocketAddr);

/// Tuning of the accept loop.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How long a client may take to complete the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long an HTTP/1.1 client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// After shutdown is signalled, how long open connections (in-flight requests, watches) may
    /// take to finish before they are dropped.
    pub drain_timeout: Duration,
    /// HTTP/2 streams one connection may have open at once (kube-apiserver: 250 per client by Go's
    /// default; watches each hold one).
    pub max_concurrent_streams: u32,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(10),
            max_concurrent_streams: 1000,
        }
    }
}

/// Serving failed as a whole (failures of single connections are only logged).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listener's own address could not be read.
    #[error("read listener address")]
    LocalAddr(#[source] std::io::Error),
    /// Accepting connections failed with an error that retrying cannot fix.
    #[error("accept connection on {addr}")]
    Accept {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Serves `app` over HTTPS on `listener` until `shutdown` completes, with [`ServeOptions::default`].
///
/// See [`serve_with`].
pub async fn serve(
    listener: TcpListener,
    tls: impl Into<ReloadableTls>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    serve_with(listener, tls, app, shutdown, ServeOptions::default()).await
}

/// Serves `app` over HTTPS on `listener` until `shutdown` completes.
///
/// Each connection is a TLS handshake (with the configuration current in `tls` at accept time),
/// then HTTP/2 or HTTP/1.1 as the client speaks (ALPN offers both). Each request carries the
/// [`PeerCertificates`] and [`RemoteAddr`] extensions. A connection that fails its handshake is
/// logged at debug level and dropped; the loop goes on.
///
/// On shutdown the listener closes at once, every connection is asked to finish (HTTP/2 GOAWAY;
/// HTTP/1.1 closes after the request in flight), and after [`ServeOptions::drain_timeout`] the
/// connections still open (long watches) are dropped. Returns when all are gone.
pub async fn serve_with(
    listener: TcpListener,
    tls: impl Into<ReloadableTls>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
    options: ServeOptions,
) -> Result<(), ServeError> {
    let tls = tls.into();
    let addr = listener.local_addr().map_err(ServeError::LocalAddr)?;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.max_concurrent_streams);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    tracing::info!(%addr, "serving HTTPS");

    let mut shutdown = std::pin::pin!(shutdown);
    let result = loop {
        tokio::select! {
            () = &mut shutdown => break Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((tcp, remote)) => {
                    connections.spawn(connection(
                        tcp,
                        remote,
                        tls.current(),
                        app.clone(),
                        builder.clone(),
                        graceful.watcher(),
                        options.handshake_timeout,
                    ));
                }
                Err(source) if is_transient_accept_error(&source) => {
                    tracing::warn!(%addr, error = %etcd_operator_api::report::Chain(&source), "accept connection failed; retrying");
                    // Out of file descriptors or memory: give closing connections a moment.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(source) => break Err(ServeError::Accept { addr, source }),
            },
            Some(finished) = connections.join_next() => log_task_end(finished),
        }
    };
    drop(listener);

    let open = graceful.count();
    tracing::info!(%addr, open_connections = open, "shutting down: draining connections");
    if tokio::time::timeout(options.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            %addr,
            timeout = ?options.drain_timeout,
            "connections still open after the drain timeout; closing them"
        );
    }
    connections.abort_all();
    while let Some(finished) = connections.join_next().await {
        log_task_end(finished);
    }
    tracing::info!(%addr, "HTTPS server stopped");
    result
}

/// One connection: handshake, then HTTP until the client leaves or shutdown drains it.
async fn connection(
    tcp: TcpStream,
    remote: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    watcher: Watcher,
    handshake_timeout: Duration,
) {
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::debug!(%remote, error = %etcd_operator_api::report::Chain(&error), "set TCP_NODELAY");
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            tracing::debug!(%remote, error = %etcd_operator_api::report::Chain(&error), "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%remote, timeout = ?handshake_timeout, "TLS handshake timed out");
            return;
        }
    };
    let (_, session) = stream.get_ref();
    let peer = PeerCertificates(Arc::new(
        session
            .peer_certificates()
            .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default(),
    ));
    tracing::trace!(
        %remote,
        alpn = ?session.alpn_protocol().map(String::from_utf8_lossy),
        client_certificate = !peer.is_empty(),
        "TLS connection established"
    );
    let remote_addr = RemoteAddr(remote);
    let user = ConnectionUser::default();
    let service = hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(peer.clone());
        request.extensions_mut().insert(user.clone());
        request.extensions_mut().insert(remote_addr);
        app.clone().oneshot(request)
    });
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .into_owned();
    if let Err(error) = watcher.watch(conn).await {
        tracing::debug!(%remote, error = %etcd_operator_api::report::Chain(&*error), "connection ended with an error");
    }
}

fn log_task_end(finished: Result<(), tokio::task::JoinError>) {
    if let Err(error) = finished
        && error.is_panic()
    {
        tracing::error!(error = %etcd_operator_api::report::Chain(&error), "connection task panicked");
    }
}

/// Accept errors that concern one connection or a temporary shortage, not the listener.
fn is_transient_accept_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionRefused
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
            | ErrorKind::TimedOut
            | ErrorKind::OutOfMemory
    ) || matches!(
        error.raw_os_error(),
        // EMFILE, ENFILE, ENOBUFS, ENOMEM, EPROTO, EPERM (firewall) on Linux.
        Some(24 | 23 | 105 | 12 | 71 | 1)
    )
}

/// Completes on SIGINT or SIGTERM: the shutdown future for [`serve`] in both modes.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let terminate = async {
        match signal(SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(error) => {
                tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "install SIGTERM handler; only SIGINT stops the server");
                std::future::pending::<()>().await;
            }
        }
    };
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "install SIGINT handler; only SIGTERM stops the server");
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = terminate => tracing::info!("SIGTERM received"),
        () = interrupt => tracing::info!("SIGINT received"),
    }
}
