"""Where FSDP1's host work per step goes, at one rank on the CPU: the
diagnosis behind docs/performance.md's "Where FSDP1's host time goes".

vit-debug b4 fp32, one gloo rank, one thread; `single` and `fsdp-full` built by the ladder
as a rung builds them, stepped in turn (A, B, A, B, ...) and timed by the training thread's
CPU time, as bench_host does. Three readings:

- **parts**: FSDP1's hook functions wrapped with a CPU-time accumulator (inclusive ms a step;
  ``of which`` rows are inside the row above them). The wrappers add a little of their own.
- **Python calls a step** (``sys.setprofile``, function and C calls): exact, load-free.
- **ablation** (``--ablate``): torch patched IN THIS PROCESS ONLY, for diagnosis, never in a
  rung: FSDP1 without its ``record_function`` annotations, without its one-rank all-reduce,
  and without both. It bounds what those parts cost; the numerics of the patched runs are
  not a rung's (no gradient reduction).

    python benchmarks/fsdp1_host_parts.py --steps 60 --ablate
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import statistics
import sys
import time
from typing import Any

HOOKS = {  # module attribute -> the row it is shown under
    "fm._root_pre_forward": "_root_pre_forward", "fm._pre_forward": "_pre_forward",
    "fm._post_forward": "_post_forward", "ru._pre_backward_hook": "_pre_backward_hook",
    "ru._post_backward_hook": "_post_backward_hook",
    "ru._post_backward_final_callback": "_post_backward_final_callback",
}


def main(argv: list[str] | None = None) -> int:
    """Long because: the builds, the call count, the wrappers and the timed loop share one
    process group and one set of patched torch modules, which read best in one place."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60, help="timed steps of each build, interleaved")
    ap.add_argument("--ablate", action="store_true", help="also time FSDP1 without annotations / all-reduce")
    a = ap.parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional  # noqa: F401  (before any group: tests/helpers/gloo.py)
    import torch.distributed.fsdp._flat_param as fp
    import torch.distributed.fsdp._runtime_utils as ru
    import torch.distributed.fsdp.fully_sharded_data_parallel as fm

    from scaleladder.models.build import build_model
    from scaleladder.flavors import get_flavor
    from scaleladder.rung.batches import synthetic_batch
    from scaleladder.rung.parallelize import apply_strategy
    from scaleladder.rung.optim import backward_and_step, make_optimizer
    from scaleladder.rung.precision import policy
    from scaleladder.spec import default_knobs, parse_strategy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    flavor = get_flavor("vit-debug")
    batch = synthetic_batch(flavor, 4, 0, 0, 0)

    def build(name: str) -> tuple[Any, Any]:
        torch.manual_seed(0)
        s = parse_strategy(name)
        model, _ = apply_strategy(build_model(flavor), s, default_knobs(s), policy("fp32"), torch.device("cpu"))
        return model, make_optimizer(model.parameters(), 1e-4, "fp32")

    def step(built: tuple[Any, Any]) -> float:
        t = time.thread_time()
        backward_and_step(built[0](batch), built[1], None)
        return time.thread_time() - t

    builds = {"single": build("single"), "fsdp-full": build("fsdp-full")}
    for b in builds.values():
        for _ in range(3):
            step(b)
    calls = {}
    for name, b in builds.items():
        n = [0]
        sys.setprofile(lambda _f, ev, _a: n.__setitem__(0, n[0] + (ev in ("call", "c_call"))))
        for _ in range(5):
            step(b)
        sys.setprofile(None)
        calls[name] = n[0] / 5

    acc: dict[str, float] = collections.defaultdict(float)
    on = [False]

    def timed(row: str, f: Any) -> Any:
        @functools.wraps(f)
        def g(*args: Any, **kwargs: Any) -> Any:
            t = time.thread_time()
            try:
                return f(*args, **kwargs)
            finally:
                if on[0]:
                    acc[row] += time.thread_time() - t
        return g

    mods = {"fm": fm, "ru": ru}
    for attr, row in HOOKS.items():
        mod, name = attr.split(".")
        setattr(mods[mod], name, timed(row, getattr(ru, name)))
    fp.FlatParamHandle._use_unsharded_views = timed("  of which _use_unsharded_views (pre-forward)",
                                                    fp.FlatParamHandle._use_unsharded_views)

    class TimedDist:  # _runtime_utils's `dist`, its all_reduce timed
        def __getattr__(self, k: str) -> Any:
            return getattr(dist, k)

    TimedDist.all_reduce = staticmethod(timed("  of which all_reduce (post-backward, gloo)", dist.all_reduce))  # type: ignore[attr-defined]
    ru.dist = TimedDist()
    rf = torch.autograd.profiler.record_function
    rf.__enter__ = timed("record_function annotations (across the rows)", rf.__enter__)  # type: ignore[method-assign]
    rf.__exit__ = timed("record_function annotations (across the rows)", rf.__exit__)  # type: ignore[method-assign]
    times: dict[str, list[float]] = {k: [] for k in builds}
    for _ in range(a.steps):
        for name, b in builds.items():
            on[0] = name == "fsdp-full"
            times[name].append(step(b))
    on[0] = False
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"torch {torch.__version__}, vit-debug b4 fp32, 1 gloo rank, 1 thread, {a.steps} interleaved steps each")
    print(f"host ms a step (median, thread CPU time, with the wrappers): single {med['single']:.2f}, "
          f"fsdp-full {med['fsdp-full']:.2f} ({med['fsdp-full'] / med['single']:.2f}x)")
    print(f"Python calls a step: single {calls['single']:.0f}, fsdp-full {calls['fsdp-full']:.0f}")
    order = ["_root_pre_forward", "_pre_forward", "  of which _use_unsharded_views (pre-forward)", "_post_forward",
             "_pre_backward_hook", "_post_backward_hook", "  of which all_reduce (post-backward, gloo)",
             "_post_backward_final_callback", "record_function annotations (across the rows)"]
    for row in order:
        print(f"  {acc[row] / a.steps * 1e3:6.2f} ms  {row}")
    if a.ablate:
        ablation(builds, step, a.steps, ru, TimedDist)
    dist.destroy_process_group()
    return 0


