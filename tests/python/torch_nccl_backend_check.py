#!/usr/bin/env python3
"""PyTorch's own NCCL backend through fusco's NCCL shim (docs/TESTING.md, "The GPU check").

    LD_PRELOAD=<bundle>/lib/shim/libnccl.so.2 FUSCO_NCCL_MODE=standalone \\
        python3 torch_nccl_backend_check.py [--nprocs 4] [--timeout 120]

NPROCS processes on one GPU (cuda:0) join a process group with backend "nccl" and run
dist.all_to_all_single (even and uneven splits, zero-sized blocks included) and dist.all_to_all
(lists of tensors, uneven) in float32, bfloat16 and int64. Every output starts poisoned and is
compared byte for byte with the reference made from every rank's seeded inputs. Each rank also
checks that the shim (libfusco_nccl) is what serves NCCL in its process.

Prints one line per rank and case and "torch_nccl_backend_check: OK" when every rank passed.
Exit status: 0 passed, 1 a mismatch, an error or a timeout, 77 no CUDA device (reason printed).
`--backend gloo` runs the same cases on CPU tensors without the shim (a check of this script).
"""
import argparse
import datetime
import multiprocessing as mp
import os
import socket
import sys
import time
import traceback

DTYPES = ["float32", "bfloat16", "int64"]
POISON = 0x5A  # every byte of an output before the call


def count(src, dst, case):
    """Rows rank src sends to rank dst in uneven case `case`; some blocks are empty."""
    if (src + 2 * dst + case) % 4 == 0:
        return 0
    return 1 + (3 * src + 5 * dst + 7 * case) % 6


def rank_input(torch, src, dst_rows, width, dtype, seed):
    """Rank src's send rows (sum(dst_rows) x width), the same on every rank for a seed."""
    g = torch.Generator().manual_seed(seed * 1000 + src)
    n = sum(dst_rows)
    if dtype == torch.int64:
        return torch.randint(-(2**40), 2**40, (n, width), generator=g, dtype=torch.int64)
    return (torch.randn((n, width), generator=g) * 100).to(dtype)


def blocks(t, rows):
    out, at = [], 0
    for r in rows:
        out.append(t[at : at + r])
        at += r
    return out


def same_bytes(torch, got, want):
    got, want = got.contiguous().cpu(), want.contiguous()
    if got.shape != want.shape:
        return False
    if got.numel() == 0:
        return True
    return torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8))


def poisoned(torch, shape, dtype, device):
    t = torch.empty(shape, dtype=dtype, device=device)
    t.view(-1).view(torch.uint8).fill_(POISON) if t.numel() else None
    return t


def run_cases(torch, dist, rank, n, device, backend):
    """Yields (name, ok, detail) for each case on this rank."""
    width = 3
    for di, dname in enumerate(DTYPES):
        dtype = getattr(torch, dname)
        for mode in ("even", "uneven", "list"):
            if backend == "gloo" and (mode == "list" or dname == "bfloat16"):
                continue  # gloo has no all_to_all of tensor lists, nor bfloat16 all-to-all
            seed = 10 * di + ("even", "uneven", "list").index(mode) + 1
            case = seed

            def rows(src, dst):
                return 4 if mode == "even" else count(src, dst, case)

            inputs = [rank_input(torch, s, [rows(s, d) for d in range(n)], width, dtype, seed)
                      for s in range(n)]
            want = torch.cat([blocks(inputs[s], [rows(s, d) for d in range(n)])[rank]
                              for s in range(n)])
            send = inputs[rank].to(device)
            in_rows = [rows(rank, d) for d in range(n)]
            out_rows = [rows(s, rank) for s in range(n)]
            name = f"{'all_to_all' if mode == 'list' else 'all_to_all_single'} {mode} {dname}"
            if mode == "list":
                outs = [poisoned(torch, (r, width), dtype, device) for r in out_rows]
                dist.all_to_all(outs, [b.contiguous() for b in blocks(send, in_rows)])
                torch.cuda.synchronize() if device != "cpu" else None
                got = torch.cat([o.cpu() for o in outs])
            else:
                out = poisoned(torch, (sum(out_rows), width), dtype, device)
                if mode == "even":
                    dist.all_to_all_single(out, send)
                else:
                    dist.all_to_all_single(out, send, output_split_sizes=out_rows,
                                           input_split_sizes=in_rows)
                torch.cuda.synchronize() if device != "cpu" else None
                got = out.cpu()
            ok = same_bytes(torch, got, want)
            yield name, ok, "" if ok else f"rows {out_rows}: first got {got[:2].tolist()}, " \
                                          f"want {want[:2].tolist()}"


def shim_loaded():
    with open("/proc/self/maps") as f:
        return "libfusco_nccl" in f.read()


def rank_main(rank, n, port, backend, queue):
    lines, failed = [], False
    try:
        import torch
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        device = "cpu"
        if backend == "nccl":
            torch.cuda.set_device(0)
            device = "cuda:0"
        dist.init_process_group(backend, rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=60))
        for name, ok, detail in run_cases(torch, dist, rank, n, device, backend):
            lines.append(f"rank {rank}: {name}: {'exact' if ok else 'WRONG ' + detail}")
            failed |= not ok
        if backend == "nccl" and not shim_loaded():
            lines.append(f"rank {rank}: libfusco_nccl is not loaded: NCCL was not the shim "
                         "(set LD_PRELOAD=<bundle>/lib/shim/libnccl.so.2)")
            failed = True
        dist.destroy_process_group()
    except Exception:  # reported to the parent, which fails the check
        lines.append(f"rank {rank}: error: {traceback.format_exc()}")
        failed = True
    queue.put((rank, failed, lines))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for all ranks")
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    a = ap.parse_args()
    if a.backend == "nccl":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            print("torch_nccl_backend_check: skipped: no CUDA device for torch")
            return 77
        print(f"torch {torch.__version__}, NCCL backend, {a.nprocs} processes on cuda:0 "
              f"({torch.cuda.get_device_name(0)}), LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, a.nprocs, port, a.backend, queue))
             for r in range(a.nprocs)]
    for p in procs:
        p.start()
    results, deadline = {}, time.time() + a.timeout
    while len(results) < a.nprocs and time.time() < deadline:
        try:
            rank, failed, lines = queue.get(timeout=1.0)
            results[rank] = (failed, lines)
        except Exception:
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    bad = False
    for r in range(a.nprocs):
        if r not in results:
            print(f"rank {r}: no result within {a.timeout:.0f} s (hang or crash; exit code "
                  f"{procs[r].exitcode})")
            bad = True
            continue
        failed, lines = results[r]
        print("\n".join(lines))
        bad |= failed
    print("torch_nccl_backend_check: " + ("FAILED" if bad else "OK"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
