//! What a thread sends to other threads: per-destination batches of packets and the notes for
//! the root's log, pushed when full or at the end of an input batch. No thread ever waits for
//! room in a queue: what does not fit stays here, in sending order ([`Outgoing::retry`]).

use super::alloc::Cached;
use super::ft::Note;
use super::Shared;
use crate::plan::{Routes, Splitter, Target};
use sluice_packet::{Batch, Clock, MetaFlags, Packet};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// Per-destination output buffers of one thread: index `i` for instance `i`, the last for the
/// sink. Full buffers are pushed at once; the rest at the end of each input batch.
pub(super) struct Outgoing {
    bufs: Vec<Batch>,
    /// Destinations whose buffer took a packet since the last [`Outgoing::flush`] (a run that
    /// may scale has hundreds of destinations, most of them spares never used).
    filled: Vec<usize>,
    pub(super) splitter: Splitter,
    /// With scaling possible: the flow allocation as this thread last loaded it.
    pub(super) alloc: Cached,
    pub(super) mirrored: u64,
    /// Notes for the roots' logs not sent yet, by root.
    pub(super) notes: Vec<Vec<Note>>,
    /// Scratch space for the commits a store client reports.
    pub(super) commits: Vec<(Clock, u64)>,
    /// What found its queue full, in the order it was sent ([`Outgoing::retry`]).
    pub(super) stalled: VecDeque<Stalled>,
    /// Set while an instance processes a batch whose updates are not sent yet
    /// (`Shared::send_updates_first`): full buffers wait in `held` until [`Outgoing::flush`],
    /// which comes after the instance's `end_batch` sent them.
    pub(super) hold: bool,
    held: Vec<(usize, Batch)>,
    /// Packets in a row bound for `run.0`, not in its buffer yet ([`Outgoing::push_in_run`]).
    run: (usize, Batch),
}

/// Something a thread sent that found its queue full.
pub(super) enum Stalled {
    /// Notes for root `.0`'s log.
    Notes(usize, Vec<Note>),
    /// A batch for instance `.0` (or the sink, past the last instance).
    Batch(usize, Batch),
}

impl Outgoing {
    pub(super) fn new(shared: &Shared) -> Outgoing {
        Outgoing {
            bufs: (0..=shared.queues.len()).map(|_| Vec::new()).collect(),
            filled: Vec::new(),
            splitter: Splitter::default(),
            alloc: Cached::default(),
            mirrored: 0,
            notes: (0..shared.roots).map(|_| Vec::new()).collect(),
            commits: Vec::new(),
            stalled: VecDeque::new(),
            hold: false,
            held: Vec::new(),
            run: (0, Vec::new()),
        }
    }

    /// Pushes `item` onto its queue, or, if that is full or something sent earlier still
    /// waits, keeps it to push later: in sending order, so the root never sees a copy finish
    /// before it heard the copy was made.
    pub(super) fn send(&mut self, shared: &Shared, item: Stalled) {
        if !self.stalled.is_empty() {
            self.stalled.push_back(item);
            return;
        }
        if let Err(back) = try_push(shared, item) {
            self.stalled.push_back(back);
        }
    }

    /// Pushes what waited, in order, as far as the queues take it. Whether anything waits still.
    pub(super) fn retry(&mut self, shared: &Shared) -> bool {
        while let Some(item) = self.stalled.pop_front() {
            if let Err(back) = try_push(shared, item) {
                self.stalled.push_front(back);
                return true;
            }
        }
        false
    }

    /// Queues a note for the log of the root that stamped its clock (only when roots keep logs).
    pub(super) fn note(&mut self, shared: &Shared, note: Note) {
        if shared.logging() {
            let r = usize::from(note.clock().root());
            if self.notes.get(r).is_some_and(|n| n.len() >= NOTES_PER_BUFFER) {
                // A burst (a store acknowledging many batches at once) goes in several
                // buffers rather than growing one: the buffers circulate and never reallocate.
                self.flush_notes(shared);
            }
            if let Some(n) = self.notes.get_mut(r) {
                n.push(note);
            }
        }
    }

    /// Sends the notes gathered so far to their roots.
    pub(super) fn flush_notes(&mut self, shared: &Shared) {
        if !shared.logging() {
            return;
        }
        for r in 0..self.notes.len() {
            if self.notes.get(r).is_none_or(Vec::is_empty) {
                continue;
            }
            let fresh = shared.note_spare.pop().unwrap_or_else(|| Vec::with_capacity(NOTES_PER_BUFFER));
            let Some(n) = self.notes.get_mut(r) else { continue };
            let notes = std::mem::replace(n, fresh);
            self.send(shared, Stalled::Notes(r, notes));
        }
    }

