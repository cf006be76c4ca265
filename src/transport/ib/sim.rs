//! A simulated RDMA fabric in host memory, for tests: devices, memory regions checked by key and range,
//! reliable-connected queue pairs whose writes are executed (real memory copies) when their completion
//! queue is polled, and injectable failures.
//!
//! Memory registered with it must be live host memory of this process for as long as the region exists.

use super::verbs::{
    Completion, LinkLayer, MemoryRegion, PortInfo, QpEndpoint, QueuePair, RdmaWrite, VerbsDevice, VerbsLibrary,
    WC_LOC_PROT_ERR, WC_REM_ACCESS_ERR, WC_SUCCESS, WC_WR_FLUSH_ERR,
};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Failures the fabric can be told to produce.
#[derive(Clone, Debug)]
pub struct Faults {
    /// The write with this fabric-wide index (0-based, in execution order) completes with this status.
    pub fail_write: Option<(u64, u32)>,
    /// Connecting a queue pair (RTR) finds the peer unreachable.
    pub unreachable: bool,
    /// Writes are never executed (a peer that stopped answering).
    pub stall: bool,
    /// Writes executed per poll of a completion queue.
    pub execute_per_poll: usize,
    /// Ports report themselves down.
    pub port_down: bool,
    /// Queue pairs carry no inline data (as some providers).
    pub no_inline: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            fail_write: None,
            unreachable: false,
            stall: false,
            execute_per_poll: usize::MAX,
            port_down: false,
            no_inline: false,
        }
    }
}

/// A write as the fabric executed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Executed {
    pub qpn: u32,
    pub remote_addr: u64,
    pub len: u32,
    pub status: u32,
}

/// Remote keys differ from local keys, so that mixing them up fails.
const RKEY_MASK: u32 = 0x5a5a_0000;

struct Region {
    device: String,
    addr: u64,
    len: u64,
}

#[derive(Default)]
struct Fabric {
    devices: Vec<String>,
    regions: HashMap<u32, Region>,
    /// Queue pairs by number: their device and whether they are still alive.
    qps: HashMap<u32, String>,
    next_key: u32,
    next_qpn: u32,
    faults: Faults,
    executed_count: u64,
    log: Vec<Executed>,
    /// Protocol violations by the user of the fabric (an overrun queue); tests assert there are none.
    violations: Vec<String>,
    /// The most writes ever outstanding on one queue pair.
    max_outstanding: usize,
}

/// The fabric; clones share it.
#[derive(Clone, Default)]
pub struct SimFabric {
    inner: Arc<Mutex<Fabric>>,
}

impl SimFabric {
    pub fn new(devices: &[&str]) -> SimFabric {
        let f = SimFabric::default();
        {
            let mut st = f.inner.lock();
            st.devices = devices.iter().map(|s| s.to_string()).collect();
            st.next_key = 0x100;
            st.next_qpn = 0x40;
        }
        f
    }
    pub fn set_faults(&self, faults: Faults) {
        self.inner.lock().faults = faults;
    }
    pub fn log(&self) -> Vec<Executed> {
        self.inner.lock().log.clone()
    }
    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().violations.clone()
    }
    pub fn max_outstanding(&self) -> usize {
        self.inner.lock().max_outstanding
    }
    pub fn region_count(&self) -> usize {
        self.inner.lock().regions.len()
    }

    fn lid_of(devices: &[String], device: &str) -> u16 {
        devices.iter().position(|d| d == device).map_or(0, |i| i as u16 + 1)
    }
}

impl VerbsLibrary for SimFabric {
    fn device_names(&self) -> Result<Vec<String>> {
        Ok(self.inner.lock().devices.clone())
    }
    fn open(&self, name: &str) -> Result<Arc<dyn VerbsDevice>> {
        let names = self.device_names()?;
        if !names.iter().any(|n| n == name) {
            return Err(super::real::not_found(name, &names));
        }
        Ok(Arc::new(SimDevice {
            fabric: self.clone(),
            name: name.to_string(),
        }))
    }
}

struct SimDevice {
    fabric: SimFabric,
    name: String,
}

