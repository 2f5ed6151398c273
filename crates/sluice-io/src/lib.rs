//! Trace input and output for Sluice.
//!
//! - [`pcap`]: a streaming reader of classic pcap (microsecond and nanosecond, both byte orders)
//!   and pcapng files ([`TraceReader`], [`load`]) and a classic pcap writer ([`TraceWriter`]).
//!   Only Ethernet captures are accepted.
//! - [`gen`]: a seeded, deterministic generator of synthetic TCP traffic (the StatelessNF
//!   `long`, `short` and `mixed` workloads, and custom small ones), streaming with bounded memory.
//! - [`demo`]: the generator's `demo` workload, background traffic with a planted port scan,
//!   Trojan signature and decoys, and the constants naming the planted hosts.
//! - [`replay`]: a [`Pacer`] releasing packets at full speed or at their recorded pace.
//! - [`inspect`]: [`summarize`] a trace (packets, bytes, flows, protocols, bad packets, times).
//!
//! Every fallible operation returns an [`IoError`] naming the file and, for packet records, the
//! record number. Nothing derived from file content can make this crate panic.

#![warn(missing_docs)]

pub mod demo;
mod error;
pub mod gen;
pub mod inspect;
pub mod pcap;
pub mod replay;

pub use error::IoError;
pub use gen::{generate, FrameSize, GenConfig, Generator, Workload};
pub use inspect::{summarize, ProtoCounts, TraceSummary};
pub use pcap::{load, Precision, TraceFormat, TraceReader, TraceRecord, TraceWriter};
pub use replay::{Pace, Pacer};
