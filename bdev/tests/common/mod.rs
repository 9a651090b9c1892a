//! Helpers shared by the integration tests.

/// Runs `f` in a fresh glommio executor on its own thread and waits for it.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    glommio::LocalExecutorBuilder::default()
        .spawn(f)
        .expect("start executor")
        .join()
        .expect("executor thread");
}
