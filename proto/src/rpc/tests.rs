//! Round trips of every message and refusal of malformed bytes, including
//! random and mutated frames (the parser must never panic).

use proptest::collection::vec;
use proptest::prelude::*;

use super::handshake::*;
use super::message::LIST_VALUE_BYTES_MAX;
use super::*;
use crate::region::{Provider, RegionDescriptor, RegionKind};

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..max)
}

fn key() -> impl Strategy<Value = Key> {
    (any::<u64>(), any::<u128>(), bytes(40), bytes(40)).prop_map(|(c, o, d, a)| Key {
        container: c,
        object: o,
        dkey: d,
        akey: a,
    })
}

fn data_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (key(), bytes(300)).prop_map(|(key, value)| Request::Update { key, value }),
        key().prop_map(|key| Request::Fetch { key }),
        (key(), 1u8..4).prop_map(|(key, s)| Request::Punch {
            key,
            scope: [PunchScope::Akey, PunchScope::Dkey, PunchScope::Object][usize::from(s - 1)],
        }),
        (
            any::<u64>(),
            any::<u128>(),
            proptest::option::of(bytes(20)),
            any::<u32>()
        )
            .prop_map(|(container, object, after, limit)| Request::ListDkeys {
                container,
                object,
                after,
                limit
            }),
        (
            any::<u64>(),
            bytes(20),
            proptest::option::of(bytes(20)),
            any::<u32>()
        )
            .prop_map(|(container, dkey, after, limit)| Request::ListAkeys {
                container,
                object: 9,
                dkey,
                after,
                limit
            }),
        (key(), any::<u64>(), bytes(100)).prop_map(|(key, expected_version, value)| {
            Request::CondUpdate {
                key,
                expected_version,
                value,
            }
        }),
        (key(), any::<u64>(), bytes(100)).prop_map(|(key, offset, data)| Request::ExtentWrite {
            key,
            offset,
            data
        }),
        (key(), any::<u64>(), 0u32..(1 << 20)).prop_map(|(key, offset, len)| Request::ExtentRead {
            key,
            offset,
            len
        }),
        key().prop_map(|key| Request::Verify { key }),
        (key(), any::<u64>(), any::<u64>(), 0u32..=(1 << 20)).prop_map(
            |(key, offset, region_offset, len)| Request::BulkWrite {
                key,
                offset,
                region_offset,
                len
            }
        ),
        (key(), any::<u64>(), any::<u64>(), 0u32..=(1 << 20)).prop_map(
            |(key, offset, region_offset, len)| Request::BulkRead {
                key,
                offset,
                region_offset,
                len
            }
        ),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        data_request(),
        vec(data_request(), 0..8).prop_map(Request::Batch),
        (
            any::<u128>(),
            bytes(20),
            proptest::option::of(bytes(20)),
            any::<u32>()
        )
            .prop_map(|(object, akey, after, limit)| Request::ListValues {
                container: 3,
                object,
                akey,
                after,
                limit
            }),
        Just(Request::Stat),
        Just(Request::Sync),
        key().prop_map(|key| Request::ExtentList { key }),
        (
            any::<u64>(),
            proptest::option::of(any::<u128>()),
            any::<u32>()
        )
            .prop_map(|(container, after, limit)| Request::ListObjects {
                container,
                after,
                limit
            }),
        (any::<u32>(), any::<u64>(), any::<u64>(), 0u32..4096).prop_map(|(r, a, o, l)| {
            Request::RegionRead {
                region_id: r,
                access_key: a,
                offset: o,
                len: l,
            }
        }),
        (any::<u32>(), any::<[u8; 16]>()).prop_map(|(flags, client_nonce)| Request::Hello(Hello {
            flags,
            client_nonce
        })),
        any::<[u8; 32]>().prop_map(|proof| Request::Login(Login { proof })),
    ]
}

