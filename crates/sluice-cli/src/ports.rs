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
}

impl TraceSource {
    /// A source over `reader`, stopping after `limit` packets if given.
    pub fn new(reader: TraceReader, pace: Pace, limit: Option<u64>) -> TraceSource {
        TraceSource { reader, pacer: Pacer::new(pace), limit, read: 0 }
    }
}

impl Source for TraceSource {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        for _ in 0..max {
            if self.limit.is_some_and(|l| self.read >= l) {
                return Ok(if out.is_empty() { Fill::Done } else { Fill::Data });
            }
            let Some(rec) = self.reader.next_record().map_err(|e| RunError::Source(e.to_string()))? else {
                return Ok(if out.is_empty() { Fill::Done } else { Fill::Data });
            };
            // Paced replay: wait for this packet's time, but hand over what is ready first.
            if !self.pacer.is_full_speed() {
                if let Some(due) = self.pacer.due(rec.ts_ns) {
                    if due > std::time::Instant::now() && !out.is_empty() {
                        let p = pool.packet(rec.data, Meta { ts_ns: rec.ts_ns, ..Meta::default() });
                        out.push(p);
                        self.read += 1;
                        return Ok(Fill::Data);
                    }
                }
                self.pacer.wait(rec.ts_ns);
            }
            out.push(pool.packet(rec.data, Meta { ts_ns: rec.ts_ns, ..Meta::default() }));
            self.read += 1;
        }
        Ok(Fill::Data)
    }
}

/// Feeds generated traffic straight into the chain.
pub struct GenSource {
    gen: Generator,
}

impl GenSource {
    /// A source over `gen`.
    pub fn new(gen: Generator) -> GenSource {
        GenSource { gen }
    }
}

impl Source for GenSource {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        for _ in 0..max {
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
