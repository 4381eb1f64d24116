"""The all-gather of the DeepEP-compatible module's count exchange, on fusco's grouped row
exchange (fusco/_rows.py)."""
import torch

from .._rows import exchange


def all_gather_rows(comm, row, what):
    """Every rank's `row` (a 1-D tensor of the same length and dtype on every rank), stacked in
    rank order: [nranks, len]. One fusco group; row 0 of this rank goes to every peer."""
    n = comm.nranks
    src = row.reshape(1, -1).contiguous()
    out = torch.empty((n, src.shape[1]), dtype=src.dtype, device=src.device)
    zeros = torch.zeros(n, dtype=torch.int64, device=src.device)
    ranks = torch.arange(n, dtype=torch.int64, device=src.device)
    ones = [1] * n
    exchange(comm, [(src, out)], zeros, ones, ranks, ones, what)
    return out
