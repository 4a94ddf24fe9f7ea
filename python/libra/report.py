"""The report of an executor run, as ``libra exec`` makes it: statistics over ranks, the check's verdict, JSON.

The numbers come from libra's C++ report (src/exec/harness.hpp, "the report of a run"), so a Python runner
and the CLI print the same document for the same results:

    import libra.report
    rep = libra.report.exec_report(
        run=dict(mode="tap", seq_len=512, cp=2, chunks=2, heads_q=4, heads_kv=2, head_dim=16, dtype="bf16",
                 source="pool.jsonl", ranks=4, pool_ranks=4, pool_size=2),
        timings=dict(forward_wall=[...], forward_compute=[...], backward_wall=[...],      # per rank, seconds
                     backward_compute=[...], forward_own=[...], backward_own=[...]),
        pools=[dict(pool=0, samples=9, tokens_per_slot=[512, 512],
                    errors={"O": (max_abs, max_ref), "LSE": ..., "dQ": ..., "dK": ..., "dV": ...})])
    rep["document"]["check"]["within_tolerance"], rep["check"]["first_failed"], rep["wall_overhead"]

``timings`` values may also be ``{"max": ..., "mean": ...}`` already reduced over the ranks; a pool is planned
(its ``tiles``, ``imbalance``, ``comm_bytes`` reported) when it has ``tiles``. ``tolerance`` None applies the
element type's tolerances (``exec_tolerance``), a number one for every tensor (``libra exec --check-tolerance``).
Bad input raises ValueError with one line naming the key.
"""
import json as _json

from . import _libra

__all__ = ["exec_report", "exec_tolerance", "own_cpu_fraction"]


def exec_report(run, timings, pools, *, check=True, tolerance=None):
    """The report of a run: ``json`` (the text of ``libra exec --json``), ``document`` (it parsed),
    ``timings`` ({"max", "mean"} per key), ``wall_overhead`` (forward, backward) and ``check`` (None
    without a check, else ``ok``, ``first_failed`` and per tensor max_abs, max_ref, relative, tolerance, ok)."""
    out = _libra.exec_report(dict(run), dict(timings), list(pools), bool(check), tolerance)
    out["document"] = _json.loads(out["json"])
    return out


def exec_tolerance(dtype):
    """The relative tolerance per tensor (O, LSE, dQ, dK, dV) ``libra exec --check`` applies for ``dtype``."""
    return _libra.exec_tolerance(dtype)


def own_cpu_fraction(cpu, kernel_cpu):
    """A rank's executor CPU time outside the kernel over its kernel CPU time (0 without kernel time)."""
    return _libra.own_cpu_fraction(cpu, kernel_cpu)
