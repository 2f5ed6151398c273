//! AF_PACKET ports on real veth pairs in throw-away network namespaces.
//!
//! Needs root (CAP_NET_ADMIN, CAP_NET_RAW, CAP_SYS_ADMIN for `ip netns`), iproute2 (`ip`) and,
//! for the bridge test, iputils `ping`; `ethtool` is used when present to turn offloads off as
//! the Sluice integration does. Missing privileges or tools make the tests fail with the reason.
//! Every name carries the process id and a per-test tag; a guard deletes what a test created
//! even when it fails. Traffic only ever goes to the veth peers inside the test namespaces.

use etherparse::{Icmpv4Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice, VlanId, VlanSlice};
use sluice_afpacket::{AfPacketError, AfPacketPort, PortStats, RingConfig};
use sluice_packet::{Batch, Meta, Packet, PacketPool};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// An IEEE "local experimental" ethertype, for a frame nobody processes.
const MARKER_ETHERTYPE: u16 = 0x88b5;

/// Longest any loop in these tests may run.
const LOOP_LIMIT: Duration = Duration::from_secs(10);

/// Fails the test with a clear reason unless we may create namespaces and raw sockets, and
/// the tools are there.
fn preflight(tools: &[&str]) {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let needed = [(12, "CAP_NET_ADMIN"), (13, "CAP_NET_RAW"), (21, "CAP_SYS_ADMIN")];
    let missing: Vec<&str> = needed.iter().filter(|(bit, _)| cap_eff & (1 << bit) == 0).map(|(_, n)| *n).collect();
    assert!(
        missing.is_empty(),
        "these tests create network namespaces, veth pairs and AF_PACKET sockets and must run as \
         root; missing capabilities: {missing:?} (euid {})",
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    );
    for tool in tools {
        let found = Command::new(tool).arg("-V").output().is_ok();
        assert!(
            found,
            "`{tool}` is not installed; install it with \
             `apt-get update && apt-get install -y iproute2 iputils-ping ethtool`"
        );
    }
}

