//! A Redis store backend for Sluice: the [`Backend`]/[`Connection`] protocol of `sluice-store`
//! with exactly the embedded engine's semantics, executed atomically inside Redis (≥ 7) by a
//! Redis Functions library (`src/sluice.lua`, loaded with `FUNCTION LOAD REPLACE` when the
//! backend connects).
//!
//! # URLs
//! - `redis://host:port[/db][?prefix=P&buckets=N]`: one Redis server.
//! - `redis+cluster://h1:p1,h2:p2,...[?prefix=P&buckets=N]`: a Redis Cluster, given by any of
//!   its primaries (the slot map is read with `CLUSTER SLOTS`). Cluster mode is chosen by the
//!   scheme, not detected, so that a URL says what it means; a `redis://` URL pointing at a
//!   cluster node fails on the first key the node does not serve.
//!
//! `prefix` (default `sluice`, letters, digits, `-`, `_`, `.`) names the keyspace, so several
//! stores (and tests) share a server; [`RedisBackend::clear`] deletes it. `buckets` (default 16)
//! is the number of shards, the counterpart of the embedded store's threads.
//!
//! # Layout: buckets
//! Every value belongs to one of `buckets` buckets, by a stable hash (FNV-1a) of its key's
//! encoding. All keys of bucket `b` carry the hash tag `{P:b}`, so a bucket lives in one cluster
//! slot: a value's string or list, its metadata hash (form, version, owner, claimant, timer),
//! its subscriber set, and the bucket's own structures — the per-clock log and its index for
//! `ForgetClock`, the TS vector, the timer index, the packet time, and one notification list per
//! client. A bucket is exactly a shard of the embedded engine: the TS vector returned with a
//! read is the bucket's (as it is the shard's there), `ForgetClock` and `AdvanceTime` are
//! applied to every bucket in request order, and a checkpoint keeps each instance's highest
//! clock over all buckets. With `buckets=1` a single server behaves like a one-thread embedded
//! store. The layout is listed at the top of `sluice.lua`.
//!
//! # Execution
//! `send` groups a batch's requests by node (the node serving each bucket's slot; broadcast
//! requests go to every node) and sends each node **one** `FCALL sluice_exec` carrying its
//! requests in order, so a batch costs one round trip per node and each node applies its part
//! atomically, in issue order. Functions are called without declared keys and with the flag
//! `allow-cross-slot-keys` (a node serves many buckets); in cluster mode the function first
//! touches every bucket it was told about, so a bucket that moved (resharding) fails the call
//! before anything changed, and the client refreshes the slot map and regroups. The batch is
//! acknowledged when every node has answered; replies are queued for `poll`.
//!
//! # Values
//! See [`codec`]: `Int` is stored as decimal text (Lua increments it with `INCRBY`), other
//! values as a versioned binary encoding, lists as Redis lists of element encodings.
//! Compare-and-set compares encodings in Lua.
//!
//! # What runs in the client: custom operations (optimistic)
//! Custom operations are Rust `fn`s and cannot run inside Redis; neither can a few exact
//! cases of built-ins (incrementing a float, an `i64` increment that wraps, a compare-and-set
//! whose expected value holds a float). For those, `sluice_exec` stops at the operation and
//! returns the value's encoding and version (after the per-clock-log and ownership checks);
//! the connection applies the operation with `sluice_state::ops::apply` and sends a
//! conditional write (`W`) that applies only if the version is unchanged — and checks the log
//! and ownership again, logs the tag, updates the TS vector and notifies subscribers — followed
//! by the rest of the node's requests. On a version conflict the function returns the fresh
//! value and the connection retries. Each value's operations are therefore still atomic
//! (linearised at the conditional write) and tagged ones are applied exactly once.
//!
//! # Notifications
//! Functions `RPUSH` notifications to a per-bucket, per-client list; `notifications()` drains
//! the caller's lists with one function call per node. Lists rather than Pub/Sub, client
//! tracking or keyspace notifications because a notification must not be lost while its
//! client is not listening (a timer firing for an instance that has not polled yet), must be
//! delivered exactly once, and must be produced atomically with the change that caused it.

pub mod codec;

use codec::{decode_key, decode_opt, encode_key, encode_opt, encode_value, has_float, key_slot, Form};
use sluice_packet::{Clock, InstanceId};
use sluice_state::{ops::apply, CustomOp, StateError, StateOp};
use sluice_store::OpTag;
use sluice_store::{
    Backend, Checkpoint, Connection, Notification, Replies, Request, Response, StoreError, StoreOp, TsVector,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// The Lua library (Redis Functions).
pub const LIBRARY: &str = include_str!("sluice.lua");

const DEFAULT_BUCKETS: u16 = 16;
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Conditional writes of one client operation retried at most this often under contention.
const MAX_CONFLICTS: usize = 10_000;
/// Times a call is regrouped after the cluster's slot map changed.
const MAX_REROUTES: usize = 5;

/// How the backend reaches Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// One server: its connection URL (without the query).
    Single(String),
    /// A cluster: seed addresses `host:port`.
    Cluster(Vec<String>),
}

