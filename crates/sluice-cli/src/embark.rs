//! `sluice embark`: keys, rule encryption, the gateway, the end-to-end run and benchmarks
//! for NFs over encrypted traffic (crate `sluice-embark`, docs/embark.md).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use sluice_embark::compare::{compare_with_swap, Comparison, SwapPlan};
use sluice_embark::gateway::{Gateway, GatewayState};
use sluice_embark::rules::{encrypt_provider, ProviderConfig};
use sluice_embark::MasterKey;
use sluice_io::{Precision, TraceWriter};
use std::path::PathBuf;

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
    /// gateway's secret state. A rule update is a new encryption with a higher --generation,
    /// swapped in with `run --swap-at` (docs/embark.md, "Rule updates").
    EncryptRules {
        #[arg(long)]
        key: PathBuf,
        /// Plaintext provider chain (e.g. chains/embark/provider.yaml).
        #[arg(long)]
        chain: PathBuf,
        /// Rule generation, carried by every packet and token record made under these rules
        /// (bump it for every update; a swap needs a higher one).
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
    /// packet with the plaintext chain, optionally with a rule swap mid-trace (--swap-at).
    /// Exit 4 if they differ or a packet met rules of another generation.
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
        /// Swap to the next rule generation at this input packet (a count, or a percentage
        /// such as `50%`): the gateway switches, the provider runs both generations' chains
        /// side by side until the old one's last packet is through, then retires it. Needs
        /// --next-chain, --next-encrypted-chain and --next-state.
        #[arg(long, requires_all = ["next_chain", "next_encrypted_chain", "next_state"])]
        swap_at: Option<String>,
        /// The next generation's plaintext chain (the reference after the swap).
        #[arg(long)]
        next_chain: Option<PathBuf>,
        /// The next generation's encrypted chain (`encrypt-rules --generation N+1`).
        #[arg(long)]
        next_encrypted_chain: Option<PathBuf>,
        /// The next generation's gateway state.
        #[arg(long)]
        next_state: Option<PathBuf>,
        /// Packets in flight between gateway and provider (processed in order): with a swap,
        /// the old generation's last packets reach the provider after the gateway switched.
        #[arg(long, default_value_t = 64)]
        in_flight: usize,
    },
    /// PrefixMatch, NF-on-ciphertext and gateway benchmarks.
    Bench {
        /// Trace for the NF and gateway measurements.
        #[arg(long, default_value = "traces/demo.pcap")]
        input: PathBuf,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 5)]
        repeat: usize,
        /// Which measurements to run.
        #[arg(long, value_enum, default_value = "all")]
        part: crate::embark_bench::Part,
        /// Compare the NFs over the first N IP packets only (default: all of them; a few
        /// thousand fit in the CPU caches).
        #[arg(long)]
        nf_packets: Option<usize>,
        /// Run only one side of the NF comparison, `--repeat` times, and print its rate
        /// (for profiling one side with `perf record`).
        #[arg(long, value_enum)]
        side: Option<crate::embark_bench::Side>,
        /// Compare only this NF (`firewall`, `lb` or `nat`).
        #[arg(long)]
        nf: Option<String>,
        /// How packets meet the NFs in the comparison: `batch` (default; batches of 32
        /// copied in just before the chain runs, as the runtime delivers them) or `cold`.
        #[arg(long, value_enum)]
        arrival: Option<crate::embark_bench::Arrival>,
        /// Pad each plaintext frame with a zero Ethernet trailer to the length of its
        /// encryption: the same NF work on frames as big as the ciphertext's, which separates
        /// the cost of Embark's bigger frames from that of the NFs' work on encrypted values.
        #[arg(long)]
        pad_plain: bool,
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
        EmbarkCmd::Run {
            key,
            state,
            chain,
            encrypted_chain,
            input,
            json,
            swap_at,
            next_chain,
            next_encrypted_chain,
            next_state,
            in_flight,
        } => {
            let key = read_key(&key)?;
            let enc = read_encrypted_chain(&encrypted_chain, &key)?;
            let mut gw = Gateway::new(&key, read_state(&state)?)?;
            let packets = sluice_io::load(&input, None)?;
            let next = match (swap_at, next_chain, next_encrypted_chain, next_state) {
                (Some(at), Some(p), Some(e), Some(s)) => Some((
                    parse_at(&at, packets.len())?,
                    read_chain(&p)?,
                    read_encrypted_chain(&e, &key)?,
                    read_state(&s)?,
                )),
                _ => None,
            };
            let plan = next.as_ref().map(|(at, plain, enc, st)| SwapPlan {
                at: *at,
                plain,
                enc,
                state: st.clone(),
                key: &key,
            });
            let reg = sluice_nfs::registry();
            let c = compare_with_swap(&reg, &read_chain(&chain)?, &enc, &mut gw, &packets, plan, in_flight)?;
            return report(&c, json.as_ref());
        }
        EmbarkCmd::Bench { input, repeat, part, nf_packets, side, nf, arrival, pad_plain } => {
            let nfs = crate::embark_bench::NfSelection { packets: nf_packets, side, kind: nf, arrival, pad_plain };
            crate::embark_bench::bench(&input, repeat.max(1), part, &nfs)?
        }
    }
    Ok(true)
}

