//! The roots of a threaded run (CHC's root): each stamps its own clocks on its share of the
//! input, logs what it admits (with fault tolerance), keeps its oldest unfinished clock, tells
//! the store which of its per-clock logs can go, and sends what it admitted into the chain.
//!
//! With one root (the default) all of it runs on the calling thread, between reading the
//! source and draining the sink. With several (`RunConfig::roots`) the calling thread reads the
//! source and splits it by source address ([`sluice_chc::root::partition`], so a host's
//! packets keep their order in one root's clocks); its own share it admits as root 0, the
//! others go in batches over one queue per root to root threads that run [`other_root`]. The
//! sink, the notes of root 0 and control stay with the calling thread; every root drains the
//! notes about its own clocks (`Shared::notes` has a queue per root).

use super::ft::{Note, RootLog};
use super::outgoing::{single_destination, Outgoing};
use super::{Overflow, RunError, Shared};
use crate::filter::CompiledFilter;
use crate::plan::{direction, Routes};
use crate::record::DropRecord;
use crate::report::{FaultToleranceReport, RootCrashReport};
use sluice_chc::egress::Egress;
use sluice_packet::{Batch, Clock, InstanceId, Packet};
use sluice_store::{Backend, Connection, Replies, Request, StoreKey, StoreOp};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One root's admission and what it did.
pub(super) struct RootState {
    /// Which root (its clocks carry it).
    pub(super) id: u8,
    /// The last sequence number it stamped.
    pub(super) seq: u64,
    /// Its oldest clock still in flight (or, with failovers, still logged).
    pub(super) low: u64,
    /// With fault tolerance: its packet log.
    pub(super) log: Option<RootLog>,
    /// Packets it dropped, by reason.
    pub(super) drops: BTreeMap<&'static str, u64>,
    /// With a recording: per packet handed to this root, in order, the clock it stamped or
    /// `None` where it dropped the packet.
    pub(super) recorded: Option<Vec<Option<Clock>>>,
    /// With a recording: packets no entry route took.
    pub(super) no_route: Vec<DropRecord>,
    /// The latest packet time it admitted.
    pub(super) last_ts: u64,
    /// Packets the traffic filter sent past the chain.
    pub(super) bypassed: u64,
    /// Mirror copies its entry routes made (a root thread's; root 0's are the caller's).
    pub(super) mirrored: u64,
    forget: Forgetting,
}

/// Telling the store which per-clock logs of a root can go.
struct Forgetting {
    conn: Option<Box<dyn Connection>>,
    /// Sequence numbers up to this one are forgotten.
    upto: u64,
    last: Instant,
    batches: u64,
    discard: Replies,
}

impl RootState {
    /// Root `id` of a run with `roots`, connected to `store` if the state is in one.
    pub(super) fn new(
        id: u8,
        (log, record): (Option<RootLog>, bool),
        store: Option<&Arc<dyn Backend>>,
    ) -> Result<RootState, RunError> {
        let conn = match store {
            Some(b) => Some(
                b.connect(InstanceId(u32::MAX - u32::from(id)))
                    .map_err(|e| RunError::Config(format!("state store: {e}")))?,
            ),
            None => None,
        };
        Ok(RootState {
            id,
            seq: 0,
            low: 1,
            log,
            drops: BTreeMap::new(),
            recorded: record.then(Vec::new),
            no_route: Vec::new(),
            last_ts: 0,
            bypassed: 0,
            mirrored: 0,
            forget: Forgetting { conn, upto: 0, last: Instant::now(), batches: 0, discard: Replies::default() },
        })
    }

    /// The store connection the root's own requests go through.
    pub(super) fn reconnect(&mut self, store: &Arc<dyn Backend>) -> Result<(), RunError> {
        if let Some(conn) = self.forget.conn.as_mut() {
            *conn = store
                .connect(InstanceId(u32::MAX - u32::from(self.id)))
                .map_err(|e| RunError::Config(format!("state store: {e}")))?;
        }
        Ok(())
    }

