//! Part 3: store operations per second. `get`, `set`, `incr` through a raw connection in
//! batches of 1 and 64, for the embedded store (1 and 2 shard threads) and Redis, next to
//! `redis-benchmark` run as a subprocess on the same server.

use super::store::{clear_redis, Env, RawClient};
use super::BenchStoreArgs;
use crate::bench::common::{ratio, Stat};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use sluice_packet::InstanceId;
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::StoreKey;
use std::collections::BTreeMap;
use std::time::Instant;

/// Distinct keys the operations-per-second part spreads its requests over.
const OPS_KEYS: u64 = 1_000;

/// Operations per second of one (store, operation, batch) or `redis-benchmark` line.
#[derive(Debug, Clone, Serialize)]
pub(super) struct OpsResult {
    pub(super) store: String,
    pub(super) op: String,
    /// Requests per batch (`sluice`), or pipeline depth (`redis-benchmark -P`).
    pub(super) batch: usize,
    /// `redis-benchmark` clients (`-c`); 1 for `sluice`'s single connection.
    pub(super) clients: usize,
    pub(super) ops_per_s: Stat,
    repeats: Vec<f64>,
}

/// Every (store, operation, batch) `repeat` times, and `redis-benchmark` where there is Redis
/// and the program; why `redis-benchmark` did not run goes to `not_run`.
pub(super) fn run_ops(
    a: &BenchStoreArgs,
    env: &Env,
    repeat: usize,
    not_run: &mut Vec<String>,
) -> Result<Vec<OpsResult>> {
    let mut results = Vec::new();
    let n = if a.quick { 2_000 } else { a.ops.max(64) };
    let mut cases: Vec<(String, usize)> = vec![("embedded-1".into(), 1), ("embedded-2".into(), 2)];
    if env.redis.is_some() {
        cases.push(("redis".into(), 0));
    }
    let mut table: BTreeMap<(String, String, usize, usize), Vec<f64>> = BTreeMap::new();
    let mut order: Vec<(String, String, usize, usize)> = Vec::new();
    let mut push = |k: (String, String, usize, usize), v: f64| {
        if !table.contains_key(&k) {
            order.push(k.clone());
        }
        table.entry(k).or_default().push(v);
    };
    let bench_port = env.redis.and_then(redis_port);
    let have_rb = which("redis-benchmark");
    if env.redis.is_some() && !have_rb {
        not_run.push("redis-benchmark: not run: not found on PATH".to_string());
    }
    for r in 0..repeat {
        for (store, threads) in &cases {
            let n = if *threads == 0 { a.redis_ops.max(64) } else { n };
            for (op, rate) in store_ops(env, store, *threads, n)? {
                eprintln!("[ops {}/{}] {:<11} {:<10} {:>11.0} ops/s", r + 1, repeat, store, op.0, rate);
                push((store.clone(), op.0.to_string(), op.1, 1), rate);
            }
        }
        if let (Some(port), true) = (bench_port, have_rb) {
            for (clients, pipeline) in [(1usize, 1usize), (50, 64)] {
                let n = if clients == 1 { a.redis_ops.max(1) } else { a.redis_benchmark_n.max(1) };
                for (op, rate) in redis_benchmark(port, n, clients, pipeline)? {
                    eprintln!(
                        "[ops {}/{}] redis-benchmark -c {clients} -P {pipeline} {op:<5} {rate:>11.0} ops/s",
                        r + 1,
                        repeat
                    );
                    push(("redis-benchmark".into(), op, pipeline, clients), rate);
                }
            }
        }
    }
    for k in order {
        let v = table.remove(&k).unwrap_or_default();
        results.push(OpsResult {
            store: k.0,
            op: k.1,
            batch: k.2,
            clients: k.3,
            ops_per_s: Stat::of(v.iter().copied()),
            repeats: v,
        });
    }
    Ok(results)
}

/// A named operation generator.
type NamedOp = (&'static str, fn(u64) -> StateOp);

/// `get`, `set`, `incr` in batches of 1 and 64 over one connection: ((op, batch), ops/s).
fn store_ops(env: &Env, store: &str, threads: usize, n: usize) -> Result<Vec<((&'static str, usize), f64)>> {
    let store = env.store(store.starts_with("redis"), threads)?;
    let mut client = RawClient::open(store.backend.as_ref(), InstanceId::new(3, 0))?;
    let ops: [NamedOp; 3] =
        [("set", |i| StateOp::Set(Value::Int(i as i64))), ("get", |_| StateOp::Get), ("incr", |_| StateOp::Incr(1))];
    let mut out = Vec::new();
    for batch in [1usize, 64] {
        for (name, op) in &ops {
            let t = Instant::now();
            let mut done = 0u64;
            while done < n as u64 {
                let reqs: Vec<(StoreKey, StateOp)> = (0..batch as u64)
                    .map(|j| {
                        let key = StoreKey { vertex: 3, object: 0, key: StateKey::Id((done + j) % OPS_KEYS) };
                        (key, op(done + j))
                    })
                    .collect();
                client.call(reqs)?;
                done += batch as u64;
            }
            out.push(((*name, batch), ratio(done as f64, t.elapsed().as_secs_f64())));
        }
    }
    clear_redis(store.redis.as_deref())?;
    Ok(out)
}

/// The port of a `redis://host:port...` URL.
fn redis_port(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("redis://")?;
    let hostport = rest.split(['/', '?']).next()?;
    let hostport = hostport.rsplit('@').next()?;
    hostport.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}

/// Whether a program is on `PATH`.
fn which(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// Runs `redis-benchmark -t get,set,incr -q` on 127.0.0.1 and parses its requests per second.
fn redis_benchmark(port: u16, n: usize, clients: usize, pipeline: usize) -> Result<Vec<(String, f64)>> {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", "get,set,incr", "-n", &n.to_string(), "-q"])
        .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
        .output()
        .context("running redis-benchmark")?;
    if !out.status.success() {
        bail!("redis-benchmark failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(parse_redis_benchmark(&String::from_utf8_lossy(&out.stdout)))
}

/// Parses `SET: 123456.79 requests per second, p50=0.207 msec` lines (progress lines, separated
/// by carriage returns, are skipped).
fn parse_redis_benchmark(text: &str) -> Vec<(String, f64)> {
    text.split(['\r', '\n'])
        .filter(|l| l.contains("requests per second"))
        .filter_map(|l| {
            let (op, rest) = l.split_once(':')?;
            let rate: f64 = rest.split_whitespace().next()?.parse().ok()?;
            Some((op.trim().to_ascii_lowercase(), rate))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis_benchmark_output() {
        let text = "SET: rps=0.0 (overall: nan) avg_msec=nan (overall: nan)\r\
                    SET: 94696.97 requests per second, p50=0.263 msec\n\
                    GET: 101010.10 requests per second, p50=0.247 msec\n\
                    INCR: 99009.90 requests per second\n";
        let v = parse_redis_benchmark(text);
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].0, "set");
        assert!((v[1].1 - 101010.10).abs() < 1e-6);
    }

    #[test]
    fn redis_port_of_urls() {
        assert_eq!(redis_port("redis://127.0.0.1:6390"), Some(6390));
        assert_eq!(redis_port("redis://127.0.0.1:6390/0?prefix=x"), Some(6390));
        assert_eq!(redis_port("redis://127.0.0.1"), None);
    }
}
