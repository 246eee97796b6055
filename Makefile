# reflexarc: two commands do everything on a fresh Debian 12 machine as root.
#   make demo   runs the headline scenario on the built-in policies
#   make test   passes the tests (unit, simulations, real kernel)
PY := .venv/bin/python
RX := .venv/bin/reflexarc
DEMO_SCENARIO ?= rdma-qp-slow
DEMO_MODE ?= enforce

.PHONY: setup test demo validate policy-tests bench schema clean

setup:
	@scripts/bootstrap

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

demo: setup
	$(RX) simulate $(DEMO_SCENARIO) --mode $(DEMO_MODE) --out out/demo

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

clean:
	rm -rf out/ .pytest_cache
