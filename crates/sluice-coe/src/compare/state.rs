//! Final state, entry by entry under the renaming; allocation objects by size only.

use super::renaming::{ep_text, Mapping};
use super::{DiffKind, Difference, Sink};
use crate::observed::StateEntry;
use sluice_state::{StateKey, Value};
use std::collections::{BTreeMap, HashMap};

fn key_text(k: &StateKey) -> String {
    match k {
        StateKey::Unit => "unit".to_string(),
        StateKey::Flow(f) => f.to_string(),
        StateKey::Addr(ip) => ip.to_string(),
        StateKey::Endpoint(ip, port, proto) => ep_text((*ip, *port, *proto)),
        StateKey::Id(n) => format!("#{n}"),
    }
}

fn value_text(v: &Value) -> String {
    let mut s = format!("{v:?}");
    if s.len() > 160 {
        let mut cut = 160;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

fn floats_close(a: f64, b: f64, tol: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol * a.abs().max(b.abs())
}

/// Whether a reference value matches a physical one under the renaming.
fn values_match(r: &Value, p: &Value, m: &Mapping, tol: f64) -> bool {
    match (r, p) {
        (Value::Int(a), Value::Int(b)) => a == b,
        (Value::Float(a), Value::Float(b)) => floats_close(*a, *b, tol),
        (Value::Endpoint(..), Value::Endpoint(..)) | (Value::Tuple(_), Value::Tuple(_)) => m.value(r) == *p,
        (Value::Ints(a), Value::Ints(b)) => a == b,
        (Value::Bytes(a), Value::Bytes(b)) => a == b,
        (Value::List(a), Value::List(b)) => {
            if a.len() != b.len() {
                return false;
            }
            let all_ints = |l: &std::collections::VecDeque<Value>| l.iter().all(|v| matches!(v, Value::Int(_)));
            if m.ports_renamed && all_ints(a) && all_ints(b) {
                return true; // allocation pools: which ports are free depends on the choices made
            }
            let mut ra: Vec<String> = a.iter().map(|v| format!("{:?}", m.value(v))).collect();
            let mut pb: Vec<String> = b.iter().map(|v| format!("{v:?}")).collect();
            ra.sort_unstable();
            pb.sort_unstable();
            ra == pb
        }
        _ => false,
    }
}

/// Compares the final state of both runs: allocation objects by how many values they hold,
/// every other entry by key and value under the renaming.
pub(super) fn compare_state(reference: &[StateEntry], physical: &[StateEntry], m: &Mapping, tol: f64, sink: &mut Sink) {
    compare_allocations(reference, physical, sink);
    let reference: Vec<&StateEntry> = reference.iter().filter(|e| !e.allocation).collect();
    let physical: Vec<&StateEntry> = physical.iter().filter(|e| !e.allocation).collect();
    compare_entries(&reference, &physical, m, tol, sink);
}

/// The number of values each allocation object (by vertex and object) holds, with its name.
fn allocation_sizes(entries: &[StateEntry]) -> BTreeMap<(String, u16), (String, u64)> {
    let mut sizes: BTreeMap<(String, u16), (String, u64)> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.allocation) {
        sizes.entry((e.vertex.clone(), e.object)).or_insert_with(|| (e.object_name.clone(), 0)).1 += 1;
    }
    sizes
}

/// Objects recording allocation choices: equivalent when they hold as many values (which
/// values depends on the choices made).
fn compare_allocations(reference: &[StateEntry], physical: &[StateEntry], sink: &mut Sink) {
    let (rc, pc) = (allocation_sizes(reference), allocation_sizes(physical));
    for ((vertex, object), (name, n)) in &rc {
        let got = pc.get(&(vertex.clone(), *object)).map_or(0, |v| v.1);
        sink.stats.state_entries_compared += 1;
        if got != *n {
            sink.push(
                Difference::new(
                    DiffKind::StateMismatch,
                    format!("{name} (allocations) holds {got} value(s) in the physical run, {n} in the reference"),
                )
                .vertex(vertex),
            );
        }
    }
    for ((vertex, object), (name, n)) in &pc {
        if !rc.contains_key(&(vertex.clone(), *object)) {
            sink.push(
                Difference::new(
                    DiffKind::StateExtra,
                    format!("{name} (allocations) holds {n} value(s) only in the physical run"),
                )
                .vertex(vertex),
            );
        }
    }
}

/// Every other entry: each reference entry must be in the physical run under its renamed key,
/// with a matching value; physical entries left over are extra.
fn compare_entries(reference: &[&StateEntry], physical: &[&StateEntry], m: &Mapping, tol: f64, sink: &mut Sink) {
    let mut phys: HashMap<(&str, u16, StateKey), &StateEntry> =
        physical.iter().map(|e| ((e.vertex.as_str(), e.object, e.key), *e)).collect();
    for r in reference {
        sink.stats.state_entries_compared += 1;
        let key = m.key(&r.key);
        let renamed = if key != r.key { format!(" (renamed {})", key_text(&key)) } else { String::new() };
        let what = format!("{}[{}]{renamed}", r.object_name, key_text(&r.key));
        match phys.remove(&(r.vertex.as_str(), r.object, key)) {
            None => sink.push(
                Difference::new(DiffKind::StateMissing, format!("{what} = {} missing", value_text(&r.value)))
                    .vertex(&r.vertex),
            ),
            Some(p) if !values_match(&r.value, &p.value, m, tol) => {
                // A renamed value is what was compared: say so when it differs from the
                // reference's own (equal-looking values otherwise hide the cause).
                let renamed = m.value(&r.value);
                let as_renamed =
                    if renamed == r.value { String::new() } else { format!(" (renamed {})", value_text(&renamed)) };
                sink.push(
                    Difference::new(
                        DiffKind::StateMismatch,
                        format!(
                            "{what} is {} in the physical run, {}{as_renamed} in the reference",
                            value_text(&p.value),
                            value_text(&r.value)
                        ),
                    )
                    .vertex(&r.vertex),
                )
            }
            Some(_) => {}
        }
    }
    let mut extra: Vec<&StateEntry> = phys.into_values().collect();
    extra.sort_by(|a, b| (&a.vertex, a.object, a.key).cmp(&(&b.vertex, b.object, b.key)));
    for p in extra {
        sink.push(
            Difference::new(
                DiffKind::StateExtra,
                format!("{}[{}] = {} not in the reference", p.object_name, key_text(&p.key), value_text(&p.value)),
            )
            .vertex(&p.vertex),
        );
    }
}
