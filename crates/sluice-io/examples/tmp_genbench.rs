use sluice_io::gen::{self, FrameSize, GenConfig, Workload};
use std::time::Instant;
fn main() {
    for size in [FrameSize::Mix, FrameSize::Fixed(64)] {
        let cfg = GenConfig { scale: 0.1, size, ..GenConfig::new(Workload::Long, 1) };
        let t = Instant::now();
        let mut b = 0u64;
        for (_, f) in gen::generate(&cfg).unwrap() { b += f.len() as u64; }
        let dt = t.elapsed();
        println!("{size:?}: {b} bytes, {:.2} Mpps", 3e6 / dt.as_secs_f64() / 1e6);
    }
}
