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
}

impl<'a> MemorySource<'a> {
    /// A source over `packets`.
    pub fn new(packets: &'a [Packet]) -> Self {
        MemorySource { packets, pos: 0 }
    }
}

impl Source for MemorySource<'_> {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        let end = (self.pos + max).min(self.packets.len());
        if self.pos >= end {
            return Ok(Fill::Done);
        }
        for p in &self.packets[self.pos..end] {
            out.push(pool.copy_of(p));
        }
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
