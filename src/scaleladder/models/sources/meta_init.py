"""A library model built with its parameters on the meta device, initialised later as the library does.

Why (docs/your-model.md, "Initialisation"): a rung builds a big model on ``meta`` and
materialises it one FSDP unit at a time (``models/init.py``). Building a timm or transformers
model under ``torch.device("meta")`` loses two things the library computes in its
constructor, and ``models/init.py``'s rules for the seeds' models would get them wrong:

* buffers (Llama's ``rotary_emb.inv_freq``, CLIP's ``position_ids``, Swin's
  ``relative_position_index``): zeroed on materialisation, so RoPE is off and every token
  sits at position 0;
* the values it gives parameters without ``reset_parameters``: zeroed as "biases"
  (``LlamaRMSNorm.weight``, ConvNeXt's layer scale ``gamma``): a dead model.

So :func:`build_on_meta` puts only the *parameters* on meta (as accelerate's
``init_empty_weights(include_buffers=False)``: the constructor runs on the CPU, each
parameter moves to meta as it is registered), buffers stay real, and it records, per
parameter, how the library initialised it: the constructor's value when it is small
(a layer scale's 1e-6, a norm's ones) and every in-place operation applied to it afterwards
(``nn.init.trunc_normal_``, ``normal_``, ``fill_``, ``mul_``, a row zeroed with ``[i]``...).
:func:`replay` applies that recipe to the module's freshly allocated parameters: the
library's own initialisation, per module, in any order, with no other module present.

Traps handled:

* torch's ``nn.init.trunc_normal_``, ``orthogonal_``, ``sparse_`` and ``dirac_`` return at
  once on a meta tensor, with no ``__torch_function__`` hook, so a mode never sees them: they
  are patched for the build where the libraries call them (``torch.nn.init`` and
  transformers' table of torch's init functions).
* A later operation overwriting the whole parameter (``normal_``, ``copy_``...) starts its
  recipe over, so the recorded history stays short (transformers initialises a Linear twice).
* An operation that reads another meta tensor (``a.copy_(b)``, ``b`` on meta) cannot be
  replayed: the parameter falls back to its module's ``reset_parameters`` or
  ``models/init.py``'s rules, and :func:`unreplayable` names it.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

#: A parameter's constructor value is kept when it has at most this many elements (a layer
#: scale, a norm's weight, a token); a bigger one is always overwritten by an init function.
KEEP_NUMEL = 1 << 16
#: Operations that overwrite the whole of what they are applied to.
_OVERWRITE = frozenset({
    "normal_", "uniform_", "trunc_normal_", "constant_", "ones_", "zeros_", "fill_", "zero_", "copy_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "eye_", "dirac_",
    "sparse_", "random_", "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_",
})
#: In-place in name only: they change no value.
_NOT_VALUES = frozenset({"requires_grad_", "share_memory_", "retain_grad", "record_stream", "resize_", "set_"})
_IN_PLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__", "__idiv__"})
#: torch.nn.init functions that skip a meta tensor without a __torch_function__ hook
_SILENT_ON_META = ("trunc_normal_", "orthogonal_", "sparse_", "dirac_")


class _Target:
    """Stands for the parameter in a recorded operation's arguments."""


TARGET = _Target()


@dataclass
class _Op:
    func: Callable[..., Any]
    geometry: tuple[tuple[int, ...], tuple[int, ...], int] | None  # (size, stride, offset) of a partial view; None: all of it
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class Recipe:
    """How the library initialised one parameter: a starting value, then operations."""

    shape: tuple[int, ...]
    start: Tensor | None = None  # the constructor's value (small ones only)
    ops: list[_Op] = field(default_factory=list)
    broken: str = ""  # why it cannot be replayed ("" if it can)

    @property
    def complete(self) -> bool:
        """Whether it says every value: a kept start or a first operation that overwrites it all."""
        return not self.broken and (self.start is not None or bool(self.ops) and self.ops[0].geometry is None
                                    and getattr(self.ops[0].func, "__name__", "") in _OVERWRITE)


#: module -> {parameter name: recipe}; weak, so a dropped model takes its recipes with it.
_RECIPES: weakref.WeakKeyDictionary[nn.Module, dict[str, Recipe]] = weakref.WeakKeyDictionary()


def _key(t: Tensor) -> int:
    return int(t.untyped_storage()._cdata)


