//! A seeded generator of synthetic TCP traffic: the StatelessNF workloads (`long`, `short`,
//! `mixed`) and custom small ones for tests.
//!
//! Every flow is a complete, well-formed TCP connection over IPv4 in Ethernet:
//! 1. three-way handshake: SYN (client), SYN-ACK (server), ACK (client);
//! 2. data packets (flags ACK+PSH): the first from the client, the second from the server,
//!    later ones from the server with probability 0.7, from the client otherwise; sequence and
//!    acknowledgement numbers advance exactly by the bytes sent (no loss, no reordering within a
//!    flow);
//! 3. teardown from both sides: FIN+ACK (client), ACK (server), FIN+ACK (server), ACK (client).
//!
//! So a flow of `n` packets has `n - 7` data packets; `n` must be at least 7.
//!
//! Addresses and ports: clients in 10.0.0.0/8 with ephemeral ports 32768..=65535, servers in
//! 198.18.0.0/15 (the RFC 2544 benchmark range; [`GenConfig::servers`] distinct hosts) on a small
//! set of well-known ports (80 and 443 most, then 22, 21, 25, 8080, 3306). The client
//! address/port pair is a seeded bijection of the flow's index, so all flows of one run are
//! distinct, and another seed gives other flows.
//!
//! Frame sizes ([`FrameSize`]): with [`FrameSize::Mix`], handshake and teardown packets are
//! 64-byte frames (the 54 bytes of headers plus Ethernet padding) and data packets follow a
//! bimodal distribution that depends on the direction: client to server 65 % small
//! (64..=200 bytes), 25 % medium (201..=1399), 10 % large (1400..=1500); server to client 15 %
//! small, 15 % medium, 70 % large, half of those full 1500-byte frames. With
//! [`FrameSize::Fixed`] every frame, control packets included, has exactly that size (control
//! packets are padded). Sizes are frame lengths as captured (no FCS), within 64..=1500.
//!
//! Timing: flows run concurrently. The generator keeps at most [`GenConfig::concurrency`] flows
//! active; each packet comes from an active flow chosen uniformly at random, and a finished flow
//! is replaced by a new one until the workload's flows are exhausted. Gaps between consecutive
//! packets of the trace are exponentially distributed with mean [`GenConfig::mean_gap_ns`]
//! (at least 1 ns), so timestamps strictly increase. Memory is bounded by the active set, whatever
//! the number of packets.
//!
//! Determinism: one ChaCha8 stream seeded with [`GenConfig::seed`] drives every choice, so the
//! same configuration always produces the same bytes.
//!
//! The [`Workload::Demo`] workload adds planted sessions (a port scan, a Trojan signature and
//! decoys) to background flows; see [`crate::demo`].

use crate::pcap::{Precision, TraceWriter};
use crate::IoError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// Length of the Ethernet + IPv4 + TCP headers the generator writes (no options).
pub const HEADERS_LEN: usize = 14 + 20 + 20;
/// Smallest frame the generator produces.
pub const MIN_FRAME: u16 = 64;
/// Largest frame the generator produces.
pub const MAX_GEN_FRAME: u16 = 1500;
/// Fewest packets a flow can have: handshake (3) plus teardown (4).
pub const MIN_PACKETS_PER_FLOW: u32 = 7;

/// Which traffic to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// 3,000 flows of 10,000 packets (30 M packets at scale 1).
    Long,
    /// 100,000 flows of 100 packets (10 M packets at scale 1).
    Short,
    /// Half the packets from long flows, half from short ones: 1,500 flows of 10,000 packets and
    /// 150,000 flows of 100 packets (30 M packets at scale 1), started in random order.
    Mixed,
    /// `flows` flows of `packets_per_flow` packets each; not affected by [`GenConfig::scale`].
    Custom {
        /// Number of flows.
        flows: u64,
        /// Packets in each flow (at least [`MIN_PACKETS_PER_FLOW`]).
        packets_per_flow: u32,
    },
    /// The demonstration trace of [`crate::demo`]: 2,000 background flows of 20 to 48 packets
    /// (scaled by [`GenConfig::scale`]) merged in time with a port scan, a Trojan signature and
    /// decoy hosts (not scaled).
    Demo,
}

