//! PrefixMatch: range and prefix matching over encrypted values.
//!
//! The rule ranges of one value domain (IPv6 addresses, or ports) cut the domain into
//! elementary intervals, each covered by one set of rules. Every distinct set gets a random
//! label of `prefix_len` bits. A rule is encrypted as the prefixes `label/prefix_len` of the
//! intervals it covers; a value as the label of its interval followed by `bits - prefix_len`
//! bits of a per-connection PRF of the value. An encrypted value therefore lies in an encrypted
//! rule's prefixes exactly when the plaintext value lies in the plaintext range, and ordinary
//! prefix or range comparisons (`<=`, `>=`) decide it: the NFs need no change.
//!
//! Lookup is a binary search over the sorted interval starts (one `u128` and one `u32` label
//! index per interval), so encryption costs `O(log intervals)` plus one AES block.

use crate::keys::{Field, FlowPrf};
use crate::EmbarkError;
use rand::Rng;
use std::collections::{HashMap, HashSet};

/// Which values a PrefixMatch instance encrypts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    /// 128-bit IPv6 addresses (IPv4 as IPv4-mapped).
    Addr,
    /// 16-bit transport ports.
    Port,
}

impl Domain {
    /// Width of a value in bits.
    pub fn bits(self) -> u32 {
        match self {
            Domain::Addr => 128,
            Domain::Port => 16,
        }
    }

    fn field(self) -> Field {
        match self {
            Domain::Addr => Field::Addr,
            Domain::Port => Field::Port,
        }
    }

    /// Largest value of the domain.
    pub fn max(self) -> u128 {
        u128::MAX >> (128 - self.bits())
    }
}

/// An encrypted prefix: the value whose top `len` bits are the label, and `len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EncPrefix {
    /// The prefix's network value (bits below `len` are zero).
    pub value: u128,
    /// Prefix length in bits.
    pub len: u8,
}

impl EncPrefix {
    /// The inclusive range of values the prefix covers, within a domain of `bits` bits.
    pub fn range(&self, bits: u32) -> (u128, u128) {
        let host = bits - u32::from(self.len);
        let span = if host >= 128 { u128::MAX } else { (1u128 << host) - 1 };
        (self.value, self.value | span)
    }
}

/// The gateway's secret interval map for one domain.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PrefixMatch {
    domain: Domain,
    prefix_len: u8,
    /// Sorted interval starts; `starts[0] == 0`.
    starts: Vec<u128>,
    /// Label index of each interval.
    label_of: Vec<u32>,
    /// Label value of each label index (the top `prefix_len` bits of an encryption).
    labels: Vec<u64>,
}

/// Smallest `b` with `2^b >= n`.
fn ceil_log2(n: usize) -> u32 {
    usize::BITS - n.saturating_sub(1).leading_zeros()
}

