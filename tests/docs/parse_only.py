"""Runs a Python script as `__main__` up to its argument parsing, then exits 0.

Usage: parse_only.py SCRIPT [ARGS...]

The docs test checks an example or script command this way when running it
for real would take minutes: the script's imports run (a missing `libra` or
torch fails here), argparse checks every flag and value (and whatever the
script's `type=` functions check, such as that an input file exists), and
the script's work never starts. A script that never calls parse_args runs
whole, so the docs test calls this only for scripts that parse arguments.
"""
import argparse
import os
import runpy
import sys


class _Parsed(Exception):
    pass


def main():
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        runpy.run_path(script, run_name="__main__")
    except _Parsed:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
