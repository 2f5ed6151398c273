//! A sequential driver for the provider's chain: one instance per NF with local state, packets
//! in order. Token records go only to IDS instances; everything else goes through every NF in
//! chain order until one drops it. Used by `sluice embark run` and the equivalence tests; the
//! NFs themselves are the library's, built from the (encrypted or plaintext) config unchanged.

use crate::keyword::TOKEN_PROTO;
use crate::rules::ProviderConfig;
use sluice_nf::{BuildCtx, Event, Instance, LabelTable, NfError, NfRegistry, Verdict};
use sluice_packet::{InstanceId, Packet};
use std::sync::Arc;

/// What happened to a packet in the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Left the chain.
    Forward,
    /// Dropped by NF `nf` for `reason`.
    Drop {
        /// Vertex name.
        nf: String,
        /// Drop reason.
        reason: &'static str,
    },
    /// A token record, consumed by the IDS.
    Consumed,
}

/// The provider's chain.
pub struct ProviderChain {
    nfs: Vec<(Instance, bool)>,
}

impl ProviderChain {
    /// Builds one instance of every NF of `cfg`.
    pub fn build(registry: &NfRegistry, cfg: &ProviderConfig) -> Result<ProviderChain, NfError> {
        let mut nfs = Vec::new();
        for (i, spec) in cfg.nfs.iter().enumerate() {
            let mut labels = LabelTable::default();
            let mut b =
                BuildCtx { vertex: &spec.name, instance: 0, instances: 1, labels: &mut labels, shared_state: false };
            let nf = registry.build(&spec.kind, &spec.config, &mut b).map_err(|e| match e {
                NfError::Config { field, message } => {
                    NfError::Config { field: format!("{}.{field}", spec.name), message }
                }
                other => other,
            })?;
            let state = sluice_state::LocalState::new(nf.state_objects(), nf.custom_ops());
            let id = InstanceId::new(i as u16, 0);
            let inst = Instance::new(nf, Box::new(state), spec.name.as_str().into(), id, Arc::new(labels));
            nfs.push((inst, spec.kind == "ids"));
        }
        Ok(ProviderChain { nfs })
    }

    /// Runs a data packet through the chain with the token records the gateway sent before
    /// it. The records reach an IDS just before the data packet does (the IDS reads both
    /// channels in step), and are discarded with the packet if an NF before the IDS drops it.
    pub fn process_with_tokens(&mut self, pkt: &mut Packet, tokens: &mut [Packet]) -> Outcome {
        if pkt.tuple().is_some_and(|t| t.proto.0 == TOKEN_PROTO) {
            return Outcome::Consumed;
        }
        for (inst, is_ids) in &mut self.nfs {
            if *is_ids {
                for t in tokens.iter_mut() {
                    inst.process(t);
                }
            }
            if let Verdict::Drop(reason) = inst.process(pkt) {
                return Outcome::Drop { nf: inst.vertex().to_string(), reason };
            }
        }
        Outcome::Forward
    }

    /// Runs one packet through the chain.
    pub fn process(&mut self, pkt: &mut Packet) -> Outcome {
        let token = pkt.tuple().is_some_and(|t| t.proto.0 == TOKEN_PROTO);
        for (inst, is_ids) in &mut self.nfs {
            if token && !*is_ids {
                continue;
            }
            match inst.process(pkt) {
                Verdict::Drop(reason) if !token => {
                    return Outcome::Drop { nf: inst.vertex().to_string(), reason };
                }
                _ => {}
            }
        }
        if token {
            Outcome::Consumed
        } else {
            Outcome::Forward
        }
    }

    /// Takes the events every NF emitted so far.
    pub fn take_events(&mut self) -> Vec<Event> {
        self.nfs.iter_mut().flat_map(|(i, _)| i.take_events()).collect()
    }
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
    pub dropped: std::collections::BTreeMap<String, u64>,
    /// Packets the gateway refused, by error.
    pub gateway_errors: std::collections::BTreeMap<String, u64>,
    /// Delivered packets equal to the plaintext path's only after undoing a different NAT
    /// port choice (per-connection seeds turn the NAT's endpoint-independent mapping into a
    /// per-connection one, so the encrypted path may use other external ports).
    pub nat_renamed: u64,
    /// Decisions compared (outcomes plus events).
    pub events: u64,
    /// IDS alerts on the plaintext path.
    pub alerts: u64,
    /// Token records and their bytes.
    pub token_records: u64,
    /// Bytes of token records.
    pub token_bytes: u64,
    /// Bytes of plaintext frames and of encrypted data frames.
    pub plain_bytes: u64,
    /// Bytes of encrypted data frames.
    pub enc_bytes: u64,
    /// Every difference, with the input packet's index (empty: equivalent).
    pub differences: Vec<String>,
}

