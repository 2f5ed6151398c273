//! The binary encoding of [`Value`]s and [`StoreKey`](sluice_store::StoreKey)s in Redis (format version 1).
//!
//! A value's *encoding* is one byte string:
//! - `Int`: its decimal text (`-12`), exactly as Rust's `i64::to_string` and Redis' `INCRBY`
//!   write it, so Lua can increment a stored integer in place;
//! - anything else: the version byte `0x01`, a tag byte and the payload (big-endian):
//!   `F` f64 bits (8); `E` address, port (2); `T` src, dst, sport (2), dport (2), proto (1);
//!   `I` count (4), i64s (8 each); `L` count (4), then per element its length (4) and encoding;
//!   `B` the bytes. An address is `4` + 4 bytes or `6` + 16 bytes.
//!
//! A first byte other than a digit, `-` or `0x01` is a future format and is refused.
//! The top-level value of a key holding a list is stored as a Redis list of element encodings
//! (so push and pop run in Lua); its [`Form`] says which. Two values without floats are equal
//! exactly when their encodings are (compare-and-set compares encodings in Lua; a comparison
//! involving floats, where `NaN != NaN` and `0.0 == -0.0`, runs in the client instead).
//!
//! A [`StoreKey`](sluice_store::StoreKey) encodes as vertex (2), object (2), a tag byte and the key's fields; the
//! encoding is self-delimiting (notifications put a value's encoding right after it).

use sluice_packet::{FiveTuple, FlowKey, Proto};
use sluice_state::{StateKey, Value};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The first byte of every non-integer encoding: format version 1.
pub const FORMAT_V1: u8 = 0x01;

/// An encoding that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad encoding: {0}")]
pub struct CodecError(pub String);

fn bad<T>(what: &str) -> Result<T, CodecError> {
    Err(CodecError(what.to_string()))
}

/// How a top-level value is stored at its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Form {
    /// Absent.
    None,
    /// A Redis string holding the encoding.
    Str(Vec<u8>),
    /// A Redis list holding the element encodings.
    List(Vec<Vec<u8>>),
}

impl Form {
    /// The form a value is stored in.
    pub fn of(v: Option<&Value>) -> Form {
        match v {
            None => Form::None,
            Some(Value::List(l)) => Form::List(l.iter().map(encode_value).collect()),
            Some(v) => Form::Str(encode_value(v)),
        }
    }

    /// Appends the form as Lua's `read_form` expects it: `n` | `s` enc | `l` count elems...
    pub fn push_args(&self, args: &mut Vec<Vec<u8>>) {
        match self {
            Form::None => args.push(b"n".to_vec()),
            Form::Str(s) => {
                args.push(b"s".to_vec());
                args.push(s.clone());
            }
            Form::List(l) => {
                args.push(b"l".to_vec());
                args.push(l.len().to_string().into_bytes());
                args.extend(l.iter().cloned());
            }
        }
    }
}

/// Whether a value contains a float anywhere (see the module doc on equality).
pub fn has_float(v: &Value) -> bool {
    match v {
        Value::Float(_) => true,
        Value::List(l) => l.iter().any(has_float),
        _ => false,
    }
}

fn put_addr(out: &mut Vec<u8>, a: &IpAddr) {
    match a {
        IpAddr::V4(v4) => {
            out.push(4);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(6);
            out.extend_from_slice(&v6.octets());
        }
    }
}

/// The encoding of a value.
pub fn encode_value(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, v);
    out
}

fn encode_into(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
        Value::Float(f) => {
            out.extend_from_slice(&[FORMAT_V1, b'F']);
            out.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        Value::Endpoint(a, p) => {
            out.extend_from_slice(&[FORMAT_V1, b'E']);
            put_addr(out, a);
            out.extend_from_slice(&p.to_be_bytes());
        }
        Value::Tuple(t) => {
            out.extend_from_slice(&[FORMAT_V1, b'T']);
            put_addr(out, &t.src);
            put_addr(out, &t.dst);
            out.extend_from_slice(&t.sport.to_be_bytes());
            out.extend_from_slice(&t.dport.to_be_bytes());
            out.push(t.proto.0);
        }
        Value::Ints(xs) => {
            out.extend_from_slice(&[FORMAT_V1, b'I']);
            out.extend_from_slice(&(xs.len() as u32).to_be_bytes());
            for x in xs {
                out.extend_from_slice(&x.to_be_bytes());
            }
        }
        Value::List(l) => {
            out.extend_from_slice(&[FORMAT_V1, b'L']);
            out.extend_from_slice(&(l.len() as u32).to_be_bytes());
            for e in l {
                let enc = encode_value(e);
                out.extend_from_slice(&(enc.len() as u32).to_be_bytes());
                out.extend_from_slice(&enc);
            }
        }
        Value::Bytes(b) => {
            out.extend_from_slice(&[FORMAT_V1, b'B']);
            out.extend_from_slice(b);
        }
    }
}

