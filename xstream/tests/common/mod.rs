//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::Duration;

use ferrite_xstream::{XstreamConfig, XstreamSet};

/// One set per test binary, on every allowed core, spinning a little so
/// that many short cases stay quick.
pub fn shared_set() -> &'static XstreamSet {
    static SET: OnceLock<XstreamSet> = OnceLock::new();
    SET.get_or_init(|| {
        match XstreamSet::start(XstreamConfig::default().with_spin(Duration::from_micros(20))) {
            Ok(set) => set,
            Err(e) => panic!("cannot start the shared xstream set: {e}"),
        }
    })
}

/// Blocks on a future from a test thread.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}
