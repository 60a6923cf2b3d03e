# The two commands a new user needs are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -euo pipefail -c

# Binaries of the local control plane (built once from the Go module proxy, cached outside the repo).
control-plane:
	bash tests/control-plane/build.sh >/dev/null

# The Python used by the bridge tests and by the local sandbox server's sandboxes (cached venv).
python-env:
	bash .ci/python-env.sh >/dev/null

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets --quiet -- -D warnings
	venv=$$(bash .ci/python-env.sh)
	"$$venv/bin/ruff" check bridge
	"$$venv/bin/ruff" format --check bridge

# Every test: Rust (unit, contract, real kube-apiserver end to end) and Python (bridge, agent).
test: control-plane python-env
	venv=$$(bash .ci/python-env.sh)
	export BRIQ_SANDBOX_VENV="$$venv"
	cargo test --all-targets
	cd bridge && "$$venv/bin/python" -m pytest -q

.PHONY: control-plane python-env lint test

# The main job end to end on the embedded default (see README.md).
demo: control-plane python-env
	cargo run --quiet -- demo

.PHONY: demo
