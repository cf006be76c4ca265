//! The verbs interface over the system's libibverbs (see `sys` for the bindings).

use super::sys::{self, Library};
use super::verbs::{
    Completion, LinkLayer, MemoryRegion, PortInfo, QpEndpoint, QueuePair, RdmaWrite, VerbsDevice, VerbsLibrary,
};
use crate::error::{Error, Result};
use std::ffi::{CStr, c_int};
use std::sync::Arc;

fn errno_string(rc: c_int) -> String {
    std::io::Error::from_raw_os_error(rc.abs()).to_string()
}

fn last_errno() -> String {
    std::io::Error::last_os_error().to_string()
}

/// libibverbs, loaded from `MSCCLPP_IBV_SO` or `libibverbs.so.1`.
pub struct RealLibrary {
    lib: Arc<Library>,
}

impl RealLibrary {
    pub fn load(name: &str) -> Result<RealLibrary> {
        Ok(RealLibrary {
            lib: Arc::new(Library::load(name)?),
        })
    }

    /// Runs `f` over the device list, freeing it afterwards.
    fn with_devices<T>(&self, f: impl FnOnce(&[*mut sys::ibv_device]) -> Result<T>) -> Result<T> {
        let mut n: c_int = 0;
        // SAFETY: out-pointer to a local.
        let list = unsafe { (self.lib.fns.get_device_list)(&mut n) };
        if list.is_null() {
            // No kernel support or no devices: treat as an empty list, but keep the reason for the log.
            log::info!("ibv_get_device_list found no RDMA devices: {}", last_errno());
            return f(&[]);
        }
        // SAFETY: libibverbs returned an array of `n` device pointers.
        let devices = unsafe { std::slice::from_raw_parts(list, n.max(0) as usize) };
        let r = f(devices);
        // SAFETY: the list came from ibv_get_device_list and is freed once; opened contexts stay valid.
        unsafe { (self.lib.fns.free_device_list)(list) };
        r
    }

    fn device_name(&self, d: *mut sys::ibv_device) -> String {
        // SAFETY: a device from the live list; the name is a NUL-terminated string inside it.
        let p = unsafe { (self.lib.fns.get_device_name)(d) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null and NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl VerbsLibrary for RealLibrary {
    fn device_names(&self) -> Result<Vec<String>> {
        self.with_devices(|devs| Ok(devs.iter().map(|&d| self.device_name(d)).collect()))
    }

    fn open(&self, name: &str) -> Result<Arc<dyn VerbsDevice>> {
        let ctx = self.with_devices(|devs| {
            let Some(&d) = devs.iter().find(|&&d| self.device_name(d) == name) else {
                let names: Vec<String> = devs.iter().map(|&d| self.device_name(d)).collect();
                return Err(not_found(name, &names));
            };
            // SAFETY: a device of the live list.
            let ctx = unsafe { (self.lib.fns.open_device)(d) };
            if ctx.is_null() {
                return Err(Error::system(format!(
                    "ibv_open_device(\"{name}\") failed: {}",
                    last_errno()
                )));
            }
            Ok(ctx)
        })?;
        // SAFETY: a context we just opened.
        let pd = unsafe { (self.lib.fns.alloc_pd)(ctx) };
        if pd.is_null() {
            let e = last_errno();
            // SAFETY: opened above, closed once.
            unsafe { (self.lib.fns.close_device)(ctx) };
            return Err(Error::system(format!("ibv_alloc_pd on \"{name}\" failed: {e}")));
        }
        Ok(Arc::new(RealDevice {
            inner: Arc::new(DeviceInner {
                lib: self.lib.clone(),
                name: name.to_string(),
                ctx,
                pd,
            }),
        }))
    }
}

/// The error for a device name that is not there.
pub fn not_found(name: &str, names: &[String]) -> Error {
    Error::invalid_argument(format!(
        "InfiniBand device \"{name}\" not found; devices found: {}",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    ))
}

/// A context and protection domain; freed when the last region and queue pair that use them are gone.
struct DeviceInner {
    lib: Arc<Library>,
    name: String,
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
}

// SAFETY: libibverbs objects may be used from any thread (the library locks internally where needed);
// the pointers are freed only in Drop.
unsafe impl Send for DeviceInner {}
// SAFETY: as above.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: allocated in `open`, freed once, after every region and queue pair (they hold an Arc).
        unsafe {
            (self.lib.fns.dealloc_pd)(self.pd);
            (self.lib.fns.close_device)(self.ctx);
        }
    }
}

struct RealDevice {
    inner: Arc<DeviceInner>,
}

impl VerbsDevice for RealDevice {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn port(&self, port: u8, gid_index: i32) -> Result<PortInfo> {
        let d = &self.inner;
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: a live context; `attr` is a zeroed full-size ibv_port_attr, as verbs.h's inline wrapper
        // passes to this compat entry point.
        let rc = unsafe { (d.lib.fns.query_port)(d.ctx, port, &mut attr) };
        if rc != 0 {
            return Err(Error::invalid_argument(format!(
                "port {port} of InfiniBand device \"{}\" cannot be queried (MSCCLPP_IB_PORT): {}",
                d.name,
                errno_string(rc)
            )));
        }
        let mut gid = [0u8; 16];
        if gid_index >= 0 {
            let mut g = sys::ibv_gid::default();
            // SAFETY: a live context and an out-pointer to a local.
            let rc = unsafe { (d.lib.fns.query_gid)(d.ctx, port, gid_index, &mut g) };
            if rc != 0 {
                return Err(Error::invalid_argument(format!(
                    "GID index {gid_index} of port {port} of \"{}\" cannot be read (MSCCLPP_IB_GID_INDEX): {}",
                    d.name,
                    errno_string(rc)
                )));
            }
            gid = g.raw;
        }
        Ok(PortInfo {
            active: attr.state == sys::IBV_PORT_ACTIVE,
            lid: attr.lid,
            mtu: attr.active_mtu as u8,
            link_layer: if attr.link_layer == sys::IBV_LINK_LAYER_ETHERNET {
                LinkLayer::Ethernet
            } else {
                LinkLayer::InfiniBand
            },
            gid,
        })
    }

