#!/usr/bin/env python3
"""Checks every Python command shown in README.md and docs/*.md.

Usage: check_python_commands.py REPO_ROOT

A command is a code-block line (as check_doc_commands.py reads them) that
runs the project's Python: `.venv/bin/python ...`, `.venv/bin/torchrun ...`
or `/usr/bin/python3 ...`, optionally after `VAR=value` assignments. Each
runs from the repository root, one of these ways:

- `python -c CODE`: run for real, must exit 0 within 300 s;
- `python -m pytest ARGS`: collected only (`--collect-only`), must exit 0
  and find at least one test;
- `python SCRIPT ARGS` and `torchrun [FLAGS] SCRIPT ARGS`: the script runs
  up to its argument parsing (tests/docs/parse_only.py), so its imports,
  flags and values are checked, and every torchrun flag must be in
  `torchrun --help`; a script without argparse must exist and compile;
- `python -m venv` and `pip install`: not run here (python.install runs the
  documented installation in a scratch venv), counted as skipped.

The examples' real runs are their own ctest tests (python.example and the
torchrun tests).
"""
import os
import py_compile
import re
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_doc_commands import code_commands  # noqa: E402

PYTHON = re.compile(r"^(\S*/)?(\.venv/bin/python3?|\.venv/bin/torchrun|/usr/bin/python3)$")


def split_env(argv):
    env = {}
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
        k, v = argv.pop(0).split("=", 1)
        env[k] = v
    return env, argv


def check(root, argv, env, torchrun_help):
    """None when the command checks out, else why not; also how it was checked."""
    prog = argv[0]
    run_env = dict(os.environ, **env)
    exe = os.path.join(root, prog) if not os.path.isabs(prog) else prog
    if not os.path.exists(exe):
        return f"{prog} does not exist (run scripts/setup.sh)", "failed"
    if prog.endswith("torchrun"):
        rest = argv[1:]
        while rest and rest[0].startswith("-"):
            flag = rest.pop(0)
            name = flag.split("=")[0]
            if name not in torchrun_help:
                return f"{name} is not a torchrun flag", "failed"
            if "=" not in flag and rest and not rest[0].startswith("-") and not rest[0].endswith(".py"):
                rest.pop(0)  # the flag's value
        python = os.path.join(os.path.dirname(exe), "python")
        return script(root, python, rest, run_env)
    args = argv[1:]
    if args[:1] == ["-c"]:
        r = subprocess.run([exe, *args], cwd=root, env=run_env, capture_output=True, text=True, timeout=300)
        return (None if r.returncode == 0 else f"exit {r.returncode}: {r.stderr.strip()[-400:]}"), "run"
    if args[:2] == ["-m", "pytest"]:
        r = subprocess.run([exe, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider", *args[2:]],
                           cwd=root, env=run_env, capture_output=True, text=True, timeout=300)
        # -q lists test ids, -qq counts per file: either shows what was collected.
        ids = re.findall(r"^\S+::\S+", r.stdout, re.M)
        per_file = [int(n) for n in re.findall(r"^\S+\.py: (\d+)$", r.stdout, re.M)]
        if r.returncode != 0 or not (ids or sum(per_file)):
            return f"pytest collects nothing or fails: {r.stdout.strip()[-300:]} {r.stderr.strip()[-300:]}", "failed"
        return None, "collected"
    if args[:2] == ["-m", "venv"] or args[:2] == ["-m", "pip"]:
        return None, "skipped"
    return script(root, exe, args, run_env)


def script(root, python, args, env):
    if not args or not args[0].endswith(".py"):
        return f"expected a script, got {args[:1]}", "failed"
    path = os.path.join(root, args[0])
    if not os.path.exists(path):
        return f"{args[0]} does not exist", "failed"
    if "argparse" not in open(path, encoding="utf-8").read():
        try:
            py_compile.compile(path, doraise=True)
        except py_compile.PyCompileError as e:
            return f"does not compile: {e}", "failed"
        return None, "compiled"
    parse_only = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parse_only.py")
    r = subprocess.run([python, parse_only, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    return (None if r.returncode == 0 else f"exit {r.returncode}: {r.stderr.strip()[-400:]}"), "parsed"


def main():
    root = os.path.abspath(sys.argv[1])
    files = [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    torchrun = os.path.join(root, ".venv", "bin", "torchrun")
    torchrun_help = ""
    if os.path.exists(torchrun):
        torchrun_help = subprocess.run([torchrun, "--help"], capture_output=True, text=True).stdout
    failures, counts = [], {}
    for f in files:
        rel = os.path.relpath(f, root)
        for no, cmd, mention in code_commands(f):
            if mention:
                continue
            try:
                argv = shlex.split(cmd)
            except ValueError:
                continue
            env, argv = split_env(argv)
            if argv and argv[0].endswith("/pip"):
                counts["skipped"] = counts.get("skipped", 0) + 1
                continue
            if not argv or not PYTHON.match(argv[0]):
                continue
            try:
                why, how = check(root, argv, env, torchrun_help)
            except subprocess.TimeoutExpired:
                why, how = "ran past its time limit", "failed"
            counts[how] = counts.get(how, 0) + 1
            if why is not None:
                failures.append(f"{rel}:{no}: {cmd}: {why}")
    for line in failures:
        print("docs:", line)
    summary = ", ".join(f"{n} {how}" for how, n in sorted(counts.items()))
    print(f"docs: Python commands: {summary}; {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
