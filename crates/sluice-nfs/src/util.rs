//! Helpers shared by the NFs, and the pass-through NF.

use sluice_nf::{BuildCtx, NetworkFunction, NfContext, NfError, StateDecl, Verdict};
use sluice_packet::Packet;

/// Deserialises an NF's `config` block (`Null` meaning "all defaults").
pub fn parse_config<T: serde::de::DeserializeOwned + Default>(config: &serde_yaml::Value) -> Result<T, NfError> {
    if config.is_null() {
        return Ok(T::default());
    }
    serde_yaml::from_value(config.clone()).map_err(NfError::from_serde)
}

/// Forwards everything; keeps no state.
pub struct Passthrough;

impl NetworkFunction for Passthrough {
    fn kind(&self) -> &'static str {
        "passthrough"
    }
    fn state_objects(&self) -> &[StateDecl] {
        &[]
    }
    fn process(&self, _pkt: &mut Packet, _ctx: &mut NfContext<'_>) -> Verdict {
        Verdict::Forward
    }
}

/// Builds a [`Passthrough`]; it takes no configuration.
pub fn build_passthrough(config: &serde_yaml::Value, _ctx: &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError> {
    if !config.is_null() {
        return Err(NfError::config("", "passthrough takes no configuration"));
    }
    Ok(Box::new(Passthrough))
}