fn data_reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        any::<u64>().prop_map(Reply::Version),
        Just(Reply::Value(None)),
        (any::<u64>(), bytes(200))
            .prop_map(|(version, value)| Reply::Value(Some(Found { version, value }))),
        (vec(bytes(20), 0..10), any::<bool>()).prop_map(|(keys, more)| Reply::Keys { keys, more }),
        (any::<bool>(), any::<u64>())
            .prop_map(|(applied, version)| Reply::Cond { applied, version }),
        (1u16..13, "[a-zé]{0,40}").prop_map(|(c, m)| Reply::error(ErrorCode::from_u16(c), m)),
        verified().prop_map(Reply::Verified),
        Just(Reply::Placed(None)),
        (any::<u64>(), 0u32..=(1 << 20))
            .prop_map(|(version, len)| Reply::Placed(Some(Placed { version, len }))),
    ]
}

fn verified() -> impl Strategy<Value = Verified> {
    prop_oneof![
        Just(Verified::Absent),
        (any::<u32>(), any::<u64>()).prop_map(|(records, value_bytes)| Verified::Intact {
            records,
            value_bytes
        }),
        (any::<u32>(), any::<u64>(), "[a-z é]{0,40}").prop_map(|(records, addr, reason)| {
            Verified::Corrupt {
                records,
                addr,
                reason,
            }
        }),
    ]
}

fn welcome() -> impl Strategy<Value = Reply> {
    (1usize..5, any::<u64>(), any::<bool>()).prop_map(|(n, incarnation, shm)| {
        let regions = (0..n)
            .map(|t| RegionDescriptor {
                provider: if shm { Provider::Shm } else { Provider::Tcp },
                kind: RegionKind::Log,
                target: t as u16,
                region_id: t as u32,
                length: 1 << 20,
                param: 1 << 20,
                access_key: incarnation ^ t as u64,
                remote_addr: 0,
            })
            .collect();
        Reply::Welcome(Welcome {
            flags: u16::from(shm) | (incarnation as u16 & WELCOME_SERVED_BY),
            served_by: (incarnation >> 16) as u16 % n.max(1) as u16,
            incarnation,
            server_proof: [7; 32],
            targets: (0..n as u16)
                .map(|t| TargetInfo {
                    target: t,
                    xstream: t,
                    state: 0,
                    core: (t % 3 != 0).then_some(t / 2),
                })
                .collect(),
            regions,
        })
    })
}

/// An extent map: pieces in order, each after a gap of 0 or more bytes.
fn extent_list() -> impl Strategy<Value = ExtentList> {
    let piece = (0u64..100, 1u64..100, any::<u64>(), any::<u32>());
    (any::<u64>(), any::<u64>(), any::<u32>(), vec(piece, 0..20)).prop_map(
        |(version, newest_addr, newest_len, raw)| {
            let mut at = 0;
            let pieces = raw
                .into_iter()
                .map(|(gap, len, rec_addr, rec_len)| {
                    let start = at + gap;
                    at = start + len;
                    ExtentSpan {
                        start,
                        end: at,
                        rec_addr,
                        rec_len,
                    }
                })
                .collect();
            ExtentList {
                version,
                newest_addr,
                newest_len,
                covered_end: u64::MAX,
                pieces,
            }
        },
    )
}

fn reply_with_kind() -> impl Strategy<Value = (MessageType, Reply)> {
    prop_oneof![
        data_reply().prop_map(|r| (r.shape_kind(), r)),
        bytes(300).prop_map(|d| (MessageType::RegionRead, Reply::Data(d))),
        (vec(any::<u128>(), 0..10), any::<bool>()).prop_map(|(objects, more)| (
            MessageType::ListObjects,
            Reply::Objects { objects, more }
        )),
        (
            vec((bytes(20), proptest::option::of(bytes(70))), 0..10),
            any::<bool>()
        )
            .prop_map(|(entries, more)| (MessageType::ListValues, Reply::Values { entries, more })),
        Just((MessageType::Sync, Reply::Synced)),
        Just((MessageType::ExtentList, Reply::Extents(None))),
        extent_list().prop_map(|l| (MessageType::ExtentList, Reply::Extents(Some(l)))),
        vec(data_reply(), 0..6).prop_map(|v| (MessageType::Batch, Reply::Batch(v))),
        welcome().prop_map(|w| (MessageType::Login, w)),
        (any::<u8>(), any::<[u8; 16]>()).prop_map(|(a, server_nonce)| (
            MessageType::Hello,
            Reply::Challenge(Challenge {
                auth: a % 2,
                server_nonce
            })
        )),
        vec(
            (any::<u16>(), vec(("[a-z_]{1,20}", any::<u64>()), 0..5)),
            0..4
        )
        .prop_map(|t| (
            MessageType::Stat,
            Reply::Stat(
                t.into_iter()
                    .map(|(target, counters)| TargetStat { target, counters })
                    .collect()
            )
        )),
    ]
}

