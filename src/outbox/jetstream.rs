//! The relay's NATS side: one connection (reconnecting by itself), the stream made sure of, and
//! a batch published in order with its acknowledgements awaited together.

use std::time::{Duration, Instant};

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, stream};
use futures_util::future::join_all;

use super::events::{filter, OutboxRow};
use super::RelayError;
use crate::config::NatsConfig;

/// Bound of one JetStream answer (publish acknowledgement, stream lookup). Acknowledgements of
/// a batch are awaited together, so a batch takes at most about this long even when NATS
/// vanishes in the middle of it.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(3);
/// Reconnect attempts back off up to this, so a NATS that comes back is used within it.
const RECONNECT_MAX: Duration = Duration::from_secs(1);

pub struct Publisher {
    /// Kept to read the connection state: nothing is sent while it is down, so no stale
    /// publishes pile up in the client's buffer.
    client: async_nats::Client,
    js: jetstream::Context,
    config: NatsConfig,
    /// The stream was found or created on this connection; cleared when a publish finds it
    /// gone (an operator deleted it), so it is made again.
    stream_ready: bool,
}

impl Publisher {
    /// Connects in the background: a NATS that is down at start delays events, never the
    /// gateway.
    ///
    /// # Errors
    /// An address the client cannot parse (nothing is retried for it).
    pub async fn connect(config: NatsConfig) -> Result<Publisher, RelayError> {
        let client = async_nats::ConnectOptions::new()
            .name("dropgate-outbox-relay")
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(ACK_TIMEOUT)
            .reconnect_delay_callback(|attempt| {
                Duration::from_millis(50u64.saturating_mul(1 << attempt.min(10))).min(RECONNECT_MAX)
            })
            .connect(config.url.expose())
            .await
            .map_err(|e| RelayError::Config(e.to_string()))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(ACK_TIMEOUT)
            .build(client.clone());
        Ok(Publisher {
            client,
            js,
            config,
            stream_ready: false,
        })
    }

    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Finds the stream, or creates it (file storage, every subject under the prefix, the
    /// configured duplicate window). An existing stream is used as it is.
    ///
    /// # Errors
    /// [`RelayError::Unreachable`] while NATS is down; [`RelayError::Stream`] when JetStream
    /// refuses (not enabled, a stream of that name over other subjects...).
    pub async fn ensure_stream(&mut self) -> Result<(), RelayError> {
        if self.stream_ready {
            return Ok(());
        }
        if !self.connected() {
            return Err(RelayError::Unreachable);
        }
        let wanted = filter(&self.config.subject_prefix, None);
        let mut s = self
            .js
            .get_or_create_stream(stream::Config {
                name: self.config.stream.clone(),
                subjects: vec![wanted.clone()],
                duplicate_window: self.config.duplicate_window,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| RelayError::Stream(e.to_string()))?;
        let info = s
            .info()
            .await
            .map_err(|e| RelayError::Stream(e.to_string()))?;
        let covers = info
            .config
            .subjects
            .iter()
            .any(|s| *s == wanted || s == ">");
        if !covers {
            // Publishes will find no stream; say why once here, they keep failing until fixed.
            tracing::error!(stream = %self.config.stream, subjects = ?info.config.subjects, wanted,
                "the JetStream stream does not take the event subjects; events stay in the outbox");
        } else if info.config.duplicate_window < super::LEASE * 2 {
            tracing::warn!(stream = %self.config.stream, window = ?info.config.duplicate_window,
                "the stream's duplicate window is short: a relay taking over late could publish an event twice");
        }
        tracing::info!(stream = %self.config.stream, "outbox relay publishing to JetStream");
        self.stream_ready = true;
        Ok(())
    }

    /// Publishes `rows` in their order, each with its event id as `Nats-Msg-Id`, then awaits
    /// every acknowledgement. Returns, per row, whether JetStream took it (`Ok(duplicate)`:
    /// `true` when JetStream already held that id and dropped this copy). Rows not sent before
    /// `deadline` (the lease would run out under them) fail.
    pub async fn publish(
        &mut self,
        rows: &[OutboxRow],
        deadline: Instant,
    ) -> Vec<Result<bool, RelayError>> {
        let prefix = self.config.subject_prefix.clone();
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            if Instant::now() >= deadline || !self.connected() {
                break;
            }
            let payload = match serde_json::to_vec(&row.body()) {
                Ok(p) => p,
                Err(e) => {
                    pending.push(Err(RelayError::Publish(e.to_string())));
                    continue;
                }
            };
            let message = PublishMessage::build()
                .payload(payload.into())
                .message_id(row.event_id());
            match self.js.send_publish(row.subject(&prefix), message).await {
                Ok(ack) => pending.push(Ok(ack)),
                // The connection went away under the batch: the rest would fail the same way.
                Err(e) => {
                    pending.push(Err(publish_error(&e)));
                    break;
                }
            }
        }
        let sent = pending.len();
        let acks = join_all(pending.into_iter().map(|p| async move {
            match p {
                Ok(ack) => ack
                    .await
                    .map(|a| a.duplicate)
                    .map_err(|e| publish_error(&e)),
                Err(e) => Err(e),
            }
        }))
        .await;
        if acks.iter().any(|r| matches!(r, Err(RelayError::NoStream))) {
            self.stream_ready = false;
        }
        let mut out = acks;
        out.extend((sent..rows.len()).map(|_| Err(RelayError::Unreachable)));
        out
    }
}

fn publish_error(e: &PublishError) -> RelayError {
    match e.kind() {
        PublishErrorKind::StreamNotFound => RelayError::NoStream,
        _ => RelayError::Publish(e.to_string()),
    }
}
