"""Job queue: latest wins per document, bounded size, cancel by id, one reply per job."""

from __future__ import annotations

import asyncio
import threading

import pytest

from diffgemma_engine.errors import BusyError
from diffgemma_engine.service.jobs import Job, JobQueue
from diffgemma_engine.shared import protocol


def _job(
    loop: asyncio.AbstractEventLoop,
    request_id: str,
    uri: str = "u",
    connection: int = 1,
    deadline_ms: int = 0,
) -> Job:
    request = protocol.Infill(id=request_id, uri=uri, prefix="", deadline_ms=deadline_ms)
    return Job(request=request, key=(connection, uri), loop=loop, future=loop.create_future())


async def test_newer_job_for_the_same_document_supersedes() -> None:
    loop = asyncio.get_running_loop()
    queue = JobQueue()
    old, other, new = _job(loop, "1"), _job(loop, "2", uri="v"), _job(loop, "3")
    for job in (old, other, new):
        queue.submit(job)
    assert old.should_stop() == "superseded"
    assert other.should_stop() is None and new.should_stop() is None
    # The superseded job was still waiting: it left the queue and was answered at once.
    reply = old.future.result()
    assert isinstance(reply, protocol.Result) and reply.stop is protocol.StopReason.SUPERSEDED and reply.id == "1"
    await asyncio.sleep(0)  # the loop's next turn hands them to the model thread
    assert [queue.take(), queue.take()] == [other, new] and len(queue) == 0


async def test_superseded_and_cancelled_waiting_jobs_do_not_pile_up() -> None:
    """5,000 superseding 200 KB requests for one document keep one job queued, not 5,000 (1 GB)."""
    loop = asyncio.get_running_loop()
    queue = JobQueue(max_pending=4)
    big = "x" * 200_000
    jobs = []
    for n in range(5000):
        request = protocol.Infill(id=str(n), uri="u", prefix=big)
        jobs.append(Job(request=request, key=(1, "u"), loop=loop, future=loop.create_future()))
        queue.submit(jobs[-1])  # never busy: the waiting ones are superseded, not counted
    await asyncio.sleep(0)
    assert len(queue) == 1 and queue.take() is jobs[-1]
    assert all(job.future.done() and job.future.result().stop is protocol.StopReason.SUPERSEDED for job in jobs[:-1])
    waiting = _job(loop, "c", uri="w", connection=2)
    queue.submit(waiting)
    assert queue.cancel_request(2, "c") and waiting.future.result().stop is protocol.StopReason.CANCELLED
    assert len(queue) == 0
    print(f"superseded while waiting: {len(jobs) - 1} answered at once, 1 queued")


async def test_same_document_on_another_connection_is_independent() -> None:
    loop = asyncio.get_running_loop()
    queue = JobQueue()
    first, second = _job(loop, "1", connection=1), _job(loop, "1", connection=2)
    queue.submit(first)
    queue.submit(second)
    assert first.cancel_reason is None


async def test_queue_is_bounded() -> None:
    loop = asyncio.get_running_loop()
    queue = JobQueue(max_pending=2)
    queue.submit(_job(loop, "1", uri="a"))
    queue.submit(_job(loop, "2", uri="b"))
    with pytest.raises(BusyError, match="limit 2"):
        queue.submit(_job(loop, "3", uri="c"))


async def test_cancel_by_id_and_by_connection() -> None:
    loop = asyncio.get_running_loop()
    queue = JobQueue()
    a, b, c = _job(loop, "a", uri="1"), _job(loop, "b", uri="2"), _job(loop, "c", uri="3", connection=9)
    for job in (a, b, c):
        queue.submit(job)
    assert queue.cancel_request(1, "a") and not queue.cancel_request(1, "zzz")
    assert a.should_stop() == "cancelled"
    queue.cancel_connection(1)
    assert b.should_stop() == "cancelled" and c.should_stop() is None


async def test_a_job_cancelled_in_the_read_that_brought_it_never_reaches_the_model_thread() -> None:
    """Before: the model thread could take a job the moment it was queued, while the loop was still reading the
    ``Cancel`` that came in the same read; the cancel then raced the denoising steps, and a short canvas won."""
    loop = asyncio.get_running_loop()
    queue = JobQueue()
    taken: list[Job | None] = []
    model_thread = threading.Thread(target=lambda: taken.extend([queue.take(), queue.take()]), daemon=True)
    model_thread.start()
    cancelled, served = _job(loop, "a", uri="1"), _job(loop, "b", uri="2")
    queue.submit(cancelled)
    queue.submit(served)
    assert len(queue) == 2
    model_thread.join(0.2)
    assert taken == []  # not before the loop's next turn
    assert queue.cancel_request(1, "a")
    reply = cancelled.future.result()
    assert isinstance(reply, protocol.Result) and reply.stop is protocol.StopReason.CANCELLED
    await asyncio.sleep(0)
    queue.close()
    model_thread.join(10)
    assert taken == [served, None] and len(queue) == 0


async def test_close_comes_after_the_jobs_already_submitted() -> None:
    loop = asyncio.get_running_loop()
    queue = JobQueue()
    job = _job(loop, "1")
    queue.submit(job)
    queue.close()
    assert [queue.take(), queue.take()] == [job, None]
    await asyncio.sleep(0)  # the scheduled hand-over finds nothing left to hand over
    assert len(queue) == 0


async def test_deadline_stops_the_job() -> None:
    job = _job(asyncio.get_running_loop(), "1", deadline_ms=1)
    await asyncio.sleep(0.01)
    assert job.should_stop() == "deadline"


async def test_a_job_resolves_once() -> None:
    job = _job(asyncio.get_running_loop(), "1")
    job.resolve(protocol.Result(id="1", text="a", stop=protocol.StopReason.EOS))
    job.resolve(protocol.Result(id="1", text="b", stop=protocol.StopReason.EOS))
    assert (await job.future).text == "a"
