"""A models file: the user's models by name, each a timm, transformers or python entry (docs/your-model.md).

TORCH-FREE on purpose: Snakemake's own process reads the file when the DAG is made
(``site/config.py``), and importing torch, timm or transformers there would cost it seconds
each time. So this module checks only what the file says: its YAML, each entry's keys and
their types. What the libraries say about an entry (a timm name timm lacks, a config class
transformers lacks, a factory that cannot be imported) is found when the model is first
built (``models/sources/``).

The file is a YAML mapping, a model name (a run spec's first part) to an entry::

    convnext-atto:
      source: timm                      # timm | transformers | python
      name: convnext_atto               # timm: a name timm has
      kwargs: {num_classes: 10}         # timm.create_model's / the config class's / the factory's
      image_size: 32
    llama-tiny:
      source: transformers
      config: LlamaConfig               # a configuration class of transformers
      task: causal-lm                   # causal-lm | image-classification | image-text-contrastive
      kwargs: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 128}
    my-model:
      source: python
      factory: my_model:make            # "module:function", returning a models.family.Family
      path: my_model                    # a folder put on sys.path, relative to this file

Common keys: ``image_size`` (default: the kwargs' ``img_size`` or ``image_size``, else 224),
``text_len`` (default 64), ``num_classes`` (default: the kwargs' ``num_classes`` or
``num_labels``, else 1000). timm and transformers entries may name their blocks
(``blocks: [ClassName, ...]``) where the automatic rule finds none.

Each entry becomes a :class:`~scaleladder.flavors.Flavor` whose ``family`` is its source and
whose ``entry`` is the entry as canonical JSON (with ``model``, its name, and a python entry's
``path`` made absolute): records carry it, and :func:`register_entry` makes the same flavor
from it on any machine, with no models file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from scaleladder import flavors
from scaleladder.errors import SpecError
from scaleladder.flavors import Flavor

SOURCES: tuple[str, ...] = ("timm", "transformers", "python")
#: A transformers entry's task -> what it trains on (Family.inputs)
TASKS: Mapping[str, str] = {"causal-lm": "text", "image-classification": "image", "image-text-contrastive": "image-text"}
COMMON_KEYS: frozenset[str] = frozenset({"source", "kwargs", "image_size", "text_len", "num_classes"})
SOURCE_KEYS: Mapping[str, frozenset[str]] = {
    "timm": frozenset({"name", "pretrained", "blocks"}),
    "transformers": frozenset({"config", "task", "blocks"}),
    "python": frozenset({"factory", "path"}),
}
REQUIRED: Mapping[str, tuple[str, ...]] = {"timm": ("name",), "transformers": ("config", "task"), "python": ("factory",)}
#: The key under which an entry's JSON holds its model name (added here, never written by the user).
MODEL_KEY = "model"
DEFAULT_IMAGE_SIZE = 224
DEFAULT_TEXT_LEN = 64
DEFAULT_NUM_CLASSES = 1000
#: A text model's vocabulary when its kwargs name none: the project tokenizer's default size
#: (data/tokenizer.DEFAULT_VOCAB_SIZE, a test holds the two equal; importing it would import
#: the tokenizers library here).
TEXT_VOCAB_SIZE = 1024
#: A text model's special ids: the project tokenizer's (data/tokenizer.py trains [PAD] [UNK] [CLS]
#: [SEP] [MASK] as ids 0..4; rung/batches.py's text is [CLS] ... [SEP] with them). Its config gets
#: them (pad, bos = [CLS], eos = [SEP]); the shards' tokenizer must agree (data/pair_transforms.py).
PAD_ID, BOS_ID, EOS_ID = 0, 2, 3
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class _Loader(yaml.SafeLoader):
    """YAML 1.1's safe loader, reading ``1e-6`` as a float (PyYAML wants ``1.0e-6``: ``1e-6``
    would reach timm or transformers as the string "1e-6")."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_models_file(path: str | Path) -> dict[str, Flavor]:
    """Every entry of the models file at ``path``, checked, as a flavor (not registered)."""
    p = Path(path)
    where = f"models file {str(path)!r}"
    if not p.is_file():
        raise SpecError(f"{where}: {'is not a file' if p.exists() else 'does not exist'}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{where}: cannot be read ({type(e).__name__}: {_first_line(str(e))})") from None
    try:
        doc = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        raise SpecError(f"{where}: not valid YAML ({_yaml_problem(e)})") from None
    if doc is None:
        raise SpecError(f"{where}: holds no models (a mapping of model names to entries is expected)")
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: must be a mapping of model names to entries, not a {type(doc).__name__}")
    base = p.resolve().parent
    return {str(name): flavor_from_entry(name, entry, base, where) for name, entry in doc.items()}


