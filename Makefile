# reflexarc: two commands do everything on a fresh Debian 12 machine as root.
#   make demo   a real remediation on the testbed: an unmodified two-rank PyTorch job
#               launched as torchrun would, a bulk upload congesting its link, the
#               controller finding the job and demoting the upload (fault a)
#   make test   passes the tests (unit, simulations, real kernel, testbed)
#   make demo-sim  the simulated scenario (no kernel needed)
#   make bench  the benchmarks side by side (~2 h): rule engine, DataLoader churn, probe
#               cost, the closed loop, reaction time against Prometheus + Alertmanager,
#               then the cost table from all of them (bench/results/)
#   make soak   the reliability suite at full counts (SIGKILL trials, fuzzing, bad input,
#               hook spoofing, journal damage, a signal storm): bench/results/reliability.json
PY := .venv/bin/python
RX := .venv/bin/reflexarc
DEMO_SCENARIO ?= rdma-qp-slow
DEMO_MODE ?= enforce

.PHONY: setup test demo demo-sim validate policy-tests bench soak schema clean

setup:
	@scripts/bootstrap

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

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
	$(PY) bench/cost_table.py --out bench/results/cost_table.md

soak: setup
	$(PY) bench/reliability.py

clean:
	rm -rf out/ .pytest_cache
