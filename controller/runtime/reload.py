"""Hot reload of the policy set: on SIGHUP, and when a policy file changes.

``reflexarc run`` polls the stat of its ``--policy`` paths every
``POLL_EVERY`` seconds (no inotify): a file's inode, size, mtime and ctime
(content, a rename into place, an owner or mode change), and a directory's
policy files (one added or removed). A change is read once the files have
stayed the same for one more poll, so an editor or a copy is not read
half-written; SIGHUP reloads at the next tick, changed or not.

The new set goes through what a start goes through: the same loader, the same
trust check for the policies that would enforce (``policy.trust``), the same
node readiness findings (printed; policies idle on this node are left out).
A set with an error never replaces the running one: its located errors are
printed on stderr, then one line that says so::

    /etc/reflexarc/policies/late.yaml:7:64: error: 'op' '>>' is not valid; did you mean '>'? ...
    reload refused (file change): 1 error(s) in policy files; keeping 3 policies

The refusal is audited (a ``reload`` record, outcome ``refused``, its errors)
and counted (``reflexarc_policy_reloads_total{outcome="error"}``;
``reflexarc_policy_last_reload_ok`` 0 until a reload succeeds), and the old
policies go on. A set without any policy is refused too, as a start refuses
it. A good set prints its findings and one line::

    policies reloaded (SIGHUP): added late; removed pin; their changes: 1 reverted; 3 rules kept their
    state; running 4 policies

A good set replaces the running one between two ticks
(``Controller.replace_policies``). A rule whose policy name, name and
definition (its conditions, actions, rollback and timings, its policy's
selector, the mode it runs in) are unchanged keeps its state: pending timers,
active changes, cooldowns; moving it to another file, to another line or
adding comments changes nothing. A rule that was removed or changed ends as a
restart without it would end it: its active change is reverted when it rolls
back on shutdown or reverts on restart (the default), and stays applied and
journaled when it says ``on_restart: adopt`` (audited ``adopted``; the next
start adopts it, ``reflexarc rollback`` reverts it); its alerts are resolved.
A changed rule then starts afresh from ``ok``. The audit gets a ``reload``
record (outcome ``ok``, the added, removed and changed policies, the rules
kept and ended) before those reverts. A mode given on the command line stays.

What a start gave the sources stays as it was until a restart: the probes
watch the processes, cgroups, ports and interfaces of the policies they were
started with (a reload that would change that says so: ``selection``), and
the hook channel admits sockets by the selectors of those policies.

Example::

    reloader = Reloader(ctl, PolicyFiles(["/etc/reflexarc/policies"]), facts, receiver=False)
    signal.signal(signal.SIGHUP, lambda *_: reloader.request())
    reloader.poll(now)          # between two ticks: None, or a Reload

Overhead: per poll, one ``stat`` per policy path and per policy file in its
directories (every ``POLL_EVERY`` seconds, not per tick); a reload costs a
start's load and checks (``loader.py``: ~5-30 ms a file) and builds only the
rules that are new.
"""
from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reflexarc.core.diagnostics import Diagnostic

from ..engine.engine import Controller, PolicySwap
from ..policy.diagnostics import errors
from ..policy.loader import POLICY_SUFFIXES, validate_paths
from ..policy.model import Policy
from ..policy.readiness import findings, idle_reason
from ..policy.trust import untrusted, withheld
from ..signals.producers import NodeFacts

log = logging.getLogger("reflexarc.reload")

POLL_EVERY = 2.0     # seconds between two looks at the policy files
SIGHUP = "SIGHUP"
FILE_CHANGE = "file change"


def _stat(path: Path) -> tuple:
    try:
        st = os.stat(path)
    except OSError as exc:
        return ("missing", exc.errno)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _dir_stat(path: Path) -> tuple:
    """A directory's owner and mode (what the trust check reads), not its times:
    an editor's swap file beside a policy is no change."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_uid, st.st_mode


class PolicyFiles:
    """The ``--policy`` paths and the stat fingerprint of what they hold."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = list(paths)
        self.loaded = self.fingerprint()    # what the running set was read from
        self._seen = self.loaded            # what the last poll saw

    def fingerprint(self) -> tuple:
        out = []
        for raw in self.paths:
            path = Path(raw)
            if not path.is_dir():
                out.append((raw, _stat(path)))
                continue
            try:
                names = sorted(e.name for e in os.scandir(path)
                               if e.name.endswith(POLICY_SUFFIXES) and not e.name.startswith("."))
                out.append((raw, _dir_stat(path)))
            except OSError as exc:
                out.append((raw, ("unreadable", exc.errno)))
                continue
            out.extend(((raw, name), _stat(path / name)) for name in names)
        return tuple(out)

    def settled_change(self) -> bool:
        """Whether the files differ from what was loaded and have not moved since
        the last call (a write in progress waits one more poll)."""
        now = self.fingerprint()
        settled = now == self._seen
        self._seen = now
        return settled and now != self.loaded

    def mark_loaded(self) -> None:
        """The files as they are now are the ones being read."""
        self.loaded = self._seen = self.fingerprint()


