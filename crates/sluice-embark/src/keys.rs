//! Keys: the gateway's master key, the subkeys derived from it, and the per-flow PRF that
//! PrefixMatch uses for the suffix of an encrypted value.

use crate::EmbarkError;
use aes::cipher::{BlockEncrypt, KeyInit};
use aes::{Aes128, Aes256};
use cmac::{Cmac, Mac};
use hmac::Hmac;
use sha2::Sha256;
use std::net::IpAddr;

/// Length of the master key in bytes.
pub const MASTER_KEY_LEN: usize = 32;

/// The enterprise's secret. Everything else (flow PRF key, packet AEAD key, keyword key, pool
/// key) is derived from it, so that one file is all a gateway needs to keep secret.
#[derive(Clone)]
pub struct MasterKey([u8; MASTER_KEY_LEN]);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material; the id is enough to tell keys apart.
        write!(f, "MasterKey(id {})", self.id())
    }
}

impl MasterKey {
    /// A fresh random key from the operating system's generator.
    pub fn generate() -> MasterKey {
        let mut k = [0u8; MASTER_KEY_LEN];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut k);
        MasterKey(k)
    }

    /// A key from raw bytes (tests, benchmarks).
    pub fn from_bytes(b: [u8; MASTER_KEY_LEN]) -> MasterKey {
        MasterKey(b)
    }

    /// Parses the hex form written by [`MasterKey::to_hex`].
    pub fn from_hex(s: &str) -> Result<MasterKey, EmbarkError> {
        let s = s.trim();
        if s.len() != 2 * MASTER_KEY_LEN || !s.is_ascii() {
            return Err(EmbarkError::BadKey(format!("expected {} hex digits", 2 * MASTER_KEY_LEN)));
        }
        let mut k = [0u8; MASTER_KEY_LEN];
        for (i, slot) in k.iter_mut().enumerate() {
            let pair = s.get(2 * i..2 * i + 2).unwrap_or("");
            *slot = u8::from_str_radix(pair, 16).map_err(|_| EmbarkError::BadKey(format!("`{pair}` is not hex")))?;
        }
        Ok(MasterKey(k))
    }

    /// Hex form, for key files.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A public identifier of the key (a one-way function of it): written into rule files so
    /// that a gateway refuses rules made for another key.
    pub fn id(&self) -> String {
        self.derive(b"key-id")[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A 32-byte subkey for `purpose` (HMAC-SHA256 of the purpose under the master key, as a
    /// KDF: subkeys for different purposes are independent).
    pub fn derive(&self, purpose: &[u8]) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable_hmac());
        mac.update(b"sluice-embark/v1/");
        mac.update(purpose);
        mac.finalize().into_bytes().into()
    }
}

/// HMAC accepts keys of any length; this is never reached.
fn unreachable_hmac() -> Hmac<Sha256> {
    <Hmac<Sha256> as Mac>::new_from_slice(&[0u8; 32]).unwrap_or_else(|_| unreachable_hmac())
}

/// Derives the per-connection seed `PRF_k(flow)` (CMAC-AES-256 over the direction-free flow
/// key), so that both directions of a connection share one seed and different connections get
/// independent ones.
#[derive(Clone)]
pub struct FlowKeyer {
    cmac: Cmac<Aes256>,
}

impl FlowKeyer {
    /// The keyer of `key`.
    pub fn new(key: &MasterKey) -> FlowKeyer {
        let k = key.derive(b"flow-seed");
        let cmac = <Cmac<Aes256> as KeyInit>::new_from_slice(&k).unwrap_or_else(|_| unreachable_cmac());
        FlowKeyer { cmac }
    }

    /// The PRF keyed by the seed of the connection between `(a, pa)` and `(b, pb)` over
    /// protocol `proto`; the endpoints may be given in either order.
    pub fn flow(&self, a: (IpAddr, u16), b: (IpAddr, u16), proto: u8) -> FlowPrf {
        let enc = |(ip, p): (IpAddr, u16)| {
            let mut e = [0u8; 18];
            e[..16].copy_from_slice(&v6_bits(ip).to_be_bytes());
            e[16..].copy_from_slice(&p.to_be_bytes());
            e
        };
        let (x, y) = (enc(a), enc(b));
        let (lo, hi) = if x <= y { (x, y) } else { (y, x) };
        let mut mac = self.cmac.clone();
        mac.update(&lo);
        mac.update(&hi);
        mac.update(&[proto]);
        let seed: [u8; 16] = mac.finalize().into_bytes().into();
        FlowPrf { aes: Aes128::new(&seed.into()) }
    }
}

fn unreachable_cmac() -> Cmac<Aes256> {
    <Cmac<Aes256> as KeyInit>::new_from_slice(&[0u8; 32]).unwrap_or_else(|_| unreachable_cmac())
}

/// What a PRF input is: the suffix of an address and of a port must be independent even when
/// the numbers are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Field {
    /// An IP address (IPv4 as IPv4-mapped IPv6).
    Addr = 1,
    /// A transport port.
    Port = 2,
}

/// `PRF_seed`: AES-128 keyed by one connection's seed.
#[derive(Clone)]
pub struct FlowPrf {
    aes: Aes128,
}

impl FlowPrf {
    /// A PRF keyed directly by `seed` (tests and benchmarks).
    pub fn from_seed(seed: [u8; 16]) -> FlowPrf {
        FlowPrf { aes: Aes128::new(&seed.into()) }
    }

    /// 128 pseudorandom bits for value `v` of kind `field`. An address is its own AES block;
    /// a port is encoded as twelve `0xff` bytes, a 16-bit tweak and the port, a block no
    /// unicast address has (it lies in ff00::/8, multicast), so the kinds share no inputs.
    pub fn eval(&self, field: Field, v: u128) -> u128 {
        let input = match field {
            Field::Addr => v,
            // Bits 16..32 carry a tweak (see `PrefixMatch::encrypt_tweaked`).
            Field::Port => (u128::MAX << 32) | (v & 0xffff_ffff),
        };
        let mut b = aes::Block::from(input.to_be_bytes());
        self.aes.encrypt_block(&mut b);
        u128::from_be_bytes(b.into())
    }
}

/// An address as a 128-bit number: IPv6 as is, IPv4 as its IPv4-mapped IPv6 form.
pub fn v6_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(a.to_ipv6_mapped()),
        IpAddr::V6(a) => u128::from(a),
    }
}
