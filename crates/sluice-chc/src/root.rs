//! The root: logical clocks, the packet log, the XOR check and delete, replay selection, and
//! what a new root does after a crash.
//!
//! Every admitted packet gets a clock (root id in the high bits) and an entry in the log. The
//! entry stays until every copy of the packet is done (left the chain, dropped, consumed,
//! suppressed) *and* its XOR vector folds to zero: each instance XORs a value into a packet per
//! object it updates and reports the same value once the store has acknowledged the update
//! (a *commit*). A copy that was replayed redid its updates with blocking, tagged operations, so
//! its entry no longer waits for commits. Deleted entries are announced through
//! [`Root::take_deleted`] so a driver keeping the log in a store deletes them there too.

use ahash::{AHashMap, AHashSet};
use log::PacketLog;
use sluice_packet::{Clock, InstanceId, Meta, MetaFlags, Packet};
use std::collections::BTreeMap;

/// Root parameters.
#[derive(Debug, Clone, Copy)]
pub struct RootConfig {
    /// Most packets in the log; input past it is dropped.
    pub log_capacity: usize,
    /// The clock is persisted every this many packets of a root.
    pub clock_persist_every: u64,
    /// Roots over statically partitioned input (by source address).
    pub roots: u8,
    /// Keep an entry until its updates are committed (the XOR check); off: until its copies
    /// are done.
    pub xor_check: bool,
    /// Remember every clock's input packet number and entry time for the whole run
    /// ([`Root::input_of`], [`Root::entry_time`]): a bounded run reports decisions by input
    /// packet. Off (a long-running chain): only the log's entries are kept.
    pub remember_inputs: bool,
}

impl Default for RootConfig {
    fn default() -> Self {
        RootConfig { log_capacity: 1 << 20, clock_persist_every: 100, roots: 1, xor_check: true, remember_inputs: true }
    }
}

/// Most buffers of deleted entries kept for reuse, whatever the log's capacity (a log that
/// shrinks frees the rest).
const SPARE_BUFFERS: usize = 1 << 16;

/// A root's logical clock: the last sequence number stamped and the last one persisted.
#[derive(Debug, Clone, Copy, Default)]
struct RootClock {
    seq: u64,
    persisted: u64,
}

/// One packet in the log.
#[derive(Debug, Clone)]
struct LogEntry {
    input: u64,
    packet: Packet,
    /// Copies still travelling.
    refs: u32,
    /// XOR of the values the copies carried out and the commits reported.
    xor: u64,
    /// A replay copy went all the way: its updates are committed.
    replayed: bool,
    /// The root has heard that a copy left the chain.
    left: bool,
}

impl LogEntry {
    /// Every copy is done and, with the XOR check, every update committed (or redone by a
    /// replay that went all the way).
    fn deletable(&self, xor_check: bool) -> bool {
        self.refs == 0 && (!xor_check || self.xor == 0 || self.replayed)
    }
}

/// What [`Root::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Stamped with `clock` and logged; `persist` is the sequence number to persist now, if the
    /// persistence interval is reached.
    Admitted {
        /// The packet's clock.
        clock: Clock,
        /// Persist this sequence number of the packet's root.
        persist: Option<u64>,
    },
    /// The log is full: the packet is dropped (and reported).
    LogFull,
}

/// What a root crash did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootCrash {
    /// The root's packets that were in the log.
    pub logged: usize,
    /// Whether they were lost with the root (log at the root) rather than kept in the store.
    pub lost: bool,
    /// The sequence number the new root resumes from (persisted, so no clock is reused).
    pub resumed: u64,
}

/// What reading the log back from its store copy did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reload {
    /// Entries found in the store and still expected.
    pub kept: u64,
    /// Entries the store no longer had: they cannot be replayed any more.
    pub lost: u64,
    /// Entries the store still had although the old root had deleted them: delete again.
    pub stale: Vec<Clock>,
}

/// The root has no such root id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSuchRoot {
    /// The id asked for.
    pub root: u8,
    /// How many roots there are.
    pub roots: usize,
}

/// Counters of the root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RootStats {
    /// Packets admitted.
    pub admitted: u64,
    /// Packets dropped because the log was full.
    pub log_full: u64,
    /// Clocks persisted.
    pub clock_persists: u64,
    /// Most entries in the log at once.
    pub log_peak: u64,
    /// Copies replayed.
    pub replayed: u64,
    /// Entries deleted (every copy done, every update committed).
    pub deleted: u64,
}

