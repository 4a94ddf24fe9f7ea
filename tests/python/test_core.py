"""The torch-free binding: corpus, placement, plans, plan files, simulator, errors, GIL.

References are independent of the code under test: naive Python re-computations
(percentiles, packing, workloads, causal pair counts, coverage), and the
`libra` CLI for the outputs it also prints (fingerprints, simulator JSON,
error lines)."""
import json
import math
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import libra


def nearest_rank(values, p):
    v = sorted(values)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)]


def test_corpus_stats_and_loading(tmp_path):
    lengths = [5, 1, 9, 3, 3, 7, 2, 8, 4, 6, 10, 1]
    f = tmp_path / "lengths.txt"
    f.write_text("".join(f"{n}\n" for n in lengths))
    s = libra.corpus_stats(str(f))
    assert s["kind"] == "raw" and s["samples"] == len(lengths) and s["total_tokens"] == sum(lengths)
    mean = sum(lengths) / len(lengths)
    cv = math.sqrt(sum((x - mean) ** 2 for x in lengths) / len(lengths)) / mean
    d = s["lengths"]
    assert d["mean"] == pytest.approx(mean) and d["cv"] == pytest.approx(cv)
    assert d["median"] == nearest_rank(lengths, 50) and d["p90"] == nearest_rank(lengths, 90)
    assert d["max"] == max(lengths)
    assert libra.load_lengths(str(f)) == lengths

    j = tmp_path / "packed.jsonl"
    seqs = [[3, 5], [8], [1, 1, 6]]
    j.write_text("".join(json.dumps(x) + "\n" for x in seqs))
    assert libra.load_packed_sequences(str(j)) == seqs
    assert libra.corpus_stats(str(j))["workloads"]["max"] == 64
    names = [c["source"] for c in libra.builtin_corpora()]
    assert "builtin:paper-1m" in names and "builtin:paper-256k" in names


def naive_pack(lengths, L):
    out, cur = [], []
    for n in lengths:
        while n > L:  # split policy: pieces of exactly L, then the remainder
            if cur:
                out.append(cur)
                cur = []
            out.append([L])
            n -= L
        if sum(cur) + n > L:
            out.append(cur)
            cur = []
        cur.append(n)
    if cur:
        out.append(cur)
    return out


def test_pack_matches_naive_sequential_packer():
    rng = np.random.default_rng(1)
    lengths = [int(x) for x in rng.integers(1, 40, size=300)]
    r = libra.pack(lengths, 32)
    assert r["sequences"] == naive_pack(lengths, 32)
    assert r["input_tokens"] == sum(lengths) and r["dropped_tokens"] == 0
    t = libra.pack(lengths, 32, overlong="truncate", packer="bfd")
    assert all(sum(s) <= 32 for s in t["sequences"])
    assert t["output_tokens"] == sum(min(x, 32) for x in lengths)


def test_place_window_is_a_permutation_with_exact_loads():
    seqs = libra.pack([int(x) for x in np.random.default_rng(2).integers(1, 200, size=400)], 256)["sequences"][:16]
    f = [sum(l * l for l in s) for s in seqs]
    assert list(libra.sequence_workloads(seqs)) == f
    for mode in ("vrsp", "sampler", "random", "zigzag", "zigzag-swap", "vrsp-refine"):
        w = libra.place_window(seqs, 4, mode=mode, seed=3)
        flat = sorted(i for p in w["pools"] for i in p)
        assert flat == list(range(16)) and all(len(p) == 4 for p in w["pools"])
        loads = [sum(f[i] for i in p) for p in w["pools"]]
        assert list(w["loads"]) == loads
        assert w["imbalance"] == pytest.approx(max(loads) / (sum(loads) / len(loads)) - 1)
        assert w["lower_bound"] <= w["imbalance"] + 1e-12
    assert libra.place_window(seqs, 4)["imbalance"] <= libra.place_window(seqs, 4, mode="sampler")["imbalance"]


