"""PlanRuntime: one micro-batch's plan bound to one pool group (collective construction)."""
import time

import torch
import torch.distributed as dist

from .. import _libra
from .exchange import _PHASE_CLASSES, _index_tensors
from .groups import _POOLS
from .ops import register as _register_op


def _fingerprint_words(fp):
    return [int(fp >> 32), int(fp & 0xFFFFFFFF)]


class PlanRuntime:
    """One micro-batch's plan on one pool group, shared by every layer and by backward.

    Construction is collective over ``group``: the ranks exchange their plan
    fingerprints and worker indices, and every rank raises the same one-line
    ValueError when they disagree. The worker's schedule is then precomputed
    as index tensors.
    """

    def __init__(self, plan, group, worker=None, threads=1, trace=False, check_calls=True, schedule=None,
                 exchange="auto"):
        entry = _POOLS.get(id(group))
        if entry is None and worker is None:
            raise ValueError("PlanRuntime: group was not made by libra.torch.pool_group or domain_groups; pass worker=")
        size = dist.get_world_size(group)
        me = entry[1][dist.get_rank(group)] if worker is None else int(worker)
        # Every check below runs on what all ranks gathered, so they all raise the same line.
        mine = torch.tensor(_fingerprint_words(plan.fingerprint) + [me, plan.num_workers], dtype=torch.int64)
        everyone = [torch.zeros(4, dtype=torch.int64) for _ in range(size)]
        dist.all_gather(everyone, mine, group=group)
        fps = [(int(t[0]) << 32) | int(t[1]) for t in everyone]
        peers = [int(t[2]) for t in everyone]
        if len(set(fps)) == 1 and int(everyone[0][3]) != size:
            raise ValueError(f"PlanRuntime: the group has {size} ranks but the plan has {int(everyone[0][3])} workers")
        if len(set(fps)) != 1:
            counts = {}
            for i, f in enumerate(fps):
                counts.setdefault(f, []).append(i)
            parts = "; ".join(f"group ranks {r} hold {f:016x}" for f, r in sorted(counts.items()))
            raise ValueError(f"plan fingerprint mismatch across the pool group: {parts}")
        if sorted(peers) != list(range(size)):
            raise ValueError(f"PlanRuntime: the group's worker indices {peers} are not a permutation of 0..{size - 1}")
        self.plan = plan
        self.group = group
        self.worker = me
        self.threads = threads
        self.check_calls = check_calls
        if exchange not in ("auto", "programs", "index"):
            raise ValueError(f"PlanRuntime: exchange {exchange!r} must be auto, programs or index")
        # How messages are packed: "programs" copies the schedule's runs in C++ (CPU tensors),
        # "index" uses index tensors and torch ops (any device; what CUDA tensors use).
        self.exchange = exchange
        # Chrome trace events of every attention call under this runtime (trace=True): per chunk, the
        # kernel calls (tid 0) and each all-to-all from issue to completion (tid 1).
        self.trace = [] if trace else None
        self._t0 = time.perf_counter()
        self.window = plan.config["window"]
        # libra's per-rank schedule (libra/schedule.hpp), its exchanges expanded to index arrays with
        # the peers in group-rank order (what all_to_all_single's splits follow).
        progs = schedule
        if progs is not None:
            info = progs.info
            if info["order"] != peers or info["worker"] != me or info["fingerprint"] != plan.fingerprint:
                progs = None
        if progs is None:
            progs = _libra.rank_programs(plan, me, peers)
            info = progs.info
        self.programs, self.schedule = progs, info
        self.home_rows, self.heads_q, self.heads_kv = info["home_rows"], info["heads_q"], info["heads_kv"]
        self.head_dim, self.num_chunks = info["head_dim"], info["chunks"]
        self.splits = {(p, m, c): progs.splits(p, m, c)
                       for p, classes in _PHASE_CLASSES.items() for m in range(self.num_chunks) for c in classes}
        self._peers = peers
        self._on = {}
        self._cuda_meta = {}  # _cuda_call_meta's, by (pass, chunk, device)
        # What torch.compile's libra::attention op takes in place of this object (ops.py).
        self.op_handle = _register_op(self)

    def on(self, device):
        """The schedule as index tensors on ``device`` (built once per device; the CUDA path's
        exchanges; CPU tensors use the C++ programs instead)."""
        device = torch.device(device)
        if torch.device("cpu") not in self._on:
            sd = _libra.rank_schedule(self.plan, self.worker, self._peers)
            self._on[torch.device("cpu")] = _index_tensors(sd)
        self.index = self._on[torch.device("cpu")]
        if device not in self._on:
            def move(x):
                if isinstance(x, torch.Tensor):
                    return x.to(device)
                if isinstance(x, dict):
                    return {k: move(v) for k, v in x.items()}
                if isinstance(x, (list, tuple)):
                    return type(x)(move(v) for v in x)
                return x
            self._on[device] = move(self.index)
        return self._on[device]

    @property
    def fingerprint(self):
        return self.plan.fingerprint
