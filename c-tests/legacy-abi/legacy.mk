# Legacy-ABI test: a program compiled against the 0.1.0 header and linked with our library.
# Include it near the end of the top-level Makefile (after NVCC, CUDA_ARCH, NVCCFLAGS, LINK_DEPS and
# CUDA_ORDER are defined: prerequisites are expanded when the rule is read). Paths are relative to the
# repository root.
#
# The 0.1.0 header is not part of this repository (CONTRIBUTING.md, "The legacy header", says where it comes
# from): it is copied at build time from LEGACY_HEADER (by default .legacy/mscclpp-0.1.0.h, a git-ignored
# place for it; or `make LEGACY_HEADER=path/to/mscclpp.h`) into build/legacy-include/mscclpp.h. Without it
# the target is skipped with a message, and `make test` counts the legacy-ABI test as skipped. The header includes
# <mscclppfifo.h>, which comes from c-tests/legacy-abi/include (written from the documented wire format).
#
#   make legacy-abi   ->  build/tests/gpu/legacy_allgather   (run: build/tests/gpu/legacy_allgather 2)
#                         build/tests/legacy/legacy_host: the host calls, no GPU needed (run by make test)
#                         build/bench/legacy/{pingpong,bidir_put}: the benchmarks, with the legacy device
#                         code (its FIFO push) on our proxy, run by run_bench.sh beside ours

LEGACY_HEADER ?= .legacy/mscclpp-0.1.0.h
LEGACY_INCLUDE_DIR := build/legacy-include
LEGACY_ABI_BIN := build/tests/gpu/legacy_allgather
LEGACY_ABI_SRC := c-tests/legacy-abi/legacy_allgather.cu
# The harness the GPU tests and benchmarks share (c-tests/harness/).
LEGACY_COMMON := $(wildcard c-tests/harness/*.h c-tests/harness/*.cuh)
LEGACY_ABI_DEPS := $(LEGACY_ABI_SRC) c-tests/legacy-abi/include/mscclppfifo.h $(LEGACY_COMMON) $(LINK_DEPS)
# Built first (order only): the library and its links, the bundled CUDA runtime, the compiler.
LEGACY_ABI_ORDER ?= $(if $(CUDA_ORDER),$(CUDA_ORDER),build/lib/libmscclpp.so)
NVCC ?= nvcc
LEGACY_NVCCFLAGS ?= $(if $(CUDA_ARCH),$(CUDA_ARCH),-arch=sm_90) -std=c++17 $(NVCCFLAGS) -Xcompiler -Wall,-Wextra

.PHONY: legacy-abi

ifeq ($(wildcard $(LEGACY_HEADER)),)
legacy-abi: ## the programs built on MSCCL++ 0.1.0's header (LEGACY_HEADER)
	@echo "legacy-abi: skipped: no MSCCL++ 0.1.0 mscclpp.h at LEGACY_HEADER=$(LEGACY_HEADER) (CONTRIBUTING.md, \"The legacy header\", says where to get one)"
else
LEGACY_BENCHES := build/bench/legacy/pingpong build/bench/legacy/bidir_put
# GPU tests whose source also builds on the 0.1.0 header: the same test with the legacy device code.
LEGACY_GPU_TESTS := build/tests/gpu/legacy/rank_failure
LEGACY_HOST_BIN := build/tests/legacy/legacy_host
legacy-abi: $(LEGACY_ABI_BIN) $(LEGACY_BENCHES) $(LEGACY_GPU_TESTS) $(LEGACY_HOST_BIN)

$(LEGACY_INCLUDE_DIR)/mscclpp.h: $(LEGACY_HEADER)
	@mkdir -p $(@D)
	install -m 0644 $< $@

# The legacy include directories come first and build/include is not searched at all, so the program
# sees only the 0.1.0 header and the FIFO header written for it.
$(LEGACY_ABI_BIN): $(LEGACY_ABI_DEPS) $(LEGACY_INCLUDE_DIR)/mscclpp.h | $(LEGACY_ABI_ORDER)
	@mkdir -p $(@D)
	$(NVCC) $(LEGACY_NVCCFLAGS) -I c-tests/legacy-abi/include -I $(LEGACY_INCLUDE_DIR) -I c-tests/harness \
	  $(LEGACY_ABI_SRC) -o $@ \
	  -L build/lib -lmscclpp -cudart shared -Xlinker -rpath -Xlinker '$$ORIGIN/../../lib'

# The host half (g++, no GPU needed), run by make test: the 0.1.0 header and the host tests' helpers.
$(LEGACY_HOST_BIN): c-tests/legacy-abi/legacy_host.cpp c-tests/host/host_test_common.h \
                    c-tests/legacy-abi/include/mscclppfifo.h $(LEGACY_INCLUDE_DIR)/mscclpp.h $(LINK_DEPS) \
                    | build/lib/libmscclpp.so
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -Wall -Wextra -Werror $(CXXFLAGS) -pthread -I c-tests/legacy-abi/include \
	  -I $(LEGACY_INCLUDE_DIR) -I c-tests/host $< -o $@ -L build/lib -lmscclpp -Wl,-rpath,'$$ORIGIN/../../lib'

build/bench/legacy/%: examples-c/bench/%.cu $(LEGACY_COMMON) $(LINK_DEPS) $(LEGACY_INCLUDE_DIR)/mscclpp.h \
                      | $(LEGACY_ABI_ORDER)
	@mkdir -p $(@D)
	$(NVCC) $(LEGACY_NVCCFLAGS) -I c-tests/legacy-abi/include -I $(LEGACY_INCLUDE_DIR) -I c-tests/harness $< -o $@ \
	  -L build/lib -lmscclpp -cudart shared -Xlinker -rpath -Xlinker '$$ORIGIN/../../lib'
build/tests/gpu/legacy/%: c-tests/gpu/%.cu $(LEGACY_COMMON) $(LINK_DEPS) $(LEGACY_INCLUDE_DIR)/mscclpp.h \
                          | $(LEGACY_ABI_ORDER)
	@mkdir -p $(@D)
	$(NVCC) $(LEGACY_NVCCFLAGS) -I c-tests/legacy-abi/include -I $(LEGACY_INCLUDE_DIR) -I c-tests/harness $< -o $@ \
	  -L build/lib -lmscclpp -cudart shared -Xlinker -rpath -Xlinker '$$ORIGIN/../../../lib'
endif
