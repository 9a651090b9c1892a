//! What the namespace can still hold: the engine's targets' space
//! ceilings and live data (`ferrite stat`'s `live_ceiling_bytes` and
//! `live_bytes`), for statfs.

use super::error::{client_err, FsResult};
use super::Namespace;

/// Bytes the engine admits in all, and those in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// The sum of the targets' ceilings: what live data may fill.
    pub total_bytes: u64,
    pub used_bytes: u64,
}

impl Space {
    pub fn free_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.used_bytes)
    }
}

impl Namespace {
    /// The engine's space now, summed over its targets (every namespace on
    /// the engine shares it).
    pub fn space(&self) -> FsResult<Space> {
        let stat = self.client().stat().map_err(client_err("statfs"))?;
        let sum = |name: &str| -> u64 {
            let counters = stat.target_counters.iter().flat_map(|t| &t.counters);
            counters.filter(|(n, _)| n == name).map(|(_, v)| v).sum()
        };
        Ok(Space {
            total_bytes: sum("live_ceiling_bytes"),
            used_bytes: sum("live_bytes"),
        })
    }
}
