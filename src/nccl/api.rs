//! The `extern "C"` functions of NCCL's `nccl.h` that predate 2.29 (2.28.9's), and `ncclDevCommCreate` /
//! `ncclDevCommDestroy` of its device API (the calls of 2.29 to 2.32 are in files of their own, see `mod.rs`). Exported (each with NCCL's `pnccl` twin) only with the `nccl-abi` feature, which
//! builds `libnccl.so.2`. Each finds the communicator, checks its arguments as NCCL does (the error
//! names the argument), and calls the core behind the panic boundary: the same `Communicator` calls that
//! `mscclpp.h`'s functions make (`mscclpp_abi/`). What the core does not carry out goes to the NVIDIA
//! communicator beside ours where `MSCCLPP_NCCL_FALLBACK` made one (`fallback.rs`), else is refused.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::{self as ncomm, NcclComm, PreMulSum};
use super::config;
use super::error::{self as nerror, code};
use super::fallback::{self, Forwarded};
use super::group::{self, Group};
use super::types::*;
use crate::abi::{catch_panic, non_null};
use crate::bootstrap::UniqueId;
use crate::collective::{Call, Collective, DataType, P2pKind, P2pOp, RedOp, Scalar, algorithm};
use crate::comm::Communicator;
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::gpu::{AppStream, DeviceAllocation, GpuContext, ensure_driver};
use crate::logging::RankScope;
use crate::registration::Kind;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Arc;

/// How long set-up waits for the root and the peers.
const BOOTSTRAP_TIMEOUT: std::time::Duration = crate::bootstrap::DEFAULT_TIMEOUT;

/// Work a group queues, issued at its outermost `ncclGroupEnd`.
pub(super) enum Op {
    /// A communicator's initialisation (`ncclCommInitRank` inside a group): every one of a group runs at
    /// once, so that one thread can make several ranks.
    Init {
        comm: Arc<NcclComm>,
        gpu: Option<GpuContext>,
        job: InitJob,
    },
    Collective {
        comm: Arc<Communicator>,
        call: Call,
        root: i64,
        stream: u64,
    },
    /// A send or a receive: a group's are issued together, after the group's collectives, in one launch
    /// per communicator (they must progress at the same time).
    P2p {
        comm: Arc<Communicator>,
        op: P2pOp,
        stream: u64,
    },
    /// A call for NVIDIA's communicator beside ours: inside a group, issued at its end inside NVIDIA's own
    /// group.
    Fallback(Forwarded),
    /// A one-sided call (`rma.rs`): a group's are issued after its sends and receives, its puts and
    /// signals first, then its waits, each in call order.
    OneSided {
        comm: Arc<Communicator>,
        op: crate::collective::signal::OneSided,
        stream: u64,
    },
}

type InitJob = super::split::Job;

/// A queued collective's arguments: the call, the application's root, its stream.
type QueuedCall = (Call, i64, u64);

/// A group's work on one communicator: its collectives, then its sends and receives (with their streams).
struct CommWork {
    comm: Arc<Communicator>,
    calls: Vec<QueuedCall>,
    p2p: Vec<(P2pOp, u64)>,
    one_sided: Vec<(crate::collective::signal::OneSided, u64)>,
}

impl CommWork {
    /// `comm`'s entry of `all`, made at its first work.
    fn of(all: &mut Vec<CommWork>, comm: Arc<Communicator>) -> &mut CommWork {
        let i = match all.iter().position(|w| Arc::ptr_eq(&w.comm, &comm)) {
            Some(i) => i,
            None => {
                all.push(CommWork {
                    comm,
                    calls: Vec::new(),
                    p2p: Vec::new(),
                    one_sided: Vec::new(),
                });
                all.len() - 1
            }
        };
        &mut all[i]
    }
}

thread_local! {
    pub(super) static GROUP: RefCell<Group<Op>> = RefCell::new(Group::default());
}

/// The entry of every function: installs the logger, runs `body` behind the panic boundary, and keeps a
/// failure's message for `ncclGetLastError`. `body` returns `ncclSuccess` or `ncclInProgress`.
pub(super) fn entry(name: &str, body: impl FnOnce() -> Result<ncclResult_t>) -> ncclResult_t {
    crate::logging::init_for_nccl();
    match catch_panic(name, body) {
        Ok(r) => r,
        Err(e) => {
            nerror::record(name, &e);
            code(&e)
        }
    }
}

/// `entry` with the communicator behind `comm`; what it logs names its rank.
pub(super) fn with_comm(
    name: &str,
    comm: ncclComm_t,
    body: impl FnOnce(&Arc<NcclComm>) -> Result<ncclResult_t>,
) -> ncclResult_t {
    let found = ncomm::lookup(comm);
    let _rank = found.as_ref().ok().and_then(|c| c.rank()).map(RankScope::enter);
    entry(name, || body(&found?))
}

/// `with_comm` for work that a group queues: a failure inside a group (a NULL or destroyed communicator
/// too) also fails the group's end.
pub(super) fn enqueue(
    name: &str,
    comm: ncclComm_t,
    body: impl FnOnce(&Arc<NcclComm>) -> Result<ncclResult_t>,
) -> ncclResult_t {
    let found = ncomm::lookup(comm);
    let _rank = found.as_ref().ok().and_then(|c| c.rank()).map(RankScope::enter);
    entry(name, || {
        found
            .and_then(|c| body(&c))
            .inspect_err(|e| group::with(&GROUP, |g| g.fail(e)))
    })
}

pub(super) const OK: Result<ncclResult_t> = Ok(ncclResult_t::ncclSuccess);

/// NCCL's name of a type, for messages.
pub(super) fn datatype_name(t: DataType) -> &'static str {
    match t {
        DataType::Int8 => "ncclInt8",
        DataType::Uint8 => "ncclUint8",
        DataType::Int32 => "ncclInt32",
        DataType::Uint32 => "ncclUint32",
        DataType::Int64 => "ncclInt64",
        DataType::Uint64 => "ncclUint64",
        DataType::Float16 => "ncclFloat16",
        DataType::Float32 => "ncclFloat32",
        DataType::Float64 => "ncclFloat64",
        DataType::Bfloat16 => "ncclBfloat16",
        DataType::Float8e4m3 => "ncclFloat8e4m3",
        DataType::Float8e5m2 => "ncclFloat8e5m2",
    }
}

/// The core's type for `v`, an `ncclDataType_t` (the core numbers its types as NCCL does, fp8 included).
pub(super) fn datatype(v: c_int) -> Result<DataType> {
    DataType::from_number(v).ok_or_else(|| {
        Error::invalid_argument(format!(
            "datatype is {v}; it must be an ncclDataType_t, 0 (ncclInt8) to {} (ncclFloat8e5m2)",
            datatype::NUM_TYPES - 1
        ))
    })
}