/// The parsed URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Config {
    mode: Mode,
    prefix: String,
    buckets: u16,
    /// The URL without credentials, for reports.
    display: String,
}

fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::Unavailable(msg.into())
}

fn parse_url(url: &str) -> Result<Config, StoreError> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut prefix = "sluice".to_string();
    let mut buckets = DEFAULT_BUCKETS;
    for kv in query.into_iter().flat_map(|q| q.split('&')).filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "prefix" => {
                let ok = !v.is_empty()
                    && v.len() <= 64
                    && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
                if !ok {
                    return Err(invalid(format!("prefix {v:?}: use 1-64 letters, digits, '-', '_', '.'")));
                }
                prefix = v.to_string();
            }
            "buckets" => {
                buckets = v
                    .parse::<u16>()
                    .ok()
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or_else(|| invalid(format!("buckets {v:?}: a number from 1 to 4096")))?;
            }
            other => return Err(invalid(format!("unknown URL parameter {other:?} (prefix, buckets)"))),
        }
    }
    let strip_credentials = |rest: &str| match rest.rsplit_once('@') {
        Some((_, host)) => host.to_string(),
        None => rest.to_string(),
    };
    if let Some(rest) = base.strip_prefix("redis+cluster://") {
        let seeds: Vec<String> =
            rest.trim_end_matches('/').split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        if seeds.is_empty() || seeds.iter().any(|s| !s.contains(':') || s.contains('@')) {
            return Err(invalid(format!("{url}: expected redis+cluster://host:port,host:port,...")));
        }
        let display = format!("redis+cluster://{}", seeds.join(","));
        return Ok(Config { mode: Mode::Cluster(seeds), prefix, buckets, display });
    }
    if let Some(rest) = base.strip_prefix("redis://") {
        let display = format!("redis://{}", strip_credentials(rest));
        return Ok(Config { mode: Mode::Single(base.to_string()), prefix, buckets, display });
    }
    Err(invalid(format!("{url}: expected redis://host:port or redis+cluster://host:port,...")))
}

fn redis_err(e: redis::RedisError) -> StoreError {
    if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Protocol(e.to_string())
    }
}

/// Whether a failed call should be retried on a fresh slot map.
fn is_topology_error(e: &redis::RedisError) -> bool {
    let s = e.to_string();
    e.is_cluster_error()
        || s.contains("non local key")
        || s.contains("MOVED")
        || s.contains("ASK")
        || s.contains("CLUSTERDOWN")
        || s.contains("TRYAGAIN")
}

/// Which node serves each bucket.
#[derive(Debug, Clone)]
struct Topology {
    /// Connection URLs of the nodes (primaries).
    nodes: Vec<String>,
    /// Node index of each bucket.
    bucket_node: Vec<usize>,
}

impl Topology {
    /// The buckets each node serves.
    fn buckets_of(&self, node: usize) -> Vec<u16> {
        (0..self.bucket_node.len()).filter(|b| self.bucket_node[*b] == node).map(|b| b as u16).collect()
    }
}

fn open(url: &str) -> Result<redis::Connection, StoreError> {
    let client = redis::Client::open(url).map_err(|e| invalid(format!("{url}: {e}")))?;
    let conn = client.get_connection_with_timeout(IO_TIMEOUT).map_err(redis_err)?;
    conn.set_read_timeout(Some(IO_TIMEOUT)).map_err(redis_err)?;
    conn.set_write_timeout(Some(IO_TIMEOUT)).map_err(redis_err)?;
    Ok(conn)
}

fn bytes(v: &redis::Value) -> Result<&[u8], StoreError> {
    match v {
        redis::Value::BulkString(b) => Ok(b),
        redis::Value::SimpleString(s) => Ok(s.as_bytes()),
        redis::Value::Nil => Ok(&[]),
        other => Err(StoreError::Protocol(format!("expected a string, got {other:?}"))),
    }
}

fn text(v: &redis::Value) -> Result<String, StoreError> {
    match v {
        redis::Value::Int(i) => Ok(i.to_string()),
        other => String::from_utf8(bytes(other)?.to_vec()).map_err(|_| StoreError::Protocol("not UTF-8".into())),
    }
}

fn array(v: &redis::Value) -> Result<&[redis::Value], StoreError> {
    match v {
        redis::Value::Array(a) | redis::Value::Set(a) => Ok(a),
        redis::Value::Nil => Ok(&[]),
        other => Err(StoreError::Protocol(format!("expected an array, got {other:?}"))),
    }
}

fn number<T: std::str::FromStr>(v: &redis::Value) -> Result<T, StoreError> {
    let s = text(v)?;
    s.parse().map_err(|_| StoreError::Protocol(format!("expected a number, got {s:?}")))
}

fn codec_err(e: codec::CodecError) -> StoreError {
    StoreError::Protocol(e.to_string())
}

/// A flat `client, clock, ...` array as a sorted TS vector.
fn ts_of(v: &redis::Value) -> Result<Vec<(InstanceId, Clock)>, StoreError> {
    let a = array(v)?;
    let mut ts = Vec::with_capacity(a.len() / 2);
    for pair in a.chunks(2) {
        if let [c, k] = pair {
            ts.push((InstanceId(number(c)?), Clock(number(k)?)));
        }
    }
    ts.sort();
    Ok(ts)
}

