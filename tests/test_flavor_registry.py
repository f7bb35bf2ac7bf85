"""The model registry (flavors.py) is a table code may extend: a registered flavor is
a model the run spec accepts, a clash is refused, and the view readers hold is read-only."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import MappingProxyType

import pytest

from scaleladder import flavors
from scaleladder.flavors import FLAVORS, get_flavor, register
from scaleladder.spec import RunSpec, SpecError


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registrations made in a test leave the process's table as it was."""
    monkeypatch.setattr(flavors, "_TABLE", dict(flavors._TABLE))
    monkeypatch.setattr(flavors, "FLAVORS", MappingProxyType(flavors._TABLE))
    yield


def test_a_registered_flavor_is_a_model_the_spec_accepts(table: None) -> None:
    with pytest.raises(SpecError, match="unknown model 'vit-tiny'"):
        RunSpec.from_path("vit-tiny/single/fp32/pre-lag/n1/b2")
    tiny = dataclasses.replace(get_flavor("vit-debug"), name="vit-tiny", hidden=16)
    assert register(tiny) is tiny
    assert get_flavor("vit-tiny") is tiny and flavors.FLAVORS["vit-tiny"] is tiny
    assert RunSpec.from_path("vit-tiny/single/fp32/pre-lag/n1/b2").model == "vit-tiny"
    assert register(tiny) is tiny  # the same flavor again: a no-op


def test_a_clash_or_a_name_no_spec_can_hold_is_refused(table: None) -> None:
    other = dataclasses.replace(get_flavor("vit-debug"), hidden=48)
    with pytest.raises(SpecError, match="'vit-debug' is already registered"):
        register(other)
    assert get_flavor("vit-debug").hidden == 32
    assert register(other, replace=True) is other and get_flavor("vit-debug") is other
    for bad in ("", "vit/tiny", "vit tiny"):
        with pytest.raises(SpecError, match="a run spec's first part"):
            register(dataclasses.replace(other, name=bad))


def test_readers_see_a_read_only_view() -> None:
    with pytest.raises(TypeError):
        FLAVORS["x"] = get_flavor("vit-debug")  # type: ignore[index]
    assert list(FLAVORS)[:2] == ["flava-350m", "flava-900m"]  # registration order: the built-in ones first
