//! IDS: Aho-Corasick signature matching over each TCP byte stream, reassembled in sequence
//! order per direction.
//!
//! # Semantics
//!
//! * **Reassembly.** Each direction of a TCP connection is tracked from its SYN (or, for
//!   connections already running, from the first segment with payload). Segments are placed by
//!   sequence number (wrapping arithmetic): bytes already scanned are skipped (retransmissions
//!   and overlaps are never scanned twice; the first copy wins), a segment that starts beyond
//!   the next expected byte is kept in the flow's out-of-order buffer until the gap is filled,
//!   then the buffered segments are scanned in order.
//! * **Bounded buffer.** A flow buffers at most `max_buffer_bytes` of out-of-order payload (both
//!   directions together). A segment that would exceed it triggers an overflow: a
//!   `reassembly-overflow` event is emitted, the direction's buffer is discarded, and the stream
//!   resynchronises on the current segment (matching state restarts at the gap, so nothing is
//!   matched across the hole).
//! * **Matching.** Rules are compiled into two Aho-Corasick DFAs (case-sensitive and
//!   `nocase` patterns). The automaton state of each DFA is kept *per flow and direction in the
//!   state store*, as the index of the DFA state, and carried from one segment to the next, so
//!   a signature split across segments (or across a buffered gap that is later filled) is found
//!   exactly once. Every occurrence in the stream is reported once; several matches of one rule
//!   completed by the same packet give one event.
//! * **Decisions.** A match emits an `alert` event (subject: the packet's 5-tuple, detail:
//!   `rule=<id>` and the rule's message). For a rule with `action: drop`, the packet that
//!   completed the match is dropped (`ids-drop-rule`) and the whole connection is blocked: its
//!   later packets in both directions are dropped (`ids-blocked`). Blocking the connection,
//!   not just the packet, matters: the sender would retransmit the dropped bytes, which the
//!   reassembler has already consumed and would not scan again.
//! * **Word boundaries.** A rule with `boundary: true` matches only occurrences that start a
//!   word: right after a delimiter byte (anything but an ASCII letter or digit) or at the
//!   start of the stream (or of matching resumed after an overflow). It is compiled as the
//!   pattern behind every delimiter byte, and a stream starts its automata as if it had read
//!   one delimiter that no pattern contains. Embark's gateway sends one token per word for
//!   such rules instead of one per byte.
//! * Only TCP is inspected; other packets are forwarded.
//!
//! # State objects
//!
//! | id | name | scope | pattern | value |
//! |---|---|---|---|---|
//! | 0 | `stream` | per flow | read/write often | `Ints`: ruleset fingerprint, flags, last-seen time, and per direction the next expected sequence number, the two automaton states and the buffered byte count |
//! | 1 | `reorder_buffer` | per flow | read/write often | `Bytes`: out-of-order segments `[dir u8][seq u32][len u16][bytes]`* |
//!
//! Directions are named after the flow key: direction 0 goes from [`FlowKey::a`] to
//! [`FlowKey::b`]. The `reorder_buffer` object is only touched when a direction has buffered
//! bytes. The ruleset fingerprint lets an instance built with different rules ignore automaton
//! states written under the old ones (they restart at the DFA start state).
//!
//! # Memory bounds
//!
//! * `reorder_buffer`: at most `max_buffer_bytes` of payload per flow (plus 7 bytes per segment).
//! * Both objects are deleted on RST, `close_timeout_ms` after both FINs were seen (a short
//!   linger so that late retransmissions are recognised as old), or `idle_timeout_ms` after the
//!   flow's last packet (one timer per flow, re-armed lazily when it fires). A blocked flow stays
//!   blocked until it has been idle that long.
//! * A packet of an untracked flow creates state (the `stream` record and the flow's idle
//!   timer) only if it carries payload or is a SYN (with or without ACK, but not a RST): a
//!   payload-less SYN or SYN-ACK is tracked so that its direction starts at the initial
//!   sequence number. Other packets without payload (pure ACKs, FINs, RSTs) of an untracked
//!   flow create no state.
//!
//! # Configuration
//!
//! ```yaml
//! type: ids
//! config:
//!   rules:
//!     - { id: 1001, pattern: "/etc/passwd", msg: "passwd file access" }
//!     - { id: 1002, pattern: "cmd.exe", nocase: true, action: drop }
//!     - { id: 1003, pattern: "JOIN", boundary: true }   # only where a word starts
//!   max_buffer_bytes: 65536
//!   idle_timeout_ms: 120000
//!   close_timeout_ms: 2000
//! ```
//!
//! Without `rules`, a small default ruleset is used ([`default_rules`]).
//!
//! Drop reasons: `ids-drop-rule`, `ids-blocked`. Event kinds: `alert`, `reassembly-overflow`.

