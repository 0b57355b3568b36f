"""The installed packages a run records: every distribution on sys.path, with its version."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from ember.track import environment


def _dist(folder: Path, dirname: str, name: str, version: str, meta_file: str = "METADATA") -> None:
    (folder / dirname).mkdir(parents=True)
    (folder / dirname / meta_file).write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_the_package_list_is_what_importlib_metadata_finds_first_on_sys_path() -> None:
    expected: dict[str, str] = {}
    for dist in metadata.distributions():  # in sys.path order, like imports
        expected.setdefault(environment._normalized(dist.metadata["Name"]), dist.version)
    found = environment._packages()
    assert found == expected
    assert list(found) == sorted(found)
    assert {"torch", "numpy", "ember"} <= set(found)


def test_names_and_versions_come_from_the_folder_name_or_else_from_the_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _dist(first, "Foo_Bar-1.2.3.dist-info", "Foo-Bar", "1.2.3")
    _dist(first, "torch_stub-2.0.0+cpu.dist-info", "torch-stub", "2.0.0+cpu")
    _dist(first, "dashed-1.0_1.dist-info", "dashed", "1.0-1")  # '_' may be an escaped '-': read it
    _dist(first, "develop.egg-info", "Develop", "0.3", meta_file="PKG-INFO")  # no version in the name
    _dist(first, "legacy-4.5-py3.11.egg-info", "legacy", "4.5", meta_file="PKG-INFO")
    _dist(second, "foo_bar-9.9.dist-info", "foo_bar", "9.9")  # shadowed by the first on sys.path
    (first / "not_a_dist").mkdir()
    (first / "leftover-1.0_1.dist-info").mkdir()  # no metadata: skipped
    (first / "flat-0.9-py3.11.egg-info").write_text("Metadata-Version: 1.0\nName: flat\nVersion: 0.9\n")
    (first / "flatfile.egg-info").write_text("Metadata-Version: 1.0\nName: FlatFile\nVersion: 2\n")
    monkeypatch.setattr(sys, "path", [str(first), str(tmp_path / "missing"), str(second)])
    assert environment._packages() == {
        "dashed": "1.0-1",
        "develop": "0.3",
        "flat": "0.9",
        "flatfile": "2",
        "foo-bar": "1.2.3",
        "legacy": "4.5",
        "torch-stub": "2.0.0+cpu",
    }


def test_create_run_records_the_package_list_in_platform_json() -> None:
    from ember import track

    run = track.create_run(name="packages")
    run.finish()
    packages = run.platform["platform"]["packages"]
    assert packages == environment._packages()
