//! The gateway's side of KeywordMatch: TCP stream reassembly and sliding-window tokens.
//!
//! The reassembly follows the IDS's rules (`sluice_nfs::ids`) step for step — when a stream
//! starts, what is skipped, buffered or resynchronised, when it ends (RST, both FINs plus the
//! close timeout, idle timeout) — so that the windows the gateway tokenises are exactly the
//! bytes the plaintext IDS would scan, and a keyword's last byte arrives with the same packet.
//! A new stream gets a fresh random salt, which tells the IDS to restart its counters.

use crate::keyword::{is_delimiter, salted, Class, KeywordKey, Token, MAX_WINDOW};
use sluice_packet::{FlowKey, Packet, L4};
use std::collections::HashMap;

/// Tokenizer settings (the IDS's, as written in the provider's encrypted config).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TokenizerConfig {
    /// Token classes, in the order records index them.
    pub classes: Vec<Class>,
    /// Out-of-order payload buffered per flow, bytes.
    pub max_buffer_bytes: u32,
    /// Idle timeout, ms of packet time.
    pub idle_timeout_ms: u64,
    /// Timeout after both FINs, ms.
    pub close_timeout_ms: u64,
}

#[derive(Default)]
struct Dir {
    init: bool,
    fin: bool,
    next: u32,
    /// Bytes scanned so far (stream offset of the next byte).
    pos: u64,
    /// Last `MAX_WINDOW` bytes scanned, for windows across packets (and the byte before a
    /// window, for boundary classes).
    tail: Vec<u8>,
    /// Bytes scanned since matching (re)started: the stream's start, or an overflow.
    since: u64,
    /// Out-of-order segments `(seq, bytes)`.
    segs: Vec<(u32, Vec<u8>)>,
    /// Occurrences so far of each window, keyed by its `R`.
    counters: HashMap<[u8; 16], u32>,
}

struct Flow {
    dirs: [Dir; 2],
    salts: [u64; 2],
    closing: bool,
    close_deadline: u64,
    last_ns: u64,
}

/// New tokens for one direction of one packet.
pub struct Tokens {
    /// Direction salt.
    pub salt: u64,
    /// Stream offset of the first new byte.
    pub base: u64,
    /// Tokens, in stream order.
    pub tokens: Vec<Token>,
}

pub(crate) struct Tokenizer {
    cfg: TokenizerConfig,
    key: KeywordKey,
    flows: HashMap<FlowKey, Flow>,
    now: u64,
}

fn seq_diff(a: u32, b: u32) -> i64 {
    i64::from(b.wrapping_sub(a) as i32)
}

impl Tokenizer {
    pub(crate) fn new(cfg: TokenizerConfig, key: KeywordKey) -> Tokenizer {
        Tokenizer { cfg, key, flows: HashMap::new(), now: 0 }
    }

    /// Feeds one packet; returns its tokens (`None` when it starts no window).
    pub(crate) fn feed(&mut self, pkt: &Packet) -> Option<Tokens> {
        let t = pkt.tuple()?;
        if pkt.hdr().l4 != L4::Tcp || self.cfg.classes.is_empty() {
            return None;
        }
        self.now = self.now.max(pkt.meta.ts_ns);
        let now = self.now;
        let idle = self.cfg.idle_timeout_ms.saturating_mul(1_000_000);
        let fk = t.flow_key();
        let dir = usize::from(!fk.source_is_a(&t));
        // Expiry as the IDS's timers would have done it before this packet.
        if let Some(f) = self.flows.get(&fk) {
            let dead = if f.closing { now >= f.close_deadline } else { now >= f.last_ns.saturating_add(idle) };
            if dead {
                self.flows.remove(&fk);
            }
        }
        let flags = pkt.hdr().tcp_flags;
        let payload = pkt.payload();
        if let std::collections::hash_map::Entry::Vacant(slot) = self.flows.entry(fk) {
            if flags.rst() || (payload.is_empty() && !flags.syn()) {
                return None;
            }
            slot.insert(new_flow(now));
        }
        if flags.rst() {
            self.flows.remove(&fk);
            return None;
        }
        let close_ns = self.cfg.close_timeout_ms.saturating_mul(1_000_000);
        let f = self.flows.get_mut(&fk)?;
        f.last_ns = now;
        let seq = pkt.hdr().tcp_seq;
        let data_seq = if flags.syn() { seq.wrapping_add(1) } else { seq };
        let reused = f.dirs[dir].init && f.dirs[dir].next != data_seq;
        if flags.syn() && !flags.ack() && f.closing && reused {
            *f = new_flow(now);
        }
        let d = &mut f.dirs[dir];
        if !d.init && (flags.syn() || !payload.is_empty()) {
            *d = Dir { init: true, next: data_seq, ..Dir::default() };
            // A direction (re)starting is a new stream for the IDS.
            f.salts[dir] = rand::random();
        }
        let salt = f.salts[dir];
        let base = f.dirs[dir].pos;
        let mut tokens = Vec::new();
        if !payload.is_empty() {
            let total: usize = f.dirs.iter().flat_map(|d| d.segs.iter()).map(|s| s.1.len()).sum();
            let d = &mut f.dirs[dir];
            segment(&self.cfg, &self.key, d, total, data_seq, payload, salt, base, &mut tokens);
        }
        if flags.fin() {
            f.dirs[dir].fin = true;
            if f.dirs.iter().all(|d| d.fin) && !f.closing {
                f.closing = true;
                f.close_deadline = now.saturating_add(close_ns);
            }
        }
        if tokens.is_empty() {
            return None;
        }
        Some(Tokens { salt, base, tokens })
    }
}

