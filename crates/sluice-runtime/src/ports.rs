//! Where a run's packets come from and go to: the [`Source`] and [`Sink`] traits, and the
//! sources and sinks over memory that tests and benchmarks use (files, the generator and live
//! interfaces implement them in `sluice-cli`).

use crate::exec::RunError;
use sluice_packet::{Batch, Packet, PacketPool};

/// What a source produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Packets were added (possibly zero for a live source between bursts).
    Data,
    /// Nothing now; try again later. A live source waits efficiently itself (e.g. in poll)
    /// before saying so; the root only yields the CPU and calls again.
    Idle,
    /// No more input.
    Done,
}

/// Where packets come from.
pub trait Source {
    /// Appends up to `max` packets (allocated from `pool`) to `out`.
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError>;
}

/// Where packets go.
pub trait Sink {
    /// Takes a batch of output packets (they are recycled afterwards).
    fn write(&mut self, batch: &[Packet]) -> Result<(), RunError>;
    /// Flushes at the end of the run.
    fn finish(&mut self) -> Result<(), RunError> {
        Ok(())
    }
}

/// A source over packets held in memory (copied into pool buffers as they are admitted, so
/// the originals can be replayed again).
pub struct MemorySource<'a> {
    packets: &'a [Packet],
    pos: usize,
    /// With a fixed rate: packets per second, and when the first one was due.
    rate: Option<(f64, Option<std::time::Instant>)>,
}

impl<'a> MemorySource<'a> {
    /// A source over `packets`, as fast as the chain takes them.
    pub fn new(packets: &'a [Packet]) -> Self {
        MemorySource { packets, pos: 0, rate: None }
    }

    /// The first `n` packets it will give (for a compiler's sample), whatever it gave so far.
    pub fn sample(&self, n: usize) -> &'a [Packet] {
        &self.packets[..n.min(self.packets.len())]
    }

    /// A source over `packets` at `pps` packets per second (open loop: packet `i` is due `i /
    /// pps` seconds after the first read, whether or not the chain keeps up).
    pub fn with_rate(packets: &'a [Packet], pps: f64) -> Self {
        MemorySource { packets, pos: 0, rate: (pps > 0.0).then_some((pps, None)) }
    }
}

impl Source for MemorySource<'_> {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        let mut end = (self.pos + max).min(self.packets.len());
        if self.pos >= end {
            return Ok(Fill::Done);
        }
        if let Some((pps, start)) = &mut self.rate {
            let start = *start.get_or_insert_with(std::time::Instant::now);
            let due = (start.elapsed().as_secs_f64() * *pps) as usize + 1;
            end = end.min(due);
            if end <= self.pos {
                return Ok(Fill::Idle);
            }
        }
        pool.copy_all(&self.packets[self.pos..end], out);
        self.pos = end;
        Ok(Fill::Data)
    }
}

/// A sink that discards everything.
pub struct DiscardSink;

impl Sink for DiscardSink {
    fn write(&mut self, _batch: &[Packet]) -> Result<(), RunError> {
        Ok(())
    }
}

/// A sink that keeps copies of the output packets (for tests and comparisons).
#[derive(Default)]
pub struct CollectSink {
    /// Packets in output order.
    pub packets: Vec<Packet>,
}

impl Sink for CollectSink {
    fn write(&mut self, batch: &[Packet]) -> Result<(), RunError> {
        self.packets.extend_from_slice(batch);
        Ok(())
    }
}
