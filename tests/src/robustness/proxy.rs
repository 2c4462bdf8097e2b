//! A fault-injecting TCP proxy, as etcd's robustness tests put between members' peer ports: it
//! forwards both directions, and can be switched at any time to drop the bytes silently while
//! keeping every connection open (a blackhole: the far side sees a silent peer, not a closed
//! one) or to delay each chunk.
//!
//! It can also stall (hold every byte, forward nothing, keep the connection, deliver what it held
//! once released: what TCP shows of a partition that heals before its connections time out) the
//! whole proxy, or only the connections a given member opened: etcd's peer requests name their
//! sender in an `X-Server-From` header (plain HTTP on the peer plane), which the proxy reads from
//! each connection's first request. A member reaches its peers on connections it opens to their
//! proxies as well as on those they open to its own, so isolating it takes both.
//!
//! Stalling, not dropping, is what isolation uses: dropping bytes in the middle of a stream that
//! then carries on cannot happen on a real network (TCP delivers in order or breaks the
//! connection), and etcd may read garbage from such a stream.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
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
    /// Hold them: nothing more is read or forwarded until the mode changes, then everything
    /// held is delivered; connections stay open and new ones are accepted.
    Stall,
    /// Forward each chunk after this long (order kept per direction).
    Delay(Duration),
}

/// A running proxy; dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    listen: SocketAddr,
    mode: watch::Sender<Mode>,
    blocked: watch::Sender<BTreeSet<String>>,
    task: tokio::task::JoinHandle<()>,
}

/// What each connection obeys.
#[derive(Debug, Clone)]
struct Control {
    mode: watch::Receiver<Mode>,
    blocked: watch::Receiver<BTreeSet<String>>,
    /// The sender named by the connection's first request (empty when none), once read.
    source: Arc<OnceLock<String>>,
}

impl Control {
    /// What to do with a chunk now: a connection of a blocked sender stalls.
    fn decide(&self) -> Mode {
        let blocked = self
            .source
            .get()
            .is_some_and(|s| !s.is_empty() && self.blocked.borrow().contains(s));
        if blocked { Mode::Stall } else { *self.mode.borrow() }
    }
}

/// The value of the `X-Server-From` header in an HTTP request head, or "" when it has none.
fn sender_of(head: &[u8]) -> String {
    let text = String::from_utf8_lossy(head);
    text.split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("x-server-from"))
        .map(|(_, value)| value.trim().to_string())
        .unwrap_or_default()
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
        let (mode, mode_rx) = watch::channel(Mode::Pass);
        let (blocked, blocked_rx) = watch::channel(BTreeSet::new());
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let control = Control {
                    mode: mode_rx.clone(),
                    blocked: blocked_rx.clone(),
                    source: Arc::default(),
                };
                connections.spawn(async move {
                    // The upstream refusing is what the client would see without the proxy: close.
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    let there = pump(in_read, out_write, control.clone(), true);
                    let back = pump(out_read, in_write, control, false);
                    // Either side closing ends the connection.
                    tokio::select! {
                        _ = there => {}
                        _ = back => {}
                    }
                });
            }
        });
        Ok(Self {
            listen,
            mode,
            blocked,
            task,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Switches what it does with bytes from now on (also on open connections).
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Stalls (from now on, also on open connections) the connections whose first request names
    /// one of `senders` in `X-Server-From`; an empty set releases them.
    pub fn block_senders(&self, senders: BTreeSet<String>) {
        self.blocked.send_replace(senders);
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

/// Copies one direction, obeying the mode at the time each chunk arrives; the direction away
/// from the connecting side (`first_request`) reads the sender from the first request's head.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut control: Control,
    first_request: bool,
) {
    const HEAD_LIMIT: usize = 16 * 1024;
    let mut buf = vec![0u8; 16 * 1024];
    let mut head = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if first_request && control.source.get().is_none() {
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.len() > HEAD_LIMIT {
                let _ = control.source.set(sender_of(&head));
                head = Vec::new();
            }
        }
        // Held here while stalled: nothing more is read, so the sender's buffers fill.
        loop {
            match control.decide() {
                Mode::Stall => {
                    tokio::select! {
                        changed = control.mode.changed() => if changed.is_err() { return },
                        changed = control.blocked.changed() => if changed.is_err() { return },
                    }
                }
                Mode::Blackhole => break,
                Mode::Pass => break,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
            }
        }
        if control.decide() == Mode::Blackhole {
            continue;
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

    #[test]
    fn the_sender_is_read_from_the_request_head() {
        let head =
            b"GET /raft/stream/message/2 HTTP/1.1\r\nHost: x\r\nx-server-from: 8e9e05c52164694d\r\n\r\n";
        assert_eq!(sender_of(head), "8e9e05c52164694d");
        assert_eq!(sender_of(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "");
    }

    #[tokio::test]
    async fn a_stall_holds_the_bytes_and_delivers_them_once_released() {
        let proxy = FaultProxy::start("127.0.0.1:0".parse().unwrap(), echo().await)
            .await
            .unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let wait = Duration::from_secs(2);
        assert!(round_trip(&mut s, b"one", wait).await.is_some());
        proxy.set(Mode::Stall);
        assert_eq!(
            round_trip(&mut s, b"held", Duration::from_millis(300)).await,
            None
        );
        proxy.set(Mode::Pass);
        // What was held comes first, then what follows: nothing lost, nothing reordered.
        assert_eq!(
            round_trip(&mut s, b"next", wait).await.as_deref(),
            Some(&b"held"[..])
        );
        let mut rest = [0u8; 4];
        tokio::time::timeout(wait, s.read_exact(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&rest, b"next");
    }

    #[tokio::test]
    async fn stalls_only_the_connections_of_a_blocked_sender() {
        let proxy = FaultProxy::start("127.0.0.1:0".parse().unwrap(), echo().await)
            .await
            .unwrap();
        let wait = Duration::from_secs(2);
        let hello = |from: &str| format!("POST /raft HTTP/1.1\r\nX-Server-From: {from}\r\n\r\n").into_bytes();
        let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(round_trip(&mut a, &hello("aaa"), wait).await.is_some());
        assert!(round_trip(&mut b, &hello("bbb"), wait).await.is_some());

        proxy.block_senders(["aaa".to_string()].into());
        assert_eq!(
            round_trip(&mut a, b"more", Duration::from_millis(300)).await,
            None
        );
        assert!(
            round_trip(&mut b, b"more", wait).await.is_some(),
            "another sender was blocked"
        );
        // A new connection of the blocked sender is stalled from its first request on.
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            round_trip(&mut again, &hello("aaa"), Duration::from_millis(300)).await,
            None
        );

        proxy.block_senders(BTreeSet::new());
        // Released: the held bytes arrive, then the new ones.
        assert_eq!(
            round_trip(&mut a, b"back", wait).await.as_deref(),
            Some(&b"more"[..])
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
