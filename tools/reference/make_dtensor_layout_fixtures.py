"""Writes tests/fixtures/dtensor-layouts/layouts.json: which global elements every rank holds under
PyTorch DTensor, for seeded random meshes, shapes and placements, so that dtensor/spec.cc's shard
math can be checked against the real thing (tests/dtensor/pytorch_layouts_test.cc).

    tools/reference/.venv/bin/python tools/reference/make_dtensor_layout_fixtures.py

Every case runs on real torch.distributed ranks: one gloo process per rank (torch.multiprocessing,
spawn), a DeviceMesh from init_device_mesh("cpu", mesh), and the global tensor arange(numel)
reshaped to the case's shape, so a rank's local tensor *is* the list of global (flat, row-major)
indices it holds. Two kinds of case:

  distribute  distribute_tensor(x, mesh, placements, src_data_rank=None) with placements drawn from
              R, Shard(d) and _StridedShard(d, split_factor=sf) (torch.distributed.tensor.
              placement_types._StridedShard), biased towards nesting one tensor dim over several
              mesh dims. src_data_rank=None is the path on which every rank cuts its own piece
              with the placements' own split functions; for cases without _StridedShard the script
              also runs the scatter path (src_data_rank=0) and checks that it gives the same local
              tensors. (The scatter path raises AssertionError for uneven _StridedShard pieces in
              torch 2.15: _StridedShard._split_tensor reports pad sizes but does not pad, and
              _shard_tensor asserts equal shapes before mesh_scatter.) Each rank also records
              PyTorch's compute_local_shape_and_global_offset for its coordinate.
  order       a non-default DTensorSpec.shard_order (one tensor dim sharded over several mesh dims
              in an execution order other than left to right): PyTorch's own redistribute
              (_redistribute.redistribute_local_tensor from all-Replicate to the spec with that
              shard_order) cuts the pieces. The case also records the placements that PyTorch's
              DTensorSpec._convert_shard_order_to_StridedShard gives for that order and the layout
              distribute_tensor gives for *those* placements, i.e. whether PyTorch's _StridedShard
              encoding of the order reproduces the order's layout.

Record per rank (ranks in row-major mesh order = global rank):
    [local_shape, global_offset or null, index ranges or null]
index ranges: per tensor dim, the global indices along that dim of the local tensor's rows, in the
local tensor's order, as [start, stop) runs of consecutive indices. The script derives them from
the local tensor's values and asserts that x[ix_(indices)] equals the local tensor element for
element, so the record is lossless. null when the local tensor is empty (no element to read an
index from; its shape is still recorded).

The output is deterministic for a given torch version (seeded case generation, no randomness in
the layouts). The committed fixture was made with torch 2.15.0 (the PyPI wheel, CPU only used).
"""
import argparse
import datetime
import json
import math
import os
import random
import sys
import tempfile
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SEED = 16
NUM_DISTRIBUTE = 360
NUM_ORDER = 120
MAX_RANKS = 8
MAX_NUMEL = 4096
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures",
                   "dtensor-layouts", "layouts.json")

# Named cases first: the tables of shared/reference/local-shape-examples.md and upstream tests.
ANCHORS = [
    ([4], [10, 4], "S(0)"),
    ([4], [5, 4], "S(0)"),
    ([8], [2, 3], "S(0)"),
    ([4, 2], [13, 2], "S(0),S(0)"),
    ([4, 2], [18, 2], "S(0),S(0)"),
    ([2, 2], [9, 5], "S(0),S(1)"),
    ([2, 2], [8, 8], "S(0),S(0)"),
    ([2, 2], [8, 8], "_S(0,2),S(0)"),
    ([4, 2], [15, 5], "_S(0,2),S(0)"),
    ([4, 2], [39, 2], "_S(0,3),_S(0,4)"),
    ([4], [9, 1], "_S(0,2)"),
    ([2, 2, 2], [16, 16], "_S(0,2),S(0),S(0)"),
    ([2, 2, 2], [39, 2], "S(0),_S(0,2),S(0)"),
    ([3, 2], [7, 3], "_S(0,2),S(0)"),
    ([2, 4], [24, 24], "S(0),R"),
    ([2, 4], [24, 24], "R,S(0)"),
]
ORDER_ANCHORS = [
    # mesh, shape, placements, {tensor dim: mesh dims in execution order}
    ([2, 2], [8, 8], "S(0),S(0)", {0: [1, 0]}),
    ([3, 2], [7, 3], "S(0),S(0)", {0: [1, 0]}),
    ([4, 2], [15, 5], "S(0),S(0)", {0: [1, 0]}),
    ([2, 2, 2], [16, 2], "S(0),S(0),S(0)", {0: [2, 0, 1]}),
    ([2, 2, 2], [11, 2], "S(0),S(0),S(0)", {0: [2, 0, 1]}),
]


