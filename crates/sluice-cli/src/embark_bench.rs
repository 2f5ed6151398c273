//! `sluice embark bench`: PrefixMatch, the gateway, and the provider's NFs on ciphertext
//! against the same NFs on plaintext (docs/benchmarks.md, "Embark").
//!
//! The NF comparison is paired: both sides process the same packets (every IP packet of the
//! trace the gateway accepted, as plaintext and as its encryption), each repetition measures
//! both sides back to back in alternating order. Packets reach the chain as the runtime
//! delivers them (batches of 32 copied in just before the chain runs; `--arrival cold` copies
//! them all first). Two ratios are reported: the median of the per-repetition ratios, and the
//! ratio of each side's sum over batches of the batch's fastest time over all repetitions,
//! which load from other processes on a shared machine disturbs least.

use anyhow::Result;
use rand::SeedableRng;
use sluice_embark::gateway::{Encrypted, Gateway};
use sluice_embark::keys::FlowPrf;
use sluice_embark::prefixmatch::{Domain, PrefixMatch};
use sluice_embark::provider::ProviderChain;
use sluice_embark::rules::{encrypt_provider, ProviderConfig};
use sluice_embark::MasterKey;
use sluice_packet::{Packet, PacketPool};
use std::path::Path;
use std::time::Instant;

/// Which measurements to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// Everything.
    All,
    /// PrefixMatch encryption with 10K and 100K rules.
    Prefixmatch,
    /// Gateway out (with and without KeywordMatch) and in.
    Gateway,
    /// Firewall, LB and NAT alone on plaintext and on ciphertext.
    Nfs,
}

/// One side of the NF comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Side {
    /// The plaintext chain on the plaintext packets.
    Plain,
    /// The encrypted chain on their encryptions.
    Enc,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Random firewall-like address rules: prefixes /8 to /32 of IPv4 (mapped) and /32 to /64 of
/// IPv6.
fn random_rules(n: usize, rng: &mut rand::rngs::StdRng) -> Vec<(u128, u128)> {
    use rand::Rng;
    (0..n)
        .map(|_| {
            let (net, len) = if rng.gen_bool(0.7) {
                ((0xffffu128 << 32) | u128::from(rng.gen::<u32>()), 96 + rng.gen_range(8..=32))
            } else {
                (rng.gen::<u128>(), rng.gen_range(32..=64))
            };
            let span = if len == 128 { 0 } else { (1u128 << (128 - len)) - 1 };
            (net & !span, (net & !span) | span)
        })
        .collect()
}

fn bench_prefixmatch(repeat: usize, rng: &mut rand::rngs::StdRng) -> Result<()> {
    println!("# PrefixMatch (median of {repeat})");
    for n in [10_000usize, 100_000] {
        let rules = random_rules(n, rng);
        let t0 = Instant::now();
        let pm = PrefixMatch::build(Domain::Addr, &rules, rng)?;
        let build = t0.elapsed().as_secs_f64();
        let values: Vec<u128> = (0..200_000).map(|_| rand::Rng::gen::<u128>(rng) | (0xffff << 32)).collect();
        let prf = FlowPrf::from_seed([5; 16]);
        let mut per = Vec::new();
        for _ in 0..repeat {
            let t = Instant::now();
            let mut acc = 0u128;
            for v in &values {
                acc ^= pm.encrypt(*v & ((1 << 48) - 1) | (0xffff << 32), &prf)?;
            }
            std::hint::black_box(acc);
            per.push(t.elapsed().as_secs_f64() * 1e6 / values.len() as f64);
        }
        println!(
            "encrypt, {n} rules: {:.3} us/value; map {} intervals, {} labels /{}, {:.1} MB; built in {:.2} s",
            median(per),
            pm.intervals(),
            pm.label_count(),
            pm.prefix_len(),
            pm.heap_bytes() as f64 / 1e6,
            build
        );
    }
    Ok(())
}

fn bench_gateway(
    key: &MasterKey,
    state: &sluice_embark::gateway::GatewayState,
    packets: &[Packet],
    input: &Path,
    repeat: usize,
) -> Result<()> {
    let mut no_kw = state.clone();
    no_kw.tokenizer = None;
    println!("# Gateway, one core, {} packets of {} (median of {repeat})", packets.len(), input.display());
    let bytes: u64 = packets.iter().map(|p| p.len() as u64).sum();
    let mut encrypted: Vec<Encrypted> = Vec::new();
    for (label, st) in [("headers only", &no_kw), ("with KeywordMatch", state)] {
        let mut r = Vec::new();
        for _ in 0..repeat {
            let mut gw = Gateway::new(key, st.clone())?;
            let t = Instant::now();
            let mut out = Vec::with_capacity(packets.len());
            for p in packets.iter().filter(|p| p.hdr().is_ip()) {
                if let Ok(e) = gw.encrypt(p) {
                    out.push(e);
                }
            }
            r.push(t.elapsed().as_secs_f64());
            encrypted = out;
        }
        let s = median(r);
        println!(
            "encrypt {label}: {:.3} Mpps, {:.2} Gbit/s",
            packets.len() as f64 / s / 1e6,
            bytes as f64 * 8.0 / s / 1e9
        );
    }
    let gw = Gateway::new(key, state.clone())?;
    let mut r = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        for e in &encrypted {
            std::hint::black_box(gw.decrypt(&e.data).ok());
        }
        r.push(t.elapsed().as_secs_f64());
    }
    println!("decrypt: {:.3} Mpps", encrypted.len() as f64 / median(r) / 1e6);
    Ok(())
}

