//! The verbs side channel as a client reads the engine's answer (engine
//! `fabric/verbs/side.rs`, `exchange`): a 32-byte queue pair info, a u32 LE
//! descriptor count, then that many 40-byte region descriptors. A queue
//! pair info that decodes re-encodes to exactly the bytes it came from (the
//! layout has no ignored bits), holds 24-bit queue pair and packet sequence
//! numbers and an MTU of 1 to 5; every descriptor that decodes is valid and
//! re-encodes to its bytes.

#![no_main]

use ferrite_proto::qp_info::{QpInfo, QP_INFO_BYTES};
use ferrite_proto::region::{RegionDescriptor, DESCRIPTOR_BYTES};
use libfuzzer_sys::fuzz_target;

/// The most descriptors the client accepts (side.rs `DESCRIPTORS_MAX`).
const DESCRIPTORS_MAX: u32 = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<QP_INFO_BYTES>() else {
        return;
    };
    let Ok(info) = QpInfo::decode(head) else {
        return;
    };
    assert_eq!(&info.encode(), head);
    assert!(info.qpn <= 0xff_ffff && info.psn <= 0xff_ffff);
    assert!((1..=5).contains(&info.mtu));
    let Some((count, mut rest)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let count = u32::from_le_bytes(*count);
    if count > DESCRIPTORS_MAX {
        return;
    }
    for _ in 0..count {
        let Some((b, tail)) = rest.split_first_chunk::<DESCRIPTOR_BYTES>() else {
            return;
        };
        rest = tail;
        let Ok(d) = RegionDescriptor::decode(b) else {
            return;
        };
        d.validate().expect("a decoded descriptor is valid");
        assert_eq!(&d.encode(), b);
    }
});
