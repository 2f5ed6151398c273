//! [`RedisBackend`]: connecting (loading the function library), clearing the keyspace, and
//! the [`Backend`] operations that act on the whole store (checkpoint, restore, wipe).

use crate::codec::{decode_opt, decode_value, encode_key, encode_opt, encode_value, Form};
use crate::config::{parse_url, Mode};
use crate::connection::RedisConnection;
use crate::io_thread::ThreadedConnection;
use crate::reply::{
    array, bytes, codec_err, decode_whole_key, invalid, is_busy, is_connection_error, is_missing_library_text,
    is_passing_text, is_topology_error, is_topology_text, number, redis_err, text, ts_of,
};
use crate::request::hex16;
use crate::topology::{lock_mutex, write_lock, Nodes, Replicated, Settling, Shared, Topology};
use sluice_packet::{Clock, InstanceId};
use sluice_state::CustomOp;
use sluice_store::{Backend, Checkpoint, Connection, Found, LoggedResult, StoreError};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

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
    /// Checks that `url` is a Redis store URL this backend takes (scheme, addresses,
    /// parameters), without connecting: an error here is a mistake to fix, not a server to
    /// wait for.
    pub fn check_url(url: &str) -> Result<(), StoreError> {
        parse_url(url).map(|_| ())
    }

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
            library_on: Mutex::new(HashSet::new()),
        });
        let backend = RedisBackend { shared };
        // Not through `with_admin`: a cluster that cannot be reached at all is a mistake to
        // report at once, not a failover to wait for.
        {
            let shared = &backend.shared;
            let nodes = &mut *lock_mutex(&shared.admin);
            let topo = shared.refresh(nodes)?;
            // `refresh` loaded the library where it could; a node that did not take it is
            // asked again here, and its error reported.
            for url in &topo.nodes {
                // A busy node (another client's long script, its data still loading) is
                // waited for as calls wait for it: the suite's random Redis runs once failed to
                // connect while another test's script ran long.
                let mut settling = Settling::new();
                while !lock_mutex(&shared.library_on).contains(url) {
                    match shared.load_library(nodes, url) {
                        Ok(()) => break,
                        Err(e) if is_busy(&e) => {
                            tracing::warn!(node = %url, error = %e, "Redis node busy; loading the function library again");
                            settling.again(shared, nodes).map_err(|_| invalid(format!("{url}: {e}")))?;
                        }
                        Err(e) if is_connection_error(&e) => return Err(invalid(format!("{url}: {e}"))),
                        Err(e) => {
                            return Err(invalid(format!(
                                "{url}: cannot load the Sluice function library (Redis >= 7 needed): {e}"
                            )))
                        }
                    }
                }
            }
        }
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
                // A wiped store stays wiped on a replica that takes over (`replicas=`).
                replicated(shared, nodes, url)?;
            }
            Ok(())
        })
    }

    /// Runs `f` on the admin connections (checkpoint, restore, clear), one caller at a time.
    /// In a cluster, a node that does not answer or no longer serves its slots (a primary
    /// failed over) makes it read the slot map again, and run `f` once more (whole: it only
    /// reads, or writes again to the same effect) when the map changed: the admin connections
    /// hear of a failover only through their own calls, and a process that only takes
    /// checkpoints failed every one after a primary died. The surviving nodes learn of a
    /// promotion by gossip, so a map read just after it can still name the dead primary: the
    /// map is read again every [`ADMIN_REMAP_PAUSE`] for at most [`ADMIN_REMAP_LIMIT`] until
    /// it changes. `f` itself only runs again on a new map and the wait is short: a checkpoint
    /// dumps every primary, each dump blocking its server, and a wait for a whole failover
    /// would weigh on the instances' own calls while they wait for the same failover (a
    /// periodic checkpoint tries again an interval later).
    fn with_admin<T>(&self, mut f: impl FnMut(&Shared, &mut Nodes) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut nodes = lock_mutex(&self.shared.admin);
        let mut result = f(&self.shared, &mut nodes);
        if matches!(&result, Err(StoreError::Protocol(e)) if is_missing_library_text(e)) {
            // A node lacks the function library (which one, the error does not say): loaded
            // again wherever this backend cannot be sure of it, and the call made once more.
            self.shared.library_lost(None);
            self.shared.refresh(&mut nodes)?;
            result = f(&self.shared, &mut nodes);
        }
        if !matches!(self.shared.cfg.mode, Mode::Cluster(_)) {
            return result;
        }
        let deadline = Instant::now() + ADMIN_REMAP_LIMIT;
        loop {
            let e = match result {
                Err(e) if is_failing_over(&e) => e,
                r => return r,
            };
            if Instant::now() >= deadline {
                return Err(e);
            }
            tracing::debug!(error = %e, "an admin call met a cluster node failing over; reading the slot map again");
            // A node that marks the cluster down for a moment (a failover still spreading) or
            // asks to try again can be right with the map as it is: asked again after a pause,
            // not only once the map changes.
            let passes = matches!(&e, StoreError::Protocol(s) if is_passing_text(s));
            let old = self.shared.topology();
            loop {
                match self.shared.refresh(&mut nodes) {
                    Ok(new) if new != old => break,
                    _ if Instant::now() >= deadline => return Err(e),
                    Ok(_) if passes => {
                        std::thread::sleep(ADMIN_REMAP_PAUSE);
                        break;
                    }
                    _ => std::thread::sleep(ADMIN_REMAP_PAUSE),
                }
            }
            result = f(&self.shared, &mut nodes);
        }
    }
}

