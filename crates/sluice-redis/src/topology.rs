//! Where the buckets live: the nodes serving them (read from the cluster's slot map), the
//! connections to those nodes, and the state the backend shares with its connections.

use crate::codec::{self, key_slot};
use crate::config::{Config, Mode};
use crate::reply::{array, invalid, is_busy, is_connection_error, is_topology_error, number, redis_err, text};
use sluice_state::CustomOp;
use sluice_store::StoreError;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// Read and write timeout of every connection to a node.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a batch keeps being regrouped while the cluster's slot map changes or a node does
/// not answer: long enough for a replica to take over from a failed primary (Redis needs the
/// node timeout plus an election).
pub(crate) const FAILOVER_WAIT: Duration = Duration::from_secs(30);
/// The longest pause between two readings of the slot map while waiting for it to settle.
const MAX_REROUTE_PAUSE: Duration = Duration::from_millis(500);

/// Waiting for a cluster's slot map to settle while a node fails over, or for a busy node
/// (an instance's batch, opening its connection, rolling a batch forward): the first reading
/// again at once (a slot moved), then with growing pauses, for up to [`FAILOVER_WAIT`].
pub(crate) struct Settling {
    started: Instant,
    pause: Duration,
}

impl Settling {
    pub(crate) fn new() -> Settling {
        Settling { started: Instant::now(), pause: Duration::ZERO }
    }

    /// Pauses, then reads the slot map again into `nodes`; an error once the wait is over.
    pub(crate) fn again(&mut self, shared: &Shared, nodes: &mut Nodes) -> Result<(), StoreError> {
        if self.started.elapsed() >= FAILOVER_WAIT {
            return Err(StoreError::Unavailable(format!(
                "the store did not settle within {} s: a node is down and no replica took its slots over, or a node stayed busy",
                FAILOVER_WAIT.as_secs()
            )));
        }
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).clamp(Duration::from_millis(10), MAX_REROUTE_PAUSE);
        if let Err(e) = shared.refresh(nodes) {
            tracing::debug!(error = %e, "reading the cluster's slot map failed; trying again");
        }
        Ok(())
    }
}

/// Which node serves each bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Topology {
    /// Connection URLs of the nodes (primaries).
    pub(crate) nodes: Vec<String>,
    /// Node index of each bucket.
    pub(crate) bucket_node: Vec<usize>,
}

impl Topology {
    /// The buckets each node serves.
    pub(crate) fn buckets_of(&self, node: usize) -> Vec<u16> {
        (0..self.bucket_node.len()).filter(|b| self.bucket_node[*b] == node).map(|b| b as u16).collect()
    }

    /// The node serving `bucket` (the first if the map does not know it).
    pub(crate) fn node_of(&self, bucket: u16) -> usize {
        self.bucket_node.get(usize::from(bucket)).copied().unwrap_or(0)
    }
}

/// Opens a connection to one node, with the I/O timeouts set.
fn open(url: &str) -> Result<redis::Connection, StoreError> {
    let client = redis::Client::open(url).map_err(|e| invalid(format!("{url}: {e}")))?;
    let conn = client.get_connection_with_timeout(IO_TIMEOUT).map_err(redis_err)?;
    conn.set_read_timeout(Some(IO_TIMEOUT)).map_err(redis_err)?;
    conn.set_write_timeout(Some(IO_TIMEOUT)).map_err(redis_err)?;
    Ok(conn)
}

/// What the backend and all its connections share.
pub(crate) struct Shared {
    /// The parsed URL.
    pub(crate) cfg: Config,
    /// The current bucket-to-node map.
    pub(crate) topology: RwLock<Topology>,
    /// Custom operations by vertex (they run in the client).
    pub(crate) custom: RwLock<HashMap<u16, Vec<CustomOp>>>,
    /// Connections for checkpoint, restore and clear.
    pub(crate) admin: Mutex<Nodes>,
    /// The nodes this backend loaded the function library on (see [`Shared::refresh`]).
    pub(crate) library_on: Mutex<HashSet<String>>,
}

/// How long one `WAIT` waits for the replicas (`replicas=` in the URL) to acknowledge writes.
const REPLICA_WAIT_MS: u64 = 2_000;
/// The pause before asking a busy node (`reply::is_busy`) for a `WAIT` again.
const BUSY_PAUSE: Duration = Duration::from_millis(20);