/// A cursor over an encoding.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        match end {
            Some(e) => {
                let s = &self.buf[self.pos..e];
                self.pos = e;
                Ok(s)
            }
            None => bad("truncated"),
        }
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, CodecError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn addr(&mut self) -> Result<IpAddr, CodecError> {
        match self.u8()? {
            4 => Ok(IpAddr::V4(Ipv4Addr::from(self.array::<4>()?))),
            6 => Ok(IpAddr::V6(Ipv6Addr::from(self.array::<16>()?))),
            _ => bad("address family"),
        }
    }
    fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos.min(self.buf.len())..];
        self.pos = self.buf.len();
        s
    }
    fn done(&self) -> Result<(), CodecError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            bad("trailing bytes")
        }
    }
}

/// Decodes a value's encoding.
pub fn decode_value(buf: &[u8]) -> Result<Value, CodecError> {
    match buf.first() {
        None => bad("empty"),
        Some(b'-' | b'0'..=b'9') => {
            let s = std::str::from_utf8(buf).map_err(|_| CodecError("integer text".into()))?;
            s.parse::<i64>().map(Value::Int).map_err(|_| CodecError(format!("integer {s:?}")))
        }
        Some(&FORMAT_V1) => {
            let mut r = Reader { buf, pos: 1 };
            let v = match r.u8()? {
                b'F' => Value::Float(f64::from_bits(r.u64()?)),
                b'E' => {
                    let a = r.addr()?;
                    Value::Endpoint(a, r.u16()?)
                }
                b'T' => {
                    let src = r.addr()?;
                    let dst = r.addr()?;
                    let sport = r.u16()?;
                    let dport = r.u16()?;
                    let proto = Proto(r.u8()?);
                    Value::Tuple(FiveTuple { src, dst, sport, dport, proto })
                }
                b'I' => {
                    let n = r.u32()? as usize;
                    if n > buf.len() / 8 {
                        return bad("ints count");
                    }
                    let mut xs = Vec::with_capacity(n);
                    for _ in 0..n {
                        xs.push(r.u64()? as i64);
                    }
                    Value::Ints(xs)
                }
                b'L' => {
                    let n = r.u32()? as usize;
                    if n > buf.len() / 4 {
                        return bad("list count");
                    }
                    let mut l = VecDeque::with_capacity(n);
                    for _ in 0..n {
                        let len = r.u32()? as usize;
                        l.push_back(decode_value(r.take(len)?)?);
                    }
                    Value::List(l)
                }
                b'B' => Value::Bytes(r.rest().to_vec()),
                t => return Err(CodecError(format!("unknown tag {t:#x}"))),
            };
            r.done()?;
            Ok(v)
        }
        Some(b) => Err(CodecError(format!("unsupported format {b:#x} (newer Sluice?)"))),
    }
}

/// Decodes an optional value: the empty string is absent.
pub fn decode_opt(buf: &[u8]) -> Result<Option<Value>, CodecError> {
    if buf.is_empty() {
        Ok(None)
    } else {
        decode_value(buf).map(Some)
    }
}

/// Encodes an optional value (absent: the empty string).
pub fn encode_opt(v: Option<&Value>) -> Vec<u8> {
    v.map(encode_value).unwrap_or_default()
}

