// Device code of struct mscclppConcurrentFifo, spliced into its body in mscclppfifo.h by build.rs
// (so this is a fragment of a struct body, not a header of its own).

  // Claims the next slot, waits until the proxy has freed it, then writes the trigger in one 16-byte store
  // so that the proxy never sees half a trigger. Returns the claimed position, for flush().
  //
  // The threads of a warp that push together claim consecutive positions with one atomic. Claimed one by
  // one, a warp's positions could lie more than MSCCLPP_PROXY_FIFO_SIZE apart (other warps' atomics land
  // in between), and then a thread waiting for its slot could wait on a lower position held by a thread
  // of its own warp that the hardware holds back until the warp reconverges: a deadlock once more than
  // MSCCLPP_PROXY_FIFO_SIZE threads push at once. With consecutive positions a thread only ever waits for
  // positions of other warps that are lower still, so any number of threads may push at once.
  __forceinline__ __device__ uint64_t push(uint64_t type, uint64_t dstDataOffset, uint64_t srcDataOffset,
                                           uint64_t dataSize)
  {
    return pushCountingSignal(type, dstDataOffset, srcDataOffset, dataSize, nullptr);
  }

  // push() that, given signalEpoch (a connection's localSignalEpochId->device), also counts one more signal
  // as epochIncrement() does, before it stores the trigger; the epoch's read then overlaps with the claim.
  __forceinline__ __device__ uint64_t pushCountingSignal(uint64_t type, uint64_t dstDataOffset,
                                                         uint64_t srcDataOffset, uint64_t dataSize,
                                                         uint64_t* signalEpoch)
  {
    // Both loads are issued before the claim's atomic returns, so the three overlap; the tail only grows,
    // so an early value errs on the side of waiting.
    const uint64_t tailSeen = *reinterpret_cast<volatile uint64_t*>(triggerFifoTail);
    const uint64_t epochSeen = signalEpoch != nullptr ? *reinterpret_cast<volatile uint64_t*>(signalEpoch) : 0;
    const uint64_t pos = claimPositions();
    if (signalEpoch != nullptr) *reinterpret_cast<volatile uint64_t*>(signalEpoch) = epochSeen + 1;
    mscclppTrigger* slot = &triggerFifo[pos % MSCCLPP_PROXY_FIFO_SIZE];
    // This library's proxy zeroes a slot before it publishes a tail past it, so pos within
    // MSCCLPP_PROXY_FIFO_SIZE of a tail seen proves the slot is free, and the push reads no host memory.
    if (pos >= MSCCLPP_PROXY_FIFO_SIZE + tailSeen) {
      // At most MSCCLPP_PROXY_FIFO_SIZE triggers may be in flight ahead of the proxy's tail. The device copy
      // of the tail is cheap to read but refreshed by GPU stream work that a busy GPU may defer; the host
      // copy after the slots is always current, so it decides when the device copy says "full".
      //
      // After an abort the proxy raises both tails past any position, so pushes stop finding the FIFO
      // full; until the raised tails are seen, a push that has spun MSCCLPP_FIFO_ABORT_POLLS times reads
      // the abort word (host memory, only here) and once aborted returns at once, writing nothing: the
      // proxy carries nothing out any more, and the loop around the push goes on at the GPU's speed.
      unsigned int spins = 0;
      while (pos >= MSCCLPP_PROXY_FIFO_SIZE + *reinterpret_cast<volatile uint64_t*>(triggerFifoTail)) {
        if (pos < MSCCLPP_PROXY_FIFO_SIZE + hostTail()) break;
        if (++spins % MSCCLPP_FIFO_ABORT_POLLS == 0 && aborted()) return pos;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        // Many threads may wait here; reading host memory in a tight loop would crowd the host link.
        __nanosleep(256);
#endif
      }
      // As the legacy protocol does, also wait for the proxy to zero the slot's first word.
      while (*reinterpret_cast<volatile uint64_t*>(&slot->value[0]) != 0) {
        if (++spins % MSCCLPP_FIFO_ABORT_POLLS == 0 && aborted()) return pos;
      }
    }
    // Each field is cut to its width so that an out-of-range argument can never spill into connId or type.
    const uint64_t word0 = (dataSize & ((1ULL << MSCCLPP_BITS_SIZE) - 1)) |
                           ((srcDataOffset & ((1ULL << MSCCLPP_BITS_OFFSET) - 1)) << MSCCLPP_BITS_SIZE);
    const uint64_t word1 =
      (dstDataOffset & ((1ULL << MSCCLPP_BITS_OFFSET) - 1)) |
      ((static_cast<uint64_t>(connId) & ((1ULL << MSCCLPP_BITS_CONNID) - 1)) << MSCCLPP_BITS_OFFSET) |
      ((type & ((1ULL << MSCCLPP_BITS_TYPE) - 1)) << (MSCCLPP_BITS_OFFSET + MSCCLPP_BITS_CONNID));
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(slot->value), "l"(word0), "l"(word1)
                 : "memory");
    return pos;
  }

  // One atomic per group of converged threads; each gets base + its rank among them.
  __forceinline__ __device__ uint64_t claimPositions()
  {
    const unsigned int mask = __activemask();
    unsigned int lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    const int leader = __ffs(mask) - 1;
    unsigned long long base = 0;
    if (static_cast<int>(lane) == leader) {
      base = atomicAdd(reinterpret_cast<unsigned long long*>(triggerFifoHead), static_cast<unsigned long long>(__popc(mask)));
    }
    base = __shfl_sync(mask, base, leader);
    return base + __popc(mask & ((1u << lane) - 1u));
  }

  // Waits until the trigger pushed at pos has been carried out: the proxy has zeroed its slot's first word,
  // or its tail has passed pos (when the slot already holds a newer trigger; the host copy of the tail is
  // always current). Returns early once the communicator is aborted.
  __forceinline__ __device__ void waitDone(uint64_t pos)
  {
    mscclppSpinWatch watch;
    while (*reinterpret_cast<volatile uint64_t*>(&triggerFifo[pos % MSCCLPP_PROXY_FIFO_SIZE].value[0]) != 0 &&
           hostTail() <= pos) {
      if (watch.due() && spinTooLong(watch, mscclppStuckFlush, pos, hostTail())) return;
    }
  }

  // ---- Failures: an extension of this library, not in MSCCL++ 0.1.0 --------------------------------------
  // After the slots and the host tail, the FIFO's pinned memory holds the proxy's control words:
  //   [0] non-zero once the communicator is aborted (a peer died, mscclppCommAbort, a stuck wait);
  //   [1] MSCCLPP_WAIT_TIMEOUT in nanoseconds (0: off), written by the library when it made the FIFO;
  //   [2] a stuck wait's report: bit 63 set, the kind (mscclppStuckKind) in bits 32-39, connId below;
  //   [3] the epoch or FIFO position it waited for; [4] the last value it saw.
  // The proxy reads the report, logs it and aborts the communicator.
  __forceinline__ __device__ volatile uint64_t* control() const
  {
    return reinterpret_cast<volatile uint64_t*>(&triggerFifo[MSCCLPP_PROXY_FIFO_SIZE + 1].value[0]);
  }

  // True once the communicator is aborted: the proxy no longer moves data, waits return without their
  // data, and what arrived after the failure is undefined. A read of host memory (about a microsecond).
  __forceinline__ __device__ bool aborted() const
  {
    return control()[0] != 0;
  }

  // The slow path of a wait that has spun a while (kept out of line so that the spin loops stay small):
  // true once the communicator is aborted, so the wait should return; past MSCCLPP_WAIT_TIMEOUT it also
  // reports the wait once, where the proxy finds it.
  __noinline__ __device__ bool spinTooLong(mscclppSpinWatch& watch, uint64_t kind, uint64_t expected, uint64_t seen)
  {
    const uint64_t now = mscclppGlobalTimerNs();
    if (watch.since == 0) {
      watch.since = now;
      return false;
    }
    // Host memory is read only after a millisecond of spinning, so short waits never leave the GPU.
    if (now - watch.since < 1000000ull) return false;
    volatile uint64_t* c = control();
    if (c[0] != 0) return true;
    const uint64_t timeout = c[1];
    if (timeout != 0 && !watch.reported && now - watch.since > timeout) {
      watch.reported = true;
      if (c[2] == 0) {
        c[3] = expected;
        c[4] = seen;
        __threadfence_system();
        c[2] = (1ull << 63) | ((kind & 0xff) << 32) | static_cast<uint64_t>(static_cast<uint32_t>(connId));
      }
    }
    return false;
  }

  // The proxy's tail as it keeps it in host memory, right after the slots (this library's layout; the
  // legacy protocol only knows triggerFifoTail).
  __forceinline__ __device__ uint64_t hostTail() const
  {
    return *reinterpret_cast<volatile const uint64_t*>(&triggerFifo[MSCCLPP_PROXY_FIFO_SIZE].value[0]);
  }
