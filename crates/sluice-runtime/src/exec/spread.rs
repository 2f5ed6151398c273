//! A chain over several nodes: the thread that moves packets and notes between this node and
//! the others (docs/decisions.md, "One chain across nodes").
//!
//! Queues of instances on other nodes, and on a node without the root the sink's queue and the
//! notes queues, are drained here instead of by a worker or the root: their batches leave as
//! Geneve datagrams (`sluice_wire::geneve`), their notes as notes datagrams
//! (`sluice_wire::notes`), notes first, so the root hears of a copy before the copy can end
//! anywhere. What arrives goes into the local instances' queues, the sink's (output coming
//! back to the root), or, on the root's node, into the window, the in-flight clocks and the
//! root's log as a worker's notes would.
//!
//! Nodes say hello every 50 ms when they have nothing else to send; a node silent for the
//! spread's `silence_ms` has failed. With a root log and a store, the root's node then fails
//! it over: the link knows which copies were on that node (it counts, per clock, the copies it
//! sent there and the notes and packets that came back), stops listening to it, and the root
//! replaces its instances in their dormant slots here and replays its log to them, as for an
//! instance that failed in this process (`failover.rs`). Nodes without the root send
//! everything through the root's node (a star), so every copy's whereabouts are in its sight.
//!
//! Datagrams lost between live nodes are asked for again and resent; each node takes a
//! sender's datagrams in their sequence order only (`in_order`), so notes keep their place
//! before the batches they precede and nothing is taken twice.

use super::ft::Note;
use super::idle::Idle;
use super::outgoing::Outgoing;
use super::{RunError, Shared};
use crate::report::LinkReport;
use crate::spread::Layout;
use sluice_packet::{Batch, Clock, InstanceId, Meta};
use sluice_wire::geneve::{encode_sequenced, TO_EGRESS};
use sluice_wire::notes::{encode_notes, NoteKind, WireNote, MAX_NOTES};
use sluice_wire::{RecvBatch, UdpLink};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod crashed;
mod idle_link;
mod in_order;
mod on_node;
mod progress;
mod receive;
mod silence;
mod view;
use in_order::{Received, Sent};
use on_node::OnNode;
use std::time::{Duration, Instant};
pub(super) use view::{check_planned_changes, live_view};

/// How long the root's node waits for every other node to answer before the run starts.
pub(super) const HELLO_LIMIT: Duration = Duration::from_secs(30);
/// A `Stop` note's XOR field from the root's node to a node it declared failed: the fence.
pub(super) const FENCE: u64 = 1;
/// How often a node says hello to a node it has not heard from, and to one it has sent
/// nothing else to for this long (a heartbeat).
const HELLO_EVERY: Duration = Duration::from_millis(50);

/// How often, at most, the root's node tells the others the oldest clock its log holds.
const OLDEST_EVERY: Duration = Duration::from_millis(2);

/// Frames larger than this do not cross (the encapsulation adds at most 256 bytes).
const MTU: usize = 9000;

