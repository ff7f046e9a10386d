"""Pending infill jobs: a bounded queue between the socket loop and the model thread.

The asyncio side submits jobs and cancels them; the model thread takes them one at a time. A job's cancel
reason and deadline are read by the model thread between denoising steps (``Job.should_stop``), which is
how a cancel reaches the model within one step. Each job resolves its future exactly once.

A submitted job is handed to the model thread on the loop's next turn, not at once: the frames of one read from a
client's socket are all dispatched first. So a ``Cancel`` (or a newer request for the document) that arrived with
its request answers the job without its work being started, rather than racing the model thread to it.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import BusyError
from ..shared import protocol
from ..shared.serve_options import DEFAULT_MAX_PENDING


@dataclass(eq=False)
class Job:
    """One infill request on its way through the engine."""

    request: protocol.Infill
    key: tuple[int, str]
    """(connection id, document uri): a newer job with the same key supersedes this one."""
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[protocol.Result | protocol.Error]
    arrived: float = field(default_factory=time.monotonic)
    started: float | None = None
    cancel_reason: protocol.StopReason | None = None

    @property
    def deadline(self) -> float | None:
        """Monotonic time after which denoising stops, or None."""
        return self.arrived + self.request.deadline_ms / 1000.0 if self.request.deadline_ms > 0 else None

    def cancel(self, reason: protocol.StopReason) -> None:
        """Ask the job to stop (thread-safe: a single attribute write read by the model thread)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason

    def should_stop(self) -> str | None:
        """Called by the model thread before each denoising step."""
        if self.cancel_reason is not None:
            return self.cancel_reason.value
        deadline = self.deadline
        if deadline is not None and time.monotonic() >= deadline:
            return protocol.StopReason.DEADLINE.value
        return None

    def time_left_ms(self) -> float | None:
        """What remains of the request's deadline, in ms (None: it has none). Read on the model thread."""
        deadline = self.deadline
        return (deadline - time.monotonic()) * 1000.0 if deadline is not None else None

    def queue_ms(self) -> float:
        """Time from arrival to the start of work (or to now)."""
        return ((self.started or time.monotonic()) - self.arrived) * 1000.0

    def resolve(self, reply: protocol.Result | protocol.Error) -> None:
        """Deliver the one reply; later calls are ignored. Call on the event loop."""
        if not self.future.done():
            self.future.set_result(reply)

    def resolve_threadsafe(self, reply: protocol.Result | protocol.Error) -> None:
        """``resolve`` from the model thread."""
        self.loop.call_soon_threadsafe(self.resolve, reply)


class JobQueue:
    """FIFO of jobs with latest-wins per key and a size limit."""

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.max_pending = max_pending
        self._pending: collections.deque[Job | None] = collections.deque()
        """What the model thread takes."""
        self._staged: list[Job] = []
        """Submitted on this turn of the loop; moved to ``_pending`` on its next (``_release``)."""
        self._condition = threading.Condition()
        self._latest: dict[tuple[int, str], Job] = {}

    def submit(self, job: Job) -> None:
        """Queue ``job``, superseding the previous job with its key; ``BusyError`` when full. Call on the loop.

        A superseded or cancelled job that is still waiting leaves the queue at once and is answered there, so
        the queue holds only live work: what ``max_pending`` counts is what it keeps in memory."""
        previous = self._latest.get(job.key)
        if previous is not None and not previous.future.done():
            self._stop(previous, protocol.StopReason.SUPERSEDED)
        with self._condition:
            live = sum(1 for queued in self._waiting() if queued.cancel_reason is None)
            if live >= self.max_pending:
                raise BusyError(f"the engine has {live} requests waiting (limit {self.max_pending}); try later")
            self._staged.append(job)
            if len(self._staged) == 1:
                job.loop.call_soon(self._release)
        self._latest[job.key] = job
        job.future.add_done_callback(lambda _: self._forget(job))

    def _release(self) -> None:
        """Hand the jobs submitted on the last turn of the loop to the model thread."""
        with self._condition:
            self._pending.extend(self._staged)
            self._staged.clear()
            self._condition.notify()

    def _waiting(self) -> list[Job]:
        """Jobs not yet taken by the model thread. Hold ``_condition``."""
        return [job for job in self._pending if job is not None] + self._staged

    def _forget(self, job: Job) -> None:
        if self._latest.get(job.key) is job:
            del self._latest[job.key]

    def cancel_request(self, connection: int, request_id: str) -> bool:
        """Cancel the job with ``request_id`` on ``connection``; False if there is none. Call on the loop."""
        for job in list(self._latest.values()):
            if job.key[0] == connection and job.request.id == request_id:
                self._stop(job, protocol.StopReason.CANCELLED)
                return True
        return False

    def cancel_connection(self, connection: int) -> None:
        """Cancel every job of a closed connection. Call on the loop."""
        for job in list(self._latest.values()):
            if job.key[0] == connection:
                self._stop(job, protocol.StopReason.CANCELLED)

    def _stop(self, job: Job, reason: protocol.StopReason) -> None:
        """Cancel ``job``: one the model thread has not taken is removed and answered now; one it runs stops at
        its next denoising step."""
        job.cancel(reason)
        with self._condition:
            if job in self._staged:
                self._staged.remove(job)
            elif job in self._pending:
                self._pending.remove(job)
            else:
                return  # taken by the model thread: it answers
        job.resolve(protocol.Result(id=job.request.id, text="", stop=reason, timings=protocol.Timings()))

    def take(self) -> Job | None:
        """Block until a job is queued; None means shut down. Called by the model thread."""
        with self._condition:
            while not self._pending:
                self._condition.wait()
            return self._pending.popleft()

    def take_matching(self, matches: Callable[[Job], bool], limit: int) -> list[Job]:
        """Remove and return up to ``limit`` queued jobs for which ``matches`` is true, without waiting."""
        taken: list[Job] = []
        with self._condition:
            for job in list(self._pending):
                if len(taken) >= limit:
                    break
                if job is not None and matches(job):
                    self._pending.remove(job)
                    taken.append(job)
        return taken

    def next_deadline(self) -> float | None:
        """The earliest deadline of the live jobs waiting for the model thread (None: none has one). Read on the
        model thread while it waits for a runtime elsewhere (vLLM)."""
        with self._condition:
            deadlines = [job.deadline for job in self._waiting() if job.cancel_reason is None]
        return min((deadline for deadline in deadlines if deadline is not None), default=None)

    def close(self) -> None:
        """Wake the model thread with a shutdown marker, after the jobs already submitted."""
        with self._condition:
            self._pending.extend(self._staged)
            self._staged.clear()
            self._pending.append(None)
            self._condition.notify()

    def in_flight(self) -> int:
        """Requests the engine holds and has not answered: queued, or on the model thread. Call on the loop."""
        return sum(1 for job in self._latest.values() if not job.future.done())

    def __len__(self) -> int:
        with self._condition:
            return len(self._waiting())
