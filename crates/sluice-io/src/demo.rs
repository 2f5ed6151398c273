//! The `demo` workload ([`Workload::Demo`](crate::Workload::Demo)): a trace on which every NF of
//! the example chain (NAT → portscan detector → load balancer, with the Trojan detector off-path)
//! has real work to do.
//!
//! It is the generator's ordinary traffic, [`BACKGROUND`] flows (2,000 TCP flows of 20, 32 or 48
//! packets, flow counts scaled by [`GenConfig::scale`]) from clients in 10.0.0.0/8 to servers in
//! 198.18.0.0/16, merged in time order with planted sessions between internal hosts in
//! 192.168.66.0/24 (outside the background clients' 10.0.0.0/8, so a NAT translating 10.0.0.0/8 leaves the planted hosts visible to the detectors behind it) and external hosts in 198.19.0.0/16 (which no
//! background server uses, hence [`MAX_SERVERS`]):
//!
//! 1. **Port scan.** [`DEMO_SCANNER`] sends one SYN to each of [`DEMO_SCAN_PORTS`] distinct ports
//!    of [`DEMO_SCAN_TARGET`] (in 1..=1024, in random order, from one source port), spread over
//!    5 %–95 % of the trace. Closed ports answer RST+ACK; the [`DEMO_OPEN_PORTS`] answer SYN+ACK
//!    and the scanner resets (RST), as in a half-open `nmap -sS` scan.
//! 2. **Trojan signature.** [`DEMO_TROJAN_HOST`] runs, one after the other: an SSH session to
//!    [`DEMO_SSH_SERVER`]:22 (both banners, the client's being `SSH-2.0-OpenSSH_8.9\r\n`, then
//!    opaque key-exchange bytes); an anonymous FTP session to [`DEMO_FTP_SERVER`]:21
//!    (`USER anonymous`, `PASS x`, `TYPE I`, then for each of [`DEMO_DOWNLOADS`] `PASV`, a
//!    passive data connection to a port in 40000..50000 carrying the file from the server,
//!    `RETR <path>`, `150` and `226` replies, and finally `QUIT`); an IRC session to
//!    [`DEMO_IRC_SERVER`]:6667 (`NICK bot123`, `USER`, `JOIN #cmd`, `PRIVMSG #cmd :ready`).
//! 3. **Decoys.** [`DEMO_DECOY_HOST`] runs the same three sessions in the reverse order (IRC,
//!    FTP, SSH; nick `bot456`) and [`DEMO_PARTIAL_HOST`] runs SSH then FTP but never IRC. A
//!    correct Trojan detector flags [`DEMO_TROJAN_HOST`] only.
//!
//! Every session is a complete TCP connection built like the background flows (three-way
//! handshake, ACK+PSH data segments with exact sequence and acknowledgement numbers, FIN
//! teardown from both sides; the FTP data connections are closed by the server).
//!
//! Timing: the background lasts about `S` = background packets × [`GenConfig::mean_gap_ns`].
//! Planted sessions start at fixed fractions of `S` (Trojan host at 10 %, 35 % and 65 %, decoy at
//! 15 %, 40 % and 70 %, partial host at 20 % and 45 %); the packets of a session are 20 mean gaps
//! apart, and a host's next session never starts before its previous one ended, so each host's
//! order holds for every configuration. Where a planted packet ties a background one it is moved
//! 1 ns later, so timestamps still strictly increase.
//!
//! Sizes: planted frames are the 54 bytes of headers plus the payload, padded to 64 bytes, or to
//! the size of [`FrameSize::Fixed`] when that is larger (frames whose payload does not fit stay
//! longer than that size).
//!
//! Determinism: planted ports, sequence numbers, IP identifications, scan order, jitter and
//! opaque payloads come from a ChaCha8 stream of their own, derived from [`GenConfig::seed`]; the
//! number of planted packets and connections does not depend on the seed or the configuration.

