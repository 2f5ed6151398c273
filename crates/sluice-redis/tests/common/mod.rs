//! Shared by the Redis tests: the servers come from the environment (see `scripts/redis-env.sh`),
//! and every test works in a fresh keyspace (its own prefix), deleted when it ends.

#![allow(dead_code)]

use sluice_redis::RedisBackend;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which server a test uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `SLUICE_REDIS_URL`.
    Single,
    /// `SLUICE_REDIS_CLUSTER_URL`.
    Cluster,
}

/// The server's URL from the environment. A missing variable fails the test: these tests never
/// pass without having run.
pub fn url(t: Target) -> String {
    let var = match t {
        Target::Single => "SLUICE_REDIS_URL",
        Target::Cluster => "SLUICE_REDIS_CLUSTER_URL",
    };
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "{var} is not set: start the test servers with `scripts/redis-env.sh start DIR` and set \
             SLUICE_REDIS_URL=redis://127.0.0.1:6390 \
             SLUICE_REDIS_CLUSTER_URL=redis+cluster://127.0.0.1:7390,127.0.0.1:7391,127.0.0.1:7392 \
             (scripts/test-all.sh does both)"
        ),
    }
}

/// A backend in a fresh keyspace; the keyspace is deleted when the guard drops.
pub struct Fresh {
    pub backend: RedisBackend,
}

impl Drop for Fresh {
    fn drop(&mut self) {
        let _ = self.backend.clear();
    }
}

/// A fresh keyspace on `t` with `params` added to the URL (e.g. `buckets=1`).
pub fn fresh(t: Target, params: &str) -> Fresh {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let base = url(t);
    let sep = if base.contains('?') { '&' } else { '?' };
    let extra = if params.is_empty() { String::new() } else { format!("&{params}") };
    let full = format!("{base}{sep}prefix=test-{}-{n}-{}{extra}", std::process::id(), nanos % 1_000_000_000);
    let backend = RedisBackend::connect(&full).unwrap_or_else(|e| panic!("connect {full}: {e}"));
    Fresh { backend }
}
