"""Offline training text for the examples: the bytes of the text files Debian ships in
/usr/share/common-licenses, one sample per paragraph, packed by libra.

Shared by train_tiny.py and hf_llama.py (imported from the examples folder, which
Python puts on the path of a script it runs); the importing script sets up the
path to libra first.
"""
import glob
import os

import libra


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