fn hex16(x: u64) -> String {
    format!("{x:016x}")
}

/// The `ZRANGEBYLEX` upper bound selecting members whose first 16 hex digits are `<= x`.
fn upto(x: u64) -> String {
    match x.checked_add(1) {
        Some(n) => format!("({}", hex16(n)),
        None => "+".to_string(),
    }
}

fn static_op(s: &str) -> Option<&'static str> {
    ["incr", "push", "pop", "pop_n"].into_iter().find(|x| *x == s)
}

fn static_kind(s: &str) -> Option<&'static str> {
    ["int", "float", "endpoint", "tuple", "ints", "list", "bytes"].into_iter().find(|x| *x == s)
}

struct Shared {
    cfg: Config,
    topology: RwLock<Topology>,
    custom: RwLock<HashMap<u16, Vec<CustomOp>>>,
    /// Connections for checkpoint, restore and clear.
    admin: Mutex<Nodes>,
}

/// Connections to nodes, by URL, opened on first use.
#[derive(Default)]
struct Nodes {
    conns: HashMap<String, redis::Connection>,
}

impl Nodes {
    fn get(&mut self, url: &str) -> Result<&mut redis::Connection, StoreError> {
        if !self.conns.contains_key(url) {
            let c = open(url)?;
            self.conns.insert(url.to_string(), c);
        }
        self.conns.get_mut(url).ok_or_else(|| invalid("connection vanished"))
    }

    /// Runs a command on a node; a broken connection is dropped (reopened next time).
    fn query(&mut self, url: &str, cmd: &redis::Cmd) -> Result<redis::Value, redis::RedisError> {
        let conn = self
            .get(url)
            .map_err(|e| redis::RedisError::from((redis::ErrorKind::IoError, "connect", e.to_string())))?;
        let r = cmd.query::<redis::Value>(conn);
        if let Err(e) = &r {
            if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                self.conns.remove(url);
            }
        }
        r
    }
}

impl Shared {
    fn tag(&self, bucket: u16) -> String {
        format!("{{{}:{}}}", self.cfg.prefix, bucket)
    }

    fn bucket_of(&self, kenc: &[u8]) -> u16 {
        (codec::bucket_hash(kenc) % u64::from(self.cfg.buckets)) as u16
    }

    fn topology(&self) -> Topology {
        match self.topology.read() {
            Ok(t) => t.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Reads the slot map (cluster mode) and maps buckets to nodes.
    fn refresh(&self, nodes: &mut Nodes) -> Result<Topology, StoreError> {
        let topo = match &self.cfg.mode {
            Mode::Single(url) => {
                Topology { nodes: vec![url.clone()], bucket_node: vec![0; usize::from(self.cfg.buckets)] }
            }
            Mode::Cluster(seeds) => {
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
                Topology { nodes: urls, bucket_node }
            }
        };
        match self.topology.write() {
            Ok(mut t) => *t = topo.clone(),
            Err(p) => *p.into_inner() = topo.clone(),
        }
        Ok(topo)
    }

    fn custom_ops(&self, vertex: u16) -> Vec<CustomOp> {
        let map = match self.custom.read() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.get(&vertex).cloned().unwrap_or_default()
    }
}

/// A Sluice store in Redis (one server or a cluster). Cheap to clone; every
/// [`Backend::connect`] opens the instance's own connections.
#[derive(Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").field("url", &self.shared.cfg.display).finish()
    }
}

