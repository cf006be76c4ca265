// The reduction operators, applied element-wise to 8- and 16-byte units of any element type. Half and
// bfloat16 are computed in float and rounded once per step, as NCCL does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// Arithmetic in the element type, or in float for the 16-bit floating types.
template <typename T>
struct Arith {
  typedef T Acc;
  __device__ static Acc up(T v) { return v; }
  __device__ static T down(Acc v) { return v; }
};
template <>
struct Arith<__half> {
  typedef float Acc;
  __device__ static Acc up(__half v) { return __half2float(v); }
  __device__ static __half down(Acc v) { return __float2half_rn(v); }
};
template <>
struct Arith<__nv_bfloat16> {
  typedef float Acc;
  __device__ static Acc up(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 down(Acc v) { return __float2bfloat16_rn(v); }
};

struct OpSum {
  template <typename A>
  __device__ static A apply(A x, A y) { return x + y; }
};
struct OpProd {
  template <typename A>
  __device__ static A apply(A x, A y) { return x * y; }
};
struct OpMax {
  template <typename A>
  __device__ static A apply(A x, A y) { return x > y ? x : y; }
};
struct OpMin {
  template <typename A>
  __device__ static A apply(A x, A y) { return x < y ? x : y; }
};
// The average: a sum, divided by the number of ranks at the end (integers: truncated, as NCCL does).
struct OpAvg {
  template <typename A>
  __device__ static A apply(A x, A y) { return x + y; }
};

// What the last step does to a reduced element: nothing, but for the average.
template <typename Op>
struct Finish {
  template <typename A>
  __device__ static A apply(A x, uint32_t) { return x; }
};
template <>
struct Finish<OpAvg> {
  template <typename A>
  __device__ static A apply(A x, uint32_t nranks) { return x / static_cast<A>(nranks); }
};

// Element-wise reduction of two units of U bytes holding elements of type T.
template <typename T, typename Op, typename U>
__device__ __forceinline__ U reduceUnit(U x, U y)
{
  constexpr int n = sizeof(U) / sizeof(T);
  T* xs = reinterpret_cast<T*>(&x);
  const T* ys = reinterpret_cast<const T*>(&y);
#pragma unroll
  for (int i = 0; i < n; i++) {
    xs[i] = Arith<T>::down(Op::apply(Arith<T>::up(xs[i]), Arith<T>::up(ys[i])));
  }
  return x;
}

template <typename T, typename Op, typename U>
__device__ __forceinline__ U finishUnit(U x, uint32_t nranks)
{
  constexpr int n = sizeof(U) / sizeof(T);
  T* xs = reinterpret_cast<T*>(&x);
#pragma unroll
  for (int i = 0; i < n; i++) xs[i] = Arith<T>::down(Finish<Op>::apply(Arith<T>::up(xs[i]), nranks));
  return x;
}