/// The encoding of a store key.
pub fn encode_key(k: &sluice_store::StoreKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    out.extend_from_slice(&k.vertex.to_be_bytes());
    out.extend_from_slice(&k.object.to_be_bytes());
    match &k.key {
        StateKey::Unit => out.push(b'U'),
        StateKey::Flow(f) => {
            out.push(b'F');
            let ((ia, pa), (ib, pb)) = (f.a(), f.b());
            put_addr(&mut out, &ia);
            out.extend_from_slice(&pa.to_be_bytes());
            put_addr(&mut out, &ib);
            out.extend_from_slice(&pb.to_be_bytes());
            out.push(f.proto.0);
        }
        StateKey::Addr(a) => {
            out.push(b'A');
            put_addr(&mut out, a);
        }
        StateKey::Endpoint(a, p, proto) => {
            out.push(b'E');
            put_addr(&mut out, a);
            out.extend_from_slice(&p.to_be_bytes());
            out.push(*proto);
        }
        StateKey::Id(i) => {
            out.push(b'I');
            out.extend_from_slice(&i.to_be_bytes());
        }
    }
    out
}

/// Decodes a store key at the start of `buf`; returns it and the bytes it took.
pub fn decode_key(buf: &[u8]) -> Result<(sluice_store::StoreKey, usize), CodecError> {
    let mut r = Reader { buf, pos: 0 };
    let vertex = r.u16()?;
    let object = r.u16()?;
    let key = match r.u8()? {
        b'U' => StateKey::Unit,
        b'F' => {
            let a = (r.addr()?, r.u16()?);
            let b = (r.addr()?, r.u16()?);
            StateKey::Flow(FlowKey::new(a, b, Proto(r.u8()?)))
        }
        b'A' => StateKey::Addr(r.addr()?),
        b'E' => {
            let a = r.addr()?;
            let p = r.u16()?;
            StateKey::Endpoint(a, p, r.u8()?)
        }
        b'I' => StateKey::Id(r.u64()?),
        t => return Err(CodecError(format!("unknown key tag {t:#x}"))),
    };
    Ok((sluice_store::StoreKey { vertex, object, key }, r.pos))
}

/// A stable 64-bit hash (FNV-1a) of a key encoding: every client, in every process, puts a key
/// in the same bucket.
pub fn bucket_hash(kenc: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in kenc {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Redis Cluster's key slot (CRC16/XMODEM of the hash tag, mod 16384).
pub fn key_slot(key: &[u8]) -> u16 {
    let tag = match key.iter().position(|b| *b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|b| *b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for b in tag {
        crc ^= u16::from(*b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc & 16383
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_store::StoreKey;

    #[test]
    fn values_round_trip() {
        let a4: IpAddr = "10.0.0.1".parse().unwrap();
        let a6: IpAddr = "2001:db8::1".parse().unwrap();
        let t = FiveTuple { src: a4, dst: a6, sport: 1, dport: 2, proto: Proto::TCP };
        let vs = vec![
            Value::Int(0),
            Value::Int(i64::MIN),
            Value::Int(i64::MAX),
            Value::Float(-1.5),
            Value::Endpoint(a6, 443),
            Value::Tuple(t),
            Value::Ints(vec![1, -2, 3]),
            Value::Bytes(vec![0, 1, 255]),
            Value::Bytes(vec![]),
            Value::List(VecDeque::new()),
            Value::List(VecDeque::from([Value::Int(1), Value::List(VecDeque::from([Value::Float(2.0)]))])),
        ];
        for v in vs {
            let e = encode_value(&v);
            assert_eq!(decode_value(&e).unwrap(), v);
        }
        assert!(decode_value(b"\x02x").is_err());
        assert!(decode_value(b"\x01Ixxxx").is_err());
    }

    #[test]
    fn keys_round_trip() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "::1".parse().unwrap();
        for key in [
            StateKey::Unit,
            StateKey::Flow(FlowKey::new((a, 1), (b, 2), Proto::UDP)),
            StateKey::Addr(b),
            StateKey::Endpoint(a, 80, 6),
            StateKey::Id(u64::MAX),
        ] {
            let k = StoreKey { vertex: 3, object: 7, key };
            let mut e = encode_key(&k);
            let n = e.len();
            e.extend_from_slice(b"rest");
            assert_eq!(decode_key(&e).unwrap(), (k, n));
        }
    }

    #[test]
    fn slots_match_redis() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"123456789"), 0x31c3 & 16383);
    }
}