    /// Applies the notes about this root's clocks; its oldest clock still logged.
    pub(super) fn take_notes(&mut self, shared: &Shared) -> Option<Clock> {
        self.log.as_mut().and_then(|l| drain_notes(shared, self.id, l))
    }

    /// Moves the oldest unfinished clock up past what finished. With failovers, a clock still
    /// logged keeps its slot in the in-flight ring: a replay may count copies of it again.
    pub(super) fn advance_low(&mut self, shared: &Shared) {
        let replays = shared.failover.is_some();
        while self.low <= self.seq {
            let c = Clock::new(self.id, self.low);
            if !shared.clocks.finished(c) || (replays && self.log.as_ref().is_some_and(|l| l.is_logged(c))) {
                break;
            }
            self.low += 1;
        }
    }

    /// Per-clock logs in the store are kept only for packets still in flight, or, with the
    /// root's log, still logged (a replay would need them): tells the store, at most every
    /// 2 ms, which can go.
    pub(super) fn forget_old(&mut self, oldest_logged: Option<Clock>) -> Result<(), RunError> {
        let f = &mut self.forget;
        let Some(conn) = f.conn.as_mut() else { return Ok(()) };
        let floor = oldest_logged.map_or(self.low, |c| c.seq().min(self.low));
        if floor <= f.upto + 1 || f.last.elapsed() < Duration::from_millis(2) {
            return Ok(());
        }
        f.last = Instant::now();
        f.upto = floor - 1;
        let key = StoreKey { vertex: 0, object: 0, key: sluice_state::StateKey::Unit };
        let op = StoreOp::ForgetClock(Clock::new(self.id, f.upto));
        let req = Request { id: 0, client: InstanceId(0), tag: None, key, op, reply: false };
        f.batches += 1;
        conn.send(f.batches, Arc::new([req])).map_err(|e| RunError::Worker(format!("state store: {e}")))?;
        f.discard = Replies::default();
        let _ = conn.poll(&mut f.discard);
        Ok(())
    }

    /// How many packets this root may admit now: within the window, its clock ring and its
    /// log. With several roots each has its own share of the window, counted as its clocks from
    /// the oldest unfinished one: a root always gets room once its own clocks finish, whatever
    /// the others hold. (A shared count would let packets held in entry order fill the window
    /// while the packet they wait for cannot be admitted.)
    pub(super) fn room(&self, shared: &Shared, window: usize) -> usize {
        if shared.hold_admission.load(Ordering::Acquire) {
            return 0;
        }
        let outstanding = self.seq + 1 - self.low;
        let span_room = shared.clocks.span().saturating_sub(outstanding) as usize;
        let log_room = self.log.as_ref().map_or(usize::MAX, RootLog::room);
        let window_room = if shared.roots > 1 {
            (window / usize::from(shared.roots)).saturating_sub(outstanding as usize)
        } else {
            window.saturating_sub(shared.in_flight.load(Ordering::Acquire))
        };
        window_room.min(span_room).min(log_room)
    }

    /// Stamps and logs a packet handed to this root (its entry time, in
    /// `ingress_ns`, stamped by the reading thread); `None` if it dropped it (`over`: past the
    /// window with `overflow: drop`; or the log was full).
    #[inline]
    pub(super) fn admit(&mut self, shared: &Shared, mut pkt: Packet, over: bool) -> Option<Packet> {
        if over || self.log.is_some() {
            return self.admit_logged_or_over(shared, pkt, over);
        }
        // Without a log nothing refuses a packet within the window: stamped in line.
        self.stamp(shared, &mut pkt);
        Some(pkt)
    }

