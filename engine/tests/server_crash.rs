//! Guards durability end to end: writers load a real `ferrite-engine` over
//! RPC (pipelined updates and punches on file bdevs through io_uring), the
//! engine is killed with SIGKILL at a random moment, restarted on the same
//! files, and every acknowledged write must be there — the value of the
//! last acknowledged write of each key, or of the one write that was in
//! flight for it when the engine died. Several rounds, so recovery of a
//! recovered store is covered too. `FERRITE_SEED=` replays a run.

mod server_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrite_proto::rpc::{Key, PunchScope, Reply, Request};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use server_support::*;

const WRITERS: usize = 3;
const KEYS_PER_WRITER: usize = 300;
const WINDOW: usize = 16;
const ROUNDS: usize = 3;
/// Bound on windows per writer per round.
const MAX_WINDOWS: usize = 20_000;

/// What a key holds: `None` = absent.
type State = Option<Vec<u8>>;

#[derive(Default, Clone)]
struct KeyModel {
    acked: State,
    /// Sent after the last acknowledgement, not acknowledged.
    pending: Option<State>,
}

type Model = Arc<Mutex<HashMap<Key, KeyModel>>>;

fn writer_key(w: usize, i: usize) -> Key {
    key(100 + w as u128, &format!("dkey-{i}"), "akey")
}

