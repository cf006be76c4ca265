//! Transports: how a connection moves data, and everything a communicator asks of it.
//!
//! Each transport lives in a folder of its own and implements `Transport`, which covers its whole life in
//! a communicator: taking connections on (`mscclppConnect`), the set-up messages exchanged through the
//! bootstrap and the completion of set-up (`mscclppConnectionSetup`), its part of each connection's device
//! view (the FIFO its proxy serves, and the peer's memory where kernels reach it directly), launching,
//! stopping and reporting the failure of its proxies, registered buffers and writes into them, and
//! teardown. The legacy connection machine (`connections.rs`, over the communicator's bootstrap) keeps
//! what is common to all: the connection list and its order, the epoch blocks, the count of flags carried
//! out per connection (`FlagsCarried`), and its state machine; it loops over its transports and names a
//! transport kind only where it picks the transport of a new connection (`connections::new_transport`).
//!
//! - `p2p/`: GPUs of one machine: the copy engine writes into peers' memory mapped with CUDA IPC, and a
//!   flag raised while no data is in flight is also stored by the CPU into host memory shared with the peer.
//! - `ib/`: InfiniBand (and RoCE): RDMA writes from GPU memory through libibverbs loaded at run time.
//!
//! To add a transport: a variant of `connection::TransportKind` (and its `transportType` in `mscclpp_abi/api.rs`),
//! a folder here whose type implements `Transport`, and one arm in `connections::new_transport`.

pub mod ib;
pub mod p2p;

use crate::connection::{Connection, TransportKind};
use crate::error::{Error, Result};
use crate::gpu::{AppStream, DevicePtr, GpuContext, Stream};
use crate::proxy::AbortHook;
use crate::types::{mscclppDevConn, mscclppRegisteredMemoryP2P};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// One transport of a communicator: all of its connections of one kind, their set-up, the proxy (or
/// proxies) serving them, and the buffers registered with their peers. Connections are named by their
/// index in the communicator's list (the `connId` of their triggers); a transport sees only its own.
///
/// The communicator calls these under its lock, with its GPU's context current, in this order:
/// `check_connect` and `connect` per connection; at set-up `prepare_setup`, `setup_message` and
/// `complete_setup` for the connections not yet set up, `fill_device_connection` for every connection,
/// and `setup_finished` after the closing barrier; then any number of proxy launches and stops, buffer
/// registrations and registered writes; `clear` last.
pub trait Transport: Send {
    /// Its name in logs and errors ("P2P", "IB").
    fn name(&self) -> &'static str;

    /// Whether it carries connections of `kind` (each kind has one transport per communicator).
    fn carries(&self, kind: &TransportKind) -> bool;

    // ---- mscclppConnect ----

    /// Checks what a new connection of `kind` needs before any GPU work, so that a machine without it
    /// fails first, saying what it lacks (IB loads libibverbs and opens the device).
    fn check_connect(&mut self, _kind: &TransportKind) -> Result<()> {
        Ok(())
    }

    /// Takes connection `conn` on, its epoch block allocated on `gpu`, the communicator's GPU, which the
    /// transport works on from then on.
    fn connect(&mut self, gpu: &GpuContext, conn: usize, c: &Connection) -> Result<()>;

    // ---- mscclppConnectionSetup ----

    /// Called once per set-up, before the messages of `pending`, its connections not set up yet (P2P
    /// places their fast flags in one object of shared memory).
    fn prepare_setup(&mut self, _pending: &[(usize, &Connection)]) -> Result<()> {
        Ok(())
    }

    /// What connection `conn`'s peer needs to reach this side; the communicator sends it through the
    /// bootstrap, inside a message that names the rank, the tag and the transport.
    fn setup_message(&self, conn: usize) -> Result<Vec<u8>>;

    /// Completes connection `conn` with the message its peer's `setup_message` made.
    fn complete_setup(&mut self, conn: usize, peer_message: &[u8]) -> Result<()>;

    /// Called after the barrier that ends a set-up: every peer has completed its side.
    fn setup_finished(&mut self) {}

    /// Fills its part of connection `conn`'s device view, whose common part (rank, tag, own buffer and
    /// epoch block) is written: `fifo`, the FIFO its proxy serves, and, where kernels reach the peer's
    /// memory directly, `base.remoteBuff` and `base.remoteSignalEpochId` (otherwise left null).
    fn fill_device_connection(&mut self, conn: usize, dev: &mut mscclppDevConn) -> Result<()>;

    // ---- proxies ----

