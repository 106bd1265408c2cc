"""The shared set of CRC-checked files: identities, sharing with forked children, a full table."""
from __future__ import annotations

import multiprocessing as mp
import os

from vlmdata.cache import VerifiedFiles, file_identity


def _child_adds(files: VerifiedFiles, ident: int) -> None:
    files.add(ident)


def test_identity_changes_when_the_file_changes(tmp_path):
    p = tmp_path / "s.tar"
    p.write_bytes(b"abc")
    a = file_identity(str(p), os.stat(p), 1)
    assert a == file_identity(str(p), os.stat(p), 1) and a != 0
    assert a != file_identity(str(p), os.stat(p), 2)               # checked against another CRC
    p.write_bytes(b"abd")                                           # rewritten in place: new times
    assert a != file_identity(str(p), os.stat(p), 1)


def test_forked_children_share_the_set():
    files = VerifiedFiles(slots=64)
    ctx = mp.get_context("fork")
    proc = ctx.Process(target=_child_adds, args=(files, 12345))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0 and 12345 in files                   # what a worker checked, the next one knows


def test_full_table_overwrites_and_forgets_nothing_it_holds():
    files = VerifiedFiles(slots=8)
    for i in range(1, 40):
        files.add(i * 8)                                             # all hash to slot 0
    assert 39 * 8 in files                                          # the newest is always held
    held = sum((i * 8) in files for i in range(1, 40))
    assert 1 <= held <= 8                                           # the others are checked again later
    files.clear()
    assert 39 * 8 not in files
