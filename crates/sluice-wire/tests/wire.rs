//! Sluice's datagrams on real sockets and as tools see them: a batch over loopback arrives
//! whole and decodes to what was sent, tcpdump reads a capture of them as Geneve carrying the
//! original packets, and the ports (`Sender`, `Receiver`) carry packets with their metadata and
//! count what is malformed, for another chain, lost or late.

use sluice_packet::{Clock, InstanceId, LabelId, MetaFlags, Packet};
use sluice_wire::geneve::{capture_frame, source_port};
use sluice_wire::{decode, encode, RecvBatch, UdpLink, GENEVE_PORT};
use std::net::{SocketAddr, SocketAddrV4};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The first `n` packets of the bundled demo trace.
fn demo_packets(n: usize) -> Vec<Packet> {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/demo.pcap");
    let mut packets = sluice_io::load(&trace, Some(n)).expect("traces/demo.pcap");
    for (i, p) in packets.iter_mut().enumerate() {
        p.meta.clock = Clock::new(1, i as u64 + 1);
        p.meta.xor = i as u64 * 7;
        if i % 5 == 0 {
            p.meta.flags.insert(MetaFlags::REPLAYED);
            p.meta.target = Some(InstanceId::new(2, 0));
        }
        p.meta.labels.set(LabelId(1), i as u32);
    }
    packets
}

fn datagrams(packets: &[Packet]) -> Vec<Vec<u8>> {
    packets
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut d = Vec::new();
            encode(&p.meta, InstanceId::new(1, (i % 3) as u16), 9, p.data(), &mut d).expect("encode");
            d
        })
        .collect()
}

#[test]
fn a_batch_over_loopback_arrives_and_decodes_to_what_was_sent() {
    let packets = demo_packets(150);
    let grams = datagrams(&packets);
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let rx = UdpLink::bind(any, Some(Duration::from_secs(5))).expect("receiver");
    let tx = UdpLink::bind(any, None).expect("sender");
    let to = rx.local_addr().expect("receiver address");
    let refs: Vec<&[u8]> = grams.iter().map(Vec::as_slice).collect();
    // More than one system call's worth: the link splits the batch.
    assert_eq!(tx.send_batch(to, &refs).expect("send"), grams.len());
    let mut batch = RecvBatch::new(64, 2048);
    let mut got: Vec<Vec<u8>> = Vec::new();
    while got.len() < grams.len() {
        let n = rx.recv_batch(&mut batch).expect("receive");
        assert!(n > 0, "timed out after {} of {} datagrams", got.len(), grams.len());
        assert_eq!(n, batch.iter().count());
        for (d, from) in batch.iter() {
            assert_eq!(from, tx.local_addr().ok());
            got.push(d.to_vec());
        }
    }
    // Loopback keeps order; every datagram decodes to the packet and metadata sent.
    for (i, (d, p)) in got.iter().zip(&packets).enumerate() {
        let dec = decode(d).expect("decode");
        assert_eq!(dec.meta, p.meta, "packet {i}");
        assert_eq!(dec.frame, p.data(), "packet {i}");
        assert_eq!(dec.dest, InstanceId::new(1, (i % 3) as u16));
        assert_eq!(dec.vni, 9);
    }
    assert_eq!(batch.truncated(), 0);
}

#[test]
fn an_empty_wait_times_out_with_nothing() {
    let rx = UdpLink::bind("127.0.0.1:0".parse().expect("address"), Some(Duration::from_millis(50))).expect("rx");
    let mut batch = RecvBatch::new(8, 2048);
    assert_eq!(rx.recv_batch(&mut batch).expect("receive"), 0);
    assert!(batch.is_empty());
}

#[test]
fn a_datagram_larger_than_the_buffer_is_counted_not_returned() {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let rx = UdpLink::bind(any, Some(Duration::from_secs(5))).expect("rx");
    let tx = UdpLink::bind(any, None).expect("tx");
    let big = vec![0u8; 600];
    let small = vec![1u8; 100];
    tx.send_batch(rx.local_addr().expect("addr"), &[&big, &small]).expect("send");
    let mut batch = RecvBatch::new(8, 256);
    let mut seen = Vec::new();
    while seen.is_empty() {
        assert!(rx.recv_batch(&mut batch).expect("receive") <= 1);
        seen.extend(batch.iter().map(|(d, _)| d.to_vec()));
    }
    assert_eq!(seen, vec![small]);
    assert_eq!(batch.truncated(), 1);
}