impl Workload {
    /// The `(flows, packets per flow)` groups of the workload at `scale` (flow counts are
    /// multiplied by `scale` and rounded, at least 1 per group). For [`Workload::Demo`] these are
    /// the background flows only; the planted sessions come on top.
    pub fn groups(&self, scale: f64) -> Vec<(u64, u32)> {
        let scaled = |n: u64| ((n as f64 * scale).round() as u64).max(1);
        match *self {
            Workload::Long => vec![(scaled(3_000), 10_000)],
            Workload::Short => vec![(scaled(100_000), 100)],
            Workload::Mixed => vec![(scaled(1_500), 10_000), (scaled(150_000), 100)],
            Workload::Demo => crate::demo::BACKGROUND.iter().map(|&(n, p)| (scaled(n), p)).collect(),
            Workload::Custom { flows, packets_per_flow } => vec![(flows, packets_per_flow)],
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Workload::Long => f.write_str("long"),
            Workload::Short => f.write_str("short"),
            Workload::Mixed => f.write_str("mixed"),
            Workload::Demo => f.write_str("demo"),
            Workload::Custom { flows, packets_per_flow } => write!(f, "{flows}x{packets_per_flow}"),
        }
    }
}

impl FromStr for Workload {
    type Err = IoError;

    /// Parses `long`, `short`, `mixed`, `demo` or `FLOWSxPACKETS` (e.g. `10x20`).
    fn from_str(s: &str) -> Result<Workload, IoError> {
        match s.to_ascii_lowercase().as_str() {
            "long" => Ok(Workload::Long),
            "short" => Ok(Workload::Short),
            "mixed" => Ok(Workload::Mixed),
            "demo" => Ok(Workload::Demo),
            other => {
                let bad = || {
                    IoError::InvalidConfig(format!(
                        "unknown workload {s:?}: use long, short, mixed, demo or FLOWSxPACKETS"
                    ))
                };
                let (f, p) = other.split_once('x').ok_or_else(bad)?;
                Ok(Workload::Custom {
                    flows: f.trim().parse().map_err(|_| bad())?,
                    packets_per_flow: p.trim().parse().map_err(|_| bad())?,
                })
            }
        }
    }
}

/// Frame size policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FrameSize {
    /// 64-byte control packets and a bimodal distribution for data (see the module docs).
    #[default]
    Mix,
    /// Every frame exactly this many bytes (64..=1500), e.g. 64 for packet-rate benchmarks.
    Fixed(u16),
}

impl FromStr for FrameSize {
    type Err = IoError;

    /// Parses `mix` or a frame size in bytes.
    fn from_str(s: &str) -> Result<FrameSize, IoError> {
        if s.eq_ignore_ascii_case("mix") {
            return Ok(FrameSize::Mix);
        }
        s.trim()
            .parse()
            .map(FrameSize::Fixed)
            .map_err(|_| IoError::InvalidConfig(format!("bad frame size {s:?}: use mix or a number of bytes")))
    }
}

/// What to generate; see the [module documentation](self).
#[derive(Debug, Clone, PartialEq)]
pub struct GenConfig {
    /// The workload.
    pub workload: Workload,
    /// Seed of the random stream.
    pub seed: u64,
    /// Multiplies the flow counts of the named workloads (1.0 = full size).
    pub scale: f64,
    /// Frame sizes.
    pub size: FrameSize,
    /// Most flows active at once.
    pub concurrency: usize,
    /// Timestamp of the first packet, nanoseconds since the epoch.
    pub start_ns: u64,
    /// Mean gap between consecutive packets, nanoseconds.
    pub mean_gap_ns: u64,
    /// Number of distinct server addresses (1..=131,070).
    pub servers: u32,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            workload: Workload::Short,
            seed: 1,
            scale: 1.0,
            size: FrameSize::Mix,
            concurrency: 4096,
            start_ns: 1_600_000_000 * 1_000_000_000,
            mean_gap_ns: 2_000,
            servers: 1024,
        }
    }
}

