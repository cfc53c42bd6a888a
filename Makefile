# Thin wrapper over CMake. `make` builds into build/ (the command is build/kdloss);
# `make test` builds and runs every test (also under ASan+UBSan); `make bench` runs the main job.
SHELL      := /bin/bash
BUILD      ?= build
BUILD_SAN  ?= build-san
BUILD_CUDA ?= build-cuda
BUILD_FUZZ ?= build-fuzz
BUILD_SIM  ?= build-sim
BUILD_BI   ?= build-builtin
FUZZ_TIME  ?= 10
FUZZ_LONG  ?= 600
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps build install test test-c test-install test-san test-cuda test-cuda-sim test-py test-fuzz fuzz fuzz-build test-fault bench bench-check cuda clean wheel test-wheel test-builtin gpu-check-files test-gpu-dry gpu-model
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)

all: build

deps:
	@bash scripts/deps.sh c

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

test-c: build
	cd $(BUILD) && ctest --output-on-failure

# `make install [PREFIX=DIR]`: header, library, CMake package and kdloss.pc (CMake's default
# prefix, /usr/local, without PREFIX). test-install runs the install test alone (test-c has it).
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

test-install: build
	cd $(BUILD) && ctest --output-on-failure -R test_install

# `make wheel`: dist/kdloss-*-manylinux_*.whl, oneDNN inside, libgomp shared with the process, and
# where nvcc exists the CUDA backend libkdloss_cuda.so (scripts/wheel.sh says why); test-wheel
# installs it in a fresh venv (tests/install/test_wheel.sh).
wheel: deps
	bash scripts/wheel.sh

test-wheel: wheel
	bash tests/install/test_wheel.sh

# The CPU library without oneDNN (-DKDLOSS_GEMM=builtin, what the GPU image builds): no libdnnl
# linked, `kdloss info` names the builtin provider, and the CPU tests' quick subset passes.
test-builtin: deps
	cmake -S . -B $(BUILD_BI) -DCMAKE_BUILD_TYPE=Release -DKDLOSS_GEMM=builtin $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD_BI) -j $(JOBS)
	@if readelf -d $(BUILD_BI)/libkdloss.so | grep -i dnnl; then echo "test-builtin: libdnnl is linked"; exit 1; fi
	$(BUILD_BI)/kdloss info | grep '^gemm        builtin .*in use'
	cd $(BUILD_BI) && KDLOSS_TEST_QUICK=1 ctest --output-on-failure -E '^test_(install|vp_np[0-9]|fault_inject|fault_gemm)$$'

# The files bench/gpu_check.sh installs on the GPU machine (bench/gpu_check/NOTES.md): the wheel
# (dist/) and Liger-Kernel's (.whl/, pure Python, from PyPI when missing).
gpu-check-files: wheel
	@ls .whl/liger_kernel-*.whl >/dev/null 2>&1 || \
	  "$$(bash scripts/deps.sh py | tail -n 1)/bin/pip" download -q --no-deps liger-kernel -d .whl
	@ls -la dist/kdloss-*manylinux*.whl .whl/liger_kernel-*.whl

# bench/gpu_check.sh --dry-run: every step before the first GPU call, here (it reuses the CUDA
# build of test-cuda and the simulator build of test-cuda-sim).
test-gpu-dry: gpu-check-files
	GPU_CHECK_BUILD=$(BUILD_CUDA) GPU_CHECK_SIM_BUILD=$(BUILD_SIM) bash bench/gpu_check.sh --dry-run

# The sanitizer build carries the CUDA backend on the simulator (cudasim/): its test_cuda runs the
# quick subset of every CUDA kernel under ASan + UBSan.
test-san: deps
	cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=Debug -DKDLOSS_SANITIZE=ON -DKDLOSS_CUDA_SIM=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD_SAN) -j $(JOBS)
	cd $(BUILD_SAN) && KDLOSS_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -E test_cuda_gemmex

# The CUDA simulator (cudasim/README.md): src/cuda compiled by the host compiler and every kernel
# run on CPU threads under memcheck, racecheck, synccheck and initcheck; tests/cuda/test_cuda_*.c
# whole, the simulator's planted defects and its cuBLAS / NCCL stand-ins. Ends with the line
# "cuda-sim: K of N kernels executed, C checker reports".
test-cuda-sim: deps
	cmake -S . -B $(BUILD_SIM) -DCMAKE_BUILD_TYPE=Release -DKDLOSS_CUDA_SIM=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD_SIM) -j $(JOBS) --target test_cuda test_sim_planted test_sim_blas gpu_model
	cd $(BUILD_SIM) && ctest --output-on-failure -R '^test_(cuda|cuda_gemmex|sim_planted|sim_blas|gpu_model)$$'
	@grep -h '^cuda-sim: .* launch sites reached' $(BUILD_SIM)/Testing/Temporary/LastTest.log | head -1
	@grep -h '^cuda-sim: .* kernels executed' $(BUILD_SIM)/Testing/Temporary/LastTest.log | head -1

