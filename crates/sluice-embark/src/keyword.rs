//! KeywordMatch: searchable encryption of payload tokens, so that a provider's IDS learns
//! which encrypted rule keywords occur in a stream and nothing else about it.
//!
//! * **Tokens.** The gateway cuts each reassembled byte stream into sliding windows: for every
//!   token class `(len, nocase)` that the rules need, the window of `len` bytes ending at each
//!   stream byte (lower-cased for `nocase` classes). Keywords longer than [`MAX_WINDOW`] are
//!   covered by several windows at fixed offsets, checked together by the IDS.
//! * **Delimiter tokens.** For a rule that only matches at a word boundary (IDS rule option
//!   `boundary`), the window holding the keyword's first bytes belongs to a *boundary class*:
//!   the gateway emits its tokens only for windows that start right after a delimiter byte
//!   ([`is_delimiter`]) or at the start of the stream, one per word instead of one per byte.
//!   The provider then learns where words start in the stream (the offsets of those tokens).
//! * **Keyword encryption.** `R(w) = AES_k(class ‖ w)`: the provider gets `R` of each rule
//!   window (the encrypted rule) and never `k`.
//! * **Token encryption (randomised).** The `c`-th occurrence of window `w` in a stream with
//!   salt `s` travels as `AES_{R(w)}(s ‖ c)` truncated to 64 bits. Two equal windows give
//!   different ciphertexts (different `c`), so the provider learns nothing about tokens that
//!   match no rule, not even their equality. For a rule window the provider knows `R`, so it
//!   keeps one counter per keyword and stream and the one ciphertext it expects next in a hash
//!   table: detection is a lookup per token.
//! * **URIs (deterministic).** An HTTP request URI is sent as `HMAC_k'(uri)`: equal URIs give
//!   equal values (what a cache needs), at the price of revealing their frequency.
//!
//! Tokens travel in *token records* ([`TokenRecord`]): the payload of an IPv6 packet with next
//! header [`TOKEN_PROTO`] and the data packet's encrypted addresses, emitted by the gateway just
//! before the data packet whose bytes completed the windows.

use crate::keys::MasterKey;
use crate::EmbarkError;
use aes::cipher::{BlockEncrypt, KeyInit};
use aes::{Aes128, Aes256};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;

/// Longest window; longer keywords are split into windows of this length.
pub const MAX_WINDOW: usize = 8;
/// IP protocol number of token records (253: reserved for experiments, RFC 3692).
pub const TOKEN_PROTO: u8 = 253;
/// First bytes of a token record.
pub const TOKEN_MAGIC: &[u8; 4] = b"EMBK";

/// A token class: window length and case folding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Class {
    /// Window length, 1..=MAX_WINDOW.
    pub len: u8,
    /// Whether windows are ASCII lower-cased.
    pub nocase: bool,
    /// Whether windows are taken only where a word starts (after a delimiter byte or at the
    /// start of the stream) rather than at every byte.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub boundary: bool,
}

/// Whether `b` separates words: every byte but ASCII letters and digits (the plaintext IDS's
/// `boundary` rules use the same definition).
pub fn is_delimiter(b: u8) -> bool {
    !b.is_ascii_alphanumeric()
}

/// The gateway's keyword key (also what encrypts rules).
#[derive(Clone)]
pub struct KeywordKey {
    aes: Aes256,
    uri: [u8; 32],
}

impl KeywordKey {
    /// The keyword key of `key`.
    pub fn new(key: &MasterKey) -> KeywordKey {
        let k = key.derive(b"keyword");
        KeywordKey { aes: Aes256::new(&k.into()), uri: key.derive(b"uri") }
    }

    /// `R(w)` for window `w` of class `c` (`w` already case-folded for `nocase`).
    pub fn rule_token(&self, c: Class, w: &[u8]) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0] = c.len;
        b[1] = u8::from(c.nocase) | (u8::from(c.boundary) << 1);
        let n = w.len().min(14);
        b[2..2 + n].copy_from_slice(&w[..n]);
        let mut blk = aes::Block::from(b);
        self.aes.encrypt_block(&mut blk);
        blk.into()
    }

    /// Deterministic encryption of an HTTP request URI.
    pub fn uri_token(&self, uri: &[u8]) -> [u8; 16] {
        let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(&self.uri) else { return [0; 16] };
        mac.update(uri);
        let full: [u8; 32] = mac.finalize().into_bytes().into();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        out
    }
}