fn first_frame(wire: &[u8]) -> (FrameHeader, &[u8]) {
    let (h, len) = split_frame(wire, BODY_BYTES_MAX).unwrap().unwrap();
    assert_eq!(len, wire.len());
    (h, &wire[HEADER_BYTES..len])
}

proptest! {
    #[test]
    fn request_roundtrip(id in any::<u64>(), req in request()) {
        let mut wire = Vec::new();
        encode_request(id, &req, &mut wire);
        let (h, body) = first_frame(&wire);
        prop_assert_eq!(h.request_id, id);
        prop_assert!(!h.is_reply());
        prop_assert_eq!(decode_request(&h, body).unwrap(), req);
        prop_assert!(decode_reply(&h, body).is_err(), "direction is checked");
    }

    #[test]
    fn reply_roundtrip(id in any::<u64>(), (kind, reply) in reply_with_kind()) {
        let mut wire = Vec::new();
        encode_reply(kind, id, &reply, &mut wire);
        let (h, body) = first_frame(&wire);
        prop_assert!(h.is_reply());
        prop_assert_eq!(decode_reply(&h, body).unwrap(), reply);
    }

    #[test]
    fn random_bytes_never_panic(buf in bytes(512), kind in any::<u8>(), reply in any::<bool>()) {
        let _ = split_frame(&buf, BODY_BYTES_MAX);
        if let Some(kind) = MessageType::from_u8(kind) {
            let _ = Request::decode_body(kind, &buf);
            let _ = Reply::decode_body(kind, &buf);
            let h = FrameHeader { kind, flags: u16::from(reply), request_id: 1, body_len: buf.len() as u32 };
            let _ = decode_request(&h, &buf);
            let _ = decode_reply(&h, &buf);
        }
    }

    #[test]
    fn mutated_frames_never_panic(req in request(), pos in any::<usize>(), byte in any::<u8>(), cut in any::<usize>()) {
        let mut wire = Vec::new();
        encode_request(1, &req, &mut wire);
        let p = pos % wire.len();
        wire[p] = byte;
        wire.truncate(cut % (wire.len() + 1));
        if let Ok(Some((h, len))) = split_frame(&wire, BODY_BYTES_MAX) {
            if len <= wire.len() {
                let _ = decode_request(&h, &wire[HEADER_BYTES..len]);
            }
        }
    }
}

#[test]
fn truncated_bodies_are_refused() {
    let req = Request::Update {
        key: Key::new(1, 2, b"d", b"a"),
        value: b"value".to_vec(),
    };
    let mut wire = Vec::new();
    encode_request(3, &req, &mut wire);
    let body = &wire[HEADER_BYTES..];
    for cut in 0..body.len() {
        assert!(Request::decode_body(MessageType::Update, &body[..cut]).is_err());
    }
    let mut long = body.to_vec();
    long.push(0);
    assert!(Request::decode_body(MessageType::Update, &long).is_err());
}

