//! AF_XDP ports on real veth pairs in throw-away network namespaces: the port answers ARP and
//! ping for an address nobody else has, so `ping` in the namespace succeeds only if frames go
//! both ways through the UMEM; the XDP program goes with the port; a second port on the same
//! interface is refused with a reason.
//!
//! Needs root (CAP_NET_ADMIN, CAP_BPF, CAP_SYS_ADMIN for `ip netns`), iproute2 and iputils
//! `ping` (`.ci/run` installs them). Names carry the process id; a guard deletes what a test
//! created even when it fails.

use etherparse::{Icmpv4Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use sluice_afxdp::{AfXdpError, AttachMode, XdpConfig, XdpPort};
use sluice_packet::{Batch, Packet, PacketPool};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PORT_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x79, 0x00, 0x01];
const PORT_IP: [u8; 4] = [10, 79, 0, 1];

fn run(args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed (these tests need root, iproute2 and iputils-ping): {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A namespace with one end of a veth pair (10.79.0.2/24, offloads off); the other end,
/// `host`, stays in this namespace, up, without an address. Deleted on drop.
struct Veth {
    ns: String,
    host: String,
    peer: String,
}

impl Veth {
    fn new(tag: &str) -> Veth {
        let pid = std::process::id();
        let v = Veth {
            ns: format!("sluice-xdp-{pid}-{tag}"),
            host: format!("sx{pid}{tag}h"),
            peer: format!("sx{pid}{tag}p"),
        };
        run(&["ip", "netns", "add", &v.ns]);
        run(&["ip", "link", "add", &v.host, "type", "veth", "peer", "name", &v.peer, "netns", &v.ns]);
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", v.host), "1");
        run(&["ip", "link", "set", &v.host, "up"]);
        run(&["ip", "-n", &v.ns, "addr", "add", "10.79.0.2/24", "dev", &v.peer]);
        run(&["ip", "-n", &v.ns, "link", "set", &v.peer, "up"]);
        // Full-size GSO frames would not fit a UMEM frame.
        let _ = Command::new("ip")
            .args(["netns", "exec", &v.ns, "ethtool", "-K", &v.peer, "tso", "off", "gso", "off", "tx", "off"])
            .output();
        v
    }

    fn xdp_attached(&self) -> bool {
        let out = run(&["ip", "link", "show", "dev", &self.host]);
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.host]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// The ARP reply to `frame` if it is a request for `PORT_IP`.
fn arp_reply(frame: &[u8]) -> Option<Vec<u8>> {
    // Ethernet (14) + ARP for IPv4 over Ethernet (28); operation 1 = request.
    if frame.len() < 42 || frame[12..14] != [0x08, 0x06] || frame[20..22] != [0, 1] || frame[38..42] != PORT_IP {
        return None;
    }
    let (asker_mac, asker_ip) = (&frame[22..28], &frame[28..32]);
    let mut r = Vec::with_capacity(42);
    r.extend_from_slice(asker_mac);
    r.extend_from_slice(&PORT_MAC);
    r.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 2]);
    r.extend_from_slice(&PORT_MAC);
    r.extend_from_slice(&PORT_IP);
    r.extend_from_slice(asker_mac);
    r.extend_from_slice(asker_ip);
    Some(r)
}

/// The echo reply to `frame` if it is an ICMP echo request to `PORT_IP`.
fn echo_reply(frame: &[u8]) -> Option<Vec<u8>> {
    let p = SlicedPacket::from_ethernet(frame).ok()?;
    let Some(NetSlice::Ipv4(ip)) = &p.net else { return None };
    if ip.header().destination() != PORT_IP {
        return None;
    }
    let Some(TransportSlice::Icmpv4(icmp)) = &p.transport else { return None };
    let Icmpv4Type::EchoRequest(echo) = icmp.icmp_type() else { return None };
    let src_mac: [u8; 6] = frame[6..12].try_into().ok()?;
    let b = PacketBuilder::ethernet2(PORT_MAC, src_mac)
        .ipv4(PORT_IP, ip.header().source(), 64)
        .icmpv4_echo_reply(echo.id, echo.seq);
    let mut out = Vec::new();
    b.write(&mut out, icmp.payload()).ok()?;
    Some(out)
}

/// What the responder saw.
#[derive(Debug, Default)]
struct Seen {
    arp_answered: u64,
    echo_answered: u64,
    received: u64,
}

#[test]
fn port_answers_arp_and_ping_through_its_umem() {
    answers_arp_and_ping("a", AttachMode::Auto, AttachMode::Driver);
}

/// The same with the program in generic (skb) mode, which every driver has.
#[test]
fn port_in_generic_mode_answers_arp_and_ping() {
    answers_arp_and_ping("g", AttachMode::Generic, AttachMode::Generic);
}

fn answers_arp_and_ping(tag: &str, asked: AttachMode, expected: AttachMode) {
    let veth = Veth::new(tag);
    let cfg = XdpConfig { mode: asked, ..XdpConfig::default() };
    let mut port = XdpPort::open(&veth.host, &cfg).expect("open AF_XDP port on veth");
    eprintln!("{port:?}, max tx {}", port.max_tx_len());
    assert_eq!(port.mode(), expected, "veth has native XDP; generic when asked");
    assert!(veth.xdp_attached(), "the XDP program is attached while the port is open");
    assert_eq!(port.max_tx_len(), 1518);

    let stop = Arc::new(AtomicBool::new(false));
    let stop_r = Arc::clone(&stop);
    let responder = std::thread::spawn(move || {
        let pool = PacketPool::new(256, 2048);
        let mut batch: Batch = Vec::with_capacity(64);
        let mut seen = Seen::default();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !stop_r.load(Ordering::Relaxed) && Instant::now() < deadline {
            let n = port.recv_batch(&pool, &mut batch, 64).expect("recv_batch");
            seen.received += n as u64;
            let mut replies: Vec<Packet> = Vec::new();
            for p in &batch {
                if let Some(r) = arp_reply(p.data()) {
                    seen.arp_answered += 1;
                    replies.push(pool.packet(&r, p.meta));
                } else if let Some(r) = echo_reply(p.data()) {
                    seen.echo_answered += 1;
                    replies.push(pool.packet(&r, p.meta));
                }
            }
            let mut sent = 0;
            while sent < replies.len() {
                sent += port.send_batch(&replies[sent..]).expect("send_batch");
            }
            pool.recycle_batch(&mut batch);
            pool.recycle_batch(&mut replies);
            if n == 0 {
                sluice_afxdp::poll_any(&[&port], Duration::from_millis(2)).expect("poll");
            }
        }
        (seen, port.stats().expect("stats"), port)
    });

    let ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            &veth.ns,
            "ping",
            "-c",
            "5",
            "-i",
            "0.2",
            "-W",
            "2",
            "-w",
            "10",
            "-s",
            "1000",
            "10.79.0.1",
        ])
        .output()
        .expect("run ping");
    stop.store(true, Ordering::Relaxed);
    let (seen, stats, port) = responder.join().expect("responder panicked");
    let text = String::from_utf8_lossy(&ping.stdout).into_owned() + &String::from_utf8_lossy(&ping.stderr);
    eprintln!("{text}\n{seen:?}\n{stats:?}");
    assert!(ping.status.success() && text.contains("5 received"), "ping through the AF_XDP port failed: {text}");
    assert!(seen.arp_answered >= 1, "{seen:?}");
    assert_eq!(seen.echo_answered, 5, "{seen:?}");
    assert_eq!(stats.tx_packets, seen.arp_answered + seen.echo_answered);
    assert_eq!(stats.rx_packets, seen.received);
    assert_eq!(stats.rx_dropped + stats.rx_invalid + stats.tx_oversize + stats.tx_runt, 0, "{stats:?}");

    // While one port holds the interface, a second is refused with the reason.
    let second = XdpPort::open(&veth.host, &XdpConfig::default());
    match second {
        Err(e @ AfXdpError::Syscall { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&veth.host) && msg.contains("already has an AF_XDP socket"), "{msg}");
        }
        other => panic!("a second port on the same interface should be refused: {other:?}"),
    }
    drop(port);
    assert!(!veth.xdp_attached(), "the XDP program must go with the port");
}

