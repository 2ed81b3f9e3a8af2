//! The HTTP front end: hyper 1.x, HTTP/1.1, one task per connection.
//!
//! hyper has no server loop of its own: this module accepts, wraps each stream in `TokioIo`,
//! and serves it with a builder whose timer is set, without which the header-read timeout
//! (the slowloris guard, and the idle timeout) silently does nothing. What a client may hold
//! is bounded in [`limits`].

mod admin;
mod handler;
mod head;
mod lifecycle;
mod limits;
mod live;
mod openapi;
mod problem;
mod problems;
mod queue;
mod router;
mod routes;
mod seatmap;
mod seats;
mod state;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;

pub use problem::{ApiError, Body};
pub use router::{Route, ROUTES};
pub use routes::claim_quantity;
pub use state::AppState;

use crate::config::{
    HEADER_READ_TIMEOUT, LISTEN_BACKLOG, MAX_CONNECTION_BUFFER_BYTES, MAX_HEADER_BYTES,
};
use limits::ConnectionLimit;

/// The listening socket, with a queue of [`LISTEN_BACKLOG`] connections not yet accepted.
///
/// # Errors
/// The socket's, e.g. the address is in use.
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As tokio's bind does: a restarted gateway may bind while its old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `listener` until `shutdown`, then stops accepting and lets in-flight requests finish
/// for at most `grace`. At most `max_connections` are served at once; the surplus is answered
/// 503 and closed.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: CancellationToken,
    grace: Duration,
    max_connections: usize,
) {
    let graceful = GracefulShutdown::new();
    let limit = ConnectionLimit::new(max_connections);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        // max_buf_size alone is checked only while the headers are incomplete, so a large
        // final read could carry them past it; max_header_size is checked on every parse.
        .max_header_size(MAX_HEADER_BYTES)
        .max_buf_size(MAX_CONNECTION_BUFFER_BYTES)
        .keep_alive(true)
        // Responses are small: one flattened write costs less than a vectored one.
        .writev(false);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: pause instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Some(permit) = limit.admit() else {
                    limit.refuse(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                // hyper keeps a connection's request future in a box made with the connection
                // and moves each request's future into it: its size (6 KiB, a claim's state
                // machine; router.rs boxes the operators' bigger ones) is paid per connection
                // and copied per request. (A box per request instead cost 15 % more gateway
                // CPU per claim in loadtest/ratio.sh: an allocation and two copies each.)
                let svc = service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(router::handle(&state, req).await) }
                });
                let (builder, watcher, shutdown) =
                    (builder.clone(), graceful.watcher(), shutdown.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    // Until its first head is whole, the connection waits outside hyper and
                    // holds no buffer (head.rs).
                    tokio::select! {
                        whole = head::wait(&stream, HEADER_READ_TIMEOUT) => if !whole { return },
                        _ = shutdown.cancelled() => return,
                    }
                    let conn = watcher.watch(builder.serve_connection(TokioIo::new(stream), svc));
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            _ = shutdown.cancelled() => break,
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(grace) => tracing::warn!(?grace, "connections still open after the grace period; closing"),
    }
}
