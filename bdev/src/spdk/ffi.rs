//! Hand-written declarations of the SPDK functions this backend calls, from
//! SPDK's public headers (`spdk/env.h`, `spdk/thread.h`, `spdk/init.h`,
//! `spdk/bdev.h`). Only pointers to opaque structs cross the boundary,
//! except `spdk_env_opts`, which is filled by SPDK itself (see
//! [`EnvOptsStorage`]).
//!
//! The `#[link]` attribute only matters when a final binary is linked:
//! `cargo check --features spdk` needs no SPDK installed.

#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

/// Opaque SPDK objects.
#[repr(C)]
pub struct spdk_thread {
    _private: [u8; 0],
}
#[repr(C)]
pub struct spdk_bdev {
    _private: [u8; 0],
}
#[repr(C)]
pub struct spdk_bdev_desc {
    _private: [u8; 0],
}
#[repr(C)]
pub struct spdk_bdev_io {
    _private: [u8; 0],
}
#[repr(C)]
pub struct spdk_io_channel {
    _private: [u8; 0],
}
#[repr(C)]
pub struct spdk_cpuset {
    _private: [u8; 0],
}

/// Room for `struct spdk_env_opts` of any SPDK release so far (it is a few
/// hundred bytes); `spdk_env_opts_init` fills it and we then set `name`,
/// its first member.
#[repr(C, align(64))]
pub struct EnvOptsStorage(pub [u8; 4096]);

/// `enum spdk_bdev_io_type` (values of `spdk/bdev.h`).
pub const SPDK_BDEV_IO_TYPE_READ: c_int = 1;
pub const SPDK_BDEV_IO_TYPE_WRITE: c_int = 2;
pub const SPDK_BDEV_IO_TYPE_UNMAP: c_int = 3;
pub const SPDK_BDEV_IO_TYPE_FLUSH: c_int = 4;
pub const SPDK_BDEV_IO_TYPE_WRITE_ZEROES: c_int = 9;

pub type spdk_bdev_io_completion_cb =
    unsafe extern "C" fn(bdev_io: *mut spdk_bdev_io, success: bool, cb_arg: *mut c_void);
pub type spdk_bdev_event_cb_t =
    unsafe extern "C" fn(event_type: c_int, bdev: *mut spdk_bdev, event_ctx: *mut c_void);
pub type spdk_subsystem_init_fn = unsafe extern "C" fn(rc: c_int, ctx: *mut c_void);
pub type spdk_new_thread_fn = unsafe extern "C" fn(thread: *mut spdk_thread) -> c_int;

#[link(name = "spdk")]
extern "C" {
    pub fn spdk_env_opts_init(opts: *mut EnvOptsStorage);
    pub fn spdk_env_init(opts: *const EnvOptsStorage) -> c_int;
    pub fn spdk_dma_zmalloc(size: usize, align: usize, phys_addr: *mut u64) -> *mut c_void;
    pub fn spdk_dma_free(buf: *mut c_void);

    pub fn spdk_thread_lib_init(new_thread_fn: Option<spdk_new_thread_fn>, ctx_sz: usize) -> c_int;
    pub fn spdk_thread_create(name: *const c_char, cpumask: *const spdk_cpuset)
        -> *mut spdk_thread;
    pub fn spdk_set_thread(thread: *mut spdk_thread);
    pub fn spdk_thread_poll(thread: *mut spdk_thread, max_msgs: u32, now: u64) -> c_int;

    pub fn spdk_subsystem_init_from_json_config(
        json_config_file: *const c_char,
        rpc_addr: *const c_char,
        cb_fn: spdk_subsystem_init_fn,
        cb_arg: *mut c_void,
        stop_on_error: bool,
    );

    pub fn spdk_bdev_open_ext(
        bdev_name: *const c_char,
        write: bool,
        event_cb: spdk_bdev_event_cb_t,
        event_ctx: *mut c_void,
        desc: *mut *mut spdk_bdev_desc,
    ) -> c_int;
    pub fn spdk_bdev_close(desc: *mut spdk_bdev_desc);
    pub fn spdk_bdev_desc_get_bdev(desc: *mut spdk_bdev_desc) -> *mut spdk_bdev;
    pub fn spdk_bdev_get_block_size(bdev: *const spdk_bdev) -> u32;
    pub fn spdk_bdev_get_num_blocks(bdev: *const spdk_bdev) -> u64;
    pub fn spdk_bdev_get_buf_align(bdev: *const spdk_bdev) -> usize;
    pub fn spdk_bdev_get_optimal_io_boundary(bdev: *const spdk_bdev) -> u32;
    pub fn spdk_bdev_io_type_supported(bdev: *mut spdk_bdev, io_type: c_int) -> bool;
    pub fn spdk_bdev_get_io_channel(desc: *mut spdk_bdev_desc) -> *mut spdk_io_channel;
    pub fn spdk_put_io_channel(ch: *mut spdk_io_channel);
    pub fn spdk_bdev_free_io(bdev_io: *mut spdk_bdev_io);

    pub fn spdk_bdev_read(
        desc: *mut spdk_bdev_desc,
        ch: *mut spdk_io_channel,
        buf: *mut c_void,
        offset: u64,
        nbytes: u64,
        cb: spdk_bdev_io_completion_cb,
        cb_arg: *mut c_void,
    ) -> c_int;
    pub fn spdk_bdev_write(
        desc: *mut spdk_bdev_desc,
        ch: *mut spdk_io_channel,
        buf: *mut c_void,
        offset: u64,
        nbytes: u64,
        cb: spdk_bdev_io_completion_cb,
        cb_arg: *mut c_void,
    ) -> c_int;
    pub fn spdk_bdev_flush(
        desc: *mut spdk_bdev_desc,
        ch: *mut spdk_io_channel,
        offset: u64,
        length: u64,
        cb: spdk_bdev_io_completion_cb,
        cb_arg: *mut c_void,
    ) -> c_int;
    pub fn spdk_bdev_write_zeroes(
        desc: *mut spdk_bdev_desc,
        ch: *mut spdk_io_channel,
        offset: u64,
        len: u64,
        cb: spdk_bdev_io_completion_cb,
        cb_arg: *mut c_void,
    ) -> c_int;
    pub fn spdk_bdev_unmap(
        desc: *mut spdk_bdev_desc,
        ch: *mut spdk_io_channel,
        offset: u64,
        nbytes: u64,
        cb: spdk_bdev_io_completion_cb,
        cb_arg: *mut c_void,
    ) -> c_int;
}
