//! CUDA IPC: exporting a buffer to another process, and mapping a peer's buffer; and `ProcessId`, which
//! tells whether a peer can open our handles at all.
//!
//! A handle names a whole allocation, so an export carries the buffer's offset inside its allocation;
//! the importer adds it back (the legacy library did not, and its peers saw the allocation's base).

use super::{DevicePtr, GpuContext, check, pointer_info};
use crate::codec::{Reader, Writer};
use crate::error::Result;
use cudarc::driver::sys;

/// What a peer needs to map one of our buffers. Serialized into set-up messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcExport {
    pub handle: [u8; 64],
    /// Offset of the buffer from the start of its allocation.
    pub offset: u64,
    /// Size of the buffer.
    pub size: u64,
    /// The buffer's own address, used directly by a peer in the same process.
    pub address: DevicePtr,
}

impl IpcExport {
    /// Exports `[ptr, ptr+size)`, which must be device memory inside one allocation.
    pub fn new(ptr: DevicePtr, size: u64, what: &str) -> Result<IpcExport> {
        let info = pointer_info(ptr, size, what)?;
        let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
        // SAFETY: out-pointer to a local; `ptr` is a device allocation (checked above).
        check(unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) }, || {
            format!("cuIpcGetMemHandle({what})")
        })?;
        let mut bytes = [0u8; 64];
        for (b, r) in bytes.iter_mut().zip(handle.reserved.iter()) {
            *b = *r as u8;
        }
        Ok(IpcExport {
            handle: bytes,
            offset: ptr - info.base,
            size,
            address: ptr,
        })
    }

    /// Writes the export into a set-up message.
    pub fn write(&self, w: &mut Writer) {
        w.bytes(&self.handle).u64(self.offset).u64(self.size).u64(self.address);
    }

    /// Reads an export written by `write`.
    pub fn read(r: &mut Reader) -> Result<IpcExport> {
        Ok(IpcExport {
            handle: r.take()?,
            offset: r.u64()?,
            size: r.u64()?,
            address: r.u64()?,
        })
    }
}

/// A peer's allocation mapped into our context; unmapped when dropped.
pub struct IpcMapping {
    base: DevicePtr,
    ctx: GpuContext,
}

impl IpcMapping {
    pub fn open(ctx: &GpuContext, handle: &[u8; 64]) -> Result<IpcMapping> {
        ctx.make_current()?;
        let mut raw = sys::CUipcMemHandle_st { reserved: [0; 64] };
        for (r, b) in raw.reserved.iter_mut().zip(handle.iter()) {
            *r = *b as _;
        }
        let mut base: DevicePtr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: out-pointer to a local; the handle came from a peer's cuIpcGetMemHandle.
        check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, raw, flags) }, || {
            "cuIpcOpenMemHandle".into()
        })?;
        Ok(IpcMapping { base, ctx: *ctx })
    }
    pub fn base(&self) -> DevicePtr {
        self.base
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: opened by cuIpcOpenMemHandle and closed once.
        self.ctx
            .free_in_drop("cuIpcCloseMemHandle", || unsafe { sys::cuIpcCloseMemHandle(self.base) });
    }
}

/// Identifies a process among those of the job: a hash of the machine's boot id and host name, and the
/// process id. It decides how a peer's exported memory is reached: at the owner's own address by a peer of
/// the same process (a process cannot open its own IPC handles), through CUDA IPC by one of the same machine
/// (`host`), not at all from another machine. Used by the P2P transport, the collectives' scratch set-up and
/// NCCL's fallback (whether a job spans machines).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId {
    pub host: u64,
    pub pid: u32,
}

impl ProcessId {
    pub fn this() -> ProcessId {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let mut host: u64 = 0xcbf29ce484222325;
        for b in boot.trim().bytes().chain(hostname_bytes()) {
            host = (host ^ b as u64).wrapping_mul(0x100000001b3);
        }
        ProcessId {
            host,
            pid: std::process::id(),
        }
    }

    pub(crate) fn write(&self, w: &mut Writer) {
        w.u64(self.host).u32(self.pid);
    }

    pub(crate) fn read(r: &mut Reader) -> Result<ProcessId> {
        Ok(ProcessId {
            host: r.u64()?,
            pid: r.u32()?,
        })
    }
}

fn hostname_bytes() -> impl Iterator<Item = u8> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = if ok {
        buf.iter().position(|&b| b == 0).unwrap_or(buf.len())
    } else {
        0
    };
    buf.into_iter().take(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_round_trips_and_rejects_bad_lengths() {
        let mut handle = [0u8; 64];
        handle[3] = 0xab;
        let e = IpcExport {
            handle,
            offset: 4096,
            size: 1 << 20,
            address: 0x7f00_0000_1000,
        };
        let mut w = Writer::new();
        e.write(&mut w);
        let bytes = w.into_bytes();
        assert_eq!(bytes.len(), 64 + 3 * 8);
        let mut r = Reader::new(&bytes, "test export");
        assert_eq!(IpcExport::read(&mut r).unwrap(), e);
        r.finish().unwrap();
        assert!(IpcExport::read(&mut Reader::new(&[0u8; 10], "test export")).is_err());
    }
}