# ---- case generation (pure Python, seeded) ------------------------------------------------------

def gen_mesh(rng, min_dims=1):
    ndim = rng.choice([d for d in (1, 2, 2, 3, 3) if d >= min_dims])
    while True:
        sizes = [rng.choice([1, 2, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8]) for _ in range(ndim)]
        n = math.prod(sizes)
        if n <= MAX_RANKS and (n > 1 or rng.random() < 0.05):
            return sizes


def gen_dim(rng):
    r = rng.random()
    if r < 0.07:
        return 0
    if r < 0.30:
        return rng.randint(1, 3)   # smaller than most meshes
    return rng.randint(4, 19)


def gen_shape(rng):
    while True:
        shape = [gen_dim(rng) for _ in range(rng.choice([1, 2, 2, 3]))]
        if math.prod(shape) <= MAX_NUMEL:
            return shape


def gen_placements(rng, mesh, ndim):
    focus = rng.randrange(ndim)
    out = []
    for _ in mesh:
        r = rng.random()
        if r < 0.2:
            out.append("R")
            continue
        d = focus if rng.random() < 0.75 else rng.randrange(ndim)
        if r < 0.55:
            out.append(f"S({d})")
        else:
            out.append(f"_S({d},{rng.choice([1, 2, 2, 3, 4, 5])})")
    return ",".join(out)


def gen_order_case(rng):
    while True:
        mesh = gen_mesh(rng, min_dims=2)
        if sum(1 for s in mesh if s > 1) >= 2:
            break
    shape = gen_shape(rng)
    focus = rng.randrange(len(shape))
    placements, by_dim = [], {}
    for i in range(len(mesh)):
        r = rng.random()
        if r < 0.7:
            d = focus
        elif r < 0.85 or len(shape) == 1:
            placements.append("R")
            continue
        else:
            d = rng.randrange(len(shape))
        placements.append(f"S({d})")
        by_dim.setdefault(d, []).append(i)
    order = {}
    for d, dims in by_dim.items():
        perm = list(dims)
        if len(perm) >= 2:
            while perm == sorted(perm):
                rng.shuffle(perm)
        order[d] = perm
    if not any(len(v) >= 2 for v in order.values()):
        return gen_order_case(rng)
    return mesh, shape, ",".join(placements), order


def make_cases():
    rng = random.Random(SEED)
    cases = []
    for mesh, shape, pl in ANCHORS:
        cases.append({"kind": "distribute", "mesh": mesh, "shape": shape, "placements": pl})
    while len(cases) < NUM_DISTRIBUTE:
        mesh = gen_mesh(rng)
        shape = gen_shape(rng)
        cases.append({"kind": "distribute", "mesh": mesh, "shape": shape,
                      "placements": gen_placements(rng, mesh, len(shape))})
    for mesh, shape, pl, order in ORDER_ANCHORS:
        cases.append({"kind": "order", "mesh": mesh, "shape": shape, "placements": pl,
                      "order": order})
    while len(cases) < NUM_DISTRIBUTE + NUM_ORDER:
        mesh, shape, pl, order = gen_order_case(rng)
        cases.append({"kind": "order", "mesh": mesh, "shape": shape, "placements": pl,
                      "order": order})
    for i, c in enumerate(cases):
        c["id"] = i
    return cases


# ---- PyTorch side (runs on every rank) ----------------------------------------------------------

def parse_placements(text):
    # "R,S(0),_S(1,2)" -> torch placements (R has no parentheses, so split by hand).
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard
    out, i = [], 0
    while i < len(text):
        if text[i] == ",":
            i += 1
        elif text.startswith("R", i):
            out.append(Replicate())
            i += 1
        else:
            j = text.index(")", i)
            body = text[i:j + 1]
            if body.startswith("S("):
                out.append(Shard(int(body[2:-1])))
            elif body.startswith("_S("):
                d, sf = body[3:-1].split(",")
                out.append(_StridedShard(int(d), split_factor=int(sf)))
            else:
                raise ValueError(text)
            i = j + 1
    return out


