"""Bad input to the dispatcher raises FuscoError with a clear message on the rank that passed it,
fails its peers promptly (not after the communicator's 60 s timeout) and leaves the comm usable."""
import time

import pytest
import torch

from harness import fusco, run_ranks

E, K, T, H = 4, 2, 5, 3


def _good_inputs(r):
    g = r.gen(9)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    return torch.randn(T, H, generator=g), torch.rand(T, K, generator=g), idx


def _still_usable(r, disp):
    x, p, idx = _good_inputs(r)
    tokens, tpe = disp.dispatch(x, p, idx)
    out = disp.combine(tokens)
    assert torch.allclose(out, x * p.sum(1, keepdim=True), rtol=1e-6, atol=1e-6)


def _bad_on_rank0(r, kind):
    disp = fusco.MoEDispatcher(r.comm, E)
    x, p, idx = _good_inputs(r)
    bad = r.rank == 0
    stage = "dispatch"
    if bad:
        if kind == "expert_out_of_range":
            idx[2, 1] = E
        elif kind == "duplicate_expert":
            idx[3, 1] = idx[3, 0]
        elif kind == "float_indices":
            idx = idx.to(torch.float32)
        elif kind == "rows_mismatch":
            x = x[:-1]
        elif kind == "probs_shape":
            p = p[:, :1]
        elif kind == "routing_map_shape":
            idx = torch.zeros(T, E + 1, dtype=torch.bool)
    if kind in ("combine_rows", "combine_dtype"):
        stage = "combine"
    t0 = time.monotonic()
    with pytest.raises(fusco.FuscoError) as e:
        tokens, _ = disp.dispatch(x, p, idx)
        if stage == "combine":
            if kind == "combine_dtype":
                disp.combine(tokens.to(torch.int32) if bad else tokens)
            else:
                disp.combine(tokens[1:] if bad else tokens)
    elapsed = time.monotonic() - t0
    assert elapsed < 20, "the failure took %.1f s (the comm's timeout is 60 s)" % elapsed
    if bad:
        assert e.value.result_name == "fuscoInvalidArgument", e.value
    else:
        assert e.value.result_name in ("fuscoRemoteError", "fuscoInvalidUsage"), e.value
    _still_usable(r, disp)
    return e.value.message


@pytest.mark.parametrize("kind,says", [
    ("expert_out_of_range", "token 2"),
    ("duplicate_expert", "token 3"),
    ("float_indices", "int64"),
    ("rows_mismatch", "indices must be int64 [4, k>=1]"),
    ("probs_shape", "probs have shape"),
    ("routing_map_shape", "routing_map has shape (5, 5)"),
    ("combine_rows", "expert output has shape"),
    ("combine_dtype", "not a float"),
])
def test_bad_input_on_one_rank(kind, says):
    messages = run_ranks(2, _bad_on_rank0, kind)
    assert says in messages[0], messages[0]
    assert "rank 0" in messages[1], messages[1]  # the peer's message names the failed rank


def _local_misuse(r):
    disp = fusco.MoEDispatcher(r.comm, E)
    with pytest.raises(fusco.FuscoError, match="before dispatch") as e:
        disp.combine(torch.zeros(1, H))
    assert e.value.result_name == "fuscoInvalidUsage"
    with pytest.raises(fusco.FuscoError, match="do not split evenly"):
        fusco.MoEDispatcher(r.comm, 3)
    with pytest.raises(fusco.FuscoError, match="expert_to_rank"):
        fusco.MoEDispatcher(r.comm, 3, [0, 1, 2])
    with pytest.raises(fusco.FuscoError, match="comm must be"):
        fusco.MoEDispatcher(None, 4)
    x, p, idx = _good_inputs(r)
    tokens, _ = disp.dispatch(x, p, idx)
    route = disp.route
    r.comm.destroy()  # frees the plans made on it too
    with pytest.raises(fusco.FuscoError, match="destroyed") as e:
        disp.dispatch(x, p, idx)
    assert e.value.result_name == "fuscoInvalidUsage"
    with pytest.raises(fusco.FuscoError, match="freed"):
        route.handle


def test_local_misuse_raises():
    run_ranks(2, _local_misuse)


def _float64_combine_after_float32_dispatch(r):
    """No probs and fp32 rows: planned without the slot map; a float64 combine builds it then."""
    disp = fusco.MoEDispatcher(r.comm, E)
    x, _, idx = _good_inputs(r)
    tokens, _ = disp.dispatch(x, None, idx)
    assert disp.route.send_pos is None
    eo = tokens.to(torch.float64).requires_grad_()
    out = disp.combine(eo)
    assert out.dtype == torch.float64
    assert torch.allclose(out, x.to(torch.float64) * K)
    out.sum().backward()
    assert torch.equal(eo.grad, torch.ones_like(eo))


def test_float64_combine_builds_the_slot_map_on_demand():
    run_ranks(2, _float64_combine_after_float32_dispatch)
