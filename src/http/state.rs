//! What every request handler shares: built by [`crate::app::Application::build`], served by
//! [`super::serve`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::auth::Verifier;
use crate::catalog::Catalog;
use crate::claims::ClaimService;
use crate::live::Live;
use crate::observe::FailClosed;
use crate::outbox::OutboxStatus;
use crate::store::Store;

/// Everything a request handler needs, shared by all connections.
pub struct AppState {
    pub store: Store,
    pub catalog: Catalog,
    pub verifier: Verifier,
    pub claims: ClaimService,
    pub metrics: PrometheusHandle,
    /// SKUs seen failing closed, so the claim path and the observer log each transition once.
    pub closed: Arc<FailClosed>,
    /// The outbox backlog and the relay's NATS state, shown by /readyz (never a reason for 503).
    pub outbox: Arc<OutboxStatus>,
    /// Per-SKU claim counts and the open live streams, for `/admin/live`.
    pub live: Live,
    /// Set on shutdown, so /readyz turns 503 before the listener closes.
    pub(crate) draining: AtomicBool,
    /// The secret the waiting room derives tickets with (the oldest admission secret, so a
    /// rotation's new first key changes no ticket).
    pub secret: crate::config::Secret,
    /// The key admission tokens are signed with (the first admission secret, with its kid).
    pub signing: crate::config::HmacKey,
    /// Queued SKUs by tag, as tickets name them (a SKU's tag never changes).
    pub ticket_tags: dashmap::DashMap<i32, String>,
    /// Seated SKUs' seat maps as this gateway last read them (`GET /v1/skus/{sku}/seats`).
    pub seat_maps: crate::seatmaps::SeatMaps,
}

impl AppState {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