    /// [`RootState::admit`] for a packet past the window or a root with a log (out of line).
    #[inline(never)]
    fn admit_logged_or_over(&mut self, shared: &Shared, mut pkt: Packet, over: bool) -> Option<Packet> {
        let now_ns = pkt.meta.ingress_ns;
        let refused = if over {
            Some("window-full")
        } else if let Some(l) = self.log.as_mut() {
            match l.admit(self.seq + 1, &mut pkt, now_ns) {
                // The log's root stamps the clock: after a root crash it resumes past the
                // persisted one, not at the next.
                Some(clock) => {
                    self.seq = clock.seq() - 1;
                    None
                }
                // Unreachable while admission waits for room in the log; counted if not.
                None => Some("log-full"),
            }
        } else {
            None
        };
        if let Some(r) = refused {
            if let Some(rec) = self.recorded.as_mut() {
                rec.push(None);
            }
            *self.drops.entry(r).or_default() += 1;
            shared.pool.recycle(pkt);
            return None;
        }
        // As the reading thread stamped it, whatever the log's admission did to the metadata.
        pkt.meta.ingress_ns = now_ns;
        self.stamp(shared, &mut pkt);
        Some(pkt)
    }

    /// Gives an admitted packet the root's next clock and tells the run's clock ring of it
    /// (with its entry time, stamped by the reading thread in `ingress_ns`).
    #[inline]
    fn stamp(&mut self, shared: &Shared, pkt: &mut Packet) {
        let now_ns = pkt.meta.ingress_ns;
        self.seq += 1;
        pkt.meta.clock = Clock::new(self.id, self.seq);
        shared.clocks.admit(pkt.meta.clock, now_ns);
        if shared.publish_admissions {
            if let Some(a) = shared.admissions.admitted.get(usize::from(self.id)) {
                a.store(self.seq, Ordering::Release);
            }
        }
        if let Some(rec) = self.recorded.as_mut() {
            rec.push(Some(pkt.meta.clock));
            self.last_ts = self.last_ts.max(pkt.meta.ts_ns);
        }
        // Counted in flight by `enter`, for the whole batch at once.
    }

    /// Counts in flight and sends what this root admitted into the chain: past it if the
    /// traffic filter says so, else along the entry routes; a packet no route takes is done
    /// here.
    pub(super) fn enter(
        &mut self,
        shared: &Shared,
        out: &mut Outgoing,
        (entry, traffic): (&[Routes], Option<&CompiledFilter>),
        stamped: &mut Batch,
    ) -> Result<(), RunError> {
        // In flight before any of them can be seen (and finish) downstream: one atomic add a
        // batch, not one a packet (it was 4 % of a pass-through's time).
        shared.in_flight.fetch_add(stamped.len(), Ordering::AcqRel);
        if let Some(l) = self.log.as_mut() {
            // With the log in the store, a packet enters the chain once the store has it.
            l.persist(stamped.iter().map(|p| (p.meta.clock.seq(), p))).map_err(|e| RunError::Worker(e.to_string()))?;
        }
        let only_to = match entry {
            [routes] => single_destination(shared, routes),
            _ => None,
        };
        for pkt in stamped.drain(..) {
            if traffic.is_some_and(|f| !f.matches(&pkt)) {
                self.bypassed += 1;
                out.push(shared, shared.queues.len(), pkt);
                continue;
            }
            if let (Some(d), None) = (only_to, pkt.meta.replay_target()) {
                out.push_in_run(shared, d, pkt);
                continue;
            }
            let Some(routes) = entry.get(direction(&pkt, entry.len())) else { continue };
            if let Some(pkt) = out.route(shared, routes, pkt) {
                if self.recorded.is_some() {
                    let d = DropRecord { clock: pkt.meta.clock, vertex: "input".into(), reason: "no-route" };
                    self.no_route.push(d);
                }
                *self.drops.entry("no-route").or_default() += 1;
                if let Some(l) = self.log.as_mut() {
                    l.note(&Note::Finished(pkt.meta));
                }
                shared.clocks.done(pkt.meta.clock);
                shared.pool.recycle(pkt);
                shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        }
        out.flush(shared);
        Ok(())
    }

    /// Says that every packet handed to this root that entered up to `entry` is admitted (or
    /// dropped): order-sensitive instances need not wait for this root before then.
    pub(super) fn passed(&self, shared: &Shared, entry: u64) {
        if shared.publish_admissions {
            if let Some(p) = shared.admissions.passed.get(usize::from(self.id)) {
                p.fetch_max(entry, Ordering::AcqRel);
            }
        }
    }

    /// Packets it dropped.
    pub(super) fn dropped(&self) -> u64 {
        self.drops.values().sum()
    }

    /// Entries still in its log.
    pub(super) fn logged(&self) -> usize {
        self.log.as_ref().map_or(0, RootLog::logged)
    }
}

/// Applies the notes about root `id`'s clocks to its log and passes its deletes on; the oldest
/// clock still logged.
pub(super) fn drain_notes(shared: &Shared, id: u8, log: &mut RootLog) -> Option<Clock> {
    if let Some(q) = shared.notes.as_ref().and_then(|q| q.get(usize::from(id))) {
        while let Some(mut b) = q.pop() {
            for n in &b {
                log.note(n);
            }
            b.clear();
            let _ = shared.note_spare.push(b);
        }
    }
    log.sync_deletes(&shared.egress)
}

/// The calling thread's side of the split: batches for the other roots, pushed onto their
/// queues; what does not fit waits here, and meanwhile no more input is read.
pub(super) struct Split {
    bufs: Vec<Batch>,
    /// The entry time last stamped.
    pub(super) last_entry: u64,
    /// With a recording: per input packet, the root it went to (`None`: dropped before).
    pub(super) routed: Option<Vec<Option<u8>>>,
    /// Input packets that went to a root so far.
    entered: u64,
}

impl Split {
    pub(super) fn new(roots: u8, record: bool) -> Split {
        let bufs = (0..roots).map(|_| Vec::new()).collect();
        Split { bufs, last_entry: 0, routed: record.then(Vec::new), entered: 0 }
    }

