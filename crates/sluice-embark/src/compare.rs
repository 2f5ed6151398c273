//! The plaintext chain against gateway → encrypted chain → gateway over a trace, packet by
//! packet, optionally with a rule swap mid-trace and packets in flight between gateway and
//! provider (used by `sluice embark run` and the tests).
//!
//! With a swap at packet `k`, the reference is the plaintext chain with the old rules for
//! packets `0..k`; from `k` on, the connections the gateway keeps under the old generation
//! (those live at the swap, see [`crate::swap`]) stay on that chain, with its state, and every
//! other packet goes to a fresh plaintext chain with the new rules. The encrypted path is the
//! real protocol: the gateway switches at `k`, the provider stages the new chain then and
//! retires the old one once no connection is left under it and its last packet is through,
//! while up to `in_flight` packets sit between gateway and provider.

use crate::gateway::{frame_generation, Encrypted, Gateway, GatewayState};
use crate::provider::{Outcome, ProviderChain};
use crate::rules::ProviderConfig;
use crate::swap::Provider;
use crate::{EmbarkError, MasterKey};
use sluice_nf::{Event, NfError, NfRegistry};
use sluice_packet::Packet;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Why a comparison could not run.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// An NF refused its configuration.
    #[error(transparent)]
    Nf(#[from] NfError),
    /// Keys, rules or the swap were unusable.
    #[error(transparent)]
    Embark(#[from] EmbarkError),
}

/// A rule swap in the middle of a comparison.
pub struct SwapPlan<'a> {
    /// Index of the first packet the gateway encrypts under the new rules.
    pub at: usize,
    /// New plaintext rules (the reference from `at` on).
    pub plain: &'a ProviderConfig,
    /// New encrypted rules.
    pub enc: &'a ProviderConfig,
    /// New gateway state.
    pub state: GatewayState,
    /// The master key (the same for every generation).
    pub key: &'a MasterKey,
}

/// The result of running a trace through the plaintext chain and through gateway → encrypted
/// chain → gateway, packet by packet.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Comparison {
    /// Input packets.
    pub packets: u64,
    /// Packets neither path handles as IP (passed outside the chain on both).
    pub non_ip: u64,
    /// Packets both paths forwarded.
    pub forwarded: u64,
    /// Drops on the plaintext path, by `nf: reason`.
    pub dropped: BTreeMap<String, u64>,
    /// Packets the gateway refused, by error.
    pub gateway_errors: BTreeMap<String, u64>,
    /// Packets the provider refused for their rule generation, by reason (must stay empty).
    pub refused: BTreeMap<String, u64>,
    /// Delivered packets equal to the plaintext path's only after undoing a different NAT
    /// port choice (per-connection seeds turn the NAT's endpoint-independent mapping into a
    /// per-connection one, so the encrypted path may use other external ports).
    pub nat_renamed: u64,
    /// Decisions compared (outcomes plus events).
    pub events: u64,
    /// IDS alerts on the plaintext path.
    pub alerts: u64,
    /// Token records.
    pub token_records: u64,
    /// Bytes of token records.
    pub token_bytes: u64,
    /// Bytes of plaintext frames.
    pub plain_bytes: u64,
    /// Bytes of encrypted data frames.
    pub enc_bytes: u64,
    /// With a swap: the packet index it happened at.
    pub swap_at: Option<u64>,
    /// With a swap: old-generation packets the provider processed after the gateway had
    /// switched (of connections kept under it, or in flight), all through the old chain.
    pub old_after_swap: u64,
    /// With a swap: the input packet (the last of the old generation) after whose processing
    /// at the provider the old generation was retired.
    pub retired_after: Option<u64>,
    /// With a swap: connections still kept under the old generation at the end of the trace.
    pub pinned_at_end: u64,
    /// Every difference, with the input packet's index (empty: equivalent).
    pub differences: Vec<String>,
}

impl Comparison {
    fn diff(&mut self, i: usize, m: String) {
        if self.differences.len() < 50 {
            self.differences.push(format!("packet {i}: {m}"));
        }
    }
}

