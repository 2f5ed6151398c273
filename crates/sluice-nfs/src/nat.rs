//! nat (to be written).

use sluice_nf::{BuildCtx, NetworkFunction, NfError};

/// Builds an instance from its config.
pub fn build(_config: &serde_yaml::Value, _ctx: &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError> {
    Err(NfError::config("", "not implemented yet"))
}
