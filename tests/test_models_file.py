"""The models file (models/models_file.py): read torch-free, every entry checked, each fault one
line naming the model and the culprit, and the flavors it makes registered and re-made from a
record's entry alone."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest

from scaleladder import flavors
from scaleladder.models.models_file import (
    TEXT_VOCAB_SIZE,
    load_models_file,
    register_entry,
    register_models_file,
)
from scaleladder.spec import RunSpec, SpecError

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "models.yaml"


@pytest.fixture(autouse=True)
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registrations made in a test leave the process's table as it was."""
    monkeypatch.setattr(flavors, "_TABLE", dict(flavors._TABLE))
    monkeypatch.setattr(flavors, "FLAVORS", MappingProxyType(flavors._TABLE))
    yield


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def test_the_example_holds_one_entry_of_each_source() -> None:
    got = load_models_file(EXAMPLE)
    assert {f.family for f in got.values()} == {"timm", "transformers", "python"}
    atto, llama, clip, mine = got["convnext-atto"], got["llama-tiny"], got["clip-tiny"], got["my-model"]
    assert (atto.image_size, atto.num_classes) == (32, 10)
    assert (llama.text_len, llama.vocab_size) == (32, TEXT_VOCAB_SIZE)
    assert clip.image_size == 32  # from kwargs.vision_config.image_size
    entry = json.loads(mine.entry)
    assert entry["model"] == "my-model" and entry["path"] == str(EXAMPLE.parent / "my_model")
    assert json.loads(atto.entry) == {"model": "convnext-atto", "source": "timm", "name": "convnext_atto",
                                      "kwargs": {"num_classes": 10}, "image_size": 32}
    assert atto.entry == json.dumps(json.loads(atto.entry), sort_keys=True)  # canonical


def test_registered_names_are_models_the_spec_accepts() -> None:
    got = register_models_file(EXAMPLE)
    assert RunSpec.from_path("llama-tiny/fsdp2-full/fp32/pf1/n1/b4").model == "llama-tiny"
    assert flavors.get_flavor("clip-tiny") is got["clip-tiny"]
    assert register_models_file(EXAMPLE) == got  # the same file again: nothing changes


def test_a_records_entry_makes_the_same_flavor() -> None:
    made = load_models_file(EXAMPLE)
    for name, flavor in made.items():
        assert register_entry(name, flavor.entry) == flavor
    with pytest.raises(SpecError, match="recorded model 'x': its entry is not JSON"):
        register_entry("x", "{nope")


def test_defaults_and_yaml_floats(tmp_path: Path) -> None:
    got = load_models_file(write(tmp_path, """
a: {source: timm, name: convnext_atto, kwargs: {ls_init_value: 1e-6}}
b: {source: timm, name: vit_tiny_patch16_224, kwargs: {img_size: [48, 48], num_classes: 7}}
c: {source: transformers, config: LlamaConfig, task: causal-lm, kwargs: {vocab_size: 4096}}
"""))
    assert json.loads(got["a"].entry)["kwargs"]["ls_init_value"] == 1e-6  # a float, not the string "1e-6"
    assert (got["a"].image_size, got["a"].num_classes, got["a"].text_len) == (224, 1000, 64)
    assert (got["b"].image_size, got["b"].num_classes) == (48, 7)
    assert got["c"].vocab_size == 4096


def test_the_default_text_vocabulary_is_the_tokenizers() -> None:
    from scaleladder.data.tokenizer import DEFAULT_VOCAB_SIZE

    assert TEXT_VOCAB_SIZE == DEFAULT_VOCAB_SIZE


