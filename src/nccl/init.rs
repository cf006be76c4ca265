//! Making a communicator: `ncclGetUniqueId`, `ncclCommInitRank` (and its `Config` and `Scalable`
//! siblings), `ncclCommInitAll`; and what every way of making one shares (`start`): inside a group it is
//! made at the group's end, with a non-blocking config on a thread of its own (`ncclInProgress` until
//! it is), else now. Splits and shrinks (`split.rs`) and grows (`grow.rs`) work out their new
//! communicator's ranks and id, then end here too (`start_child`); every one ends in `finish_init`, which
//! attaches NVIDIA's communicator where `MSCCLPP_NCCL_FALLBACK` asks for one and sets up the collectives.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::{self as ncomm, NcclComm};
use super::config;
use super::entry::{OK, entry};
use super::fallback;
use super::queue::{GROUP, Job, Op, with};
use super::types::*;
use crate::abi::{non_null, non_null_args};
use crate::bootstrap::UniqueId;
use crate::comm::Communicator;
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::gpu::{GpuContext, ensure_driver};
use crate::logging::RankScope;
use std::ffi::c_int;
use std::sync::Arc;

/// How long set-up waits for the root and the peers.
pub(super) const BOOTSTRAP_TIMEOUT: std::time::Duration = crate::bootstrap::DEFAULT_TIMEOUT;

/// Ends an initialisation: NVIDIA's communicator is made beside ours where the ranks span hosts (it carries
/// what crosses them; none to be had fails the initialisation on every rank) or `MSCCLPP_NCCL_FALLBACK` asks
/// for one (every rank does this at once, as the initialisation itself), then the outcome is recorded.
///
/// Then the collectives are set up (scratch memory mapped between the ranks), collectively as the
/// initialisation is: a first send or receive need not involve every rank, so their memory must be
/// mapped before any. Without a GPU driver nothing is set up (a call that needs the GPU fails then); where
/// the ranks span hosts our collectives cannot run, and NVIDIA's communicator carries everything if there
/// is one, else the initialisation fails with the reason.
/// Returns the failure it recorded, for a blocking initialisation to return.
pub(super) fn finish_init(comm: &NcclComm, result: Result<Communicator>) -> Result<()> {
    let result = result.and_then(|core| {
        let engine = fallback::attach(&core)?;
        // Between hosts NVIDIA's communicator is the communicator's work too: our first failure aborts it.
        if let Some(f) = engine.as_ref().filter(|f| f.spans_hosts()) {
            let f = f.clone();
            core.failures().on_abort(Box::new(move || f.abort_detached()));
        }
        comm.attach_fallback(engine);
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
    let failure = result.as_ref().err().cloned();
    comm.complete(result);
    failure.map_or(Ok(()), Err)
}

/// How an initialisation reaches its peers: through `NCCL_COMM_ID`'s address where it is set (rank 0
/// listens there; the unique id is not read), else through the unique id's root.
pub(super) fn init_job(nranks: usize, rank: usize, id: &ncclUniqueId) -> Result<Job> {
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
pub(super) fn run_init(comm: &NcclComm, gpu: Option<GpuContext>, job: Job) {
    if let Some(g) = gpu {
        let _ = g.make_current();
    }
    let _rank = comm.rank().map(RankScope::enter);
    let result = job();
    if let Err(e) = &result {
        log::warn!("initialising a communicator: {}", e.message);
    }
    // Recorded in `comm`, where its queries and the group's end find it.
    let _ = finish_init(comm, result);
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
        let blocking_default = crate::settings::NCCL_COMM_BLOCKING.flag();
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
/// `*out` set once it is made. Initialisations, splits, shrinks and grows all end here.
///
/// # Safety
/// `out` is non-null and writable.
pub(super) unsafe fn start(
    out: *mut ncclComm_t,
    comm: Arc<NcclComm>,
    gpu: Option<GpuContext>,
    blocking: bool,
    job: Job,
) -> Result<ncclResult_t> {
    let in_group = with(&GROUP, |g| g.open());
    if in_group || !blocking {
        let handle = ncomm::register(comm.clone());
        // SAFETY: the caller's contract.
        unsafe { *out = handle };
        if in_group {
            with(&GROUP, |g| g.queue(Op::Init { comm, gpu, job }));
            return OK;
        }
        std::thread::Builder::new()
            .name("nccl-init".into())
            .spawn(move || run_init(&comm, gpu, job))
            .map_err(|e| Error::system(format!("cannot start the initialisation thread: {e}")))?;
        return Ok(ncclResult_t::ncclInProgress);
    }
    let _rank = comm.rank().map(RankScope::enter);
    // A blocking initialisation that failed returns its failure, as NCCL's does.
    finish_init(&comm, Ok(job()?))?;
    // SAFETY: the caller's contract.
    unsafe { *out = ncomm::register(comm) };
    OK
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
    let blocking_default = crate::settings::NCCL_COMM_BLOCKING.flag();
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
    job: Job,
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

// ---- exports ----

nccl_export! {
    /// Starts a bootstrap root in this process and describes it in the id (unless `NCCL_COMM_ID` is set,
    /// where rank 0 listens instead).
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        entry("ncclGetUniqueId", || {
            non_null_args!(uniqueId);
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
            non_null_args!(newcomm, commIds);
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
            non_null_args!(comms);
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
            // Every device is checked before any rank starts: a rank whose device does not exist would
            // never reach the bootstrap, and the others would wait for it until the timeout.
            let count = GpuContext::device_count()?;
            if let Some((rank, bad)) = devices.iter().enumerate().find(|&(_, &d)| d >= count) {
                return Err(Error::invalid_argument(format!(
                    "devlist[{rank}] is device {bad}, and this process sees {count} CUDA device(s) (0 to {}); \
                     CUDA_VISIBLE_DEVICES decides which",
                    count - 1
                )));
            }
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
                            let f = match fallback::attach(&core) {
                                Ok(f) => f,
                                Err(e) => {
                                    core.destroy();
                                    return Err(e);
                                }
                            };
                            // As `finish_init`: the collectives' memory, set up by every rank at once, before
                            // any send, receive or one-sided call (which need not involve every rank).
                            if let Err(e) = core.prepare_collectives() {
                                core.destroy();
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
                    c.destroy();
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
