//! What one client, or a crowd of them, may hold at the edge: connections (a bound, with an
//! immediate 503 beyond it), header bytes and header time (hyper's `max_header_size`,
//! `max_buf_size` and `header_read_timeout`, set in [`super::serve`]), and body time
//! ([`read_body`]).
//!
//! hyper 1.x has no idle timeout of its own, but it restarts the header-read timer as soon as
//! a kept-alive connection goes idle (`proto::h1::conn::State::idle`), so
//! [`HEADER_READ_TIMEOUT`](crate::config::HEADER_READ_TIMEOUT) is also the idle timeout.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use hyper::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::problem::ApiError;
use crate::config::{BODY_READ_TIMEOUT, REFUSAL_LINGER};
use crate::metrics as m;

/// Connections past the bound being answered at once; past this many, the surplus is closed
/// without an answer, so a flood cannot turn refusals into the resource it exhausts.
const MAX_REFUSALS_IN_PROGRESS: usize = 256;

/// The bound on open connections. A permit travels with its connection's task and is given
/// back when the connection ends, however it ends.
pub(super) struct ConnectionLimit {
    /// One permit per connection being served.
    open: Arc<Semaphore>,
    /// One permit per surplus connection being answered 503.
    refusing: Arc<Semaphore>,
    /// The 503 answer, rendered once: a refusal costs one write, not a hyper connection.
    answer: Bytes,
}

impl ConnectionLimit {
    pub(super) fn new(max: usize) -> Self {
        ConnectionLimit {
            open: Arc::new(Semaphore::new(max)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSALS_IN_PROGRESS)),
            answer: Bytes::from(ApiError::TooManyConnections.into_http1_bytes()),
        }
    }

    /// A permit to serve one more connection, or `None` at the bound.
    pub(super) fn admit(&self) -> Option<OwnedSemaphorePermit> {
        self.open.clone().try_acquire_owned().ok()
    }

    /// Answers a connection past the bound with 503 and closes it, off the accept loop.
    pub(super) fn refuse(&self, mut stream: TcpStream) {
        m::connection_refused();
        let Ok(permit) = self.refusing.clone().try_acquire_owned() else {
            return;
        };
        let answer = self.answer.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(REFUSAL_LINGER, async {
                stream.write_all(&answer).await?;
                stream.shutdown().await?;
                // Closing with the client's request still unread would reset the connection
                // and could destroy the answer before the client reads it: read to its end.
                let mut sink = [0u8; 1024];
                while stream.read(&mut sink).await? > 0 {}
                Ok::<_, std::io::Error>(())
            })
            .await;
        });
    }
}

/// Reads the body: more than `limit` bytes is refused (before reading when the length is
/// declared), and the whole body must arrive within [`BODY_READ_TIMEOUT`], or a client
/// trickling a byte at a time would hold its connection and its handler for as long as it
/// likes. [`crate::config::MAX_BODY_BYTES`] on the buyers' routes, [`crate::config::MAX_ADMIN_BODY_BYTES`] on the operators'
/// (a seated venue's plan).
///
/// # Errors
/// [`ApiError::PayloadTooLarge`], [`ApiError::RequestTimeout`] (hyper then closes the
/// connection: the rest of the body is never read), [`ApiError::UnsupportedMediaType`], or
/// [`ApiError::BadRequest`].
pub(super) async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    // Every body is JSON. A request without Content-Type is read as JSON (curl -d and many
    // clients send none); one that names another type is refused (415) unless it is empty.
    let not_json = req
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| !is_json(v.to_str().unwrap_or("")));
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::PayloadTooLarge);
    }
    let body = Limited::new(req.into_body(), limit).collect();
    match tokio::time::timeout(BODY_READ_TIMEOUT, body).await {
        Err(_) => Err(ApiError::RequestTimeout),
        Ok(Ok(c)) => {
            let bytes = c.to_bytes();
            // An empty body has no type to be wrong (a claim of one unit).
            if not_json && !bytes.is_empty() {
                return Err(ApiError::UnsupportedMediaType);
            }
            Ok(bytes)
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::PayloadTooLarge),
        Ok(Err(_)) => Err(ApiError::BadRequest(
            "could not read the request body".into(),
        )),
    }
}

/// A request that says it carries a body (a length above 0, or chunks) of a type other than
/// JSON: refused before any route acts on it.
pub(super) fn body_of_another_type(req: &Request<Incoming>) -> bool {
    let h = req.headers();
    let has_body = h
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(h.contains_key(TRANSFER_ENCODING), |n| n > 0);
    has_body
        && h.get(CONTENT_TYPE)
            .is_some_and(|v| !is_json(v.to_str().unwrap_or("")))
}

/// `application/json` or a `+json` type, parameters (`; charset=utf-8`) aside.
///
/// `application/x-www-form-urlencoded` is what `curl -d` sends when not told otherwise, and
/// operators' runbooks are written with `curl -d '{...}'`: such a body is read as JSON too (a
/// real form body is then 400, not JSON), rather than refusing every curl user with a 415.
fn is_json(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or("").trim();
    media.eq_ignore_ascii_case("application/json")
        || media.eq_ignore_ascii_case("application/x-www-form-urlencoded")
        || media
            .rsplit_once('+')
            .is_some_and(|(_, suffix)| suffix.eq_ignore_ascii_case("json"))
}