    /// Notes that the next input packet went to root `to` (`None`: dropped before any root).
    pub(super) fn routed(&mut self, to: Option<u8>) {
        self.entered += u64::from(to.is_some());
        if let Some(r) = self.routed.as_mut() {
            r.push(to);
        }
    }

    /// How many input packets went to a root so far.
    pub(super) fn entered(&self) -> u64 {
        self.entered
    }

    /// Hands `pkt` to root `to` (not 0).
    pub(super) fn hand(&mut self, shared: &Shared, to: u8, pkt: Packet) {
        let Some(buf) = self.bufs.get_mut(usize::from(to)) else { return };
        if buf.capacity() == 0 {
            *buf = shared.empty_batch();
        }
        buf.push(pkt);
    }

    /// Pushes what was handed to the other roots; whether something still waits for room.
    pub(super) fn push(&mut self, shared: &Shared) -> bool {
        let mut waits = false;
        for (r, buf) in self.bufs.iter_mut().enumerate() {
            if buf.is_empty() {
                continue;
            }
            let Some(q) = shared.root_inputs.get(r) else { continue };
            let b = std::mem::take(buf);
            let n = b.len();
            // Counted before the push: the run ends only when nothing is handed and not admitted.
            shared.handed.fetch_add(n, Ordering::AcqRel);
            if let Err(b) = q.push(b) {
                shared.handed.fetch_sub(n, Ordering::AcqRel);
                *buf = b;
                waits = true;
            }
        }
        if !waits {
            // Every packet read so far is on its root's queue or admitted.
            shared.entered.store(self.last_entry, Ordering::Release);
        }
        waits
    }