impl RedisBackend {
    /// Connects to `redis://host:port` or `redis+cluster://h1:p1,h2:p2,...` (see the crate
    /// docs for the parameters), reads the cluster's slot map and loads the function library
    /// on every node.
    pub fn connect(url: &str) -> Result<RedisBackend, StoreError> {
        let cfg = parse_url(url)?;
        let shared = Arc::new(Shared {
            cfg,
            topology: RwLock::new(Topology { nodes: Vec::new(), bucket_node: Vec::new() }),
            custom: RwLock::new(HashMap::new()),
            admin: Mutex::new(Nodes::default()),
        });
        let backend = RedisBackend { shared };
        backend.with_admin(|shared, nodes| {
            let topo = shared.refresh(nodes)?;
            for url in &topo.nodes {
                let load = redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(LIBRARY).clone();
                nodes.query(url, &load).map_err(|e| {
                    if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                        invalid(format!("{url}: {e}"))
                    } else {
                        invalid(format!("{url}: cannot load the Sluice function library (Redis >= 7 needed): {e}"))
                    }
                })?;
            }
            Ok(())
        })?;
        Ok(backend)
    }

    /// The key prefix (namespace) of this store.
    pub fn prefix(&self) -> &str {
        &self.shared.cfg.prefix
    }

    /// The number of buckets (shards).
    pub fn buckets(&self) -> u16 {
        self.shared.cfg.buckets
    }

    /// Deletes every key of this store's prefix on every node (tests, resets).
    pub fn clear(&self) -> Result<(), StoreError> {
        self.with_admin(|shared, nodes| {
            let topo = shared.topology();
            let pattern = format!("{{{}:*", shared.cfg.prefix);
            for url in &topo.nodes {
                let mut cursor: u64 = 0;
                loop {
                    let scan = redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000).clone();
                    let v = nodes.query(url, &scan).map_err(redis_err)?;
                    let a = array(&v)?;
                    let (Some(next), Some(keys)) = (a.first(), a.get(1)) else {
                        return Err(StoreError::Protocol("short SCAN reply".into()));
                    };
                    cursor = number(next)?;
                    for k in array(keys)? {
                        let del = redis::cmd("UNLINK").arg(bytes(k)?).clone();
                        nodes.query(url, &del).map_err(redis_err)?;
                    }
                    if cursor == 0 {
                        break;
                    }
                }
            }
            Ok(())
        })
    }

    fn with_admin<T>(&self, f: impl FnOnce(&Shared, &mut Nodes) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut nodes = match self.shared.admin.lock() {
            Ok(n) => n,
            Err(p) => p.into_inner(),
        };
        f(&self.shared, &mut nodes)
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> String {
        format!("{} (prefix {}, {} buckets)", self.shared.cfg.display, self.shared.cfg.prefix, self.shared.cfg.buckets)
    }

    fn register_custom_ops(&self, vertex: u16, ops: &[CustomOp]) -> Result<(), StoreError> {
        let mut map = match self.shared.custom.write() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.insert(vertex, ops.to_vec());
        Ok(())
    }

    fn connect(&self, client: InstanceId) -> Result<Box<dyn Connection>, StoreError> {
        let mut conn = RedisConnection {
            shared: self.shared.clone(),
            client_arg: client.0.to_string().into_bytes(),
            nodes: Nodes::default(),
            next_batch: 1,
            held: BTreeMap::new(),
            responses: VecDeque::new(),
            acked: Vec::new(),
            notes: Vec::new(),
        };
        // Fail now rather than at the first batch if a node is unreachable.
        for url in self.shared.topology().nodes {
            conn.nodes.get(&url)?;
        }
        Ok(Box::new(conn))
    }

    fn checkpoint(&self) -> Result<Checkpoint, StoreError> {
        self.with_admin(|shared, nodes| {
            let topo = shared.topology();
            let mut values = Vec::new();
            let mut timers = Vec::new();
            let mut ts: BTreeMap<InstanceId, Clock> = BTreeMap::new();
            for (n, url) in topo.nodes.iter().enumerate() {
                let buckets = topo.buckets_of(n);
                let mut cmd = redis::cmd("FCALL");
                cmd.arg("sluice_dump").arg(0).arg(&shared.cfg.prefix).arg(buckets.len());
                for b in &buckets {
                    cmd.arg(*b);
                }
                let v = nodes.query(url, &cmd).map_err(redis_err)?;
                let parts = array(&v)?;
                let (Some(vals), Some(t), Some(tm)) = (parts.first(), parts.get(1), parts.get(2)) else {
                    return Err(StoreError::Protocol("short sluice_dump reply".into()));
                };
                for triple in array(tm)?.chunks(3) {
                    if let [k, d, who] = triple {
                        let kb = bytes(k)?;
                        let (key, used) = decode_key(kb).map_err(codec_err)?;
                        if used != kb.len() {
                            return Err(StoreError::Protocol("trailing bytes after a key".into()));
                        }
                        let d = text(d)?;
                        let deadline = u64::from_str_radix(&d, 16)
                            .map_err(|_| StoreError::Protocol(format!("timer deadline {d:?} is not hex")))?;
                        timers.push((key, deadline, InstanceId(number(who)?)));
                    }
                }
                for pair in array(vals)?.chunks(2) {
                    if let [k, e] = pair {
                        let kb = bytes(k)?;
                        let (key, used) = decode_key(kb).map_err(codec_err)?;
                        if used != kb.len() {
                            return Err(StoreError::Protocol("trailing bytes after a key".into()));
                        }
                        if let Some(value) = decode_opt(bytes(e)?).map_err(codec_err)? {
                            values.push((key, value));
                        }
                    }
                }
                for (i, c) in ts_of(t)? {
                    let e = ts.entry(i).or_insert(c);
                    *e = (*e).max(c);
                }
            }
            values.sort_by_key(|v| v.0);
            timers.sort();
            Ok(Checkpoint { values, ts: ts.into_iter().collect(), timers })
        })
    }

    fn restore(&self, cp: &Checkpoint) -> Result<(), StoreError> {
        self.with_admin(|shared, nodes| {
            let topo = shared.topology();
            let mut per_node: Vec<Vec<Vec<u8>>> = vec![Vec::new(); topo.nodes.len()];
            // Timers per node: bucket, key, deadline, recipient each.
            let mut timers_of: Vec<Vec<Vec<u8>>> = vec![Vec::new(); topo.nodes.len()];
            for (k, d, who) in &cp.timers {
                let kenc = encode_key(k);
                let b = shared.bucket_of(&kenc);
                let n = topo.bucket_node.get(usize::from(b)).copied().unwrap_or(0);
                if let Some(args) = timers_of.get_mut(n) {
                    args.push(b.to_string().into_bytes());
                    args.push(kenc);
                    args.push(hex16(*d).into_bytes());
                    args.push(who.0.to_string().into_bytes());
                }
            }
            for (k, v) in &cp.values {
                let kenc = encode_key(k);
                let b = shared.bucket_of(&kenc);
                let n = topo.bucket_node.get(usize::from(b)).copied().unwrap_or(0);
                if let Some(args) = per_node.get_mut(n) {
                    args.push(b.to_string().into_bytes());
                    args.push(kenc);
                    Form::of(Some(v)).push_args(args);
                }
            }
            for (n, url) in topo.nodes.iter().enumerate() {
                let buckets = topo.buckets_of(n);
                let mut cmd = redis::cmd("FCALL");
                cmd.arg("sluice_restore").arg(0).arg(&shared.cfg.prefix).arg(buckets.len());
                for b in &buckets {
                    cmd.arg(*b);
                }
                cmd.arg(cp.ts.len());
                for (i, c) in &cp.ts {
                    cmd.arg(i.0).arg(c.0);
                }
                let timers = timers_of.get(n).map(Vec::as_slice).unwrap_or(&[]);
                cmd.arg(timers.len() / 4);
                for a in timers {
                    cmd.arg(a.as_slice());
                }
                for a in per_node.get(n).map(Vec::as_slice).unwrap_or(&[]) {
                    cmd.arg(a.as_slice());
                }
                nodes.query(url, &cmd).map_err(redis_err)?;
            }
            Ok(())
        })
    }

    /// Deletes the prefix's whole keyspace ([`RedisBackend::clear`]): values, metadata, logs, TS
    /// vectors, timers, packet times and notification lists. Batch sequences live in each
    /// [`Connection`] and custom operations in this process, so the latter survive; connections
    /// opened before the wipe must still be replaced, as the trait requires.
    fn wipe(&self) -> Result<(), StoreError> {
        self.clear()
    }
}

