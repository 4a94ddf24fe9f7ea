"""What the byte-corpus training examples (train_tiny.py, hf_llama.py, hf_trainer.py) share:
libra from this source tree when it has a release build, the offline training text (the bytes of
the text files Debian ships in /usr/share/common-licenses, one sample per paragraph, packed by
libra) as token tensors, their common command-line options, their loss.csv / loss.png and the
torchrun frame of hf_llama.py and hf_trainer.py.

    import _common                 # first: puts the source tree's libra on the path
    from _common import PackedBytes, load_samples, pack_bytes
    packed = pack_bytes(load_samples("/usr/share/common-licenses/*"), 256)
    ids, lengths = PackedBytes(packed, 256)[0]

Imported from the examples folder, which Python puts on the path of a script it runs.
"""
import csv
import glob
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT = os.path.join(HERE, "..", "build", "release", "python")
if os.path.isdir(BUILT):  # a source tree with a release build; otherwise the installed package
    sys.path[1:1] = [BUILT, os.path.join(HERE, "..", "python")]

import libra  # noqa: E402


def load_samples(pattern):
    """Paragraphs (byte strings) of the files matching pattern, in sorted file order."""
    samples = []
    for path in sorted(glob.glob(pattern)):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                samples += [s for s in f.read().split(b"\n\n") if len(s) >= 2]
    if not samples:
        raise SystemExit(f"no text found at {pattern}")
    return samples


def pack_bytes(samples, seq_len):
    """libra packs the lengths; the bytes follow in the same (loader) order. Returns
    [(sample lengths, bytes)] per packed sequence."""
    packed = libra.pack([len(s) for s in samples], seq_len)["sequences"]
    stream = b"".join(samples)
    out, pos = [], 0
    for seq in packed:
        n = sum(seq)
        out.append((seq, stream[pos:pos + n]))
        pos += n
    return out


class PackedBytes(torch.utils.data.Dataset):
    """Packed sequence i as (token ids [seq_len], its sample lengths); padding is token 0."""

    def __init__(self, packed, seq_len):
        self.packed, self.seq_len = packed, seq_len

    def __len__(self):
        return len(self.packed)

    def __getitem__(self, i):
        lengths, data = self.packed[i]
        ids = torch.zeros(self.seq_len, dtype=torch.long)
        ids[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        return ids, list(lengths)


def add_training_args(ap, name, seq_len=256, block=32):
    """The options every byte-corpus example takes: sequence length, SH-Tile rows, batch, optimizer,
    seed, text and output folder (out/NAME)."""
    ap.add_argument("--seq-len", type=int, default=seq_len)
    ap.add_argument("--block", type=int, default=block, help="query rows per SH-Tile")
    ap.add_argument("--gbs", type=int, default=4, help="packed sequences per optimizer step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text", default="/usr/share/common-licenses/*", help="glob of text files to train on")
    ap.add_argument("--out", default=f"out/{name}", help="output folder")


def write_loss_files(out, header, rows, curves, title=None, first_step=1):
    """OUT/loss.csv (header and rows) and OUT/loss.png (curves: (y, matplotlib format, label) against
    the step, numbered from first_step), each written atomically. Returns False when matplotlib is missing (no PNG)."""
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, ".loss.csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    os.replace(tmp, os.path.join(out, "loss.csv"))
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for y, fmt, label in curves:
        ax.plot(range(first_step, first_step + len(y)), y, fmt, label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean next-byte loss")
    if title:
        ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    tmp = os.path.join(out, ".loss.png.tmp")
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, os.path.join(out, "loss.png"))
    return True


def torchrun_main(name, threads, body):
    """Runs ``body()``, which returns the failed checks, on each of torchrun's processes in one gloo
    group; rank 0 prints the failures and every process exits 1 on any (every rank decides alike)."""
    if "RANK" not in os.environ:
        raise SystemExit(f"{name}: launch with torchrun, e.g. .venv/bin/torchrun --standalone --nproc-per-node 4 "
                         f"examples/{name}.py")
    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    try:
        bad = body()
        if bad and dist.get_rank() == 0:
            print(f"{name}: " + "; ".join(bad))
    finally:
        dist.barrier()
        dist.destroy_process_group()
    if bad:
        sys.exit(1)
