//! `sluice embark`: keys, rule encryption, the gateway, the end-to-end run and benchmarks
//! for NFs over encrypted traffic (crate `sluice-embark`, docs/embark.md).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rand::SeedableRng;
use sluice_embark::gateway::{Gateway, GatewayState};
use sluice_embark::keys::FlowPrf;
use sluice_embark::prefixmatch::{Domain, PrefixMatch};
use sluice_embark::provider::{compare, ProviderChain};
use sluice_embark::rules::{encrypt_provider, ProviderConfig};
use sluice_embark::MasterKey;
use sluice_io::{Precision, TraceWriter};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct EmbarkArgs {
    #[command(subcommand)]
    cmd: EmbarkCmd,
}

#[derive(Subcommand)]
enum EmbarkCmd {
    /// Write a fresh random master key (hex) to a file readable only by its owner.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Encrypt a provider chain's rules: writes the provider's encrypted chain and the
    /// gateway's secret state.
    EncryptRules {
        #[arg(long)]
        key: PathBuf,
        /// Plaintext provider chain (e.g. chains/embark/provider.yaml).
        #[arg(long)]
        chain: PathBuf,
        /// Rule generation (bump it for every update).
        #[arg(long, default_value_t = 1)]
        generation: u32,
        #[arg(long)]
        provider_out: PathBuf,
        #[arg(long)]
        gateway_out: PathBuf,
    },
    /// The gateway over a trace: `encrypt` (to the provider, token records interleaved) or
    /// `decrypt` (back from it).
    Gateway {
        #[arg(value_parser = ["encrypt", "decrypt"])]
        direction: String,
        #[arg(long)]
        key: PathBuf,
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        output: PathBuf,
    },
    /// Gateway → provider chain (encrypted rules) → gateway over a trace, compared packet for
    /// packet with the plaintext chain. Exit 4 if they differ.
    Run {
        #[arg(long)]
        key: PathBuf,
        #[arg(long)]
        state: PathBuf,
        /// The plaintext chain.
        #[arg(long)]
        chain: PathBuf,
        /// The provider's encrypted chain.
        #[arg(long)]
        encrypted_chain: PathBuf,
        #[arg(long)]
        input: PathBuf,
        /// Write the comparison as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// PrefixMatch, NF-on-ciphertext and gateway benchmarks.
    Bench {
        /// Trace for the NF and gateway measurements.
        #[arg(long, default_value = "traces/demo.pcap")]
        input: PathBuf,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 5)]
        repeat: usize,
    },
}

fn read_key(p: &PathBuf) -> Result<MasterKey> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading key {}", p.display()))?;
    Ok(MasterKey::from_hex(&text)?)
}

fn read_state(p: &PathBuf) -> Result<GatewayState> {
    let f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    serde_json::from_reader(std::io::BufReader::new(f)).with_context(|| format!("parsing {}", p.display()))
}

fn read_chain(p: &PathBuf) -> Result<ProviderConfig> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("parsing {}", p.display()))
}

pub fn cmd(a: EmbarkArgs) -> Result<bool> {
    match a.cmd {
        EmbarkCmd::Keygen { out } => {
            let k = MasterKey::generate();
            write_secret(&out, &(k.to_hex() + "\n"))?;
            println!("key {} written to {}", k.id(), out.display());
        }
        EmbarkCmd::EncryptRules { key, chain, generation, provider_out, gateway_out } => {
            let key = read_key(&key)?;
            let plain = read_chain(&chain)?;
            let (enc, state) = encrypt_provider(&key, &plain, generation, &mut rand::rngs::OsRng)?;
            std::fs::write(&provider_out, serde_yaml::to_string(&enc)?)?;
            write_secret(&gateway_out, &serde_json::to_string(&state)?)?;
            println!(
                "generation {generation}: {} address intervals ({} labels, /{}), {} port intervals; provider chain {}, gateway state {}",
                state.addr.intervals(),
                state.addr.label_count(),
                state.addr.prefix_len(),
                state.port.intervals(),
                provider_out.display(),
                gateway_out.display()
            );
        }
        EmbarkCmd::Gateway { direction, key, state, input, output } => {
            let key = read_key(&key)?;
            let mut gw = Gateway::new(&key, read_state(&state)?)?;
            let packets = sluice_io::load(&input, None)?;
            let mut w = TraceWriter::create(&output, Precision::Nano)?;
            let mut errors: std::collections::BTreeMap<String, u64> = Default::default();
            let mut n = 0;
            for p in &packets {
                if direction == "encrypt" {
                    match gw.encrypt(p) {
                        Ok(e) => {
                            for t in e.tokens.iter().chain([&e.data]) {
                                w.write(p.meta.ts_ns, t.data())?;
                                n += 1;
                            }
                        }
                        Err(e) => *errors.entry(e.to_string()).or_default() += 1,
                    }
                } else if p.tuple().is_some_and(|t| t.proto.0 == sluice_embark::keyword::TOKEN_PROTO) {
                    continue;
                } else {
                    match gw.decrypt(p) {
                        Ok(d) => {
                            w.write(p.meta.ts_ns, d.data())?;
                            n += 1;
                        }
                        Err(e) => *errors.entry(e.to_string()).or_default() += 1,
                    }
                }
            }
            w.finish()?;
            println!("{} packets in, {n} written to {}; dropped: {errors:?}", packets.len(), output.display());
        }
        EmbarkCmd::Run { key, state, chain, encrypted_chain, input, json } => {
            let key = read_key(&key)?;
            let enc = read_chain(&encrypted_chain)?;
            if enc.key_id.as_deref() != Some(key.id().as_str()) {
                bail!("{} was encrypted for key {:?}, not {}", encrypted_chain.display(), enc.key_id, key.id());
            }
            let mut gw = Gateway::new(&key, read_state(&state)?)?;
            let packets = sluice_io::load(&input, None)?;
            let c = compare(&sluice_nfs::registry(), &read_chain(&chain)?, &enc, &mut gw, &packets)?;
            println!("packets          {}", c.packets);
            println!("forwarded        {} ({} after undoing a NAT port choice)", c.forwarded, c.nat_renamed);
            println!("dropped          {:?}", c.dropped);
            println!("IDS alerts       {}", c.alerts);
            println!("token records    {} ({} bytes)", c.token_records, c.token_bytes);
            println!("bytes            {} plaintext, {} encrypted data", c.plain_bytes, c.enc_bytes);
            println!("gateway refused  {:?}", c.gateway_errors);
            if let Some(j) = json {
                std::fs::write(j, serde_json::to_string_pretty(&c)?)?;
            }
            if c.differences.is_empty() {
                println!("equivalent: every decision and every delivered packet equal");
            } else {
                for d in &c.differences {
                    println!("DIFFERENCE {d}");
                }
                return Ok(false);
            }
        }
        EmbarkCmd::Bench { input, repeat } => bench(&input, repeat.max(1))?,
    }
    Ok(true)
}

