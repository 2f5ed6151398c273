//! Checks that every [`StoreClient`] mode (External, Cached, Async) and [`LocalState`] agree on
//! one seeded script of operations.
//!
//! [`StoreClient`]: crate::client::StoreClient

use super::raw::Raw;
use super::support::{
    clk, ensure, fresh_base, meta, open_client, random_op, same_result, skey, small_value, Rng, CUSTOM_OPS,
};
use crate::backend::Backend;
use crate::client::{ClientConfig, Mode};
use sluice_packet::InstanceId;
use sluice_state::{AccessPattern, LocalState, ObjectId, Scope, StateDecl, StateHandle, StateKey, StateOp, Value};

/// One step of a script every state handle runs.
#[derive(Debug, Clone)]
enum Step {
    /// `end_batch` then `begin_batch`.
    Batch,
    /// `end_packet`, then `begin_packet` with the next clock.
    Packet,
    /// A blocking operation; its result is compared.
    Exec(u16, usize, StateOp),
    /// A non-blocking update.
    ExecNb(u16, usize, StateOp),
    /// `set_exclusive`.
    Exclusive(u16, bool),
}

const OBJECTS: u16 = 4;
const KEYS: usize = 4;

fn mode_decls() -> [StateDecl; OBJECTS as usize] {
    [
        StateDecl::new("flows", Scope::per_flow(), AccessPattern::ReadWriteOften),
        StateDecl::new("map", Scope::global(), AccessPattern::ReadHeavy),
        StateDecl::new("pool", Scope::global(), AccessPattern::ReadWriteOften),
        StateDecl::new("counters", Scope::global(), AccessPattern::WriteMostly),
    ]
}

fn script(seed: u64, steps: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    if seed % 2 == 1 {
        // Exclusive from the start (the single-instance vertex).
        out.push(Step::Exclusive(1, true));
        out.push(Step::Exclusive(2, true));
    }
    out.push(Step::Packet);
    for _ in 0..steps {
        let r = rng.below(100);
        if r < 8 {
            out.push(Step::Batch);
            if rng.chance(25) {
                out.push(Step::Exclusive(1 + rng.below(2) as u16, rng.chance(50)));
            }
            out.push(Step::Packet);
            continue;
        }
        if r < 30 {
            out.push(Step::Packet);
        }
        let obj = rng.below(u64::from(OBJECTS)) as u16;
        let key = rng.below(KEYS as u64) as usize;
        if obj == 3 {
            // Write-mostly: counters at keys 0-1, lists at keys 2-3, so that non-blocking
            // updates never fail (a failure is reported by LocalState, not by an async client).
            let counter = key < 2;
            out.push(match (counter, rng.below(10)) {
                (true, 0..=6) => Step::ExecNb(obj, key, StateOp::Incr(rng.range(-2, 5))),
                (true, _) => Step::Exec(obj, key, StateOp::Get),
                (false, 0..=5) => Step::ExecNb(obj, key, StateOp::Push(Value::Int(rng.range(0, 99)))),
                (false, 6..=7) => Step::Exec(obj, key, StateOp::Pop),
                (false, _) => Step::Exec(obj, key, StateOp::Get),
            });
        } else if rng.chance(15) {
            let op = if rng.chance(75) { StateOp::Set(small_value(&mut rng)) } else { StateOp::Delete };
            out.push(Step::ExecNb(obj, key, op));
        } else {
            out.push(Step::Exec(obj, key, random_op(&mut rng)));
        }
    }
    out.push(Step::Batch);
    out
}

type Outcome = Result<Option<Value>, String>;