use crate::util::parse_config;
use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::dfa::DFA;
use aho_corasick::{Anchored, MatchKind, StartKind};
use serde::Deserialize;
use sluice_nf::{
    AccessPattern, BuildCtx, InputOrder, NetworkFunction, NfContext, NfError, ObjectId, Scope, StateDecl, StateKey,
    TimerFired, Value, Verdict,
};
use sluice_packet::{FiveTuple, Packet, Proto, L4};
use std::collections::HashMap;

/// Per flow: sequence tracking and automaton states of both directions.
pub const STREAM: ObjectId = ObjectId(0);
/// Per flow: buffered out-of-order segments.
pub const REORDER_BUFFER: ObjectId = ObjectId(1);

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Emit an `alert` event.
    #[default]
    Alert,
    /// Emit an `alert` event, drop the packet and block the connection.
    Drop,
}

/// One signature.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Rule id, reported in events; unique.
    pub id: u32,
    /// The byte string to find.
    pub pattern: String,
    /// Match ASCII letters case-insensitively.
    #[serde(default)]
    pub nocase: bool,
    /// Match only occurrences that start at a word boundary: right after a delimiter byte
    /// (see [`is_delimiter`]) or at the start of the stream (or where matching restarted after
    /// a reassembly overflow). Such rules let Embark's gateway send far fewer tokens.
    #[serde(default)]
    pub boundary: bool,
    /// What to do on a match.
    #[serde(default)]
    pub action: Action,
    /// Free-text message for events.
    #[serde(default)]
    pub msg: Option<String>,
}

/// Configuration; see the module documentation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The signatures.
    pub rules: Vec<Rule>,
    /// Out-of-order payload buffered per flow, bytes.
    pub max_buffer_bytes: u32,
    /// Milliseconds of packet time after a flow's last packet before its state is dropped.
    pub idle_timeout_ms: u64,
    /// Milliseconds of packet time after both FINs before the flow's state is dropped.
    pub close_timeout_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config { rules: default_rules(), max_buffer_bytes: 65_536, idle_timeout_ms: 120_000, close_timeout_ms: 2_000 }
    }
}

/// The default ruleset: a few classic signatures, all `alert`.
pub fn default_rules() -> Vec<Rule> {
    let r = |id, pattern: &str, nocase, msg: &str| Rule {
        id,
        pattern: pattern.into(),
        nocase,
        boundary: false,
        action: Action::Alert,
        msg: Some(msg.into()),
    };
    vec![
        r(1001, "/etc/passwd", false, "attempt to read /etc/passwd"),
        r(1002, "cmd.exe", true, "Windows command shell access"),
        r(1003, "USER root", true, "login attempt as root"),
        r(1004, "PASS ", true, "cleartext password"),
        r(1005, "<script", true, "script tag"),
        r(1006, "/bin/sh", false, "shell path in stream"),
    ]
}

/// Whether `b` separates words for `boundary` rules: every byte but ASCII letters and digits.
pub fn is_delimiter(b: u8) -> bool {
    !b.is_ascii_alphanumeric()
}

/// One compiled DFA with a dense numbering of its states, so that a state can be stored as a
/// small integer and validated when read back.
struct Matcher {
    dfa: DFA,
    /// Pattern id → index into the rule list.
    rule_of: Vec<usize>,
    /// Dense index → DFA state.
    states: Vec<StateID>,
    /// DFA state → dense index.
    index: HashMap<StateID, u32>,
    /// Dense state a stream (re)starts in: the start state, or with `boundary` rules the state
    /// after a virtual delimiter that no pattern contains, so that a boundary rule matches at
    /// the very start of the stream.
    fresh: u32,
}

