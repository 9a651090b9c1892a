//! Guards shutdown with work in flight: every caller of run_on gets an
//! answer (the value, or Canceled), queued messages are dropped, later
//! sends fail with ShutDown, and shutdown itself returns.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrite_xstream::{
    Error, RunOptions, Task, TaskClass, TaskGraph, XstreamConfig, XstreamId, XstreamSet,
};

#[test]
fn shutdown_cancels_tasks_in_flight_and_refuses_new_work() {
    let set = XstreamSet::start(XstreamConfig::default().with_mailbox_capacity(8)).unwrap();
    let mesh = set.mesh().clone();
    let started = Arc::new(AtomicUsize::new(0));
    let mut waiting = Vec::new();
    for i in 0..32usize {
        let started = started.clone();
        let xs = XstreamId(i % set.len());
        let fut = mesh.run_on(xs, TaskClass::Foreground, move || async move {
            started.fetch_add(1, Ordering::SeqCst);
            futures::future::pending::<()>().await;
            i
        });
        waiting.push(std::thread::spawn(move || common::block_on(fut)));
    }
    // A graph whose async tasks never finish.
    let mut g = TaskGraph::with_capacity(4);
    let stuck = g
        .add(
            &[],
            Task::new_async(TaskClass::Background, futures::future::pending),
        )
        .unwrap();
    g.add(&[stuck], Task::noop()).unwrap();
    let graph_run = g.run(&mesh, RunOptions::seeded(3));
    let graph_thread = std::thread::spawn(move || common::block_on(graph_run));
    for _ in 0..2000 {
        if started.load(Ordering::SeqCst) == 32 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        started.load(Ordering::SeqCst),
        32,
        "all tasks should be running before shutdown"
    );
    set.shutdown().unwrap();
    for w in waiting {
        let outcome = w.join().unwrap();
        assert!(matches!(outcome, Err(Error::Canceled)), "{outcome:?}");
    }
    // The graph's stuck task is canceled, or, when shutdown came before the
    // graph had handed it to an xstream, refused (it failed once in four
    // full CI runs here with ShutDown).
    let graph_outcome = graph_thread.join().unwrap();
    assert!(
        matches!(graph_outcome, Err(Error::Canceled | Error::ShutDown)),
        "{graph_outcome:?}"
    );
    let late = common::block_on(mesh.run_on(XstreamId(0), TaskClass::Control, || async {}));
    assert!(matches!(late, Err(Error::ShutDown)), "{late:?}");
    assert!(matches!(
        mesh.try_send(XstreamId(0), TaskClass::Control, || async {}),
        Err(Error::ShutDown)
    ));
}

#[test]
fn dropping_the_set_answers_senders_blocked_on_a_full_mailbox() {
    let set = XstreamSet::start(
        XstreamConfig::default()
            .with_cores([0])
            .with_mailbox_capacity(2),
    )
    .unwrap();
    let mesh = set.mesh().clone();
    // Park xstream 0 inside a task that blocks its thread until released,
    // so its mailbox fills up.
    let gate = Arc::new(AtomicUsize::new(0));
    let g = gate.clone();
    mesh.try_send(XstreamId(0), TaskClass::Foreground, move || async move {
        g.store(1, Ordering::SeqCst);
        for _ in 0..20_000 {
            if g.load(Ordering::SeqCst) == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
    .unwrap();
    for _ in 0..2000 {
        if gate.load(Ordering::SeqCst) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut queued = 0;
    while mesh
        .try_send(XstreamId(0), TaskClass::Foreground, || async {})
        .is_ok()
    {
        queued += 1;
        assert!(queued <= 2, "the lane is bounded at 2");
    }
    assert_eq!(queued, 2);
    let err = mesh
        .try_send(XstreamId(0), TaskClass::Foreground, || async {})
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::MailboxFull {
                xstream: XstreamId(0)
            }
        ),
        "{err}"
    );
    // A waiting sender, then shutdown from another thread.
    let blocked = mesh.run_on(XstreamId(0), TaskClass::Foreground, || async { 5 });
    let blocked = std::thread::spawn(move || common::block_on(blocked));
    let closer = std::thread::spawn(move || drop(set));
    std::thread::sleep(Duration::from_millis(20));
    gate.store(2, Ordering::SeqCst);
    closer.join().unwrap();
    let outcome = blocked.join().unwrap();
    assert!(
        matches!(outcome, Err(Error::ShutDown) | Err(Error::Canceled) | Ok(5)),
        "{outcome:?}"
    );
}
