//! When an update is acknowledged ([`Durability`]), and flushing the device
//! on demand ([`Store::sync`]) or in the background ([`Store::flush_loop`]).

use super::{Store, StoreError};
use crate::store::error::Result;
use std::rc::Weak;
use std::time::Duration;

/// When an update is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Once its record is written to the device and the device flushed: it
    /// survives a power loss. One flush per group commit.
    #[default]
    Device,
    /// Once its record is written to the device, before any flush: it
    /// survives the engine being killed (the kernel or the device's cache
    /// holds the bytes), but a power loss may take what was written since the
    /// last flush. The device is flushed every flush interval, on
    /// [`Store::sync`], by every checkpoint and at shutdown: the guarantee of a
    /// local file system written without fsync.
    Process,
}

impl Durability {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "device" => Some(Self::Device),
            "process" => Some(Self::Process),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Device => "device",
            Self::Process => "process",
        }
    }
}

impl Store {
    /// The durability this store acknowledges updates with.
    pub fn durability(&self) -> Durability {
        self.config.durability
    }

    /// How often [`Store::flush_loop`] flushes under [`Durability::Process`].
    pub fn flush_interval(&self) -> Duration {
        self.config.flush_interval
    }

    /// Returns once every update acknowledged before the call survives a
    /// power loss (a no-op beyond waiting for commits under
    /// [`Durability::Device`]).
    pub async fn sync(&self) -> Result<()> {
        self.wait_all_durable().await?;
        self.flush_written().await
    }

    /// Flushes the device if bytes were written since the last flush.
    /// Concurrent callers share one flush.
    pub(crate) async fn flush_written(&self) -> Result<()> {
        let written = self.log.borrow().committed_appends;
        if self.flushed_upto.get() >= written {
            return Ok(());
        }
        let _permit = self
            .flush_lock
            .acquire_permit(1)
            .await
            .map_err(|e| StoreError::Invalid(format!("flush lock: {e}")))?;
        if self.flushed_upto.get() >= written {
            return Ok(());
        }
        let upto = self.log.borrow().committed_appends;
        if let Err(e) = self.chan.flush().await {
            self.set_poison(format!("log flush: {e}"));
            return Err(self.device_error("flush", e));
        }
        self.note_flushed(upto);
        Ok(())
    }

    /// Records that the first `upto` appended records are on stable media.
    pub(crate) fn note_flushed(&self, upto: u64) {
        self.flushed_upto.set(self.flushed_upto.get().max(upto));
        let appends = self.log.borrow().appends;
        self.damage.borrow_mut().flushed(upto, appends);
    }

    /// Under [`Durability::Process`], flushes what was written every
    /// `interval` until the store is dropped. Run it on the store's xstream.
    pub async fn flush_loop(store: Weak<Store>, interval: Duration) {
        loop {
            glommio::timer::sleep(interval).await;
            let Some(s) = store.upgrade() else { return };
            if s.check_writable().is_err() {
                return;
            }
            if let Err(e) = s.flush_written().await {
                tracing::warn!(device = %s.device, error = %e, "background flush failed");
            }
        }
    }
}
