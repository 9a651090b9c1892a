//! Model-based property test of the store: random sequences of updates,
//! extent writes, punches at every level, fetches, listings, checkpoints,
//! cleaning passes and restarts (clean reopen of the same device) are run
//! against the store and against a `BTreeMap` model; every read must agree.
//! A churn (one key rewritten for over two rings of log) makes every other
//! key's next update a cold write (`store::cold`).

use ferrite_engine::store::{Store, StoreConfig, StoreError};
use ferrite_proto::key::RecordKey;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Op {
    Update {
        d: u8,
        a: u8,
        len: usize,
        fill: u8,
    },
    Extent {
        d: u8,
        a: u8,
        off: u16,
        len: u16,
        fill: u8,
    },
    Punch {
        d: u8,
        a: u8,
    },
    PunchDkey {
        d: u8,
    },
    PunchObject,
    Fetch {
        d: u8,
        a: u8,
    },
    List,
    Checkpoint,
    Clean,
    Churn {
        fill: u8,
    },
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..4u8, 0..3u8, 0..6000usize, any::<u8>()).prop_map(|(d, a, len, fill)| Op::Update { d, a, len, fill }),
        3 => (0..4u8, 3..5u8, 0..3000u16, 1..2000u16, any::<u8>()).prop_map(|(d, a, off, len, fill)| Op::Extent { d, a, off, len, fill }),
        2 => (0..4u8, 0..5u8).prop_map(|(d, a)| Op::Punch { d, a }),
        1 => (0..4u8).prop_map(|d| Op::PunchDkey { d }),
        1 => Just(Op::PunchObject),
        4 => (0..4u8, 0..5u8).prop_map(|(d, a)| Op::Fetch { d, a }),
        1 => Just(Op::List),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Clean),
        1 => any::<u8>().prop_map(|fill| Op::Churn { fill }),
        1 => Just(Op::Restart),
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum Val {
    Single(Vec<u8>),
    Array(Vec<u8>),
}

type Model = BTreeMap<(Vec<u8>, Vec<u8>), Val>;

fn key<'a>(d: &'a [u8], a: &'a [u8]) -> RecordKey<'a> {
    RecordKey::new(3, 9, d, a)
}

fn names(d: u8, a: u8) -> (Vec<u8>, Vec<u8>) {
    (
        format!("dkey{d}").into_bytes(),
        format!("akey{a}").into_bytes(),
    )
}

/// Updates per [`Op::Churn`], of [`CHURN_BYTES`] each: over two rings.
const CHURN_UPDATES: usize = 96;
const CHURN_BYTES: usize = 6000;

async fn apply(s: &Store, m: &mut Model, op: &Op) {
    match *op {
        Op::Churn { fill } => {
            for i in 0..CHURN_UPDATES {
                let a = i as u8 % 3;
                let op = Op::Update {
                    d: 0,
                    a,
                    len: CHURN_BYTES,
                    fill: fill.wrapping_add(i as u8),
                };
                Box::pin(apply(s, m, &op)).await;
            }
        }
        Op::Update { d, a, len, fill } => {
            let (dk, ak) = names(d, a);
            let v = vec![fill; len];
            let r = s.update(&key(&dk, &ak), &v).await;
            match m.get(&(dk.clone(), ak.clone())) {
                Some(Val::Array(_)) => assert!(matches!(r, Err(StoreError::WrongKind { .. }))),
                _ => {
                    r.unwrap();
                    m.insert((dk, ak), Val::Single(v));
                }
            }
        }
        Op::Extent {
            d,
            a,
            off,
            len,
            fill,
        } => {
            let (dk, ak) = names(d, a);
            let bytes = vec![fill; usize::from(len)];
            let r = s
                .update_extent(&key(&dk, &ak), u64::from(off), &bytes)
                .await;
            let e = m.entry((dk, ak)).or_insert(Val::Array(Vec::new()));
            match e {
                Val::Single(_) => assert!(matches!(r, Err(StoreError::WrongKind { .. }))),
                Val::Array(arr) => {
                    r.unwrap();
                    let end = usize::from(off) + usize::from(len);
                    if arr.len() < end {
                        arr.resize(end, 0);
                    }
                    arr[usize::from(off)..end].copy_from_slice(&bytes);
                }
            }
        }
        Op::Punch { d, a } => {
            let (dk, ak) = names(d, a);
            s.punch(&key(&dk, &ak)).await.unwrap();
            m.remove(&(dk, ak));
        }
        Op::PunchDkey { d } => {
            let (dk, _) = names(d, 0);
            s.punch_dkey(3, 9, &dk).await.unwrap();
            m.retain(|k, _| k.0 != dk);
        }
        Op::PunchObject => {
            s.punch_object(3, 9).await.unwrap();
            m.clear();
        }
        Op::Fetch { d, a } => check_key(s, m, d, a).await,
        Op::List => check_lists(s, m),
        Op::Checkpoint => {
            s.checkpoint().await.unwrap();
        }
        Op::Clean => {
            s.clean().await.unwrap();
        }
        Op::Restart => unreachable!("handled by the driver"),
    }
}