# The GPU model (bench/gpu_model/): the seed workloads' time on an H100 SXM and an H200, modelled
# from what the simulator counts (bytes per launch, GEMM FLOPs, syncs), labelled "modelled, not
# measured". A few minutes; `make test` runs its --check (test_gpu_model).
gpu-model: deps
	cmake -S . -B $(BUILD_SIM) -DCMAKE_BUILD_TYPE=Release -DKDLOSS_CUDA_SIM=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD_SIM) -j $(JOBS) --target gpu_model
	$(BUILD_SIM)/gpu_model

# The CUDA backend is built with nvcc (warnings as errors) wherever nvcc exists, for sm_90 only
# (the wheel builds every architecture: make wheel); its test skips itself without a GPU (the
# simulator runs the kernels: test-cuda-sim).
test-cuda: deps
ifneq ($(NVCC),)
	cmake -S . -B $(BUILD_CUDA) -DCMAKE_BUILD_TYPE=Release -DKDLOSS_CUDA=ON -DKDLOSS_GEMM=auto -DKDLOSS_CUDA_ARCHS=90-real $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD_CUDA) -j $(JOBS)
	cd $(BUILD_CUDA) && ctest --output-on-failure -R cuda
else
	@echo "test-cuda: nvcc not found, CUDA build check skipped"
endif

# The PyTorch binding: a venv with torch (created when missing), pip install ., pytest. The CUDA
# library is left out of that install unless KDLOSS_CUDA=1 (on a GPU machine): without a device
# it is never loaded, and `make wheel` builds it (every architecture) in the same build-py/cmake.
test-py: deps
	KDLOSS_CUDA=$${KDLOSS_CUDA:-0} bash scripts/test_python.sh

# The libFuzzer target over the C API (clang, ASan + UBSan): a bounded run in `make test`, a long
# one with a kept corpus in `make fuzz`. Skipped, with a message, only when clang cannot link
# libFuzzer (scripts/deps.sh c installs clang and libclang-rt-14-dev).
FUZZ_OK = printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' | \
	clang -x c -fsanitize=fuzzer - -o $(BUILD_FUZZ)/.probe >/dev/null 2>&1
fuzz-build: deps
	@mkdir -p $(BUILD_FUZZ)
	@if $(FUZZ_OK); then \
	  CC=clang cmake -S . -B $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=Debug -DKDLOSS_FUZZ=ON -DKDLOSS_WERROR=OFF $(CMAKE_ARGS) >/dev/null && \
	  cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_api; \
	else echo "fuzz: clang with libFuzzer not available, fuzz target not built"; fi

test-fuzz: fuzz-build
	@if [ -x $(BUILD_FUZZ)/fuzz_api ] && $(FUZZ_OK); then \
	  ASAN_OPTIONS=detect_leaks=1 $(BUILD_FUZZ)/fuzz_api -max_total_time=$(FUZZ_TIME) -print_final_stats=1 -artifact_prefix=$(BUILD_FUZZ)/ 2>&1 | tail -25; \
	  exit $${PIPESTATUS[0]}; \
	else echo "test-fuzz: SKIPPED: clang with libFuzzer not available"; fi

fuzz: fuzz-build
	@mkdir -p $(BUILD_FUZZ)/corpus
	ASAN_OPTIONS=detect_leaks=1 $(BUILD_FUZZ)/fuzz_api $(BUILD_FUZZ)/corpus -max_total_time=$(FUZZ_LONG) -print_final_stats=1 -artifact_prefix=$(BUILD_FUZZ)/

# The fault-injection tests alone (also in `ctest`): their tables of allocation points.
test-fault: build
	cd $(BUILD) && ctest --output-on-failure -L fault

test: test-c test-builtin test-san test-fuzz test-cuda test-cuda-sim test-py test-wheel test-gpu-dry

# The environment stays as the user has it (OPENBLAS_* included); the last lines say which
# targets were met. bench exits 1 only when a benchmark failed to run; bench-check runs the same
# and exits 3 when all ran but some target was NOT MET.
bench: build
	bash bench/run_main.sh $(BUILD)

bench-check: build
	bash bench/run_main.sh $(BUILD) --check

cuda: deps
	cmake -S . -B $(BUILD_CUDA) -DCMAKE_BUILD_TYPE=Release -DKDLOSS_CUDA=ON -DKDLOSS_GEMM=auto -DKDLOSS_CUDA_ARCHS= $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD_CUDA) -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_CUDA) $(BUILD_FUZZ) $(BUILD_SIM) $(BUILD_BI) build-py build-gpu-check
