//! Building and running a gateway. Binding is separate from running, so tests start the real
//! application on port 0 and read the address back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::activity::Upkeep;
use crate::auth::Verifier;
use crate::catalog::Catalog;
use crate::claims::ClaimService;
use crate::config::Config;
use crate::freshness::Refresher;
use crate::http::AppState;
use crate::journal::WriterSignal;
use crate::lifecycle::expiry::Expirer;
use crate::live::Live;
use crate::observe::{FailClosed, Observer};
use crate::outbox::{OutboxStatus, Relay};
use crate::reprocess::Reprocessor;
use crate::shards::recovery::Recovery;
use crate::soldout::{SoldOut, Watcher};
use crate::store::Store;
use crate::writer::Writer;

/// A gateway that is bound and connected, not yet serving.
pub struct Application {
    listener: TcpListener,
    state: Arc<AppState>,
    writer: Writer,
    reprocessor: Reprocessor,
    refresher: Refresher,
    /// Finishes restocks whose answer was lost, or whose gateway died.
    restocks: crate::inventory::RestockSweeper,
    /// Expires due holds (and lapsed offers) of this gateway's share of the SKUs.
    expirer: Expirer,
    observer: Observer,
    /// Keeps the active set (the SKUs the writer and the expiry worker serve) true: retries
    /// failed marks, retires idle SKUs, walks the catalog for work the set lost.
    upkeep: Upkeep,
    relay: Relay,
    sold_out: Watcher,
    /// Finishes transfers between the shards of a sharded SKU that a gateway left half done.
    transfers: Recovery,
    config: Config,
    /// Admits the lines of queued SKUs (one gateway at a time per SKU, leased).
    admitter: crate::queue::admit::Admitter,
    /// Records the waiting rooms' tickets in PostgreSQL.
    tickets: crate::queue::tickets::Recorder,
}

