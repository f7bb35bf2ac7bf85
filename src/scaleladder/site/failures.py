"""Why a workflow job failed, on the console: the one-line cause from each failed job's log.

Snakemake prints "Error in rule X:" with ``message: None`` (the rule has no ``message:``
directive) and the path of the job's log; the cause itself ("no images found", "inductor
needs a C++ compiler") is only in that log. The Snakefile's ``onerror`` handler
(workflow/rules/common.smk) calls :func:`explain` with Snakemake's own log: it finds each
failed job's rule and log there, and prints the last error line of each log under the
rule's name.

In a container (``docker run --rm``) Snakemake's complete log lies in ``.snakemake/log/``
inside the container, gone once it exits: :func:`explain` copies it into the mounted
``results/logs/snakemake/`` and names that copy.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

#: Where a copy of Snakemake's complete log goes when it runs in a container (``results/`` is mounted).
LOG_COPIES = Path("results/logs/snakemake")

_RULE = re.compile(r"^Error in rule (?P<rule>\S+?):\s*$")
_LOG = re.compile(r"^\s+log: (?P<logs>.+?)(?: \(check log file\(s\) for error details\))?\s*$")
# "scaleladder: error: ...", "scaleladder shard: error: ...": our own one-line errors (SpecError and the
# like); anywhere in the line: a rank's lines may carry a prefix ("[rank1]: scaleladder run: error: ...")
_OURS = re.compile(r"\bscaleladder[\w .-]*: error: ")
# the last line of a traceback: "SpecError: ...", "torch.OutOfMemoryError: ...", "KeyboardInterrupt"
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$")
MAX_CHARS = 400  # one line on the console, even for a cause that runs on


def failed_jobs(snakemake_log: Iterable[str]) -> list[tuple[str, list[str]]]:
    """(rule, its job's log files) for each "Error in rule" block of Snakemake's log, in order,
    each job once."""
    out: list[tuple[str, list[str]]] = []
    rule: str | None = None
    for line in snakemake_log:
        line = line.rstrip("\n")
        if m := _RULE.match(line):
            rule = m["rule"]
            out.append((rule, []))
        elif rule is not None and (m := _LOG.match(line)):
            out[-1][1].extend(p.strip() for p in m["logs"].split(",") if p.strip())
            rule = None  # a block names its log once; later "log:" lines belong to other blocks
        elif rule is not None and line and not line.startswith(" "):
            rule = None  # the block ended without a log
    seen: set[tuple[str, tuple[str, ...]]] = set()
    unique = []
    for rule_, logs in out:
        if (rule_, tuple(logs)) not in seen:
            seen.add((rule_, tuple(logs)))
            unique.append((rule_, logs))
    return unique


def cause(log_text: str) -> str:
    """The one line that says why: our own ``scaleladder ...: error:`` line, else the last line
    of the last traceback, else the last line that says error, else the last line ('' if none)."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    for pick in (lambda ln: _OURS.search(ln), lambda ln: _EXCEPTION.match(ln), lambda ln: "error" in ln.lower()):
        hits = [ln for ln in lines if pick(ln)]
        if hits:
            return _one_line(hits[-1])
    return _one_line(lines[-1]) if lines else ""


def _one_line(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "…"


def _log_cause(path: str) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        return f"(its log {path} cannot be read: {e.strerror or e})"
    return cause(text) or f"(its log {path} is empty: the job died before writing to it, e.g. killed; see above)"


def in_container() -> bool:
    """Whether this process runs in a container: ``SCALELADDER_IN_CONTAINER`` (set by our images),
    or the files Docker (``/.dockerenv``) and Podman (``/run/.containerenv``) leave."""
    flag = os.environ.get("SCALELADDER_IN_CONTAINER", "").strip().lower()
    if flag:
        return flag not in ("0", "false", "no")
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")


def copy_to_results(logs: Iterable[str], dest: Path = LOG_COPIES) -> list[Path]:
    """Each of Snakemake's complete logs copied under ``dest`` (the mounted results/); the copies."""
    copies = []
    for log in logs:
        try:
            dest.mkdir(parents=True, exist_ok=True)
            copies.append(Path(shutil.copy2(log, dest / Path(log).name)))
        except OSError:
            continue  # a read-only results/: the message still names the cause
    return copies


def lines(snakemake_logs: Iterable[str]) -> Iterator[str]:
    """The console lines: one block per failed job, the rule's name then its log's cause."""
    jobs: list[tuple[str, list[str]]] = []
    for log in snakemake_logs:
        try:
            with open(log, errors="replace") as f:
                jobs += [j for j in failed_jobs(f) if j not in jobs]
        except OSError:
            continue
    if not jobs:
        return
    yield ("scaleladder: why it failed, from each failed job's log (Snakemake's 'message: None' above "
           "only says that the rule has no message of its own):")
    for rule, logs in jobs:
        yield f"  rule {rule}:"
        for log in logs or []:
            yield f"    {_log_cause(log)}"
            yield f"    (log: {log})"
        if not logs:
            yield "    (the job has no log: see Snakemake's lines above)"


def complete_log_line(copies: Iterable[Path]) -> str:
    """Snakemake's last line, naming the copies in the mounted results/ (relative, as the host sees them)."""
    return (f"Complete log(s): {', '.join(map(str, copies))} (in the results/ folder mounted from the host: "
            ".snakemake/ lies inside the container, gone once it exits)")


def explain(snakemake_logs: list[str], out: TextIO, container: bool | None = None) -> list[Path]:
    """Print why each failed job failed (:func:`lines`); in a container also copy Snakemake's
    complete log into the mounted results/. Returns the copies (the caller names them last:
    :func:`complete_log_line`)."""
    for line in lines(snakemake_logs):
        print(line, file=out)
    if not (in_container() if container is None else container):
        return []
    return copy_to_results(snakemake_logs)