#[test]
fn tcpdump_reads_a_capture_as_geneve_around_the_original_packets() {
    let Some(tcpdump) = ["/usr/bin/tcpdump", "/usr/sbin/tcpdump"].into_iter().find(|p| Path::new(p).exists()) else {
        panic!("tcpdump is not installed: run the suite through scripts/test-all.sh, which installs it");
    };
    let packets = demo_packets(20);
    let grams = datagrams(&packets);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("between-nodes.pcap");
    let mut w = sluice_io::TraceWriter::create(&file, sluice_io::Precision::Micro).expect("pcap");
    for (p, d) in packets.iter().zip(&grams) {
        let src = SocketAddrV4::new([192, 0, 2, 1].into(), source_port(p));
        let dst = SocketAddrV4::new([192, 0, 2, 2].into(), GENEVE_PORT);
        w.write(p.meta.ts_ns, &capture_frame(src, dst, d).expect("frame")).expect("write");
    }
    assert_eq!(w.finish().expect("finish"), 20);
    let out = Command::new(tcpdump).args(["-nn", "-v", "-r"]).arg(&file).output().expect("run tcpdump");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let geneve = text.lines().filter(|l| l.contains("Geneve")).count();
    assert_eq!(geneve, 20, "every frame decodes as Geneve:\n{text}");
    assert!(text.contains("vni 0x9"), "{text}");
    assert!(text.contains("class Experimental (0xfff0) type 0x81(C) len 28"), "Sluice's packet option:\n{text}");
    // The inner packets follow, with their own addresses.
    let inner = packets[0].tuple().expect("an IP packet");
    assert!(text.contains(&inner.src.to_string()), "inner source {}:\n{text}", inner.src);
}

/// A receiver on a free loopback port for chain `vni`.
fn receiver(vni: u32) -> sluice_wire::Receiver {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    sluice_wire::Receiver::bind(any, vni, Duration::from_millis(300), 1514).expect("receiver")
}

/// Everything `rx` hands on until a receive times out: (destination, packet).
fn drain(rx: &mut sluice_wire::Receiver) -> Vec<(InstanceId, Packet)> {
    let mut got = Vec::new();
    while rx.recv(|d| got.push((d.dest, Packet::from_slice(d.frame, d.meta)))).expect("receive") > 0 {}
    got
}

#[test]
fn a_sender_and_a_receiver_carry_packets_with_their_metadata() {
    let packets = demo_packets(300);
    let mut rx = receiver(7);
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let to = rx.local_addr().expect("address");
    let mut tx = sluice_wire::Sender::new(any, to, 7).expect("sender");
    // Several batches, each more than one system call's worth.
    for chunk in packets.chunks(100) {
        tx.send(chunk, sluice_wire::TO_ROOT).expect("send");
    }
    let got = drain(&mut rx);
    assert_eq!(got.len(), packets.len(), "{:?}", rx.stats());
    for ((dest, p), sent) in got.iter().zip(&packets) {
        assert_eq!(*dest, sluice_wire::TO_ROOT);
        assert_eq!(p.data(), sent.data());
        assert_eq!(p.meta, sent.meta);
    }
    assert_eq!(tx.stats().datagrams, 300);
    let s = rx.stats();
    assert_eq!((s.accepted, s.malformed, s.lost, s.late, s.other_vni), (300, 0, 0, 0, 0), "{s:?}");
}

