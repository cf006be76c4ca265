//! Host memory shared by the processes of one machine (a POSIX shared-memory object) and mapped into
//! each one's GPU. P2P connections' fast flags live here, so that the peer's proxy raises a flag with a
//! CPU store instead of a copy-engine transfer.

use super::memory::mapped_device_pointer;
use super::{DevicePtr, GpuContext, check};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A shared-memory object mapped into this process (no CUDA involved).
struct ShmMapping {
    name: String,
    host: *mut u8,
    size: usize,
    /// This process created the name and has not removed it yet.
    linked: AtomicBool,
}

fn os_error(what: String) -> Error {
    Error::io(what, std::io::Error::last_os_error())
}

/// A random part of a name, so that a name left behind by a crashed process with our pid is not reused.
fn name_salt() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    // std keys each RandomState randomly.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}

impl ShmMapping {
    /// A new zeroed object of `size` bytes under a name no other process uses.
    fn create(size: usize) -> Result<ShmMapping> {
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "/mscclpp-{}-{}-{:08x}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed),
            name_salt()
        );
        let cname = CString::new(name.clone()).expect("no NUL in the name");
        // SAFETY: a NUL-terminated name; O_EXCL makes us its only creator.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        if fd < 0 {
            return Err(os_error(format!("creating shared memory {name}")));
        }
        // SAFETY: `fd` is the object just created; ftruncate zero-fills it.
        let mapped = if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            Err(os_error(format!("sizing shared memory {name} to {size} bytes")))
        } else {
            Self::map(fd, &name, size)
        };
        // SAFETY: our descriptor; the mapping keeps the object alive.
        unsafe { libc::close(fd) };
        if mapped.is_err() {
            // SAFETY: the name we created.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
        }
        let m = mapped?;
        m.linked.store(true, Ordering::Relaxed);
        Ok(m)
    }

    /// Opens, whole, an object another process created, which must hold at least `min_size` bytes.
    fn open(name: &str, min_size: usize) -> Result<ShmMapping> {
        let cname =
            CString::new(name).map_err(|_| Error::remote(format!("shared memory name {name:?} holds a NUL byte")))?;
        // SAFETY: a NUL-terminated name.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(os_error(format!("opening the peer's shared memory {name}")));
        }
        // SAFETY: a zeroed stat is valid for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our descriptor and a local to fill.
        let mapped = if unsafe { libc::fstat(fd, &mut st) } != 0 {
            Err(os_error(format!("inspecting shared memory {name}")))
        } else if st.st_size <= 0 || (st.st_size as u64) < min_size as u64 {
            Err(Error::remote(format!(
                "the peer's shared memory {name} holds {} bytes, fewer than {min_size}",
                st.st_size
            )))
        } else {
            Self::map(fd, name, st.st_size as usize)
        };
        // SAFETY: our descriptor; the mapping keeps the object alive.
        unsafe { libc::close(fd) };
        mapped
    }

    fn map(fd: libc::c_int, name: &str, size: usize) -> Result<ShmMapping> {
        // SAFETY: maps `size` bytes of an object at least that large; checked for MAP_FAILED below.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(os_error(format!("mapping shared memory {name}")));
        }
        Ok(ShmMapping {
            name: name.to_string(),
            host: host.cast(),
            size,
            linked: AtomicBool::new(false),
        })
    }

    fn unlink(&self) {
        if self.linked.swap(false, Ordering::Relaxed) {
            let cname = CString::new(self.name.clone()).expect("no NUL in the name");
            // SAFETY: a name this process created.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
        }
    }
}

impl Drop for ShmMapping {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.host.cast(), self.size) };
    }
}

/// A shared-memory object registered with the GPU of a context (page-locked and mapped for it).
pub struct SharedHostMemory {
    /// Unregistered in `drop`, before the mapping's own drop unmaps it.
    device: DevicePtr,
    ctx: GpuContext,
    shm: ShmMapping,
}

