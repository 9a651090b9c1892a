//! Guards the promise the record store's crash tests rely on: after
//! `CrashBdev::crash`, every unflushed write is kept, dropped or torn at a
//! sector boundary exactly as reported, and flushed data is never lost.

mod common;

use common::run;
use ferrite_bdev::wrap::{CrashBdev, CrashMode, Fate, TEAR_SECTOR};
use ferrite_bdev::{open, Bdev, BdevRef, Channel, IoBuf};
use std::sync::Arc;

fn filled(ch: &dyn Channel, len: usize, byte: u8) -> IoBuf {
    let mut b = ch.alloc(len).unwrap();
    b.as_mut_slice().fill(byte);
    b
}

const BS: u64 = 4096;
const WRITE_LEN: u64 = 2 * BS;

/// Flushed 0xAA everywhere in blocks 0..16, then unflushed 0x5B writes of
/// two blocks each at blocks 0, 4, 8; crash; every byte must match the fate.
async fn one_round(inner: BdevRef, seed: u64) -> Vec<Fate> {
    let dev = CrashBdev::new(inner);
    let ch = dev.channel().unwrap();
    ch.write(0, filled(&*ch, 16 * BS as usize, 0xAA))
        .await
        .unwrap();
    ch.flush().await.unwrap();
    let offsets = [0, 4 * BS, 8 * BS];
    for off in offsets {
        ch.write(off, filled(&*ch, WRITE_LEN as usize, 0x5B))
            .await
            .unwrap();
    }
    assert_eq!(dev.unflushed_writes(), 3);
    let report = dev.crash(seed).await.unwrap();
    assert_eq!(report.writes.len(), 3);
    assert!(
        ch.read(0, ch.alloc(BS as usize).unwrap()).await.is_err(),
        "old channel is dead"
    );
    let fresh = dev.channel().unwrap();
    let image = fresh
        .read(0, fresh.alloc(16 * BS as usize).unwrap())
        .await
        .unwrap();
    let image = image.as_slice();
    for (w, off) in report.writes.iter().zip(offsets) {
        assert_eq!((w.offset, w.len), (off, WRITE_LEN));
        let kept = match w.fate {
            Fate::Kept => WRITE_LEN,
            Fate::Dropped => 0,
            Fate::Torn { kept_bytes } => {
                assert_eq!(kept_bytes % TEAR_SECTOR, 0);
                assert!(kept_bytes < WRITE_LEN);
                kept_bytes
            }
            Fate::Holed { .. } => panic!("seed {seed}: a hole in the random mode"),
        };
        let range = &image[off as usize..(off + WRITE_LEN) as usize];
        assert!(
            range[..kept as usize].iter().all(|&b| b == 0x5B),
            "seed {seed}: kept part"
        );
        assert!(
            range[kept as usize..].iter().all(|&b| b == 0xAA),
            "seed {seed}: lost part"
        );
    }
    // Blocks no unflushed write touched keep their flushed content.
    assert!(image[(2 * BS) as usize..(4 * BS) as usize]
        .iter()
        .all(|&b| b == 0xAA));
    assert!(image[(10 * BS) as usize..].iter().all(|&b| b == 0xAA));
    report.writes.iter().map(|w| w.fate).collect()
}

#[test]
fn unflushed_writes_vanish_or_tear_as_reported() {
    run(|| async {
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..24u64 {
            for fate in one_round(open("malloc:1M").unwrap(), seed).await {
                seen.insert(match fate {
                    Fate::Kept => 0,
                    Fate::Dropped => 1,
                    Fate::Torn { .. } => 2,
                    Fate::Holed { .. } => 3,
                });
            }
        }
        assert_eq!(seen.len(), 3, "24 seeds produce every fate");
    });
}

#[test]
fn same_seed_same_crash() {
    run(|| async {
        let a = one_round(open("malloc:1M").unwrap(), 99).await;
        let b = one_round(open("malloc:1M").unwrap(), 99).await;
        assert_eq!(a, b);
    });
}

#[test]
fn crash_on_a_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("uring:{}?size=1M", dir.path().join("d").display());
    run(move || async move {
        for seed in 0..4 {
            one_round(open(&spec).unwrap(), seed).await;
        }
    });
}