def placements_text(placements):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard
    out = []
    for p in placements:
        if isinstance(p, _StridedShard):
            out.append(f"_S({p.dim},{int(p.split_factor)})")
        elif isinstance(p, Shard):
            out.append(f"S({p.dim})")
        elif isinstance(p, Replicate):
            out.append("R")
        else:
            raise ValueError(p)
    return ",".join(out)


def runs(indices):
    out = []
    for v in indices:
        if out and out[-1][1] == v:
            out[-1][1] += 1
        else:
            out.append([v, v + 1])
    return out


def record(local, shape, offset):
    local_shape = list(local.shape)
    if local.numel() == 0:
        return [local_shape, offset, None]
    vals = local.numpy()
    coords = np.unravel_index(vals, shape)
    lists = []
    for k in range(len(shape)):
        sl = [0] * len(shape)
        sl[k] = slice(None)
        lists.append([int(v) for v in coords[k][tuple(sl)]])
    full = np.arange(math.prod(shape)).reshape(shape)
    if not np.array_equal(full[np.ix_(*lists)], vals):
        raise AssertionError(f"local tensor is not a product of per-dim index lists: {vals}")
    return [local_shape, offset, [runs(l) for l in lists]]


def run_case(case, mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta
    from torch.distributed.tensor._redistribute import redistribute_local_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import _StridedShard

    shape = case["shape"]
    x = torch.arange(math.prod(shape), dtype=torch.int64).reshape(shape)
    placements = parse_placements(case["placements"])
    assert placements_text(placements) == case["placements"], case
    result = {}
    if case["kind"] == "distribute":
        d = distribute_tensor(x, mesh, placements, src_data_rank=None)
        local = d.to_local()
        if not any(isinstance(p, _StridedShard) for p in placements):
            scattered = distribute_tensor(x, mesh, placements).to_local()
            if not torch.equal(scattered, local):
                raise AssertionError(f"case {case['id']}: scatter path differs from local split")
        lshape, offset = compute_local_shape_and_global_offset(x.shape, mesh, placements)
        rec = record(local, shape, [int(o) for o in offset])
        result["ranks"] = rec
        result["torch_local_shape"] = [int(s) for s in lshape]
    else:
        order = tuple(ShardOrderEntry(tensor_dim=d, mesh_dims=tuple(ms))
                      for d, ms in sorted(case["order"].items()))
        meta = TensorMeta(x.shape, x.stride(), x.dtype)
        src = DTensorSpec(mesh, tuple(Replicate() for _ in placements), meta)
        dst = DTensorSpec(mesh, tuple(placements), meta, shard_order=order)
        local = redistribute_local_tensor(x, src, dst)
        result["ranks"] = record(local, shape, None)
        strided = DTensorSpec._convert_shard_order_to_StridedShard(order, tuple(placements), mesh)
        result["strided"] = placements_text(strided)
        s_local = distribute_tensor(x, mesh, list(strided), src_data_rank=None).to_local()
        _, s_offset = compute_local_shape_and_global_offset(x.shape, mesh, list(strided))
        result["strided_ranks"] = record(s_local, shape, [int(o) for o in s_offset])
    return result


def worker(rank, world, init_file, cases, out_dir):
    try:
        from torch.distributed.device_mesh import init_device_mesh
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=120))
        meshes, results = {}, []
        for case in cases:
            key = tuple(case["mesh"])
            if key not in meshes:
                meshes[key] = init_device_mesh("cpu", key)
            results.append(run_case(case, meshes[key]))
        with open(os.path.join(out_dir, f"{world}_{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        with open(os.path.join(out_dir, f"{world}_{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        sys.exit(1)


def run_world(world, cases, out_dir):
    init_file = tempfile.mktemp(prefix="dt_layouts_", dir=out_dir)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, world, init_file, cases, out_dir))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
    for p in procs:
        if p.is_alive():
            p.kill()
    if failed:
        for r in failed:
            err = os.path.join(out_dir, f"{world}_{r}.err")
            if os.path.exists(err):
                sys.stderr.write(open(err).read())
        raise SystemExit(f"world {world}: ranks {failed} failed")
    per_rank = [json.load(open(os.path.join(out_dir, f"{world}_{r}.json"))) for r in range(world)]
    return [[per_rank[r][i] for r in range(world)] for i in range(len(cases))]


def stats(cases):
    """Coverage of the distribute cases (mesh dims of size 1 do not shard)."""
    out = {"mesh_1d": 0, "mesh_2d": 0, "mesh_3d": 0, "with_strided_shard": 0,
           "nested_one_dim_over_several_mesh_dims": 0, "nested_with_strided_shard": 0,
           "uneven": 0, "dim_smaller_than_its_shard_count": 0, "zero_size_dim": 0}
    for c in cases:
        if c["kind"] != "distribute":
            continue
        mesh, shape = c["mesh"], c["shape"]
        pls = parse_placements(c["placements"])
        out[f"mesh_{len(mesh)}d"] += 1
        by_dim = {}
        for i, p in enumerate(pls):
            if hasattr(p, "dim") and mesh[i] > 1:
                by_dim.setdefault(p.dim, []).append((mesh[i], type(p).__name__ == "_StridedShard"))
        out["with_strided_shard"] += any(type(p).__name__ == "_StridedShard" for p in pls)
        out["nested_one_dim_over_several_mesh_dims"] += any(len(v) >= 2 for v in by_dim.values())
        out["nested_with_strided_shard"] += any(len(v) >= 2 and any(s for _, s in v)
                                                for v in by_dim.values())
        ways = {d: math.prod(k for k, _ in v) for d, v in by_dim.items()}
        out["uneven"] += any(shape[d] % k for d, k in ways.items())
        out["dim_smaller_than_its_shard_count"] += any(shape[d] < k for d, k in ways.items())
        out["zero_size_dim"] += 0 in shape
    return out


def dumps_case(case):
    # One line per case and per rank list keeps the file small and diffable.
    head = {k: case[k] for k in ("id", "kind", "mesh", "shape", "placements")}
    if case["kind"] == "order":
        head["order"] = [[d, ms] for d, ms in sorted(case["order"].items())]
        head["strided"] = case["strided"]
    parts = [json.dumps(head, separators=(",", ":"))[:-1]]
    parts.append('"ranks":' + json.dumps(case["ranks"], separators=(",", ":")))
    if case["kind"] == "order":
        parts.append('"strided_ranks":' + json.dumps(case["strided_ranks"], separators=(",", ":")))
    return ",\n   ".join(parts) + "}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    cases = make_cases()
    by_world = {}
    for c in cases:
        by_world.setdefault(math.prod(c["mesh"]), []).append(c)
    with tempfile.TemporaryDirectory(prefix="dt_layouts_") as tmp:
        for world in sorted(by_world):
            group = by_world[world]
            print(f"world {world}: {len(group)} cases", flush=True)
            for c, per_rank in zip(group, run_world(world, group, tmp)):
                c["ranks"] = [r["ranks"] for r in per_rank]
                # compute_local_shape_and_global_offset against the real local tensors.
                for r in per_rank:
                    if "torch_local_shape" in r and r["torch_local_shape"] != r["ranks"][0]:
                        raise AssertionError(f"case {c['id']}: compute_local_shape_and_global_offset "
                                             f"says {r['torch_local_shape']}, local is {r['ranks'][0]}")
                if c["kind"] == "order":
                    c["strided"] = per_rank[0]["strided"]
                    c["strided_ranks"] = [r["strided_ranks"] for r in per_rank]

    kinds = {k: sum(1 for c in cases if c["kind"] == k) for k in ("distribute", "order")}
    strided_mismatch = sum(
        1 for c in cases if c["kind"] == "order"
        and [(r[0], r[2]) for r in c["ranks"]] != [(r[0], r[2]) for r in c["strided_ranks"]])
    meta = {
        "generator": "tools/reference/make_dtensor_layout_fixtures.py",
        "torch": torch.__version__,
        "seed": SEED,
        "global_tensor": "arange(numel).reshape(shape); rank r = row-major mesh coordinate",
        "rank_record": "[local_shape, global_offset|null, per-dim [start,stop) runs in local order|null if empty]",
        "counts": kinds,
        "distribute_coverage": stats(cases),
        "order_cases_where_pytorch_strided_encoding_differs_from_the_order": strided_mismatch,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write('{"meta": ' + json.dumps(meta, indent=1) + ',\n "cases": [\n  ')
        f.write(",\n  ".join(dumps_case(c) for c in cases))
        f.write("\n ]\n}\n")
    json.load(open(args.out))  # well-formed
    print(f"wrote {args.out}: {len(cases)} cases {kinds}, {os.path.getsize(args.out)} bytes; "
          f"order cases whose _StridedShard encoding differs in PyTorch itself: {strided_mismatch}")


if __name__ == "__main__":
    main()
