"""Chrome trace events of the attention calls (kernel and all-to-all spans)."""
import contextlib
import json
import os
import time


def _event(rt, name, tid, start, end):
    rt.trace.append({"name": name, "ph": "X", "pid": rt.worker, "tid": tid,
                     "ts": round((start - rt._t0) * 1e6, 1), "dur": round((end - start) * 1e6, 1)})


@contextlib.contextmanager
def _compute(rt, name):
    if rt.trace is None:
        yield
        return
    start = time.perf_counter()
    yield
    _event(rt, name, 0, start, time.perf_counter())


def _watch(rt, work, name):
    """Records an async collective from its issue to its completion (its future's callback)."""
    if rt.trace is not None:
        start = time.perf_counter()
        work.get_future().then(lambda _f: _event(rt, name, 1, start, time.perf_counter()))
    return rt._deadline(work, name)  # its wait() is bounded by the runtime's timeout


def write_trace(path, events):
    """Writes Chrome trace-event JSON (chrome://tracing, Perfetto) of events gathered from the ranks."""
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    os.replace(tmp, path)
