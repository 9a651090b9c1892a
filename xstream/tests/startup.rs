//! Guards start-up: a bad core list and a failing init closure are clear
//! errors and leave no xstream running; init runs on every xstream, on its
//! own pinned thread, before any message.

use std::sync::{Arc, Mutex};

use ferrite_xstream::{allowed_cores, current, Error, XstreamConfig, XstreamId, XstreamSet};

#[test]
fn invalid_core_lists_are_refused() {
    let err = XstreamSet::start(XstreamConfig::default().with_cores([])).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let err = XstreamSet::start(XstreamConfig::default().with_cores([0, 0])).unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
    let err = XstreamSet::start(XstreamConfig::default().with_cores([4096])).unwrap_err();
    assert!(matches!(err, Error::InvalidCoreList { .. }), "{err}");
}

#[test]
fn init_runs_on_each_pinned_xstream_and_failure_stops_the_set() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let set = XstreamSet::start_with(XstreamConfig::default(), move |id: XstreamId| {
        let s = s.clone();
        async move {
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() };
            s.lock().unwrap().push((id, current(), cpu));
            Ok::<(), String>(())
        }
    })
    .unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen.len(), set.len());
    for (i, (id, cur, cpu)) in seen.iter().enumerate() {
        assert_eq!((*id, *cur), (XstreamId(i), Some(XstreamId(i))));
        assert_eq!(*cpu as usize, set.cores()[i], "xstream {i} not on its core");
    }
    assert_eq!(set.cores(), allowed_cores().unwrap().as_slice());
    set.shutdown().unwrap();

    let err = XstreamSet::start_with(XstreamConfig::default(), |id: XstreamId| async move {
        if id == XstreamId(0) {
            Err("no device for target 0".to_string())
        } else {
            Ok(())
        }
    })
    .unwrap_err();
    assert!(
        matches!(&err, Error::Init { xstream: XstreamId(0), reason } if reason.contains("no device")),
        "{err}"
    );
}