def test_placement_sampler_steps_are_pure_permutations_of_windows():
    seqs = libra.pack([int(x) for x in np.random.default_rng(4).integers(1, 100, size=500)], 128)["sequences"]
    s = libra.PlacementSampler(seqs, gbs=8, dp=4, pool_size=2)
    assert s.num_steps == len(seqs) // 8 and s.dropped_tail == len(seqs) % 8
    for step in (0, 1, s.num_steps - 1):
        st = s.at(step)
        assert sorted(st["order"]) == list(range(step * 8, step * 8 + 8))
        window = [seqs[i] for i in range(step * 8, step * 8 + 8)]
        assert st["pools"] == libra.place_window(window, 2)["pools"]
        assert list(s.at(step)["order"]) == list(st["order"])
    with pytest.raises(ValueError, match="step"):
        s.at(s.num_steps)


def causal_pairs(a, e, window=None):
    """Causal (query, key) pairs of sample-local query rows [a, e)."""
    return sum(q + 1 if window is None else min(q + 1, window) for q in range(a, e))


POOL = [[10, 30, 20, 4], [64], [5, 5, 40], [33, 17, 1]]


@pytest.mark.parametrize("mode,window,dedup", [("tap", None, False), ("tap-split", 9, False),
                                               ("ulysses", None, False), ("tap", None, True)])
def test_plan_covers_every_query_row_and_head_once(mode, window, dedup):
    L, cp, hq, hkv = 64, 2, 8, 2
    plan = libra.make_plan(POOL, seq_len=L, cp=cp, block_size=8, head_shards=4, heads_q=hq, heads_kv=hkv,
                           head_dim=16, window=window, chunks=2, mode=mode, dedup_per_kv_head=dedup)
    assert plan.num_workers == len(POOL) * cp and plan.config["mode"] == mode
    t = plan.tiles
    cover = np.zeros((len(POOL), L, hq), dtype=int)
    loads = np.zeros(plan.num_workers, dtype=np.int64)
    fr = plan.fragments
    for i in range(len(t["id"])):
        cover[t["slot"][i], t["begin"][i]:t["end"][i], t["heads_begin"][i]:t["heads_end"][i]] += 1
        flops = sum(causal_pairs(fr["a"][f], fr["e"][f], window)
                    for f in range(t["fragment_begin"][i], t["fragment_end"][i]))
        assert t["flops"][i] == flops * (t["heads_end"][i] - t["heads_begin"][i])
        loads[t["worker"][i]] += t["flops"][i]
        assert t["home"][i] == t["slot"][i] * cp + t["begin"][i] // (L // cp)
    for p, s in enumerate(POOL):
        assert (cover[p, :sum(s)] == 1).all() and (cover[p, sum(s):] == 0).all()
    assert list(plan.worker_flops) == list(loads)
    assert plan.imbalance == pytest.approx(loads.max() / loads.mean() - 1)
    bm = plan.byte_matrix
    assert bm.shape == (plan.num_workers, plan.num_workers) and (np.diag(bm) == 0).all()
    for s in range(plan.num_workers):
        for d in range(plan.num_workers):
            assert plan.transfers(s, d)["bytes"].sum() == bm[s, d]
            assert sum(plan.chunk_transfers(m, s, d)["bytes"].sum() for m in range(2)) <= bm[s, d]
    assert plan.comm_bytes == bm.sum()


def test_plan_is_immutable_picklable_and_round_trips_files(tmp_path):
    kw = dict(seq_len=64, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16, chunks=2)
    plan = libra.make_plan(POOL, **kw)
    assert libra.make_plan(POOL, **kw).fingerprint == plan.fingerprint
    assert libra.make_plan(POOL, **dict(kw, tau=0.5)).fingerprint != plan.fingerprint
    again = pickle.loads(pickle.dumps(plan))
    assert again == plan and again.fingerprint == plan.fingerprint
    with pytest.raises(ValueError):
        plan.tiles["worker"][0] = 1
    with pytest.raises(AttributeError):
        plan.fingerprint = 1
    for name in ("p.json", "p.bin"):
        plan.save(str(tmp_path / name))
        assert libra.load_plan(str(tmp_path / name)) == plan
    assert libra.plan_from_json(plan.to_json()) == plan


