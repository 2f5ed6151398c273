//! Reaching the store under test: the embedded store or a fresh Redis keyspace, and a raw
//! connection that sends one batch and waits for its answers.

use anyhow::{anyhow, bail, Context, Result};
use sluice_packet::InstanceId;
use sluice_redis::RedisBackend;
use sluice_state::{StateOp, Value};
use sluice_store::{Backend, Connection, EmbeddedStore, Replies, Request, StoreKey, StoreOp};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a blocking store call may take before the benchmark gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What the measurements need to reach a store.
pub(super) struct Env<'a> {
    /// The Redis URL, if the Redis cases run.
    pub(super) redis: Option<&'a str>,
    /// Numbers fresh Redis keyspaces.
    pub(super) seq: &'a AtomicU64,
    /// Shard threads of the embedded store in the mode cases.
    pub(super) store_threads: usize,
}

impl Env<'_> {
    /// A Redis backend on a fresh keyspace.
    fn fresh_redis(&self) -> Result<Arc<RedisBackend>> {
        let url = self.redis.ok_or_else(|| anyhow!("no --redis"))?;
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let sep = if url.contains('?') { '&' } else { '?' };
        let full = format!("{url}{sep}prefix=bench-{}-{n}", std::process::id());
        Ok(Arc::new(RedisBackend::connect(&full).with_context(|| format!("connecting to {url}"))?))
    }

    /// A store for one measurement: Redis on a fresh keyspace, or the embedded store with
    /// `threads` shards.
    pub(super) fn store(&self, redis: bool, threads: usize) -> Result<Store> {
        if redis {
            let r = self.fresh_redis()?;
            Ok(Store { backend: r.clone(), redis: Some(r) })
        } else {
            let embedded = EmbeddedStore::start(threads.max(1)).context("starting the embedded store")?;
            Ok(Store { backend: Arc::new(embedded), redis: None })
        }
    }
}

/// A store under test, and the same store as Redis if it is one (to clear its keyspace
/// afterwards).
pub(super) struct Store {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) redis: Option<Arc<RedisBackend>>,
}

/// Clears the keyspace of a measurement's Redis store, if it had one.
pub(super) fn clear_redis(redis: Option<&RedisBackend>) -> Result<()> {
    if let Some(r) = redis {
        r.clear().context("clearing the Redis keyspace")?;
    }
    Ok(())
}

/// One instance's raw connection to the store, numbering its batches and requests.
pub(super) struct RawClient {
    conn: Box<dyn Connection>,
    me: InstanceId,
    /// The last batch number sent.
    number: u64,
    /// The last request id used.
    next_id: u64,
}

impl RawClient {
    /// Connects as instance `me`.
    pub(super) fn open(backend: &dyn Backend, me: InstanceId) -> Result<RawClient> {
        let conn = backend.connect(me).map_err(|e| anyhow!("{e}"))?;
        Ok(RawClient { conn, me, number: 0, next_id: 0 })
    }

    /// Sends `ops` as one batch, each with a reply, and waits for every answer (in `ops` order).
    pub(super) fn call(&mut self, ops: Vec<(StoreKey, StateOp)>) -> Result<Vec<Option<Value>>> {
        let first = self.next_id + 1;
        let n = ops.len();
        let reqs: Vec<Request> = ops
            .into_iter()
            .map(|(key, op)| {
                self.next_id += 1;
                Request { id: self.next_id, client: self.me, tag: None, key, op: StoreOp::State(op), reply: true }
            })
            .collect();
        self.number += 1;
        self.conn.send(self.number, reqs.into()).map_err(|e| anyhow!("{e}"))?;
        let mut results: Vec<Option<Option<Value>>> = vec![None; n];
        let mut left = n;
        let mut replies = Replies::default();
        let deadline = Instant::now() + CALL_TIMEOUT;
        while left > 0 {
            self.conn.wait(&mut replies, Duration::from_millis(100)).map_err(|e| anyhow!("{e}"))?;
            for r in replies.responses.drain(..) {
                let Some(slot) = r.id.checked_sub(first).and_then(|i| results.get_mut(i as usize)) else {
                    continue;
                };
                if slot.is_none() {
                    left -= 1;
                }
                *slot = Some(r.result.map_err(|e| anyhow!("store error: {e}"))?);
            }
            replies.acked.clear();
            if left > 0 && Instant::now() > deadline {
                bail!("the store did not answer within {CALL_TIMEOUT:?}");
            }
        }
        Ok(results.into_iter().map(Option::flatten).collect())
    }
}