/// The core's operator for `v`: a built-in `ncclRedOp_t`, or a `PreMulSum` operator made on `comm`, which
/// reduces only the type it was made for (as NCCL's).
pub(super) fn redop(v: c_int, comm: &NcclComm, datatype: DataType) -> Result<RedOp> {
    if let Some(op) = RedOp::from_number(v) {
        return Ok(op);
    }
    let made = comm.premul(v).ok_or_else(|| {
        Error::invalid_argument(format!(
            "op is {v}; it must be an ncclRedOp_t, 0 (ncclSum) to {} (ncclAvg), or an operator made by \
             ncclRedOpCreatePreMulSum on this comm (and not destroyed)",
            redop::NUM_OPS - 1
        ))
    })?;
    ensure_arg!(
        made.datatype == datatype,
        "op {v} was made by ncclRedOpCreatePreMulSum for {}, not for datatype {} of this call",
        datatype_name(made.datatype),
        datatype_name(datatype)
    );
    Ok(RedOp::PreMulSum(made.scalar))
}

/// Checks a rank argument (`root`, `peer`) against the communicator's size.
pub(super) fn check_rank(name: &str, v: c_int, comm: &NcclComm) -> Result<()> {
    let nranks = comm.nranks()?;
    ensure_arg!(
        v >= 0 && (v as usize) < nranks,
        "{name} is {v}; it must be in [0, nranks = {nranks})"
    );
    Ok(())
}

/// Runs one collective now, or queues it inside a group.
pub(super) fn issue(op: Op) -> Result<ncclResult_t> {
    let op = match group::with(&GROUP, |g| {
        if g.open() {
            g.queue(op);
            None
        } else {
            Some(op)
        }
    }) {
        None => return OK,
        Some(op) => op,
    };
    match op {
        Op::Collective {
            comm,
            call,
            root,
            stream,
        } => {
            // SAFETY: nccl.h's contract: `stream` is NULL or a live stream of the communicator's GPU.
            comm.collective(&call, root, unsafe { AppStream::from_raw(stream) })?;
            OK
        }
        Op::P2p { comm, op, stream } => {
            // SAFETY: as above.
            comm.send_recv(&[op], unsafe { AppStream::from_raw(stream) })?;
            OK
        }
        Op::Fallback(f) => {
            f.issue()?;
            OK
        }
        Op::OneSided { comm, op, stream } => {
            // SAFETY: as above.
            comm.one_sided(&op, unsafe { AppStream::from_raw(stream) })?;
            OK
        }
        Op::Init { .. } => Err(Error::internal("an initialisation outside a group")),
    }
}

