#!/usr/bin/env python3
"""What the DeepEP-compatible module (fusco.deep_ep) costs over fusco's native MoE calls, on
local host ranks (CPU tensors, gloo groups, forked processes): per iteration, the native path is
fuscoMoePlan + fuscoMoeDispatch + fuscoMoeCombine (RANK dedup, unweighted combine) through the
plugin's Route, and the deep_ep path is get_dispatch_layout + dispatch + combine, on the same
routing and rows. Both run alternately in one process, the same number of times; the report is
the median time of each and their ratio (deep_ep / native), as rank 0 saw it (docs: perf/README.md).

    /usr/bin/python3 perf/deep_ep_overhead.py --ranks 4 --tokens 1024 --hidden 2048 --experts 32 \\
        --topk 8 --iters 30
"""
import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "plugins", "torch"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import fusco  # noqa: E402
import fusco.deep_ep as deep_ep  # noqa: E402
from fusco import _lib  # noqa: E402
from fusco.dispatcher import Route  # noqa: E402


def native_step(comm, cfg, placement, topk_idx, x, n_local):
    route = Route(comm, cfg, topk_idx, placement, n_local, 0, False)
    rows = route.dispatch(x)
    out = route.combine(rows, None)
    route.close()
    return out


def deep_ep_step(buf, topk_idx, x, experts):
    per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx, experts)
    recv, _, _, _, handle, _ = buf.dispatch(x, num_tokens_per_rank=per_rank,
                                            num_tokens_per_rdma_rank=per_rdma,
                                            is_token_in_rank=in_rank,
                                            num_tokens_per_expert=per_expert, topk_idx=topk_idx,
                                            topk_weights=torch.ones(topk_idx.shape))
    out, _, _ = buf.combine(recv, handle)
    return out


def rank_main(rank, a, init, results):
    torch.set_num_threads(1)
    os.environ["FUSCO_DEEP_EP_DEVICE"] = "cpu"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=a.ranks,
                            timeout=datetime.timedelta(seconds=300))
    comm = fusco.Communicator.from_process_group()
    buf = deep_ep.Buffer(dist.group.WORLD, 0, 0)
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(a.tokens, a.hidden, generator=g).to(torch.bfloat16)
    scores = torch.randn(a.tokens, a.experts, generator=g).abs() + 1
    topk_idx = torch.topk(scores, a.topk, dim=-1).indices.contiguous()
    n_local = a.experts // a.ranks
    placement = torch.arange(a.experts, dtype=torch.int64) // n_local
    cfg = _lib.MoeConfig()
    cfg.numExperts = a.experts
    cfg.dedup = _lib.DEDUP["rank"]
    times = {"native": [], "deep_ep": []}
    for it in range(a.warmup + a.iters):
        order = ("native", "deep_ep") if it % 2 == 0 else ("deep_ep", "native")
        for which in order:
            dist.barrier()
            t0 = time.perf_counter()
            if which == "native":
                native_step(comm, cfg, placement, topk_idx, x, n_local)
            else:
                deep_ep_step(buf, topk_idx, x, a.experts)
            dist.barrier()
            if it >= a.warmup:
                times[which].append(time.perf_counter() - t0)
    del buf
    comm.destroy()
    if rank == 0:
        results.put({k: statistics.median(v) for k, v in times.items()})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="fusco-deepep-perf-") as tmp:
        init = "file://" + os.path.join(tmp, "store")
        procs = [ctx.Process(target=rank_main, args=(r, a, init, results))
                 for r in range(a.ranks)]
        for proc in procs:
            proc.start()
        med = results.get(timeout=1800)
        for proc in procs:
            proc.join()
    bad = [i for i, proc in enumerate(procs) if proc.exitcode != 0]
    if bad:
        print("deep_ep_overhead: rank(s) %s failed" % bad, file=sys.stderr)
        return 1
    print("deep_ep_overhead: %d host ranks, %d tokens x %d bf16, %d experts, top-%d, %d iterations"
          % (a.ranks, a.tokens, a.hidden, a.experts, a.topk, a.iters))
    print("  native (plan + dispatch + combine): %.3f ms" % (med["native"] * 1e3))
    print("  deep_ep (layout + dispatch + combine): %.3f ms" % (med["deep_ep"] * 1e3))
    print("  deep_ep / native: %.3f" % (med["deep_ep"] / med["native"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
