//! Which foreground writes go to the cold segment.
//!
//! A key whose newest record is more than [`COLD_AFTER_RINGS`] rings of log
//! old was not written for that long, and is likely to go as long again
//! before its next write. Its new single value is appended to the open cold
//! segment, with the cleaner's copies, instead of among the hot keys'
//! records, which die young. Hot segments then hold records that die
//! together and are freed with no cleaning pass
//! ([`Store::free_zero_slots`]). Before, the cleaner had to read a hot
//! segment back from the device to copy out the few cold keys' records
//! left in it, long after the rest had died; and those reads, beside the
//! foreground's synchronous writes on the same device, were what slowed
//! the writes while the cleaner ran.
//!
//! Order: a cold record goes above the key's newest record (the placement
//! checks the cold segment's head against it, `log.rs`), and only while no
//! update or punch of the key waits to be published, as for a cleaner
//! copy. Byte arrays and punches always go to the hot head.

use super::log::{AppendSpec, CLEANER_SLOTS};
use super::Store;
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::RecordFlags;

/// How old, in rings of log appended since, a key's newest record must be
/// for its next single value to go to the cold segment. `ferrite bench
/// store --cleaner-only` (16 MiB ring, 90 % of the updates to a tenth of
/// the keys, so each hot key is rewritten every 7 MiB of log or so): at
/// one ring (2 runs), about a tenth of the hot keys' updates went cold as
/// well, the cold segments filled with records that died young, and the
/// cleaner copied 627 MB a run against 343-353 MB with every write at the
/// hot head; at two rings 237-240 MB, at four 235-256, at eight 276-282
/// (3 runs each).
pub const COLD_AFTER_RINGS: u64 = 2;

/// Where a foreground append goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    /// The hot head (above every record).
    Hot,
    /// The cold segment, above the key's newest record at this address.
    Cold(u64),
}

impl Stream {
    /// The `cold` field of an [`AppendSpec`] for this stream.
    pub(crate) fn floor(self) -> Option<u64> {
        match self {
            Stream::Hot => None,
            Stream::Cold(above) => Some(above),
        }
    }
}

impl Store {
    /// Where a foreground append of `spec` goes now: [`Stream::Cold`] for a
    /// single value whose key's newest record is published and more than
    /// [`COLD_AFTER_RINGS`] rings old, else [`Stream::Hot`]; always hot
    /// while the free segments are down to the cleaner's
    /// ([`CLEANER_SLOTS`]): then the open cold segment's room is what the
    /// cleaner copies into, and foreground writes taking it, with no
    /// segment opened (which would wait), left a nearly full log with no
    /// room for the copies that free segments. Synchronous: the answer
    /// holds until the caller's next await.
    pub(crate) fn stream_for(&self, spec: &AppendSpec<'_>) -> Stream {
        if !self.config.cold_writes || spec.flags != RecordFlags::empty() {
            return Stream::Hot;
        }
        let (head, free) = {
            let log = self.log.borrow();
            (log.head, log.slots.free)
        };
        if free <= 1 + CLEANER_SLOTS {
            return Stream::Hot;
        }
        let old = |addr: u64| head.saturating_sub(addr) > COLD_AFTER_RINGS * self.geo.ring_bytes;
        match self.published_addr(spec.key) {
            Some(addr) if old(addr) => Stream::Cold(addr),
            _ => Stream::Hot,
        }
    }

    /// The address of the key's newest record when none of its updates or
    /// punches waits to be published and it holds a single value; `None`
    /// otherwise (absent, a byte array, or pending).
    fn published_addr(&self, key: &RecordKey<'_>) -> Option<u64> {
        if self.has_pending(key.hash().0) {
            return None;
        }
        self.published_state(key).1
    }
}