#[test]
fn a_receiver_counts_and_drops_what_is_not_for_it() {
    let packets = demo_packets(10);
    let mut rx = receiver(7);
    let to = rx.local_addr().expect("address");
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let raw = UdpLink::bind(any, None).expect("socket");
    let numbered = |seq: u64, vni: u32| {
        let mut d = Vec::new();
        sluice_wire::encode_sequenced(&packets[0].meta, InstanceId(3), vni, Some(seq), packets[0].data(), &mut d)
            .expect("encode");
        d
    };
    let (first, skipped_two, late, other_chain) = (numbered(0, 7), numbered(3, 7), numbered(1, 7), numbered(4, 9));
    let garbage = b"not geneve at all".to_vec();
    let mut control = first.clone();
    control[1] |= 0x80;
    let grams: Vec<&[u8]> = vec![&first, &garbage, &skipped_two, &control, &late, &other_chain];
    raw.send_batch(to, &grams).expect("send");
    let got = drain(&mut rx);
    assert_eq!(got.len(), 3, "the three datagrams of chain 7 that decode");
    assert!(got.iter().all(|(d, _)| *d == InstanceId(3)));
    let s = rx.stats();
    assert_eq!(s.malformed, 2, "garbage and a Geneve control message: {s:?}");
    assert_eq!(s.other_vni, 1, "{s:?}");
    // 0, then 3 (1 and 2 missing), then 1 after all: one lost, one late.
    assert_eq!((s.lost, s.late), (1, 1), "{s:?}");
    assert!(s.last_error.as_deref().is_some_and(|e| e.contains("control")), "{s:?}");
}

#[test]
fn the_link_benchmark_runs_and_measures_every_round_trip() {
    // A smoke run of `examples/linkbench` (no timing assertion): every round trip completes.
    for batch in [1, 32] {
        let times = sluice_wire::port::round_trips(50, batch, 64).expect("round trips");
        assert_eq!(times.len(), 50);
        assert!(times.iter().all(|t| !t.is_zero()), "batch {batch}: {times:?}");
    }
}

/// Equal-sized datagrams with a few of other sizes among them, each carrying its number.
fn numbered(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let size = if i % 97 == 13 { 40 + i % 50 } else { 120 };
            let mut d = vec![(i % 251) as u8; size];
            d[..4].copy_from_slice(&(i as u32).to_be_bytes());
            d
        })
        .collect()
}

#[test]
fn runs_of_equal_datagrams_go_through_the_kernel_as_one_and_arrive_whole_and_in_order() {
    let grams = numbered(2_000);
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let rx = UdpLink::bind(any, Some(Duration::from_secs(5))).expect("receiver");
    let tx = UdpLink::bind(any, None).expect("sender");
    let to = rx.local_addr().expect("receiver address");
    let refs: Vec<&[u8]> = grams.iter().map(Vec::as_slice).collect();
    let mut batch = RecvBatch::new(64, 2048);
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut receives = 0;
    // In slices the socket's buffer holds.
    for part in refs.chunks(250) {
        assert_eq!(tx.send_batch(to, part).expect("send"), part.len());
        let want = got.len() + part.len();
        while got.len() < want {
            let n = rx.recv_batch(&mut batch).expect("receive");
            assert!(n > 0, "timed out after {} of {} datagrams", got.len(), grams.len());
            receives += 1;
            got.extend(batch.iter().map(|(d, _)| d.to_vec()));
        }
    }
    assert_eq!(got, grams, "every datagram, whole, in order");
    assert_eq!(batch.truncated(), 0);
    if rx.takes_runs() {
        // 2,000 datagrams in 8 sends: runs arrived in one buffer each, not one per datagram.
        assert!(receives < 100, "{receives} receives for {} datagrams", grams.len());
    }
}

#[test]
fn a_receiver_without_gro_gets_the_runs_one_datagram_at_a_time() {
    let grams = numbered(300);
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("plain receiver");
    rx.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let tx = UdpLink::bind("127.0.0.1:0".parse().expect("address"), None).expect("sender");
    let refs: Vec<&[u8]> = grams.iter().map(Vec::as_slice).collect();
    let mut buf = [0u8; 2048];
    // In slices the socket's buffer holds.
    for (c, part) in refs.chunks(100).enumerate() {
        assert_eq!(tx.send_batch(rx.local_addr().expect("address"), part).expect("send"), part.len());
        for (j, want) in part.iter().enumerate() {
            let i = c * 100 + j;
            let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("datagram {i}: {e}"));
            assert_eq!(&buf[..n], *want, "datagram {i}");
        }
    }
}
