//! Guards failure handling in TaskGraph: a failed or panicking task cancels
//! every transitive dependent on every xstream with itself as the cause,
//! while independent branches still complete.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferrite_xstream::{
    RunOptions, Task, TaskClass, TaskError, TaskGraph, TaskId, TaskOutcome, XstreamId,
};

fn recorder(
    log: &Arc<Mutex<Vec<(TaskId, TaskOutcome)>>>,
) -> impl FnOnce(TaskId, &TaskOutcome) + Send + 'static {
    let log = log.clone();
    move |id, outcome| log.lock().unwrap().push((id, outcome.clone()))
}

#[test]
fn failure_cancels_dependents_across_xstreams_with_cause() {
    let set = common::shared_set();
    let last = XstreamId(set.len() - 1);
    let log = Arc::new(Mutex::new(Vec::new()));
    let ran = Arc::new(AtomicUsize::new(0));
    let mut g = TaskGraph::with_capacity(16);
    let r = ran.clone();
    let root = g
        .add(
            &[],
            Task::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }),
        )
        .unwrap();
    let bad = g
        .add(
            &[root],
            Task::new(|| Err(TaskError::new("disk on fire")))
                .on(XstreamId(0))
                .named("bad"),
        )
        .unwrap();
    let r = ran.clone();
    let child = g
        .add(
            &[bad],
            Task::new(move || {
                r.fetch_add(100, Ordering::SeqCst);
                Ok(())
            })
            .on(last)
            .completion_callback(recorder(&log)),
        )
        .unwrap();
    let grandchild = g
        .add(
            &[child, root],
            Task::noop()
                .on(XstreamId(0))
                .completion_callback(recorder(&log)),
        )
        .unwrap();
    let r = ran.clone();
    let sibling = g
        .add(
            &[root],
            Task::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .on(last)
            .completion_callback(recorder(&log)),
        )
        .unwrap();
    let report = common::block_on(g.run(set.mesh(), RunOptions::seeded(1))).unwrap();
    assert_eq!((report.completed, report.canceled), (2, 2));
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].0, bad);
    assert_eq!(report.failed[0].1.message, "disk on fire");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        2,
        "the canceled child's body must not run"
    );
    let mut log = log.lock().unwrap().clone();
    log.sort_by_key(|(id, _)| *id);
    assert_eq!(log.len(), 3);
    for (id, outcome) in &log[..2] {
        match outcome {
            TaskOutcome::Canceled { cause, error } => {
                assert_eq!(*cause, bad, "{id}");
                assert_eq!(error.message, "disk on fire");
            }
            other => panic!("{id}: expected canceled, got {other:?}"),
        }
    }
    assert_eq!(log[0].0, child);
    assert_eq!(log[1].0, grandchild);
    assert_eq!(log[2].0, sibling);
    assert!(matches!(log[2].1, TaskOutcome::Completed));
}

#[test]
fn panics_fail_the_task_not_the_xstream() {
    let set = common::shared_set();
    let mut g = TaskGraph::with_capacity(8);
    let sync_panic = g.add(&[], Task::new(|| panic!("boom"))).unwrap();
    let async_panic = g
        .add(
            &[],
            Task::new_async(TaskClass::Background, || async { panic!("async boom") }),
        )
        .unwrap();
    g.add(&[sync_panic], Task::noop()).unwrap();
    g.add(&[async_panic], Task::noop()).unwrap();
    g.add(&[], Task::noop()).unwrap();
    let report = common::block_on(g.run(set.mesh(), RunOptions::seeded(2))).unwrap();
    let failed: Vec<TaskId> = report.failed.iter().map(|(t, _)| *t).collect();
    assert_eq!(failed, vec![sync_panic, async_panic]);
    assert!(report
        .failed
        .iter()
        .all(|(_, e)| e.message.contains("panicked")));
    assert_eq!((report.completed, report.canceled), (1, 2));
    // The xstreams still serve messages afterwards.
    for xs in set.ids() {
        let got = common::block_on(
            set.mesh()
                .run_on(xs, TaskClass::Control, move || async move { xs.0 + 1 }),
        );
        assert_eq!(got.unwrap(), xs.0 + 1);
    }
}

#[test]
fn a_panicking_message_is_canceled_and_the_xstream_keeps_serving() {
    let set = common::shared_set();
    for xs in set.ids() {
        let panicked = common::block_on(set.mesh().run_on(xs, TaskClass::Foreground, || async {
            if std::hint::black_box(true) {
                panic!("handler bug");
            }
            1
        }));
        assert!(
            matches!(panicked, Err(ferrite_xstream::Error::Canceled)),
            "{panicked:?}"
        );
        let panicked_early = common::block_on(set.mesh().run_on(
            xs,
            TaskClass::Control,
            || -> std::future::Ready<u8> { panic!("bug before the future") },
        ));
        assert!(
            matches!(panicked_early, Err(ferrite_xstream::Error::Canceled)),
            "{panicked_early:?}"
        );
        let fine = common::block_on(set.mesh().run_on(xs, TaskClass::Control, || async { 7 }));
        assert_eq!(fine.unwrap(), 7);
    }
}
