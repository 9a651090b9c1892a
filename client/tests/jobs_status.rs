//! Guards: status queries answered while a job runs are consistent (no task
//! done before a predecessor, progress never goes back), `--watch` style
//! subscriptions end with the final state, and cancel stops a job.
#![cfg(feature = "embedded")]

#[path = "jobs_common.rs"]
mod common;

use std::time::Duration;

use ferrite_client::bench_jobs::{dag_spec, random_dag};
use ferrite_client::jobs::JobClient;
use ferrite_proto::rpc_jobs::{JobPhase, SpecFormat, TaskPhase};

#[test]
fn concurrent_status_queries_during_a_run_are_consistent() {
    common::watchdog(Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let service = common::start_service(dir.path(), 8);
    let addr = service.addr().to_string();
    let _w: Vec<_> = (0..2)
        .map(|i| common::Worker::start(&addr, &format!("w{i}"), 1, dir.path()))
        .collect();
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    client.wait_resources(2).unwrap();
    let preds = random_dag(1000, (0, 3), 30, 7);
    let job = client
        .submit(
            &serde_json::to_string(&dag_spec(&preds)).unwrap(),
            SpecFormat::Json,
        )
        .unwrap();
    let queriers: Vec<_> = (0..4)
        .map(|_| {
            let (addr, preds) = (addr.clone(), preds.clone());
            std::thread::spawn(move || {
                let mut c = JobClient::connect(&addr, common::TOKEN).unwrap();
                let mut last_done = 0;
                let mut seen_final = false;
                for _ in 0..50 {
                    let s = c.status(job).unwrap();
                    assert_eq!(s.tasks.len(), preds.len());
                    let done: Vec<bool> =
                        s.tasks.iter().map(|t| t.state == TaskPhase::Done).collect();
                    for (i, p) in preds.iter().enumerate() {
                        if s.tasks[i].state != TaskPhase::Pending {
                            assert!(
                                p.iter().all(|&p| done[p as usize]),
                                "task {i} past pending before its constraints"
                            );
                        }
                    }
                    let n = done.iter().filter(|&&d| d).count();
                    assert!(n >= last_done, "progress went back: {n} < {last_done}");
                    last_done = n;
                    if s.state.is_final() {
                        seen_final = true;
                        break;
                    }
                }
                (last_done, seen_final)
            })
        })
        .collect();
    let mut watcher = JobClient::connect(&addr, common::TOKEN).unwrap();
    let mut updates = 0;
    let last = watcher.watch(job, |_| updates += 1).unwrap();
    assert_eq!(last.state, JobPhase::Done);
    assert!(updates >= 1);
    assert!(last.tasks.iter().all(|t| t.state == TaskPhase::Done));
    for q in queriers {
        let (done, _) = q.join().unwrap();
        assert!(done <= preds.len());
    }
    assert_eq!(client.wait(job).unwrap().0, JobPhase::Done);
    service.shutdown();
}

#[test]
fn cancel_stops_a_running_job() {
    let common::Setup {
        dir,
        fifo,
        service,
        addr,
    } = common::setup(Duration::from_secs(60));
    let _w = common::Worker::start(&addr, "w", 1, dir.path());
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    let text = format!(
        "name='c'\n[[task]]\nid='hang'\nsteps=[{{kind='exec', cmd='sh', args=['-c', 'echo go > {}; exec sleep 600']}}]\n[[task]]\nid='never'\nafter=['hang']\nsteps=[{{kind='noop'}}]\n",
        fifo.display()
    );
    let job = client.submit(&text, SpecFormat::Toml).unwrap();
    assert_eq!(common::read_fifo_line(&fifo), "go");
    client.cancel(job).unwrap();
    assert_eq!(client.wait(job).unwrap().0, JobPhase::Cancelled);
    let s = client.status(job).unwrap();
    assert_eq!(s.tasks[1].state, TaskPhase::Cancelled);
    assert!(
        client.cancel(job).is_err(),
        "a cancelled job cannot be cancelled again"
    );
    let listed = client.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, JobPhase::Cancelled);
    service.shutdown();
}