    /// `mscclppProxyLaunch`: starts the proxy thread(s) serving its connections. `flags` counts the flags
    /// carried out per connection; its proxies add to it. `on_abort` is what a proxy calls when it wants
    /// the communicator aborted (a stuck wait reported, its own failure).
    fn launch_proxy(&mut self, flags: &FlagsCarried, on_abort: &AbortHook) -> Result<()>;

    /// The communicator is aborted (a peer failed, `mscclppCommAbort`, a stuck wait): its proxies stop
    /// moving data, release the kernels waiting on its connections (`release_waits`) and drain their
    /// FIFOs until stopped; proxies launched later start aborted. Never blocks.
    fn abort_proxy(&mut self);

    /// Whether any of its proxies runs.
    fn proxy_running(&self) -> bool;

    /// Stops its proxies, if they run, after their final flush. An error only if a thread could not be
    /// stopped cleanly; what went wrong while they ran is `proxy_failure`.
    fn stop_proxy(&mut self) -> Result<()>;

    /// The first failure of any of its proxies, running or stopped (a failed copy or RDMA write, a
    /// failed set-up of the thread): the data they carried since can no longer be trusted.
    fn proxy_failure(&self) -> Option<Error>;

    // ---- registered buffers ----

    /// `mscclppRegisterBuffer`: what connection `conn`'s peer needs to write into `[ptr, +size)`.
    fn register_message(&mut self, conn: usize, ptr: DevicePtr, size: u64) -> Result<Vec<u8>>;

    /// Completes the registration of `[ptr, +size)` with the message connection `conn`'s peer made for
    /// its own buffer: the entry for `regMem->p2p`.
    fn register_remote(
        &mut self,
        conn: usize,
        ptr: DevicePtr,
        size: u64,
        peer_message: &[u8],
    ) -> Result<mscclppRegisteredMemoryP2P>;

    /// Whether `entry` is one its `register_remote` made.
    fn owns_registered(&self, entry: &mscclppRegisteredMemoryP2P) -> bool;

    /// `mscclppRegisteredBufferWrite` into the peer's buffer of one entry it owns.
    fn registered_write(&mut self, entry: &mscclppRegisteredMemoryP2P, write: &RegisteredWrite) -> Result<()>;

    // ---- teardown ----

    /// Stops its proxies and releases everything it holds (peers' mappings, queue pairs, memory
    /// registrations), before the communicator frees the connections' epoch blocks. Returns what
    /// `stop_proxy` returns.
    fn clear(&mut self) -> Result<()>;
}

/// One `mscclppRegisteredBufferWrite`, as each entry's transport carries it out: `[src + src_offset,
/// +size)` (checked to lie in one allocation of the application) into the peer's buffer at `dst_offset`,
/// ordered after the work queued on `stream` so far.
#[derive(Clone, Copy, Debug)]
pub struct RegisteredWrite {
    /// The entry's index in `regMem->p2p`, for errors.
    pub index: usize,
    pub src: DevicePtr,
    pub size: u64,
    pub src_offset: u64,
    pub dst_offset: u64,
    pub stream: AppStream,
}

/// The number of flags carried out on each connection of a communicator, by the proxies of every
/// transport: the value the peer's `proxy` word must hold once the last of them has landed (P2P and IB
/// flags carry it, where the legacy proxies sent the `device` epoch, which may run ahead of the data).
/// The communicator keeps it across proxy launches, so that a relaunched proxy goes on counting; clones
/// share the counts.
#[derive(Clone, Default)]
pub struct FlagsCarried(Arc<Vec<AtomicU64>>);

impl FlagsCarried {
    /// Counts starting at `counts` (tests; and a set-up that adds connections).
    pub fn from_counts(counts: impl IntoIterator<Item = u64>) -> FlagsCarried {
        FlagsCarried(Arc::new(counts.into_iter().map(AtomicU64::new).collect()))
    }

    /// Counts for `connections` connections: those of the connections counted here so far, then zeros.
    /// Called by set-up while no proxy runs.
    pub fn for_connections(&self, connections: usize) -> FlagsCarried {
        Self::from_counts((0..connections).map(|conn| self.count(conn)))
    }