impl Matcher {
    /// A matcher for `rules` (`(rule index, pattern, boundary)`). A boundary rule's pattern
    /// `p` is compiled as `d‖p` for every delimiter byte `d`.
    fn for_rules(rules: &[(usize, &[u8], bool)], nocase: bool) -> Result<Matcher, NfError> {
        let (mut pats, mut rule_of): (Vec<Vec<u8>>, Vec<usize>) = (Vec::new(), Vec::new());
        for &(i, p, boundary) in rules {
            if boundary {
                for d in (0..=255u8).filter(|&d| is_delimiter(d)) {
                    pats.push([&[d], p].concat());
                    rule_of.push(i);
                }
            } else {
                pats.push(p.to_vec());
                rule_of.push(i);
            }
        }
        let refs: Vec<&[u8]> = pats.iter().map(Vec::as_slice).collect();
        let mut m = Matcher::new(&refs, rule_of, nocase)?;
        if rules.iter().any(|r| r.2) {
            let Some(v) = (0..=255u8).find(|&d| is_delimiter(d) && rules.iter().all(|r| !r.1.contains(&d))) else {
                return Err(NfError::config("rules", "boundary rules need a delimiter byte that no pattern contains"));
            };
            let start = m.states.first().copied();
            let after = start.map(|s| m.dfa.next_state(Anchored::No, s, v));
            m.fresh = after.and_then(|a| m.index.get(&a).copied()).unwrap_or(0);
        }
        Ok(m)
    }

    fn new(patterns: &[&[u8]], rule_of: Vec<usize>, nocase: bool) -> Result<Matcher, NfError> {
        let dfa = DFA::builder()
            .match_kind(MatchKind::Standard)
            .start_kind(StartKind::Unanchored)
            .ascii_case_insensitive(nocase)
            .prefilter(false)
            .build(patterns)
            .map_err(|e| NfError::config("rules", format!("cannot compile signatures: {e}")))?;
        let start = dfa
            .start_state(Anchored::No)
            .map_err(|e| NfError::config("rules", format!("cannot compile signatures: {e}")))?;
        // Number the reachable states breadth-first from the start state (index 0).
        let mut states = vec![start];
        let mut index = HashMap::from([(start, 0u32)]);
        let mut i = 0;
        while let Some(&s) = states.get(i) {
            for b in 0..=255u8 {
                let n = dfa.next_state(Anchored::No, s, b);
                if let std::collections::hash_map::Entry::Vacant(slot) = index.entry(n) {
                    let id = u32::try_from(states.len())
                        .map_err(|_| NfError::config("rules", "signature automaton too large"))?;
                    slot.insert(id);
                    states.push(n);
                }
            }
            i += 1;
        }
        Ok(Matcher { dfa, rule_of, states, index, fresh: 0 })
    }

    /// Runs `data` through the DFA from dense state `st`, pushing the rule index of every match.
    fn scan(&self, st: &mut u32, data: &[u8], hits: &mut Vec<usize>) {
        let Some(&first) = self.states.get(*st as usize).or(self.states.first()) else { return };
        let mut sid = first;
        for &b in data {
            sid = self.dfa.next_state(Anchored::No, sid, b);
            if self.dfa.is_special(sid) && self.dfa.is_match(sid) {
                for k in 0..self.dfa.match_len(sid) {
                    let pid = self.dfa.match_pattern(sid, k);
                    if let Some(&r) = self.rule_of.get(pid.as_usize()) {
                        hits.push(r);
                    }
                }
            }
        }
        *st = self.index.get(&sid).copied().unwrap_or(0);
    }
}

/// The IDS. Holds only its configuration and the compiled (read-only) automata.
pub struct Ids {
    decls: Vec<StateDecl>,
    rules: Vec<Rule>,
    /// Case-sensitive and case-insensitive matchers; either may be absent.
    matchers: [Option<Matcher>; 2],
    /// The matchers' [`Matcher::fresh`] states.
    fresh: [u32; 2],
    fingerprint: i64,
    max_buffer: usize,
    idle_ns: u64,
    close_ns: u64,
}

/// FNV-1a over the ruleset: stable across processes (unlike `std`'s hasher).
fn fingerprint(rules: &[Rule]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for r in rules {
        eat(&r.id.to_be_bytes());
        eat(&(r.pattern.len() as u64).to_be_bytes());
        eat(r.pattern.as_bytes());
        eat(&[u8::from(r.nocase) | (u8::from(r.boundary) << 1)]);
    }
    h as i64
}

