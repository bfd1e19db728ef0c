# attnres: the make targets.
#   make demo       install dependencies, build, prepare the offline corpus, run the paired demo
#   make test       install dependencies, build, run every test (and list the skipped ones with their reasons)
#   make test-blas-flip  rerun the suites whose fp32 results depend on OpenBLAS's kernels with
#                   OPENBLAS_CORETYPE flipped (Haswell if unset, unset if set), and Fp32Golden
#                   with Prescott: what CI runs after `make test` (.ci/run)
#   make docs       regenerate the generated parts of docs/ (the config key table of docs/training.md)
#   make sanitize   build the test suite with ASan + UBSan (build-sanitize/) and run it
#   make fuzz       build the libFuzzer targets with clang (build-fuzz/) and fuzz each one for
#                   FUZZ_SECONDS seconds (docs/reliability.md)
#   make hardening  what CI runs of both (.ci/run): one clang build (build-hardening/) with ASan,
#                   UBSan and the fuzzer's coverage, the suites of HARDENING_TESTS under the
#                   sanitizers, then every fuzz target for FUZZ_SECONDS seconds
# GPU work (docs/cuda.md "Running on a bare GPU machine"):
#   make gpu-bundle      collect the GPU-check build's dependencies into .gpu/bundle
#   make gpu-rehearsal   rehearse tests/gpu/device-run.sh here, without a GPU (minutes; not in `make test`)
#                        EMULATE="--only c --steps 1" also runs those checks under the CPU emulator;
#                        CCACHE=1 compiles through ccache (a second rehearsal is quick); KEEP=1 keeps its scratch
BUILD ?= build
SANITIZE_BUILD ?= build-sanitize
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
HARDENING_BUILD ?= build-hardening
HARDENING_OPT ?= -O0
# The test executables `make hardening` builds and runs under the sanitizers: attnres_tests, every
# C++ suite but the PyTorch-reference one (test_reference: 64 tests, 230 s under ASan, each running
# the float64 torch oracle beside the model code that the finite-difference suites run here too)
# and MPI's (test_mpi, not built: MPI off) (tests/CMakeLists.txt). Left out as well:
# the bf16 GEMM's exact-summation-order checks (90 s under ASan; the same kernels and tails run in
# Bf16Hardware.MatchesReference and MatchesFallback) and the fp32 one's (34 s; its kernel runs in the
# other GemmF32 tests), and CliSafety, which never ran here (it had its own executable before
# attnres_tests). `make sanitize` runs everything.
HARDENING_SKIP = Bf16Hardware\.(WithinSummationBound|ExactSummationOrder)|GemmF32\.ExactSummationOrder|^CliSafety
HARDENING_TESTS ?= attnres_tests
JOBS ?= $(shell nproc)

