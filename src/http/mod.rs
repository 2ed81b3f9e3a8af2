//! The HTTP front end: hyper 1.x, HTTP/1.1, one task per connection.
//!
//! hyper has no server loop of its own: this module accepts, wraps each stream in `TokioIo`,
//! and serves it with a builder whose timer is set, without which the header-read timeout
//! (the slowloris guard, and the idle timeout) silently does nothing. What a client may hold
//! is bounded in [`limits`].

mod admin;
mod lifecycle;
mod limits;
mod live;
mod openapi;
mod problem;
mod problems;
mod queue;
mod router;
mod routes;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use problem::{ApiError, Body};
pub use router::{Route, ROUTES};
pub use routes::claim_quantity;

use crate::app::AppState;
use crate::config::{HEADER_READ_TIMEOUT, MAX_CONNECTION_BUFFER_BYTES, MAX_HEADER_BYTES};
use limits::ConnectionLimit;

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
                let svc = service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(router::handle(&state, req).await) }
                });
                let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), svc));
                tokio::spawn(async move {
                    let _permit = permit;
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