/// The salted token: `AES_{r}(salt ‖ counter)`, first 64 bits. Computed by the gateway for
/// every window and by the IDS for the next expected occurrence of each rule keyword.
pub fn salted(r: &[u8; 16], salt: u64, counter: u32) -> u64 {
    let aes = Aes128::new(&(*r).into());
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&salt.to_be_bytes());
    b[8..12].copy_from_slice(&counter.to_be_bytes());
    let mut blk = aes::Block::from(b);
    aes.encrypt_block(&mut blk);
    let o: [u8; 16] = blk.into();
    u64::from_be_bytes([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
}

/// How a long keyword is cut: `(offset, len)` of each window.
pub fn windows_of(len: usize) -> Vec<(usize, usize)> {
    if len <= MAX_WINDOW {
        return vec![(0, len)];
    }
    let mut w: Vec<(usize, usize)> = (0..len - MAX_WINDOW).step_by(MAX_WINDOW).map(|o| (o, MAX_WINDOW)).collect();
    w.push((len - MAX_WINDOW, MAX_WINDOW));
    w
}

/// An encrypted keyword the provider looks for: its class and `R`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EncKeyword {
    /// Index into the rule file's class list.
    pub class: u8,
    /// `R(w)`, hex.
    pub r: String,
}

/// An encrypted IDS rule: which keywords must occur where, relative to the end of a match.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EncKeywordRule {
    /// The rule's id (reported in alerts).
    pub id: u32,
    /// Drop and block the connection on a match.
    #[serde(default)]
    pub drop: bool,
    /// Keyword length in bytes.
    pub len: u32,
    /// `(keyword index, offset of the window's last byte within the keyword)`.
    pub windows: Vec<(u32, u32)>,
}

/// The encrypted IDS ruleset as the provider loads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EncKeywordRules {
    /// Token classes, in the order token records index them.
    pub classes: Vec<Class>,
    /// Distinct encrypted windows.
    pub keywords: Vec<EncKeyword>,
    /// Rules, in the plaintext ruleset's order.
    pub rules: Vec<EncKeywordRule>,
}

/// A plaintext keyword rule (the IDS's `rules` entries).
#[derive(Debug, Clone)]
pub struct KeywordRule<'a> {
    /// Rule id.
    pub id: u32,
    /// The byte string.
    pub pattern: &'a [u8],
    /// Case-insensitive.
    pub nocase: bool,
    /// Drop and block on a match.
    pub drop: bool,
    /// Match only at a word boundary.
    pub boundary: bool,
}

/// Encrypts an IDS ruleset.
pub fn encrypt_rules(key: &KeywordKey, rules: &[KeywordRule<'_>]) -> Result<EncKeywordRules, EmbarkError> {
    let mut out = EncKeywordRules::default();
    let mut class_ix: HashMap<Class, u8> = HashMap::new();
    let mut kw_ix: HashMap<(u8, Vec<u8>), u32> = HashMap::new();
    for r in rules {
        if r.pattern.is_empty() {
            return Err(EmbarkError::BadRule(format!("IDS rule {}: empty pattern", r.id)));
        }
        let pat: Vec<u8> = if r.nocase { r.pattern.to_ascii_lowercase() } else { r.pattern.to_vec() };
        let mut windows = Vec::new();
        for (off, len) in windows_of(pat.len()) {
            // A boundary rule's first window is a delimiter token; the others are ordinary
            // windows at fixed offsets from it.
            let c = Class { len: len as u8, nocase: r.nocase, boundary: r.boundary && off == 0 };
            let n = class_ix.len();
            let ci = *class_ix.entry(c).or_insert(n as u8);
            if ci as usize == out.classes.len() {
                out.classes.push(c);
            }
            let w = pat[off..off + len].to_vec();
            let next = out.keywords.len() as u32;
            let ki = *kw_ix.entry((ci, w.clone())).or_insert(next);
            if ki == next {
                out.keywords.push(EncKeyword { class: ci, r: hex(&key.rule_token(c, &w)) });
            }
            windows.push((ki, (off + len - 1) as u32));
        }
        out.rules.push(EncKeywordRule { id: r.id, drop: r.drop, len: pat.len() as u32, windows });
    }
    Ok(out)
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses 32 hex digits.
pub fn unhex16(s: &str) -> Result<[u8; 16], EmbarkError> {
    let mut out = [0u8; 16];
    if s.len() != 32 || !s.is_ascii() {
        return Err(EmbarkError::BadRule(format!("`{s}` is not 32 hex digits")));
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2).unwrap_or(""), 16)
            .map_err(|_| EmbarkError::BadRule(format!("`{s}` is not hex")))?;
    }
    Ok(out)
}

