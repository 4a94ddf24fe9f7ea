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
import math as _math
import operator as _operator

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


def _split_top(text):
    """Splits a pybind11 signature's parameter list at the commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _parameters(fn):
    """[(name, declared type)] from the first line of a pybind11 docstring, in order (`*` dropped)."""
    head = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
    if "(" not in head:
        return []
    inner = head[head.index("(") + 1:head.rindex(")")] if ")" in head else ""
    out = []
    for part in _split_top(inner):
        if part in ("*", "/") or ":" not in part:
            continue
        name, rest = part.split(":", 1)
        out.append((name.strip(), rest.split("=", 1)[0].strip()))
    return out


# C++ widths pybind11's signatures do not show: every other integer argument is 64-bit (seed unsigned).
_INT32 = {"make_plan": {"cp", "head_shards", "heads_q", "heads_kv", "head_dim", "chunks"}}
_UNSIGNED = {"seed"}


def _a(noun):
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def _is_bool(value):
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and getattr(value, "dtype", None) is not None
                                       and value.dtype.kind == "b" and getattr(value, "ndim", 1) == 0)


def _check_value(call, name, declared, value):
    """One line for an argument pybind11 would take silently (a bool as a number, a number or None as a
    bool, bytes as a str) or misreport (an int out of its C++ range reads as a type mismatch); None
    when it is fine or pybind11's to judge."""
    if declared == "bool":
        return None if _is_bool(value) else f"{call}(): {name} {value!r}: must be True or False, not {_a(_type_name(value))}"
    if declared == "str" and isinstance(value, (bytes, bytearray)):
        return f"{call}(): {name} {value!r}: must be a str, not {_type_name(value)}"
    numeric = any(t in declared for t in ("int", "float"))
    if isinstance(value, bool):
        if numeric:
            kind = "a number" if "float" in declared else "an integer"
            return f"{call}(): {name} {value}: must be {kind}, not a bool"
        return None
    if declared.startswith("List[int]") and isinstance(value, (list, tuple)):
        for i, x in enumerate(value):
            if isinstance(x, bool):
                return f"{call}(): {name}[{i}] {x}: must be an integer, not a bool"
        return None
    if "int" in declared and isinstance(value, int):
        # A Plan's methods take C++ int indices (tile, chunk, worker).
        bits = 32 if name in _INT32.get(call, ()) or call.startswith("Plan.") else 64
        lo, hi = (0, 2 ** 64 - 1) if name in _UNSIGNED else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
        if not lo <= value <= hi:
            return f"{call}(): {name} {value}: out of range, must be in [{lo}, {hi}]"
    return None


def _one_line_type_errors(fn, name=None):
    # pybind11 reports a type mismatch in several lines and echoes every argument
    # (a pool of a million samples included); libra's rule is one bounded line. Bools and integers
    # out of their C++ range are refused here, before pybind11 reads True as 1 or calls 2**31 a type.
    name = name or fn.__name__
    params = _parameters(fn)
    by_name = dict(params)

    def call(*args, **kwargs):
        named = list(zip([p for p, _ in params], args)) + list(kwargs.items())
        for arg, value in named:
            if arg in by_name:
                problem = _check_value(name, arg, by_name[arg], value)
                if problem:
                    raise ValueError(problem)
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            text = str(e)
            if "incompatible function arguments" not in text and "incompatible constructor arguments" not in text:
                raise
            given = ", ".join([_type_name(a) for a in args] + [f"{k}={_type_name(v)}" for k, v in kwargs.items()])
            expected = " | ".join(line.strip().split(". ", 1)[-1] for line in text.splitlines()
                                  if line.strip()[:1].isdigit())
            raise ArgumentError(f"{name}(): arguments of types ({given}) do not match {expected}") from None

    call.__name__ = name
    call.__qualname__ = name
    call.__doc__ = fn.__doc__
    return call


class PlacementSampler(_libra.PlacementSampler):
    """libra's placement sampler: ``at(step)`` is GA step ``step``'s VRSP placement of its window.

    The binding's class, with its arguments checked in one line (bools, ranges, types) like every
    other call of this module.
    """

    _init = _one_line_type_errors(_libra.PlacementSampler.__init__, "PlacementSampler")

    def __init__(self, *args, **kwargs):
        PlacementSampler._init(self, *args, **kwargs)

    def at(self, step):
        return _libra.PlacementSampler.at(self, _integer("PlacementSampler.at(): step", step))


def _integer(what, value):
    """value as an int (Python or numpy integers), else one line: bools and floats are refused."""
    if not isinstance(value, bool):
        try:
            return _operator.index(value)
        except TypeError:
            pass
    return _refuse(f"{what} {value!r}: must be an integer, not a {_type_name(value)}")


