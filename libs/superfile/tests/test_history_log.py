"""The history off the commit path: a bounded tail per manifest list, segments and checkpoints behind it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
import superfile
from superfile.cli import main
from superfile.errors import UpgradeRequiredError
from superfile.io import from_uri
from superfile.manifest import log
from table_worker import append_until_killed

SCHEMA = pa.schema([("id", pa.int64())])


def _head(storage_uri: str, name: str) -> tuple[dict, int]:
    storage = from_uri(storage_uri).child(name)
    pointer = json.loads(storage.read("_pointer.json"))
    raw = storage.read(pointer["manifest"])
    return json.loads(raw), len(raw)


def test_five_thousand_versions_answer_as_a_short_history() -> None:
    uri = "memory://five-thousand-versions"  # the same store as file:// (tests/test_io.py), 3x faster to fill
    t = superfile.connect(uri).create_table("t", SCHEMA)
    sizes = {}
    for i in range(5_000):
        t.append({"id": [i]}, idempotency_key=f"k{i}" if i % 100 == 0 else None)
        if t.version in (101, 5_001):
            sizes[t.version] = _head(uri, "t")[1]
    head, _ = _head(uri, "t")
    assert len(head["history_tail"]) <= log.TAIL and head["format_version"] == 2
    assert sizes[5_001] < sizes[101] * 1.5, sizes  # the list stays small: the history is not in it

    t = superfile.connect(uri).open_table("t")  # a fresh process's view
    versions = t.versions()
    assert [v["version"] for v in versions] == list(range(1, 5_002))
    assert versions[0]["operation"] == "create" and {v["operation"] for v in versions[1:]} == {"append"}
    assert [v["row_count"] for v in versions[:3]] == [0, 1, 2]
    for version in (1, 2, 64, 65, 1_025, 2_500, 4_999, 5_001):
        assert t.checkout(version).count_rows() == version - 1
    stamps = [v["timestamp_ms"] for v in versions]
    for version in (3, 1_500, 4_000):
        as_of = stamps[version - 1]
        expected = max(v["version"] for v in versions if v["timestamp_ms"] <= as_of)
        assert t.checkout(as_of=as_of).version == expected
    changes = t.changes(100, 105)
    assert changes.column("_change").to_pylist() == ["insert"] * 5
    assert sorted(t.checkout(105).to_arrow().column("id").to_pylist())[-5:] == [99, 100, 101, 102, 103]
    assert t.append({"id": [0]}, idempotency_key="k0") == 2  # the oldest key still answers
    assert t.count_rows() == 5_000
    restored = t.restore(3_000)
    assert restored == 5_002 and t.count_rows() == 2_999
    assert t.versions()[-1]["operation"] == "restore"


def test_cleanup_trims_the_history_and_its_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log, "TAIL", 4)
    monkeypatch.setattr(log, "CHECKPOINT_EVERY", 3)
    uri = f"file://{tmp_path}"
    t = superfile.connect(uri).create_table("t", SCHEMA)
    for i in range(40):
        t.append({"id": [i]})
    storage = from_uri(uri).child("t")
    assert [v["version"] for v in t.versions()] == list(range(1, 42))
    segments_before = [i.path for i in storage.list(log.SEGMENTS)]
    assert len(segments_before) >= 9
    result = t.cleanup(0, safety_margin=0)
    assert result["removed"]["history_segments"] >= 1
    assert [v["version"] for v in t.versions()] == [41]
    for i in range(40, 60):  # past the next checkpoint: it leaves out what cleanup expired
        t.append({"id": [i]})
    head, _ = _head(uri, "t")
    chain, segment = [], head["history_segment"]
    while segment is not None:
        body = json.loads(storage.read(segment))
        chain.append([e[0] for e in body["entries"]])
        segment = body["previous"]
    assert len(chain) <= log.CHECKPOINT_EVERY
    assert min(min(c) for c in chain) >= 41  # the checkpoint holds no expired version
    assert [v["version"] for v in t.versions()] == list(range(41, 62))
    t.cleanup(0, safety_margin=0)
    assert {i.path for i in storage.list(log.SEGMENTS)} == set(_chain(storage, head["history_segment"]))


def _chain(storage: object, segment: str | None) -> list[str]:
    out = []
    while segment is not None:
        out.append(segment)
        segment = json.loads(storage.read(segment))["previous"]  # type: ignore[attr-defined]
    return out


def test_sigkill_while_writing_segments_and_checkpoints_reopens_at_a_commit(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    superfile.connect(uri).create_table(
        "t", pa.schema([("worker", pa.int32()), ("seq", pa.int32()), ("text", pa.string())])
    )
    rng = random.Random(11)
    acked: set[tuple[int, int]] = set()
    for trial in range(20):
        seqs = append_until_killed("append-short-history", uri, "t", trial, 3, rng.uniform(0, 0.3))
        acked |= {(trial, seq) for seq in seqs}
        t = superfile.connect(uri).open_table("t")
        rows = t.to_arrow()
        seen = set(zip(rows.column("worker").to_pylist(), rows.column("seq").to_pylist(), strict=True))
        assert acked <= seen and rows.num_rows == 3 * len(seen)
        versions = t.versions()
        assert [v["version"] for v in versions] == list(range(1, t.version + 1))
        assert versions[-1]["row_count"] == rows.num_rows


def test_the_old_format_is_refused_with_the_upgrade_hint_and_upgraded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"file://{tmp_path}"
    db = superfile.connect(uri)
    t = db.create_table("t", SCHEMA)
    for i in range(70):  # more than a tail: the upgrade writes the history to a checkpoint
        t.append({"id": [i]})
    history = [[v["version"], None, v["timestamp_ms"], v["operation"], 0, 0, v["row_count"]] for v in t.versions()]
    storage = from_uri(uri).child("t")
    head, _ = _head(uri, "t")
    for v in history:
        v[1] = next(m for m in _manifest_paths(storage) if m.startswith(f"_manifests/{v[0]:020d}-"))
    old = {k: val for k, val in head.items() if not k.startswith("history_")} | {"format_version": 1}
    old["history"] = history
    pointer = json.loads(storage.read("_pointer.json"))
    storage.write(pointer["manifest"], json.dumps(old).encode())  # as superfile wrote format 1

    with pytest.raises(UpgradeRequiredError, match=f"superfile upgrade {uri} t"):
        superfile.connect(uri).open_table("t")
    assert main(["upgrade", uri, "t", "--format", "json"]) == 0  # the command the error names
    assert json.loads(capsys.readouterr().out) == {"table": "t", "version": 72}
    assert superfile.connect(uri).upgrade_table("t") == 72  # already current: nothing to do
    t = superfile.connect(uri).open_table("t")
    assert t.count_rows() == 70 and [v["version"] for v in t.versions()] == list(range(1, 73))
    assert t.versions()[-1]["operation"] == "upgrade" and t.checkout(10).count_rows() == 9
    assert _head(uri, "t")[0]["history_segment"] is not None  # the 71 old entries went to a checkpoint


def _manifest_paths(storage: object) -> list[str]:
    return [i.path for i in storage.list("_manifests/") if "/parts/" not in i.path]  # type: ignore[attr-defined]