/// Writes and flushes in random order; whatever the crash, every block whose
/// last write was flushed holds that write.
#[test]
fn flushed_data_is_never_lost() {
    run(|| async {
        for seed in 0..16u64 {
            let inner = open("malloc:256K").unwrap();
            let dev = Arc::new(CrashBdev::new(inner));
            let ch = dev.channel().unwrap();
            let mut flushed = [0u8; 64]; // last flushed byte per block
            let mut written = [0u8; 64]; // last written byte per block
            let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            for step in 0..200u32 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let block = (x >> 33) % 64;
                if step % 7 == 6 {
                    ch.flush().await.unwrap();
                    flushed.copy_from_slice(&written);
                } else {
                    let byte = (step % 250 + 1) as u8;
                    ch.write(block * BS, filled(&*ch, BS as usize, byte))
                        .await
                        .unwrap();
                    written[block as usize] = byte;
                }
            }
            dev.crash(seed).await.unwrap();
            let fresh = dev.channel().unwrap();
            let image = fresh
                .read(0, fresh.alloc(64 * BS as usize).unwrap())
                .await
                .unwrap();
            for b in 0..64usize {
                let block = &image.as_slice()[b * BS as usize..(b + 1) * BS as usize];
                if written[b] == flushed[b] {
                    assert!(
                        block.iter().all(|&v| v == flushed[b]),
                        "seed {seed} block {b}"
                    );
                }
            }
        }
    });
}

#[test]
fn pass_through_until_crash() {
    run(|| async {
        let dev = CrashBdev::new(open("malloc:64K").unwrap());
        assert_eq!(dev.block_count(), 16);
        let ch = dev.channel().unwrap();
        ch.write(BS, filled(&*ch, BS as usize, 3)).await.unwrap();
        let r = dev.crash(1).await.unwrap();
        assert_eq!(r.writes.len(), 1);
        assert_eq!(dev.unflushed_writes(), 0);
        let ch = dev.channel().unwrap();
        ch.write(0, filled(&*ch, BS as usize, 4)).await.unwrap();
        ch.flush().await.unwrap();
        assert_eq!(
            dev.crash(2).await.unwrap().writes.len(),
            0,
            "nothing unflushed"
        );
        let ch = dev.channel().unwrap();
        let b = ch.read(0, ch.alloc(BS as usize).unwrap()).await.unwrap();
        assert!(b.as_slice().iter().all(|&v| v == 4));
    });
}

/// The out-of-order mode: each multi-sector write loses one sector that is
/// not its last and keeps every later one (what the record store's
/// recovery must not take for a complete commit).
#[test]
fn lose_earlier_sector_keeps_the_later_ones() {
    run(|| async {
        for seed in 0..8u64 {
            let dev = CrashBdev::new(open("malloc:1M").unwrap());
            dev.set_mode(CrashMode::LoseEarlierSector);
            let ch = dev.channel().unwrap();
            ch.write(0, filled(&*ch, 4 * BS as usize, 0xAA))
                .await
                .unwrap();
            ch.flush().await.unwrap();
            ch.write(0, filled(&*ch, WRITE_LEN as usize, 0x5B))
                .await
                .unwrap();
            let report = dev.crash(seed).await.unwrap();
            let Fate::Holed {
                lost_from,
                lost_bytes,
            } = report.writes[0].fate
            else {
                panic!("seed {seed}: {:?}", report.writes[0]);
            };
            assert_eq!(lost_bytes, TEAR_SECTOR);
            assert!(lost_from + lost_bytes < WRITE_LEN, "seed {seed}");
            let fresh = dev.channel().unwrap();
            let image = fresh
                .read(0, fresh.alloc(WRITE_LEN as usize).unwrap())
                .await
                .unwrap();
            for (i, &b) in image.as_slice().iter().enumerate() {
                let lost = (lost_from..lost_from + lost_bytes).contains(&(i as u64));
                assert_eq!(b, if lost { 0xAA } else { 0x5B }, "seed {seed}: byte {i}");
            }
        }
    });
}

/// A device told to die after n writes completes exactly n, then refuses
/// writes and flushes; a crash revives it.
#[test]
fn die_after_writes_stops_at_the_nth() {
    run(|| async {
        let dev = CrashBdev::new(open("malloc:1M").unwrap());
        let ch = dev.channel().unwrap();
        dev.die_after_writes(2);
        for i in 0..2 {
            ch.write(i * BS, filled(&*ch, BS as usize, 1))
                .await
                .unwrap();
        }
        assert!(dev.died());
        assert!(ch
            .write(2 * BS, filled(&*ch, BS as usize, 1))
            .await
            .is_err());
        assert!(ch.flush().await.is_err());
        dev.crash(1).await.unwrap();
        assert!(!dev.died());
        let fresh = dev.channel().unwrap();
        fresh
            .write(0, filled(&*fresh, BS as usize, 2))
            .await
            .unwrap();
        fresh.flush().await.unwrap();
    });
}
