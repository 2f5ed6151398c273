//! The embedded store: values sharded over store threads, each value owned by exactly one
//! thread, so the data path takes no locks. Clients send batches of requests; each shard applies
//! the requests it receives in arrival order (so one client's requests to one value apply in
//! issue order) and answers through the client's own lock-free queues.

use crate::backend::{Backend, Connection, StoreError, Takeover, TakeoverParts};
use crate::clock_log::Was;
use crate::wire::{Checkpoint, Found, LoggedResult, Notification, Replies, Request, Response, StoreKey, StoreOp};
use crossbeam_queue::{ArrayQueue, SegQueue};
use sluice_packet::{Clock, InstanceId};
use sluice_state::{CustomOp, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

mod connection;
mod shard;
use connection::EmbeddedConnection;
use shard::Shard;

type Map<K, V> = hashbrown::HashMap<K, V, ahash::RandomState>;

/// Connection ids, unique in the process.
static NEXT_CONNECTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// How long a shard thread keeps polling its queue after a batch of non-blocking requests before
/// sleeping: short, so as not to take a core from the NFs.
const STAY_AWAKE: Duration = Duration::from_micros(5);
/// The same after answering a blocking request: its client is likely to send another soon, and
/// a wakeup costs tens of microseconds.
const STAY_AWAKE_AFTER_CALL: Duration = Duration::from_micros(200);
/// How long a shard sleeps at a time, timed, while clients keep it busy (it heard from one
/// within [`BUSY_FOR`]). Meanwhile clients post batches nobody waits for without waking it: a
/// wakeup a batch, a system call on the packet thread, was a tenth of a run-to-completion
/// chain's time with the store on its own thread. What waits for the store wakes it
/// ([`Inner::hurry`]).
const NAP: Duration = Duration::from_micros(50);
/// A shard idle for less than this since its last request naps ([`NAP`]) rather than sleeps.
const BUSY_FOR: Duration = Duration::from_millis(2);
/// How long a question to every shard (checkpoint, scan, restore, wipe) waits for the answers.
const SHARD_ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// Entries (timers and values) per part of a [`Backend::takeover`] answer: the replacement takes
/// a part in while the shard reads the next.
const TAKEOVER_PART: usize = 512;

/// What a shard sends back.
enum Reply {
    /// The answer to a request that wanted one, or a failure.
    Response(Response),
    /// This shard has applied its part of a batch.
    Ack(u64),
}

/// Where a shard answers one client connection.
struct ClientQueues {
    id: InstanceId,
    /// Unique per connection: batch numbers are per connection.
    conn: u64,
    replies: SegQueue<Reply>,
    notifications: SegQueue<Notification>,
    /// The thread blocked in `wait`, if any.
    waiter: Mutex<Option<Thread>>,
    waiting: AtomicBool,
    /// The instance's epoch, if it connected as the instance ([`Backend::connect_at`]).
    epoch: Option<u32>,
    /// The epoch it is fenced below, once it is ([`Backend::fence`]). Held while a batch is
    /// posted to the shards, so that a fence falls between two batches, never inside one: each
    /// batch goes to every shard or to none.
    fenced: Mutex<Option<u32>>,
}

impl ClientQueues {
    fn wake(&self) {
        if self.waiting.load(Ordering::Acquire) {
            if let Ok(w) = self.waiter.lock() {
                if let Some(t) = w.as_ref() {
                    t.unpark();
                }
            }
        }
    }
}

enum Msg {
    /// A client's batch: every shard gets it and applies the requests it owns.
    Batch(Arc<[Request]>, u64, Arc<ClientQueues>),
    Register(u16, Vec<CustomOp>),
    Checkpoint(mpsc::Sender<Checkpoint>),
    /// The clocks of the shard's per-clock log with a tagged update of this vertex.
    UpdatedClocks(u16, mpsc::Sender<Vec<Clock>>),
    /// One pass over a vertex's entries ([`Scan`]), its findings sent in parts as they are
    /// read; `None` ends them.
    Scan(Scan, TakeoverParts),
    Restore(Restore, mpsc::Sender<()>),
    /// Answer once everything posted before has been applied (a fence waits for it).
    Barrier(mpsc::Sender<()>),
    /// Forget everything, as a freshly started store would.
    Wipe(mpsc::Sender<()>),
    Stop,
}

/// What a pass over one vertex's entries collects: the timers an instance armed
/// (`Backend::timers_of`, `Backend::takeover`) and the values of some of the vertex's objects
/// (`Backend::values_of`, `Backend::takeover`).
struct Scan {
    vertex: u16,
    timers_of: Option<InstanceId>,
    objects: Option<Vec<u16>>,
}

/// One shard's part of a checkpoint being restored.
#[derive(Default)]
struct Restore {
    values: Vec<(StoreKey, Value)>,
    ts: Vec<(InstanceId, Clock)>,
    timers: Vec<(StoreKey, u64, InstanceId)>,
    log: Vec<LoggedResult>,
}

fn shard_of(hasher: &ahash::RandomState, shards: usize, key: &StoreKey) -> usize {
    if shards <= 1 {
        // One shard holds everything: no key to hash.
        return 0;
    }
    (hasher.hash_one(key) % shards.max(1) as u64) as usize
}

/// Applies the requests of `reqs` that this shard owns (and every broadcast request).
fn apply_batch(
    shard: &mut Shard,
    reqs: &[Request],
    client: &ClientQueues,
    me: usize,
    shards: usize,
    hasher: &ahash::RandomState,
) {
    for r in reqs {
        let broadcast = matches!(r.op, StoreOp::AdvanceTime(_) | StoreOp::ForgetClock(_));
        if !broadcast && shard_of(hasher, shards, &r.key) != me {
            continue;
        }
        let resp = shard.handle(r);
        // Broadcast requests are answered by shard 0 only.
        if (r.reply && (!broadcast || me == 0)) || resp.result.is_err() {
            client.replies.push(Reply::Response(resp));
        }
    }
}

/// Whether a shard naps, and whether it should: shared by the shard and its clients.
#[derive(Default)]
struct Doze {
    /// The shard sleeps for [`NAP`] at most: a post nobody waits for need not wake it.
    napping: AtomicBool,
    /// Some client posted a batch nobody waits for since the shard last slept long. Only
    /// then does the shard nap: otherwise every post wakes it anyway, and waking itself
    /// every [`NAP`] would only take time from the threads that post (a paced chain with
    /// fault tolerance was slower by a tenth).
    lazy_posts: AtomicBool,
}

fn shard_loop(
    queue: Arc<ArrayQueue<Msg>>,
    doze: Arc<Doze>,
    stop: Arc<AtomicBool>,
    me: usize,
    shards: usize,
    hasher: ahash::RandomState,
) {
    let mut shard = Shard::new();
    // Stay responsive for a while after the last request (a blocking client is waiting on the
    // round trip), then sleep until a client posts again.
    let mut idle_since: Option<Instant> = None;
    let mut spins = 0u32;
    let mut stay = STAY_AWAKE;
    loop {
        let Some(msg) = queue.pop() else {
            if stop.load(Ordering::Acquire) {
                return;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if since.elapsed() < stay {
                // Yield rather than spin: a client may be waiting on this very core.
                std::thread::yield_now();
            } else if since.elapsed() < BUSY_FOR && doze.lazy_posts.load(Ordering::Acquire) {
                // Back soon by itself: clients need not wake it for what nobody waits for.
                doze.napping.store(true, Ordering::Release);
                std::thread::park_timeout(NAP);
                doze.napping.store(false, Ordering::Release);
            } else {
                doze.lazy_posts.store(false, Ordering::Release);
                // Clients unpark the thread when they post; the timeout only bounds a lost wakeup.
                std::thread::park_timeout(Duration::from_millis(1));
            }
            continue;
        };
        idle_since = None;
        spins = 0;
        match msg {
            Msg::Batch(reqs, number, client) => {
                // Notifications go to the instance's latest connection (a restarted or
                // replacement instance connects again under the same id).
                if !shard.clients.get(&client.id).is_some_and(|c| Arc::ptr_eq(c, &client)) {
                    shard.clients.insert(client.id, client.clone());
                }
                stay = if reqs.iter().any(|r| r.reply) { STAY_AWAKE_AFTER_CALL } else { STAY_AWAKE };
                let (next, held) = shard.sequences.entry(client.conn).or_insert_with(|| (1, BTreeMap::new()));
                if number < *next {
                    // Applied before (the acknowledgement was late or lost): acknowledge again.
                    client.replies.push(Reply::Ack(number));
                } else if number == *next && held.is_empty() {
                    // The usual case: the connection's next batch, nothing held back.
                    *next += 1;
                    apply_batch(&mut shard, &reqs, &client, me, shards, &hasher);
                    client.replies.push(Reply::Ack(number));
                } else {
                    held.insert(number, reqs);
                    let mut ready = Vec::new();
                    while let Some(b) = held.remove(next) {
                        ready.push((*next, b));
                        *next += 1;
                    }
                    for (n, b) in ready {
                        apply_batch(&mut shard, &b, &client, me, shards, &hasher);
                        client.replies.push(Reply::Ack(n));
                    }
                }
                client.wake();
                for c in shard.touched.drain(..) {
                    c.wake();
                }
            }
            Msg::Register(v, ops) => {
                shard.custom.insert(v, ops);
            }
            Msg::Checkpoint(tx) => {
                // Copied only: the asker sorts what every shard sent, off this thread, which
                // the instances wait for.
                let values: Vec<_> =
                    shard.entries.iter().filter_map(|(k, e)| e.value.clone().map(|v| (*k, v))).collect();
                let ts: Vec<_> = shard.ts.iter().collect();
                let timers: Vec<_> = shard
                    .entries
                    .iter()
                    .filter_map(|(k, e)| e.timer.map(|(d, armer)| (*k, d, e.owner.unwrap_or(armer))))
                    .collect();
                let log: Vec<_> = shard
                    .log
                    .iter()
                    .map(|(clock, vertex, seq, result, was)| LoggedResult {
                        part: 0,
                        clock,
                        vertex,
                        seq,
                        result: result.value(),
                        found: was.found(),
                    })
                    .collect();
                let _ = tx.send(Checkpoint { values, ts, timers, log });
            }
            Msg::UpdatedClocks(vertex, tx) => {
                let clocks = shard.log.iter().filter(|(_, v, ..)| *v == vertex).map(|(c, ..)| c).collect();
                let _ = tx.send(clocks);
            }
            Msg::Scan(scan, tx) => {
                let empty = || Takeover {
                    values: scan.objects.as_ref().map(|_| Vec::new()),
                    history: Some(Vec::new()),
                    ..Takeover::default()
                };
                let mut part = empty();
                for (k, e) in shard.entries.of_vertex(scan.vertex) {
                    if let (Some(owner), Some((deadline, armer))) = (scan.timers_of, e.timer) {
                        if e.owner.unwrap_or(armer) == owner {
                            part.timers.push((*k, deadline));
                        }
                    }
                    if let (Some(values), Some(objects), Some(v)) = (part.values.as_mut(), &scan.objects, &e.value) {
                        if objects.contains(&k.object) {
                            values.push((*k, v.clone()));
                        }
                    }
                    if part.timers.len() + part.values.as_ref().map_or(0, Vec::len) >= TAKEOVER_PART {
                        let _ = tx.send(Some(std::mem::replace(&mut part, empty())));
                    }
                }
                // The log's earlier values of the vertex's keys, with the last part: read in the
                // same turn as the values, so they agree.
                part.history = Some(
                    shard
                        .log
                        .iter()
                        .filter_map(|(clock, _, seq, _, was)| {
                            let found = was.found()?;
                            let of_vertex = match &found {
                                Found::Kept { key, .. } | Found::NotKept { key } => key.vertex == scan.vertex,
                            };
                            of_vertex.then_some((clock, seq, found))
                        })
                        .collect(),
                );
                let _ = tx.send(Some(part));
                let _ = tx.send(None);
            }
            Msg::Restore(cp, tx) => {
                shard.entries.clear();
                shard.log.clear();
                shard.timers.clear();
                for (k, v) in cp.values {
                    shard.entries.entry(k).value = Some(v);
                }
                for (k, d, who) in cp.timers {
                    let e = shard.entries.entry(k);
                    e.timer = Some((d, who));
                    e.wait_in(&mut shard.timers, k, d);
                }
                shard.ts = cp.ts.into_iter().collect();
                shard.ts_cache = None;
                for l in cp.log {
                    let was = Was::from_found(l.found.as_ref());
                    shard.log.insert_was(l.clock, l.vertex, l.seq, l.result.into(), was);
                }
                let _ = tx.send(());
            }
            Msg::Barrier(tx) => {
                let _ = tx.send(());
            }
            Msg::Wipe(tx) => {
                // A replaced store process starts from nothing: values, metadata, log, TS
                // vector, packet time, custom ops, known clients and batch sequences alike.
                shard = Shard::new();
                let _ = tx.send(());
            }
            Msg::Stop => return,
        }
    }
}

struct ShardHandle {
    queue: Arc<ArrayQueue<Msg>>,
    doze: Arc<Doze>,
    thread: Option<JoinHandle<()>>,
}

struct Inner {
    shards: Vec<ShardHandle>,
    hasher: ahash::RandomState,
    stop: Arc<AtomicBool>,
    /// Per instance: the lowest epoch accepted and its connections opened with an epoch.
    /// Touched by connects and fences only, never on the data path.
    fences: Mutex<Map<InstanceId, Fences>>,
}

/// One instance's fence and connections.
#[derive(Default)]
struct Fences {
    lowest: u32,
    connections: Vec<std::sync::Weak<ClientQueues>>,
}

impl Inner {
    fn shard_of(&self, key: &StoreKey) -> usize {
        shard_of(&self.hasher, self.shards.len(), key)
    }

    /// Asks every shard at once (`ask(shard, reply)` makes the message) and waits for all the
    /// answers, in shard order: the wait is the slowest shard's, not the sum of them all.
    fn ask_every_shard<T>(&self, mut ask: impl FnMut(usize, mpsc::Sender<T>) -> Msg) -> Result<Vec<T>, StoreError> {
        let receivers: Vec<mpsc::Receiver<T>> = (0..self.shards.len())
            .map(|s| {
                let (tx, rx) = mpsc::channel();
                self.post(s, ask(s, tx));
                rx
            })
            .collect();
        let deadline = Instant::now() + SHARD_ANSWER_LIMIT;
        receivers
            .into_iter()
            .map(|rx| {
                rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .map_err(|_| StoreError::Timeout(SHARD_ANSWER_LIMIT))
            })
            .collect()
    }

    /// Puts every shard on `scan`, their parts going to `parts`; how many shards (ends) that is.
    fn scan(&self, scan: impl Fn() -> Scan, parts: &TakeoverParts) -> usize {
        for s in 0..self.shards.len() {
            self.post(s, Msg::Scan(scan(), parts.clone()));
        }
        self.shards.len()
    }

    /// Every shard's findings of `scan`, put together.
    fn collect(&self, scan: impl Fn() -> Scan) -> Result<Takeover, StoreError> {
        let (tx, rx) = mpsc::channel();
        let readers = self.scan(scan, &tx);
        let deadline = Instant::now() + SHARD_ANSWER_LIMIT;
        let mut all = Takeover::default();
        let mut ended = 0;
        while ended < readers {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Some(part)) => {
                    all.timers.extend(part.timers);
                    if let Some(values) = part.values {
                        all.values.get_or_insert_with(Vec::new).extend(values);
                    }
                }
                Ok(None) => ended += 1,
                Err(_) => return Err(StoreError::Timeout(SHARD_ANSWER_LIMIT)),
            }
        }
        Ok(all)
    }

    fn post(&self, shard: usize, msg: Msg) {
        self.post_to(shard, msg, true);
    }

    /// Wakes every napping shard: a client is about to wait for an answer or acknowledgement.
    pub(super) fn hurry(&self) {
        for s in &self.shards {
            if let (true, Some(t)) = (s.doze.napping.load(Ordering::Acquire), &s.thread) {
                t.thread().unpark();
            }
        }
    }

    /// Queues `msg` for `shard`, and wakes it unless it naps and the message is not `urgent`
    /// (nobody waits for it: it is taken at the end of the nap).
    pub(super) fn post_to(&self, shard: usize, mut msg: Msg, urgent: bool) {
        let Some(s) = self.shards.get(shard) else { return };
        loop {
            match s.queue.push(msg) {
                Ok(()) => break,
                Err(back) => {
                    msg = back;
                    std::thread::yield_now();
                }
            }
        }
        if !urgent && !s.doze.lazy_posts.load(Ordering::Relaxed) {
            s.doze.lazy_posts.store(true, Ordering::Release);
        }
        if let (true, Some(t)) = (urgent || !s.doze.napping.load(Ordering::Acquire), &s.thread) {
            t.thread().unpark();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for s in &mut self.shards {
            let _ = s.queue.push(Msg::Stop);
            if let Some(t) = s.thread.take() {
                t.thread().unpark();
                let _ = t.join();
            }
        }
    }
}

/// The embedded store: `threads` shard threads in this process.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

impl EmbeddedStore {
    /// Starts a store with `threads` shard threads (at least one).
    pub fn start(threads: usize) -> Result<EmbeddedStore, StoreError> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut shards = Vec::new();
        let hasher = ahash::RandomState::with_seeds(0x5107e, 0x5eed, 0xab, 0xcd);
        let n = threads.max(1);
        for i in 0..n {
            let queue = Arc::new(ArrayQueue::new(1 << 16));
            let doze = Arc::new(Doze::default());
            let (q, z, s, h) = (queue.clone(), doze.clone(), stop.clone(), hasher.clone());
            let thread = std::thread::Builder::new()
                .name(format!("sluice-store-{i}"))
                .spawn(move || shard_loop(q, z, s, i, n, h))
                .map_err(|e| StoreError::Unavailable(format!("cannot start store thread: {e}")))?;
            shards.push(ShardHandle { queue, doze, thread: Some(thread) });
        }
        let fences = Mutex::new(Map::default());
        Ok(EmbeddedStore { inner: Arc::new(Inner { shards, hasher, stop, fences }) })
    }
}