impl VerbsDevice for SimDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn port(&self, port: u8, gid_index: i32) -> Result<PortInfo> {
        if port != 1 {
            return Err(Error::invalid_argument(format!(
                "port {port} of InfiniBand device \"{}\" cannot be queried (MSCCLPP_IB_PORT): no such port",
                self.name
            )));
        }
        let st = self.fabric.inner.lock();
        let lid = SimFabric::lid_of(&st.devices, &self.name);
        Ok(PortInfo {
            active: !st.faults.port_down,
            lid,
            mtu: 5,
            link_layer: LinkLayer::InfiniBand,
            gid: if gid_index >= 0 { [lid as u8; 16] } else { [0; 16] },
        })
    }
    fn register(&self, addr: u64, len: u64) -> Result<Box<dyn MemoryRegion>> {
        if addr == 0 || len == 0 {
            return Err(Error::system(format!(
                "ibv_reg_mr of {len} bytes at {addr:#x}: invalid range"
            )));
        }
        let mut st = self.fabric.inner.lock();
        let key = st.next_key;
        st.next_key += 1;
        st.regions.insert(
            key,
            Region {
                device: self.name.clone(),
                addr,
                len,
            },
        );
        Ok(Box::new(SimRegion {
            fabric: self.fabric.clone(),
            key,
            addr,
            len,
        }))
    }
    fn create_qp(&self, port: u8, send_depth: u32, cq_size: u32) -> Result<Box<dyn QueuePair>> {
        if send_depth == 0 || cq_size == 0 {
            return Err(Error::system("ibv_create_qp: zero-sized queue"));
        }
        let mut st = self.fabric.inner.lock();
        let qpn = st.next_qpn;
        st.next_qpn += 1;
        st.qps.insert(qpn, self.name.clone());
        Ok(Box::new(SimQp {
            max_inline: if st.faults.no_inline { 0 } else { 64 },
            fabric: self.fabric.clone(),
            device: self.name.clone(),
            port,
            qpn,
            sq_cap: send_depth as usize,
            cq_cap: cq_size as usize,
            connected: false,
            remote_device: None,
            errored: false,
            sq: VecDeque::new(),
            cq: VecDeque::new(),
            occupied: 0,
        }))
    }
}

struct SimRegion {
    fabric: SimFabric,
    key: u32,
    addr: u64,
    len: u64,
}

impl MemoryRegion for SimRegion {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn size(&self) -> u64 {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key ^ RKEY_MASK
    }
    fn raw(&self) -> usize {
        0
    }
}

impl Drop for SimRegion {
    fn drop(&mut self) {
        self.fabric.inner.lock().regions.remove(&self.key);
    }
}

struct SimQp {
    fabric: SimFabric,
    device: String,
    port: u8,
    qpn: u32,
    sq_cap: usize,
    cq_cap: usize,
    /// Inline bytes a work request may carry.
    max_inline: u32,
    connected: bool,
    /// The device of the peer queue pair, once connected.
    remote_device: Option<String>,
    errored: bool,
    /// Posted, not yet executed; with the number of send-queue slots its completion frees.
    sq: VecDeque<(RdmaWrite, usize)>,
    /// Executed, not yet polled: the completion and the slots it frees.
    cq: VecDeque<(Completion, usize)>,
    /// Send-queue slots in use (posted and not yet retired by a polled completion).
    occupied: usize,
}