/// One token: class index, offset of the window's last byte from the record's base, value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    /// Index into the class list.
    pub class: u8,
    /// Window end = `base + delta`.
    pub delta: u32,
    /// Salted encryption.
    pub value: u64,
}

/// The side-channel record for one data packet and direction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenRecord {
    /// Rule generation the tokens were made under.
    pub generation: u32,
    /// The data packet's encrypted source port.
    pub sport: u16,
    /// The data packet's encrypted destination port.
    pub dport: u16,
    /// Salt of this stream direction; a new salt means a new stream (counters restart).
    pub salt: u64,
    /// Stream offset that token deltas are relative to.
    pub base: u64,
    /// The tokens.
    pub tokens: Vec<Token>,
    /// Deterministic encryption of the HTTP request URI the packet starts, if any.
    pub uri: Option<[u8; 16]>,
}

/// Offset of the generation in an encoded record (after magic, version and flags).
pub const RECORD_GENERATION_OFFSET: usize = 6;
const REC_HEADER: usize = 4 + 1 + 1 + 4 + 2 + 2 + 8 + 8 + 4;
const TOKEN_LEN: usize = 13;

impl TokenRecord {
    /// Serialises the record.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(REC_HEADER + TOKEN_LEN * self.tokens.len() + 16);
        b.extend_from_slice(TOKEN_MAGIC);
        b.push(1);
        b.push(u8::from(self.uri.is_some()));
        b.extend(self.generation.to_be_bytes());
        b.extend(self.sport.to_be_bytes());
        b.extend(self.dport.to_be_bytes());
        b.extend(self.salt.to_be_bytes());
        b.extend(self.base.to_be_bytes());
        b.extend((self.tokens.len() as u32).to_be_bytes());
        for t in &self.tokens {
            b.push(t.class);
            b.extend(t.delta.to_be_bytes());
            b.extend(t.value.to_be_bytes());
        }
        if let Some(u) = &self.uri {
            b.extend_from_slice(u);
        }
        b
    }

    /// Parses a record; every length is checked against the bytes present.
    pub fn decode(b: &[u8]) -> Result<TokenRecord, EmbarkError> {
        let bad = EmbarkError::Malformed;
        let h = b.get(..REC_HEADER).ok_or(bad("token record shorter than its header"))?;
        if &h[..4] != TOKEN_MAGIC {
            return Err(bad("token record without magic"));
        }
        if h[4] != 1 {
            return Err(bad("token record of an unknown version"));
        }
        let has_uri = h[5] & 1 != 0;
        let u16at = |o: usize| u16::from_be_bytes([h[o], h[o + 1]]);
        let u32at = |o: usize| u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let u64at = |o: usize| (u64::from(u32at(o)) << 32) | u64::from(u32at(o + 4));
        let n = u32at(30) as usize;
        let body_len = n.checked_mul(TOKEN_LEN).ok_or(bad("token count overflows"))?;
        let body = b.get(REC_HEADER..REC_HEADER + body_len).ok_or(bad("token record shorter than its count"))?;
        let tokens = body
            .chunks_exact(TOKEN_LEN)
            .map(|c| Token {
                class: c[0],
                delta: u32::from_be_bytes([c[1], c[2], c[3], c[4]]),
                value: u64::from_be_bytes([c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12]]),
            })
            .collect();
        let rest = &b[REC_HEADER + body_len..];
        let uri = if has_uri {
            let u: [u8; 16] =
                rest.get(..16).and_then(|s| s.try_into().ok()).ok_or(bad("token record: URI cut short"))?;
            Some(u)
        } else {
            None
        };
        Ok(TokenRecord {
            generation: u32at(RECORD_GENERATION_OFFSET),
            sport: u16at(10),
            dport: u16at(12),
            salt: u64at(14),
            base: u64at(22),
            tokens,
            uri,
        })
    }
}

