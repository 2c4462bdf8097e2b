//! Free loopback ports for test servers.

use std::net::{Ipv4Addr, TcpListener};

/// Returns `n` distinct ports that were free on 127.0.0.1 a moment ago.
///
/// The listeners are held until all ports are chosen, so the ports are distinct; another process
/// may still take one before the caller binds it, which is why starters retry on a bind failure.
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}
