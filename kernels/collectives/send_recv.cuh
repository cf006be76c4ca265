// Send and receive (ncclSend, ncclRecv): one launch carries every send to and receive from other ranks of
// one rank's group, all at once, so that no order of calls inside a group can deadlock (a send and a
// receive between the same two ranks in both directions, an all-to-all).
//
// Channel: each ordered pair source -> destination has, in the destination's send/receive area, `lanes` lanes of
// `depth` slots of `slotBytes` each (the communicator's shape, src/collective/send_recv.rs `Shape`). A send is cut
// into up to `lanes` contiguous parts (the same cut on both sides: it depends on the byte count and the
// shape alone), each streamed through its own lane in chunks of at most a slot. Chunks are numbered per
// pair and lane from the first send of the communicator on (1, 2, ...; the counts are kept in the rank's
// own memory, so a replayed CUDA graph goes on counting); chunk c goes through slot c % depth. The sender
// of chunk c waits until the receiver has copied chunk c - depth out (credit >= c - depth, in the sender's
// area), writes the slot, and posts c (posted, in the receiver's area); the receiver waits until posted >=
// c, copies the slot out and gives the credit c back.
//
// Blocks: the sends to one peer, and the receives from one peer, form a channel served by its own blocks;
// a block serves lanes b, b + blocks, ... of every op of its channel, lane by lane and in call order within
// a lane, so that one block alone writes a lane's counters (they stay monotonic). Sender and receiver may
// give a channel different numbers of blocks: the chunks, not the blocks, are what both sides agree on.
// Every block of both launches is resident at once (the host keeps each launch within its share of the
// GPU), and each side takes the (lane, op) pairs of a channel in the same order, so the first pair either
// side waits on is always one the other side is working on or has passed.
//
// Reducing receives (mscclpp_send_recv_reduce_<op>_<type>, for two ranks' reduce, reduce-scatter and all-reduce:
// src/collective/send_recv_collectives.rs): a receive with a `src` writes, element by element, the operator
// applied to its `src` and the chunk, finished for two contributions (an average halves the sum). Every
// other op moves bytes as in mscclpp_send_recv.
#pragma once

#include "common.cuh"
#include "reduce.cuh"

