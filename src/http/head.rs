//! Waiting for a connection's first request head before hyper is given the connection.
//!
//! hyper allocates its buffers (8 KiB to read, 8 KiB for headers) and its connection state as
//! soon as it is given a connection. Until the first request's head is whole, its bytes wait in
//! the kernel's socket buffer, looked at (peeked) but not taken, so a connection that sent
//! nothing, or half a head and stalled, costs only its task (docs/performance.md, "Memory per
//! claimant and per connection"). The wait is bounded as hyper's header read is, so a stalled
//! crowd still goes.

use std::io::{self, ErrorKind};
use std::os::fd::AsFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// How much of a waiting head is looked at. A longer head is handed to hyper as it is, which
/// reads and bounds it (431 past the header limit).
const PEEK_BYTES: usize = 2048;

/// Waits until `stream` holds a whole request head, or more than [`PEEK_BYTES`], or bytes no
/// request head begins with (hyper answers those 400). `false`: the client closed, or sent no
/// whole head within `limit`.
pub async fn wait(stream: &TcpStream, limit: Duration) -> bool {
    matches!(
        tokio::time::timeout(limit, whole_head(stream)).await,
        Ok(Ok(true))
    )
}

async fn whole_head(stream: &TcpStream) -> io::Result<bool> {
    loop {
        stream.readable().await?;
        // Peeked bytes stay unread, so the socket stays readable: a head still partial answers
        // WouldBlock, which clears that, and the next `readable()` waits for more bytes.
        match stream.try_io(Interest::READABLE, || look(stream)) {
            Ok(go) => return Ok(go),
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `Ok(true)`: hand the connection to hyper; `Ok(false)`: the client closed; `WouldBlock`:
/// wait for more bytes.
fn look(stream: &TcpStream) -> io::Result<bool> {
    // A second handle on the same socket (sharing its non-blocking mode) for the moment of the
    // look: std's peek is a safe call, and tokio has none that answers at once. Held only
    // here, so a waiting connection keeps one descriptor, not two.
    let peer = std::net::TcpStream::from(stream.as_fd().try_clone_to_owned()?);
    let mut buf = [0u8; PEEK_BYTES];
    let n = peer.peek(&mut buf)?;
    if n == 0 {
        return Ok(false);
    }
    if n == buf.len() || is_ready(&buf[..n]) {
        Ok(true)
    } else {
        Err(ErrorKind::WouldBlock.into())
    }
}

/// Whether a connection's first bytes are enough for hyper: a whole head (ended by an empty
/// line, with or without CRs, as hyper reads it), or bytes no method begins with.
fn is_ready(bytes: &[u8]) -> bool {
    if !bytes[0].is_ascii_uppercase() {
        return true;
    }
    bytes.windows(2).any(|w| w == b"\n\n") || bytes.windows(3).any(|w| w == b"\n\r\n")
}

#[cfg(test)]
mod tests {
    use super::is_ready;

    #[test]
    fn a_head_is_whole_at_its_empty_line_and_junk_goes_to_hyper_at_once() {
        assert!(!is_ready(b"POST /v1/skus/a/claims HTTP/1.1\r\nHost: x\r\n"));
        assert!(!is_ready(b"GET / HTTP/1.1\r\nHost: x\r\n\r"));
        assert!(is_ready(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(is_ready(b"GET / HTTP/1.1\nHost: x\n\n"));
        assert!(is_ready(b"\x16\x03\x01 a TLS hello"));
        assert!(is_ready(b"get / HTTP/1.1"));
    }
}