/// One request as `sluice_exec` arguments, with where it goes.
#[derive(Debug, Clone)]
struct Op {
    /// Index of the request in its batch.
    req: usize,
    /// Its bucket; `None` for requests every bucket applies (`ForgetClock`, `AdvanceTime`).
    bucket: Option<u16>,
    /// The key's encoding (empty for broadcast requests).
    kenc: Vec<u8>,
    /// The arguments (header and operands).
    args: Vec<Vec<u8>>,
}

/// What a node answered about one operation.
enum Outcome {
    /// Done (answer included when wanted or failed).
    Done(Option<Response>),
    /// Must be applied in the client: the value's encoding and version, and for an
    /// `IncrMany` which of its tags were logged already.
    Fallback(Vec<u8>, String, Vec<bool>),
}

/// One instance's connection: its own connection to every node.
struct RedisConnection {
    shared: Arc<Shared>,
    client_arg: Vec<u8>,
    nodes: Nodes,
    /// The next batch number to apply (numbers are per connection, from 1).
    next_batch: u64,
    /// Batches that arrived before their predecessors.
    held: BTreeMap<u64, Arc<[Request]>>,
    responses: VecDeque<Response>,
    acked: Vec<u64>,
    notes: Vec<Notification>,
}

/// The per-clock log's name for a tag (the embedded engine's `(clock, vertex, seq)`).
fn logid(tag: OpTag, vertex: u16) -> Vec<u8> {
    format!("{}{:04x}{:04x}", hex16(tag.clock.0), vertex, tag.seq).into_bytes()
}

fn header(code: &str, bucket: Option<u16>, kenc: &[u8], req: &Request, reply: bool) -> Vec<Vec<u8>> {
    let (logid, clock) = match req.tag {
        Some(t) if bucket.is_some() => (logid(t, req.key.vertex), t.clock.0.to_string().into_bytes()),
        _ => (Vec::new(), Vec::new()),
    };
    vec![
        code.as_bytes().to_vec(),
        bucket.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
        kenc.to_vec(),
        if reply { b"1".to_vec() } else { b"0".to_vec() },
        logid,
        clock,
    ]
}

