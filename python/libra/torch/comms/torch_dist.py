"""torch.distributed process groups (gloo, NCCL, ...): one process per worker."""
import datetime
import time

import torch
import torch.distributed as dist

from . import Communicator


def _wire(x):
    """gloo has no bf16: send 16-bit floats as their bytes (rows stay rows)."""
    return x.view(torch.uint8) if x.dtype in (torch.bfloat16, torch.float16) else x


class TorchDist(Communicator):
    name = "torch-dist"

    def owns(self, group):
        return isinstance(group, dist.ProcessGroup)

    def active(self):
        return dist.is_available() and dist.is_initialized()

    def world(self):
        return dist.get_world_size(), dist.get_rank()

    def new_group(self, ranks):
        return dist.new_group(ranks)

    def size(self, group):
        return dist.get_world_size(group)

    def rank(self, group):
        return dist.get_rank(group)

    def world_ranks(self, group):
        return dist.get_process_group_ranks(group)

    def all_to_all(self, out, inp, out_splits, in_splits, group):
        return dist.all_to_all_single(_wire(out), _wire(inp), list(out_splits), list(in_splits), group=group,
                                      async_op=True)

    def all_gather(self, outs, inp, group):
        return dist.all_gather(outs, inp, group=group, async_op=True)

    def set_timeout(self, group, seconds):
        # The backend's own timeout ends a collective whose peer is silent; a wait's deadline alone would
        # leave the collective pending in gloo's thread, and the process would hang on exit until it ends.
        try:
            group.set_timeout(datetime.timedelta(seconds=seconds))
            return True
        except (AttributeError, RuntimeError):
            return False

    def silent(self, group, work, seq, timeout):
        # Every rank that gave up on the collective leaves a mark in the group's store, then waits up to
        # `timeout` for the others' marks (their deadlines run from their own posts); the ranks that left
        # none sent nothing.
        me, size = dist.get_rank(group), dist.get_world_size(group)
        key = f"libra/silent/{seq}/"
        missing = None
        try:
            store = group.get_group_store()
            store.set_timeout(datetime.timedelta(seconds=timeout))
            store.set(key + str(me), "1")
            end = time.monotonic() + timeout
            others = [r for r in range(size) if r != me]
            while True:
                missing = [r for r in others if not store.check([key + str(r)])]
                if not missing or time.monotonic() >= end:
                    break
                time.sleep(0.05)
        except (AttributeError, RuntimeError):
            pass  # no store to ask (or it is silent too)
        return missing

    def barrier(self, group=None):
        dist.barrier(group=group)

    def all_reduce(self, tensor, group=None):
        dist.all_reduce(tensor, group=group)


COMMUNICATOR = TorchDist()
