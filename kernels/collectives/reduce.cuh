// The reduction operators, applied element-wise to 8- and 16-byte units of any element type. Half, bfloat16
// and the two fp8 types are computed in float and rounded once per step (fp8: to nearest even, saturating
// to the largest finite value, as cuda_fp8.h's conversions do).
#pragma once

#include "common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

// Arithmetic in the element type, or in float for the 16- and 8-bit floating types.
template <typename T>
struct Arith {
  typedef T Acc;
  __device__ static Acc up(T v) { return v; }
  __device__ static T down(Acc v) { return v; }
};
// The narrow floating types are computed in float and rounded back once per step.
#define MSCCLPP_ARITH_IN_FLOAT(T, toFloat, fromFloat)                  \
  template <>                                                          \
  struct Arith<T> {                                                    \
    typedef float Acc;                                                 \
    __device__ static Acc up(T v) { return toFloat(v); }               \
    __device__ static T down(Acc v) { return fromFloat(v); }           \
  };
MSCCLPP_ARITH_IN_FLOAT(__half, __half2float, __float2half_rn)
MSCCLPP_ARITH_IN_FLOAT(__nv_bfloat16, __bfloat162float, __float2bfloat16_rn)
// fp8 to and from float (to fp8: nearest even, saturating). sm_89 and later convert in an instruction;
// before (sm_80), cuda_fp8.h emulates the conversions in long sequences, called here rather than inlined at
// each of the kernels' conversions, which made the fp8 units' compile two and a half times longer.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#define MSCCLPP_FP8_CONVERSION static __device__ __noinline__
#else
#define MSCCLPP_FP8_CONVERSION static __device__ __forceinline__
#endif
MSCCLPP_FP8_CONVERSION __nv_fp8_e4m3 floatToE4m3(float v) { return __nv_fp8_e4m3(v); }
MSCCLPP_FP8_CONVERSION __nv_fp8_e5m2 floatToE5m2(float v) { return __nv_fp8_e5m2(v); }
MSCCLPP_FP8_CONVERSION float e4m3ToFloat(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
MSCCLPP_FP8_CONVERSION float e5m2ToFloat(__nv_fp8_e5m2 v) { return static_cast<float>(v); }
MSCCLPP_ARITH_IN_FLOAT(__nv_fp8_e4m3, e4m3ToFloat, floatToE4m3)
MSCCLPP_ARITH_IN_FLOAT(__nv_fp8_e5m2, e5m2ToFloat, floatToE5m2)

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

// NCCL's ncclRedOpCreatePreMulSum: every rank's input multiplied by its scalar (PreOp, below), then summed.
struct OpPreMulSum {
  template <typename A>
  __device__ static A apply(A x, A y) { return x + y; }
};

// A product rounded on its own, never fused with the addition that follows (nvcc contracts a * b + c into
// one fma where it can see both): PreMulSum's scaled input must be the same value whether it was sent to a
// peer or added on the rank itself, so that every rank, and every path, adds the same terms.
template <typename A>
__device__ __forceinline__ A mulRounded(A x, A y) { return x * y; }
template <>
__device__ __forceinline__ float mulRounded(float x, float y) { return __fmul_rn(x, y); }
template <>
__device__ __forceinline__ double mulRounded(double x, double y) { return __dmul_rn(x, y); }

// What a rank's input goes through where the rank reads it from its own buffer, before it leaves for the
// peers or enters its own reduction (never a partial result): nothing, but for PreMulSum, where each
// element is multiplied by the rank's scalar (in the arithmetic type, rounded to the element type, as NCCL
// does). Constructed once per thread: a scalar in device memory is read when the kernel runs.
template <typename T, typename Op>
struct PreOp : NoPre {
  __device__ explicit PreOp(const CollArgs&) {}
};
template <typename T>
struct PreOp<T, OpPreMulSum> {
  typename Arith<T>::Acc scalar;
  __device__ explicit PreOp(const CollArgs& a) : scalar(Arith<T>::up(collScalar<T>(a))) {}
  template <typename U>
  __device__ __forceinline__ U operator()(U v) const
  {
    constexpr int n = sizeof(U) / sizeof(T);
    T* xs = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int i = 0; i < n; i++) xs[i] = Arith<T>::down(mulRounded(Arith<T>::up(xs[i]), scalar));
    return v;
  }
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