class _Recorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.recipes: dict[int, Recipe] = {}
        self.keep: list[Tensor] = []  # the meta parameters: their storages' keys stay theirs

    def add_parameter(self, real: Tensor, meta: Tensor) -> None:
        start = real.detach().clone() if real.numel() <= KEEP_NUMEL and not real.is_meta else None
        self.recipes[_key(meta)] = Recipe(tuple(meta.shape), start)
        self.keep.append(meta)

    def record(self, func: Callable[..., Any], target: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Record ``func`` applied in place to ``target``; False if ``target`` is no recorded parameter."""
        recipe = self.recipes.get(_key(target)) if target.is_meta else None
        if recipe is None:
            return False
        name = getattr(func, "__name__", "")
        whole = tuple(target.shape) == recipe.shape and target.storage_offset() == 0 and target.is_contiguous()
        geometry = None if whole else (tuple(target.shape), tuple(target.stride()), int(target.storage_offset()))
        if whole and name in _OVERWRITE:
            recipe.start, recipe.ops, recipe.broken = None, [], ""
        stored_args = tuple(self._stored(a, target, recipe, name) for a in args)
        stored_kwargs = {k: self._stored(v, target, recipe, name) for k, v in kwargs.items()}
        if not recipe.broken:
            recipe.ops.append(_Op(func, geometry, stored_args, stored_kwargs))
        return True

    @staticmethod
    def _stored(value: Any, target: Tensor, recipe: Recipe, name: str) -> Any:
        if value is target:
            return TARGET
        if isinstance(value, Tensor):
            if value.is_meta or value.numel() > KEEP_NUMEL:
                recipe.broken = recipe.broken or f"{name} reads a tensor of shape {tuple(value.shape)} that is not kept"
                return None
            return value.detach().clone()
        if isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
            recipe.broken = recipe.broken or f"{name} reads a list of tensors"
            return None
        return value

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        mutating = (name.endswith("_") and not name.startswith("__") and name not in _NOT_VALUES) or name in _IN_PLACE_DUNDERS
        if mutating:
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, Tensor) and target.is_meta:
                rest = args[1:] if args else ()
                kw = {k: v for k, v in kwargs.items() if not (k == "tensor" and not args)}
                self.record(func, target, rest, kw)
        return func(*args, **kwargs)


_ACTIVE: list[_Recorder] = []


def _silent_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
        if _ACTIVE and isinstance(tensor, Tensor) and tensor.is_meta and _ACTIVE[-1].record(original, tensor, args, kwargs):
            return tensor
        return original(tensor, *args, **kwargs)

    init.__name__ = original.__name__
    init.__wrapped__ = original  # type: ignore[attr-defined]
    return init


@contextmanager
def _patched_silent_inits() -> Iterator[None]:
    """torch's init functions that skip meta tensors silently, wrapped where libraries look them up."""
    undo: list[tuple[Any, str, Any, bool]] = []  # (holder, key, old value, is a dict)
    holders: list[tuple[Any, bool]] = [(torch.nn.init, False)]
    hf = sys.modules.get("transformers.initialization")
    if hf is not None and isinstance(getattr(hf, "TORCH_INIT_FUNCTIONS", None), dict):
        holders.append((hf.TORCH_INIT_FUNCTIONS, True))
    try:
        for holder, is_dict in holders:
            for fname in _SILENT_ON_META:
                old = holder.get(fname) if is_dict else getattr(holder, fname, None)
                if old is None or hasattr(old, "__wrapped__"):
                    continue
                undo.append((holder, fname, old, is_dict))
                if is_dict:
                    holder[fname] = _silent_wrapper(old)
                else:
                    setattr(holder, fname, _silent_wrapper(old))
        yield
    finally:
        for holder, fname, old, is_dict in reversed(undo):
            if is_dict:
                holder[fname] = old
            else:
                setattr(holder, fname, old)


@contextmanager
def _parameters_on_meta(recorder: _Recorder) -> Iterator[None]:
    """Every parameter registered while it runs moves to meta (buffers stay where they are made)."""
    original = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is None or param.is_meta:
            return
        real = module._parameters[name]
        assert real is not None
        meta = type(real)(real.to("meta"), requires_grad=real.requires_grad)
        meta.__dict__.update(real.__dict__)
        module._parameters[name] = meta
        recorder.add_parameter(real, meta)

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def build_on_meta(make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` with its parameters on meta, its buffers real, and each parameter's recipe kept
    for :func:`replay` (under the module that owns it)."""
    recorder = _Recorder()
    _ACTIVE.append(recorder)
    try:
        # on the CPU whatever the caller's default device (a torch.device("meta") around the call
        # would put the buffers on meta too, and the parameters there before they are seen)
        with torch.device("cpu"), _parameters_on_meta(recorder), _patched_silent_inits(), recorder:
            model = make()
    finally:
        _ACTIVE.remove(recorder)
    attach(model, recorder)
    return model


def attach(model: nn.Module, recorder: _Recorder) -> None:
    for module in model.modules():
        found = {name: recorder.recipes[_key(p)] for name, p in module._parameters.items()
                 if p is not None and p.is_meta and _key(p) in recorder.recipes}
        if found:
            _RECIPES[module] = {**_RECIPES.get(module, {}), **found}


def set_recipe(module: nn.Module, name: str, value: Tensor) -> None:
    """Give ``module.<name>`` (a parameter put there after the build) a recipe: start at ``value``."""
    _RECIPES.setdefault(module, {})[name] = Recipe(tuple(value.shape), value.detach().to("cpu").clone())


def has_recipes(module: nn.Module) -> bool:
    return module in _RECIPES


def unreplayable(model: nn.Module) -> list[str]:
    """``module.parameter: why`` for every parameter of ``model`` whose recipe cannot be replayed."""
    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for module in model.modules():
        for pname, recipe in _RECIPES.get(module, {}).items():
            if not recipe.complete:
                prefix = names.get(id(module), "?")
                out.append(f"{prefix + '.' if prefix else ''}{pname}: {recipe.broken or 'no init recorded'}")
    return out


@torch.no_grad()
def replay(module: nn.Module, fallback: Callable[[nn.Module], None]) -> None:
    """Initialise ``module``'s own parameters by their recipes; ``fallback(module)`` first when one
    of them has none that can be replayed (a module the build did not record, an unreplayable op)."""
    recipes = _RECIPES.get(module, {})
    params = [(n, p) for n, p in module._parameters.items() if p is not None]
    if any(n not in recipes or not recipes[n].complete for n, _ in params):
        fallback(module)
    for n, p in params:
        recipe = recipes.get(n)
        if recipe is None or not recipe.complete or tuple(p.shape) != recipe.shape:
            continue
        if recipe.start is not None:
            p.copy_(recipe.start)
        for op in recipe.ops:
            view = p if op.geometry is None else p.as_strided(*op.geometry)
            args = tuple(view if a is TARGET else a for a in op.args)
            kwargs = {k: view if v is TARGET else v for k, v in op.kwargs.items()}
            op.func(view, *args, **kwargs)
