//! `sluice run --record DIR` and `sluice verify --recorded DIR`: a real run of the threaded
//! runtime, kept so that it can be checked against the logical chain (the record's format is
//! `sluice_coe::recorded`).

use crate::{exit, fail, load_chain, Failure};
use anyhow::Context;
use sluice_coe::compare::CompareOptions;
use sluice_coe::recorded::{clock_of, verify_recorded, JournalLine, RecordedDrop, RecordedEvent, RunRecord};
use sluice_io::{Precision, TraceWriter};
use sluice_packet::{Batch, Packet, PacketPool};
use sluice_runtime::record::RecordJournal;
use sluice_runtime::{Fill, RunError, RunReport, Sink, Source};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The files of a record directory.
struct Files {
    chain: PathBuf,
    input: PathBuf,
    output: PathBuf,
    record: PathBuf,
    journal: PathBuf,
}

fn files(dir: &Path) -> Files {
    Files {
        chain: dir.join("chain.yaml"),
        input: dir.join("input.pcap"),
        output: dir.join("output.pcap"),
        record: dir.join("record.json"),
        journal: dir.join("journal.jsonl"),
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

/// A node's journal (`journal.jsonl`): each drop and event written as it happens, one line
/// per `write`, so that what the node wrote survives its process.
pub struct JournalFile {
    file: Mutex<(std::fs::File, Vec<u8>)>,
    /// The first write that failed, reported when the part is written.
    failed: Mutex<Option<String>>,
}

impl JournalFile {
    /// Creates `dir`'s journal for `node` of chain `chain`.
    pub fn create(dir: &Path, chain: &str, node: &str) -> Result<JournalFile, Failure> {
        let path = files(dir).journal;
        let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let j = JournalFile { file: Mutex::new((file, Vec::new())), failed: Mutex::new(None) };
        j.write(&JournalLine::Node { chain: chain.to_string(), node: node.to_string() });
        if let Some(e) = j.failure() {
            return Err(fail(exit::FAILED)(anyhow::anyhow!("writing {}: {e}", path.display())));
        }
        Ok(j)
    }

    fn write(&self, line: &JournalLine) {
        let mut guard = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (file, buf) = &mut *guard;
        buf.clear();
        let written = serde_json::to_writer(&mut *buf, line).map_err(|e| e.to_string()).and_then(|()| {
            buf.push(b'\n');
            file.write_all(buf).map_err(|e| e.to_string())
        });
        if let Err(e) = written {
            self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(e);
        }
    }

    /// The first write that failed.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl RecordJournal for JournalFile {
    fn dropped(&self, clock: sluice_packet::Clock, vertex: &str, reason: &'static str) {
        self.write(&JournalLine::Drop(RecordedDrop {
            clock: clock.0,
            vertex: vertex.to_string(),
            reason: reason.into(),
        }));
    }

    fn decided(&self, event: &sluice_nf::Event) {
        self.write(&JournalLine::Event(RecordedEvent::from(event)));
    }
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
        let pf = files(p);
        if !pf.record.exists() && pf.journal.exists() {
            // The node was killed before it wrote its part: what it journaled as it went.
            let text =
                std::fs::read_to_string(&pf.journal).with_context(|| format!("reading {}", pf.journal.display()))?;
            let node = record
                .merge_journal(&text)
                .with_context(|| format!("folding in the journal in {}", p.display()))
                .map_err(fail(exit::INVALID))?;
            eprintln!("node `{node}` did not finish its part ({}): its journal folded in", p.display());
            continue;
        }
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
