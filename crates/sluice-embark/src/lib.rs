//! Embark for Sluice: network functions over encrypted traffic.
//!
//! An enterprise sends its traffic through a provider's NFs without trusting the provider with
//! it. The enterprise's gateway encrypts every packet so that the provider's firewall, NAT,
//! load balancer and IDS run unchanged on ciphertext:
//!
//! * [`prefixmatch`]: addresses and ports encrypted so that range and prefix rules still
//!   match (the provider learns which encrypted rules a value falls in, nothing else);
//! * [`keyword`]: payload tokens encrypted so that an IDS can find encrypted keywords;
//! * [`gateway`]: IPv4→IPv6, field-wise encryption, the original values sealed in an IPv6
//!   destination option, token records; and the way back;
//! * [`rules`]: turning a provider chain's plaintext NF configuration into the encrypted one
//!   plus the gateway's secret state;
//! * [`provider`]: a sequential driver for the provider's chain (tests, the CLI);
//! * [`swap`]: rule updates, a coordinated swap with no packet under mixed generations;
//! * [`compare`]: the plaintext chain against the encrypted path, packet for packet.
//!
//! See `docs/embark.md` for the threat model and what exactly leaks.

pub mod compare;
mod conns;
pub mod gateway;
pub mod keys;
pub mod keyword;
pub mod prefixmatch;
pub mod provider;
pub mod rules;
pub mod swap;
mod tokenizer;

pub use keys::MasterKey;

/// What can go wrong with Embark's keys, rules and packets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbarkError {
    /// A key (file) is unusable.
    #[error("bad key: {0}")]
    BadKey(String),
    /// A rule or rule file is unusable.
    #[error("bad rule: {0}")]
    BadRule(String),
    /// Rules or packets made under another key.
    #[error("wrong key: {0}")]
    WrongKey(String),
    /// An encrypted packet or record does not parse.
    #[error("malformed: {0}")]
    Malformed(&'static str),
    /// A packet the gateway does not handle.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
}
