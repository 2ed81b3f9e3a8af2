//! The ledger's high-water mark of each shard's state sequence (see [`crate::freshness`]):
//! shard 0's is `skus.redis_seq`, as for every SKU; shard i >= 1's is a row of
//! `sku_shard_marks`. Every function takes a Redis name (`sku`, `sku#i` or `sku#i.salt`).

use std::collections::HashMap;

use sqlx::PgPool;

use crate::error::DbError;
use crate::keys::split_shard;
use crate::scripts::Floor;

/// Raises the mark of the shard `name` to at least `seq` and returns it (0 when the SKU has no
/// catalog row).
///
/// # Errors
/// The database error.
pub async fn raise(db: &PgPool, name: &str, seq: i64) -> Result<i64, DbError> {
    let (sku, shard) = split_shard(name);
    let mark: Option<i64> = if shard == 0 {
        sqlx::query_scalar(
            "UPDATE skus SET redis_seq = GREATEST(redis_seq, $2) WHERE sku = $1 RETURNING redis_seq",
        )
        .bind(sku)
        .bind(seq)
        .fetch_optional(db)
        .await?
    } else {
        sqlx::query_scalar(
            "INSERT INTO sku_shard_marks (sku, shard, redis_seq)
             SELECT sku, $2, $3 FROM skus WHERE sku = $1
             ON CONFLICT (sku, shard)
               DO UPDATE SET redis_seq = GREATEST(sku_shard_marks.redis_seq, EXCLUDED.redis_seq)
             RETURNING redis_seq",
        )
        .bind(sku)
        .bind(i32::from(shard))
        .bind(seq)
        .fetch_optional(db)
        .await?
    };
    Ok(mark.unwrap_or(0))
}

/// Records that the state of the shard `name` carries the incarnation `inc` (or a later one:
/// see `lua/rotate.lua`); incarnations only grow here.
///
/// # Errors
/// The database error.
pub async fn record_inc(db: &PgPool, name: &str, inc: i64) -> Result<(), DbError> {
    let (sku, shard) = split_shard(name);
    if shard == 0 {
        sqlx::query("UPDATE skus SET redis_inc = GREATEST(redis_inc, $2) WHERE sku = $1")
            .bind(sku)
            .bind(inc)
            .execute(db)
            .await?;
    } else {
        sqlx::query(
            "INSERT INTO sku_shard_marks (sku, shard, redis_inc)
             SELECT sku, $2, $3 FROM skus WHERE sku = $1
             ON CONFLICT (sku, shard)
               DO UPDATE SET redis_inc = GREATEST(sku_shard_marks.redis_inc, EXCLUDED.redis_inc)",
        )
        .bind(sku)
        .bind(i32::from(shard))
        .bind(inc)
        .execute(db)
        .await?;
    }
    Ok(())
}

/// The marks of the shards `names` (any mix of SKUs and shards), as `(name, mark)` with the
/// name as given; a shard with no mark recorded yet is left out (nothing to compare against).
///
/// # Errors
/// The database error.
pub async fn read(db: &PgPool, names: &[String]) -> Result<Vec<(String, i64)>, DbError> {
    Ok(read_floors(db, names)
        .await?
        .into_iter()
        .map(|(n, f)| (n, f.seq))
        .collect())
}

/// As [`read`], each with the incarnation recorded for it: the whole [`Floor`].
///
/// # Errors
/// The database error.
pub async fn read_floors(db: &PgPool, names: &[String]) -> Result<Vec<(String, Floor)>, DbError> {
    let (mut skus, mut shard_skus, mut shards) = (Vec::new(), Vec::new(), Vec::new());
    // A row names its shard by number; the name given (its salt included) is found back here.
    let mut shard_names: HashMap<(&str, i32), &str> = HashMap::new();
    for n in names {
        match split_shard(n) {
            (sku, 0) => skus.push(sku.to_string()),
            (sku, i) => {
                shard_skus.push(sku.to_string());
                shards.push(i32::from(i));
                shard_names.insert((sku, i32::from(i)), n);
            }
        }
    }
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT sku, redis_seq, redis_inc FROM skus WHERE sku = ANY($1)")
            .bind(&skus)
            .fetch_all(db)
            .await?;
    let mut out: Vec<(String, Floor)> = rows
        .into_iter()
        .map(|(n, seq, inc)| (n, Floor { seq, inc }))
        .collect();
    if !shards.is_empty() {
        let rows: Vec<(String, i32, i64, i64)> = sqlx::query_as(
            "SELECT m.sku, m.shard, m.redis_seq, m.redis_inc
               FROM sku_shard_marks m
               JOIN UNNEST($1::text[], $2::int4[]) AS t(sku, shard)
                 ON m.sku = t.sku AND m.shard = t.shard",
        )
        .bind(&shard_skus)
        .bind(&shards)
        .fetch_all(db)
        .await?;
        out.extend(rows.into_iter().filter_map(|(sku, i, seq, inc)| {
            let name = shard_names.get(&(sku.as_str(), i))?.to_string();
            Some((name, Floor { seq, inc }))
        }));
    }
    Ok(out)
}

/// The mark of one shard (0 when none is recorded).
///
/// # Errors
/// The database error.
pub async fn of(db: &PgPool, name: &str) -> Result<i64, DbError> {
    Ok(read(db, &[name.to_string()])
        .await?
        .first()
        .map_or(0, |(_, m)| *m))
}
