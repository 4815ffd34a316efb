"""Ctrl-C that long jobs act on at a safe point, and that is never lost.

Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread is. Raised inside
a finalizer (a weakref callback run by the garbage collector) it is printed as "Exception
ignored" and lost: 4 of 10 Ctrl-C's let a conversion run on to its end here. Raised in the
middle of an optimizer step it would leave a half-updated model to checkpoint.
"""
from __future__ import annotations

import signal
import threading


class SigintLatch:
    """While installed, the first Ctrl-C (or another of ``signals``, e.g. the SIGTERM a batch
    scheduler sends before it kills a job) only sets ``hit``; the job calls ``check()`` (raises
    KeyboardInterrupt once hit) or reads ``hit`` at its safe points. A second one raises at
    once. Installed only when ``enabled``, in the main thread and over the default handler (a
    program that handles a signal itself keeps its handler); ``restore()`` puts the old ones
    back."""

    def __init__(self, *, enabled: bool = True, signals=(signal.SIGINT,)):
        self.hit, self.signal, self._old = False, None, {}
        if enabled and threading.current_thread() is threading.main_thread():
            for sig in signals:
                if signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL):
                    self._old[sig] = signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit, self.signal = True, signal.Signals(signum).name

    def check(self) -> None:
        if self.hit:
            raise KeyboardInterrupt

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
