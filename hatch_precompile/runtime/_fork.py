"""Worker processes forked from one that loaded the models (gunicorn --preload,
multiprocessing's "fork" start method, uvicorn's and celery's prefork workers).

torch's CPU build runs its threads with GNU OpenMP, whose thread pool belongs to
the process that started it. A child forked after the pool has run inherits its
state but not its threads, and its first parallel kernel, compiled or eager,
waits for them forever. So when a model of this package has run in a process,
each child forked from it is set to one thread as it starts (`after_in_child`),
before it can call anything; so is a child forked after a load that checked
the weights' checksums (torch sums them on every core, the first load after
an install). A child forked after loading alone, with the weights' stamp
left by an earlier load, keeps the parent's thread count: its pool starts afresh. One thread per worker is
also how a server with as many workers as cores should run them (docs/usage.md).
A process that ran models on NumPy arrays alone has no torch imported: its
children get the same call from torch's library (`_shim.one_thread`).
"""

from __future__ import annotations

import os
import sys
import threading

_ran = threading.Event()  # a model ran in this process, or in the one it was forked from


def note_call() -> None:
    """A model is about to run, or torch's parallel code: OpenMP's pool may start in this process."""
    if not _ran.is_set():
        _ran.set()


def _one_thread_in_the_child() -> None:
    if not _ran.is_set():
        return
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(1)
    from . import _shim  # the same call for the NumPy path's shim (torch's, or the wheel's own OpenMP pool)

    _shim.one_thread()


os.register_at_fork(after_in_child=_one_thread_in_the_child)
