//! `MSCCLPP_NCCL_FALLBACK`: NVIDIA's `libnccl.so.2`, loaded privately, and an NVIDIA communicator made
//! beside each of ours, which gets every collective and send or receive of ranks on several hosts (ours
//! need every rank's GPU in one machine; on one machine every type and operator is ours).
//!
//! - `Library`: the file, loaded once, lazily, with `RTLD_LOCAL | RTLD_DEEPBIND`: both are needed because
//!   our `libnccl.so.2` exports the same names and is usually preloaded. `RTLD_LOCAL` keeps NVIDIA's names
//!   out of the global scope (nothing else resolves to them), `RTLD_DEEPBIND` makes NVIDIA's own calls to its
//!   own exported functions (`ncclSend` calling `ncclGroupStart`, say) resolve inside it, not to ours. A file
//!   the process loaded already (torch does, without those flags) is loaded as a private copy instead.
//!   Every function used is resolved at load time, so that a library too old or not NCCL fails at once,
//!   naming the symbol.
//! - `attach`: at initialisation, after our communicator is made: rank 0 asks NVIDIA's library for a
//!   unique id, which travels with each rank's host over our bootstrap; every rank then joins NVIDIA's
//!   communicator on its current device. A rank that cannot (no library, NVIDIA's refusal) leaves every
//!   rank without the fallback, with a WARN saying why; our communicator stays usable.
//! - `Comm`: that NVIDIA communicator; `Call`: a call forwarded to it, issued at once or inside NVIDIA's
//!   own group at the end of ours.

use super::engine_search;
use super::types::{NCCL_UNIQUE_ID_BYTES, ncclResult_t, ncclUniqueId};
use crate::collective::Collective;
use crate::comm::Communicator;
use crate::dynlib;
use crate::error::{Error, ErrorKind, Result};
use crate::settings::NCCL_FALLBACK;
use once_cell::sync::OnceCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// NVIDIA's `ncclComm_t` (opaque to us).
type RawComm = *mut c_void;
type Stream = *mut c_void;

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueIdFn = unsafe extern "C" fn(*mut ncclUniqueId) -> c_int;
type CommInitRankFn = unsafe extern "C" fn(*mut RawComm, c_int, ncclUniqueId, c_int) -> c_int;
type CommFn = unsafe extern "C" fn(RawComm) -> c_int;
type CommIntOutFn = unsafe extern "C" fn(RawComm, *mut c_int) -> c_int;
type GetLastErrorFn = unsafe extern "C" fn(RawComm) -> *const c_char;
type GroupFn = unsafe extern "C" fn() -> c_int;
type ReduceLikeFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, Stream) -> c_int;
type GatherLikeFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, Stream) -> c_int;
type RootedReduceFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, RawComm, Stream) -> c_int;
type SendFn = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, Stream) -> c_int;
type RecvFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, Stream) -> c_int;
type RevokeFn = unsafe extern "C" fn(RawComm, c_int) -> c_int;
type PreMulSumFn = unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, RawComm) -> c_int;
type RedOpDestroyFn = unsafe extern "C" fn(c_int, RawComm) -> c_int;

/// NVIDIA's functions this file calls, each checked present at load time.
struct Functions {
    get_version: GetVersionFn,
    get_unique_id: GetUniqueIdFn,
    comm_init_rank: CommInitRankFn,
    comm_finalize: CommFn,
    comm_destroy: CommFn,
    comm_abort: CommFn,
    comm_get_async_error: CommIntOutFn,
    get_last_error: GetLastErrorFn,
    group_start: GroupFn,
    group_end: GroupFn,
    all_reduce: ReduceLikeFn,
    reduce_scatter: ReduceLikeFn,
    all_gather: GatherLikeFn,
    all_to_all: GatherLikeFn,
    broadcast: ReduceLikeFn,
    reduce: RootedReduceFn,
    gather: ReduceLikeFn,
    scatter: ReduceLikeFn,
    send: SendFn,
    recv: RecvFn,
    comm_revoke: RevokeFn,
    red_op_create_pre_mul_sum: PreMulSumFn,
    red_op_destroy: RedOpDestroyFn,
}