/// AllReduce, AllGather, ReduceScatter, Broadcast: checked here (nothing touches a GPU before the checks
/// pass), then the core's collective, now or at the group's end.
#[allow(clippy::too_many_arguments)]
pub(super) fn collective(
    name: &'static str,
    collective: Collective,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype_value: c_int,
    op: Option<c_int>,
    root: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> ncclResult_t {
    enqueue(name, comm, |c| {
        let datatype = datatype(datatype_value)?;
        let core_op = op.map(|o| redop(o, c, datatype)).transpose()?;
        // Ranks on several hosts: NVIDIA's communicator carries every call (ours have no transport there).
        if let Some(f) = c.fallback_for_all() {
            c.open()?;
            if collective.rooted() {
                check_rank("root", root, c)?;
            }
            let op = match op {
                Some(o) if o >= redop::NUM_OPS => c
                    .premul(o)
                    .and_then(|p| p.fallback)
                    .ok_or_else(|| Error::invalid_usage(format!("op {o} has no twin on NVIDIA's communicator")))?,
                Some(o) => o,
                None => 0,
            };
            let call = fallback::Call::Collective {
                collective,
                send: sendbuff as u64,
                recv: recvbuff as u64,
                count,
                datatype: datatype_value,
                op,
                root,
            };
            return forward(f, call, stream);
        }
        let core = c.usable()?;
        let call = Call {
            collective,
            function: name,
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype,
            op: core_op,
            root: root.max(0) as usize,
        };
        // The checks the core makes without a GPU (root, sizes, NULL buffers), made here too so that a
        // call queued in a group fails at once.
        call.sizes(core.rank(), core.nranks(), root as i64)?;
        issue(Op::Collective {
            comm: core,
            call,
            root: root as i64,
            stream: stream as u64,
        })
    })
}

/// Issues `call` on NVIDIA's communicator `f`, now or at the group's end.
pub(super) fn forward(f: &Arc<fallback::Comm>, call: fallback::Call, stream: *mut c_void) -> Result<ncclResult_t> {
    issue(Op::Fallback(Forwarded {
        comm: f.clone(),
        call,
        stream: stream as u64,
    }))
}

/// Ends an initialisation: NVIDIA's communicator is made beside ours where `MSCCLPP_NCCL_FALLBACK` asks
/// for one (every rank does this at once, as the initialisation itself), then the outcome is recorded.
///
/// Then the collectives are set up (scratch memory mapped between the ranks), collectively as the
/// initialisation is: a first send or receive need not involve every rank, so their memory must be
/// mapped before any. Without a GPU driver nothing is set up (a call that needs the GPU fails then); where
/// the ranks span hosts our collectives cannot run, and NVIDIA's communicator carries everything if there
/// is one, else the initialisation fails with the reason.
pub(super) fn finish_init(comm: &NcclComm, result: Result<Communicator>) {
    let result = result.and_then(|core| {
        comm.attach_fallback(fallback::attach(&core));
        if let Some(blocks) = comm.cta_limit() {
            core.limit_ctas(blocks);
        }
        if ensure_driver().is_ok()
            && let Err(e) = core.prepare_collectives()
        {
            if comm.fallback_for_all().is_none() {
                return Err(e);
            }
            log::info!(
                "our collectives are not set up ({}); NVIDIA's communicator carries every call",
                e.message
            );
        }
        Ok(core)
    });
    comm.complete(result);
}

/// How an initialisation reaches its peers: through `NCCL_COMM_ID`'s address where it is set (rank 0
/// listens there; the unique id is not read), else through the unique id's root.
pub(super) fn init_job(nranks: usize, rank: usize, id: &ncclUniqueId) -> Result<InitJob> {
    if let Some(address) = crate::settings::NCCL_COMM_ID.text() {
        return Ok(Box::new(move || {
            Communicator::init_by_address(nranks, &address, rank, BOOTSTRAP_TIMEOUT)
        }));
    }
    let bytes = crate::abi::id_bytes(&id.internal);
    let id = UniqueId::from_bytes(&bytes, "unique id", "ncclGetUniqueId")?;
    Ok(Box::new(move || {
        Communicator::init_by_id(nranks, &id, rank, BOOTSTRAP_TIMEOUT)
    }))
}

/// Runs an initialisation on this thread (in the context current where it was asked for) and records its
/// outcome in `comm`.
fn run_init(comm: &NcclComm, gpu: Option<GpuContext>, job: InitJob) {
    if let Some(g) = gpu {
        let _ = g.make_current();
    }
    let _rank = comm.rank().map(RankScope::enter);
    let result = job();
    if let Err(e) = &result {
        log::warn!("initialising a communicator: {}", e.message);
    }
    finish_init(comm, result);
}

/// The device a communicator made now on this thread works on (see `NcclComm::device`).
pub(super) fn current_device(gpu: Option<GpuContext>) -> Option<i32> {
    gpu.map(|g| g.device).or_else(|| ensure_driver().ok().map(|_| 0))
}

/// `ncclCommInitRank` and `ncclCommInitRankConfig`.
unsafe fn init_rank(
    name: &str,
    out: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    config: *const ncclConfig_t,
) -> ncclResult_t {
    entry(name, || {
        non_null(out, "comm")?;
        let blocking_default = crate::settings::NCCL_COMM_BLOCKING.flag().unwrap_or(true);
        // SAFETY: nccl.h's contract: NULL or the caller's config.
        let cfg = unsafe { config::read(config, blocking_default) }?;
        ensure_arg!(nranks >= 1, "nranks is {nranks}; it must be at least 1");
        ensure_arg!(
            rank >= 0 && rank < nranks,
            "rank is {rank}; it must be in [0, nranks = {nranks})"
        );
        let (nranks, rank) = (nranks as usize, rank as usize);
        let job = init_job(nranks, rank, id)?;
        let gpu = GpuContext::current_if_any();
        let comm = NcclComm::pending(rank, nranks, current_device(gpu), cfg.name);
        comm.set_blocking(cfg.blocking);
        comm.set_cta_limit(cfg.max_ctas);
        // SAFETY: checked non-null.
        unsafe { start(out, comm, gpu, cfg.blocking, job) }
    })
}

/// Makes `comm` by running `job`, as its config and the group say: inside a group, at the group's end
/// (`*out` set now); non-blocking, on a thread of its own (`*out` set now, `ncclInProgress`); else now,
/// `*out` set once it is made. Initialisations, splits and shrinks all end here.
///
/// # Safety
/// `out` is non-null and writable.
pub(super) unsafe fn start(
    out: *mut ncclComm_t,
    comm: Arc<NcclComm>,
    gpu: Option<GpuContext>,
    blocking: bool,
    job: InitJob,
) -> Result<ncclResult_t> {
    let in_group = group::with(&GROUP, |g| g.open());
    if in_group || !blocking {
        let handle = ncomm::register(comm.clone());
        // SAFETY: the caller's contract.
        unsafe { *out = handle };
        if in_group {
            group::with(&GROUP, |g| g.queue(Op::Init { comm, gpu, job }));
            return OK;
        }
        std::thread::Builder::new()
            .name("nccl-init".into())
            .spawn(move || run_init(&comm, gpu, job))
            .map_err(|e| Error::system(format!("cannot start the initialisation thread: {e}")))?;
        return Ok(ncclResult_t::ncclInProgress);
    }
    let _rank = comm.rank().map(RankScope::enter);
    finish_init(&comm, Ok(job()?));
    // SAFETY: the caller's contract.
    unsafe { *out = ncomm::register(comm) };
    OK
}

/// Issues a group's work: the initialisations all at once, then the collectives, in order per
/// communicator (one thread per communicator when there are several, since a communicator's first call
/// waits for its peers, which may be this thread's other communicators). Returns the first error.
fn run_group(ops: Vec<Op>) -> Result<ncclResult_t> {
    let mut inits = Vec::new();
    let mut by_comm: Vec<CommWork> = Vec::new();
    let mut forwarded = Vec::new();
    for op in ops {
        match op {
            Op::Init { comm, gpu, job } => inits.push((comm, gpu, job)),
            Op::Fallback(f) => forwarded.push(f),
            Op::Collective {
                comm,
                call,
                root,
                stream,
            } => CommWork::of(&mut by_comm, comm).calls.push((call, root, stream)),
            Op::P2p { comm, op, stream } => CommWork::of(&mut by_comm, comm).p2p.push((op, stream)),
            Op::OneSided { comm, op, stream } => CommWork::of(&mut by_comm, comm).one_sided.push((op, stream)),
        }
    }
    let mut first: Option<Error> = None;
    if !inits.is_empty() {
        let comms: Vec<Arc<NcclComm>> = inits.iter().map(|(c, _, _)| c.clone()).collect();
        std::thread::scope(|s| {
            for (comm, gpu, job) in inits {
                s.spawn(move || run_init(&comm, gpu, job));
            }
        });
        first = comms.iter().find_map(|c| c.core().err());
    }
    // Every rank issues a communicator's collectives first, in call order, then its sends and receives
    // in one launch: the same order everywhere, so that no rank's kernel waits behind one its peer
    // queued later.
    let run = |work: &CommWork| -> Result<()> {
        for (call, root, stream) in &work.calls {
            // SAFETY: nccl.h's contract for the stream of each call, kept until the group's end.
            let stream = unsafe { AppStream::from_raw(*stream) };
            work.comm.collective(call, *root, stream)?;
        }
        if let Some((_, stream)) = work.p2p.first() {
            // Two launches of one group on two streams could each wait for the other's share of the GPU.
            if work.p2p.iter().any(|(_, s)| s != stream) {
                return Err(Error::invalid_usage(
                    "the sends and receives of one group on one communicator use several streams; this library \
                     carries them out on one stream per communicator and group",
                ));
            }
            let ops: Vec<P2pOp> = work.p2p.iter().map(|(op, _)| *op).collect();
            // SAFETY: as above.
            work.comm.send_recv(&ops, unsafe { AppStream::from_raw(*stream) })?;
        }
        // Then the one-sided calls, their waits last: a wait queued before a put of the same group would
        // hold the stream back from the put its peer may be waiting for.
        for i in super::rma::group_order(&work.one_sided) {
            let (op, stream) = &work.one_sided[i];
            // SAFETY: as above.
            work.comm.one_sided(op, unsafe { AppStream::from_raw(*stream) })?;
        }
        Ok(())
    };
    if by_comm.len() == 1 {
        if let Err(e) = run(&by_comm[0]) {
            first.get_or_insert(e);
        }
    } else if by_comm.len() > 1 {
        let gpu = GpuContext::current_if_any();
        let errors: Vec<Error> = std::thread::scope(|s| {
            let workers: Vec<_> = by_comm
                .iter()
                .map(|work| {
                    s.spawn(move || {
                        if let Some(g) = gpu {
                            let _ = g.make_current();
                        }
                        run(work)
                    })
                })
                .collect();
            workers
                .into_iter()
                .filter_map(|w| {
                    w.join()
                        .unwrap_or_else(|_| Err(Error::internal("a group's thread panicked")))
                        .err()
                })
                .collect()
        });
        if let Some(e) = errors.into_iter().next() {
            first.get_or_insert(e);
        }
    }
    // NVIDIA's share of the group, in one NVIDIA group after ours: within a group NCCL promises no order
    // between operations either, and every rank issues its share in the same place. Issued even after an
    // error of ours, so that the peers' NVIDIA calls are not left waiting.
    if let Some(f) = forwarded.first()
        && let Err(e) = f.comm.library().issue_group(&forwarded)
    {
        first.get_or_insert(e);
    }
    match first {
        Some(e) => Err(e),
        None => OK,
    }
}

// ---- version, unique id, initialisation ----

nccl_export! {
    /// The version of NCCL's API this library implements: 2.32.3 (`NCCL_VERSION_CODE`, 23203).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> ncclResult_t {
        entry("ncclGetVersion", || {
            non_null(version, "version")?;
            // SAFETY: checked non-null.
            unsafe { *version = NCCL_VERSION_CODE };
            OK
        })
    }
}