def ablation(builds: dict[str, Any], step: Any, steps: int, ru: Any, timed_dist: Any) -> None:
    """single and fsdp-full against fsdp-full with torch's FSDP1 patched (this process only)."""
    import torch

    class NoAllReduce(timed_dist):  # type: ignore[misc,valid-type]
        @staticmethod
        def all_reduce(*_a: Any, **_k: Any) -> None:
            return None

    rf = (torch.profiler.record_function, torch.autograd.profiler.record_function)

    @contextlib.contextmanager
    def patched(what: str) -> Any:
        saved = ru.dist
        if "annotations" in what:
            torch.profiler.record_function = torch.autograd.profiler.record_function = (  # type: ignore[assignment,misc]
                lambda *_a, **_k: contextlib.nullcontext())
        if "all-reduce" in what:
            ru.dist = NoAllReduce()
        try:
            yield
        finally:
            torch.profiler.record_function, torch.autograd.profiler.record_function = rf  # type: ignore[misc]
            ru.dist = saved

    rows = ["single", "fsdp-full", "fsdp-full, no annotations", "fsdp-full, no all-reduce",
            "fsdp-full, no annotations, no all-reduce"]
    times: dict[str, list[float]] = {r: [] for r in rows}
    for _ in range(steps):
        for r in rows:
            with patched(r):
                times[r].append(step(builds["single" if r == "single" else "fsdp-full"]))
    base = statistics.median(times["single"])
    print("ablation (torch patched in this process only; median host ms a step, x single):")
    for r in rows:
        m = statistics.median(times[r])
        print(f"  {m * 1e3:6.2f} ms  {m / base:.2f}x  {r}")


if __name__ == "__main__":
    sys.exit(main())
