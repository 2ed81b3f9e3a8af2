//! Restore's Redis writes, batched: one pipeline per shard (a pipeline reaches one slot's node
//! on a cluster), each sent once it holds [`CHUNK`] commands.

use crate::error::StoreError;
use crate::store::{RedisConn, Store};

/// Redis writes per pipeline: bounds the memory and the time of each round trip.
pub const CHUNK: usize = 5_000;

/// One pipeline per shard, each flushed once it holds [`CHUNK`] commands.
pub struct ShardPipes {
    pipes: Vec<redis::Pipeline>,
    queued: Vec<usize>,
}

impl ShardPipes {
    pub fn new(shards: usize) -> Self {
        ShardPipes {
            pipes: (0..shards).map(|_| redis::pipe()).collect(),
            queued: vec![0; shards],
        }
    }

    /// The pipeline of `shard`, counting one more command on it.
    pub fn add(&mut self, shard: usize) -> &mut redis::Pipeline {
        self.queued[shard] += 1;
        &mut self.pipes[shard]
    }

    pub async fn flush_full(
        &mut self,
        store: &Store,
        con: &mut RedisConn,
    ) -> Result<(), StoreError> {
        for (pipe, queued) in self.pipes.iter_mut().zip(&mut self.queued) {
            if *queued >= CHUNK {
                flush(store, con, pipe).await?;
                *queued = 0;
            }
        }
        Ok(())
    }

    pub async fn flush_all(
        &mut self,
        store: &Store,
        con: &mut RedisConn,
    ) -> Result<(), StoreError> {
        for (pipe, queued) in self.pipes.iter_mut().zip(&mut self.queued) {
            flush(store, con, pipe).await?;
            *queued = 0;
        }
        Ok(())
    }
}

/// Sends what `pipe` holds, if anything.
pub async fn flush(
    store: &Store,
    con: &mut RedisConn,
    pipe: &mut redis::Pipeline,
) -> Result<(), StoreError> {
    if pipe.is_empty() {
        return Ok(());
    }
    let sent = std::mem::take(pipe);
    store
        .bounded(async { Ok(sent.query_async::<()>(con).await?) })
        .await
}
