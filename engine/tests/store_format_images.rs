//! Every store format this engine has written still opens: device images
//! checked in under `tests/images/` (one per store/checkpoint format, see
//! the version history in `engine/FORMAT.md`) open with their keys and
//! values whole, and images of formats this engine does not read are
//! refused with an error that says whether the format is older or newer.
//!
//! The images were written once by an engine of their format
//! (`FERRITE_WRITE_FORMAT_IMAGES=1 cargo test -p ferrite-engine --test
//! store_format_images`, which rewrites only the images of the current
//! formats). Never regenerate an older one, and never change [`expected`]:
//! a new format adds an image and a line to `IMAGES`.
//!
//! An image is stored sparse: `"FIMG"`, u32 version 1, u64 device bytes,
//! then for each 4096-byte block that is not all zeros a u64 offset and the
//! block's bytes (all little-endian).

use ferrite_bdev::BdevRef;
use ferrite_engine::store::{Store, StoreConfig, StoreError};
use ferrite_proto::key::RecordKey;
use std::path::PathBuf;

const BLOCK: usize = 4096;
const DEVICE_BYTES: usize = 8 << 20;
const IMAGE_MAGIC: &[u8; 4] = b"FIMG";
const KEYS: u32 = 48;

/// The images and the (store, checkpoint) formats they hold.
const IMAGES: [(&str, u32, u32); 2] = [("store-f2-ckpt2.img", 2, 2), ("store-f2-ckpt3.img", 2, 3)];

fn image_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/images")
        .join(name)
}

fn key(k: u32) -> Vec<u8> {
    format!("key-{k:03}").into_bytes()
}

fn value(k: u32, round: u32) -> Vec<u8> {
    if k == 7 {
        // A value over several blocks.
        return (0..20_000u32).map(|i| (i * 31 + k + round) as u8).collect();
    }
    format!("image key {k} round {round};")
        .repeat(1 + (k % 5) as usize)
        .into_bytes()
}

/// What every image holds: keys 0..8 overwritten in round 1, keys 40..48
/// punched, the rest at round 0.
fn expected(k: u32) -> Option<Vec<u8>> {
    match k {
        0..8 => Some(value(k, 1)),
        40.. => None,
        _ => Some(value(k, 0)),
    }
}

fn rkey(k: &[u8]) -> RecordKey<'_> {
    RecordKey::new(3, 0x5eed, b"image", k)
}

/// Writes the keys: half before a checkpoint, the rest (and the
/// overwrites and punches) after it, so opening replays the log too.
async fn fill(store: &Store) {
    for k in 0..KEYS {
        let kb = key(k);
        store.update(&rkey(&kb), &value(k, 0)).await.unwrap();
        if k == KEYS / 2 {
            store.checkpoint().await.unwrap();
        }
    }
    for k in 0..8 {
        let kb = key(k);
        store.update(&rkey(&kb), &value(k, 1)).await.unwrap();
    }
    for k in 40..KEYS {
        let kb = key(k);
        store.punch(&rkey(&kb)).await.unwrap();
    }
    store.sync().await.unwrap();
}

async fn device_bytes(dev: &BdevRef) -> Vec<u8> {
    let ch = dev.channel().unwrap();
    let buf = ch.alloc(dev.size_bytes() as usize).unwrap();
    ch.read(0, buf).await.unwrap().as_slice().to_vec()
}

async fn device_from(image: &[u8]) -> BdevRef {
    let dev = ferrite_bdev::open(&format!("malloc:{}", image.len())).unwrap();
    let ch = dev.channel().unwrap();
    let mut buf = ch.alloc(image.len()).unwrap();
    buf.as_mut_slice().copy_from_slice(image);
    ch.write(0, buf).await.unwrap();
    ch.flush().await.unwrap();
    dev
}

fn encode_sparse(image: &[u8]) -> Vec<u8> {
    let mut out = IMAGE_MAGIC.to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&(image.len() as u64).to_le_bytes());
    for (i, block) in image.chunks(BLOCK).enumerate() {
        if block.iter().any(|&b| b != 0) {
            out.extend_from_slice(&((i * BLOCK) as u64).to_le_bytes());
            out.extend_from_slice(block);
        }
    }
    out
}