#define MSCCLPP_SENDRECV_MAX_LANES 64
#define MSCCLPP_SENDRECV_MAX_OPS 64
#define MSCCLPP_SENDRECV_MAX_CHANNELS 33
#define MSCCLPP_SENDRECV_THREADS 512
#define MSCCLPP_SENDRECV_SEND 0
#define MSCCLPP_SENDRECV_RECV 1
#define MSCCLPP_SENDRECV_COPY 2
// A relay channel (the middle of a chain's reduce, every step of a ring's reduce-scatter): receives from
// `peer`, reduces each chunk with this rank's own operand (an op's `src`), and sends the result on to another
// rank (the op's flags from PEER_SHIFT on) straight into its slot, without a buffer of its own. One block
// moves a lane as a receive and a send at once: it waits for the chunk (posted) and for the slot it writes
// (credit), then posts the chunk on and gives the credit back after one barrier. Every op of the channel
// sends to one rank. An op with RELAY_NO_IN receives nothing and sends its `src` (a ring's first step); one
// with RELAY_NO_OUT sends nothing and writes the reduction, finished, into its `ptr` (a ring's last step).
#define MSCCLPP_SENDRECV_RELAY 3
// Counters at the start of a rank's send/receive area, each [rank][lane] of 64 bits: posted (written by the source
// rank), credit (written by the receiving rank), then this rank's own counts of the chunks it sent to and
// received from each rank, the guard of in-place pairs and the landed count of forwarded receives (below).
// The slots follow: [source rank][lane][slot][slotBytes].
#define MSCCLPP_SENDRECV_COUNTER_BYTES (6 * MSCCLPP_COLL_MAX_RANKS * MSCCLPP_SENDRECV_MAX_LANES * 8)
#define MSCCLPP_SENDRECV_POSTED 0
#define MSCCLPP_SENDRECV_CREDIT 1
#define MSCCLPP_SENDRECV_SENT 2
#define MSCCLPP_SENDRECV_RECEIVED 3
#define MSCCLPP_SENDRECV_GUARD 4
#define MSCCLPP_SENDRECV_LANDED 5
// SendRecvOp::flags.
#define MSCCLPP_SENDRECV_ALIGNED 1
// An in-place pair (an all-to-all in place): a send to a peer and a receive from it of the same buffer. A
// receive's chunk may overwrite only what the send has already read: the send block counts the guarded
// chunks it has sent in this launch into guard[peer][lane] (this rank's memory), and the receive block
// waits until that count passes its own before it copies a guarded chunk out, and sets the guard back to 0
// at the end of its lane (the send block wrote its last count before that: the receive waited for it).
#define MSCCLPP_SENDRECV_GUARDED 2
// A forward (a chain's broadcast): a receive from one peer into a buffer (FORWARDED) and a send of that buffer
// to another (FORWARD, the first peer in the bits from PEER_SHIFT on), the same bytes and so the same lanes
// and chunks. The receive block counts each chunk of its lane that has landed into landed[from][lane] (this
// rank's memory); the send block waits until that count reaches its own before it sends the chunk on, and
// sets it back to 0 at the end of its lane (the receive wrote its last count before: the send waited for
// it). Every forward of a launch comes from one peer.
#define MSCCLPP_SENDRECV_FORWARDED 4
#define MSCCLPP_SENDRECV_FORWARD 8
#define MSCCLPP_SENDRECV_PEER_SHIFT 8
#define MSCCLPP_SENDRECV_RELAY_NO_IN 16
#define MSCCLPP_SENDRECV_RELAY_NO_OUT 32

// Laid out as src/collective/kernel_args.rs lays them out.
struct SendRecvOp {
  char* ptr;           // the application's buffer: read by a send, written by a receive
  uint64_t bytes;
  uint64_t laneUnits;   // 16-byte units of each lane but the last
  uint64_t chunkBytes;  // bytes of each chunk of a lane but its last: a multiple of 16, at most slotBytes
  uint32_t lanes;
  uint32_t flags;      // MSCCLPP_SENDRECV_ALIGNED: ptr (and src) are multiples of 16; MSCCLPP_SENDRECV_GUARDED
  const char* src;     // a copy's source; a receive's own operand where it reduces (null: it only moves)
};

struct SendRecvChannel {
  uint32_t firstOp;  // ops[firstOp, firstOp + ops): the sends to `peer`, or the receives from it, in call order
  uint32_t ops;
  uint32_t firstBlock;
  uint32_t blocks;
  uint32_t peer;
  uint32_t kind;  // MSCCLPP_SENDRECV_SEND, _RECV, _RELAY (peer: the rank it receives from) or _COPY (peer unused)
};

struct SendRecvArgs {
  SendRecvOp ops[MSCCLPP_SENDRECV_MAX_OPS];
  SendRecvChannel channels[MSCCLPP_SENDRECV_MAX_CHANNELS];  // by firstBlock; the copies' channel, if any, last
  char* areas[MSCCLPP_COLL_MAX_RANKS];              // every rank's send/receive area (this rank's own too), mapped here
  const volatile uint64_t* abortFlag;               // host memory: non-zero once the communicator is aborted
  uint32_t rank;
  uint32_t nranks;
  uint32_t channelCount;
  uint32_t lanes;  // the shape: lanes per ordered pair, slots per lane, bytes per slot
  uint32_t depth;
  uint32_t reserved;
  uint64_t slotBytes;
};

