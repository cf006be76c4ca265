// The one part of the library in C++: mscclppRegisteredMemory holds a std::vector owned by the
// application, so appending to it and reading it must be done by C++ code built with the same
// standard library.
//
// The structs come from the public header that build.rs has just generated (it writes the headers before
// it compiles this file), so the layout seen here is the one applications see.
#include <mscclpp.h>

#include <cstddef>
#include <vector>

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