impl RedisConnection {
    /// Translates a request into `sluice_exec` arguments.
    fn op(&self, idx: usize, req: &Request) -> Op {
        let broadcast = matches!(req.op, StoreOp::ForgetClock(_) | StoreOp::AdvanceTime(_));
        if broadcast {
            // Answered here once, not by every node.
            let (code, extra) = match req.op {
                // The clock's root only: other roots' clocks are not comparable.
                StoreOp::ForgetClock(c) => ("F", vec![format!("[{}", hex16(Clock::new(c.root(), 0).0)), upto(c.0)]),
                StoreOp::AdvanceTime(t) => ("V", vec![hex16(t), upto(t)]),
                _ => ("V", Vec::new()),
            };
            let mut args = header(code, None, &[], req, false);
            args.extend(extra.into_iter().map(String::into_bytes));
            return Op { req: idx, bucket: None, kenc: Vec::new(), args };
        }
        let kenc = encode_key(&req.key);
        let bucket = self.shared.bucket_of(&kenc);
        let mut extra: Vec<Vec<u8>> = Vec::new();
        let code = match &req.op {
            StoreOp::State(op) => match op {
                StateOp::Get => "G",
                StateOp::Set(v) => {
                    Form::of(Some(v)).push_args(&mut extra);
                    "S"
                }
                StateOp::Delete => "D",
                StateOp::Incr(d) => {
                    extra.push(d.to_string().into_bytes());
                    "I"
                }
                StateOp::Push(x) => {
                    extra.push(encode_value(x));
                    "P"
                }
                StateOp::Pop => "O",
                StateOp::PopN(n) => {
                    extra.push(n.to_string().into_bytes());
                    "N"
                }
                StateOp::CompareAndSet { expect, new } => {
                    if expect.as_ref().is_some_and(has_float) {
                        "R"
                    } else {
                        Form::of(expect.as_ref()).push_args(&mut extra);
                        Form::of(Some(new)).push_args(&mut extra);
                        "C"
                    }
                }
                StateOp::Custom { .. } => "R",
                StateOp::Record(v) => {
                    extra.push(encode_value(v));
                    "E"
                }
            },
            StoreOp::IncrMany(incrs) => {
                extra.push(incrs.len().to_string().into_bytes());
                for (tag, d) in incrs {
                    extra.push(logid(*tag, req.key.vertex));
                    extra.push(tag.clock.0.to_string().into_bytes());
                    extra.push(d.to_string().into_bytes());
                }
                "J"
            }
            StoreOp::Subscribe => "U",
            StoreOp::Unsubscribe => "u",
            StoreOp::SetTimer { deadline_ns } => {
                extra.push(hex16(*deadline_ns).into_bytes());
                "A"
            }
            StoreOp::CancelTimer => "a",
            StoreOp::ExpireTimer { deadline_ns } => {
                extra.push(hex16(*deadline_ns).into_bytes());
                "x"
            }
            StoreOp::Claim => "M",
            StoreOp::Release => "m",
            StoreOp::ForgetClock(_) | StoreOp::AdvanceTime(_) => "V",
        };
        let mut args = header(code, Some(bucket), &kenc, req, req.reply);
        args.extend(extra);
        Op { req: idx, bucket: Some(bucket), kenc, args }
    }

    /// Calls `sluice_exec` on a node; `Err(Ok(()))` when the slot map changed under it.
    fn call(
        &mut self,
        url: &str,
        buckets: &[u16],
        ops: &[&Op],
        drain: bool,
    ) -> Result<Result<redis::Value, ()>, StoreError> {
        let cluster = matches!(self.shared.cfg.mode, Mode::Cluster(_));
        let mut cmd = redis::cmd("FCALL");
        cmd.arg("sluice_exec")
            .arg(0)
            .arg(&self.shared.cfg.prefix)
            .arg(self.client_arg.as_slice())
            .arg(if cluster { "1" } else { "0" })
            .arg(if drain { "1" } else { "0" })
            .arg(buckets.len());
        for b in buckets {
            cmd.arg(*b);
        }
        for op in ops {
            for a in &op.args {
                cmd.arg(a.as_slice());
            }
        }
        match self.nodes.query(url, &cmd) {
            Ok(v) => Ok(Ok(v)),
            Err(e) if cluster && is_topology_error(&e) => Ok(Err(())),
            Err(e) => Err(redis_err(e)),
        }
    }

    fn decode_notes(&mut self, v: &redis::Value) -> Result<(), StoreError> {
        for n in array(v)? {
            let b = bytes(n)?;
            let Some((kind, rest)) = b.split_first() else { continue };
            let (key, used) = decode_key(rest).map_err(codec_err)?;
            let after = rest.get(used..).unwrap_or(&[]);
            self.notes.push(match kind {
                b'C' => Notification::Changed { key, value: decode_opt(after).map_err(codec_err)? },
                b'T' => Notification::TimerFired { key },
                b'H' => Notification::Handover { key },
                k => return Err(StoreError::Protocol(format!("unknown notification kind {k:#x}"))),
            });
        }
        Ok(())
    }

