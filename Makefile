# The two commands a new user needs are `make demo` and `make test` (see README.md and the book in
# docs/: `make docs`).
SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -euo pipefail -c

# Binaries of the local control plane (built once from the Go module proxy, cached outside the repo).
control-plane:
	bash tests/control-plane/build.sh >/dev/null

# The Python used by the bridge tests and by the local sandbox server's sandboxes (cached venv).
python-env:
	bash .ci/python-env.sh >/dev/null

# helm, the kstatus checker, promcheck (Prometheus' rule and PromQL parsers), crane, registry and
# krew for the chart, GitOps and release tests
# (built once from the Go module proxy, cached outside the repo), the operator image's Debian
# packages, and mdbook for the docs book (cargo install from crates.io, cached likewise).
tools:
	bash tests/tools/build.sh >/dev/null

# The previous release's operator (compat/<version>/commit), built once from this repository's
# history and cached outside the repo, for the upgrade test (tests/upgrade.rs).
previous-release:
	bash compat/build.sh >/dev/null

lint: tools
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	venv=$$(bash .ci/python-env.sh)
	"$$venv/bin/ruff" check bridge dev/python dev/test-runner.py images
	"$$venv/bin/ruff" format --check bridge dev/python dev/test-runner.py images
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
# (sandbox bridge, agent client). dev/test-runner.py times each step, runs the test binaries and
# the Python suites TEST_JOBS at a time, and ends with where the time went: each step, each binary
# and suite, the slowest 20 tests (also in target/test-report/, with each one's log). TEST_JOBS
# defaults to one per CPU: each binary starts a control plane of its own (tests/upgrade.rs one
# with the previous release's CRDs), so binaries share nothing but the machine.
TEST_JOBS ?=
test:
	runner="python3 dev/test-runner.py"
	$$runner reset
	$$runner step "python environment" -- $(MAKE) --no-print-directory python-env
	$$runner step "fast tier (make test-unit)" -- $(MAKE) --no-print-directory test-unit
	$$runner step "control plane" -- $(MAKE) --no-print-directory control-plane
	$$runner step "tools" -- $(MAKE) --no-print-directory tools
	$$runner step "previous release" -- $(MAKE) --no-print-directory previous-release
	venv=$$(bash .ci/python-env.sh 2>/dev/null)
	export BRIQ_SANDBOX_VENV="$$venv"
	export BRIQ_TOOLS_DIR="$$(bash tests/tools/build.sh 2>/dev/null)"
	# The agent end to end: a real CodeAgent + KubernetesExecutor against `briq-dev local-stack`
	# (kube-apiserver, local sandbox server, operator). cargo test builds briq-dev only as a test
	# harness, so its binary is built here.
	$$runner step "cargo build -p briq-dev" -- cargo build --quiet -p briq-dev
	target="$${CARGO_TARGET_DIR:-$(CURDIR)/target}"
	export BRIQ_DEV_BIN="$$target/debug/briq-dev"
	# The unit tests of the libraries ran in the fast tier.
	$$runner run $(if $(TEST_JOBS),--jobs $(TEST_JOBS)) --skip-kind lib \
	  --suite bridge/sandbox "$$venv/bin/python -m pytest -q --junitxml=$$target/test-report/sandbox.xml" \
	  --suite bridge/agent "$$venv/bin/python -m pytest -q --junitxml=$$target/test-report/agent.xml"

# The Python tests that need neither a kernel nor a cluster, in seconds: the sandbox bridge's
# pure helpers, its setup command (a fake pip) and its compatibility with the previous release's
# bridge (compat/<version>/bridge/), the executor's status mapping, and the agent
# distribution: what it pulls in, its version (the crate's), its former import name, and its
# wheel and sdist as `make release` builds them (twine check --strict, contents).
test-unit-python: python-env
	venv=$$(bash .ci/python-env.sh)
	(cd bridge/sandbox && "$$venv/bin/python" -m pytest -q tests/test_units.py tests/test_setup.py tests/test_compat.py)
	cd bridge/agent && "$$venv/bin/python" -m pytest -q tests/test_mapping.py tests/test_distribution.py

