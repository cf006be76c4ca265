// A stand-in for the CUDA driver (libcuda.so.1) of a machine that has the driver and no device it may use
// (as with CUDA_VISIBLE_DEVICES= on a GPU machine): cuInit fails with CUDA_ERROR_NO_DEVICE and
// cuGetErrorName names its codes. For the tests that a library without a device still initialises, and
// never waits on itself while naming the driver's error (c-tests/nccl/run_nccl_tests.sh).
#include <stddef.h>

typedef int CUresult;
enum { CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NO_DEVICE = 100 };

CUresult cuInit(unsigned int flags) {
  (void)flags;
  return CUDA_ERROR_NO_DEVICE;
}

CUresult cuGetErrorName(CUresult error, const char** name) {
  if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
  *name = error == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : NULL;
  return *name ? 0 : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
  *text = error == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable device is detected" : NULL;
  return *text ? 0 : CUDA_ERROR_INVALID_VALUE;
}