    pub(super) fn push(&mut self, shared: &Shared, dest: usize, pkt: Packet) {
        if !self.run.1.is_empty() {
            // Packets in a run were sent before this one.
            self.end_run(shared);
        }
        let Some(buf) = self.bufs.get_mut(dest) else { return };
        if buf.capacity() == 0 {
            *buf = shared.empty_batch();
        }
        if buf.is_empty() {
            self.filled.push(dest);
        }
        buf.push(pkt);
        if buf.len() >= shared.batch {
            self.full(shared, dest);
        }
    }

    /// `dest`'s buffer is full: pushed at once, or, while an instance's updates are not sent
    /// yet ([`Outgoing::hold`]), kept aside until [`Outgoing::flush`].
    fn full(&mut self, shared: &Shared, dest: usize) {
        if !self.hold {
            self.flush_one(shared, dest);
        } else if let Some(buf) = self.bufs.get_mut(dest) {
            let full = std::mem::take(buf);
            self.held.push((dest, full));
        }
    }

    /// Like [`Outgoing::push`], for a hot path that sends packet after packet to one place:
    /// they gather in a run, and [`Outgoing::end_run`] hands the run's buffer over whole when
    /// nothing waits for `dest` yet. A `push` or `flush` ends the run first, so packets keep
    /// their sending order.
    #[inline]
    pub(super) fn push_in_run(&mut self, shared: &Shared, dest: usize, pkt: Packet) {
        // Most packets: one more in a run that goes on (a test and a store, inlined where the
        // packets are made; the run's start and end out of line).
        if self.run.0 == dest && !self.run.1.is_empty() && self.run.1.len() + 1 < shared.batch {
            self.run.1.push(pkt);
            return;
        }
        self.push_starting_or_ending_run(shared, dest, pkt);
    }

    /// [`Outgoing::push_in_run`] for a packet that starts a run or ends one.
    #[inline(never)]
    fn push_starting_or_ending_run(&mut self, shared: &Shared, dest: usize, pkt: Packet) {
        if self.run.0 != dest {
            self.end_run(shared);
        }
        if self.run.1.is_empty() {
            self.run.0 = dest;
            if self.run.1.capacity() == 0 {
                self.run.1 = shared.empty_batch();
            }
        }
        self.run.1.push(pkt);
        if self.run.1.len() >= shared.batch {
            self.end_run(shared);
        }
    }

    /// Puts the run's packets in their destination's buffer: the run's buffer itself if that
    /// one is empty, else packet by packet.
    pub(super) fn end_run(&mut self, shared: &Shared) {
        if self.run.1.is_empty() {
            return;
        }
        let dest = self.run.0;
        let Some(buf) = self.bufs.get_mut(dest) else {
            // Where `push` would take the packets nowhere either.
            self.run.1.clear();
            return;
        };
        if !buf.is_empty() || self.run.1.len() > shared.batch {
            let mut run = std::mem::take(&mut self.run.1);
            for p in run.drain(..) {
                self.push(shared, dest, p);
            }
            self.run.1 = run;
            return;
        }
        std::mem::swap(buf, &mut self.run.1);
        self.filled.push(dest);
        if buf.len() >= shared.batch {
            self.full(shared, dest);
        }
    }

    pub(super) fn flush_one(&mut self, shared: &Shared, dest: usize) {
        if self.bufs.get(dest).is_none_or(Vec::is_empty) {
            return;
        }
        // The root hears of copies made before any of them can finish elsewhere.
        self.flush_notes(shared);
        let Some(buf) = self.bufs.get_mut(dest) else { return };
        let b = std::mem::take(buf);
        self.send(shared, Stalled::Batch(dest, b));
    }

    pub(super) fn flush(&mut self, shared: &Shared) {
        self.end_run(shared);
        self.retry(shared);
        if !self.held.is_empty() {
            // Before the rest of their destinations' packets, as they were filled.
            self.flush_notes(shared);
            let mut held = std::mem::take(&mut self.held);
            for (dest, b) in held.drain(..) {
                self.send(shared, Stalled::Batch(dest, b));
            }
            // Its room is kept for the next batch.
            self.held = held;
        }
        let mut filled = std::mem::take(&mut self.filled);
        // In destination order, as a walk over every buffer would go; a destination filled,
        // pushed and filled again is listed twice.
        filled.sort_unstable();
        filled.dedup();
        for d in filled.drain(..) {
            self.flush_one(shared, d);
        }
        self.filled = filled;
        self.flush_notes(shared);
    }