/// A poisoned lock of the store's fences (a thread panicked holding it).
fn poisoned() -> StoreError {
    StoreError::Unavailable("the store's fence table is poisoned".into())
}

impl EmbeddedStore {
    /// A connection of `client`, as the instance in `epoch` or (`None`) acting for it.
    fn open(&self, client: InstanceId, epoch: Option<u32>) -> Result<Box<dyn Connection>, StoreError> {
        let queues = Arc::new(ClientQueues {
            id: client,
            conn: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            replies: SegQueue::new(),
            notifications: SegQueue::new(),
            waiter: Mutex::new(None),
            waiting: AtomicBool::new(false),
            epoch,
            fenced: Mutex::new(None),
        });
        if let Some(epoch) = epoch {
            let mut fences = self.inner.fences.lock().map_err(|_| poisoned())?;
            let f = fences.entry(client).or_default();
            if epoch < f.lowest {
                return Err(StoreError::fenced(client, epoch, f.lowest));
            }
            f.connections.retain(|c| c.strong_count() > 0);
            f.connections.push(Arc::downgrade(&queues));
        }
        Ok(Box::new(EmbeddedConnection {
            inner: self.inner.clone(),
            queues,
            parts: Map::default(),
            waker_set: false,
            lazy: false,
        }))
    }
}

