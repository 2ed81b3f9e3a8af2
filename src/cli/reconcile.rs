//! `dropgate reconcile`: every SKU's accounting as a table, and whether the books balance.
//! Read-only (API.md): it opens the database the URL names and reads it; a missing database,
//! or one without this version's schema, is an error that says so, never a database created
//! or migrated on the spot (a mistyped `DATABASE_URL` once printed an empty table and exit 0).

use std::io::Write;

use super::token::quiet_end;
use super::ReconcileArgs;
use crate::error::{InventoryError, Refusal};
use crate::sku::SkuId;
use crate::startup::{redact, Exit, Failure};

/// Prints the table; `Ok(false)` when any SKU does not balance. A reader that goes away
/// (`| head -2`) ends the output quietly and the verdict stands.
///
/// # Errors
/// The [`Failure`] of the database, of Redis, or of an unknown `--sku`.
pub async fn reconcile(args: ReconcileArgs) -> anyhow::Result<bool> {
    let stores = args.stores;
    let only = match args.sku.as_deref().map(SkuId::parse) {
        Some(None) => {
            return Err(Failure::new(
                Exit::Config,
                "--sku: a SKU id matches ^[A-Za-z0-9._-]{1,64}$",
            )
            .into());
        }
        Some(Some(sku)) => Some(sku),
        None => None,
    };
    // A one-off reader: the gateway's default bound of a call.
    let timeout = std::time::Duration::from_millis(
        crate::config::DEFAULT_REDIS_TIMEOUT_MS
            .parse()
            .unwrap_or(250),
    );
    let db = crate::db::connect_existing(&stores.database_url).await?;
    let store = crate::store::Store::connect(&stores.redis_url, &stores.key_prefix, timeout)
        .await
        .map_err(|e| Failure::redis(&stores.redis_url, &e))?;
    // The kept per-SKU sums the view reads against a full recount (migration 0019).
    let drift = crate::books::books_drift(&db).await?;
    let catalog = crate::catalog::Catalog::new(db);
    let views = match crate::ledger::accounting(&store, &catalog, only).await {
        Ok(v) => v,
        Err(InventoryError::Refused(Refusal::UnknownSku)) => {
            return Err(Failure::new(
                Exit::UnknownSku,
                format!(
                    "no SKU \"{}\" in the catalog of {}: check the id (reconcile without --sku \
                     lists every SKU)",
                    args.sku.as_deref().unwrap_or_default(),
                    redact(&stores.database_url)
                ),
            )
            .into())
        }
        Err(e) => return Err(e.into()),
    };
    if !views.is_empty() && views.iter().all(|v| v.remaining.is_none()) {
        // Redis answered, yet holds nothing for any SKU of the catalog: a `?` on every row
        // says less than the likely cause.
        eprintln!(
            "dropgate reconcile: no state exists under the key prefix \"{}\" in {}: not one of \
             the catalog's {} SKU(s) has Redis state there. Is --key-prefix \
             (DROPGATE_KEY_PREFIX) the gateways'? If it is, Redis lost the SKUs: restore them \
             (docs/runbook.md).",
            stores.key_prefix,
            redact(&stores.redis_url),
            views.len()
        );
    }
    let balanced = views.iter().all(|v| v.consistent) && drift.is_empty();
    let mut table = crate::ledger::table(&views);
    for sku in &drift {
        table.push_str(&format!(
            "{sku}: sku_books differs from a recount of its issuances rows\n"
        ));
    }
    let mut out = std::io::stdout().lock();
    quiet_end(out.write_all(table.as_bytes()).and_then(|()| out.flush()))?;
    Ok(balanced)
}
