//! The IDS's encrypted mode (Embark): the same decisions as [`crate::ids`], taken on
//! KeywordMatch token records instead of plaintext payload.
//!
//! The enterprise gateway reassembles each TCP stream exactly as the plaintext IDS does and
//! sends, just before a data packet, a token record (an IPv6 packet with next header 253 and
//! the data packet's encrypted addresses) holding the salted encryptions of every window that
//! packet completes. This mode keeps, per connection and direction, one counter per encrypted
//! keyword and looks each token up in a table of the ciphertexts it expects next: a match
//! completes a rule when all of the rule's windows matched at the right offsets.
//!
//! * A rule match emits `alert` (subject: the data packet's 5-tuple as the IDS sees it,
//!   detail `rule=<id>`), once per rule per record, like the plaintext IDS per packet.
//! * `drop` rules block the connection: the data packet that follows the record is dropped
//!   with `ids-drop-rule`, later packets in both directions with `ids-blocked`.
//! * Token records are consumed (`ids-token-record`); data packets are otherwise forwarded.
//! * A blocked connection stays blocked until idle for `idle_timeout_ms` (packet time).
//!
//! Configuration: `encrypted:` holds the rules written by `sluice embark encrypt-rules`;
//! `idle_timeout_ms` as in the plaintext IDS.
//!
//! State: `embark_stream` (per flow, read/write often): flags, last-seen time, and per
//! direction the stream's salt, keyword counters and recent window matches.

use crate::util::parse_config;
use serde::Deserialize;
use sluice_embark::keyword::{EncKeywordRules, KeywordMatcher, StreamMatch, TokenRecord, TOKEN_PROTO};
use sluice_nf::{
    AccessPattern, BuildCtx, InputOrder, NetworkFunction, NfContext, NfError, ObjectId, Scope, StateDecl, StateKey,
    TimerFired, Value, Verdict,
};
use sluice_packet::{FiveTuple, Packet, Proto, L4};

/// Per flow: blocked flags, last-seen time, both directions' matching state.
pub const STREAM: ObjectId = ObjectId(0);

/// Configuration of the encrypted mode.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EncConfig {
    /// The encrypted rules.
    pub encrypted: EncKeywordRules,
    /// Accepted for symmetry with the plaintext IDS (the gateway buffers).
    pub max_buffer_bytes: u32,
    /// Milliseconds of packet time without packets before a flow's state is dropped.
    pub idle_timeout_ms: u64,
    /// Accepted for symmetry with the plaintext IDS (the gateway tracks FINs).
    pub close_timeout_ms: u64,
}

impl Default for EncConfig {
    fn default() -> Self {
        EncConfig {
            encrypted: EncKeywordRules::default(),
            max_buffer_bytes: 65_536,
            idle_timeout_ms: 120_000,
            close_timeout_ms: 2_000,
        }
    }
}

const F_BLOCKED: u8 = 1;
const F_PENDING: u8 = 2;

#[derive(Default)]
struct Rec {
    flags: u8,
    last_ns: u64,
    dirs: [StreamMatch; 2],
}

impl Rec {
    fn decode(v: &Value) -> Rec {
        let Value::Bytes(b) = v else { return Rec::default() };
        let (Some(&flags), Some(t)) = (b.first(), b.get(1..9)) else { return Rec::default() };
        let last_ns = u64::from_be_bytes(t.try_into().unwrap_or([0; 8]));
        let mut rec = Rec { flags, last_ns, ..Rec::default() };
        let mut rest = &b[9..];
        for d in &mut rec.dirs {
            match StreamMatch::decode(rest) {
                Some((s, r)) => {
                    *d = s;
                    rest = r;
                }
                None => break,
            }
        }
        rec
    }

    fn encode(&self) -> Value {
        let mut b = vec![self.flags];
        b.extend(self.last_ns.to_be_bytes());
        for d in &self.dirs {
            d.encode(&mut b);
        }
        Value::Bytes(b)
    }
}

/// The IDS in encrypted mode.
pub struct EncIds {
    decls: Vec<StateDecl>,
    matcher: KeywordMatcher,
    idle_ns: u64,
}