/// The root's state machine.
#[derive(Debug, Clone)]
pub struct Root {
    cfg: RootConfig,
    clocks: Vec<RootClock>,
    log: PacketLog<LogEntry>,
    /// Per clock: the input packet number and its entry time.
    clock_input: AHashMap<Clock, (u64, u64)>,
    replays_in_flight: AHashMap<Clock, u32>,
    /// Replay copies travelling, by the instance their replay is aimed at, then by clock: how
    /// many of each (the earliest says how far a recovering target may go, [`Root::replay_frontier`]).
    replays_to: AHashMap<InstanceId, BTreeMap<Clock, u32>>,
    last_clock: Clock,
    deleted: Vec<Clock>,
    /// Buffers of deleted entries, for the next entries' copies, last freed first: a running
    /// log allocates nothing per packet, and copies into a buffer still in the cache.
    spare: Vec<Packet>,
    /// Clocks whose entries a root lost with its log while they were still in flight: no
    /// replay can bring them back.
    unlogged: AHashSet<Clock>,
    stats: RootStats,
}

impl Root {
    /// A root (or several, `cfg.roots`) with empty logs.
    pub fn new(cfg: RootConfig) -> Root {
        Root {
            clocks: vec![RootClock::default(); usize::from(cfg.roots.max(1))],
            cfg,
            log: PacketLog::default(),
            clock_input: AHashMap::new(),
            replays_in_flight: AHashMap::new(),
            replays_to: AHashMap::new(),
            last_clock: Clock::default(),
            deleted: Vec::new(),
            spare: Vec::new(),
            unlogged: AHashSet::new(),
            stats: RootStats::default(),
        }
    }

    /// How many roots share the input.
    pub fn roots(&self) -> usize {
        self.clocks.len()
    }

    /// The root whose share of the input `pkt` is ([`partition`] over this root's count).
    pub fn partition(&self, pkt: &Packet) -> u8 {
        partition(pkt, self.clocks.len())
    }

    /// Input packet number `input` arrives: stamp its clock (and ingress time), log it.
    pub fn admit(&mut self, input: u64, pkt: &mut Packet, now_ns: u64) -> Admission {
        if self.log.len() >= self.cfg.log_capacity {
            self.stats.log_full += 1;
            return Admission::LogFull;
        }
        let root = self.partition(pkt);
        let every = self.cfg.clock_persist_every;
        let Some(rc) = self.clocks.get_mut(usize::from(root)) else { return Admission::LogFull };
        rc.seq += 1;
        let mut persist = None;
        if rc.seq >= rc.persisted + every {
            rc.persisted = rc.seq;
            persist = Some(rc.seq);
            self.stats.clock_persists += 1;
        }
        let clock = Clock::new(root, rc.seq);
        pkt.meta.clock = clock;
        pkt.meta.ingress_ns = now_ns;
        pkt.meta.xor = 0;
        self.last_clock = clock;
        if self.cfg.remember_inputs {
            self.clock_input.insert(clock, (input, pkt.meta.ts_ns));
        }
        self.stats.admitted += 1;
        // The buffer freed last: the one most likely still in the cache.
        let packet = match self.spare.pop() {
            Some(spare) => pkt.copy_onto(spare),
            None => pkt.clone(),
        };
        self.log.insert(clock, LogEntry { input, packet, refs: 1, xor: 0, replayed: false, left: false });
        self.stats.log_peak = self.stats.log_peak.max(self.log.len() as u64);
        Admission::Admitted { clock, persist }
    }

    /// Another copy of `pkt` is on its way (a mirror copy, a clone's copy, a replay).
    pub fn copy_sent(&mut self, copy: &impl AsRef<Meta>) {
        let meta = copy.as_ref();
        if let Some(e) = self.log.get_mut(&meta.clock) {
            e.refs += 1;
        }
        if meta.flags.contains(MetaFlags::REPLAYED) {
            *self.replays_in_flight.entry(meta.clock).or_default() += 1;
            // A copy made past the target (a mirror copy downstream of it) is not on its way
            // to the target.
            if let Some(t) = meta.target.filter(|_| !meta.flags.contains(MetaFlags::REACHED)) {
                *self.replays_to.entry(t).or_default().entry(meta.clock).or_default() += 1;
            }
        }
    }

    /// A copy is done (dropped, consumed, suppressed, or it left and [`Root::copy_left`] was
    /// not used): fold its XOR vector in, delete the entry if nothing else is pending.
    #[inline]
    pub fn copy_finished(&mut self, copy: &impl AsRef<Meta>) {
        self.finish_copy(copy.as_ref(), false);
    }

    /// A copy left the chain and the root heard of it.
    #[inline]
    pub fn copy_left(&mut self, copy: &impl AsRef<Meta>) {
        self.finish_copy(copy.as_ref(), true);
    }