impl Backend for EmbeddedStore {
    fn name(&self) -> String {
        format!("embedded ({} thread(s))", self.inner.shards.len())
    }

    fn register_custom_ops(&self, vertex: u16, ops: &[CustomOp]) -> Result<(), StoreError> {
        for s in 0..self.inner.shards.len() {
            self.inner.post(s, Msg::Register(vertex, ops.to_vec()));
        }
        Ok(())
    }

    fn connect(&self, client: InstanceId) -> Result<Box<dyn Connection>, StoreError> {
        self.open(client, None)
    }

    fn connect_at(&self, client: InstanceId, epoch: u32) -> Result<Box<dyn Connection>, StoreError> {
        self.open(client, Some(epoch))
    }

    fn fence(&self, client: InstanceId, epoch: u32) -> Result<(), StoreError> {
        {
            let mut fences = self.inner.fences.lock().map_err(|_| poisoned())?;
            let f = fences.entry(client).or_default();
            f.lowest = f.lowest.max(epoch);
            let lowest = f.lowest;
            f.connections.retain(|c| c.strong_count() > 0);
            for q in f.connections.iter().filter_map(std::sync::Weak::upgrade) {
                if q.epoch.is_some_and(|e| e < lowest) {
                    // Waits for a batch being posted: it goes out whole, before the fence.
                    *q.fenced.lock().map_err(|_| poisoned())? = Some(lowest);
                }
            }
        }
        // What was posted before is applied before the fence returns.
        self.inner.ask_every_shard(|_, tx| Msg::Barrier(tx))?;
        Ok(())
    }