def test_plan_fingerprint_matches_the_cli(tmp_path, libra_cli):
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(s) + "\n" for s in POOL))
    out = tmp_path / "cli.bin"
    subprocess.run([libra_cli, "plan", str(pool), "--seq-len", "64", "--cp", "2", "--block", "8",
                    "--head-shards", "4", "--heads-q", "8", "--heads-kv", "2", "--head-dim", "16",
                    "--chunks", "2", "--window", "9", "--mode", "tap-split", "-o", str(out)], check=True)
    plan = libra.make_plan(POOL, seq_len=64, cp=2, block_size=8, head_shards=4, heads_q=8, heads_kv=2,
                           head_dim=16, chunks=2, window=9, mode="tap-split")
    assert libra.load_plan(str(out)).fingerprint == plan.fingerprint


TOPO_SHAPE = dict(seq_len=64, cp=2, block_size=8, head_shards=4, heads_q=8, heads_kv=2, head_dim=16)


def test_make_plan_topology_reaches_the_planner_and_the_tiers(tmp_path, libra_cli):
    """topology= is the CLI's --gpus-per-node etc.: same tap-topo plan (fingerprint), and every
    mode's bytes by tier recounted here from the transfers on that topology."""
    topo = {"gpus_per_node": 2, "nodes_per_supernode": 2, "inter_node_gbps": 20}
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(s) + "\n" for s in POOL))
    out = tmp_path / "cli.bin"
    subprocess.run([libra_cli, "plan", str(pool), "--seq-len", "64", "--cp", "2", "--block", "8",
                    "--head-shards", "4", "--heads-q", "8", "--heads-kv", "2", "--head-dim", "16",
                    "--mode", "tap-topo", "--gpus-per-node", "2", "--nodes-per-supernode", "2",
                    "--inter-node-gbps", "20", "-o", str(out)], check=True)
    plan = libra.make_plan(POOL, mode="tap-topo", topology=topo, **TOPO_SHAPE)
    assert libra.load_plan(str(out)).fingerprint == plan.fingerprint
    assert plan.fingerprint != libra.make_plan(POOL, mode="tap-topo", **TOPO_SHAPE).fingerprint
    want = {"gpus_per_node": 2, "nodes_per_supernode": 2, "intra_node_gbps": 360.0, "inter_node_gbps": 20.0,
            "inter_supernode_gbps": 7.5, "congestion_per_node": 0.5}
    assert plan.config["topology"] == want
    assert libra.plan_from_bytes(plan.to_bytes()).config["topology"] == want

    for mode in ("tap", "tap-topo"):
        p = libra.make_plan(POOL, mode=mode, topology=topo, **TOPO_SHAPE)
        x = p.all_transfers()
        W = p.num_workers
        cross, spine = np.zeros(W, dtype=np.int64), np.zeros(W, dtype=np.int64)
        for src, dst, b in zip(x["src"], x["dst"], x["bytes"]):
            if src // 2 != dst // 2:
                cross[dst] += b
            if src // 4 != dst // 4:
                spine[dst] += b
        t = p.tier_bytes
        assert list(t["recv_cross_node"]) == list(cross) and list(t["recv_cross_supernode"]) == list(spine)
        assert cross.sum() > 0 and p.max_recv_cross_node == cross.max()


def test_make_plan_topology_errors_are_one_line_value_errors(tmp_path, libra_cli):
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(s) + "\n" for s in POOL))
    with pytest.raises(ValueError) as e:
        libra.make_plan(POOL, mode="tap-topo", topology={"intra_node_gbps": 0}, **TOPO_SHAPE)
    line = cli_error(libra_cli, "plan", str(pool), "--seq-len", "64", "--cp", "2", "--block", "8",
                     "--head-shards", "4", "--heads-q", "8", "--heads-kv", "2", "--head-dim", "16",
                     "--mode", "tap-topo", "--intra-node-gbps", "0")
    assert str(e.value) in line and "intra_node_gbps" in str(e.value)
    for topo, part in [({"gpus": 8}, "topology['gpus']: unknown key"),
                       ({"gpus_per_node": 2.5}, "topology['gpus_per_node']: must be an integer"),
                       ({"gpus_per_node": 0}, "topology['gpus_per_node'] 0: must be in [1, 2^31)"),
                       ({"inter_node_gbps": "fast"}, "topology['inter_node_gbps']: must be a number"),
                       ([("gpus_per_node", 8)], "topology: must be a dict")]:
        with pytest.raises(ValueError) as e:
            libra.make_plan(POOL, mode="tap-topo", topology=topo, **TOPO_SHAPE)
        assert part in str(e.value) and "\n" not in str(e.value), str(e.value)