nccl_export! {
    /// Starts a bootstrap root in this process and describes it in the id (unless `NCCL_COMM_ID` is set,
    /// where rank 0 listens instead).
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        entry("ncclGetUniqueId", || {
            non_null(uniqueId, "uniqueId")?;
            let bytes = if crate::settings::NCCL_COMM_ID.text().is_some() {
                [0u8; NCCL_UNIQUE_ID_BYTES]
            } else {
                UniqueId::create(BOOTSTRAP_TIMEOUT)?.to_bytes()
            };
            // SAFETY: checked non-null; the caller provides a writable ncclUniqueId.
            let out = unsafe { &mut *uniqueId };
            crate::abi::write_id_bytes(&mut out.internal, &bytes);
            OK
        })
    }
}

nccl_export! {
    /// Joins `nranks` ranks meeting at the id's root, blocking or not as the config says.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut ncclComm_t,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        // SAFETY: nccl.h's contract for each argument.
        unsafe { init_rank("ncclCommInitRankConfig", comm, nranks, &commId, rank, config) }
    }
}

nccl_export! {
    /// Joins `nranks` ranks meeting at the id's root.
    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut ncclComm_t,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
    ) -> ncclResult_t {
        // SAFETY: nccl.h's contract for each argument.
        unsafe { init_rank("ncclCommInitRank", comm, nranks, &commId, rank, std::ptr::null()) }
    }
}

nccl_export! {
    /// `ncclCommInitRankConfig` for a rank given several ids: carried out for one id.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut ncclComm_t,
        nranks: c_int,
        myrank: c_int,
        nId: c_int,
        commIds: *mut ncclUniqueId,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        let name = "ncclCommInitRankScalable";
        // Every rank is given the same ids, and one of our roots serves any number of ranks: the first id
        // does. Taken only where MSCCLPP_NCCL_FALLBACK is set, as the other ids' roots are then left to
        // time out unused.
        let fallback_set = crate::settings::NCCL_FALLBACK.text().is_some();
        if (nId == 1 || (nId > 1 && fallback_set)) && !commIds.is_null() {
            // SAFETY: checked non-null; the caller passes nId ids.
            let id = unsafe { &*commIds };
            // SAFETY: nccl.h's contract for each argument.
            return unsafe { init_rank(name, newcomm, nranks, id, myrank, config) };
        }
        entry(name, || {
            non_null(newcomm, "newcomm")?;
            non_null(commIds, "commIds")?;
            ensure_arg!(nId >= 1, "nId is {nId}; it must be at least 1");
            ensure_arg!(nranks >= 1, "nranks is {nranks}; it must be at least 1");
            ensure_arg!(
                myrank >= 0 && myrank < nranks,
                "myrank is {myrank}; it must be in [0, nranks = {nranks})"
            );
            // SAFETY: nccl.h's contract: NULL or the caller's config.
            unsafe { config::read(config, true) }?;
            Err(Error::invalid_usage(format!(
                "{name} with {nId} ids is not carried out by this library yet (one id is); {}",
                fallback::unavailable_hint()
            )))
        })
    }
}

nccl_export! {
    /// One process, one rank per listed device (`devlist` NULL: devices 0 to ndev-1).
    fn ncclCommInitAll / pncclCommInitAll(comms: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
        entry("ncclCommInitAll", || {
            non_null(comms, "comms")?;
            ensure_arg!(ndev >= 1, "ndev is {ndev}; it must be at least 1");
            let devices: Vec<c_int> = if devlist.is_null() {
                (0..ndev).collect()
            } else {
                // SAFETY: the caller passes ndev devices.
                unsafe { std::slice::from_raw_parts(devlist, ndev as usize) }.to_vec()
            };
            if let Some(bad) = devices.iter().find(|&&d| d < 0) {
                return Err(Error::invalid_argument(format!("devlist holds {bad}; devices are not negative")));
            }
            ensure_driver()?;
            let n = devices.len();
            let id = UniqueId::create(BOOTSTRAP_TIMEOUT)?;
            type Made = Result<(Communicator, Option<Arc<fallback::Comm>>)>;
            let results: Vec<Made> = std::thread::scope(|s| {
                let workers: Vec<_> = devices
                    .iter()
                    .enumerate()
                    .map(|(rank, &device)| {
                        let id = &id;
                        s.spawn(move || {
                            let _rank = RankScope::enter(rank);
                            GpuContext::set_device(device)?;
                            let core = Communicator::init_by_id(n, id, rank, BOOTSTRAP_TIMEOUT)?;
                            let f = fallback::attach(&core);
                            // As `finish_init`: the collectives' memory, set up by every rank at once, before
                            // any send, receive or one-sided call (which need not involve every rank).
                            if let Err(e) = core.prepare_collectives() {
                                let _ = core.destroy();
                                if let Some(f) = f {
                                    let _ = f.abort();
                                }
                                return Err(e);
                            }
                            Ok((core, f))
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| w.join().unwrap_or_else(|_| Err(Error::internal("an initialisation thread panicked"))))
                    .collect()
            });
            if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
                let e = e.clone();
                for (c, f) in results.into_iter().flatten() {
                    let _ = c.destroy();
                    if let Some(f) = f {
                        let _ = f.abort();
                    }
                }
                return Err(e);
            }
            for (rank, ((c, f), device)) in results.into_iter().flatten().zip(devices).enumerate() {
                let comm = NcclComm::pending(rank, n, Some(device), None);
                comm.attach_fallback(f);
                comm.complete(Ok(c));
                // SAFETY: checked non-null; the caller provides ndev handles.
                unsafe { *comms.add(rank) = ncomm::register(comm) };
            }
            OK
        })
    }
}

// ---- ending a communicator ----

nccl_export! {
    /// Ends the communicator's work: later calls on it but `ncclCommDestroy` are refused. Its work is
    /// stream-ordered on the application's streams, so nothing is left to flush.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        with_comm("ncclCommFinalize", comm, |c| {
            c.finalize()?;
            OK
        })
    }
}