    pub(super) fn dest(&mut self, shared: &Shared, t: Target, pkt: &Packet) -> usize {
        match t {
            Target::Output => shared.queues.len(),
            Target::Vertex(v) => match (shared.vertices.get(v), &shared.scaling) {
                (Some(vp), None) => self.splitter.pick(vp, pkt),
                // The allocation of the packet's clock, wherever and whenever it is routed.
                (Some(vp), Some(sc)) => self.alloc.pick(&sc.alloc, v, vp, pkt).unwrap_or(shared.queues.len()),
                (None, _) => shared.queues.len(),
            },
        }
    }

    /// Sends `pkt` along `routes`: copies to matching mirror edges, the packet itself to the
    /// first matching on-path edge. Returns the packet back if no edge takes it. A replay copy
    /// on its way to its target goes only where that leads ([`Shared::leads_to`]).
    pub(super) fn route(&mut self, shared: &Shared, routes: &Routes, pkt: Packet) -> Option<Packet> {
        let replay = pkt.meta.replay_target();
        if !routes.mirrors.is_empty() {
            let mut copies = 0;
            for t in routes.mirror_targets(&pkt) {
                let d = self.dest(shared, t, &pkt);
                if replay.is_some_and(|r| !shared.leads_to(t, d, r)) {
                    continue;
                }
                let mut c = shared.pool.copy_of(&pkt);
                // The original carries the XOR vector of the updates so far; a copy starts
                // empty, so the root folds each update in once.
                c.meta.xor = 0;
                c.meta.flags.insert(MetaFlags::MIRROR);
                // Account for the copy before it can be seen downstream.
                shared.in_flight.fetch_add(1, Ordering::AcqRel);
                shared.clocks.copy(c.meta.clock);
                self.note(shared, Note::Sent(c.meta));
                self.push(shared, d, c);
                copies += 1;
            }
            self.mirrored += copies;
        }
        match routes.main_target(&pkt) {
            Some(t) => {
                let d = self.dest(shared, t, &pkt);
                if replay.is_some_and(|r| !shared.leads_to(t, d, r)) {
                    return Some(pkt);
                }
                self.push(shared, d, pkt);
                None
            }
            None => Some(pkt),
        }
    }
}

/// Where every packet `routes` takes goes, when that is one place whatever the packet: one
/// edge without a filter and no mirrors, to the chain's exit or to a vertex of one instance,
/// in a run whose allocation cannot change (no scaling). [`Outgoing::route`] would find the
/// same place for each packet (a replay copy aside, which may go nowhere); asked once a
/// batch, the hot paths push there directly.
pub(super) fn single_destination(shared: &Shared, routes: &Routes) -> Option<usize> {
    let [route] = routes.main.as_slice() else { return None };
    if shared.scaling.is_some() || !routes.mirrors.is_empty() || route.filter.is_some() {
        return None;
    }
    match route.to {
        Target::Output => Some(shared.queues.len()),
        Target::Vertex(w) => match shared.vertices.get(w)?.instances.as_slice() {
            [only] => Some(*only),
            _ => None,
        },
    }
}

/// Pushes a stalled item onto its queue; the item back if the queue is full.
fn try_push(shared: &Shared, item: Stalled) -> Result<(), Stalled> {
    match item {
        Stalled::Notes(r, n) => match shared.notes.as_ref().and_then(|q| q.get(r)) {
            Some(q) => {
                q.push(n).map_err(|n| Stalled::Notes(r, n))?;
                shared.wake.notes_queued();
                Ok(())
            }
            None => Ok(()),
        },
        Stalled::Batch(dest, b) => {
            let q = shared.queue(dest).unwrap_or(&shared.sink);
            let n = b.len();
            q.push(b).map_err(|b| Stalled::Batch(dest, b))?;
            shared.wake.queued(dest);
            if let Some(sc) = &shared.scaling {
                sc.queued(dest, n as isize);
            }
            Ok(())
        }
    }
}

/// Notes per buffer sent to the root (reserved when a buffer is made).
const NOTES_PER_BUFFER: usize = 256;
