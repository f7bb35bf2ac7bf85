"""Where a models-file model comes from (docs/your-model.md): each source makes the
:class:`~scaleladder.models.family.Family` of one entry.

* ``timm``: ``timm.create_model(name, pretrained=False, **kwargs)`` (``sources/timm.py``);
* ``transformers``: a configuration class and a task, built offline from the config
  (``sources/transformers.py``);
* ``python``: the user's own ``factory`` returning a Family (``sources/python.py``).

and what they share:

* ``common``: the library families' build, synthetic samples by input kind, text ids, losses
  (CLIP's gathered over the ranks);
* ``meta_init``: a library model built with its parameters on meta, initialised later as its
  library did (its buffers kept real).

The libraries are imported here only when an entry of theirs is asked for: the models file
itself is read torch-free (``models/models_file.py``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from scaleladder.errors import SpecError

if TYPE_CHECKING:
    from scaleladder.flavors import Flavor
    from scaleladder.models.family import Family

#: source -> the package its entries need (None: the user's own code)
_NEEDS = {"timm": "timm", "transformers": "transformers", "python": None}


def family_for_entry(flavor: Flavor) -> Family:
    """The family of ``flavor``'s models-file entry (``flavor.entry``, canonical JSON)."""
    try:
        entry = json.loads(flavor.entry)
    except ValueError:
        raise SpecError(f"model {flavor.name!r}: its entry is not JSON: {flavor.entry[:80]!r}") from None
    if not isinstance(entry, dict):
        raise SpecError(f"model {flavor.name!r}: its entry is not a mapping: {flavor.entry[:80]!r}")
    entry.setdefault("model", flavor.name)
    source = entry.get("source")
    if source not in _NEEDS:
        raise SpecError(f"model {flavor.name!r}: unknown source {source!r} (one of {', '.join(_NEEDS)})")
    package = _NEEDS[source]
    if source == "transformers":
        from scaleladder.models.sources.transformers import offline

        offline()  # before transformers is imported: it reads them then
    if package is not None:
        try:
            __import__(package)
        except ImportError as e:
            raise SpecError(f"model {flavor.name!r} is a {source} entry, but {package} cannot be imported ({e}); "
                            "install scaleladder's models extra (pip install 'scaleladder[models]')") from None
    if source == "timm":
        from scaleladder.models.sources.timm import TimmFamily

        return TimmFamily(entry)
    if source == "transformers":
        from scaleladder.models.sources.transformers import family

        return family(entry)
    from scaleladder.models.sources.python import python_family

    return python_family(entry)
