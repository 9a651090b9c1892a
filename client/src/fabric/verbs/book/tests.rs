use super::*;

const CAP: usize = 4096;

/// A book over `buf` as the landing buffer, with room for 64 reads.
fn book(buf: &[u8]) -> Book {
    Book::new(buf.as_ptr() as u64, 7, buf.len(), 64)
}

fn remote(i: u64, len: usize) -> Remote {
    Remote {
        addr: 0x10_0000 + i * 4096,
        rkey: 0x99,
        len,
    }
}

/// What the device does for a posted read: its bytes land in its range
/// (`fill` repeated), then its completion is filed.
fn land(b: &mut Book, buf: &mut [u8], wr: &ReadWr, fill: u8) {
    let at = (wr.local_addr - buf.as_ptr() as u64) as usize;
    buf[at..at + wr.len as usize].fill(fill);
    b.complete(wr.wr_id, Ok(()), buf);
}

#[test]
fn reads_staged_by_many_gets_go_out_as_one_list() {
    let buf = vec![0u8; CAP];
    let mut b = book(&buf);
    // Ten GETs issued one after another stage their bucket reads.
    let ids: Vec<u64> = (0..10)
        .map(|i| b.stage(&[remote(i, 64)], true, 64).unwrap())
        .collect();
    assert_eq!(ids, (1..=10).collect::<Vec<_>>(), "wr_ids in order");
    let wrs = b.staged().to_vec();
    assert_eq!(wrs.len(), 10, "one list for the next doorbell");
    for (i, w) in wrs.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.remote_addr, w.lkey),
            (ids[i], remote(i as u64, 64).addr, 7)
        );
        let at = w.local_addr - buf.as_ptr() as u64;
        assert!(at as usize + 64 <= CAP && at % ALIGN as u64 == 0);
        for v in &wrs[..i] {
            let other = v.local_addr - buf.as_ptr() as u64;
            assert!(at + 64 <= other || other + 64 <= at, "ranges overlap");
        }
    }
    assert!(b.ring_now(false), "nothing landed: the first poll rings");
    b.mark_posted();
    assert!(b.staged().is_empty() && !b.ring_now(true));
    // The staged list holds one doorbell's worth, and no more than the
    // send queue has room for.
    let mut b = book(&buf);
    for i in 0..BATCH_MAX as u64 {
        assert!(b.stage(&[remote(i, 64)], true, 64).is_some());
    }
    assert_eq!(b.stage(&[remote(99, 64)], true, 64), None, "list full");
    let mut b = book(&buf);
    assert!(b.stage(&[remote(0, 64), remote(1, 64)], true, 3).is_some());
    assert_eq!(b.stage(&[remote(2, 64), remote(3, 64)], true, 3), None);
    assert_eq!(b.staged().len(), 2, "all or none");
}

#[test]
fn reads_a_completion_batch_makes_ready_share_a_doorbell() {
    let mut buf = vec![0u8; CAP];
    let mut b = book(&buf);
    for i in 0..3 {
        b.stage(&[remote(i, 64)], true, 64).unwrap();
    }
    let buckets = b.staged().to_vec();
    b.mark_posted();
    // One poll of the completion queue files all three.
    for (i, w) in buckets.iter().enumerate() {
        land(&mut b, &mut buf, w, 0xa0 + i as u8);
    }
    assert_eq!(b.untaken(), 3);
    // Each GET's future in turn takes its bucket and stages its record
    // read; only the last one, with no landed bytes left untaken, rings.
    let mut rang_at = None;
    for (i, w) in buckets.iter().enumerate() {
        let bytes = b.take_owned(w.wr_id, &buf).unwrap().unwrap();
        assert_eq!(bytes, vec![0xa0 + i as u8; 64], "its own bytes");
        b.stage(&[remote(10 + i as u64, 152)], true, 64).unwrap();
        if b.ring_now(false) {
            rang_at.get_or_insert(i);
        }
    }
    assert_eq!(rang_at, Some(2), "held back until the last future staged");
    assert_eq!(b.staged().len(), 3, "three record reads, one doorbell");
    // A future that already held back once rings even while landed
    // bytes wait for a future nobody polls.
    let records = b.staged().to_vec();
    b.mark_posted();
    land(&mut b, &mut buf, &records[0], 1);
    b.stage(&[remote(20, 64)], true, 64).unwrap();
    assert!(!b.ring_now(false) && b.ring_now(true));
}

