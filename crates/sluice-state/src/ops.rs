//! The semantics of every [`StateOp`], in one place, for every backend that holds values in
//! memory (the local backend here, the embedded store later).

use crate::decl::CustomOp;
use crate::handle::StateError;
use crate::value::{StateOp, Value};
use std::collections::VecDeque;

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Int(_) => "int",
        Value::Float(_) => "float",
        Value::Endpoint(..) => "endpoint",
        Value::Tuple(_) => "tuple",
        Value::Ints(_) => "ints",
        Value::List(_) => "list",
        Value::Bytes(_) => "bytes",
    }
}

fn wrong(op: &'static str, v: &Value) -> StateError {
    StateError::WrongType { op, found: kind(v) }
}

/// Applies `op` to the value in `slot` (`None`: absent) and returns the operation's result.
/// On error the slot is unchanged.
pub fn apply(slot: &mut Option<Value>, op: StateOp, custom: &[CustomOp]) -> Result<Option<Value>, StateError> {
    match op {
        StateOp::Get => Ok(slot.clone()),
        StateOp::Set(v) => {
            *slot = Some(v);
            Ok(None)
        }
        StateOp::Delete => Ok(slot.take()),
        StateOp::Incr(d) => match slot {
            None => {
                *slot = Some(Value::Int(d));
                Ok(Some(Value::Int(d)))
            }
            Some(Value::Int(i)) => {
                *i = i.wrapping_add(d);
                Ok(Some(Value::Int(*i)))
            }
            Some(Value::Float(f)) => {
                *f += d as f64;
                Ok(Some(Value::Float(*f)))
            }
            Some(v) => Err(wrong("incr", v)),
        },
        StateOp::Push(x) => match slot {
            None => {
                *slot = Some(Value::List(VecDeque::from([x])));
                Ok(Some(Value::Int(1)))
            }
            Some(Value::List(l)) => {
                l.push_back(x);
                Ok(Some(Value::Int(l.len() as i64)))
            }
            Some(v) => Err(wrong("push", v)),
        },
        StateOp::Pop => match slot {
            None => Ok(None),
            Some(Value::List(l)) => Ok(l.pop_front()),
            Some(v) => Err(wrong("pop", v)),
        },
        StateOp::PopN(n) => match slot {
            None => Ok(Some(Value::List(VecDeque::new()))),
            Some(Value::List(l)) => {
                let k = (n as usize).min(l.len());
                Ok(Some(Value::List(l.drain(..k).collect())))
            }
            Some(v) => Err(wrong("pop_n", v)),
        },
        StateOp::CompareAndSet { expect, new } => {
            if *slot == expect {
                *slot = Some(new);
                Ok(Some(Value::Int(1)))
            } else {
                Ok(slot.clone())
            }
        }
        StateOp::Record(v) => Ok(Some(v)),
        StateOp::Custom { op, arg } => {
            let c = custom.get(usize::from(op)).ok_or(StateError::UnknownCustomOp(op))?;
            let before = slot.clone();
            let r = (c.apply)(slot, &arg);
            if r.is_err() {
                *slot = before;
            }
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incr_push_pop_cas() {
        let mut s = None;
        assert_eq!(apply(&mut s, StateOp::Incr(2), &[]).ok(), Some(Some(Value::Int(2))));
        assert_eq!(apply(&mut s, StateOp::Incr(-5), &[]).ok(), Some(Some(Value::Int(-3))));
        assert!(apply(&mut s, StateOp::Pop, &[]).is_err());
        let mut l = None;
        for i in 0..3 {
            apply(&mut l, StateOp::Push(Value::Int(i)), &[]).ok();
        }
        assert_eq!(apply(&mut l, StateOp::Pop, &[]).ok(), Some(Some(Value::Int(0))));
        let two = apply(&mut l, StateOp::PopN(5), &[]).ok().flatten();
        assert_eq!(two, Some(Value::List(VecDeque::from([Value::Int(1), Value::Int(2)]))));
        let mut c = Some(Value::Int(1));
        let r = apply(&mut c, StateOp::CompareAndSet { expect: Some(Value::Int(2)), new: Value::Int(3) }, &[]);
        assert_eq!(r.ok(), Some(Some(Value::Int(1))));
        assert_eq!(c, Some(Value::Int(1)));
        let r = apply(&mut c, StateOp::CompareAndSet { expect: Some(Value::Int(1)), new: Value::Int(3) }, &[]);
        assert_eq!(r.ok(), Some(Some(Value::Int(1))));
        assert_eq!(c, Some(Value::Int(3)));
    }

    #[test]
    fn failing_custom_op_leaves_value() {
        fn bad(s: &mut Option<Value>, _: &Value) -> Result<Option<Value>, StateError> {
            *s = None;
            Err(StateError::Custom("no"))
        }
        let ops = [CustomOp { name: "bad", apply: bad }];
        let mut s = Some(Value::Int(7));
        assert!(apply(&mut s, StateOp::Custom { op: 0, arg: Value::Int(0) }, &ops).is_err());
        assert_eq!(s, Some(Value::Int(7)));
        assert!(apply(&mut s, StateOp::Custom { op: 1, arg: Value::Int(0) }, &ops).is_err());
    }
}
