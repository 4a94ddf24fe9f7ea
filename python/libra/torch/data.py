"""The DataLoader side: a batch sampler that hands each DP replica its VRSP-placed
packed sequence for every GA step."""
import threading

import torch

from .. import _libra


class PlacementBatchSampler(torch.utils.data.Sampler):
    """A batch sampler that yields ``[index]``: this DP replica's packed sequence for every GA step, VRSP order.

    Batch n is GA index ``n % (gbs/dp)`` of optimizer step ``n // (gbs/dp)``;
    ``pool(n)`` gives the P packed sequences of that batch's pool in slot
    order (what the plan is made from). The order is a pure function of
    (sequences, gbs, dp, pool_size, mode, seed): ``state_dict()`` holds only
    the position, and ``load_state_dict`` resumes from it.
    """

    def __init__(self, sequences, gbs, dp, pool_size, dp_rank, mode="vrsp", seed=0):
        self._core = _libra.PlacementSampler(sequences, gbs, dp, pool_size, mode, seed)
        if not 0 <= dp_rank < dp:
            raise ValueError(f"PlacementBatchSampler: dp_rank {dp_rank} must be in [0, {dp})")
        self.gbs, self.dp, self.pool_size, self.dp_rank = gbs, dp, pool_size, dp_rank
        self.ga_steps = gbs // dp
        self._position = 0
        self._step_cache = (None, None)
        self._lock = threading.Lock()

    def __len__(self):
        return self._core.num_steps * self.ga_steps

    @property
    def num_steps(self):
        return self._core.num_steps

    def _order(self, step):
        with self._lock:
            if self._step_cache[0] != step:
                self._step_cache = (step, self._core.at(step)["order"])
            return self._step_cache[1]

    def _check(self, n):
        if not 0 <= n < len(self):
            raise ValueError(f"PlacementBatchSampler: batch {n} must be in [0, {len(self)})")

    def index(self, n):
        """Index of the packed sequence this replica trains on in batch n."""
        self._check(n)
        step, ga = divmod(n, self.ga_steps)
        return int(self._order(step)[ga * self.dp + self.dp_rank])

    def pool_indices(self, n):
        """Indices of the P sequences of batch n's pool, in slot order (slot = dp_rank % P)."""
        self._check(n)
        step, ga = divmod(n, self.ga_steps)
        order = self._order(step)
        first = ga * self.dp + (self.dp_rank // self.pool_size) * self.pool_size
        return [int(i) for i in order[first:first + self.pool_size]]

    def pool(self, n):
        """The packed sequences (lists of sample lengths) of batch n's pool, in slot order."""
        return [self._core.sequence(i) for i in self.pool_indices(n)]

    def sequence(self, i):
        return self._core.sequence(i)

    def __iter__(self):
        while self._position < len(self):
            n = self._position
            self._position += 1
            yield [self.index(n)]

    def state_dict(self):
        return {"position": self._position}

    def load_state_dict(self, state):
        pos = state.get("position") if isinstance(state, dict) else None
        if not isinstance(pos, int) or not 0 <= pos <= len(self):
            raise ValueError(f"PlacementBatchSampler state: position must be an integer in [0, {len(self)}]")
        self._position = pos
