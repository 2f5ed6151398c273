//! What a run did: packets in, out and dropped by reason; per-NF and per-instance counts and
//! rates; latency percentiles; the NFs' decisions. Printed for people, serialised for machines.

use sluice_nf::Event;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Counters of one NF instance.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct InstanceReport {
    /// Index within the vertex.
    pub index: u16,
    /// Removed by scaling in before the run ended.
    pub retired: bool,
    /// Crashed on this node, a node of a chain spread over nodes without the root: replaced on
    /// the root's node, whose report has the replacement. The counters are up to the crash.
    pub handed_over: bool,
    /// Worker thread that ran it.
    pub worker: usize,
    /// Packets it received.
    pub packets_in: u64,
    /// Packets it sent on.
    pub forwarded: u64,
    /// Packets it dropped, by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Packets consumed because the vertex is off-path (mirror copies).
    pub consumed: u64,
    /// Copies dropped as duplicates of a clock it processed (replays after a failover).
    pub duplicates: u64,
    /// Replay copies it passed on towards a replacement further down, as its first processing
    /// of their clock left them (without running the NF again).
    pub replays_passed: u64,
    /// Time spent processing, seconds.
    pub busy_s: f64,
    /// Packets per second of busy time, in millions.
    pub busy_mpps: f64,
    /// How the state backend served the instance (store round trips, cache hits, ...).
    pub state: BTreeMap<String, u64>,
}

/// Counters of one vertex.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VertexReport {
    /// Name in the chain file.
    pub name: String,
    /// NF type.
    pub kind: String,
    /// Fields its traffic was partitioned on.
    pub split: Vec<String>,
    /// Whether it is off-path.
    pub off_path: bool,
    /// Its instances.
    pub instances: Vec<InstanceReport>,
}

impl VertexReport {
    /// Packets received by all instances.
    pub fn packets_in(&self) -> u64 {
        self.instances.iter().map(|i| i.packets_in).sum()
    }
    /// Packets dropped by all instances.
    pub fn dropped(&self) -> u64 {
        self.instances.iter().flat_map(|i| i.dropped.values()).sum()
    }
}

/// End-to-end latency percentiles of output packets, microseconds (root to sink).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Latency {
    /// Packets measured.
    pub samples: u64,
    /// 5th percentile.
    pub p5: f64,
    /// 25th percentile.
    pub p25: f64,
    /// Median.
    pub p50: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Maximum.
    pub max: f64,
}

impl Latency {
    /// The percentiles of `hist`, which holds nanoseconds.
    pub fn of_ns(hist: &hdrhistogram::Histogram<u64>) -> Latency {
        let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
        Latency {
            samples: hist.len(),
            p5: q(0.05),
            p25: q(0.25),
            p50: q(0.5),
            p75: q(0.75),
            p95: q(0.95),
            p99: q(0.99),
            p999: q(0.999),
            max: hist.max() as f64 / 1000.0,
        }
    }
}

/// Checkpoints of the state store taken during the run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CheckpointReport {
    /// How many.
    pub taken: u64,
    /// Values in the last one.
    pub last_values: u64,
    /// Instances in its TS vector.
    pub last_ts: u64,
    /// Time spent taking them, seconds.
    pub total_s: f64,
    /// Checkpoints that failed (the store did not answer whole: a Redis primary dying, say):
    /// the next is tried an interval later, and a rebuild meanwhile starts from the last one
    /// taken.
    pub failed: u64,
}

/// What the root's packet log did (`RunConfig::fault_tolerance`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FaultToleranceReport {
    /// Packets logged (every admitted packet).
    pub logged: u64,
    /// Entries deleted: every copy of the packet done and every update it caused committed.
    pub deleted: u64,
    /// Entries still in the log when the run ended (0 unless the store stopped acknowledging).
    pub left_in_log: u64,
    /// Most entries in the log at once.
    pub log_peak: u64,
    /// Commits (store acknowledgements of a packet's updates at one instance) folded into the
    /// log's XOR vectors.
    pub commits: u64,
    /// Copies dropped at the chain's egress because a copy of their clock had left already.
    pub duplicates_suppressed: u64,
}

