//! What the gateway answers for a claim.

use uuid::Uuid;

/// What the gateway answers for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Won(WonClaim),
    /// An earlier win under the same Idempotency-Key and the same request.
    Replayed(WonClaim),
    SoldOut,
    LimitReached,
    KeyReused,
    /// Shed: too many claims already wait on this SKU (before reaching Redis), or a claim on a
    /// sharded SKU found no unit in [`super::BORROW_ROUNDS`] refills while units remained. Nothing
    /// moved.
    Shed,
    /// The sale window has not opened / has closed (Redis's clock).
    NotOpen,
    Closed,
}

impl Outcome {
    /// The `outcome` label of a decision in `dropgate_claims_total` (also the `outcome` field
    /// of its log line): one of [`crate::metrics::CLAIM_OUTCOMES`].
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Won(_) => "won",
            Outcome::Replayed(_) => "replayed",
            Outcome::SoldOut => "sold_out",
            Outcome::LimitReached => "limit_reached",
            Outcome::KeyReused => "key_reused",
            Outcome::Shed => "overloaded",
            Outcome::NotOpen => "not_open",
            Outcome::Closed => "closed",
        }
    }
}

/// A winning claim, as the 201 body shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WonClaim {
    pub claim_id: Uuid,
    pub quantity: u32,
    /// Stock left right after this claim won.
    pub remaining: i64,
    /// When the hold expires (unix ms); `None` for a claim final at once.
    pub expires_ms: Option<i64>,
}