/// Builds an encrypted-mode IDS.
pub fn build(config: &serde_yaml::Value, _ctx: &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError> {
    let c: EncConfig = parse_config(config)?;
    if c.encrypted.rules.is_empty() {
        return Err(NfError::config("encrypted.rules", "needs at least one rule"));
    }
    if c.idle_timeout_ms == 0 {
        return Err(NfError::config("idle_timeout_ms", "must be positive"));
    }
    let matcher = KeywordMatcher::new(&c.encrypted).map_err(|e| NfError::config("encrypted", e.to_string()))?;
    Ok(Box::new(EncIds {
        decls: vec![StateDecl::new("embark_stream", Scope::per_flow(), AccessPattern::ReadWriteOften)],
        matcher,
        idle_ns: c.idle_timeout_ms.saturating_mul(1_000_000),
    }))
}

impl EncIds {
    fn load(&self, key: &StateKey, ctx: &mut NfContext<'_>) -> Option<Rec> {
        match ctx.state.get(STREAM, key) {
            Ok(Some(v)) => Some(Rec::decode(&v)),
            _ => None,
        }
    }

    fn store(&self, key: &StateKey, rec: &Rec, ctx: &mut NfContext<'_>, new: bool) {
        let _ = ctx.state.set(STREAM, key, rec.encode());
        if new {
            ctx.state.set_timer(STREAM, key, ctx.now_ns.saturating_add(self.idle_ns));
        }
    }

    fn tokens(&self, pkt: &Packet, ctx: &mut NfContext<'_>) -> Verdict {
        let Some(t) = pkt.tuple() else { return Verdict::Drop("ids-token-record") };
        let Ok(rec) = TokenRecord::decode(pkt.payload()) else { return Verdict::Drop("ids-bad-token-record") };
        // The connection the tokens belong to.
        let conn = FiveTuple { src: t.src, dst: t.dst, sport: rec.sport, dport: rec.dport, proto: Proto::TCP };
        let fk = conn.flow_key();
        let key = StateKey::Flow(fk);
        let dir = usize::from(!fk.source_is_a(&conn));
        let (mut r, new) = match self.load(&key, ctx) {
            Some(r) => (r, false),
            None => (Rec::default(), true),
        };
        r.last_ns = ctx.now_ns;
        if r.flags & F_BLOCKED == 0 {
            let mut hits = Vec::new();
            self.matcher.scan(&mut r.dirs[dir], &rec, &mut hits);
            hits.sort_unstable();
            hits.dedup();
            for &h in &hits {
                let Some(rule) = self.matcher.rules.get(h) else { continue };
                let mut detail = format!("rule={}", rule.id);
                if rule.drop {
                    detail.push_str(" action=drop");
                    r.flags |= F_BLOCKED | F_PENDING;
                }
                ctx.emit("alert", conn, detail);
            }
        }
        self.store(&key, &r, ctx, new);
        Verdict::Drop("ids-token-record")
    }
}

impl NetworkFunction for EncIds {
    /// Both directions of a connection in entry order: a connection's verdict and its end follow
    /// both sides.
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
        if t.proto.0 == TOKEN_PROTO {
            return self.tokens(pkt, ctx);
        }
        if pkt.hdr().l4 != L4::Tcp {
            return Verdict::Forward;
        }
        let Some(fk) = pkt.flow_key() else { return Verdict::Forward };
        let key = StateKey::Flow(fk);
        let Some(mut r) = self.load(&key, ctx) else { return Verdict::Forward };
        r.last_ns = ctx.now_ns;
        let verdict = if r.flags & F_PENDING != 0 {
            r.flags &= !F_PENDING;
            Verdict::Drop("ids-drop-rule")
        } else if r.flags & F_BLOCKED != 0 {
            Verdict::Drop("ids-blocked")
        } else {
            Verdict::Forward
        };
        if r.flags & F_BLOCKED == 0 && pkt.hdr().tcp_flags.rst() {
            let _ = ctx.state.delete(STREAM, &key);
            ctx.state.cancel_timer(STREAM, &key);
            return verdict;
        }
        self.store(&key, &r, ctx, false);
        verdict
    }

    fn on_timer(&self, fired: TimerFired, ctx: &mut NfContext<'_>) {
        if fired.object != STREAM {
            return;
        }
        let last = self.load(&fired.key, ctx).map_or(0, |r| r.last_ns);
        let deadline = last.saturating_add(self.idle_ns);
        if deadline > ctx.now_ns {
            ctx.state.set_timer(STREAM, &fired.key, deadline);
        } else {
            let _ = ctx.state.delete(STREAM, &fired.key);
        }
    }
}
