//! A run's input and output as Geneve datagrams (`sluice run --from-geneve`, `--to-geneve`):
//! a chain behind a Geneve-speaking load balancer, or one chain feeding another in another
//! process or on another machine. The encapsulation is Sluice's (docs/wire-format.md).
//!
//! What crosses: the Ethernet frame, its capture time (the NFs' "now") and the labels NFs set
//! upstream. What does not: the sender's logical clock, log marks and XOR bits belong to the
//! sender's chain and root; the receiving chain's root stamps its own. A datagram lost between
//! two chains is counted (link sequence gaps), not replayed: each chain's root log covers its
//! own NFs only (docs/deploy.md).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;
use sluice_packet::{Batch, Meta, Packet, PacketPool};
use sluice_runtime::{Fill, RunError, Sink, Source};
use sluice_wire::{Receiver, RecvStats, SendStats, Sender, TO_ROOT};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one receive waits for a first datagram: short, so that the root thread, which
/// reads the source between its other duties, is never away for long.
const RECV_WAIT: Duration = Duration::from_micros(500);
/// The largest frame taken in (a jumbo frame); larger datagrams are counted as truncated.
const MAX_FRAME: usize = 9216;

/// What a Geneve input saw, for the report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct InputStats {
    /// Where it listened.
    pub listen: String,
    /// The receiver's counters.
    #[serde(flatten)]
    pub link: RecvStats,
    /// Datagrams addressed to an NF instance rather than to this chain's root (sent by a node
    /// of a chain spread over processes, not by a chain's output): dropped.
    pub not_for_root: u64,
    /// Seconds from the first datagram taken in to the last: `accepted / active_s` is the rate
    /// the input came at, whatever the run waited before and after.
    pub active_s: f64,
}

/// A run's Geneve counters as the control endpoint's `/metrics` serves them while it runs
/// (the report has the same at the end).
#[derive(Debug, Default)]
pub struct LinkCounters {
    /// Input datagrams by what became of them: accepted, malformed, other_vni, not_for_root,
    /// truncated; and the ones the sequence numbers say were lost or late.
    input: [AtomicU64; 7],
    /// Output datagrams and bytes sent.
    output: [AtomicU64; 2],
}

const INPUT_OUTCOMES: [&str; 7] = ["accepted", "malformed", "other_vni", "not_for_root", "truncated", "lost", "late"];

impl LinkCounters {
    fn input_seen(&self, s: &InputStats) {
        let l = &s.link;
        let now = [l.accepted, l.malformed, l.other_vni, s.not_for_root, l.truncated, l.lost, l.late];
        for (c, v) in self.input.iter().zip(now) {
            c.store(v, Ordering::Relaxed);
        }
    }
}

/// [`LinkCounters`] in Prometheus text.
#[derive(Debug, Clone)]
pub struct LinkCollector(pub Arc<LinkCounters>);

impl Collector for LinkCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut fam = enc.encode_descriptor(
            "sluice_geneve_input_datagrams",
            "Datagrams on the Geneve input (--from-geneve), by outcome; lost and late come from the senders' sequence numbers.",
            None,
            MetricType::Counter,
        )?;
        for (outcome, c) in INPUT_OUTCOMES.iter().zip(&self.0.input) {
            ConstCounter::new(c.load(Ordering::Relaxed)).encode(fam.encode_family(&[("outcome", *outcome)])?)?;
        }
        let out = [
            ("sluice_geneve_output_datagrams", "Datagrams sent on the Geneve output (--to-geneve).", &self.0.output[0]),
            ("sluice_geneve_output_bytes", "Bytes sent on the Geneve output (--to-geneve).", &self.0.output[1]),
        ];
        for (name, help, c) in out {
            let c = ConstCounter::new(c.load(Ordering::Relaxed));
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}

/// Geneve datagrams on a UDP address as a run's input.
pub struct GeneveSource {
    rx: Receiver,
    pending: VecDeque<Packet>,
    stats: Rc<RefCell<InputStats>>,
    counters: Arc<LinkCounters>,
    idle_end: Option<Duration>,
    first_rx: Option<Instant>,
    last_rx: Option<Instant>,
    limit: Option<u64>,
    read: u64,
    warned_at: u64,
}

