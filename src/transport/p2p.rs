//! The P2P transport: kernels' triggers carried out by the copy engine, between GPUs of one machine.
//!
//! Data is a copy from our buffer into the peer's (mapped with CUDA IPC); Flag is an 8-byte copy of our
//! `device` epoch into the peer's `proxy` epoch on the same stream, so it lands after the data of the
//! triggers before it; Sync waits for the stream to drain.

use crate::error::{Error, Result};
use crate::gpu::{DevicePtr, GpuContext, PinnedHostBuffer, Stream};
use crate::proxy::{TailPublisher, Trigger, TriggerHandler};

/// What the proxy needs of one connection; `None` in the plan for connections it does not serve.
#[derive(Clone, Copy, Debug)]
pub struct P2pRoute {
    pub local_buff: DevicePtr,
    pub local_size: u64,
    pub remote_buff: DevicePtr,
    pub remote_size: u64,
    /// Our `mscclppDevConnSignalEpochId` (its `device` word is the first).
    pub local_epochs: DevicePtr,
    /// The peer's `mscclppDevConnSignalEpochId` (its `proxy` word is at +8).
    pub remote_epochs: DevicePtr,
}

/// Checks a trigger's ranges against its connection's buffers.
pub fn check_ranges(t: &Trigger, route: &P2pRoute) -> Result<()> {
    let size = t.data_size as u64;
    if t.src_offset as u64 + size > route.local_size {
        return Err(Error::invalid_usage(format!(
            "source range +{}..+{} is past the end of the local buffer ({} bytes)",
            t.src_offset,
            t.src_offset as u64 + size,
            route.local_size
        )));
    }
    if t.dst_offset as u64 + size > route.remote_size {
        return Err(Error::invalid_usage(format!(
            "destination range +{}..+{} is past the end of the peer's buffer ({} bytes)",
            t.dst_offset,
            t.dst_offset as u64 + size,
            route.remote_size
        )));
    }
    Ok(())
}

/// Looks up the route of a trigger's connection.
pub fn route_of<'a>(routes: &'a [Option<P2pRoute>], t: &Trigger) -> Result<&'a P2pRoute> {
    routes.get(t.conn_id as usize).and_then(|r| r.as_ref()).ok_or_else(|| {
        Error::invalid_usage(format!(
            "connection id {} is not a P2P connection of this communicator",
            t.conn_id
        ))
    })
}

pub struct P2pHandler {
    pub routes: Vec<Option<P2pRoute>>,
    pub stream: Stream,
}

