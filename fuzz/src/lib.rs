//! Seed inputs for the fuzz targets, made from real encodings so that they
//! stay valid when a format changes. `seeds()` lists every seed; the test
//! below writes them to `corpus/<target>/` when `FERRITE_WRITE_CORPUS` is
//! set, and otherwise fails if the committed corpus differs from them (run
//! it with the variable after changing a format, and commit the result).

use std::collections::BTreeMap;

use ferrite_engine::store::Geometry;
use ferrite_proto::bucket::{Bucket, Slot};
use ferrite_proto::key::RecordKey;
use ferrite_proto::qp_info::QpInfo;
use ferrite_proto::record::{encode_pad, encode_record, record_len, RecordFlags};
use ferrite_proto::region::{Provider, RegionDescriptor, RegionKind};
use ferrite_proto::rpc::{self, handshake, ExtentList, ExtentSpan, Key, MessageType, Reply};
use ferrite_proto::rpc::{Challenge, Found, Hello, Login, Placed, PunchScope, Request};
use ferrite_proto::rpc::{TargetInfo, TargetStat, Verified, Welcome};
use ferrite_proto::rpc_jobs::{JobSpec, RetryPolicy, Step, TaskSpec, ToEngine, ToPeer};

mod seeds_jobs;

/// One seed: the target it feeds, its file name, its bytes.
pub struct Seed {
    pub target: &'static str,
    pub name: String,
    pub bytes: Vec<u8>,
}

/// Every target's seeds.
pub fn seeds() -> Vec<Seed> {
    let mut out = Vec::new();
    let mut add = |target, name: String, bytes| {
        out.push(Seed {
            target,
            name,
            bytes,
        })
    };
    for (name, bytes) in rpc_frames() {
        add("rpc_frame", name, bytes);
    }
    for (name, bytes) in handshakes() {
        add("handshake", name, bytes);
    }
    for (name, bytes) in seeds_jobs::job_frames() {
        add("job_frame", name, bytes);
    }
    for (name, bytes) in seeds_jobs::job_specs() {
        add("job_spec", name, bytes);
    }
    for (name, bytes) in qp_infos() {
        add("qp_info", name, bytes);
    }
    for (name, bytes) in buckets() {
        add("bucket", name, bytes);
    }
    for (name, bytes) in records() {
        add("record", name, bytes);
    }
    for (name, bytes) in superblocks() {
        add("superblock", name, bytes);
    }
    out
}

fn key() -> Key {
    Key::new(7, 42, b"dkey", b"akey")
}

/// One request of every type.
fn requests() -> Vec<Request> {
    let (k, after) = (key(), Some(b"d0".to_vec()));
    vec![
        Request::Hello(Hello {
            flags: handshake::HELLO_WANT_SHM,
            client_nonce: [3; 16],
        }),
        Request::Login(Login { proof: [9; 32] }),
        Request::Update {
            key: k.clone(),
            value: b"value".to_vec(),
        },
        Request::Fetch { key: k.clone() },
        Request::Punch {
            scope: PunchScope::Dkey,
            key: k.clone(),
        },
        Request::ListDkeys {
            container: 7,
            object: 42,
            after: after.clone(),
            limit: 10,
        },
        Request::ListAkeys {
            container: 7,
            object: 42,
            dkey: b"d".to_vec(),
            after: None,
            limit: 5,
        },
        Request::ListValues {
            container: 7,
            object: 42,
            akey: b"a".to_vec(),
            after,
            limit: 5,
        },
        Request::CondUpdate {
            key: k.clone(),
            expected_version: 3,
            value: b"v".to_vec(),
        },
        Request::ExtentWrite {
            key: k.clone(),
            offset: 4096,
            data: b"extent".to_vec(),
        },
        Request::ExtentRead {
            key: k.clone(),
            offset: 0,
            len: 100,
        },
        Request::Batch(vec![
            Request::Fetch { key: k.clone() },
            Request::Verify { key: k.clone() },
        ]),
        Request::Stat,
        Request::Sync,
        Request::ListObjects {
            container: 7,
            after: Some(41),
            limit: 8,
        },
        Request::Verify { key: k.clone() },
        Request::BulkWrite {
            key: k.clone(),
            offset: 0,
            region_offset: 64,
            len: 512,
        },
        Request::BulkRead {
            key: k.clone(),
            offset: 8,
            region_offset: 0,
            len: 512,
        },
        Request::ExtentList { key: k },
        Request::RegionRead {
            region_id: 2,
            access_key: 0xfeed,
            offset: 128,
            len: 64,
        },
    ]
}