/// One node's end of the links to the others.
pub(super) struct Link {
    layout: Layout,
    socket: UdpLink,
    /// Taken out while a receive runs (`None` only then).
    rx: Option<RecvBatch>,
    out: Outgoing,
    /// The global indices of the instances on other nodes.
    remote: Vec<usize>,
    /// Batches taken this turn: (node, destination, batch).
    taken: Vec<(usize, InstanceId, Batch)>,
    notes: Vec<WireNote>,
    decoded: Vec<WireNote>,
    /// Encoded datagrams waiting to be sent, per node, with their sequence numbers.
    datagrams: Vec<Vec<(u64, Vec<u8>)>>,
    /// Datagram buffers sent and ready for reuse (no allocation per packet).
    spare: Vec<Vec<u8>>,
    /// Per node: the next link sequence number to send, what was sent (held for resending),
    /// and what came from it, taken in sequence order (`in_order`).
    next_seq: Vec<u64>,
    sent: Vec<Sent>,
    received: Vec<Received>,
    /// Resends other nodes asked for this turn: (node, first sequence number, count).
    asked: Vec<(usize, u64, u64)>,
    /// Nodes whose first hello this turn heard, to answer at its end.
    hellos_to_answer: Vec<usize>,
    /// Per node: heard its hello.
    heard: Vec<bool>,
    /// Per node: when it was last heard from, and last sent anything.
    last_heard: Vec<Instant>,
    /// Per node: since when it has been sent packets without being heard from.
    awaiting: Vec<Option<Instant>>,
    last_sent: Vec<Option<Instant>>,
    fingerprint: u64,
    /// The root keeps a log: it hears every note; otherwise only copies made and ended.
    logging: bool,
    /// On the root's node of a run that can fail over: per node, the copies on it.
    on_node: Vec<OnNode>,
    /// On the root's node, per node: the copies it said were lost with an instance that
    /// crashed there, until it says which (`crashed.rs`); and the crashes it said, to take over.
    lost_heard: Vec<Vec<Meta>>,
    processed_heard: Vec<sluice_chc::clockset::ClockSet>,
    crashes_heard: Vec<(usize, Meta)>,
    /// On a node without the root: its instances that crashed here, whose copies it relays to
    /// the root's node.
    relayed: Vec<usize>,
    /// Per node: declared failed, not listened to any more.
    dead: Vec<bool>,
    pub(super) report: LinkReport,
    /// The root's node said the run is over.
    pub(super) ended: bool,
    /// And where it ended: its last clock and last input packet's capture time.
    pub(super) root_end: Option<(Clock, u64)>,
    /// On the root's node: the oldest logged sequence number last told the others, and when.
    oldest_told: (u64, Instant),
    /// On the root's node: the root's progress told to nodes with order-sensitive instances.
    telling: progress::Telling,
    /// On the root's node, per node: said its state is all in the store after the end
    /// ([`NoteKind::Flushed`]).
    flushed: Vec<bool>,
    /// When this link last looked at the clock (at the start of a turn and before judging
    /// silence): a long gap means this thread itself was not running, see [`Link::absence`].
    looked: Instant,
}

impl Link {
    /// Where the root's node said the run ended (a recorded run's other nodes need it).
    pub(super) fn ended_at(&self) -> Result<(Clock, u64), RunError> {
        self.root_end.ok_or_else(|| {
            RunError::Worker("the root's node ended the run without saying where: no part record".into())
        })
    }

    /// Per vertex, whether this node's record holds its state ([`Layout::records_state`]).
    pub(super) fn records_state(&self, vertices: &[crate::plan::VertexPlan]) -> Vec<bool> {
        self.layout.records_state(vertices)
    }

    /// On a node without the root, after the end: tells the root's node that its instances'
    /// state is all in the store (`ok`), or that it stops with an error. Only the root's node
    /// of a recorded run waits for it, and may be gone already: a failure to send is no error.
    pub(super) fn tell_flushed(&mut self, ok: bool) {
        if let Err(e) = self.tell_all(if ok { NoteKind::Flushed } else { NoteKind::Stop }, None) {
            tracing::debug!("telling the root's node this node's state is in the store: {e}");
        }
    }

    /// Binds this node's address in `layout`.
    pub(super) fn bind(shared: &Shared, layout: Layout, (fingerprint, logging): (u64, bool)) -> Result<Link, RunError> {
        let me =
            layout.addrs.get(layout.me).copied().ok_or_else(|| RunError::Config("this node has no address".into()))?;
        let socket = UdpLink::bind(me, None).map_err(|e| RunError::Config(format!("node address {me}: {e}")))?;
        sluice_wire::port::grow_buffers(&socket);
        let nodes = layout.addrs.len();
        let remote: Vec<usize> = (0..layout.node_of.len()).filter(|g| !layout.here(*g)).collect();
        // What the link drains rings it: the queues of instances elsewhere, and on a node
        // without the root the egress and the notes for the root's log.
        let bell = sluice_netif::Doorbell::new().map_err(|e| RunError::Config(format!("the link's eventfd: {e}")))?;
        let sink = (!layout.has_root()).then_some(shared.queues.len());
        let drained: Vec<usize> = remote.iter().copied().chain(sink).collect();
        shared.wake.link(bell, &drained, !layout.has_root());
        let report =
            LinkReport { node: layout.names.get(layout.me).cloned().unwrap_or_default(), ..LinkReport::default() };
        let telling = progress::Telling::new(shared, &layout);
        let mut heard = vec![false; nodes];
        if let Some(h) = heard.get_mut(layout.me) {
            *h = true;
        }
        Ok(Link {
            layout,
            socket,
            rx: Some(RecvBatch::new(sluice_wire::MAX_BATCH, MTU + 256)),
            out: Outgoing::new(shared),
            remote,
            taken: Vec::new(),
            notes: Vec::new(),
            decoded: Vec::new(),
            datagrams: vec![Vec::new(); nodes],
            spare: Vec::new(),
            next_seq: vec![0; nodes],
            sent: (0..nodes).map(|_| Sent::default()).collect(),
            received: (0..nodes).map(|_| Received::default()).collect(),
            asked: Vec::new(),
            hellos_to_answer: Vec::new(),
            heard,
            last_heard: vec![Instant::now(); nodes],
            awaiting: vec![None; nodes],
            last_sent: vec![None; nodes],
            fingerprint,
            logging,
            on_node: (0..nodes)
                .map(|_| OnNode::new(if shared.failover.is_some() { shared.clocks.span() } else { 0 }))
                .collect(),
            lost_heard: vec![Vec::new(); nodes],
            processed_heard: vec![Default::default(); nodes],
            crashes_heard: Vec::new(),
            relayed: Vec::new(),
            dead: vec![false; nodes],
            report,
            ended: false,
            root_end: None,
            oldest_told: (1, Instant::now()),
            telling,
            flushed: vec![false; nodes],
            looked: Instant::now(),
        })
    }

