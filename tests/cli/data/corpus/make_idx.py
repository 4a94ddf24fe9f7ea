#!/usr/bin/env python3
"""Writes the Megatron .idx test files byte by byte with Python's struct
module, independently of libra's reader. Run from this folder; the outputs
are committed, so this only documents (and can regenerate) them."""
import struct

MAGIC = b"MMIDIDX\x00\x00"


def idx(lengths, docs, version=1, dtype=4, itemsize=2, magic=MAGIC, seq_count=None, doc_count=None, pointers=None):
    if pointers is None:
        pointers, p = [], 0
        for n in lengths:
            pointers.append(p)
            p += n * itemsize
    out = magic + struct.pack("<Q", version) + struct.pack("<B", dtype)
    out += struct.pack("<Q", len(lengths) if seq_count is None else seq_count)
    out += struct.pack("<Q", len(docs) if doc_count is None else doc_count)
    out += struct.pack("<%di" % len(lengths), *lengths)
    out += struct.pack("<%dq" % len(pointers), *pointers)
    out += struct.pack("<%dq" % len(docs), *docs)
    return out


# dtype 8 is uint16 (2 bytes per token), the usual choice for a 65k vocabulary.
good = idx([300, 1000, 100, 700, 200, 900, 500, 400, 800, 600], [0, 3, 7, 10], dtype=8)
files = {
    "good.idx": good,
    "bad_magic.idx": b"MMIDIDX\x00\x01" + good[9:],
    "short_header.idx": good[:20],
    "bad_version.idx": idx([5, 6], [0, 2], version=2, dtype=8),
    "bad_dtype.idx": idx([5, 6], [0, 2], dtype=9),
    "short_arrays.idx": idx([5, 6], [0, 2], dtype=8, seq_count=1000),
    "trailing.idx": idx([5, 6], [0, 2], dtype=8) + b"\x00\x00\x00",
    "zero_length.idx": idx([5, 0, 6], [0, 3], dtype=8),
    "bad_pointer.idx": idx([5, 6], [0, 2], dtype=8, pointers=[0, 11]),
    "bad_docs.idx": idx([5, 6, 7], [0, 2, 1, 3], dtype=8),
}
for name, data in files.items():
    with open(name, "wb") as f:
        f.write(data)