    /// A copy is done (`left`: it left the chain): one lookup of its entry per packet and copy.
    #[inline]
    fn finish_copy(&mut self, meta: &Meta, left: bool) {
        // A replay applied every update along its path with blocking, tagged operations:
        // whatever the lost copy left uncommitted is committed once its last copy is gone.
        let replay_done = meta.flags.contains(MetaFlags::REPLAYED) && self.replay_copy_gone(meta);
        let xor_check = self.cfg.xor_check;
        let Some(e) = self.log.get_mut(&meta.clock) else { return };
        e.replayed |= replay_done;
        e.left |= left;
        e.refs = e.refs.saturating_sub(1);
        e.xor ^= meta.xor;
        if e.deletable(xor_check) {
            self.delete(meta.clock);
        }
    }

    /// A copy was lost with a failed instance: its updates will be redone by the replay, so
    /// its vector is not folded in and the entry stays.
    pub fn copy_lost(&mut self, copy: &impl AsRef<Meta>) {
        let meta = copy.as_ref();
        if let Some(e) = self.log.get_mut(&meta.clock) {
            e.refs = e.refs.saturating_sub(1);
        }
        if meta.flags.contains(MetaFlags::REPLAYED) {
            self.replay_copy_gone(meta);
        }
    }

    /// A replay copy reached its target, which processed it (the driver marks it `REACHED`):
    /// the target has that part of the log, whatever happens to the copy downstream. A
    /// recovering target waits for its copies to reach it, not to leave the chain: downstream,
    /// an order-sensitive vertex may wait for a packet the target still holds.
    pub fn replay_reached(&mut self, copy: &impl AsRef<Meta>) {
        let meta = copy.as_ref();
        if meta.flags.contains(MetaFlags::REPLAYED) {
            if let Some(t) = meta.target {
                self.replay_to_target_done(t, meta.clock);
            }
        }
    }

    /// Replay copy `pkt`, on its way to its target, goes to `to` instead (the target handed its
    /// flow over to `to` in an immediate move while the replay was travelling): the copy now
    /// counts towards `to`'s replay, no longer towards the old target's recovery.
    pub fn retarget(&mut self, pkt: &mut Packet, to: InstanceId) {
        if !pkt.meta.flags.contains(MetaFlags::REPLAYED) || pkt.meta.flags.contains(MetaFlags::REACHED) {
            return;
        }
        if let Some(old) = pkt.meta.target.filter(|t| *t != to) {
            self.replay_to_target_done(old, pkt.meta.clock);
            *self.replays_to.entry(to).or_default().entry(pkt.meta.clock).or_default() += 1;
            pkt.meta.target = Some(to);
        }
    }

