# distlock: `make demo` and `make test` set up everything they need on Debian.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: deps test fmt lint demo bench clean

deps:
	@./scripts/install-deps.sh

## Formatting, lints and every test, strictly against real servers.
test: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	LOCK_TEST_STRICT=1 $(CARGO) test --workspace --no-fail-fast

## A short demonstration: clients contending for one lock, then a comparative
## benchmark of every backend on throwaway local servers (under two minutes).
demo: deps
	$(CARGO) build --quiet --release -p examples --bin demo --bin lockbench
	./target/release/demo
	./target/release/lockbench --duration 1s --warmup 300ms --clients 8,64 --locks 64 \
		--held 1000 --takeover-rounds 2 --out lockbench-report

## The full comparative benchmark (a few minutes); report in lockbench-report/.
bench: deps
	$(CARGO) build --quiet --release -p examples --bin lockbench
	./target/release/lockbench --out lockbench-report

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