fn welcome() -> Welcome {
    Welcome {
        flags: handshake::WELCOME_SERVED_BY,
        served_by: 1,
        incarnation: 0x1234_5678,
        server_proof: [4; 32],
        targets: vec![
            TargetInfo {
                target: 0,
                xstream: 0,
                state: 0,
                core: Some(2),
            },
            TargetInfo {
                target: 1,
                xstream: 1,
                state: 1,
                core: None,
            },
        ],
        regions: vec![
            descriptor(Provider::Shm, RegionKind::Buckets, 1024 * 64, 1024),
            descriptor(Provider::Tcp, RegionKind::Log, 1 << 20, 1 << 20),
        ],
    }
}

fn descriptor(provider: Provider, kind: RegionKind, length: u64, param: u64) -> RegionDescriptor {
    RegionDescriptor {
        provider,
        kind,
        target: 0,
        region_id: 1,
        length,
        param,
        access_key: 0xabcd,
        remote_addr: 0,
    }
}

/// One reply of every shape, with the request type it answers.
fn replies() -> Vec<(MessageType, Reply)> {
    let found = Some(Found {
        version: 5,
        value: b"value".to_vec(),
    });
    let pieces = vec![ExtentSpan {
        start: 0,
        end: 4096,
        rec_addr: 8192,
        rec_len: 4200,
    }];
    let extents = ExtentList {
        version: 9,
        newest_addr: 8192,
        newest_len: 4200,
        covered_end: u64::MAX,
        pieces,
    };
    let counters = vec![("puts".to_string(), 12), ("gets".to_string(), 30)];
    vec![
        (
            MessageType::Hello,
            Reply::Challenge(Challenge {
                auth: 1,
                server_nonce: [8; 16],
            }),
        ),
        (MessageType::Login, Reply::Welcome(welcome())),
        (MessageType::Update, Reply::Version(17)),
        (MessageType::Fetch, Reply::Value(found)),
        (
            MessageType::ListDkeys,
            Reply::Keys {
                keys: vec![b"a".to_vec(), b"b".to_vec()],
                more: true,
            },
        ),
        (
            MessageType::ListValues,
            Reply::Values {
                entries: vec![(b"d".to_vec(), Some(b"v".to_vec())), (b"e".to_vec(), None)],
                more: false,
            },
        ),
        (
            MessageType::CondUpdate,
            Reply::Cond {
                applied: true,
                version: 4,
            },
        ),
        (
            MessageType::ListObjects,
            Reply::Objects {
                objects: vec![1, 2, u128::MAX],
                more: false,
            },
        ),
        (
            MessageType::Verify,
            Reply::Verified(Verified::Intact {
                records: 2,
                value_bytes: 10,
            }),
        ),
        (
            MessageType::Verify,
            Reply::Verified(Verified::Corrupt {
                records: 1,
                addr: 4096,
                reason: "crc".into(),
            }),
        ),
        (
            MessageType::BulkRead,
            Reply::Placed(Some(Placed {
                version: 3,
                len: 512,
            })),
        ),
        (MessageType::ExtentList, Reply::Extents(Some(extents))),
        (MessageType::RegionRead, Reply::Data(vec![0xee; 64])),
        (
            MessageType::Batch,
            Reply::Batch(vec![Reply::Version(1), Reply::Value(None)]),
        ),
        (
            MessageType::Stat,
            Reply::Stat(vec![TargetStat {
                target: 0,
                counters,
            }]),
        ),
        (MessageType::Sync, Reply::Synced),
        (
            MessageType::Fetch,
            Reply::error(rpc::ErrorCode::NoSpace, "store full"),
        ),
    ]
}

fn kind_name(kind: MessageType) -> String {
    format!("{kind:?}").to_lowercase()
}

fn rpc_frames() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, req) in requests().iter().enumerate() {
        let mut wire = Vec::new();
        rpc::encode_request(i as u64 + 1, req, &mut wire);
        out.push((format!("request-{}", kind_name(req.kind())), wire));
    }
    for (i, (kind, reply)) in replies().iter().enumerate() {
        let mut wire = Vec::new();
        rpc::encode_reply(*kind, i as u64 + 1, reply, &mut wire);
        out.push((format!("reply-{i:02}-{}", kind_name(*kind)), wire));
    }
    out
}

