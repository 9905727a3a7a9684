//! Small helpers many tests need: test logging and a port reservation for the rare case where a port must be
//! known before a process starts (the normal way is port 0 plus the address file).

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use crate::error::{Error, Result};

/// Installs a `tracing` subscriber that writes through the test harness's capture (so output shows only for
/// failing tests), filtered by `RUST_LOG` (default `info`). Safe to call from every test: only the first call
/// in a process installs it.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Fails only when a subscriber is already installed, which is the intended no-op.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// Finds a free loopback port by binding `127.0.0.1:0` and releasing it. Racy by nature: another process may
/// take the port before the caller binds it. Prefer port 0 and the address file ([`crate::BrokerProcess`] and
/// [`crate::MirrorProcess`] do this); use this only for a config that must name a port in advance.
pub fn reserve_port() -> Result<u16> {
    let [port] = reserve_ports::<1>()?;
    Ok(port)
}

/// `N` distinct free loopback ports, as [`reserve_port`] finds one (and as racy with other processes). All `N`
/// probe listeners are held until the last is bound: ports reserved one after another may come back the same, since
/// a released port is free again at once (etcd was once given one port for both its client and peer URLs).
pub fn reserve_ports<const N: usize>() -> Result<[u16; N]> {
    let mut held = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for port in &mut ports {
        let (listener, bound) = probe_listener()?;
        *port = bound;
        held.push(listener);
    }
    Ok(ports)
}

fn probe_listener() -> Result<(TcpListener, u16)> {
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let listener = TcpListener::bind(any).map_err(|source| Error::Net {
        action: "bind a probe listener on",
        addr: any.to_string(),
        source,
    })?;
    let addr = listener.local_addr().map_err(|source| Error::Net {
        action: "read the bound address of",
        addr: any.to_string(),
        source,
    })?;
    Ok((listener, addr.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_port_can_be_bound() {
        let port = reserve_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        // Many at once are distinct, each one free.
        let many = reserve_ports::<64>().unwrap();
        let distinct: std::collections::BTreeSet<u16> = many.iter().copied().collect();
        assert_eq!(distinct.len(), 64);
        let _bound: Vec<TcpListener> =
            many.iter().map(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, *p)).unwrap()).collect();
        init_tracing();
        init_tracing();
    }
}
