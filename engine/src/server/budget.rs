//! Reply budgets: no reply frame the engine sends passes the
//! [`BODY_BYTES_MAX`] a client accepts (proto `FORMAT.md`, "Reply budget").
//!
//! A lone reply fits by construction (a value or a read is at most 1 MiB)
//! except a listing, whose keys may each be 4 KiB: it is cut at
//! [`BATCH_REPLY_BUDGET_BYTES`] with `more` set, the continuation listings
//! already have. The items of a batch share that budget in item order: a
//! listing that does not fit whole is cut to what is left, and any other
//! item that does not fit gets [`ErrorCode::TooLarge`] ("ask alone"), a
//! refusal small enough that a whole batch of them still fits the frame.
//!
//! The values are fetched before the budget is applied: it bounds the
//! reply frame, not the memory the fetches of one batch take.

use ferrite_proto::rpc::message::BATCH_ITEMS_MAX;
use ferrite_proto::rpc::{ErrorCode, Reply, BATCH_REPLY_BUDGET_BYTES, BODY_BYTES_MAX};

/// Bytes in front of each batch reply item: u8 type, u32 body_len.
const ITEM_HEADER_BYTES: usize = 1 + 4;
/// Longest message of a too-large refusal.
const TOO_LARGE_MESSAGE_MAX_BYTES: usize = 124;
/// Body of a too-large refusal at most: u16 code, u16 length, message.
const TOO_LARGE_BODY_MAX_BYTES: usize = 2 + 2 + TOO_LARGE_MESSAGE_MAX_BYTES;

// The budget and a refusal for every item fit the frame (u16 item count
// in front).
const _: () = assert!(
    2 + BATCH_REPLY_BUDGET_BYTES + BATCH_ITEMS_MAX * (ITEM_HEADER_BYTES + TOO_LARGE_BODY_MAX_BYTES)
        <= BODY_BYTES_MAX
);

/// Bytes of `reply`'s body as `Reply::encode_body` writes them.
fn body_bytes(reply: &Reply) -> usize {
    match reply {
        Reply::Value(Some(f)) => 1 + 8 + 4 + f.value.len(),
        Reply::Data(d) => 4 + d.len(),
        Reply::Keys { keys, .. } => 4 + 1 + keys.iter().map(|k| key_bytes(k)).sum::<usize>(),
        Reply::Values { entries, .. } => 4 + 1 + entries.iter().map(entry_bytes).sum::<usize>(),
        Reply::Batch(items) => {
            2 + (items.iter())
                .map(|r| ITEM_HEADER_BYTES + body_bytes(r))
                .sum::<usize>()
        }
        small => {
            let mut body = Vec::new();
            small.encode_body(&mut body);
            body.len()
        }
    }
}

fn key_bytes(key: &[u8]) -> usize {
    2 + key.len()
}

fn entry_bytes((key, value): &(Vec<u8>, Option<Vec<u8>>)) -> usize {
    key_bytes(key) + 1 + value.as_ref().map_or(0, |v| 4 + v.len())
}

/// How many of `items` (costing `cost` each) fit in `left` bytes.
fn fitting<T>(items: &[T], mut left: usize, cost: impl Fn(&T) -> usize) -> usize {
    let mut n = 0;
    for item in items {
        match left.checked_sub(cost(item)) {
            Some(rest) => left = rest,
            None => break,
        }
        n += 1;
    }
    n
}

