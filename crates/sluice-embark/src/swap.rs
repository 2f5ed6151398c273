//! Rule updates: re-encrypted rules and a coordinated swap in which no packet is processed
//! under mixed keys.
//!
//! # The protocol
//!
//! 1. The enterprise encrypts the new plaintext rules as generation `g+1`
//!    (`encrypt-rules --generation g+1`): a new provider chain and a new gateway state (new
//!    interval maps, pool values and keyword classes under the same master key).
//! 2. The provider **stages** the `g+1` chain next to the running `g` chain
//!    ([`Provider::stage`]). Both are live; every packet goes to the chain of the generation
//!    it carries (the Embark option's first field, a token record's header), so a packet is
//!    always matched against rules encrypted with the same maps as its own fields.
//! 3. The gateway **switches** at a packet boundary ([`crate::gateway::Gateway::rekey`]):
//!    packets of new connections and their token records are made under `g+1`; the
//!    connections live at the switch stay under `g` until they end (below). The gateway keeps
//!    the `g` state for those and to decrypt `g` packets coming back.
//! 4. When no connection is left under `g` and the provider has processed the last `g`
//!    packet (it is back at the gateway or dropped), both **retire** `g`
//!    ([`Provider::retire`], [`crate::gateway::Gateway::retire_previous`]): its chain, NF
//!    state and gateway state are discarded.
//!
//! A packet whose generation has no chain at the provider, or a token record sent with a
//! data packet of another generation, is refused before any NF sees it and counted
//! ([`Provider::refused`]); a chain given a packet of another generation refuses it too
//! ([`crate::provider::Outcome::Refused`]). So "header fields under one generation, rules under
//! another" cannot happen silently.
//!
//! # Live connections
//!
//! Connection state of `g` is keyed and valued by `g`'s encryptions, which the new interval
//! maps change. Rather than rewriting it, the gateway keeps every connection live at the
//! switch under `g` until it ends (RST or both FINs plus a 10 s linger, or idle for the
//! firewall's default timeouts: TCP 60 s until both sides have sent, then 7,440 s; others
//! 60 s): its packets keep their `g`
//! encryptions and meet the `g` chain, whose state for them (firewall tracking, NAT mapping,
//! LB backend, IDS stream) stays valid. Connections opened after the switch meet the new
//! rules. This is what a stateful firewall does with a rule change anyway (rules are checked
//! when a connection opens). Forcing retirement earlier
//! ([`crate::gateway::Gateway::retire_previous`] while
//! [`crate::gateway::Gateway::pinned_connections`] is not 0) moves the remaining connections
//! to `g+1`, where they restart.

use crate::gateway::frame_generation;
use crate::provider::{Outcome, ProviderChain};
use crate::EmbarkError;
use sluice_nf::Event;
use sluice_packet::Packet;
use std::collections::BTreeMap;

/// The provider side of a swap: one chain per live rule generation (at most two).
pub struct Provider {
    chains: Vec<ProviderChain>,
    refused: BTreeMap<String, u64>,
}

impl Provider {
    /// A provider running `chain` (encrypted rules, with a generation).
    pub fn new(chain: ProviderChain) -> Result<Provider, EmbarkError> {
        if chain.generation().is_none() {
            return Err(EmbarkError::BadRule("the provider runs encrypted rules with a generation".into()));
        }
        Ok(Provider { chains: vec![chain], refused: BTreeMap::new() })
    }

    /// The live generations, oldest first.
    pub fn generations(&self) -> Vec<u32> {
        self.chains.iter().filter_map(ProviderChain::generation).collect()
    }

    /// Stages the chain of the next generation beside the running one. Refused if its
    /// generation is not newer than every live one, or a swap is already under way.
    pub fn stage(&mut self, chain: ProviderChain) -> Result<(), EmbarkError> {
        let newest = self.generations().into_iter().max().unwrap_or(0);
        match chain.generation() {
            _ if self.chains.len() >= 2 => {
                Err(EmbarkError::BadRule("a swap is under way: retire the old generation first".into()))
            }
            Some(g) if g > newest => {
                self.chains.push(chain);
                Ok(())
            }
            g => Err(EmbarkError::BadRule(format!("staged generation {g:?} is not newer than {newest}"))),
        }
    }

    /// Discards the chain (rules and NF state) of `generation`; refused for the only one.
    pub fn retire(&mut self, generation: u32) -> Result<(), EmbarkError> {
        if self.chains.len() < 2 {
            return Err(EmbarkError::BadRule("cannot retire the only live generation".into()));
        }
        let before = self.chains.len();
        self.chains.retain(|c| c.generation() != Some(generation));
        if self.chains.len() == before {
            return Err(EmbarkError::BadRule(format!("generation {generation} is not live")));
        }
        Ok(())
    }

    /// Runs a data packet and its token records through the chain of the packet's generation.
    pub fn process_with_tokens(&mut self, pkt: &mut Packet, tokens: &mut [Packet]) -> Outcome {
        let gen = frame_generation(pkt.data());
        let out = match self.chains.iter_mut().find(|c| gen.is_some() && c.generation() == gen) {
            Some(chain) => chain.process_with_tokens(pkt, tokens),
            None => Outcome::Refused(match gen {
                Some(g) => format!("packet of rule generation {g}: no live rules of that generation"),
                None => "packet without a rule generation".into(),
            }),
        };
        if let Outcome::Refused(why) = &out {
            *self.refused.entry(why.clone()).or_default() += 1;
        }
        out
    }

    /// Takes the events every live chain emitted so far.
    pub fn take_events(&mut self) -> Vec<Event> {
        self.chains.iter_mut().flat_map(ProviderChain::take_events).collect()
    }

    /// Packets refused for their generation, by reason.
    pub fn refused(&self) -> &BTreeMap<String, u64> {
        &self.refused
    }
}
