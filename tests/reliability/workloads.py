"""The processes the crash trials act on, as small scripts run with ``python -c``.

- ``TRAINER``: a training process with two DataLoader workers (``argv[1]``,
  ``IDLE_WORKER``: comm ``pt_data_worker``, three threads each); prints ``{"trainer": pid, "workers":
  [pid, pid]}`` and runs until its stdin closes. The affinity actuator pins the
  workers' threads.
- ``HOOK_SCRIPT``: a training loop that serves reflexarc's framework hooks
  (``reflexarc.actuators.hooks``) as job ``argv[2]`` in hook directory
  ``argv[1]``, reports a step of ``argv[4]`` ms (default 520) every 0.1 s, and offers handler
  ``loader.prefetch(factor)`` with an undo and a preview. Its setting (``factor``,
  2 at start) and how many calls and undos ran are kept in the JSON file
  ``argv[3]``, rewritten atomically on each change: what the trial checks.

Overhead: the trainer idles; the hook script wakes every 0.1 s.
"""
from __future__ import annotations

from pathlib import Path

IDLE_WORKER = str(Path(__file__).resolve().parents[1] / "workloads" / "idle_worker.py")

TRAINER = r"""
import json, os, subprocess, sys
workers = [subprocess.Popen([sys.executable, sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True) for _ in range(2)]
for w in workers:
    assert w.stdout.readline().strip() == "ready"
print(json.dumps({"trainer": os.getpid(), "workers": [w.pid for w in workers]}), flush=True)
sys.stdin.read()
for w in workers:
    w.stdin.close()
    w.wait()
"""

ORIGINAL_FACTOR = 2
CHANGED_FACTOR = 8

HOOK_SCRIPT = r"""
import json, os, sys, time
from reflexarc.actuators.hooks import Hooks
hook_dir, job, state_path = sys.argv[1], sys.argv[2], sys.argv[3]
step_ms = float(sys.argv[4]) if len(sys.argv) > 4 else 520.0
state = {"factor": 2, "calls": 0, "undos": 0}
previous = []

def save():
    tmp = state_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, state_path)

def set_factor(factor):
    previous.append(state["factor"])
    state["factor"] = factor
    state["calls"] += 1
    save()
    return factor

def undo(factor):
    state["factor"] = previous.pop() if previous else 2
    state["undos"] += 1
    save()

def preview(factor):
    return {"before": state["factor"], "after": factor}

save()
hooks = Hooks.start(job=job, rank=0, hook_dir=hook_dir)
hooks.handler("loader.prefetch", undo=undo, preview=preview)(set_factor)
print(json.dumps({"ready": hooks.path, "pid": os.getpid()}), flush=True)
step = 0
while True:
    hooks.report(step_time_ms=step_ms, dataloader_batch_wait_ms=1.0, iteration=step)
    hooks.step_boundary()
    step += 1
    time.sleep(0.1)
"""

# a policy that never acts: what a restart that only reconciles the journal loads
QUIET = """\
policies:
  - name: quiet
    mode: dry-run
    selector: {match: {job: quiet}}
    rules:
      - name: r
        when: {signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 300}
        actions:
          - {actuator: log, params: {message: x}}
"""