impl GeneveSource {
    /// Listens on `addr` for chain `vni`. With `idle_end`, the input ends once that long has
    /// passed without a datagram after the first one; with `limit`, after that many packets.
    /// Its counters go to `counters` as well as to the statistics returned.
    pub fn bind(
        addr: SocketAddr,
        vni: u32,
        (idle_end, limit): (Option<Duration>, Option<u64>),
        counters: Arc<LinkCounters>,
    ) -> Result<(GeneveSource, Rc<RefCell<InputStats>>), sluice_wire::PortError> {
        let rx = Receiver::bind(addr, vni, RECV_WAIT, MAX_FRAME)?;
        let listen = rx.local_addr()?.to_string();
        let stats = Rc::new(RefCell::new(InputStats { listen, ..InputStats::default() }));
        let source = GeneveSource {
            rx,
            pending: VecDeque::new(),
            stats: stats.clone(),
            counters,
            idle_end,
            first_rx: None,
            last_rx: None,
            limit,
            read: 0,
            warned_at: 0,
        };
        Ok((source, stats))
    }

    /// Receives one batch into `pending`; waits for it (briefly) only if `wait`.
    fn receive(&mut self, pool: &PacketPool, wait: bool) -> Result<(), RunError> {
        let (pending, mut not_for_root) = (&mut self.pending, 0);
        let take = |d: sluice_wire::Decoded<'_>| {
            if d.dest != TO_ROOT {
                not_for_root += 1;
                return;
            }
            let meta = Meta { ts_ns: d.meta.ts_ns, labels: d.meta.labels, in_port: d.meta.in_port, ..Meta::default() };
            pending.push_back(pool.packet(d.frame, meta));
        };
        let n = if wait { self.rx.recv(take) } else { self.rx.try_recv(take) };
        let n = n.map_err(|e| RunError::Source(e.to_string()))?;
        let mut stats = self.stats.borrow_mut();
        if n > 0 {
            let now = Instant::now();
            let first = *self.first_rx.get_or_insert(now);
            self.last_rx = Some(now);
            stats.active_s = now.duration_since(first).as_secs_f64();
        }
        stats.not_for_root += not_for_root;
        stats.link = self.rx.stats().clone();
        self.counters.input_seen(&stats);
        let rejected = stats.link.malformed + stats.link.other_vni + stats.not_for_root;
        // Say so at the first rejected datagram and then at every doubling: visible, not a flood.
        if rejected > self.warned_at {
            tracing::warn!(
                malformed = stats.link.malformed,
                other_vni = stats.link.other_vni,
                not_for_root = stats.not_for_root,
                last_error = stats.link.last_error.as_deref().unwrap_or(""),
                "geneve input: datagrams dropped"
            );
            self.warned_at = rejected.saturating_mul(2);
        }
        Ok(())
    }
}

impl Source for GeneveSource {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        if self.pending.is_empty() {
            // Topping up a batch (something to hand over already): only what is there.
            self.receive(pool, out.is_empty())?;
        }
        let mut added = 0;
        while added < max && self.limit.is_none_or(|l| self.read < l) {
            let Some(p) = self.pending.pop_front() else { break };
            out.push(p);
            added += 1;
            self.read += 1;
        }
        if self.limit.is_some_and(|l| self.read >= l) {
            for p in self.pending.drain(..) {
                pool.recycle(p);
            }
            return Ok(if added > 0 { Fill::Data } else { Fill::Done });
        }
        if added > 0 {
            return Ok(Fill::Data);
        }
        let quiet = self.last_rx.zip(self.idle_end).is_some_and(|(last, idle)| last.elapsed() >= idle);
        Ok(if quiet { Fill::Done } else { Fill::Idle })
    }
}

/// A run's output as Geneve datagrams to one address.
pub struct GeneveSink {
    tx: Sender,
    stats: Rc<RefCell<SendStats>>,
    counters: Arc<LinkCounters>,
}

impl GeneveSink {
    /// Sends to `to` as chain `vni`, from a socket on `bind` (port 0: any); counts in
    /// `counters` as well as in the statistics returned.
    pub fn new(
        (bind, to): (SocketAddr, SocketAddr),
        vni: u32,
        counters: Arc<LinkCounters>,
    ) -> Result<(GeneveSink, Rc<RefCell<SendStats>>), sluice_wire::PortError> {
        let tx = Sender::new(bind, to, vni)?;
        let stats = Rc::new(RefCell::new(SendStats::default()));
        Ok((GeneveSink { tx, stats: stats.clone(), counters }, stats))
    }
}

impl Sink for GeneveSink {
    fn write(&mut self, batch: &[Packet]) -> Result<(), RunError> {
        self.tx.send(batch, TO_ROOT).map_err(|e| RunError::Sink(format!("to {}: {e}", self.tx.peer())))?;
        let s = self.tx.stats();
        *self.stats.borrow_mut() = s;
        self.counters.output[0].store(s.datagrams, Ordering::Relaxed);
        self.counters.output[1].store(s.bytes, Ordering::Relaxed);
        Ok(())
    }
}
