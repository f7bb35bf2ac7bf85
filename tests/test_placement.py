"""Where each rank ran, and bad rendezvous input, without a cluster. The same
paths across two real nodes: tests/test_multinode.py."""

from __future__ import annotations

import json
import socket

import pytest
import torch.distributed as dist

from scaleladder.figures.report import placement_cell
from scaleladder.rung.launch import DistEnv, check_master
from scaleladder.rung.provenance import local_address, node_index, rank_placement
from scaleladder.spec import SpecError


def _env(source: str, addr: str = "127.0.0.1", port: int = 29500, rank: int = 0) -> DistEnv:
    return DistEnv(rank, 4, rank % 2, 2, addr, port, source)


def test_an_unresolvable_master_is_one_line_naming_the_nodelist() -> None:
    with pytest.raises(SpecError) as e:
        check_master(_env("slurm", "nosuch-node1.invalid"), {"SLURM_JOB_NODELIST": "nosuch-node1.invalid,x"})
    assert str(e.value).startswith("master address 'nosuch-node1.invalid' (the first host of the Slurm nodelist "
                                   "'nosuch-node1.invalid,x') does not resolve: ")
    assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match=r"^master address 'nosuch\.invalid' \(MASTER_ADDR\) does not resolve"):
        check_master(_env("torchrun", "nosuch.invalid"), {"MASTER_ADDR": "nosuch.invalid"})
    check_master(_env("single", "nosuch.invalid"), {})  # a plain process picks its own rendezvous


def test_a_master_port_in_use_is_one_line_on_rank_0_under_srun() -> None:
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SpecError, match=rf"^master port {port} on \S+ is already in use \(.*\): another rung or process "
                                            "listens there; set MASTER_PORT in the site's env to a free port$"):
            check_master(_env("slurm", port=port), {})
        check_master(_env("slurm", port=port, rank=1), {})  # only rank 0 binds the store
        check_master(_env("torchrun", port=port), {})  # torchrun's agent holds the port itself
    check_master(_env("slurm", port=port), {})  # free again


def test_node_index_from_the_launcher() -> None:
    assert node_index(_env("slurm"), {"SLURM_NODEID": "1"}) == 1
    assert node_index(_env("torchrun"), {"GROUP_RANK": "3", "SLURM_NODEID": "0"}) == 3
    assert node_index(_env("torchrun"), {"SLURM_NODEID": "2"}) == 2  # srun torchrun without GROUP_RANK
    assert node_index(_env("slurm"), {}) is None


def test_a_one_rank_group_records_its_own_placement() -> None:
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free}", rank=0, world_size=1)
    try:
        p = rank_placement(DistEnv(0, 1, 0, 1, "localhost", free, "single"))
    finally:
        dist.destroy_process_group()
    assert p["rank_placement"] == [{"rank": 0, "host": socket.gethostname(), "addr": "127.0.0.1", "node": 0, "local_rank": 0}]
    assert p["master_host"] == "localhost" and p["master_addr"] == "127.0.0.1" and p["master_port"] == free
    assert local_address("127.0.0.1", free) == "127.0.0.1"


def test_the_report_cell_names_hosts_ranks_and_master() -> None:
    ranks = [{"rank": r, "host": f"n{r // 2 + 1}", "addr": f"10.0.0.{r // 2 + 1}", "node": r // 2, "local_rank": r % 2}
             for r in range(4)]
    cell = placement_cell({"rank_placement": json.dumps(ranks), "master_addr": "10.0.0.1", "master_port": 29533})
    assert cell == "n1 (10.0.0.1): ranks 0-1; n2 (10.0.0.2): ranks 2-3; master 10.0.0.1:29533"
    assert placement_cell({}) == "-" and placement_cell({"rank_placement": "not json"}) == "-"
    cyclic = [dict(p, node=p["rank"] % 2, host=f"n{p['rank'] % 2 + 1}", addr="") for p in ranks]  # srun -m cyclic
    assert placement_cell({"rank_placement": cyclic, "master_host": "n1", "master_port": 1}) == \
        "n1: ranks 0,2; n2: ranks 1,3; master n1:1"
