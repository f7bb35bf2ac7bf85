"""`scaleladder mlflow`: one MLflow run per rung of a ladder, logged from one process.

Each run is named by its spec and holds:

- **params**: the spec's fields (model, strategy, wrapper, sharding, precision, knobs, nodes,
  batch, ...) and the settings the rung ran with (steps, warm-up, data, seed);
- **metrics**: every finite number of the record (items/s and its interval, MFU, memory,
  start-up, ...), at step 0; ``ok`` rungs only have the throughput ones;
- **tags**: ``status``, ``spec``, the rung file's SHA-256 (``scaleladder.source_sha256``);
- **artifact**: the rung file itself, where it can be read.

Logging a ladder twice logs each rung once: a rung whose spec and source SHA-256 are already in
the experiment as a finished run is skipped (a rerun rung, with a new file, is a new run); a run
that an earlier call left unfinished (the server went away mid-rung) is deleted and logged again. Called after
``aggregate``, from one process: since MLflow 3.7 the default store is SQLite, and many rung
jobs writing one SQLite file on Lustre would meet its locks.

A tracker never costs a result: a store that cannot be reached or written is ONE warning line
and exit 0 (the ladder is as it was); the stamp file (``--stamp``) says what happened, so the
workflow goes on. A malformed URI is refused when the config is read (the schema's pattern, the
same as :data:`URI_PATTERN`, which ``--uri`` is checked against too: exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from scaleladder.errors import SpecError
from scaleladder.files import atomic_write_text
from scaleladder.results.record import Record, Settings, Source, Spec

PARAM_SECTIONS = (Spec, Settings)  # the spec and the settings a rung ran with: params
SHA_TAG = "scaleladder.source_sha256"
SPEC_TAG = "scaleladder.spec"
#: MLflow's own retries and timeouts, unless the user set them: an unreachable server is a
#: warning in seconds, not after MLflow's default back-off of minutes
#: a tracking URI: a local SQLite store, a file store, a server, Databricks (the schema's
#: trackers.mlflow_uri pattern is this one; tests/test_trackers.py holds them equal)
URI_PATTERN = r"^(sqlite:///.+|file:.+|https?://[^/\s]+.*|databricks(://.*)?)$"
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ladder", required=True, help="the aggregated ladder file (results/ladder.h5)")
    p.add_argument("--uri", required=True, help="the tracking URI (sqlite:///results/mlflow.db, http://host:5000, ...)")
    p.add_argument("--experiment", default="scaleladder", help="the experiment the runs go to (default scaleladder)")
    p.add_argument("--stamp", default=None, metavar="FILE", help="a JSON note of what was logged (the workflow's output)")


def param_keys() -> set[str]:
    return {str(a) for s in PARAM_SECTIONS for a in s.fields}


def split(r: Mapping[str, object]) -> tuple[dict[str, str], dict[str, float]]:
    """A rung's (params, metrics): spec and settings as text, every finite number as a metric."""
    keys = param_keys()
    params = {k: str(v)[:6000] for k, v in r.items() if k in keys and v is not None and v != ""}
    metrics = {k: float(v) for k, v in r.items() if k not in keys and isinstance(v, int | float) and math.isfinite(float(v))}
    return params, metrics


def logged(client: object, experiment_id: str) -> tuple[set[tuple[str, str]], list[str]]:
    """(spec, source SHA-256) of every finished run in the experiment, and the ids of the runs an
    earlier call left unfinished (logged again)."""
    seen: set[tuple[str, str]] = set()
    unfinished: list[str] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)  # type: ignore[attr-defined]
        for r in page:
            if r.info.status == "FINISHED":
                seen.add((r.data.tags.get(SPEC_TAG, ""), r.data.tags.get(SHA_TAG, "")))
            elif SPEC_TAG in r.data.tags:
                unfinished.append(r.info.run_id)
        token = page.token
        if not token:
            return seen, unfinished


def experiment(client: object, name: str, uri: str) -> str:
    """The experiment's id, made when missing (a local store keeps its artifacts beside the database)."""
    found = client.get_experiment_by_name(name)  # type: ignore[attr-defined]
    if found is not None:
        return str(found.experiment_id)
    where = None
    if uri.startswith("sqlite:///"):
        where = Path(uri[len("sqlite:///"):]).resolve().parent.joinpath("mlflow-artifacts").as_uri()
    return str(client.create_experiment(name, artifact_location=where))  # type: ignore[attr-defined]


def rung_file(source: str, ladder: str) -> str | None:
    """A rung's file, named relative to where aggregate ran: the working directory, else the
    workflow's (the folder holding results/ladder.h5's results/)."""
    for path in (source, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(ladder))), source)):
        if source and os.path.isfile(path):
            return path
    return None


def log_rungs(uri: str, name: str, rungs: Iterable[Mapping[str, object]], ladder: str) -> tuple[int, int]:
    """Log every rung not yet in the experiment; (logged, skipped)."""
    from mlflow.entities import Metric, Param, RunStatus
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = experiment(client, name, uri)
    seen, unfinished = logged(client, exp)
    for run_id in unfinished:
        client.delete_run(run_id)
    done = skipped = 0
    now = int(time.time() * 1000)
    for r in rungs:
        spec, sha = str(r.get(Spec.spec, "")), str(r.get(Source.source_sha256, ""))
        if (spec, sha) in seen:
            skipped += 1
            continue
        params, metrics = split(r)
        tags = {SPEC_TAG: spec, SHA_TAG: sha, "status": str(r.get(Record.status, ""))}
        run = client.create_run(exp, run_name=spec, tags=tags)
        client.log_batch(run.info.run_id, metrics=[Metric(k, v, now, 0) for k, v in sorted(metrics.items())],
                         params=[Param(k, v) for k, v in sorted(params.items())])
        source = rung_file(str(r.get(Source.source_file, "")), ladder)
        if source:
            client.log_artifact(run.info.run_id, source)
        client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
        done += 1
    return done, skipped


def main(args: argparse.Namespace) -> int:
    from scaleladder.results.aggregate import read_ladder
    from scaleladder.results.trackers import require

    require("mlflow", "mlflow", "scaleladder mlflow")
    if not re.match(URI_PATTERN, args.uri):
        raise SpecError(f"--uri {args.uri!r}: not a tracking URI (sqlite:///path.db, file:/path, http(s)://host:port)")
    rungs, _root = read_ladder(args.ladder)  # an unreadable ladder is bad input: one line, exit 2
    for k, v in HTTP_ENV.items():
        os.environ.setdefault(k, v)
    note: dict[str, object] = {"uri": args.uri, "experiment": args.experiment, "rungs": len(rungs)}
    try:
        done, skipped = log_rungs(args.uri, args.experiment, rungs, args.ladder)
    except Exception as e:  # any failure of the tracker: the ladder is as it was
        first = str(e).splitlines()[0] if str(e) else ""
        print(f"scaleladder mlflow: warning: nothing more logged to {args.uri} ({type(e).__name__}: {first[:300]}); "
              "the ladder and its rungs are unaffected", file=sys.stderr)
        note["error"] = f"{type(e).__name__}: {first[:300]}"
    else:
        note.update(logged=done, skipped=skipped)
        print(f"scaleladder mlflow: {done} run(s) logged to {args.uri} (experiment {args.experiment!r}), "
              f"{skipped} already there")
    if args.stamp:
        atomic_write_text(args.stamp, json.dumps(note, indent=1) + "\n")
    return 0