/// NVIDIA's library, loaded. Never unloaded: its communicators and threads may outlive any one of ours.
pub struct Library {
    path: String,
    version: c_int,
    fns: Functions,
}

impl Library {
    /// Loads the library at `path` and resolves every function; the error names the path and dlerror's
    /// text, or the missing symbol.
    pub fn load(path: &str) -> Result<Library> {
        Self::load_as(path, "MSCCLPP_NCCL_FALLBACK")
    }

    /// `load`, with `source` (the setting, or where the search found the file) opening every message.
    fn load_as(path: &str, source: &str) -> Result<Library> {
        let cpath = CString::new(path)
            .map_err(|_| Error::invalid_argument(format!("{source} \"{path}\" contains a NUL byte")))?;
        // RTLD_NOW resolves everything up front so that failures show here; LOCAL and DEEPBIND keep NVIDIA's
        // names and ours apart (see the module's comment).
        let flags = libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND;
        // Loaded already (torch 2.11's start-up dlopens NVIDIA's file by its path, without DEEPBIND), the
        // file would keep its first flags, and NVIDIA's calls to its own exported functions would reach
        // ours: a private copy is loaded instead (of a file named by its path; a bare name is the loader's to
        // resolve, as it always was).
        let handle = if path.contains('/') && dynlib::is_loaded(&cpath) {
            log::info!(
                "{source}: \"{path}\" is already loaded in this process (without RTLD_DEEPBIND): loading a private \
                 copy of it, so that its calls to its own functions stay inside it"
            );
            dynlib::open_private_copy(path, flags)
        } else {
            dynlib::open(&cpath, flags)
        }
        .map_err(|e| Error::system(format!("{source}: cannot load \"{path}\": {e}")))?;
        // Our own libnccl.so.2 (of any build) or its core would take every call back into this library:
        // they, and only they, export the face's entry points under the core's prefix.
        // SAFETY: the handle `open` just returned.
        if unsafe { dynlib::symbol(handle, c"mscclpp_nccl_face_ncclGetVersion") }.is_ok() {
            return Err(Error::invalid_argument(format!(
                "{source} \"{path}\" is this library's own libnccl.so.2 (or its core libmscclpp.so.0), not \
                 NVIDIA's NCCL: name NVIDIA's (for instance the one PyTorch's wheels ship as nvidia/nccl/lib/libnccl.so.2)"
            )));
        }
        let sym = |s: &CStr| -> Result<*mut c_void> {
            // SAFETY: the handle `open` just returned, never closed while this runs.
            unsafe { dynlib::symbol(handle, s) }.map_err(|e| {
                Error::system(format!(
                    "{source}: \"{path}\" is not a usable NVIDIA NCCL (2.28 or later): symbol {} is missing ({e})",
                    s.to_string_lossy()
                ))
            })
        };
        macro_rules! f {
            ($s:literal, $t:ty) => {
                // SAFETY: the symbol is NCCL's exported function of that name, whose C signature the type
                // restates from nccl.h (2.28).
                unsafe { std::mem::transmute::<*mut c_void, $t>(sym($s)?) }
            };
        }
        let fns = Functions {
            get_version: f!(c"ncclGetVersion", GetVersionFn),
            get_unique_id: f!(c"ncclGetUniqueId", GetUniqueIdFn),
            comm_init_rank: f!(c"ncclCommInitRank", CommInitRankFn),
            comm_finalize: f!(c"ncclCommFinalize", CommFn),
            comm_destroy: f!(c"ncclCommDestroy", CommFn),
            comm_abort: f!(c"ncclCommAbort", CommFn),
            comm_get_async_error: f!(c"ncclCommGetAsyncError", CommIntOutFn),
            get_last_error: f!(c"ncclGetLastError", GetLastErrorFn),
            group_start: f!(c"ncclGroupStart", GroupFn),
            group_end: f!(c"ncclGroupEnd", GroupFn),
            all_reduce: f!(c"ncclAllReduce", ReduceLikeFn),
            reduce_scatter: f!(c"ncclReduceScatter", ReduceLikeFn),
            all_gather: f!(c"ncclAllGather", GatherLikeFn),
            all_to_all: f!(c"ncclAlltoAll", GatherLikeFn),
            broadcast: f!(c"ncclBroadcast", ReduceLikeFn),
            reduce: f!(c"ncclReduce", RootedReduceFn),
            gather: f!(c"ncclGather", ReduceLikeFn),
            scatter: f!(c"ncclScatter", ReduceLikeFn),
            send: f!(c"ncclSend", SendFn),
            recv: f!(c"ncclRecv", RecvFn),
            comm_revoke: f!(c"ncclCommRevoke", RevokeFn),
            red_op_create_pre_mul_sum: f!(c"ncclRedOpCreatePreMulSum", PreMulSumFn),
            red_op_destroy: f!(c"ncclRedOpDestroy", RedOpDestroyFn),
        };
        let mut version: c_int = 0;
        // SAFETY: a valid out-pointer.
        let r = unsafe { (fns.get_version)(&mut version) };
        if r != 0 {
            return Err(Error::system(format!(
                "{source}: \"{path}\"'s ncclGetVersion returned {r}"
            )));
        }
        log::info!(
            "{source}: loaded \"{path}\", NVIDIA NCCL {} (ncclGetVersion: {version})",
            version_text(version)
        );
        Ok(Library {
            path: path.to_string(),
            version,
            fns,
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn version(&self) -> c_int {
        self.version
    }

    /// A failure of NVIDIA's `function` (result `r`, its last error's text) as our error of the same code.
    fn check(&self, function: &str, r: c_int, comm: RawComm) -> Result<()> {
        if r == ncclResult_t::ncclSuccess as c_int {
            return Ok(());
        }
        // SAFETY: NCCL's function accepts a communicator or NULL and returns a string it keeps.
        let text = unsafe { (self.fns.get_last_error)(comm) };
        let detail = if text.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, NUL-terminated.
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        };
        let kind = match r {
            1 => ErrorKind::Cuda,
            2 => ErrorKind::System,
            4 => ErrorKind::InvalidArgument,
            5 => ErrorKind::InvalidUsage,
            6 => ErrorKind::Remote,
            7 => ErrorKind::InProgress,
            8 => ErrorKind::Timeout,
            _ => ErrorKind::Internal,
        };
        Err(Error::new(
            kind,
            format!("NVIDIA's {function} (MSCCLPP_NCCL_FALLBACK) returned {r}: {detail}"),
        ))
    }

    fn unique_id(&self) -> Result<ncclUniqueId> {
        let mut id = ncclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        // SAFETY: a valid out-pointer to 128 bytes.
        let r = unsafe { (self.fns.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", r, std::ptr::null_mut())?;
        Ok(id)
    }

    fn init_rank(&self, nranks: usize, id: ncclUniqueId, rank: usize) -> Result<RawComm> {
        let mut comm: RawComm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id is passed by value as nccl.h declares.
        let r = unsafe { (self.fns.comm_init_rank)(&mut comm, nranks as c_int, id, rank as c_int) };
        self.check("ncclCommInitRank", r, std::ptr::null_mut())?;
        Ok(comm)
    }

    /// Runs `calls` inside one NVIDIA group, so that NVIDIA sees the send/receive pairs and collectives of
    /// our group together (issued apart, a rank's sends and its peer's could wait for each other). Every
    /// call is issued and the group always ended; the first error is returned.
    pub fn issue_group(&self, calls: &[Forwarded]) -> Result<()> {
        self.check(
            "ncclGroupStart",
            // SAFETY: no arguments.
            unsafe { (self.fns.group_start)() },
            std::ptr::null_mut(),
        )?;
        let mut first = None;
        for c in calls {
            if let Err(e) = c.issue() {
                first.get_or_insert(e);
            }
        }
        // SAFETY: no arguments; closes the group opened above.
        let end = self.check("ncclGroupEnd", unsafe { (self.fns.group_end)() }, std::ptr::null_mut());
        match first {
            Some(e) => Err(e),
            None => end,
        }
    }
}

/// `22809` as `2.28.9` (NCCL's numbering since 2.9: major * 10000 + minor * 100 + patch; before, * 1000).
pub fn version_text(v: c_int) -> String {
    if v >= 20900 {
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, v / 100 % 10, v % 100)
    }
}

static LIBRARY: OnceCell<std::result::Result<Library, Error>> = OnceCell::new();

/// NVIDIA's library, loaded at the first call that wants it: the one `MSCCLPP_NCCL_FALLBACK` names, or,
/// where the setting is unset and `search` is true (the ranks span hosts), the first found by
/// `engine_search`. `None` when the setting is unset and no search is asked for. A failure (to find or to
/// load) is kept, so that each later communicator reports the same reason without retrying.
pub fn library(search: bool) -> Option<Result<&'static Library>> {
    let named = NCCL_FALLBACK.text();
    if named.is_none() && !search {
        return None;
    }
    Some(
        LIBRARY
            .get_or_init(|| match named {
                Some(path) => Library::load(&path),
                None => match engine_search::search() {
                    Some((path, found)) => {
                        let source = format!("NVIDIA's NCCL between hosts ({})", found.describe());
                        Library::load_as(&path.to_string_lossy(), &source)
                    }
                    None => Err(Error::invalid_usage(engine_search::not_found_hint())),
                },
            })
            .as_ref()
            .map_err(Clone::clone),
    )
}

/// The setting's state, for messages about a call this library does not carry out.
pub fn unavailable_hint() -> String {
    match NCCL_FALLBACK.text() {
        None => "set MSCCLPP_NCCL_FALLBACK to the path of NVIDIA's libnccl.so.2 to have it carried out there".into(),
        Some(path) => format!(
            "MSCCLPP_NCCL_FALLBACK=\"{path}\" is set, but this communicator has no NVIDIA communicator beside it \
             (see the WARN at its initialisation)"
        ),
    }
}

/// An NVIDIA communicator made beside one of ours.
pub struct Comm {
    lib: &'static Library,
    /// NVIDIA's `ncclComm_t`, as an address (it is only ever passed back to NVIDIA's functions).
    handle: usize,
    /// The ranks are on several hosts: every collective goes here (ours need one machine).
    spans_hosts: bool,
    /// Destroyed or aborted: it is ended once only.
    ended: AtomicBool,
}

impl Comm {
    fn new(lib: &'static Library, handle: RawComm, spans_hosts: bool) -> Arc<Comm> {
        Arc::new(Comm {
            lib,
            handle: handle as usize,
            spans_hosts,
            ended: AtomicBool::new(false),
        })
    }

    fn raw(&self) -> RawComm {
        self.handle as RawComm
    }

    pub fn spans_hosts(&self) -> bool {
        self.spans_hosts
    }

    pub fn library(&self) -> &'static Library {
        self.lib
    }

    pub fn finalize(&self) -> Result<()> {
        // SAFETY: a live NVIDIA communicator (ended ones are unregistered before any later call).
        let r = unsafe { (self.lib.fns.comm_finalize)(self.raw()) };
        self.lib.check("ncclCommFinalize", r, self.raw())
    }

    /// `ncclCommDestroy`, once.
    pub fn destroy(&self) -> Result<()> {
        if self.ended.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // SAFETY: a live NVIDIA communicator, ended here only.
        let r = unsafe { (self.lib.fns.comm_destroy)(self.raw()) };
        self.lib.check("ncclCommDestroy", r, std::ptr::null_mut())
    }

    /// `ncclCommAbort`, once (also while another thread waits in a call on it, as NCCL allows).
    pub fn abort(&self) -> Result<()> {
        if self.ended.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // SAFETY: a live NVIDIA communicator, ended here only.
        let r = unsafe { (self.lib.fns.comm_abort)(self.raw()) };
        self.lib.check("ncclCommAbort", r, std::ptr::null_mut())
    }

    /// `abort` on a thread of its own: our failure path calls it where the ranks span hosts, so that
    /// NVIDIA's kernels and calls waiting for a dead or silent peer end now (NVIDIA's own detection may
    /// come late or never: a survivor stayed stuck 70 s in one probe), without making the failure path
    /// wait for NVIDIA's abort, which can itself take long.
    pub fn abort_detached(self: &Arc<Self>) {
        if self.ended.load(Ordering::Acquire) {
            return;
        }
        let comm = self.clone();
        let spawned = std::thread::Builder::new()
            .name("nccl-engine-abort".into())
            .spawn(move || match comm.abort() {
                Ok(()) => log::info!("NVIDIA's communicator aborted after the failure"),
                Err(e) => log::info!("aborting NVIDIA's communicator after the failure: {}", e.message),
            });
        if let Err(e) = spawned {
            log::warn!("NVIDIA's communicator could not be aborted after the failure (no thread: {e})");
        }
    }

    /// NVIDIA's asynchronous error, with its last error's text when it is one.
    pub fn async_error(&self) -> (ncclResult_t, Option<String>) {
        if self.ended.load(Ordering::Acquire) {
            return (ncclResult_t::ncclSuccess, None);
        }
        let mut r: c_int = 0;
        // SAFETY: a live NVIDIA communicator and a valid out-pointer.
        let called = unsafe { (self.lib.fns.comm_get_async_error)(self.raw(), &mut r) };
        let r = if called != 0 { called } else { r };
        let code = result_code(r);
        if code == ncclResult_t::ncclSuccess || code == ncclResult_t::ncclInProgress {
            return (code, None);
        }
        let e = self.lib.check("ncclCommGetAsyncError", r, self.raw()).err();
        (code, e.map(|e| e.message))
    }

    pub fn revoke(&self, flags: c_int) -> Result<()> {
        // SAFETY: a live NVIDIA communicator.
        let r = unsafe { (self.lib.fns.comm_revoke)(self.raw(), flags) };
        self.lib.check("ncclCommRevoke", r, self.raw())
    }

    /// NVIDIA's twin of a `PreMulSum` operator of ours (its number, on NVIDIA's communicator).
    ///
    /// # Safety
    /// `scalar` is what nccl.h's `ncclRedOpCreatePreMulSum` takes: a value of `datatype` in host memory, or
    /// a device address, as `residence` says.
    pub unsafe fn create_premul(&self, scalar: *mut c_void, datatype: c_int, residence: c_int) -> Result<c_int> {
        let mut op: c_int = 0;
        // SAFETY: a live communicator, a valid out-pointer; `scalar` is the caller's, valid for this call.
        let r = unsafe { (self.lib.fns.red_op_create_pre_mul_sum)(&mut op, scalar, datatype, residence, self.raw()) };
        self.lib.check("ncclRedOpCreatePreMulSum", r, self.raw())?;
        Ok(op)
    }

    pub fn destroy_premul(&self, op: c_int) -> Result<()> {
        // SAFETY: a live communicator; `op` was made on it.
        let r = unsafe { (self.lib.fns.red_op_destroy)(op, self.raw()) };
        self.lib.check("ncclRedOpDestroy", r, self.raw())
    }
}

/// NVIDIA's result code as ours (an unknown one as an internal error).
fn result_code(r: c_int) -> ncclResult_t {
    use ncclResult_t::*;
    match r {
        0 => ncclSuccess,
        1 => ncclUnhandledCudaError,
        2 => ncclSystemError,
        4 => ncclInvalidArgument,
        5 => ncclInvalidUsage,
        6 => ncclRemoteError,
        7 => ncclInProgress,
        _ => ncclInternalError,
    }
}

/// A call forwarded to NVIDIA's library: buffers and streams as addresses, numbers as the caller gave
/// them (operators already NVIDIA's: see `Comm::create_premul`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Call {
    /// One of the core's collectives; `op` (NVIDIA's number) and `root` where the collective takes them.
    Collective {
        collective: Collective,
        send: u64,
        recv: u64,
        count: usize,
        datatype: c_int,
        op: c_int,
        root: c_int,
    },
    Send {
        buf: u64,
        count: usize,
        datatype: c_int,
        peer: c_int,
    },
    Recv {
        buf: u64,
        count: usize,
        datatype: c_int,
        peer: c_int,
    },
}