nccl_export! {
    /// Frees the communicator (waiting for an initialisation still running). NULL: nothing to do.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        if comm.is_null() {
            return ncclResult_t::ncclSuccess;
        }
        with_comm("ncclCommDestroy", comm, |_| {
            let c = ncomm::unregister(comm)?;
            if let Some(core) = c.wait_core() {
                core.destroy()?;
            }
            c.destroy_fallback()?;
            OK
        })
    }
}

nccl_export! {
    /// Aborts the communicator on every rank (also while another thread waits in a call on it, which then
    /// returns) and frees it. NULL: nothing to do.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        if comm.is_null() {
            return ncclResult_t::ncclSuccess;
        }
        with_comm("ncclCommAbort", comm, |_| {
            ncomm::unregister(comm)?.abort()?;
            OK
        })
    }
}

nccl_export! {
    /// Stops the communicator's work without freeing it (`NcclComm::revoke`: our abort, the peers told);
    /// afterwards only `ncclCommShrink`, `ncclCommDestroy`, `ncclCommAbort` and the queries work on it,
    /// and `ncclCommGetAsyncError` reports `ncclSuccess` unless a peer died. Where the ranks span hosts,
    /// NVIDIA's communicator carries everything and is revoked instead.
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
        with_comm("ncclCommRevoke", comm, |c| {
            ensure_arg!(revokeFlags == 0, "revokeFlags is {revokeFlags}; it must be 0 (NCCL_REVOKE_DEFAULT)");
            if let Some(f) = c.fallback_for_all() {
                c.open()?;
                f.revoke(revokeFlags)?;
                return OK;
            }
            c.revoke()?;
            OK
        })
    }
}

/// The blocking mode of a split or shrink: its config's, or the parent's where it has none (NCCL's new
/// communicator inherits the parent's configuration then).
///
/// # Safety
/// `config` is NULL or the caller's `ncclConfig_t`.
pub(super) unsafe fn child_config(parent: &NcclComm, config: *const ncclConfig_t) -> Result<config::Config> {
    if config.is_null() {
        return Ok(config::Config::default_for(parent.blocking()));
    }
    let blocking_default = crate::settings::NCCL_COMM_BLOCKING.flag().unwrap_or(true);
    // SAFETY: the caller's contract.
    unsafe { config::read(config, blocking_default) }
}

/// Makes the new communicator of a split or shrink of `parent` with `job`, as `start` does.
///
/// # Safety
/// `newcomm` is non-null and writable.
pub(super) unsafe fn start_child(
    parent: &NcclComm,
    newcomm: *mut ncclComm_t,
    place: Option<(usize, usize)>,
    cfg: config::Config,
    job: InitJob,
) -> Result<ncclResult_t> {
    let gpu = GpuContext::current_if_any();
    let comm = match place {
        Some((rank, nranks)) => NcclComm::pending(rank, nranks, parent.device, cfg.name),
        None => NcclComm::unplaced(parent.device, cfg.name),
    };
    comm.set_blocking(cfg.blocking);
    comm.set_cta_limit(cfg.max_ctas);
    // SAFETY: the caller's contract.
    unsafe { start(newcomm, comm, gpu, cfg.blocking, job) }
}

nccl_export! {
    /// The ranks that pass one color make a new communicator, ordered by key, then by parent rank
    /// (collective over the parent; `NCCL_SPLIT_NOCOLOR`: none, `*newcomm` NULL). Blocking or not as its
    /// config says (the parent's mode without one); inside a group, made at its end. See `split.rs`.
    /// Where the ranks span hosts, NVIDIA's library makes it (NVIDIA's alone).
    fn ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        with_comm("ncclCommSplit", comm, |c| {
            non_null(newcomm, "newcomm")?;
            // SAFETY: checked non-null.
            unsafe { *newcomm = std::ptr::null_mut() };
            ensure_arg!(
                color >= 0 || color == NCCL_SPLIT_NOCOLOR,
                "color is {color}; it must not be negative, or NCCL_SPLIT_NOCOLOR"
            );
            // SAFETY: nccl.h's contract: NULL or the caller's config.
            let cfg = unsafe { child_config(c, config) }?;
            if let Some(f) = c.fallback_for_all() {
                c.open()?;
                // SAFETY: checked non-null above.
                return unsafe { split(c, f, fallback::Split::Color { color, key }, newcomm, config) };
            }
            let parent = c.usable()?;
            let count = c.next_split();
            super::split::announce(&parent, count, color, key)?;
            if color == NCCL_SPLIT_NOCOLOR {
                return OK;
            }
            let job = super::split::split_job(parent, count, color, key, BOOTSTRAP_TIMEOUT);
            // SAFETY: checked non-null.
            unsafe { start_child(c, newcomm, None, cfg, job) }
        })
    }
}

