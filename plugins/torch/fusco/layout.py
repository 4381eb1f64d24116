"""The layout-level call: fusco.all_to_all over fuscoGatherSend / fuscoScatterRecv."""

import torch

from . import _lib
from ._rows import exchange, row_bytes
from .comm import Communicator, FuscoError, invalid

_default_comm = None


def set_default_communicator(comm):
    """The communicator that all_to_all uses when it is given none (None clears it)."""
    global _default_comm
    if comm is not None and not isinstance(comm, Communicator):
        raise invalid("fusco: set_default_communicator takes a fusco.Communicator")
    _default_comm = comm


def get_default_communicator():
    return _default_comm


def _splits(name, splits, nranks):
    if isinstance(splits, torch.Tensor):
        splits = splits.cpu().tolist()
    splits = [int(s) for s in splits]
    if len(splits) != nranks:
        raise invalid("fusco.all_to_all: %s has %d entries, one per rank (%d) expected"
                      % (name, len(splits), nranks))
    if any(s < 0 for s in splits):
        raise invalid("fusco.all_to_all: %s has a negative entry: %s" % (name, splits))
    return splits


def _check_rows(name, rows, bound, total, validate):
    if rows.dtype != torch.int64 or rows.dim() != 1:
        raise invalid("fusco.all_to_all: %s must be a 1-D int64 tensor, got %s %s"
                      % (name, rows.dtype, tuple(rows.shape)))
    if not rows.is_contiguous():
        raise invalid("fusco.all_to_all: %s must be contiguous" % name)
    if rows.numel() != total:
        raise invalid("fusco.all_to_all: %s has %d entries but its splits sum to %d"
                      % (name, rows.numel(), total))
    if validate and rows.numel() > 0:
        lo, hi = int(rows.min().item()), int(rows.max().item())
        if lo < 0 or hi >= bound:
            raise invalid("fusco.all_to_all: %s holds row %d, outside [0, %d)"
                          % (name, lo if lo < 0 else hi, bound))


def _fail_collectively(comm, err):
    """This rank's arguments are bad: it still posts one (invalid, rowBytes 0) send and receive
    per peer, so that every peer's group fails promptly instead of waiting for it; then raises."""
    lib = _lib.load()
    stream = comm.stream()
    lib.fuscoGroupStart()
    for p in range(comm.nranks):
        lib.fuscoGatherSend(None, None, 0, 0, p, comm.handle, stream)
        lib.fuscoScatterRecv(None, None, 0, 0, p, comm.handle, stream)
    lib.fuscoGroupEnd()
    raise err


def all_to_all(output, input, send_rows, recv_rows, send_splits, recv_splits, comm=None, *,
               validate=True):
    """Layout-descriptor all-to-all (the FUSCO paper's Python call).

    Rows are the first dimension of `input` and `output` (same row size in bytes, any dtype).
    The rows `send_rows[sum(send_splits[:p]) : sum(send_splits[:p+1])]` of `input` (duplicates
    allowed) go to rank p, which writes the i-th row it receives from this rank to
    `output[recv_rows[sum(recv_splits[:q]) + i]]` where q is this rank (a receive row appears at
    most once). send_splits[p] here must equal recv_splits[me] on rank p. Collective over `comm`
    (default: set_default_communicator's). send_rows / recv_rows: 1-D int64 tensors in the comm's
    memory space; the splits: host sequences (or tensors) of nranks counts. validate=True checks
    that every row index is inside its tensor (one host sync on CUDA). Returns output. Not
    differentiable (fusco.MoEDispatcher is).
    """
    if comm is None:
        comm = _default_comm
    if comm is None:
        raise FuscoError(_lib.INVALID_USAGE, "fusco.all_to_all: no communicator given and no "
                         "default set (fusco.set_default_communicator)")
    try:
        for name, t in (("output", output), ("input", input), ("send_rows", send_rows),
                        ("recv_rows", recv_rows)):
            comm.check_tensor(t, name)
        if input.dim() == 0 or output.dim() == 0:
            raise invalid("fusco.all_to_all: input and output need a row dimension")
        if not input.is_contiguous() or not output.is_contiguous():
            raise invalid("fusco.all_to_all: input and output must be contiguous")
        rb = row_bytes(input)
        if rb != row_bytes(output):
            raise invalid("fusco.all_to_all: input rows have %d bytes, output rows %d"
                          % (rb, row_bytes(output)))
        if rb == 0:
            raise invalid("fusco.all_to_all: rows of 0 bytes")
        ss = _splits("send_splits", send_splits, comm.nranks)
        rs = _splits("recv_splits", recv_splits, comm.nranks)
        _check_rows("send_rows", send_rows, input.shape[0], sum(ss), validate)
        _check_rows("recv_rows", recv_rows, output.shape[0], sum(rs), validate)
        if validate and recv_rows.numel() > 1 and \
                torch.unique(recv_rows).numel() != recv_rows.numel():
            raise invalid("fusco.all_to_all: recv_rows names a row more than once")
    except FuscoError as e:
        if comm._handle is None:
            raise
        _fail_collectively(comm, e)
    exchange(comm, [(input, output)], send_rows, ss, recv_rows, rs, "fusco.all_to_all")
    return output
