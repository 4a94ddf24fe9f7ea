"""Timing of a forward and a backward, as libra's benchmarks and examples report it: the median of
``reps`` timed repetitions after one untimed warm-up (first calls build caches, plans, kernels).

    from libra.torch.timing import fwd_bwd_medians
    fwd_s, bwd_s = fwd_bwd_medians(lambda: lt.attention(q, k, v, rt), lambda o: o.backward(do), reps=5)

``prepare`` runs untimed ahead of every repetition (a barrier; fresh leaf tensors for ``forward``
to read); ``warmed`` runs once after the warm-up (clearing a
trace so that it holds the timed runs only); ``clock`` is time.perf_counter (wall) unless given
(time.thread_time: this thread's CPU time).
"""
import statistics
import time


def fwd_bwd_medians(forward, backward, reps, clock=time.perf_counter, prepare=None, warmed=None):
    """(median seconds of ``forward()``, median seconds of ``backward(its result)``) over
    ``reps`` repetitions after one warm-up."""
    if reps < 1:
        raise ValueError(f"libra.torch.timing: reps {reps}: must be at least 1")
    fwd, bwd = [], []
    for rep in range(reps + 1):
        if prepare is not None:
            prepare()
        t0 = clock()
        out = forward()
        t1 = clock()
        backward(out)
        t2 = clock()
        if rep:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
        elif warmed is not None:
            warmed()
    return statistics.median(fwd), statistics.median(bwd)
