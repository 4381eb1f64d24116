"""Communicators: creation from a process group, life cycle, errors."""
import os

import pytest
import torch
import torch.distributed as dist

from harness import COMM_TIMEOUT_MS, DEVICES, fusco, run_ranks


def test_library_loads_and_reports_its_version():
    assert os.path.exists(fusco.library_path())
    assert fusco.get_version() >= (0, 1, 0)
    uid = fusco.get_unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128
    assert uid != fusco.get_unique_id()


def test_single_rank_communicator_in_process():
    with fusco.Communicator(1, 0, fusco.get_unique_id()) as comm:
        assert (comm.rank, comm.nranks) == (0, 1)
        assert comm.node_info() == (0, 1, 0, 1)
        assert comm.async_error() is None
    with pytest.raises(fusco.FuscoError) as e:
        comm.node_info()
    assert e.value.result_name == "fuscoInvalidUsage"
    comm.destroy()  # idempotent


def test_bad_unique_id_is_refused_with_fuscos_message():
    with pytest.raises(fusco.FuscoError) as e:
        fusco.Communicator(1, 0, bytes(128))
    assert e.value.result_name == "fuscoInvalidArgument"
    assert "id" in e.value.message
    assert str(e.value).startswith("fuscoInvalidArgument: ")


def test_bad_arguments_are_refused():
    with pytest.raises(fusco.FuscoError, match="128 bytes"):
        fusco.Communicator(1, 0, b"short")
    with pytest.raises(fusco.FuscoError) as e:
        fusco.Communicator(2, 5, fusco.get_unique_id(), timeout_ms=2000)
    assert e.value.result_name == "fuscoInvalidArgument"
    with pytest.raises(fusco.FuscoError):
        fusco.Communicator(1, 0, fusco.get_unique_id(), device="meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_cuda_communicator_without_a_device_fails_cleanly():
    with pytest.raises(fusco.FuscoError, match="no CUDA device"):
        fusco.Communicator(1, 0, fusco.get_unique_id(), device="cuda")
    # An explicit device index reaches the library (config.memType = fuscoMemCuda), which refuses.
    with pytest.raises(fusco.FuscoError):
        fusco.Communicator(1, 0, fusco.get_unique_id(), device=torch.device("cuda", 0),
                           timeout_ms=5000)


def _from_group(r):
    comm = r.comm
    assert (comm.rank, comm.nranks) == (r.rank, r.nranks)
    assert comm.device.type == r.device.type
    node, num_nodes, local_rank, local_size = comm.node_info()
    # A subgroup: its rank 0 (world rank 1) makes the id and broadcasts it.
    sub = dist.new_group([1, 2])
    if r.rank in (1, 2):
        with fusco.Communicator.from_process_group(sub, device=r.device.type,
                                                   timeout_ms=COMM_TIMEOUT_MS) as c:
            assert (c.rank, c.nranks) == (r.rank - 1, 2)
    return (node, num_nodes, local_rank, local_size)


@pytest.mark.parametrize("device", DEVICES)
def test_from_process_group_matches_the_group(device):
    infos = run_ranks(3, _from_group, device=device)
    assert [i[2] for i in infos] == [0, 1, 2]  # one host: one node
    assert all(i[1] == 1 for i in infos)
