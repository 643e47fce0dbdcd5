"""Files outside the partitions' own folders are found by a walk that skips past the partitions' files by name."""

from __future__ import annotations

import shutil
from pathlib import Path

from otel_replay.storage.manifest import _loose_files, looks_like_partition


def _by_paths(root: Path) -> tuple[list[str], list[str]]:
    """The reference: every ``*.parquet`` path under ``root`` as a path object, judged by its parents."""
    loose, nested = [], []
    for path in root.rglob("*.parquet"):
        if path.name.startswith(".") or not path.is_file():
            continue
        if not looks_like_partition(path.parent.name):
            loose.append(str(path))
        elif path.parent.parent != root:
            nested.append(str(path))
    return sorted(loose), sorted(nested)


def test_loose_and_nested_files_are_those_a_walk_of_every_path_finds(tmp_path: Path) -> None:
    root = tmp_path / "spans"
    day = root / "date=2026-01-01"
    day.mkdir(parents=True)
    for i in range(50):
        (day / f"part-{i}.parquet").write_bytes(b"x")  # a partition's own files: never loose
    places = [
        root / "hand.parquet",
        root / "other" / "a.parquet",
        root / "other" / "date=2026-02-02" / "b.parquet",  # a date folder inside another folder: nested
        day / "date=2026-01-01" / "c.parquet",  # a date folder inside a partition: nested
        day / "sub" / "d.parquet",  # a plain folder inside a partition: loose
        root / "date=2026-13-99" / "e.parquet",  # looks like a partition (not a real date): judged as one
        root / "other" / ".hidden.parquet",
        root / "other" / "notes.txt",
        root / "ünïcode dir" / "f g.parquet",
    ]
    for place in places:
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_bytes(b"x")
    loose, nested = _loose_files(root)
    assert (sorted(loose), sorted(nested)) == _by_paths(root)
    assert str(root / "hand.parquet") in loose and str(day / "sub" / "d.parquet") in loose
    assert sorted(nested) == sorted(str(p) for p in places[2:4])
    shutil.rmtree(day)  # a partition gone (retention) between two listings: nothing raised
    loose, nested = _loose_files(root)
    assert (sorted(loose), sorted(nested)) == _by_paths(root)
