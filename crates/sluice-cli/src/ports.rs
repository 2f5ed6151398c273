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
            // Paced replay: hand over what is due; a packet not due yet waits here. With
            // nothing to hand over, the source spins for a packet due within the pacer's spin
            // threshold and otherwise says it is idle: the root thread, which also sees packets
            // out of the chain, must not sleep until the next packet is due (at a few hundred
            // packets a second, output waited for the next input: a 2.6 ms median latency).
            if let Some(due) = self.pacer.due(pkt.meta.ts_ns) {
                let now = std::time::Instant::now();
                if due > now {
                    if !out.is_empty() {
                        self.pending = Some(pkt);
                        return Ok(Fill::Data);
                    }
                    if due - now > sluice_io::replay::SPIN_THRESHOLD {
                        self.pending = Some(pkt);
                        return Ok(Fill::Idle);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A paced trace with nothing due says so at once instead of blocking until its next
    /// packet is due: the root thread calling it also takes the chain's output, which would
    /// otherwise wait as long as the gap before the next input.
    #[test]
    fn a_paced_trace_is_idle_until_its_next_packet_is_due() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("two.pcap");
        let frame = [0u8; 60]; // the source does not look into frames
        let mut w = TraceWriter::create(&path, Precision::Micro).expect("create");
        w.write(0, &frame).expect("write");
        w.write(300_000_000, &frame).expect("write"); // 0.3 s later
        w.finish().expect("finish");
        let reader = TraceReader::open(&path).expect("open");
        let mut src = TraceSource::new(reader, Pace::Recorded { speed: 1.0 }, None);
        let pool = PacketPool::new(8, 2048);
        let mut out = Batch::new();
        assert!(matches!(src.fill(&pool, &mut out, 8), Ok(Fill::Data)));
        assert_eq!(out.len(), 1, "the first packet is due at once");
        out.clear();
        let asked = std::time::Instant::now();
        assert!(matches!(src.fill(&pool, &mut out, 8), Ok(Fill::Idle)), "the second is not due");
        assert!(out.is_empty());
        let waited = asked.elapsed();
        std::thread::sleep(std::time::Duration::from_millis(300).saturating_sub(waited));
        let mut filled = Fill::Idle;
        while matches!(filled, Fill::Idle) {
            filled = src.fill(&pool, &mut out, 8).expect("fill");
        }
        assert!(matches!(filled, Fill::Data) && out.len() == 1, "the second once due");
        out.clear();
        assert!(matches!(src.fill(&pool, &mut out, 8), Ok(Fill::Done)));
    }
}