async fn check_key(s: &Store, m: &Model, d: u8, a: u8) {
    let (dk, ak) = names(d, a);
    let k = key(&dk, &ak);
    match m.get(&(dk.clone(), ak.clone())) {
        None => assert_eq!(s.fetch(&k).await.unwrap(), None, "{dk:?}/{ak:?}"),
        Some(Val::Single(v)) => assert_eq!(&s.fetch(&k).await.unwrap().unwrap().1, v),
        Some(Val::Array(arr)) => {
            let got = s
                .fetch_extent(&k, 0, arr.len() as u64 + 10)
                .await
                .unwrap()
                .unwrap()
                .1;
            assert_eq!(&got[..arr.len()], &arr[..]);
            assert!(got[arr.len()..].iter().all(|&b| b == 0));
        }
    }
}

fn check_lists(s: &Store, m: &Model) {
    let mut dkeys: Vec<Vec<u8>> = m.keys().map(|k| k.0.clone()).collect();
    dkeys.dedup();
    let mut got = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    for _ in 0..10 {
        let page = s.list_dkeys(3, 9, after.as_deref(), 2);
        if page.is_empty() {
            break;
        }
        after = page.last().cloned();
        got.extend(page);
    }
    assert_eq!(got, dkeys);
    for d in &dkeys {
        let akeys: Vec<Vec<u8>> = m
            .keys()
            .filter(|k| &k.0 == d)
            .map(|k| k.1.clone())
            .collect();
        assert_eq!(s.list_akeys(3, 9, d, None, 100), akeys);
    }
}

fn run_case(ops: Vec<Op>) {
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let bdev = ferrite_bdev::open("malloc:24M").unwrap();
            let cfg = StoreConfig {
                ring_bytes: 256 << 10,
                segment_bytes: 64 << 10,
                max_commit_bytes: 64 << 10,
                ..StoreConfig::small()
            };
            let mut s = Store::open(bdev.clone(), cfg.clone()).await.unwrap();
            let mut m = Model::new();
            for op in &ops {
                if let Op::Restart = op {
                    drop(s);
                    s = Store::open(bdev.clone(), cfg.clone()).await.unwrap();
                } else {
                    apply(&s, &mut m, op).await;
                }
            }
            drop(s);
            let s = Store::open(bdev, cfg).await.unwrap();
            assert_eq!(s.stats().keys, m.len());
            for d in 0..4 {
                for a in 0..5 {
                    check_key(&s, &m, d, a).await;
                }
            }
            check_lists(&s, &m);
        })
        .unwrap()
        .join()
        .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    #[test]
    fn store_matches_btreemap_model(ops in proptest::collection::vec(op(), 1..120)) {
        run_case(ops);
    }
}