impl Ids {
    /// Builds the IDS from a configuration, validating it and compiling the rules.
    pub fn new(c: &Config) -> Result<Ids, NfError> {
        if c.rules.is_empty() {
            return Err(NfError::config("rules", "needs at least one rule"));
        }
        let mut ids = std::collections::HashSet::new();
        for (i, r) in c.rules.iter().enumerate() {
            if r.pattern.is_empty() {
                return Err(NfError::config(format!("rules[{i}].pattern"), "must not be empty"));
            }
            if !ids.insert(r.id) {
                return Err(NfError::config(format!("rules[{i}].id"), format!("duplicate rule id {}", r.id)));
            }
        }
        if c.idle_timeout_ms == 0 {
            return Err(NfError::config("idle_timeout_ms", "must be positive"));
        }
        if c.close_timeout_ms == 0 {
            return Err(NfError::config("close_timeout_ms", "must be positive"));
        }
        let mut matchers: [Option<Matcher>; 2] = [None, None];
        for (slot, nocase) in matchers.iter_mut().zip([false, true]) {
            let rules: Vec<(usize, &[u8], bool)> = c
                .rules
                .iter()
                .enumerate()
                .filter(|(_, r)| r.nocase == nocase)
                .map(|(i, r)| (i, r.pattern.as_bytes(), r.boundary))
                .collect();
            if !rules.is_empty() {
                *slot = Some(Matcher::for_rules(&rules, nocase)?);
            }
        }
        let fresh = [0, 1].map(|i| matchers[i].as_ref().map_or(0, |m| m.fresh));
        Ok(Ids {
            decls: vec![
                StateDecl::new("stream", Scope::per_flow(), AccessPattern::ReadWriteOften),
                StateDecl::new("reorder_buffer", Scope::per_flow(), AccessPattern::ReadWriteOften),
            ],
            rules: c.rules.clone(),
            matchers,
            fresh,
            fingerprint: fingerprint(&c.rules),
            max_buffer: c.max_buffer_bytes as usize,
            idle_ns: c.idle_timeout_ms.saturating_mul(1_000_000),
            close_ns: c.close_timeout_ms.saturating_mul(1_000_000),
        })
    }

    fn scan(&self, d: &mut Dir, data: &[u8], hits: &mut Vec<usize>) {
        for (m, st) in self.matchers.iter().zip(d.st.iter_mut()) {
            if let Some(m) = m {
                m.scan(st, data, hits);
            }
        }
    }

    fn delete_flow(&self, key: &StateKey, ctx: &mut NfContext<'_>) {
        let _ = ctx.state.delete(STREAM, key);
        let _ = ctx.state.delete(REORDER_BUFFER, key);
        ctx.state.cancel_timer(STREAM, key);
    }
}

/// One direction's reassembly and matching state.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Dir {
    init: bool,
    fin: bool,
    /// Next expected sequence number.
    next: u32,
    /// Dense automaton states: case-sensitive, case-insensitive.
    st: [u32; 2],
    /// Payload bytes of this direction in the reorder buffer.
    buffered: u32,
}

/// A decoded `stream` record.
#[derive(Debug, Clone, Default, PartialEq)]
struct FlowRec {
    dirs: [Dir; 2],
    blocked: bool,
    closing: bool,
    last_ns: u64,
}

const F_INIT: [i64; 2] = [1, 2];
const F_FIN: [i64; 2] = [4, 8];
const F_BLOCKED: i64 = 16;
const F_CLOSING: i64 = 32;
const REC_LEN: usize = 3 + 2 * 5;

impl FlowRec {
    /// `fresh`: the automaton states a stream starts in ([`Matcher::fresh`]).
    fn decode(v: &Value, fingerprint: i64, fresh: [u32; 2]) -> FlowRec {
        let Some(r) = v.as_ints().filter(|r| r.len() == REC_LEN) else { return FlowRec::default() };
        let same_rules = r.first() == Some(&fingerprint);
        let flags = r.get(1).copied().unwrap_or(0);
        let mut rec = FlowRec {
            blocked: flags & F_BLOCKED != 0,
            closing: flags & F_CLOSING != 0,
            last_ns: r.get(2).copied().unwrap_or(0) as u64,
            ..FlowRec::default()
        };
        for (i, d) in rec.dirs.iter_mut().enumerate() {
            let f = |j: usize| r.get(3 + 5 * i + j).copied().unwrap_or(0);
            d.init = flags & F_INIT[i] != 0;
            d.fin = flags & F_FIN[i] != 0;
            d.next = f(0) as u32;
            // Automaton states written under another ruleset mean nothing here.
            d.st = if same_rules { [f(1) as u32, f(2) as u32] } else { fresh };
            d.buffered = f(3) as u32;
        }
        rec
    }