/// A call and the NVIDIA communicator and stream it goes to.
pub struct Forwarded {
    pub comm: Arc<Comm>,
    pub call: Call,
    pub stream: u64,
}

impl Forwarded {
    /// Issues the call on NVIDIA's communicator (refused once that was aborted or destroyed).
    pub fn issue(&self) -> Result<()> {
        if self.comm.ended.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(
                "NVIDIA's communicator beside this one was aborted or destroyed: no work may go to it",
            ));
        }
        let f = &self.comm.lib.fns;
        let (c, s) = (self.comm.raw(), self.stream as Stream);
        let p = |a: u64| a as *const c_void;
        let m = |a: u64| a as *mut c_void;
        // SAFETY: every arm calls NVIDIA's function with nccl.h's arguments, as the application passed them to
        // ours (buffers and stream under nccl.h's contract), on a live NVIDIA communicator.
        let (name, r) = unsafe {
            match self.call {
                Call::Collective {
                    collective,
                    send,
                    recv,
                    count,
                    datatype,
                    op,
                    root,
                } => {
                    let (send, recv) = (p(send), m(recv));
                    match collective {
                        Collective::AllReduce => {
                            ("ncclAllReduce", (f.all_reduce)(send, recv, count, datatype, op, c, s))
                        }
                        Collective::AllGather => ("ncclAllGather", (f.all_gather)(send, recv, count, datatype, c, s)),
                        Collective::ReduceScatter => (
                            "ncclReduceScatter",
                            (f.reduce_scatter)(send, recv, count, datatype, op, c, s),
                        ),
                        Collective::Broadcast => {
                            ("ncclBroadcast", (f.broadcast)(send, recv, count, datatype, root, c, s))
                        }
                        Collective::Reduce => ("ncclReduce", (f.reduce)(send, recv, count, datatype, op, root, c, s)),
                        Collective::AllToAll => ("ncclAlltoAll", (f.all_to_all)(send, recv, count, datatype, c, s)),
                        Collective::Gather => ("ncclGather", (f.gather)(send, recv, count, datatype, root, c, s)),
                        Collective::Scatter => ("ncclScatter", (f.scatter)(send, recv, count, datatype, root, c, s)),
                    }
                }
                Call::Send {
                    buf,
                    count,
                    datatype,
                    peer,
                } => ("ncclSend", (f.send)(p(buf), count, datatype, peer, c, s)),
                Call::Recv {
                    buf,
                    count,
                    datatype,
                    peer,
                } => ("ncclRecv", (f.recv)(m(buf), count, datatype, peer, c, s)),
            }
        };
        self.comm.lib.check(name, r, c)
    }
}

