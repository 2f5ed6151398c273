//! The `demo` workload: valid frames and exact totals, determinism, and the planted port scan,
//! Trojan signature and decoys.

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use sluice_io::demo::{
    BACKGROUND, DEMO_DECOY_HOST, DEMO_DOWNLOADS, DEMO_FTP_SERVER, DEMO_IRC_SERVER, DEMO_OPEN_PORTS, DEMO_PARTIAL_HOST,
    DEMO_SCANNER, DEMO_SCAN_PORTS, DEMO_SCAN_TARGET, DEMO_SSH_SERVER, DEMO_TROJAN_HOST,
};
use sluice_io::gen::{self, FrameSize, GenConfig, Workload};
use sluice_io::summarize;
use sluice_packet::{FlowKey, Headers, ParseStatus, L3, L4};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;

/// One frame of a trace, parsed.
struct Pkt {
    ts: u64,
    h: Headers,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    /// The TCP payload, kept only for planted traffic (an endpoint in 198.19.0.0/16).
    payload: Vec<u8>,
}

impl Pkt {
    fn flags(&self) -> u8 {
        self.h.tcp_flags.0
    }

    fn has(&self, needle: &[u8]) -> bool {
        self.payload.windows(needle.len()).any(|w| w == needle)
    }
}

fn v4(a: IpAddr) -> Ipv4Addr {
    match a {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => panic!("IPv6 address {a}"),
    }
}

fn planted_side(a: Ipv4Addr) -> bool {
    a.octets()[..2] == [198, 19]
}

/// Parses a frame, asserting that it is an Ethernet/IPv4/TCP frame.
fn parse(ts: u64, frame: &[u8]) -> Pkt {
    let h = Headers::parse(frame);
    assert_eq!(h.status, ParseStatus::Ok);
    assert_eq!(h.l3, L3::V4);
    assert_eq!(h.l4, L4::Tcp);
    let t = h.tuple.unwrap();
    let (src, dst) = (v4(t.src), v4(t.dst));
    let payload = if planted_side(src) || planted_side(dst) {
        let off = usize::from(h.payload_off);
        frame[off..off + usize::from(h.payload_len)].to_vec()
    } else {
        Vec::new()
    };
    Pkt { ts, h, src, dst, sport: t.sport, dport: t.dport, payload }
}

/// Checks the IPv4 header checksum and the TCP checksum by recomputing them with etherparse.
fn assert_checksums(frame: &[u8]) {
    let sliced = SlicedPacket::from_ethernet(frame).unwrap();
    let Some(NetSlice::Ipv4(ip)) = &sliced.net else { panic!("not IPv4") };
    let ip = ip.header().to_header();
    assert_eq!(ip.header_checksum, ip.calc_header_checksum(), "IPv4 header checksum");
    let Some(TransportSlice::Tcp(tcp)) = &sliced.transport else { panic!("not TCP") };
    let expected = tcp.to_header().calc_checksum_ipv4(&ip, tcp.payload()).unwrap();
    assert_eq!(tcp.checksum(), expected, "TCP checksum");
}

/// Generates `cfg` and checks every frame: parses as IPv4/TCP, valid checksums, frame size,
/// strictly increasing timestamps, and the count announced by the configuration and the iterator.
fn checked(cfg: &GenConfig) -> Vec<Pkt> {
    let g = gen::generate(cfg).unwrap();
    let total = cfg.total_packets();
    assert_eq!(g.size_hint(), (total as usize, Some(total as usize)));
    let min = match cfg.size {
        FrameSize::Fixed(n) => usize::from(n),
        FrameSize::Mix => 64,
    };
    let mut out: Vec<Pkt> = Vec::with_capacity(total as usize);
    for (ts, frame) in g {
        assert_checksums(&frame);
        assert!((min..=1500).contains(&frame.len()), "frame of {} bytes", frame.len());
        if let Some(last) = out.last() {
            assert!(ts > last.ts, "timestamps must strictly increase");
        }
        out.push(parse(ts, &frame));
    }
    assert_eq!(out.len() as u64, total);
    out
}

/// The default demo trace (seed 1), generated and checked once.
fn default_trace() -> &'static [Pkt] {
    static TRACE: OnceLock<Vec<Pkt>> = OnceLock::new();
    TRACE.get_or_init(|| checked(&GenConfig::new(Workload::Demo, 1)))
}