    fn encode(&self, fingerprint: i64) -> Value {
        let mut flags = 0;
        for (i, d) in self.dirs.iter().enumerate() {
            if d.init {
                flags |= F_INIT[i];
            }
            if d.fin {
                flags |= F_FIN[i];
            }
        }
        if self.blocked {
            flags |= F_BLOCKED;
        }
        if self.closing {
            flags |= F_CLOSING;
        }
        let mut r = Vec::with_capacity(REC_LEN);
        r.extend([fingerprint, flags, self.last_ns as i64]);
        for d in &self.dirs {
            r.extend([i64::from(d.next), i64::from(d.st[0]), i64::from(d.st[1]), i64::from(d.buffered), 0]);
        }
        Value::Ints(r)
    }
}

/// A buffered out-of-order segment.
#[derive(Debug, Clone, PartialEq)]
struct Segment {
    dir: u8,
    seq: u32,
    data: Vec<u8>,
}

fn decode_segments(bytes: &[u8]) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let [dir, s0, s1, s2, s3, l0, l1, tail @ ..] = rest {
        let len = usize::from(u16::from_be_bytes([*l0, *l1]));
        let Some(data) = tail.get(..len) else { break };
        out.push(Segment { dir: *dir, seq: u32::from_be_bytes([*s0, *s1, *s2, *s3]), data: data.to_vec() });
        rest = tail.get(len..).unwrap_or(&[]);
    }
    out
}

fn encode_segments(segs: &[Segment]) -> Vec<u8> {
    let mut out = Vec::with_capacity(segs.iter().map(|s| 7 + s.data.len()).sum());
    for s in segs {
        out.push(s.dir);
        out.extend(s.seq.to_be_bytes());
        out.extend((s.data.len() as u16).to_be_bytes());
        out.extend(&s.data);
    }
    out
}

/// Signed distance from `a` to `b` in sequence space (positive: `b` is ahead of `a`).
fn seq_diff(a: u32, b: u32) -> i64 {
    i64::from(b.wrapping_sub(a) as i32)
}

impl Ids {
    /// Handles one segment's payload for direction `dir`; returns the rule indices matched.
    #[allow(clippy::too_many_arguments)]
    fn segment(
        &self,
        rec: &mut FlowRec,
        dir: usize,
        data_seq: u32,
        payload: &[u8],
        t: &FiveTuple,
        key: &StateKey,
        ctx: &mut NfContext<'_>,
        hits: &mut Vec<usize>,
    ) {
        let total_buffered = rec.dirs.iter().map(|d| d.buffered as usize).sum::<usize>();
        let Some(d) = rec.dirs.get_mut(dir) else { return };
        let ahead = seq_diff(d.next, data_seq);
        if ahead > 0 {
            // A gap before this segment: buffer it (segments are at most 64 KiB, so u16 fits).
            let fits = total_buffered + payload.len() <= self.max_buffer && payload.len() <= usize::from(u16::MAX);
            let mut segs = if total_buffered > 0 {
                match ctx.state.get(REORDER_BUFFER, key) {
                    Ok(Some(Value::Bytes(b))) => decode_segments(&b),
                    _ => Vec::new(),
                }
            } else {
                Vec::new()
            };
            if fits {
                segs.push(Segment { dir: dir as u8, seq: data_seq, data: payload.to_vec() });
                d.buffered = d.buffered.saturating_add(payload.len() as u32);
                let _ = ctx.state.set(REORDER_BUFFER, key, Value::Bytes(encode_segments(&segs)));
                return;
            }
            // Overflow: forget this direction's buffer and resynchronise on this segment.
            let dropped = d.buffered;
            segs.retain(|s| usize::from(s.dir) != dir);
            store_segments(&segs, key, ctx);
            ctx.emit(
                "reassembly-overflow",
                t,
                format!("discarded {dropped} buffered bytes, skipped a gap of {ahead} bytes"),
            );
            d.buffered = 0;
            d.next = data_seq;
            d.st = self.fresh;
        }
        // In order, possibly overlapping bytes already scanned.
        let skip = usize::try_from(seq_diff(data_seq, d.next)).unwrap_or(0);
        if let Some(new) = payload.get(skip..).filter(|n| !n.is_empty()) {
            self.scan(d, new, hits);
            d.next = d.next.wrapping_add(new.len() as u32);
        }
        if d.buffered > 0 {
            self.drain(d, dir, key, ctx, hits);
        }
    }