/// A decision as compared: firewall/NAT/LB/IDS outcomes and events, reduced to what must be
/// equal (an IDS alert by rule id; a firewall deny by kind, since encrypted rules are
/// expanded and renumbered).
pub fn event_key(e: &Event) -> String {
    let detail = match e.kind {
        "alert" => {
            let mut d: Vec<&str> =
                e.detail.split(' ').filter(|w| w.starts_with("rule=") || *w == "action=drop").collect();
            d.sort_unstable();
            d.join(" ")
        }
        _ => String::new(),
    };
    format!("{} {} {}", e.nf, e.kind, detail)
}

fn keys(ev: Vec<Event>) -> Vec<String> {
    let mut v: Vec<String> = ev.iter().map(event_key).collect();
    v.sort();
    v
}

/// A packet between the gateway and the provider, with the plaintext path's verdict on it.
struct InFlight {
    i: usize,
    want: Outcome,
    want_ev: Vec<String>,
    want_pkt: Packet,
    enc: Encrypted,
}

/// The encrypted side of a comparison.
struct EncPath<'a> {
    gw: &'a mut Gateway,
    provider: Provider,
    /// NAT port choices per (generation, protocol, encrypted-path port): the NAT restarts at a
    /// swap, so each generation has its own.
    renamed: HashMap<(u32, u8, u16), u16>,
}

impl EncPath<'_> {
    /// Provider, then gateway in, for one packet; checks it against the plaintext verdict.
    fn finish(&mut self, c: &mut Comparison, f: InFlight) {
        let InFlight { i, want, want_ev, want_pkt, enc } = f;
        let mut tokens = enc.tokens;
        c.token_records += tokens.len() as u64;
        c.token_bytes += tokens.iter().map(|t| t.len() as u64).sum::<u64>();
        let mut data = enc.data;
        let gen = frame_generation(data.data()).unwrap_or(0);
        c.enc_bytes += data.len() as u64;
        let got = self.provider.process_with_tokens(&mut data, &mut tokens);
        let got_ev = keys(self.provider.take_events());
        c.events += 1 + want_ev.len() as u64;
        c.alerts += want_ev.iter().filter(|k| k.contains(" alert ")).count() as u64;
        if want_ev != got_ev {
            c.diff(i, format!("events {want_ev:?} (plaintext) vs {got_ev:?} (encrypted)"));
        }
        match (&want, &got) {
            (Outcome::Forward, Outcome::Forward) => {
                c.forwarded += 1;
                match self.gw.decrypt(&data) {
                    Ok(back) if back.data() == want_pkt.data() => {}
                    Ok(mut back) => match nat_renamed(&mut back, &want_pkt, gen, &mut self.renamed) {
                        Ok(()) => c.nat_renamed += 1,
                        Err(m) => c.diff(i, m),
                    },
                    Err(err) => {
                        *c.gateway_errors.entry(err.to_string()).or_default() += 1;
                        c.diff(i, format!("inbound gateway refused it: {err}"));
                    }
                }
            }
            (Outcome::Drop { nf, reason }, _) if got == want => {
                *c.dropped.entry(format!("{nf}: {reason}")).or_default() += 1;
            }
            _ => c.diff(i, format!("plaintext {want:?}, encrypted {got:?}")),
        }
    }

    /// Retires the old generation once none of its connections is live and no packet of it
    /// is left in flight.
    fn maybe_retire(&mut self, c: &mut Comparison, queue: &VecDeque<InFlight>, i: usize) -> Result<(), EmbarkError> {
        let Some(old) = self.gw.previous_generation() else { return Ok(()) };
        if self.gw.pinned_connections() > 0 || queue.iter().any(|f| frame_generation(f.enc.data.data()) == Some(old)) {
            return Ok(());
        }
        self.provider.retire(old)?;
        self.gw.retire_previous();
        c.retired_after = Some(i as u64);
        Ok(())
    }
}

/// Runs `packets` through both paths and compares them packet for packet.
pub fn compare(
    registry: &NfRegistry,
    plain: &ProviderConfig,
    enc: &ProviderConfig,
    gw: &mut Gateway,
    packets: &[Packet],
) -> Result<Comparison, CompareError> {
    compare_with_swap(registry, plain, enc, gw, packets, None, 0)
}