/// How packets meet the chain in the NF comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arrival {
    /// As the runtime delivers them: in batches of [`BATCH`], each copied into a recycled
    /// buffer (with its parsed headers) just before the chain runs on it, as a source fills a
    /// batch; only the chain's work is timed.
    Batch,
    /// All packets copied before the clock starts, then processed in one go: by the time a
    /// packet's turn comes its bytes have left the CPU's private caches.
    Cold,
}

/// Batch size of [`Arrival::Batch`] (the runtime's default).
const BATCH: usize = 32;

/// One pass of a fresh chain of `cfg` over a copy of `pk`: the time of each run of [`BATCH`]
/// packets through the chain (copies are made off the clock).
fn nf_pass(reg: &sluice_nf::NfRegistry, cfg: &ProviderConfig, pk: &[Packet], arrival: Arrival) -> Result<Vec<f64>> {
    let mut ch = ProviderChain::build(reg, cfg)?;
    let mut times = Vec::with_capacity(pk.len().div_ceil(BATCH));
    match arrival {
        Arrival::Cold => {
            let mut pk = pk.to_vec();
            for chunk in pk.chunks_mut(BATCH) {
                let t = Instant::now();
                for p in chunk {
                    std::hint::black_box(ch.process(p));
                }
                times.push(t.elapsed().as_secs_f64());
            }
        }
        Arrival::Batch => {
            let pool = PacketPool::new(2 * BATCH, 2048);
            let mut batch = Vec::with_capacity(BATCH);
            for chunk in pk.chunks(BATCH) {
                batch.extend(chunk.iter().map(|p| pool.copy_of(p)));
                let t = Instant::now();
                for p in &mut batch {
                    std::hint::black_box(ch.process(p));
                }
                times.push(t.elapsed().as_secs_f64());
                pool.recycle_batch(&mut batch);
            }
        }
    }
    Ok(times)
}

/// Per-side timings over the repetitions: each pass's total, and the fastest time of every
/// batch over all passes (a fresh chain does the same work on a batch in every pass, so its
/// fastest time is the one least disturbed by other processes on a shared machine).
#[derive(Default)]
struct SideTimes {
    totals: Vec<f64>,
    best: Vec<f64>,
}

impl SideTimes {
    fn add(&mut self, pass: &[f64]) {
        self.totals.push(pass.iter().sum());
        if self.best.is_empty() {
            self.best = pass.to_vec();
        }
        for (b, t) in self.best.iter_mut().zip(pass) {
            *b = b.min(*t);
        }
    }
}

