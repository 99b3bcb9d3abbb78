# sheaf: the two commands a new machine needs are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
SHEAF := target/release/sheaf
# MPI for `sheaf bcast` when the system has an MPI compiler wrapper (decided
# when the recipe runs, after `deps` may have installed it).
MPI_FEATURE = $$(command -v mpicc >/dev/null 2>&1 && echo --features sheaf-cli/mpi)

.PHONY: all bin spank build deps deps-build trees check test install install-files deb static lint demo bench soak fuzz clean

all: build

# Debian packages in tiers (scripts/deps.sh): `build` and `demo` install only
# what they need; `deps` (tests, lint, fuzz) installs every server the tests
# start, and comes before `build` in `test` so that MPI is there when sheaf
# is compiled.
deps:
	@scripts/deps.sh test
deps-build:
	@scripts/deps.sh build

# `bin` is the programs alone (what the demo needs); `build` adds the wheel.
# The Slurm SPANK plugin (slurm/sheaf_spank.c, docs/slurm.md) is built beside
# them when Slurm's header is there (libslurm-dev: scripts/deps.sh build).
bin: deps-build
	$(CARGO) build --release --locked $(MPI_FEATURE)
	@$(MAKE) --no-print-directory spank
SPANK_SO := target/release/sheaf_spank.so
spank:
	@if [ -f /usr/include/slurm/spank.h ]; then \
	  echo "cc slurm/sheaf_spank.c -> $(SPANK_SO)"; \
	  $${CC:-cc} -std=gnu11 -Wall -Wextra -Werror -O2 -fPIC -shared -o $(SPANK_SO) slurm/sheaf_spank.c; \
	else echo "spank: no /usr/include/slurm/spank.h (libslurm-dev): the Slurm plugin is not built"; fi
build: bin
	scripts/python.sh wheel   # the Python package: target/wheels/sheaf-*.whl (docs/python.md)

lint: deps
	scripts/lint-json-keys.sh   # no JSON field looked up by string: shared serde types
	scripts/check-crate-graph.sh   # docs/architecture.md's crate graph is cargo's
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --locked --all-targets $(MPI_FEATURE) -- -D warnings

# Real trees the tests compare against (K: Linux source, P: Python stack).
BENCH_DATA ?= /var/tmp/sheaf-bench
trees: deps
	SHEAF_BENCH_DATA=$(BENCH_DATA) bench/setup.sh K P

# The fast tier: unit and property tests and the integration tests that need
# no root, no mounts, no servers and no real trees (those say they are skipped).
CHECK_TESTS := --test cli --test corruption --test deep --test proptest \
	--test tar_input --test hostile --test roundtrip --test reader --test stack \
	--test incremental --test dictionary --test install \
	--test versions --test sources --test cache_keys --test extract \
	--test find --test layers --test trust --test unix --test references \
	--test quoting
check: deps build
	scripts/lint-json-keys.sh
	scripts/check-crate-graph.sh
	SHEAF_TEST_TIER=check $(CARGO) test --release --locked --workspace $(MPI_FEATURE) --lib --bins $(CHECK_TESTS)

# All tests, as CI runs them: unit, property, integration (real trees, real
# FUSE mounts, nginx, squid, sshd, pjdfstest), lint. A test whose
# prerequisite is missing fails here.
test: deps build lint trees
	SHEAF_BENCH_DATA=$(BENCH_DATA) $(CARGO) test --release --locked --workspace $(MPI_FEATURE)
	scripts/python.sh test    # the Python package's pytest suite, in target/pyenv

# The soak (not part of test): SOAK_READERS readers (default 64) for
# SOAK_MINUTES (default 10) over a local image, a URL whose server restarts
# every minute, a 10-layer union and a writable overlay; zero mismatches,
# zero errors, no fd/thread growth; report in bench/results/DATE-soak.md.
SOAK_READERS ?= 64
SOAK_MINUTES ?= 10
soak: build
	SOAK_READERS=$(SOAK_READERS) SOAK_MINUTES=$(SOAK_MINUTES) $(CARGO) test --release --locked -p sheaf-cli $(MPI_FEATURE) --test soak -- --ignored --nocapture