#[test]
fn limits_are_enforced() {
    // A dkey longer than 4096 bytes.
    let mut body = Vec::new();
    Request::Fetch {
        key: Key::new(1, 2, &[0; 4097], b""),
    }
    .encode_body(&mut body);
    assert!(Request::decode_body(MessageType::Fetch, &body).is_err());
    // A nested batch.
    let mut body = Vec::new();
    Request::Batch(vec![Request::Batch(vec![])]).encode_body(&mut body);
    assert!(Request::decode_body(MessageType::Batch, &body).is_err());
    // A region read over the read limit.
    let mut body = Vec::new();
    Request::RegionRead {
        region_id: 1,
        access_key: 0,
        offset: 0,
        len: (message::READ_BYTES_MAX + 1) as u32,
    }
    .encode_body(&mut body);
    assert!(Request::decode_body(MessageType::RegionRead, &body).is_err());
    // A boolean that is neither 0 nor 1.
    assert!(Reply::decode_body(MessageType::Fetch, &[2]).is_err());
    // An Error type is never a request.
    assert!(Request::decode_body(MessageType::Error, &[]).is_err());
}

#[test]
fn long_error_messages_are_cut_on_char_boundary() {
    let msg = "é".repeat(3000);
    let mut body = Vec::new();
    Reply::error(ErrorCode::Internal, msg).encode_body(&mut body);
    match Reply::decode_body(MessageType::Error, &body).unwrap() {
        Reply::Error { message, code } => {
            assert_eq!(code, ErrorCode::Internal);
            assert_eq!(message.len(), message::MESSAGE_BYTES_MAX);
            assert!(message.chars().all(|c| c == 'é'));
        }
        other => panic!("not an error: {other:?}"),
    }
}

#[test]
fn pipelined_frames_split_in_order() {
    let mut wire = Vec::new();
    for id in 0..5u64 {
        encode_request(id, &Request::Stat, &mut wire);
    }
    let mut at = 0;
    let mut ids = Vec::new();
    while let Some((h, len)) = split_frame(&wire[at..], BODY_BYTES_MAX).unwrap() {
        ids.push(h.request_id);
        at += len;
    }
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
    assert_eq!(at, wire.len());
}

/// The bytes of a ListObjects request and of its reply, and of a Verified
/// reply, as `FORMAT.md` lays them out.
#[test]
fn list_objects_and_verified_bodies_are_laid_out_byte_by_byte() {
    let mut body = Vec::new();
    Request::ListObjects {
        container: 0x0102,
        after: Some(0x0a0b),
        limit: 7,
    }
    .encode_body(&mut body);
    assert_eq!(body.len(), body::LIST_OBJECTS_BODY_BYTES);
    let mut want = vec![0x02, 0x01, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1, 0x0b, 0x0a];
    want.extend([0; 14]);
    assert_eq!(body, want);
    // No `after`: has_after 0 and an after of 0; anything else is refused.
    body.clear();
    Request::ListObjects {
        container: 1,
        after: None,
        limit: 1,
    }
    .encode_body(&mut body);
    assert_eq!(body[12..], [0; 17]);
    body[13] = 1;
    assert!(Request::decode_body(MessageType::ListObjects, &body).is_err());
    assert!(!MessageType::ListObjects.is_batchable());
    assert!(MessageType::Verify.is_batchable());

    body.clear();
    Reply::Objects {
        objects: vec![5, u128::MAX],
        more: true,
    }
    .encode_body(&mut body);
    let mut want = vec![2, 0, 0, 0, 1, 5];
    want.extend([0; 15]);
    want.extend([0xff; 16]);
    assert_eq!(body, want);

    body.clear();
    let corrupt = Verified::Corrupt {
        records: 3,
        addr: 0x40,
        reason: "crc".into(),
    };
    Reply::Verified(corrupt.clone()).encode_body(&mut body);
    assert_eq!(body.len(), body::VERIFIED_FIXED_BYTES + 3);
    let mut want = vec![2, 3, 0, 0, 0];
    want.extend([0; 8]);
    want.extend([0x40, 0, 0, 0, 0, 0, 0, 0, 3, 0]);
    want.extend(b"crc");
    assert_eq!(body, want);
    assert_eq!(
        Reply::decode_body(MessageType::Verify, &body).unwrap(),
        Reply::Verified(corrupt)
    );
    body.clear();
    let intact = Verified::Intact {
        records: 1,
        value_bytes: 9,
    };
    Reply::Verified(intact).encode_body(&mut body);
    let mut want = vec![1, 1, 0, 0, 0, 9];
    want.extend([0; 17]);
    assert_eq!(body, want);
    // A field the outcome does not use must be 0; outcomes stop at 2.
    body[13] = 1;
    assert!(Reply::decode_body(MessageType::Verify, &body).is_err());
    body[13] = 0;
    body[0] = 3;
    assert!(Reply::decode_body(MessageType::Verify, &body).is_err());
}