/// The target's first byte picks the message (0 Hello, 1 Login, 2
/// Challenge, 3 Welcome), the rest is its body.
fn handshakes() -> Vec<(String, Vec<u8>)> {
    let body = |pick: u8, encode: &dyn Fn(&mut Vec<u8>)| {
        let mut b = vec![pick];
        encode(&mut b);
        b
    };
    let hello = Request::Hello(Hello {
        flags: handshake::HELLO_WANT_SHM | handshake::HELLO_BULK_REGION,
        client_nonce: [1; 16],
    });
    let login = Request::Login(Login {
        proof: handshake::login_proof(b"token", &[2; 16], &[1; 16]),
    });
    let challenge = Reply::Challenge(Challenge {
        auth: handshake::AUTH_TOKEN_HMAC_SHA256,
        server_nonce: [2; 16],
    });
    let welcome = Reply::Welcome(welcome());
    vec![
        ("hello".into(), body(0, &|o| hello.encode_body(o))),
        ("login".into(), body(1, &|o| login.encode_body(o))),
        ("challenge".into(), body(2, &|o| challenge.encode_body(o))),
        ("welcome".into(), body(3, &|o| welcome.encode_body(o))),
    ]
}

fn qp_infos() -> Vec<(String, Vec<u8>)> {
    let info = QpInfo {
        qpn: 0x11,
        psn: 0xab_cdef,
        gid: [0xfe; 16],
        lid: 0,
        mtu: 3,
    };
    let regions = [
        descriptor(Provider::Verbs, RegionKind::Buckets, 1024 * 64, 1024),
        descriptor(Provider::Verbs, RegionKind::Log, 1 << 20, 1 << 20),
    ];
    let mut answer = info.encode().to_vec();
    answer.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    for d in &regions {
        answer.extend_from_slice(&d.encode());
    }
    vec![
        ("request".into(), info.encode().to_vec()),
        ("answer".into(), answer),
    ]
}

fn record(
    key: &RecordKey<'_>,
    value: &[u8],
    addr: u64,
    flags: RecordFlags,
    extent: u64,
) -> Vec<u8> {
    let mut b = vec![0u8; record_len(key, value.len())];
    encode_record(&mut b, key, value, 5, addr, flags, extent).expect("seed record encodes");
    b
}

/// A bucket whose first slot points at the record of the key the target
/// looks up at address 0 of the window that follows.
fn buckets() -> Vec<(String, Vec<u8>)> {
    let k = key();
    let key = k.as_record_key();
    let rec = record(&key, b"value", 0, RecordFlags::empty(), 0);
    let mut bucket = Bucket::default();
    let slot = Slot {
        fingerprint: key.hash().fingerprint(),
        length: rec.len() as u32,
        addr: 0,
        version_low: 5,
    };
    bucket.set_slot(0, slot);
    bucket.set_slot(
        2,
        Slot {
            fingerprint: 0x0bad_cafe,
            length: 80,
            addr: 4096,
            version_low: 1,
        },
    );
    bucket.set_next(3);
    bucket.seal();
    let mut found = bucket.0.to_vec();
    found.extend_from_slice(&rec);
    vec![
        ("empty".into(), Bucket::default().0.to_vec()),
        ("found".into(), found),
    ]
}

fn records() -> Vec<(String, Vec<u8>)> {
    let k = key();
    let key = k.as_record_key();
    let mut pad = vec![0u8; 128];
    encode_pad(&mut pad, 8192).expect("seed pad encodes");
    vec![
        (
            "value".into(),
            record(&key, b"value", 4096, RecordFlags::empty(), 0),
        ),
        (
            "tombstone".into(),
            record(
                &key,
                b"",
                4096,
                RecordFlags::empty().with(RecordFlags::TOMBSTONE),
                0,
            ),
        ),
        (
            "extent".into(),
            record(
                &key,
                &[7; 40],
                64,
                RecordFlags::empty().with(RecordFlags::EXTENT),
                4096,
            ),
        ),
        ("pad".into(), pad),
    ]
}

fn superblocks() -> Vec<(String, Vec<u8>)> {
    let plans = [
        (
            "small",
            8u64 << 20,
            512u32,
            1u64 << 20,
            0u64,
            256u64 << 10,
            256u64 << 10,
        ),
        ("default", 1 << 30, 4096, 64 << 20, 0, 4 << 20, 32 << 20),
    ];
    plans
        .iter()
        .map(|&(name, device, block, ring, ckpt, commit, seg)| {
            let g = Geometry::plan("seed", device, block, ring, ckpt, commit, seg)
                .expect("seed geometry plans");
            let mut b = vec![0u8; 128];
            g.encode_superblock(&mut b);
            (name.to_string(), b)
        })
        .collect()
}