/// One instance failover of a threaded run (`RunConfig::crashes`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct FailoverReport {
    /// The vertex.
    pub vertex: String,
    /// The instance that failed (its replacement has the same index).
    pub instance: u16,
    /// Packets the root had admitted when it asked for the crash.
    pub at_packet: u64,
    /// Copies the failed instance took down with it (queued or held).
    pub lost: u64,
    /// Of those, copies no replay can redo: their log entries died with the root earlier (the
    /// log was not in the store). Their packets are lost.
    pub beyond_replay: u64,
    /// Copies the root's replay sent to the replacement.
    pub replayed: u64,
    /// From the root asking for the crash to the replacement serving live traffic (it took
    /// over what the store had of its predecessor and went through its replay), ms.
    pub recovery_ms: f64,
    /// When the root asked for the crash, ms since the run started.
    pub asked_ms: f64,
    /// When the instance failed, ms since the run started, as far as the root's node can tell:
    /// when the crash was asked, or, for an instance on a node that went silent, when that
    /// node was last heard from.
    pub failed_ms: f64,
    /// From the failure until root-to-sink latency was back to normal, ms
    /// ([`crate::disruption::back_to_normal`]); `None` without a latency timeline
    /// (`RunConfig::latency_timeline`, `sluice run --latency-window`) or if it was not within
    /// the run.
    pub latency_normal_ms: Option<f64>,
}

/// A root crash in a threaded run (`Planned::CrashRoot`): a new root took over.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RootCrashReport {
    /// Packets the root had admitted when it failed.
    pub at_packet: u64,
    /// When, ms since the run started.
    pub at_ms: f64,
    /// The sequence number the new root resumed from (past anything the old one stamped).
    pub resumed_at: u64,
    /// Packets in the log when it failed.
    pub logged: u64,
    /// Whether they were lost with the root (log at the root) rather than read back from the
    /// store (`RunConfig::log_in_store`).
    pub lost: bool,
    /// With the log in the store: entries the new root read back.
    pub read_back: u64,
}

/// A store crash in a threaded run (`Planned::CrashStore`): the store was wiped and rebuilt.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StoreCrashReport {
    /// Packets the root had admitted when the store failed.
    pub at_packet: u64,
    /// When, ms since the run started.
    pub at_ms: f64,
    /// How long the chain held still while the store was rebuilt, ms.
    pub paused_ms: f64,
    /// What the rebuild loaded.
    pub detail: String,
}

/// One change of a vertex's instances or flows in a threaded run (`RunConfig::reconfigs`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReconfigReport {
    /// `scale_out`, `scale_in`, `move`, `clone` (a straggler's clone takes its flows on
    /// trial) or `clone_back` (the clone lost its trial: the straggler takes them back).
    pub kind: String,
    /// The vertex.
    pub vertex: String,
    /// Packets the root had admitted when the change took effect.
    pub at_packet: u64,
    /// When, ms since the run started.
    pub at_ms: f64,
    /// Instances serving the vertex before and after.
    pub instances: (usize, usize),
    /// Flows pinned to another instance (a move's flows, a removed instance's known flows).
    pub flows: u64,
    /// From the change to its settling (every packet before it done, the old instances'
    /// updates flushed to the store): the longest a packet of a flow that changed instance
    /// waited, ms.
    pub settle_ms: f64,
    /// Of that, until every clock before the change had finished (the rest is the instances
    /// flushing and handing flows over), ms.
    pub drain_ms: f64,
    /// For a clone: how its trial ended (absent while it runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trial: Option<TrialReport>,
}

