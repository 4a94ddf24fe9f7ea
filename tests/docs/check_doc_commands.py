#!/usr/bin/env python3
"""Checks every libra command shown in README.md and docs/*.md against the tool.

Usage: check_doc_commands.py LIBRA REPO_ROOT

A command is a line of a code block (fenced or indented, continuation
backslashes joined) that starts with `libra`, `build/release/tools/libra`,
`mpirun [--flags] -np N libra` or `/usr/bin/time -v libra`; a trailing `# comment` is dropped. An inline code
span starting so is a mention. Each is checked one of three ways:

- a mention, or a synopsis (holds a placeholder such as SOURCE, FILE, P,
  builtin:NAME, `...`, `[`, `|`): `libra <command> --help` must work and
  list every --flag it names;
- cheap (corpus stats, pack, place, plan): run for real from a scratch
  directory that links the repository's data/, tests/ and docs/, and must
  exit 0 within 120 s;
- expensive (simulate, exec, bench): parsed only, with LIBRA_PARSE_ONLY=1
  (every flag exists, every value is well formed, every output directory
  exists), and must exit 0.

Every ```json block must also be valid JSON (a format example people copy).
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

CHEAP = {"corpus", "pack", "place", "plan"}
GROUPS = {"corpus", "bench"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.[a-z0-9]+)?$|:[A-Z]+$|\.\.\.|^\[|\]$|\|")


def code_commands(path):
    """Every command shown in a markdown file: (line, command, is_mention) for each line of a code
    block (fenced or indented, continuation backslashes joined, `a && b` as two) and each inline code
    span; a leading `$ ` and a trailing `# comment` are dropped."""
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    out = []
    in_fence = False
    block = []
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            in_fence = not in_fence
            continue
        code = in_fence or (line.startswith("    ") and not line.lstrip().startswith(("- ", "* ")))
        if code:
            block.append((i + 1, line.strip()))
        else:
            for m in re.finditer(r"`([^`]+)`", line):
                out.append((i + 1, m.group(1), True))
    # Join continuation lines of code blocks.
    joined = []
    cur, start = "", 0
    for no, l in block:
        if not cur:
            start = no
        if l.endswith("\\"):
            cur += l[:-1] + " "
            continue
        joined.append((start, cur + l, False))
        cur = ""
    out += joined
    # `a && b` shows two commands.
    out = [(no, part.strip(), mention) for no, cmd, mention in out for part in cmd.split(" && ")]
    result = []
    for no, cmd, mention in out:
        if cmd.startswith("$ "):
            cmd = cmd[2:]
        result.append((no, re.sub(r"\s+#.*$", "", cmd), mention))
    return result


def commands_of(path):
    """The libra commands of a markdown file (see the module docstring)."""
    result = []
    for no, cmd, mention in code_commands(path):
        cmd = re.sub(r"^/usr/bin/time -v\s+", "", cmd)
        cmd = re.sub(r"^mpirun\s+(--\S+\s+)*-np\s+\S+\s+(--\S+\s+)*", "", cmd)
        cmd = re.sub(r"^(\S*/)?tools/libra\s+", "libra ", cmd)  # the tool as the build leaves it
        if re.match(r"^libra\s+[a-z]", cmd):
            result.append((no, cmd, mention))
    return result


def main():
    libra, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    files = [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    scratch = tempfile.mkdtemp(prefix="libra_docs_")
    for d in ("data", "tests", "docs", "scripts", "examples"):
        if os.path.exists(os.path.join(root, d)):
            os.symlink(os.path.join(root, d), os.path.join(scratch, d))
    failures, counts = [], {"synopsis": 0, "run": 0, "parsed": 0}
    help_cache = {}
    for f in files:
        rel = os.path.relpath(f, root)
        for m in re.finditer(r"^```json\n(.*?)^```", open(f, encoding="utf-8").read(), re.S | re.M):
            try:
                json.loads(m.group(1))
            except ValueError as e:
                failures.append(f"{rel}: a ```json block is not valid JSON: {e}")
        for no, cmd, mention in commands_of(f):
            try:
                argv = shlex.split(cmd)[1:]
            except ValueError as e:
                failures.append(f"{rel}:{no}: {cmd}: cannot split: {e}")
                continue
            path = argv[:2] if argv and argv[0] in GROUPS and len(argv) > 1 else argv[:1]
            where = f"{rel}:{no}: {cmd}"
            if mention or any(PLACEHOLDER.search(a) for a in argv):
                key = tuple(path)
                if key not in help_cache:
                    r = subprocess.run([libra, *path, "--help"], capture_output=True, text=True)
                    help_cache[key] = r.stdout if r.returncode == 0 else None
                h = help_cache[key]
                if h is None:
                    failures.append(f"{where}: `libra {' '.join(path)} --help` fails")
                    continue
                for a in argv:
                    flag = a.split("=")[0].strip("[]|")
                    if flag.startswith("--") and not re.search(r"(^|[ ,])" + re.escape(flag) + r"([ ,=]|$)", h, re.M):
                        failures.append(f"{where}: {flag} is not an option of `libra {' '.join(path)}`")
                counts["synopsis"] += 1
                continue
            env = dict(os.environ)
            real = path[0] in CHEAP
            if not real:
                env["LIBRA_PARSE_ONLY"] = "1"
            try:
                r = subprocess.run([libra, *argv], cwd=scratch, env=env, capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired:
                failures.append(f"{where}: ran past 120 s")
                continue
            if r.returncode != 0:
                failures.append(f"{where}: exit {r.returncode}: {r.stderr.strip()}")
            counts["run" if real else "parsed"] += 1
    for line in failures:
        print("docs:", line)
    print(f"docs: {counts['run']} commands run, {counts['parsed']} parsed only, {counts['synopsis']} synopses "
          f"checked against --help; {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
