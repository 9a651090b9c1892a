//! The store's superblock as the engine reads block 0 of a device at open.
//! The input is the block; its CRC is set right before decoding so that the
//! fuzzer explores the geometry checks behind it. A superblock that decodes
//! describes a layout whose areas lie inside the device in order
//! (superblock, two checkpoint areas, log) and whose ring and segments
//! divide the log; it encodes to a block that decodes to the same geometry.

#![no_main]

use ferrite_engine::store::Geometry;
use libfuzzer_sys::fuzz_target;

/// Superblock bytes (engine/FORMAT.md) and where its CRC lies.
const SB_BYTES: usize = 88;
const SB_CRC: usize = 80;

fuzz_target!(|data: &[u8]| {
    let mut block = [0u8; 4096];
    let n = data.len().min(block.len());
    block[..n].copy_from_slice(&data[..n]);
    if block[..SB_BYTES].iter().any(|&b| b != 0) {
        let crc = crc32fast::hash(&block[..SB_CRC]);
        block[SB_CRC..SB_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(Some(g)) = Geometry::decode_superblock("fuzz", &block) else {
        return;
    };
    assert!(
        g.checkpoint_offset >= 4096,
        "checkpoints overlap the superblock: {g:?}"
    );
    let ckpt_end = g.checkpoint_area(1).checked_add(g.checkpoint_bytes);
    assert!(ckpt_end.is_some_and(|e| e <= g.log_offset), "{g:?}");
    assert!(g
        .log_offset
        .checked_add(g.log_bytes)
        .is_some_and(|e| e <= g.device_bytes));
    assert_eq!(g.log_bytes % g.ring_bytes, 0);
    assert_eq!(g.ring_bytes % g.segment_bytes, 0);
    assert!(g.slots() >= 2);
    let mut again = [0u8; 4096];
    g.encode_superblock(&mut again);
    assert_eq!(
        Geometry::decode_superblock("fuzz", &again).ok(),
        Some(Some(g))
    );
});
