# sheaf: the two commands a new machine needs are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
SHEAF := target/release/sheaf

.PHONY: all build deps test lint demo bench fuzz fuzz-build clean

all: build

deps:
	@scripts/deps.sh

build: deps
	$(CARGO) build --release --locked

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --locked --all-targets -- -D warnings

# All tests: unit, property, integration (real trees, real tools), lint.
test: build lint
	$(CARGO) test --release --locked --workspace


demo: build
	scripts/demo.sh

bench: build
	scripts/deps.sh bench
	bench/setup.sh
	bench/run.sh

# Coverage-guided fuzzing of every parser of image bytes (needs nightly).
FUZZ_SECONDS ?= 60
fuzz: deps
	scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	$(CARGO) clean