    /// Whether every node has said hello (with the same chain).
    pub(super) fn ready(&self) -> bool {
        self.heard.iter().enumerate().all(|(n, h)| *h || !self.talks_to(n))
    }

    /// Whether this node exchanges hellos with node `n`: the root's node with every other, the
    /// others with the root's node only (all their traffic goes through it).
    fn talks_to(&self, n: usize) -> bool {
        n != self.layout.me && (self.layout.has_root() || n == self.layout.root)
    }

    /// One turn: sends what waits for other nodes, takes in what arrived. Whether it did
    /// anything.
    pub(super) fn turn(&mut self, shared: &Shared) -> Result<bool, RunError> {
        self.absence();
        self.take_crashes_asked(shared);
        let mut suspect = false;
        for n in 0..self.layout.addrs.len() {
            if !self.talks_to(n) || self.dead.get(n).copied().unwrap_or(true) {
                continue;
            }
            suspect |= self.awaiting.get(n).copied().flatten().is_some_and(|t| t.elapsed() >= SUSPECT_AFTER);
            if self.last_sent.get(n).copied().flatten().is_none_or(|t| t.elapsed() >= HELLO_EVERY) {
                self.control(n, NoteKind::Hello, None)?;
            }
        }
        if let (true, Some(fo)) = (self.layout.has_root(), &shared.failover) {
            let was = shared.hold_admission.swap(suspect, Ordering::AcqRel);
            if suspect && !was {
                tracing::debug!("a node has not answered for {SUSPECT_AFTER:?}: admission held");
            }
            let oldest = fo.oldest_logged(0);
            if oldest != self.oldest_told.0 && self.oldest_told.1.elapsed() >= OLDEST_EVERY {
                self.oldest_told = (oldest, Instant::now());
                let meta = Meta { clock: Clock::new(0, oldest), ..Meta::default() };
                for n in 0..self.layout.addrs.len() {
                    if self.talks_to(n) && !self.dead.get(n).copied().unwrap_or(true) {
                        self.control(n, NoteKind::Oldest, Some(meta))?;
                    }
                }
            }
        }
        self.tell_progress(shared)?;
        let sent = self.send(shared)?;
        let mut received = self.receive(shared)?;
        // Silence is judged after taking in what arrived: when this thread itself was late
        // (descheduled on a busy machine, a long send), the other node's datagrams wait in
        // the socket, and judging first read them as its silence (a live root's node was
        // declared failed by both other nodes under load). A node that looks silent gets one
        // more receive first: this process may have been stopped between the receive and here
        // (a node paused past the limit, woken, declared the root's node failed instead of
        // reading the fence waiting in its socket).
        self.absence();
        for n in 0..self.layout.addrs.len() {
            if self.silent(n) {
                received |= self.receive(shared)?;
                if self.silent(n) {
                    self.node_failed(shared, n)?;
                }
            }
        }
        Ok(sent || received)
    }

