// The kernels the library launches: one entry point per algorithm, reduction operator and element type,
// named mscclpp_<algorithm>[_<op>_<type>] (src/collective/kernels.rs builds the same names). build.rs
// compiles one translation unit per element type, each `MSCCLPP_REDUCING_KERNELS(<type name>, <C type>)`,
// and one with `MSCCLPP_MOVING_KERNELS()` for the collectives that only move bytes (send and receive among
// them: mscclpp_send_recv, whose argument is its own; and the one-sided calls' mscclpp_rma_put and mscclpp_rma_wait,
// whose argument is theirs). Each type's unit also holds mscclpp_scale_premulsum_<type>,
// one rank's PreMulSum (the other operators of one rank are a copy), and mscclpp_send_recv_reduce_<op>_<type>,
// send and receive whose receives reduce (two ranks' reductions carried as sends and receives).
#pragma once

#include "allgather_copy.cuh"
#include "allgather_packet.cuh"
#include "allreduce_packet.cuh"
#include "allreduce_rsag.cuh"
#include "alltoall_copy.cuh"
#include "alltoall_packet.cuh"
#include "broadcast_copy.cuh"
#include "broadcast_packet.cuh"
#include "copy_engine.cuh"
#include "send_recv.cuh"
#include "reducescatter_copy.cuh"
#include "reducescatter_packet.cuh"
#include "scale.cuh"
#include "scatter_copy.cuh"
#include "scatter_packet.cuh"
#include "signal.cuh"
#include "zero_copy.cuh"

#define MSCCLPP_COLL_THREADS 1024

// `bounds`: the kernel's __launch_bounds__.
#define MSCCLPP_KERNEL_BOUNDED(name, body, bounds)                 \
  extern "C" __global__ void bounds mscclpp_##name(CollArgs args) \
  {                                                                \
    body(args);                                                    \
  }
#define MSCCLPP_KERNEL(name, body) MSCCLPP_KERNEL_BOUNDED(name, body, __launch_bounds__(MSCCLPP_COLL_THREADS))
// The zero-copy kernels, with the blocks each multiprocessor must hold (`resident`; nvcc caps the registers
// to fit them). They run the scratch code too where the vote says no, and the scratch code wants two
// blocks, the zero-copy loops one (with the registers to spare; two blocks spill). Measured on one H100 with 2
// ranks under MPS (docs/PERFORMANCE.md, zero-copy), graphs of 1 GiB, one block / two: all-reduce f32
// registered 1541 / 1580 us, unregistered 3735 / 4131; reduce-scatter 1135 / 1224, 2215 / 2314; all-gather
// 1510 / 1536, 2201 / 2273; broadcast 1248 / 1396, 2612 / 2281: broadcast takes two, the others one.
#define MSCCLPP_ZC_KERNEL(name, body, resident) \
  MSCCLPP_KERNEL_BOUNDED(name, body, __launch_bounds__(MSCCLPP_COLL_THREADS, resident))