    /// Stamps `pkt`'s entry time (`ingress_ns`): `now_ns`, or just past the last one, so that
    /// entry times are unique and follow the input's order.
    pub(super) fn stamp(&mut self, pkt: &mut Packet, now_ns: u64) {
        self.last_entry = now_ns.max(self.last_entry + 1);
        pkt.meta.ingress_ns = self.last_entry;
    }
}

/// Crashes of roots other than 0 (root 0 fails on the calling thread): asked by the calling
/// thread, carried out by the root's own thread between two of its batches.
pub(super) struct RootCrashes {
    /// Per root: the packet count its crash was asked at, or `u64::MAX` for none.
    asked: Vec<AtomicU64>,
    /// What the crashes did, for the report.
    done: Mutex<Vec<RootCrashReport>>,
    /// When the run was set up (the reports' times count from it).
    t0: Instant,
}

impl RootCrashes {
    pub(super) fn new(roots: u8) -> RootCrashes {
        let asked = (0..roots).map(|_| AtomicU64::new(u64::MAX)).collect();
        RootCrashes { asked, done: Mutex::new(Vec::new()), t0: Instant::now() }
    }

    /// Asks root `root` to fail (`after` packets admitted).
    pub(super) fn ask(&self, root: u8, after: u64) {
        if let Some(a) = self.asked.get(usize::from(root)) {
            a.store(after, Ordering::Release);
        }
    }

    /// Whether a crash asked for is not carried out yet.
    pub(super) fn pending(&self) -> bool {
        self.asked.iter().any(|a| a.load(Ordering::Acquire) != u64::MAX)
    }

