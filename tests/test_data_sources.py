"""`scaleladder shard` sources: class-name labels, --samples with --skip-bad, empty input tars."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import webdataset as wds

from scaleladder.data import synthetic
from scaleladder.data.labels import Labels
from scaleladder.data.manifest import read_manifest
from scaleladder.data.shard_command import main as shard
from test_data_shard import _fails, _photo_folder, _read_samples


def _csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows])  # quoted: captions hold commas
    return path


def _by_source(out: Path) -> dict[str, dict]:
    return {json.loads(s["json"])["source"]: s for s in _read_samples(out)}


def test_labels_are_integers_or_sorted_class_names() -> None:
    ints = Labels(["3", 0, " 7 ", None, ""])
    assert ints.classes is None and ints("3") == 3 and ints(7) == 7 and ints("") is None
    with pytest.raises(ValueError, match="negative"):
        ints("-1")
    names = Labels(["dog", "cat", "3", "cat", None])  # one name makes every label a name
    assert names.classes == ["3", "cat", "dog"]
    assert [names(x) for x in ("3", "cat", "dog", None)] == [0, 1, 2, None]
    with pytest.raises(ValueError, match="neither an integer nor a class name"):
        names([1])


def test_csv_class_names_become_sorted_ids(tmp_path: Path) -> None:
    rows = _photo_folder(tmp_path / "photos", 6)
    names = ["zebra", "cat", "dog", "cat", "zebra", "ant"]
    table = _csv(tmp_path / "caps.csv", ["path", "caption", "label"], [[f, c, n] for (f, c, _l), n in zip(rows, names)])
    out = tmp_path / "s"
    assert shard(["--images", str(tmp_path / "photos"), "--captions", str(table), "--out", str(out), "--quiet"]) == 0
    m = read_manifest(out)
    assert m.info["classes"] == ["ant", "cat", "dog", "zebra"]
    assert m.info["stats"]["num_classes"] == 4 and m.labelled
    samples = _by_source(out)
    for (file, _c, _l), name in zip(rows, names):
        assert m.info["classes"][int(samples[file]["cls"])] == name


def test_jsonl_and_webdataset_json_class_names(tmp_path: Path) -> None:
    rows = _photo_folder(tmp_path / "photos", 4)
    table = tmp_path / "photos" / "caps.jsonl"
    table.write_text("".join(json.dumps({"path": f, "caption": c, "label": n}) + "\n" for (f, c, _l), n in zip(rows, "baba")))
    assert shard(["--captions", str(table), "--out", str(tmp_path / "j"), "--quiet"]) == 0
    assert read_manifest(tmp_path / "j").info["classes"] == ["a", "b"]
    src = tmp_path / "in.tar"
    with wds.TarWriter(str(src)) as w:
        for i, name in enumerate(["rose", "tulip", "rose"]):
            s = synthetic.make_sample(0, i, 16)
            w.write({"__key__": f"k{i}", "jpg": s.jpeg, "txt": s.caption, "json": {"label": name}})
    assert shard(["--wds", str(src), "--out", str(tmp_path / "w"), "--quiet"]) == 0
    m = read_manifest(tmp_path / "w")
    assert m.info["classes"] == ["rose", "tulip"]
    assert [int(s["cls"]) for s in _read_samples(tmp_path / "w")] == [0, 1, 0]


def test_integer_labels_stay_integers(tmp_path: Path) -> None:
    rows = _photo_folder(tmp_path / "photos", 3)
    table = _csv(tmp_path / "caps.csv", ["path", "caption", "label"], [list(r) for r in rows])
    assert shard(["--images", str(tmp_path / "photos"), "--captions", str(table), "--out", str(tmp_path / "s"), "--quiet"]) == 0
    m = read_manifest(tmp_path / "s")
    assert m.info["classes"] is None
    samples = _by_source(tmp_path / "s")
    assert all(int(samples[f]["cls"]) == lab for f, _c, lab in rows)


def _break_images(photos: Path, rows: list[tuple[str, str, int]], every: int) -> int:
    bad = 0
    for i, (file, _c, _l) in enumerate(rows):
        if i % every == 0:
            (photos / file).write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
            bad += 1
    return bad


def test_samples_counts_good_samples_with_skip_bad(tmp_path: Path) -> None:
    # Half the images are corrupt: --samples 5 must still give 5 (the good ones), not
    # 5 candidates minus the bad among them.
    photos = tmp_path / "photos"
    rows = _photo_folder(photos, 10)
    assert _break_images(photos, rows, every=2) == 5
    assert shard(["--images", str(photos), "--out", str(tmp_path / "f"), "--samples", "5", "--skip-bad", "--quiet"]) == 0
    assert read_manifest(tmp_path / "f").samples == 5
    table = _csv(tmp_path / "caps.csv", ["path", "caption"], [[f, c] for f, c, _l in rows])
    out = tmp_path / "t"
    assert shard(["--images", str(photos), "--captions", str(table), "--out", str(out), "--samples", "4", "--skip-bad", "--quiet"]) == 0
    m = read_manifest(out)
    assert m.samples == 4 and m.info["skipped"]["by_reason"]["corrupt_image"] >= 1
    # Asking for more than there are good ones writes them all.
    assert shard(["--images", str(photos), "--out", str(tmp_path / "all"), "--samples", "9", "--skip-bad", "--quiet"]) == 0
    assert read_manifest(tmp_path / "all").samples == 5


def test_empty_input_tar_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.tar"
    with wds.TarWriter(str(empty)):
        pass
    _fails(capsys, ["--wds", str(empty), "--out", str(tmp_path / "s")], "empty.tar: tar holds no samples")
    _fails(capsys, ["--wds", str(empty), "--out", str(tmp_path / "s"), "--skip-bad"],
           "no samples to write (1 skipped as bad; first:", "empty.tar: tar holds no samples")
    full = tmp_path / "full.tar"
    with wds.TarWriter(str(full)) as w:
        s = synthetic.make_sample(0, 0, 16)
        w.write({"__key__": "k0", "jpg": s.jpeg, "txt": s.caption})
    assert shard(["--wds", str(empty), str(full), "--out", str(tmp_path / "s"), "--skip-bad", "--quiet"]) == 0
    m = read_manifest(tmp_path / "s")
    assert m.samples == 1 and m.info["skipped"]["by_reason"] == {"empty_tar": 1}
