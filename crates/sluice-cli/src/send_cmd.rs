//! `sluice send`: a load generator for live interfaces. Sends a trace or generated traffic out
//! of one interface, as fast as the port takes it or at a fixed rate, looping over the
//! packets until a duration or count is reached — what `scripts/bench-bridge.sh` drives a
//! bridge with, and a quick way to put a trace on a wire.

use crate::bridge::{LiveIo, LivePort};
use crate::{exit, fail, gen_config, Failure};
use anyhow::Context;
use clap::Args;
use sluice_io::TraceReader;
use sluice_packet::{Meta, Packet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args)]
pub(crate) struct SendArgs {
    /// The interface to send from (needs root).
    #[arg(long)]
    interface: String,
    /// The packets: a pcap or pcapng file ...
    #[arg(long, short, conflicts_with = "gen", required_unless_present = "gen")]
    input: Option<PathBuf>,
    /// ... or generated: long, short, mixed, demo or FLOWSxPACKETS.
    #[arg(long)]
    gen: Option<String>,
    /// With --gen: scale factor (fraction of the workload's flows).
    #[arg(long, default_value_t = 0.01)]
    scale: f64,
    /// With --gen: frame size, mix or a byte count (64..=1500).
    #[arg(long, default_value = "64")]
    size: String,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Packets per second; 0 sends as fast as the interface takes them.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Send for this many seconds, looping over the packets.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Stop after this many packets (whichever of --duration and --count comes first).
    #[arg(long)]
    count: Option<u64>,
    /// Rewrite every frame's destination MAC address to this one (e.g. the next hop's, so a
    /// kernel router forwards them), `aa:bb:cc:dd:ee:ff`.
    #[arg(long, value_name = "MAC", value_parser = parse_mac)]
    dst_mac: Option<[u8; 6]>,
    /// How to send: afpacket or xdp.
    #[arg(long, value_enum, default_value = "afpacket")]
    io: LiveIo,
    /// Also write the result as JSON to this file (`-` for stdout, replacing the text).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let mut mac = [0u8; 6];
    if parts.len() != 6 {
        return Err(format!("{s:?} is not a MAC address (six hex bytes separated by ':')"));
    }
    for (b, p) in mac.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?} is not a MAC address: bad byte {p:?}"))?;
    }
    Ok(mac)
}

/// Frames to send, in memory, with the destination MAC rewritten if asked.
fn load(a: &SendArgs) -> Result<Vec<Packet>, Failure> {
    let mut frames: Vec<Vec<u8>> = Vec::new();
    if let Some(path) = &a.input {
        let mut reader = TraceReader::open(path)
            .with_context(|| format!("opening {}", path.display()))
            .map_err(fail(exit::BAD_INPUT))?;
        while let Some(rec) = reader
            .next_record()
            .with_context(|| format!("reading {}", path.display()))
            .map_err(fail(exit::BAD_INPUT))?
        {
            frames.push(rec.data.to_vec());
        }
    } else if let Some(w) = &a.gen {
        let cfg = gen_config(w, a.scale, &a.size, a.seed)?;
        let gen = sluice_io::generate(&cfg).map_err(|e| fail(exit::INVALID)(e.into()))?;
        frames.extend(gen.map(|(_, f)| f));
    }
    let packets: Vec<Packet> = frames
        .into_iter()
        .filter(|f| f.len() >= 14)
        .map(|mut f| {
            if let Some(mac) = a.dst_mac {
                f[..6].copy_from_slice(&mac);
            }
            Packet::from_slice(&f, Meta::default())
        })
        .collect();
    if packets.is_empty() {
        return Err(fail(exit::BAD_INPUT)(anyhow::anyhow!("no Ethernet frames to send (none of at least 14 bytes)")));
    }
    Ok(packets)
}

pub(crate) fn cmd_send(a: SendArgs) -> Result<(), Failure> {
    if !(a.rate >= 0.0 && a.rate.is_finite() && a.duration > 0.0 && a.duration.is_finite()) {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--rate must be >= 0 and --duration > 0")));
    }
    let packets = load(&a)?;
    let opened = |e: String| fail(exit::FAILED)(anyhow::anyhow!("{e}"));
    match a.io {
        LiveIo::Afpacket => {
            let c = sluice_afpacket::RingConfig::default();
            let port = sluice_afpacket::AfPacketPort::open(&a.interface, &c).map_err(|e| opened(e.to_string()))?;
            send_with(&a, port, &packets)
        }
        LiveIo::Xdp => {
            let port = sluice_afxdp::XdpPort::open(&a.interface, &sluice_afxdp::XdpConfig::default())
                .map_err(|e| opened(e.to_string()))?;
            send_with(&a, port, &packets)
        }
    }
}

const BATCH: usize = 64;

fn send_with<P: LivePort>(a: &SendArgs, mut port: P, packets: &[Packet]) -> Result<(), Failure> {
    let limit = a.count.unwrap_or(u64::MAX);
    let duration = Duration::from_secs_f64(a.duration);
    let start = Instant::now();
    let (mut sent, mut pos, mut stalls) = (0u64, 0usize, 0u64);
    loop {
        let elapsed = start.elapsed();
        if elapsed >= duration || sent >= limit {
            break;
        }
        let mut want = (BATCH as u64).min((packets.len() - pos) as u64).min(limit - sent);
        if a.rate > 0.0 {
            let due = (elapsed.as_secs_f64() * a.rate) as u64 + 1;
            want = want.min(due.saturating_sub(sent));
            if want == 0 {
                std::thread::sleep(Duration::from_micros(20));
                continue;
            }
        }
        let n = port.send(&packets[pos..pos + want as usize]).map_err(|e| fail(exit::FAILED)(anyhow::anyhow!(e)))?;
        if n == 0 {
            stalls += 1;
            std::thread::yield_now();
        }
        sent += n as u64;
        pos = (pos + n) % packets.len();
    }
    // Let the last frames leave before the counters are read.
    std::thread::sleep(Duration::from_millis(50));
    let _ = port.send(&[]);
    let secs = start.elapsed().as_secs_f64().min(a.duration);
    let (ports, line) = port.report();
    let result = serde_json::json!({
        "interface": a.interface, "sent": sent, "seconds": secs, "pps": sent as f64 / secs,
        "distinct_packets": packets.len(), "full_ring_waits": stalls, "port": ports,
    });
    if a.json.as_deref() != Some(std::path::Path::new("-")) {
        println!(
            "sent {sent} packets in {secs:.2} s from {} ({:.3} Mpps; {} distinct, looped)\n{line}",
            a.interface,
            sent as f64 / secs / 1e6,
            packets.len()
        );
    }
    if let Some(p) = &a.json {
        let text = serde_json::to_string_pretty(&result).context("serialising the result")? + "\n";
        if p == std::path::Path::new("-") {
            print!("{text}");
        } else {
            std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
        }
    }
    Ok(())
}