    /// The flags carried out on `conn` so far (0 for a connection not counted here).
    pub fn count(&self, conn: usize) -> u64 {
        self.0.get(conn).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Counts one more flag carried out on connection `conn` and returns the new count.
    pub fn carry_one(&self, conn: usize) -> Result<u64> {
        let sent = self
            .0
            .get(conn)
            .ok_or_else(|| Error::internal(format!("connection {conn} has no flag count")))?;
        Ok(sent.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

/// What a proxy writes into the epoch blocks of its connections when the communicator aborts: past any
/// epoch a kernel can wait for, and far from wrapping.
pub const RELEASED_EPOCH: u64 = 1 << 62;

/// Releases the kernels waiting on connections whose epoch blocks start at `epoch_blocks`: raises the
/// `proxy` word (what `wait()` spins on, in this header's device code and the legacy one) and the
/// direct-signal "received" word (what `directWait()` spins on) to `RELEASED_EPOCH`, with stream memory
/// writes on `stream`, a stream of the proxy's own, so they land while the application's kernels run.
///
/// # Safety
/// Each address is the start of a connection's epoch block (`connection::EpochBlock`, 64 bytes of device
/// memory this context reaches) that stays allocated until the stream has run the writes.
pub unsafe fn release_waits(stream: &Stream, epoch_blocks: impl IntoIterator<Item = DevicePtr>) -> Result<()> {
    for block in epoch_blocks {
        for word in [
            crate::connection::EpochBlock::PROXY_WORD,
            crate::connection::EpochBlock::DIRECT_RECEIVED_WORD,
        ] {
            // SAFETY: the word lies in the epoch block, which the caller keeps allocated (contract above).
            unsafe { stream.write_u64(block + 8 * word, RELEASED_EPOCH)? };
        }
    }
    Ok(())
}

/// What every transport's proxy does with a trigger's Data and Flag parts (`copy` and `raise_flag` are
/// its own): the data only if `ranges` (the trigger's check against both buffers) passed; the flag even
/// when the data was dropped, since the device counted the signal and a missing flag would leave the
/// peer waiting forever. A dropped part is the returned error (the proxy logs it and goes on).
///
/// A Data part of size 0 is ignored on every transport, whatever its offsets: nothing to move, so nothing
/// is checked, copied or counted as dropped (before the transports shared this, P2P refused one whose
/// offset lay past a buffer and IB ignored it). The FIFO carries one only with a non-zero source offset,
/// since a slot whose first word is 0 is empty.
pub fn carry_out<H: ?Sized>(
    handler: &mut H,
    t: &crate::proxy::Trigger,
    ranges: impl FnOnce() -> Result<()>,
    copy: impl FnOnce(&mut H) -> Result<()>,
    raise_flag: impl FnOnce(&mut H) -> Result<()>,
) -> Result<()> {
    let mut dropped = None;
    if t.has_data() && t.data_size > 0 {
        match ranges() {
            Ok(()) => copy(handler)?,
            Err(e) if t.has_flag() => {
                log::error!("dropped the data of {t:?}: {e}");
                dropped = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    if t.has_flag() {
        raise_flag(handler)?;
    }
    dropped.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copied(done: &mut (u32, u32)) -> Result<()> {
        done.0 += 1;
        Ok(())
    }
    fn flagged(done: &mut (u32, u32)) -> Result<()> {
        done.1 += 1;
        Ok(())
    }

    #[test]
    fn a_data_part_of_size_0_is_neither_checked_nor_copied() {
        use crate::proxy::trigger::{TYPE_DATA, TYPE_FLAG};
        let t = |kind, data_size| crate::proxy::Trigger {
            data_size,
            src_offset: u32::MAX,
            dst_offset: u32::MAX,
            conn_id: 0,
            kind,
        };
        let bad_ranges = || Err(Error::invalid_usage("past the buffer"));
        let mut done = (0, 0);
        carry_out(&mut done, &t(TYPE_DATA, 0), bad_ranges, copied, flagged).unwrap();
        carry_out(&mut done, &t(TYPE_DATA | TYPE_FLAG, 0), bad_ranges, copied, flagged).unwrap();
        assert_eq!(done, (0, 1), "no copy; the flag is raised");
        let e = carry_out(&mut done, &t(TYPE_DATA | TYPE_FLAG, 8), bad_ranges, copied, flagged);
        assert!(e.is_err(), "a non-empty range past the buffer is dropped");
        assert_eq!(done, (0, 2), "and its flag still raised");
    }

    #[test]
    fn flag_counts_go_on_across_set_ups_and_are_shared_by_clones() {
        let flags = FlagsCarried::from_counts([5, 0]);
        let proxy = flags.clone();
        assert_eq!(proxy.carry_one(0).unwrap(), 6);
        assert_eq!(proxy.carry_one(1).unwrap(), 1);
        assert_eq!((flags.count(0), flags.count(1)), (6, 1), "clones share the counts");
        assert!(proxy.carry_one(2).is_err(), "a connection without a count is an error");
        let more = flags.for_connections(3);
        assert_eq!((more.count(0), more.count(1), more.count(2)), (6, 1, 0));
        assert_eq!(more.carry_one(2).unwrap(), 1);
        assert_eq!(flags.count(7), 0);
    }
}