/// The bytes of a BulkWrite/BulkRead request and of a Placed reply, as
/// `FORMAT.md` lays them out, and their refusals.
#[test]
fn bulk_bodies_are_laid_out_byte_by_byte() {
    let key = Key::new(1, 2, b"d", b"a");
    let mut key_bytes = Vec::new();
    key.encode_into(&mut key_bytes);
    for kind in [MessageType::BulkWrite, MessageType::BulkRead] {
        assert!(kind.is_batchable());
        let (offset, region_offset, len) = (0x0102, 0x0a0b_0000, 47008);
        let req = match kind {
            MessageType::BulkWrite => Request::BulkWrite {
                key: key.clone(),
                offset,
                region_offset,
                len,
            },
            _ => Request::BulkRead {
                key: key.clone(),
                offset,
                region_offset,
                len,
            },
        };
        let mut body = Vec::new();
        req.encode_body(&mut body);
        assert_eq!(body.len(), key_bytes.len() + body::BULK_FIXED_BYTES);
        let mut want = key_bytes.clone();
        want.extend([0x02, 0x01, 0, 0, 0, 0, 0, 0]);
        want.extend([0, 0, 0x0b, 0x0a, 0, 0, 0, 0]);
        want.extend(47008u32.to_le_bytes());
        assert_eq!(body, want);
        assert_eq!(Request::decode_body(kind, &body).unwrap(), req);
        // len over 1 MiB is refused.
        let at = body.len() - 4;
        body[at..].copy_from_slice(&((1u32 << 20) + 1).to_le_bytes());
        assert!(Request::decode_body(kind, &body).is_err());
    }

    let mut body = Vec::new();
    let placed = Reply::Placed(Some(Placed {
        version: 9,
        len: 0x0304,
    }));
    placed.encode_body(&mut body);
    assert_eq!(body.len(), body::PLACED_BODY_BYTES);
    let mut want = vec![1, 9, 0, 0, 0, 0, 0, 0, 0];
    want.extend([0x04, 0x03, 0, 0]);
    assert_eq!(body, want);
    assert_eq!(
        Reply::decode_body(MessageType::BulkRead, &body).unwrap(),
        placed
    );
    body.clear();
    Reply::Placed(None).encode_body(&mut body);
    assert_eq!(body, [0; body::PLACED_BODY_BYTES]);
    // Not found with a version or a length, and found over 2, are refused.
    body[1] = 1;
    assert!(Reply::decode_body(MessageType::BulkRead, &body).is_err());
    body[1] = 0;
    body[0] = 2;
    assert!(Reply::decode_body(MessageType::BulkRead, &body).is_err());
    // A BulkWrite is answered by a version, in a batch too.
    let mut wire = Vec::new();
    encode_reply(
        MessageType::Batch,
        3,
        &Reply::Batch(vec![Reply::Version(4), placed.clone()]),
        &mut wire,
    );
    let (h, b) = first_frame(&wire);
    assert_eq!(
        decode_reply(&h, b).unwrap(),
        Reply::Batch(vec![Reply::Version(4), placed])
    );
}

