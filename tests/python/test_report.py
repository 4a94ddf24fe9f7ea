"""libra.report: the report of an executor run from Python, against `libra exec --json` and raw numbers.

The CLI cases run `libra exec` (in-process ranks) on the tiny pool of tests/cli, feed the numbers its JSON
states back through libra.report.exec_report, and compare the two documents key for key (same keys in the
same order, same strings, integers and verdicts; floats to 1e-12, since a relative error is fed back as
max_abs / relative). The raw-number cases check the statistics against sums and maxima taken here.
"""
import json
import math
import subprocess
from pathlib import Path

import pytest

import libra.report as report

ROOT = Path(__file__).resolve().parents[2]
POOL = "../mpi/data/pool_p2_l512.jsonl"  # relative to tests/cli, as the CLI tests name it
SHAPE = ["--seq-len", "512", "--cp", "2", "--block", "64", "--heads-q", "4", "--heads-kv", "2", "--head-dim", "16"]
TENSORS = ["O", "LSE", "dQ", "dK", "dV"]

CASES = {
    # name: (extra flags, checked, uniform tolerance, exit status)
    "tap_bf16_checked": (SHAPE + ["--head-shards", "2", "--chunks", "2"], True, None, 0),
    "tap_split_window_relay_beyond_tolerance": (
        SHAPE + ["--head-shards", "2", "--chunks", "2", "--mode", "tap-split", "--window", "40", "--dtype", "fp32",
                 "--relay"], True, 1e-12, 3),
    "tapered_unchecked": (
        ["--seq-len", "512", "--cp", "2", "--block", "64", "--heads-q", "8", "--heads-kv", "2", "--head-dim", "16",
         "--chunk-split", "tapered", "--head-shards", "1", "--chunks", "4"], False, None, 0),
}


def run_cli(libra_cli, flags, checked, tolerance, status):
    args = [str(libra_cli), "exec", POOL, *flags, "--ranks", "4", "--json"]
    if checked:
        args.append("--check")
    if tolerance is not None:
        args += ["--check-tolerance", repr(tolerance)]
    p = subprocess.run(args, cwd=ROOT / "tests" / "cli", capture_output=True, text=True, timeout=120)
    assert p.returncode == status, p.stderr
    return p.stdout


def inputs_from(doc):
    """exec_report's arguments from the numbers a CLI document states."""
    run = {k: doc[k] for k in ("mode", "seq_len", "cp", "chunks", "heads_q", "heads_kv", "head_dim", "dtype",
                               "window", "threads", "source", "length_scale", "ranks", "pool_ranks", "pool_size")}
    if "chunk_split" in doc:
        run["chunk_split"] = doc["chunk_split"]
        run["chunk_widths"] = doc["chunk_widths"]
    run["relay"] = any("relayed_pairs" in p for p in doc["pools"])
    timings = {
        # The document states the slowest rank's wall time only; its mean is not printed.
        "forward_wall": {"max": doc["forward"]["wall_s"], "mean": 0.0},
        "backward_wall": {"max": doc["backward"]["wall_s"], "mean": 0.0},
        "forward_compute": {"max": doc["forward"]["compute_max_s"], "mean": doc["forward"]["compute_mean_s"]},
        "backward_compute": {"max": doc["backward"]["compute_max_s"], "mean": doc["backward"]["compute_mean_s"]},
        "forward_own": {"max": doc["executor_cpu_over_kernel_cpu"]["forward"], "mean": 0.0},
        "backward_own": {"max": doc["executor_cpu_over_kernel_cpu"]["backward"], "mean": 0.0},
    }
    pools = []
    checked = {p["pool"]: p for p in doc["check"]["pools"]} if "check" in doc else {}
    for p in doc["pools"]:
        pool = dict(p)
        if p["pool"] in checked:
            c = checked[p["pool"]]
            pool["reference"] = c["reference"]
            pool["errors"] = {}
            for t in TENSORS:
                e = c["tensors"][t]
                rel = e["relative_error"]
                # rel = max_abs / max_ref (max_abs when max_ref is 0; 0 when max_abs is 0)
                pool["errors"][t] = (e["max_abs_error"], e["max_abs_error"] / rel if rel > 0 else 1.0)
        pools.append(pool)
    return run, timings, pools


