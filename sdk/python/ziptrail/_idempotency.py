"""The function server's idempotency records (Go: sdk/go/records.go).

The pod's sidecar (queue-proxy-zl) records every invocation's answer under
its idempotency key and answers a duplicate delivery from that record, but
its records live in its memory: a sidecar restarted after a crash forwards
a resent key to the function again. So the function server keeps its own
record per key too: a key is run at most once per function process.

- A delivery whose key is recorded gets the recorded answer (status,
  content type, body) without running the handler; one whose key is
  running waits for that run and gets its answer.
- The answer is recorded before it is written: an answer its (dead) caller
  never got is still recorded.
- Bounded: at most ``MAX_KEYS`` keys and ``MAX_BYTES`` bytes of answers,
  oldest first out; a record expires ``TTL`` seconds after its run ended
  (the sidecar's default object TTL). An answer over ``MAX_ANSWER`` bytes
  is not recorded: its key is forgotten, and a later resend runs again
  (deliveries already waiting for that run still get its answer).
- A run that ended without an answer (the handler thread died of a
  ``BaseException``) is forgotten: its waiters, and later deliveries, run
  the key again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

#: At most this many keys (running or recorded) per function process.
MAX_KEYS = 4096
#: At most this many bytes of recorded answers.
MAX_BYTES = 64 << 20
#: A larger answer (body) is not recorded: its key runs again if resent.
MAX_ANSWER = 16 << 20
#: Seconds a record lives after its run ended (the sidecar's object TTL).
TTL = 600.0

#: (status, content type, body)
Answer = tuple[int, str, bytes]


class Record:
    """One key: running until ``done`` is set, then ``answer`` (None: the
    run ended without one, run the key again)."""

    __slots__ = ("key", "done", "answer", "size", "expires")

    def __init__(self, key: str) -> None:
        self.key = key
        self.done = threading.Event()
        self.answer: Answer | None = None
        self.size = 0
        self.expires = 0.0

    def wait(self) -> Answer | None:
        """The run's answer, once it ended (None: run the key again)."""
        self.done.wait()
        return self.answer


def answer_size(a: Answer) -> int:
    return len(a[2]) + len(a[1]) + 64


class Records:
    """A function process's idempotency records, safe for concurrent use.
    No lock is held while a handler runs: a run owns its :class:`Record`
    and sets its event when it ends."""

    def __init__(self, max_keys: int = MAX_KEYS, max_bytes: int = MAX_BYTES, max_answer: int = MAX_ANSWER,
                 ttl: float = TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_keys, self.max_bytes, self.max_answer, self.ttl = max_keys, max_bytes, max_answer, ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, Record] = {}  # running and recorded
        self._done: OrderedDict[str, Record] = OrderedDict()  # recorded, oldest (first expiring) first
        self._bytes = 0

    def begin(self, key: str) -> tuple[Record, bool]:
        """The key's record and whether the caller runs it (True: run the
        handler, then :meth:`finish` or :meth:`abandon`; False: answer with
        ``record.wait()``, or run again if that is None)."""
        with self._lock:
            self._expire()
            rec = self._keys.get(key)
            if rec is not None:
                return rec, False
            rec = self._keys[key] = Record(key)
            self._evict()
            return rec, True

    def finish(self, rec: Record, answer: Answer) -> None:
        """Records the run's answer and wakes the deliveries waiting for it."""
        with self._lock:
            rec.answer = answer
            if self._keys.get(rec.key) is rec:
                if len(answer[2]) > self.max_answer:
                    del self._keys[rec.key]  # not recorded: a resend runs again
                else:
                    rec.size, rec.expires = answer_size(answer), self._clock() + self.ttl
                    self._done[rec.key] = rec
                    self._bytes += rec.size
                    self._evict()
            rec.done.set()

    def abandon(self, rec: Record) -> None:
        """Forgets a run that ended without an answer; its waiters get None."""
        with self._lock:
            if self._keys.get(rec.key) is rec:
                del self._keys[rec.key]
            rec.done.set()

    def usage(self) -> tuple[int, int]:
        """Keys (running and recorded) and bytes recorded."""
        with self._lock:
            return len(self._keys), self._bytes

    def _remove(self, rec: Record) -> None:
        del self._done[rec.key]
        del self._keys[rec.key]
        self._bytes -= rec.size

    def _expire(self) -> None:
        now = self._clock()
        while self._done:
            rec = next(iter(self._done.values()))
            if rec.expires > now:
                return
            self._remove(rec)

    def _evict(self) -> None:
        """Frees the oldest recorded keys while over a cap; running ones
        stay (their duplicates wait for them)."""
        while (len(self._keys) > self.max_keys or self._bytes > self.max_bytes) and self._done:
            self._remove(next(iter(self._done.values())))