use crate::gen::{Flow, FrameSize, GenConfig, ACK, FIN, HEADERS_LEN, MIN_FRAME, PSH, RST, SYN};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

/// The background flow groups at scale 1: `(flows, packets per flow)`.
pub const BACKGROUND: [(u64, u32); 3] = [(700, 20), (700, 32), (600, 48)];
/// Largest [`GenConfig::servers`] the demo accepts: background servers must stay in
/// 198.18.0.0/16, clear of the planted external hosts.
pub const MAX_SERVERS: u32 = 65_535;

/// The internal host that scans [`DEMO_SCAN_TARGET`].
pub const DEMO_SCANNER: Ipv4Addr = Ipv4Addr::new(192, 168, 66, 13);
/// The external host whose ports are scanned.
pub const DEMO_SCAN_TARGET: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
/// Number of distinct ports probed (each with one SYN).
pub const DEMO_SCAN_PORTS: usize = 150;
/// The probed ports that are open (answered with SYN+ACK); every other probe gets RST+ACK.
pub const DEMO_OPEN_PORTS: [u16; 5] = [22, 80, 443, 3306, 8080];
/// The internal host showing the Trojan signature: SSH, then three FTP downloads, then IRC.
pub const DEMO_TROJAN_HOST: Ipv4Addr = Ipv4Addr::new(192, 168, 66, 7);
/// The internal host doing the same steps in the wrong order (IRC, FTP, SSH): not a Trojan.
pub const DEMO_DECOY_HOST: Ipv4Addr = Ipv4Addr::new(192, 168, 66, 8);
/// The internal host doing SSH and the FTP downloads but no IRC: not a Trojan.
pub const DEMO_PARTIAL_HOST: Ipv4Addr = Ipv4Addr::new(192, 168, 66, 9);
/// The SSH server (port 22) of the planted sessions.
pub const DEMO_SSH_SERVER: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 22);
/// The FTP server (control port 21, passive data ports 40000..50000) of the planted sessions.
pub const DEMO_FTP_SERVER: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 21);
/// The IRC server (port 6667) of the planted sessions.
pub const DEMO_IRC_SERVER: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 67);
/// The files each FTP session downloads (`RETR <path>`), in this order: HTML, ZIP, EXE.
pub const DEMO_DOWNLOADS: [&str; 3] = ["/pub/index.html", "/pub/tools.zip", "/pub/setup.exe"];

/// The SSH client banner of the planted SSH sessions.
const SSH_CLIENT_BANNER: &[u8] = b"SSH-2.0-OpenSSH_8.9\r\n";
const SSH_SERVER_BANNER: &[u8] = b"SSH-2.0-OpenSSH_8.9p1 Ubuntu-3ubuntu0.6\r\n";
/// Sizes of the opaque (key exchange) SSH messages after the banners: `(from client, bytes)`.
const SSH_MESSAGES: [(bool, usize); 4] = [(true, 360), (false, 480), (true, 48), (false, 560)];
/// Contents of [`DEMO_DOWNLOADS`]: a fixed prefix, filled up to a size with seeded bytes.
const FILES: [(&[u8], usize); 3] = [(INDEX_HTML, 0), (b"PK\x03\x04", 2_000), (b"MZ\x90\x00", 3_000)];
const INDEX_HTML: &[u8] = b"<!DOCTYPE html>\n<html><head><title>Index of /pub</title></head>\n\
    <body><h1>Index of /pub</h1>\n<a href=\"tools.zip\">tools.zip</a>\n<a href=\"setup.exe\">setup.exe</a>\n\
    </body></html>\n";
/// Payload bytes per FTP data segment.
const FTP_SEGMENT: usize = 1_024;
/// Client ports of planted connections.
const EPHEMERAL: RangeInclusive<u16> = 32_768..=60_999;
/// Server ports of passive FTP data connections.
const PASV_PORTS: RangeInclusive<u16> = 40_000..=49_999;
/// Packets of a session are this many mean gaps apart.
const STEP_GAPS: u64 = 20;
/// Mixed into the seed so the planted stream differs from the background's.
const SEED_SALT: u64 = 0xDE30_5EED_0000_0001;