    fn checkpoint(&self) -> Result<Checkpoint, StoreError> {
        let mut all = Checkpoint::default();
        for (s, cp) in self.inner.ask_every_shard(|_, tx| Msg::Checkpoint(tx))?.into_iter().enumerate() {
            all.values.extend(cp.values);
            all.timers.extend(cp.timers);
            all.log.extend(cp.log.into_iter().map(|l| LoggedResult { part: s as u32, ..l }));
            for (i, c) in cp.ts {
                match all.ts.iter_mut().find(|(j, _)| *j == i) {
                    Some(e) => e.1 = e.1.max(c),
                    None => all.ts.push((i, c)),
                }
            }
        }
        // Unstable sorts: the keys are unique (a value per key, a timer per key, a log entry per
        // tag and part), so the order is the same, without a stable sort's copies of every
        // element (a checkpoint of 20,000 values spent most of its time in them).
        all.values.sort_unstable_by_key(|v| v.0);
        all.ts.sort_unstable();
        all.timers.sort_unstable();
        all.log.sort_unstable_by_key(|l| (l.part, l.clock, l.vertex, l.seq));
        Ok(all)
    }

    fn clocks_updated_by(&self, vertex: u16) -> Result<Vec<Clock>, StoreError> {
        let mut all: Vec<Clock> =
            self.inner.ask_every_shard(|_, tx| Msg::UpdatedClocks(vertex, tx))?.into_iter().flatten().collect();
        all.sort_unstable();
        all.dedup();
        Ok(all)
    }