/// One chain over several nodes: what one node's links to the others moved.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkReport {
    /// This node's name in the spread.
    pub node: String,
    /// Packets sent to instances (or the egress) on other nodes.
    pub packets_sent: u64,
    /// Packets received for this node's instances (or its egress).
    pub packets_received: u64,
    /// Notes sent to the root's node.
    pub notes_sent: u64,
    /// Notes heard from other nodes (on the root's node).
    pub notes_received: u64,
    /// Datagrams sent, packets, notes and control together.
    pub datagrams_sent: u64,
    /// Datagrams received from nodes of the spread.
    pub datagrams_received: u64,
    /// Datagrams that did not decode, or were for another chain, dropped.
    pub malformed: u64,
    /// Packets for an instance this node does not host, dropped.
    pub misaddressed: u64,
    /// Datagrams from addresses that are not nodes of the spread, dropped.
    pub strangers: u64,
    /// Datagrams found missing (a later one of the same sender came first) and asked for
    /// again; the run goes on once they are resent.
    pub lost: u64,
    /// Datagrams dropped as taken already (a resend that crossed the original).
    pub late: u64,
    /// Datagrams this node resent because another asked for them.
    pub resent: u64,
    /// The last decoding error, to say what the malformed ones were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Nodes found silent and failed over (their instances replaced on the root's node).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_nodes: Vec<String>,
    /// Datagrams from failed nodes, dropped (a node declared failed is not listened to again).
    pub fenced: u64,
    /// Instances crashed alone (a drill through a control endpoint) and replaced on the root's
    /// node: on a node without the root, its own that it handed over; on the root's node,
    /// those of other nodes it took over.
    pub crashed_instances: u64,
    /// On the root's node: reports of the root's progress sent to nodes hosting
    /// order-sensitive instances; elsewhere, those taken in.
    pub progress: u64,
}

/// How a clone's trial ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct TrialReport {
    /// The straggler's time per packet before the clone took over, ns.
    pub straggler_ns: f64,
    /// The clone's during its trial, ns.
    pub clone_ns: f64,
    /// Whether the clone kept the flows (it was not slower).
    pub clone_kept: bool,
}

/// Root-to-sink latency of the packets that left in one window of the run
/// (`RunConfig::latency_timeline`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LatencyWindow {
    /// The window's start, ms since the run started.
    pub start_ms: f64,
    /// Packets that left in it.
    pub packets: u64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
}

/// The result of a run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunReport {
    /// Chain name.
    pub chain: String,
    /// Where NF state lived (`local`, or the client mode and the store).
    pub state: String,
    /// Worker threads.
    pub workers: usize,
    /// Roots (each on its own thread when more than one).
    pub roots: u8,
    /// Batch size.
    pub batch: usize,
    /// In-flight window of the root.
    pub window: usize,
    /// Packets read from the input.
    pub packets_in: u64,
    /// Bytes read.
    pub bytes_in: u64,
    /// Packets sent to the output (including bypassed ones).
    pub packets_out: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Packets outside the traffic class, sent to the output untouched.
    pub bypassed: u64,
    /// Dropped packets by `place: reason` (`root: malformed`, `nat: nat-no-mapping`, ...).
    pub dropped: BTreeMap<String, u64>,
    /// Sum of `dropped`.
    pub dropped_total: u64,
    /// Copies made for mirror edges.
    pub mirrored: u64,
    /// Wall-clock duration, seconds.
    pub elapsed_s: f64,
    /// Input packets per second over the run, millions.
    pub mpps: f64,
    /// Per-vertex counters.
    pub vertices: Vec<VertexReport>,
    /// End-to-end latency.
    pub latency_us: Latency,
    /// With `RunConfig::latency_timeline`: latency per window of egress time, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub latency_timeline: Vec<LatencyWindow>,
    /// With `RunConfig::latency_timeline`: each packet's (egress time, latency), ns, in egress
    /// order, and the width of the windows ([`RunReport::around`]).
    #[serde(skip)]
    pub latency_samples: Option<(Vec<(u64, u64)>, Duration)>,
    /// Checkpoints of the state store.
    pub checkpoints: CheckpointReport,
    /// The root's packet log, with `RunConfig::fault_tolerance`.
    pub fault_tolerance: Option<FaultToleranceReport>,
    /// Instance failovers (`RunConfig::crashes`), in the order they happened.
    pub failovers: Vec<FailoverReport>,
    /// Scaling and flow moves (`RunConfig::reconfigs`), in the order they happened.
    pub reconfigurations: Vec<ReconfigReport>,
    /// Root crashes, in the order they happened.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub root_crashes: Vec<RootCrashReport>,
    /// Store crashes, in the order they happened.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub store_crashes: Vec<StoreCrashReport>,
    /// A chain over several nodes: what this node's links to the others moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkReport>,
    /// Decisions by `nf/kind`.
    pub event_counts: BTreeMap<String, u64>,
    /// All decisions, in clock order.
    pub events: Vec<Event>,
    /// With `RunConfig::record`: what `sluice verify --recorded` needs besides the frames.
    #[serde(skip)]
    pub recording: Option<crate::record::Recording>,
}