# The programs (`sheaf`, small, mounts local images itself and runs
# libexec/sheaf/sheaf-full, the whole tool, for everything else), the helper
# mount(8) runs for `-t fuse.sheaf` and fstab, the systemd units of the containerd snapshotter (not
# enabled: add --repo to the service's ExecStart, then `systemctl enable --now
# sheaf-snapshotter.socket sheaf-snapshotter.service`; docs/containers.md), a man
# page per command (`man sheaf-mount`) and the bash, zsh and fish completions,
# all made from the same definitions as --help. `install-files` only copies
# what is built (scripts/deb.sh runs it).
PREFIX ?= /usr/local
MAN1 = $(DESTDIR)$(PREFIX)/share/man/man1
install: build
	@$(MAKE) --no-print-directory install-files
install-files:
	install -D -m 755 $(SHEAF) $(DESTDIR)$(PREFIX)/bin/sheaf
	install -D -m 755 $(SHEAF)-full $(DESTDIR)$(PREFIX)/libexec/sheaf/sheaf-full
	install -d $(DESTDIR)/sbin
	ln -sf $(PREFIX)/bin/sheaf $(DESTDIR)/sbin/mount.fuse.sheaf
	install -d $(DESTDIR)/etc/systemd/system
	$(SHEAF) snapshotter --systemd-unit | sed 's|^ExecStart=[^ ]*|ExecStart=$(PREFIX)/bin/sheaf|' > $(DESTDIR)/etc/systemd/system/sheaf-snapshotter.service
	$(SHEAF) snapshotter --systemd-socket > $(DESTDIR)/etc/systemd/system/sheaf-snapshotter.socket
	install -d $(MAN1)
	$(SHEAF) man --dir $(MAN1)
	install -d $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	$(SHEAF) completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/sheaf
	$(SHEAF) completions zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_sheaf
	$(SHEAF) completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/sheaf.fish
	if [ -f $(dir $(SHEAF))sheaf_spank.so ]; then install -D -m 644 $(dir $(SHEAF))sheaf_spank.so $(DESTDIR)$(PREFIX)/lib/sheaf/sheaf_spank.so; fi
	install -D -m 644 slurm/sheaf-slurm.8 $(DESTDIR)$(PREFIX)/share/man/man8/sheaf-slurm.8
	install -D -m 644 docs/slurm.md $(DESTDIR)$(PREFIX)/share/doc/sheaf/slurm.md

# A fully static build (musl): target/static/sheaf and sheaf-full, then a
# smoke test of them (build, ls, mount, read back, umount) with an empty
# environment. No MPI in it (bcast copies locally). README: "A static build".
static:
	scripts/static.sh

# A Debian package of what `make install` installs, with PREFIX=/usr:
# target/debian/sheaf_VERSION_ARCH.deb (`dpkg -i` it; `dpkg -P sheaf` removes all).
deb: deps build
	scripts/deb.sh


# Under five minutes on a fresh 2-core machine: the programs (no wheel: the
# demo does not use Python), then nginx and ssh-keygen.
demo: bin
	@scripts/deps.sh demo
	scripts/demo.sh

bench: build
	scripts/deps.sh bench
	bench/setup.sh
	bench/run.sh
	bench/mount.sh
	bench/metadata.sh
	bench/cold-scan.sh
	bench/default-image.sh
	bench/scale.sh
	bench/http.sh
	bench/layers.sh
	bench/pools.sh
	bench/ssh.sh
	bench/containers.sh
	bench/overlay.sh
	bench/cluster.sh
	bench/slurm.sh
	bench/run-image.sh
	bench/incremental.sh
	bench/python.sh
	bench/setup.sh V
	bench/dedup.sh

# Coverage-guided fuzzing of every parser of image bytes (needs nightly).
FUZZ_SECONDS ?= 60
fuzz: deps
	scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	$(CARGO) clean