def register_models_file(path: str | Path) -> dict[str, Flavor]:
    """Load the models file at ``path`` and register each entry (``flavors.register``); return them."""
    loaded = load_models_file(path)
    for flavor in loaded.values():
        _register(flavor, f"models file {str(path)!r}")
    return loaded


def register_entry(name: str, entry: str) -> Flavor:
    """Register the model ``name`` from its entry's JSON (a record's ``model_entry``) and return it."""
    where = f"recorded model {name!r}"
    try:
        parsed = json.loads(entry)
    except ValueError as e:
        raise SpecError(f"{where}: its entry is not JSON ({_first_line(str(e))})") from None
    if not isinstance(parsed, dict):
        raise SpecError(f"{where}: its entry is not a mapping")
    parsed.pop(MODEL_KEY, None)
    return _register(flavor_from_entry(name, parsed, None, where), where)


def _register(flavor: Flavor, where: str) -> Flavor:
    try:
        return flavors.register(flavor)
    except SpecError:
        raise SpecError(f"{where}: model {flavor.name!r} is already registered with another entry") from None


def is_built_in(name: str) -> bool:
    """Whether ``name`` is a flavor that no models file made (the built-in table, a benchmark's)."""
    known = flavors.FLAVORS.get(name)  # looked up now: tests swap the table
    return known is not None and not known.entry


