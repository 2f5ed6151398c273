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
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Datagrams that decoded and were handed on.
    pub accepted: u64,
    /// Datagrams that were not Sluice's Geneve (or were damaged), dropped.
    pub malformed: u64,
    /// Datagrams for another chain (another VNI), dropped.
    pub other_vni: u64,
    /// Datagrams addressed to an NF instance rather than to this chain's root (sent by a node
    /// of a chain spread over processes, not by a chain's output): dropped.
    pub not_for_root: u64,
    /// Datagrams larger than the receive buffers, dropped.
    pub truncated: u64,
    /// Datagrams the senders' sequence numbers say were lost on the way.
    pub lost: u64,
    /// Datagrams that arrived after a later one of the same sender.
    pub late: u64,
    /// The last decoding error, to say what the malformed ones were.
    pub last_error: Option<String>,
    /// Seconds from the first datagram taken in to the last: `accepted / active_s` is the rate
    /// the input came at, whatever the run waited before and after.
    pub active_s: f64,
}

/// A run's Geneve counters: what the control endpoint's `/metrics` serves while the run goes,
/// and what the report says at the end.
#[derive(Debug, Default)]
pub struct LinkCounters {
    /// Input datagrams by what became of them: accepted, malformed, other_vni, not_for_root,
    /// truncated; and the ones the sequence numbers say were lost or late.
    input: [AtomicU64; 7],
    /// Nanoseconds from the first input datagram to the last.
    active_ns: AtomicU64,
    /// The last decoding error (written only when the malformed count grows).
    last_error: Mutex<Option<String>>,
    /// Output datagrams and bytes sent.
    output: [AtomicU64; 2],
}

const INPUT_OUTCOMES: [&str; 7] = ["accepted", "malformed", "other_vni", "not_for_root", "truncated", "lost", "late"];

impl LinkCounters {
    /// The receiver's counters now, with the datagrams not for the root counted by the source.
    fn input_seen(&self, r: &RecvStats, not_for_root: u64) {
        if r.malformed > self.input[1].load(Ordering::Relaxed) {
            if let Ok(mut e) = self.last_error.lock() {
                e.clone_from(&r.last_error);
            }
        }
        let now = [r.accepted, r.malformed, r.other_vni, not_for_root, r.truncated, r.lost, r.late];
        for (c, v) in self.input.iter().zip(now) {
            c.store(v, Ordering::Relaxed);
        }
    }

    /// The input's report.
    pub fn input_report(&self, listen: &str) -> InputStats {
        let [accepted, malformed, other_vni, not_for_root, truncated, lost, late] =
            self.input.each_ref().map(|c| c.load(Ordering::Relaxed));
        InputStats {
            listen: listen.to_string(),
            accepted,
            malformed,
            other_vni,
            not_for_root,
            truncated,
            lost,
            late,
            last_error: self.last_error.lock().ok().and_then(|e| e.clone()),
            active_s: self.active_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    /// The output's datagrams and bytes.
    pub fn output_report(&self) -> SendStats {
        SendStats { datagrams: self.output[0].load(Ordering::Relaxed), bytes: self.output[1].load(Ordering::Relaxed) }
    }
}

/// The report's sections for a run's Geneve input (listening on `input`) and output (to
/// `output`): for each, its JSON key, its value and its line of text.
pub fn report_sections(
    links: &LinkCounters,
    input: Option<SocketAddr>,
    output: Option<SocketAddr>,
) -> Result<Vec<(&'static str, serde_json::Value, String)>, serde_json::Error> {
    let mut sections = Vec::new();
    if let Some(listen) = input {
        let s = links.input_report(&listen.to_string());
        let mut line = format!(
            "  geneve input on {}: {} accepted in {:.3} s, {} malformed, {} for another VNI, {} not for the root, {} too large, {} lost on the way, {} late",
            s.listen, s.accepted, s.active_s, s.malformed, s.other_vni, s.not_for_root, s.truncated, s.lost, s.late
        );
        if let Some(e) = &s.last_error {
            line += &format!(" (last malformed: {e})");
        }
        sections.push(("geneve_input", serde_json::to_value(&s)?, line));
    }
    if let Some(to) = output {
        let s = links.output_report();
        let line = format!("  geneve output to {to}: {} datagrams, {} bytes", s.datagrams, s.bytes);
        let value = serde_json::json!({ "to": to.to_string(), "datagrams": s.datagrams, "bytes": s.bytes });
        sections.push(("geneve_output", value, line));
    }
    Ok(sections)
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
    counters: Arc<LinkCounters>,
    not_for_root: u64,
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
    /// It counts in `counters`. Returns the source and the address it listens on.
    pub fn bind(
        addr: SocketAddr,
        vni: u32,
        (idle_end, limit): (Option<Duration>, Option<u64>),
        counters: Arc<LinkCounters>,
    ) -> Result<(GeneveSource, SocketAddr), sluice_wire::PortError> {
        let rx = Receiver::bind(addr, vni, RECV_WAIT, MAX_FRAME)?;
        let listen = rx.local_addr()?;
        let source = GeneveSource {
            rx,
            pending: VecDeque::new(),
            counters,
            not_for_root: 0,
            idle_end,
            first_rx: None,
            last_rx: None,
            limit,
            read: 0,
            warned_at: 0,
        };
        Ok((source, listen))
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
        if n > 0 {
            let now = Instant::now();
            let first = *self.first_rx.get_or_insert(now);
            self.last_rx = Some(now);
            let active = now.duration_since(first).as_nanos();
            self.counters.active_ns.store(u64::try_from(active).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
        self.not_for_root += not_for_root;
        let r = self.rx.stats();
        self.counters.input_seen(r, self.not_for_root);
        let rejected = r.malformed + r.other_vni + self.not_for_root;
        // Say so at the first rejected datagram and then at every doubling: visible, not a flood.
        if rejected > self.warned_at {
            tracing::warn!(
                malformed = r.malformed,
                other_vni = r.other_vni,
                not_for_root = self.not_for_root,
                last_error = r.last_error.as_deref().unwrap_or(""),
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
    counters: Arc<LinkCounters>,
}

impl GeneveSink {
    /// Sends to `to` as chain `vni`, from a socket on `bind` (port 0: any); counts in
    /// `counters`.
    pub fn new(
        (bind, to): (SocketAddr, SocketAddr),
        vni: u32,
        counters: Arc<LinkCounters>,
    ) -> Result<GeneveSink, sluice_wire::PortError> {
        Ok(GeneveSink { tx: Sender::new(bind, to, vni)?, counters })
    }
}

impl Sink for GeneveSink {
    fn write(&mut self, batch: &[Packet]) -> Result<(), RunError> {
        self.tx.send(batch, TO_ROOT).map_err(|e| RunError::Sink(format!("to {}: {e}", self.tx.peer())))?;
        let s = self.tx.stats();
        self.counters.output[0].store(s.datagrams, Ordering::Relaxed);
        self.counters.output[1].store(s.bytes, Ordering::Relaxed);
        Ok(())
    }
}
