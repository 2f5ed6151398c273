//! Operations per second through the Redis backend, to compare with `redis-benchmark -t
//! get,set,incr`. Usage: `cargo run --release -p sluice-redis --example opsbench -- URL [N]`.
//! Measures blocking single requests (one round trip each, like `redis-benchmark -P 1`) and
//! batches of 64 requests (one `FCALL` per node per batch).

use sluice_packet::InstanceId;
use sluice_redis::RedisBackend;
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, Replies, Request, StoreKey, StoreOp};
use std::time::Instant;

/// A named operation generator.
type NamedOp = (&'static str, fn(u64) -> StateOp);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6390".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let sep = if url.contains('?') { '&' } else { '?' };
    let backend = RedisBackend::connect(&format!("{url}{sep}prefix=opsbench-{}", std::process::id()))?;
    let me = InstanceId::new(1, 0);
    let mut conn = backend.connect(me)?;
    let ops: [NamedOp; 3] =
        [("set", |i| StateOp::Set(Value::Int(i as i64))), ("get", |_| StateOp::Get), ("incr", |_| StateOp::Incr(1))];
    let mut number = 0;
    for batch in [1usize, 64] {
        for (name, op) in &ops {
            let mut id = 0;
            let t = Instant::now();
            let mut done = 0;
            while done < n {
                let reqs: Vec<Request> = (0..batch as u64)
                    .map(|j| {
                        id += 1;
                        let key = StoreKey { vertex: 1, object: 0, key: StateKey::Id((done + j) % 1000) };
                        Request { id, client: me, tag: None, key, op: StoreOp::State(op(done + j)), reply: true }
                    })
                    .collect();
                number += 1;
                conn.send(number, reqs.into())?;
                let mut r = Replies::default();
                conn.poll(&mut r)?;
                done += batch as u64;
            }
            let s = t.elapsed().as_secs_f64();
            println!("{name:>5} batch {batch:>3}: {:>9.0} ops/s ({:.1} µs/op)", n as f64 / s, s * 1e6 / n as f64);
        }
    }
    backend.clear()?;
    Ok(())
}
