//! `spdk` (cargo feature `spdk`): a bdev of a system SPDK, through FFI.
//!
//! **Untested**: no SPDK is installed where this was written; CI only runs
//! `cargo check --features spdk`. See `bdev/SPDK.md` for building it.
//!
//! Model: SPDK's environment and bdev subsystems are started once per
//! process ([`init`]) from an SPDK JSON config that creates the bdevs. Each
//! xstream that opens a channel gets its own `spdk_thread` and an SPDK
//! `io_channel`; the channel's futures poll that thread (`spdk_thread_poll`)
//! when polled, so completions run on the xstream, as in SPDK's own
//! reactors. SPDK needs DMA-able memory: each I/O is copied through a
//! bounce buffer from `spdk_dma_zmalloc`. The init thread keeps module
//! pollers (NVMe admin queue, hot-plug): call [`poll_init_thread`] now and
//! then from one xstream.

mod ffi;

use crate::{Bdev, BdevError, Channel, IoType, Result};
use ffi::*;
use std::cell::Cell;
use std::ffi::CString;
use std::os::raw::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

const SPDK_QUEUE_DEPTH: usize = 128;
/// How long a dropped in-flight operation is polled for before it is leaked.
const DROP_POLL_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

struct ThreadPtr(*mut spdk_thread);
// SAFETY: only used to poll the init thread under INIT_LOCK.
unsafe impl Send for ThreadPtr {}
// SAFETY: as above.
unsafe impl Sync for ThreadPtr {}

static INIT: OnceLock<std::result::Result<ThreadPtr, String>> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

fn spdk_error(reason: String) -> BdevError {
    BdevError::Other {
        device: "spdk".into(),
        reason,
    }
}

unsafe extern "C" fn init_done(rc: c_int, ctx: *mut c_void) {
    // SAFETY: ctx is the &Cell<Option<i32>> passed by `start`, alive while
    // `start` polls.
    unsafe { (*(ctx as *const Cell<Option<i32>>)).set(Some(rc)) };
}

fn start(config_json: &str) -> std::result::Result<ThreadPtr, String> {
    let name = CString::new("ferrite").map_err(|e| e.to_string())?;
    let config = CString::new(config_json).map_err(|e| e.to_string())?;
    let mut opts = Box::new(EnvOptsStorage([0; 4096]));
    // SAFETY: FFI per spdk/env.h; `opts` is larger than spdk_env_opts and
    // `name` (its first member) outlives the call.
    unsafe {
        spdk_env_opts_init(&mut *opts);
        std::ptr::write(opts.0.as_mut_ptr().cast::<*const i8>(), name.as_ptr());
        if spdk_env_init(&*opts) != 0 {
            return Err("spdk_env_init failed (hugepages configured? run as root?)".into());
        }
        if spdk_thread_lib_init(None, 0) != 0 {
            return Err("spdk_thread_lib_init failed".into());
        }
    }
    // SAFETY: FFI per spdk/thread.h.
    let thread = unsafe { spdk_thread_create(name.as_ptr(), std::ptr::null()) };
    if thread.is_null() {
        return Err("spdk_thread_create failed".into());
    }
    let done: Cell<Option<i32>> = Cell::new(None);
    // SAFETY: the callback gets `done`, polled below until it fires.
    unsafe {
        spdk_set_thread(thread);
        spdk_subsystem_init_from_json_config(
            config.as_ptr(),
            std::ptr::null(),
            init_done,
            (&done as *const Cell<Option<i32>>).cast_mut().cast(),
            true,
        );
    }
    let start = std::time::Instant::now();
    while done.get().is_none() && start.elapsed() < std::time::Duration::from_secs(60) {
        // SAFETY: polling the thread we created, on this OS thread.
        unsafe { spdk_thread_poll(thread, 0, 0) };
    }
    match done.get() {
        Some(0) => Ok(ThreadPtr(thread)),
        Some(rc) => Err(format!("loading SPDK config {config_json}: error {rc}")),
        None => Err(format!(
            "loading SPDK config {config_json}: no answer in 60 s"
        )),
    }
}

/// Starts SPDK once per process with the bdevs of `config_json` (an SPDK
/// JSON config file). Later calls return the first outcome.
pub fn init(config_json: &str) -> Result<()> {
    match INIT.get_or_init(|| start(config_json)) {
        Ok(_) => Ok(()),
        Err(e) => Err(spdk_error(e.clone())),
    }
}

/// Runs the init thread's pollers once (module admin work).
pub fn poll_init_thread() {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(Ok(t)) = INIT.get() {
        // SAFETY: the init thread is only polled under INIT_LOCK.
        unsafe { spdk_thread_poll(t.0, 0, 0) };
    }
}

thread_local! {
    /// The spdk_thread of this OS thread (xstream), created on first use.
    static LOCAL_THREAD: Cell<*mut spdk_thread> = const { Cell::new(std::ptr::null_mut()) };
}

