// One rank's PreMulSum (an all-reduce, reduce-scatter or reduce of one rank): the output is the input, each
// element multiplied by the scalar (PreOp). The other operators of one rank are a copy, made by the host.
// No scratch and no epoch: nothing waits for anything.
#pragma once

#include "reduce.cuh"

template <typename T, typename Op>
__device__ void scaleOneRank(const CollArgs& a)
{
  const PreOp<T, Op> pre(a);
  const uint64_t units = unitsOf(a.bytes, 16);
  const bool aligned = a.aligned != 0;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t j = blockIdx.x * blockDim.x + threadIdx.x; j < units; j += step) {
    storeUnit<uint4>(a.recv, j, a.bytes, aligned, pre(loadUnit<uint4>(a.send, j, a.bytes, aligned)));
  }
}