/// A decision as compared: firewall/NAT/LB/IDS outcomes and events, reduced to what must be
/// equal (an IDS alert by rule id; a firewall deny by kind, since encrypted rules are
/// expanded and renumbered).
fn event_key(e: &Event) -> String {
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

/// Runs `packets` through both paths and compares them packet for packet.
pub fn compare(
    registry: &NfRegistry,
    plain: &ProviderConfig,
    enc: &ProviderConfig,
    gw: &mut crate::gateway::Gateway,
    packets: &[Packet],
) -> Result<Comparison, NfError> {
    let mut pc = ProviderChain::build(registry, plain)?;
    let mut ec = ProviderChain::build(registry, enc)?;
    let mut c = Comparison::default();
    let mut renamed = std::collections::HashMap::new();
    let diff = |c: &mut Comparison, i: usize, m: String| {
        if c.differences.len() < 50 {
            c.differences.push(format!("packet {i}: {m}"));
        }
    };
    for (i, orig) in packets.iter().enumerate() {
        c.packets += 1;
        let mut p = orig.clone();
        p.meta.clock = sluice_packet::Clock(i as u64);
        if !p.hdr().is_ip() {
            c.non_ip += 1;
            continue;
        }
        c.plain_bytes += p.len() as u64;
        let want = pc.process(&mut p);
        let mut want_ev: Vec<String> = pc.take_events().iter().map(event_key).collect();
        let mut src = orig.clone();
        src.meta.clock = p.meta.clock;
        let e = match gw.encrypt(&src) {
            Ok(e) => e,
            Err(err) => {
                *c.gateway_errors.entry(err.to_string()).or_default() += 1;
                diff(&mut c, i, format!("gateway refused it: {err}"));
                continue;
            }
        };
        let mut tokens = e.tokens;
        c.token_records += tokens.len() as u64;
        c.token_bytes += tokens.iter().map(|t| t.len() as u64).sum::<u64>();
        let mut data = e.data;
        c.enc_bytes += data.len() as u64;
        let got = ec.process_with_tokens(&mut data, &mut tokens);
        let mut got_ev: Vec<String> = ec.take_events().iter().map(event_key).collect();
        want_ev.sort();
        got_ev.sort();
        c.events += 1 + want_ev.len() as u64;
        c.alerts += want_ev.iter().filter(|k| k.contains(" alert ")).count() as u64;
        if want_ev != got_ev {
            diff(&mut c, i, format!("events {want_ev:?} (plaintext) vs {got_ev:?} (encrypted)"));
        }
        match (&want, &got) {
            (Outcome::Forward, Outcome::Forward) => {
                c.forwarded += 1;
                match gw.decrypt(&data) {
                    Ok(back) if back.data() == p.data() => {}
                    Ok(mut back) => {
                        if let Err(m) = nat_renamed(&mut back, &p, &mut renamed) {
                            diff(&mut c, i, m);
                        } else {
                            c.nat_renamed += 1;
                        }
                    }
                    Err(err) => {
                        *c.gateway_errors.entry(err.to_string()).or_default() += 1;
                        diff(&mut c, i, format!("inbound gateway refused it: {err}"));
                    }
                }
            }
            (Outcome::Drop { nf, reason }, _) if got == want => {
                *c.dropped.entry(format!("{nf}: {reason}")).or_default() += 1;
            }
            _ => diff(&mut c, i, format!("plaintext {want:?}, encrypted {got:?}")),
        }
    }
    Ok(c)
}

/// Checks that `back` (delivered on the encrypted path) equals `want` (plaintext path) up to
/// the NAT's choice of external source port, and that this choice is consistent: one
/// encrypted-path port always stands for the same plaintext-path port.
fn nat_renamed(
    back: &mut Packet,
    want: &Packet,
    map: &mut std::collections::HashMap<(u8, u16), u16>,
) -> Result<(), String> {
    let (Some(b), Some(w)) = (back.tuple(), want.tuple()) else { return Err("delivered packet does not parse".into()) };
    let same_but_port = b.src == w.src && b.dst == w.dst && b.dport == w.dport && b.proto == w.proto;
    if !same_but_port {
        return Err(format!("delivered bytes differ: {w} (plaintext) vs {b} (encrypted)"));
    }
    let plain = *map.entry((b.proto.0, b.sport)).or_insert(w.sport);
    if plain != w.sport {
        return Err(format!("NAT port {} stands for {plain} and {}", b.sport, w.sport));
    }
    back.rewrite_src(b.src, w.sport).map_err(|e| e.to_string())?;
    if back.data() != want.data() {
        return Err(format!("delivered bytes differ beyond the NAT port: {w}"));
    }
    Ok(())
}
