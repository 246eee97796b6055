# reflexarc: two commands do everything on a fresh Debian 12 machine as root.
#   make demo   a real remediation on the testbed: an unmodified two-rank PyTorch job
#               launched as torchrun would, a bulk upload congesting its link, the
#               controller finding the job and demoting the upload (fault a)
#   make test   passes the tests (unit, simulations, real kernel, testbed)
#   make test-fast  the tests that need no root, no network namespace, no testbed and
#               no minutes (markers in pyproject.toml): a first check in a few minutes
#   make demo-sim  the simulated scenario (no kernel needed)
#   make bench  the benchmarks side by side (~2 h): rule engine, DataLoader churn, probe
#               cost, the closed loop, reaction time against Prometheus + Alertmanager,
#               then the cost table from all of them (bench/results/)
#   make soak   the reliability suite at full counts (SIGKILL trials, fuzzing, bad input,
#               hook spoofing, journal damage, a signal storm): bench/results/reliability.json
#   make image  the controller's container image from deploy/Containerfile, with podman or
#               buildah (not part of make test; docs/deploy.md): tagged localhost/reflexarc:VERSION,
#               the chart's default; IMAGE=registry.example/reflexarc:0.1.0 PUSH=1 pushes it there
PY := .venv/bin/python
RX := .venv/bin/reflexarc
DEMO_SCENARIO ?= rdma-qp-slow
DEMO_MODE ?= enforce
# The image: its name (the Helm chart's image.repository and tag must name the same), the
# builder (podman or buildah), and the base (DEBIAN_IMAGE=...@sha256:... pins it).
VERSION := $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*$$/\1/p' deploy/helm/reflexarc/Chart.yaml)
IMAGE ?= localhost/reflexarc:$(VERSION)
CONTAINER_TOOL ?= $(firstword $(foreach tool,podman buildah,$(shell command -v $(tool) 2>/dev/null)))
DEBIAN_IMAGE ?=
# More options of `build`, e.g. --isolation=chroot where the runtime cannot make cgroups,
# or -v mounts of a proxy's CA for the RUN steps' downloads.
IMAGE_BUILD_FLAGS ?=
PUSH ?=

.PHONY: setup test test-fast demo demo-sim validate policy-tests bench soak schema image clean

setup:
	@scripts/bootstrap

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -m "not kernel and not netns and not testbed and not slow"

demo: setup
	$(PY) -m reflexarc.simulations.testbed loop --faults a --no-hooks --out out/demo --results out/demo/closed_loop.json

demo-sim: setup
	$(RX) simulate $(DEMO_SCENARIO) --mode $(DEMO_MODE) --out out/demo-sim

validate: setup
	$(RX) validate policies/

policy-tests: setup
	$(RX) test-policies policies/tests/

schema: setup
	$(PY) -m reflexarc.controller.policy.schema > policies/schema.json

bench: setup
	$(PY) bench/engine.py
	$(PY) bench/churn.py
	$(PY) bench/probe_overhead.py
	$(PY) -m reflexarc.simulations.testbed loop --also-unmodified --two-jobs --out out/closed-loop \
		--results bench/results/closed_loop.json
	$(PY) bench/reaction.py
	$(PY) bench/arrivals.py
	$(PY) bench/cost_table.py --out bench/results/cost_table.md

soak: setup
	$(PY) bench/reliability.py

image:
	@test -n "$(CONTAINER_TOOL)" || { echo "make image: needs podman or buildah (apt-get install podman)" >&2; exit 1; }
	$(CONTAINER_TOOL) build -f deploy/Containerfile -t $(IMAGE) \
		$(if $(DEBIAN_IMAGE),--build-arg DEBIAN_IMAGE=$(DEBIAN_IMAGE)) --ignorefile deploy/Containerfile.ignore \
		$(IMAGE_BUILD_FLAGS) .
	$(if $(PUSH),$(CONTAINER_TOOL) push $(IMAGE))

clean:
	rm -rf out/ .pytest_cache
