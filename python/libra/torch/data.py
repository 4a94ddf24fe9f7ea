"""The DataLoader side: a batch sampler that hands each DP replica its VRSP-placed
packed sequence for every GA step, one epoch at a time."""
import collections
import threading

import numpy as np
import torch

from .. import PlacementSampler, _integer, _pricing_json, _refuse, priced_placement_sampler


# What PlacementBatchSampler.domain(n) returns for a replica whose pool is fused in batch n.
Domain = collections.namedtuple("Domain", ["index", "pools", "positions", "slot", "indices"])
Domain.__doc__ = """A fused vrsp-elastic domain of one batch: ``index`` (in the window's ``domains``),
``pools`` (window pool indices, increasing), ``positions`` (those pools' places in their GA step,
pool % (dp/P): what ``DomainGroups.of`` takes), ``slot`` (this replica's slot in the domain: slot s
is slot s % P of pool pools[s // P]) and ``indices`` (the domain's len(pools) * P sequences in slot
order, what make_plan takes)."""


class BatchIndex(int):
    """The index (into the sequences given) of a packed sequence, as ``PlacementBatchSampler`` yields it:
    an int that also carries the batch it was drawn for, ``epoch`` and ``batch`` (n of that epoch), so
    a dataset can hand the key on with the sample and the training loop take ``planner.runtime(batch)``
    from the batch itself instead of from a counter (which resuming or skipping batches puts off)."""

    def __new__(cls, index, epoch, batch):
        self = super().__new__(cls, index)
        self.epoch, self.batch = int(epoch), int(batch)
        return self

    def __reduce__(self):  # DataLoader workers receive it pickled
        return BatchIndex, (int(self), self.epoch, self.batch)

    def __repr__(self):
        return f"BatchIndex({int(self)}, epoch={self.epoch}, batch={self.batch})"


