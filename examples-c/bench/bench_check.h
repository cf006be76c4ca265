// CHECK(call) for the benchmarks that measure the hardware without this library (peer_copy_ceiling,
// memory_traffic, graph_floor): they include nothing of it, nor ../common/, so that a reader sees all they
// do. A failed CUDA call prints `FAIL <BENCH_NAME>: <call>: <error> (line N)` on stdout, where run_bench.sh
// looks for failures, and exits 1. Define BENCH_NAME (a string literal) before including this header.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#ifndef BENCH_NAME
#error "define BENCH_NAME before including bench_check.h"
#endif

#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) {                                                                               \
      printf("FAIL " BENCH_NAME ": %s: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__);          \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)