fn run_writer(
    w: usize,
    (addr, token): (std::net::SocketAddr, Vec<u8>),
    model: Model,
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicU64>,
    seed: u64,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let Ok(mut c) = RawClient::connect_tcp(addr, Some(&token)) else {
        return;
    };
    for window in 0..MAX_WINDOWS {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut picked: Vec<usize> = (0..KEYS_PER_WRITER).collect();
        let (chosen, _) = picked.partial_shuffle(&mut rng, WINDOW);
        let mut inflight = HashMap::new();
        for &i in chosen.iter() {
            let k = writer_key(w, i);
            let (req, state) = if rng.gen_bool(0.15) {
                (
                    Request::Punch {
                        scope: PunchScope::Akey,
                        key: k.clone(),
                    },
                    None,
                )
            } else {
                let len = rng.gen_range(1..200);
                let mut v = format!("w{w}-k{i}-n{window}-").into_bytes();
                v.resize(v.len() + len, b'x');
                (
                    Request::Update {
                        key: k.clone(),
                        value: v.clone(),
                    },
                    Some(v),
                )
            };
            model.lock().unwrap().entry(k.clone()).or_default().pending = Some(state.clone());
            let Ok(id) = c.send(&req) else { return };
            inflight.insert(id, (k, state));
        }
        for _ in 0..inflight.len() {
            let Ok((h, reply)) = c.recv() else { return };
            let (k, state) = inflight
                .remove(&h.request_id)
                .expect("reply to a request we sent");
            assert!(
                matches!(reply, Reply::Version(_)),
                "write refused: {reply:?}"
            );
            let mut m = model.lock().unwrap();
            let e = m.get_mut(&k).expect("modelled key");
            e.acked = state;
            e.pending = None;
            acks.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// After a stuck batch: is the engine still answering, which of the keys
/// does a single fetch get stuck on, and does the stuck batch's reply come
/// once other requests have run (a stalled device queue they restart)?
fn diagnose(engine: &EngineProcess, keys: &[Key], stuck_conn: &mut RawClient) -> String {
    let mut c = match RawClient::connect_tcp(engine.tcp, Some(&engine.token)) {
        Ok(c) => c,
        Err(e) => return format!("engine refuses new connections: {e}"),
    };
    if let Stream::Tcp(s) = &c.stream {
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    }
    let stat = c.call(&Request::Stat);
    let mut stuck = Vec::new();
    for k in keys {
        match RawClient::connect_tcp(engine.tcp, Some(&engine.token)) {
            Ok(mut one) => {
                if let Stream::Tcp(s) = &one.stream {
                    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                }
                if one.call(&Request::Fetch { key: k.clone() }).is_err() {
                    stuck.push(String::from_utf8_lossy(&k.dkey).into_owned());
                }
            }
            Err(e) => return format!("stat {stat:?}; connect failed: {e}"),
        }
    }
    if let Stream::Tcp(s) = &stuck_conn.stream {
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    }
    let late = match stuck_conn.recv() {
        Ok((_, Reply::Batch(r))) => format!("came late with {} items", r.len()),
        other => format!("still missing: {:?}", other.map(|(h, _)| h)),
    };
    format!("a new connection's Stat: {stat:?}; single fetches stuck on {stuck:?}; the batch reply {late}")
}

fn verify_and_settle(engine: &EngineProcess, model: &Model) -> usize {
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    let mut m = model.lock().unwrap();
    let keys: Vec<Key> = m.keys().cloned().collect();
    let mut checked = 0;
    for chunk in keys.chunks(64) {
        let batch = chunk
            .iter()
            .map(|k| Request::Fetch { key: k.clone() })
            .collect();
        let replies = match c.call(&Request::Batch(batch)) {
            Ok(Reply::Batch(replies)) => replies,
            other => panic!(
                "batch fetch: {other:?}; {}",
                diagnose(engine, chunk, &mut c)
            ),
        };
        for (k, r) in chunk.iter().zip(replies) {
            let got: State = match r {
                Reply::Value(v) => v.map(|f| f.value),
                other => panic!("fetch {k:?}: {other:?}"),
            };
            let e = m.get_mut(k).unwrap();
            let ok = got == e.acked || e.pending.as_ref() == Some(&got);
            assert!(
                ok,
                "key {:?}: recovered {:?}, acknowledged {:?}, in flight {:?}",
                String::from_utf8_lossy(&k.dkey),
                got.as_ref()
                    .map(|v| String::from_utf8_lossy(v).into_owned()),
                e.acked
                    .as_ref()
                    .map(|v| String::from_utf8_lossy(v).into_owned()),
                e.pending
            );
            e.acked = got;
            e.pending = None;
            checked += 1;
        }
    }
    checked
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let seed = test_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = temp_dir();
    let model: Model = Arc::default();
    let mut total_acks = 0;
    for round in 0..ROUNDS {
        let engine = EngineProcess::start(dir.path(), &[]);
        if round > 0 {
            let checked = verify_and_settle(&engine, &model);
            eprintln!("round {round}: verified {checked} keys after kill -9");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(AtomicU64::new(0));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (model, stop, acks) = (model.clone(), stop.clone(), acks.clone());
                let (addr, s) = ((engine.tcp, engine.token.clone()), rng.gen());
                std::thread::spawn(move || run_writer(w, addr, model, stop, acks, s))
            })
            .collect();
        // Let some writes be acknowledged, then kill at a random moment.
        let deadline = Instant::now() + Duration::from_secs(120);
        while acks.load(Ordering::SeqCst) < 200 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..800)));
        engine.kill9();
        stop.store(true, Ordering::SeqCst);
        for w in writers {
            w.join().expect("writer thread");
        }
        let n = acks.load(Ordering::SeqCst);
        assert!(
            n >= 200,
            "round {round}: only {n} writes acknowledged before the kill"
        );
        total_acks += n;
    }
    let engine = EngineProcess::start(dir.path(), &[]);
    let checked = verify_and_settle(&engine, &model);
    eprintln!("{total_acks} acknowledged writes over {ROUNDS} kills; {checked} keys verified");
    assert!(checked > 0 && checked <= WRITERS * KEYS_PER_WRITER);
    assert_eq!(engine.terminate(), Some(0));

    // A clean shutdown checkpointed: the next start recovers the same state.
    let engine = EngineProcess::start(dir.path(), &[]);
    assert_eq!(verify_and_settle(&engine, &model), checked);
}
