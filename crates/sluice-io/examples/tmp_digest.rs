use std::hash::{Hash, Hasher};
fn main() {
    for (w, size) in [("50x30", "mix"), ("20x100", "64"), ("short", "mix")] {
        let mut cfg = sluice_io::GenConfig::new(w.parse().unwrap(), 7);
        cfg.size = size.parse().unwrap();
        cfg.scale = 0.01;
        cfg.concurrency = 16;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut n = 0u64;
        for (ts, f) in sluice_io::generate(&cfg).unwrap() {
            ts.hash(&mut h);
            f.hash(&mut h);
            n += 1;
        }
        println!("{w} {size} {n} {:016x}", h.finish());
    }
}
