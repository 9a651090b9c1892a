//! A bucket as a client copies it out of a bucket region, then the slot it
//! follows: the first 64 input bytes are the bucket, the rest a window of
//! the record log. A bucket whose CRC checks decodes to slots that encode
//! back to the same bytes (reserved word aside); `matching` yields exactly
//! the slots with the fingerprint; a record found behind a slot and
//! verified for the key asked for is that key's record at that address,
//! and lies inside the window.

#![no_main]

use ferrite_proto::bucket::{Bucket, BUCKET_BYTES, OFF_RESERVED, OFF_SLOTS, SLOTS_PER_BUCKET};
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::RecordView;
use libfuzzer_sys::fuzz_target;

/// The key a client looks up (the corpus generator's seeds hold records
/// of this key).
fn wanted() -> RecordKey<'static> {
    RecordKey::new(7, 42, b"dkey", b"akey")
}

fn check_slots(bucket: &Bucket) {
    let mut copy = Bucket(bucket.0);
    copy.0[OFF_RESERVED..OFF_SLOTS].fill(0);
    for (i, slot) in bucket.slots().into_iter().enumerate() {
        copy.set_slot(i, slot);
    }
    copy.set_next(bucket.next());
    assert_eq!(copy.0[OFF_SLOTS..], bucket.0[OFF_SLOTS..]);
    let fingerprint = bucket.slot(0).fingerprint;
    let expected = bucket
        .slots()
        .iter()
        .filter(|s| s.fingerprint == fingerprint)
        .count();
    assert_eq!(bucket.matching(fingerprint).count(), expected);
    assert!((1..=SLOTS_PER_BUCKET).contains(&expected));
}

fuzz_target!(|data: &[u8]| {
    let Some((head, window)) = data.split_first_chunk::<BUCKET_BYTES>() else {
        return;
    };
    let bucket = Bucket(*head);
    if bucket.check().is_err() {
        return;
    }
    check_slots(&bucket);
    let key = wanted();
    for slot in bucket.matching(key.hash().fingerprint()) {
        // The window stands for the log from address 0.
        let Ok(start) = usize::try_from(slot.addr) else {
            continue;
        };
        let end = start.saturating_add(slot.length as usize).min(window.len());
        let Some(bytes) = window.get(start..end) else {
            continue;
        };
        let Ok(view) = RecordView::parse(bytes) else {
            continue;
        };
        assert!(view.len() <= bytes.len());
        if view.verify_for(&key, slot.addr).is_ok() {
            assert_eq!(view.key(), key);
            assert_eq!(view.addr(), slot.addr);
        }
    }
});