/// How long an admin call waits for the slot map to change after it met a node failing
/// over (see [`RedisBackend::with_admin`]).
const ADMIN_REMAP_LIMIT: Duration = Duration::from_secs(3);
/// How often an admin call reads the slot map again while it waits for it to change.
const ADMIN_REMAP_PAUSE: Duration = Duration::from_millis(50);

impl Backend for RedisBackend {
    fn name(&self) -> String {
        format!("{} (prefix {}, {} buckets)", self.shared.cfg.display, self.shared.cfg.prefix, self.shared.cfg.buckets)
    }

    fn is_shared(&self) -> bool {
        true
    }

    /// The script keeps what each tagged update found before it (`sluice.lua`, `as_of`).
    fn reads_as_of(&self) -> bool {
        true
    }

    fn register_custom_ops(&self, vertex: u16, ops: &[CustomOp]) -> Result<(), StoreError> {
        write_lock(&self.shared.custom).insert(vertex, ops.to_vec());
        Ok(())
    }

    fn finish_interrupted_batch(&self, owner: InstanceId) -> Result<usize, StoreError> {
        // Acting for the failed instance, never fenced: the batch was its, begun before.
        let applied = RedisConnection::open(self.shared.clone(), owner, None)?.roll_forward()?;
        if applied > 0 {
            tracing::info!(
                vertex = owner.vertex(),
                index = owner.index(),
                operations = applied,
                "finished a batch its failed instance left half applied"
            );
        }
        Ok(applied)
    }

    fn connect(&self, client: InstanceId) -> Result<Box<dyn Connection>, StoreError> {
        Ok(Box::new(ThreadedConnection::spawn(RedisConnection::open(self.shared.clone(), client, None)?)?))
    }

    /// A fenced connection is refused at its first call, not here: the check is in the script.
    fn connect_at(&self, client: InstanceId, epoch: u32) -> Result<Box<dyn Connection>, StoreError> {
        Ok(Box::new(ThreadedConnection::spawn(RedisConnection::open(self.shared.clone(), client, Some(epoch))?)?))
    }

    /// One call per node, writing the fence in every bucket it serves: a call of the fenced
    /// connection that runs after it is refused on that node, whichever buckets it names. In
    /// a cluster, a node that does not answer or no longer serves its slots (a primary killed
    /// with the node whose instance is fenced) is waited for as a batch waits for a replica
    /// to take over ([`Settling`], not the admin calls' few seconds), and the fence written
    /// again over the new slot map (a fence already written changes nothing).
    fn fence(&self, client: InstanceId, epoch: u32) -> Result<(), StoreError> {
        let shared = &self.shared;
        let cluster = matches!(shared.cfg.mode, Mode::Cluster(_));
        let nodes = &mut *lock_mutex(&shared.admin);
        let mut settling = Settling::new();
        loop {
            let topo = shared.topology();
            let mut failed = None;
            for (n, url) in topo.nodes.iter().enumerate() {
                let mut cmd = bucket_fcall("sluice_fence", &shared.cfg.prefix, &topo.buckets_of(n));
                cmd.arg(client.0).arg(epoch);
                // With `replicas=`, a fence counts once the replicas have it: a primary that
                // dies just after would otherwise hand its slots to a replica that lets the
                // fenced instance (only slow, not dead) write again.
                failed = match nodes.query(url, &cmd) {
                    Ok(_) => match nodes.wait_for_replicas(url, shared.cfg.replicas, cluster)? {
                        Replicated::Yes => None,
                        Replicated::Moved(e) => Some(e),
                    },
                    Err(e) => Some(e),
                };
                if failed.is_some() {
                    break;
                }
            }
            match failed {
                None => return Ok(()),
                Some(e) if is_busy(&e) || (cluster && (is_topology_error(&e) || is_connection_error(&e))) => {
                    tracing::debug!(error = %e, "fencing: a node is busy or failing over; trying again");
                    settling.again(shared, nodes).map_err(|_| redis_err(e))?;
                }
                Some(e) => return Err(redis_err(e)),
            }
        }
    }

