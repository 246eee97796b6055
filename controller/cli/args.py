"""The argument types of the ``reflexarc`` command line (``main.build_parser``):
durations, intervals, paths, counts, ports, listen addresses, sizes and the
fleet budget's (etcd endpoints, percentages, TTLs, key prefixes, node names), each
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


def _endpoints_arg(text: str) -> list[str]:
    """An argparse type: etcd client URLs, comma-separated (``http://HOST:PORT``,
    ``https://...``, or ``HOST[:PORT]``, port 2379)."""
    from ..fleet.store import parse_endpoint
    urls = []
    for part in text.split(","):
        try:
            scheme, host, port = parse_endpoint(part)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        urls.append(f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}")
    return urls


def _positive_count_arg(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number >= 1")
    return int(text)


def _percent_arg(text: str) -> float:
    """An argparse type: a share of the fleet in per cent, > 0 and <= 100."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = float("nan")
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"'{text}' is not a percentage > 0 and <= 100")
    return value


def _ttl_arg(text: str) -> int:
    """An argparse type: a lease's TTL, whole seconds from 2 (etcd's floor) to an hour."""
    from ..fleet.budget import MIN_TTL
    value = _duration_arg(text)
    if value != int(value) or not MIN_TTL <= value <= 3600:
        raise argparse.ArgumentTypeError(f"'{text}' is not a TTL: whole seconds from {MIN_TTL} to 3600")
    return int(value)


def _park_ttl_arg(text: str) -> int:
    """An argparse type: how long a stopped node's slots are kept, whole seconds from 2 to a day."""
    from ..fleet.budget import MIN_TTL
    value = _duration_arg(text)
    if value != int(value) or not MIN_TTL <= value <= 86400:
        raise argparse.ArgumentTypeError(f"'{text}' is not a TTL: whole seconds from {MIN_TTL} to a day (86400)")
    return int(value)


def _key_prefix_arg(text: str) -> str:
    """An argparse type: an etcd key prefix, ``/`` and then a name (no spaces, no trailing ``/``)."""
    if not text.startswith("/") or text.rstrip("/") == "" or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"'{text}' is not a key prefix: '/' and a name, without spaces "
                                         "(e.g. /reflexarc)")
    return text.rstrip("/")


def _node_name_arg(text: str) -> str:
    """An argparse type: a node's name in the fleet: not empty, no '/' and no spaces."""
    if not text or "/" in text or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"'{text}' is not a node name: not empty, without '/' or spaces")
    return text