/// The bytes of an `extents` reply, and the maps its decoder refuses:
/// pieces out of order, empty or past `covered_end`, too many of them.
#[test]
fn extents_reply_layout_and_refusals() {
    let list = ExtentList {
        version: 7,
        newest_addr: 0x100,
        newest_len: 64,
        covered_end: u64::MAX,
        pieces: vec![ExtentSpan {
            start: 0,
            end: 10,
            rec_addr: 0x40,
            rec_len: 72,
        }],
    };
    let mut body = Vec::new();
    Reply::Extents(Some(list.clone())).encode_body(&mut body);
    assert_eq!(body.len(), 33 + 28);
    assert_eq!(body[0], 1);
    assert_eq!(body[1..9], 7u64.to_le_bytes());
    assert_eq!(body[9..17], 0x100u64.to_le_bytes());
    assert_eq!(body[17..21], 64u32.to_le_bytes());
    assert_eq!(body[21..29], u64::MAX.to_le_bytes());
    assert_eq!(body[29..33], 1u32.to_le_bytes());
    assert_eq!(body[33..41], 0u64.to_le_bytes());
    assert_eq!(body[41..49], 10u64.to_le_bytes());
    assert_eq!(body[49..57], 0x40u64.to_le_bytes());
    assert_eq!(body[57..61], 72u32.to_le_bytes());
    let back = Reply::decode_body(MessageType::ExtentList, &body).unwrap();
    assert_eq!(back, Reply::Extents(Some(list.clone())));
    let refused = |l: ExtentList| {
        let mut b = Vec::new();
        Reply::Extents(Some(l)).encode_body(&mut b);
        Reply::decode_body(MessageType::ExtentList, &b).is_err()
    };
    let mut empty = list.clone();
    empty.pieces[0].end = 0;
    assert!(refused(empty));
    let mut overlapping = list.clone();
    overlapping.pieces.push(ExtentSpan {
        start: 5,
        ..list.pieces[0]
    });
    assert!(refused(overlapping));
    let mut short = list.clone();
    short.covered_end = 9;
    assert!(refused(short));
    // Not found: every field 0.
    body.clear();
    Reply::Extents(None).encode_body(&mut body);
    assert_eq!(body, [0; 33]);
    body[5] = 1;
    assert!(Reply::decode_body(MessageType::ExtentList, &body).is_err());
    // A map longer than a reply holds is cut before its first piece left
    // out, and says so in covered_end.
    let mut long = list;
    long.pieces = (0..EXTENT_PIECES_MAX as u64 + 3)
        .map(|i| ExtentSpan {
            start: 2 * i,
            end: 2 * i + 1,
            rec_addr: i,
            rec_len: 1,
        })
        .collect();
    body.clear();
    Reply::Extents(Some(long)).encode_body(&mut body);
    let Reply::Extents(Some(cut)) = Reply::decode_body(MessageType::ExtentList, &body).unwrap()
    else {
        panic!("a cut map decodes");
    };
    assert_eq!(cut.pieces.len(), EXTENT_PIECES_MAX);
    assert_eq!(cut.covered_end, 2 * EXTENT_PIECES_MAX as u64);
}

/// A ListValues reply: byte layout, and at most LIST_VALUE_BYTES_MAX of
/// values in all (a reply over it is refused, one at it decodes).
#[test]
fn listed_values_layout_and_limit() {
    let reply = Reply::Values {
        entries: vec![(b"ab".to_vec(), Some(vec![7; 3])), (b"c".to_vec(), None)],
        more: true,
    };
    let mut body = Vec::new();
    reply.encode_body(&mut body);
    let want: &[u8] = &[
        2, 0, 0, 0, 1, // count, more
        2, 0, b'a', b'b', 1, 3, 0, 0, 0, 7, 7, 7, // key, has_value, blob
        1, 0, b'c', 0, // key, no value
    ];
    assert_eq!(body, want);
    assert_eq!(
        Reply::decode_body(MessageType::ListValues, &body).unwrap(),
        reply
    );
    let half = LIST_VALUE_BYTES_MAX / 2;
    let values = |last: usize| Reply::Values {
        entries: vec![
            (b"a".to_vec(), Some(vec![1; half])),
            (b"b".to_vec(), Some(vec![2; last])),
        ],
        more: false,
    };
    for (last, ok) in [(half, true), (half + 1, false)] {
        body.clear();
        values(last).encode_body(&mut body);
        let got = Reply::decode_body(MessageType::ListValues, &body);
        assert_eq!(got.is_ok(), ok, "values of {} bytes", half + last);
    }
}