/// What each rank tells the others at `attach`, once the hosts are known: whether it loaded the library,
/// and (rank 0) NVIDIA's unique id.
const HELLO_BYTES: usize = 1 + NCCL_UNIQUE_ID_BYTES;

fn hello(ready: bool, id: Option<&ncclUniqueId>) -> [u8; HELLO_BYTES] {
    let mut b = [0u8; HELLO_BYTES];
    b[0] = ready as u8;
    if let Some(id) = id {
        for (o, &c) in b[1..].iter_mut().zip(id.internal.iter()) {
            *o = c as u8;
        }
    }
    b
}

/// The readiness and rank 0's id out of every rank's hello.
fn read_hellos(all: &[u8]) -> (Vec<bool>, ncclUniqueId) {
    let blocks: Vec<&[u8]> = all.chunks(HELLO_BYTES).collect();
    let ready = blocks.iter().map(|b| b[0] == 1).collect();
    let id = ncclUniqueId {
        internal: std::array::from_fn(|i| blocks[0][1 + i] as c_char),
    };
    (ready, id)
}

/// The ranks whose flag is false, for messages.
fn ranks_without(flags: &[bool]) -> Vec<usize> {
    flags
        .iter()
        .enumerate()
        .filter(|(_, ok)| !**ok)
        .map(|(r, _)| r)
        .collect()
}

