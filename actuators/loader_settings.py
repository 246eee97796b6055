"""The DataLoader settings a training script lets reflexarc change through the
``dataloader.prefetch`` hook (``prefetch_factor``, ``num_workers``), with undo
to what they replaced; the arguments the shipped ``dataloader-starvation``
policy sends. The hook's thread calls ``set``/``restore``/``preview``; the
training loop calls ``take()`` at a step (or epoch) and rebuilds its
DataLoader iterator when the settings changed.

Example::

    settings = LoaderSettings(prefetch_factor=2, num_workers=2)
    hooks.handler("dataloader.prefetch", undo=settings.restore, preview=settings.preview)(settings.set)
    ...
    current, changed = settings.take()          # in the training loop
    if changed:
        loader = DataLoader(data, batch_size=16, **current)

Overhead: a lock and a dict copy per call.
"""
from __future__ import annotations

import threading


class LoaderSettings:
    """``prefetch_factor`` and ``num_workers``, each limited to 1-64; ``take()``
    hands a change over to the training loop once."""

    LIMITS = {"prefetch_factor": (1, 64), "num_workers": (1, 64)}

    def __init__(self, prefetch_factor: int, num_workers: int) -> None:
        self.current = {"prefetch_factor": prefetch_factor, "num_workers": num_workers}
        self.original: dict | None = None
        self._changed = False
        self._lock = threading.Lock()

    def _wanted(self, args: dict) -> dict:
        unknown = set(args) - set(self.LIMITS)
        if unknown or not args:
            raise ValueError(f"takes {', '.join(self.LIMITS)}; got {', '.join(sorted(args)) or 'nothing'}")
        wanted = dict(self.current)
        for key, value in args.items():
            lo, hi = self.LIMITS[key]
            if not lo <= int(value) <= hi:
                raise ValueError(f"{key} {value} outside {lo}..{hi}")
            wanted[key] = int(value)
        return wanted

    def set(self, **args) -> dict:
        with self._lock:
            wanted = self._wanted(args)
            if self.original is None:
                self.original = dict(self.current)
            self.current, self._changed = wanted, True
            return {**wanted, "original": self.original}

    def restore(self, **_args) -> dict:
        with self._lock:
            if self.original is not None:
                self.current, self.original, self._changed = self.original, None, True
            return dict(self.current)

    def preview(self, **args) -> dict:
        with self._lock:
            return {"before": dict(self.current), "after": self._wanted(args)}

    def take(self) -> tuple[dict, bool]:
        """The current settings and whether they changed since the last ``take``."""
        with self._lock:
            changed, self._changed = self._changed, False
            return dict(self.current), changed
