# distlock: `make demo` and `make test` set up everything they need on Debian.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: deps test check fmt lint demo clean

deps:
	@./scripts/install-deps.sh

## Formatting, lints and every test, strictly against real servers.
test: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	LOCK_TEST_STRICT=1 $(CARGO) test --workspace --no-fail-fast

## A short demonstration: several clients contend for one lock.
demo: deps
	$(CARGO) run --quiet --release -p examples --bin demo

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