class PlacementBatchSampler(torch.utils.data.Sampler):
    """A batch sampler that yields ``[index]``: this DP replica's packed sequence for every GA step, VRSP order.

    Batch n is GA index ``n % (gbs/dp)`` of optimizer step ``n // (gbs/dp)``;
    ``pool(n)`` gives the P packed sequences of that batch's pool in slot
    order (what the plan is made from). Like ``DistributedSampler``, call
    ``set_epoch(e)`` before each epoch: epoch 0 takes the sequences in the
    order given, epoch e > 0 a permutation of them drawn from (seed, e), the
    same on every rank; VRSP then places each window of ``gbs`` sequences.
    The order is a pure function of (sequences, gbs, dp, pool_size, mode,
    seed, epoch, elastic_*): ``state_dict()`` holds the epoch and the position in it, and
    ``load_state_dict`` resumes from them. An epoch's iteration ends where the
    epoch does; iterating again yields nothing until ``set_epoch`` moves on.
    Each index is a ``BatchIndex``: it says which batch (epoch, n) it was drawn for, so the
    batch can name its plan itself (``planner.runtime(index.batch)``) after resuming or skipping.

    With ``mode="vrsp-elastic"`` (docs/elastic.md) a batch's pool may be fused with other pools of
    its GA step into one TAP domain: ``domain(n)`` says which (None when this replica's pool runs
    alone) and ``plan_pool(n)`` gives the sequences to plan, the domain's when fused.
    ``elastic_k``, ``elastic_threshold`` and ``elastic_rule`` are those of libra.place_window, and so
    are ``interleave_cp`` and ``interleave_gpus_per_node``: every pool's slots in node-interleaved
    order (a pool's heaviest sequences on different nodes; what ``libra simulate``'s libra-topo
    plans), which ``index``, ``pool`` and the plans made from them all follow.
    With ``elastic_pricing=`` (a dict of ``libra simulate --config`` keys: seq_len required, cp,
    hardware, network, head_shards, block_sizes) a window fuses only where the cost model predicts
    its optimizer step faster than VRSP's, the decision ``libra simulate --elastic`` reports for
    that window (libra.priced_placement_sampler); without it, whenever a pool is above the threshold.
    """

    def __init__(self, sequences, gbs, dp, pool_size, dp_rank, mode="vrsp", seed=0, elastic_k=2,
                 elastic_threshold=0.05, elastic_rule="buddy", elastic_pricing=None, interleave_cp=0,
                 interleave_gpus_per_node=0):
        where = "PlacementBatchSampler:"
        gbs, dp, pool_size, dp_rank, seed = (_integer(f"{where} {n}", v) for n, v in (
            ("gbs", gbs), ("dp", dp), ("pool_size", pool_size), ("dp_rank", dp_rank), ("seed", seed)))
        for name, v in (("gbs", gbs), ("dp", dp), ("pool_size", pool_size)):
            if v < 1:
                _refuse(f"{where} {name} {v}: must be >= 1")
        if not 0 <= seed < 2 ** 64:
            _refuse(f"{where} seed {seed}: must be in [0, 2**64)")
        if not isinstance(mode, str):
            _refuse(f"{where} mode {mode!r}: must be a string (vrsp, ...)")
        if not 0 <= dp_rank < dp:
            _refuse(f"{where} dp_rank {dp_rank}: must be in [0, dp = {dp})")
        self._args = (gbs, dp, pool_size, mode, seed)
        self._elastic = dict(elastic_k=elastic_k, elastic_threshold=elastic_threshold, elastic_rule=elastic_rule)
        # Node-interleaved slots (libra.place_window): every pool's order, so the replica that loads a
        # sequence and the plan's slot of it agree.
        self._interleave = dict(interleave_cp=interleave_cp, interleave_gpus_per_node=interleave_gpus_per_node)
        self._pricing = None
        if elastic_pricing is not None:
            if mode != "vrsp-elastic":
                _refuse(f"{where} elastic_pricing: only with mode 'vrsp-elastic' (the mode is {mode!r})")
            if interleave_cp or interleave_gpus_per_node:
                _refuse(f"{where} elastic_pricing: not with a node-interleaved slot order (mode vrsp-elastic fixes it)")
            _pricing_json(elastic_pricing, where.rstrip(":"))  # one line now, not at the first batch
            self._pricing = dict(elastic_pricing)
        self.mode = mode
        self._sequences = sequences
        self._core = self._make(sequences)
        self._given = self._core  # epoch 0: indices are the caller's; it also serves sequence(i)
        self.gbs, self.dp, self.pool_size, self.dp_rank, self.seed = gbs, dp, pool_size, dp_rank, seed
        self.ga_steps = gbs // dp
        self.epoch = 0
        self._perm = None  # epoch > 0: the caller's index of each position in this epoch's order
        self._position = 0
        self._step_cache = (None, None)
        self._lock = threading.Lock()

    def _make(self, sequences):
        try:
            if self._pricing is not None:
                gbs, dp, pool_size, _, seed = self._args
                return priced_placement_sampler(sequences, gbs, dp, pool_size, self._pricing, seed, **self._elastic)
            return PlacementSampler(sequences, *self._args, **self._elastic, **self._interleave)
        except ValueError as e:
            raise ValueError(f"PlacementBatchSampler: {e}") from None

    def __len__(self):
        return self._core.num_steps * self.ga_steps

    @property
    def num_steps(self):
        return self._core.num_steps

    def set_epoch(self, epoch):
        """Selects the epoch the next iteration covers (its order: epoch 0 as given, later ones a
        permutation drawn from (seed, epoch)). A new epoch starts at its first batch; setting the
        current epoch again keeps the position, so a resumed run's ``set_epoch`` does not rewind."""
        epoch = _integer("PlacementBatchSampler.set_epoch(): epoch", epoch)
        if epoch < 0:
            _refuse(f"PlacementBatchSampler.set_epoch(): epoch {epoch}: must be >= 0")
        if epoch == self.epoch:
            return
        self._switch(epoch)
        self._position = 0

    def _switch(self, epoch):
        if epoch == 0:
            perm, core = None, self._given
        else:
            # numpy's PCG64 seeded by (seed, epoch): the same permutation on every rank, and two
            # seeds never share an epoch's order (seed + epoch would).
            n = self._given.num_sequences
            perm = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(n)
            seqs = [self._given.sequence(int(i)) for i in perm]
            core = self._make(seqs)
        with self._lock:
            self.epoch, self._perm, self._core = epoch, perm, core
            self._step_cache = (None, None)

    def _step(self, step):
        """(order as caller indices, the window's domains) of optimizer step `step`, cached."""
        with self._lock:
            if self._step_cache[0] != step:
                at = self._core.at(step)
                order = at["order"]
                layout = {(int(g), int(f)): q for q, (g, f) in enumerate(zip(at["pool_ga"], at["pool_first_replica"]))}
                self._step_cache = (step, (order if self._perm is None else self._perm[order],
                                           [list(map(int, d)) for d in at["domains"]],
                                           list(zip(map(int, at["pool_ga"]), map(int, at["pool_first_replica"]))),
                                           layout))
            return self._step_cache[1]

    def _order(self, step):
        return self._step(step)[0]

    def _check(self, n):
        n = _integer("PlacementBatchSampler: batch", n)
        if not 0 <= n < len(self):
            raise ValueError(f"PlacementBatchSampler: batch {n} must be in [0, {len(self)})")
        return n

    def index(self, n):
        """Index (into the sequences given) of the packed sequence this replica trains on in batch n
        of the current epoch."""
        n = self._check(n)
        step, ga = divmod(n, self.ga_steps)
        return int(self._order(step)[ga * self.dp + self.dp_rank])

    def pool_indices(self, n):
        """Indices of the P sequences of batch n's pool, in slot order (slot = dp_rank % P)."""
        n = self._check(n)
        step, ga = divmod(n, self.ga_steps)
        order = self._order(step)
        first = ga * self.dp + (self.dp_rank // self.pool_size) * self.pool_size
        return [int(i) for i in order[first:first + self.pool_size]]

    def pool(self, n):
        """The packed sequences (lists of sample lengths) of batch n's pool, in slot order."""
        return [self._given.sequence(i) for i in self.pool_indices(n)]

    def domain(self, n):
        """The fused domain this replica's pool belongs to in batch n (a ``Domain``), or None when
        its pool runs alone (every mode but vrsp-elastic, and unfused pools)."""
        n = self._check(n)
        step, ga = divmod(n, self.ga_steps)
        order, domains, where, pool_at = self._step(step)
        P = self.pool_size
        pool = pool_at[(ga, self.dp_rank // P * P)]
        for j, d in enumerate(domains):
            if pool in d and len(d) > 1:
                # S' holds pool q at replicas [first, first + P) of its GA index (the step's layout).
                idx = [int(order[where[q][0] * self.dp + where[q][1] + s]) for q in d for s in range(P)]
                slot = d.index(pool) * P + self.dp_rank % P
                return Domain(j, d, [where[q][1] // P for q in d], slot, idx)
        return None

    def plan_indices(self, n):
        """Indices of the sequences batch n's plan is made of: the fused domain's in slot order, else
        the pool's."""
        d = self.domain(n)
        return self.pool_indices(n) if d is None else d.indices

    def plan_pool(self, n):
        """The packed sequences batch n's plan is made of (``plan_indices``)."""
        return [self._given.sequence(i) for i in self.plan_indices(n)]

    def sequence(self, i):
        return self._given.sequence(i)

    def __iter__(self):
        while self._position < len(self):
            n = self._position
            self._position += 1
            yield [BatchIndex(self.index(n), self.epoch, n)]

    def state_dict(self):
        return {"epoch": self.epoch, "position": self._position}

    def load_state_dict(self, state):
        """Resumes at ``state`` (from ``state_dict``; a state without "epoch" is epoch 0)."""
        where = "PlacementBatchSampler state"
        if not isinstance(state, dict):
            _refuse(f"{where}: must be a dict with position (and epoch), got a {type(state).__name__}")
        extra = sorted(set(map(str, state)) - {"epoch", "position"})
        if extra:
            _refuse(f"{where}: unknown key {extra[0]!r} (it holds epoch and position)")
        if "position" not in state:
            _refuse(f"{where}: position is missing")
        pos, epoch = state["position"], state.get("epoch", 0)
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos <= len(self):
            _refuse(f"{where}: position {pos!r}: must be an integer in [0, {len(self)}]")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            _refuse(f"{where}: epoch {epoch!r}: must be an integer >= 0")
        if epoch != self.epoch:
            self._switch(epoch)
        self._position = pos


class PlacementDataLoader(torch.utils.data.DataLoader):
    """A DataLoader over a ``PlacementBatchSampler`` (``batch_sampler=``) whose ``set_epoch`` reaches the
    sampler: what transformers' Trainer and accelerate call on the loader at each epoch. A plain
    DataLoader has no ``set_epoch``, and the sampler, which yields nothing once an epoch is done, would
    never move on to the next epoch."""

    def __init__(self, dataset, batch_sampler, **kwargs):
        if not isinstance(batch_sampler, PlacementBatchSampler):
            _refuse(f"PlacementDataLoader: batch_sampler must be a libra.torch.PlacementBatchSampler, got "
                    f"{type(batch_sampler).__name__}")
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)

    def set_epoch(self, epoch):
        self.batch_sampler.set_epoch(epoch)