fn scaled(seed: u64, scale: f64) -> GenConfig {
    GenConfig { scale, ..GenConfig::new(Workload::Demo, seed) }
}

/// Replays every connection's sequence space: each segment carries its sender's next sequence
/// number and acknowledges the peer's (once the peer's initial sequence number is known).
/// Returns the number of connections.
fn assert_tcp_sequences(trace: &[Pkt]) -> usize {
    #[derive(Default)]
    struct Conn {
        client: Option<(Ipv4Addr, u16)>,
        next: [Option<u32>; 2],
        closed: [bool; 2],
    }
    let mut conns: HashMap<FlowKey, Conn> = HashMap::new();
    for p in trace {
        let key = p.h.tuple.unwrap().flow_key();
        let c = conns.entry(key).or_default();
        let client = *c.client.get_or_insert((p.src, p.sport));
        let side = usize::from((p.src, p.sport) != client);
        let f = p.flags();
        if side == 0 && c.next[0].is_none() {
            assert_eq!(f, SYN, "{key}: a connection starts with the client's SYN");
        }
        // A reset to a SYN from a closed port has no sequence number of its own.
        let fresh_reset = f & RST != 0 && c.next[side].is_none();
        if let Some(next) = c.next[side] {
            assert_eq!(p.h.tcp_seq, next, "{key}: sequence number");
        } else if !fresh_reset {
            assert!(f & SYN != 0, "{key}: first segment of a side is a SYN");
        }
        if f & ACK != 0 {
            assert_eq!(Some(p.h.tcp_ack), c.next[1 - side], "{key}: acknowledgement number");
        } else {
            assert_eq!(p.h.tcp_ack, 0, "{key}: no ACK flag, acknowledgement 0");
        }
        if !fresh_reset {
            let len = u32::from(p.h.payload_len) + u32::from(f & (SYN | FIN) != 0);
            c.next[side] = Some(p.h.tcp_seq.wrapping_add(len));
        }
        assert!(!c.closed[side] || f & FIN == 0, "{key}: one FIN per side");
        c.closed[side] |= f & FIN != 0;
    }
    conns.len()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Event {
    Ssh,
    Html,
    Zip,
    Exe,
    Irc,
}

/// The Trojan detector's events per client host, with their index in the trace: SYNs to port 22,
/// `RETR` lines of .html/.zip/.exe files to port 21, `NICK`/`JOIN`/`PRIVMSG` lines to port 6667.
fn trojan_events(trace: &[Pkt]) -> HashMap<Ipv4Addr, Vec<(usize, Event)>> {
    let mut events: HashMap<Ipv4Addr, Vec<(usize, Event)>> = HashMap::new();
    for (i, p) in trace.iter().enumerate() {
        let mut found = Vec::new();
        if p.dport == 22 && p.flags() == SYN {
            found.push(Event::Ssh);
        }
        let text = String::from_utf8_lossy(&p.payload);
        for line in text.split("\r\n") {
            if p.dport == 21 {
                if let Some(name) = line.strip_prefix("RETR ") {
                    match name.rsplit('.').next() {
                        Some("html") => found.push(Event::Html),
                        Some("zip") => found.push(Event::Zip),
                        Some("exe") => found.push(Event::Exe),
                        _ => {}
                    }
                }
            }
            if p.dport == 6667 && ["NICK ", "JOIN ", "PRIVMSG "].iter().any(|c| line.starts_with(c)) {
                found.push(Event::Irc);
            }
        }
        for e in found {
            events.entry(p.src).or_default().push((i, e));
        }
    }
    events
}

/// A reference Trojan detector: a host is flagged when some SSH event precedes an HTML, a ZIP
/// and an EXE download which all precede some IRC event.
fn trojan_hosts(trace: &[Pkt]) -> HashSet<Ipv4Addr> {
    let mut flagged = HashSet::new();
    for (host, evs) in trojan_events(trace) {
        let first_ssh = evs.iter().filter(|e| e.1 == Event::Ssh).map(|e| e.0).min();
        let last_irc = evs.iter().filter(|e| e.1 == Event::Irc).map(|e| e.0).max();
        let (Some(s), Some(i)) = (first_ssh, last_irc) else { continue };
        if [Event::Html, Event::Zip, Event::Exe].iter().all(|t| evs.iter().any(|e| e.1 == *t && s < e.0 && e.0 < i)) {
            flagged.insert(host);
        }
    }
    flagged
}

/// Timestamps of packets from `host` whose payload holds `needle`.
fn times(trace: &[Pkt], host: Ipv4Addr, needle: &[u8]) -> Vec<u64> {
    trace.iter().filter(|p| p.src == host && p.has(needle)).map(|p| p.ts).collect()
}

fn one(trace: &[Pkt], host: Ipv4Addr, needle: &str) -> u64 {
    let t = times(trace, host, needle.as_bytes());
    assert_eq!(t.len(), 1, "{host} must send {needle:?} once");
    t[0]
}

#[test]
fn workload_name() {
    assert_eq!("demo".parse::<Workload>().unwrap(), Workload::Demo);
    assert_eq!("Demo".parse::<Workload>().unwrap(), Workload::Demo);
    assert_eq!(Workload::Demo.to_string(), "demo");
    assert_eq!(Workload::Demo.groups(1.0), BACKGROUND.to_vec());
}

#[test]
fn default_trace_is_valid_with_exact_totals() {
    let cfg = GenConfig::new(Workload::Demo, 1);
    let trace = default_trace(); // every frame checked by `checked`
    let background: u64 = BACKGROUND.iter().map(|&(n, p)| n * u64::from(p)).sum();
    assert_eq!(background, 65_200);
    assert_eq!(cfg.total_packets(), background + 544);
    assert_eq!(trace.len() as u64, cfg.total_packets());
    assert_eq!(cfg.total_flows(), 2_000 + 167);
    assert_eq!(assert_tcp_sequences(trace) as u64, cfg.total_flows());
    // Background flows keep to their ranges; planted traffic stays between 192.168.66.0/24 and
    // 198.19.0.0/16.
    for p in trace {
        let planted = [p.src, p.dst].iter().any(|a| a.octets()[..3] == [192, 168, 66]);
        let external = [p.src, p.dst].into_iter().find(|a| a.octets()[0] == 198).unwrap();
        assert_eq!(planted, planted_side(external), "{} -> {}", p.src, p.dst);
        if !planted {
            assert_eq!(external.octets()[..2], [198, 18]);
        }
    }
}

#[test]
fn totals_and_size_hint_are_exact_for_other_configurations() {
    for cfg in [
        GenConfig { mean_gap_ns: 1, concurrency: 7, ..scaled(3, 0.001) },
        GenConfig { size: FrameSize::Fixed(64), ..scaled(4, 0.05) },
        GenConfig { size: FrameSize::Fixed(1500), mean_gap_ns: 1_000_000, ..scaled(5, 0.02) },
    ] {
        let trace = checked(&cfg);
        assert_eq!(assert_tcp_sequences(&trace) as u64, cfg.total_flows());
        assert_eq!(trojan_hosts(&trace), HashSet::from([DEMO_TROJAN_HOST]));
        let mut g = gen::generate(&cfg).unwrap();
        g.next();
        assert_eq!(g.remaining(), cfg.total_packets() - 1);
        assert_eq!(g.count() as u64, cfg.total_packets() - 1);
    }
}

#[test]
fn deterministic_per_seed() {
    let run = |seed| gen::generate(&scaled(seed, 0.05)).unwrap().collect::<Vec<_>>();
    let a = run(7);
    assert_eq!(a, run(7));
    let b = run(8);
    assert_ne!(a, b);
    // The planted part depends on the seed too: the scan probes ports in another order.
    let scan_order = |frames: &[(u64, Vec<u8>)]| -> Vec<u16> {
        frames.iter().map(|(ts, f)| parse(*ts, f)).filter(|p| p.src == DEMO_SCANNER).map(|p| p.dport).collect()
    };
    assert_ne!(scan_order(&a), scan_order(&b));
}

#[test]
fn trojan_host_runs_ssh_then_downloads_then_irc() {
    let trace = default_trace();
    let host = DEMO_TROJAN_HOST;
    let to = |server: Ipv4Addr, port: u16| {
        move |p: &&Pkt| (p.src == host && p.dst == server && p.dport == port) || (p.dst == host && p.sport == port)
    };
    // Each session is one complete connection to its server.
    for (server, port) in [(DEMO_SSH_SERVER, 22), (DEMO_FTP_SERVER, 21), (DEMO_IRC_SERVER, 6667)] {
        let conn: Vec<&Pkt> = trace.iter().filter(to(server, port)).collect();
        assert_eq!(conn[0].flags(), SYN);
        assert_eq!(conn[1].flags(), SYN | ACK);
        assert_eq!(conn.iter().filter(|p| p.flags() & FIN != 0).count(), 2);
        assert!(conn.iter().all(|p| p.sport == conn[0].sport || p.dport == conn[0].sport), "one connection");
    }
    let ssh_syn = trace.iter().find(|p| p.src == host && p.dport == 22 && p.flags() == SYN).unwrap().ts;
    let ssh_banner = one(trace, host, "SSH-2.0-OpenSSH_8.9\r\n");
    let server_banner = trace.iter().find(|p| p.dst == host && p.has(b"SSH-2.0-OpenSSH_8.9p1")).unwrap().ts;
    let ssh_end = trace.iter().filter(to(DEMO_SSH_SERVER, 22)).map(|p| p.ts).max().unwrap();
    assert!(ssh_syn < server_banner && server_banner < ssh_banner && ssh_banner < ssh_end);

    let ftp_start = trace.iter().find(|p| p.src == host && p.dport == 21).unwrap().ts;
    assert!(ssh_end < ftp_start, "the FTP session starts after the SSH session ended");
    let banner = trace.iter().find(|p| p.dst == host && p.sport == 21 && p.has(b"220 ")).unwrap().ts;
    let user = one(trace, host, "USER anonymous\r\n");
    let pass = one(trace, host, "PASS x\r\n");
    assert!(ftp_start < banner && banner < user && user < pass);
    let mut last_retr = 0;
    for path in DEMO_DOWNLOADS {
        let retr = one(trace, host, &format!("RETR {path}\r\n"));
        assert!(pass < retr && last_retr < retr, "downloads in order, after login");
        let reply = |code: &str| {
            trace.iter().find(|p| p.ts > retr && p.dst == host && p.sport == 21 && p.has(code.as_bytes())).unwrap().ts
        };
        let (opening, done) = (reply("150 "), reply("226 "));
        // The file travels on a passive data connection between the 150 and 226 replies.
        let data: Vec<&Pkt> =
            trace.iter().filter(|p| p.src == DEMO_FTP_SERVER && p.dst == host && p.sport >= 40_000).collect();
        assert!(data.iter().any(|p| opening < p.ts && p.ts < done && p.h.payload_len > 0));
        assert!(opening < done);
        last_retr = retr;
    }
    let ftp_end = trace.iter().filter(to(DEMO_FTP_SERVER, 21)).map(|p| p.ts).max().unwrap();
    assert!(last_retr < ftp_end);

    let irc_start = trace.iter().find(|p| p.src == host && p.dport == 6667).unwrap().ts;
    assert!(ftp_end < irc_start, "the IRC session starts after the FTP session ended");
    let nick = one(trace, host, "NICK bot123\r\n");
    let user = one(trace, host, "USER bot123");
    let join = one(trace, host, "JOIN #cmd\r\n");
    let msg = one(trace, host, "PRIVMSG #cmd :ready\r\n");
    assert!(irc_start < nick && nick < user && user < join && join < msg);
    assert!(ssh_banner < last_retr && last_retr < nick);
}

#[test]
fn decoys_are_out_of_order_or_incomplete() {
    let trace = default_trace();
    let events = trojan_events(trace);
    let span = |host: Ipv4Addr, kinds: &[Event]| {
        let idx: Vec<usize> = events[&host].iter().filter(|e| kinds.contains(&e.1)).map(|e| e.0).collect();
        (*idx.iter().min().unwrap(), *idx.iter().max().unwrap())
    };
    let kinds = |host: Ipv4Addr| events[&host].iter().map(|e| e.1).collect::<HashSet<_>>();
    let downloads = [Event::Html, Event::Zip, Event::Exe];

    // The Trojan host: SSH, then all downloads, then IRC.
    assert_eq!(kinds(DEMO_TROJAN_HOST).len(), 5);
    let (ssh, files, irc) = (
        span(DEMO_TROJAN_HOST, &[Event::Ssh]),
        span(DEMO_TROJAN_HOST, &downloads),
        span(DEMO_TROJAN_HOST, &[Event::Irc]),
    );
    assert!(ssh.1 < files.0 && files.1 < irc.0);

    // The decoy: every step, in the reverse order.
    assert_eq!(kinds(DEMO_DECOY_HOST).len(), 5);
    let (ssh, files, irc) =
        (span(DEMO_DECOY_HOST, &[Event::Ssh]), span(DEMO_DECOY_HOST, &downloads), span(DEMO_DECOY_HOST, &[Event::Irc]));
    assert!(irc.1 < files.0 && files.1 < ssh.0);
    for line in ["NICK bot456\r\n", "JOIN #cmd\r\n", "SSH-2.0-OpenSSH_8.9\r\n", "RETR /pub/setup.exe\r\n"] {
        one(trace, DEMO_DECOY_HOST, line);
    }

    // The partial host: SSH and downloads, no IRC.
    assert_eq!(kinds(DEMO_PARTIAL_HOST), HashSet::from([Event::Ssh, Event::Html, Event::Zip, Event::Exe]));
    let (ssh, files) = (span(DEMO_PARTIAL_HOST, &[Event::Ssh]), span(DEMO_PARTIAL_HOST, &downloads));
    assert!(ssh.1 < files.0);

    // Only the Trojan host matches the signature.
    assert_eq!(trojan_hosts(trace), HashSet::from([DEMO_TROJAN_HOST]));
}

#[test]
fn scanner_probes_many_ports_and_gets_resets() {
    let trace = default_trace();
    // Per probed port: the scanner's packets and the target's replies, in time order.
    let mut probes: BTreeMap<u16, Vec<(bool, u8, u64)>> = BTreeMap::new();
    for p in trace {
        if p.src == DEMO_SCANNER {
            assert_eq!(p.dst, DEMO_SCAN_TARGET);
            probes.entry(p.dport).or_default().push((true, p.flags(), p.ts));
        } else if p.dst == DEMO_SCANNER {
            assert_eq!(p.src, DEMO_SCAN_TARGET);
            probes.entry(p.sport).or_default().push((false, p.flags(), p.ts));
        }
    }
    assert_eq!(probes.len(), DEMO_SCAN_PORTS);
    assert!(probes.len() >= 100);
    let (mut resets, mut open) = (0, Vec::new());
    for (&port, pkts) in &probes {
        let shape: Vec<(bool, u8)> = pkts.iter().map(|&(from_scanner, f, _)| (from_scanner, f)).collect();
        if shape == [(true, SYN), (false, RST | ACK)] {
            resets += 1;
        } else {
            assert_eq!(shape, [(true, SYN), (false, SYN | ACK), (true, RST)], "port {port}");
            open.push(port);
        }
    }
    assert_eq!(resets, DEMO_SCAN_PORTS - DEMO_OPEN_PORTS.len());
    assert_eq!(open, DEMO_OPEN_PORTS.to_vec());
    // The scan is spread over most of the trace, among the background.
    let syns: Vec<u64> = probes.values().map(|p| p[0].2).collect();
    let (first, last) = (trace[0].ts, trace[trace.len() - 1].ts);
    let (lo, hi) = (*syns.iter().min().unwrap(), *syns.iter().max().unwrap());
    assert!((hi - lo) as f64 > 0.7 * (last - first) as f64);
    let background_between =
        trace.iter().filter(|p| p.ts > lo && p.ts < hi && p.src.octets()[..3] != [192, 168, 66]).count();
    assert!(background_between > 50_000);
}

#[test]
fn demo_needs_servers_clear_of_the_planted_hosts() {
    let cfg = GenConfig { servers: 65_536, ..GenConfig::new(Workload::Demo, 1) };
    assert!(gen::generate(&cfg).is_err());
    assert!(gen::generate(&GenConfig { servers: 65_535, ..cfg.clone() }).is_ok());
    assert!(gen::generate(&GenConfig { workload: Workload::Short, ..cfg }).is_ok());
}

#[test]
fn write_pcap_matches_the_totals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.pcap");
    let cfg = scaled(2, 0.1);
    assert_eq!(gen::write_pcap(&cfg, &path).unwrap(), cfg.total_packets());
    let s = summarize(&path).unwrap();
    assert_eq!(s.packets, cfg.total_packets());
    assert_eq!(s.flows, cfg.total_flows());
    assert_eq!(s.protocols.tcp, cfg.total_packets());
    assert_eq!(s.out_of_order, 0);
}
