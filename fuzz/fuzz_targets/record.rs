//! A record as a client reads it from a log region: `RecordView::parse`
//! over arbitrary bytes. A record that parses never claims more bytes than
//! it was given and is a whole number of 8-byte units; it verifies for its
//! own key at its own address (padding records excepted) and for no key
//! that differs in any part; and re-encoding its fields reproduces every
//! byte the CRC covers.

#![no_main]

use ferrite_proto::key::RecordKey;
use ferrite_proto::record::{
    encode_record_stamped, record_len, RecordFlags, RecordView, HEADER_BYTES, OFF_CRC, RECORD_ALIGN,
};
use libfuzzer_sys::fuzz_target;

fn others<'a>(key: &RecordKey<'a>, dkey: &'a [u8], akey: &'a [u8]) -> [RecordKey<'a>; 4] {
    [
        RecordKey::new(key.container ^ 1, key.object, key.dkey, key.akey),
        RecordKey::new(key.container, key.object ^ 1, key.dkey, key.akey),
        RecordKey::new(key.container, key.object, dkey, key.akey),
        RecordKey::new(key.container, key.object, key.dkey, akey),
    ]
}

fn reencode(view: &RecordView<'_>) {
    let key = view.key();
    let raw = view.bytes();
    if key.validate().is_err() {
        return; // encode_record_stamped refuses such keys
    }
    let mut out = vec![0u8; record_len(&key, view.value().len())];
    let flags = view.flags();
    let len = encode_record_stamped(
        &mut out,
        &key,
        view.value(),
        view.version(),
        view.addr(),
        flags,
        view.extent_offset(),
        view.epoch(),
    )
    .expect("a parsed record's fields encode");
    assert_eq!(len, raw.len());
    let body = HEADER_BYTES + key.dkey.len() + key.akey.len() + view.value().len();
    assert_eq!(out[..OFF_CRC + 4], raw[..OFF_CRC + 4]);
    assert_eq!(out[HEADER_BYTES..body], raw[HEADER_BYTES..body]);
}

fuzz_target!(|data: &[u8]| {
    let Ok(view) = RecordView::parse(data) else {
        return;
    };
    assert!(view.len() <= data.len());
    assert_eq!(view.len() % RECORD_ALIGN, 0);
    let key = view.key();
    if view.flags().has(RecordFlags::PAD) {
        assert!(view.verify_for(&key, view.addr()).is_err());
        return;
    }
    view.verify_for(&key, view.addr())
        .expect("a record verifies for its own key");
    assert!(view.verify_for(&key, view.addr() ^ 8).is_err());
    let mut dkey = key.dkey.to_vec();
    dkey.push(0);
    let mut akey = key.akey.to_vec();
    akey.push(0);
    for other in others(&key, &dkey, &akey) {
        assert!(
            view.verify_for(&other, view.addr()).is_err(),
            "verified for {other:?}"
        );
    }
    reencode(&view);
});
