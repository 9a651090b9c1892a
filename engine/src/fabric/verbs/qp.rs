//! Reliable-connected queue pairs: the connection state machine, the
//! 32-byte exchange record each side sends the other, and RDMA READs posted
//! as linked work-request lists (one doorbell) with completions polled by
//! the caller.
//!
//! `QpInfo` (its 32-byte wire format) lives in `ferrite_proto::qp_info`,
//! so that it decodes without the verbs library.

use std::mem::MaybeUninit;
use std::sync::Arc;

use rdma_sys::{
    ibv_access_flags, ibv_cq, ibv_create_cq, ibv_create_qp, ibv_destroy_cq, ibv_destroy_qp,
    ibv_modify_qp, ibv_poll_cq, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask,
    ibv_qp_init_attr, ibv_qp_state, ibv_qp_type, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc,
    ibv_wc_status, ibv_wc_status_str, ibv_wr_opcode,
};

use super::device::Device;
use crate::server::ServerError;

pub use ferrite_proto::qp_info::{QpInfo, QP_INFO_BYTES};

/// Where a queue pair is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    Reset,
    Init,
    /// Ready to receive: knows its peer.
    Rtr,
    /// Ready to send: RDMA READs may be posted.
    Rts,
    /// A work request failed; the queue pair is unusable.
    Error,
}

impl QpState {
    /// The state a connect step moves to from `self`; connecting is
    /// Reset → Init → Rtr → Rts and nothing else.
    pub fn next(self) -> Result<QpState, ServerError> {
        match self {
            QpState::Reset => Ok(QpState::Init),
            QpState::Init => Ok(QpState::Rtr),
            QpState::Rtr => Ok(QpState::Rts),
            s => Err(ServerError::Fabric(format!(
                "queue pair in state {s:?} cannot be connected"
            ))),
        }
    }
}

/// One RDMA READ: `len` bytes at `remote_addr` (rkey) into local memory
/// registered with `lkey`; its completion carries `wr_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadWr {
    pub wr_id: u64,
    pub local_addr: u64,
    pub lkey: u32,
    pub len: u32,
    pub remote_addr: u64,
    pub rkey: u32,
}

/// Work requests posted per doorbell at most.
pub const BATCH_MAX: usize = 16;

/// Local ACK timeout of a requester queue pair: 4.096 µs × 2^14 ≈ 67 ms
/// without an answer before a read is sent again.
pub const ACK_TIMEOUT_EXPONENT: u8 = 14;
/// Times a read is sent again before its completion reports "transport
/// retry counter exceeded" and the queue pair breaks: with
/// [`ACK_TIMEOUT_EXPONENT`], a lost path is reported after about
/// 7 × 67 ms = 0.5 s (the soft-RoCE guest measured 0.5-0.6 s), while a
/// late answer (an emulated CPU stalled for a few hundred ms) still gets
/// through. 7 would mean "retry forever" to soft-RoCE: a read of a killed
/// engine then never completed.
pub const RETRY_COUNT: u8 = 6;

/// The completion of one work request: its `wr_id` and, when it failed,
/// why (the status text and number).
pub type WorkCompletion = (u64, Result<(), String>);

/// A reliable-connected queue pair with its own completion queue.
#[derive(Debug)]
pub struct RcQp {
    device: Arc<Device>,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    state: QpState,
    psn: u32,
    outstanding: usize,
}

// SAFETY: the QP and CQ are used by one thread at a time (&mut self for
// every operation); libibverbs objects may move between threads.
unsafe impl Send for RcQp {}

fn os_error(op: &str) -> ServerError {
    ServerError::Fabric(format!("{op}: {}", std::io::Error::last_os_error()))
}