def assert_same(a, b, where="document"):
    if isinstance(a, list) and a and isinstance(a[0], tuple):  # object as pairs: same keys, same order
        assert [k for k, _ in a] == [k for k, _ in b], where
        for (k, x), (_, y) in zip(a, b):
            assert_same(x, y, f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert b == pytest.approx(a, rel=1e-12, abs=0), where
    else:
        assert type(a) is type(b) and a == b, where


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_report_is_the_cli_document(libra_cli, case):
    flags, checked, tolerance, status = CASES[case]
    text = run_cli(libra_cli, flags, checked, tolerance, status)
    doc = json.loads(text)
    run, timings, pools = inputs_from(doc)
    rep = report.exec_report(run, timings, pools, check=checked, tolerance=tolerance)
    pairs = lambda s: json.loads(s, object_pairs_hook=list)  # noqa: E731
    assert_same(pairs(text), pairs(rep["json"]))
    if checked:
        assert rep["check"]["ok"] == doc["check"]["within_tolerance"] == (status == 0)
        failed = [t for t in TENSORS if not doc["check"]["tensors"][t]["ok"]]
        assert rep["check"]["first_failed"] == (failed[0] if failed else None)
        if tolerance is None:
            assert report.exec_tolerance(doc["dtype"]) == {t: doc["check"]["tensors"][t]["tolerance"] for t in TENSORS}
    else:
        assert rep["check"] is None and "check" not in doc


def test_statistics_from_raw_numbers():
    wall_f, comp_f = [0.25, 0.5, 0.125, 0.375], [0.2, 0.1, 0.05, 0.3]
    wall_b, comp_b = [1.0, 3.0, 2.0, 0.5], [0.9, 2.5, 1.5, 0.25]
    cpu, kernel_cpu = [1.5, 2.0, 0.0, 3.0], [1.0, 1.6, 0.0, 2.0]
    own = [report.own_cpu_fraction(c, k) for c, k in zip(cpu, kernel_cpu)]
    assert own == [0.5, (2.0 - 1.6) / 1.6, 0.0, 0.5]
    errors = [  # per pool: (max |x - ref|, max |ref|) per tensor
        {"O": (1e-3, 2.0), "LSE": (0.0, 5.0), "dQ": (2e-2, 0.5), "dK": (1e-4, 1.0), "dV": (3e-3, 0.0)},
        {"O": (4e-3, 1.0), "LSE": (1e-6, 7.0), "dQ": (1e-2, 0.25), "dK": (2e-4, 4.0), "dV": (1e-3, 2.0)},
    ]
    run = dict(mode="tap", seq_len=64, cp=2, chunks=1, heads_q=2, heads_kv=1, head_dim=8, dtype="bf16",
               source="raw", ranks=4, pool_ranks=2, pool_size=1)
    pools = [dict(pool=i, samples=1, tokens_per_slot=[64], errors=e) for i, e in enumerate(errors)]
    rep = report.exec_report(run, dict(forward_wall=wall_f, forward_compute=comp_f, backward_wall=wall_b,
                                       backward_compute=comp_b, forward_own=own, backward_own=own), pools)
    for key, xs in (("forward_wall", wall_f), ("forward_compute", comp_f), ("backward_compute", comp_b)):
        assert rep["timings"][key]["max"] == max(xs)
        assert rep["timings"][key]["mean"] == pytest.approx(math.fsum(xs) / len(xs), rel=1e-15)
    assert rep["wall_overhead"]["forward"] == pytest.approx(max(wall_f) / max(comp_f) - 1, rel=1e-15)
    assert rep["wall_overhead"]["backward"] == pytest.approx(max(wall_b) / max(comp_b) - 1, rel=1e-15)
    # Over the pools: the largest error over the largest reference magnitude, per tensor.
    for t in TENSORS:
        max_abs = max(e[t][0] for e in errors)
        max_ref = max(e[t][1] for e in errors)
        assert rep["check"]["tensors"][t]["relative"] == pytest.approx(max_abs / max_ref, rel=1e-15)
    # bf16 tolerances: dQ's 2e-2 / 0.5 = 4e-2 is within 5e-2; O's 4e-3 / 2 within 2e-2; so all pass ...
    assert rep["check"]["ok"] and rep["check"]["first_failed"] is None
    # ... until a uniform 1e-2 leaves dQ (4e-2) as the first tensor beyond it (O is 2e-3).
    strict = report.exec_report(run, {k: [1.0] for k in rep["timings"]}, pools, tolerance=1e-2)
    assert not strict["check"]["ok"] and strict["check"]["first_failed"] == "dQ"
    assert strict["document"]["check"]["tensors"]["O"]["ok"] is True


def test_bad_input_names_the_key():
    run = dict(mode="tap", seq_len=64, cp=2, chunks=1, heads_q=2, heads_kv=1, head_dim=8, dtype="bf16",
               source="raw", ranks=2, pool_ranks=2, pool_size=1)
    timings = {k: [1.0] for k in ("forward_wall", "forward_compute", "backward_wall", "backward_compute",
                                  "forward_own", "backward_own")}
    pool = dict(pool=0, samples=1, tokens_per_slot=[64])
    with pytest.raises(ValueError, match=r"pools\[0\]: missing key 'errors'"):
        report.exec_report(run, timings, [pool])
    with pytest.raises(ValueError, match=r"run: missing key 'dtype'"):
        report.exec_report({k: v for k, v in run.items() if k != "dtype"}, timings, [pool], check=False)
    with pytest.raises(ValueError, match=r"timings\['forward_wall'\]: no ranks"):
        report.exec_report(run, dict(timings, forward_wall=[]), [pool], check=False)
    with pytest.raises(ValueError, match=r"bf17"):
        report.exec_report(dict(run, dtype="bf17"), timings, [pool], check=False)
