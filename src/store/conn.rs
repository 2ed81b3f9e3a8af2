//! The connections a [`super::Store`] holds: one multiplexed connection of the hot path
//! (a single Redis's `ConnectionManager` or a cluster connection), and the background readers'.

use bb8_redis::RedisConnectionManager;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

pub type RedisPool = bb8::Pool<RedisConnectionManager>;

/// A multiplexed connection to a single Redis or to a cluster; cloning it is cheap and shares
/// the sockets.
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Background connections: a bb8 pool on a single Redis, a second cluster connection on a
/// cluster.
#[derive(Clone)]
pub(super) enum Background {
    Pool(RedisPool),
    Cluster(ClusterConnection),
}

/// Whether a stream read's reply holds any entry: `XREADGROUP` answers nil for none,
/// `XAUTOCLAIM` `[cursor, [], deleted]`.
pub(super) fn carries_entries(v: &Value) -> bool {
    match v {
        Value::Nil => false,
        // XAUTOCLAIM: [cursor, entries, deleted ids].
        Value::Array(parts) if parts.len() >= 2 && !matches!(parts[0], Value::Array(_)) => {
            !matches!(&parts[1], Value::Array(e) if e.is_empty())
        }
        // XREADGROUP: [[stream, entries], ...].
        Value::Array(streams) => streams.iter().any(|s| match s {
            Value::Array(p) if p.len() == 2 => !matches!(&p[1], Value::Array(e) if e.is_empty()),
            _ => true,
        }),
        _ => true,
    }
}

/// The policy values of a `CONFIG GET maxmemory-policy` reply, from one node (`[name,
/// value]`) or several (a map of node to that).
pub(super) fn collect_policies(v: Value, out: &mut Vec<String>) {
    match v {
        Value::Array(items) if items.len() == 2 && !matches!(items[0], Value::Array(_)) => {
            if let Ok(p) = redis::from_redis_value::<String>(items[1].clone()) {
                out.push(p);
            }
        }
        Value::Array(items) => items.into_iter().for_each(|i| collect_policies(i, out)),
        Value::Map(pairs) => pairs
            .into_iter()
            .for_each(|(_, v)| collect_policies(v, out)),
        _ => {}
    }
}