    /// The crashes carried out, for the report.
    pub(super) fn take_done(&self) -> Vec<RootCrashReport> {
        std::mem::take(&mut *self.done.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// On root `state.id`'s thread, between two batches: fails the root if asked, its log lost
    /// or read back from the store (`RootLog::crash`), and resumes its clock past it.
    fn carry_out(&self, state: &mut RootState) -> Result<(), RunError> {
        let Some(asked) = self.asked.get(usize::from(state.id)) else { return Ok(()) };
        let after = asked.load(Ordering::Acquire);
        if after == u64::MAX {
            return Ok(());
        }
        // Without a log there is nothing to recover (a run with root crashes has one): the
        // ask goes, or the run would wait for it forever.
        asked.store(u64::MAX, Ordering::Release);
        let Some(log) = state.log.as_mut() else { return Ok(()) };
        let at_ms = self.t0.elapsed().as_secs_f64() * 1e3;
        let report =
            log.crash((after, at_ms)).map_err(|e| RunError::Worker(format!("the new root {}: {e}", state.id)))?;
        // The clocks skipped count against the window at once (as for root 0).
        state.seq = report.resumed_at;
        self.done.lock().unwrap_or_else(PoisonError::into_inner).push(report);
        Ok(())
    }
}

/// What a root thread hands back at the end of the run.
pub(super) type RootEnd = Result<RootState, RunError>;

/// A root thread (root `state.id`, not 0): admits what the calling thread hands it, until the
/// run is over.
pub(super) fn other_root(
    shared: &Shared,
    mut state: RootState,
    (entry, traffic): (&[Routes], Option<&CompiledFilter>),
    (window, overflow): (usize, Overflow),
) -> RootEnd {
    let mut out = Outgoing::new(shared);
    let mut stamped: Batch = Vec::with_capacity(shared.batch);
    let id = usize::from(state.id);
    let Some(input) = shared.root_inputs.get(id) else { return Ok(state) };
    let mut idle = 0u32;
    let mut replays = super::failover::Replays::default();
    let mut store_crashes_seen = 0u64;
    let publish = |state: &RootState| {
        if let Some(n) = shared.root_logged.get(id) {
            n.store(state.logged(), Ordering::Release);
        }
    };
    while !shared.aborted.load(Ordering::Acquire) {
        super::store_crash::root_holds_if_asked(shared, &mut state, &mut store_crashes_seen)?;
        let oldest_logged = state.take_notes(shared);
        if let (Some(fo), Some(log)) = (&shared.failover, state.log.as_mut()) {
            fo.set_oldest_logged(state.id, oldest_logged.map_or(state.seq + 1, |c| c.seq()));
            replays.serve(shared, state.id, (entry, traffic), (log, &mut out));
        }
        publish(&state);
        let stalled = out.retry(shared);
        if !stalled {
            // Between two batches, everything admitted in the chain.
            shared.root_crashes.carry_out(&mut state)?;
        }
        state.advance_low(shared);
        if let Some(sc) = &shared.scaling {
            sc.set_low(state.id, state.low);
        }
        state.forget_old(oldest_logged)?;
        // Read before looking at the queue: with the queue empty, everything entered up to
        // it and handed to this root is admitted (said even when there is no room to admit
        // more: packets held in entry order may wait for it).
        let entered = shared.entered.load(Ordering::Acquire);
        if input.is_empty() {
            state.passed(shared, entered);
        }
        let room = state.room(shared, window);
        if stalled || (room < shared.batch && overflow == Overflow::Wait) {
            std::thread::sleep(Duration::from_micros(20));
            continue;
        }
        let Some(mut batch) = input.pop() else {
            state.passed(shared, entered);
            if shared.input_done.load(Ordering::Acquire) {
                break;
            }
            idle += 1;
            if idle < super::IDLE_TURNS_BEFORE_SLEEP {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(10));
            }
            continue;
        };
        idle = 0;
        let n = batch.len();
        let last_entry = batch.last().map_or(0, |p| p.meta.ingress_ns);
        for (i, pkt) in batch.drain(..).enumerate() {
            let over = i >= room && overflow == Overflow::Drop;
            if let Some(p) = state.admit(shared, pkt, over) {
                stamped.push(p);
            }
        }
        state.passed(shared, last_entry);
        shared.give_back(batch);
        state.enter(shared, &mut out, (entry, traffic), &mut stamped)?;
        // In flight and logged before no longer handed: the calling thread reads them in the
        // other order.
        publish(&state);
        shared.handed.fetch_sub(n, Ordering::AcqRel);
    }
    publish(&state);
    state.mirrored = out.mirrored;
    Ok(state)
}

/// Adds what the roots bypassed and dropped (by reason, with the drops counted on the root
/// thread, `counted`) to the run's report.
pub(super) fn drops_into(
    report: &mut crate::report::RunReport,
    roots: &mut [RootState],
    mut counted: std::collections::BTreeMap<&'static str, u64>,
) {
    for r in roots {
        report.bypassed += r.bypassed;
        for (reason, n) in std::mem::take(&mut r.drops) {
            *counted.entry(reason).or_default() += n;
        }
    }
    for (r, n) in counted {
        report.dropped.insert(format!("root: {r}"), n);
    }
}

/// What the roots' logs did over the run, added up (`None` without fault tolerance); the
/// duplicates are the egress's.
pub(super) fn log_report(roots: &[RootState], egress: &Mutex<Egress>) -> Option<FaultToleranceReport> {
    let mut total: Option<FaultToleranceReport> = None;
    for r in roots.iter().filter_map(|r| r.log.as_ref().map(RootLog::report)) {
        let t = total.get_or_insert_with(FaultToleranceReport::default);
        t.logged += r.logged;
        t.deleted += r.deleted;
        t.left_in_log += r.left_in_log;
        t.log_peak += r.log_peak;
        t.commits += r.commits;
    }
    if let Some(t) = total.as_mut() {
        t.duplicates_suppressed = egress.lock().unwrap_or_else(PoisonError::into_inner).dropped();
    }
    total
}

/// A recorded run's admissions in input order: the routes the calling thread recorded, each
/// root's clocks in the order it admitted its share.
pub(super) fn merge_recorded(routed: Vec<Option<u8>>, roots: &mut [RootState]) -> Vec<Option<Clock>> {
    let mut per_root: Vec<std::vec::IntoIter<Option<Clock>>> =
        roots.iter_mut().map(|r| r.recorded.take().unwrap_or_default().into_iter()).collect();
    routed
        .into_iter()
        .map(|to| to.and_then(|r| per_root.get_mut(usize::from(r)).and_then(Iterator::next).flatten()))
        .collect()
}
