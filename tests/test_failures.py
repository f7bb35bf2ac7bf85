"""The cause of a failed job on the console (scaleladder.site.failures, the Snakefile's onerror):
the rule and log of each failed job from Snakemake's log, and the one line of a log that says why."""

from __future__ import annotations

import io
from pathlib import Path

from scaleladder.site import failures

SNAKEMAKE_LOG = """\
localrule shard:
    output: results/shards/32px/manifest.json (update)
    log: results/logs/shard/32px.log
    jobid: 3
Error in rule shard:
    message: None
    jobid: 3
    output: results/shards/32px/manifest.json (update)
    log: results/logs/shard/32px.log (check log file(s) for error details)
    shell:
        scaleladder shard ... > results/logs/shard/32px.log 2>&1
        (command exited with non-zero exit code)
Error in rule rung:
    message: None
    jobid: 5
    log: results/logs/rungs/vit-debug/ddp-compile/fp32/pre-lag/n1/b4.log (check log file(s) for error details)
Exiting because a job execution failed. Look above for error messages
"""


def test_failed_jobs_are_the_error_blocks_with_their_logs() -> None:
    assert failures.failed_jobs(SNAKEMAKE_LOG.splitlines(True)) == [
        ("shard", ["results/logs/shard/32px.log"]),
        ("rung", ["results/logs/rungs/vit-debug/ddp-compile/fp32/pre-lag/n1/b4.log"]),
    ]


def test_the_cause_is_our_error_line_else_the_traceback_end() -> None:
    ours = "progress 1\nscaleladder shard: error: /x: no images found (looked for .jpg)\nTraceback...\n"
    assert failures.cause(ours) == "scaleladder shard: error: /x: no images found (looked for .jpg)"
    tb = ("[rank0] step 1\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
          "torch._inductor.exc.InductorError: CppCompileError: inductor needs a C++ compiler\n\n")
    assert failures.cause(tb) == "torch._inductor.exc.InductorError: CppCompileError: inductor needs a C++ compiler"
    rung = ("[rank1]: scaleladder run: error: InductorError: CppCompileError: C++ compile error (SCALELADDER_DEBUG=1 for a traceback)\n"
            "scaleladder: vit-debug/ddp-compile/fp32/pre-lag/n1/b4: the run failed with exit code 1; no result written\n")
    assert failures.cause(rung).startswith("[rank1]: scaleladder run: error: InductorError: CppCompileError")
    assert failures.cause("a\nlast words\n") == "last words"
    assert failures.cause("") == ""


def test_explain_prints_the_cause_under_the_rule_and_copies_the_log_in_a_container(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results/logs/shard").mkdir(parents=True)
    (tmp_path / "results/logs/shard/32px.log").write_text("scaleladder shard: error: /e: no images found (looked for .jpg)\n")
    (tmp_path / "sm.log").write_text(SNAKEMAKE_LOG)
    out = io.StringIO()
    copies = failures.explain([str(tmp_path / "sm.log")], out, container=True)
    text = out.getvalue()
    assert "  rule shard:\n    scaleladder shard: error: /e: no images found" in text
    assert "'message: None' above only says" in text
    assert "rule rung:" in text and "cannot be read" in text  # its log is absent: said, not raised
    assert copies == [Path("results/logs/snakemake/sm.log")] and (tmp_path / copies[0]).read_text() == SNAKEMAKE_LOG
    assert failures.complete_log_line(copies).startswith("Complete log(s): results/logs/snakemake/sm.log (in the results/ folder mounted")
    assert failures.explain([str(tmp_path / "sm.log")], io.StringIO(), container=False) == []


def test_in_container_follows_the_flag_first(monkeypatch) -> None:
    monkeypatch.setenv("SCALELADDER_IN_CONTAINER", "1")
    assert failures.in_container()
    monkeypatch.setenv("SCALELADDER_IN_CONTAINER", "0")
    assert not failures.in_container()