/// Makes NVIDIA's communicator beside `core`, collectively over the ranks (each calls it right after making
/// its communicator, on the thread and device that made it):
/// - where the ranks span hosts, always: NVIDIA's library is the engine between them (`library(true)`:
///   the setting's, or the one the search finds). A rank that cannot have it (none found, a load or
///   NVIDIA's init refused) fails every rank's initialisation, naming the rank and the reason;
/// - on one host, where `MSCCLPP_NCCL_FALLBACK` is set: as the fallback of calls we do not carry out. A rank
///   that cannot have it leaves every rank without it, with a WARN saying why; our communicator stays usable.
///
/// `Ok(None)`: no NVIDIA communicator, and none needed.
pub fn attach(core: &Communicator) -> Result<Option<Arc<Comm>>> {
    let (rank, nranks) = (core.rank(), core.nranks());
    // Whether the job spans hosts decides whether the engine is needed: every rank's host came with the
    // bootstrap's table, so every rank decides alike without another exchange.
    let hosts = core.bootstrap().hosts();
    let spans_hosts = hosts.iter().any(|&h| h != hosts[0]);
    // Where it spans hosts, a failure below is every rank's, said once with what to do.
    let refuse = |why: String| -> Result<Option<Arc<Comm>>> {
        if spans_hosts {
            let on = hosts.iter().collect::<std::collections::HashSet<_>>().len();
            Err(Error::invalid_usage(format!(
                "the communicator's ranks span {on} hosts, and NVIDIA's NCCL, which carries collectives between \
                 hosts, cannot be had: {why}"
            )))
        } else {
            log::warn!("{why}; this communicator goes on without the fallback");
            Ok(None)
        }
    };
    let lib = match library(spans_hosts) {
        None => return Ok(None),
        Some(Ok(l)) => Some(l),
        Some(Err(e)) => {
            if spans_hosts {
                log::warn!("rank {rank}: {}", e.message);
            } else {
                log::warn!("{}; this communicator goes on without the fallback", e.message);
            }
            None
        }
    };
    let mut id = None;
    if rank == 0
        && let Some(l) = lib
    {
        match l.unique_id() {
            Ok(i) => id = Some(i),
            Err(e) => log::warn!("{}", e.message),
        }
    }
    let ready = lib.is_some() && (rank != 0 || id.is_some());
    let mut all = vec![0u8; HELLO_BYTES * nranks];
    all[rank * HELLO_BYTES..(rank + 1) * HELLO_BYTES].copy_from_slice(&hello(ready, id.as_ref()));
    if let Err(e) = core.bootstrap().all_gather(&mut all, HELLO_BYTES) {
        return refuse(format!("exchanging NVIDIA's unique id failed ({})", e.message));
    }
    let (readiness, id) = read_hellos(&all);
    let missing = ranks_without(&readiness);
    if !missing.is_empty() {
        let why = match library(spans_hosts) {
            Some(Err(e)) if missing.contains(&rank) => e.message,
            _ => String::new(),
        };
        return refuse(format!(
            "rank(s) {missing:?} could not load NVIDIA's library or get its unique id{}",
            if why.is_empty() {
                String::new()
            } else {
                format!(" (here: {why})")
            }
        ));
    }
    let lib = lib.expect("every rank is ready, this one too");
    let made = lib.init_rank(nranks, id, rank);
    if let Err(e) = &made {
        log::warn!(
            "rank {rank}: {} (NVIDIA's NCCL refuses, among others, two ranks of one host on one GPU)",
            e.message
        );
    }
    // Every rank learns whether all joined: one that did not leaves the others' NVIDIA communicator
    // unusable, so those are aborted (locally: the peers are not waited for) and nobody routes to it.
    let mut joined = vec![0u8; nranks];
    joined[rank] = made.is_ok() as u8;
    if let Err(e) = core.bootstrap().all_gather(&mut joined, 1) {
        if let Ok(h) = made {
            let _ = Comm::new(lib, h, spans_hosts).abort();
        }
        return refuse(format!("exchanging NVIDIA's outcome failed ({})", e.message));
    }
    let failed = ranks_without(&joined.iter().map(|&b| b == 1).collect::<Vec<_>>());
    if !failed.is_empty() {
        if let Ok(h) = made {
            let _ = Comm::new(lib, h, spans_hosts).abort();
        }
        return refuse(format!("NVIDIA's ncclCommInitRank failed on rank(s) {failed:?}"));
    }
    let comm = Comm::new(lib, made.expect("every rank joined, this one too"), spans_hosts);
    if spans_hosts && rank == 0 && crate::collective::reproducible_reductions().unwrap_or(true) {
        // NVIDIA's library orders a reduction's additions by its own algorithm, chosen by size.
        log::warn!(
            "MSCCLPP_DETERMINISTIC is set, but this communicator's ranks span hosts and NVIDIA's NCCL carries its \
             reductions: their results are not promised to be the same bits across message sizes"
        );
    }
    log::info!(
        "rank {rank} of {nranks}: NVIDIA's communicator made beside ours ({}, NCCL {}){}",
        lib.path(),
        version_text(lib.version()),
        if spans_hosts {
            format!(
                "; the ranks span {}: every collective goes to it",
                crate::collective::hosts::HostLayout::new(hosts)
            )
        } else {
            String::new()
        }
    );
    Ok(Some(comm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_nccl_writes_them() {
        assert_eq!(version_text(22809), "2.28.9");
        assert_eq!(version_text(22901), "2.29.1");
        assert_eq!(version_text(2804), "2.8.4");
    }

    #[test]
    fn hellos_carry_readiness_and_rank_0s_id() {
        let id = ncclUniqueId {
            internal: std::array::from_fn(|i| i as c_char),
        };
        let mut all = Vec::new();
        all.extend_from_slice(&hello(true, Some(&id)));
        all.extend_from_slice(&hello(false, None));
        all.extend_from_slice(&hello(true, None));
        let (ready, got) = read_hellos(&all);
        assert_eq!(ready, vec![true, false, true]);
        assert_eq!(got.internal, id.internal);
        assert_eq!(ranks_without(&ready), vec![1]);
    }

    #[test]
    fn a_missing_library_names_the_path_and_dlerror() {
        let e = Library::load("/nonexistent/libnccl.so.2").err().unwrap();
        assert_eq!(e.kind, ErrorKind::System);
        assert!(e.message.contains("\"/nonexistent/libnccl.so.2\""), "{}", e.message);
        assert!(e.message.contains("No such file"), "dlerror's text: {}", e.message);
    }

    #[test]
    fn a_library_that_is_not_nccl_names_the_first_missing_symbol() {
        // libc is loaded in every test process and exports no NCCL function.
        let e = Library::load("libc.so.6").err().unwrap();
        assert!(e.message.contains("symbol ncclGetVersion is missing"), "{}", e.message);
    }

    #[test]
    fn nvidia_codes_map_to_ours() {
        assert_eq!(result_code(0), ncclResult_t::ncclSuccess);
        assert_eq!(result_code(6), ncclResult_t::ncclRemoteError);
        assert_eq!(result_code(3), ncclResult_t::ncclInternalError);
        assert_eq!(result_code(42), ncclResult_t::ncclInternalError);
    }
}
