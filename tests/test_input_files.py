"""Input files: only regular files are read; a FIFO, a device or a directory is
refused before anything blocks on it, and text that is not UTF-8 is located."""
from __future__ import annotations

import os

import pytest

from reflexarc.core.input_files import InputFileError, check_regular, files_in, open_regular, read_text


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for call in (lambda: check_regular(fifo), lambda: open_regular(fifo), lambda: read_text(fifo, 10)):
        with pytest.raises(InputFileError, match="is a FIFO, not a regular file"):
            call()


def test_devices_directories_and_missing_paths_are_refused(tmp_path):
    cases = {"/dev/zero": "is a character device", str(tmp_path): "is a directory",
             str(tmp_path / "nope"): "no such file or directory"}
    for path, reason in cases.items():
        with pytest.raises(InputFileError) as exc:
            read_text(path, 10)
        assert str(exc.value).startswith(f"{path}: {reason}"), exc.value


def test_text_past_the_limit_or_not_utf8_is_refused_and_located(tmp_path):
    f = tmp_path / "f.yaml"
    f.write_bytes(b"a: 1\nb: caf\xc3\xa9\nc: \xff\n")
    with pytest.raises(InputFileError) as exc:
        read_text(f, 1000)
    assert (exc.value.line, exc.value.col) == (3, 4)
    assert str(exc.value) == f"{f}:3:4: not UTF-8 text: byte 0xff cannot be decoded"
    f.write_text("x" * 11)
    with pytest.raises(InputFileError, match="larger than 10 bytes"):
        read_text(f, 10)
    f.write_bytes(b"\xef\xbb\xbfok\n")
    assert read_text(f, 10) == "ok\n"


def test_files_in_a_directory_are_regular_or_refused(tmp_path):
    (tmp_path / "b.yaml").write_text("")
    (tmp_path / "a.yml").write_text("")
    (tmp_path / ".hidden.yaml").write_text("")
    (tmp_path / "notes.txt").write_text("")
    assert files_in([str(tmp_path)], (".yaml", ".yml")) == [tmp_path / "a.yml", tmp_path / "b.yaml"]
    os.mkfifo(tmp_path / "c.yaml")
    with pytest.raises(InputFileError, match=r"c\.yaml: is a FIFO"):
        files_in([str(tmp_path)], (".yaml", ".yml"))
    with pytest.raises(InputFileError, match="an empty path"):
        files_in([""], (".yaml",))
