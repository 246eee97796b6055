"""Progressive enforcement across a fleet, behind a fleet circuit breaker, held
in etcd beside the budget (``budget.py``, whose node lease it shares).

Keys, under the fleet's prefix:

- ``rollouts/<policy>/state``: the rollout's stage, the breaker (open or not,
  when, why), the fleet's last verify outcomes, the remediations verified in
  the stage, and a history of what happened (widened, opened, reset); no
  lease: it outlives every node, so a breaker stays open across restarts
  until an operator resets it (``reflexarc fleet reset``);
- ``rollouts/<policy>/seats/<node>``: the node is one of the stage's nodes,
  with the node's lease (a dead node's seat frees itself; a node keeps its
  seat as the stage widens).

Every write is a compare-and-swap on the state key's modification revision
(``EtcdStore.swap``): a node that takes a seat writes the state too, so two
nodes that read the same stage cannot both take its last seat, and two
outcomes reported at once are both counted.

``admit`` is asked before every enforce change of a policy with a rollout:
it raises ``Refused`` with the reason ``breaker-open`` (the breaker is open),
``rollout-stage`` (the stage's seats are taken by other nodes),
``store-unreachable`` or ``store-error`` (fail closed). ``report`` counts a
verify outcome: it may widen the stage or open the breaker, and returns what
it did, for the caller to audit and alert. An outcome the store does not take
now is kept and sent first at the next ``admit`` or ``flush``: a failure is
never lost on the way to the breaker.

Example::

    rollout = FleetRollout(budget)                     # budget started: its lease holds the seats
    rollout.admit("demote-bulk", spec)                 # None, or raises Refused
    rollout.report("demote-bulk", spec, ok=False, target="job=j")   # [Event("opened", ...)] or []
    reset("demote-bulk", store, "/reflexarc", reason="threshold fixed", by="alice@ops-1")

Overhead: ``admit`` one range read (two with a share of the live nodes), one
transaction when it takes a seat; ``report`` a read and a transaction.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field

from reflexarc.core.rollout import RolloutSpec

from .budget import FleetBudget, Refused
from .store import Entry, EtcdStore, StoreError, StoreUnavailable

log = logging.getLogger("reflexarc.fleet.rollout")

REASONS = ("rollout-stage", "breaker-open", "superseded", "no-fleet-store")
ROUNDS = 8            # reads and swaps tried when other nodes write the state first
HISTORY = 50          # events kept in the state
VERSIONS = 20         # replaced versions remembered (a node still running one is refused)


@dataclass
class State:
    """A policy's rollout as the store holds it."""

    stage: int = 0
    open: bool = False
    opened_at: float | None = None
    opened_by: str = ""
    reason: str = ""
    recent: list[dict] = field(default_factory=list)      # {node, ok, target, t}, oldest first
    verified_in_stage: int = 0
    history: list[dict] = field(default_factory=list)     # {t, event, ...}, oldest first
    spec: dict = field(default_factory=dict)
    version: str = ""                                       # the policy's version rolled out ("": not known)
    superseded: list[str] = field(default_factory=list)    # the versions it replaced, newest first

    @classmethod
    def parse(cls, text: str) -> State:
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def dump(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def note(self, event: str, t: float, **fields) -> None:
        self.history = (self.history + [{"t": round(t, 3), "event": event, **fields}])[-HISTORY:]


@dataclass(frozen=True)
class Event:
    """What an outcome did to the rollout: ``widened`` or ``opened``."""

    kind: str
    policy: str
    stage: int            # the stage now (0-based)
    detail: str


class FleetRollout:
    def __init__(self, budget: FleetBudget, wall=time.time) -> None:
        self.budget = budget
        self.store: EtcdStore = budget.store
        self.node = budget.node
        self.prefix = budget.prefix
        self._wall = wall
        self._pending: list[tuple[str, RolloutSpec, bool, str, float]] = []
        self._lock = threading.Lock()
        self.seen: dict[str, State] = {}      # each policy's state as last read (the metrics)

    def state_key(self, policy: str) -> str:
        return state_key(self.prefix, policy)

    def seat_key(self, policy: str) -> str:
        return f"{seats_prefix(self.prefix, policy)}{self.node}"

    def _read(self, policy: str) -> tuple[State | None, int, list[Entry]]:
        return read(self.store, self.prefix, policy)

    # --- admission ------------------------------------------------------------------------------
    def admit(self, policy: str, spec: RolloutSpec) -> None:
        """Whether this node may make an enforce change of ``policy`` now:
        None, or ``Refused``. Outcomes not reported yet go first."""
        try:
            self.flush(strict=True)
            for _ in range(ROUNDS):
                if self._admit_once(policy, spec):
                    return
            raise Refused("store-error", f"{policy}: the rollout's state kept changing under {self.node}")
        except StoreUnavailable as exc:
            raise Refused("store-unreachable", str(exc)) from None
        except StoreError as exc:
            raise Refused("store-error", str(exc)) from None

    def _admit_once(self, policy: str, spec: RolloutSpec) -> bool:
        state, modified, seats = self._read(policy)
        state = state or State(spec=spec.to_dict())
        self.seen[policy] = state
        if spec.version and state.version != spec.version:
            return self._new_version(policy, spec, state, modified)
        if state.open:
            raise Refused("breaker-open", f"{policy}: {breaker_words(state)}; an operator resets it with "
                                          f"reflexarc fleet reset {policy} --reason TEXT")
        index = min(state.stage, len(spec.stages) - 1)
        stage = spec.stages[index]
        live = self.store.count(f"{self.prefix}/nodes/") if stage.percent is not None else 0
        size = stage.size(live)
        if size is None:
            return True                      # every node
        lease = self.budget.registered()
        mine = [s for s in seats if s.key == self.seat_key(policy)]
        if mine and mine[0].lease == lease:
            return True
        others = sorted(s.key.rsplit("/", 1)[-1] for s in seats if s.key != self.seat_key(policy))
        if len(others) >= size:
            left = max(0, spec.promote_after - state.verified_in_stage)
            raise Refused("rollout-stage", f"{policy}: stage {index + 1} of {len(spec.stages)} ({stage.text()}) "
                                           f"admits {size} node(s), enforcing on {', '.join(others)}; it widens "
                                           f"after {left} more verified remediation(s)")
        seat = json.dumps({"since": round(self._wall(), 3), "stage": index})
        return self.store.swap(self.state_key(policy), modified, state.dump(),
                               also=((self.seat_key(policy), seat, lease),))

    def _new_version(self, policy: str, spec: RolloutSpec, state: State, modified: int) -> bool:
        """This node runs a version of ``policy`` the state does not hold: one
        it replaced (refused: the node must reload), the first one known (it
        is recorded), or a new one: the rollout starts over at the first stage,
        its outcomes and seats cleared (an open breaker stays open). False:
        written, to be read again; the next round admits."""
        if spec.version in state.superseded:
            raise Refused("superseded", f"{policy}: this node runs version {spec.version[:12]} of the policy, "
                                        f"which version {state.version[:12]} replaced on the fleet; reload its "
                                        f"policy files (SIGHUP) to enforce it")
        clear = ()
        if state.version:
            log.warning("fleet rollout: %s changed (version %s -> %s): its rollout starts over at stage 1 of %d",
                        policy, state.version[:12], spec.version[:12], len(spec.stages))
            state.note("restarted", self._wall(), node=self.node, was=state.version, version=spec.version,
                       from_stage=state.stage)
            state.superseded = [state.version, *state.superseded][:VERSIONS]
            state.stage, state.verified_in_stage, state.recent = 0, 0, []
            clear = (seats_prefix(self.prefix, policy),)
        state.version, state.spec = spec.version, spec.to_dict()
        self.store.swap(self.state_key(policy), modified, state.dump(), clear=clear)
        return False

    # --- outcomes -------------------------------------------------------------------------------
    def report(self, policy: str, spec: RolloutSpec, ok: bool, target: str) -> list[Event]:
        """Count a verify outcome of this node's change of ``policy``; what it
        did to the rollout (and to outcomes held back before it). A store that
        does not take it now keeps it for the next ``admit`` or ``flush``."""
        with self._lock:
            self._pending.append((policy, spec, ok, target, self._wall()))
        return self.flush()

    def flush(self, strict: bool = False) -> list[Event]:
        """Send the outcomes not reported yet, oldest first; the events they
        made. A store error leaves the rest for later (``strict``: raises it)."""
        events = []
        with self._lock:
            while self._pending:
                policy, spec, ok, target, t = self._pending[0]
                try:
                    event = self._record(policy, spec, ok, target, t)
                except (StoreUnavailable, StoreError) as exc:
                    if strict:
                        raise
                    log.warning("fleet rollout: %d verify outcome(s) not reported yet (%s); sent before the "
                                "next enforce change", len(self._pending), exc)
                    break
                self._pending.pop(0)
                if event is not None:
                    events.append(event)
        return events

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _record(self, policy: str, spec: RolloutSpec, ok: bool, target: str, t: float) -> Event | None:
        for _ in range(ROUNDS):
            state, modified, _ = self._read(policy)
            state = state or State()
            if spec.version and state.version and state.version != spec.version:
                log.info("fleet rollout: an outcome of %s version %s not counted: the fleet rolls out %s",
                         policy, spec.version[:12], state.version[:12])
                return None
            state.spec = spec.to_dict()
            state.recent = (state.recent + [{"node": self.node, "ok": ok, "target": target,
                                              "t": round(t, 3)}])[-spec.window:]
            state.verified_in_stage += 1 if ok else 0
            outcomes = [r["ok"] for r in state.recent]
            failed = sum(not o for o in outcomes)
            event = None
            if not state.open and spec.breaks(outcomes):
                state.open, state.opened_at, state.opened_by = True, round(t, 3), self.node
                state.reason = (f"{failed} of the fleet's last {len(outcomes)} verifications failed; "
                                f"{spec.allowed_failures()} of {spec.window} may, for a {spec.success_rate:g} % "
                                f"success rate")
                state.note("opened", t, node=self.node, stage=state.stage, reason=state.reason)
                event = Event("opened", policy, state.stage, state.reason)
            elif not state.open and spec.widens(outcomes, state.verified_in_stage, state.stage):
                detail = (f"{state.verified_in_stage} remediation(s) verified in stage {state.stage + 1}, "
                          f"{100 * sum(outcomes) / len(outcomes):.0f} % of the fleet's last {len(outcomes)}")
                state.stage += 1
                state.verified_in_stage = 0
                detail = f"stage {state.stage + 1} of {len(spec.stages)} ({spec.stages[state.stage].text()}) after " \
                    + detail
                state.note("widened", t, node=self.node, stage=state.stage, detail=detail)
                event = Event("widened", policy, state.stage, detail)
            if self.store.swap(self.state_key(policy), modified, state.dump()):
                self.seen[policy] = state
                return event
        raise StoreError(f"{policy}: the rollout's state kept changing under {self.node}")


# --- read and reset, for the nodes and the CLI ----------------------------------------------------
def state_key(prefix: str, policy: str) -> str:
    return f"{prefix.rstrip('/')}/rollouts/{policy}/state"


def seats_prefix(prefix: str, policy: str) -> str:
    return f"{prefix.rstrip('/')}/rollouts/{policy}/seats/"


def read(store: EtcdStore, prefix: str, policy: str) -> tuple[State | None, int, list[Entry]]:
    """A policy's rollout in one read: its state (None: none yet), the state's
    modification revision (0: none), and its seats."""
    entries = store.prefix(f"{prefix.rstrip('/')}/rollouts/{policy}/")
    state, modified = None, 0
    for e in entries:
        if e.key == state_key(prefix, policy):
            try:
                state = State.parse(e.value)
            except (ValueError, TypeError) as exc:
                raise StoreError(f"{e.key}: not a rollout state: {exc}") from None
            modified = e.modified
    return state, modified, [e for e in entries if e.key.startswith(seats_prefix(prefix, policy))]


def breaker_words(state: State) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(state.opened_at)) if state.opened_at else "?"
    return f"the fleet's breaker opened at {when} by {state.opened_by or '?'}: {state.reason}"


def reset(store: EtcdStore, prefix: str, policy: str, reason: str, by: str, from_start: bool = False,
          wall=time.time) -> State:
    """Close the breaker of ``policy`` (and, ``from_start``, go back to the
    first stage, its seats emptied and the replaced versions forgotten, so an
    earlier version may be rolled out again), the last outcomes forgotten;
    the reset in the history with its reason and who. KeyError: no rollout state."""
    for _ in range(ROUNDS):
        state, modified, _ = read(store, prefix, policy)
        if state is None:
            raise KeyError(policy)
        was = {"open": state.open, "stage": state.stage}
        state.open, state.opened_at, state.opened_by, state.reason = False, None, "", ""
        state.recent = []
        if from_start:             # and the versions forgotten: the next node's version is the fleet's
            state.stage, state.verified_in_stage = 0, 0
            state.version, state.superseded = "", []
        state.note("reset", wall(), by=by, reason=reason, was_open=was["open"], from_stage=was["stage"],
                   stage=state.stage)
        if store.swap(state_key(prefix, policy), modified, state.dump()):
            if from_start:
                store.delete_prefix(seats_prefix(prefix, policy))
            return state
    raise StoreError(f"{policy}: the rollout's state kept changing")