fn bench_nfs(
    chain: &ProviderConfig,
    enc: &ProviderConfig,
    pairs: &(Vec<Packet>, Vec<Packet>),
    repeat: usize,
    sel: &NfSelection,
) -> Result<()> {
    let (plain_pk, enc_pk) = pairs;
    let plain_bytes: usize = plain_pk.iter().map(Packet::len).sum();
    let enc_bytes: usize = enc_pk.iter().map(Packet::len).sum();
    println!(
        "# NFs alone, plaintext vs ciphertext: the same {} packets ({:.0} / {:.0} bytes on average), \
         back to back in alternating order, {repeat} passes each (plaintext / ciphertext)",
        plain_pk.len(),
        plain_bytes as f64 / plain_pk.len().max(1) as f64,
        enc_bytes as f64 / enc_pk.len().max(1) as f64
    );
    let arrival = sel.arrival.unwrap_or(Arrival::Batch);
    println!(
        "# arrival: {arrival:?}{}",
        if sel.pad_plain { ", plaintext frames padded to the ciphertext's lengths" } else { "" }
    );
    let reg = sluice_nfs::registry();
    for kind in ["firewall", "lb", "nat"] {
        if sel.kind.as_deref().is_some_and(|k| k != kind) {
            continue;
        }
        let one = |cfg: &ProviderConfig| ProviderConfig {
            key_id: cfg.key_id.clone(),
            generation: cfg.generation,
            nfs: cfg.nfs.iter().filter(|n| n.kind == kind).cloned().collect(),
        };
        let (pc, ec) = (one(chain), one(enc));
        let n = plain_pk.len() as f64;
        if let Some(side) = sel.side {
            let (cfg, pk) = if side == Side::Plain { (&pc, plain_pk) } else { (&ec, enc_pk) };
            let mut st = SideTimes::default();
            for _ in 0..repeat {
                st.add(&nf_pass(&reg, cfg, pk, arrival)?);
            }
            println!(
                "{kind}, {side:?} only: {:.3} Mpps (median pass), {:.3} Mpps (sum of fastest batches)",
                n / median(st.totals) / 1e6,
                n / st.best.iter().sum::<f64>() / 1e6
            );
            continue;
        }
        // One warm-up pass of each, not counted.
        nf_pass(&reg, &pc, plain_pk, arrival)?;
        nf_pass(&reg, &ec, enc_pk, arrival)?;
        let (mut p, mut e, mut ratio) = (SideTimes::default(), SideTimes::default(), Vec::new());
        for i in 0..repeat {
            let (tp, te) = if i % 2 == 0 {
                let tp = nf_pass(&reg, &pc, plain_pk, arrival)?;
                (tp, nf_pass(&reg, &ec, enc_pk, arrival)?)
            } else {
                let te = nf_pass(&reg, &ec, enc_pk, arrival)?;
                (nf_pass(&reg, &pc, plain_pk, arrival)?, te)
            };
            p.add(&tp);
            e.add(&te);
            ratio.push(tp.iter().sum::<f64>() / te.iter().sum::<f64>());
        }
        let (lo, hi) = ratio.iter().fold((f64::MAX, f64::MIN), |(a, b), &r| (a.min(r), b.max(r)));
        let (bp, be) = (p.best.iter().sum::<f64>(), e.best.iter().sum::<f64>());
        println!(
            "{kind}: median pass {:.3} / {:.3} Mpps, median ratio {:.3} (per-repetition {lo:.3}-{hi:.3}); \
             fastest batches {:.3} / {:.3} Mpps, ratio {:.3}",
            n / median(p.totals) / 1e6,
            n / median(e.totals) / 1e6,
            median(ratio),
            n / bp / 1e6,
            n / be / 1e6,
            bp / be
        );
    }
    Ok(())
}

/// What the NF comparison covers.
#[derive(Debug, Clone, Default)]
pub struct NfSelection {
    /// The first N IP packets only (default: all of them; a few thousand fit in the caches).
    pub packets: Option<usize>,
    /// Only this side, `--repeat` times (for profiling it alone).
    pub side: Option<Side>,
    /// Only this NF kind.
    pub kind: Option<String>,
    /// How packets meet the chain.
    pub arrival: Option<Arrival>,
    /// Pad the plaintext frames to their encryptions' lengths (see [`padded`]).
    pub pad_plain: bool,
}

/// `p` with a zero Ethernet trailer up to `len` bytes: the headers and hence the NFs' work are
/// unchanged (the IP length fields bound the payload), only the frame is as big as its
/// encryption. `p` itself if padding would change the parsed headers.
fn padded(p: &Packet, len: usize) -> Packet {
    let mut d = p.data().to_vec();
    d.resize(len.max(d.len()), 0);
    let q = Packet::new(d, p.meta);
    if q.hdr() == p.hdr() {
        q
    } else {
        p.clone()
    }
}

/// Runs the benchmarks of `part` over the trace `input`.
pub fn bench(input: &Path, repeat: usize, part: Part, sel: &NfSelection) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    if matches!(part, Part::All | Part::Prefixmatch) {
        bench_prefixmatch(repeat, &mut rng)?;
    }
    if part == Part::Prefixmatch {
        return Ok(());
    }
    let packets = sluice_io::load(input, None)?;
    let key = MasterKey::from_bytes([3; 32]);
    let text = std::fs::read_to_string("chains/embark/provider.yaml")?;
    let chain: ProviderConfig = serde_yaml::from_str(&text)?;
    let (enc, state) = encrypt_provider(&key, &chain, 1, &mut rng)?;
    if matches!(part, Part::All | Part::Gateway) {
        bench_gateway(&key, &state, &packets, input, repeat)?;
    }
    if matches!(part, Part::All | Part::Nfs) {
        // Token records do not change the data packets; the NFs measured take none.
        let mut headers_only = state;
        headers_only.tokenizer = None;
        let mut gw = Gateway::new(&key, headers_only)?;
        let mut pairs = (Vec::new(), Vec::new());
        for p in packets.iter().filter(|p| p.hdr().is_ip()).take(sel.packets.unwrap_or(usize::MAX)) {
            if let Ok(e) = gw.encrypt(p) {
                pairs.0.push(if sel.pad_plain { padded(p, e.data.len()) } else { p.clone() });
                pairs.1.push(e.data);
            }
        }
        bench_nfs(&chain, &enc, &pairs, repeat, sel)?;
    }
    Ok(())
}
