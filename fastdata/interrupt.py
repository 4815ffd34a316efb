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
    """While installed, the first Ctrl-C only sets ``hit``; the job calls ``check()`` (raises
    KeyboardInterrupt once hit) or reads ``hit`` at its safe points. A second Ctrl-C raises at
    once. Installed only when ``enabled``, in the main thread and over Python's default handler
    (a program that handles SIGINT itself keeps its handler); ``restore()`` puts the old one
    back."""

    def __init__(self, *, enabled: bool = True):
        self.hit, self._old = False, None
        if (enabled and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._old = signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def check(self) -> None:
        if self.hit:
            raise KeyboardInterrupt

    def restore(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None