    fn checkpoint(&self) -> Result<Checkpoint, StoreError> {
        self.with_admin(|shared, nodes| {
            let topo = shared.topology();
            let mut values = Vec::new();
            let mut timers = Vec::new();
            let mut log = Vec::new();
            let mut ts: BTreeMap<InstanceId, Clock> = BTreeMap::new();
            for (n, url) in topo.nodes.iter().enumerate() {
                let cmd = bucket_fcall("sluice_dump", &shared.cfg.prefix, &topo.buckets_of(n));
                let v = nodes.query(url, &cmd).map_err(redis_err)?;
                let parts = array(&v)?;
                let (Some(vals), Some(t), Some(tm), Some(lg)) =
                    (parts.first(), parts.get(1), parts.get(2), parts.get(3))
                else {
                    return Err(StoreError::Protocol("short sluice_dump reply".into()));
                };
                for entry in array(lg)?.chunks(5) {
                    if let [b, id, r, k, found] = entry {
                        let mut l = logged_result(number(b)?, bytes(id)?, bytes(r)?)?;
                        l.found = found_of(bytes(k)?, bytes(found)?)?;
                        log.push(l);
                    }
                }
                for triple in array(tm)?.chunks(3) {
                    if let [k, d, who] = triple {
                        let key = decode_whole_key(bytes(k)?)?;
                        let d = text(d)?;
                        let deadline = u64::from_str_radix(&d, 16)
                            .map_err(|_| StoreError::Protocol(format!("timer deadline {d:?} is not hex")))?;
                        timers.push((key, deadline, InstanceId(number(who)?)));
                    }
                }
                for pair in array(vals)?.chunks(2) {
                    if let [k, e] = pair {
                        let key = decode_whole_key(bytes(k)?)?;
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
            log.sort_by_key(|l: &LoggedResult| (l.clock, l.vertex, l.seq));
            Ok(Checkpoint { values, ts: ts.into_iter().collect(), timers, log })
        })
    }

    fn restore(&self, cp: &Checkpoint) -> Result<(), StoreError> {
        self.with_admin(|shared, nodes| {
            let topo = shared.topology();
            let mut per_node: Vec<Vec<Vec<u8>>> = vec![Vec::new(); topo.nodes.len()];
            // Timers per node: bucket, key, deadline, recipient each.
            let mut timers_of: Vec<Vec<Vec<u8>>> = vec![Vec::new(); topo.nodes.len()];
            // A key's encoding, its bucket and the node serving it.
            let place = |k| {
                let kenc = encode_key(k);
                let b = shared.bucket_of(&kenc);
                (kenc, b, topo.node_of(b))
            };
            for (k, d, who) in &cp.timers {
                let (kenc, b, n) = place(k);
                if let Some(args) = timers_of.get_mut(n) {
                    args.push(b.to_string().into_bytes());
                    args.push(kenc);
                    args.push(hex16(*d).into_bytes());
                    args.push(who.0.to_string().into_bytes());
                }
            }
            // The per-clock log per node: bucket, logid, result, key, found each.
            let mut log_of: Vec<Vec<Vec<u8>>> = vec![Vec::new(); topo.nodes.len()];
            for l in &cp.log {
                let Ok(b) = u16::try_from(l.part) else { continue };
                if let Some(args) = log_of.get_mut(topo.node_of(b)) {
                    args.push(b.to_string().into_bytes());
                    args.push(format!("{}{:04x}{:08x}", hex16(l.clock.0), l.vertex, l.seq).into_bytes());
                    args.push(encode_opt(l.result.as_ref()));
                    let (k, found) = found_args(l.found.as_ref());
                    args.push(k);
                    args.push(found);
                }
            }
            for (k, v) in &cp.values {
                let (kenc, b, n) = place(k);
                if let Some(args) = per_node.get_mut(n) {
                    args.push(b.to_string().into_bytes());
                    args.push(kenc);
                    Form::of(Some(v)).push_args(args);
                }
            }
            for (n, url) in topo.nodes.iter().enumerate() {
                let mut cmd = bucket_fcall("sluice_restore", &shared.cfg.prefix, &topo.buckets_of(n));
                cmd.arg(cp.ts.len());
                for (i, c) in &cp.ts {
                    cmd.arg(i.0).arg(c.0);
                }
                let timers = timers_of.get(n).map(Vec::as_slice).unwrap_or(&[]);
                cmd.arg(timers.len() / 4);
                for a in timers {
                    cmd.arg(a.as_slice());
                }
                let log = log_of.get(n).map(Vec::as_slice).unwrap_or(&[]);
                cmd.arg(log.len() / 5);
                for a in log {
                    cmd.arg(a.as_slice());
                }
                for a in per_node.get(n).map(Vec::as_slice).unwrap_or(&[]) {
                    cmd.arg(a.as_slice());
                }
                nodes.query(url, &cmd).map_err(redis_err)?;
                // A rebuilt store counts once the replicas have it (`replicas=`), as every
                // instance's writes do.
                replicated(shared, nodes, url)?;
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

/// Waits until the replicas (`replicas=` in the URL) hold the admin writes made on `url`; a
/// node failing over meanwhile is an error [`RedisBackend::with_admin`] makes the call again for.
fn replicated(shared: &Shared, nodes: &mut Nodes, url: &str) -> Result<(), StoreError> {
    let cluster = matches!(shared.cfg.mode, Mode::Cluster(_));
    match nodes.wait_for_replicas(url, shared.cfg.replicas, cluster)? {
        Replicated::Yes => Ok(()),
        Replicated::Moved(e) => Err(redis_err(e)),
    }
}

/// Whether an admin call's error may go away once the cluster's slot map settles.
fn is_failing_over(e: &StoreError) -> bool {
    match e {
        StoreError::Unavailable(_) => true,
        StoreError::Protocol(s) => is_topology_text(s),
        _ => false,
    }
}

/// An `FCALL` of a function that takes the prefix and the buckets a node serves (more
/// arguments may follow).
fn bucket_fcall(function: &str, prefix: &str, buckets: &[u16]) -> redis::Cmd {
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(function).arg(0).arg(prefix).arg(buckets.len());
    for b in buckets {
        cmd.arg(*b);
    }
    cmd
}

/// What a logged update found, from `sluice_dump`'s key and found (`sluice.lua`'s `b:<k>`
/// field: `n` absent, `v` and an encoding, `u` not kept; both empty: nothing kept).
fn found_of(k: &[u8], found: &[u8]) -> Result<Option<Found>, StoreError> {
    if k.is_empty() {
        return Ok(None);
    }
    let key = decode_whole_key(k)?;
    match found.split_first() {
        Some((b'n', [])) => Ok(Some(Found::Kept { key, value: None })),
        Some((b'v', enc)) => Ok(Some(Found::Kept { key, value: Some(decode_value(enc).map_err(codec_err)?) })),
        Some((b'u', [])) => Ok(Some(Found::NotKept { key })),
        _ => Err(StoreError::Protocol(format!(
            "what an update found, {:?}, is not n, v… or u",
            String::from_utf8_lossy(found)
        ))),
    }
}

/// `sluice_restore`'s key and found arguments for what a logged update found ([`found_of`]
/// reversed).
fn found_args(found: Option<&Found>) -> (Vec<u8>, Vec<u8>) {
    match found {
        None => (Vec::new(), Vec::new()),
        Some(Found::Kept { key, value: None }) => (encode_key(key), b"n".to_vec()),
        Some(Found::Kept { key, value: Some(v) }) => {
            let mut enc = b"v".to_vec();
            enc.extend(encode_value(v));
            (encode_key(key), enc)
        }
        Some(Found::NotKept { key }) => (encode_key(key), b"u".to_vec()),
    }
}

/// One entry of a bucket's per-clock log from `sluice_dump`: its id is the clock (16 hex
/// digits), the vertex (4) and the update's number (8).
fn logged_result(bucket: u32, id: &[u8], result: &[u8]) -> Result<LoggedResult, StoreError> {
    let bad =
        || StoreError::Protocol(format!("per-clock log id {:?} is not 28 hex digits", String::from_utf8_lossy(id)));
    let id = std::str::from_utf8(id).map_err(|_| bad())?;
    let (Some(c), Some(v), Some(s)) = (id.get(0..16), id.get(16..20), id.get(20..28)) else { return Err(bad()) };
    if id.len() != 28 {
        return Err(bad());
    }
    Ok(LoggedResult {
        part: bucket,
        clock: Clock(u64::from_str_radix(c, 16).map_err(|_| bad())?),
        vertex: u16::from_str_radix(v, 16).map_err(|_| bad())?,
        seq: u32::from_str_radix(s, 16).map_err(|_| bad())?,
        result: decode_opt(result).map_err(codec_err)?,
        found: None,
    })
}