#define MSCCLPP_REDUCING_KERNELS_OP(tname, T, oname, Op)                              \
  MSCCLPP_KERNEL(allreduce_packet_##oname##_##tname, (allreducePacket<T, Op>))         \
  MSCCLPP_KERNEL(allreduce_rsag_##oname##_##tname, (allreduceRsag<T, Op>))             \
  MSCCLPP_KERNEL(reducescatter_packet_##oname##_##tname, (reducescatterPacket<T, Op>)) \
  MSCCLPP_KERNEL(reducescatter_copy_##oname##_##tname, (reducescatterCopy<T, Op>))

// The zero-copy kernels of an operator (every operator but PreMulSum: zero_copy.cuh).
#define MSCCLPP_ZC_REDUCING_KERNELS_OP(tname, T, oname, Op)                    \
  MSCCLPP_ZC_KERNEL(allreduce_zc_##oname##_##tname, (allreduceZc<T, Op>), 1)   \
  MSCCLPP_ZC_KERNEL(reducescatter_zc_##oname##_##tname, (reducescatterZc<T, Op>), 1)

// Send and receive with reducing receives, for two ranks' reductions (send_recv.cuh; not PreMulSum, whose scalar
// is in CollArgs).
#define MSCCLPP_SENDRECV_REDUCING_KERNEL_OP(tname, T, oname, Op)                           \
  extern "C" __global__ void __launch_bounds__(MSCCLPP_SENDRECV_THREADS)                   \
      mscclpp_send_recv_reduce_##oname##_##tname(const __grid_constant__ SendRecvArgs args)     \
  {                                                                                   \
    sendRecvKernel<SendRecvReduce<T, Op>>(args);                                                \
  }

#define MSCCLPP_REDUCING_KERNELS(tname, T)                        \
  MSCCLPP_REDUCING_KERNELS_OP(tname, T, sum, OpSum)               \
  MSCCLPP_REDUCING_KERNELS_OP(tname, T, prod, OpProd)             \
  MSCCLPP_REDUCING_KERNELS_OP(tname, T, max, OpMax)               \
  MSCCLPP_REDUCING_KERNELS_OP(tname, T, min, OpMin)               \
  MSCCLPP_REDUCING_KERNELS_OP(tname, T, avg, OpAvg)               \
  MSCCLPP_REDUCING_KERNELS_OP(tname, T, premulsum, OpPreMulSum)   \
  MSCCLPP_ZC_REDUCING_KERNELS_OP(tname, T, sum, OpSum)            \
  MSCCLPP_ZC_REDUCING_KERNELS_OP(tname, T, prod, OpProd)          \
  MSCCLPP_ZC_REDUCING_KERNELS_OP(tname, T, max, OpMax)            \
  MSCCLPP_ZC_REDUCING_KERNELS_OP(tname, T, min, OpMin)            \
  MSCCLPP_ZC_REDUCING_KERNELS_OP(tname, T, avg, OpAvg)            \
  MSCCLPP_SENDRECV_REDUCING_KERNEL_OP(tname, T, sum, OpSum)            \
  MSCCLPP_SENDRECV_REDUCING_KERNEL_OP(tname, T, prod, OpProd)          \
  MSCCLPP_SENDRECV_REDUCING_KERNEL_OP(tname, T, max, OpMax)            \
  MSCCLPP_SENDRECV_REDUCING_KERNEL_OP(tname, T, min, OpMin)            \
  MSCCLPP_SENDRECV_REDUCING_KERNEL_OP(tname, T, avg, OpAvg)            \
  MSCCLPP_KERNEL(scale_premulsum_##tname, (scaleOneRank<T, OpPreMulSum>))

#define MSCCLPP_MOVING_KERNELS()                    \
  MSCCLPP_KERNEL(allgather_packet, allgatherPacket) \
  MSCCLPP_KERNEL(allgather_copy, allgatherCopy)     \
  MSCCLPP_KERNEL(broadcast_packet, broadcastPacket) \
  MSCCLPP_KERNEL(broadcast_copy, broadcastCopy)     \
  MSCCLPP_ZC_KERNEL(allgather_zc, allgatherZc, 1)   \
  MSCCLPP_ZC_KERNEL(broadcast_zc, broadcastZc, 2)   \
  MSCCLPP_KERNEL(ce_fence, ceFence)                 \
  MSCCLPP_KERNEL(alltoall_packet, alltoallPacket)   \
  MSCCLPP_KERNEL(alltoall_copy, alltoallCopy)       \
  MSCCLPP_KERNEL(scatter_packet, scatterPacket)     \
  MSCCLPP_KERNEL(scatter_copy, scatterCopy)         \
  MSCCLPP_SENDRECV_KERNEL()                              \
  MSCCLPP_SIGNAL_KERNELS()

// __grid_constant__: the kernel reads its large argument where it lies, never copying it per thread.
#define MSCCLPP_SENDRECV_KERNEL()                                                     \
  extern "C" __global__ void __launch_bounds__(MSCCLPP_SENDRECV_THREADS)             \
      mscclpp_send_recv(const __grid_constant__ SendRecvArgs args)                          \
  {                                                                              \
    sendRecvKernel<SendRecvMoveOnly>(args);                                                \
  }