    /// Interprets one entry of `sluice_exec`'s results.
    fn outcome(&self, batch: &[Request], op: &Op, r: &[redis::Value]) -> Result<Outcome, StoreError> {
        let req = batch.get(op.req).ok_or_else(|| StoreError::Protocol("result for no request".into()))?;
        let kind = r.get(1).map(text).transpose()?.unwrap_or_default();
        let field = |i: usize| r.get(i).ok_or_else(|| StoreError::Protocol("short result".into()));
        let resp = |result, replayed, ts| Response { id: req.id, result, replayed, ts };
        Ok(match kind.as_str() {
            "o" => {
                let value = decode_opt(bytes(field(2)?)?).map_err(codec_err)?;
                let ts: Option<TsVector> = match r.get(3) {
                    Some(t) => Some(ts_of(t)?.into()),
                    None => None,
                };
                Outcome::Done(Some(resp(Ok(value), false, ts)))
            }
            "r" => Outcome::Done(Some(resp(Ok(decode_opt(bytes(field(2)?)?).map_err(codec_err)?), true, None))),
            "e" => {
                let code = text(field(2)?)?;
                let a = text(field(3)?)?;
                let b = r.get(4).map(text).transpose()?.unwrap_or_default();
                let msg = match code.as_str() {
                    "owned" => format!("{:?} is owned by instance {}", req.key, a),
                    "wrong" => match (static_op(&a), static_kind(&b)) {
                        (Some(op), Some(found)) => StateError::WrongType { op, found }.to_string(),
                        _ => format!("operation {a} does not apply to a {b} value"),
                    },
                    _ => return Err(StoreError::Protocol(format!("{code}: {a}"))),
                };
                Outcome::Done(Some(resp(Err(msg), false, None)))
            }
            "f" => {
                let logged = match r.get(4) {
                    Some(f) => bytes(f)?.iter().map(|b| *b == b'1').collect(),
                    None => Vec::new(),
                };
                Outcome::Fallback(bytes(field(2)?)?.to_vec(), text(field(3)?)?, logged)
            }
            other => return Err(StoreError::Protocol(format!("unknown result kind {other:?}"))),
        })
    }

    /// Applies an operation the store could not apply itself; returns the conditional write to
    /// send in its place, or the failure to answer.
    fn fallback(
        &self,
        batch: &[Request],
        op: &Op,
        enc: &[u8],
        ver: &str,
        logged: &[bool],
    ) -> Result<Result<Op, Response>, StoreError> {
        let req = batch.get(op.req).ok_or_else(|| StoreError::Protocol("fallback for no request".into()))?;
        let fail =
            |e: StateError| Ok(Err(Response { id: req.id, result: Err(e.to_string()), replayed: false, ts: None }));
        let mut slot = decode_opt(enc).map_err(codec_err)?;
        // The increments of an IncrMany applied here, to log with the write.
        let mut applied: Vec<Vec<u8>> = Vec::new();
        let result = match &req.op {
            StoreOp::State(sop) => {
                let custom = self.shared.custom_ops(req.key.vertex);
                match apply(&mut slot, sop.clone(), &custom) {
                    Ok(r) => r,
                    Err(e) => return fail(e),
                }
            }
            StoreOp::IncrMany(incrs) => {
                for (i, (tag, d)) in incrs.iter().enumerate() {
                    if logged.get(i).copied().unwrap_or(false) {
                        continue;
                    }
                    match apply(&mut slot, StateOp::Incr(*d), &[]) {
                        Ok(r) => {
                            applied.push(logid(*tag, req.key.vertex));
                            applied.push(tag.clock.0.to_string().into_bytes());
                            applied.push(encode_opt(r.as_ref()));
                        }
                        Err(e) => return fail(e),
                    }
                }
                None
            }
            other => return Err(StoreError::Protocol(format!("fallback for {other:?}"))),
        };
        let mut args = header("W", op.bucket, &op.kenc, req, req.reply);
        args.push(ver.as_bytes().to_vec());
        Form::of(slot.as_ref()).push_args(&mut args);
        args.push(encode_opt(result.as_ref()));
        args.push((applied.len() / 3).to_string().into_bytes());
        args.extend(applied);
        Ok(Ok(Op { req: op.req, bucket: op.bucket, kenc: op.kenc.clone(), args }))
    }