/// `ncclCommSplit` / `ncclCommShrink` on the fallback: NVIDIA's new communicator, behind a handle of ours
/// (NULL where this rank is in none).
unsafe fn split(
    c: &NcclComm,
    f: &Arc<fallback::Comm>,
    how: fallback::Split,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> Result<ncclResult_t> {
    // SAFETY: the caller's config, under nccl.h's contract.
    let handle = match unsafe { f.split(how, config) }? {
        Some((new, rank, nranks)) => ncomm::register(NcclComm::elsewhere(rank, nranks, c.device, new)),
        None => std::ptr::null_mut(),
    };
    // SAFETY: the caller checked it non-null.
    unsafe { *newcomm = handle };
    OK
}

nccl_export! {
    /// The parent's ranks but the excluded ones make a new communicator, in parent order; the excluded
    /// ranks do not call it. Works after a failure, the dead ranks excluded: the survivors meet over the
    /// parent's connections between them (see `split.rs`). `NCCL_SHRINK_ABORT` first revokes the parent
    /// (`ncclCommRevoke`). Blocking or not as `ncclCommSplit`. Where the ranks span hosts, NVIDIA's library
    /// makes it (NVIDIA's alone).
    fn ncclCommShrink / pncclCommShrink(
        comm: ncclComm_t,
        excludeRanksList: *mut c_int,
        excludeRanksCount: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
        shrinkFlags: c_int,
    ) -> ncclResult_t {
        with_comm("ncclCommShrink", comm, |c| {
            non_null(newcomm, "newcomm")?;
            // SAFETY: checked non-null.
            unsafe { *newcomm = std::ptr::null_mut() };
            ensure_arg!(
                matches!(shrinkFlags, NCCL_SHRINK_DEFAULT | NCCL_SHRINK_ABORT),
                "shrinkFlags is {shrinkFlags}; it must be NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
            );
            let (rank, nranks) = c.place()?;
            ensure_arg!(
                excludeRanksCount >= 0 && (excludeRanksCount as usize) < nranks,
                "excludeRanksCount is {excludeRanksCount}; it must be in [0, nranks = {nranks})"
            );
            let exclude = if excludeRanksCount > 0 {
                non_null(excludeRanksList, "excludeRanksList")?;
                // SAFETY: checked non-null; the caller passes excludeRanksCount ranks.
                unsafe { std::slice::from_raw_parts(excludeRanksList, excludeRanksCount as usize) }.to_vec()
            } else {
                Vec::new()
            };
            let (kept, excluded) = super::split::survivors(nranks, &exclude)?;
            // SAFETY: nccl.h's contract: NULL or the caller's config.
            let cfg = unsafe { child_config(c, config) }?;
            if let Some(f) = c.fallback_for_all() {
                c.open()?;
                let how = fallback::Split::Shrink {
                    exclude,
                    flags: shrinkFlags,
                };
                // SAFETY: checked non-null above.
                return unsafe { split(c, f, how, newcomm, config) };
            }
            ensure_arg!(
                excluded.binary_search(&rank).is_err(),
                "excludeRanksList holds this rank ({rank}): the ranks left out do not call ncclCommShrink"
            );
            // Any state of the parent will do (failed, revoked, finalized): a shrink is how one goes on.
            let parent = c.core()?;
            if shrinkFlags == NCCL_SHRINK_ABORT {
                c.revoke()?;
            }
            let index = kept.iter().position(|&r| r == rank).expect("not excluded, so kept");
            let place = Some((index, kept.len()));
            let job = super::split::shrink_job(parent, c.next_shrink(), kept, excluded, BOOTSTRAP_TIMEOUT);
            // SAFETY: checked non-null.
            unsafe { start_child(c, newcomm, place, cfg, job) }
        })
    }
}

// ---- errors and queries ----

nccl_export! {
    /// A static description of a result code.
    fn ncclGetErrorString / pncclGetErrorString(result: c_int) -> *const c_char {
        nerror::describe(result).as_ptr()
    }
}

nccl_export! {
    /// The last error's message: the communicator's failure once one was seen, else that of this
    /// thread's last failing call, else (NVIDIA's library keeps one for the process, and PyTorch asks with
    /// NULL from its watchdog thread) the process's last error, a communicator's failure reported by
    /// `ncclCommGetAsyncError` among them ("" when none).
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        let failure = (!comm.is_null())
            .then(|| ncomm::lookup(comm).ok())
            .flatten()
            .and_then(|c| {
                c.async_error();
                c.failure_message()
            });
        failure.unwrap_or_else(|| {
            let mine = nerror::last_on_this_thread();
            // SAFETY: a NUL-terminated string of this thread's, valid until its next failing call.
            if unsafe { CStr::from_ptr(mine) }.is_empty() { nerror::last_in_process() } else { mine }
        })
    }
}

nccl_export! {
    /// The communicator's asynchronous error, without blocking: `ncclInProgress` while it initialises,
    /// `ncclRemoteError` once a peer failed, `ncclInvalidUsage` after its own abort.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t {
        with_comm("ncclCommGetAsyncError", comm, |c| {
            non_null(asyncError, "asyncError")?;
            let r = c.async_error();
            if !matches!(r, ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress)
                && let Some(m) = c.failure_message()
            {
                // SAFETY: the communicator's message, a NUL-terminated string it keeps.
                nerror::record_in_process(&unsafe { CStr::from_ptr(m) }.to_string_lossy());
            }
            // SAFETY: checked non-null.
            unsafe { *asyncError = r };
            OK
        })
    }
}

nccl_export! {
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
        with_comm("ncclCommCount", comm, |c| {
            non_null(count, "count")?;
            let n = c.nranks()?;
            // SAFETY: checked non-null.
            unsafe { *count = n as c_int };
            OK
        })
    }
}

nccl_export! {
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
        with_comm("ncclCommUserRank", comm, |c| {
            non_null(rank, "rank")?;
            let (r, _) = c.place()?;
            // SAFETY: checked non-null.
            unsafe { *rank = r as c_int };
            OK
        })
    }
}

nccl_export! {
    /// The CUDA device the communicator works on.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
        with_comm("ncclCommCuDevice", comm, |c| {
            non_null(device, "device")?;
            let d = c
                .device
                .ok_or_else(|| Error::cuda("the communicator has no device: the CUDA driver is not installed"))?;
            // SAFETY: checked non-null.
            unsafe { *device = d };
            OK
        })
    }
}

// ---- memory ----

/// `ncclMemAlloc`'s allocations, by address.
static ALLOCATIONS: Lazy<Mutex<HashMap<u64, DeviceAllocation>>> = Lazy::new(Default::default);

nccl_export! {
    /// Device memory of the current device (size 0: `*ptr` = NULL).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
        entry("ncclMemAlloc", || {
            non_null(ptr, "ptr")?;
            if size == 0 {
                // SAFETY: checked non-null.
                unsafe { *ptr = std::ptr::null_mut() };
                return OK;
            }
            let alloc = DeviceAllocation::zeroed(&GpuContext::current()?, size)?;
            let address = alloc.ptr();
            ALLOCATIONS.lock().insert(address, alloc);
            // SAFETY: checked non-null.
            unsafe { *ptr = address as *mut c_void };
            OK
        })
    }
}

nccl_export! {
    /// Frees memory of `ncclMemAlloc` (NULL: nothing to do).
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        entry("ncclMemFree", || {
            if ptr.is_null() {
                return OK;
            }
            let alloc = ALLOCATIONS.lock().remove(&(ptr as u64));
            ensure_arg!(alloc.is_some(), "ptr {ptr:p} was not allocated by ncclMemAlloc (or was freed)");
            drop(alloc);
            OK
        })
    }
}

nccl_export! {
    /// Registers a buffer with the communicator (`crate::registration`, as `mscclppCommRegister`): its
    /// allocation recorded so that memory freed and allocated again is told apart, and exported to the peers,
    /// whose collectives then read and write it directly (zero-copy, docs/ZERO_COPY.md).
    fn ncclCommRegister / pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> ncclResult_t {
        with_comm("ncclCommRegister", comm, |c| {
            non_null(handle, "handle")?;
            let token = register(c, buff, size, Kind::Buffer)?;
            // SAFETY: checked non-null.
            unsafe { *handle = token as *mut c_void };
            OK
        })
    }
}

nccl_export! {
    /// Forgets a registration. A NULL handle is NCCL's "nothing registered" (what its register gives
    /// without local registration): nothing to do.
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        with_comm("ncclCommDeregister", comm, |c| {
            if !handle.is_null() {
                c.core()?.deregister(handle as u64, Kind::Buffer, "handle")?;
            }
            OK
        })
    }
}

