//! `sluice embark bench`: PrefixMatch, the gateway, and the provider's NFs on ciphertext
//! against the same NFs on plaintext (docs/benchmarks.md, "Embark").
//!
//! The NF comparison is paired: both sides process the same packets (every IP packet of the
//! trace the gateway accepted, as plaintext and as its encryption), each repetition measures
//! both sides back to back in alternating order, and the ratio reported is the median of the
//! per-repetition ratios, so load from other processes on a shared machine hits both sides
//! alike.

use anyhow::Result;
use rand::SeedableRng;
use sluice_embark::gateway::{Encrypted, Gateway};
use sluice_embark::keys::FlowPrf;
use sluice_embark::prefixmatch::{Domain, PrefixMatch};
use sluice_embark::provider::ProviderChain;
use sluice_embark::rules::{encrypt_provider, ProviderConfig};
use sluice_embark::MasterKey;
use sluice_packet::Packet;
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

/// Packets per second of one fresh chain of `cfg` over a copy of `pk` (the copy is made
/// before the clock starts).
fn nf_rate(reg: &sluice_nf::NfRegistry, cfg: &ProviderConfig, pk: &[Packet]) -> Result<f64> {
    let mut ch = ProviderChain::build(reg, cfg)?;
    let mut pk = pk.to_vec();
    let t = Instant::now();
    for p in &mut pk {
        std::hint::black_box(ch.process(p));
    }
    Ok(pk.len() as f64 / t.elapsed().as_secs_f64())
}

fn bench_nfs(
    chain: &ProviderConfig,
    enc: &ProviderConfig,
    pairs: &(Vec<Packet>, Vec<Packet>),
    repeat: usize,
) -> Result<()> {
    let (plain_pk, enc_pk) = pairs;
    let plain_bytes: usize = plain_pk.iter().map(Packet::len).sum();
    let enc_bytes: usize = enc_pk.iter().map(Packet::len).sum();
    println!(
        "# NFs alone, plaintext vs ciphertext: the same {} packets ({:.0} / {:.0} bytes on average), \
         back to back in alternating order, median of {repeat}",
        plain_pk.len(),
        plain_bytes as f64 / plain_pk.len().max(1) as f64,
        enc_bytes as f64 / enc_pk.len().max(1) as f64
    );
    let reg = sluice_nfs::registry();
    for kind in ["firewall", "lb", "nat"] {
        let one = |cfg: &ProviderConfig| ProviderConfig {
            key_id: cfg.key_id.clone(),
            generation: cfg.generation,
            nfs: cfg.nfs.iter().filter(|n| n.kind == kind).cloned().collect(),
        };
        let (pc, ec) = (one(chain), one(enc));
        // One warm-up round of each, not counted.
        nf_rate(&reg, &pc, plain_pk)?;
        nf_rate(&reg, &ec, enc_pk)?;
        let (mut pr, mut er, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..repeat {
            let (p, e) = if i % 2 == 0 {
                let p = nf_rate(&reg, &pc, plain_pk)?;
                (p, nf_rate(&reg, &ec, enc_pk)?)
            } else {
                let e = nf_rate(&reg, &ec, enc_pk)?;
                (nf_rate(&reg, &pc, plain_pk)?, e)
            };
            pr.push(p / 1e6);
            er.push(e / 1e6);
            ratio.push(e / p);
        }
        let (lo, hi) = ratio.iter().fold((f64::MAX, f64::MIN), |(a, b), &r| (a.min(r), b.max(r)));
        println!(
            "{kind}: plaintext {:.3} Mpps, ciphertext {:.3} Mpps, ratio {:.3} (per-repetition ratios {lo:.3}-{hi:.3})",
            median(pr),
            median(er),
            median(ratio)
        );
    }
    Ok(())
}

/// Runs the benchmarks of `part` over the trace `input`; the NF comparison over its first
/// `nf_packets` IP packets (all: `None`; a few thousand fit in the caches).
pub fn bench(input: &Path, repeat: usize, part: Part, nf_packets: Option<usize>) -> Result<()> {
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
        for p in packets.iter().filter(|p| p.hdr().is_ip()).take(nf_packets.unwrap_or(usize::MAX)) {
            if let Ok(e) = gw.encrypt(p) {
                pairs.0.push(p.clone());
                pairs.1.push(e.data);
            }
        }
        bench_nfs(&chain, &enc, &pairs, repeat)?;
    }
    Ok(())
}
