//! The scratch memory of a communicator's collectives: one buffer per rank, mapped into every other rank's
//! context, into which peers write a call's data (the application's own buffers are never exported, so any
//! device buffer works); and the epoch counter the kernels keep (the abort word they read is
//! `abort_word.rs`).
//!
//! Each buffer holds two slots (calls alternate between them by epoch), each the flags of
//! `kernel_args::FLAG_BYTES` and then the data of `MSCCLPP_COLL_SCRATCH_MB`: a quarter of it for packets
//! and the rest for copies (packets never share memory with copied data; see `common.cuh`). The send/receive area of
//! send and receive (`send_recv.rs`) follows the two slots in the same allocation, so that it is mapped by every
//! peer in the same set-up, before any send or receive (the first of which need not involve every rank),
//! and the signal counters of the one-sided calls (`signal.rs`) follow it, for the same reason.
//!
//! The buffer is shared memory (`gpu::SharedAllocation`) wherever the device supports it, its descriptor
//! passed to the peers of this machine: a peer's mapping then keeps the pages alive, so that a kernel of a
//! peer still writing into this rank's buffer after this rank freed it (a suspend, a destroy, an abort) or
//! died never touches freed memory (under MPS such a fault would end every client of the GPU). Elsewhere
//! it is a plain allocation exported by CUDA IPC, with a line at INFO saying so.

use super::Collective;
use super::algorithm::{Protocol, window_bytes};
use super::kernel_args::{FLAG_BYTES, MAX_RANKS};
use super::plan::PathSettings;
use crate::bootstrap::Bootstrap;
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use crate::gpu::{
    DescriptorInbox, DeviceAllocation, DevicePtr, GpuContext, IpcExport, IpcMapping, ProcessId, SharedAllocation,
    SharedMapping, Stream, send_descriptor, shareable_supported,
};

/// This rank's buffer: shared memory, or a plain allocation that CUDA IPC exports (see the module's doc).
enum OwnBuffer {
    Shared(SharedAllocation),
    Ipc(DeviceAllocation),
}

impl OwnBuffer {
    fn ptr(&self) -> DevicePtr {
        match self {
            OwnBuffer::Shared(s) => s.ptr(),
            OwnBuffer::Ipc(a) => a.ptr(),
        }
    }

    fn size(&self) -> usize {
        match self {
            OwnBuffer::Shared(s) => s.size(),
            OwnBuffer::Ipc(a) => a.size(),
        }
    }
}

/// How a peer of another process of this machine reaches this rank's buffer, as the set-up's exchange
/// carries it.
enum Export {
    /// Shared memory of `size` bytes: its descriptor comes by the peer's inbox.
    Shared {
        size: u64,
    },
    Ipc(IpcExport),
}