def cli_error(cli, *args):
    r = subprocess.run([cli, *args], capture_output=True, text=True)
    assert r.returncode == 2
    return r.stderr.strip().splitlines()[-1]


def test_errors_are_value_errors_with_the_cli_line(tmp_path, libra_cli):
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(s) + "\n" for s in POOL[:2]))
    with pytest.raises(ValueError) as e:
        libra.make_plan(POOL[:2], seq_len=64, cp=3, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                        head_dim=16)
    line = cli_error(libra_cli, "plan", str(pool), "--seq-len", "64", "--cp", "3", "--block", "8",
                     "--head-shards", "2", "--heads-q", "4", "--heads-kv", "2", "--head-dim", "16")
    assert str(e.value) in line and "\n" not in str(e.value)
    bad = tmp_path / "bad.txt"
    bad.write_text("3\n-4\n")
    with pytest.raises(ValueError) as e:
        libra.corpus_stats(str(bad))
    assert str(e.value) in cli_error(libra_cli, "corpus", "stats", str(bad))
    with pytest.raises(OSError):
        libra.load_plan(str(tmp_path / "missing.bin"))
    with pytest.raises(ValueError, match="mode"):
        libra.place_window(POOL, 2, mode="nope")
    with pytest.raises(ValueError):
        libra.make_plan("not a pool", seq_len=64, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                        head_dim=16)
    with pytest.raises(TypeError):
        libra.make_plan(POOL, 64)  # keyword-only


def test_wrong_argument_types_give_one_line_value_errors():
    shape = dict(cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16)
    with pytest.raises(ValueError) as e:
        libra.make_plan(POOL, seq_len="64", **shape)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith("make_plan(): arguments of types (list, seq_len=str, cp=int")
    assert "seq_len: int" in text  # the signature it expected
    big = [1] * 100_000
    with pytest.raises(ValueError) as e:
        libra.place_window(big, "4")
    assert "\n" not in str(e.value) and len(str(e.value)) < 1000  # the argument is not echoed


def test_simulate_returns_the_cli_json(tmp_path, libra_cli):
    cfg = {"source": "builtin:paper-256k", "windows": 1, "pool_sizes": [4], "head_shards": [8],
           "block_sizes": [8192], "threads": 1, "scaling_dp": [1, 2]}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    cli = subprocess.run([libra_cli, "simulate", "--config", str(tmp_path / "c.json"), "--json"],
                         capture_output=True, text=True, check=True)
    got = libra.simulate(cfg)
    want = json.loads(cli.stdout)
    for k in ("timing",):  # wall-clock figures differ between runs
        got.pop(k, None)
        want.pop(k, None)
    assert got == want
    with pytest.raises(ValueError, match="nope"):
        libra.simulate({"nope": 1})


