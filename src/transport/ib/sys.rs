//! Minimal bindings to libibverbs, loaded with `dlopen` at run time.
//!
//! The structs are the prefixes (or the whole, where we allocate them) of rdma-core's
//! `infiniband/verbs.h`, field for field; the tests check their sizes and offsets against the values
//! that header gives on x86-64. `ibv_post_send` and `ibv_poll_cq` are inline functions in that header
//! which call through `context->ops`; `post_send` and `poll_cq` below do the same.
#![allow(non_camel_case_types)]

use crate::dynlib;
use crate::error::{Error, Result};
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};

pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_SEND_SIGNALED: c_uint = 2;
pub const IBV_SEND_INLINE: c_uint = 8;
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
pub const IBV_PORT_ACTIVE: c_uint = 4;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

/// Opaque: only ever handled by pointer.
#[repr(C)]
pub struct ibv_device {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ibv_pd {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ibv_comp_channel {
    _private: [u8; 0],
}

pub type PollCqFn = unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers, of which we call two.
#[repr(C)]
pub struct ibv_context_ops {
    _before_poll_cq: [usize; 11],
    pub poll_cq: Option<PollCqFn>,
    _before_post_send: [usize; 13],
    pub post_send: Option<PostSendFn>,
    _after: [usize; 6],
}

/// The prefix of `struct ibv_context` up to `ops`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
}

/// The prefix of `struct ibv_cq` we read.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
}

/// The prefix of `struct ibv_qp` we read.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `union ibv_gid` (16 raw bytes, 8-byte aligned for its 64-bit view).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_port_attr` in full; the exported `ibv_query_port` fills all but `port_cap_flags2`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of the `wr` union; the union is 32 bytes (its largest member is `wr.atomic`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
    pub _pad: [u32; 5],
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub rdma: ibv_send_wr_rdma,
    /// The `qp_type` union (4 bytes, padded to 8).
    pub qp_type: u64,
    /// The `bind_mw`/`tso` union (48 bytes).
    pub bind_mw: [u64; 6],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