__device__ __forceinline__ uint64_t* sendRecvCounter(char* area, uint32_t which, uint32_t rank, uint32_t lane)
{
  return reinterpret_cast<uint64_t*>(area) +
         (static_cast<uint64_t>(which) * MSCCLPP_COLL_MAX_RANKS + rank) * MSCCLPP_SENDRECV_MAX_LANES + lane;
}

// The slot of `area` (the receiver's) that chunk `chunk` of lane `lane` from `source` goes through.
__device__ __forceinline__ char* sendRecvSlot(const SendRecvArgs& a, char* area, uint32_t source, uint32_t lane, uint64_t chunk)
{
  return area + MSCCLPP_SENDRECV_COUNTER_BYTES +
         ((static_cast<uint64_t>(source) * a.lanes + lane) * a.depth + chunk % a.depth) * a.slotBytes;
}

// Lane `lane` of an op is its bytes [begin, end): every lane but the last holds laneUnits 16-byte units.
__device__ __forceinline__ void sendRecvLane(const SendRecvOp& op, uint32_t lane, uint64_t& begin, uint64_t& end)
{
  begin = lane * op.laneUnits * 16;
  const uint64_t laneEnd = begin + op.laneUnits * 16;
  end = laneEnd < op.bytes ? laneEnd : op.bytes;
}

// The most lanes of any op of a channel: lanes past them carry nothing (small sends use one lane of many).
__device__ __forceinline__ uint32_t sendRecvWidest(const SendRecvArgs& a, const SendRecvChannel& ch)
{
  uint32_t used = 0;
  for (uint32_t k = ch.firstOp; k < ch.firstOp + ch.ops; k++) used = a.ops[k].lanes > used ? a.ops[k].lanes : used;
  return used;
}

// What a receive does with each 16-byte unit of a chunk: stores it (SendRecvMoveOnly), or stores the operator
// applied to the receive's own operand and it (SendRecvReduce), finished for `finish` contributions (an
// average divides the sum by them) where that is not 0: the last receive of a reduction finishes it, a relay
// passes the partial result on.
struct SendRecvMoveOnly {
  static constexpr bool kReduces = false;
  __device__ explicit SendRecvMoveOnly(uint32_t) {}
  __device__ __forceinline__ uint4 operator()(uint4, uint4 in) const { return in; }
};
template <typename T, typename Op>
struct SendRecvReduce {
  static constexpr bool kReduces = true;
  uint32_t finish;
  __device__ explicit SendRecvReduce(uint32_t f) : finish(f) {}
  __device__ __forceinline__ uint4 operator()(uint4 own, uint4 in) const
  {
    const uint4 v = reduceUnit<T, Op>(own, in);
    return finish != 0 ? finishUnit<T, Op>(v, finish) : v;
  }
};

// 16-byte units a thread has in flight: a copy loads one stream, a reducing receive (and a relay) two, the
// chunk and its own operand. Between two H200s (docs/PERFORMANCE.md, "Chains' chunks and all-to-all's lanes
// among four GPUs") a reducing receive went faster with twice the threads a block, so its loads in flight
// bound it in part; 8 units a thread give it those loads without halving the blocks a GPU holds: reduce
// 0.7 % faster from 256 MiB, all-reduce and reduce-scatter 1-3 % below 1 GiB.
constexpr uint32_t kSendRecvGroup = 4;
constexpr uint32_t kSendRecvReducingGroup = 8;

// Units [0, units) of 16 bytes, kGroup in flight per thread: the loads of a group (`load(u)`) are issued
// before its stores (`store(u, loaded)`), so that a thread waits on one round trip per group.
template <uint32_t kGroup, typename Load, typename Store>
__device__ __forceinline__ void sendRecvGroups(uint64_t units, const Load& load, const Store& store)
{
  const uint64_t step = static_cast<uint64_t>(blockDim.x) * kGroup;
  uint64_t u = threadIdx.x;
  for (; u + (kGroup - 1) * blockDim.x < units; u += step) {
    decltype(load(u)) v[kGroup];
#pragma unroll
    for (uint32_t g = 0; g < kGroup; g++) v[g] = load(u + g * blockDim.x);
#pragma unroll
    for (uint32_t g = 0; g < kGroup; g++) store(u + g * blockDim.x, v[g]);
  }
  for (; u < units; u += blockDim.x) store(u, load(u));
}

