//! `kubectl ax ui`: the web console. A small HTTP server on loopback that reads and acts with
//! the user's own kubeconfig credentials, so the API server's RBAC decides everything and the
//! operator gains nothing. Pages are rendered on the server (maud, escaped), SVG included; one
//! small script swaps in live updates sent as Server-Sent Events from API watches.
//!
//! `security`, `diagram`, `html` and `pages` are pure; `store` (the watches), `actions` (the
//! buttons) and `server` (routes and handlers) need a client.

pub mod actions;
pub mod diagram;
pub mod html;
pub mod pages;
pub mod security;
pub mod server;
pub mod store;

use std::io::Write;
use std::net::SocketAddr;

use clap::Args;

use crate::client::ctx::Ctx;
use crate::client::error::ClientError;

// Where the console listens: the flags of `kubectl ax ui` (not a doc comment, which clap would
// take as the about text of `ui`).
#[derive(Args, Debug, Clone)]
pub struct UiArgs {
    /// Port to listen on (0: any free port; the URL printed says which).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Address to listen on. Without it only this machine can connect (127.0.0.1); anyone who
    /// can reach another address and has the URL acts with your credentials.
    #[arg(long)]
    pub address: Option<std::net::IpAddr>,
    /// Open the console in a browser ($BROWSER, else xdg-open).
    #[arg(long)]
    pub open: bool,
}

/// The address to print for a listener bound to `bound`: a wildcard address is reached on
/// loopback from this machine.
pub fn url_host(bound: SocketAddr) -> String {
    match bound.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => format!("127.0.0.1:{}", bound.port()),
        ip if ip.is_unspecified() => format!("[::1]:{}", bound.port()),
        _ => bound.to_string(),
    }
}

/// Serves the console until Ctrl-C. The first line on stdout is its URL, token included.
pub async fn run(ctx: Ctx, args: &UiArgs) -> Result<(), ClientError> {
    let address = SocketAddr::new(security::bind_address(args.address), args.port);
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| ClientError::Usage(format!("cannot listen on {address}: {e}")))?;
    let bound = listener.local_addr()?;
    let token = security::token_from(rand::random());
    let scope = ctx.list_namespace().map(str::to_owned);
    let store = store::Store::new(scope);
    store.start(ctx.client.clone());
    let app = server::App::new(ctx, store, token.clone());
    let url = format!("http://{}/?token={token}", url_host(bound));
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ax console: {url}")?;
        out.flush()?;
    }
    eprintln!(
        "watching {} with your kubeconfig credentials; Ctrl-C stops the console",
        app.scope
    );
    if !bound.ip().is_loopback() {
        eprintln!(
            "warning: listening on {bound}: anyone who can reach it and has the URL acts as you"
        );
    }
    if args.open {
        open_browser(&url);
    }
    axum::serve(listener, server::router(app))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| ClientError::Io(e.to_string()))
}

/// `$BROWSER URL`, else `xdg-open URL`; a failure is a warning (the URL is printed anyway).
fn open_browser(url: &str) {
    let program = std::env::var("BROWSER").unwrap_or_else(|_| "xdg-open".into());
    if let Err(e) = std::process::Command::new(&program)
        .arg(url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        eprintln!("warning: could not start {program} ({e}); open the URL above yourself");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listeners_are_shown_as_loopback() {
        assert_eq!(url_host("0.0.0.0:80".parse().unwrap()), "127.0.0.1:80");
        assert_eq!(url_host("[::]:80".parse().unwrap()), "[::1]:80");
        assert_eq!(url_host("10.1.2.3:80".parse().unwrap()), "10.1.2.3:80");
    }
}
