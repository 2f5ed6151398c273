//! `sluice run --bridge IF0,IF1`: two live interfaces with the chain between them, through
//! AF_PACKET rings (`--io afpacket`, the default) or AF_XDP sockets (`--io xdp`). What comes in
//! on one interface leaves by the other (in port 0 ↔ port 1).

use sluice_packet::{Batch, Packet, PacketPool};
use sluice_runtime::{Fill, RunError, Sink, Source};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Which kernel interface a bridge reads and writes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LiveIo {
    /// AF_PACKET sockets with memory-mapped TPACKET_V2 rings: any interface, no XDP needed.
    Afpacket,
    /// AF_XDP sockets: an XDP program redirects each interface's frames to a UMEM shared with
    /// Sluice (needs CAP_BPF; no other XDP program on the interfaces).
    Xdp,
}

/// What a bridge needs of a live port.
pub(crate) trait LivePort: Sized {
    /// Appends up to `max` received packets to `out`.
    fn recv(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<usize, String>;
    /// Queues leading packets of `pkts` for sending; how many it is done with.
    fn send(&mut self, pkts: &[Packet]) -> Result<usize, String>;
    /// Sleeps until one of `ports` has a frame or `timeout` passes.
    fn wait_any(ports: &[&Self], timeout: Duration) -> Result<(), String>;
    /// The interface name.
    fn name(&self) -> &str;
    /// Counters for the report: JSON, and one line of text.
    fn report(&mut self) -> (serde_json::Value, String);
}

impl LivePort for sluice_afpacket::AfPacketPort {
    fn recv(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<usize, String> {
        self.recv_batch(pool, out, max).map_err(|e| e.to_string())
    }
    fn send(&mut self, pkts: &[Packet]) -> Result<usize, String> {
        self.send_batch(pkts).map_err(|e| e.to_string())
    }
    fn wait_any(ports: &[&Self], timeout: Duration) -> Result<(), String> {
        sluice_afpacket::poll_any(ports, timeout).map(|_| ()).map_err(|e| e.to_string())
    }
    fn name(&self) -> &str {
        self.ifname()
    }
    fn report(&mut self) -> (serde_json::Value, String) {
        let s = self.stats().unwrap_or_else(|_| self.counters());
        let json = serde_json::json!({
            "io": "afpacket", "rx": s.rx_packets, "tx": s.tx_packets, "kernel_drops": s.rx_kernel_drops,
            "truncated": s.rx_truncated, "tx_ring_full": s.tx_ring_full, "tx_oversize": s.tx_oversize,
        });
        let line = format!(
            "  port {} (AF_PACKET): rx {} tx {} kernel-drops {} truncated {} tx-ring-full {}",
            self.ifname(),
            s.rx_packets,
            s.tx_packets,
            s.rx_kernel_drops,
            s.rx_truncated,
            s.tx_ring_full
        );
        (json, line)
    }
}

impl LivePort for sluice_afxdp::XdpPort {
    fn recv(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<usize, String> {
        self.recv_batch(pool, out, max).map_err(|e| e.to_string())
    }
    fn send(&mut self, pkts: &[Packet]) -> Result<usize, String> {
        self.send_batch(pkts).map_err(|e| e.to_string())
    }
    fn wait_any(ports: &[&Self], timeout: Duration) -> Result<(), String> {
        sluice_afxdp::poll_any(ports, timeout).map(|_| ()).map_err(|e| e.to_string())
    }
    fn name(&self) -> &str {
        self.ifname()
    }
    fn report(&mut self) -> (serde_json::Value, String) {
        let s = self.stats().unwrap_or_else(|_| self.counters());
        let (mode, zc) = (self.mode().to_string(), self.zero_copy());
        let json = serde_json::json!({
            "io": "xdp", "xdp_mode": mode, "zero_copy": zc, "rx": s.rx_packets, "tx": s.tx_packets,
            "kernel_drops": s.rx_dropped, "rx_ring_full": s.rx_ring_full, "tx_ring_full": s.tx_ring_full,
            "tx_oversize": s.tx_oversize,
        });
        let line = format!(
            "  port {} (AF_XDP, {mode} mode, {}): rx {} tx {} kernel-drops {} rx-ring-full {} tx-ring-full {}",
            self.ifname(),
            if zc { "zero-copy" } else { "copy" },
            s.rx_packets,
            s.tx_packets,
            s.rx_dropped,
            s.rx_ring_full,
            s.tx_ring_full
        );
        (json, line)
    }
}

/// Two live ports with a chain between them. The same object is the run's source and sink,
/// shared through `Rc<RefCell<_>>` because both run on the root thread.
pub(crate) struct Bridge<P> {
    ports: [P; 2],
    last_rx: Instant,
    /// Frames dropped because a transmit ring stayed full.
    tx_dropped: u64,
}

impl<P: LivePort> Bridge<P> {
    /// A bridge over two open ports.
    pub(crate) fn new(ports: [P; 2]) -> Self {
        Bridge { ports, last_rx: Instant::now(), tx_dropped: 0 }
    }

