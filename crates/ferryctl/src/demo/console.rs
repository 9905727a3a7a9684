//! The demo's web console: `ferry-console` in this process over dc-a and dc-b, linked to the mirror's monitor, on
//! 127.0.0.1:9500 when free. Pages are readable without a token (the demo is loopback-only); actions need the
//! demo's token, entered once at /login.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

/// The console address the demo prefers (the console's default).
const PREFERRED: &str = "127.0.0.1:9500";

fn config_text(listen: &str, a: SocketAddr, b: SocketAddr, monitor: SocketAddr, token_file: &Path) -> String {
    format!(
        "listen = \"{listen}\"\nanonymous_read = true\n\
         [[clusters]]\nname = \"dc-a\"\nbrokers = [\"{a}\"]\n[[clusters]]\nname = \"dc-b\"\nbrokers = [\"{b}\"]\n\
         [[mirrors]]\nname = \"dc-a-to-dc-b\"\nurl = \"http://{monitor}\"\n\
         [[tokens]]\nname = \"demo\"\nscope = \"admin\"\ntoken_file = {}\n",
        toml_string(&token_file.display().to_string())
    )
}

fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Starts the console; it stops on `stop`.
pub async fn start(
    a: SocketAddr,
    b: SocketAddr,
    monitor: SocketAddr,
    token_file: &Path,
    stop: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let mut last = None;
    for listen in [PREFERRED, "127.0.0.1:0"] {
        let config = ferry_console::ConsoleConfig::parse(&config_text(listen, a, b, monitor, token_file))
            .map_err(|e| anyhow::anyhow!("the demo's console config is invalid: {e}"))?;
        match ferry_console::start(config, stop.clone()).await {
            Ok((addr, _task)) => return Ok(addr),
            Err(e) => last = Some(e),
        }
    }
    Err(anyhow::anyhow!(last.unwrap_or_default())).context("cannot start the console")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_console_config_is_valid() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("t");
        std::fs::write(&token, "abc").unwrap();
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let c = ferry_console::ConsoleConfig::parse(&config_text("127.0.0.1:0", a, a, a, &token)).unwrap();
        assert_eq!((c.clusters.len(), c.tokens.len(), c.mirrors.len()), (2, 1, 1));
        assert!(c.anonymous_read);
    }
}