impl PrefixMatch {
    /// Builds the interval map of `ranges` (inclusive `(first, last)` pairs) with fresh random
    /// labels from `rng`. The label width is chosen from the number of distinct rule sets:
    /// for addresses at least 16 bits and 8 bits more than needed (so labels are sparse in
    /// their space), at most 64 (the PRF suffix keeps at least 64 bits, which is what makes
    /// encryptions of different addresses collide with negligible probability); for ports the
    /// fewest bits that fit the labels, so as many suffix bits as possible remain.
    pub fn build<R: Rng>(domain: Domain, ranges: &[(u128, u128)], rng: &mut R) -> Result<PrefixMatch, EmbarkError> {
        let max = domain.max();
        for (i, &(lo, hi)) in ranges.iter().enumerate() {
            if lo > hi || hi > max {
                return Err(EmbarkError::BadRule(format!("range {i} ({lo}-{hi}) is inverted or out of the domain")));
            }
        }
        // Interval starts: 0, every range start, and the value after every range end.
        let mut starts: Vec<u128> = Vec::with_capacity(2 * ranges.len() + 1);
        starts.push(0);
        for &(lo, hi) in ranges {
            starts.push(lo);
            if hi < max {
                starts.push(hi + 1);
            }
        }
        starts.sort_unstable();
        starts.dedup();
        // The set of rules covering each interval, as the XOR of random 128-bit tags of its
        // rules (Zobrist hashing): equal sets give equal hashes, different sets different ones
        // except with probability about intervals² / 2^128. A sweep adds a rule's tag where it
        // starts and removes it after it ends.
        let mut delta = vec![0u128; starts.len() + 1];
        for &(lo, hi) in ranges {
            let tag: u128 = rng.gen();
            let a = starts.partition_point(|&s| s < lo);
            delta[a] ^= tag;
            if hi < max {
                let b = starts.partition_point(|&s| s <= hi);
                delta[b] ^= tag;
            }
        }
        let mut set_label: HashMap<u128, u32> = HashMap::new();
        let mut label_of = Vec::with_capacity(starts.len());
        let mut acc = 0u128;
        for d in delta.iter().take(starts.len()) {
            acc ^= d;
            let n = set_label.len() as u32;
            label_of.push(*set_label.entry(acc).or_insert(n));
        }
        let nlabels = set_label.len();
        let need = ceil_log2(nlabels.max(1));
        let prefix_len = match domain {
            Domain::Addr => (need + 8).clamp(16, 64),
            Domain::Port => need.max(1),
        };
        if (domain == Domain::Port && prefix_len > 14) || need > 56 {
            return Err(EmbarkError::BadRule(format!("{nlabels} distinct rule sets are too many for {domain:?}")));
        }
        // Distinct random labels.
        let mut used = HashSet::with_capacity(nlabels);
        let mut labels = Vec::with_capacity(nlabels);
        let space = if prefix_len >= 64 { u64::MAX } else { (1u64 << prefix_len) - 1 };
        while labels.len() < nlabels {
            let l = rng.gen_range(0..=space);
            if used.insert(l) {
                labels.push(l);
            }
        }
        Ok(PrefixMatch { domain, prefix_len: prefix_len as u8, starts, label_of, labels })
    }

    /// The domain.
    pub fn domain(&self) -> Domain {
        self.domain
    }

    /// Label width in bits.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Number of elementary intervals.
    pub fn intervals(&self) -> usize {
        self.starts.len()
    }

    /// Number of distinct labels (distinct rule sets).
    pub fn label_count(&self) -> usize {
        self.labels.len()
    }

    /// Bytes of heap the map holds (for the memory benchmark).
    pub fn heap_bytes(&self) -> usize {
        self.starts.capacity() * 16 + self.label_of.capacity() * 4 + self.labels.capacity() * 8
    }

    fn suffix_bits(&self) -> u32 {
        self.domain.bits() - u32::from(self.prefix_len)
    }

    fn label_at(&self, v: u128) -> Result<u64, EmbarkError> {
        if v > self.domain.max() {
            return Err(EmbarkError::Malformed("value outside the domain"));
        }
        // starts[0] == 0, so the index is at least 1 before the subtraction.
        let i = self.starts.partition_point(|&s| s <= v).saturating_sub(1);
        let li = self.label_of.get(i).ok_or(EmbarkError::Malformed("interval map is inconsistent"))?;
        self.labels.get(*li as usize).copied().ok_or(EmbarkError::Malformed("interval map is inconsistent"))
    }

    fn compose(&self, label: u64, suffix: u128) -> u128 {
        let sb = self.suffix_bits();
        let mask = if sb >= 128 { u128::MAX } else { (1u128 << sb) - 1 };
        (u128::from(label) << sb) | (suffix & mask)
    }

    /// EncryptValue: the label of `v`'s interval followed by `PRF_seed(v)`.
    pub fn encrypt(&self, v: u128, prf: &FlowPrf) -> Result<u128, EmbarkError> {
        let label = self.label_at(v)?;
        Ok(self.compose(label, prf.eval(self.domain.field(), v)))
    }

    /// Like [`PrefixMatch::encrypt`] with a PRF input tweak (ports only): used to re-draw a
    /// port whose encryption collided with the other endpoint's of the same connection.
    pub fn encrypt_tweaked(&self, v: u128, tweak: u16, prf: &FlowPrf) -> Result<u128, EmbarkError> {
        if self.domain != Domain::Port || v > self.domain.max() {
            return Err(EmbarkError::Malformed("tweaks are for ports"));
        }
        let label = self.label_at(v)?;
        Ok(self.compose(label, prf.eval(Field::Port, v | (u128::from(tweak) << 16))))
    }