    /// The report's section: per-port counters (JSON and lines of text).
    pub(crate) fn report(&mut self) -> (serde_json::Value, String) {
        let mut json = serde_json::Map::new();
        let mut lines = Vec::new();
        for p in &mut self.ports {
            let (j, l) = p.report();
            json.insert(p.name().to_string(), j);
            lines.push(l);
        }
        if self.tx_dropped > 0 {
            lines.push(format!("  frames dropped on full transmit rings: {}", self.tx_dropped));
        }
        json.insert("tx_dropped".into(), self.tx_dropped.into());
        (serde_json::Value::Object(json), lines.join("\n"))
    }

    fn send(&mut self, port: usize, pkts: &[Packet]) -> Result<(), RunError> {
        let Some(p) = self.ports.get_mut(port) else { return Ok(()) };
        let mut sent = 0;
        let mut tries = 0;
        while sent < pkts.len() {
            let n = p.send(&pkts[sent..]).map_err(RunError::Sink)?;
            sent += n;
            if n == 0 {
                tries += 1;
                if tries > 100 {
                    // The kernel is not draining the ring: drop rather than stall the chain.
                    self.tx_dropped += (pkts.len() - sent) as u64;
                    return Ok(());
                }
                std::thread::sleep(Duration::from_micros(10));
            }
        }
        Ok(())
    }
}

/// The source half of a shared [`Bridge`].
pub(crate) struct BridgeSource<P>(pub(crate) Rc<RefCell<Bridge<P>>>);
/// The sink half of a shared [`Bridge`].
pub(crate) struct BridgeSink<P>(pub(crate) Rc<RefCell<Bridge<P>>>);

impl<P: LivePort> Source for BridgeSource<P> {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        let mut b = self.0.borrow_mut();
        for (i, port) in b.ports.iter_mut().enumerate() {
            let start = out.len();
            let room = max.saturating_sub(start);
            if room == 0 {
                break;
            }
            port.recv(pool, out, room).map_err(RunError::Source)?;
            for p in &mut out[start..] {
                p.meta.in_port = i as u16;
            }
        }
        if !out.is_empty() {
            b.last_rx = Instant::now();
            return Ok(Fill::Data);
        }
        // Nothing ready. Right after traffic, keep polling the rings (cheap, no syscall) for
        // low latency; once the bridge has been quiet for a while, sleep in ppoll on both.
        if b.last_rx.elapsed() > Duration::from_millis(5) {
            let [p0, p1] = &b.ports;
            P::wait_any(&[p0, p1], Duration::from_micros(500)).map_err(RunError::Source)?;
        }
        Ok(Fill::Idle)
    }
}

impl<P: LivePort> Sink for BridgeSink<P> {
    fn write(&mut self, batch: &[Packet]) -> Result<(), RunError> {
        let mut b = self.0.borrow_mut();
        // Consecutive runs of packets leaving by the same port go out in one call.
        let mut start = 0;
        while start < batch.len() {
            let port = 1 - usize::from(batch[start].meta.in_port.min(1));
            let end = batch[start..]
                .iter()
                .position(|p| 1 - usize::from(p.meta.in_port.min(1)) != port)
                .map_or(batch.len(), |k| start + k);
            b.send(port, &batch[start..end])?;
            start = end;
        }
        Ok(())
    }
}