fn write_secret(p: &PathBuf, text: &str) -> Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    o.mode(0o600);
    o.open(p).with_context(|| format!("creating {}", p.display()))?.write_all(text.as_bytes())?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
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

fn bench(input: &PathBuf, repeat: usize) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    println!("# PrefixMatch (median of {repeat})");
    for n in [10_000usize, 100_000] {
        let rules = random_rules(n, &mut rng);
        let t0 = Instant::now();
        let pm = PrefixMatch::build(Domain::Addr, &rules, &mut rng)?;
        let build = t0.elapsed().as_secs_f64();
        let values: Vec<u128> = (0..200_000).map(|_| rand::Rng::gen::<u128>(&mut rng) | (0xffff << 32)).collect();
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
    let packets = sluice_io::load(input, None)?;
    let key = MasterKey::from_bytes([3; 32]);
    let chain: ProviderConfig = read_chain(&PathBuf::from("chains/embark/provider.yaml"))?;
    let (enc, state) = encrypt_provider(&key, &chain, 1, &mut rng)?;
    let mut no_kw = state.clone();
    no_kw.tokenizer = None;
    // Gateway throughput, one core.
    println!("# Gateway, one core, {} packets of {} (median of {repeat})", packets.len(), input.display());
    let bytes: u64 = packets.iter().map(|p| p.len() as u64).sum();
    let mut encrypted = Vec::new();
    for (label, st) in [("headers only", no_kw.clone()), ("with KeywordMatch", state.clone())] {
        let mut r = Vec::new();
        for _ in 0..repeat {
            let mut gw = Gateway::new(&key, st.clone())?;
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
    let gw = Gateway::new(&key, state.clone())?;
    let mut r = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        for e in &encrypted {
            std::hint::black_box(gw.decrypt(&e.data).ok());
        }
        r.push(t.elapsed().as_secs_f64());
    }
    println!("decrypt: {:.3} Mpps", encrypted.len() as f64 / median(r) / 1e6);
    // NFs on ciphertext vs plaintext.
    println!("# NFs alone, plaintext vs ciphertext (median of {repeat})");
    let reg = sluice_nfs::registry();
    for kind in ["firewall", "lb", "nat"] {
        let one = |cfg: &ProviderConfig| ProviderConfig {
            key_id: cfg.key_id.clone(),
            generation: cfg.generation,
            nfs: cfg.nfs.iter().filter(|n| n.kind == kind).cloned().collect(),
        };
        let (pc, ec) = (one(&chain), one(&enc));
        let plain_pk: Vec<_> = packets.iter().filter(|p| p.hdr().is_ip()).cloned().collect();
        let enc_pk: Vec<_> = encrypted.iter().map(|e| e.data.clone()).collect();
        let mut rates = [0.0f64; 2];
        for (slot, (cfg, pk)) in rates.iter_mut().zip([(&pc, &plain_pk), (&ec, &enc_pk)]) {
            let mut r = Vec::new();
            for _ in 0..repeat {
                let mut ch = ProviderChain::build(&reg, cfg)?;
                let mut pk = pk.clone();
                let t = Instant::now();
                for p in &mut pk {
                    std::hint::black_box(ch.process(p));
                }
                r.push(pk.len() as f64 / t.elapsed().as_secs_f64() / 1e6);
            }
            *slot = median(r);
        }
        println!(
            "{kind}: plaintext {:.3} Mpps, ciphertext {:.3} Mpps, ratio {:.3}",
            rates[0],
            rates[1],
            rates[1] / rates[0]
        );
    }
    Ok(())
}