impl SimQp {
    /// Executes one posted write; returns its completion if one is generated.
    fn execute(&mut self, st: &mut Fabric, w: &RdmaWrite) -> Option<Completion> {
        let index = st.executed_count;
        st.executed_count += 1;
        let status = if self.errored {
            WC_WR_FLUSH_ERR
        } else if let Some((_, status)) = st.faults.fail_write.filter(|&(n, _)| n == index) {
            status
        } else if w.inline_value.is_none()
            && !st.regions.get(&w.lkey).is_some_and(|r| {
                r.device == self.device && w.local_addr >= r.addr && w.local_addr + w.len as u64 <= r.addr + r.len
            })
        {
            WC_LOC_PROT_ERR
        } else if !st.regions.get(&(w.rkey ^ RKEY_MASK)).is_some_and(|r| {
            Some(&r.device) == self.remote_device.as_ref()
                && w.remote_addr >= r.addr
                && w.remote_addr + w.len as u64 <= r.addr + r.len
        }) {
            WC_REM_ACCESS_ERR
        } else {
            // The bytes of an inline write were taken when it was posted.
            let value = w.inline_value.unwrap_or(0);
            let src = match w.inline_value {
                Some(_) => &value as *const u64 as *const u8,
                None => w.local_addr as *const u8,
            };
            // SAFETY: both ranges lie inside registered regions (or the source is `value`, and `len` is
            // 8), which the tests keep alive while registered (see the module docs); `copy` allows overlap.
            unsafe { std::ptr::copy(src, w.remote_addr as *mut u8, w.len as usize) };
            WC_SUCCESS
        };
        st.log.push(Executed {
            qpn: self.qpn,
            remote_addr: w.remote_addr,
            len: w.len,
            status,
        });
        if status != WC_SUCCESS {
            self.errored = true;
        }
        // Errors always complete; successes only when signaled.
        (status != WC_SUCCESS || w.signaled).then_some(Completion {
            wr_id: w.wr_id,
            status,
            vendor_err: if status == WC_SUCCESS { 0 } else { 0x81 },
        })
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        self.fabric.inner.lock().qps.remove(&self.qpn);
    }
}

impl QueuePair for SimQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }
    fn send_depth(&self) -> u32 {
        self.sq_cap as u32
    }
    fn cq_size(&self) -> u32 {
        self.cq_cap as u32
    }
    fn connect(&mut self, local: &QpEndpoint, remote: &QpEndpoint) -> Result<()> {
        let st = self.fabric.inner.lock();
        if local.port != self.port {
            return Err(Error::internal("endpoint port differs from the queue pair's"));
        }
        let peer = st
            .qps
            .get(&remote.qpn)
            .filter(|dev| !st.faults.unreachable && SimFabric::lid_of(&st.devices, dev) == remote.lid);
        let Some(peer) = peer else {
            return Err(Error::remote(format!(
                "moving queue pair {} on \"{}\" to RTR failed: peer queue pair {} at LID {} is unreachable",
                self.qpn, self.device, remote.qpn, remote.lid
            )));
        };
        self.remote_device = Some(peer.clone());
        self.connected = true;
        Ok(())
    }
    fn max_inline(&self) -> u32 {
        self.max_inline
    }
    fn post_write(&mut self, w: &RdmaWrite) -> Result<()> {
        if !self.connected {
            return Err(Error::system("ibv_post_send: the queue pair is not in RTS"));
        }
        if w.inline_value.is_some() && (w.len != 8 || self.max_inline < 8) {
            return Err(Error::system("ibv_post_send: Invalid argument (inline data)"));
        }
        let mut st = self.fabric.inner.lock();
        if self.occupied >= self.sq_cap {
            st.violations
                .push(format!("send queue of QP {} overrun ({} slots)", self.qpn, self.sq_cap));
            return Err(Error::system("ibv_post_send: Cannot allocate memory (send queue full)"));
        }
        self.occupied += 1;
        st.max_outstanding = st.max_outstanding.max(self.occupied);
        // An unsignaled write's slot is retired by the next signaled completion.
        let frees = if w.signaled {
            1 + self.sq.iter().rev().take_while(|(x, _)| !x.signaled).count()
        } else {
            0
        };
        self.sq.push_back((*w, frees));
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let fabric = self.fabric.clone();
        let mut st = fabric.inner.lock();
        let budget = if st.faults.stall && !self.errored {
            0
        } else {
            st.faults.execute_per_poll
        };
        let mut executed = 0;
        while executed < budget {
            let Some((w, frees)) = self.sq.pop_front() else { break };
            executed += 1;
            if let Some(c) = self.execute(&mut st, &w) {
                if self.cq.len() >= self.cq_cap {
                    st.violations.push(format!(
                        "completion queue of QP {} overrun ({} entries)",
                        self.qpn, self.cq_cap
                    ));
                }
                self.cq.push_back((c, frees.max(1)));
            }
        }
        let mut n = 0;
        while n < max {
            let Some((c, frees)) = self.cq.pop_front() else { break };
            self.occupied = self.occupied.saturating_sub(frees);
            out.push(c);
            n += 1;
        }
        Ok(n)
    }
}