/// The planted part of a demo trace.
#[derive(Debug, Clone)]
pub(crate) struct Planted {
    /// `(timestamp ns, frame)` in non-decreasing time order.
    pub(crate) packets: Vec<(u64, Vec<u8>)>,
    /// Number of TCP connections.
    pub(crate) flows: u64,
}

/// One step of a host's scenario.
#[derive(Debug, Clone, Copy)]
enum Session {
    Ssh,
    Ftp,
    Irc,
}

/// Builds the planted sessions of `cfg` (see the [module documentation](self)).
pub(crate) fn plant(cfg: &GenConfig) -> Planted {
    let span = cfg.background_packets().saturating_mul(cfg.mean_gap_ns);
    let at = |permille: u64| cfg.start_ns.saturating_add((u128::from(span) * u128::from(permille) / 1000) as u64);
    let mut p = Planter {
        rng: ChaCha8Rng::seed_from_u64(cfg.seed ^ SEED_SALT),
        step: cfg.mean_gap_ns.saturating_mul(STEP_GAPS).max(1),
        min_frame: match cfg.size {
            FrameSize::Fixed(n) => usize::from(n.max(MIN_FRAME)),
            FrameSize::Mix => usize::from(MIN_FRAME),
        },
        t: cfg.start_ns,
        packets: Vec::new(),
        flows: 0,
    };
    p.port_scan(at(50), at(950));
    p.host(DEMO_TROJAN_HOST, "bot123", &[(Session::Ssh, at(100)), (Session::Ftp, at(350)), (Session::Irc, at(650))]);
    p.host(DEMO_DECOY_HOST, "bot456", &[(Session::Irc, at(150)), (Session::Ftp, at(400)), (Session::Ssh, at(700))]);
    p.host(DEMO_PARTIAL_HOST, "bot789", &[(Session::Ssh, at(200)), (Session::Ftp, at(450))]);
    // Stable: packets of one host keep their order.
    p.packets.sort_by_key(|&(ts, _)| ts);
    Planted { packets: p.packets, flows: p.flows }
}

/// Writes planted connections on a clock that advances one step per packet.
struct Planter {
    rng: ChaCha8Rng,
    /// Time between two packets of a session.
    step: u64,
    min_frame: usize,
    /// Timestamp of the next packet.
    t: u64,
    packets: Vec<(u64, Vec<u8>)>,
    flows: u64,
}

impl Planter {
    /// A new connection from `client:cport` to `server:port`; a server ISN of 0 suits a
    /// connection that the server only resets.
    fn connect_from(&mut self, client: (Ipv4Addr, u16), server: (Ipv4Addr, u16), server_isn: u32) -> Flow {
        self.flows += 1;
        let client_isn = self.rng.gen();
        let ipid = [self.rng.gen(), self.rng.gen()];
        Flow::new((client.0.octets(), client.1), (server.0.octets(), server.1), [client_isn, server_isn], ipid)
    }

    /// A new connection from an ephemeral port of `client` to `server:port`.
    fn connect(&mut self, client: Ipv4Addr, server: Ipv4Addr, port: u16) -> Flow {
        let cport = self.rng.gen_range(EPHEMERAL);
        let server_isn = self.rng.gen();
        self.connect_from((client, cport), (server, port), server_isn)
    }

    /// Emits one packet of `conn` at the current time and advances the clock.
    fn send(&mut self, conn: &mut Flow, from_client: bool, flags: u8, payload: &[u8]) {
        let len = (HEADERS_LEN + payload.len()).max(self.min_frame);
        let frame = conn.emit(from_client, flags, payload, len);
        self.packets.push((self.t, frame));
        self.t = self.t.saturating_add(self.step);
    }

    /// A data segment (ACK+PSH).
    fn say(&mut self, conn: &mut Flow, from_client: bool, payload: &[u8]) {
        self.send(conn, from_client, ACK | PSH, payload);
    }

