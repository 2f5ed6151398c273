//! Regression files: a minimal failing run as a schedule file whose `run:` section names the
//! chain, the trace and the engine options, with a header saying how to reproduce it.

use crate::schedule::FaultSchedule;
use std::path::{Component, Path, PathBuf};

/// What the header of a regression file says.
#[derive(Debug, Clone)]
pub struct RegressionHeader {
    /// The chain's name and file as given to `sluice fuzz`.
    pub chain: String,
    /// The trace as given, and its packet count.
    pub input: String,
    /// The seed of the random run the case was shrunk from.
    pub seed: u64,
    /// The symptoms, one line.
    pub symptom: String,
    /// `verify`'s account of the differences.
    pub summary: String,
    /// Of how many reruns of the minimal case, how many failed the same way.
    pub reproduced: Option<(usize, usize)>,
}

/// The text of a regression file at `file` (its directory decides the relative paths of the
/// chain and the trace in `run:`): a comment header, then the schedule.
pub fn regression_yaml(
    schedule: &FaultSchedule,
    chain: &Path,
    input: &Path,
    file: &Path,
    h: &RegressionHeader,
) -> String {
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut s = schedule.clone();
    s.run.chain = Some(relative_path(chain, dir));
    s.run.input = Some(relative_path(input, dir));
    let name = file.display();
    let mut out = String::new();
    out.push_str(&format!(
        "# Regression: a random run (`sluice fuzz`, seed {}) shrunk to a minimal failing case.\n",
        h.seed
    ));
    out.push_str(&format!("# chain: {}\n# input: {}\n", h.chain, h.input));
    out.push_str(&format!("# symptom: {}\n", h.symptom));
    if h.symptom.contains("log_left") {
        out.push_str("#   (log_left: `sluice verify` shows it as `left N` on its `root:` line and still exits 0;\n");
        out.push_str("#   the tests and `sluice fuzz` count packets left in the root's log as a failure)\n");
    }
    if let Some((k, n)) = h.reproduced {
        out.push_str(&format!("# reproduced: {k} of {n} reruns failed the same way\n"));
    }
    out.push_str(&format!(
        "# reproduce: sluice verify --chain {} --input {} --faults {name}\n",
        chain.display(),
        input.display()
    ));
    out.push_str("#   (the `run:` section below sets the chain, trace, packet limit and engine options)\n");
    for line in h.summary.lines().take(14) {
        out.push_str(&format!("#   {line}\n"));
    }
    out.push_str(&s.to_yaml());
    out
}

/// `path` relative to `dir` (both made absolute against the current directory first), or
/// `path` as it is when no relative path exists.
pub fn relative_path(path: &Path, dir: &Path) -> PathBuf {
    let abs = |p: &Path| -> Option<PathBuf> {
        let p = if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().ok()?.join(p) };
        Some(normalise(&p))
    };
    let (Some(p), Some(d)) = (abs(path), abs(dir)) else { return path.to_path_buf() };
    let pc: Vec<Component> = p.components().collect();
    let dc: Vec<Component> = d.components().collect();
    let common = pc.iter().zip(&dc).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..dc.len() {
        out.push("..");
    }
    for c in pc.iter().skip(common) {
        out.push(c.as_os_str());
    }
    out
}

/// `p` without `.` and with `..` applied.
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}