impl GenConfig {
    /// The default configuration for `workload` and `seed`.
    pub fn new(workload: Workload, seed: u64) -> GenConfig {
        GenConfig { workload, seed, ..GenConfig::default() }
    }

    /// Checks the configuration; [`generate`] does the same.
    pub fn validate(&self) -> Result<(), IoError> {
        let bad = |m: String| Err(IoError::InvalidConfig(m));
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return bad(format!("scale must be a positive number, not {}", self.scale));
        }
        if let FrameSize::Fixed(n) = self.size {
            if !(MIN_FRAME..=MAX_GEN_FRAME).contains(&n) {
                return bad(format!("frame size {n} outside {MIN_FRAME}..={MAX_GEN_FRAME}"));
            }
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1".to_string());
        }
        if !(1..=131_070).contains(&self.servers) {
            return bad(format!("servers must be in 1..=131070, not {}", self.servers));
        }
        if self.workload == Workload::Demo && self.servers > crate::demo::MAX_SERVERS {
            return bad(format!(
                "the demo workload needs servers <= {} (its planted hosts use 198.19.0.0/16), not {}",
                crate::demo::MAX_SERVERS,
                self.servers
            ));
        }
        let groups = self.workload.groups(self.scale);
        let mut flows: u64 = 0;
        for &(n, ppf) in &groups {
            if ppf < MIN_PACKETS_PER_FLOW {
                return bad(format!("{ppf} packets per flow: a flow needs at least {MIN_PACKETS_PER_FLOW}"));
            }
            flows = flows.saturating_add(n);
        }
        if flows > u64::from(u32::MAX) + 1 {
            return bad(format!("{flows} flows: at most 2^32 are supported"));
        }
        Ok(())
    }

    /// Total number of packets the configuration produces. For [`Workload::Demo`] this builds the
    /// few hundred planted packets to count them.
    pub fn total_packets(&self) -> u64 {
        let planted = match self.workload {
            Workload::Demo => crate::demo::plant(self).packets.len() as u64,
            _ => 0,
        };
        self.background_packets().saturating_add(planted)
    }

    /// Total number of flows (TCP connections) the configuration produces.
    pub fn total_flows(&self) -> u64 {
        let planted = match self.workload {
            Workload::Demo => crate::demo::plant(self).flows,
            _ => 0,
        };
        self.workload.groups(self.scale).iter().map(|&(n, _)| n).sum::<u64>().saturating_add(planted)
    }

    /// Packets of the workload's flow groups (everything but the demo's planted sessions).
    pub(crate) fn background_packets(&self) -> u64 {
        self.workload.groups(self.scale).iter().map(|&(n, p)| n.saturating_mul(u64::from(p))).sum()
    }
}

/// Creates the generator for `cfg`: an iterator of `(timestamp ns, Ethernet frame)`.
pub fn generate(cfg: &GenConfig) -> Result<Generator, IoError> {
    cfg.validate()?;
    Ok(Generator::new(cfg))
}

/// Generates `cfg` straight into a classic pcap file with nanosecond timestamps (the generator's
/// gaps are below a microsecond by default). Returns the number of packets written.
pub fn write_pcap(cfg: &GenConfig, path: impl AsRef<Path>) -> Result<u64, IoError> {
    let mut w = TraceWriter::create(path, Precision::Nano)?;
    for (ts, frame) in generate(cfg)? {
        w.write(ts, &frame)?;
    }
    w.finish()
}

