//! One script call for a batch of claims of one SKU, and what happens when it gets no answer:
//! its outcome read back (never sent again), the wins kept only once the replicas hold them,
//! and a Redis that answers nothing asked a read before it gets another call.

use std::time::Instant;

use uuid::Uuid;

use crate::activity;
use crate::error::StoreError;
use crate::ids;
use crate::keys::SkuKeys;
use crate::metrics as m;
use crate::scripts::Floor;
use crate::scripts::{self, ClaimInput, Decision};
use crate::store::Store;

use crate::clock::now_ms;

/// Reads of a claim's record after its call got no answer, before its outcome is reported
/// unknown (503 `outcome_unknown`, then settled in the background); with the call itself this
/// bounds a claim at three Redis timeouts (750 ms by default).
const RESOLVE_ATTEMPTS: usize = 2;

/// Whether Redis answers a read of the SKU's slot within the call bound: asked before the
/// next call of a SKU whose last call got no answer. A call sent to a Redis that does not
/// answer waits in its connection and runs when Redis answers again, long after its buyers
/// were told `outcome_unknown`; a read that runs late changes nothing. So while Redis is
/// silent each batch costs one bounded read and is answered 503 `unavailable` (a definite
/// "nothing moved"), rather than queueing a claim call behind the others and waiting for its
/// timeout and its read-backs.
pub(super) async fn probe(store: &Store, keys: &SkuKeys) -> bool {
    let mut con = store.hot();
    store
        .bounded(async {
            Ok(redis::cmd("EXISTS")
                .arg(keys.state())
                .query_async::<i64>(&mut con)
                .await?)
        })
        .await
        .is_ok()
}

/// One result per claim of a call, in order, and whether Redis was silent: neither the call
/// nor any read-back of it got an answer (a win answered `outcome_unknown` because the replicas
/// were late is not silence: the master answered).
pub(super) type Decided = (Vec<Result<Decision, StoreError>>, bool);

/// Decides `inputs` in one script call, the call `call`; when the call gets no answer, reads
/// each claim's outcome back instead of sending it again. The call goes with the SKU's
/// activity mark, so some writer reads what it journals (see [`activity`]).
pub(super) async fn decide_batch(
    store: &Store,
    name: &str,
    keys: &SkuKeys,
    call: &Uuid,
    inputs: &[ClaimInput],
    floor: Floor,
) -> Decided {
    let mut con = store.hot();
    let started = Instant::now();
    let sent = store.bounded(scripts::claim_at(
        &mut con,
        keys,
        call,
        inputs,
        now_ms(),
        floor,
    ));
    let result = activity::with_mark(store, name, sent).await;
    m::redis_call("claim", started.elapsed());
    let ids = || -> Vec<Uuid> { (0..inputs.len()).map(|i| ids::claim_in(call, i)).collect() };
    match result {
        // The call had a record already: it is this very call run twice (a cluster connection
        // resends after a connection error), and the first run decided; or a resolver fenced
        // it, and it decided nothing. Either way its record tells each claim's outcome.
        Ok(decisions) if decisions.iter().any(|d| matches!(d, Decision::Fenced)) => {
            let (answers, _) = resolve(store, keys, &ids()).await;
            (
                replicated_or_unknown(store, keys, call, answers).await,
                false,
            )
        }
        Ok(decisions) if decisions.len() == inputs.len() => {
            let out = decisions.into_iter().map(Ok).collect();
            (replicated_or_unknown(store, keys, call, out).await, false)
        }
        Ok(_) => (
            each(inputs.len(), || {
                StoreError::Protocol("claim reply of the wrong length".into())
            }),
            false,
        ),
        Err(e) if store.may_have_run(&e) => {
            let (answers, silent) = resolve(store, keys, &ids()).await;
            (
                replicated_or_unknown(store, keys, call, answers).await,
                silent,
            )
        }
        Err(e) => (each(inputs.len(), || definite(&e)), false),
    }
}

/// Keeps the wins only once the configured replicas hold them (see [`Store::replicated`]);
/// without that acknowledgement a win's outcome is unknown to the buyer (a failover could
/// still take it away), and the settler reads it back later.
async fn replicated_or_unknown(
    store: &Store,
    keys: &SkuKeys,
    call: &Uuid,
    out: Vec<Result<Decision, StoreError>>,
) -> Vec<Result<Decision, StoreError>> {
    if !out.iter().any(|d| matches!(d, Ok(Decision::Won { .. }))) {
        return out;
    }
    if matches!(store.replicated(keys).await, Ok(true)) {
        return out;
    }
    m::wait_short();
    out.into_iter()
        .enumerate()
        .map(|(i, d)| match d {
            Ok(Decision::Won { .. }) => Err(StoreError::OutcomeUnknown(ids::claim_in(call, i))),
            other => other,
        })
        .collect()
}

/// Settles claims whose call got no answer, by reading their call's record (and fencing a
/// call that did not run), never by sending them again. The read is retried a few times: every
/// answer that settles a claim saves an `outcome_unknown`. Silent (see [`Decided`]) when no
/// read got an answer.
pub(super) async fn resolve(store: &Store, keys: &SkuKeys, ids: &[Uuid]) -> Decided {
    m::uncertain_outcome();
    let mut con = store.hot();
    for _ in 0..RESOLVE_ATTEMPTS {
        if let Ok(answers) = store.bounded(scripts::read_back(&mut con, keys, ids)).await {
            // The fence is a write, and holds only once the replicas have it, as a win does:
            // a master that dies before its replica has the fence leaves the call free to run
            // on the promoted replica (a cluster connection resends it there), so until then
            // "nothing moved" is not known.
            let fence_holds = answers.iter().all(Option::is_some)
                || matches!(store.replicated(keys).await, Ok(true));
            let out = answers
                .into_iter()
                .zip(ids)
                .map(|(a, id)| match a {
                    // The call's record tells a hold's expiry: the win is answered as it was.
                    Some(w) => Ok(Decision::Won {
                        remaining: w.remaining,
                        expires_ms: w.expires_ms,
                    }),
                    // Fenced: the claim did not and now cannot win. Nothing moved.
                    None if fence_holds => Err(StoreError::Unavailable(
                        "no answer from redis; the claim was fenced and moved nothing".into(),
                    )),
                    None => Err(StoreError::OutcomeUnknown(*id)),
                })
                .collect();
            return (out, false);
        }
    }
    let unknown = ids
        .iter()
        .map(|id| Err(StoreError::OutcomeUnknown(*id)))
        .collect();
    (unknown, true)
}

fn each(n: usize, e: impl Fn() -> StoreError) -> Vec<Result<Decision, StoreError>> {
    (0..n).map(|_| Err(e())).collect()
}

/// The same definite failure, for each claim of a batch.
pub(super) fn definite(e: &StoreError) -> StoreError {
    match e {
        StoreError::SkuLost => StoreError::SkuLost,
        StoreError::Stale => StoreError::Stale,
        StoreError::Protocol(s) => StoreError::Protocol(s.clone()),
        other => StoreError::Unavailable(other.to_string()),
    }
}