/// `reply` cut so that its body takes at most `left` bytes: listings lose
/// their last entries (and then say `more`); `Err` when even the first
/// entry, or a reply that cannot be cut, does not fit.
fn cut_to(reply: Reply, left: usize) -> Result<Reply, Reply> {
    if body_bytes(&reply) <= left {
        return Ok(reply);
    }
    let room = left.saturating_sub(4 + 1);
    match reply {
        Reply::Keys { mut keys, .. } => match fitting(&keys, room, |k| key_bytes(k)) {
            0 => Err(Reply::Keys { keys, more: true }),
            n => {
                keys.truncate(n);
                Ok(Reply::Keys { keys, more: true })
            }
        },
        Reply::Values { mut entries, .. } => match fitting(&entries, room, entry_bytes) {
            0 => Err(Reply::Values {
                entries,
                more: true,
            }),
            n => {
                entries.truncate(n);
                Ok(Reply::Values {
                    entries,
                    more: true,
                })
            }
        },
        other => Err(other),
    }
}

/// The refusal that replaces a batch item whose reply took `bytes`.
fn too_large(bytes: usize) -> Reply {
    let message = format!(
        "reply of {bytes} bytes passes the batch's {BATCH_REPLY_BUDGET_BYTES}-byte reply budget: \
         ask for it alone"
    );
    debug_assert!(message.len() <= TOO_LARGE_MESSAGE_MAX_BYTES);
    Reply::error(ErrorCode::TooLarge, message)
}

/// A lone reply within the budget: a listing is cut (more set).
pub(crate) fn bound_alone(reply: Reply) -> Reply {
    cut_to(reply, BATCH_REPLY_BUDGET_BYTES).unwrap_or_else(|whole| whole)
}

/// The replies of a batch within the shared budget, in item order. A
/// reply no bigger than a refusal is always kept (the frame has room for
/// one per item): a write's answer is never refused, and an error whose
/// message does not fit is shortened.
pub(crate) fn bound_batch(replies: Vec<Reply>) -> Vec<Reply> {
    let mut left = BATCH_REPLY_BUDGET_BYTES;
    (replies.into_iter())
        .map(|reply| {
            let bytes = body_bytes(&reply);
            if bytes <= TOO_LARGE_BODY_MAX_BYTES {
                return reply;
            }
            let kept = match cut_to(reply, left.saturating_sub(ITEM_HEADER_BYTES)) {
                Ok(kept) => kept,
                Err(Reply::Error { code, message }) => Reply::error(code, shortened(&message)),
                Err(_) => too_large(bytes),
            };
            let kept_bytes = body_bytes(&kept);
            if kept_bytes > TOO_LARGE_BODY_MAX_BYTES {
                left = left.saturating_sub(ITEM_HEADER_BYTES + kept_bytes);
            }
            kept
        })
        .collect()
}