/// State of one TCP connection. [`Flow::emit`] is the crate's one TCP frame builder, used by the
/// background flows and by the demo's planted sessions.
#[derive(Debug, Clone)]
pub(crate) struct Flow {
    client: [u8; 4],
    server: [u8; 4],
    cport: u16,
    sport: u16,
    /// Next sequence number of the client and of the server.
    c_nxt: u32,
    s_nxt: u32,
    c_ipid: u16,
    s_ipid: u16,
    /// Packets emitted so far and in total.
    sent: u32,
    total: u32,
}

impl Flow {
    /// A connection between `client` and `server` (address and port each) that has sent nothing
    /// yet: `isn` are the client's and the server's initial sequence numbers, `ipid` their first
    /// IPv4 identifications.
    pub(crate) fn new(client: ([u8; 4], u16), server: ([u8; 4], u16), isn: [u32; 2], ipid: [u16; 2]) -> Flow {
        Flow {
            client: client.0,
            server: server.0,
            cport: client.1,
            sport: server.1,
            c_nxt: isn[0],
            s_nxt: isn[1],
            c_ipid: ipid[0],
            s_ipid: ipid[1],
            sent: 0,
            total: 0,
        }
    }

    /// Builds the next packet of the connection: sent by the client or the server, with TCP
    /// `flags` and `payload`, padded to `frame_len` bytes (Ethernet padding). Sequence and
    /// acknowledgement numbers are the connection's (acknowledgement 0 without ACK); the sender's
    /// next sequence number then advances by the payload, plus one for SYN or FIN. Callers keep
    /// payloads within one Ethernet MTU (at most 1,460 bytes).
    pub(crate) fn emit(&mut self, from_client: bool, flags: u8, payload: &[u8], frame_len: usize) -> Vec<u8> {
        let (src, dst, sport, dport) = if from_client {
            (self.client, self.server, self.cport, self.sport)
        } else {
            (self.server, self.client, self.sport, self.cport)
        };
        let (seq, ack) = if from_client { (self.c_nxt, self.s_nxt) } else { (self.s_nxt, self.c_nxt) };
        let ack = if flags & ACK != 0 { ack } else { 0 };
        let ipid = if from_client { &mut self.c_ipid } else { &mut self.s_ipid };
        let id = *ipid;
        *ipid = ipid.wrapping_add(1);

        let mut f = Vec::with_capacity(frame_len.max(HEADERS_LEN + payload.len()));
        // Ethernet: locally administered MACs derived from the addresses.
        let mac = |ip: [u8; 4], tag: u8| [0x02, tag, ip[0], ip[1], ip[2], ip[3]];
        let (smac, dmac) = if from_client { (mac(src, 0), mac(dst, 1)) } else { (mac(src, 1), mac(dst, 0)) };
        f.extend_from_slice(&dmac);
        f.extend_from_slice(&smac);
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        // IPv4 header.
        let total_len = (20 + 20 + payload.len()) as u16;
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&total_len.to_be_bytes());
        ip[4..6].copy_from_slice(&id.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64; // TTL
        ip[9] = 6; // TCP
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&dst);
        let c = checksum(&[&ip]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        // TCP header.
        let mut tcp = [0u8; 20];
        tcp[0..2].copy_from_slice(&sport.to_be_bytes());
        tcp[2..4].copy_from_slice(&dport.to_be_bytes());
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        tcp[8..12].copy_from_slice(&ack.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = flags;
        tcp[14..16].copy_from_slice(&64_240u16.to_be_bytes());
        let tcp_len = (20 + payload.len()) as u16;
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&src);
        pseudo[4..8].copy_from_slice(&dst);
        pseudo[9] = 6;
        pseudo[10..12].copy_from_slice(&tcp_len.to_be_bytes());
        let c = checksum(&[&pseudo, &tcp, payload]);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&tcp);
        f.extend_from_slice(payload);
        // Ethernet padding up to the frame size.
        f.resize(frame_len.max(f.len()), 0);