/// What [`Nodes::wait_for_replicas`] found.
pub(crate) enum Replicated {
    /// Enough replicas hold every write made so far over the connection to the node.
    Yes,
    /// The node no longer serves its slots or did not answer (a cluster failing over): the
    /// writes are to be made again over the new slot map.
    Moved(redis::RedisError),
}

/// Connections to nodes, by URL, opened on first use.
#[derive(Default)]
pub(crate) struct Nodes {
    conns: HashMap<String, redis::Connection>,
}

impl Nodes {
    /// The connection to `url`, opened if there is none.
    pub(crate) fn get(&mut self, url: &str) -> Result<&mut redis::Connection, StoreError> {
        if !self.conns.contains_key(url) {
            let c = open(url)?;
            self.conns.insert(url.to_string(), c);
        }
        self.conns.get_mut(url).ok_or_else(|| invalid("connection vanished"))
    }

    /// Waits until `want` replicas of `url` acknowledge every write made over this connection
    /// to it (Redis `WAIT`, which counts the connection's own writes): a primary failing now
    /// loses nothing its replicas do not have. A primary that has just taken over from a failed
    /// one has no replica until the failed machine comes back (or another replica migrates to
    /// it): the wait goes on for up to [`FAILOVER_WAIT`], as calls wait for a replica to take
    /// over, rather than count writes nobody else holds. `cluster`: a node that does not
    /// answer may be failing over ([`Replicated::Moved`]). With `want` 0, nothing to wait for.
    pub(crate) fn wait_for_replicas(&mut self, url: &str, want: u8, cluster: bool) -> Result<Replicated, StoreError> {
        if want == 0 {
            return Ok(Replicated::Yes);
        }
        let started = Instant::now();
        let wait = redis::cmd("WAIT").arg(want).arg(REPLICA_WAIT_MS).clone();
        loop {
            match self.query(url, &wait) {
                Ok(n) => {
                    let got: u64 = number(&n)?;
                    if got >= u64::from(want) {
                        return Ok(Replicated::Yes);
                    }
                    if started.elapsed() >= FAILOVER_WAIT {
                        return Err(StoreError::Unavailable(format!(
                            "{url}: {got} of {want} replica(s) acknowledged the writes within {} s",
                            FAILOVER_WAIT.as_secs()
                        )));
                    }
                    tracing::warn!(
                        node = url,
                        replicas = got,
                        wanted = want,
                        "writes not yet acknowledged by enough replicas; waiting"
                    );
                }
                Err(e) if cluster && (is_topology_error(&e) || is_connection_error(&e)) => {
                    return Ok(Replicated::Moved(e))
                }
                // The writes were made: only the wait is asked again (making them again could
                // apply an untagged update twice).
                Err(e) if is_busy(&e) && started.elapsed() < FAILOVER_WAIT => std::thread::sleep(BUSY_PAUSE),
                Err(e) => return Err(redis_err(e)),
            }
        }
    }

    /// Runs a command on a node; a broken connection is dropped (reopened next time).
    pub(crate) fn query(&mut self, url: &str, cmd: &redis::Cmd) -> Result<redis::Value, redis::RedisError> {
        let conn = self
            .get(url)
            .map_err(|e| redis::RedisError::from((redis::ErrorKind::IoError, "connect", e.to_string())))?;
        let r = cmd.query::<redis::Value>(conn);
        if let Err(e) = &r {
            if is_connection_error(e) {
                self.conns.remove(url);
            }
        }
        r
    }
}

impl Shared {
    /// The hash tag of a bucket's keys, `{prefix:bucket}`.
    fn tag(&self, bucket: u16) -> String {
        format!("{{{}:{}}}", self.cfg.prefix, bucket)
    }

    /// The bucket of a key, by its encoding.
    pub(crate) fn bucket_of(&self, kenc: &[u8]) -> u16 {
        (codec::bucket_hash(kenc) % u64::from(self.cfg.buckets)) as u16
    }

    /// The current bucket-to-node map.
    pub(crate) fn topology(&self) -> Topology {
        read_lock(&self.topology).clone()
    }