pub type GetDeviceListFn = unsafe extern "C" fn(num: *mut c_int) -> *mut *mut ibv_device;
pub type FreeDeviceListFn = unsafe extern "C" fn(list: *mut *mut ibv_device);
pub type GetDeviceNameFn = unsafe extern "C" fn(dev: *mut ibv_device) -> *const c_char;
pub type OpenDeviceFn = unsafe extern "C" fn(dev: *mut ibv_device) -> *mut ibv_context;
pub type CloseDeviceFn = unsafe extern "C" fn(ctx: *mut ibv_context) -> c_int;
pub type AllocPdFn = unsafe extern "C" fn(ctx: *mut ibv_context) -> *mut ibv_pd;
pub type DeallocPdFn = unsafe extern "C" fn(pd: *mut ibv_pd) -> c_int;
pub type RegMrFn = unsafe extern "C" fn(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr;
pub type DeregMrFn = unsafe extern "C" fn(mr: *mut ibv_mr) -> c_int;
pub type CreateCqFn = unsafe extern "C" fn(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq;
pub type DestroyCqFn = unsafe extern "C" fn(cq: *mut ibv_cq) -> c_int;
pub type CreateQpFn = unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
pub type DestroyQpFn = unsafe extern "C" fn(qp: *mut ibv_qp) -> c_int;
pub type ModifyQpFn = unsafe extern "C" fn(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
pub type QueryPortFn = unsafe extern "C" fn(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int;
pub type QueryGidFn = unsafe extern "C" fn(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int;

/// The libibverbs functions we use (all exported symbols of `libibverbs.so.1`).
pub struct Functions {
    pub get_device_list: GetDeviceListFn,
    pub free_device_list: FreeDeviceListFn,
    pub get_device_name: GetDeviceNameFn,
    pub open_device: OpenDeviceFn,
    pub close_device: CloseDeviceFn,
    pub alloc_pd: AllocPdFn,
    pub dealloc_pd: DeallocPdFn,
    pub reg_mr: RegMrFn,
    pub dereg_mr: DeregMrFn,
    pub create_cq: CreateCqFn,
    pub destroy_cq: DestroyCqFn,
    pub create_qp: CreateQpFn,
    pub destroy_qp: DestroyQpFn,
    pub modify_qp: ModifyQpFn,
    /// The compat entry point: it fills the fields of `ibv_port_attr` up to `flags`, which is all we read.
    pub query_port: QueryPortFn,
    pub query_gid: QueryGidFn,
}

/// A loaded libibverbs. Never unloaded: verbs objects may outlive any one owner of the handle.
pub struct Library {
    pub fns: Functions,
}

impl Library {
    /// Loads `name` (a file name searched like any shared library, or a path).
    pub fn load(name: &str) -> Result<Library> {
        let cname = CString::new(name)
            .map_err(|_| Error::invalid_argument(format!("MSCCLPP_IBV_SO \"{name}\" contains a NUL byte")))?;
        // RTLD_NOW resolves everything up front so that failures show here.
        let handle = dynlib::open(&cname, libc::RTLD_NOW | libc::RTLD_LOCAL).map_err(|e| {
            Error::system(format!(
                "cannot load the InfiniBand verbs library \"{name}\" ({e}); install libibverbs (rdma-core) or \
                 point MSCCLPP_IBV_SO at it"
            ))
        })?;
        let sym = |s: &CStr| -> Result<*mut c_void> {
            // SAFETY: the handle `open` just returned, never closed while this runs.
            unsafe { dynlib::symbol(handle, s) }.map_err(|e| {
                Error::system(format!(
                    "\"{name}\" is not a usable libibverbs: symbol {} is missing ({e})",
                    s.to_string_lossy()
                ))
            })
        };
        macro_rules! f {
            ($s:literal, $t:ty) => {
                // SAFETY: the symbol is libibverbs' exported function of that name, whose C signature the
                // type restates from verbs.h.
                unsafe { std::mem::transmute::<*mut c_void, $t>(sym($s)?) }
            };
        }
        let fns = Functions {
            get_device_list: f!(c"ibv_get_device_list", GetDeviceListFn),
            free_device_list: f!(c"ibv_free_device_list", FreeDeviceListFn),
            get_device_name: f!(c"ibv_get_device_name", GetDeviceNameFn),
            open_device: f!(c"ibv_open_device", OpenDeviceFn),
            close_device: f!(c"ibv_close_device", CloseDeviceFn),
            alloc_pd: f!(c"ibv_alloc_pd", AllocPdFn),
            dealloc_pd: f!(c"ibv_dealloc_pd", DeallocPdFn),
            reg_mr: f!(c"ibv_reg_mr", RegMrFn),
            dereg_mr: f!(c"ibv_dereg_mr", DeregMrFn),
            create_cq: f!(c"ibv_create_cq", CreateCqFn),
            destroy_cq: f!(c"ibv_destroy_cq", DestroyCqFn),
            create_qp: f!(c"ibv_create_qp", CreateQpFn),
            destroy_qp: f!(c"ibv_destroy_qp", DestroyQpFn),
            modify_qp: f!(c"ibv_modify_qp", ModifyQpFn),
            query_port: f!(c"ibv_query_port", QueryPortFn),
            query_gid: f!(c"ibv_query_gid", QueryGidFn),
        };
        Ok(Library { fns })
    }
}

/// `ibv_post_send`, as verbs.h defines it inline.
///
/// # Safety
/// `qp` is a live queue pair; `wr` and the scatter list it points at are valid for the call.
pub unsafe fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    // SAFETY: the caller's promise; the provider fills `ops` when it opens the context.
    unsafe {
        match (*(*qp).context).ops.post_send {
            Some(f) => f(qp, wr, bad_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_poll_cq`, as verbs.h defines it inline.
///
/// # Safety
/// `cq` is a live completion queue; `wc` has room for `num` entries.
pub unsafe fn poll_cq(cq: *mut ibv_cq, num: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's promise; the provider fills `ops` when it opens the context.
    unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(f) => f(cq, num, wc),
            None => -libc::EOPNOTSUPP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// Sizes and offsets as rdma-core's verbs.h lays them out on x86-64 (measured with a C compiler).
    #[test]
    fn layouts_match_verbs_h() {
        assert_eq!(size_of::<ibv_context_ops>(), 256);
        assert_eq!(offset_of!(ibv_context, ops), 8);
        assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
        assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
        assert_eq!(size_of::<ibv_mr>(), 48);
        assert_eq!(
            (
                offset_of!(ibv_mr, addr),
                offset_of!(ibv_mr, length),
                offset_of!(ibv_mr, lkey),
                offset_of!(ibv_mr, rkey)
            ),
            (16, 24, 36, 40)
        );
        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!((size_of::<ibv_send_wr>(), align_of::<ibv_send_wr>()), (128, 8));
        assert_eq!(offset_of!(ibv_send_wr, num_sge), 24);
        assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
        assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
        assert_eq!(offset_of!(ibv_send_wr, rdma), 40);
        assert_eq!(offset_of!(ibv_send_wr, rdma) + offset_of!(ibv_send_wr_rdma, rkey), 48);
        assert_eq!(offset_of!(ibv_send_wr, qp_type), 72);
        assert_eq!(offset_of!(ibv_send_wr, bind_mw), 80);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(
            (
                offset_of!(ibv_wc, status),
                offset_of!(ibv_wc, vendor_err),
                offset_of!(ibv_wc, qp_num)
            ),
            (8, 16, 28)
        );
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(
            (
                offset_of!(ibv_qp_init_attr, cap),
                offset_of!(ibv_qp_init_attr, qp_type),
                offset_of!(ibv_qp_init_attr, sq_sig_all)
            ),
            (32, 52, 56)
        );
        assert_eq!(size_of::<ibv_qp_cap>(), 20);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(
            (
                offset_of!(ibv_qp_attr, qp_access_flags),
                offset_of!(ibv_qp_attr, cap),
                offset_of!(ibv_qp_attr, ah_attr),
                offset_of!(ibv_qp_attr, alt_ah_attr),
                offset_of!(ibv_qp_attr, pkey_index),
                offset_of!(ibv_qp_attr, max_rd_atomic),
                offset_of!(ibv_qp_attr, port_num),
                offset_of!(ibv_qp_attr, rate_limit)
            ),
            (32, 36, 56, 88, 120, 126, 129, 136)
        );
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(
            (offset_of!(ibv_ah_attr, dlid), offset_of!(ibv_ah_attr, port_num)),
            (24, 30)
        );
        assert_eq!(size_of::<ibv_global_route>(), 24);
        assert_eq!(offset_of!(ibv_global_route, flow_label), 16);
        assert_eq!((size_of::<ibv_gid>(), align_of::<ibv_gid>()), (16, 8));
        assert_eq!(size_of::<ibv_port_attr>(), 52);
        assert_eq!(
            (
                offset_of!(ibv_port_attr, active_mtu),
                offset_of!(ibv_port_attr, lid),
                offset_of!(ibv_port_attr, link_layer),
                offset_of!(ibv_port_attr, port_cap_flags2)
            ),
            (8, 34, 46, 48)
        );
    }
}