    /// Tells every other node that the run is over (`End`, from the root's node) or that this
    /// node stops with an error (`Stop`), a few times: datagrams can be lost.
    pub(super) fn tell_all(&mut self, kind: NoteKind, last: Option<(Clock, u64)>) -> Result<(), RunError> {
        let mine = WireNote { kind, meta: Meta { clock: Clock(self.fingerprint), ..Meta::default() } };
        // Where the run ended goes in the same datagram, before the end itself.
        let last =
            last.map(|(clock, ts)| WireNote { kind: NoteKind::Last, meta: Meta { clock, xor: ts, ..Meta::default() } });
        let notes: Vec<WireNote> = last.into_iter().chain([mine]).collect();
        for _ in 0..3 {
            for n in 0..self.layout.addrs.len() {
                if self.talks_to(n) {
                    self.send_control(n, &notes)?;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Sends `node` one control note, now: what `meta` says (by default this node's
    /// fingerprint in the clock).
    fn control(&mut self, node: usize, kind: NoteKind, meta: Option<Meta>) -> Result<(), RunError> {
        let meta = meta.unwrap_or(Meta { clock: Clock(self.fingerprint), ..Meta::default() });
        self.send_control(node, &[WireNote { kind, meta }])
    }

    /// Sends `node` control notes in one datagram, now.
    fn send_control(&mut self, node: usize, notes: &[WireNote]) -> Result<(), RunError> {
        let mut d = self.spare.pop().unwrap_or_default();
        let seq = self.seq(node);
        encode_notes(self.layout.vni, seq, notes, &mut d).map_err(wire)?;
        self.push_datagram(node, seq, d);
        self.flush_datagrams(Some(node))
    }

    fn seq(&mut self, node: usize) -> u64 {
        next(&mut self.next_seq, node)
    }

    fn send_to(&mut self, node: usize, datagrams: &[&[u8]]) -> Result<(), RunError> {
        let Some(to) = self.layout.addrs.get(node).copied() else { return Ok(()) };
        self.socket
            .send_batch(to, datagrams)
            .map_err(|e| RunError::Worker(format!("sending to node `{}`: {e}", self.name(node))))?;
        self.report.datagrams_sent += datagrams.len() as u64;
        if let Some(t) = self.last_sent.get_mut(node) {
            *t = Some(Instant::now());
        }
        Ok(())
    }

    fn name(&self, node: usize) -> &str {
        self.layout.names.get(node).map_or("?", String::as_str)
    }

    /// Takes the batches bound for other nodes, then the notes (queued before their batches),
    /// and sends them: notes first.
    fn send(&mut self, shared: &Shared) -> Result<bool, RunError> {
        // Crashes carried out here, taken before the notes: every note the instance sent is
        // queued already, and goes first.
        let handed = match &shared.failover {
            Some(fo) if !self.layout.has_root() => fo.take_handed_over(),
            _ => Vec::new(),
        };
        for g in &self.remote {
            let (Some(node), Some(Some(id))) = (self.layout.node_of.get(*g), self.layout.ids.get(*g)) else { continue };
            // A node without the root sends everything through the root's node (a star).
            let to = if self.layout.has_root() { *node } else { self.layout.root };
            while let Some(b) = shared.pop(*g) {
                self.taken.push((to, *id, b));
            }
        }
        if !self.layout.has_root() {
            while let Some(b) = shared.sink.pop() {
                self.taken.push((self.layout.root, TO_EGRESS, b));
            }
            if let Some(queues) = &shared.notes {
                for q in queues {
                    while let Some(mut notes) = q.pop() {
                        let logging = self.logging;
                        let needed = notes
                            .drain(..)
                            .map(wire_note)
                            .filter(|n| logging || matches!(n.kind, NoteKind::Sent | NoteKind::Finished));
                        self.notes.extend(needed);
                        let _ = shared.note_spare.push(notes);
                    }
                }
            }
            self.hand_over(handed);
        }
        let busy = !self.taken.is_empty() || !self.notes.is_empty();
        if !self.notes.is_empty() {
            let root = self.layout.root;
            let notes = std::mem::take(&mut self.notes);
            for chunk in notes.chunks(MAX_NOTES) {
                let seq = self.seq(root);
                let mut d = self.spare.pop().unwrap_or_default();
                encode_notes(self.layout.vni, seq, chunk, &mut d).map_err(wire)?;
                self.push_datagram(root, seq, d);
            }
            self.report.notes_sent += notes.len() as u64;
            self.notes = notes;
            self.notes.clear();
            // Before any batch: the root hears of a copy before it can end elsewhere.
            self.flush_datagrams(Some(root))?;
        }
        let mut taken = std::mem::take(&mut self.taken);
        for (node, dest, mut batch) in taken.drain(..) {
            for p in batch.drain(..) {
                let seq = self.seq(node);
                let mut d = self.spare.pop().unwrap_or_default();
                encode_sequenced(&p.meta, dest, self.layout.vni, Some(seq), p.data(), &mut d).map_err(wire)?;
                if let Some(on) = self.on_node.get_mut(node) {
                    on.arrived(&p.meta);
                }
                if let Some(a) = self.awaiting.get_mut(node).filter(|a| a.is_none()) {
                    *a = Some(Instant::now());
                }
                self.push_datagram(node, seq, d);
                self.report.packets_sent += 1;
                shared.pool.recycle(p);
            }
            shared.give_back(batch);
        }
        self.taken = taken;
        self.flush_datagrams(None)?;
        Ok(busy)
    }

    fn push_datagram(&mut self, node: usize, seq: u64, d: Vec<u8>) {
        if let Some(q) = self.datagrams.get_mut(node) {
            q.push((seq, d));
        }
    }

    /// Sends the datagrams waiting for `only` (or every node).
    fn flush_datagrams(&mut self, only: Option<usize>) -> Result<(), RunError> {
        for node in 0..self.datagrams.len() {
            if only.is_some_and(|o| o != node) {
                continue;
            }
            let Some(mut ds) = self.datagrams.get_mut(node).map(std::mem::take) else { continue };
            if ds.is_empty() {
                continue;
            }
            let refs: Vec<&[u8]> = ds.iter().map(|(_, d)| d.as_slice()).collect();
            self.send_to(node, &refs)?;
            // Held for resending; the buffer of the oldest held comes back for reuse.
            if let Some(sent) = self.sent.get_mut(node) {
                for (seq, d) in ds.drain(..) {
                    if let Some(mut old) = sent.keep(seq, d) {
                        old.clear();
                        self.spare.push(old);
                    }
                }
            }
            if let Some(q) = self.datagrams.get_mut(node) {
                *q = ds;
            }
        }
        Ok(())
    }
}

impl Link {
    /// Node `n` has been silent too long. With failover armed (root's log, store), its
    /// instances are replaced here: the copies it held are lost copies of their crash, it is
    /// not listened to again (and told to stop, should it only have been slow), and the root
    /// asks the crashes. Otherwise the run ends with an error.
    fn node_failed(&mut self, shared: &Shared, n: usize) -> Result<(), RunError> {
        let name = self.name(n).to_string();
        let silent = format!("node `{name}` has not been heard from for {} ms", self.layout.silence.as_millis());
        let Some(fo) = shared.failover.as_ref().filter(|_| self.layout.has_root()) else {
            return Err(RunError::Worker(format!(
                "{silent}: it stopped or the link is cut (failing its instances over needs --fault-tolerance and a store every node reaches)"
            )));
        };
        if let Some(d) = self.dead.get_mut(n) {
            *d = true;
        }
        let node_of = &self.layout.node_of;
        let globals: Vec<usize> = self.remote.iter().copied().filter(|g| node_of.get(*g) == Some(&n)).collect();
        let lost = self.on_node.get_mut(n).map(OnNode::take_all).unwrap_or_default();
        let silent_ms = self.last_heard.get(n).map_or(0, |t| t.elapsed().as_millis() as u64);
        tracing::warn!(node = %name, silent_ms, instances = globals.len(), lost_copies = lost.len(), "a node failed: its instances are replaced on the root's node, which replays its log to them");
        let heard = self.last_heard.get(n).copied().unwrap_or_else(Instant::now);
        self.take_over(shared, fo, (globals, lost, None), heard);
        if let Some(a) = self.awaiting.get_mut(n) {
            *a = None;
        }
        self.report.failed_nodes.push(name);
        // Fenced: should it only have been slow, it stops rather than go on beside its
        // replacements, and says why.
        let fence = Meta { clock: Clock(self.fingerprint), xor: FENCE, ..Meta::default() };
        let _ = self.control(n, NoteKind::Stop, Some(fence));
        Ok(())
    }
}

/// A note from another node, heard on the root's node: the window and the in-flight clocks
/// change as a local worker's would change them, and the root's log hears it. Whether a copy
/// ended (the window then has a place more, once the note is on its way to the log).
fn root_hears(shared: &Shared, out: &mut Outgoing, kind: NoteKind, meta: Meta) -> bool {
    match kind {
        NoteKind::Sent => {
            shared.in_flight.fetch_add(1, Ordering::AcqRel);
            shared.clocks.copy(meta.clock);
            out.note(shared, Note::Sent(meta));
            false
        }
        NoteKind::Finished => {
            out.note(shared, Note::Finished(meta));
            shared.clocks.done(meta.clock);
            true
        }
        NoteKind::Commit => {
            out.note(shared, Note::Commit(meta.clock, meta.xor));
            false
        }
        NoteKind::Reached => {
            out.note(shared, Note::Reached(meta));
            false
        }
        NoteKind::Left
        | NoteKind::Lost
        | NoteKind::Crashed
        | NoteKind::Processed
        | NoteKind::Hello
        | NoteKind::End
        | NoteKind::Stop
        | NoteKind::Resend
        | NoteKind::Last
        | NoteKind::Oldest
        | NoteKind::Admitted
        | NoteKind::Done
        | NoteKind::Flushed => false,
    }
}

fn wire_note(n: Note) -> WireNote {
    let (kind, meta) = match n {
        Note::Sent(m) => (NoteKind::Sent, m),
        Note::Finished(m) => (NoteKind::Finished, m),
        Note::Commit(clock, xor) => (NoteKind::Commit, Meta { clock, xor, ..Meta::default() }),
        Note::Reached(m) => (NoteKind::Reached, m),
        Note::Left(m) => (NoteKind::Left, m),
    };
    WireNote { kind, meta }
}

fn node_of_addr(addrs: &[SocketAddr], from: SocketAddr) -> Option<usize> {
    addrs.iter().position(|a| *a == from)
}

fn next(seqs: &mut [u64], node: usize) -> u64 {
    match seqs.get_mut(node) {
        Some(s) => {
            *s += 1;
            *s - 1
        }
        None => 0,
    }
}

fn wire(e: sluice_wire::WireError) -> RunError {
    RunError::Worker(format!("encapsulating for another node: {e}"))
}

/// Whether a node of this spread takes part in failovers: the root's node replaces another's
/// instances, the others pass the replays on; with other nodes.
pub(super) fn may_fail_over(layout: Option<&Layout>) -> bool {
    // Every node: the others keep what their instances emitted for replays passing through.
    layout.is_some_and(|l| l.addrs.len() > 1)
}

/// This node's part of `part`'s spread: where each instance runs. A vertex whose instances run
/// on several nodes shares its state among them: only through a store they all reach.
pub(super) fn layout(part: &crate::spread::Part, plan: &crate::plan::Plan, slots: usize) -> Result<Layout, RunError> {
    let l = part.spread.layout(&part.node, &plan.vertices, slots).map_err(|e| RunError::Config(e.to_string()))?;
    let shared = plan.store.as_ref().is_some_and(|s| s.is_shared());
    let split = plan.vertices.iter().find(|vp| l.is_split(vp));
    if let (Some(vp), false) = (split, shared) {
        return Err(RunError::Config(format!(
            "`{}` has instances on several nodes, which share its state: give every node one store they all reach (--store redis://... or sluice://...), not state in each process",
            vp.name
        )));
    }
    Ok(l)
}

/// On a node without the root that hosts instances of order-sensitive vertices (`ordered`):
/// where they read the root's progress, as the root's node tells it.
pub(super) fn from_root(
    layout: &Layout,
    vertices: &[crate::plan::VertexPlan],
    ordered: &[bool],
) -> Option<crate::order::FromRoot> {
    let here: Vec<bool> = vertices
        .iter()
        .enumerate()
        .map(|(v, vp)| ordered.get(v).copied().unwrap_or(false) && vp.instances.iter().any(|g| layout.here(*g)))
        .collect();
    (!layout.has_root() && here.iter().any(|h| *h)).then(|| crate::order::FromRoot::new(&here))
}

/// Binds this node's link and, on the root's node, starts its thread and waits for every
/// other node to answer; on another node, the link to serve instead of a root.
pub(super) fn connect(
    shared: &Arc<Shared>,
    layout: &Layout,
    fault_tolerance: bool,
    stop: Option<&AtomicBool>,
) -> Result<(Option<LinkThread>, Option<Link>), RunError> {
    let fingerprint = fingerprint(&shared.vertices, layout, fault_tolerance);
    let link = Link::bind(shared, layout.clone(), (fingerprint, fault_tolerance))?;
    if layout.has_root() {
        let t = LinkThread::start(shared.clone(), link)?;
        Ok((Some(t.wait_ready(stop)?), None))
    } else {
        Ok((None, Some(link)))
    }
}

/// On a node without the root: serves the links until the root's node says the run is over.
pub(super) fn serve_part(shared: &Shared, link: &mut Link, stop: Option<&AtomicBool>) -> Result<(), RunError> {
    let mut idle = Idle::default();
    let mut quiet = idle_link::Quiet::default();
    let served = (|| {
        while !link.ended {
            if shared.aborted.load(Ordering::Acquire) {
                return Err(RunError::Worker("a worker failed".into()));
            }
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                return Err(RunError::Config("stopped before the root's node ended the run".into()));
            }
            if link.turn(shared)? {
                idle.busy();
            } else {
                link.pause(shared, &mut idle);
            }
            link.notice_quiet(shared, &mut quiet);
        }
        Ok(())
    })();
    if served.is_err() {
        // The root's node waits for what this node holds: tell it that nothing more comes.
        let _ = link.tell_all(NoteKind::Stop, None);
    }
    served
}

/// A node sent packets this long ago and not heard from since is suspect: the root admits
/// nothing until it answers (or is failed over). A live node answers a batch within well under
/// a millisecond (its packets back, or its notes); a busy machine may pause it for a few.
const SUSPECT_AFTER: Duration = Duration::from_millis(20);

/// The longest an idle link waits for a datagram before it looks at its queues again.
const IDLE_WAIT: Duration = Duration::from_micros(50);

/// The link thread of the root's node.
pub(super) struct LinkThread {
    handle: std::thread::JoinHandle<Result<LinkEnd, RunError>>,
    ready: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// Where the run ended (last clock, last capture time), told the other nodes with the end,
    /// and whether the run is recorded (the link then waits for [`NoteKind::Flushed`]).
    last: Arc<std::sync::Mutex<Option<EndOfRun>>>,
}

/// Where the run ended (last clock, last capture time), and whether it is recorded.
type EndOfRun = ((Clock, u64), bool);

/// What the root's node's link leaves at the end of a run.
pub(super) struct LinkEnd {
    /// What it moved.
    pub(super) report: LinkReport,
    /// Whose state the root's node records ([`Layout::records_state`], with the nodes that
    /// failed over), and the nodes sharing a split vertex that did not say their state is in
    /// the store within [`FLUSHED_LIMIT`].
    pub(super) owned: super::finish::Owned,
}

/// How long the root's node of a recorded run waits for the nodes sharing a split vertex to
/// say their state is in the store. They fire their end timers and flush first: well under
/// a second, unless the store is slow or the node died after the end.
const FLUSHED_LIMIT: Duration = Duration::from_secs(30);

impl LinkThread {
    /// Starts `link` on its own thread.
    pub(super) fn start(shared: Arc<Shared>, mut link: Link) -> Result<LinkThread, RunError> {
        let ready = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(std::sync::Mutex::new(None));
        let (r, st, sh, at_end) = (ready.clone(), stop.clone(), shared, last.clone());
        let handle = std::thread::Builder::new()
            .name("sluice-link".into())
            .spawn(move || {
                let mut idle = Idle::default();
                let served = (|| {
                    while !st.load(Ordering::Acquire) {
                        if link.turn(&sh)? {
                            idle.busy();
                        } else {
                            link.pause(&sh, &mut idle);
                        }
                        if link.ready() {
                            r.store(true, Ordering::Release);
                        }
                    }
                    Ok(())
                })();
                let over = if served.is_ok() && !sh.aborted.load(Ordering::Acquire) {
                    NoteKind::End
                } else {
                    // The run cannot end well: everyone here and on the other nodes stops.
                    sh.aborted.store(true, Ordering::Release);
                    NoteKind::Stop
                };
                let (last, recorded) = at_end
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .map_or((None, false), |(l, r)| (Some(l), r));
                let told = link.tell_all(over, last.filter(|_| over == NoteKind::End));
                served.and(told)?;
                let unflushed = if recorded { link.await_flushed(&sh) } else { Vec::new() };
                let records_state = link.layout.records_state(&sh.vertices);
                let owned = super::finish::Owned { records_state, unflushed };
                Ok(LinkEnd { report: link.report, owned })
            })
            .map_err(|e| RunError::Worker(e.to_string()))?;
        Ok(LinkThread { handle, ready, stop, last })
    }

    /// Waits until every node has answered ([`HELLO_LIMIT`] at most, or until `stop`).
    pub(super) fn wait_ready(self, stop: Option<&AtomicBool>) -> Result<LinkThread, RunError> {
        let t0 = Instant::now();
        while !self.ready.load(Ordering::Acquire) {
            if self.handle.is_finished() {
                // Its own error says why (another chain on a node, an address in use).
                self.finish((Clock::default(), 0), false)?;
                return Err(RunError::Worker("the link to the other nodes ended before the run started".into()));
            }
            if t0.elapsed() >= HELLO_LIMIT || stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                self.stop.store(true, Ordering::Release);
                return Err(RunError::Config(format!(
                    "the other nodes did not all answer within {} s: start `sluice run --spread ... --node NAME` on each node of the spread file",
                    HELLO_LIMIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(self)
    }

    /// Ends the other nodes' parts and returns what the link moved; in a `recorded` run, once
    /// the nodes sharing a split vertex have flushed their state.
    pub(super) fn finish(self, last: (Clock, u64), recorded: bool) -> Result<LinkEnd, RunError> {
        *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((last, recorded));
        self.stop.store(true, Ordering::Release);
        self.handle.join().map_err(|_| RunError::Worker("the link thread panicked".into()))?
    }
}

impl Link {
    /// On the root's node after the end of a recorded run: waits (at most [`FLUSHED_LIMIT`])
    /// until every live node hosting an instance of a split vertex has said its state is in
    /// the store; the names of those that did not.
    fn await_flushed(&mut self, shared: &Shared) -> Vec<String> {
        let mut waiting: Vec<usize> = shared
            .vertices
            .iter()
            .filter(|vp| self.layout.is_split(vp))
            .flat_map(|vp| vp.instances.iter().filter_map(|g| self.layout.node_of.get(*g).copied()))
            .filter(|n| *n != self.layout.me && !self.dead.get(*n).copied().unwrap_or(true))
            .collect();
        waiting.sort_unstable();
        waiting.dedup();
        let t0 = Instant::now();
        let mut idle = Idle::default();
        while waiting.iter().any(|n| !self.flushed.get(*n).copied().unwrap_or(false)) && t0.elapsed() < FLUSHED_LIMIT {
            let Some(mut rx) = self.rx.take() else { break };
            let got = self.receive_into(shared, &mut rx);
            self.rx = Some(rx);
            match got {
                Ok(true) => idle.busy(),
                Ok(false) => self.pause(shared, &mut idle),
                Err(e) => {
                    // A node that stopped with an error after the end has not flushed.
                    tracing::warn!("waiting for the nodes' state after the end: {e}");
                    break;
                }
            }
        }
        waiting
            .into_iter()
            .filter(|n| !self.flushed.get(*n).copied().unwrap_or(false))
            .map(|n| self.name(n).to_string())
            .collect()
    }
}

/// A number that differs, with high probability, between nodes given different chains,
/// placements or fault tolerance: exchanged in hellos so that such nodes refuse each other.
pub(super) fn fingerprint(vertices: &[crate::plan::VertexPlan], layout: &Layout, fault_tolerance: bool) -> u64 {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same on every node and run.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    for v in vertices {
        (&*v.name, &v.kind, v.instances.len(), v.spares.len(), v.off_path).hash(&mut h);
    }
    (&layout.node_of, &layout.addrs, layout.root, layout.vni, fault_tolerance).hash(&mut h);
    h.finish()
}
