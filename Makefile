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

# helm and the kstatus checker for the chart and GitOps tests (built once from the Go module
# proxy, cached outside the repo).
tools:
	bash tests/tools/build.sh >/dev/null

lint: tools
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	venv=$$(bash .ci/python-env.sh)
	"$$venv/bin/ruff" check bridge dev/python
	"$$venv/bin/ruff" format --check bridge dev/python
	tools=$$(bash tests/tools/build.sh 2>/dev/null)
	"$$tools/bin/helm" lint --strict charts/briq-operator
	"$$tools/bin/helm" template briq-operator charts/briq-operator --include-crds >/dev/null

# The fast tier, first: the controllers' decisions, the parsers and the vocabulary (Rust unit
# tests) and the Python tests that need no kernel and no cluster. No control plane; seconds
# once built.
test-unit: python-env
	cargo test --workspace --lib
	$(MAKE) --no-print-directory test-unit-python

# Every test: the fast tier, then Rust (contract, real kube-apiserver end to end) and Python
# (sandbox bridge, agent client).
test: test-unit control-plane python-env tools
	venv=$$(bash .ci/python-env.sh)
	export BRIQ_SANDBOX_VENV="$$venv"
	export BRIQ_TOOLS_DIR="$$(bash tests/tools/build.sh 2>/dev/null)"
	cargo test --workspace --all-targets
	(cd bridge/sandbox && "$$venv/bin/python" -m pytest -q)
	# The agent end to end: a real CodeAgent + KubernetesExecutor against `briq-dev local-stack`
	# (kube-apiserver, local sandbox server, operator). cargo test builds briq-dev only as a test
	# harness, so its binary is built here.
	cargo build --quiet -p briq-dev
	cd bridge/agent
	BRIQ_DEV_BIN="$(CURDIR)/target/debug/briq-dev" "$$venv/bin/python" -m pytest -q

# The Python tests that need neither a kernel nor a cluster, in seconds: the sandbox bridge's
# pure helpers and its setup command (a fake pip), the executor's status mapping, and what the
# agent distribution pulls in.
test-unit-python: python-env
	venv=$$(bash .ci/python-env.sh)
	(cd bridge/sandbox && "$$venv/bin/python" -m pytest -q tests/test_units.py tests/test_setup.py)
	cd bridge/agent && "$$venv/bin/python" -m pytest -q tests/test_mapping.py tests/test_distribution.py

.PHONY: control-plane python-env tools lint test test-unit test-unit-python

# The main job end to end on the embedded default (see README.md).
demo: control-plane python-env
	echo "building briq-dev (first run: several minutes) …"
	cargo run -p briq-dev -- demo

.PHONY: demo

# Latency, throughput, API cost, memory and cold start, printed as a table and written as JSON
# (see README.md, "Performance"). `make bench ARGS=--quick` for a smoke run of a few minutes.
BENCH_OUT ?= target/bench.json
bench: control-plane python-env
	# The memory scenario runs `briq-operator run` from the same target directory.
	cargo build --release -p briq-operator
	cargo run --release -p briq-dev -- bench --out "$(BENCH_OUT)" $(ARGS)

.PHONY: bench

# The release artifacts, versioned from Cargo.toml, in $(RELEASE_DIR): install.yaml (namespace,
# CRDs, RBAC, Deployment, admission policy; `kubectl apply --server-side -f install.yaml`) and
# the packaged chart (dev/release.sh; tests/chart.rs checks both against the API server).
RELEASE_DIR ?= target/release-artifacts
release: tools
	tools=$$(bash tests/tools/build.sh 2>/dev/null)
	bash dev/release.sh "$$tools/bin/helm" "$(RELEASE_DIR)"

.PHONY: release