    /// Scans every buffered segment of `dir` that the stream has now reached.
    fn drain(&self, d: &mut Dir, dir: usize, key: &StateKey, ctx: &mut NfContext<'_>, hits: &mut Vec<usize>) {
        let mut segs = match ctx.state.get(REORDER_BUFFER, key) {
            Ok(Some(Value::Bytes(b))) => decode_segments(&b),
            _ => Vec::new(),
        };
        loop {
            let ready = segs.iter().position(|s| usize::from(s.dir) == dir && seq_diff(d.next, s.seq) <= 0);
            let Some(i) = ready else { break };
            let s = segs.swap_remove(i);
            let skip = usize::try_from(seq_diff(s.seq, d.next)).unwrap_or(0);
            if let Some(new) = s.data.get(skip..).filter(|n| !n.is_empty()) {
                self.scan(d, new, hits);
                d.next = d.next.wrapping_add(new.len() as u32);
            }
        }
        d.buffered = segs.iter().filter(|s| usize::from(s.dir) == dir).map(|s| s.data.len() as u32).sum();
        store_segments(&segs, key, ctx);
    }
}

fn store_segments(segs: &[Segment], key: &StateKey, ctx: &mut NfContext<'_>) {
    if segs.is_empty() {
        let _ = ctx.state.delete(REORDER_BUFFER, key);
    } else {
        let _ = ctx.state.set(REORDER_BUFFER, key, Value::Bytes(encode_segments(segs)));
    }
}

impl NetworkFunction for Ids {
    /// Both directions of a connection in entry order: a stream closes on the FINs of both sides.
    fn input_order(&self) -> InputOrder {
        InputOrder::Connection
    }

    fn kind(&self) -> &'static str {
        "ids"
    }

    fn state_objects(&self) -> &[StateDecl] {
        &self.decls
    }

    fn process(&self, pkt: &mut Packet, ctx: &mut NfContext<'_>) -> Verdict {
        let Some(t) = pkt.tuple() else { return Verdict::Forward };
        if pkt.hdr().l4 != L4::Tcp || t.proto != Proto::TCP {
            return Verdict::Forward;
        }
        let flags = pkt.hdr().tcp_flags;
        let payload = pkt.payload();
        let Some(fk) = pkt.flow_key() else { return Verdict::Forward };
        let key = StateKey::Flow(fk);
        let dir = usize::from(!fk.source_is_a(&t));
        let mut rec = match ctx.state.get(STREAM, &key) {
            Ok(Some(v)) => FlowRec::decode(&v, self.fingerprint, self.fresh),
            Ok(None) => {
                if flags.rst() || (payload.is_empty() && !flags.syn()) {
                    return Verdict::Forward;
                }
                ctx.state.set_timer(STREAM, &key, ctx.now_ns.saturating_add(self.idle_ns));
                FlowRec::default()
            }
            // State unavailable: fail open.
            Err(_) => return Verdict::Forward,
        };
        rec.last_ns = ctx.now_ns;
        if rec.blocked {
            let _ = ctx.state.set(STREAM, &key, rec.encode(self.fingerprint));
            return Verdict::Drop("ids-blocked");
        }
        if flags.rst() {
            self.delete_flow(&key, ctx);
            return Verdict::Forward;
        }
        let seq = pkt.hdr().tcp_seq;
        let data_seq = if flags.syn() { seq.wrapping_add(1) } else { seq };
        // A new connection reusing the 5-tuple of one that is closing: start afresh. (A SYN in
        // the middle of a live connection is ignored, so it cannot reset the matcher.)
        let reused = rec.dirs.get(dir).is_some_and(|d| d.init && d.next != data_seq);
        if flags.syn() && !flags.ack() && rec.closing && reused {
            rec = FlowRec { last_ns: ctx.now_ns, ..FlowRec::default() };
            let _ = ctx.state.delete(REORDER_BUFFER, &key);
            ctx.state.set_timer(STREAM, &key, ctx.now_ns.saturating_add(self.idle_ns));
        }
        if let Some(d) = rec.dirs.get_mut(dir) {
            if !d.init && (flags.syn() || !payload.is_empty()) {
                *d = Dir { init: true, next: data_seq, st: self.fresh, ..Dir::default() };
            }
        }
        let mut hits = Vec::new();
        if !payload.is_empty() {
            self.segment(&mut rec, dir, data_seq, payload, &t, &key, ctx, &mut hits);
        }
        if flags.fin() {
            if let Some(d) = rec.dirs.get_mut(dir) {
                d.fin = true;
            }
            if rec.dirs.iter().all(|d| d.fin) && !rec.closing {
                rec.closing = true;
                ctx.state.set_timer(STREAM, &key, ctx.now_ns.saturating_add(self.close_ns));
            }
        }
        hits.sort_unstable();
        hits.dedup();
        let mut verdict = Verdict::Forward;
        for &r in &hits {
            let Some(rule) = self.rules.get(r) else { continue };
            let mut detail = format!("rule={}", rule.id);
            if let Some(m) = &rule.msg {
                detail.push_str(" msg=");
                detail.push_str(m);
            }
            if rule.action == Action::Drop {
                detail.push_str(" action=drop");
                rec.blocked = true;
                verdict = Verdict::Drop("ids-drop-rule");
            }
            ctx.emit("alert", t, detail);
        }
        let _ = ctx.state.set(STREAM, &key, rec.encode(self.fingerprint));
        verdict
    }

    fn on_timer(&self, fired: TimerFired, ctx: &mut NfContext<'_>) {
        if fired.object != STREAM {
            return;
        }
        let rec = match ctx.state.get(STREAM, &fired.key) {
            Ok(Some(v)) => FlowRec::decode(&v, self.fingerprint, self.fresh),
            _ => {
                self.delete_flow(&fired.key, ctx);
                return;
            }
        };
        let idle_deadline = rec.last_ns.saturating_add(self.idle_ns);
        if !rec.closing && idle_deadline > ctx.now_ns {
            // Seen since the timer was armed: sleep until the flow has really been idle.
            ctx.state.set_timer(STREAM, &fired.key, idle_deadline);
        } else {
            self.delete_flow(&fired.key, ctx);
        }
    }
}

