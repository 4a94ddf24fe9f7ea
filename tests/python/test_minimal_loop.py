"""examples/minimal_loop.py, as docs/python.md shows it, launched with torchrun (4 gloo processes):
libra (P = 2, CP = 2) and torch's own attention on whole sequences (CP = 1, DP = 4) train on the
same global batches, so their per-step losses agree."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-6  # relative; measured 2.7e-8 and 2.3e-9 over the 2 steps


def run(*args):
    exe = Path(sys.executable).parent / "torchrun"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]
    # --standalone: a free rendezvous port, so that concurrent runs do not collide.
    cmd += ["--standalone", "--nproc-per-node", "4", str(ROOT / "examples" / "minimal_loop.py"), "--steps", "2",
            *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    steps = re.findall(r"^step (\d+) loss (\S+) tokens (\d+)$", out.stdout, re.M)
    assert [int(s) for s, _, _ in steps] == [0, 1], out.stdout
    return [(float(loss), int(tokens)) for _, loss, tokens in steps]


def test_minimal_loop_under_torchrun_matches_plain_attention():
    libra_run = run()
    plain = run("--cp", "1", "--pool-size", "1", "--attention", "plain")
    print("libra", libra_run, "plain", plain)
    for (a, ta), (b, tb) in zip(libra_run, plain):
        assert ta == tb
        assert abs(a - b) <= TOL * abs(b), (libra_run, plain)


def test_the_loop_in_the_docs_is_the_example():
    doc = (ROOT / "docs" / "python.md").read_text()
    section = doc.split("## A complete minimal training loop", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    example = (ROOT / "examples" / "minimal_loop.py").read_text()
    body = "\n".join(line[4:] if line.startswith("    ") else line for line in example.split("\n"))
    assert block.strip() and block in body
