//! Keys, values and operations.

use sluice_packet::{FiveTuple, FlowKey};
use std::collections::VecDeque;
use std::net::IpAddr;

/// The key of one value inside a state object, derived from the object's scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum StateKey {
    /// The single value of a global object.
    Unit,
    /// A connection (direction-free).
    Flow(FlowKey),
    /// A host.
    Addr(IpAddr),
    /// An endpoint: address, port and protocol number.
    Endpoint(IpAddr, u16, u8),
    /// A small integer key (a port, a backend index, ...).
    Id(u64),
}

/// Addresses go in as machine words ([`sluice_packet::hash_ip`]): every per-packet state
/// operation hashes its key, and IPv6 (or Embark's encrypted) addresses would otherwise cost a
/// length prefix and a 16-byte slice each.
impl std::hash::Hash for StateKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        use sluice_packet::hash_ip;
        match self {
            StateKey::Unit => h.write_u8(0),
            StateKey::Flow(k) => {
                h.write_u8(1);
                k.hash(h);
            }
            StateKey::Addr(a) => {
                h.write_u8(2);
                hash_ip(a, h);
            }
            StateKey::Endpoint(a, port, proto) => {
                h.write_u8(3);
                hash_ip(a, h);
                h.write_u32((u32::from(*port) << 8) | u32::from(*proto));
            }
            StateKey::Id(i) => {
                h.write_u8(4);
                h.write_u64(*i);
            }
        }
    }
}

/// A stored value. Variants are few and mostly `Copy`-sized so that reading state on the fast
/// path costs no allocation; lists and bytes exist for pools, buffers and opaque records.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Value {
    /// A signed integer (counters, states, port numbers).
    Int(i64),
    /// A float (likelihoods, scores).
    Float(f64),
    /// An address and a port.
    Endpoint(IpAddr, u16),
    /// A 5-tuple (e.g. the internal side of a NAT mapping).
    Tuple(FiveTuple),
    /// A fixed record of integers.
    Ints(Vec<i64>),
    /// A list that push/pop operate on.
    List(VecDeque<Value>),
    /// Opaque bytes (e.g. buffered out-of-order segments).
    Bytes(Vec<u8>),
}

impl Value {
    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
    /// The float, if this is one (integers convert).
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    /// The endpoint, if this is one.
    pub fn as_endpoint(&self) -> Option<(IpAddr, u16)> {
        match self {
            Value::Endpoint(a, p) => Some((*a, *p)),
            _ => None,
        }
    }
    /// The tuple, if this is one.
    pub fn as_tuple(&self) -> Option<FiveTuple> {
        match self {
            Value::Tuple(t) => Some(*t),
            _ => None,
        }
    }
    /// The integer record, if this is one.
    pub fn as_ints(&self) -> Option<&[i64]> {
        match self {
            Value::Ints(v) => Some(v),
            _ => None,
        }
    }
    /// The bytes, if this is one.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(v) => Some(v),
            _ => None,
        }
    }
}

/// One operation on one value of a state object. Offloading these to wherever the state lives
/// (rather than read-modify-write in the NF) is what lets instances share objects without locks.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum StateOp {
    /// Read the value. Result: the value, or `None`.
    Get,
    /// Replace the value. Result: `None`.
    Set(Value),
    /// Remove the value. Result: the removed value.
    Delete,
    /// Add to an integer (absent counts as 0). Result: the new value.
    Incr(i64),
    /// Append to a list (absent counts as empty). Result: the new length.
    Push(Value),
    /// Remove the first element of a list. Result: that element, or `None` if empty.
    Pop,
    /// Remove up to n elements from the front. Result: a list of them.
    PopN(u32),
    /// Set to `new` if the current value equals `expect` (`None`: absent). Result: `Int(1)` if
    /// it was set, else the current value.
    CompareAndSet {
        /// The value expected.
        expect: Option<Value>,
        /// The value to set.
        new: Value,
    },
    /// Run the NF's registered custom operation with this index (see `CustomOp`).
    Custom {
        /// Index in the NF's custom-operation list.
        op: u16,
        /// Its argument.
        arg: Value,
    },
    /// Record a value the NF drew from a non-deterministic source (a random number, the wall
    /// clock). The value stored under the key is left alone. Result: the argument. Its use is
    /// the tag it travels with: a store answers a repeat of the tag (a replayed packet, a
    /// clone's copy) from its per-clock log, that is with the value recorded first.
    Record(Value),
}

impl StateOp {
    /// Whether the operation can change state (reads are the only ones that cannot).
    pub fn is_update(&self) -> bool {
        !matches!(self, StateOp::Get)
    }
}
