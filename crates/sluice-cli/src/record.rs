//! `sluice run --record DIR` and `sluice verify --recorded DIR`: a real run of the threaded
//! runtime, kept so that it can be checked against the logical chain (the record's format is
//! `sluice_coe::recorded`).

use crate::{exit, fail, load_chain, Failure};
use anyhow::Context;
use sluice_coe::compare::CompareOptions;
use sluice_coe::recorded::{clock_of, verify_recorded, RunRecord};
use sluice_io::{Precision, TraceWriter};
use sluice_packet::{Batch, Packet, PacketPool};
use sluice_runtime::{Fill, RunError, RunReport, Sink, Source};
use std::path::{Path, PathBuf};

/// The files of a record directory.
struct Files {
    chain: PathBuf,
    input: PathBuf,
    output: PathBuf,
    record: PathBuf,
}

fn files(dir: &Path) -> Files {
    Files {
        chain: dir.join("chain.yaml"),
        input: dir.join("input.pcap"),
        output: dir.join("output.pcap"),
        record: dir.join("record.json"),
    }
}

/// Keeps every packet a source gives the root, and its port, in `input.pcap`.
pub struct RecordingSource<'a> {
    inner: &'a mut dyn Source,
    writer: Option<TraceWriter>,
    ports: Vec<u16>,
}

impl Source for RecordingSource<'_> {
    fn fill(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<Fill, RunError> {
        let before = out.len();
        let fill = self.inner.fill(pool, out, max)?;
        let Some(w) = self.writer.as_mut() else { return Err(RunError::Sink("record closed".into())) };
        for p in out.iter().skip(before) {
            w.write(p.meta.ts_ns, p.data()).map_err(|e| RunError::Sink(format!("recording the input: {e}")))?;
            self.ports.push(p.meta.in_port);
        }
        Ok(fill)
    }
}

/// Keeps every output packet in `output.pcap` and its clock, then passes it on.
pub struct RecordingSink<'a> {
    inner: &'a mut dyn Sink,
    writer: Option<TraceWriter>,
    clocks: Vec<u64>,
}

impl Sink for RecordingSink<'_> {
    fn write(&mut self, batch: &[Packet]) -> Result<(), RunError> {
        let Some(w) = self.writer.as_mut() else { return Err(RunError::Sink("record closed".into())) };
        for p in batch {
            w.write(p.meta.ts_ns, p.data()).map_err(|e| RunError::Sink(format!("recording the output: {e}")))?;
            self.clocks.push(clock_of(p));
        }
        self.inner.write(batch)
    }

    fn finish(&mut self) -> Result<(), RunError> {
        if let Some(w) = self.writer.take() {
            w.finish().map_err(|e| RunError::Sink(format!("recording the output: {e}")))?;
        }
        self.inner.finish()
    }
}

/// A record being made in `dir`.
pub struct Recorder {
    dir: PathBuf,
    closed_loop: bool,
}