    /// An encryption of `v` with a fixed `suffix` instead of a per-flow PRF: used for values the
    /// provider writes into packets (a NAT's public address, a load balancer's backends), which
    /// must be the same in every connection yet still match the rules `v` matches.
    pub fn encrypt_with_suffix(&self, v: u128, suffix: u128) -> Result<u128, EmbarkError> {
        Ok(self.compose(self.label_at(v)?, suffix))
    }

    /// EncryptPrefixes for one rule: the encrypted prefixes whose union matches exactly the
    /// encryptions of the values in `[lo, hi]`, sorted by value (which hides where in the
    /// range each piece lies).
    pub fn encrypt_range(&self, lo: u128, hi: u128) -> Result<Vec<EncPrefix>, EmbarkError> {
        if lo > hi || hi > self.domain.max() {
            return Err(EmbarkError::BadRule(format!("range {lo}-{hi} is inverted or out of the domain")));
        }
        let first = self.starts.partition_point(|&s| s <= lo).saturating_sub(1);
        let last = self.starts.partition_point(|&s| s <= hi).saturating_sub(1);
        // Intervals are cut at every rule boundary, so a rule given to `build` covers whole
        // intervals; a range that was not given may cut one and is refused.
        let starts_ok = self.starts.get(first) == Some(&lo);
        let ends_ok = hi == self.domain.max() || self.starts.get(last + 1) == Some(&(hi + 1));
        if !starts_ok || !ends_ok {
            return Err(EmbarkError::BadRule(format!(
                "range {lo}-{hi} was not part of the rules the map was built from"
            )));
        }
        let mut set: Vec<u64> = Vec::new();
        for i in first..=last {
            if let Some(&l) = self.label_of.get(i).and_then(|&li| self.labels.get(li as usize)) {
                set.push(l);
            }
        }
        set.sort_unstable();
        set.dedup();
        Ok(set.into_iter().map(|l| EncPrefix { value: self.compose(l, 0), len: self.prefix_len }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(7)
    }

    #[test]
    fn intervals_with_equal_rule_sets_share_a_label() {
        // [10, 20] and [15, 30] over ports: intervals [0,9] [10,14] [15,20] [21,30] [31,max].
        let pm = PrefixMatch::build(Domain::Port, &[(10, 20), (15, 30)], &mut rng()).unwrap();
        assert_eq!(pm.intervals(), 5);
        // {} (twice), {1}, {1,2}, {2}.
        assert_eq!(pm.label_count(), 4);
        assert_eq!(pm.label_at(0).unwrap(), pm.label_at(60_000).unwrap());
        assert_ne!(pm.label_at(12).unwrap(), pm.label_at(17).unwrap());
        assert_eq!(pm.encrypt_range(10, 20).unwrap().len(), 2);
        assert!(pm.encrypt_range(11, 20).is_err());
    }

    #[test]
    fn one_element_intervals() {
        let pm = PrefixMatch::build(Domain::Port, &[(13, 25), (25, 27)], &mut rng()).unwrap();
        let prf = FlowPrf::from_seed([3; 16]);
        let r1 = pm.encrypt_range(13, 25).unwrap();
        let r2 = pm.encrypt_range(25, 27).unwrap();
        let inside = |e: u128, r: &[EncPrefix]| {
            r.iter().any(|p| {
                let (a, b) = p.range(16);
                a <= e && e <= b
            })
        };
        let e25 = pm.encrypt(25, &prf).unwrap();
        assert!(inside(e25, &r1) && inside(e25, &r2));
        let e26 = pm.encrypt(26, &prf).unwrap();
        assert!(!inside(e26, &r1) && inside(e26, &r2));
    }

    #[test]
    fn same_seed_same_value_different_seed_different_value() {
        let pm = PrefixMatch::build(Domain::Addr, &[(1 << 100, (1 << 101) - 1)], &mut rng()).unwrap();
        let a = FlowPrf::from_seed([1; 16]);
        let b = FlowPrf::from_seed([2; 16]);
        let v = (1u128 << 100) + 42;
        assert_eq!(pm.encrypt(v, &a).unwrap(), pm.encrypt(v, &a).unwrap());
        assert_ne!(pm.encrypt(v, &a).unwrap(), pm.encrypt(v, &b).unwrap());
        assert!(pm.encrypt(u128::MAX, &a).is_ok());
        let ports = PrefixMatch::build(Domain::Port, &[], &mut rng()).unwrap();
        assert!(ports.encrypt(70_000, &a).is_err());
    }
}
