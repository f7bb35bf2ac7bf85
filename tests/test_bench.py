"""The timed loop's definitions that a CPU can check: memory counters counted within the
window only, and what counts as running out of memory."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

from helpers.gloo import one_rank_group
from scaleladder.rung import loop
from scaleladder.rung.loop import OOMDuringStep, is_oom, oom_line, train_loop
from scaleladder.campaign.maxbatch import is_oom_message
from scaleladder.rung.precision import policy

CPU = torch.device("cpu")


class Counting(nn.Module):
    """A model whose every forward 'retries an allocation' once (and every 3rd 'OOMs'),
    the way a GPU's cumulative counters grow from process start."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.calls = 0

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        self.calls += 1
        return (self.w * batch["x"]).sum()


@pytest.mark.parametrize("steps,warmup", [(7, 3), (5, 0), (4, 1)])
def test_alloc_retries_and_ooms_count_the_window_only(monkeypatch: pytest.MonkeyPatch, steps: int, warmup: int) -> None:
    model = Counting()
    # num_alloc_retries / num_ooms never reset (reset_peak_memory_stats leaves them): fake
    # counters that have already counted 100 / 10 before this loop, then grow per step.
    monkeypatch.setattr(loop, "_mem_counters", lambda device: (100 + model.calls, 10 + model.calls // 3))
    batches = [{"x": torch.ones(2)}] * steps
    with one_rank_group():
        m = train_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, steps=steps, warmup=warmup, prec=policy("fp32"), device=CPU)
    assert m.alloc_retries.tolist() == [steps - warmup]  # the warm-up's and the process's earlier ones excluded
    assert m.ooms.tolist() == [steps // 3 - warmup // 3]
    assert m.measured_steps == steps - warmup and len(m.step_time_s) == steps


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`"),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
        RuntimeError("HIP out of memory. Tried to allocate 1.00 GiB"),
        # NCCL's and RCCL's own reports, as torch's DistBackendError carries them: the
        # memory line is the LAST of four, "Cuda"/"HIP" in their own case
        dist.DistBackendError(loop.INJECTED_MESSAGES["nccl"]),
        dist.DistBackendError(loop.INJECTED_MESSAGES["nccl"].replace("failure 2 ", "failure ")),  # NCCL < 2.19
        dist.DistBackendError(loop.INJECTED_MESSAGES["rccl"]),
        RuntimeError("HIP error: hipErrorOutOfMemory"),
    ],
    ids=["torch-oom", "cublas", "hipblas", "cuda-runtime", "hip", "nccl", "nccl-old", "rccl", "hip-name"],
)
def test_every_way_a_gpu_runs_out_of_memory_is_an_oom(exc: BaseException) -> None:
    assert is_oom(exc)
    # the record keeps the line that says so, which maxbatch must recognise in turn
    assert is_oom_message(oom_line(exc)) and "\n" not in oom_line(exc)


def test_the_nccl_oom_is_named_by_its_memory_line_not_its_first() -> None:
    e = dist.DistBackendError(loop.INJECTED_MESSAGES["nccl"])
    assert oom_line(e) == "Cuda failure 2 'out of memory'"
    assert not is_oom_message(str(e).splitlines()[0])  # why the first line would not do


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("CUDA error: an illegal memory access was encountered"), ValueError("out of memory"),
     RuntimeError("Expected all tensors to be on the same device"),
     dist.DistBackendError(loop.INJECTED_MESSAGES["nccl"].replace("'out of memory'", "'invalid argument'")),
     RuntimeError("No backend type associated with device type cpu")],
)
def test_other_failures_are_not_ooms(exc: BaseException) -> None:
    assert not is_oom(exc)


def test_a_cublas_alloc_failure_in_a_step_carries_its_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALELADDER_INJECT_OOM", "0:2:cublas")
    model = Counting()
    with one_rank_group(), pytest.raises(OOMDuringStep) as e:
        train_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), [{"x": torch.ones(2)}] * 4, steps=4, warmup=1, prec=policy("fp32"), device=CPU)
    assert e.value.step == 2 and "CUBLAS_STATUS_ALLOC_FAILED" in str(e.value)