fn decode_sparse(b: &[u8]) -> Vec<u8> {
    assert_eq!(&b[..4], IMAGE_MAGIC, "not an image");
    assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 1);
    let len = u64::from_le_bytes(b[8..16].try_into().unwrap()) as usize;
    let mut image = vec![0u8; len];
    let mut rest = &b[16..];
    while !rest.is_empty() {
        let at = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
        image[at..at + BLOCK].copy_from_slice(&rest[8..8 + BLOCK]);
        rest = &rest[8 + BLOCK..];
    }
    image
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Rewrites a checkpoint-format-3 image's checkpoint headers as format 2
/// wrote them: format 2, no damage record (bytes 64..224 zero), header CRC
/// over bytes 0..60. Used only to write the format 2 image.
fn as_checkpoint_format_2(image: &mut [u8]) {
    let (offset, bytes) = (u64_at(image, 16) as usize, u64_at(image, 24) as usize);
    for area in [offset, offset + bytes] {
        let h = &mut image[area..area + BLOCK];
        if &h[..4] == b"FCKP" {
            h[4..8].copy_from_slice(&2u32.to_le_bytes());
            h[64..224].fill(0);
            let crc = crc32fast::hash(&h[..60]);
            h[60..64].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

async fn write_images() {
    let dev = ferrite_bdev::open(&format!("malloc:{DEVICE_BYTES}")).unwrap();
    let store = Store::open(dev.clone(), StoreConfig::small())
        .await
        .unwrap();
    fill(&store).await;
    drop(store);
    let mut image = device_bytes(&dev).await;
    std::fs::create_dir_all(image_path("")).unwrap();
    std::fs::write(image_path(IMAGES[1].0), encode_sparse(&image)).unwrap();
    as_checkpoint_format_2(&mut image);
    std::fs::write(image_path(IMAGES[0].0), encode_sparse(&image)).unwrap();
}

async fn check_image(name: &str) {
    let image = decode_sparse(&std::fs::read(image_path(name)).unwrap());
    let store = Store::open(device_from(&image).await, StoreConfig::small())
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    for k in 0..KEYS {
        let kb = key(k);
        let got = store.fetch(&rkey(&kb)).await.unwrap().map(|(_, v)| v);
        assert_eq!(got, expected(k), "{name}: key {k}");
    }
    // And it takes writes in the current format.
    store.update(&rkey(b"new"), b"after upgrade").await.unwrap();
    store.checkpoint().await.unwrap();
}

/// Opening `image` with byte `at` set to the u32 `format` (and the CRC at
/// `crc_at` over `..crc_at` fixed up) fails; returns the error's text.
async fn refused(image: &[u8], at: usize, crc_at: usize, format: u32) -> String {
    let mut image = image.to_vec();
    let start = at - (at % BLOCK);
    image[at..at + 4].copy_from_slice(&format.to_le_bytes());
    let crc = crc32fast::hash(&image[start..crc_at]);
    image[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    match Store::open(device_from(&image).await, StoreConfig::small()).await {
        Ok(_) => panic!("format {format} at byte {at} opened"),
        Err(e @ StoreError::Layout { .. }) => e.to_string(),
        Err(e) => panic!("format {format} at byte {at}: not a layout error: {e}"),
    }
}

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    glommio::LocalExecutorBuilder::default()
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn every_checked_in_format_opens_with_its_data() {
    if std::env::var_os("FERRITE_WRITE_FORMAT_IMAGES").is_some() {
        run(write_images);
    }
    for (name, store_format, checkpoint_format) in IMAGES {
        let image = decode_sparse(&std::fs::read(image_path(name)).unwrap());
        assert_eq!(
            u32::from_le_bytes(image[4..8].try_into().unwrap()),
            store_format
        );
        let ck = u64_at(&image, 16) as usize;
        let formats: Vec<u32> = [ck, ck + u64_at(&image, 24) as usize]
            .iter()
            .filter(|&&a| &image[a..a + 4] == b"FCKP")
            .map(|&a| u32::from_le_bytes(image[a + 4..a + 8].try_into().unwrap()))
            .collect();
        assert!(!formats.is_empty() && formats.iter().all(|&f| f == checkpoint_format));
        run(move || check_image(name));
    }
}

#[test]
fn formats_this_engine_does_not_read_are_refused_by_name() {
    run(|| async {
        let image = decode_sparse(&std::fs::read(image_path(IMAGES[1].0)).unwrap());
        // Superblock: format at byte 4, CRC over bytes 0..80 at byte 80.
        let older = refused(&image, 4, 80, 1).await;
        assert!(older.contains("store format 1 is older"), "{older}");
        let newer = refused(&image, 4, 80, 3).await;
        assert!(newer.contains("store format 3 is newer"), "{newer}");
        // A checkpoint area in use: format at byte 4 of its header, CRC
        // over bytes 0..60 at byte 60.
        let ck = u64_at(&image, 16) as usize;
        let area = [ck, ck + u64_at(&image, 24) as usize]
            .into_iter()
            .find(|&a| &image[a..a + 4] == b"FCKP")
            .unwrap();
        let newer = refused(&image, area + 4, area + 60, 4).await;
        assert!(
            newer.contains("format 4, newer than this engine"),
            "{newer}"
        );
    });
}
