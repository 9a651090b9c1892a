//! What the engine and its clients must agree on, byte for byte.
//!
//! A client finds a record without the engine's CPU: it hashes the key
//! ([`key::KeyHash`]), reads the 64-byte [`bucket::Bucket`] the hash names out
//! of the target's bucket region, follows a slot's remote pointer into the
//! target's record log region and checks the [`record`] it finds there against
//! the key it asked for. Every layout here is described byte by byte in
//! `proto/FORMAT.md` and pinned by compile-time assertions.
//!
//! ```
//! use ferrite_proto::key::RecordKey;
//! use ferrite_proto::record::{encode_record, RecordFlags, RecordView};
//!
//! let key = RecordKey::new(1, 42, b"dkey", b"akey");
//! let mut buf = vec![0u8; ferrite_proto::record::record_len(&key, 5)];
//! encode_record(&mut buf, &key, b"hello", 7, 4096, RecordFlags::empty(), 0).unwrap();
//! let view = RecordView::parse(&buf).unwrap();
//! view.verify_for(&key, 4096).unwrap();
//! assert_eq!(view.value(), b"hello");
//! assert_eq!(view.version(), 7);
//! ```

pub mod bucket;
pub mod crc;
pub mod error;
pub mod key;
pub mod qp_info;
pub mod record;
pub mod region;
pub mod rpc;
pub mod rpc_jobs;
#[cfg(feature = "sqlite")]
pub mod state_sql;
#[cfg(feature = "jobs")]
pub mod tasks;

pub use error::FormatError;
