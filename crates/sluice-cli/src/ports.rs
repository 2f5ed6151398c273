//! Sources and sinks the CLI connects to a run: trace files, the generator, pcap output.

use sluice_io::{Generator, Pace, Pacer, Precision, TraceReader, TraceWriter};
use sluice_packet::{Batch, Meta, Packet, PacketPool};
use sluice_runtime::{Fill, RunError, Sink, Source};

/// Reads a pcap/pcapng file, at full speed or at the recorded pace.
pub struct TraceSource {
    reader: TraceReader,
    pacer: Pacer,
    limit: Option<u64>,
    read: u64,
    /// Paced: the next packet, read but not due yet.
    pending: Option<Packet>,
}

impl TraceSource {
    /// A source over `reader`, stopping after `limit` packets if given.
    pub fn new(reader: TraceReader, pace: Pace, limit: Option<u64>) -> TraceSource {
        TraceSource { reader, pacer: Pacer::new(pace), limit, read: 0, pending: None }
    }
}

impl Source for TraceSource {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        let ended = |out: &Batch| Ok(if out.is_empty() { Fill::Done } else { Fill::Data });
        for _ in 0..max {
            if self.limit.is_some_and(|l| self.read >= l) {
                return ended(out);
            }
            let pkt = match self.pending.take() {
                Some(p) => p,
                None => match self.reader.next_record().map_err(|e| RunError::Source(e.to_string()))? {
                    Some(rec) => pool.packet(rec.data, Meta { ts_ns: rec.ts_ns, ..Meta::default() }),
                    None => return ended(out),
                },
            };
            // Paced replay: hand over what is due; a packet not due yet waits here (or, when
            // nothing is ready to hand over, the source waits for it).
            if let Some(due) = self.pacer.due(pkt.meta.ts_ns) {
                if due > std::time::Instant::now() {
                    if !out.is_empty() {
                        self.pending = Some(pkt);
                        return Ok(Fill::Data);
                    }
                    self.pacer.wait(pkt.meta.ts_ns);
                }
            }
            out.push(pkt);
            self.read += 1;
        }
        Ok(Fill::Data)
    }
}

/// Feeds generated traffic straight into the chain.
pub struct GenSource {
    gen: Generator,
    /// Packets still to give (`--limit`).
    left: u64,
}

impl GenSource {
    /// A source over `gen`, ending after `limit` packets if given.
    pub fn new(gen: Generator, limit: Option<u64>) -> GenSource {
        GenSource { gen, left: limit.unwrap_or(u64::MAX) }
    }
}

impl Source for GenSource {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        for _ in 0..max {
            if self.left == 0 {
                return Ok(if out.is_empty() { Fill::Done } else { Fill::Data });
            }
            self.left -= 1;
            match self.gen.next() {
                Some((ts_ns, frame)) => out.push(pool.packet(&frame, Meta { ts_ns, ..Meta::default() })),
                None => return Ok(if out.is_empty() { Fill::Done } else { Fill::Data }),
            }
        }
        Ok(Fill::Data)
    }
}

/// Writes output packets to a classic pcap file, keeping their capture timestamps.
pub struct PcapSink {
    writer: Option<TraceWriter>,
}

impl PcapSink {
    /// A sink writing to `writer`.
    pub fn new(writer: TraceWriter) -> PcapSink {
        PcapSink { writer: Some(writer) }
    }
    /// Creates `path` with the given timestamp precision.
    pub fn create(path: &std::path::Path, precision: Precision) -> Result<PcapSink, sluice_io::IoError> {
        Ok(PcapSink::new(TraceWriter::create(path, precision)?))
    }
}

impl Sink for PcapSink {
    fn write(&mut self, batch: &[Packet]) -> Result<(), RunError> {
        let Some(w) = self.writer.as_mut() else { return Err(RunError::Sink("output already closed".into())) };
        for p in batch {
            w.write(p.meta.ts_ns, p.data()).map_err(|e| RunError::Sink(e.to_string()))?;
        }
        Ok(())
    }
    fn finish(&mut self) -> Result<(), RunError> {
        match self.writer.take() {
            Some(w) => w.finish().map(|_| ()).map_err(|e| RunError::Sink(e.to_string())),
            None => Ok(()),
        }
    }
}

/// Two live interfaces with a chain between them: what comes in on one goes out on the other
/// (in port 0 ↔ in port 1). The same object is the run's source and sink, shared through
/// `Rc<RefCell<_>>` because both run on the root thread.
pub struct Bridge {
    ports: [sluice_afpacket::AfPacketPort; 2],
    last_rx: std::time::Instant,
    /// Frames dropped because a transmit ring stayed full.
    pub tx_dropped: u64,
}

impl Bridge {
    /// Opens both interfaces.
    pub fn open(a: &str, b: &str) -> Result<Bridge, sluice_afpacket::AfPacketError> {
        let cfg = sluice_afpacket::RingConfig::default();
        Ok(Bridge {
            ports: [sluice_afpacket::AfPacketPort::open(a, &cfg)?, sluice_afpacket::AfPacketPort::open(b, &cfg)?],
            last_rx: std::time::Instant::now(),
            tx_dropped: 0,
        })
    }

    /// Per-port counters, for the report.
    pub fn stats(&mut self) -> Vec<(String, sluice_afpacket::PortStats)> {
        self.ports.iter_mut().map(|p| (p.ifname().to_string(), p.stats().unwrap_or_else(|_| p.counters()))).collect()
    }

    fn send(&mut self, port: usize, pkts: &[Packet]) -> Result<(), RunError> {
        let Some(p) = self.ports.get_mut(port) else { return Ok(()) };
        let mut sent = 0;
        let mut tries = 0;
        while sent < pkts.len() {
            let n = p.send_batch(&pkts[sent..]).map_err(|e| RunError::Sink(e.to_string()))?;
            sent += n;
            if n == 0 {
                tries += 1;
                if tries > 100 {
                    // The kernel is not draining the ring: drop rather than stall the chain.
                    self.tx_dropped += (pkts.len() - sent) as u64;
                    return Ok(());
                }
                std::thread::sleep(std::time::Duration::from_micros(10));
            }
        }
        Ok(())
    }
}

/// The source half of a shared [`Bridge`].
pub struct BridgeSource(pub std::rc::Rc<std::cell::RefCell<Bridge>>);
/// The sink half of a shared [`Bridge`].
pub struct BridgeSink(pub std::rc::Rc<std::cell::RefCell<Bridge>>);

impl Source for BridgeSource {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        let mut b = self.0.borrow_mut();
        for (i, port) in b.ports.iter_mut().enumerate() {
            let start = out.len();
            let room = max.saturating_sub(start);
            if room == 0 {
                break;
            }
            port.recv_batch(pool, out, room).map_err(|e| RunError::Source(e.to_string()))?;
            for p in &mut out[start..] {
                p.meta.in_port = i as u16;
            }
        }
        if !out.is_empty() {
            b.last_rx = std::time::Instant::now();
            return Ok(Fill::Data);
        }
        // Nothing ready. Right after traffic, keep polling the rings (cheap, no syscall) for
        // low latency; once the bridge has been quiet for a while, sleep in ppoll on both.
        if b.last_rx.elapsed() > std::time::Duration::from_millis(5) {
            let [p0, p1] = &b.ports;
            sluice_afpacket::poll_any(&[p0, p1], std::time::Duration::from_micros(500))
                .map_err(|e| RunError::Source(e.to_string()))?;
        }
        Ok(Fill::Idle)
    }
}

impl Sink for BridgeSink {
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
