//! Wrappers that stack on any device, for tests (SPDK `module/bdev/error`,
//! `module/bdev/delay`; redb's `CrashBackend`):
//!
//! - [`ErrorBdev`]: fails or corrupts chosen I/Os ([`ErrorRule`]: by kind,
//!   byte range, n-th matching I/O, probability with a seed).
//! - [`DelayBdev`]: completes each I/O after a fixed extra latency.
//! - [`CrashBdev`]: keeps the durable image of the device; [`CrashBdev::crash`]
//!   simulates a power loss in which every write not yet flushed is kept,
//!   dropped, or torn at a sector boundary, chosen by a seed. Flushed data
//!   is never lost.
//!
//! A wrapper is itself a [`Bdev`]: wrap, share as a [`BdevRef`], and open
//! channels on it as usual. With no rule set (or no delay, or no crash) each
//! one passes every I/O through unchanged.
//!
//! ```
//! use ferrite_bdev::wrap::{CrashBdev, ErrorBdev, ErrorRule};
//! use ferrite_bdev::{open, Bdev, IoType};
//! use std::sync::Arc;
//!
//! let errors = Arc::new(ErrorBdev::new(open("malloc:1M").unwrap(), 7));
//! errors.add_rule(ErrorRule::fail(&[IoType::Write]).nth(2));
//! let crash = Arc::new(CrashBdev::new(errors.clone()));
//! glommio::LocalExecutorBuilder::default()
//!     .spawn(move || async move {
//!         let ch = crash.channel().unwrap();
//!         let buf = ch.write(0, ch.alloc(4096).unwrap()).await.unwrap();
//!         assert!(ch.write(0, buf).await.is_err()); // the 2nd write fails
//!         assert_eq!(errors.injected(), 1);
//!         drop(ch);
//!         let report = crash.crash(42).await.unwrap();
//!         assert_eq!(report.writes.len(), 1); // the unflushed first write
//!     })
//!     .unwrap()
//!     .join()
//!     .unwrap();
//! ```

mod crash;
mod delay;
mod error;

pub use crash::{CrashBdev, CrashMode, CrashReport, Fate, WriteFate, TEAR_SECTOR};
pub use delay::{DelayBdev, Delays};
pub use error::{ErrorBdev, ErrorRule, Fault};

#[cfg(doc)]
use crate::{Bdev, BdevRef};

/// Forwards the geometry methods of [`crate::Bdev`] to `self.inner`.
macro_rules! forward_geometry {
    () => {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn block_size(&self) -> u32 {
            self.inner.block_size()
        }
        fn block_count(&self) -> u64 {
            self.inner.block_count()
        }
        fn optimal_io_boundary_blocks(&self) -> u32 {
            self.inner.optimal_io_boundary_blocks()
        }
        fn io_type_supported(&self, io_type: $crate::IoType) -> bool {
            self.inner.io_type_supported(io_type)
        }
    };
}
pub(crate) use forward_geometry;
