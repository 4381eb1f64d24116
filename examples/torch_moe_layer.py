#!/usr/bin/env python3
"""A small Megatron-style MoE layer trained on N local ranks, once with fusco.MoEDispatcher and once
with the pure-PyTorch reference dispatcher (permute -> all_to_all_single -> sort_chunks, as in
Megatron). Same data, same initial weights: the losses must match step by step. Prints both and
exits non-zero if they do not.

  /usr/bin/python3 examples/torch_moe_layer.py              # 4 CPU ranks, 40 steps
  FUSCO_LIBRARY=build/libfusco.so /usr/bin/python3 examples/torch_moe_layer.py --ranks 2

Expert parallelism: each rank holds num_experts / ranks experts; the router and the output head are
replicated (their gradients are averaged over the ranks, data parallel).
"""
import argparse
import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

try:
    import fusco
except ImportError:  # run from a checkout: the package lives in plugins/torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins",
                                    "torch"))
    import fusco
from fusco.reference import ReferenceDispatcher


class Expert(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MoELayer(nn.Module):
    """Router (top-k softmax) -> dispatch -> local experts -> combine, plus a residual."""

    def __init__(self, dispatcher, hidden, ffn, num_experts, topk):
        super().__init__()
        self.dispatcher, self.topk = dispatcher, topk
        torch.manual_seed(1)
        self.router = nn.Linear(hidden, num_experts, bias=False)
        experts = []
        for e in dispatcher.local_expert_indices:  # the same weights whichever rank holds e
            torch.manual_seed(100 + e)
            experts.append(Expert(hidden, ffn))
        self.experts = nn.ModuleList(experts)

    def forward(self, x):
        probs, indices = torch.topk(torch.softmax(self.router(x), dim=-1), self.topk, dim=-1)
        probs = probs / probs.sum(-1, keepdim=True)
        # The three lines of a Megatron-style layer:
        tokens, tokens_per_expert = self.dispatcher.dispatch(x, probs, indices)
        expert_out = torch.cat([expert(chunk) for expert, chunk in
                                zip(self.experts, tokens.split(tokens_per_expert.tolist()))])
        return x + self.dispatcher.combine(expert_out)


def train(dispatcher, args, rank, device):
    layer = MoELayer(dispatcher, args.hidden, args.ffn, args.experts, args.topk).to(device)
    torch.manual_seed(2)
    head = nn.Linear(args.hidden, 1).to(device)
    params = list(layer.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=args.lr)
    replicated = list(layer.router.parameters()) + list(head.parameters())
    teacher = torch.Generator().manual_seed(3)
    w_true = torch.randn(args.hidden, 1, generator=teacher)
    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(args.tokens, args.hidden, generator=g)
        y = torch.sin(x @ w_true) + 0.1 * torch.randn(args.tokens, 1, generator=g)
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(head(layer(x)), y)
        opt.zero_grad()
        loss.backward()
        for p in replicated:  # data-parallel parameters: average their gradients
            grad = p.grad.cpu()
            dist.all_reduce(grad)
            p.grad.copy_(grad / dist.get_world_size())
        opt.step()
        mean = loss.detach().cpu().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    return losses, time.perf_counter() - start


def worker(rank, args, init):
    torch.set_num_threads(1)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.ranks,
                            timeout=datetime.timedelta(seconds=300))
    with fusco.Communicator.from_process_group(device=device.type) as comm:
        ours, t_ours = train(fusco.MoEDispatcher(comm, args.experts), args, rank, device)
    ref, t_ref = train(ReferenceDispatcher(args.experts), args, rank, device)
    dist.destroy_process_group()
    if rank != 0:
        return
    print("fusco %s, %d ranks, %d experts, top-%d, %d tokens per rank, hidden %d, device %s"
          % (".".join(map(str, fusco.get_version())), args.ranks, args.experts, args.topk,
             args.tokens, args.hidden, device.type))
    print("%5s %14s %14s %10s" % ("step", "fusco", "reference", "rel.diff"))
    worst = 0.0
    for step, (a, b) in enumerate(zip(ours, ref)):
        rel = abs(a - b) / max(abs(b), 1e-12)
        worst = max(worst, rel)
        print("%5d %14.8f %14.8f %10.2e" % (step, a, b, rel))
    print("time: fusco %.2f s, reference %.2f s (%d steps; CPU timings on a shared machine are "
          "only indicative)" % (t_ours, t_ref, args.steps))
    if not worst <= args.rtol:
        print("FAIL: the losses differ by up to %.2e (tolerance %.0e)" % (worst, args.rtol))
        sys.exit(1)
    if not ours[-1] < ours[0]:
        print("FAIL: the loss did not go down (%.6f -> %.6f)" % (ours[0], ours[-1]))
        sys.exit(1)
    print("OK: the losses match step by step (max relative difference %.2e)" % worst)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per rank and step")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--ffn", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--rtol", type=float, default=1e-4, help="allowed relative loss difference")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fusco-moe-") as tmp:
        init = "file://" + os.path.join(tmp, "store")
        try:
            mp.start_processes(worker, args=(args, init), nprocs=args.ranks, join=True,
                               start_method="spawn")
        except mp.ProcessExitedException as e:
            print("torch_moe_layer: %s" % e, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