nccl_export! {
    /// Registers a window: a registration of its own kind in the same table, its flags kept.
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: ncclComm_t,
        buff: *mut c_void,
        size: usize,
        win: *mut ncclWindow_t,
        winFlags: c_int,
    ) -> ncclResult_t {
        with_comm("ncclCommWindowRegister", comm, |c| {
            non_null(win, "win")?;
            ensure_arg!(
                matches!(winFlags, NCCL_WIN_DEFAULT | NCCL_WIN_COLL_SYMMETRIC),
                "winFlags is {winFlags}; it must be NCCL_WIN_DEFAULT (0) or NCCL_WIN_COLL_SYMMETRIC (1)"
            );
            let token = register(c, buff, size, Kind::Window { flags: winFlags })?;
            // SAFETY: checked non-null.
            unsafe { *win = token as ncclWindow_t };
            OK
        })
    }
}

nccl_export! {
    /// Forgets a window (NULL: nothing to do, as `ncclCommDeregister`).
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        with_comm("ncclCommWindowDeregister", comm, |c| {
            if !win.is_null() {
                c.core()?.deregister(win as u64, Kind::Window { flags: 0 }, "win")?;
            }
            OK
        })
    }
}

/// Registers `[buff, buff + size)` of `kind` with the core communicator: the arguments first (so that they
/// are reported whatever the communicator's state), then its state (refused once revoked or finalized),
/// then the driver. Memory of `ncclMemAlloc` is marked as the library's own.
fn register(c: &NcclComm, buff: *mut c_void, size: usize, kind: Kind) -> Result<u64> {
    crate::registration::check_range(buff as u64, size)?;
    let core = c.usable()?;
    let start = buff as u64;
    let library_memory = ALLOCATIONS
        .lock()
        .values()
        .any(|a| start >= a.ptr() && start + size as u64 <= a.ptr() + a.size() as u64);
    core.register(start, size, kind, library_memory)
}

// ---- operators ----

nccl_export! {
    /// Makes a `PreMulSum` operator (the sum of every rank's input, each multiplied by its rank's scalar
    /// first), for `datatype` alone: an immediate scalar is copied now, a device one is read by every
    /// kernel that uses the operator. Kept until `ncclRedOpDestroy`.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut c_int,
        scalar: *mut c_void,
        datatype: c_int,
        residence: c_int,
        comm: ncclComm_t,
    ) -> ncclResult_t {
        with_comm("ncclRedOpCreatePreMulSum", comm, |c| {
            non_null(op, "op")?;
            non_null(scalar, "scalar")?;
            let datatype_value = datatype;
            let datatype = self::datatype(datatype_value)?;
            let size = datatype.size();
            let core_scalar = match residence {
                NCCL_SCALAR_HOST_IMMEDIATE => {
                    // SAFETY: checked non-null; the caller's scalar is one value of `datatype` in host memory.
                    let bytes = unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), size) };
                    Scalar::immediate(bytes)
                }
                NCCL_SCALAR_DEVICE => {
                    ensure_arg!(
                        (scalar as usize).is_multiple_of(size),
                        "scalar {scalar:p} (ncclScalarDevice) is not aligned to its type {} ({size} bytes)",
                        datatype_name(datatype)
                    );
                    Scalar::Device(scalar as u64)
                }
                other => {
                    return Err(Error::invalid_argument(format!(
                        "residence is {other}; it must be ncclScalarDevice (0) or ncclScalarHostImmediate (1)"
                    )));
                }
            };
            // Its twin on NVIDIA's communicator, where that carries the collectives (ranks on several hosts).
            let twin = c
                .fallback_for_all()
                // SAFETY: the caller's scalar, under nccl.h's contract (checked non-null).
                .map(|f| unsafe { f.create_premul(scalar, datatype_value, residence) })
                .transpose()?;
            let n = c.add_premul(PreMulSum {
                datatype,
                scalar: core_scalar,
                fallback: twin,
            });
            // SAFETY: checked non-null.
            unsafe { *op = n };
            OK
        })
    }
}

nccl_export! {
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: ncclComm_t) -> ncclResult_t {
        with_comm("ncclRedOpDestroy", comm, |c| {
            ensure_arg!(
                op >= redop::NUM_OPS,
                "op is {op}, a built-in operator; only operators made by ncclRedOpCreatePreMulSum are destroyed"
            );
            let made = c.remove_premul(op);
            ensure_arg!(
                made.is_some(),
                "op {op} was not made by ncclRedOpCreatePreMulSum on this comm (or was destroyed)"
            );
            if let (Some(f), Some(twin)) = (c.fallback(), made.and_then(|m| m.fallback)) {
                f.destroy_premul(twin)?;
            }
            OK
        })
    }
}

// ---- collectives ----

nccl_export! {
    /// `recvbuff` gets the reduction of every rank's `sendbuff` (`count` elements).
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclAllReduce", Collective::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), 0, comm, stream)
    }
}

nccl_export! {
    /// `recvbuff` (`nranks * sendcount` elements) gets every rank's `sendbuff`, in rank order.
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclAllGather", Collective::AllGather, sendbuff, recvbuff, sendcount, datatype, None, 0, comm, stream)
    }
}

nccl_export! {
    /// `recvbuff` (`recvcount` elements) gets this rank's piece of the reduction of every `sendbuff`.
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: c_int,
        op: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclReduceScatter", Collective::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, Some(op), 0, comm, stream)
    }
}

nccl_export! {
    /// Every rank's `recvbuff` gets `root`'s `sendbuff`.
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclBroadcast", Collective::Broadcast, sendbuff, recvbuff, count, datatype, None, root, comm, stream)
    }
}

nccl_export! {
    /// `ncclBroadcast` in place.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclBcast", Collective::Broadcast, buff, buff, count, datatype, None, root, comm, stream)
    }
}

nccl_export! {
    /// `root`'s `recvbuff` gets the reduction of every rank's `sendbuff` (the others' is not used).
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclReduce", Collective::Reduce, sendbuff, recvbuff, count, datatype, Some(op), root, comm, stream)
    }
}

nccl_export! {
    /// Rank r's `recvbuff` piece p (`count` elements each) gets rank p's `sendbuff` piece r.
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclAlltoAll", Collective::AllToAll, sendbuff, recvbuff, count, datatype, None, 0, comm, stream)
    }
}

nccl_export! {
    /// `root`'s `recvbuff` piece r (`count` elements each) gets rank r's `sendbuff`.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclGather", Collective::Gather, sendbuff, recvbuff, count, datatype, None, root, comm, stream)
    }
}

nccl_export! {
    /// Rank r's `recvbuff` (`count` elements) gets piece r of `root`'s `sendbuff`.
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclScatter", Collective::Scatter, sendbuff, recvbuff, count, datatype, None, root, comm, stream)
    }
}

