# attnres: the make targets.
#   make demo   install dependencies, build, prepare the offline corpus, run the paired demo
#   make test   install dependencies, build, run every test
#   make docs   regenerate the generated parts of docs/ (the config key table of docs/training.md)
# GPU work (docs/cuda.md "Running on a bare GPU machine"):
#   make gpu-bundle      collect the GPU-check build's dependencies into .gpu/bundle
#   make gpu-rehearsal   rehearse tests/gpu/device-run.sh here, without a GPU (minutes; not in `make test`)
#                        EMULATE="--only c --steps 1" also runs those checks under the CPU emulator
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test demo docs clean gpu-bundle gpu-rehearsal

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release > $(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

docs: build
	@$(BUILD)/src/cli/attnres config --update-docs docs/training.md

demo: build
	@bash scripts/demo.sh $(BUILD)

gpu-bundle:
	@bash scripts/gpu-bundle.sh

gpu-rehearsal:
	@EMULATE="$(EMULATE)" bash tests/gpu/rehearse.sh

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