    fn timers_of(&self, owner: InstanceId) -> Result<Vec<(StoreKey, u64)>, StoreError> {
        let scan = || Scan { vertex: owner.vertex(), timers_of: Some(owner), objects: None };
        let mut timers = self.inner.collect(scan)?.timers;
        timers.sort();
        Ok(timers)
    }

    fn reads_as_of(&self) -> bool {
        true
    }
    fn takeover_returns_at_once(&self) -> bool {
        true
    }

    fn takeover(&self, owner: InstanceId, objects: Option<&[u16]>, parts: &TakeoverParts) -> Result<usize, StoreError> {
        // Each shard sends to the replacement directly, as it reads.
        let scan = || Scan { vertex: owner.vertex(), timers_of: Some(owner), objects: objects.map(<[u16]>::to_vec) };
        Ok(self.inner.scan(scan, parts))
    }

    fn values_of(&self, vertex: u16, objects: &[u16]) -> Result<Option<Vec<(StoreKey, Value)>>, StoreError> {
        let scan = || Scan { vertex, timers_of: None, objects: Some(objects.to_vec()) };
        Ok(self.inner.collect(scan)?.values)
    }

    fn restore(&self, cp: &Checkpoint) -> Result<(), StoreError> {
        let n = self.inner.shards.len();
        let mut parts: Vec<Restore> = (0..n).map(|_| Restore { ts: cp.ts.clone(), ..Restore::default() }).collect();
        for l in &cp.log {
            if let Some(p) = parts.get_mut(l.part as usize % n.max(1)) {
                p.log.push(l.clone());
            }
        }
        for (k, v) in &cp.values {
            if let Some(p) = parts.get_mut(self.inner.shard_of(k)) {
                p.values.push((*k, v.clone()));
            }
        }
        for (k, d, who) in &cp.timers {
            if let Some(p) = parts.get_mut(self.inner.shard_of(k)) {
                p.timers.push((*k, *d, *who));
            }
        }
        self.inner
            .ask_every_shard(|s, tx| Msg::Restore(parts.get_mut(s).map(std::mem::take).unwrap_or_default(), tx))?;
        Ok(())
    }

    fn wipe(&self) -> Result<(), StoreError> {
        self.inner.ask_every_shard(|_, tx| Msg::Wipe(tx))?;
        // A replaced store process knows no fences either.
        self.inner.fences.lock().map_err(|_| poisoned())?.clear();
        Ok(())
    }
}
