// The one part of the library in C++: mscclppRegisteredMemory holds a std::vector owned by the
// application, so appending to it and reading it must be done by C++ code built with the same
// standard library.
#include <cstddef>
#include <vector>

struct mscclppIbMr;
struct mscclppRegisteredMemoryP2P {
  void* remoteBuff;
  mscclppIbMr* IbMr;
};
struct mscclppRegisteredMemory {
  std::vector<mscclppRegisteredMemoryP2P> p2p;
};

extern "C" int mscclpp_regmem_append(mscclppRegisteredMemory* mem, void* remoteBuff, mscclppIbMr* ibMr) noexcept {
  try {
    mem->p2p.push_back(mscclppRegisteredMemoryP2P{remoteBuff, ibMr});
    return 0;
  } catch (...) {
    return -1;  // allocation failure: reported as a system error by the caller
  }
}

extern "C" size_t mscclpp_regmem_len(const mscclppRegisteredMemory* mem) noexcept { return mem->p2p.size(); }

extern "C" const mscclppRegisteredMemoryP2P* mscclpp_regmem_data(const mscclppRegisteredMemory* mem) noexcept {
  return mem->p2p.data();
}
