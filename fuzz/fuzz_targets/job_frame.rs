//! The job service's `[u32 LE length][JSON]` frames, read as the service
//! reads a worker's or CLI's stream (`ToEngine`) and as a worker or CLI
//! reads the service's (`ToPeer`). Nothing may panic or allocate more than
//! the frame limit; every message that decodes must write a frame that
//! reads back to the same message, and reading never consumes more bytes
//! than the stream holds.

#![no_main]

use ferrite_proto::rpc_jobs::{read_frame, write_frame, ToEngine, ToPeer};
use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;

/// Most frames read from one input (inputs are small; this bounds the loop).
const FRAMES_MAX: usize = 64;

fn stream<T: DeserializeOwned + Serialize + PartialEq + Debug>(data: &[u8]) {
    let mut rest = data;
    for _ in 0..FRAMES_MAX {
        let before = rest.len();
        match read_frame::<_, T>(&mut rest) {
            Ok(Some(msg)) => {
                assert!(rest.len() < before, "a frame consumed no bytes");
                let mut wire = Vec::new();
                write_frame(&mut wire, &msg).expect("a decoded message writes");
                let back: T = read_frame(&mut &wire[..])
                    .expect("a written frame reads")
                    .expect("a written frame is whole");
                assert_eq!(back, msg);
            }
            Ok(None) | Err(_) => return,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    stream::<ToEngine>(data);
    stream::<ToPeer>(data);
});
