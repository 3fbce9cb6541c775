# distlock: `make demo` and `make test` set up everything they need on Debian.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: deps test fmt lint demo bench chaos package clean

deps:
	@./scripts/install-deps.sh

## Formatting, lints and every test, strictly against real servers. The test jobs
## (a binary, or one module of a crate's `it` binary) run TEST_JOBS at a time, default 4
## (scripts/run-tests.sh; TEST_JOBS=1: one after another).
test: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# Every intra-doc link resolves (the dependencies' metadata is clippy's).
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet
	LOCK_TEST_STRICT=1 CARGO=$(CARGO) ./scripts/run-tests.sh
	# The facade without its backends: a URL names the feature to enable.
	$(CARGO) test -p distlock --no-default-features --lib
	# The published crates package: manifests, READMEs, the files they read.
	$(CARGO) package --no-verify --allow-dirty --quiet $(PUBLISHED)

## The crates published on crates.io, and `make package`: each packaged and built alone
## from its package, as `cargo publish` would (a build of its own per crate: slow).
PUBLISHED = -p lock-core -p lock-redis -p lock-zookeeper -p lock-etcd -p lock-postgres -p lock-file -p distlock -p conformance \
	-p lockctl
package: deps
	$(CARGO) package --allow-dirty $(PUBLISHED)

## A short demonstration: clients contending for one lock, a fleet of processes
## migrated from ZooKeeper to Redis and back (docs/migration.md), then a comparative
## benchmark of every single backend on throwaway local servers (one run, so no
## medians; `make bench` reports medians of 3 runs, the dual lock included). The
## semaphore, read-write and multi-lock rows add about 35 s (`--primitives` alone: none).
demo: deps
	$(CARGO) build --quiet --release -p examples --bin demo --bin migration --bin fleet_member
	$(CARGO) build --quiet --release -p tools --bin lockbench
	./target/release/demo
	./target/release/migration
	./target/release/lockbench --runs 1 --duration 1s --warmup 300ms --clients 64 --locks 1,1024 \
		--sweep 1,8,64,256 --held 1000 --takeover-rounds 2 --out lockbench-report \
		--primitives semaphore,semaphore-many,rwlock,multi \
		--backends memory,redis,redlock,zookeeper,etcd,postgres,file

## Longer seeded fault schedules on every backend and on dual deployments (the dual
## lock, faults on either side; not in `make test`), every conformance rule on the
## deployments that run a short form in `make test` (TLS, RedLock as a new side), then
## the reliability report in chaos-report/ (CHAOS_SECONDS per nemesis run, CHAOS_SEED for
## its schedule and option sets). The scenarios mostly wait on leases and faults, so
## CHAOS_JOBS groups of them (a chaos module of a crate, e.g. lock-redis's `chaos::semaphore`)
## run side by side, each on 2 test threads (scripts/run-tests.sh; CHAOS_JOBS=1: one
## after another).
CHAOS_SECONDS ?= 60
CHAOS_SEED ?= 1
CHAOS_JOBS ?= 3
CHAOS_ONLY = ^((lab|lock-redis|lock-zookeeper|lock-etcd|lock-postgres)/test/it/chaos/|lab/test/dual_chaos$$|(lab|lock-redis|lock-zookeeper)/test/it/(dual|conformance)/|lockctl/test/it/signals/)
chaos: deps
	rm -rf chaos-report && mkdir -p chaos-report
	CHAOS_LONG=1 CHAOS_SECONDS=$(CHAOS_SECONDS) CHAOS_SEED=$(CHAOS_SEED) \
		LOCK_TEST_SEED=$(CHAOS_SEED) CHAOS_REPORT_DIR=$(CURDIR)/chaos-report \
		LOCK_TEST_STRICT=1 CARGO=$(CARGO) TEST_RUN=chaos TEST_JOBS=$(CHAOS_JOBS) TEST_SPLIT=2 \
		TEST_BUILD="--release -p lab -p lock-redis -p lock-zookeeper -p lock-etcd -p lock-postgres -p lockctl \
		--test it --test dual_chaos" TEST_ONLY='$(CHAOS_ONLY)' \
		./scripts/run-tests.sh -- --test-threads 2
	$(CARGO) run --quiet --release -p tools --bin chaos_report -- chaos-report