fn local_thread() -> Result<*mut spdk_thread> {
    LOCAL_THREAD.with(|t| {
        if t.get().is_null() {
            let name = CString::new("ferrite-xstream").map_err(|e| spdk_error(e.to_string()))?;
            // SAFETY: FFI per spdk/thread.h; SPDK copies the name.
            let created = unsafe { spdk_thread_create(name.as_ptr(), std::ptr::null()) };
            if created.is_null() {
                return Err(spdk_error("spdk_thread_create failed".into()));
            }
            t.set(created);
        }
        // SAFETY: makes this OS thread's spdk_thread current.
        unsafe { spdk_set_thread(t.get()) };
        Ok(t.get())
    })
}

struct Desc(*mut spdk_bdev_desc);
// SAFETY: a descriptor may be used from any spdk_thread (SPDK's contract).
unsafe impl Send for Desc {}
// SAFETY: as above.
unsafe impl Sync for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: opened in SpdkBdev::open.
        unsafe { spdk_bdev_close(self.0) };
    }
}

unsafe extern "C" fn bdev_event(_type: c_int, _bdev: *mut spdk_bdev, _ctx: *mut c_void) {
    // Hot-remove and resize are not handled: I/O to a removed bdev fails.
}

/// An SPDK bdev.
pub struct SpdkBdev {
    name: Arc<str>,
    desc: Arc<Desc>,
    bdev: usize,
    block_size: u32,
    num_blocks: u64,
    buf_align: usize,
    boundary: u32,
}

impl SpdkBdev {
    /// Opens SPDK bdev `bdev_name` for writing. SPDK must be started with
    /// [`init`], or `config_json` is used to start it.
    pub fn open(bdev_name: &str, config_json: Option<&str>) -> Result<Self> {
        if let Some(c) = config_json {
            init(c)?;
        }
        if INIT.get().is_none() {
            return Err(spdk_error(
                "SPDK is not started: give ?config=<SPDK JSON config> in the spec".into(),
            ));
        }
        let c_name = CString::new(bdev_name).map_err(|e| spdk_error(e.to_string()))?;
        let mut desc: *mut spdk_bdev_desc = std::ptr::null_mut();
        let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        local_thread()?;
        // SAFETY: FFI per spdk/bdev.h; `desc` receives the descriptor.
        let rc = unsafe {
            spdk_bdev_open_ext(
                c_name.as_ptr(),
                true,
                bdev_event,
                std::ptr::null_mut(),
                &mut desc,
            )
        };
        if rc != 0 || desc.is_null() {
            return Err(spdk_error(format!(
                "spdk_bdev_open_ext({bdev_name}): error {rc}"
            )));
        }
        let desc = Arc::new(Desc(desc));
        // SAFETY: the descriptor is open; these read bdev properties.
        let (bdev, block_size, num_blocks, buf_align, boundary) = unsafe {
            let b = spdk_bdev_desc_get_bdev(desc.0);
            (
                b,
                spdk_bdev_get_block_size(b),
                spdk_bdev_get_num_blocks(b),
                spdk_bdev_get_buf_align(b),
                spdk_bdev_get_optimal_io_boundary(b),
            )
        };
        Ok(Self {
            name: format!("spdk:{bdev_name}").into(),
            desc,
            bdev: bdev as usize,
            block_size,
            num_blocks,
            buf_align: buf_align.max(64),
            boundary,
        })
    }
}

impl Bdev for SpdkBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn block_count(&self) -> u64 {
        self.num_blocks
    }
    fn optimal_io_boundary_blocks(&self) -> u32 {
        self.boundary
    }
    fn io_type_supported(&self, io_type: IoType) -> bool {
        let t = match io_type {
            IoType::Read => SPDK_BDEV_IO_TYPE_READ,
            IoType::Write => SPDK_BDEV_IO_TYPE_WRITE,
            IoType::Flush => SPDK_BDEV_IO_TYPE_FLUSH,
            IoType::WriteZeroes => SPDK_BDEV_IO_TYPE_WRITE_ZEROES,
            IoType::Unmap => SPDK_BDEV_IO_TYPE_UNMAP,
        };
        // SAFETY: the bdev lives while its descriptor is open.
        unsafe { spdk_bdev_io_type_supported(self.bdev as *mut spdk_bdev, t) }
    }
    fn channel(&self) -> Result<Box<dyn Channel>> {
        let thread = local_thread()?;
        // SAFETY: called on this xstream's spdk_thread.
        let ch = unsafe { spdk_bdev_get_io_channel(self.desc.0) };
        if ch.is_null() {
            return Err(spdk_error("spdk_bdev_get_io_channel failed".into()));
        }
        Ok(Box::new(channel::SpdkChannel::new(
            Arc::clone(&self.name),
            Arc::clone(&self.desc),
            ch,
            thread,
            self.block_size,
            self.size_bytes(),
            self.buf_align,
        )))
    }
}

mod channel;