/// The longest prefix of `message` (whole characters) a refusal carries.
fn shortened(message: &str) -> String {
    let mut end = TOO_LARGE_MESSAGE_MAX_BYTES.min(message.len());
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::rpc::{self, Found, MessageType};

    fn value(n: usize) -> Reply {
        Reply::Value(Some(Found {
            version: 1,
            value: vec![7; n],
        }))
    }

    #[test]
    fn body_bytes_is_what_encoding_writes() {
        let replies = [
            value(3),
            Reply::Value(None),
            Reply::Data(vec![1; 9]),
            Reply::Keys {
                keys: vec![b"ab".to_vec(), vec![]],
                more: false,
            },
            Reply::Values {
                entries: vec![(b"k".to_vec(), Some(vec![1; 5])), (b"j".to_vec(), None)],
                more: true,
            },
            Reply::Version(4),
            Reply::error(ErrorCode::Io, "x"),
        ];
        let batch = Reply::Batch(replies.to_vec());
        for r in replies.iter().chain([&batch]) {
            let mut body = Vec::new();
            r.encode_body(&mut body);
            assert_eq!(body_bytes(r), body.len(), "{r:?}");
        }
    }

    /// A batch of 1024 values of 1 MiB (1 GiB) keeps what fits in the
    /// budget, refuses the rest one by one, and encodes to a frame a
    /// client accepts.
    #[test]
    fn a_batch_of_large_values_fits_the_frame() {
        let mib = 1 << 20;
        let replies: Vec<Reply> = (0..BATCH_ITEMS_MAX).map(|_| value(mib)).collect();
        let bounded = bound_batch(replies);
        let kept = bounded
            .iter()
            .filter(|r| matches!(r, Reply::Value(_)))
            .count();
        assert_eq!(kept, 3, "4 MiB holds three 1 MiB values and their headers");
        for r in &bounded[kept..] {
            assert!(
                matches!(
                    r,
                    Reply::Error {
                        code: ErrorCode::TooLarge,
                        ..
                    }
                ),
                "{r:?}"
            );
        }
        let mut frame = Vec::new();
        rpc::encode_reply(MessageType::Batch, 1, &Reply::Batch(bounded), &mut frame);
        assert!(frame.len() - rpc::HEADER_BYTES <= BODY_BYTES_MAX);
        let (header, _) = rpc::split_frame(&frame, BODY_BYTES_MAX).unwrap().unwrap();
        let decoded = rpc::decode_reply(&header, &frame[rpc::HEADER_BYTES..]).unwrap();
        assert!(matches!(decoded, Reply::Batch(items) if items.len() == BATCH_ITEMS_MAX));
    }

    /// A listing of 4096 keys of 4 KiB (16 MiB) is cut, alone and in a
    /// batch, with more set; one that has no room left is refused.
    #[test]
    fn listings_are_cut_with_more() {
        let keys: Vec<Vec<u8>> = (0..4096u32).map(|i| vec![(i % 251) as u8; 4096]).collect();
        let listing = Reply::Keys {
            keys: keys.clone(),
            more: false,
        };
        let Reply::Keys { keys: cut, more } = bound_alone(listing.clone()) else {
            panic!("keys");
        };
        assert!(more && !cut.is_empty() && cut.len() < keys.len());
        assert_eq!(cut[..], keys[..cut.len()], "a prefix of the listing");
        assert!(body_bytes(&Reply::Keys { keys: cut, more }) <= BATCH_REPLY_BUDGET_BYTES);
        let small = Reply::Keys {
            keys: vec![b"a".to_vec()],
            more: false,
        };
        assert_eq!(bound_alone(small.clone()), small, "what fits is untouched");
        let bounded = bound_batch(vec![value(1 << 20), listing.clone(), listing]);
        assert!(matches!(&bounded[1], Reply::Keys { more: true, keys } if !keys.is_empty()));
        assert!(matches!(
            bounded[2],
            Reply::Error {
                code: ErrorCode::TooLarge,
                ..
            }
        ));
    }

    /// Past the budget, a write's answer and a short error are kept, and a
    /// long error is shortened: only reads are refused.
    #[test]
    fn small_replies_are_never_refused() {
        let long = "é".repeat(1000);
        // The first value leaves 100 bytes of the budget.
        let replies = vec![
            value(BATCH_REPLY_BUDGET_BYTES - ITEM_HEADER_BYTES - 13 - 100),
            value(1 << 20),
            value(1 << 20),
            value(1 << 20),
            Reply::Version(9),
            Reply::error(ErrorCode::Io, "short"),
            Reply::error(ErrorCode::Io, long.clone()),
        ];
        let bounded = bound_batch(replies);
        assert!(matches!(bounded[0], Reply::Value(Some(_))));
        for r in &bounded[1..4] {
            assert!(
                matches!(
                    r,
                    Reply::Error {
                        code: ErrorCode::TooLarge,
                        ..
                    }
                ),
                "{r:?}"
            );
        }
        assert_eq!(bounded[4], Reply::Version(9));
        assert_eq!(bounded[5], Reply::error(ErrorCode::Io, "short"));
        let Reply::Error { code, message } = &bounded[6] else {
            panic!("error");
        };
        assert_eq!(*code, ErrorCode::Io);
        assert!(long.starts_with(message.as_str()) && message.len() <= TOO_LARGE_MESSAGE_MAX_BYTES);
    }
}