def numpy_attention(q, k, v, n, window=None):
    """One causal sample, all rows: q [n, h_q, d], k/v [n, h_kv, d], float64."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    o = np.zeros_like(q)
    for h in range(hq):
        s = q[:, h] @ k[:, h // (hq // hkv)].T / math.sqrt(d)
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        mask = (j <= i) if window is None else (j <= i) & (j > i - window)
        s = np.where(mask, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        o[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // (hq // hkv)]
    return o


def view(a):
    return (a.ctypes.data, "fp32", a.shape[0], a.shape[1], a.shape[2], a.shape[1] * a.shape[2])


@pytest.mark.parametrize("window", [None, 5])
def test_kernel_binding_on_caller_memory(window):
    rng = np.random.default_rng(5)
    n, hq, hkv, d = 37, 4, 2, 16
    q, k, v = (rng.standard_normal((n, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
    o = np.zeros_like(q)
    lse = np.zeros((n, hq, 1), dtype=np.float32)
    # Two fragments of the same sample: rows [0, 20) and [20, 37).
    frags = np.array([[0, 0, n, 0, 20], [20, 0, n, 20, n]], dtype=np.int64)
    libra._libra.kernel_forward(view(q), view(k), view(v), view(o), view(lse), frags,
                                libra.FULL_CAUSAL if window is None else window)
    ref = numpy_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), n, window)
    assert np.abs(o - ref).max() < 1e-5
    with pytest.raises(ValueError, match="fragment"):
        libra._libra.kernel_forward(view(q), view(k), view(v), view(o), view(lse),
                                    np.array([[30, 0, n, 0, 20]], dtype=np.int64))


def ran_inside(call):
    """Loop iterations per second of this thread while `call` runs on another thread (after its first 10 ms)."""
    stamps, span = [], []
    done = threading.Event()

    def work():
        t0 = time.perf_counter()
        call()
        span.extend([t0, time.perf_counter()])
        done.set()

    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
    t.join()
    t0, t1 = span
    return t1 - t0, sum(1 for s in stamps if t0 + 0.01 < s < t1) / (t1 - t0 - 0.01)


def test_long_calls_release_the_gil():
    n = 6000  # long enough (a few hundred ms) even on an idle AVX-512 core
    q = np.ones((n, 4, 64), dtype=np.float32)
    o, lse = np.zeros_like(q), np.zeros((n, 4, 1), dtype=np.float32)
    frags = np.array([[0, 0, n, 0, n]], dtype=np.int64)
    calls = {
        "simulate": lambda: libra.simulate({"source": "builtin:paper-256k", "windows": 1, "threads": 1}),
        "kernel_forward": lambda: libra._libra.kernel_forward(view(q), view(q), view(q), view(o), view(lse), frags),
    }
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        # A call that releases the GIL lets this thread loop at a good fraction of its speed during a
        # sleep; one that holds it (a C loop such as sum(range(n))) leaves it a few percent, from the
        # thread switches around the call. Scheduling noise on a loaded machine can only lower the
        # first figure, so a few attempts are allowed.
        for name, call in calls.items():
            seen = []
            for _ in range(4):
                _, free = ran_inside(lambda: time.sleep(0.2))
                _, held = ran_inside(lambda: sum(range(20_000_000)))
                seconds, ran = ran_inside(call)
                seen.append((round(free), round(held), round(ran), round(seconds, 3)))
                if held < 0.2 * free < ran and seconds > 0.05:
                    break
            else:
                raise AssertionError(f"{name}: (free, held, during call, seconds) = {seen}")
    finally:
        sys.setswitchinterval(old)


def test_place_window_node_interleave_against_a_serpentine_reference():
    seqs = libra.pack([int(x) for x in np.random.default_rng(5).integers(1, 200, size=800)], 256)["sequences"][:32]
    f = [sum(l * l for l in s) for s in seqs]
    plain = libra.place_window(seqs, 8)
    mixed = libra.place_window(seqs, 8, interleave_cp=2, interleave_gpus_per_node=4)  # 2 slots per node, 4 nodes
    assert list(mixed["loads"]) == list(plain["loads"]) and mixed["imbalance"] == plain["imbalance"]
    for pool, got in zip(plain["pools"], mixed["pools"]):
        # Reference: heaviest first (ties: lower slot), dealt 0 1 2 3 3 2 1 0 over the nodes.
        ranked = sorted(range(8), key=lambda s: (-f[pool[s]], s))
        node_of_rank = [0, 1, 2, 3, 3, 2, 1, 0]
        want = [None] * 8
        filled = [0] * 4
        for rank, s in enumerate(ranked):
            n = node_of_rank[rank]
            want[2 * n + filled[n]] = pool[s]
            filled[n] += 1
        assert got == want
    # A slot filling a node, or slots straddling nodes: the plain order.
    assert libra.place_window(seqs, 8, interleave_cp=4, interleave_gpus_per_node=4)["pools"] == plain["pools"]
    assert libra.place_window(seqs, 8, interleave_cp=3, interleave_gpus_per_node=8)["pools"] == plain["pools"]
    with pytest.raises(ValueError, match="slot interleave: cp -1"):
        libra.place_window(seqs, 8, interleave_cp=-1, interleave_gpus_per_node=8)
    with pytest.raises(ValueError, match="not with mode vrsp-elastic"):
        libra.place_window(seqs, 8, mode="vrsp-elastic", dp=16, interleave_cp=2, interleave_gpus_per_node=4)
