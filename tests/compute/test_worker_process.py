"""A worker process's build: the serving rank reads the grammar vocabulary before it serves."""

from __future__ import annotations

import importlib
import os
from types import SimpleNamespace


def test_a_worker_process_reads_the_grammar_vocabulary_before_it_serves(monkeypatch) -> None:
    # Importing worker_process sets GOMP_SPINCOUNT; the processes this suite starts later (the
    # offline engine's among them) must not inherit it from here.
    monkeypatch.setattr(os, "environ", dict(os.environ))
    build_rank = importlib.import_module("aioworker.compute.build_rank")
    worker_process = importlib.import_module("aioworker.compute.worker_process")
    read = []
    grammars = SimpleNamespace(read_vocabulary=lambda: read.append(True))
    built = ("executor", SimpleNamespace(grammars=grammars))
    monkeypatch.setattr(build_rank, "build_rank", lambda *args, **kwargs: built)
    assert worker_process.build_rank(None, None, device_index=0) == built
    assert read == [True]