BAD = {
    "unknown source": ("m: {source: keras, name: x}", "model 'm': unknown source 'keras' (one of timm, transformers, python)"),
    "no source": ("m: {name: x}", "model 'm': missing key 'source'"),
    "timm without name": ("m: {source: timm}", "model 'm': missing key(s) 'name' for source timm"),
    "transformers without task": ("m: {source: transformers, config: LlamaConfig}", "model 'm': missing key(s) 'task'"),
    "python without factory": ("m: {source: python}", "model 'm': missing key(s) 'factory'"),
    "unknown key": ("m: {source: timm, name: x, weights: imagenet}", "model 'm': unknown key(s) 'weights' for source timm"),
    "a key of another source": ("m: {source: timm, name: x, task: causal-lm}", "model 'm': unknown key(s) 'task'"),
    "pretrained": ("m: {source: timm, name: resnet18, pretrained: true}", "model 'm': pretrained: true is refused"),
    "pretrained in kwargs": ("m: {source: timm, name: resnet18, kwargs: {pretrained: true}}", "model 'm': pretrained: true is refused"),
    "built-in name": ("vit-base: {source: timm, name: vit_base_patch16_224}", "model 'vit-base' is a built-in flavor's name"),
    "bad task": ("m: {source: transformers, config: LlamaConfig, task: chat}", "model 'm': unknown task 'chat' (one of causal-lm, "),
    "bad factory": ("m: {source: python, factory: my_model.make}", "model 'm': factory 'my_model.make' must be \"module:function\""),
    "bad config": ("m: {source: transformers, config: 'Llama Config', task: causal-lm}", "model 'm': config 'Llama Config' is not a class name"),
    "kwargs a list": ("m: {source: timm, name: x, kwargs: [1, 2]}", "model 'm': kwargs must be a mapping"),
    "image_size text": ("m: {source: timm, name: x, image_size: big}", "model 'm': image_size must be a positive integer, not 'big'"),
    "text_len one": ("m: {source: transformers, config: LlamaConfig, task: causal-lm, text_len: 1}", "model 'm': text_len must be at least 2"),
    "blocks a string": ("m: {source: timm, name: x, blocks: Block}", "model 'm': blocks must be a list of class names"),
    "no such path": ("m: {source: python, factory: a:b, path: nowhere}", "model 'm': path 'nowhere' ("),
    "entry a string": ("m: timm", "model 'm': its entry must be a mapping"),
    "name with a slash": ("a/b: {source: timm, name: x}", "model name 'a/b' must be non-empty, with no '/'"),
    "a list": ("- {source: timm, name: x}", "must be a mapping of model names to entries, not a list"),
    "empty": ("", "holds no models"),
    "malformed": ("m: {source: timm, name: [x}", "not valid YAML ("),
}


@pytest.mark.parametrize("case", list(BAD))
def test_each_fault_is_one_line_naming_the_culprit(tmp_path: Path, case: str) -> None:
    text, message = BAD[case]
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as e:
        register_models_file(path)
    said = str(e.value)
    assert "\n" not in said
    assert said.startswith(f"models file {str(path)!r}: ") and message in said, said


def test_a_missing_file_or_a_folder(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"models file '.*nope.yaml': does not exist"):
        load_models_file(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match=r"models file '.*': is not a file"):
        load_models_file(tmp_path)


def test_a_name_registered_by_another_file_is_refused(tmp_path: Path) -> None:
    register_models_file(write(tmp_path, "m: {source: timm, name: convnext_atto}"))
    other = tmp_path / "other.yaml"
    other.write_text("m: {source: timm, name: resnet18}")
    with pytest.raises(SpecError, match=r"other.yaml': model 'm' is already registered with another entry"):
        register_models_file(other)


NO_TORCH = """
import sys
for name in ("torch", "timm", "transformers", "tokenizers"):
    sys.modules[name] = None  # importing them now raises ImportError
from scaleladder.models.models_file import register_models_file
print(sorted(register_models_file(sys.argv[1])))
"""


@pytest.mark.process
def test_the_file_is_read_without_torch() -> None:
    """Snakemake's process reads it when the DAG is made: no torch, timm or transformers there."""
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(sorted(load_models_file(EXAMPLE)))