    /// The three-way handshake.
    fn open(&mut self, conn: &mut Flow) {
        self.send(conn, true, SYN, &[]);
        self.send(conn, false, SYN | ACK, &[]);
        self.send(conn, true, ACK, &[]);
    }

    /// The teardown, started by the client or by the server.
    fn close(&mut self, conn: &mut Flow, client_first: bool) {
        self.send(conn, client_first, FIN | ACK, &[]);
        self.send(conn, !client_first, ACK, &[]);
        self.send(conn, !client_first, FIN | ACK, &[]);
        self.send(conn, client_first, ACK, &[]);
    }

    /// `len` seeded bytes standing for encrypted or compressed content.
    fn opaque(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.rng.fill(v.as_mut_slice());
        v
    }

    /// The port scan, probes spread over `from..to`.
    fn port_scan(&mut self, from: u64, to: u64) {
        let mut closed: Vec<u16> = (1..=1024).filter(|p| !DEMO_OPEN_PORTS.contains(p)).collect();
        closed.shuffle(&mut self.rng);
        let mut ports: Vec<u16> = DEMO_OPEN_PORTS.to_vec();
        ports.extend(closed.iter().take(DEMO_SCAN_PORTS.saturating_sub(DEMO_OPEN_PORTS.len())));
        ports.shuffle(&mut self.rng);
        let cport = self.rng.gen_range(EPHEMERAL);
        let interval = (to.saturating_sub(from) / DEMO_SCAN_PORTS as u64).max(1);
        for (i, &port) in ports.iter().enumerate() {
            let jitter = self.rng.gen_range(0..=interval / 2);
            self.t = from.saturating_add(interval.saturating_mul(i as u64)).saturating_add(jitter);
            let open = DEMO_OPEN_PORTS.contains(&port);
            let server_isn = if open { self.rng.gen() } else { 0 };
            let mut probe = self.connect_from((DEMO_SCANNER, cport), (DEMO_SCAN_TARGET, port), server_isn);
            self.send(&mut probe, true, SYN, &[]);
            if open {
                self.send(&mut probe, false, SYN | ACK, &[]);
                self.send(&mut probe, true, RST, &[]);
            } else {
                self.send(&mut probe, false, RST | ACK, &[]);
            }
        }
    }

    /// Runs `sessions` of `client` in order, each at its time or right after the previous one.
    fn host(&mut self, client: Ipv4Addr, nick: &str, sessions: &[(Session, u64)]) {
        let mut end = 0;
        for &(session, at) in sessions {
            self.t = at.max(end);
            match session {
                Session::Ssh => self.ssh(client),
                Session::Ftp => self.ftp(client),
                Session::Irc => self.irc(client, nick),
            }
            end = self.t.saturating_add(self.step);
        }
    }

    fn ssh(&mut self, client: Ipv4Addr) {
        let mut c = self.connect(client, DEMO_SSH_SERVER, 22);
        self.open(&mut c);
        self.say(&mut c, false, SSH_SERVER_BANNER);
        self.say(&mut c, true, SSH_CLIENT_BANNER);
        for (from_client, len) in SSH_MESSAGES {
            let bytes = self.opaque(len);
            self.say(&mut c, from_client, &bytes);
        }
        self.close(&mut c, true);
    }