# Tests that cannot run under the sanitizers, by CTest label; each label's reason is printed.
SANITIZE_EXCLUDE = no_sanitize
# The sanitizers' settings for both suites: every finding stops the test; LeakSanitizer skips what
# the OpenMP runtime keeps for its threads (tests/sanitizers/lsan.supp).
SANITIZER_ENV = ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1:halt_on_error=1 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: all deps configure build test test-blas-flip demo docs sanitize fuzz hardening clean gpu-bundle gpu-rehearsal

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release > $(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The PyTorch reference's server (tests/reference/ref_server.py) is no child of ctest: its CPU
# seconds, which a `time make test` does not count, are in its log's last line, printed here.
REFERENCE_SERVER_CPU = { grep -h "^ref_server: stopped" $(abspath $(BUILD))/reference-server.sock.log 2>/dev/null || true; }

test: build
	@cd $(BUILD) && status=0 && ctest --output-on-failure -j $(JOBS) || status=$$?; \
	  bash $(CURDIR)/scripts/test-skips.sh . ; $(REFERENCE_SERVER_CPU); exit $$status

# The suites whose fp32 results depend on the BLAS kernels' summation order: the Python package
# against the oracle and the C++ model, the C++ model against the float64 reference. Their
# tolerances come from error bounds (tests/reference/rounding.py), so they must pass under either
# kernel set; Fp32Golden's bit-exact hashes are recorded for the Prescott kernels on every machine
# class (tests/model/test_fp32_golden.cpp), so it runs with those. The fp32 GEMM backend follows
# OpenBLAS' core (kernels/gemm_f32.hpp), so on AVX-512 CPUs the flip changes it too, and
# GemmF32.BackendChoice checks the choice under both cores.
BLAS_SENSITIVE_TESTS = ^python_model$$|^python_cli$$|Reference\.Float32|ReferenceUntied|^GemmF32\.BackendChoice$$
test-blas-flip: build
	@if [ -n "$${OPENBLAS_CORETYPE+set}" ]; then flip="env -u OPENBLAS_CORETYPE"; what="unset (was $$OPENBLAS_CORETYPE)"; \
	  else flip="env OPENBLAS_CORETYPE=Haswell"; what="Haswell (was unset)"; fi; \
	  echo "test-blas-flip: OPENBLAS_CORETYPE $$what"; \
	  cd $(BUILD) && $$flip ctest --output-on-failure -j $(JOBS) -R '$(BLAS_SENSITIVE_TESTS)' && \
	  echo "test-blas-flip: Fp32Golden with OPENBLAS_CORETYPE=Prescott" && \
	  OPENBLAS_CORETYPE=Prescott ctest --output-on-failure -R '^Fp32Golden\.' && bash $(CURDIR)/scripts/test-skips.sh . && \
	  $(REFERENCE_SERVER_CPU)

docs: build
	@$(BUILD)/src/cli/attnres config --update-docs docs/training.md

demo: build
	@bash scripts/demo.sh $(BUILD)

# -O1 keeps the instrumented suite fast enough; CUDA and the benchmarks are left out.
sanitize: deps
	@cmake -S . -B $(SANITIZE_BUILD) -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_CXX_FLAGS_SANITIZE="-O1" \
	  -DCMAKE_C_FLAGS_SANITIZE="-O1" -DATTNRES_SANITIZE=address,undefined -DATTNRES_CUDA=OFF \
	  -DATTNRES_BUILD_BENCH=OFF > $(SANITIZE_BUILD).configure.log 2>&1 || { cat $(SANITIZE_BUILD).configure.log; exit 1; }
	@cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	@sed 's/^/sanitize: skipped (label $(SANITIZE_EXCLUDE)): /' $(SANITIZE_BUILD)/sanitize-skips.txt
	@cd $(SANITIZE_BUILD) && $(SANITIZER_ENV) ctest --output-on-failure -j $(JOBS) -LE $(SANITIZE_EXCLUDE)

fuzz: deps
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_CXX_FLAGS_FUZZ="-O1" -DCMAKE_C_FLAGS_FUZZ="-O1" \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DATTNRES_FUZZ=ON -DATTNRES_NATIVE=OFF \
	  -DATTNRES_CUDA=OFF -DATTNRES_MPI=OFF -DATTNRES_BUILD_TESTS=OFF -DATTNRES_BUILD_BENCH=OFF \
	  > $(FUZZ_BUILD).configure.log 2>&1 || { cat $(FUZZ_BUILD).configure.log; exit 1; }
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target attnres_fuzz
	@bash fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# One build for both stages: the fuzz configuration (clang, ASan + UBSan, fuzzer-no-link coverage)
# with the tests on; only HARDENING_TESTS, the CLI and the fuzz binary are built, and CTest's
# placeholders for the unbuilt suites (*_NOT_BUILT) and the Python suites are left out.
# HARDENING_OPT (-O0: half the compile time of -O1) is every file's optimisation but the kernels,
# model and kernel tests', which attnres_optimize_under_sanitizers (CMakeLists.txt) builds at -O1.
hardening: deps
	@cmake -S . -B $(HARDENING_BUILD) -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_CXX_FLAGS_FUZZ="$(HARDENING_OPT)" \
	  -DCMAKE_C_FLAGS_FUZZ="$(HARDENING_OPT)" \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DATTNRES_FUZZ=ON -DATTNRES_NATIVE=OFF \
	  -DATTNRES_CUDA=OFF -DATTNRES_MPI=OFF -DATTNRES_BUILD_BENCH=OFF \
	  > $(HARDENING_BUILD).configure.log 2>&1 || { cat $(HARDENING_BUILD).configure.log; exit 1; }
	@cmake --build $(HARDENING_BUILD) -j $(JOBS) --target attnres attnres_fuzz $(HARDENING_TESTS)
	@sed 's/^/hardening: skipped (label $(SANITIZE_EXCLUDE)): /' $(HARDENING_BUILD)/sanitize-skips.txt
	@cd $(HARDENING_BUILD) && $(SANITIZER_ENV) ctest --output-on-failure -j $(JOBS) \
	  -LE '$(SANITIZE_EXCLUDE)|python' -E '_NOT_BUILT$$|^reference_|$(HARDENING_SKIP)'
	@bash fuzz/run.sh $(HARDENING_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

gpu-bundle:
	@bash scripts/gpu-bundle.sh

gpu-rehearsal:
	@EMULATE="$(EMULATE)" CCACHE="$(CCACHE)" KEEP="$(KEEP)" bash tests/gpu/rehearse.sh

clean:
	rm -rf $(BUILD) $(BUILD).configure.log $(SANITIZE_BUILD) $(SANITIZE_BUILD).configure.log \
	  $(FUZZ_BUILD) $(FUZZ_BUILD).configure.log $(HARDENING_BUILD) $(HARDENING_BUILD).configure.log
