"""aggregate: rung files -> results/ladder.h5 with Group.copy, provenance, idempotence."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import write_rung
from scaleladder.cli import main as cli
from scaleladder.results.aggregate import aggregate, read_ladder
from scaleladder.spec import SpecError


def _contents(path: Path) -> dict[str, object]:
    """Everything in a ladder file except the time it was built."""
    out: dict[str, object] = {}
    with h5py.File(path, "r") as f:
        out["/"] = {k: v for k, v in f.attrs.items() if k != "created_utc"}

        def visit(name: str, obj: object) -> None:
            if name == "index":  # every rung's attributes in one JSON text: each rung's entry apart
                out.update({f"index:{spec}": entry for spec, entry in json.loads(obj[()]).items()})  # type: ignore[index]
            elif isinstance(obj, h5py.Dataset):
                out[name] = obj[()].tolist()
            else:
                out[name] = dict(obj.attrs)  # type: ignore[attr-defined]

        f.visititems(visit)
    return json.loads(json.dumps(out, default=str))


def test_copies_every_rung_whole_with_provenance(tmp_path: Path) -> None:
    a = write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b8", items_per_s=123.0)
    b = write_rung(tmp_path, "vit-debug/fsdp-full/fp32/pre-lag/n1/b8", status="oom")
    out = tmp_path / "results" / "ladder.h5"
    counts = aggregate([str(a), str(b)], str(out), {"site": "test"})
    assert counts == {"ok": 1, "oom": 1}
    with h5py.File(out, "r") as f:
        g = f["rungs/vit-debug/ddp/fp32/pre-lag/n1/b8"]
        assert g.attrs["items_per_s"] == 123.0 and g.attrs["status"] == "ok"
        assert g["step_time_s"].shape == (6,) and "memory/peak_reserved_bytes" in g  # datasets came along
        assert len(g.attrs["source_sha256"]) == 64
        assert f["rungs/vit-debug/fsdp-full/fp32/pre-lag/n1/b8"].attrs["status"] == "oom"
        assert json.loads(f.attrs["provenance"]) == {"site": "test"}
        assert f.attrs["n_rungs"] == 2
        assert {s["spec"] for s in json.loads(f.attrs["sources"])} == {
            "vit-debug/ddp/fp32/pre-lag/n1/b8", "vit-debug/fsdp-full/fp32/pre-lag/n1/b8"}
    rungs, root = read_ladder(str(out))
    assert {r["status"] for r in rungs} == {"ok", "oom"}
    assert json.loads(root["status_counts"]) == {"ok": 1, "oom": 1}


def test_idempotent_and_a_rerun_rung_replaces_only_itself(tmp_path: Path) -> None:
    files = [write_rung(tmp_path, f"vit-debug/ddp/fp32/pre-lag/n1/b{b}", items_per_s=float(b)) for b in (2, 4, 8)]
    out = tmp_path / "ladder.h5"
    aggregate([str(f) for f in files], str(out))
    first = _contents(out)
    aggregate([str(f) for f in files], str(out))  # same inputs: same file
    assert _contents(out) == first
    write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b4", items_per_s=999.0)  # that rung is rerun
    aggregate([str(f) for f in reversed(files)], str(out))  # input order does not matter
    after = _contents(out)
    changed = {k for k in first if first[k] != after.get(k)}
    assert all("b4" in k or k == "/" for k in changed), changed
    assert after["rungs/vit-debug/ddp/fp32/pre-lag/n1/b4"]["items_per_s"] == 999.0  # type: ignore[index]
    assert not list(tmp_path.glob("*.tmp"))


def test_bad_inputs_fail_loudly(tmp_path: Path) -> None:
    stray = tmp_path / "stray.h5"
    h5py.File(stray, "w").close()
    with pytest.raises(SpecError):  # a file whose path names no run spec
        aggregate([str(stray)], str(tmp_path / "ladder.h5"))
    a = write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b8")
    other = tmp_path / "elsewhere" / "vit-debug/ddp/fp32/pre-lag/n1/b8.h5"
    other.parent.mkdir(parents=True)
    other.write_bytes(a.read_bytes())
    with pytest.raises(SpecError, match="same spec"):
        aggregate([str(a), str(other)], str(tmp_path / "ladder.h5"))
    assert not (tmp_path / "ladder.h5").exists()  # nothing half-written


def test_cli_with_dir_and_provenance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_rung(tmp_path, "flava-debug/ddp/fp32/pre-lag/n1/bmax", max_batch=12, batch="12")
    out = tmp_path / "ladder.h5"
    rc = cli(["aggregate", "--out", str(out), "--dir", str(tmp_path / "results" / "rungs"), "--provenance", '{"a": 1}'])
    assert rc == 0 and "1 rungs" in capsys.readouterr().out
    (r,), _ = read_ladder(str(out))
    assert r["spec"] == "flava-debug/ddp/fp32/pre-lag/n1/bmax"
    assert r["spec_batch"] == "max" and r["batch"] == "12"  # declared max, settled on 12
    assert cli(["aggregate", "--out", str(out), "--provenance", "not json", str(tmp_path)]) == 2
    assert cli(["aggregate", "--out", str(out)]) == 2
    assert np.isclose(r["items_per_s"], 100.0) and os.path.exists(out)


def _mixed_ladder(root: Path) -> list[str]:
    """ok rungs (one with two repeats, one without an interval yet), an OOM, a corrupt file, and
    names that sort differently as text and as a tree (vit-base/... beside vit-base-... would)."""
    files = [write_rung(root, f"vit-debug/ddp/fp32/pre-lag/n1/b{b}", items_per_s=float(b)) for b in (2, 4, 8)]
    files.append(write_rung(root, "vit-debug-wide/ddp/fp32/pre-lag/n1/b4", items_per_s=5.0))
    files.append(write_rung(root, "vit-debug/fsdp-full/fp32/pre-lag/n1/b4", status="oom"))
    bad = write_rung(root, "vit-debug/fsdp-full/fp32/pre-lag/n1/b8")
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    files.append(bad)
    rep = Path(str(files[0]).replace(".h5", ".r1.h5"))
    rep.write_bytes(files[0].read_bytes())
    files.append(rep)
    return [str(f) for f in files]


def test_the_index_holds_what_the_groups_hold(tmp_path: Path) -> None:
    files = _mixed_ladder(tmp_path)
    out = tmp_path / "ladder.h5"
    aggregate(files, str(out))
    indexed, root = read_ladder(str(out))
    walked, _ = read_ladder(str(out), walk=True)
    assert [r["spec"] for r in indexed] == [r["spec"] for r in walked]
    assert json.dumps(indexed, default=str, sort_keys=True) == json.dumps(walked, default=str, sort_keys=True)  # NaN equal as text
    statuses = {r["status"] for r in indexed}
    assert statuses == {"ok", "oom", "corrupt"} and any(r.get("repeats") == 2 for r in indexed)


@pytest.mark.process
def test_a_pool_of_readers_gives_the_same_ladder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scaleladder.results.aggregate as agg

    files = _mixed_ladder(tmp_path)
    out = tmp_path / "ladder.h5"
    aggregate(files, str(out))
    indexed, _ = read_ladder(str(out))
    monkeypatch.setattr(agg, "POOL_FROM", 2)  # from 2 files on: the fork pool's path
    pooled = tmp_path / "pooled.h5"
    aggregate(files, str(pooled))
    assert json.dumps(read_ladder(str(pooled))[0], default=str, sort_keys=True) == json.dumps(indexed, default=str, sort_keys=True)