    /// Executes `ops` (in order) on the nodes of the current slot map.
    fn run(&mut self, batch: &[Request], ops: Vec<Op>, depth: usize) -> Result<(), StoreError> {
        let topo = self.shared.topology();
        let mut groups: Vec<Vec<Op>> = vec![Vec::new(); topo.nodes.len()];
        for op in ops {
            match op.bucket {
                None => groups.iter_mut().for_each(|g| g.push(op.clone())),
                Some(b) => {
                    let n = topo.bucket_node.get(usize::from(b)).copied().unwrap_or(0);
                    if let Some(g) = groups.get_mut(n) {
                        g.push(op);
                    }
                }
            }
        }
        for (n, group) in groups.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let url = topo.nodes.get(n).cloned().ok_or_else(|| invalid("node vanished"))?;
            let buckets = topo.buckets_of(n);
            if let Some(rest) = self.run_group(batch, &url, &buckets, group)? {
                if depth >= MAX_REROUTES {
                    return Err(invalid("the cluster's slot map keeps changing"));
                }
                self.shared.refresh(&mut self.nodes)?;
                self.run(batch, rest, depth + 1)?;
            }
        }
        Ok(())
    }

    /// Executes one node's operations; returns those left when the node no longer serves them.
    fn run_group(
        &mut self,
        batch: &[Request],
        url: &str,
        buckets: &[u16],
        mut ops: Vec<Op>,
    ) -> Result<Option<Vec<Op>>, StoreError> {
        let mut start = 0;
        let mut conflicts = 0;
        while start < ops.len() {
            let refs: Vec<&Op> = ops[start..].iter().collect();
            let reply = match self.call(url, buckets, &refs, false)? {
                Ok(v) => v,
                Err(()) => return Ok(Some(ops.split_off(start))),
            };
            let parts = array(&reply)?;
            let results = parts.first().map(array).transpose()?.unwrap_or(&[]);
            let mut next = ops.len();
            for r in results {
                let r = array(r)?;
                let idx: usize = r.first().map(number).transpose()?.unwrap_or(0);
                let pos = start + idx.checked_sub(1).ok_or_else(|| StoreError::Protocol("result index 0".into()))?;
                let op = ops.get(pos).ok_or_else(|| StoreError::Protocol("result index out of range".into()))?;
                match self.outcome(batch, op, r)? {
                    Outcome::Done(Some(resp)) => self.responses.push_back(resp),
                    Outcome::Done(None) => {}
                    Outcome::Fallback(enc, ver, logged) => {
                        if op.args.first().is_some_and(|c| c == b"W") {
                            conflicts += 1;
                            if conflicts > MAX_CONFLICTS {
                                let id = batch.get(op.req).map(|r| r.id).unwrap_or(0);
                                self.responses.push_back(Response {
                                    id,
                                    result: Err("too many concurrent updates to apply a custom operation".into()),
                                    replayed: false,
                                    ts: None,
                                });
                                next = pos + 1;
                                break;
                            }
                        }
                        match self.fallback(batch, op, &enc, &ver, &logged)? {
                            Ok(write) => {
                                ops[pos] = write;
                                next = pos;
                            }
                            Err(resp) => {
                                self.responses.push_back(resp);
                                next = pos + 1;
                            }
                        }
                        break;
                    }
                }
            }
            start = next;
        }
        Ok(None)
    }

    fn drain_notifications(&mut self) -> Result<(), StoreError> {
        let topo = self.shared.topology();
        for (n, url) in topo.nodes.iter().enumerate() {
            let buckets = topo.buckets_of(n);
            let reply = match self.call(url, &buckets, &[], true)? {
                Ok(v) => v,
                Err(()) => {
                    // Buckets moved: the next poll uses the new map.
                    self.shared.refresh(&mut self.nodes)?;
                    continue;
                }
            };
            let parts = array(&reply)?;
            if let Some(notes) = parts.get(1) {
                self.decode_notes(notes)?;
            }
        }
        Ok(())
    }
}

impl Connection for RedisConnection {
    fn send(&mut self, number: u64, batch: Arc<[Request]>) -> Result<(), StoreError> {
        if number < self.next_batch {
            // Applied before (a retransmission): acknowledge again.
            self.acked.push(number);
            return Ok(());
        }
        self.held.insert(number, batch);
        // Apply in number order, holding a batch until those before it have arrived.
        while let Some(batch) = self.held.remove(&self.next_batch) {
            let number = self.next_batch;
            let ops: Vec<Op> = batch.iter().enumerate().map(|(i, r)| self.op(i, r)).collect();
            if let Err(e) = self.run(&batch, ops, 0) {
                // Not acknowledged: the client sends it again (tagged updates apply once).
                self.held.insert(number, batch);
                return Err(e);
            }
            for r in batch.iter() {
                if r.reply && matches!(r.op, StoreOp::ForgetClock(_) | StoreOp::AdvanceTime(_)) {
                    self.responses.push_back(Response { id: r.id, result: Ok(None), replayed: false, ts: None });
                }
            }
            self.acked.push(number);
            self.next_batch += 1;
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Replies) -> Result<(), StoreError> {
        out.responses.extend(self.responses.drain(..));
        out.acked.append(&mut self.acked);
        Ok(())
    }

    fn wait(&mut self, out: &mut Replies, timeout: Duration) -> Result<(), StoreError> {
        let before = out.responses.len() + out.acked.len();
        self.poll(out)?;
        if out.responses.len() + out.acked.len() == before {
            // Requests execute inside `send`: nothing more can arrive. Do not spin the caller.
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
        }
        Ok(())
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), StoreError> {
        self.drain_notifications()?;
        out.append(&mut self.notes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = parse_url("redis://127.0.0.1:6390?prefix=t-1&buckets=4").unwrap();
        assert_eq!(c.mode, Mode::Single("redis://127.0.0.1:6390".into()));
        assert_eq!((c.prefix.as_str(), c.buckets), ("t-1", 4));
        let c = parse_url("redis+cluster://127.0.0.1:7390,127.0.0.1:7391").unwrap();
        assert_eq!(c.mode, Mode::Cluster(vec!["127.0.0.1:7390".into(), "127.0.0.1:7391".into()]));
        assert_eq!(c.prefix, "sluice");
        assert!(parse_url("redis://h:1?prefix=a:b").is_err());
        assert!(parse_url("redis://h:1?buckets=0").is_err());
        assert!(parse_url("http://h:1").is_err());
        assert_eq!(parse_url("redis://u:pw@h:1").unwrap().display, "redis://h:1");
    }

    #[test]
    fn bounds() {
        assert_eq!(upto(0), "(0000000000000001");
        assert_eq!(upto(u64::MAX), "+");
    }
}
