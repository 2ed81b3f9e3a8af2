//! `dropgate events tail`: a durable JetStream consumer that prints each claim event as one
//! JSON line, the example an order system starts from.
//!
//! Durable: the server remembers what this consumer acknowledged, so a restarted tail goes on
//! where the last one stopped. An event is acknowledged only after its line is written and
//! flushed, so a crash in between prints it again on restart (at least once): an order system
//! applies an event only when its `seq` is above the last one it applied for the claim.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;

use super::events::filter;

#[derive(Debug, clap::Args)]
pub struct TailArgs {
    /// Only this SKU's events.
    #[arg(long)]
    pub sku: Option<String>,
    /// The durable consumer's name (default `dropgate-tail`, or `dropgate-tail-<sku>`). A
    /// consumer keeps its subject filter: use another name for another filter.
    #[arg(long)]
    pub durable: Option<String>,
    /// Exit after this many events (default: run until Ctrl-C).
    #[arg(long)]
    pub count: Option<u64>,
    /// NATS server(s) to read from, nats:// or tls://, comma-separated
    #[arg(long, env = crate::config::ENV_NATS_URL, default_value = crate::config::DEFAULT_TAIL_NATS_URL, hide_env_values = true)]
    pub nats_url: String,
    /// JetStream stream of the claim events (the gateways' DROPGATE_NATS_STREAM)
    #[arg(long, env = crate::config::ENV_NATS_STREAM, default_value = crate::config::DEFAULT_NATS_STREAM)]
    pub nats_stream: String,
    /// First token(s) of the event subjects (the gateways' DROPGATE_NATS_SUBJECT_PREFIX)
    #[arg(long, env = crate::config::ENV_NATS_SUBJECT_PREFIX, default_value = crate::config::DEFAULT_NATS_SUBJECT_PREFIX)]
    pub nats_subject_prefix: String,
}

/// The default durable name: one per filter, since a durable consumer keeps its filter.
fn durable_name(sku: Option<&str>) -> String {
    match sku {
        // Consumer names may not hold `.`, and a `%` in one makes nats-server 2.9 send
        // message lines the client cannot parse: `_` escapes (`_` as `__`, `.` as `_d`).
        Some(s) => format!("dropgate-tail-{}", s.replace('_', "__").replace('.', "_d")),
        None => "dropgate-tail".into(),
    }
}

/// Prints events until Ctrl-C (or `--count`).
///
/// # Errors
/// NATS unreachable, no stream (no gateway with `DROPGATE_NATS_URL` has started yet), a
/// durable consumer of that name with another filter, or stdout closed.
pub async fn run(args: TailArgs) -> anyhow::Result<()> {
    let client = async_nats::connect(args.nats_url.as_str())
        .await
        .context("connecting to NATS")?;
    let js = jetstream::new(client);
    let stream = js.get_stream(&args.nats_stream).await.with_context(|| {
        format!(
            "JetStream stream {} (a gateway with DROPGATE_NATS_URL creates it at start)",
            args.nats_stream
        )
    })?;
    let name = args
        .durable
        .clone()
        .unwrap_or_else(|| durable_name(args.sku.as_deref()));
    let subject = filter(&args.nats_subject_prefix, args.sku.as_deref());
    let mut consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &name,
            consumer::pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subject.clone(),
                deliver_policy: consumer::DeliverPolicy::All,
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("durable consumer {name}"))?;
    let info = consumer.info().await.context("reading the consumer")?;
    if info.config.filter_subject != subject {
        anyhow::bail!(
            "durable consumer {name} filters {:?}, not {subject:?}: pick another --durable",
            info.config.filter_subject
        );
    }
    let Some(count) = args.count else {
        let mut messages = consumer
            .messages()
            .await
            .context("subscribing to the consumer")?;
        loop {
            tokio::select! {
                m = messages.next() => match m {
                    Some(m) => print_and_ack(m.map_err(|e| anyhow::anyhow!("receiving an event: {e}"))?).await?,
                    None => return Ok(()),
                },
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    };
    // With a count, ask for exactly what is still wanted, so no event is handed to this
    // process that it will not print (the server would hold it back until its ack wait).
    let mut printed = 0u64;
    while printed < count {
        let mut batch = consumer
            .batch()
            .max_messages((count - printed).min(1000) as usize)
            .expires(Duration::from_secs(5))
            .messages()
            .await
            .map_err(|e| anyhow::anyhow!("asking for events: {e}"))?;
        loop {
            tokio::select! {
                m = batch.next() => match m {
                    Some(m) => {
                        print_and_ack(m.map_err(|e| anyhow::anyhow!("receiving an event: {e}"))?).await?;
                        printed += 1;
                    }
                    None => break,
                },
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    }
    Ok(())
}

/// Writes the event's line and flushes, then acknowledges it (waiting for the server, so a
/// `--count` run exits with every printed event acknowledged).
async fn print_and_ack(message: jetstream::Message) -> anyhow::Result<()> {
    {
        let mut out = std::io::stdout().lock();
        out.write_all(&message.payload)?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
    message
        .double_ack()
        .await
        .map_err(|e| anyhow::anyhow!("acknowledging an event: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_filter_has_its_own_durable_name() {
        assert_eq!(super::durable_name(None), "dropgate-tail");
        assert_eq!(super::durable_name(Some("a.b")), "dropgate-tail-a_db");
        assert_eq!(super::durable_name(Some("a_db")), "dropgate-tail-a__db");
    }
}
