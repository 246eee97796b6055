"""The cluster-wide remediation budget: at most N nodes, or P % of the live
fleet, acting at once in a pool, counted in etcd (``store.EtcdStore``).

Keys, under ``prefix`` (``/reflexarc``):

- ``nodes/<node>``: the node is alive, written with its lease; the fleet's size
  is the number of these keys;
- ``pools/<pool>/slots/<i>``: slot ``i`` of the pool is taken (value: the node,
  the holder that took it and when), with the node's lease, so a dead node's
  slots free themselves when its lease runs out;
- ``jobs/<job>/<node>``: the node runs the job (the jobs it found, given as
  ``jobs``, and the job of every per-job pool it takes a slot in), with its
  lease: a per-job share (``of: job``) is of these keys;
- ``pools/<pool>/waiting/<node>``: the node wants a slot. The waiters form a
  queue by create revision (a renewal keeps its place), so every node is
  served in turn; a waiter not renewed for ``WAITER_FRESH_S`` (it stopped
  asking) is passed over.

The limit is ``min(N, ceil(P % x live nodes))`` of those given, at least 1
while P is given and a node is alive: the node's (``--fleet-max-nodes``,
``--fleet-max-percent``), or a policy's own (``budget:``, ``core/budget.py``,
given to ``take``; its pool may be one per job). ``take`` reads the pool and, in one
transaction, creates a free slot below the limit (only if no fresher claim
exists: the key must not exist) and deletes the node's waiting entry; a node
ahead in the queue goes first (the first ``free`` waiters may take the
``free`` slots). A node holds at most one slot of a pool: a second holder on
the same node (another rule, another target) shares it, and the slot is
given back when its last holder gives it back.

A node that stops with changes still applied (rollbacks that keep them
until the next start adopts or reverts them) keeps their slots: ``stop(keep=...)``
moves each such slot to a lease of its own, ``park_ttl`` seconds long, before
it revokes the node's lease. The slot's value says ``parked``. Started again,
the node takes its parked slots back (``take`` of that pool, past the queue
and the limit: the change was never undone) and, once the changes it adopted
hold their slots, deletes the parked ones nothing claimed (``drop_parked``).
A node that does not come back frees them when their lease runs out.

The lease is renewed every TTL/3 by a thread. A lease that ran out (the store
unreachable for longer than the TTL) is counted in ``lost``; the node registers
again and takes its held slots back, ahead of the queue (its changes are
already applied); one it cannot take back (the pool filled meanwhile) is
retried at each renewal. A slot given back while the store is unreachable is
deleted at the next renewal that reaches it.

Every failure is a typed refusal (``Refused.reason``): ``budget-full``,
``store-unreachable`` (no endpoint answers: fail closed) or ``store-error``.

Example::

    budget = FleetBudget(EtcdStore(endpoints), "node-a", max_nodes=2, ttl=15)
    budget.start()                                  # lease, node key, keep-alive thread
    budget.take("policy:demote-bulk", "r/pid=42")   # the slot's key, or raises Refused
    FleetBudget(store, "node-a")                    # no limit: the node registered only (a rollout's lease)
    budget.give_back("r/pid=42")
    budget.held()                                   # {"policy:...": ["r/pid=42"]}
    budget.stop()                                   # revokes the lease: every slot it held is free
    budget.stop(keep={"r/pid=42"})                  # ... but this holder's slot, parked until it starts again

Overhead: idle, one keep-alive request per TTL/3 (12 a minute at TTL 15);
``take`` 2-3 requests (one a transaction), ``give_back`` one transaction.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field

from reflexarc.core.budget import BudgetSpec, job_of_pool, limit, quote_job

from .store import LEASE_GONE, Entry, EtcdStore, StoreError, StoreUnavailable

log = logging.getLogger("reflexarc.fleet")

WAITER_FRESH_S = 25.0      # a waiting entry not renewed for this long is passed over
MIN_TTL = 2                # etcd's own floor is ~1.5 s (its election timeout x 1.5)
PARK_TTL = 3600            # a stopped node's slots of changes left applied are kept this long (s)
REASONS = ("budget-full", "store-unreachable", "store-error")
CLAIM_ROUNDS = 3           # reads and transactions tried when another node takes the slot first


class Refused(Exception):
    """No slot: ``reason`` is one of ``REASONS``, ``detail`` says more."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class _Slot:
    key: str | None                    # None while the node acts without a slot (lost, not taken back yet)
    holders: set[str] = field(default_factory=set)
    spec: BudgetSpec | None = None     # the policy's own limit; None: the node's


