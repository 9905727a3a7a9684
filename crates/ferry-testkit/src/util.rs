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
    Ok(addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_port_can_be_bound() {
        let port = reserve_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        init_tracing();
        init_tracing();
    }
}
