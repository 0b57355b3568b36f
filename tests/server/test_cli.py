"""``ember server`` administration from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from ember.server.cli import main as server_main


@pytest.mark.parametrize("where", ["before", "after"])
def test_db_and_data_reach_init_before_or_after_the_subcommand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    monkeypatch.chdir(tmp_path)  # the default ./.ember-server must stay untouched
    monkeypatch.delenv("EMBER_SERVER_DB", raising=False)
    monkeypatch.delenv("EMBER_SERVER_DATA", raising=False)
    url = f"sqlite:///{tmp_path / 'chosen.db'}"
    options = ["--db", url, "--data", str(tmp_path / "blobs")]
    argv = ["server", *options, "init", "--admin", "root"]
    if where == "after":
        argv = ["server", "init", "--admin", "root", *options]
    assert server_main(argv) == 0
    assert "ember_" in capsys.readouterr().out
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM users")).scalars().all() == ["root"]
    engine.dispose()
    assert not (tmp_path / ".ember-server").exists()
    assert server_main(["server", *options, "user", "add", "bob"]) == 0
    assert server_main(["server", *options, "key", "create", "bob"]) == 0
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_keys")).scalar_one() == 3
    engine.dispose()
    assert not (tmp_path / ".ember-server").exists()
