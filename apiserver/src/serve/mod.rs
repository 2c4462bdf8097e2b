//! HTTPS serving: rustls (client certificates requested, not required), HTTP/1.1 and HTTP/2.
//!
//! Used by both modes: local mode builds its [`tls::server_config`] from its own CA, cluster mode
//! from the mounted serving certificate and the client CAs of the aggregation layer. The accept
//! loop in [`server`] hands each request the verified client chain ([`PeerCertificates`]) and the
//! peer address ([`RemoteAddr`]) as request extensions, for the authentication layer;
//! [`in_process`] gives the co-located controller's requests the same extensions without a socket.

pub mod auth;
pub mod in_process;
pub mod server;
pub mod tls;

pub use auth::{AUTHENTICATED_GROUP, UserInfo};
pub use in_process::InProcess;
pub use server::{
    ConnectionUser, PeerCertificates, RemoteAddr, ServeError, ServeOptions, serve, serve_with,
    shutdown_signal,
};
pub use tls::{ReloadableTls, TlsError, install_crypto_provider, server_config};

#[cfg(test)]
mod tests;