// A unit of a slot and the receiver's own unit beside it, loaded together (sendRecvReceive).
struct SendRecvUnits {
  uint4 slot, own;
};

// A receive of `n` bytes out of a slot: dst = slot (SendRecvMoveOnly) or reduce(own, slot) (SendRecvReduce),
// in groups (sendRecvGroups) where dst (and own) are aligned and n a multiple of 16, else unit by unit.
// Slot reads bypass L1 (`ld.global.cg`): a slot is rewritten by the peer for later chunks, and L1 is not
// coherent with those writes.
template <typename R>
__device__ __forceinline__ void sendRecvReceive(char* dst, const char* own, const char* slot, uint64_t n, bool aligned,
                                                const R& reduce)
{
  const uint64_t units = unitsOf(n, 16);
  const uint4* in = reinterpret_cast<const uint4*>(slot);
  if (!aligned || n % 16 != 0) {
    for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
      if constexpr (R::kReduces) {
        storeUnit<uint4>(dst, u, n, aligned, reduce(loadUnit<uint4>(own, u, n, aligned), __ldcg(in + u)));
      } else {
        storeUnit<uint4>(dst, u, n, aligned, __ldcg(in + u));
      }
    }
    return;
  }
  const uint4* mine = reinterpret_cast<const uint4*>(own);
  uint4* out = reinterpret_cast<uint4*>(dst);
  if constexpr (R::kReduces) {
    sendRecvGroups<kSendRecvReducingGroup>(
      units, [&](uint64_t u) { return SendRecvUnits{__ldcg(in + u), mine[u]}; },
      [&](uint64_t u, const SendRecvUnits& v) { out[u] = reduce(v.own, v.slot); });
  } else {
    sendRecvGroups<kSendRecvGroup>(
      units, [&](uint64_t u) { return __ldcg(in + u); }, [&](uint64_t u, const uint4& v) { out[u] = v; });
  }
}

// A send's chunk (or a copy to this rank itself) of `n` bytes from `src` into `dst`, in groups
// (sendRecvGroups) where both are aligned and n a multiple of 16, else unit by unit (a slot, always
// aligned, written as scratch).
__device__ __forceinline__ void sendRecvToSlot(char* dst, const char* src, uint64_t n, bool aligned)
{
  const uint64_t units = unitsOf(n, 16);
  if (!aligned || n % 16 != 0) {
    for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) storeScratch16(dst, u, loadUnit<uint4>(src, u, n, aligned));
    return;
  }
  const uint4* in = reinterpret_cast<const uint4*>(src);
  uint4* out = reinterpret_cast<uint4*>(dst);
  sendRecvGroups<kSendRecvGroup>(
    units, [&](uint64_t u) { return in[u]; }, [&](uint64_t u, const uint4& v) { out[u] = v; });
}

// Thread 0 waits until `*counter` (this rank's memory, written by a peer) reaches `target`; the block goes
// on together. False once the communicator is aborted (the kernel should then end).
__device__ __forceinline__ bool sendRecvWait(const SendRecvArgs& a, const uint64_t* counter, uint64_t target)
{
  int aborted = 0;
  if (threadIdx.x == 0) {
    uint32_t spins = 0;
    while (loadAcquireSys(counter) < target) {
      if (++spins % MSCCLPP_COLL_ABORT_POLL == 0 && *a.abortFlag != 0) {
        aborted = 1;
        break;
      }
    }
  }
  return __syncthreads_or(aborted) == 0;
}

