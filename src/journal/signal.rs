//! How the claim path tells the writer that winners are waiting in a journal.

use std::collections::HashSet;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// How the claim path tells the writer that winners are waiting: a wake-up, and the SKUs
/// that won since, so they are read at once rather than at the next sweep of the active set.
#[derive(Default)]
pub struct WriterSignal {
    wake: Notify,
    skus: parking_lot::Mutex<HashSet<String>>,
}

impl WriterSignal {
    /// Called after a win. Takes the lock only to check a small set; allocates only for a SKU
    /// the writer has not been told about yet.
    pub fn won(&self, name: &str) {
        {
            let mut skus = self.skus.lock();
            if !skus.contains(name) {
                skus.insert(name.to_string());
            }
        }
        self.wake.notify_one();
    }

    /// The SKUs signalled since the last call.
    pub fn take(&self) -> HashSet<String> {
        std::mem::take(&mut *self.skus.lock())
    }

    /// Resolves at the next wake-up (or at once, for one that came since the last).
    pub fn notified(&self) -> Notified<'_> {
        self.wake.notified()
    }
}
