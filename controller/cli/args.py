"""The argument types of the ``reflexarc`` command line (``main.build_parser``):
durations, intervals, paths, counts, ports, listen addresses and sizes, each
checked as it is parsed, so that bad input is one ``error:`` line (exit 2)
and never a wait: intervals are finite and > 0, durations finite and >= 0,
counts whole and >= 0, paths not empty.

Example::

    s.add_argument("--interval", type=_interval_arg, default=1.0, metavar="DURATION")

Overhead: argument parsing only.
"""
from __future__ import annotations

import argparse


def _duration_arg(text: str) -> float:
    """An argparse type: a duration (``90``, ``20m``, ``1h``), finite and >= 0."""
    from reflexarc.core.durations import DurationError, parse_duration
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _interval_arg(text: str) -> float:
    """An argparse type: a duration > 0 (a loop interval)."""
    value = _duration_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not an interval: use a duration > 0, e.g. 1 or 500ms")
    return value


def _path_arg(text: str) -> str:
    """An argparse type: a path that is not empty (an empty one would mean the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: name a file or directory")
    return text


def _count_arg(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number >= 0")
    return int(text)


def _port_arg(text: str) -> int:
    """An argparse type: a TCP port 1-65535."""
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port (1-65535)")
    return int(text)


def _address_arg(text: str) -> tuple[str, int]:
    """An argparse type: a listen address, ``[HOST:]PORT`` (loopback without a host)."""
    from ..runtime.exporter import parse_address
    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size_mb_arg(text: str) -> float:
    """An argparse type: a size in MB, finite and > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"'{text}' is not a size in MB (a number > 0)")
    return value