// Once every thread of the block has moved its part of a chunk: thread 0 stores `value` into a peer's
// `counter`, after the block's data stores (a send) or loads (a receive).
__device__ __forceinline__ void sendRecvPublish(uint64_t* counter, uint64_t value)
{
  __syncthreads();
  if (threadIdx.x == 0) storeReleaseSys(counter, value);
}

// The copies to this rank itself: block b of the channel copies lanes b, b + blocks, ... of every copy, each
// lane at once (nothing crosses a link, so there is no chunk to wait for).
__device__ void sendRecvCopies(const SendRecvArgs& a, const SendRecvChannel& ch)
{
  for (uint32_t k = ch.firstOp; k < ch.firstOp + ch.ops; k++) {
    const SendRecvOp& op = a.ops[k];
    for (uint32_t lane = blockIdx.x - ch.firstBlock; lane < op.lanes; lane += ch.blocks) {
      uint64_t begin, end;
      sendRecvLane(op, lane, begin, end);
      const uint64_t n = end - begin;
      if ((op.flags & MSCCLPP_SENDRECV_ALIGNED) != 0 && n % 16 == 0) {
        sendRecvToSlot(op.ptr + begin, op.src + begin, n, true);
      } else {
        // Unaligned on either side: unit by unit, each side as it is.
        for (uint64_t u = threadIdx.x; u < unitsOf(n, 16); u += blockDim.x) {
          storeUnit<uint4>(op.ptr + begin, u, n, false, loadUnit<uint4>(op.src + begin, u, n, false));
        }
      }
    }
  }
}

// A relay channel (MSCCLPP_SENDRECV_RELAY): block b moves lanes b, b + blocks, ... of every op, each chunk from
// `ch.peer`'s slot here, reduced with this rank's operand, into this rank's slot at the rank it sends to. The
// chunks are numbered as a receive's from ch.peer and as a send's to that rank, each pair's count its own.
//
// The ops are a ring's steps, and a lane goes chunk by chunk, each chunk through every step (chunk 0 of
// steps 0, 1, ..., then chunk 1 of each), not step by step: step 0 only sends, so a lane that sent all of
// its step-0 chunks first would fill the next rank's slots (a lane holds depth of them) and every rank
// would then wait for the next one's credit round the ring. Chunk-major, a rank sends one chunk of step 0
// and then must receive before it sends again. The rank before sends the chunks of this rank's step s + 1
// as its step s, the same part cut alike, so both sides count them in the same order.
template <typename R>
__device__ void sendRecvRelay(const SendRecvArgs& a, const SendRecvChannel& ch)
{
  char* own = a.areas[a.rank];
  const uint32_t to = a.ops[ch.firstOp].flags >> MSCCLPP_SENDRECV_PEER_SHIFT;
  char* next = a.areas[to];
  char* prev = a.areas[ch.peer];
  const uint32_t used = sendRecvWidest(a, ch);
  for (uint32_t lane = blockIdx.x - ch.firstBlock; lane < used; lane += ch.blocks) {
    uint64_t* received = sendRecvCounter(own, MSCCLPP_SENDRECV_RECEIVED, ch.peer, lane);
    uint64_t* sent = sendRecvCounter(own, MSCCLPP_SENDRECV_SENT, to, lane);
    const uint64_t firstIn = *reinterpret_cast<volatile uint64_t*>(received);
    const uint64_t firstOut = *reinterpret_cast<volatile uint64_t*>(sent);
    uint64_t in = firstIn;
    uint64_t out = firstOut;
    uint64_t chunks = 0;  // the most chunks of this lane in any step
    for (uint32_t k = ch.firstOp; k < ch.firstOp + ch.ops; k++) {
      const SendRecvOp& op = a.ops[k];
      if (lane >= op.lanes) continue;
      uint64_t begin, end;
      sendRecvLane(op, lane, begin, end);
      const uint64_t c = end > begin ? (end - begin + op.chunkBytes - 1) / op.chunkBytes : 0;
      chunks = c > chunks ? c : chunks;
    }
    for (uint64_t c = 0; c < chunks; c++) {
      for (uint32_t k = ch.firstOp; k < ch.firstOp + ch.ops; k++) {
        const SendRecvOp& op = a.ops[k];
        if (lane >= op.lanes) continue;
        uint64_t begin, end;
        sendRecvLane(op, lane, begin, end);
        const uint64_t off = begin + c * op.chunkBytes;
        if (off >= end) continue;
        const uint64_t rest = end - off;
        const uint64_t n = rest < op.chunkBytes ? rest : op.chunkBytes;
        const bool aligned = (op.flags & MSCCLPP_SENDRECV_ALIGNED) != 0;
        const bool receives = (op.flags & MSCCLPP_SENDRECV_RELAY_NO_IN) == 0;
        const bool sends = (op.flags & MSCCLPP_SENDRECV_RELAY_NO_OUT) == 0;
        if (receives && !sendRecvWait(a, sendRecvCounter(own, MSCCLPP_SENDRECV_POSTED, ch.peer, lane), ++in)) return;
        if (sends) {
          out++;
          const uint64_t freed = out > a.depth ? out - a.depth : 0;
          if (!sendRecvWait(a, sendRecvCounter(own, MSCCLPP_SENDRECV_CREDIT, to, lane), freed)) return;
        }
        if (!receives) {
          sendRecvToSlot(sendRecvSlot(a, next, a.rank, lane, out), op.src + off, n, aligned);
        } else if (!sends) {
          sendRecvReceive(op.ptr + off, op.src + off, sendRecvSlot(a, own, ch.peer, lane, in), n, aligned, R(a.nranks));
        } else {
          // The slot at `to` is always aligned; the operand may not be (then unit by unit).
          sendRecvReceive(sendRecvSlot(a, next, a.rank, lane, out), op.src + off,
                          sendRecvSlot(a, own, ch.peer, lane, in), n, aligned, R(0));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          if (sends) storeReleaseSys(sendRecvCounter(next, MSCCLPP_SENDRECV_POSTED, a.rank, lane), out);
          if (receives) storeReleaseSys(sendRecvCounter(prev, MSCCLPP_SENDRECV_CREDIT, a.rank, lane), in);
        }
      }
    }
    if (threadIdx.x == 0 && in != firstIn) *received = in;
    if (threadIdx.x == 0 && out != firstOut) *sent = out;
  }
}