class FleetBudget:
    def __init__(self, store: EtcdStore, node: str, max_nodes: int | None = None, max_percent: float | None = None,
                 ttl: int = 15, prefix: str = "/reflexarc", wall=time.time, park_ttl: int = PARK_TTL,
                 jobs=None) -> None:
        if max_nodes is not None and max_nodes < 1:
            raise ValueError("max_nodes must be >= 1")
        if max_percent is not None and not 0 < max_percent <= 100:
            raise ValueError("max_percent must be > 0 and <= 100")
        if not node or "/" in node:
            raise ValueError(f"node name {node!r}: not empty, no '/'")
        if int(ttl) < MIN_TTL or int(park_ttl) < MIN_TTL:
            raise ValueError(f"ttl and park_ttl must be >= {MIN_TTL} s")
        self.store, self.node = store, node
        self.max_nodes, self.max_percent = max_nodes, max_percent
        self.ttl, self.park_ttl = int(ttl), int(park_ttl)
        self.prefix = prefix.rstrip("/")
        self._wall = wall
        self.lease: int | None = None
        self.lost = 0                    # leases that ran out under the node
        self._slots: dict[str, _Slot] = {}
        self._pool_of: dict[str, str] = {}
        self._unreleased: list[str] = []     # slot keys given back while the store did not answer
        self._parked: dict[str, Entry] = {}  # pool -> the slot this node parked when it last stopped
        self.jobs = jobs                    # () -> the names of the jobs on this node now, or None
        self._registered_jobs: set[str] = set()   # quoted names with a jobs/ key under the lease
        self._asked_jobs: dict[str, float] = {}   # quoted name -> when a per-job share of it was last asked
        self._looked_for_parked = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._outage = False
        self.why_full = ""               # why the last claim found no slot

    # --- keys ---------------------------------------------------------------------------------
    @property
    def node_key(self) -> str:
        return f"{self.prefix}/nodes/{self.node}"

    def pool_prefix(self, pool: str) -> str:
        return f"{self.prefix}/pools/{pool}/"

    def slot_key(self, pool: str, i: int) -> str:
        return f"{self.pool_prefix(pool)}slots/{i}"

    def waiting_key(self, pool: str) -> str:
        return f"{self.pool_prefix(pool)}waiting/{self.node}"

    def job_prefix(self, quoted_job: str) -> str:
        return f"{self.prefix}/jobs/{quoted_job}/"

    @property
    def limited(self) -> bool:
        """Whether it bounds the nodes acting at once; without a limit it only
        registers the node (the lease a rollout's seats are held with)."""
        return self.max_nodes is not None or self.max_percent is not None

    @property
    def renewing(self) -> bool:
        """Whether the node has a lease and its last renewal reached the store."""
        return self.lease is not None and not self._outage

    def registered(self) -> int:
        """The node's lease, registering it first when it has none (StoreUnavailable, StoreError)."""
        with self._lock:
            if self.lease is None:
                self._register()
            return self.lease

    def limit(self, live: int, spec: BudgetSpec | None = None) -> int:
        """How many nodes may act at once in a pool with ``live`` nodes alive:
        by the policy's own ``spec``, else by the node's limits."""
        if spec is not None:
            return spec.limit(live)
        return limit(live, self.max_nodes, self.max_percent)

    # --- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Register the node (a lease and its node key) and start renewing it.
        A store that does not answer now is not an error: the renewal retries,
        and until it registers every ``take`` is refused (``store-unreachable``)."""
        try:
            with self._lock:
                self._register()
        except (StoreUnavailable, StoreError) as exc:
            log.warning("fleet budget: cannot register %s yet (%s); enforce actions are refused until it can",
                        self.node, exc)
            self._outage = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._keep_alive, name="reflexarc-fleet-lease", daemon=True)
        self._thread.start()

    def stop(self, keep=()) -> None:
        """Stop renewing and revoke the lease: the node key and every slot it
        held are gone at once (not after the TTL), but the slots of the
        holders in ``keep`` (changes that stay applied), parked first."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        with self._lock:
            if self.lease is not None:
                self._park({self._pool_of[h] for h in keep if h in self._pool_of})
            lease, self.lease = self.lease, None
            self._slots.clear()
            self._pool_of.clear()
            self._unreleased.clear()
        if lease is not None:
            try:
                self.store.revoke(lease)
            except (StoreUnavailable, StoreError) as exc:
                log.warning("fleet budget: lease not revoked (%s); its slots free themselves within %d s",
                            exc, self.ttl)
        self.store.close()

    def _park(self, pools: set[str]) -> None:
        """Move the slots of ``pools`` to a lease of ``park_ttl`` seconds of
        their own, so that they outlive the node's lease."""
        slots = [(pool, self._slots[pool]) for pool in sorted(pools) if self._slots[pool].key is not None]
        if not slots:
            return
        try:
            park = self.store.grant(self.park_ttl)
            for pool, slot in slots:
                value = json.dumps({"node": self.node, "holder": next(iter(sorted(slot.holders)), ""),
                                    "parked": round(self._wall(), 3)})
                if not self.store.move(slot.key, value, self.lease, park):
                    log.warning("fleet budget: slot %s was no longer %s's: not parked", slot.key, self.node)
        except (StoreUnavailable, StoreError) as exc:
            log.warning("fleet budget: the slots of the changes left applied could not be parked (%s); they free "
                        "themselves within %d s", exc, self.ttl)
            return
        log.warning("fleet budget: %d slot(s) of changes left applied stay taken for up to %d s, until %s starts "
                    "again (%s)", len(slots), self.park_ttl, self.node, ", ".join(pool for pool, _ in slots))

    def _find_parked(self) -> dict[str, Entry]:
        """The slots this node parked when it last stopped, by pool."""
        found = {}
        pools = f"{self.prefix}/pools/"
        for e in self.store.prefix(pools):
            pool, _, rest = e.key[len(pools):].rpartition("/slots/")
            if not pool or not rest.isdigit():
                continue
            try:
                value = json.loads(e.value)
            except ValueError:
                continue
            if isinstance(value, dict) and value.get("node") == self.node and "parked" in value:
                found[pool] = e
        return found

    def drop_parked(self) -> int:
        """Free the parked slots nothing took back (their changes were reverted
        at the start, or are gone); how many. A store that does not answer
        leaves them to their lease."""
        with self._lock:
            dropped = 0
            for pool, entry in list(self._parked.items()):
                try:
                    dropped += self.store.delete_if_leased(entry.key, entry.lease)
                except (StoreUnavailable, StoreError):
                    continue
                del self._parked[pool]
            return dropped

    def _register(self) -> None:
        lease = self.store.grant(self.ttl)
        self.store.put(self.node_key, json.dumps({"since": round(self._wall(), 3), "ttl": self.ttl}), lease)
        self.lease = lease
        self._registered_jobs.clear()             # the old lease took its job keys with it
        self._look_for_parked()

    def _look_for_parked(self) -> None:
        """Once registered, the first time the store answers: the slots this
        node parked when it last stopped."""
        if not self._looked_for_parked:
            self._parked = self._find_parked()
            self._looked_for_parked = True

    def _keep_alive(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self.renew()

    def renew(self) -> None:
        """One renewal (the thread calls it every TTL/3): keep the lease, or
        register again and take the held slots back when it ran out; delete the
        slots given back while the store did not answer."""
        try:
            lease = self.lease
            alive = lease is not None and self.store.keepalive(lease) > 0
            with self._lock:
                if not alive and self.lease == lease:      # not registered again meanwhile by a take
                    self._lease_lost()
                else:
                    self._look_for_parked()
                    self._sync_jobs()
                    self._retake(only_unbacked=True)
                self._release_pending()
            if self._outage:
                self._outage = False
                log.warning("fleet budget: the store answers again (%s)", self.store.endpoint)
        except (StoreUnavailable, StoreError) as exc:
            if not self._outage:
                self._outage = True
                log.warning("fleet budget: renewal failed (%s); new enforce actions are refused meanwhile", exc)

    def _lease_lost(self) -> None:
        """The lease ran out (or was never granted): register again and take
        every held slot back, ahead of the queue."""
        if self.lease is not None:
            self.lost += 1
            log.warning("fleet budget: the lease of %s ran out (the store was out of its reach for over %d s); "
                        "registering again and taking its %d slot(s) back", self.node, self.ttl, len(self._slots))
            self.lease = None
        self._register()
        self._retake(only_unbacked=False)

    def _sync_jobs(self, also: str | None = None) -> None:
        """Register the jobs this node runs now (``jobs``, and ``also``, a
        quoted name) under its lease, and unregister those it no longer runs
        and holds no per-job slot for."""
        if self.jobs is None and also is None or self.lease is None:
            return
        now = self._wall()
        if also:
            self._asked_jobs[also] = now
        self._asked_jobs = {job: t for job, t in self._asked_jobs.items() if now - t <= WAITER_FRESH_S}
        want = {quote_job(j) for j in (self.jobs() if self.jobs is not None else ()) if j}
        want |= {job for job in map(job_of_pool, self._slots) if job} | set(self._asked_jobs)
        for job in sorted(want - self._registered_jobs):
            self.store.put(self.job_prefix(job) + self.node, json.dumps({"since": round(self._wall(), 3)}),
                           self.lease)
            self._registered_jobs.add(job)
        for job in sorted(self._registered_jobs - want):
            self.store.delete_if_leased(self.job_prefix(job) + self.node, self.lease)
            self._registered_jobs.discard(job)

    def _retake(self, only_unbacked: bool) -> None:
        for pool, slot in self._slots.items():
            if only_unbacked and slot.key is not None:
                continue
            slot.key = self._claim(pool, next(iter(slot.holders), ""), queue=False, spec=slot.spec)
            if slot.key is None:
                log.error("fleet budget: %s acts in %s without a slot (the pool filled while its lease was "
                          "lost); retried at each renewal", self.node, pool)

    def _release_pending(self) -> None:
        while self._unreleased and self.lease is not None:
            key = self._unreleased[0]
            self.store.delete_if_leased(key, self.lease)
            self._unreleased.pop(0)

    # --- slots --------------------------------------------------------------------------------
    def take(self, pool: str, holder: str, spec: BudgetSpec | None = None, ahead: bool = False) -> str:
        """A slot of ``pool`` for ``holder``: its key (the slot this node
        already holds in the pool, shared), or ``Refused``. ``spec``: the
        policy's own limit (``core/budget.py``); None, the node's. ``ahead``:
        past the queue, for a change already applied (adopted at a restart)."""
        with self._lock:
            slot = self._slots.get(pool)
            if slot is not None and slot.key is not None:
                slot.holders.add(holder)
                self._pool_of[holder] = pool
                return slot.key
            try:
                if self.lease is None:
                    self._register()
                try:
                    key = self._claim(pool, holder, queue=slot is None and not ahead, spec=spec)
                except StoreError as exc:
                    if LEASE_GONE not in str(exc):
                        raise
                    self._lease_lost()             # ran out since the last renewal: register and ask again
                    key = self._claim(pool, holder, queue=slot is None and not ahead, spec=spec)
            except StoreUnavailable as exc:
                raise Refused("store-unreachable", str(exc)) from None
            except StoreError as exc:
                raise Refused("store-error", str(exc)) from None
            if key is None:
                raise Refused("budget-full", f"{pool}: {self.why_full}")
            if slot is None:
                slot = self._slots[pool] = _Slot(key, spec=spec)
            slot.key = key
            slot.holders.add(holder)
            self._pool_of[holder] = pool
            return key

    def _claim(self, pool: str, holder: str, queue: bool, spec: BudgetSpec | None = None) -> str | None:
        """Create a free slot of ``pool``; its key, or None (and, with ``queue``,
        the node's waiting entry written or renewed; ``why_full`` says why).
        Without ``queue`` the node goes ahead of the waiters (it takes back a
        slot it held)."""
        lease = self.lease
        self.why_full = ""
        parked = self._parked.get(pool)
        if parked is not None:                    # its own, kept while it was stopped: taken back as it is
            value = json.dumps({"node": self.node, "holder": holder, "since": round(self._wall(), 3)})
            moved = self.store.move(parked.key, value, parked.lease, lease)
            del self._parked[pool]                # taken, or freed (its lease ran out) or taken by another since
            if moved:
                return parked.key
        job = job_of_pool(pool) if spec is not None and spec.of == "job" else None
        if job is not None:
            self._sync_jobs(also=job)             # this node runs the job: it counts among its nodes
        for _ in range(CLAIM_ROUNDS):
            share = spec.max_percent if spec is not None else self.max_percent
            counted = self.job_prefix(job) if job is not None else f"{self.prefix}/nodes/"
            live = self.store.count(counted) if share is not None else 0
            limit = self.limit(live, spec)
            entries = self.store.prefix(self.pool_prefix(pool))
            taken, waiters = set(), []
            for e in entries:
                kind, _, name = e.key[len(self.pool_prefix(pool)):].partition("/")
                if kind == "slots" and name.isdigit():
                    if e.lease == lease:          # a transaction whose answer was lost: it is ours
                        return e.key
                    taken.add(int(name))
                elif kind == "waiting" and self._fresh(e):
                    waiters.append(e)
            # indices below the limit only, and no more than the limit leaves: slots above it (taken
            # before the fleet shrank) still count, and two nodes that read alike collide on one key
            free = [i for i in range(limit) if i not in taken][:max(0, limit - len(taken))]
            waiters.sort(key=lambda e: e.created)
            ahead = next((n for n, e in enumerate(waiters) if e.key == self.waiting_key(pool)), len(waiters))
            if queue and ahead >= len(free) or not free:
                of_job = f" ({share:g} % of the {live} node(s) running the job)" if job is not None else ""
                self.why_full = (f"{len(taken)} slot(s) taken, the limit {limit}{of_job}" if not free else
                                 f"{len(free)} slot(s) free, {ahead} node(s) ahead in the queue")
                break
            self.why_full = f"another node took slot {free[0]} first"
            i = free[min(ahead, len(free) - 1) if queue else 0]
            value = json.dumps({"node": self.node, "holder": holder, "since": round(self._wall(), 3)})
            if self.store.create(self.slot_key(pool, i), value, lease, and_delete=self.waiting_key(pool)):
                return self.slot_key(pool, i)
        if queue:
            self.store.put(self.waiting_key(pool), json.dumps({"renewed": round(self._wall(), 3)}), lease)
        return None

    def _fresh(self, entry: Entry) -> bool:
        try:
            renewed = float(json.loads(entry.value)["renewed"])
        except (ValueError, KeyError, TypeError):
            return False
        return self._wall() - renewed <= WAITER_FRESH_S

    def give_back(self, holder: str) -> bool:
        """``holder`` no longer needs its slot; the slot is deleted when it was
        the pool's last holder on this node (later, at a renewal, when the store
        does not answer now). Whether ``holder`` held one."""
        with self._lock:
            pool = self._pool_of.pop(holder, None)
            if pool is None:
                return False
            slot = self._slots[pool]
            slot.holders.discard(holder)
            if slot.holders:
                return True
            del self._slots[pool]
            if slot.key is None or self.lease is None:
                return True
            try:
                self.store.delete_if_leased(slot.key, self.lease)
            except (StoreUnavailable, StoreError) as exc:
                log.warning("fleet budget: slot %s not given back yet (%s); retried at the next renewal",
                            slot.key, exc)
                self._unreleased.append(slot.key)
            return True

    def held(self) -> dict[str, list[str]]:
        """The pools this node holds a slot of, with their holders."""
        with self._lock:
            return {pool: sorted(slot.holders) for pool, slot in self._slots.items()}
