//! A fault-injecting TCP proxy, as etcd's robustness tests put between members' peer ports: it
//! forwards both directions, and can be switched at any time to drop the bytes silently while
//! keeping every connection open (a blackhole: the far side sees a silent peer, not a closed
//! one) or to delay each chunk.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::RobustnessError;

/// What the proxy does with the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward them.
    Pass,
    /// Read and drop them; connections stay open and new ones are accepted.
    Blackhole,
    /// Forward each chunk after this long (order kept per direction).
    Delay(Duration),
}

/// A running proxy; dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    listen: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `listen` (port 0: any free port) and forwards to `upstream`.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> Result<Self, RobustnessError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| RobustnessError::Proxy {
                what: "listen",
                source,
            })?;
        let listen = listener.local_addr().map_err(|source| RobustnessError::Proxy {
            what: "listen",
            source,
        })?;
        let (mode, watcher) = watch::channel(Mode::Pass);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let watcher = watcher.clone();
                connections.spawn(async move {
                    // The upstream refusing is what the client would see without the proxy: close.
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    let there = pump(in_read, out_write, watcher.clone());
                    let back = pump(out_read, in_write, watcher);
                    // Either side closing ends the connection.
                    tokio::select! {
                        _ = there => {}
                        _ = back => {}
                    }
                });
            }
        });
        Ok(Self { listen, mode, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Switches what it does with bytes from now on (also on open connections).
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection.
        self.task.abort();
    }
}

/// Copies one direction, obeying the mode at the time each chunk arrives.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let current = *mode.borrow();
        match current {
            Mode::Pass => {}
            Mode::Blackhole => continue,
            Mode::Delay(d) => tokio::time::sleep(d).await,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An upstream that echoes every byte back.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// Sends `msg` and waits up to `wait` for it to come back.
    async fn round_trip(s: &mut TcpStream, msg: &[u8], wait: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        match tokio::time::timeout(wait, s.read_exact(&mut got)).await {
            Ok(Ok(_)) => Some(got),
            _ => None,
        }
    }

    #[tokio::test]
    async fn passes_then_blackholes_keeping_the_connection_then_passes_again() {
        let proxy = FaultProxy::start("127.0.0.1:0".parse().unwrap(), echo().await)
            .await
            .unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let wait = Duration::from_secs(2);
        assert_eq!(
            round_trip(&mut s, b"one", wait).await.as_deref(),
            Some(&b"one"[..])
        );

        proxy.set(Mode::Blackhole);
        assert_eq!(proxy.mode(), Mode::Blackhole);
        assert_eq!(
            round_trip(&mut s, b"lost", Duration::from_millis(300)).await,
            None,
            "bytes went through a blackhole"
        );
        // A new connection is accepted, and silent too.
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            round_trip(&mut fresh, b"new", Duration::from_millis(300)).await,
            None
        );

        proxy.set(Mode::Pass);
        // The same connection carries bytes again (what was dropped stays dropped).
        assert_eq!(
            round_trip(&mut s, b"two", wait).await.as_deref(),
            Some(&b"two"[..])
        );
    }

    #[tokio::test]
    async fn delays_each_chunk() {
        let proxy = FaultProxy::start("127.0.0.1:0".parse().unwrap(), echo().await)
            .await
            .unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set(Mode::Delay(Duration::from_millis(200)));
        let began = Instant::now();
        assert!(
            round_trip(&mut s, b"slow", Duration::from_secs(3))
                .await
                .is_some()
        );
        // Delayed once each way.
        assert!(
            began.elapsed() >= Duration::from_millis(400),
            "{:?}",
            began.elapsed()
        );
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_its_connections() {
        let proxy = FaultProxy::start("127.0.0.1:0".parse().unwrap(), echo().await)
            .await
            .unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(round_trip(&mut s, b"x", Duration::from_secs(2)).await.is_some());
        drop(proxy);
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "still open: {read:?}");
    }
}
