"""Multi-process harness for the PyTorch plugin's tests: runs a function on N local ranks, each
with a gloo process group and a fusco communicator made from it, and reports every rank's
failure (with its traceback) to the test.

CPU runs fork the pytest process (torch is already imported, so a launch costs a fraction of a
second); CUDA runs spawn fresh interpreters (CUDA cannot be used after fork), all ranks sharing
the visible GPUs round-robin.
"""
import datetime
import os
import queue
import shutil
import sys
import tempfile
import time
import traceback

import multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PLUGIN = os.path.join(REPO, "plugins", "torch")
if PLUGIN not in sys.path:
    sys.path.insert(0, PLUGIN)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fusco  # noqa: E402

# fusco's own timeout in the tests: a broken test fails in a minute, never hangs for 5.
COMM_TIMEOUT_MS = 60000

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="no CUDA device visible to torch (the CUDA variant runs on a GPU machine with a "
               "CUDA build of torch)")),
]


class Rank:
    """What a rank's test body gets."""

    def __init__(self, rank, nranks, device, comm):
        self.rank, self.nranks, self.device, self.comm = rank, nranks, torch.device(device), comm
        if self.device.type == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())

    def gen(self, seed):
        """A CPU generator seeded per (test seed, rank): data is made on the host, then moved."""
        return torch.Generator().manual_seed(seed * 1009 + self.rank)


def _child(rank, nranks, init, device, make_comm, fn, args, results):
    try:
        torch.set_num_threads(1)
        if device == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=nranks,
                                timeout=datetime.timedelta(seconds=120))
        comm = None
        if make_comm:
            comm = fusco.Communicator.from_process_group(device=device,
                                                         timeout_ms=COMM_TIMEOUT_MS)
        try:
            out = fn(Rank(rank, nranks, device, comm), *args)
        finally:
            if comm is not None:
                comm.destroy()
        results.put((rank, None, out))
    except BaseException:  # noqa: B902 - every failure goes back to the test
        results.put((rank, traceback.format_exc(), None))


def run_ranks(nranks, fn, *args, device="cpu", timeout=180, comm=True):
    """Runs fn(Rank, *args) on nranks processes; returns the list of their return values (which
    must pickle: plain Python values). Fails the test with every failing rank's traceback."""
    ctx = mp.get_context("fork" if device == "cpu" else "spawn")
    tmp = tempfile.mkdtemp(prefix="fusco-torch-")
    results = ctx.Queue()
    init = "file://" + os.path.join(tmp, "store")
    procs = [ctx.Process(target=_child, args=(r, nranks, init, device, comm, fn, args, results),
                         daemon=True) for r in range(nranks)]
    for p in procs:
        p.start()
    got, errors = {}, {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) + len(errors) < nranks:
            if errors:  # the others may wait on the failed rank: give them a moment to report
                deadline = min(deadline, time.monotonic() + 15)
            try:
                rank, err, out = results.get(timeout=0.5)
                (errors if err else got)[rank] = err or out
                continue
            except queue.Empty:
                pass
            for r, p in enumerate(procs):
                if r not in got and r not in errors and p.exitcode not in (None, 0):
                    errors[r] = "rank %d died with exit code %s" % (r, p.exitcode)
            if time.monotonic() > deadline:
                for r in range(nranks):
                    if r not in got and r not in errors:
                        errors[r] = "rank %d did not finish within %s s" % (r, timeout)
                break
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(tmp, ignore_errors=True)
    if errors:
        pytest.fail("\n".join("---- rank %d:\n%s" % (r, errors[r]) for r in sorted(errors)),
                    pytrace=False)
    return [got[r] for r in range(nranks)]
