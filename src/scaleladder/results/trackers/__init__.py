"""The opt-in trackers: scaleladder's numbers where TensorBoard and MLflow users look for them.

A tracker is one module here, imported only when its setting is on (``trackers.*`` in a site
config; docs/metrics.md, "Trackers"). Neither is ever in the timed window, and neither can
cost a result: a tracker that fails is one warning line, and the record is written first.

- ``tensorboard_events``: a rung's per-step scalars as TensorBoard events, written by rank 0
  from its record after the timed window (``run --tensorboard DIR``).
- ``mlflow_runs``: ``scaleladder mlflow``: one MLflow run per rung of a ladder, from one
  process after ``aggregate`` (many rung jobs writing one SQLite file on Lustre meet its locks).
"""

from __future__ import annotations

import importlib.util

from scaleladder.errors import SpecError


def require(package: str, extra: str, what: str) -> None:
    """One line naming the extra to install when ``package`` is missing (exit 2, before any work)."""
    if importlib.util.find_spec(package) is None:
        raise SpecError(f"{what} needs the {package} package: pip install 'scaleladder[{extra}]'")
