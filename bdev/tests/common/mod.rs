//! Helpers shared by the integration tests.

use ferrite_xstream::{TaskClass, XstreamConfig, XstreamId, XstreamSet};

/// Runs `f` on a fresh xstream (a glommio executor on its own thread, where
/// channels live in the engine) and waits for it; a panic in `f` fails the
/// test.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let set =
        XstreamSet::start(XstreamConfig::default().with_cores(vec![0])).expect("start xstream");
    let done = set.mesh().run_on(XstreamId(0), TaskClass::Foreground, f);
    let result = futures::executor::block_on(done);
    set.shutdown().expect("shut the xstream down");
    result.expect("the test body panicked on the xstream (its message is above)");
}