impl Application {
    /// Connects to PostgreSQL (creating the database and applying migrations) and Redis
    /// (loading the scripts), and binds the listener.
    ///
    /// # Errors
    /// Any startup failure, with context.
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        use crate::startup::{Exit, Failure};
        let db = crate::db::connect_and_migrate(&config.database_url).await?;
        let requests_db = crate::db::request_pool(&config.database_url)?;
        let store = Store::connect(&config.redis_url, &config.key_prefix, config.redis_timeout)
            .await
            .map_err(|e| Failure::redis(&config.redis_url, &e))?
            .with_wait(config.redis_wait_replicas, config.redis_wait);
        if store.is_cluster() {
            tracing::info!(
                nodes = store.urls().len(),
                wait_replicas = config.redis_wait_replicas,
                "connected to a Redis Cluster"
            );
        }
        match store.eviction_policy().await {
            Ok(Some(policy)) if policy != "noeviction" => {
                return Err(Failure::new(
                    Exit::RedisUnsafe,
                    format!(
                        "Redis at {} has maxmemory-policy {policy}: it may evict journal \
                         entries, per-user counts or fences, which loses winners or oversells; \
                         set maxmemory-policy noeviction",
                        crate::startup::redact(&config.redis_url)
                    ),
                )
                .into())
            }
            Ok(None) => tracing::warn!(
                "could not read Redis maxmemory-policy (CONFIG not allowed); it must be noeviction"
            ),
            _ => {}
        }
        let listener =
            crate::http::bind(config.listen).map_err(|e| Failure::listen(config.listen, &e))?;
        if config.admin_token.is_none() {
            tracing::warn!(
                "DROPGATE_ADMIN_TOKEN is not set: the admin routes (declare, restock, restore, \
                 the SKU view, the live page's data) answer 401 until a gateway runs with one"
            );
        }
        let wake = Arc::new(WriterSignal::default());
        let marks = store.marks().clone();
        // Every SKU's mark before anything is served or any worker moves a state: a state
        // older than the ledger then fails closed on its first script call, used or not.
        match crate::freshness::load_new(&db, &marks).await {
            Ok(n) => tracing::info!(skus = n, "loaded the ledger's marks"),
            Err(e) => {
                tracing::warn!(error = %e, "could not load the ledger's marks; the refresher retries")
            }
        }
        match crate::queue::tickets::load_marks(&store, &db).await {
            Ok(n) => tracing::info!(skus = n, "loaded the waiting rooms' line marks"),
            Err(e) => {
                tracing::warn!(error = %e, "could not load the waiting rooms' line marks; the ticket recorder retries")
            }
        }
        let closed = Arc::new(FailClosed::default());
        let outbox = Arc::new(OutboxStatus::default());
        let sold_out = Arc::new(SoldOut::new(config.sold_out_trust));
        let state = Arc::new(AppState {
            catalog: Catalog::new(requests_db),
            verifier: Verifier::from_config(&config.tokens, config.admin_token.clone())
                .map_err(anyhow::Error::msg)?,
            claims: ClaimService::new(
                store.clone(),
                config.coalesce,
                config.max_queue,
                wake.clone(),
                marks.clone(),
                sold_out.clone(),
            ),
            metrics: crate::metrics::handle(),
            closed: closed.clone(),
            outbox: outbox.clone(),
            live: Live::default(),
            store: store.clone(),
            draining: AtomicBool::new(false),
            secret: config.tokens.ticket_secret().clone(),
            signing: config.tokens.signing().clone(),
            ticket_tags: dashmap::DashMap::new(),
            seat_maps: crate::seatmaps::SeatMaps::new(),
        });
        let writer = Writer::new(
            store.clone(),
            db.clone(),
            wake,
            config.journal_claim_idle,
            config.reprocess_backoff,
            marks.clone(),
        );
        let refresher = Refresher {
            store: store.clone(),
            db: db.clone(),
            marks,
        };
        let restocks = crate::inventory::RestockSweeper {
            store: store.clone(),
            db: db.clone(),
        };
        let expirer = Expirer {
            store: store.clone(),
            owner: uuid::Uuid::new_v4(),
        };
        let observer = Observer::new(
            store.clone(),
            state.catalog.clone(),
            closed,
            config.sku_gauges_interval,
        );
        let relay = Relay::new(
            db.clone(),
            config.nats.clone(),
            outbox,
            config.outbox_retention,
        );
        let sold_out = Watcher {
            store: store.clone(),
            redis_url: config.redis_url.clone(),
            cache: sold_out,
        };
        let upkeep = Upkeep::new(store.clone(), db.clone(), crate::activity::HORIZON);
        let transfers = Recovery {
            store: store.clone(),
            db: db.clone(),
        };
        let admitter = crate::queue::admit::Admitter {
            store: store.clone(),
            db: db.clone(),
            owner: uuid::Uuid::new_v4(),
        };
        let tickets = crate::queue::tickets::Recorder {
            store: store.clone(),
            db: db.clone(),
        };
        let reprocessor = Reprocessor::new(
            store,
            db,
            config.reprocess_max_attempts,
            config.reprocess_backoff,
        );
        Ok(Application {
            listener,
            state,
            writer,
            reprocessor,
            refresher,
            restocks,
            expirer,
            observer,
            upkeep,
            relay,
            sold_out,
            transfers,
            config,
            admitter,
            tickets,
        })
    }

    /// # Errors
    /// The OS error reading the bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn state(&self) -> Arc<AppState> {
        self.state.clone()
    }

    /// Serves until `shutdown` is cancelled: then /readyz turns 503, the listener closes,
    /// in-flight requests finish, and the writer drains the journal once more.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) {
        let addr = self.local_addr().ok();
        tracing::info!(
            "listening on {}",
            addr.map_or("?".into(), |a| a.to_string())
        );
        let grace = self.config.shutdown_grace;
        let background = CancellationToken::new();
        let writer = tokio::spawn(self.writer.run(background.clone()));
        let reprocessor = tokio::spawn(self.reprocessor.run(background.clone()));
        let refresher = tokio::spawn(self.refresher.run(background.clone()));
        let restocks = tokio::spawn(self.restocks.run(background.clone()));
        let expirer = tokio::spawn(self.expirer.run(background.clone()));
        let settler = tokio::spawn(self.state.claims.settler().run(background.clone()));
        let observer = tokio::spawn(self.observer.run(background.clone()));
        let upkeep = tokio::spawn(self.upkeep.run(background.clone()));
        let sold_out = tokio::spawn(self.sold_out.run(background.clone()));
        let transfers = tokio::spawn(self.transfers.run(background.clone()));
        let admitter = tokio::spawn(self.admitter.run(background.clone()));
        let tickets = tokio::spawn(self.tickets.run(background.clone()));
        // Stopped after the writer and the reprocessor, so its flush publishes what they
        // recorded while stopping.
        let relay_stop = CancellationToken::new();
        let relay = tokio::spawn(self.relay.run(relay_stop.clone()));
        let state = self.state.clone();
        let draining = {
            let shutdown = shutdown.clone();
            let state = state.clone();
            async move {
                shutdown.cancelled().await;
                state.draining.store(true, Ordering::Relaxed);
            }
        };
        tokio::join!(
            crate::http::serve(
                self.listener,
                state,
                shutdown,
                grace,
                self.config.max_connections
            ),
            draining
        );
        // Requests are done: no new winners can appear; let the writer flush what is left.
        background.cancel();
        let flushed = tokio::time::timeout(grace, async {
            let _ = writer.await;
            let _ = reprocessor.await;
            let _ = refresher.await;
            let _ = restocks.await;
            let _ = expirer.await;
            let _ = settler.await;
            let _ = observer.await;
            let _ = upkeep.await;
            let _ = sold_out.await;
            let _ = transfers.await;
            let _ = admitter.await;
            let _ = tickets.await;
            relay_stop.cancel();
            let _ = relay.await;
        })
        .await;
        relay_stop.cancel();
        if flushed.is_err() {
            tracing::warn!("background tasks did not stop within the grace period; the journal keeps what was not written");
        }
        tracing::info!("gateway stopped");
    }
}