#[test]
fn abandoned_and_failed_reads_free_their_ranges_when_safe() {
    let mut buf = vec![0u8; CAP];
    let mut b = book(&buf);
    // A staged read given up leaves the list and its range at once.
    let a = b.stage(&[remote(0, CAP)], true, 64).unwrap();
    b.abandon(a);
    assert!(b.staged().is_empty());
    // A posted one keeps its range until its completion comes.
    let p = b.stage(&[remote(1, CAP)], false, 64).unwrap();
    let wr = b.staged()[0];
    b.mark_posted();
    b.abandon(p);
    assert_eq!(
        b.stage(&[remote(2, 64)], true, 64),
        None,
        "range still held"
    );
    land(&mut b, &mut buf, &wr, 1);
    assert_eq!(b.untaken(), 0, "an abandoned read is nobody's");
    let s = b
        .stage(&[remote(3, 64)], false, 64)
        .expect("range free again");
    // A doorbell that fails fails every read staged for it.
    b.fail_staged("ibv_post_send: broken");
    let mut dst = [0u8; 64];
    assert_eq!(
        b.take_into(s, &mut dst, &buf),
        Some(Err("ibv_post_send: broken".into()))
    );
    assert!(b.staged().is_empty());
}

#[test]
fn landing_ranges_never_overlap_and_reuse_freed_gaps() {
    let cap = 4096;
    assert_eq!(first_gap(std::iter::empty(), 64, cap), Some(0));
    assert_eq!(first_gap(std::iter::empty(), cap + 1, cap), None);
    let mut held: Vec<(usize, usize)> = Vec::new();
    for want in [0, 64, 128, 256] {
        let len = if want == 128 { 100 } else { 64 };
        let at = first_gap(held.iter().copied(), len, cap).unwrap();
        assert_eq!(at, want, "packed at 64-byte boundaries");
        held.push((at, len));
    }
    // A freed range in the middle is reused by a read that fits it.
    held.retain(|r| r.0 != 64);
    assert_eq!(first_gap(held.iter().copied(), 64, cap), Some(64));
    assert_eq!(first_gap(held.iter().copied(), 65, cap), Some(320));
    // Full: nothing left of the right size.
    let full = [(0usize, cap - 32)];
    assert_eq!(first_gap(full.iter().copied(), 64, cap), None);
    assert_eq!(
        first_gap(full.iter().copied(), 32, cap),
        None,
        "4064 is no multiple of 64"
    );
    // Random lists: a found range stays inside and overlaps nothing.
    let mut x = 0x9e37_79b9_u64;
    for _ in 0..500 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 1 + (x >> 33) as usize % 700;
        match first_gap(held.iter().copied(), len, cap) {
            Some(at) => {
                assert!(at + len <= cap && at % ALIGN == 0);
                assert!(held.iter().all(|&(s, n)| at + len <= s || s + n <= at));
                held.push((at, len));
            }
            None => {
                held.remove((x >> 40) as usize % held.len());
            }
        }
    }
}

#[test]
fn a_landed_read_stays_filed_while_the_read_it_leads_to_is_posted() {
    // A cold GET's bucket read lands; the record read is picked from its
    // bytes in the landing buffer and staged before they are copied out.
    let mut buf = vec![0u8; CAP];
    let mut b = book(&buf);
    let bucket = b.stage(&[remote(0, 64)], false, 64).unwrap();
    let wrs = b.staged().to_vec();
    b.mark_posted();
    assert_eq!(b.landed_at(bucket), None, "in flight");
    land(&mut b, &mut buf, &wrs[0], 0xb0);
    let at = b.landed_at(bucket).unwrap().unwrap();
    assert_eq!(at as u64, wrs[0].local_addr - buf.as_ptr() as u64);
    assert!(buf[at..at + 64].iter().all(|&x| x == 0xb0));
    let record = b.stage(&[remote(1, 152)], false, 64).unwrap();
    let rec = b.staged()[0];
    let rec_at = (rec.local_addr - buf.as_ptr() as u64) as usize;
    assert!(
        rec_at >= at + 64 || rec_at + 152 <= at,
        "the bucket's range is still held"
    );
    b.mark_posted();
    let mut bucket_bytes = [0u8; 64];
    assert_eq!(b.take_into(bucket, &mut bucket_bytes, &buf), Some(Ok(())));
    assert_eq!(bucket_bytes, [0xb0; 64], "the bytes the pick saw");
    assert_eq!(b.landed_at(bucket), None, "taken");
    land(&mut b, &mut buf, &rec, 0x5e);
    let mut record_bytes = [0u8; 152];
    assert_eq!(b.take_into(record, &mut record_bytes, &buf), Some(Ok(())));
    assert_eq!(record_bytes, [0x5e; 152]);
    // A failed read reports its cause and is dropped once abandoned.
    let failed = b.stage(&[remote(2, 64)], false, 64).unwrap();
    b.mark_posted();
    b.complete(failed, Err("RDMA READ failed: flushed".into()), &buf);
    assert_eq!(
        b.landed_at(failed),
        Some(Err("RDMA READ failed: flushed".into()))
    );
    b.abandon(failed);
    assert_eq!(b.landed_at(failed), None);
    assert!(b.flights.is_empty(), "nothing left filed");
}