@dataclass(frozen=True)
class Reload:
    """One reload: ``swap`` says what changed, None when it was refused."""

    reason: str                          # SIGHUP or FILE_CHANGE
    diagnostics: tuple[Diagnostic, ...]  # when refused, its errors; else every finding printed
    swap: PolicySwap | None
    running: int                         # policies running after it

    @property
    def ok(self) -> bool:
        return self.swap is not None


class Reloader:
    """Reloads ``controller``'s policies from ``files``, checked as at start.

    ``facts`` and ``receiver`` are the node as the start saw it (readiness);
    ``selection`` (optional) gives what the probes watch for a policy set, to
    say when a reload would need a restart to be watched."""

    def __init__(self, controller: Controller, files: PolicyFiles, facts: NodeFacts, receiver: bool,
                 selection: Callable[[list[Policy]], object] | None = None,
                 poll_every: float = POLL_EVERY) -> None:
        self.controller = controller
        self.files = files
        self.facts = facts
        self.receiver = receiver
        self.selection = selection
        self.watched = selection(controller.policies) if selection else None
        self.poll_every = poll_every
        self._requested = False
        self._polled = float("-inf")

    def request(self) -> None:
        """Reload at the next poll (safe in a signal handler: it sets a flag)."""
        self._requested = True

    def poll(self, now: float) -> Reload | None:
        """Between two ticks: reload when asked, or when the files changed."""
        if self._requested:
            self._requested = False
            return self.reload(SIGHUP)
        if now - self._polled < self.poll_every:
            return None
        self._polled = now
        return self.reload(FILE_CHANGE) if self.files.settled_change() else None

    def reload(self, reason: str) -> Reload:
        self.files.mark_loaded()
        ctl = self.controller
        override = ctl.mode_override
        policies, diags = validate_paths(self.files.paths)
        diags = withheld(diags)          # an untrusted file is never quoted (printed, audited)
        if not errors(diags):
            diags += self._untrusted(policies, override)
        if not errors(diags) and not policies:
            diags.append(Diagnostic(", ".join(self.files.paths), 1, 1, "error", "no policies here"))
        if not errors(diags):
            diags += findings(policies, self.facts, self.receiver, override)
        for d in diags:
            self._say(str(d))
        if errors(diags):
            return self._refused(reason, errors(diags))
        running = [p for p in policies if not idle_reason(p, self.facts)]
        self._check_selection(running)
        try:
            swap = ctl.replace_policies(running, reason)
        except Exception as exc:  # a bug must not stop the loop; the new slots are built before the swap
            log.error("reload failed; the running policies stay", exc_info=exc)
            return self._refused(reason, [Diagnostic(", ".join(self.files.paths), 1, 1, "error",
                                                     f"internal error while reloading: {type(exc).__name__}: {exc}")])
        ctl.metrics.policy_reloads.labels("ok").inc()
        ctl.metrics.policy_last_reload_ok.set(1)
        self._say(f"policies reloaded ({reason}): {_describe(swap)}; running {_count(len(running))}")
        return Reload(reason, tuple(diags), swap, len(running))

    def _refused(self, reason: str, problems: list[Diagnostic]) -> Reload:
        ctl = self.controller
        running = len(ctl.policies)
        ctl.audit.write("reload", reason=reason, outcome="refused", errors=[str(d) for d in problems],
                        running=[p.name for p in ctl.policies])
        ctl.metrics.policy_reloads.labels("error").inc()
        ctl.metrics.policy_last_reload_ok.set(0)
        self._say(f"reload refused ({reason}): {len(problems)} error(s) in policy files; keeping {_count(running)}")
        return Reload(reason, tuple(problems), None, running)

    @staticmethod
    def _untrusted(policies: list[Policy], override: str | None) -> list[Diagnostic]:
        """The trust check of a start, as located errors."""
        out = []
        for p in policies:
            if (override or p.mode) == "enforce" and p.loc is not None:
                try:
                    reason = untrusted(p.loc.file)
                except OSError as exc:
                    reason = f"unreadable ({exc.strerror or exc})"
                if reason:
                    out.append(Diagnostic(p.loc.file, p.loc.line, p.loc.col, "error",
                                          f"policy {p.name} would enforce, but the file is {reason}"))
        return out

    def _check_selection(self, policies: list[Policy]) -> None:
        if self.selection is None:
            return
        try:
            same = self.selection(policies) == self.watched
        except Exception as exc:  # e.g. a cgroup that does not exist: the probes watch what they did
            self._say(f"warning: the probes cannot watch the new policies' selection ({exc}); "
                      "they keep watching what they watched at start")
            return
        if not same:
            self._say("warning: the probes keep watching the processes, cgroups, ports and interfaces of the "
                      "policies they started with; restart reflexarc for them to follow the new selectors")

    @staticmethod
    def _say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)


def _count(n: int) -> str:
    return f"{n} polic{'y' if n == 1 else 'ies'}"


def _describe(swap: PolicySwap) -> str:
    if swap.unchanged:
        return "nothing changed"
    parts = [f"{what} {', '.join(names)}" for what, names in
             (("added", swap.added), ("changed", swap.changed), ("removed", swap.removed)) if names]
    if swap.ended_changes:
        counts = Counter(swap.ended_changes)
        parts.append("their changes: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))
    kept = len(swap.kept_rules)
    parts.append(f"{kept} rule{'' if kept == 1 else 's'} kept {'its' if kept == 1 else 'their'} state")
    return "; ".join(parts)
