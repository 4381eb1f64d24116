"""fusco.all_to_all (fuscoGatherSend / fuscoScatterRecv in a group) against a reference that knows
every rank's inputs."""
import time

import pytest
import torch

from harness import DEVICES, fusco, run_ranks

POISON = -7


def _layout(nranks, seed):
    """The same random layout on every rank: per (src, dst) the rows src sends (duplicates
    allowed, some pairs empty), and per dst where they land (distinct rows, some never written)."""
    g = torch.Generator().manual_seed(seed)
    n_in = [int(torch.randint(1, 7, (1,), generator=g)) for _ in range(nranks)]
    count = torch.randint(0, 5, (nranks, nranks), generator=g)
    count[0, nranks - 1] = 0  # at least one empty pair
    send = [[torch.randint(0, n_in[s], (int(count[s, d]),), generator=g) for d in range(nranks)]
            for s in range(nranks)]
    n_out, recv = [], []
    for d in range(nranks):
        total = int(count[:, d].sum())
        n_out.append(total + 2)
        perm = torch.randperm(total + 2, generator=g)[:total]
        recv.append(list(torch.split(perm, count[:, d].tolist())))
    return n_in, count, send, n_out, recv


def _rows(src, n, shape, dtype):
    """Rows that name their source rank, row and element."""
    v = torch.arange(n * int(torch.tensor(shape).prod()), dtype=torch.float64).view((n,) + shape)
    v = v + 1000 * src
    if dtype == torch.uint8:
        v = v % 251
    return v.to(dtype)


def _exchange(r, seed, dtype, shape):
    n = r.nranks
    n_in, count, send, n_out, recv = _layout(n, seed)
    me = r.rank
    inp = _rows(me, n_in[me], shape, dtype).to(r.device)
    out = torch.full((n_out[me],) + shape, POISON, dtype=dtype, device=r.device)
    send_rows = torch.cat([send[me][d] for d in range(n)]).to(r.device)
    recv_rows = torch.cat([recv[me][s] for s in range(n)]).to(r.device)
    res = fusco.all_to_all(out, inp, send_rows, recv_rows, count[me, :].tolist(),
                           count[:, me], r.comm)
    assert res is out
    expect = torch.full((n_out[me],) + shape, POISON, dtype=dtype)
    for s in range(n):
        src_rows = _rows(s, n_in[s], shape, dtype)
        expect[recv[me][s]] = src_rows[send[s][me]]
    assert torch.equal(out.cpu(), expect), "rank %d got\n%s\nexpected\n%s" % (me, out, expect)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nranks,dtype,shape", [
    (2, torch.float32, (5,)),
    (3, torch.bfloat16, (3, 2)),
    (4, torch.int64, (1,)),
    (3, torch.uint8, (7,)),
])
def test_rows_land_where_the_layout_says(device, nranks, dtype, shape):
    run_ranks(nranks, _exchange, 11 + nranks, dtype, shape, device=device)


def _default_comm(r):
    fusco.set_default_communicator(r.comm)
    try:
        x = torch.full((1, 4), float(r.rank), device=r.device)
        out = torch.zeros((r.nranks, 4), device=r.device)
        rows = torch.zeros(r.nranks, dtype=torch.int64, device=r.device)
        fusco.all_to_all(out, x, rows, torch.arange(r.nranks, device=r.device),
                         [1] * r.nranks, [1] * r.nranks)
        assert out[:, 0].tolist() == list(range(r.nranks))
    finally:
        fusco.set_default_communicator(None)
    with pytest.raises(fusco.FuscoError, match="no communicator"):
        fusco.all_to_all(out, x, rows, rows, [1] * r.nranks, [1] * r.nranks)


def test_default_communicator():
    run_ranks(2, _default_comm)


def _valid_exchange(r):
    x = torch.full((1, 3), float(r.rank), device=r.device)
    out = torch.zeros((r.nranks, 3), device=r.device)
    fusco.all_to_all(out, x, torch.zeros(r.nranks, dtype=torch.int64, device=r.device),
                     torch.arange(r.nranks, device=r.device), [1] * r.nranks, [1] * r.nranks,
                     r.comm)
    assert out[:, 0].tolist() == list(range(r.nranks))


def _one_rank_bad(r, kind):
    n = r.nranks
    x = torch.ones((2, 3), device=r.device)
    out = torch.zeros((2 * n, 3), device=r.device)
    send = torch.zeros(n, dtype=torch.int64, device=r.device)
    recv = torch.arange(n, device=r.device)
    ss, rs = [1] * n, [1] * n
    bad = r.rank == 0
    if bad and kind == "splits":
        ss = [1] * (n + 1)
    if bad and kind == "row":
        send = torch.full((n,), 2, dtype=torch.int64, device=r.device)  # x has 2 rows
    if bad and kind == "dtype":
        send = send.to(torch.int32)
    if kind == "counts":  # rank 0 sends 2 rows to rank 1, which expects 1
        if r.rank == 0:
            ss = [1, 2] + [1] * (n - 2)
            send = torch.zeros(n + 1, dtype=torch.int64, device=r.device)
    t0 = time.monotonic()
    if kind == "counts" and r.rank > 1:  # counts are checked pairwise: rank 2's pairs are fine
        fusco.all_to_all(out, x, send, recv, ss, rs, r.comm)
        _valid_exchange(r)
        return None
    with pytest.raises(fusco.FuscoError) as e:
        fusco.all_to_all(out, x, send, recv, ss, rs, r.comm)
    elapsed = time.monotonic() - t0
    assert elapsed < 20, "the failure took %.1f s (the comm's timeout is 60 s)" % elapsed
    if bad and kind != "counts":
        assert e.value.result_name == "fuscoInvalidArgument"
    _valid_exchange(r)  # the comm stays usable
    return e.value.result_name, e.value.message


@pytest.mark.parametrize("kind", ["splits", "row", "dtype", "counts"])
def test_bad_input_fails_every_rank_promptly(kind):
    res = run_ranks(3, _one_rank_bad, kind)
    if kind == "splits":
        assert "send_splits" in res[0][1]
    if kind == "row":
        assert "outside" in res[0][1]
    if kind == "counts":  # fusco finds the mismatch on both ends of the pair
        assert res[0][0] == res[1][0] == "fuscoInvalidUsage"
        assert "disagree" in res[0][1] and "disagree" in res[1][1]