/// An encrypted chain, refused unless encrypted for `key`.
fn read_encrypted_chain(p: &PathBuf, key: &MasterKey) -> Result<ProviderConfig> {
    let enc = read_chain(p)?;
    if enc.key_id.as_deref() != Some(key.id().as_str()) {
        bail!("{} was encrypted for key {:?}, not {}", p.display(), enc.key_id, key.id());
    }
    Ok(enc)
}

/// A packet index written as a count or a percentage of `n`.
fn parse_at(s: &str, n: usize) -> Result<usize> {
    let at = match s.trim().strip_suffix('%') {
        Some(pct) => {
            let pct: f64 = pct.trim().parse().with_context(|| format!("--swap-at {s}: not a percentage"))?;
            if !(0.0..=100.0).contains(&pct) {
                bail!("--swap-at {s}: a percentage is between 0 and 100");
            }
            (n as f64 * pct / 100.0).round() as usize
        }
        None => s.trim().parse().with_context(|| format!("--swap-at {s}: not a packet count or percentage"))?,
    };
    if at > n {
        bail!("--swap-at {s}: the trace has {n} packets");
    }
    Ok(at)
}

/// Prints a comparison; `false` if the paths differ.
fn report(c: &Comparison, json: Option<&PathBuf>) -> Result<bool> {
    println!("packets          {}", c.packets);
    println!("forwarded        {} ({} after undoing a NAT port choice)", c.forwarded, c.nat_renamed);
    println!("dropped          {:?}", c.dropped);
    println!("IDS alerts       {}", c.alerts);
    println!("token records    {} ({} bytes)", c.token_records, c.token_bytes);
    println!("bytes            {} plaintext, {} encrypted data", c.plain_bytes, c.enc_bytes);
    println!("gateway refused  {:?}", c.gateway_errors);
    println!("provider refused {:?} (packets of a generation without live rules, or mixed)", c.refused);
    if let Some(at) = c.swap_at {
        println!(
            "rule swap        at packet {at}; {} old-generation packets after it (connections kept under the old rules, packets in flight), through the old chain; old generation {}",
            c.old_after_swap,
            c.retired_after.map_or_else(
                || format!("not retired: {} connections still under it at the end", c.pinned_at_end),
                |r| format!("retired after packet {r}")
            )
        );
    }
    if let Some(j) = json {
        std::fs::write(j, serde_json::to_string_pretty(c)?)?;
    }
    if c.differences.is_empty() && c.refused.is_empty() {
        println!("equivalent: every decision and every delivered packet equal");
        return Ok(true);
    }
    for d in &c.differences {
        println!("DIFFERENCE {d}");
    }
    Ok(false)
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