    fn replay_to_target_done(&mut self, t: InstanceId, clock: Clock) {
        let Some(copies) = self.replays_to.get_mut(&t) else { return };
        if let Some(n) = copies.get_mut(&clock) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                copies.remove(&clock);
            }
        }
        if copies.is_empty() {
            self.replays_to.remove(&t);
        }
    }

    /// One replay copy is gone; whether it was the last of its clock.
    fn replay_copy_gone(&mut self, meta: &Meta) -> bool {
        if let Some(t) = meta.target.filter(|_| !meta.flags.contains(MetaFlags::REACHED)) {
            self.replay_to_target_done(t, meta.clock);
        }
        let clock = meta.clock;
        let Some(n) = self.replays_in_flight.get_mut(&clock) else { return false };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.replays_in_flight.remove(&clock);
            return true;
        }
        false
    }

    /// An instance reports that the store acknowledged updates made for `clock`.
    #[inline]
    pub fn commit(&mut self, clock: Clock, xor: u64) {
        let xor_check = self.cfg.xor_check;
        let Some(e) = self.log.get_mut(&clock) else { return };
        e.xor ^= xor;
        if e.deletable(xor_check) {
            self.delete(clock);
        }
    }

    #[inline]
    fn delete(&mut self, clock: Clock) {
        if let Some(e) = self.log.remove(&clock) {
            // As many as the log can hold: entries come and go in bursts of up to a window,
            // and a cap below it sends most of a burst back to the allocator.
            if self.spare.len() < SPARE_BUFFERS.min(self.cfg.log_capacity) {
                self.spare.push(e.packet);
            }
            self.deleted.push(clock);
            self.stats.deleted += 1;
        }
    }

    /// Entries deleted since the last call, oldest first (for the log's copy in a store).
    pub fn take_deleted(&mut self) -> Vec<Clock> {
        std::mem::take(&mut self.deleted)
    }

    /// Whether entries were deleted since they were last taken.
    pub fn has_deleted(&self) -> bool {
        !self.deleted.is_empty()
    }

    /// [`Root::take_deleted`] without allocating: `each` is called with every clock.
    pub fn drain_deleted(&mut self, each: impl FnMut(Clock)) {
        self.deleted.drain(..).for_each(each);
    }

    /// Copies of every logged packet, in clock order, marked as replayed and aimed at `target`
    /// (the last one marked `LAST`); each counts as a copy on its way. An entry whose copy the
    /// root knows has left is replayed only for its uncommitted updates: marked `EMITTED`, so
    /// the chain's egress drops it. Returns each copy with its input packet number.
    pub fn replay_to(&mut self, target: InstanceId) -> Vec<(u64, Packet)> {
        let len = self.log.len();
        let mut copies = Vec::with_capacity(len);
        for (i, e) in self.log.values().enumerate() {
            let mut pkt = e.packet.clone();
            pkt.meta.flags.insert(MetaFlags::REPLAYED);
            if e.left {
                pkt.meta.flags.insert(MetaFlags::EMITTED);
            }
            if i + 1 == len {
                pkt.meta.flags.insert(MetaFlags::LAST);
            }
            pkt.meta.target = Some(target);
            pkt.meta.xor = 0;
            copies.push((e.input, pkt));
        }
        for (_, p) in &copies {
            self.copy_sent(p);
        }
        self.stats.replayed += copies.len() as u64;
        copies
    }

    /// The clocks with replay copies travelling, and how many (diagnostics).
    pub fn replays_travelling(&self) -> Vec<(Clock, u32)> {
        let mut v: Vec<_> = self.replays_in_flight.iter().map(|(c, n)| (*c, *n)).collect();
        v.sort();
        v
    }

    /// A fresh replay copy of one logged clock aimed at `target` (a copy of another replay lost
    /// with a failed instance on its way), counted as a copy on its way; `None` if `clock` is
    /// no longer logged.
    pub fn replay_clock_to(&mut self, clock: Clock, target: InstanceId) -> Option<(u64, Packet)> {
        let e = self.log.get(&clock)?;
        let mut pkt = e.packet.clone();
        pkt.meta.flags.insert(MetaFlags::REPLAYED);
        if e.left {
            pkt.meta.flags.insert(MetaFlags::EMITTED);
        }
        pkt.meta.target = Some(target);
        pkt.meta.xor = 0;
        let input = e.input;
        self.copy_sent(&pkt);
        self.stats.replayed += 1;
        Some((input, pkt))
    }

    /// No copy of a replay aimed at `target` is travelling any more: the instance has what the
    /// log held when its replay started, and may serve the live packets it held.
    pub fn replay_drained_to(&self, target: InstanceId) -> bool {
        !self.replays_to.contains_key(&target)
    }

    /// The earliest clock of a replay copy still on its way to `target`, with its entry time
    /// (`None`: none is). Everything of the replay before it has reached the target or gone,
    /// so a recovering target may go through that part of its replay at once rather than wait
    /// for the whole: a replay towards another instance that passes through the target needs
    /// what the target emits for it (two instances failing together, each on the other's
    /// replay path).
    pub fn replay_frontier(&self, target: InstanceId) -> Option<(Clock, u64)> {
        let clock = *self.replays_to.get(&target)?.keys().next()?;
        // An entry with copies travelling is still logged; without it, the earliest time.
        let entered = self.log.get(&clock).map_or(0, |e| e.packet.meta.ingress_ns);
        Some((clock, entered))
    }

    /// No replayed copy is travelling any more.
    pub fn replay_drained(&self) -> bool {
        self.replays_in_flight.is_empty()
    }

    /// Root `root` failed and a new one takes over: it resumes the clock past anything the old
    /// one may have stamped. With the log at the root (`log_lost`) the root's entries are gone:
    /// their copies in flight finish without an entry and can no longer be replayed.
    pub fn crash(&mut self, root: u8, log_lost: bool) -> Result<RootCrash, NoSuchRoot> {
        let roots = self.clocks.len();
        let every = self.cfg.clock_persist_every;
        let Some(rc) = self.clocks.get_mut(usize::from(root)) else { return Err(NoSuchRoot { root, roots }) };
        rc.seq = rc.persisted + every;
        rc.persisted = rc.seq;
        let resumed = rc.seq;
        let logged = self.log.keys().filter(|c| c.root() == root).count();
        if log_lost {
            let unlogged = &mut self.unlogged;
            self.log.retain(|c, _| {
                let keep = c.root() != root;
                if !keep {
                    unlogged.insert(*c);
                }
                keep
            });
        }
        Ok(RootCrash { logged, lost: log_lost, resumed })
    }

    /// Replaces the log by what its store copy holds (after a root or store crash): entries
    /// the store lost cannot be replayed; entries the old root had deleted are listed to be
    /// deleted again. Copies in flight and XOR vectors are kept with their entries.
    pub fn reload(&mut self, stored: BTreeMap<Clock, (u64, Packet)>) -> Reload {
        let old = std::mem::take(&mut self.log);
        let mut r = Reload::default();
        for (clock, (input, packet)) in stored {
            match old.get(&clock) {
                Some(e) => {
                    r.kept += 1;
                    self.log.insert(clock, LogEntry { input, packet, ..e.clone() });
                }
                None => r.stale.push(clock),
            }
        }
        r.lost = old.len() as u64 - r.kept;
        // What the store lost (written since its checkpoint) is beyond replay, like a lost root log.
        self.unlogged.extend(old.keys().filter(|c| !self.log.contains_key(c)));
        r
    }

    /// Whether every update made for `clock` so far is committed: its entry's XOR vector folds
    /// to zero (or a replay redid them); a clock no longer logged is done.
    pub fn committed(&self, clock: Clock) -> bool {
        self.log.get(&clock).is_none_or(|e| e.xor == 0 || e.replayed)
    }

    /// Whether `clock`'s log entry was lost while the packet was in flight (with a root that
    /// kept the log, or with a store that had not checkpointed it yet): a copy of it lost now
    /// (an instance failing with it queued) is lost for good. CHC cannot recover an NF failing
    /// together with the component that held its packets' log (docs/correctness.md).
    pub fn lost_with_log(&self, clock: Clock) -> bool {
        self.unlogged.contains(&clock)
    }

    /// Whether any entry was lost while its packet was in flight ([`Root::lost_with_log`]):
    /// copies of clocks below the oldest logged one may still be on their way.
    pub fn lost_any_with_log(&self) -> bool {
        !self.unlogged.is_empty()
    }

    /// The log, in clock order: (clock, input packet number, packet as the root logged it).
    /// After a store crash that cut the log's copy in the store back to its checkpoint, the
    /// driver writes what the store lost back from here (the roots that did not fail with it).
    pub fn log_entries(&self) -> impl Iterator<Item = (Clock, u64, &Packet)> + '_ {
        self.log.iter().map(|(c, e)| (c, e.input, &e.packet))
    }

    /// Whether `clock` is still in the log.
    pub fn is_logged(&self, clock: Clock) -> bool {
        self.log.contains_key(&clock)
    }

    /// Packets in the log.
    pub fn logged(&self) -> usize {
        self.log.len()
    }

    /// The input packet number `clock` was stamped on.
    pub fn input_of(&self, clock: Clock) -> Option<u64> {
        self.clock_input.get(&clock).map(|c| c.0)
    }

    /// When the packet stamped `clock` entered the chain (its packet time); 0 if unknown.
    pub fn entry_time(&self, clock: Clock) -> u64 {
        self.clock_input.get(&clock).map_or(0, |c| c.1)
    }

    /// The clock of the last packet admitted.
    pub fn last_clock(&self) -> Clock {
        self.last_clock
    }

    /// Counters.
    pub fn stats(&self) -> RootStats {
        self.stats
    }
}

mod log;
#[cfg(test)]
mod tests;

impl std::fmt::Display for NoSuchRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no root {}: the chain has {} root(s)", self.root, self.roots)
    }
}

impl std::error::Error for NoSuchRoot {}

/// The root (of `roots`) whose share of the input `pkt` is: a static partition by source
/// address, so that a host's packets all enter at one root and keep their order in its clocks
/// (NFs that order a host's events by clock, such as the Trojan detector, rely on it). Not
/// symmetric: a connection's two directions may enter at different roots, so a driver whose
/// roots run concurrently merges what they admit in entry order before the chain's first NFs.
pub fn partition(pkt: &Packet, roots: usize) -> u8 {
    let n = roots as u64;
    if n <= 1 {
        return 0;
    }
    let h = match pkt.tuple().map(|t| t.src) {
        Some(std::net::IpAddr::V4(a)) => u64::from(u32::from(a)),
        Some(std::net::IpAddr::V6(a)) => a.octets().iter().fold(0u64, |h, x| h.rotate_left(8) ^ u64::from(*x)),
        None => 0,
    };
    // Multiplicative hashing spreads neighbouring addresses over the roots.
    ((h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % n) as u8
}