    fn register(&self, addr: u64, len: u64) -> Result<Box<dyn MemoryRegion>> {
        let d = &self.inner;
        let access = sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ;
        // SAFETY: a live protection domain; the range is the caller's memory, which it keeps alive while
        // the region exists (the region is dropped before the memory is freed).
        let mr = unsafe { (d.lib.fns.reg_mr)(d.pd, addr as *mut _, len as usize, access) };
        if mr.is_null() {
            return Err(Error::system(format!(
                "ibv_reg_mr of {len} bytes at {addr:#x} on \"{}\" failed: {} (GPU memory needs GPUDirect RDMA: \
                 is the nvidia-peermem module loaded?)",
                d.name,
                last_errno()
            )));
        }
        // SAFETY: a region libibverbs just returned.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Box::new(RealRegion {
            device: d.clone(),
            mr,
            addr,
            len,
            lkey,
            rkey,
        }))
    }

    fn create_qp(&self, port: u8, send_depth: u32, cq_size: u32) -> Result<Box<dyn QueuePair>> {
        let d = &self.inner;
        // SAFETY: a live context; no completion channel.
        let cq =
            unsafe { (d.lib.fns.create_cq)(d.ctx, cq_size as c_int, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(Error::system(format!(
                "ibv_create_cq({cq_size} entries) on \"{}\" failed: {} (MSCCLPP_IB_CQ_SIZE)",
                d.name,
                last_errno()
            )));
        }
        // Room for an 8-byte value inline lets flags carry an exact count (`handler`); a provider that
        // offers none gets a queue pair without, whose flags copy the epoch word as the legacy proxy did.
        let mut qp = std::ptr::null_mut();
        let mut cap = sys::ibv_qp_cap::default();
        for max_inline_data in [INLINE_VALUE_BYTES, 0] {
            let mut init = sys::ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq,
                recv_cq: cq,
                srq: std::ptr::null_mut(),
                cap: sys::ibv_qp_cap {
                    max_send_wr: send_depth,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data,
                },
                qp_type: sys::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            // SAFETY: a live protection domain and CQ; `init` is a complete ibv_qp_init_attr.
            qp = unsafe { (d.lib.fns.create_qp)(d.pd, &mut init) };
            if !qp.is_null() {
                // The provider writes back what it granted.
                cap = init.cap;
                break;
            }
        }
        // SAFETY: `cq` is live and read-only here.
        let granted_cqe = unsafe { (*cq).cqe }.max(0) as u32;
        let mut q = RealQp {
            device: d.clone(),
            qp,
            cq,
            send_depth: cap.max_send_wr,
            max_inline: cap.max_inline_data,
            cq_size: granted_cqe,
            port,
            wcs: Vec::new(),
        };
        if qp.is_null() {
            return Err(Error::system(format!(
                "ibv_create_qp (RC, {send_depth} send WRs) on \"{}\" failed: {} (MSCCLPP_IB_QP_DEPTH)",
                d.name,
                last_errno()
            )));
        }
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: (sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ)
                as u32,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS;
        q.modify(&mut attr, mask, "INIT")?;
        Ok(Box::new(q))
    }
}

struct RealRegion {
    device: Arc<DeviceInner>,
    mr: *mut sys::ibv_mr,
    addr: u64,
    len: u64,
    lkey: u32,
    rkey: u32,
}

// SAFETY: see DeviceInner; the region is only read after registration and deregistered in Drop.
unsafe impl Send for RealRegion {}
// SAFETY: as above.
unsafe impl Sync for RealRegion {}

