//! Incremental Internet checksum update (RFC 1624, eqn. 3): `HC' = ~(~HC + ~m + m')`.

/// Adjusts a one's-complement checksum `csum` (as stored in the header) for the 16-bit-word
/// aligned field that changed from `old` to `new`. Both slices must have the same even length.
pub fn checksum_adjust(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    // The one's-complement sum of 32-bit words folds to that of their 16-bit halves: an IPv6
    // address takes four additions instead of eight.
    let mut sum: u64 = u64::from(!csum);
    let (o4, n4) = (old.chunks_exact(4), new.chunks_exact(4));
    let (o_rest, n_rest) = (o4.remainder(), n4.remainder());
    for (o, n) in o4.zip(n4) {
        let o = u32::from_be_bytes([o[0], o[1], o[2], o[3]]);
        let n = u32::from_be_bytes([n[0], n[1], n[2], n[3]]);
        sum += u64::from(!o) + u64::from(n);
    }
    if let ([o0, o1], [n0, n1]) = (o_rest, n_rest) {
        sum += u64::from(!u16::from_be_bytes([*o0, *o1])) + u64::from(u16::from_be_bytes([*n0, *n1]));
    }
    fold(sum)
}

/// [`checksum_adjust`] for a single 16-bit word.
pub fn checksum_adjust_u16(csum: u16, old: u16, new: u16) -> u16 {
    fold(u64::from(!csum) + u64::from(!old) + u64::from(new))
}

pub(crate) fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(data: &[u8]) -> u16 {
        let mut sum = 0u64;
        for c in data.chunks(2) {
            let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from(c[0]) << 8 };
            sum += u64::from(w);
        }
        fold(sum)
    }

    #[test]
    fn incremental_matches_full_recompute() {
        let mut data: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37)).collect();
        let before = full(&data);
        let old = [data[12], data[13], data[14], data[15]];
        data[12..16].copy_from_slice(&[10, 0, 0, 1]);
        let after = checksum_adjust(before, &old, &data[12..16]);
        assert_eq!(after, full(&data));
        let w_old = u16::from_be_bytes([data[20], data[21]]);
        data[20..22].copy_from_slice(&0xbeefu16.to_be_bytes());
        assert_eq!(checksum_adjust_u16(after, w_old, 0xbeef), full(&data));
    }

    /// Every field length the data path adjusts for (a port, an IPv4 or IPv6 address, odd
    /// 16-bit word counts) against a full recomputation, over many contents.
    #[test]
    fn wide_words_match_a_full_recompute() {
        let mut x: u32 = 7;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        };
        for len in [2usize, 4, 6, 16, 18] {
            for _ in 0..500 {
                let mut data: Vec<u8> = (0..64).map(|_| next()).collect();
                let before = full(&data);
                let old = data[8..8 + len].to_vec();
                for b in &mut data[8..8 + len] {
                    *b = next();
                }
                assert_eq!(checksum_adjust(before, &old, &data[8..8 + len]), full(&data), "len {len}");
            }
        }
    }
}