        // Advance the sender's sequence number: SYN and FIN count as one byte.
        let adv = (payload.len() as u32).wrapping_add(u32::from(flags & (SYN | FIN) != 0));
        if from_client {
            self.c_nxt = self.c_nxt.wrapping_add(adv);
        } else {
            self.s_nxt = self.s_nxt.wrapping_add(adv);
        }
        self.sent += 1;
        f
    }
}

/// A flow's packet: who sends it, TCP flags, payload length.
#[derive(Debug, Clone, Copy)]
struct Segment {
    from_client: bool,
    flags: u8,
    payload: usize,
    frame: usize,
}

pub(crate) const FIN: u8 = 0x01;
pub(crate) const SYN: u8 = 0x02;
pub(crate) const RST: u8 = 0x04;
pub(crate) const PSH: u8 = 0x08;
pub(crate) const ACK: u8 = 0x10;

const SERVER_PORTS: [(u16, u32); 7] = [(80, 35), (443, 35), (22, 10), (21, 5), (25, 5), (8080, 5), (3306, 5)];

const FILLER_LEN: usize = 2048;
static FILLER: [u8; FILLER_LEN] = filler();

const fn filler() -> [u8; FILLER_LEN] {
    let text = b"Sluice synthetic payload: the quick brown fox jumps over the dog\n";
    let mut a = [0u8; FILLER_LEN];
    let mut i = 0;
    while i < FILLER_LEN {
        a[i] = text[i % text.len()];
        i += 1;
    }
    a
}

/// The client address of a flow whose permuted index is `h`: its 17 high bits are the host,
/// spread over 10.0.0.0/8 by an odd multiplier (a bijection mod 2^24).
pub(crate) fn client_addr(h: u32) -> [u8; 4] {
    let host = ((h >> 15) + 1).wrapping_mul(0x9E_3779) & 0xff_ffff;
    let [_, a, b, c] = host.to_be_bytes();
    [10, a, b, c]
}

/// A seeded bijection of `u32`.
fn permute(mut x: u32, k: [u32; 2]) -> u32 {
    x ^= k[0];
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    x = x.wrapping_add(k[1]);
    x = x.wrapping_mul(0x846C_A68B);
    x ^= x >> 16;
    x
}

/// The synthetic traffic iterator returned by [`generate`]. Yields `(timestamp ns, frame)`.
#[derive(Debug, Clone)]
pub struct Generator {
    rng: ChaCha8Rng,
    keys: [u32; 2],
    /// Flows not started yet, per group, with the group's packets per flow.
    pending: Vec<(u64, u32)>,
    active: Vec<Flow>,
    next_index: u64,
    ts: u64,
    mean_gap: f64,
    size: FrameSize,
    servers: u32,
    remaining: u64,
    /// Planted packets still to merge in, in time order (only [`Workload::Demo`] has any).
    planted: VecDeque<(u64, Vec<u8>)>,
    /// Timestamp of the last packet yielded.
    last_ts: Option<u64>,
}

impl Generator {
    fn new(cfg: &GenConfig) -> Generator {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let keys = [rng.gen(), rng.gen()];
        let planted: VecDeque<(u64, Vec<u8>)> = match cfg.workload {
            Workload::Demo => crate::demo::plant(cfg).packets.into(),
            _ => VecDeque::new(),
        };
        let mut g = Generator {
            rng,
            keys,
            pending: cfg.workload.groups(cfg.scale),
            active: Vec::new(),
            next_index: 0,
            ts: cfg.start_ns,
            mean_gap: cfg.mean_gap_ns as f64,
            size: cfg.size,
            servers: cfg.servers,
            remaining: cfg.background_packets().saturating_add(planted.len() as u64),
            planted,
            last_ts: None,
        };
        while g.active.len() < cfg.concurrency {
            match g.start_flow() {
                Some(f) => g.active.push(f),
                None => break,
            }
        }
        g
    }