    fn ftp(&mut self, client: Ipv4Addr) {
        let mut ctl = self.connect(client, DEMO_FTP_SERVER, 21);
        self.open(&mut ctl);
        let login: [(bool, &[u8]); 7] = [
            (false, b"220 (vsFTPd 3.0.5)\r\n"),
            (true, b"USER anonymous\r\n"),
            (false, b"331 Please specify the password.\r\n"),
            (true, b"PASS x\r\n"),
            (false, b"230 Login successful.\r\n"),
            (true, b"TYPE I\r\n"),
            (false, b"200 Switching to Binary mode.\r\n"),
        ];
        for (from_client, line) in login {
            self.say(&mut ctl, from_client, line);
        }
        for (path, &(prefix, size)) in DEMO_DOWNLOADS.iter().zip(FILES.iter()) {
            let mut content = prefix.to_vec();
            let fill = self.opaque(size.saturating_sub(prefix.len()));
            content.extend_from_slice(&fill);
            self.download(&mut ctl, client, path, &content);
        }
        self.say(&mut ctl, true, b"QUIT\r\n");
        self.say(&mut ctl, false, b"221 Goodbye.\r\n");
        self.close(&mut ctl, true);
    }

    /// One passive-mode download on the control connection `ctl`.
    fn download(&mut self, ctl: &mut Flow, client: Ipv4Addr, path: &str, content: &[u8]) {
        let port = self.rng.gen_range(PASV_PORTS);
        let [a, b, c, d] = DEMO_FTP_SERVER.octets();
        self.say(ctl, true, b"PASV\r\n");
        let pasv = format!("227 Entering Passive Mode ({a},{b},{c},{d},{},{}).\r\n", port >> 8, port & 0xff);
        self.say(ctl, false, pasv.as_bytes());
        let mut data = self.connect(client, DEMO_FTP_SERVER, port);
        self.open(&mut data);
        self.say(ctl, true, format!("RETR {path}\r\n").as_bytes());
        let opening = format!("150 Opening BINARY mode data connection for {path} ({} bytes).\r\n", content.len());
        self.say(ctl, false, opening.as_bytes());
        for chunk in content.chunks(FTP_SEGMENT) {
            self.say(&mut data, false, chunk);
        }
        self.close(&mut data, false);
        self.say(ctl, false, b"226 Transfer complete.\r\n");
    }

    fn irc(&mut self, client: Ipv4Addr, nick: &str) {
        let mut c = self.connect(client, DEMO_IRC_SERVER, 6667);
        self.open(&mut c);
        let lines = [
            (true, format!("NICK {nick}\r\n")),
            (true, format!("USER {nick} 0 * :{nick}\r\n")),
            (false, format!(":irc.example.net 001 {nick} :Welcome to the Internet Relay Network {nick}\r\n")),
            (true, "JOIN #cmd\r\n".to_string()),
            (false, format!(":{nick}!{nick}@{client} JOIN #cmd\r\n")),
            (true, "PRIVMSG #cmd :ready\r\n".to_string()),
        ];
        for (from_client, line) in &lines {
            self.say(&mut c, *from_client, line.as_bytes());
        }
        self.close(&mut c, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::client_addr;
    use crate::Workload;

    #[test]
    fn planted_hosts_are_not_background_clients() {
        let planted = [DEMO_SCANNER, DEMO_TROJAN_HOST, DEMO_DECOY_HOST, DEMO_PARTIAL_HOST].map(|a| a.octets());
        // The client address depends on the 17 high bits of the permuted flow index only.
        for k in 0..(1u32 << 17) {
            assert!(!planted.contains(&client_addr(k << 15)), "{:?}", client_addr(k << 15));
        }
    }

    #[test]
    fn planted_counts_do_not_depend_on_the_configuration() {
        let base = plant(&GenConfig::new(Workload::Demo, 1));
        assert_eq!(base.packets.len(), 544);
        assert_eq!(base.flows, 167);
        for cfg in [
            GenConfig::new(Workload::Demo, 99),
            GenConfig { scale: 0.001, mean_gap_ns: 1, ..GenConfig::new(Workload::Demo, 3) },
            GenConfig { size: FrameSize::Fixed(1500), mean_gap_ns: 1_000_000, ..GenConfig::new(Workload::Demo, 4) },
        ] {
            let p = plant(&cfg);
            assert_eq!(p.packets.len(), base.packets.len());
            assert_eq!(p.flows, base.flows);
            assert!(p.packets.windows(2).all(|w| w[0].0 <= w[1].0));
        }
    }
}