/// The provider's compiled form of [`EncKeywordRules`].
#[derive(Debug, Clone)]
pub struct KeywordMatcher {
    /// Class of each keyword.
    kw_class: Vec<u8>,
    /// `R` of each keyword.
    kw_r: Vec<[u8; 16]>,
    /// The rules.
    pub rules: Vec<EncKeywordRule>,
    /// Keyword → rules whose last window it is.
    last_of: Vec<Vec<usize>>,
    /// Longest rule, bytes.
    max_len: u64,
}

/// One stream direction's matching state at the provider.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamMatch {
    /// The stream's salt (0: none seen yet).
    pub salt: u64,
    /// Occurrences seen so far of each keyword.
    pub counters: Vec<u32>,
    /// Recent keyword matches `(keyword, window end)`, for multi-window rules.
    pub recent: Vec<(u32, u64)>,
}

impl KeywordMatcher {
    /// Validates and compiles a ruleset.
    pub fn new(r: &EncKeywordRules) -> Result<KeywordMatcher, EmbarkError> {
        let mut kw_r = Vec::with_capacity(r.keywords.len());
        let mut kw_class = Vec::with_capacity(r.keywords.len());
        for k in &r.keywords {
            if usize::from(k.class) >= r.classes.len() {
                return Err(EmbarkError::BadRule(format!("keyword of unknown class {}", k.class)));
            }
            kw_class.push(k.class);
            kw_r.push(unhex16(&k.r)?);
        }
        let mut last_of = vec![Vec::new(); kw_r.len()];
        let mut max_len = 0;
        for (i, rule) in r.rules.iter().enumerate() {
            let last = rule
                .windows
                .iter()
                .max_by_key(|w| w.1)
                .ok_or_else(|| EmbarkError::BadRule(format!("rule {} has no windows", rule.id)))?;
            if rule.windows.iter().any(|w| w.0 as usize >= kw_r.len() || w.1 >= rule.len) || last.1 + 1 != rule.len {
                return Err(EmbarkError::BadRule(format!("rule {}: window out of range", rule.id)));
            }
            last_of[last.0 as usize].push(i);
            max_len = max_len.max(u64::from(rule.len));
        }
        Ok(KeywordMatcher { kw_class, kw_r, rules: r.rules.clone(), last_of, max_len })
    }

    /// Number of keywords.
    pub fn keywords(&self) -> usize {
        self.kw_r.len()
    }