/// Shared by the job seeds.
fn spec() -> JobSpec {
    let exec = Step::Exec {
        cmd: "sh".into(),
        args: vec!["-c".into(), "echo hi".into()],
        env: BTreeMap::from([("K".to_string(), "V".to_string())]),
        cwd: None,
        timeout_s: None,
    };
    JobSpec {
        name: "seed".into(),
        retry: RetryPolicy {
            max_attempts: 2,
            on_failure: true,
        },
        tasks: vec![
            TaskSpec {
                id: "a".into(),
                after: vec![],
                inputs: vec![],
                steps: vec![exec],
                retry: None,
            },
            TaskSpec {
                id: "b".into(),
                after: vec!["a".into()],
                inputs: vec!["a".into()],
                steps: vec![
                    Step::Put {
                        container: 3,
                        prefix: "k".into(),
                        count: 4,
                        size_bytes: 64,
                    },
                    Step::Get {
                        container: 3,
                        prefix: "k".into(),
                        count: 4,
                    },
                    Step::Copy {
                        source: 3,
                        target: 4,
                        prefix: "k".into(),
                        count: 4,
                    },
                    Step::Scrub { container: 4 },
                ],
                retry: Some(RetryPolicy {
                    max_attempts: 1,
                    on_failure: false,
                }),
            },
            TaskSpec {
                id: "c".into(),
                after: vec!["b".into()],
                inputs: vec![],
                steps: vec![
                    Step::Noop,
                    Step::Io500 {
                        phase: "setup".into(),
                        args: vec![],
                    },
                ],
                retry: None,
            },
        ],
    }
}

/// Every message of both directions, for the frame seeds.
fn messages() -> (Vec<ToEngine>, Vec<ToPeer>) {
    seeds_jobs::messages(&spec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::rpc_jobs;
    use std::path::{Path, PathBuf};

    fn corpus_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
    }

    /// Guards the committed seeds: each is byte for byte what the generator
    /// makes from today's encoders, so a format change cannot leave the
    /// fuzzers starting from inputs that no longer decode. With
    /// FERRITE_WRITE_CORPUS set it rewrites the corpus instead.
    #[test]
    fn committed_corpus_matches_the_generator() {
        let seeds = seeds();
        let write = std::env::var_os("FERRITE_WRITE_CORPUS").is_some();
        let mut stale = Vec::new();
        for s in &seeds {
            let path = corpus_dir().join(s.target).join(&s.name);
            if write {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &s.bytes).unwrap();
            } else if std::fs::read(&path).ok().as_deref() != Some(&s.bytes[..]) {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "seeds differ from the generator (rerun with FERRITE_WRITE_CORPUS=1): {stale:?}"
        );
        // No committed seed is left over from an older generator.
        for dir in std::fs::read_dir(corpus_dir()).unwrap() {
            let dir = dir.unwrap();
            let target = dir.file_name().into_string().unwrap();
            for file in std::fs::read_dir(dir.path()).unwrap() {
                let name = file.unwrap().file_name().into_string().unwrap();
                let known = seeds.iter().any(|s| s.target == target && s.name == name);
                assert!(
                    known || write,
                    "corpus/{target}/{name} is no generator seed"
                );
            }
        }
    }

    /// Guards the seeds themselves: every one decodes as its target expects,
    /// so each target starts from inputs that reach past its first check.
    #[test]
    fn every_seed_decodes() {
        for s in seeds() {
            assert!(decodes(&s), "{}/{} does not decode", s.target, s.name);
        }
    }

    fn decodes(s: &Seed) -> bool {
        let b = &s.bytes[..];
        match s.target {
            "rpc_frame" => rpc::split_frame(b, rpc::BODY_BYTES_MAX)
                .ok()
                .flatten()
                .is_some_and(|(h, len)| {
                    let body = &b[rpc::HEADER_BYTES..len];
                    rpc::decode_request(&h, body).is_ok() || rpc::decode_reply(&h, body).is_ok()
                }),
            "handshake" => match b[0] {
                0 => Request::decode_body(MessageType::Hello, &b[1..]).is_ok(),
                1 => Request::decode_body(MessageType::Login, &b[1..]).is_ok(),
                2 => Reply::decode_body(MessageType::Hello, &b[1..]).is_ok(),
                _ => Reply::decode_body(MessageType::Login, &b[1..]).is_ok(),
            },
            "job_frame" => {
                let mut r = b;
                let ok = |v: Result<Option<ToEngine>, _>| matches!(v, Ok(Some(_)));
                let peer = |v: Result<Option<ToPeer>, _>| matches!(v, Ok(Some(_)));
                ok(rpc_jobs::read_frame(&mut r)) || peer(rpc_jobs::read_frame(&mut &b[..]))
            }
            "job_spec" => seeds_jobs::spec_decodes(b),
            "qp_info" => QpInfo::decode(b[..32].try_into().unwrap()).is_ok(),
            "bucket" => Bucket(b[..64].try_into().unwrap()).check().is_ok(),
            "record" => ferrite_proto::record::RecordView::parse(b).is_ok(),
            "superblock" => matches!(Geometry::decode_superblock("seed", b), Ok(Some(_))),
            _ => false,
        }
    }
}
