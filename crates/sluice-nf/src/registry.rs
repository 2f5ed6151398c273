//! Building NF instances from chain-file configuration.

use crate::NetworkFunction;
use sluice_packet::LabelId;
use std::collections::BTreeMap;

/// Why an NF could not be built from its configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NfError {
    /// No NF type of this name is registered.
    #[error("unknown NF type `{0}` (known: {1})")]
    UnknownType(String, String),
    /// The configuration is invalid; `field` is the path within the NF's `config`.
    #[error("config field `{field}`: {message}")]
    Config {
        /// Field path inside `config` (empty for the whole block).
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl NfError {
    /// A configuration error on `field`.
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> NfError {
        NfError::Config { field: field.into(), message: message.into() }
    }

    /// Turns a serde error from deserialising a config block into an [`NfError`].
    pub fn from_serde(e: serde_yaml::Error) -> NfError {
        let msg = e.to_string();
        // serde_yaml prefixes the path ("limits.max: invalid type ...") when it knows it.
        match msg.split_once(": ") {
            Some((path, rest)) if !path.contains(' ') => NfError::config(path, rest),
            _ => NfError::config("", msg),
        }
    }
}

/// Label names used by a chain, interned to compact ids when the chain is compiled.
#[derive(Debug, Clone, Default)]
pub struct LabelTable {
    names: Vec<String>,
}

impl LabelTable {
    /// The id of `name`, adding it if new.
    pub fn intern(&mut self, name: &str) -> LabelId {
        if let Some(id) = self.get(name) {
            return id;
        }
        self.names.push(name.to_string());
        LabelId((self.names.len() - 1) as u16)
    }
    /// The id of `name`, if interned.
    pub fn get(&self, name: &str) -> Option<LabelId> {
        self.names.iter().position(|n| n == name).map(|i| LabelId(i as u16))
    }
    /// The name of `id`.
    pub fn name(&self, id: LabelId) -> Option<&str> {
        self.names.get(usize::from(id.0)).map(String::as_str)
    }
}

/// What a builder knows about the instance it builds.
pub struct BuildCtx<'a> {
    /// The vertex name.
    pub vertex: &'a str,
    /// Index of this instance within the vertex.
    pub instance: u16,
    /// Number of instances of the vertex.
    pub instances: u16,
    /// The chain's labels; builders intern the labels their NF sets.
    pub labels: &'a mut LabelTable,
    /// The instances of the vertex share their state through a store (rather than each
    /// keeping its own): resources they used to split among themselves, such as a NAT's
    /// ports, are one shared pool.
    pub shared_state: bool,
}

/// Builds one NF instance from its YAML `config` block (`Null` when absent).
pub type NfBuilder = fn(&serde_yaml::Value, &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError>;

/// The NF types a runtime can instantiate, by name.
#[derive(Default, Clone)]
pub struct NfRegistry {
    types: BTreeMap<&'static str, (NfBuilder, &'static str)>,
}

impl NfRegistry {
    /// An empty registry.
    pub fn new() -> NfRegistry {
        NfRegistry::default()
    }
    /// Registers type `name` with its builder and a one-line description.
    pub fn register(&mut self, name: &'static str, about: &'static str, builder: NfBuilder) {
        self.types.insert(name, (builder, about));
    }
    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.types.contains_key(name)
    }
    /// Registered type names with their descriptions.
    pub fn types(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        self.types.iter().map(|(n, (_, a))| (*n, *a))
    }
    /// Builds an instance of type `name`.
    pub fn build(
        &self,
        name: &str,
        config: &serde_yaml::Value,
        ctx: &mut BuildCtx<'_>,
    ) -> Result<Box<dyn NetworkFunction>, NfError> {
        match self.types.get(name) {
            Some((b, _)) => b(config, ctx),
            None => {
                Err(NfError::UnknownType(name.to_string(), self.types.keys().copied().collect::<Vec<_>>().join(", ")))
            }
        }
    }
}