// SAFETY: plain memory shared with devices and other processes; the protocol using it (monotonic
// counters, each written by one side) needs no locking, and `&self` methods only hand out raw pointers.
unsafe impl Send for SharedHostMemory {}
// SAFETY: as above.
unsafe impl Sync for SharedHostMemory {}

impl SharedHostMemory {
    /// A new zeroed object of `size` bytes under a fresh name, registered with `ctx`'s GPU.
    pub fn create(ctx: &GpuContext, size: usize) -> Result<SharedHostMemory> {
        Self::register(ctx, ShmMapping::create(size)?)
    }

    /// Opens, whole, the object a peer created (at least `min_size` bytes) and registers it.
    pub fn open(ctx: &GpuContext, name: &str, min_size: usize) -> Result<SharedHostMemory> {
        Self::register(ctx, ShmMapping::open(name, min_size)?)
    }

    fn register(ctx: &GpuContext, shm: ShmMapping) -> Result<SharedHostMemory> {
        ctx.make_current()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        check(
            // SAFETY: a page-aligned mapping of `size` bytes that stays mapped until `drop` unregisters it.
            unsafe { sys::cuMemHostRegister_v2(shm.host.cast(), shm.size, flags) },
            || format!("cuMemHostRegister(shared memory {}, {} bytes)", shm.name, shm.size),
        )?;
        let mut m = SharedHostMemory {
            device: 0,
            ctx: *ctx,
            shm,
        };
        // Set only after `m` exists, so that a failure here still unregisters the memory (`drop`).
        m.device = mapped_device_pointer(m.shm.host)?;
        Ok(m)
    }

    /// Removes the name, once every peer has opened the object; the memory stays while mapped.
    pub fn unlink(&self) {
        self.shm.unlink();
    }
    pub fn name(&self) -> &str {
        &self.shm.name
    }
    pub fn host_ptr(&self) -> *mut u8 {
        self.shm.host
    }
    pub fn device_ptr(&self) -> DevicePtr {
        self.device
    }
    pub fn size(&self) -> usize {
        self.shm.size
    }
}

impl Drop for SharedHostMemory {
    fn drop(&mut self) {
        // SAFETY: registered in `register` and unregistered once.
        self.ctx.free_in_drop("cuMemHostUnregister", || unsafe {
            sys::cuMemHostUnregister(self.shm.host.cast())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_opens_the_object_by_name_and_sees_our_stores() {
        let ours = ShmMapping::create(4096).expect("shared memory on this machine");
        let theirs = ShmMapping::open(&ours.name, 64).unwrap();
        assert_eq!(theirs.size, 4096, "opened whole");
        // SAFETY: both map 4096 bytes of one object.
        unsafe {
            assert_eq!(*theirs.host.add(8), 0, "created zeroed");
            *ours.host.add(8) = 42;
            assert_eq!(*theirs.host.add(8), 42);
        }
    }

    #[test]
    fn the_name_goes_after_unlink_and_with_its_creator() {
        let ours = ShmMapping::create(4096).unwrap();
        let name = ours.name.clone();
        ours.unlink();
        assert!(ShmMapping::open(&name, 64).is_err());
        ours.unlink(); // twice is harmless
        let other = ShmMapping::create(4096).unwrap();
        let name = other.name.clone();
        assert_ne!(name, ours.name, "every object gets a fresh name");
        drop(other);
        assert!(ShmMapping::open(&name, 64).is_err());
    }

    #[test]
    fn bad_names_and_short_objects_are_errors() {
        let e = ShmMapping::open("/mscclpp-no-such-object", 16).err().unwrap();
        assert!(e.message.contains("/mscclpp-no-such-object"), "{}", e.message);
        assert!(ShmMapping::open("/a\0b", 16).is_err());
        let ours = ShmMapping::create(4096).unwrap();
        let e = ShmMapping::open(&ours.name, 8192).err().unwrap();
        assert!(e.message.contains("fewer than 8192"), "{}", e.message);
    }
}
