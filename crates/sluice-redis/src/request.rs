//! Requests as `sluice_exec` arguments: the header every operation starts with, then its code
//! and operands (the layout `sluice.lua` reads).

use crate::codec::{encode_key, encode_opt, encode_value, has_float, Form};
use crate::topology::Shared;
use sluice_packet::Clock;
use sluice_state::StateOp;
use sluice_store::{OpTag, Request, StoreOp};

/// A number as 16 hex digits, so that text order is numeric order (the log and timer indexes
/// are ranged by text).
pub(crate) fn hex16(x: u64) -> String {
    format!("{x:016x}")
}

/// The `ZRANGEBYLEX` upper bound selecting members whose first 16 hex digits are `<= x`.
fn upto(x: u64) -> String {
    match x.checked_add(1) {
        Some(n) => format!("({}", hex16(n)),
        None => "+".to_string(),
    }
}

/// One request as `sluice_exec` arguments, with where it goes.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    /// Index of the request in its batch.
    pub(crate) req: usize,
    /// Its bucket; `None` for requests every bucket applies (`ForgetClock`, `AdvanceTime`).
    pub(crate) bucket: Option<u16>,
    /// The key's encoding (empty for broadcast requests).
    pub(crate) kenc: Vec<u8>,
    /// The arguments (header and operands).
    pub(crate) args: Vec<Vec<u8>>,
}

/// The per-clock log's name for a tag (the embedded engine's `(clock, vertex, seq)`).
fn logid(tag: OpTag, vertex: u16) -> Vec<u8> {
    format!("{}{:04x}{:08x}", hex16(tag.clock.0), vertex, tag.seq).into_bytes()
}

/// Pushes one tagged part of an operation (an `IncrMany` increment, or its result once applied
/// in the client): log id, clock, operand.
pub(crate) fn push_tagged(args: &mut Vec<Vec<u8>>, tag: OpTag, vertex: u16, operand: Vec<u8>) {
    args.push(logid(tag, vertex));
    args.push(tag.clock.0.to_string().into_bytes());
    args.push(operand);
}

/// The arguments every operation starts with: code, bucket, key encoding, whether to answer,
/// and the tag's log id and clock (empty when untagged or broadcast).
pub(crate) fn header(code: &str, bucket: Option<u16>, kenc: &[u8], req: &Request, reply: bool) -> Vec<Vec<u8>> {
    // A tagged read (a replayed packet's) is answered as of its clock (`as_of` in the script).
    let (logid, clock) = match req.tag {
        Some(t) if bucket.is_some() => (logid(t, req.key.vertex), t.clock.0.to_string().into_bytes()),
        _ => (Vec::new(), Vec::new()),
    };
    vec![
        code.as_bytes().to_vec(),
        bucket.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
        kenc.to_vec(),
        if reply { b"1".to_vec() } else { b"0".to_vec() },
        logid,
        clock,
    ]
}

/// The version a `W` write names to apply whatever the value's version (`sluice.lua`).
pub(crate) const WRITE_ANY_VERSION: &[u8] = b"*";

/// Whether every bucket applies the request (`ForgetClock`, `AdvanceTime`); the connection
/// answers it, once.
pub(crate) fn is_broadcast(op: &StoreOp) -> bool {
    matches!(op, StoreOp::ForgetClock(_) | StoreOp::AdvanceTime(_))
}

impl Op {
    /// Translates request `idx` of a batch into `sluice_exec` arguments.
    pub(crate) fn encode(shared: &Shared, idx: usize, req: &Request) -> Op {
        if is_broadcast(&req.op) {
            return Op::broadcast(idx, req);
        }
        let kenc = encode_key(&req.key);
        let bucket = shared.bucket_of(&kenc);
        let mut extra: Vec<Vec<u8>> = Vec::new();
        let code = match &req.op {
            StoreOp::State(op) => match op {
                StateOp::Get => "G",
                StateOp::Set(v) => {
                    Form::of(Some(v)).push_args(&mut extra);
                    "S"
                }
                StateOp::Delete => "D",
                StateOp::Incr(d) => {
                    extra.push(d.to_string().into_bytes());
                    "I"
                }
                StateOp::Push(x) => {
                    extra.push(encode_value(x));
                    "P"
                }
                StateOp::Pop => "O",
                StateOp::PopN(n) => {
                    extra.push(n.to_string().into_bytes());
                    "N"
                }
                StateOp::CompareAndSet { expect, new } => {
                    if expect.as_ref().is_some_and(has_float) {
                        "R"
                    } else {
                        Form::of(expect.as_ref()).push_args(&mut extra);
                        Form::of(Some(new)).push_args(&mut extra);
                        "C"
                    }
                }
                StateOp::Custom { .. } => "R",
                StateOp::Record(v) => {
                    extra.push(encode_value(v));
                    "E"
                }
            },
            StoreOp::IncrMany(incrs) => {
                extra.push(incrs.len().to_string().into_bytes());
                for (tag, d) in incrs {
                    push_tagged(&mut extra, *tag, req.key.vertex, d.to_string().into_bytes());
                }
                "J"
            }
            StoreOp::Write { value, result } => {
                // The conditional write of a custom operation's fallback, without its
                // condition (`*`) and with no increments to log beside it.
                extra.push(WRITE_ANY_VERSION.to_vec());
                Form::of(value.as_ref()).push_args(&mut extra);
                extra.push(encode_opt(result.as_ref()));
                extra.push(b"0".to_vec());
                "W"
            }
            StoreOp::Subscribe => "U",
            StoreOp::Unsubscribe => "u",
            StoreOp::SetTimer { deadline_ns } => {
                extra.push(hex16(*deadline_ns).into_bytes());
                "A"
            }
            StoreOp::CancelTimer => "a",
            StoreOp::ExpireTimer { deadline_ns } => {
                extra.push(hex16(*deadline_ns).into_bytes());
                "x"
            }
            // Answered from the per-clock log under the header's log id, or not at all.
            StoreOp::Logged => "L",
            StoreOp::Claim => "M",
            StoreOp::Release => "m",
            StoreOp::ForgetClock(_) | StoreOp::AdvanceTime(_) => "V",
        };
        let mut args = header(code, Some(bucket), &kenc, req, req.reply);
        args.extend(extra);
        Op { req: idx, bucket: Some(bucket), kenc, args }
    }

    /// A request every bucket applies: answered by the connection once, not by every node.
    fn broadcast(idx: usize, req: &Request) -> Op {
        let (code, extra) = match req.op {
            // The clock's root only: other roots' clocks are not comparable.
            StoreOp::ForgetClock(c) => ("F", vec![format!("[{}", hex16(Clock::new(c.root(), 0).0)), upto(c.0)]),
            StoreOp::AdvanceTime(t) => ("V", vec![hex16(t), upto(t)]),
            _ => ("V", Vec::new()),
        };
        let mut args = header(code, None, &[], req, false);
        args.extend(extra.into_iter().map(String::into_bytes));
        Op { req: idx, bucket: None, kenc: Vec::new(), args }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert_eq!(upto(0), "(0000000000000001");
        assert_eq!(upto(u64::MAX), "+");
    }
}