.PHONY: control-plane python-env tools previous-release lint test test-unit test-unit-python

# The main job end to end on the embedded default (see README.md, docs/src/getting-started.md).
demo: control-plane python-env
	echo "building briq-dev (first run: several minutes) …"
	cargo run -p briq-dev -- demo

.PHONY: demo

# Latency, throughput, API cost, memory and cold start, printed as a table and written as JSON
# (see docs/src/performance.md). `make bench ARGS=--quick` for a smoke run of a few minutes.
BENCH_OUT ?= target/bench.json
bench: control-plane python-env
	# The memory scenario runs `briq-operator run` from the same target directory.
	cargo build --release -p briq-operator
	cargo run --release -p briq-dev -- bench --out "$(BENCH_OUT)" $(ARGS)

.PHONY: bench

# The release artifacts, versioned from Cargo.toml, in $(RELEASE_DIR): install.yaml (namespace,
# CRDs, RBAC, Deployment, admission policy; `kubectl apply --server-side -f install.yaml`), the
# packaged chart briq-operator-VERSION.tgz, the kubectl plugin's archive
# kubectl-briq_vVERSION_linux_amd64.tar.gz and its krew manifest briq.yaml (dev/release.sh;
# tests/chart_rbac.rs and tests/image.rs check them against the API server, an OCI registry and
# krew), and the agent client's wheel briq_operator_client-VERSION-py3-none-any.whl and sdist
# briq_operator_client-VERSION.tar.gz, built offline and checked by `twine check --strict`
# (dev/release-python.sh; bridge/agent/tests/test_distribution.py checks what they hold and
# test_wheel.py installs the wheel into a fresh venv).
RELEASE_DIR ?= target/release-artifacts
release: tools python-env
	echo "building the release binary (first run: several minutes) …"
	cargo build --release --locked -p briq-operator
	tools=$$(bash tests/tools/build.sh 2>/dev/null)
	bash dev/release.sh "$$tools/bin/helm" "$(RELEASE_DIR)" target/release/briq-operator
	venv=$$(bash .ci/python-env.sh 2>/dev/null)
	bash dev/release-python.sh "$$venv/bin/python" "$(RELEASE_DIR)"

.PHONY: release

# The operator image, built without a container engine (images/operator/build.py: Debian's
# packages + the release binary, user 65532, no shell), as an OCI image layout in $(IMAGE_DIR)
# with its SBOM (sbom.spdx.json) and digest; the same commit gives the same digest. Push it with
# crane (built by `make tools`) or skopeo: see docs/src/install.md.
IMAGE_DIR ?= target/image
image: tools
	echo "building the release binary (first run: several minutes) …"
	cargo build --release --locked -p briq-operator
	tools=$$(bash tests/tools/build.sh 2>/dev/null)
	rm -rf "$(IMAGE_DIR)"
	python3 images/operator/build.py --binary target/release/briq-operator \
	  --debs "$$tools/debs" --out "$(IMAGE_DIR)" >/dev/null
	echo "$(IMAGE_DIR): OCI image layout, $$(cat "$(IMAGE_DIR)/digest"), SBOM $(IMAGE_DIR)/sbom.spdx.json"
	echo "push: $$tools/bin/crane push $(IMAGE_DIR) REGISTRY/briq-operator:$$(sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n 1)"

.PHONY: image

# The docs book (docs/, mdBook) in $(BOOK_DIR), with the mdbook of `make tools`. Its API reference
# is generated: `cargo run -q -- api-reference > docs/src/reference/api.md` (a unit test fails
# when it is stale; another checks every link and anchor, tests/docs.rs builds the book).
BOOK_DIR ?= target/book
docs: tools
	tools=$$(bash tests/tools/build.sh 2>/dev/null)
	"$$tools/bin/mdbook" build docs --dest-dir "$(CURDIR)/$(BOOK_DIR)"
	echo "$(BOOK_DIR)/index.html"

.PHONY: docs