## The full comparative benchmark, medians of 3 runs (about twenty minutes on 2 cores),
## Redis Cluster included;
## report in lockbench-report/.
bench: deps
	$(CARGO) build --quiet --release -p tools --bin lockbench
	./target/release/lockbench --runs 3 --out lockbench-report \
		--backends memory,redis,redis-cluster,redlock,zookeeper,etcd,postgres,file,dual

## lockctl for a package or a host. `make lockctl-dist` builds lockctl and, from its clap
## definition, its man pages (lockctl.1 and a page per command, lockctl-run.1 and so on)
## and its bash, zsh and fish completions, into LOCKCTL_DIST. `make install-lockctl`
## installs them where man and each shell look: PREFIX (default /usr/local)/bin/lockctl,
## share/man/man1/lockctl*.1, share/bash-completion/completions/lockctl,
## share/zsh/site-functions/_lockctl, share/fish/vendor_completions.d/lockctl.fish, each
## under DESTDIR when given (a package's staging root); `make uninstall-lockctl` removes
## them. LOCKCTL_PROFILE=dev builds the debug binary instead.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
LOCKCTL_PROFILE ?= release
LOCKCTL_TARGET = $(or $(CARGO_TARGET_DIR),target)/$(if $(filter dev,$(LOCKCTL_PROFILE)),debug,$(LOCKCTL_PROFILE))
LOCKCTL_DIST ?= $(LOCKCTL_TARGET)/lockctl-dist
INSTALL ?= install

.PHONY: lockctl-dist install-lockctl uninstall-lockctl

lockctl-dist:
	$(CARGO) build --quiet --profile $(LOCKCTL_PROFILE) -p lockctl
	mkdir -p $(LOCKCTL_DIST)/man1 $(LOCKCTL_DIST)/completions
	rm -f $(LOCKCTL_DIST)/man1/*.1
	$(LOCKCTL_TARGET)/lockctl man --dir $(LOCKCTL_DIST)/man1 > /dev/null
	$(LOCKCTL_TARGET)/lockctl completions bash > $(LOCKCTL_DIST)/completions/lockctl
	$(LOCKCTL_TARGET)/lockctl completions zsh > $(LOCKCTL_DIST)/completions/_lockctl
	$(LOCKCTL_TARGET)/lockctl completions fish > $(LOCKCTL_DIST)/completions/lockctl.fish
	cp $(LOCKCTL_TARGET)/lockctl $(LOCKCTL_DIST)/lockctl

install-lockctl: lockctl-dist
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(BASHCOMPDIR) \
		$(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR)
	$(INSTALL) -m 755 $(LOCKCTL_DIST)/lockctl $(DESTDIR)$(BINDIR)/lockctl
	$(INSTALL) -m 644 $(LOCKCTL_DIST)/man1/*.1 $(DESTDIR)$(MANDIR)/man1/
	$(INSTALL) -m 644 $(LOCKCTL_DIST)/completions/lockctl $(DESTDIR)$(BASHCOMPDIR)/lockctl
	$(INSTALL) -m 644 $(LOCKCTL_DIST)/completions/_lockctl $(DESTDIR)$(ZSHCOMPDIR)/_lockctl
	$(INSTALL) -m 644 $(LOCKCTL_DIST)/completions/lockctl.fish $(DESTDIR)$(FISHCOMPDIR)/lockctl.fish

uninstall-lockctl:
	rm -f $(DESTDIR)$(BINDIR)/lockctl $(DESTDIR)$(MANDIR)/man1/lockctl.1 \
		$(DESTDIR)$(MANDIR)/man1/lockctl-*.1 $(DESTDIR)$(BASHCOMPDIR)/lockctl \
		$(DESTDIR)$(ZSHCOMPDIR)/_lockctl $(DESTDIR)$(FISHCOMPDIR)/lockctl.fish

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
