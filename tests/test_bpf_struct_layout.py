"""The structs a BPF program shares with its loader are declared once, in a C
header, and the loader's ctypes mirror of each agrees with it field by field.

gcc compiles the header into a small program that prints, for every field the
mirror names, its ``offsetof``, its ``sizeof``, whether it is an array and its
element's size, the ``sizeof`` of each struct and the value of each flag the
mirror copies; the mirror must say the same. A mirror must also name every
byte (padding included), so that, with every named field in place, the C
struct has no field the mirror lacks. A field the header does not have, a
flag it does not define, or an array in the mirror that is no array in C fails
gcc, and the test shows gcc's message.

No root, no kernel: gcc and a compile, under a second.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

from conftest import require

from reflexarc.actuators import dscp

PRELUDE = """#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
"""

DSCP_STRUCTS = {"rule": dscp._Rule, "iface_key": dscp._IfaceKey, "iface": dscp._Iface, "meta": dscp._Meta}
DSCP_FLAGS = {name: getattr(dscp, name) for name in
              ("RULE_SET_PRIORITY", "RULE_MATCH_ADDR", "RULE_MATCH_PORTS", "IFACE_CLSACT_CREATED")}


def python_layout(cls) -> dict[str, tuple[int, int, int, int]]:
    """field -> (offset, size, is an array, element size) of a ctypes struct,
    and "" -> (0, its size, 0, its size)."""
    out = {"": (0, ctypes.sizeof(cls), 0, ctypes.sizeof(cls))}
    for name, ftype in cls._fields_:
        array = issubclass(ftype, ctypes.Array)
        element = ctypes.sizeof(ftype._type_ if array else ftype)
        out[name] = (getattr(cls, name).offset, getattr(cls, name).size, int(array), element)
    return out


def c_program(header: Path, structs: dict[str, type], flags: dict[str, int]) -> str:
    lines = []
    for struct, cls in structs.items():
        lines.append(f'printf("{struct}. 0 %zu 0 %zu\\n", sizeof(struct {struct}), sizeof(struct {struct}));')
        for name, ftype in cls._fields_:
            member = f"((struct {struct} *)0)->{name}"
            element = f"{member}[0]" if issubclass(ftype, ctypes.Array) else member
            # an array decays to a pointer: gcc classifies it as pointer_type_class (5)
            lines.append(f'printf("{struct}.{name} %zu %zu %d %zu\\n", offsetof(struct {struct}, {name}), '
                         f"sizeof({member}), __builtin_classify_type({member}) == 5, sizeof({element}));")
    lines += [f'printf("{name} %lld\\n", (long long)({name}));' for name in flags]
    body = "\n    ".join(lines)
    return f'{PRELUDE}#include "{header.name}"\n\nint main(void)\n{{\n    {body}\n    return 0;\n}}\n'


def mismatches(header: Path, structs: dict[str, type], flags: dict[str, int], tmp: Path) -> list[str]:
    """Each way the ctypes mirrors and flag values differ from what gcc makes of ``header``."""
    out = []
    for struct, cls in structs.items():
        unnamed = ctypes.sizeof(cls) - sum(ctypes.sizeof(t) for _, t in cls._fields_)
        if unnamed:
            out.append(f"{cls.__name__} leaves {unnamed} bytes of padding without a name: "
                       f"name them (as struct {struct} of {header.name} must)")
    source, exe = tmp / "layout.c", tmp / "layout"
    source.write_text(c_program(header, structs, flags))
    built = subprocess.run(["gcc", "-Wall", "-Werror", f"-I{header.parent}", "-o", str(exe), str(source)],
                           capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    if built.returncode != 0:
        return out + [f"gcc cannot compile the check against {header.name}:\n{built.stderr}"]
    printed = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    c = {fields[0]: tuple(int(v) for v in fields[1:]) for fields in map(str.split, printed) if fields}
    for struct, cls in structs.items():
        for name, py in python_layout(cls).items():
            got = c[f"{struct}.{name}"]
            if got != py:
                what = f"struct {struct}" + (f".{name}" if name else "")
                out.append(f"{what}: C has (offset, size, array, element) {got}, {cls.__name__} has {py}")
    out += [f"{name}: {header.name} defines {c[name][0]}, the loader {value}"
            for name, value in flags.items() if c[name] != (value,)]
    return out


def test_dscp_mirrors_match_dscp_h(tmp_path):
    require(shutil.which("gcc") is not None, "gcc")
    assert mismatches(dscp.HEADER, DSCP_STRUCTS, DSCP_FLAGS, tmp_path) == []
    assert f'#include "{dscp.HEADER.name}"' in dscp.SOURCE.read_text()


def test_the_layout_check_can_fail(tmp_path):
    require(shutil.which("gcc") is not None, "gcc")

    class Swapped(ctypes.Structure):     # struct meta with its fields the other way round
        _fields_ = [("pad", ctypes.c_uint32), ("used", ctypes.c_uint32)]

    class Short(ctypes.Structure):       # struct iface_key without its named padding
        _fields_ = [("netns", ctypes.c_uint64), ("ifindex", ctypes.c_uint32)]

    class Bytes(ctypes.Structure):       # struct rule with its address as 16 bytes, not 4 words
        _fields_ = [(n, ctypes.c_uint8 * 16 if n == "addr" else t) for n, t in dscp._Rule._fields_]

    found = mismatches(dscp.HEADER, {"meta": Swapped, "iface_key": Short, "rule": Bytes},
                       {"RULE_MATCH_PORTS": 8}, tmp_path)
    assert found == [
        "Short leaves 4 bytes of padding without a name: name them (as struct iface_key of dscp.h must)",
        "struct meta.pad: C has (offset, size, array, element) (4, 4, 0, 4), Swapped has (0, 4, 0, 4)",
        "struct meta.used: C has (offset, size, array, element) (0, 4, 0, 4), Swapped has (4, 4, 0, 4)",
        "struct rule.addr: C has (offset, size, array, element) (40, 16, 1, 4), Bytes has (40, 16, 1, 1)",
        "RULE_MATCH_PORTS: dscp.h defines 4, the loader 8"]

    class Renamed(ctypes.Structure):     # a field dscp.h does not have
        _fields_ = [("used", ctypes.c_uint32), ("spare", ctypes.c_uint32)]

    (found,) = mismatches(dscp.HEADER, {"meta": Renamed}, {}, tmp_path)
    assert "gcc cannot compile" in found and "no member named 'spare'" in found
