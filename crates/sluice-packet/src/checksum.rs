//! Incremental Internet checksum update (RFC 1624, eqn. 3): `HC' = ~(~HC + ~m + m')`.

/// Adjusts a one's-complement checksum `csum` (as stored in the header) for the 16-bit-word
/// aligned field that changed from `old` to `new`. Both slices must have the same even length.
pub fn checksum_adjust(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    let mut sum: u32 = u32::from(!csum);
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        let o = u16::from_be_bytes([o[0], o[1]]);
        let n = u16::from_be_bytes([n[0], n[1]]);
        sum += u32::from(!o) + u32::from(n);
    }
    fold(sum)
}

/// [`checksum_adjust`] for a single 16-bit word.
pub fn checksum_adjust_u16(csum: u16, old: u16, new: u16) -> u16 {
    fold(u32::from(!csum) + u32::from(!old) + u32::from(new))
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(data: &[u8]) -> u16 {
        let mut sum = 0u32;
        for c in data.chunks(2) {
            let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from(c[0]) << 8 };
            sum += u32::from(w);
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
}