#[test]
fn bad_configurations_and_names_are_refused_before_any_change() {
    let bad = |cfg: XdpConfig| XdpPort::open("lo", &cfg).map(|_| ()).unwrap_err().to_string();
    let msg = bad(XdpConfig { frame_size: 3000, ..XdpConfig::default() });
    assert!(msg.contains("frame size 3000"), "{msg}");
    let msg = bad(XdpConfig { rx_frames: 1000, ..XdpConfig::default() });
    assert!(msg.contains("1000 receive frames: not a power of two"), "{msg}");
    let msg = bad(XdpConfig { tx_frames: 0, ..XdpConfig::default() });
    assert!(msg.contains("0 transmit frames"), "{msg}");
    let msg = bad(XdpConfig { rx_frames: 1 << 21, tx_frames: 1 << 21, ..XdpConfig::default() });
    assert!(msg.contains("4 GiB"), "{msg}");
    let e = XdpPort::open("", &XdpConfig::default()).unwrap_err();
    assert!(matches!(e, AfXdpError::InvalidName { .. }), "{e}");
    let e = XdpPort::open("no-such-if-xdp", &XdpConfig::default()).unwrap_err();
    assert!(e.to_string().contains("if_nametoindex"), "{e}");
    assert_eq!("generic".parse::<AttachMode>(), Ok(AttachMode::Generic));
    assert!("turbo".parse::<AttachMode>().is_err());
}