impl TriggerHandler for P2pHandler {
    fn handle(&mut self, t: &Trigger) -> Result<()> {
        let route = *route_of(&self.routes, t)?;
        if t.has_data() {
            match check_ranges(t, &route) {
                Ok(()) => self.stream.copy(
                    route.remote_buff + t.dst_offset as u64,
                    route.local_buff + t.src_offset as u64,
                    t.data_size as usize,
                )?,
                Err(e) if t.has_flag() => {
                    // Drop the data but still raise the flag: the device counted this signal, and a
                    // missing flag would leave the peer waiting forever.
                    log::error!("dropped the data of {t:?}: {e}");
                    self.stream.copy(route.remote_epochs + 8, route.local_epochs, 8)?;
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        if t.has_flag() {
            self.stream.copy(route.remote_epochs + 8, route.local_epochs, 8)?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.stream.spin_until_idle()
    }
}

/// Publishes the tail into the device's copy with a stream write (no copy engine involved), or, where
/// the device cannot do stream memory operations, with an 8-byte copy from pinned memory.
pub struct P2pTailPublisher {
    pub stream: Stream,
    pub device_tail: DevicePtr,
    pub staging: Option<PinnedHostBuffer>,
}

impl TailPublisher for P2pTailPublisher {
    fn publish(&mut self, tail: u64) -> Result<()> {
        match &self.staging {
            None => self.stream.write_u64(self.device_tail, tail),
            Some(buf) => {
                // SAFETY: an aligned u64 in pinned memory we own; the DMA may read it at any time,
                // and tails only grow, so a later value is as good as this one.
                unsafe { std::ptr::write_volatile(buf.host_ptr().cast::<u64>(), tail) };
                self.stream.copy(self.device_tail, buf.device_ptr(), 8)
            }
        }
    }
}

impl P2pTailPublisher {
    pub fn new(ctx: &GpuContext, device_tail: DevicePtr) -> Result<P2pTailPublisher> {
        let mem_ops =
            ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)?;
        let staging = if mem_ops == 0 {
            Some(PinnedHostBuffer::zeroed(ctx, 64)?)
        } else {
            None
        };
        Ok(P2pTailPublisher {
            stream: Stream::new(ctx)?,
            device_tail,
            staging,
        })
    }
}

/// Binds the calling thread to the CPUs of the GPU's NUMA node, if the machine says which that is.
/// Best effort: GPUs that report no node (-1) are common, and are not an error.
pub fn bind_to_gpu_numa_node(ctx: &GpuContext) {
    match numa_cpus(ctx) {
        Ok(Some(cpus)) => {
            // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds for ids < CPU_SETSIZE.
            let rc = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                for c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
                    libc::CPU_SET(*c, &mut set);
                }
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
            };
            if rc != 0 {
                log::info!(
                    "could not bind the proxy to its GPU's NUMA node: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
        Ok(None) => log::info!("GPU {} reports no NUMA node; the proxy thread is not bound", ctx.device),
        Err(e) => log::info!("NUMA binding skipped: {e}"),
    }
}

fn numa_cpus(ctx: &GpuContext) -> Result<Option<Vec<usize>>> {
    let mut bus = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer is valid for its length.
    crate::gpu::check(
        unsafe { cudarc::driver::sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, ctx.device) },
        || "cuDeviceGetPCIBusId".into(),
    )?;
    // SAFETY: the driver wrote a NUL-terminated string.
    let bus = unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }
        .to_string_lossy()
        .to_lowercase();
    let node_path = format!("/sys/bus/pci/devices/{bus}/numa_node");
    let node: i64 = std::fs::read_to_string(&node_path)
        .map_err(|e| Error::io(&node_path, e))?
        .trim()
        .parse()
        .map_err(|_| Error::system(format!("{node_path} is not a number")))?;
    if node < 0 {
        return Ok(None);
    }
    let list_path = format!("/sys/devices/system/node/node{node}/cpulist");
    let list = std::fs::read_to_string(&list_path).map_err(|e| Error::io(&list_path, e))?;
    Ok(Some(parse_cpu_list(&list)))
}

/// Parses a kernel CPU list such as `0-3,8,10-11`.
pub fn parse_cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.splitn(2, '-').map(|x| x.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => cpus.push(a),
            (Some(Ok(a)), Some(Ok(b))) if a <= b => cpus.extend(a..=b),
            _ => {}
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> P2pRoute {
        P2pRoute {
            local_buff: 0x1000,
            local_size: 100,
            remote_buff: 0x9000,
            remote_size: 50,
            local_epochs: 0,
            remote_epochs: 0,
        }
    }

    #[test]
    fn ranges_are_checked_against_both_buffers() {
        let t = |src, dst, size| Trigger {
            data_size: size,
            src_offset: src,
            dst_offset: dst,
            conn_id: 0,
            kind: 1,
        };
        assert!(check_ranges(&t(0, 0, 50), &route()).is_ok());
        assert!(check_ranges(&t(50, 0, 50), &route()).is_ok());
        assert!(
            check_ranges(&t(51, 0, 50), &route())
                .unwrap_err()
                .message
                .contains("local buffer")
        );
        assert!(
            check_ranges(&t(0, 1, 50), &route())
                .unwrap_err()
                .message
                .contains("peer's buffer")
        );
        assert!(
            check_ranges(&t(u32::MAX, 0, u32::MAX), &route()).is_err(),
            "no overflow"
        );
    }

    #[test]
    fn unknown_connections_are_rejected() {
        let routes = vec![Some(route()), None];
        let t = |c| Trigger {
            data_size: 1,
            src_offset: 0,
            dst_offset: 0,
            conn_id: c,
            kind: 2,
        };
        assert!(route_of(&routes, &t(0)).is_ok());
        assert!(route_of(&routes, &t(1)).is_err());
        assert!(route_of(&routes, &t(1023)).is_err());
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("5-2,x"), Vec::<usize>::new());
    }
}
