"""libra: attention-workload balancing for long-context training, from Python.

The core (this module) is torch-free: corpus readers, sequence placement
(VRSP), the planner (SH-Tiles, TAP, exchange, chunks) with immutable,
fingerprinted, picklable plans, plan files and the configuration simulator,
all running libra's C++ code. ``libra.torch`` adds the PyTorch integration
(process groups, the DataLoader sampler, the plan runtime and ``attention``).

    import libra
    seqs = libra.load_packed_sequences("builtin:paper-256k")
    w = libra.place_window(seqs[:16], pool_size=4)          # pools, loads, imbalance, lower_bound
    plan = libra.make_plan([seqs[i] for i in w["pools"][0]], seq_len=262144, cp=8,
                           block_size=8192, head_shards=8, heads_q=32, heads_kv=4,
                           head_dim=128, chunks=4)
    plan.fingerprint, plan.worker_flops, plan.byte_matrix

Bad arguments raise ValueError carrying libra's one-line message; the GIL is
released while libra plans, simulates, reads files or runs the kernel.
"""
import json as _json

try:  # installed: the extension sits inside the package
    from . import _libra
except ImportError:  # source tree: python/ and build/<preset>/python on sys.path
    import _libra

__version__ = "0.1.0"


class ArgumentError(ValueError, TypeError):
    """An argument of the wrong type: one line naming the call, the types given and the signature.

    A ValueError like every other bad argument, and a TypeError for code that
    already catches pybind11's own error.
    """


def _type_name(value):
    return type(value).__name__


def _one_line_type_errors(fn):
    # pybind11 reports a type mismatch in several lines and echoes every argument
    # (a pool of a million samples included); libra's rule is one bounded line.
    name = fn.__name__

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            text = str(e)
            if "incompatible function arguments" not in text:
                raise
            given = ", ".join([_type_name(a) for a in args] + [f"{k}={_type_name(v)}" for k, v in kwargs.items()])
            expected = " | ".join(line.strip().split(". ", 1)[-1] for line in text.splitlines()
                                  if line.strip()[:1].isdigit())
            raise ArgumentError(f"{name}(): arguments of types ({given}) do not match {expected}") from None

    call.__name__ = name
    call.__qualname__ = name
    call.__doc__ = fn.__doc__
    return call


FULL_CAUSAL = _libra.FULL_CAUSAL
Plan = _libra.Plan
PlacementSampler = _libra.PlacementSampler
builtin_corpora = _one_line_type_errors(_libra.builtin_corpora)
corpus_stats = _one_line_type_errors(_libra.corpus_stats)
load_lengths = _one_line_type_errors(_libra.load_lengths)
load_packed_sequences = _one_line_type_errors(_libra.load_packed_sequences)
load_plan = _one_line_type_errors(_libra.load_plan)
make_plan = _one_line_type_errors(_libra.make_plan)
pack = _one_line_type_errors(_libra.pack)
place_window = _one_line_type_errors(_libra.place_window)
plan_from_bytes = _one_line_type_errors(_libra.plan_from_bytes)
plan_from_json = _one_line_type_errors(_libra.plan_from_json)
sequence_workloads = _one_line_type_errors(_libra.sequence_workloads)

# Transfer kinds in Plan.transfers()["kind"].
TRANSFER_Q, TRANSFER_KV, TRANSFER_O = 0, 1, 2


def simulate(config=None):
    """Runs the configuration simulator; returns what `libra simulate --json` prints, as a dict.

    ``config`` holds the keys of ``libra simulate --config FILE`` (e.g.
    ``{"source": "builtin:paper-256k", "pool_sizes": [4, 8], "windows": 2}``).
    """
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ValueError("simulate config: must be a dict of `libra simulate --config` keys")
    return _json.loads(_libra.simulate_json(_json.dumps(config)))


__all__ = [
    "ArgumentError", "FULL_CAUSAL", "Plan", "PlacementSampler", "builtin_corpora", "corpus_stats", "load_lengths",
    "load_packed_sequences", "load_plan", "make_plan", "pack", "place_window", "plan_from_bytes",
    "plan_from_json", "sequence_workloads", "simulate", "TRANSFER_Q", "TRANSFER_KV", "TRANSFER_O",
]
