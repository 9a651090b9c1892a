//! Guards `ErrorBdev`'s selection of I/Os (kind, range, n-th, probability
//! with a seed, hit limit) and what a fault does (fail, corrupt).

mod common;

use common::run;
use ferrite_bdev::wrap::{ErrorBdev, ErrorRule};
use ferrite_bdev::{open, Bdev, BdevError, IoType};
use std::sync::Arc;

const BS: usize = 4096;

#[test]
fn nth_write_fails_and_nothing_else() {
    run(|| async {
        let dev = Arc::new(ErrorBdev::new(open("malloc:1M").unwrap(), 1));
        dev.add_rule(ErrorRule::fail(&[IoType::Write]).nth(3));
        let ch = dev.channel().unwrap();
        let mut results = Vec::new();
        for i in 0..5u64 {
            results.push(ch.write(i * BS as u64, ch.alloc(BS).unwrap()).await.is_ok());
            ch.read(0, ch.alloc(BS).unwrap()).await.unwrap();
        }
        assert_eq!(results, [true, true, false, true, true]);
        assert_eq!(dev.injected(), 1);
        let e = ch.write(0, ch.alloc(BS).unwrap());
        assert!(e.await.is_ok());
    });
}

#[test]
fn range_rule_hits_only_overlapping_io_and_stops_at_max_hits() {
    run(|| async {
        let dev = Arc::new(ErrorBdev::new(open("malloc:1M").unwrap(), 1));
        let lo = 8 * BS as u64;
        dev.add_rule(ErrorRule::fail(&[]).range(lo..lo + 1).max_hits(2));
        let ch = dev.channel().unwrap();
        assert!(ch.read(0, ch.alloc(BS).unwrap()).await.is_ok());
        let e = ch
            .read(7 * BS as u64, ch.alloc(2 * BS).unwrap())
            .await
            .unwrap_err();
        assert!(matches!(e, BdevError::Io { .. }) && e.to_string().contains("injected"));
        assert!(
            ch.flush().await.is_ok(),
            "flush (offset 0, len 0) is outside the range"
        );
        assert!(ch.unmap(lo, BS as u64).await.is_err());
        assert!(
            ch.read(lo, ch.alloc(BS).unwrap()).await.is_ok(),
            "max_hits reached"
        );
        dev.clear_rules();
        assert_eq!(dev.injected(), 2);
    });
}

#[test]
fn corruption_flips_one_byte_on_read_and_on_write() {
    run(|| async {
        let dev = Arc::new(ErrorBdev::new(open("malloc:1M").unwrap(), 5));
        let ch = dev.channel().unwrap();
        let mut buf = ch.alloc(BS).unwrap();
        buf.as_mut_slice().fill(0x11);
        dev.add_rule(ErrorRule::corrupt(&[IoType::Write]).max_hits(1));
        let back = ch.write(0, buf).await.unwrap();
        assert!(
            back.as_slice().iter().all(|&b| b == 0x11),
            "caller's buffer restored"
        );
        let stored = ch.read(0, ch.alloc(BS).unwrap()).await.unwrap();
        assert_eq!(stored.as_slice().iter().filter(|&&b| b != 0x11).count(), 1);
        dev.clear_rules();
        dev.add_rule(ErrorRule::corrupt(&[IoType::Read]));
        ch.write(BS as u64, back).await.unwrap();
        let r = ch.read(BS as u64, ch.alloc(BS).unwrap()).await.unwrap();
        assert_eq!(r.as_slice().iter().filter(|&&b| b != 0x11).count(), 1);
    });
}

/// The same seed picks the same I/Os; a probability of 0.5 hits some, not all.
#[test]
fn probability_is_seeded() {
    fn pattern(seed: u64) -> Vec<bool> {
        let (tx, rx) = std::sync::mpsc::channel();
        run(move || async move {
            let dev = Arc::new(ErrorBdev::new(open("malloc:1M").unwrap(), seed));
            dev.add_rule(ErrorRule::fail(&[IoType::Read]).probability(0.5));
            let ch = dev.channel().unwrap();
            let mut v = Vec::new();
            for _ in 0..64 {
                v.push(ch.read(0, ch.alloc(BS).unwrap()).await.is_ok());
            }
            tx.send(v).unwrap();
        });
        rx.recv().unwrap()
    }
    let a = pattern(42);
    assert_eq!(a, pattern(42));
    assert!(a.iter().any(|&ok| ok) && a.iter().any(|&ok| !ok));
    assert_ne!(a, pattern(43));
}