impl Recorder {
    /// Creates `dir` (it must not hold a record already) and copies the chain file into it.
    pub fn create(dir: &Path, chain_file: &Path) -> Result<Recorder, Failure> {
        let f = files(dir);
        if f.record.exists() {
            return Err(fail(exit::INVALID)(anyhow::anyhow!(
                "{} already holds a record; give an empty or new directory",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::copy(chain_file, &f.chain).with_context(|| format!("copying the chain into {}", dir.display()))?;
        Ok(Recorder { dir: dir.to_path_buf(), closed_loop: false })
    }

    /// The run's input answers what it sends (a live bridge): `verify` translates the
    /// physical chain's choices in it (`RunRecord::closed_loop`).
    pub fn closed_loop(self, closed_loop: bool) -> Recorder {
        Recorder { closed_loop, ..self }
    }

    /// Wraps the run's source and sink.
    pub fn wrap<'a>(
        &self,
        source: &'a mut dyn Source,
        sink: &'a mut dyn Sink,
    ) -> Result<(RecordingSource<'a>, RecordingSink<'a>), Failure> {
        let f = files(&self.dir);
        let open =
            |p: &Path| TraceWriter::create(p, Precision::Nano).with_context(|| format!("creating {}", p.display()));
        Ok((
            RecordingSource { inner: source, writer: Some(open(&f.input)?), ports: Vec::new() },
            RecordingSink { inner: sink, writer: Some(open(&f.output)?), clocks: Vec::new() },
        ))
    }

    /// Writes `record.json` once the run is over.
    pub fn finish(
        self,
        report: &RunReport,
        source: RecordingSource<'_>,
        sink: RecordingSink<'_>,
    ) -> Result<(), Failure> {
        let f = files(&self.dir);
        if let Some(w) = source.writer {
            w.finish().with_context(|| format!("writing {}", f.input.display()))?;
        }
        let Some(rec) = report.recording.as_ref() else {
            return Err(fail(exit::FAILED)(anyhow::anyhow!("the run kept no record")));
        };
        let ports = if source.ports.iter().all(|p| *p == 0) { Vec::new() } else { source.ports };
        let mut record = RunRecord::new(&report.chain, rec, &report.events, sink.clocks, ports);
        record.closed_loop = self.closed_loop;
        let text = serde_json::to_string(&record).context("serialising the record")?;
        std::fs::write(&f.record, text + "\n").with_context(|| format!("writing {}", f.record.display()))?;
        Ok(())
    }
}

/// Writes the part of a spread run that a node without the root recorded (`record.json` with
/// the node's name, beside the chain): its instances' drops and events, its vertices' state.
pub fn write_part(dir: &Path, node: &str, report: &RunReport) -> Result<(), Failure> {
    let f = files(dir);
    let Some(rec) = report.recording.as_ref() else {
        return Err(fail(exit::FAILED)(anyhow::anyhow!("the run kept no record")));
    };
    let mut record = RunRecord::new(&report.chain, rec, &report.events, Vec::new(), Vec::new());
    record.part = Some(node.to_string());
    let text = serde_json::to_string(&record).context("serialising the record")?;
    std::fs::write(&f.record, text + "\n").with_context(|| format!("writing {}", f.record.display()))?;
    Ok(())
}

fn read_record(dir: &Path) -> Result<RunRecord, Failure> {
    let f = files(dir);
    let text = std::fs::read_to_string(&f.record).with_context(|| format!("reading {}", f.record.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a run record", f.record.display()))
        .map_err(fail(exit::INVALID))
}

/// `sluice verify --recorded DIR [--part DIR]...`.
pub fn verify_dir(dir: &Path, parts: &[PathBuf], json: bool) -> Result<bool, Failure> {
    let f = files(dir);
    let chain = load_chain(&f.chain)?;
    let mut record = read_record(dir)?;
    if let Some(node) = &record.part {
        return Err(fail(exit::INVALID)(anyhow::anyhow!(
            "{} holds node `{node}`'s part of a spread run: give the root's node's record to --recorded and this one to --part",
            dir.display()
        )));
    }
    for p in parts {
        record
            .merge_part(read_record(p)?)
            .with_context(|| format!("folding in the part in {}", p.display()))
            .map_err(fail(exit::INVALID))?;
    }
    let mut inputs = sluice_io::load(&f.input, None)
        .with_context(|| format!("reading {}", f.input.display()))
        .map_err(fail(exit::BAD_INPUT))?;
    record.restore_ports(&mut inputs);
    let outputs = sluice_io::load(&f.output, None)
        .with_context(|| format!("reading {}", f.output.display()))
        .map_err(fail(exit::BAD_INPUT))?
        .into_iter()
        .map(|p| p.data().to_vec())
        .collect();
    let registry = sluice_nfs::registry();
    let verdict = verify_recorded(&chain, &registry, &record, &inputs, outputs, &CompareOptions::default())
        .with_context(|| format!("verifying the record in {}", dir.display()))
        .map_err(fail(exit::INVALID))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&verdict).context("serialising the verdict")?);
    } else {
        print!("{}", verdict.render());
    }
    Ok(verdict.equivalent)
}