/// Builds an instance from its config.
pub fn build(config: &serde_yaml::Value, ctx: &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError> {
    // Rules encrypted by an Embark gateway select the encrypted mode.
    if config.get("encrypted").is_some() {
        return crate::ids_enc::build(config, ctx);
    }
    let c: Config = parse_config(config)?;
    Ok(Box::new(Ids::new(&c)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_and_segments_roundtrip() {
        let mut rec = FlowRec { blocked: true, last_ns: 77, ..FlowRec::default() };
        rec.dirs[1] = Dir { init: true, fin: true, next: u32::MAX, st: [3, 9], buffered: 12 };
        assert_eq!(FlowRec::decode(&rec.encode(5), 5, [0, 0]), rec);
        // Another ruleset: automaton states reset, the rest kept.
        assert_eq!(FlowRec::decode(&rec.encode(5), 6, [0, 0]).dirs[1].st, [0, 0]);
        let segs = vec![Segment { dir: 1, seq: 7, data: b"abc".to_vec() }, Segment { dir: 0, seq: 1, data: vec![] }];
        assert_eq!(decode_segments(&encode_segments(&segs)), segs);
        assert_eq!(decode_segments(&[1, 2, 3]), vec![]);
    }

    #[test]
    fn matcher_state_carries_across_chunks() {
        let m = Matcher::new(&[b"abcd", b"cd"], vec![0, 1], false).ok();
        let Some(m) = m else { panic!("compile") };
        let mut st = 0;
        let mut hits = Vec::new();
        m.scan(&mut st, b"xxab", &mut hits);
        assert!(hits.is_empty());
        m.scan(&mut st, b"cdyy", &mut hits);
        hits.sort_unstable();
        assert_eq!(hits, vec![0, 1]);
        // An out-of-range stored state falls back to the start state.
        let mut bad = 1 << 30;
        m.scan(&mut bad, b"cd", &mut hits);
        assert_eq!(hits.len(), 3);
    }

    #[test]
    fn seq_arithmetic_wraps() {
        assert_eq!(seq_diff(u32::MAX, 2), 3);
        assert_eq!(seq_diff(2, u32::MAX), -3);
    }
}