fn run_script(h: &mut dyn StateHandle, script: &[Step], keys: &[StateKey], base: u64) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut packet = 0u64;
    let mut m = meta(clk(base, 0));
    h.begin_batch();
    for s in script {
        match s {
            Step::Batch => {
                h.end_batch();
                h.begin_batch();
            }
            Step::Packet => {
                h.end_packet(&mut m);
                packet += 1;
                m = meta(clk(base, packet));
                h.begin_packet(&m);
            }
            Step::Exec(o, k, op) => {
                let key = keys.get(*k).copied().unwrap_or(StateKey::Unit);
                out.push(h.exec(ObjectId(*o), &key, op.clone()).map_err(|e| e.to_string()));
            }
            Step::ExecNb(o, k, op) => {
                let key = keys.get(*k).copied().unwrap_or(StateKey::Unit);
                out.push(h.exec_nb(ObjectId(*o), &key, op.clone()).map(|_| None).map_err(|e| e.to_string()));
            }
            Step::Exclusive(o, e) => h.set_exclusive(ObjectId(*o), *e),
        }
    }
    h.end_packet(&mut m);
    h.end_batch();
    out
}

/// The same seeded script of operations (blocking and non-blocking, on a per-flow, a read-heavy
/// shared, a read/write-often shared and a write-mostly object, with exclusivity switched on and
/// off) through [`StoreClient`]s in External, Cached and Async mode (vertices `vertex`,
/// `vertex + 1`, `vertex + 2`) and through [`LocalState`]: every operation's result agrees
/// (equal values, or all fail), and after `flush()` the values read back through each handle,
/// and straight from the store, agree.
///
/// [`StoreClient`]: crate::client::StoreClient
pub fn client_modes_agree_seed(b: &dyn Backend, vertex: u16, seed: u64, steps: usize) -> Result<(), String> {
    let base = fresh_base();
    let decls = mode_decls();
    let keys: Vec<StateKey> = (0..KEYS as u64).map(|k| StateKey::Id(base + k)).collect();
    let s = script(seed, steps);
    let mut local = LocalState::new(&decls, &CUSTOM_OPS);
    let want = run_script(&mut local, &s, &keys, base);
    let modes = [Mode::External, Mode::Cached, Mode::Async];
    let mut clients = Vec::new();
    for (i, mode) in modes.into_iter().enumerate() {
        let v = vertex + i as u16;
        b.register_custom_ops(v, &CUSTOM_OPS).map_err(|e| format!("register_custom_ops: {e}"))?;
        let config = ClientConfig { mode, ..Default::default() };
        let mut c = open_client(b, InstanceId::new(v, 0), &decls, &CUSTOM_OPS, config)?;
        let got = run_script(&mut c, &s, &keys, base);
        let ops: Vec<&Step> = s.iter().filter(|x| matches!(x, Step::Exec(..) | Step::ExecNb(..))).collect();
        for (n, (g, w)) in got.iter().zip(&want).enumerate() {
            ensure(same_result(g, w), || {
                format!(
                    "seed {seed}: operation {n} ({:?}): {mode:?} client returned {g:?}, LocalState {w:?}",
                    ops.get(n)
                )
            })?;
        }
        ensure(got.len() == want.len(), || format!("{mode:?}: {} results, LocalState {}", got.len(), want.len()))?;
        c.flush().map_err(|e| format!("seed {seed}: {mode:?}: flush: {e}"))?;
        clients.push((mode, v, c));
    }
    let mut reader = Raw::open(b, InstanceId::new(vertex, 99))?;
    for o in 0..OBJECTS {
        for k in &keys {
            let w = local.get(ObjectId(o), k).map_err(|e| e.to_string())?;
            for (mode, v, c) in &mut clients {
                let g = c.get(ObjectId(o), k).map_err(|e| format!("{mode:?}: final get: {e}"))?;
                ensure(g == w, || {
                    format!("seed {seed}: object {o} key {k:?}: {mode:?} client reads {g:?}, LocalState {w:?}")
                })?;
                let st = reader.get(skey(*v, o, *k))?;
                ensure(st == w, || {
                    format!("seed {seed}: object {o} key {k:?}: after flush the store holds {st:?} for the {mode:?} client, LocalState {w:?}")
                })?;
            }
        }
    }
    Ok(())
}

/// [`client_modes_agree_seed`] for three seeds.
pub fn client_modes_agree(b: &dyn Backend) -> Result<(), String> {
    for seed in 1..=3 {
        client_modes_agree_seed(b, 1014, seed, 300)?;
    }
    Ok(())
}
