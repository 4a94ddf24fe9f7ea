#!/usr/bin/python3
"""Writes the packed sequences of one TAP domain of `libra place --mode
vrsp-elastic --json` output, in the domain's slot order, as a pool file for
`libra exec` / `libra plan` (a fused domain of k pools is one pool of k*P
slots; run it on k*P*CP ranks).

Usage: tools/elastic-domain.py PLACE.json PACKED.jsonl WINDOW DOMAIN OUT.jsonl
  PLACE.json    output of libra place ... --mode vrsp-elastic --json
  PACKED.jsonl  the packed sequences it placed (libra pack output)
Prints the domain's slot count on stdout. Exits 2 with one line on bad input.
"""
import json
import os
import sys


def fail(msg):
    sys.stderr.write(f"elastic-domain: {msg}\n")
    sys.exit(2)


def main():
    if len(sys.argv) != 6:
        fail("usage: elastic-domain.py PLACE.json PACKED.jsonl WINDOW DOMAIN OUT.jsonl")
    place_path, packed_path, window_s, domain_s, out = sys.argv[1:]
    try:
        window, domain = int(window_s), int(domain_s)
        with open(place_path) as f:
            place = json.load(f)
        with open(packed_path) as f:
            packed = [line for line in f.read().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        fail(str(e))
    windows = place.get("windows", [])
    if not 0 <= window < len(windows) or "domains" not in windows[window]:
        fail(f"{place_path}: no window {window} with domains (was it --mode vrsp-elastic --json?)")
    w = windows[window]
    if not 0 <= domain < len(w["domains"]):
        fail(f"{place_path}: window {window} has {len(w['domains'])} domains, no domain {domain}")
    # Domain slot s is slot s % P of pool domains[d][s // P] (placement.hpp).
    slots = [w["first_sequence"] + i for k in w["domains"][domain] for i in w["pools"][k]]
    if max(slots) >= len(packed):
        fail(f"{packed_path}: {len(packed)} sequences, the domain needs sequence {max(slots)}")
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(packed[i] + "\n" for i in slots))
    os.replace(tmp, out)
    print(len(slots))


if __name__ == "__main__":
    main()
