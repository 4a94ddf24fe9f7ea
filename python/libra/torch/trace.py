"""The attention calls' trace in the C++ engine's one format (libra::trace_document, libra/executor.hpp):
per chunk a compute span (lane 0), each exchange from its post to the end of its wait (lane 1) and
the wait itself (lane 2), in microseconds of the steady clock the C++ TraceRecorder reads. The
binding writes the file, so both engines' traces are the same schema."""
import contextlib
import os
import time

from .. import _libra

COMPUTE, TRANSFER, WAIT = 0, 1, 2  # TraceRecorder::Lane


def now_us():
    """CLOCK_MONOTONIC, the C++ TraceRecorder's default origin: one time line for every process."""
    return time.monotonic_ns() / 1e3


def _record(rt, name, lane, begin, end):
    rt.trace.append((rt.worker, name, lane, begin, end))


@contextlib.contextmanager
def _compute(rt, name):
    if rt.trace is None:
        yield
        return
    start = now_us()
    yield
    _record(rt, name, COMPUTE, start, now_us())


class _Traced:
    """A posted exchange whose wait records the transfer (post to end of wait) and the wait."""

    def __init__(self, rt, work, name, posted):
        self.rt, self.work, self.name, self.posted = rt, work, name, posted

    def wait(self):
        start = now_us()
        self.work.wait()
        end = now_us()
        _record(self.rt, "wait " + self.name, WAIT, start, end)
        _record(self.rt, self.name, TRANSFER, self.posted, end)
        return True


def _watch(rt, work, name, trace_name):
    """``work`` with the runtime's deadline (its wait() names a silent rank as ``name``), traced as
    ``trace_name`` when the runtime traces."""
    timed = rt._deadline(work, name)
    return timed if rt.trace is None else _Traced(rt, timed, trace_name, now_us())


def write_trace(path, events):
    """Writes the trace file (Chrome trace-event JSON: chrome://tracing, Perfetto) of events gathered
    from the ranks' ``PlanRuntime(trace=True).trace``: (rank, name, lane, begin_us, end_us)."""
    text = _libra.trace_json([tuple(e) for e in events])
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
