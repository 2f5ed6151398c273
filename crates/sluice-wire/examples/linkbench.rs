//! Round trips over a loopback link: how long a batch of packets takes to cross from one
//! process's sender to another's receiver, which is what a chain pays per crossing between
//! nodes on top of its NFs. One thread sends a batch, a second receives it and sends it back;
//! half the round trip is the one-way time.
//!
//! `cargo run --release -p sluice-wire --example linkbench -- [ROUND_TRIPS] [BATCH] [FRAME_BYTES]`

use sluice_packet::{Meta, Packet};
use sluice_wire::{Receiver, Sender, TO_ROOT};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rounds = args.first().copied().unwrap_or(10_000) as usize;
    let batch = args.get(1).copied().unwrap_or(1).clamp(1, 64) as usize;
    let size = args.get(2).copied().unwrap_or(64).clamp(14, 9000) as usize;
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let wait = Duration::from_secs(2);
    let mut a_rx = Receiver::bind(any, 1, wait, 9216)?;
    let mut b_rx = Receiver::bind(any, 1, wait, 9216)?;
    let (a_addr, b_addr) = (a_rx.local_addr()?, b_rx.local_addr()?);
    let packets: Vec<Packet> = (0..batch).map(|_| Packet::from_slice(&vec![0u8; size], Meta::default())).collect();

    // The far end: whatever arrives goes back.
    let echo = std::thread::spawn(move || -> Result<(), sluice_wire::PortError> {
        let mut back = Sender::new(any, a_addr, 1)?;
        let mut got = Vec::new();
        for _ in 0..rounds {
            while got.len() < batch {
                if b_rx.recv(|d| got.push(Packet::from_slice(d.frame, d.meta)))? == 0 {
                    return Ok(());
                }
            }
            back.send(&got, TO_ROOT)?;
            got.clear();
        }
        Ok(())
    });
    let mut to_b = Sender::new(any, b_addr, 1)?;
    let mut rtts = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        to_b.send(&packets, TO_ROOT)?;
        let mut n = 0;
        while n < batch {
            let got = a_rx.recv(|_| {})?;
            if got == 0 {
                return Err("a round trip timed out".into());
            }
            n += got;
        }
        rtts.push(start.elapsed());
    }
    echo.join().map_err(|_| "the echo thread panicked")??;
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