/// [`compare`] with an optional rule swap and up to `in_flight` packets between gateway and
/// provider (processed first in, first out).
pub fn compare_with_swap(
    registry: &NfRegistry,
    plain: &ProviderConfig,
    enc: &ProviderConfig,
    gw: &mut Gateway,
    packets: &[Packet],
    swap: Option<SwapPlan<'_>>,
    in_flight: usize,
) -> Result<Comparison, CompareError> {
    let mut pc = ProviderChain::build(registry, plain)?;
    // During a swap, the plaintext chain of the old rules, with its state: the reference for
    // the connections the gateway keeps under the old generation.
    let mut pc_old: Option<(u32, ProviderChain)> = None;
    let provider = Provider::new(ProviderChain::build(registry, enc)?)?;
    let mut ep = EncPath { gw, provider, renamed: HashMap::new() };
    let mut c = Comparison::default();
    let mut queue: VecDeque<InFlight> = VecDeque::new();
    for (i, orig) in packets.iter().enumerate() {
        if let Some(s) = swap.as_ref().filter(|s| s.at == i) {
            let old = std::mem::replace(&mut pc, ProviderChain::build(registry, s.plain)?);
            pc_old = Some((ep.gw.generation(), old));
            ep.provider.stage(ProviderChain::build(registry, s.enc)?)?;
            ep.gw.rekey(s.key, s.state.clone())?;
            c.swap_at = Some(i as u64);
        }
        c.packets += 1;
        let mut p = orig.clone();
        p.meta.clock = sluice_packet::Clock(i as u64);
        if !p.hdr().is_ip() {
            c.non_ip += 1;
            continue;
        }
        c.plain_bytes += p.len() as u64;
        let mut src = orig.clone();
        src.meta.clock = p.meta.clock;
        let enc = ep.gw.encrypt(&src);
        // The plaintext reference follows the gateway's choice of generation.
        let gen = enc.as_ref().ok().and_then(|e| frame_generation(e.data.data()));
        let chain = match pc_old.as_mut() {
            Some((g, old)) if gen == Some(*g) => old,
            _ => &mut pc,
        };
        let want = chain.process(&mut p);
        let want_ev = keys(chain.take_events());
        match enc {
            Ok(enc) => queue.push_back(InFlight { i, want, want_ev, want_pkt: p, enc }),
            Err(err) => {
                *c.gateway_errors.entry(err.to_string()).or_default() += 1;
                c.diff(i, format!("gateway refused it: {err}"));
            }
        }
        while queue.len() > in_flight {
            provider_step(&mut ep, &mut c, &mut queue)?;
        }
    }
    while !queue.is_empty() {
        provider_step(&mut ep, &mut c, &mut queue)?;
    }
    c.refused = ep.provider.refused().clone();
    c.pinned_at_end = ep.gw.pinned_connections() as u64;
    Ok(c)
}

/// The provider takes the oldest packet in flight.
fn provider_step(ep: &mut EncPath<'_>, c: &mut Comparison, queue: &mut VecDeque<InFlight>) -> Result<(), EmbarkError> {
    let Some(f) = queue.pop_front() else { return Ok(()) };
    let i = f.i;
    if ep.gw.previous_generation().is_some_and(|g| frame_generation(f.enc.data.data()) == Some(g)) {
        c.old_after_swap += 1;
    }
    ep.finish(c, f);
    ep.maybe_retire(c, queue, i)
}

/// Checks that `back` (delivered on the encrypted path) equals `want` (plaintext path) up to
/// the NAT's choice of external source port, and that this choice is consistent: one
/// encrypted-path port always stands for the same plaintext-path port.
fn nat_renamed(
    back: &mut Packet,
    want: &Packet,
    gen: u32,
    map: &mut HashMap<(u32, u8, u16), u16>,
) -> Result<(), String> {
    let (Some(b), Some(w)) = (back.tuple(), want.tuple()) else { return Err("delivered packet does not parse".into()) };
    let same_but_port = b.src == w.src && b.dst == w.dst && b.dport == w.dport && b.proto == w.proto;
    if !same_but_port {
        return Err(format!("delivered bytes differ: {w} (plaintext) vs {b} (encrypted)"));
    }
    let plain = *map.entry((gen, b.proto.0, b.sport)).or_insert(w.sport);
    if plain != w.sport {
        return Err(format!("NAT port {} stands for {plain} and {}", b.sport, w.sport));
    }
    back.rewrite_src(b.src, w.sport).map_err(|e| e.to_string())?;
    if back.data() != want.data() {
        return Err(format!("delivered bytes differ beyond the NAT port: {w}"));
    }
    Ok(())
}