impl RcQp {
    /// Creates a queue pair in state Reset with room for `depth` reads.
    pub fn create(device: Arc<Device>, depth: u32) -> Result<Self, ServerError> {
        let depth = depth.max(BATCH_MAX as u32);
        // SAFETY: the context is open for the Device's lifetime, which the
        // Arc held here outlives the CQ.
        let cq = unsafe {
            ibv_create_cq(
                device.ctx(),
                depth as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(os_error("ibv_create_cq"));
        }
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = depth;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: pd is valid; init is fully initialised.
        let qp = unsafe { ibv_create_qp(device.pd(), &mut init) };
        if qp.is_null() {
            let e = os_error("ibv_create_qp");
            // SAFETY: cq was created above and is not used by any QP.
            unsafe { ibv_destroy_cq(cq) };
            return Err(e);
        }
        let psn = rand::random::<u32>() & 0xff_ffff;
        Ok(Self {
            device,
            cq,
            qp,
            state: QpState::Reset,
            psn,
            outstanding: 0,
        })
    }

    pub fn state(&self) -> QpState {
        self.state
    }

    /// What the peer needs to connect to this queue pair.
    pub fn local_info(&self) -> QpInfo {
        QpInfo {
            // SAFETY: qp is valid for self's lifetime.
            qpn: unsafe { (*self.qp).qp_num },
            psn: self.psn,
            gid: self.device.gid(),
            lid: self.device.lid(),
            mtu: u8::try_from(self.device.active_mtu().clamp(1, 5)).unwrap_or(1),
        }
    }

    /// Moves Reset → Init → Rtr → Rts towards `remote`. `remote_read`: whether
    /// the peer may RDMA READ memory of this side's protection domain.
    pub fn connect(&mut self, remote: &QpInfo, remote_read: bool) -> Result<(), ServerError> {
        use ibv_qp_attr_mask as m;
        let dev = self.device.clone();
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.port_num = dev.port();
        a.qp_access_flags = match remote_read {
            true => ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
            false => 0,
        };
        self.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
        )?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = dev.active_mtu().min(u32::from(remote.mtu)).max(1);
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = dev.max_rd_atomic();
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.port_num = dev.port();
        a.ah_attr.grh.dgid.raw = remote.gid;
        a.ah_attr.grh.sgid_index = dev.gid_index();
        a.ah_attr.grh.hop_limit = 64;
        let rtr = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, rtr)?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = ACK_TIMEOUT_EXPONENT;
        a.retry_cnt = RETRY_COUNT;
        a.rnr_retry = 7;
        a.sq_psn = self.psn;
        a.max_rd_atomic = dev.max_rd_atomic();
        let rts = m::IBV_QP_STATE
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, rts)
    }

    fn modify(
        &mut self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
    ) -> Result<(), ServerError> {
        let next = self.state.next()?;
        // SAFETY: qp is valid; attr is initialised for the fields in mask.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            self.state = QpState::Error;
            return Err(ServerError::Fabric(format!(
                "failed to modify QP to {next:?}: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        self.state = next;
        Ok(())
    }

    /// Posts `reads` as one linked list (one doorbell); each is signalled.
    /// The local buffers must stay registered and untouched until
    /// [`RcQp::poll_completions`] has returned their completions.
    pub fn post_reads(&mut self, reads: &[ReadWr]) -> Result<(), ServerError> {
        if self.state != QpState::Rts {
            return Err(ServerError::Fabric(format!(
                "RDMA READ on a queue pair in state {:?}",
                self.state
            )));
        }
        if reads.is_empty() || reads.len() > BATCH_MAX {
            return Err(ServerError::Fabric(format!(
                "{} reads in one batch",
                reads.len()
            )));
        }
        // On the stack, and only the entries posted written: this runs
        // once per RDMA READ a GET makes.
        let mut sges = [const { MaybeUninit::<ibv_sge>::uninit() }; BATCH_MAX];
        // Only the entries posted are written (a GET posts one): clearing
        // all BATCH_MAX of them cost more than the read's own setup.
        let mut wrs = [const { MaybeUninit::<ibv_send_wr>::uninit() }; BATCH_MAX];
        for (i, r) in reads.iter().enumerate() {
            let sge = sges[i].write(ibv_sge {
                addr: r.local_addr,
                length: r.len,
                lkey: r.lkey,
            });
            // SAFETY: all-zero is a valid ibv_send_wr (null next and sg_list).
            let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
            w.wr_id = r.wr_id;
            w.sg_list = sge;
            w.num_sge = 1;
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            w.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
            w.wr.rdma.remote_addr = r.remote_addr;
            w.wr.rdma.rkey = r.rkey;
            wrs[i].write(w);
        }
        for i in 1..reads.len() {
            let next = wrs[i].as_mut_ptr();
            // SAFETY: entries 0..reads.len() were written above.
            unsafe { wrs[i - 1].assume_init_mut() }.next = next;
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: qp is in RTS; the list and its SGEs live until the call
        // returns (the provider copies them into the send queue).
        let rc = unsafe { ibv_post_send(self.qp, wrs[0].as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(ServerError::Fabric(format!(
                "ibv_post_send: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        self.outstanding += reads.len();
        Ok(())
    }

    /// Work requests posted and not yet completed.
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Takes what completions the completion queue holds now (at most
    /// [`BATCH_MAX`]) into `out` without waiting; returns how many. A
    /// failed completion moves the queue pair to Error (every later one is
    /// then flushed with an error too).
    pub fn poll_completions(
        &mut self,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize, ServerError> {
        if self.outstanding == 0 {
            return Ok(0);
        }
        // Not cleared: this runs on every empty poll of a waiting read.
        let mut wcs = [const { MaybeUninit::<ibv_wc>::uninit() }; BATCH_MAX];
        // SAFETY: cq is valid; wcs has room for BATCH_MAX entries.
        let n = unsafe { ibv_poll_cq(self.cq, BATCH_MAX as i32, wcs[0].as_mut_ptr()) };
        if n < 0 {
            self.state = QpState::Error;
            return Err(ServerError::Fabric("ibv_poll_cq failed".into()));
        }
        let n = n as usize;
        self.outstanding = self.outstanding.saturating_sub(n);
        for w in &wcs[..n] {
            // SAFETY: ibv_poll_cq wrote the first n entries.
            let w = unsafe { w.assume_init_ref() };
            if w.status == ibv_wc_status::IBV_WC_SUCCESS {
                out.push((w.wr_id, Ok(())));
                continue;
            }
            self.state = QpState::Error;
            // SAFETY: returns a static C string for any status value.
            let what = unsafe { std::ffi::CStr::from_ptr(ibv_wc_status_str(w.status)) };
            let what = format!("{} (status {})", what.to_string_lossy(), w.status);
            out.push((w.wr_id, Err(what)));
        }
        Ok(n)
    }
}

impl Drop for RcQp {
    fn drop(&mut self) {
        // SAFETY: qp then cq, each destroyed once; the Device outlives both.
        unsafe {
            ibv_destroy_qp(self.qp);
            ibv_destroy_cq(self.cq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_steps_run_in_order_only() {
        let mut s = QpState::Reset;
        let mut seen = vec![s];
        for _ in 0..3 {
            s = s.next().unwrap();
            seen.push(s);
        }
        assert_eq!(
            seen,
            [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts]
        );
        assert!(QpState::Rts.next().is_err(), "already connected");
        assert!(QpState::Error.next().is_err(), "broken queue pair");
    }
}