    /// Starts the next flow, picking its group with probability proportional to the flows the
    /// group has left.
    fn start_flow(&mut self) -> Option<Flow> {
        let left: u64 = self.pending.iter().map(|&(n, _)| n).sum();
        if left == 0 {
            return None;
        }
        let mut pick = self.rng.gen_range(0..left);
        let mut ppf = 0;
        for (n, p) in self.pending.iter_mut() {
            if pick < *n {
                *n -= 1;
                ppf = *p;
                break;
            }
            pick -= *n;
        }
        let h = permute(self.next_index as u32, self.keys);
        self.next_index += 1;
        let cport = 32_768 + (h & 0x7fff) as u16;
        let srv = 198u32 << 24 | 18 << 16;
        let server = (srv + 1 + self.rng.gen_range(0..self.servers)).to_be_bytes();
        let total_weight: u32 = SERVER_PORTS.iter().map(|&(_, w)| w).sum();
        let mut w = self.rng.gen_range(0..total_weight);
        let mut sport = 80;
        for &(port, weight) in &SERVER_PORTS {
            if w < weight {
                sport = port;
                break;
            }
            w -= weight;
        }
        Some(Flow {
            client: client_addr(h),
            server,
            cport,
            sport,
            c_nxt: self.rng.gen(),
            s_nxt: self.rng.gen(),
            c_ipid: self.rng.gen(),
            s_ipid: self.rng.gen(),
            sent: 0,
            total: ppf,
        })
    }

    fn data_frame_len(&mut self, from_client: bool) -> usize {
        let r = self.rng.gen_range(0..100u32);
        let (small, medium) = if from_client { (65, 90) } else { (15, 30) };
        let len = if r < small {
            self.rng.gen_range(64..=200)
        } else if r < medium {
            self.rng.gen_range(201..=1399)
        } else if from_client || r < 65 {
            self.rng.gen_range(1400..=1500)
        } else {
            1500
        };
        len as usize
    }

    /// What packet `flow.sent` of the flow is.
    fn segment(&mut self, sent: u32, total: u32) -> Segment {
        let control = |from_client, flags| Segment { from_client, flags, payload: 0, frame: 0 };
        let data = total.saturating_sub(MIN_PACKETS_PER_FLOW);
        let mut seg = match sent {
            0 => control(true, SYN),
            1 => control(false, SYN | ACK),
            2 => control(true, ACK),
            k if k < 3 + data => {
                let from_client = match k - 3 {
                    0 => true,
                    1 => false,
                    _ => self.rng.gen_bool(0.3),
                };
                Segment { from_client, flags: ACK | PSH, payload: 1, frame: 0 }
            }
            k if k == total.saturating_sub(4) => control(true, FIN | ACK),
            k if k == total.saturating_sub(3) => control(false, ACK),
            k if k == total.saturating_sub(2) => control(false, FIN | ACK),
            _ => control(true, ACK),
        };
        let fixed = match self.size {
            FrameSize::Fixed(n) => Some(usize::from(n)),
            FrameSize::Mix => None,
        };
        seg.frame = if seg.payload > 0 {
            let len = match fixed {
                Some(n) => n,
                None => self.data_frame_len(seg.from_client),
            };
            seg.payload = len - HEADERS_LEN;
            len
        } else {
            fixed.unwrap_or(usize::from(MIN_FRAME))
        };
        seg
    }

    fn build(flow: &mut Flow, seg: Segment) -> Vec<u8> {
        let seq = if seg.from_client { flow.c_nxt } else { flow.s_nxt };
        let off = (seq as usize) % 64;
        let payload = FILLER.get(off..off + seg.payload).unwrap_or(&[]);
        flow.emit(seg.from_client, seg.flags, payload, seg.frame)
    }

    /// Packets still to come.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }
}

