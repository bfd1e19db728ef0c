# attnres: the make targets.
#   make demo   install dependencies, build, prepare the offline corpus, run the paired demo
#   make test   install dependencies, build, run every test
#   make docs   regenerate the generated parts of docs/ (the config key table of docs/training.md)
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test demo docs clean

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

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
