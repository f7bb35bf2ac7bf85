"""What a site cannot run without, said before any job is submitted.

A profile's ``site.requires`` maps each setting to what it is: an environment variable
(``SCALELADDER_SLURM_ACCOUNT: the Slurm account ...``) must be set and not empty; ``image``
means the file ``site.image`` names (after shell expansion, as the job's shell would do it)
must exist. The workflow prints the missing ones in a few lines while the DAG is built, so
``snakemake --profile frontier`` and its ``-n`` say at once what every job would trip on,
instead of 339 jobs failing one by one. ``scaleladder doctor --profile NAME`` checks much more
(binds, the image's torch, the network plugin's libraries); this is the cheap part that needs
nothing but the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from scaleladder.site.profiles import expand
from scaleladder.site.settings import Site


def missing(site: Site, env: Mapping[str, str] | None = None, cwd: str | None = None) -> list[str]:
    """One line per required setting of ``site`` that is not there."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PWD", cwd or os.getcwd())
    lines = []
    for key, what in site.requires or ():
        if key == "image":
            path, why = expand(site.image, env)
            if path is None:
                lines.append(f"image ({what}): {why}")
            elif not Path(path).is_file():
                lines.append(f"image ({what}): {path} does not exist (build it, or set SCALELADDER_IMAGE)")
        elif not env.get(key):
            lines.append(f"{key} ({what}): not set")
    return lines


def announce(site: Site, env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The few lines the workflow prints for a site with missing settings ('' when none)."""
    lines = missing(site, env, cwd)
    if not lines:
        return ""
    name = site.name
    head = f"scaleladder: profile {name}: {len(lines)} required setting(s) missing; every job would fail without them:"
    return "\n".join([head, *(f"  - {line}" for line in lines),
                      f"  Set them, then check the site with: scaleladder doctor --profile {name}"])