/// Send and Recv: checked here; carried out by the core (a group's together, see `run_group`), any type
/// (fp8 too: bytes), or on NVIDIA's communicator where ours sends everything there (ranks on several hosts).
#[allow(clippy::too_many_arguments)]
fn point_to_point(
    name: &str,
    kind: P2pKind,
    buffer: u64,
    count: usize,
    datatype_value: c_int,
    peer: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> ncclResult_t {
    enqueue(name, comm, |c| {
        let datatype = datatype(datatype_value)?;
        check_rank("peer", peer, c)?;
        if let Some(f) = c.fallback_for_all() {
            c.open()?;
            let call = match kind {
                P2pKind::Send => fallback::Call::Send {
                    buf: buffer,
                    count,
                    datatype: datatype_value,
                    peer,
                },
                P2pKind::Recv => fallback::Call::Recv {
                    buf: buffer,
                    count,
                    datatype: datatype_value,
                    peer,
                },
            };
            return forward(f, call, stream);
        }
        let core = c.usable()?;
        let op = P2pOp {
            kind,
            peer: peer as usize,
            buffer,
            count,
            datatype,
        };
        issue(Op::P2p {
            comm: core,
            op,
            stream: stream as u64,
        })
    })
}

nccl_export! {
    /// Sends `count` elements of `sendbuff` to `peer`, which receives them with `ncclRecv` (in the same
    /// group where both must progress together).
    fn ncclSend / pncclSend(
        sendbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        point_to_point("ncclSend", P2pKind::Send, sendbuff as u64, count, datatype, peer, comm, stream)
    }
}

nccl_export! {
    /// Receives `count` elements from `peer`'s `ncclSend` into `recvbuff`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        point_to_point("ncclRecv", P2pKind::Recv, recvbuff as u64, count, datatype, peer, comm, stream)
    }
}

// ---- groups ----

nccl_export! {
    /// Opens a group (they nest): work is queued until the outermost `ncclGroupEnd`.
    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        entry("ncclGroupStart", || {
            group::with(&GROUP, |g| g.start());
            OK
        })
    }
}

nccl_export! {
    /// Closes a group; the outermost issues the group's work, in order, and returns its first error (or
    /// the error of a call made inside the group, which then issues nothing).
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        entry("ncclGroupEnd", || match group::with(&GROUP, |g| g.end())? {
            None => OK,
            Some(ended) => run_group(ended?),
        })
    }
}

nccl_export! {
    /// Closes a group as `ncclGroupEnd` does, without issuing its collectives (its initialisations run);
    /// `estimatedTime` is 0 for now: this library makes no estimate yet.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
        entry("ncclGroupSimulateEnd", || {
            non_null(simInfo, "simInfo")?;
            // SAFETY: checked non-null; its header fields come first in every version.
            let info = unsafe { &mut *simInfo };
            ensure_arg!(
                info.magic == NCCL_SIM_INFO_MAGIC,
                "simInfo's magic is {:#x}, not {NCCL_SIM_INFO_MAGIC:#x}: initialise it with NCCL_SIM_INFO_INITIALIZER",
                info.magic
            );
            let (r, estimate) = match group::with(&GROUP, |g| g.end())? {
                None => (OK, 0.0),
                Some(ended) => {
                    let ops = ended?;
                    let estimate: f64 = ops.iter().map(simulated_us).sum();
                    (run_group(ops.into_iter().filter(|op| matches!(op, Op::Init { .. })).collect()), estimate)
                }
            };
            info.estimatedTime = estimate as f32;
            r
        })
    }
}

/// What `ncclGroupSimulateEnd` reports for one queued call, in microseconds: our algorithm table's choice
/// and its model (`algorithm::estimate_us`); a send or receive as the copy family's share of one message;
/// nothing for initialisations and for calls that go to NVIDIA's library (its own estimate is not asked).
fn simulated_us(op: &Op) -> f64 {
    match op {
        Op::Collective { comm, call, .. } => {
            let piece = (call.count as u64).saturating_mul(call.datatype.size() as u64);
            let nranks = comm.nranks();
            algorithm::estimate_us(call.collective, nranks, call.collective.message(piece, nranks))
        }
        Op::P2p { op, .. } => {
            let bytes = (op.count as u64).saturating_mul(op.datatype.size() as u64);
            algorithm::estimate_us(Collective::AllToAll, 2, bytes.saturating_mul(2))
        }
        Op::Init { .. } | Op::Fallback(_) | Op::OneSided { .. } => 0.0,
    }
}

// ---- NCCL's device API: not offered ----

nccl_export! {
    /// NCCL's device API is not offered: `ncclInvalidUsage`.
    fn ncclDevCommCreate / pncclDevCommCreate(
        comm: ncclComm_t,
        reqs: *const DevCommRequirements,
        outDevComm: *mut DevComm,
    ) -> ncclResult_t {
        let _ = (reqs, outDevComm);
        with_comm("ncclDevCommCreate", comm, |_| {
            Err(Error::invalid_usage("NCCL's device API (ncclDevComm) is not offered by this library"))
        })
    }
}

nccl_export! {
    /// NCCL's device API is not offered: `ncclInvalidUsage`.
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, devComm: *const DevComm) -> ncclResult_t {
        let _ = devComm;
        with_comm("ncclDevCommDestroy", comm, |_| {
            Err(Error::invalid_usage("NCCL's device API (ncclDevComm) is not offered by this library"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn every_nccl_type_is_the_cores_fp8_included() {
        assert_eq!(datatype(10).unwrap(), DataType::Float8e4m3);
        assert_eq!(datatype(11).unwrap(), DataType::Float8e5m2);
        assert_eq!(datatype(9).unwrap(), DataType::Bfloat16);
        for bad in [-1, 12] {
            let e = datatype(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains("to 11 (ncclFloat8e5m2)"), "{e}");
        }
    }

    #[test]
    fn premulsum_operators_become_the_cores_for_their_own_type_only() {
        let c = NcclComm::pending(0, 1, None, None);
        let scalar = Scalar::immediate(&[0x38]);
        let n = c.add_premul(PreMulSum {
            datatype: DataType::Float8e4m3,
            scalar,
            fallback: None,
        });
        assert_eq!(redop(n, &c, DataType::Float8e4m3).unwrap(), RedOp::PreMulSum(scalar));
        assert_eq!(redop(2, &c, DataType::Float8e4m3).unwrap(), RedOp::Max);
        let e = redop(n, &c, DataType::Float8e5m2).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message
                .contains("for ncclFloat8e4m3, not for datatype ncclFloat8e5m2"),
            "{e}"
        );
        c.remove_premul(n);
        let e = redop(n, &c, DataType::Float8e4m3).unwrap_err();
        assert!(
            e.message.contains(&format!("op is {n}")) && e.message.contains("not destroyed"),
            "{e}"
        );
        assert!(redop(-1, &c, DataType::Float32).is_err());
    }
}