/// A peer's buffer mapped here; unmapped when dropped (its pages stay while a `Shared` mapping lives).
/// Held, never read: the addresses are in `Scratch::ptrs`.
enum PeerMapping {
    Shared(#[allow(dead_code)] SharedMapping),
    Ipc(#[allow(dead_code)] IpcMapping),
}

pub struct Scratch {
    /// Peers' buffers mapped here (none for peers in this process).
    _mappings: Vec<PeerMapping>,
    own: OwnBuffer,
    /// Every rank's buffer as this context reaches it, by rank.
    pub ptrs: [DevicePtr; MAX_RANKS],
    pub slot_bytes: u64,
    /// The packet area of a slot, after its flags.
    pub packet_bytes: u64,
    /// The copy area of a slot, after its packet area.
    pub copy_bytes: u64,
    /// Every rank's send/receive area as this context reaches it, by rank (after its two slots).
    pub send_recv: [DevicePtr; MAX_RANKS],
    /// The lanes and slots of every send/receive area, the same on every rank.
    pub send_recv_shape: super::send_recv::Shape,
    /// Every rank's signal counters as this context reaches them, by rank (after its send/receive area).
    pub signals: [DevicePtr; MAX_RANKS],
    /// The ranks whose process is this one (this rank's own included): their memory is reached at the
    /// owner's addresses.
    pub in_this_process: [bool; MAX_RANKS],
    /// The kernels' words (`kernel_args::STATE_WORDS`): `[0]` the epoch of the last call, `[1]` the blocks
    /// done with the current one, then the zero-copy decision, count and addresses.
    pub state: DeviceAllocation,
    /// The most ranks of the communicator that share one GPU (their kernels share its multiprocessors),
    /// and the fewest multiprocessors any rank's context has: the same on every rank, so that every rank
    /// sizes its grids alike (a block waits for its namesakes on the peers).
    pub gpu_sharers: usize,
    pub multiprocessors: u32,
    /// The most blocks a collective's launch may have: the smallest limit any rank asked for
    /// (`Collectives::limit_ctas`), `u32::MAX` where none did. The same on every rank.
    pub cta_limit: u32,
}

impl Scratch {
    /// The bytes of a window of `collective`'s `protocol` algorithm among `nranks` in this scratch's area for
    /// that protocol (`algorithm::window_bytes`).
    pub fn window(&self, collective: Collective, protocol: Protocol, nranks: usize) -> u64 {
        let area = match protocol {
            Protocol::Packet => self.packet_bytes,
            Protocol::Copy => self.copy_bytes,
        };
        window_bytes(collective, protocol, nranks, area)
    }

    /// Allocates this rank's buffer and maps every peer's: collective, every rank calls it (from its first
    /// collective call).
    /// `cta_limit` is this rank's limit of a collective's blocks (`u32::MAX`: none); every rank's are
    /// exchanged here and the smallest kept. `paths` (the settings that choose a call's path) must be every
    /// rank's: the ranks of a call take the same path, so one rank's setting alone would leave its peers
    /// waiting.
    pub fn set_up(
        gpu: &GpuContext,
        bootstrap: &Bootstrap,
        data_bytes: u64,
        cta_limit: u32,
        paths: PathSettings,
    ) -> Result<Scratch> {
        let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
        if nranks > MAX_RANKS {
            return Err(Error::invalid_usage(format!(
                "collectives span at most {MAX_RANKS} ranks (GPUs of one machine); this communicator has {nranks}"
            )));
        }
        let slot_bytes = FLAG_BYTES + data_bytes;
        // Zeroed off the legacy default stream: this may run inside the application's graph capture.
        let stream = Stream::new(gpu)?;
        let send_recv_offset = 2 * slot_bytes;
        let send_recv_shape = super::send_recv::Shape::from_settings(nranks);
        let signal_offset = send_recv_offset + send_recv_shape.area_bytes(nranks);
        let own_bytes = (signal_offset + super::signal::AREA_BYTES) as usize;
        let own = if shareable_supported(gpu) {
            OwnBuffer::Shared(SharedAllocation::zeroed_on(gpu, own_bytes, &stream)?)
        } else {
            log::info!(
                "collectives: this GPU cannot share memory by file descriptor; the scratch is exported by CUDA IPC \
                 (a peer that frees or loses it while this rank's kernels write into it faults them)"
            );
            OwnBuffer::Ipc(DeviceAllocation::zeroed_on(gpu, own_bytes, &stream)?)
        };
        let state = DeviceAllocation::zeroed_on(gpu, super::kernel_args::STATE_WORDS * 8, &stream)?;
        let inbox = DescriptorInbox::bind()?;
        let me = ProcessId::this();
        let device = device_key(gpu)?;
        let multiprocessors = gpu.multiprocessors()?;

        // Every rank's process, GPU and buffer, through the bootstrap.
        let mut w = Writer::new();
        me.write(&mut w);
        w.u64(device).u32(multiprocessors).u32(cta_limit);
        w.u32(send_recv_shape.lanes)
            .u32(send_recv_shape.depth)
            .u64(send_recv_shape.slot_bytes)
            .u8(paths.code());
        // The owner's own address (for ranks of this process), then how other processes reach the buffer.
        w.u64(own.ptr()).string(inbox.address());
        match &own {
            OwnBuffer::Shared(s) => w.u8(1).u64(s.size() as u64),
            OwnBuffer::Ipc(a) => {
                w.u8(0);
                IpcExport::new(a.ptr(), a.size() as u64, "the collectives' scratch")?.write(&mut w);
                &mut w
            }
        };
        let mine = w.into_bytes();
        // Inbox addresses differ in length: every block is padded to the longest a rank can write.
        let block = MAX_BLOCK;
        if mine.len() > block {
            return Err(Error::internal(format!(
                "a scratch set-up block of {} bytes",
                mine.len()
            )));
        }
        let mut all = vec![0u8; block * nranks];
        all[rank * block..rank * block + mine.len()].copy_from_slice(&mine);
        bootstrap.all_gather(&mut all, block)?;

        let mut ptrs = [0; MAX_RANKS];
        let mut in_this_process = [false; MAX_RANKS];
        let mut gpus: Vec<(u64, u64)> = Vec::with_capacity(nranks);
        let mut fewest_multiprocessors = u32::MAX;
        let mut smallest_cta_limit = u32::MAX;
        // The peers of other processes of this machine: their inboxes, and how they export.
        let mut remote: Vec<(usize, Vec<u8>, Export)> = Vec::new();
        for (peer, bytes) in all.chunks(block).enumerate() {
            let mut r = Reader::new(bytes, "collective scratch");
            let process = ProcessId::read(&mut r)?;
            let peer_device = r.u64()?;
            fewest_multiprocessors = fewest_multiprocessors.min(r.u32()?);
            smallest_cta_limit = smallest_cta_limit.min(r.u32()?);
            let peer_shape = super::send_recv::Shape {
                lanes: r.u32()?,
                depth: r.u32()?,
                slot_bytes: r.u64()?,
            };
            if peer_shape != send_recv_shape {
                return Err(Error::invalid_usage(format!(
                    "rank {peer}'s send/receive lanes are {peer_shape:?} and ours {send_recv_shape:?}: \
                     MSCCLPP_SENDRECV_LANES, MSCCLPP_SENDRECV_DEPTH and MSCCLPP_SENDRECV_CHUNK_KB must be the same on \
                     every rank"
                )));
            }
            if let Some(e) = paths.disagreement(peer, r.u8()?) {
                return Err(e);
            }
            let address = r.u64()?;
            let peer_inbox = r.string(MAX_BLOCK)?.to_vec();
            let export = match r.u8()? {
                1 => Export::Shared { size: r.u64()? },
                _ => Export::Ipc(IpcExport::read(&mut r)?),
            };
            r.finish_padded()?;
            gpus.push((process.host, peer_device));
            in_this_process[peer] = process == me;
            if peer == rank {
                ptrs[peer] = own.ptr();
                continue;
            }
            if process.host != me.host {
                return Err(Error::invalid_usage(format!(
                    "rank {peer} is on another machine: collectives between machines are not supported yet \
                     (they need every rank's GPU in this machine)"
                )));
            }
            let size = match &export {
                Export::Shared { size } => *size,
                Export::Ipc(e) => e.size,
            };
            if size != own.size() as u64 {
                return Err(Error::invalid_usage(format!(
                    "rank {peer}'s collective scratch has {size} bytes and ours {}: MSCCLPP_COLL_SCRATCH_MB must be \
                     the same on every rank",
                    own.size()
                )));
            }
            if process == me {
                gpu.enable_peer_access_to(address);
                ptrs[peer] = address;
            } else {
                remote.push((peer, peer_inbox, export));
            }
        }
        let mappings = map_peers(gpu, bootstrap, &own, &inbox, &remote, &mut ptrs)?;
        let gpu_sharers = gpus
            .iter()
            .map(|g| gpus.iter().filter(|h| *h == g).count())
            .max()
            .unwrap_or(1);
        log::info!(
            "collectives set up: {} MiB of scratch ({} MiB of data per slot), {nranks} ranks, up to {gpu_sharers} \
             on one GPU, {fewest_multiprocessors} multiprocessors",
            own.size() >> 20,
            data_bytes >> 20
        );
        log::info!(
            "send/receive: {} lanes per pair of ranks (an all-to-all's and an all-gather's calls in at most {}), {} \
             slots of {} KiB each",
            send_recv_shape.lanes,
            send_recv_shape
                .lanes
                .min(super::send_recv_collectives::SELF_COPYING_LANES),
            send_recv_shape.depth,
            send_recv_shape.slot_bytes >> 10
        );
        if smallest_cta_limit != u32::MAX {
            log::info!("collectives: at most {smallest_cta_limit} blocks a launch (the smallest maxCTAs of the ranks)");
        }
        let packet_bytes = data_bytes / 4 / 16 * 16;
        let mut send_recv = [0; MAX_RANKS];
        let mut signals = [0; MAX_RANKS];
        for ((area, counters), base) in send_recv.iter_mut().zip(signals.iter_mut()).zip(&ptrs).take(nranks) {
            *area = base + send_recv_offset;
            *counters = base + signal_offset;
        }
        Ok(Scratch {
            _mappings: mappings,
            own,
            ptrs,
            slot_bytes,
            packet_bytes,
            copy_bytes: data_bytes - packet_bytes,
            send_recv,
            send_recv_shape,
            signals,
            in_this_process,
            state,
            gpu_sharers,
            multiprocessors: fewest_multiprocessors,
            cta_limit: smallest_cta_limit,
        })
    }

    /// This rank's buffer.
    pub fn own(&self) -> DevicePtr {
        self.own.ptr()
    }

    /// Bytes of device memory this rank allocated for it: its buffer (the two slots and what follows them)
    /// and the kernels' state words (the peers' buffers mapped here are theirs).
    pub fn device_bytes(&self) -> u64 {
        (self.own.size() + self.state.size()) as u64
    }
}

/// The most bytes of a rank's block in the set-up's exchange: its fixed fields, an inbox address (at most
/// `sockaddr_un`'s 108 bytes) and a CUDA IPC export.
const MAX_BLOCK: usize = 512;

/// Maps the buffers of `remote` (the peers of other processes of this machine) into this context, writing
/// their addresses into `ptrs`: this rank's descriptor is sent to each of them first where its buffer is
/// shared, the ranks meet at a barrier (after which every descriptor sent here is in `inbox`), and the
/// shared peers' descriptors are taken.
fn map_peers(
    gpu: &GpuContext,
    bootstrap: &Bootstrap,
    own: &OwnBuffer,
    inbox: &DescriptorInbox,
    remote: &[(usize, Vec<u8>, Export)],
    ptrs: &mut [DevicePtr; MAX_RANKS],
) -> Result<Vec<PeerMapping>> {
    // Ranks all of one process map nothing (every rank finds `remote` empty alike): no meeting needed.
    if remote.is_empty() {
        return Ok(Vec::new());
    }
    let senders: Vec<usize> = remote
        .iter()
        .filter(|(_, _, e)| matches!(e, Export::Shared { .. }))
        .map(|(peer, _, _)| *peer)
        .collect();
    // The inbox takes while this rank sends: a queue holds fewer datagrams than a machine can have peers
    // (descriptor_passing.rs). Every rank with a peer in another process meets at the barrier, whatever it
    // shares: it orders every send before the last take.
    let ((), mut descriptors) = inbox.take_during(&senders, || {
        if let OwnBuffer::Shared(shared) = own {
            // One descriptor serves every peer: each datagram carries a duplicate of it.
            let fd = shared.export()?;
            let still_waiting = || bootstrap.check_alive();
            for (peer, peer_inbox, _) in remote {
                send_descriptor(peer_inbox, bootstrap.rank(), &fd, &still_waiting)
                    .map_err(|e| Error::new(e.kind, format!("passing the scratch to rank {peer}: {}", e.message)))?;
            }
        }
        bootstrap.barrier()
    })?;
    let mut mappings = Vec::with_capacity(remote.len());
    for (peer, _, export) in remote {
        let (mapping, ptr) = match export {
            Export::Shared { size } => {
                let fd = descriptors.remove(peer).expect("`take_during` returned every sender's");
                let m = SharedMapping::import(gpu, fd, *size as usize)
                    .map_err(|e| Error::new(e.kind, format!("rank {peer}'s scratch: {}", e.message)))?;
                let p = m.ptr();
                (PeerMapping::Shared(m), p)
            }
            Export::Ipc(e) => {
                let m = IpcMapping::open(gpu, &e.handle)?;
                let p = m.base() + e.offset;
                (PeerMapping::Ipc(m), p)
            }
        };
        ptrs[*peer] = ptr;
        mappings.push(mapping);
    }
    Ok(mappings)
}

/// This rank's GPU as every process of the machine names it: its PCI bus id, hashed to a fixed size
/// (ordinals differ between processes with different `CUDA_VISIBLE_DEVICES`).
fn device_key(gpu: &GpuContext) -> Result<u64> {
    let id = gpu.pci_bus_id()?;
    Ok(id
        .bytes()
        .fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3)))
}