impl RunReport {
    /// Whether every input packet is accounted for: out or dropped.
    pub fn balanced(&self) -> bool {
        self.packets_in == self.packets_out + self.dropped_total
    }

    /// Takes in each packet's latency (in egress order) and the width of the run's latency
    /// windows: the latency per window, and each failover's time from the failure to latency
    /// back to normal.
    pub fn set_latency_samples(&mut self, samples: Vec<(u64, u64)>, width: Duration) {
        self.latency_timeline = crate::disruption::latency_windows(&samples, width);
        self.latency_samples = Some((samples, width));
        let normal: Vec<Option<f64>> =
            self.failovers.iter().map(|f| self.around(f.failed_ms).and_then(|a| a.back_to_normal_ms)).collect();
        for (f, normal) in self.failovers.iter_mut().zip(normal) {
            f.latency_normal_ms = normal;
        }
    }

    /// Latency around a disruption at `at_ms` (ms since the run started), from each packet's
    /// latency; `None` without them (`RunConfig::latency_timeline`).
    pub fn around(&self, at_ms: f64) -> Option<crate::disruption::Around> {
        let (samples, width) = self.latency_samples.as_ref()?;
        Some(crate::disruption::back_to_normal(samples, *width, at_ms))
    }
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let roots = if self.roots > 1 { format!(", {} roots", self.roots) } else { String::new() };
        let workers = match self.workers {
            0 => "run to completion on the root thread".to_string(),
            n => format!("{n} worker(s)"),
        };
        writeln!(f, "chain `{}`: {workers}{roots}, batch {}, window {}", self.chain, self.batch, self.window)?;
        writeln!(
            f,
            "  packets  in {:>12}   out {:>12}   dropped {:>10}   bypassed {}",
            self.packets_in, self.packets_out, self.dropped_total, self.bypassed
        )?;
        writeln!(f, "  bytes    in {:>12}   out {:>12}", self.bytes_in, self.bytes_out)?;
        writeln!(f, "  time     {:.3} s   {:.3} Mpps overall", self.elapsed_s, self.mpps)?;
        if !self.dropped.is_empty() {
            writeln!(f, "  drops by reason:")?;
            for (r, n) in &self.dropped {
                writeln!(f, "    {r:<36} {n:>10}")?;
            }
        }
        writeln!(f, "  NFs:")?;
        writeln!(
            f,
            "    {:<14} {:<11} {:>4} {:>11} {:>11} {:>9} {:>9} {:>10}",
            "vertex", "type", "inst", "in", "forwarded", "dropped", "consumed", "Mpps/busy"
        )?;
        for v in &self.vertices {
            for i in &v.instances {
                let dropped: u64 = i.dropped.values().sum();
                writeln!(
                    f,
                    "    {:<14} {:<11} {:>4} {:>11} {:>11} {:>9} {:>9} {:>10.3}",
                    v.name, v.kind, i.index, i.packets_in, i.forwarded, dropped, i.consumed, i.busy_mpps
                )?;
            }
        }
        let store: Vec<String> = self
            .vertices
            .iter()
            .flat_map(|v| v.instances.iter().map(move |i| (v, i)))
            .filter(|(_, i)| !i.state.is_empty())
            .map(|(v, i)| {
                let g = |k: &str| i.state.get(k).copied().unwrap_or(0);
                format!(
                    "    {:<14} {:>4} {:>10} {:>10} {:>10} {:>8}",
                    v.name,
                    i.index,
                    g("requests"),
                    g("round_trips"),
                    g("cache_hits"),
                    g("retransmits")
                )
            })
            .collect();
        if !store.is_empty() {
            writeln!(f, "  state store use:")?;
            writeln!(
                f,
                "    {:<14} {:>4} {:>10} {:>10} {:>10} {:>8}",
                "vertex", "inst", "requests", "round-trips", "cache-hits", "resent"
            )?;
            for l in store {
                writeln!(f, "{l}")?;
            }
        }
        if self.checkpoints.taken > 0 {
            writeln!(
                f,
                "  checkpoints: {} taken ({:.1} ms in all), last one {} values, TS of {} instance(s)",
                self.checkpoints.taken,
                self.checkpoints.total_s * 1e3,
                self.checkpoints.last_values,
                self.checkpoints.last_ts
            )?;
        }
        if self.checkpoints.failed > 0 {
            writeln!(f, "  checkpoints failed: {} (each tried again an interval later)", self.checkpoints.failed)?;
        }
        if let Some(ft) = &self.fault_tolerance {
            writeln!(
                f,
                "  root log: {} logged, {} deleted, {} left, peak {}; {} commits; {} duplicates suppressed",
                ft.logged, ft.deleted, ft.left_in_log, ft.log_peak, ft.commits, ft.duplicates_suppressed
            )?;
        }
        for fo in &self.failovers {
            let normal = match (self.latency_timeline.is_empty(), fo.latency_normal_ms) {
                (true, _) => String::new(),
                (false, Some(ms)) => format!("; latency back to normal {ms:.1} ms after the failure"),
                (false, None) => "; latency not back to normal within the run".to_string(),
            };
            writeln!(
                f,
                "  failover of {}:{} at packet {}: {} copies lost, {} replayed, serving again after {:.2} ms{normal}",
                fo.vertex, fo.instance, fo.at_packet, fo.lost, fo.replayed, fo.recovery_ms
            )?;
        }
        for c in &self.root_crashes {
            let log = if c.lost {
                format!("{} logged packets lost with it", c.logged)
            } else {
                format!("{} logged packets read back from the store", c.read_back)
            };
            writeln!(f, "  root crash at packet {}: clock resumed at {}, {log}", c.at_packet, c.resumed_at)?;
        }
        if let Some(l) = &self.link {
            writeln!(
                f,
                "  node {}: {} packets sent to other nodes, {} received; {} notes sent, {} heard; {} malformed, {} misaddressed, {} from strangers, {} fenced",
                l.node, l.packets_sent, l.packets_received, l.notes_sent, l.notes_received, l.malformed, l.misaddressed, l.strangers, l.fenced
            )?;
            if l.lost + l.late + l.resent > 0 {
                writeln!(
                    f,
                    "  link losses: {} datagrams missing and asked for again, {} resent when asked, {} duplicates dropped",
                    l.lost, l.resent, l.late
                )?;
            }
            if !l.failed_nodes.is_empty() {
                writeln!(f, "  failed nodes, their instances replaced here: {}", l.failed_nodes.join(", "))?;
            }
        }
        for c in &self.store_crashes {
            writeln!(
                f,
                "  store crash at packet {}: rebuilt while the chain held still {:.2} ms",
                c.at_packet, c.paused_ms
            )?;
        }
        for r in &self.reconfigurations {
            writeln!(
                f,
                "  {} of {} at packet {}: {} -> {} instances, {} flows pinned, settled after {:.2} ms",
                r.kind.replace('_', " "),
                r.vertex,
                r.at_packet,
                r.instances.0,
                r.instances.1,
                r.flows,
                r.settle_ms
            )?;
        }
        let l = &self.latency_us;
        writeln!(
            f,
            "  latency  µs (root to sink, {} samples): p5 {:.1}  p25 {:.1}  p50 {:.1}  p75 {:.1}  p95 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            l.samples, l.p5, l.p25, l.p50, l.p75, l.p95, l.p99, l.p999, l.max
        )?;
        if self.events.is_empty() {
            writeln!(f, "  decisions: none")?;
        } else {
            writeln!(f, "  decisions:")?;
            for (k, n) in &self.event_counts {
                writeln!(f, "    {k:<36} {n:>10}")?;
            }
            const SHOWN: usize = 20;
            for e in self.events.iter().take(SHOWN) {
                writeln!(f, "    [{}] {} {} {} {}", e.clock, e.nf, e.kind, e.subject, e.detail)?;
            }
            if self.events.len() > SHOWN {
                writeln!(f, "    ... {} more (see --json)", self.events.len() - SHOWN)?;
            }
        }
        Ok(())
    }
}