    /// Runs a record's tokens against one stream direction; pushes the index of every rule
    /// with an occurrence completed by these tokens (possibly several times).
    pub fn scan(&self, st: &mut StreamMatch, rec: &TokenRecord, hits: &mut Vec<usize>) {
        if st.salt != rec.salt || st.counters.len() != self.kw_r.len() {
            *st = StreamMatch { salt: rec.salt, counters: vec![0; self.kw_r.len()], recent: Vec::new() };
        }
        // Expected next ciphertext of every keyword.
        let mut expect: HashMap<u64, usize> =
            self.kw_r.iter().zip(&st.counters).enumerate().map(|(k, (r, &c))| (salted(r, rec.salt, c), k)).collect();
        for t in &rec.tokens {
            let Some(&k) = expect.get(&t.value) else { continue };
            if self.kw_class.get(k) != Some(&t.class) {
                continue;
            }
            let pos = rec.base + u64::from(t.delta);
            expect.remove(&t.value);
            if let (Some(c), Some(r)) = (st.counters.get_mut(k), self.kw_r.get(k)) {
                *c = c.saturating_add(1);
                expect.insert(salted(r, rec.salt, *c), k);
            }
            st.recent.push((k as u32, pos));
            for &ri in self.last_of.get(k).map(Vec::as_slice).unwrap_or(&[]) {
                let Some(rule) = self.rules.get(ri) else { continue };
                let start = (pos + 1).checked_sub(u64::from(rule.len));
                let complete = start.is_some_and(|s| {
                    rule.windows.iter().all(|&(wk, end)| st.recent.contains(&(wk, s + u64::from(end))))
                });
                if complete {
                    hits.push(ri);
                }
            }
        }
        // Only matches within the longest rule of the newest byte can still matter.
        if let Some(newest) = st.recent.iter().map(|r| r.1).max() {
            let horizon = newest.saturating_sub(self.max_len);
            st.recent.retain(|r| r.1 > horizon);
        }
    }
}

fn take(b: &[u8], n: usize) -> Option<(Vec<u8>, &[u8])> {
    b.get(..n).map(|h| (h.to_vec(), b.get(n..).unwrap_or(&[])))
}

impl StreamMatch {
    /// Serialises the state for the state store.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend(self.salt.to_be_bytes());
        out.extend((self.counters.len() as u32).to_be_bytes());
        for c in &self.counters {
            out.extend(c.to_be_bytes());
        }
        out.extend((self.recent.len() as u32).to_be_bytes());
        for (k, p) in &self.recent {
            out.extend(k.to_be_bytes());
            out.extend(p.to_be_bytes());
        }
    }

    /// Parses what [`StreamMatch::encode`] wrote; returns the rest of the bytes.
    pub fn decode(b: &[u8]) -> Option<(StreamMatch, &[u8])> {
        let (s, rest) = take(b, 8)?;
        let salt = u64::from_be_bytes(s.try_into().ok()?);
        let (n, mut rest) = take(rest, 4)?;
        let n = u32::from_be_bytes(n.try_into().ok()?) as usize;
        let mut counters = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            let (c, r) = take(rest, 4)?;
            counters.push(u32::from_be_bytes(c.try_into().ok()?));
            rest = r;
        }
        let (m, mut rest) = take(rest, 4)?;
        let m = u32::from_be_bytes(m.try_into().ok()?) as usize;
        let mut recent = Vec::with_capacity(m.min(4096));
        for _ in 0..m {
            let (e, r) = take(rest, 12)?;
            recent.push((u32::from_be_bytes(e[..4].try_into().ok()?), u64::from_be_bytes(e[4..].try_into().ok()?)));
            rest = r;
        }
        Some((StreamMatch { salt, counters, recent }, rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_roundtrip_and_truncation() {
        let r = TokenRecord {
            generation: 3,
            sport: 1,
            dport: 2,
            salt: 99,
            base: 1 << 40,
            tokens: vec![Token { class: 1, delta: 7, value: 0xdead_beef }],
            uri: Some([5; 16]),
        };
        let b = r.encode();
        assert_eq!(TokenRecord::decode(&b).unwrap(), r);
        for cut in 0..b.len() {
            assert!(TokenRecord::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn long_keywords_are_cut_into_covering_windows() {
        assert_eq!(windows_of(5), vec![(0, 5)]);
        assert_eq!(windows_of(8), vec![(0, 8)]);
        assert_eq!(windows_of(11), vec![(0, 8), (3, 8)]);
        assert_eq!(windows_of(17), vec![(0, 8), (8, 8), (9, 8)]);
    }

    #[test]
    fn stream_state_roundtrip() {
        let s = StreamMatch { salt: 5, counters: vec![1, 2], recent: vec![(1, 9)] };
        let mut b = Vec::new();
        s.encode(&mut b);
        b.push(7);
        let (d, rest) = StreamMatch::decode(&b).unwrap();
        assert_eq!((d, rest), (s, &[7u8][..]));
        assert!(StreamMatch::decode(&b[..5]).is_none());
    }
}