def _refuse(message):
    raise ValueError(message)


FULL_CAUSAL = _libra.FULL_CAUSAL
Plan = _libra.Plan
# The Plan's methods that take arguments, checked like the module's calls (a float or None index was a
# 4-line pybind11 TypeError, True read as 0 or 1, 2**63 a type mismatch).
for _method in ("worker_tiles", "worker_groups", "transfers", "chunk_transfers", "chunk_heads", "save"):
    setattr(Plan, _method, _one_line_type_errors(getattr(_libra.Plan, _method), f"Plan.{_method}"))
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
plan_relays = _one_line_type_errors(_libra.plan_relays)
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
    problem = _json_problem(config, "simulate config")
    if problem:
        raise ValueError(problem)
    return _json.loads(_libra.simulate_json(_json.dumps(config, allow_nan=False)))


# Set by the sampler, not by a pricing configuration.
_PRICING_OWN_KEYS = ("source", "gbs", "dp", "pool_sizes", "windows")


def _pricing_json(pricing, where):
    """A pricing configuration (a dict of ``libra simulate --config`` keys, plus ``plan_mode``) as
    (JSON text of the simulate keys, plan mode), or one line."""
    if not isinstance(pricing, dict):
        _refuse(f"{where}: elastic pricing: must be a dict of `libra simulate --config` keys "
                f"(seq_len required), got a {_type_name(pricing)}")
    for key in _PRICING_OWN_KEYS:
        if key in pricing:
            _refuse(f"{where}: elastic pricing: {key}: set by the sampler, not the pricing configuration")
    problem = _json_problem(pricing, "elastic pricing")
    if problem:
        _refuse(f"{where}: {problem}")
    config = dict(pricing)
    plan_mode = config.pop("plan_mode", "tap")
    if plan_mode not in ("tap", "tap-topo"):
        _refuse(f"{where}: elastic pricing: plan_mode {plan_mode!r}: must be 'tap' or 'tap-topo'")
    return _json.dumps(config, allow_nan=False), plan_mode


def priced_placement_sampler(sequences, gbs, dp, pool_size, pricing, seed=0, elastic_k=2, elastic_threshold=0.05,
                             elastic_rule="buddy"):
    """A vrsp-elastic ``PlacementSampler`` whose windows fuse pools only where the cost model
    predicts the optimizer step faster: the decision of ``libra simulate --elastic`` (the same C++
    function, libra::ElasticPricer), step s priced as the simulator's window s, so every rank and
    the simulator's per-window report agree. ``pricing`` holds the ``libra simulate --config`` keys
    of the machine and model: ``seq_len`` (required: the packed length L), ``cp``, ``hardware``,
    network keys (``congestion_per_node``, ``inter_supernode_gbps``, ...), ``head_shards`` and
    ``block_sizes`` (one value each; default 8 and 16384), ``chunks``, ``tau``, and ``plan_mode``
    (the tile placement the job plans with: "tap", the default, or "tap-topo"); gbs, dp and the pool
    size are the sampler's. Buddy domains sit on that topology (libra::buddy_domain_starts); give
    ``libra.torch.domain_groups`` the same ``pricing``. docs/elastic.md."""
    config, plan_mode = _pricing_json(pricing, "priced_placement_sampler")
    # Looked up per call: a package newer than its extension still imports.
    make = _one_line_type_errors(_libra.priced_placement_sampler, "priced_placement_sampler")
    return make(sequences, gbs, dp, pool_size, seed, elastic_k, elastic_threshold, elastic_rule, config, plan_mode)


def _json_problem(value, where):
    """What in a dict the simulator would read as JSON cannot be JSON (NaN, inf, sets, objects), in
    one line naming the key; None when it is all JSON."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{where}: key {k!r}: must be a string"
            problem = _json_problem(v, f"{where}: {k}" if where == "simulate config" else f"{where}.{k}")
            if problem:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            problem = _json_problem(v, f"{where}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(value, float) and not _math.isfinite(value):
        return f"{where} {value}: must be a finite number"
    if value is None or isinstance(value, (str, int, float)):
        return None
    return f"{where}: a {_type_name(value)} is not a JSON value"


__all__ = [
    "ArgumentError", "FULL_CAUSAL", "Plan", "PlacementSampler", "builtin_corpora", "corpus_stats", "load_lengths",
    "load_packed_sequences", "load_plan", "make_plan", "pack", "place_window", "plan_from_bytes",
    "plan_from_json", "plan_relays", "priced_placement_sampler", "sequence_workloads", "simulate", "TRANSFER_Q",
    "TRANSFER_KV", "TRANSFER_O",
]
