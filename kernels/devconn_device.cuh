// Device code of struct mscclppDevConn, spliced into its body in mscclpp.h by build.rs (so this is a
// fragment of a struct body, not a header of its own).

// Ordering contract with the proxy: put() data is copied before the Flag of the same or a later trigger is
// published, so a peer whose wait() returns sees all data put before the matching signal().

  // Asks the proxy to copy dataSize bytes from localBuff + srcDataOffset to the peer's buffer at
  // dstDataOffset. Non-blocking: the source must not be reused until flush() returns.
  __forceinline__ __device__ void put(uint64_t dstDataOffset, uint64_t srcDataOffset, uint64_t dataSize)
  {
    fifo.push(mscclppData, dstDataOffset, srcDataOffset, dataSize);
  }

  // put() at the same offset on both sides.
  __forceinline__ __device__ void put(uint64_t dataOffset, uint64_t dataSize)
  {
    put(dataOffset, dataOffset, dataSize);
  }

  // Raises this side's epoch and asks the proxy to publish it to the peer once earlier puts have landed.
  // The size 1 only keeps the slot's first word non-zero.
  __forceinline__ __device__ void signal()
  {
    fifo.pushCountingSignal(mscclppFlag, 0, 0, 1, &localSignalEpochId->device);
  }

  // put() then signal(), in one trigger.
  __forceinline__ __device__ void putWithSignal(uint64_t dstDataOffset, uint64_t srcDataOffset, uint64_t dataSize)
  {
    fifo.pushCountingSignal(mscclppData | mscclppFlag, dstDataOffset, srcDataOffset, dataSize,
                            &localSignalEpochId->device);
  }

  __forceinline__ __device__ void putWithSignal(uint64_t dataOffset, uint64_t dataSize)
  {
    putWithSignal(dataOffset, dataOffset, dataSize);
  }

  // putWithSignal() then flush(), in one trigger.
  __forceinline__ __device__ void putWithSignalAndFlush(uint64_t dstDataOffset, uint64_t srcDataOffset,
                                                        uint64_t dataSize)
  {
    const uint64_t pos = fifo.pushCountingSignal(mscclppData | mscclppFlag | mscclppSync, dstDataOffset,
                                                 srcDataOffset, dataSize, &localSignalEpochId->device);
    fifo.waitDone(pos);
  }

  __forceinline__ __device__ void putWithSignalAndFlush(uint64_t dataOffset, uint64_t dataSize)
  {
    putWithSignalAndFlush(dataOffset, dataOffset, dataSize);
  }

  // Blocks until every trigger pushed before it has completed; then the sources of earlier puts may be
  // reused. The size 1 only keeps the slot's first word non-zero.
  __forceinline__ __device__ void flush()
  {
    const uint64_t pos = fifo.push(mscclppSync, 0, 0, 1);
    fifo.waitDone(pos);
  }

  // Blocks until the peer's next signal() has arrived: the expected epoch goes up by one, then this thread
  // spins until epochReached() says the peer's proxy has published at least that epoch.
  // Returns early, without the signal, once the communicator is aborted (see aborted()); with
  // MSCCLPP_WAIT_TIMEOUT set, a wait that spins longer is reported and aborts the communicator.
  __forceinline__ __device__ void wait()
  {
    (*waitEpochId) += 1;
    const uint64_t expected = *waitEpochId;
    mscclppSpinWatch watch;
    while (!epochReached(expected)) {
      if (watch.due() &&
          fifo.spinTooLong(watch, mscclppStuckWait, expected,
                           *reinterpret_cast<volatile uint64_t*>(&localSignalEpochId->proxy)))
        return;
    }
  }

  // True once the communicator of this connection is aborted (a rank died or went silent,
  // mscclppCommAbort was called, or a wait was stuck past MSCCLPP_WAIT_TIMEOUT): waits return without
  // their signal and data is undefined from then on. An extension of this library (MSCCLPP_HAS_ABORT).
  __forceinline__ __device__ bool aborted() const
  {
    return fifo.aborted();
  }

  // True once the peer's proxy has published at least `epoch` signals: in localSignalEpochId->proxy
  // (written by the copy engine, as the legacy proxy did, and read by legacy device code), or in the fast
  // flag. The fast flag is in host memory, about a microsecond away: its read stays in flight while the
  // epoch struct (device memory) is read MSCCLPP_FAST_FLAG_POLLS times, so that a flag raised by the copy
  // engine is seen about as soon as it would be without a fast flag. The proxy stores a fast flag only for
  // a signal with none of its data in flight, and reads of host memory slow a GPU that waits for flags
  // after data; so once the struct has won MSCCLPP_FAST_FLAG_MISSES waits in a row, this side reads the
  // fast flag only in every MSCCLPP_FAST_FLAG_PROBE-th wait, until the fast flag wins one (waitMode()).
  // For waits of a program's own; call it for one epoch until it returns true, as wait() does.
  __forceinline__ __device__ bool epochReached(uint64_t epoch)
  {
    const volatile uint64_t* proxy = reinterpret_cast<volatile uint64_t*>(&localSignalEpochId->proxy);
    const volatile uint64_t* fast = fastFlag();
    if (fast == nullptr) return *proxy >= epoch;
    volatile uint64_t* mode = waitMode();
    const uint64_t modeSeen = *mode; // in flight with the first read of the struct
    if (*proxy >= epoch) return true; // arrived before this wait: says nothing about which way is faster
    if ((modeSeen & kWaitSkipsFastFlag) != 0 && epoch % MSCCLPP_FAST_FLAG_PROBE != 0) return false;
    const uint64_t fastSeen = *fast;
    for (int i = 0; i < MSCCLPP_FAST_FLAG_POLLS; ++i) {
      if (*proxy >= epoch) {
        if ((modeSeen & kWaitSkipsFastFlag) == 0)
          *mode = modeSeen + 1 >= MSCCLPP_FAST_FLAG_MISSES ? kWaitSkipsFastFlag : modeSeen + 1;
        return true;
      }
    }
    if (fastSeen < epoch) return false;
    if (modeSeen != 0) *mode = 0;
    return true;
  }

  // Word 7 of the counter block that starts with the epoch struct, kept by this side's waits alone:
  // kWaitSkipsFastFlag once the struct has won MSCCLPP_FAST_FLAG_MISSES waits in a row (the fast flag
  // is then read only in probe waits), else how many waits in a row the struct has won.
  static constexpr uint64_t kWaitSkipsFastFlag = 1ull << 63;
  __forceinline__ __device__ volatile uint64_t* waitMode()
  {
    return reinterpret_cast<volatile uint64_t*>(localSignalEpochId) + 7;
  }

  // The fast flag of a P2P connection: a word in host memory shared with the peer, where the peer's proxy
  // stores the epoch with a plain CPU store when none of its data is in flight (no copy engine on the
  // way); its address is word 3 of the counter block that starts with the epoch struct (null where there
  // is none).
  __forceinline__ __device__ const volatile uint64_t* fastFlag()
  {
    return reinterpret_cast<const volatile uint64_t*>(reinterpret_cast<const uint64_t*>(localSignalEpochId)[3]);
  }

  // Counts one more signal raised by this side (read by the proxy when it handles the Flag).
  __forceinline__ __device__ void epochIncrement()
  {
    *reinterpret_cast<volatile uint64_t*>(&localSignalEpochId->device) += 1;
  }

  // ---- Proxy-free methods: an extension of this library, not in MSCCL++ 0.1.0 ----------------------
  // Between GPUs of one machine (P2P connections, where remoteBuff and remoteSignalEpochId are set), a
  // kernel may write into the peer's buffer and signal it directly through the mapped pointers, with no
  // proxy and no FIFO. The direct signal has its own counters (in the same device allocation as the
  // epoch struct), so direct and proxy methods may be used on one connection; they order each other's
  // data only as follows: data put() through the proxy is covered by a directSignal() only after a
  // flush() has returned, and data written by directPut() is covered by a later signal() only if the
  // writing threads executed __threadfence_system() (and, across threads, a barrier) before it.
  // Like signal()/wait(), directSignal()/directWait() are called by one thread per connection at a time.

  // The counters after the epoch struct: [4] direct signals sent, [5] direct signals received (written
  // by the peer), [6] direct signals waited for.
  __forceinline__ __device__ uint64_t* directCounters(mscclppDevConnSignalEpochId* epochs)
  {
    return reinterpret_cast<uint64_t*>(epochs);
  }

  // Copies dataSize bytes from localBuff + srcDataOffset to the peer's buffer at dstDataOffset, shared
  // by numThreads threads of which this is threadId (0 <= threadId < numThreads). 16-byte accesses when
  // both addresses and the size allow it.
  __forceinline__ __device__ void directPut(uint64_t dstDataOffset, uint64_t srcDataOffset, uint64_t dataSize,
                                            uint32_t threadId, uint32_t numThreads)
  {
    char* dst = static_cast<char*>(remoteBuff) + dstDataOffset;
    const char* src = static_cast<const char*>(localBuff) + srcDataOffset;
    uint64_t done = 0;
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
      const uint64_t n16 = dataSize / 16;
      uint4* d = reinterpret_cast<uint4*>(dst);
      const uint4* s = reinterpret_cast<const uint4*>(src);
      uint64_t i = threadId;
      // Four independent 16-byte loads in flight per thread.
      for (; i + 3 * (uint64_t)numThreads < n16; i += 4 * (uint64_t)numThreads) {
        uint4 a = s[i], b = s[i + numThreads], c = s[i + 2 * (uint64_t)numThreads], e = s[i + 3 * (uint64_t)numThreads];
        d[i] = a;
        d[i + numThreads] = b;
        d[i + 2 * (uint64_t)numThreads] = c;
        d[i + 3 * (uint64_t)numThreads] = e;
      }
      for (; i < n16; i += numThreads) d[i] = s[i];
      done = n16 * 16;
    }
    for (uint64_t i = done + threadId; i < dataSize; i += numThreads) dst[i] = src[i];
  }

  // directPut() by the 32 threads of the calling warp.
  __forceinline__ __device__ void directPutWarp(uint64_t dstDataOffset, uint64_t srcDataOffset, uint64_t dataSize)
  {
    directPut(dstDataOffset, srcDataOffset, dataSize, threadIdx.x % 32, 32);
  }

  // directPut() by all threads of the calling block (every thread must call it).
  __forceinline__ __device__ void directPutBlock(uint64_t dstDataOffset, uint64_t srcDataOffset, uint64_t dataSize)
  {
    const uint32_t tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    directPut(dstDataOffset, srcDataOffset, dataSize, tid, blockDim.x * blockDim.y * blockDim.z);
  }

  // Signals the peer with release ordering: writes this thread made (and, through a preceding barrier,
  // its block's) are visible to the peer once its directWait() returns.
  __forceinline__ __device__ void directSignal()
  {
    raiseDirectSignal(true);
  }

  // Waits for the peer's next directSignal(), with acquire ordering.
  __forceinline__ __device__ void directWait()
  {
    awaitDirectSignal(true);
  }

  // directSignal() without ordering any memory: only says the signal was raised.
  __forceinline__ __device__ void relaxedSignal()
  {
    raiseDirectSignal(false);
  }

  // directWait() without ordering any memory.
  __forceinline__ __device__ void relaxedWait()
  {
    awaitDirectSignal(false);
  }

  // Counts one more direct signal and writes the count into the peer's "received" word.
  __forceinline__ __device__ void raiseDirectSignal(bool release)
  {
    uint64_t* mine = directCounters(localSignalEpochId);
    const uint64_t sent = mine[4] + 1;
    mine[4] = sent;
    uint64_t* theirs = directCounters(remoteSignalEpochId) + 5;
    if (release)
      asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(theirs), "l"(sent) : "memory");
    else
      asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(theirs), "l"(sent) : "memory");
  }

  // Counts one more direct wait and spins until the peer's count reaches it.
  __forceinline__ __device__ void awaitDirectSignal(bool acquire)
  {
    uint64_t* mine = directCounters(localSignalEpochId);
    const uint64_t want = mine[6] + 1;
    mine[6] = want;
    uint64_t seen;
    do {
      if (acquire)
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(mine + 5) : "memory");
      else
        asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(mine + 5) : "memory");
    } while (seen < want);
  }

  // True once the peer's next directSignal() has arrived, so that directWait() would return at once.
  // Changes no counter: lets a kernel wait with a deadline of its own.
  __forceinline__ __device__ bool directPoll()
  {
    uint64_t* mine = directCounters(localSignalEpochId);
    uint64_t seen;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(mine + 5) : "memory");
    return seen > mine[6];
  }
