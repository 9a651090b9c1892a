//! Guards the task classes: CPU-bound background work on an xstream cannot
//! starve foreground work there. Work is counted in units of fixed CPU
//! work, not in time.

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ferrite_xstream::{ClassShares, TaskClass, XstreamConfig, XstreamId, XstreamSet};

/// Background never stops on its own before this many units (far more
/// than foreground needs, unless foreground is starved).
const BACKGROUND_LIMIT: usize = 2_000_000;
const FOREGROUND_UNITS: usize = 2_000;

fn burn() {
    let mut x = 1u64;
    for i in 0..20_000u64 {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    black_box(x);
}

/// Runs 4 endless background burners and one foreground task of
/// `fg_units` on one xstream; returns the background units done meanwhile.
fn background_units_during_foreground(config: XstreamConfig, fg_units: usize) -> usize {
    let set = XstreamSet::start(config.with_cores([0])).unwrap();
    let mesh = set.mesh().clone();
    let bg_units = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    for _ in 0..4 {
        let (units, stop) = (bg_units.clone(), stop.clone());
        mesh.try_send(XstreamId(0), TaskClass::Background, move || async move {
            for _ in 0..BACKGROUND_LIMIT {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                burn();
                units.fetch_add(1, Ordering::SeqCst);
                glommio::yield_if_needed().await;
            }
        })
        .unwrap();
    }
    for _ in 0..10_000 {
        if bg_units.load(Ordering::SeqCst) > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let units = bg_units.clone();
    let (before, during) =
        common::block_on(
            mesh.run_on(XstreamId(0), TaskClass::Foreground, move || async move {
                let before = units.load(Ordering::SeqCst);
                for _ in 0..fg_units {
                    burn();
                    glommio::yield_if_needed().await;
                }
                (before, units.load(Ordering::SeqCst) - before)
            }),
        )
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    assert!(before > 0, "background was running when foreground started");
    set.shutdown().unwrap();
    eprintln!("foreground {fg_units} units, background {during} units meanwhile");
    during
}

#[test]
fn background_cannot_starve_foreground() {
    let during = background_units_during_foreground(XstreamConfig::default(), FOREGROUND_UNITS);
    assert!(
        during < FOREGROUND_UNITS / 2,
        "background did {during} units while foreground did {FOREGROUND_UNITS}: shares not honoured"
    );
}

/// The control experiment: with the shares inverted, the same load makes
/// background win, so the test above measures the shares and nothing else.
#[test]
fn inverted_shares_let_background_win() {
    let shares = ClassShares {
        foreground: 100,
        background: 1000,
        control: 500,
    };
    let config = XstreamConfig {
        shares,
        ..XstreamConfig::default()
    };
    let fg_units = 200;
    let during = background_units_during_foreground(config, fg_units);
    assert!(
        during > 2 * fg_units,
        "background did only {during} units with 10x the shares"
    );
}