/// The Internet checksum of the concatenation of `parts` (each of even length except the last).
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    for part in parts {
        let mut chunks = part.chunks_exact(2);
        for w in &mut chunks {
            sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u64::from(*last) << 8;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Iterator for Generator {
    type Item = (u64, Vec<u8>);

    fn next(&mut self) -> Option<(u64, Vec<u8>)> {
        // A planted packet goes first when it is due strictly before the next background one.
        let planted_first = match self.planted.front() {
            Some(&(ts, _)) => self.active.is_empty() || ts < self.ts,
            None => false,
        };
        let (ts, frame) = if planted_first { self.planted.pop_front()? } else { self.next_background()? };
        // Timestamps strictly increase: a planted packet tying a background one moves 1 ns later.
        let ts = match self.last_ts {
            Some(last) => ts.max(last.saturating_add(1)),
            None => ts,
        };
        self.last_ts = Some(ts);
        self.remaining = self.remaining.saturating_sub(1);
        Some((ts, frame))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

impl Generator {
    /// The next packet of the background flows, if any.
    fn next_background(&mut self) -> Option<(u64, Vec<u8>)> {
        if self.active.is_empty() {
            return None;
        }
        let idx = self.rng.gen_range(0..self.active.len());
        let (sent, total) = {
            let f = self.active.get(idx)?;
            (f.sent, f.total)
        };
        let seg = self.segment(sent, total);
        let frame = Generator::build(self.active.get_mut(idx)?, seg);
        let ts = self.ts;
        let u: f64 = self.rng.gen();
        let gap = (-self.mean_gap * (1.0 - u).ln()).round().max(1.0);
        self.ts = self.ts.saturating_add(gap as u64);
        if sent + 1 == total {
            match self.start_flow() {
                Some(f) => {
                    if let Some(slot) = self.active.get_mut(idx) {
                        *slot = f;
                    }
                }
                None => {
                    self.active.swap_remove(idx);
                }
            }
        }
        Some((ts, frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_is_injective_on_a_sample() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..100_000u32 {
            assert!(seen.insert(permute(i, [0xdead_beef, 0x1234_5678])));
        }
    }

    #[test]
    fn checksum_of_known_header() {
        // Example IPv4 header from RFC 1071 discussions (checksum field zeroed).
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
            0x00, 0xc7,
        ];
        assert_eq!(checksum(&[&hdr]), 0xb861);
    }

    #[test]
    fn workload_parsing() {
        assert_eq!("long".parse::<Workload>().unwrap(), Workload::Long);
        assert_eq!("10x20".parse::<Workload>().unwrap(), Workload::Custom { flows: 10, packets_per_flow: 20 });
        assert!("x".parse::<Workload>().is_err());
        assert_eq!("64".parse::<FrameSize>().unwrap(), FrameSize::Fixed(64));
        assert_eq!("mix".parse::<FrameSize>().unwrap(), FrameSize::Mix);
    }

    #[test]
    fn validation() {
        let mut c = GenConfig::new(Workload::Custom { flows: 1, packets_per_flow: 6 }, 1);
        assert!(generate(&c).is_err());
        c.workload = Workload::Custom { flows: 1, packets_per_flow: 7 };
        assert!(generate(&c).is_ok());
        c.size = FrameSize::Fixed(63);
        assert!(generate(&c).is_err());
        c.size = FrameSize::Fixed(1501);
        assert!(generate(&c).is_err());
    }

    #[test]
    fn totals() {
        let c = GenConfig::new(Workload::Long, 1);
        assert_eq!(c.total_packets(), 30_000_000);
        let c = GenConfig::new(Workload::Mixed, 1);
        assert_eq!(c.total_packets(), 30_000_000);
        assert_eq!(c.total_flows(), 151_500);
        let c = GenConfig { scale: 0.001, ..GenConfig::new(Workload::Short, 1) };
        assert_eq!(c.total_flows(), 100);
    }
}
