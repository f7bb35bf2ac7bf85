"""Run under torchrun (gloo, CPU): train one debug flavor under every strategy in ONE
process group and print each strategy's per-step losses as JSON (rank 0).

One launch for all strategies keeps the parity test fast: process start-up and
torch import dominate a debug rung. Each strategy gets a freshly built model
from the same seed, so the only difference between runs is the wrapper.

argv: flavor, global batch, steps, strategies (comma-separated), and the torch.compile
backend of the -compile strategies (default inductor). Each strategy runs with its
generation's default knobs (spec.default_knobs); ``name:knobs`` names others (pf2).
A FLAVA strategy builds the default implementation (models/flava_impl.py) unless
``name@impl`` names one (``single@torchmultimodal``), and runs the given steps unless
``name*N`` gives its own (``single@torchmultimodal*20``), and takes the given global batch unless
``name=B`` gives its own (``single=40``); the suffixes come in that order. The last two let
one 1-rank launch hold every reference a flavor needs (a launch costs more than a strategy).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from scaleladder.flavors import get_flavor
from scaleladder.models.build import build_model
from scaleladder.models.flava_impl import DEFAULT as DEFAULT_FLAVA_IMPL
from scaleladder.rung import launch
from scaleladder.rung.batches import SyntheticBatches
from scaleladder.rung.loop import train_loop
from scaleladder.rung.parallelize import apply_strategy
from scaleladder.rung.precision import policy
from scaleladder.spec import default_knobs, parse_knobs, parse_strategy

GROUPS: dict[str, list[int]] = {}  # hybrid strategy -> [replicas, ranks per shard group], as FSDP built them


def _groups(wrapped: torch.nn.Module) -> list[int]:
    from torch.distributed.tensor import DTensor

    param = next(wrapped.parameters())
    if isinstance(param, DTensor):
        # FSDP2: every parameter is a DTensor on the (replicate, shard) mesh.
        return list(param.device_mesh.shape)
    # FSDP1 HYBRID_SHARD keeps the shard group as process_group and the replicate group as
    # _inter_node_pg (its name from the one-node-per-replica case).
    return [dist.get_world_size(wrapped._inter_node_pg), dist.get_world_size(wrapped.process_group)]  # type: ignore[arg-type]


def losses(flavor_name: str, name: str, global_batch: int, steps: int, backend: str) -> list[float]:
    name, _, own_batch = name.partition("=")
    local_batch = (int(own_batch) if own_batch else global_batch) // dist.get_world_size()
    name, _, own_steps = name.partition("*")
    steps = int(own_steps) if own_steps else steps
    name, _, impl = name.partition("@")
    strategy_name, _, knobs = name.partition(":")
    flavor = get_flavor(flavor_name)
    prec = policy("fp32")
    device = torch.device("cpu")
    torch.manual_seed(0)
    model = build_model(flavor, device, flava_impl=impl or DEFAULT_FLAVA_IMPL)
    if strategy_name == "raw-hybrid1":
        # Upstream FSDP1 HYBRID_SHARD with 1-rank shard groups, bypassing our fix.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        mesh = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("replicate", "shard"))
        wrapped = FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_mesh=mesh, device_id=device,
                       auto_wrap_policy=ModuleWrapPolicy({model.layer_cls}), use_orig_params=True)
    else:
        strategy = parse_strategy(strategy_name)
        wrapped, _ = apply_strategy(model, strategy, parse_knobs(knobs) if knobs else default_knobs(strategy), prec, device,
                                    compile_backend=backend)
        if strategy.sharding == "hybrid" and strategy.group != 1:
            GROUPS[name] = _groups(wrapped)
    opt = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-3)
    rank = dist.get_rank()
    compiled = name != "raw-hybrid1" and parse_strategy(strategy_name).compile
    # A compiled loop needs a warm-up step (its compile); every step's loss is kept either way.
    m = train_loop(wrapped, opt, SyntheticBatches(flavor, local_batch, rank, steps, 0, device), steps=steps,
                   warmup=int(compiled), prec=prec, device=device, compiled=compiled)
    return [float(x) for x in m.loss]


def main() -> None:
    flavor, global_batch, steps, strategies = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
    backend = sys.argv[5] if len(sys.argv) > 5 else "inductor"
    env = launch.detect()
    from scaleladder.rung.unused_params import unused_parameter_names

    unused_parameter_names(get_flavor(flavor).family)  # before the group, as the runner does
    launch.init(env, torch.device("cpu"))
    out = {s: losses(flavor, s, global_batch, steps, backend) for s in strategies}
    if env.rank == 0:
        print("PARITY " + json.dumps(out))
        print("GROUPS " + json.dumps(GROUPS))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