fn new_flow(now: u64) -> Flow {
    Flow { dirs: [Dir::default(), Dir::default()], salts: [0, 0], closing: false, close_deadline: 0, last_ns: now }
}

#[allow(clippy::too_many_arguments)]
fn segment(
    cfg: &TokenizerConfig,
    key: &KeywordKey,
    d: &mut Dir,
    total_buffered: usize,
    data_seq: u32,
    payload: &[u8],
    salt: u64,
    base: u64,
    out: &mut Vec<Token>,
) {
    let ahead = seq_diff(d.next, data_seq);
    if ahead > 0 {
        let fits = total_buffered + payload.len() <= cfg.max_buffer_bytes as usize && payload.len() <= 65_535;
        if fits {
            d.segs.push((data_seq, payload.to_vec()));
            return;
        }
        // Overflow: the IDS forgets this direction's buffer and restarts matching here.
        d.segs.clear();
        d.next = data_seq;
        d.tail.clear();
        d.since = 0;
    }
    let skip = usize::try_from(seq_diff(data_seq, d.next)).unwrap_or(0);
    if let Some(new) = payload.get(skip..).filter(|n| !n.is_empty()) {
        scan(cfg, key, d, new, salt, base, out);
        d.next = d.next.wrapping_add(new.len() as u32);
    }
    while let Some(i) = d.segs.iter().position(|s| seq_diff(d.next, s.0) <= 0) {
        let (s, data) = d.segs.swap_remove(i);
        let skip = usize::try_from(seq_diff(s, d.next)).unwrap_or(0);
        if let Some(new) = data.get(skip..).filter(|n| !n.is_empty()) {
            scan(cfg, key, d, new, salt, base, out);
            d.next = d.next.wrapping_add(new.len() as u32);
        }
    }
}

/// Emits the token of every class for every window ending in `new`; for a boundary class,
/// only windows that start a word (after a delimiter byte, or where matching (re)started).
fn scan(cfg: &TokenizerConfig, key: &KeywordKey, d: &mut Dir, new: &[u8], salt: u64, base: u64, out: &mut Vec<Token>) {
    let mut buf = std::mem::take(&mut d.tail);
    let keep = buf.len();
    buf.extend_from_slice(new);
    for end in keep..buf.len() {
        let pos = d.pos + (end - keep) as u64;
        for (ci, c) in cfg.classes.iter().enumerate() {
            let len = usize::from(c.len);
            let Some(start) = (end + 1).checked_sub(len) else { continue };
            if c.boundary {
                // `buf` starts at the (re)start of matching iff the tail holds every byte since.
                let word_start = match start.checked_sub(1) {
                    Some(prev) => buf.get(prev).copied().is_some_and(is_delimiter),
                    None => d.since == keep as u64,
                };
                if !word_start {
                    continue;
                }
            }
            let w = &buf[start..=end];
            let mut lower = [0u8; MAX_WINDOW];
            let w = if c.nocase {
                for (o, b) in lower.iter_mut().zip(w) {
                    *o = b.to_ascii_lowercase();
                }
                &lower[..len]
            } else {
                w
            };
            let r = key.rule_token(*c, w);
            let ctr = d.counters.entry(r).or_insert(0);
            let value = salted(&r, salt, *ctr);
            *ctr = ctr.saturating_add(1);
            // One packet delivers at most its payload plus the bounded reorder buffer.
            let delta = u32::try_from(pos - base).unwrap_or(u32::MAX);
            out.push(Token { class: ci as u8, delta, value });
        }
    }
    d.pos += new.len() as u64;
    d.since += new.len() as u64;
    let from = buf.len().saturating_sub(MAX_WINDOW);
    d.tail = buf.split_off(from);
}
