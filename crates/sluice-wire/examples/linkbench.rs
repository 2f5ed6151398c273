//! Round trips over a loopback link: how long a batch of packets takes to cross from one
//! process's sender to another's receiver, which is what a chain pays per crossing between
//! nodes on top of its NFs. One thread sends a batch, a second receives it and sends it back;
//! half the round trip is the one-way time (`sluice_wire::port::round_trips`).
//!
//! `cargo run --release -p sluice-wire --example linkbench -- [ROUND_TRIPS] [BATCH] [FRAME_BYTES]`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rounds = args.first().copied().unwrap_or(10_000).max(1) as usize;
    let batch = args.get(1).copied().unwrap_or(1).clamp(1, 64) as usize;
    let size = args.get(2).copied().unwrap_or(64).clamp(14, 9000) as usize;
    let mut rtts = sluice_wire::port::round_trips(rounds, batch, size)?;
    rtts.sort();
    let pct = |p: f64| rtts[((rtts.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6 / 2.0;
    println!(
        "{rounds} round trips, {batch} packet(s) of {size} B each way: one way p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    Ok(())
}
