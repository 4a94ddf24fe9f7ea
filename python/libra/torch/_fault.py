"""The named points where the fault-injection tests (tests/python/test_faults.py) make one rank fail,
stop or fail an allocation, as src/core/fault.hpp does for the C++ engine: ``before-post`` (a pass,
before its first exchange is posted), ``mid-pass`` (just after it), ``kernel`` (a chunk's compute,
before the backend runs) and ``output`` (the pass's results complete, before they are handed back).
Only those tests install a hook; otherwise each point is one module-global check."""

hook = None  # hook(point, runtime): whatever it raises, or does, happens at that point


def point(name, rt):
    if hook is not None:
        hook(name, rt)
