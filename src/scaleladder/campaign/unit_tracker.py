"""torch's FSDP2 memory tracker for FSDP units of several blocks (knobs ``-u<k>``).

TRAP (torch 2.14 ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``): to take its
snapshots it removes each FSDP state's forward hooks and registers its own on EVERY module of the
state, one plain pre-hook and post-hook each, and on exit registers plain ones again. A grouped
``fully_shard([b_i, ..., b_{i+k-1}])`` has ONE pair of group hooks over its k modules (the
post-forward, which reshards the unit and registers its pre-backward, runs once, after the last
module). Under the tracker the group runs as k units that share one parameter group: resharded
after each module, gathered again before the next, reduced after each module's backward (seen on
``vit-base/fsdp2-full-ac/bf16-mixed/pf0-u4``: sharded gradients growing one layer at a time), and
it wraps the group's backward methods k times. The step it measures is then not the rung's, and
the model it leaves behind has lost its group hooks.

:func:`fsdp2_tracker` makes the tracker with a grouped unit's hooks kept as torch registers them
(``_register_group_forward_hooks``), wrapped once by the tracker's snapshot wrappers, and the
group's backward methods wrapped once; a unit of one module is instrumented as torch does.
``campaign/plan_check.py`` builds its FSDP2 tracker with it where a rung's units hold several
blocks (tests/test_unit_size.py holds the planner to it at k = 2 and 4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn, optim
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    from torch.utils.hooks import RemovableHandle

Hook = Callable[..., object]


def fsdp2_tracker(wrapped: nn.Module, optimizer: optim.Optimizer | None) -> FSDPMemTracker:
    """An ``FSDPMemTracker`` over ``wrapped`` that keeps grouped units grouped (module docstring)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType, _SavedFSDPMethods
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks

    def units_of(root: nn.Module) -> list[tuple[FSDPState, FSDPParamGroup, list[FSDPModule]]]:
        """Each FSDP state with a parameter group: the state, its group and its modules in module order."""
        found: dict[int, tuple[FSDPState, FSDPParamGroup, list[FSDPModule]]] = {}
        for module in root.modules():
            if isinstance(module, FSDPModule):
                state = module._get_fsdp_state()
                group = state._fsdp_param_group
                if group is not None:
                    found.setdefault(id(state), (state, group, []))[2].append(module)
        return list(found.values())

    def unhook(state: FSDPState) -> None:
        """Remove a state's forward hooks (a group's two handles are one _MultiHandle: removed once)."""
        for handle in {id(h): h for h in (state._pre_forward_hook_handle, state._post_forward_hook_handle)}.values():
            handle.remove()

    def hook(modules: list[FSDPModule], pre: Hook, post: Hook, state: FSDPState,
             tracking: bool = True) -> tuple[RemovableHandle, RemovableHandle]:
        """A state's forward hooks as torch registers them (FSDPState.init), or as the tracker does."""
        if len(modules) == 1:
            m: nn.Module = modules[0]  # type: ignore[assignment]  # an FSDPModule is an nn.Module subclass at run time
            return (m.register_forward_pre_hook(pre, prepend=True, with_kwargs=True),
                    m.register_forward_hook(post, prepend=False, always_call=tracking))
        handle: RemovableHandle = _register_group_forward_hooks(modules, pre, post, state._modules_to_run_forward,  # type: ignore[arg-type]
                                                                state._cast_output_dtype)
        return handle, handle

    class GroupedFSDPMemTracker(FSDPMemTracker):
        def _instrument_fsdp_module(self) -> None:
            units = units_of(self._root_mod)
            for state, _, _ in units:
                unhook(state)
            for state, group, modules in units:
                first = modules[0]
                self._instrument_fsdp_sharded_params_grads(group)
                state._pre_forward_hook_handle, state._post_forward_hook_handle = hook(
                    modules, self._fsdp_state_pre_forward(first, state._pre_forward),
                    self._fsdp_state_post_forward(first, state._post_forward), state)
                self._fsdp_mod_to_saved_methods[first] = _SavedFSDPMethods(group.pre_backward, group.post_backward)
                group.pre_backward = self._fsdp_param_group_pre_backward(first, group.pre_backward)  # type: ignore[method-assign]
                group.post_backward = self._fsdp_param_group_post_backward(first, group.post_backward)  # type: ignore[method-assign]
            for buffer in self._root_mod.buffers():
                self._update_and_maybe_create_winfos(buffer, _FSDPRefType.BUFFER)

        def _deregister_module_and_optimizer_hooks(self) -> None:
            units = {id(state): (group, modules) for state, group, modules in units_of(self._root_mod)}
            for first, saved in self._fsdp_mod_to_saved_methods.items():
                state = first._get_fsdp_state()
                group, modules = units[id(state)]
                unhook(state)
                state._pre_forward_hook_handle, state._post_forward_hook_handle = hook(
                    modules, state._pre_forward, state._post_forward, state, tracking=False)
                group.pre_backward = saved.pre_backward  # type: ignore[method-assign]
                group.post_backward = saved.post_backward  # type: ignore[method-assign]
            self._fsdp_mod_to_saved_methods.clear()
            if self._optimizer_hook_handles is not None:
                for handle in self._optimizer_hook_handles:
                    handle.remove()
                self._optimizer_hook_handles = None

    return GroupedFSDPMemTracker(wrapped, optimizer)
