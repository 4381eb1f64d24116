"""Grouped row exchanges: one fusco group of gather-sends and scatter-receives (docs/API.md,
"Groups, send/receive and row lists") that moves the rows of one or more tensors with the same
row lists. fusco.all_to_all moves one tensor with it; fusco.deep_ep moves a dispatch's or a
combine's tensors together, so each is one fusco operation."""
import math

from . import _lib
from .comm import FuscoError, check


def row_bytes(t):
    return math.prod(t.shape[1:]) * t.element_size() if t.dim() > 0 else 0


def _ptr(t, nrows):
    return t.data_ptr() if nrows and t.numel() else None


def exchange(comm, moves, send_rows, send_splits, recv_rows, recv_splits, what):
    """For every peer p and every (input, output) of `moves`: the rows
    send_rows[sum(send_splits[:p]) :][: send_splits[p]] of input go to p, which writes them to its
    output's rows recv_rows[...] in order. Host lists of splits; contiguous tensors in the comm's
    memory; a row list is a 1-D int64 tensor. Every rank posts the same moves, in the same order,
    and every peer gets a send and a receive per move (possibly of 0 rows), so the group always
    pairs; it is always ended, so the thread's group state stays clean. Raises FuscoError with
    fusco's message for the first call that failed, else with `what` if the group failed."""
    lib = _lib.load()
    h = comm.handle
    stream = comm.stream()
    sp = send_rows.data_ptr() if send_rows.numel() else 0
    rp = recv_rows.data_ptr() if recv_rows.numel() else 0
    first = None
    check(lib.fuscoGroupStart(), h, "fuscoGroupStart")
    so = ro = 0
    for p in range(comm.nranks):
        ns, nr = send_splits[p], recv_splits[p]
        for inp, out in moves:
            rb = row_bytes(inp)
            r = lib.fuscoGatherSend(_ptr(inp, ns), sp + 8 * so if ns else None, ns, rb, p, h,
                                    stream)
            if r != _lib.SUCCESS and first is None:
                first = (r, lib.fuscoGetLastError(h))
            r = lib.fuscoScatterRecv(_ptr(out, nr), rp + 8 * ro if nr else None, nr, rb, p, h,
                                     stream)
            if r != _lib.SUCCESS and first is None:
                first = (r, lib.fuscoGetLastError(h))
        so += ns
        ro += nr
    r = lib.fuscoGroupEnd()
    if first is not None:
        raise FuscoError(first[0], (first[1] or b"").decode("utf-8", "replace"))
    check(r, h, what)