fn have_ethtool() -> bool {
    Command::new("ethtool").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Runs a command, failing the test with its output when it does not succeed.
fn run(args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Names unique to this process and test.
fn names(tag: &str) -> (String, impl Fn(&str) -> String) {
    let pid = std::process::id();
    let ns_prefix = format!("sluice-afp-{pid}-{tag}");
    let tag = tag.to_string();
    // "sf" + up to 7 digits + 1-char tag + up to 2-char suffix: at most 12 bytes < IFNAMSIZ.
    (ns_prefix, move |suffix: &str| format!("sf{pid}{tag}{suffix}"))
}

/// Deletes the namespaces and links a test created, whatever happens to the test.
#[derive(Default)]
struct NetGuard {
    netns: Vec<String>,
    links: Vec<String>,
}

impl NetGuard {
    fn add_netns(&mut self, name: &str) {
        self.netns.push(name.to_string());
        run(&["ip", "netns", "add", name]);
    }

    /// A veth pair `host` (root namespace) ↔ `peer` (moved to `netns`), with fixed MACs, both up,
    /// `peer` with address `cidr`, offloads off when ethtool is there.
    fn add_veth(&mut self, host: &str, host_mac: &str, peer: &str, peer_mac: &str, netns: &str, cidr: &str) {
        self.links.push(host.to_string());
        run(&[
            "ip", "link", "add", host, "address", host_mac, "type", "veth", "peer", "name", peer, "address", peer_mac,
        ]);
        run(&["ip", "link", "set", peer, "netns", netns]);
        // No IPv6 chatter from the host side (the port's own interface); ignore if absent.
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{host}/disable_ipv6"), "1");
        run(&["ip", "link", "set", host, "up"]);
        run(&["ip", "-n", netns, "link", "set", "lo", "up"]);
        run(&["ip", "-n", netns, "addr", "add", cidr, "dev", peer]);
        run(&["ip", "-n", netns, "link", "set", peer, "up"]);
        if have_ethtool() {
            let off = ["gro", "off", "tso", "off", "gso", "off", "tx", "off"];
            let mut a = vec!["ethtool", "-K", host];
            a.extend(off);
            run(&a);
            let mut b = vec!["ip", "netns", "exec", netns, "ethtool", "-K", peer];
            b.extend(off);
            run(&b);
        } else {
            eprintln!("note: ethtool not installed, leaving veth offloads on");
        }
    }
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        for link in &self.links {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
        for ns in &self.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

fn echo_payload(seq: u16) -> Vec<u8> {
    (0..48u16).map(|i| (i as u8) ^ (seq as u8) ^ 0x5a).collect()
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

#[test]
fn invalid_names_are_rejected_before_any_syscall() {
    let cfg = RingConfig::default();
    for name in ["", "abcdefghijklmnopq", "a\0b"] {
        match AfPacketPort::open(name, &cfg) {
            Err(AfPacketError::InvalidName { ifname, .. }) => assert_eq!(ifname, name),
            other => panic!("{name:?}: expected InvalidName, got {other:?}"),
        }
    }
}

#[test]
fn missing_interface_names_interface_and_syscall() {
    preflight(&[]);
    let name = format!("sfnone{}", std::process::id());
    let err = AfPacketPort::open(&name, &RingConfig::default()).expect_err("no such interface");
    let msg = err.to_string();
    assert!(msg.contains(&name) && msg.contains("if_nametoindex"), "{msg}");
    assert_eq!(err.raw_os_error(), Some(libc::ENODEV), "{msg}");
}

/// Port on `a` in the root namespace, `b` in a namespace with 10.78.0.2: crafted echo requests
/// sent through the TX ring get kernel replies back through the RX ring, and the port never
/// sees its own requests.
#[test]
fn echo_requests_out_replies_in_own_frames_not_looped() {
    preflight(&["ip"]);
    let (ns_prefix, ifname) = names("e");
    let mut guard = NetGuard::default();
    let ns = format!("{ns_prefix}-ns");
    let (a, b) = (ifname("a"), ifname("b"));
    let (mac_a, mac_b) = ([0x02, 0x00, 0x00, 0x78, 0x00, 0x01], [0x02, 0x00, 0x00, 0x78, 0x00, 0x02]);
    let (ip_a, ip_b) = ([10, 78, 0, 1], [10, 78, 0, 2]);
    guard.add_netns(&ns);
    guard.add_veth(&a, "02:00:00:78:00:01", &b, "02:00:00:78:00:02", &ns, "10.78.0.2/24");
    // The namespace answers to 10.78.0.1 without asking for its MAC (nobody would answer ARP).
    run(&[
        "ip",
        "-n",
        &ns,
        "neigh",
        "replace",
        "10.78.0.1",
        "lladdr",
        "02:00:00:78:00:01",
        "dev",
        &b,
        "nud",
        "permanent",
    ]);

    let mut port = AfPacketPort::open(&a, &RingConfig::default()).expect("open port on veth");
    eprintln!(
        "port {} ifindex {} mtu {} ignore_outgoing {} qdisc_bypass {}",
        port.ifname(),
        port.ifindex(),
        port.mtu(),
        port.ignore_outgoing_active(),
        port.qdisc_bypass_active()
    );
    assert_eq!(port.mtu(), 1500);
    assert_eq!(port.max_tx_len(), 1514);

    const N: u16 = 5;
    const ID: u16 = 0x5107;
    let pool = PacketPool::new(256, 2048);
    let requests: Vec<Packet> = (0..N)
        .map(|seq| {
            let payload = echo_payload(seq);
            let builder = PacketBuilder::ethernet2(mac_a, mac_b).ipv4(ip_a, ip_b, 64).icmpv4_echo_request(ID, seq);
            let mut frame = Vec::with_capacity(builder.size(payload.len()));
            builder.write(&mut frame, &payload).expect("build echo request");
            pool.packet(&frame, Meta::default())
        })
        .collect();

    // Rejections: a runt and a frame over MTU + 14 are consumed and counted, not sent.
    let runt = Packet::from_slice(&[0u8; 10], Meta::default());
    let jumbo = Packet::from_slice(&vec![0u8; 1515], Meta::default());
    assert_eq!(port.send_batch(&[runt, jumbo]).expect("send rejects"), 2);
    let c = port.counters();
    assert_eq!((c.tx_runt, c.tx_oversize, c.tx_packets), (1, 1, 0));

    // Frames another socket (here a second port, through the qdisc so that packet taps see
    // them) sends on the interface are outgoing for this port: it must not receive them.
    let mut other_port = AfPacketPort::open(&a, &RingConfig { qdisc_bypass: false, ..RingConfig::default() })
        .expect("open second port on the same veth");
    let mut marker = Vec::from(mac_b);
    marker.extend_from_slice(&mac_a);
    marker.extend_from_slice(&MARKER_ETHERTYPE.to_be_bytes());
    marker.extend_from_slice(&[0xa5; 46]);
    let marker = Packet::from_slice(&marker, Meta::default());
    assert_eq!(other_port.send_batch(std::slice::from_ref(&marker)).expect("send marker"), 1);
    assert_eq!(other_port.counters().tx_packets, 1);

    // A batch larger than the TX ring fills it (the kick comes at the end of the batch): the
    // call reports how many it took, and the rest goes once the kernel has released slots.
    let tiny = RingConfig { block_size: 4096, rx_frames: 2, tx_frames: 2, ..RingConfig::default() };
    let mut tiny_port = AfPacketPort::open(&a, &tiny).expect("open port with a 2-frame TX ring");
    let markers = vec![marker.clone(); 5];
    assert_eq!(tiny_port.send_batch(&markers).expect("send to a full ring"), 2);
    assert_eq!(tiny_port.counters().tx_ring_full, 1);
    let deadline = Instant::now() + LOOP_LIMIT;
    let mut sent = 2;
    while sent < markers.len() {
        assert!(Instant::now() < deadline, "TX ring slots were never released");
        sent += tiny_port.send_batch(&markers[sent..]).expect("send_batch");
    }
    assert_eq!(tiny_port.counters().tx_packets, 5);
    drop(tiny_port);

    let deadline = Instant::now() + LOOP_LIMIT;
    let mut sent = 0;
    while sent < requests.len() {
        assert!(Instant::now() < deadline, "TX ring never accepted the requests");
        sent += port.send_batch(&requests[sent..]).expect("send_batch");
    }

    let mut replies = vec![false; usize::from(N)];
    let mut batch: Batch = Vec::new();
    let mut done_at: Option<Instant> = None;
    let mut other_frames = 0;
    let start_ns = now_ns();
    loop {
        let now = Instant::now();
        assert!(now < deadline, "timed out; replies seen: {replies:?}, stats {:?}", port.counters());
        // Keep listening a little after the last reply, to catch looped frames arriving late.
        if done_at.is_some_and(|t| now >= t + Duration::from_millis(300)) {
            break;
        }
        if !port.poll_readable(Duration::from_millis(50)).expect("poll") {
            continue;
        }
        port.recv_batch(&pool, &mut batch, 32).expect("recv_batch");
        for pkt in batch.drain(..) {
            assert!(pkt.meta.ts_ns >= start_ns.saturating_sub(5_000_000_000), "bad timestamp {}", pkt.meta.ts_ns);
            assert!(pkt.meta.ts_ns <= now_ns() + 1_000_000_000, "timestamp in the future");
            assert_eq!(pkt.meta.in_port, 0);
            assert!(
                !requests.iter().any(|r| r.data() == pkt.data()),
                "the port received its own transmitted frame back"
            );
            assert_ne!(pkt.data()[12..14], MARKER_ETHERTYPE.to_be_bytes(), "received another socket's outgoing frame");
            let sliced = SlicedPacket::from_ethernet(pkt.data()).expect("parse received frame");
            let (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Icmpv4(icmp))) = (&sliced.net, &sliced.transport)
            else {
                other_frames += 1;
                continue;
            };
            match icmp.icmp_type() {
                Icmpv4Type::EchoRequest(_) => panic!("an echo request (our own output) came back"),
                Icmpv4Type::EchoReply(echo) if echo.id == ID => {
                    assert_eq!(ip.header().source(), ip_b);
                    assert_eq!(ip.header().destination(), ip_a);
                    assert_eq!(&pkt.data()[0..6], &mac_a, "reply dst MAC");
                    assert_eq!(&pkt.data()[6..12], &mac_b, "reply src MAC");
                    assert!(echo.seq < N, "unexpected seq {}", echo.seq);
                    assert_eq!(icmp.payload(), &echo_payload(echo.seq)[..], "reply payload");
                    assert!(!replies[usize::from(echo.seq)], "duplicate reply {}", echo.seq);
                    replies[usize::from(echo.seq)] = true;
                }
                _ => other_frames += 1,
            }
            pool.recycle(pkt);
        }
        if done_at.is_none() && replies.iter().all(|&r| r) {
            done_at = Some(Instant::now());
        }
    }
    let stats = port.stats().expect("stats");
    eprintln!("stats {stats:?}, other frames {other_frames}");
    assert_eq!(stats.tx_packets, u64::from(N));
    assert!(stats.rx_packets >= u64::from(N));
    assert_eq!(stats.rx_truncated, 0);
    assert_eq!(stats.rx_invalid, 0);
    assert_eq!(stats.rx_kernel_drops, 0);
    if port.ignore_outgoing_active() {
        assert_eq!(stats.rx_outgoing_skipped, 0, "IGNORE_OUTGOING should have filtered in the kernel");
    }
    drop(other_port);
    drop(port);
    drop(guard);
}

/// What the forwarding thread reports.
struct BridgeReport {
    c_to_s: u64,
    s_to_c: u64,
    dropped: u64,
    stats_c: PortStats,
    stats_s: PortStats,
}

/// Moves frames from `from` to `to`; frames the TX ring cannot take after a few tries are
/// dropped (counted). Returns how many frames were forwarded.
fn forward(
    from: &mut AfPacketPort,
    to: &mut AfPacketPort,
    pool: &PacketPool,
    batch: &mut Batch,
    dropped: &mut u64,
) -> u64 {
    let n = from.recv_batch(pool, batch, 64).expect("recv_batch");
    if n == 0 {
        return 0;
    }
    let mut sent = 0;
    for _ in 0..100 {
        sent += to.send_batch(&batch[sent..]).expect("send_batch");
        if sent == batch.len() {
            break;
        }
        thread::sleep(Duration::from_micros(100));
    }
    *dropped += (batch.len() - sent) as u64;
    pool.recycle_batch(batch);
    n as u64
}

/// Two veth pairs and a forwarding loop between their root-namespace ends bridge namespace
/// `c` (10.77.0.1/24) and namespace `s` (10.77.0.2/24): ping from `c` to `s` works.
#[test]
fn bridge_between_two_namespaces_carries_ping() {
    preflight(&["ip", "ping"]);
    let (ns_prefix, ifname) = names("b");
    let mut guard = NetGuard::default();
    let (ns_c, ns_s) = (format!("{ns_prefix}-c"), format!("{ns_prefix}-s"));
    guard.add_netns(&ns_c);
    guard.add_netns(&ns_s);
    let (c0, c1, s0, s1) = (ifname("c0"), ifname("c1"), ifname("s0"), ifname("s1"));
    guard.add_veth(&c0, "02:00:00:77:c0:00", &c1, "02:00:00:77:c0:01", &ns_c, "10.77.0.1/24");
    guard.add_veth(&s0, "02:00:00:77:50:00", &s1, "02:00:00:77:50:01", &ns_s, "10.77.0.2/24");

    let mut port_c = AfPacketPort::open(&c0, &RingConfig::default()).expect("open port c");
    let mut port_s = AfPacketPort::open(&s0, &RingConfig::default()).expect("open port s");
    let stop = Arc::new(AtomicBool::new(false));
    let stop_fwd = Arc::clone(&stop);
    let forwarder = thread::spawn(move || {
        let pool = PacketPool::new(512, 2048);
        let mut batch: Batch = Vec::with_capacity(64);
        let mut r = BridgeReport {
            c_to_s: 0,
            s_to_c: 0,
            dropped: 0,
            stats_c: PortStats::default(),
            stats_s: PortStats::default(),
        };
        let deadline = Instant::now() + LOOP_LIMIT;
        while !stop_fwd.load(Ordering::Relaxed) && Instant::now() < deadline {
            let a = forward(&mut port_c, &mut port_s, &pool, &mut batch, &mut r.dropped);
            let b = forward(&mut port_s, &mut port_c, &pool, &mut batch, &mut r.dropped);
            r.c_to_s += a;
            r.s_to_c += b;
            if a + b == 0 {
                // Idle: sleep on one port briefly, then look at both again.
                port_c.poll_readable(Duration::from_millis(2)).expect("poll c");
                port_s.poll_readable(Duration::from_millis(2)).expect("poll s");
            }
        }
        r.stats_c = port_c.stats().expect("stats c");
        r.stats_s = port_s.stats().expect("stats s");
        r
    });

    let ping = Command::new("ip")
        .args(["netns", "exec", &ns_c, "ping", "-c", "3", "-i", "0.2", "-W", "2", "-w", "8", "10.77.0.2"])
        .output();
    stop.store(true, Ordering::Relaxed);
    let report = forwarder.join().expect("forwarding thread panicked");
    let ping = ping.expect("run ping");
    let text = format!("{}{}", String::from_utf8_lossy(&ping.stdout), String::from_utf8_lossy(&ping.stderr));
    eprintln!("{text}");
    eprintln!(
        "forwarded c->s {} s->c {} dropped {}\nport c {:?}\nport s {:?}",
        report.c_to_s, report.s_to_c, report.dropped, report.stats_c, report.stats_s
    );
    assert!(ping.status.success(), "ping through the bridge failed: {text}");
    assert!(text.contains("3 received"), "{text}");
    // ARP request + 3 echo requests one way, ARP reply + 3 echo replies the other.
    assert!(report.c_to_s >= 4 && report.s_to_c >= 4, "too few frames forwarded");
    assert_eq!(report.dropped, 0);
    for s in [report.stats_c, report.stats_s] {
        assert_eq!(s.rx_outgoing_skipped + s.rx_truncated + s.rx_invalid + s.tx_oversize, 0, "{s:?}");
    }
    // A port that received its own output would bounce every broadcast (the ARP request, IPv6
    // neighbour discovery) back and forth for as long as the loop runs: thousands of frames.
    assert!(report.c_to_s + report.s_to_c < 100, "the bridge loops its own output");
    assert_eq!(report.stats_s.tx_packets, report.c_to_s);
    assert_eq!(report.stats_c.tx_packets, report.s_to_c);
    drop(guard);
}

/// Sends `frame` through `port` (bounded retry on a full ring).
fn send_one(port: &mut AfPacketPort, frame: &[u8]) {
    let pkt = Packet::from_slice(frame, Meta::default());
    let deadline = Instant::now() + LOOP_LIMIT;
    while port.send_batch(std::slice::from_ref(&pkt)).expect("send_batch") == 0 {
        assert!(Instant::now() < deadline, "TX ring never accepted the frame");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Receives on `port` until `want` accepts a frame or `wait` has passed.
fn recv_until(
    port: &mut AfPacketPort,
    pool: &PacketPool,
    wait: Duration,
    mut want: impl FnMut(&Packet) -> bool,
) -> bool {
    let deadline = Instant::now() + wait.min(LOOP_LIMIT);
    let mut batch: Batch = Vec::new();
    while Instant::now() < deadline {
        if !port.poll_readable(Duration::from_millis(50)).expect("poll") {
            continue;
        }
        port.recv_batch(pool, &mut batch, 32).expect("recv_batch");
        let found = batch.iter().any(&mut want);
        pool.recycle_batch(&mut batch);
        if found {
            return true;
        }
    }
    false
}

/// The kernel strips a VLAN tag into the ring header on receive; the port puts it back. Frames
/// longer than a ring frame are counted as truncated and dropped or delivered cut, per the
/// config. Both veth ends stay in the root namespace: a port on `b` sends, ports on `a` receive.
#[test]
fn vlan_tags_restored_and_truncated_frames_handled() {
    preflight(&["ip"]);
    let (_, ifname) = names("v");
    let mut guard = NetGuard::default();
    let (a, b) = (ifname("a"), ifname("b"));
    guard.links.push(a.clone());
    run(&[
        "ip",
        "link",
        "add",
        &a,
        "address",
        "02:00:00:79:00:01",
        "type",
        "veth",
        "peer",
        "name",
        &b,
        "address",
        "02:00:00:79:00:02",
    ]);
    for dev in [&a, &b] {
        // The host stack stays quiet on these links; ignore if IPv6 is absent.
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1");
        run(&["ip", "link", "set", dev, "up"]);
        if have_ethtool() {
            run(&["ethtool", "-K", dev, "gro", "off", "tso", "off", "gso", "off", "tx", "off"]);
        }
    }
    let (mac_a, mac_b) = ([0x02, 0x00, 0x00, 0x79, 0x00, 0x01], [0x02, 0x00, 0x00, 0x79, 0x00, 0x02]);

    let pool = PacketPool::new(64, 2048);
    let mut sender = AfPacketPort::open(&b, &RingConfig::default()).expect("open port on b");
    let mut port = AfPacketPort::open(&a, &RingConfig::default()).expect("open port on a");
    // 256-byte frames hold 190 bytes of a received frame.
    let small = RingConfig { frame_size: 256, block_size: 4096, rx_frames: 16, tx_frames: 16, ..RingConfig::default() };
    assert_eq!(small.max_rx_frame(), 190);
    let mut small_drop = AfPacketPort::open(&a, &small).expect("open small-frame port");
    let keep = RingConfig { truncated: sluice_afpacket::TruncatedFrames::Deliver, ..small };
    let mut small_keep = AfPacketPort::open(&a, &keep).expect("open small-frame port");

    // A frame tagged with VLAN 7, priority 5, is received exactly as sent.
    let payload = echo_payload(7);
    let builder = PacketBuilder::ethernet2(mac_b, mac_a)
        .single_vlan(VlanId::try_new(7).expect("vlan id"))
        .ipv4([10, 79, 7, 2], [10, 79, 7, 1], 64)
        .icmpv4_echo_request(0x7007, 1);
    let mut tagged = Vec::new();
    builder.write(&mut tagged, &payload).expect("build tagged frame");
    tagged[14] |= 5 << 5; // PCP 5 in the TCI
    send_one(&mut sender, &tagged);
    let same = recv_until(&mut port, &pool, Duration::from_secs(5), |pkt| {
        let Ok(sliced) = SlicedPacket::from_ethernet(pkt.data()) else {
            return false;
        };
        let ours = matches!(&sliced.transport, Some(TransportSlice::Icmpv4(i))
            if matches!(i.icmp_type(), Icmpv4Type::EchoRequest(e) if e.id == 0x7007));
        if ours {
            assert!(matches!(&sliced.vlan, Some(VlanSlice::SingleVlan(_))), "VLAN tag lost");
            assert_eq!(pkt.data(), &tagged[..], "tagged frame changed on the way");
        }
        ours
    });
    assert!(same, "tagged frame not received; stats {:?}", port.counters());

    // A 1042-byte frame does not fit a 256-byte ring frame.
    let mut big = Vec::from(mac_a);
    big.extend_from_slice(&mac_b);
    big.extend_from_slice(&MARKER_ETHERTYPE.to_be_bytes());
    big.extend((0..1028u32).map(|i| i as u8));
    send_one(&mut sender, &big);
    assert!(
        recv_until(&mut port, &pool, Duration::from_secs(5), |pkt| pkt.data() == &big[..]),
        "no full frame on the default port"
    );
    let cut = recv_until(&mut small_keep, &pool, Duration::from_secs(5), |pkt| pkt.data() == &big[..190]);
    assert!(cut, "the Deliver port did not deliver the cut frame; {:?}", small_keep.counters());
    assert_eq!(small_keep.counters().rx_truncated, 1);
    let got = recv_until(&mut small_drop, &pool, Duration::from_millis(500), |pkt| {
        pkt.data()[12..14] == MARKER_ETHERTYPE.to_be_bytes()
    });
    assert!(!got, "the Drop port delivered a truncated frame");
    assert_eq!(small_drop.counters().rx_truncated, 1, "{:?}", small_drop.counters());
    assert_eq!(port.counters().rx_truncated, 0);
    drop((sender, port, small_drop, small_keep));
    drop(guard);
}