    /// Reads the slot map (cluster mode) and maps buckets to nodes; loads the function
    /// library on the nodes this backend has not loaded it on (a primary it has not met, one
    /// a call found without it), as far as they take it now: one that does not (busy, down, no
    /// longer a primary) is tried again at the next reading, which a call finding it missing
    /// makes before it is sent again.
    pub(crate) fn refresh(&self, nodes: &mut Nodes) -> Result<Topology, StoreError> {
        let topo = match &self.cfg.mode {
            Mode::Single(url) => {
                Topology { nodes: vec![url.clone()], bucket_node: vec![0; usize::from(self.cfg.buckets)] }
            }
            Mode::Cluster(seeds) => self.cluster_topology(seeds, nodes)?,
        };
        *write_lock(&self.topology) = topo.clone();
        for url in &topo.nodes {
            if !lock_mutex(&self.library_on).contains(url) {
                if let Err(e) = self.load_library(nodes, url) {
                    tracing::debug!(node = %url, error = %e, "loading the function library failed; trying again later");
                }
            }
        }
        Ok(topo)
    }

    /// Loads (or replaces) Sluice's function library on the node at `url`.
    pub(crate) fn load_library(&self, nodes: &mut Nodes, url: &str) -> Result<(), redis::RedisError> {
        let load = redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(crate::LIBRARY).clone();
        nodes.query(url, &load)?;
        lock_mutex(&self.library_on).insert(url.to_string());
        Ok(())
    }

    /// A call found the function library missing on the node at `url` (every node: `None`):
    /// restarted without its data, added to the cluster, flushed. The next reading of the
    /// slot map loads it there again.
    pub(crate) fn library_lost(&self, url: Option<&str>) {
        let mut on = lock_mutex(&self.library_on);
        match url {
            Some(u) => {
                on.remove(u);
            }
            None => on.clear(),
        }
    }

    /// Reads the slot map from the first reachable node (the seeds, then the nodes known so
    /// far) and maps each bucket to the primary serving its hash tag's slot.
    fn cluster_topology(&self, seeds: &[String], nodes: &mut Nodes) -> Result<Topology, StoreError> {
        let known = self.topology().nodes;
        let candidates = seeds.iter().map(|s| format!("redis://{s}/")).chain(known);
        let mut last = invalid("no cluster node reachable");
        let mut slots = None;
        for url in candidates {
            match nodes.query(&url, &redis::cmd("CLUSTER").arg("SLOTS").clone()) {
                Ok(v) => {
                    slots = Some(v);
                    break;
                }
                Err(e) => last = redis_err(e),
            }
        }
        let slots = slots.ok_or(last)?;
        let mut ranges = Vec::new();
        for r in array(&slots)? {
            let r = array(r)?;
            let (Some(lo), Some(hi), Some(master)) = (r.first(), r.get(1), r.get(2)) else {
                return Err(StoreError::Protocol("short CLUSTER SLOTS entry".into()));
            };
            let m = array(master)?;
            let (Some(host), Some(port)) = (m.first(), m.get(1)) else {
                return Err(StoreError::Protocol("short CLUSTER SLOTS node".into()));
            };
            let url = format!("redis://{}:{}/", text(host)?, number::<u16>(port)?);
            ranges.push((number::<u16>(lo)?, number::<u16>(hi)?, url));
        }
        let mut urls: Vec<String> = ranges.iter().map(|r| r.2.clone()).collect();
        urls.sort();
        urls.dedup();
        let mut bucket_node = Vec::with_capacity(usize::from(self.cfg.buckets));
        for b in 0..self.cfg.buckets {
            let slot = key_slot(self.tag(b).as_bytes());
            let url = ranges
                .iter()
                .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
                .map(|r| r.2.clone())
                .ok_or_else(|| invalid(format!("cluster slot {slot} is not served")))?;
            bucket_node.push(urls.iter().position(|u| *u == url).unwrap_or(0));
        }
        Ok(Topology { nodes: urls, bucket_node })
    }

    /// The custom operations registered for `vertex`.
    pub(crate) fn custom_ops(&self, vertex: u16) -> Vec<CustomOp> {
        read_lock(&self.custom).get(&vertex).cloned().unwrap_or_default()
    }
}

// The backend keeps working after a panic elsewhere: a poisoned lock is used as it is (its
// writers replace or insert whole values, so what it guards stays consistent).

/// Reads `lock`, poisoned or not.
pub(crate) fn read_lock<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

/// Writes `lock`, poisoned or not.
pub(crate) fn write_lock<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

/// Locks `mutex`, poisoned or not.
pub(crate) fn lock_mutex<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