template <typename R>
__device__ void sendRecvKernel(const SendRecvArgs& a)
{
  uint32_t c = 0;
  while (c + 1 < a.channelCount && blockIdx.x >= a.channels[c + 1].firstBlock) c++;
  const SendRecvChannel& ch = a.channels[c];
  if (ch.kind == MSCCLPP_SENDRECV_COPY) {
    sendRecvCopies(a, ch);
    return;
  }
  if constexpr (R::kReduces) {
    if (ch.kind == MSCCLPP_SENDRECV_RELAY) {
      sendRecvRelay<R>(a, ch);
      return;
    }
  }
  const bool sending = ch.kind == MSCCLPP_SENDRECV_SEND;
  char* own = a.areas[a.rank];
  char* peer = a.areas[ch.peer];

  const uint32_t used = sendRecvWidest(a, ch);
  for (uint32_t lane = blockIdx.x - ch.firstBlock; lane < used; lane += ch.blocks) {
    // This block alone moves this lane of this channel in this launch; the previous launch's count is
    // visible since that launch ended before this one began.
    uint64_t* count = sendRecvCounter(own, sending ? MSCCLPP_SENDRECV_SENT : MSCCLPP_SENDRECV_RECEIVED, ch.peer, lane);
    const uint64_t first = *reinterpret_cast<volatile uint64_t*>(count);
    uint64_t chunk = first;
    uint64_t guarded = 0;  // the guarded chunks of this lane so far in this launch
    uint64_t* guard = sendRecvCounter(own, MSCCLPP_SENDRECV_GUARD, ch.peer, lane);
    uint64_t forwarded = 0;           // the forwarded chunks of this lane so far in this launch
    uint64_t* landed = nullptr;       // a send's: the landed count it waits on
    for (uint32_t k = ch.firstOp; k < ch.firstOp + ch.ops; k++) {
      const SendRecvOp& op = a.ops[k];
      if (lane >= op.lanes) continue;
      uint64_t begin, end;
      sendRecvLane(op, lane, begin, end);
      const bool aligned = (op.flags & MSCCLPP_SENDRECV_ALIGNED) != 0;
      const bool isGuarded = (op.flags & MSCCLPP_SENDRECV_GUARDED) != 0;
      const bool isForward = (op.flags & MSCCLPP_SENDRECV_FORWARD) != 0;
      const bool isForwarded = (op.flags & MSCCLPP_SENDRECV_FORWARDED) != 0;
      if (isForward) landed = sendRecvCounter(own, MSCCLPP_SENDRECV_LANDED, op.flags >> MSCCLPP_SENDRECV_PEER_SHIFT, lane);
      // Offsets from `begin` on are multiples of 16, so `op.ptr + off` is aligned where `op.ptr` is.
      for (uint64_t off = begin; off < end; off += op.chunkBytes) {
        chunk++;
        const uint64_t rest = end - off;
        const uint64_t n = rest < op.chunkBytes ? rest : op.chunkBytes;
        if (sending) {
          // Chunk c reuses the slot of chunk c - depth, which the receiver must have copied out.
          const uint64_t freed = chunk > a.depth ? chunk - a.depth : 0;
          // A forward's chunk must have landed here first.
          if (isForward && !sendRecvWait(a, landed, ++forwarded)) return;
          if (!sendRecvWait(a, sendRecvCounter(own, MSCCLPP_SENDRECV_CREDIT, ch.peer, lane), freed)) return;
          sendRecvToSlot(sendRecvSlot(a, peer, a.rank, lane, chunk), op.ptr + off, n, aligned);
          sendRecvPublish(sendRecvCounter(peer, MSCCLPP_SENDRECV_POSTED, a.rank, lane), chunk);
          // The chunk has been read out of the buffer: the paired receive may overwrite it.
          if (isGuarded && threadIdx.x == 0) storeReleaseSys(guard, ++guarded);
        } else {
          if (!sendRecvWait(a, sendRecvCounter(own, MSCCLPP_SENDRECV_POSTED, ch.peer, lane), chunk)) return;
          if (isGuarded && !sendRecvWait(a, guard, ++guarded)) return;
          const char* slot = sendRecvSlot(a, own, ch.peer, lane, chunk);
          if (R::kReduces && op.src != nullptr) {
            sendRecvReceive(op.ptr + off, op.src + off, slot, n, aligned, R(a.nranks));
          } else {
            sendRecvReceive(op.ptr + off, nullptr, slot, n, aligned, SendRecvMoveOnly(0));
          }
          sendRecvPublish(sendRecvCounter(peer, MSCCLPP_SENDRECV_CREDIT, a.rank, lane), chunk);
          // The chunk is in the buffer (every thread's stores are before the barrier sendRecvPublish passed):
          // the send that forwards it may read it.
          if (isForwarded && threadIdx.x == 0) {
            storeReleaseSys(sendRecvCounter(own, MSCCLPP_SENDRECV_LANDED, ch.peer, lane), ++forwarded);
          }
        }
      }
    }
    // Every thread has passed the lane's last barrier (or moved nothing, leaving the count as it was).
    if (threadIdx.x == 0 && chunk != first) *count = chunk;
    if (threadIdx.x == 0 && !sending && guarded != 0) storeReleaseSys(guard, 0);
    if (threadIdx.x == 0 && sending && forwarded != 0) storeReleaseSys(landed, 0);
  }
}
