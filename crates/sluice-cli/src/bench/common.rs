//! What `sluice bench` and `sluice bench-store` share: the chains they measure, the packets they
//! generate, how runs are repeated and summarised, and how results are written.

use anyhow::{anyhow, Context, Result};
use serde::Serialize;
use sluice_io::{GenConfig, IoError};
use sluice_packet::{Meta, Packet};
use sluice_runtime::Chain;
use std::path::{Path, PathBuf};

/// The example chain (NAT → portscan → LB, Trojan detector off-path).
const EXAMPLE_CHAIN: &str = include_str!("../../../../chains/example.yaml");

/// Prefix of the input given to the compiler to check that splits spread the load.
pub(crate) const SAMPLE: usize = 4_096;

/// The NAT's configuration in every benchmark: the internal side is 10.0.0.0/8, as the
/// generator's clients are.
pub(crate) const NAT_CONFIG: &str = "internal: [\"10.0.0.0/8\"]";

/// The example chain, parsed.
pub(crate) fn example_chain() -> Result<Chain> {
    Chain::parse(EXAMPLE_CHAIN, Path::new("chains/example.yaml")).map_err(|e| anyhow!("{e}"))
}

/// A chain of one NF between input and output, with `instances` instances; `source` names it
/// in parse errors.
pub(crate) fn single_nf_chain(kind: &str, config: &str, instances: usize, source: &str) -> Result<Chain> {
    let config = if config.is_empty() { String::new() } else { format!("    config: {{ {config} }}\n") };
    let text = format!(
        "name: {kind}\nvertices:\n  {kind}:\n    type: {kind}\n    instances: {instances}\n{config}edges:\n  \
         - {{ from: input, to: {kind} }}\n  - {{ from: {kind}, to: output }}\n"
    );
    Chain::parse(&text, &PathBuf::from(source)).map_err(|e| anyhow!("{e}"))
}

/// The generator's packets for `cfg`, held in memory.
pub(crate) fn generate_packets(cfg: &GenConfig) -> Result<Vec<Packet>, IoError> {
    let gen = sluice_io::generate(cfg)?;
    Ok(gen.map(|(ts_ns, frame)| Packet::from_slice(&frame, Meta { ts_ns, ..Meta::default() })).collect())
}

/// The cores this process may use.
pub(crate) fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Warns that the numbers of a debug build mean little (not for `--quick` smoke runs).
pub(crate) fn warn_if_debug_build(command: &str, quick: bool) {
    if cfg!(debug_assertions) && !quick {
        eprintln!("sluice {command}: warning: this is a debug build; use `cargo run --release` for real numbers");
    }
}

/// Runs every case `repeat` times, the repeats interleaved (repeat 1 of every case, then repeat
/// 2, ...) so that a noisy moment of the machine spreads over the cases instead of hitting one.
/// With `warm_up`, one untimed run of the first case comes first: it warms the allocator and
/// the code paths. `progress` hears of every timed run (repeat from 1, case, sample). Returns
/// the samples per case.
pub(crate) fn repeat_interleaved<C, S>(
    cases: &[C],
    repeat: usize,
    warm_up: bool,
    mut measure: impl FnMut(&C) -> Result<S>,
    progress: impl Fn(usize, &C, &S),
) -> Result<Vec<Vec<S>>> {
    if warm_up {
        if let Some(first) = cases.first() {
            measure(first)?;
        }
    }
    let mut samples: Vec<Vec<S>> = cases.iter().map(|_| Vec::with_capacity(repeat)).collect();
    for r in 0..repeat {
        for (c, out) in cases.iter().zip(samples.iter_mut()) {
            let s = measure(c)?;
            progress(r + 1, c, &s);
            out.push(s);
        }
    }
    Ok(samples)
}

/// Median, min and max of one metric over the repeats.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Stat {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Stat {
    /// The statistics of `values`, non-finite ones left out (all zero when none is left).
    pub(crate) fn of(values: impl Iterator<Item = f64>) -> Stat {
        let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Stat::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Stat { median, min: v[0], max: v[n - 1] }
    }
}

/// `a / b`, or 0 when `b` is not positive.
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Millions of packets per second: `packets` in `secs` (0 when no time passed).
pub(crate) fn mpps(packets: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        packets as f64 / secs / 1e6
    } else {
        0.0
    }
}

/// Writes `text` to `path`, creating its directory.
pub(crate) fn write_file(path: &Path, text: &str) -> Result<()> {
    create_parent_dir(path)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Creates the directory `path` goes in, if it names one.
fn create_parent_dir(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

/// Writes the results as pretty JSON (`--json`) and says where.
pub(crate) fn write_json(path: &Path, results: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(results).context("serialising the results")?;
    write_file(path, &(text + "\n"))?;
    println!("results written to {}", path.display());
    Ok(())
}

/// Draws a plot into `path` (`--plot`) with `draw`, creating its directory, and says where.
pub(crate) fn write_plot(path: &Path, draw: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    create_parent_dir(path)?;
    draw(path).with_context(|| format!("drawing {}", path.display()))?;
    println!("plot written to {}", path.display());
    Ok(())
}

/// A drawing error (plotters' errors are not `Send + Sync`), as text.
pub(crate) fn drawing_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("{e}")
}

/// The range of a logarithmic latency axis: from the smallest positive of `lows` to the largest
/// of `highs`, widened by the factor `margin` on both sides (0.1..10 when there is nothing to
/// show).
pub(crate) fn log_axis(lows: impl Iterator<Item = f64>, highs: impl Iterator<Item = f64>, margin: f64) -> (f64, f64) {
    let lo = lows.filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
    let hi = highs.fold(0.0f64, f64::max);
    if lo.is_finite() && hi > lo {
        (lo / margin, hi * margin)
    } else {
        (0.1, 10.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_median_of_odd_and_even_counts() {
        let s = Stat::of([3.0, 1.0, 2.0].into_iter());
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Stat::of([4.0, 1.0, 2.0, 3.0].into_iter());
        assert_eq!(s.median, 2.5);
        assert_eq!(Stat::of(std::iter::empty()).median, 0.0);
    }

    #[test]
    fn example_chain_parses() {
        assert!(example_chain().is_ok());
    }
}