def flavor_from_entry(name: object, entry: object, base: Path | None, where: str) -> Flavor:
    """The flavor of one entry, checked. ``base``: the models file's folder (a python entry's
    ``path`` is relative to it and must exist); None for an entry whose path is absolute already
    (from a record: not checked, the record may come from another machine)."""
    if not isinstance(name, str):
        raise SpecError(f"{where}: model name {name!r} is not a string")
    if not name or "/" in name or any(c.isspace() for c in name):
        raise SpecError(f"{where}: model name {name!r} must be non-empty, with no '/' and no white space (a run spec's first part)")
    where = f"{where}: model {name!r}"
    if is_built_in(name):
        raise SpecError(f"{where} is a built-in flavor's name; give the entry another name")
    if not isinstance(entry, dict):
        raise SpecError(f"{where}: its entry must be a mapping (source, ...), not {type(entry).__name__}")
    source = entry.get("source")
    if source is None:
        raise SpecError(f"{where}: missing key 'source' (one of {', '.join(SOURCES)})")
    if source not in SOURCES:
        raise SpecError(f"{where}: unknown source {source!r} (one of {', '.join(SOURCES)})")
    allowed = COMMON_KEYS | SOURCE_KEYS[source]
    unknown = sorted(str(k) for k in entry if k not in allowed)
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} for source {source} "
                        f"(known: {', '.join(sorted(allowed))})")
    missing = [k for k in REQUIRED[source] if k not in entry]
    if missing:
        raise SpecError(f"{where}: missing key(s) {', '.join(map(repr, missing))} for source {source}")
    kwargs = entry.get("kwargs", {})
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise SpecError(f"{where}: kwargs must be a mapping of argument names to values")
    if entry.get("pretrained") not in (None, False) or kwargs.get("pretrained") not in (None, False):
        raise SpecError(f"{where}: pretrained: true is refused (scaleladder builds models with random weights, offline)")
    _check_values(entry, source, where)

    canonical = dict(entry)
    if source == "python" and "path" in entry:
        folder = Path(entry["path"]).expanduser()
        if base is not None:
            folder = (base / folder).resolve()
            if not folder.is_dir():
                raise SpecError(f"{where}: path {entry['path']!r} ({folder}) is not a folder")
        canonical["path"] = str(folder)
    canonical[MODEL_KEY] = name
    try:
        text = json.dumps(canonical, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise SpecError(f"{where}: holds a value JSON cannot represent ({_first_line(str(e))})") from None

    text_model = source == "transformers" and TASKS[entry["task"]] != "image"
    return Flavor(
        name, source,
        image_size=_int_key(entry, "image_size", where) or _image_size(kwargs, where) or DEFAULT_IMAGE_SIZE,
        text_len=_int_key(entry, "text_len", where) or DEFAULT_TEXT_LEN,
        num_classes=_int_key(entry, "num_classes", where) or _kwarg_int(kwargs, ("num_classes", "num_labels"), where)
        or DEFAULT_NUM_CLASSES,
        vocab_size=_text_vocab(kwargs, where) if text_model else Flavor.vocab_size,
        entry=text,
    )


def _check_values(entry: dict[str, Any], source: str, where: str) -> None:
    for key in ("name", "config", "factory", "path"):
        if key in entry and (not isinstance(entry[key], str) or not entry[key].strip()):
            raise SpecError(f"{where}: {key} must be a non-empty string, not {entry[key]!r}")
    if "config" in entry and not entry["config"].isidentifier():
        raise SpecError(f"{where}: config {entry['config']!r} is not a class name (e.g. LlamaConfig)")
    if "factory" in entry and not _FACTORY.match(entry["factory"]):
        raise SpecError(f"{where}: factory {entry['factory']!r} must be \"module:function\" (e.g. my_model:make)")
    if "task" in entry and entry["task"] not in TASKS:
        raise SpecError(f"{where}: unknown task {entry['task']!r} (one of {', '.join(TASKS)})")
    if "blocks" in entry:
        blocks = entry["blocks"]
        if not isinstance(blocks, list) or not blocks or not all(isinstance(b, str) and b.isidentifier() for b in blocks):
            raise SpecError(f"{where}: blocks must be a list of class names (e.g. [LlamaDecoderLayer]), not {blocks!r}")
    _int_key(entry, "image_size", where)
    if (_int_key(entry, "text_len", where) or 2) < 2:
        raise SpecError(f"{where}: text_len must be at least 2 (a first token and the end-of-text token)")


def _int_key(entry: Mapping[str, Any], key: str, where: str) -> int | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{where}: {key} must be a positive integer, not {value!r}")
    return value


def _kwarg_int(kwargs: Mapping[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    for key in keys:
        value = kwargs.get(key)
        if value is None:
            continue
        if isinstance(value, (list, tuple)) and value and all(v == value[0] for v in value):
            value = value[0]  # timm's img_size: (32, 32)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{where}: kwargs {key} {value!r} is not a positive integer (or a square size); "
                            f"give the entry's own {'image_size' if 'size' in key else 'num_classes'}")
        return value
    return None


def _image_size(kwargs: Mapping[str, Any], where: str) -> int | None:
    found = _kwarg_int(kwargs, ("img_size", "image_size"), where)
    vision = kwargs.get("vision_config")  # a two-tower config: CLIPConfig(vision_config={...})
    if found is None and isinstance(vision, dict):
        found = _kwarg_int(vision, ("image_size",), where)
    return found


def _text_vocab(kwargs: Mapping[str, Any], where: str) -> int:
    text = kwargs.get("text_config")
    found = _kwarg_int(text if isinstance(text, dict) else kwargs, ("vocab_size",), where)
    return found or TEXT_VOCAB_SIZE


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    problem = getattr(e, "problem", None) or _first_line(str(e))
    mark = getattr(e, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(problem)