impl MemoryRegion for RealRegion {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn size(&self) -> u64 {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn raw(&self) -> usize {
        self.mr as usize
    }
}

impl Drop for RealRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once; the device outlives it (Arc).
        let rc = unsafe { (self.device.lib.fns.dereg_mr)(self.mr) };
        if rc != 0 {
            log::warn!("ibv_dereg_mr on \"{}\" failed: {}", self.device.name, errno_string(rc));
        }
    }
}

/// Inline bytes asked of each queue pair: one flag value.
const INLINE_VALUE_BYTES: u32 = 8;

struct RealQp {
    device: Arc<DeviceInner>,
    qp: *mut sys::ibv_qp,
    cq: *mut sys::ibv_cq,
    send_depth: u32,
    /// Bytes a work request may carry inline, as granted.
    max_inline: u32,
    cq_size: u32,
    port: u8,
    wcs: Vec<sys::ibv_wc>,
}

// SAFETY: the queue pair is used by one thread at a time (IbQueue's lock); see DeviceInner.
unsafe impl Send for RealQp {}

impl RealQp {
    fn modify(&mut self, attr: &mut sys::ibv_qp_attr, mask: c_int, state: &str) -> Result<()> {
        // SAFETY: a live queue pair and a complete attribute struct.
        let rc = unsafe { (self.device.lib.fns.modify_qp)(self.qp, attr, mask) };
        if rc != 0 {
            return Err(Error::system(format!(
                "moving queue pair {} on \"{}\" to {state} failed: {}",
                self.qp_num(),
                self.device.name,
                errno_string(rc)
            )));
        }
        Ok(())
    }
}

impl QueuePair for RealQp {
    fn qp_num(&self) -> u32 {
        // SAFETY: a live queue pair.
        unsafe { (*self.qp).qp_num }
    }
    fn send_depth(&self) -> u32 {
        self.send_depth
    }
    fn cq_size(&self) -> u32 {
        self.cq_size
    }
    fn max_inline(&self) -> u32 {
        self.max_inline
    }

    fn connect(&mut self, local: &QpEndpoint, remote: &QpEndpoint) -> Result<()> {
        let mut ah = sys::ibv_ah_attr {
            dlid: remote.lid,
            port_num: self.port,
            ..Default::default()
        };
        if local.gid_index >= 0 {
            // RoCE (or routed InfiniBand): address the peer by GID.
            ah.is_global = 1;
            ah.grh.dgid.raw = remote.gid;
            ah.grh.sgid_index = local.gid_index as u8;
            ah.grh.hop_limit = 255;
        }
        let mut rtr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: local.mtu.min(remote.mtu) as u32,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut rtr, mask, "RTR")?;
        let mut rts = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            timeout: 18,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: local.psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut rts, mask, "RTS")
    }

    fn post_write(&mut self, w: &RdmaWrite) -> Result<()> {
        let value = w.inline_value.unwrap_or(0);
        let mut sge = match w.inline_value {
            // The provider copies the bytes into the work request during the post.
            Some(_) => sys::ibv_sge {
                addr: &value as *const u64 as u64,
                length: 8,
                lkey: 0,
            },
            None => sys::ibv_sge {
                addr: w.local_addr,
                length: w.len,
                lkey: w.lkey,
            },
        };
        let inline = if w.inline_value.is_some() {
            sys::IBV_SEND_INLINE
        } else {
            0
        };
        let mut wr = sys::ibv_send_wr {
            wr_id: w.wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: sys::IBV_WR_RDMA_WRITE,
            send_flags: inline | if w.signaled { sys::IBV_SEND_SIGNALED } else { 0 },
            imm_data: 0,
            rdma: sys::ibv_send_wr_rdma {
                remote_addr: w.remote_addr,
                rkey: w.rkey,
                ..Default::default()
            },
            qp_type: 0,
            bind_mw: [0; 6],
        };
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: a live queue pair; `wr` and `sge` live across the call.
        let rc = unsafe { sys::post_send(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::system(format!("ibv_post_send: {}", errno_string(rc))));
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        self.wcs.resize(max, sys::ibv_wc::default());
        // SAFETY: a live CQ and room for `max` entries.
        let n = unsafe { sys::poll_cq(self.cq, max as c_int, self.wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(Error::system(format!("ibv_poll_cq returned {n}")));
        }
        out.extend(self.wcs[..n as usize].iter().map(|wc| Completion {
            wr_id: wc.wr_id,
            status: wc.status,
            vendor_err: wc.vendor_err,
        }));
        Ok(n as usize)
    }
}

impl Drop for RealQp {
    fn drop(&mut self) {
        // SAFETY: created in `create_qp`, destroyed once, the queue pair before its CQ.
        unsafe {
            if !self.qp.is_null() {
                (self.device.lib.fns.destroy_qp)(self.qp);
            }
            (self.device.lib.fns.destroy_cq)(self.cq);
        }
    }
}
