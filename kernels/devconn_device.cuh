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
    epochIncrement();
    fifo.push(mscclppFlag, 0, 0, 1);
  }

  // put() then signal(), in one trigger.
  __forceinline__ __device__ void putWithSignal(uint64_t dstDataOffset, uint64_t srcDataOffset, uint64_t dataSize)
  {
    epochIncrement();
    fifo.push(mscclppData | mscclppFlag, dstDataOffset, srcDataOffset, dataSize);
  }

  __forceinline__ __device__ void putWithSignal(uint64_t dataOffset, uint64_t dataSize)
  {
    putWithSignal(dataOffset, dataOffset, dataSize);
  }

  // putWithSignal() then flush(), in one trigger.
  __forceinline__ __device__ void putWithSignalAndFlush(uint64_t dstDataOffset, uint64_t srcDataOffset,
                                                        uint64_t dataSize)
  {
    epochIncrement();
    const uint64_t pos =
      fifo.push(mscclppData | mscclppFlag | mscclppSync, dstDataOffset, srcDataOffset, dataSize);
    // Done once the proxy has zeroed the slot's first word, or has published its tail past pos (the
    // fallback for when the slot already holds a newer trigger).
    while (*reinterpret_cast<volatile uint64_t*>(&fifo.triggerFifo[pos % MSCCLPP_PROXY_FIFO_SIZE].value[0]) != 0 &&
           *reinterpret_cast<volatile uint64_t*>(fifo.triggerFifoTail) <= pos) {
    }
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
    // Done once the proxy has zeroed the slot's first word, or has published its tail past pos (the
    // fallback for when the slot already holds a newer trigger).
    while (*reinterpret_cast<volatile uint64_t*>(&fifo.triggerFifo[pos % MSCCLPP_PROXY_FIFO_SIZE].value[0]) != 0 &&
           *reinterpret_cast<volatile uint64_t*>(fifo.triggerFifoTail) <= pos) {
    }
  }

  // Blocks until the peer's next signal() has arrived: the expected epoch goes up by one, then this thread
  // spins until the peer's proxy has published at least that epoch into localSignalEpochId->proxy.
  __forceinline__ __device__ void wait()
  {
    (*waitEpochId) += 1;
    while (*reinterpret_cast<volatile uint64_t*>(&localSignalEpochId->proxy) < (*waitEpochId)) {
    }
  }

  // Counts one more signal raised by this side (read by the proxy when it handles the Flag).
  __forceinline__ __device__ void epochIncrement()
  {
    *reinterpret_cast<volatile uint64_t*>(&localSignalEpochId->device) += 1;
  }
