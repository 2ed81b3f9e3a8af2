//! A fault-injecting TCP proxy for tests, between the gateway and Redis or PostgreSQL, with the
//! vocabulary of toxiproxy's toxics that dropgate's faults need: latency, a stall (bytes held,
//! then released), a black hole (bytes thrown away), cutting every connection, and cutting
//! replies after N bytes (a reply cut in the middle).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Every chunk, either way, waits this long before it is forwarded.
    Latency(Duration),
    /// Nothing is forwarded until the mode changes; then the held bytes flow.
    Stall,
    /// Bytes are read and thrown away, either way: a request that never arrives, a reply that
    /// never comes (the connection stays open).
    BlackHole,
}

struct Control {
    mode: watch::Sender<Mode>,
    /// Bumped to cut every open connection.
    generation: AtomicU64,
    /// Bytes of replies (upstream to client) still let through before connections are cut;
    /// negative means no limit.
    reply_budget: AtomicI64,
    stopped: AtomicBool,
    /// Requests thrown away by the black hole (the first MiB), for a test to await its own.
    swallowed: std::sync::Mutex<Vec<u8>>,
}

pub struct FaultProxy {
    pub addr: SocketAddr,
    control: Arc<Control>,
    cut: watch::Sender<u64>,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode, _) = watch::channel(Mode::Pass);
        let (cut, _) = watch::channel(0u64);
        let control = Arc::new(Control {
            mode,
            generation: AtomicU64::new(0),
            reply_budget: AtomicI64::new(-1),
            stopped: AtomicBool::new(false),
            swallowed: std::sync::Mutex::new(Vec::new()),
        });
        let (c, cut_rx) = (control.clone(), cut.subscribe());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if c.stopped.load(Ordering::Relaxed) {
                    break;
                }
                let (c, cut_rx) = (c.clone(), cut_rx.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = pump(cr, sw, c.clone(), false);
                    let down = pump(sr, cw, c.clone(), true);
                    // Only cuts made from now on concern this connection.
                    let mut cut_rx = cut_rx;
                    cut_rx.borrow_and_update();
                    // Either side closing (or a reply cut short) closes the whole connection,
                    // as a peer that went away does.
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                        _ = cut_rx.changed() => {}
                    }
                });
            }
        });
        FaultProxy { addr, control, cut }
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}", self.addr)
    }

    pub fn set(&self, mode: Mode) {
        self.control.mode.send_replace(mode);
    }

    /// Cuts every open connection now (both directions dropped, as a reset would).
    pub fn cut_all(&self) {
        let g = self.control.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.cut.send_replace(g);
    }

    /// Whether the black hole has thrown away a request containing `needle`.
    pub fn swallowed(&self, needle: &[u8]) -> bool {
        let seen = self.control.swallowed.lock().unwrap();
        seen.windows(needle.len()).any(|w| w == needle)
    }

    /// Lets `bytes` more bytes of replies through, then cuts the connections (a reply cut in
    /// the middle); the limit is lifted by the cut.
    pub fn cut_replies_after(&self, bytes: i64) {
        self.control.reply_budget.store(bytes, Ordering::Relaxed);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.control.stopped.store(true, Ordering::Relaxed);
        self.set(Mode::Pass);
        self.cut_all();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    c: Arc<Control>,
    reply: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut mode = c.mode.subscribe();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        loop {
            let m = *mode.borrow_and_update();
            match m {
                Mode::Pass => break,
                Mode::Latency(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Mode::Stall => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                Mode::BlackHole => break,
            }
        }
        if *mode.borrow() == Mode::BlackHole {
            if !reply {
                let mut seen = c.swallowed.lock().unwrap();
                if seen.len() < 1 << 20 {
                    seen.extend_from_slice(&buf[..n]);
                }
            }
            continue;
        }
        let mut take = n;
        if reply {
            let budget = c.reply_budget.load(Ordering::Relaxed);
            if budget >= 0 {
                take = n.min(budget as usize);
                c.reply_budget
                    .store(budget - take as i64, Ordering::Relaxed);
                if take < n || budget - take as i64 <= 0 {
                    let _ = to.write_all(&buf[..take]).await;
                    c.reply_budget.store(-1, Ordering::Relaxed);
                    return;
                }
            }
        }
        if to.write_all(&buf[..take]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
