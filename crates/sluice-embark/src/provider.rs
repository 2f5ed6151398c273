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
    /// Refused before any NF saw it: the packet (or a token record sent with it) was made
    /// under another rule generation than the rules it would meet (see [`crate::swap`]).
    Refused(String),
}

/// The provider's chain.
pub struct ProviderChain {
    nfs: Vec<(Instance, bool)>,
    generation: Option<u32>,
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
        Ok(ProviderChain { nfs, generation: cfg.generation })
    }

    /// The rule generation of an encrypted chain (`None`: plaintext rules).
    pub fn generation(&self) -> Option<u32> {
        self.generation
    }

    /// `Err` (why) if `pkt` was not made under this chain's rule generation. A plaintext chain
    /// takes every packet.
    fn check_generation(&self, pkt: &Packet) -> Result<(), String> {
        let Some(g) = self.generation else { return Ok(()) };
        match crate::gateway::frame_generation(pkt.data()) {
            Some(x) if x == g => Ok(()),
            Some(x) => Err(format!("packet of rule generation {x} met rules of generation {g}")),
            None => Err(format!("packet without a rule generation met rules of generation {g}")),
        }
    }

    /// Runs a data packet through the chain with the token records the gateway sent before
    /// it. The records reach an IDS just before the data packet does (the IDS reads both
    /// channels in step), and are discarded with the packet if an NF before the IDS drops it.
    /// A data packet or token record of another generation refuses the whole unit: no NF
    /// sees any of it.
    pub fn process_with_tokens(&mut self, pkt: &mut Packet, tokens: &mut [Packet]) -> Outcome {
        if pkt.tuple().is_some_and(|t| t.proto.0 == TOKEN_PROTO) {
            return Outcome::Consumed;
        }
        if let Some(why) = std::iter::once(&*pkt).chain(tokens.iter()).find_map(|p| self.check_generation(p).err()) {
            return Outcome::Refused(why);
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
        if let Err(why) = self.check_generation(pkt) {
            return Outcome::Refused(why);
        }
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
