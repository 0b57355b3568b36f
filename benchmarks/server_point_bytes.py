"""The bytes one stored metric point takes on disk: what ``blobs.POINT_BYTES`` charges to the quota.

Stores 2 metrics x 400,000 points (names ``loss`` and ``lr``, type ``train``, epoch and time set)
through the server's ingest in batches of 10,000 lines, and divides the growth of the points'
and block summaries' storage by the points: the SQLite file's pages, or PostgreSQL's
``pg_total_relation_size`` of both tables (indexes included) after ``VACUUM``.

    .venv/bin/python benchmarks/server_point_bytes.py
    .venv/bin/python benchmarks/server_point_bytes.py --db postgresql+psycopg://ember@127.0.0.1:55432/bench
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from sqlalchemy import Engine, select, text

from ember.server.services import admin, ingest
from ember.server.storage.db import make_engine, session_factory
from ember.server.storage.models import Folder, Run, now
from ember.server.storage.schemas import MetricBatch
from ember.server.storage.settings import Settings

RUN = "ab" * 16


def stored_bytes(engine: Engine) -> int:
    """The bytes of the metric tables (SQLite: the whole file, which holds little else here)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            return int(pages) * int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE metric_points")
        conn.exec_driver_sql("VACUUM ANALYZE metric_blocks")
        query = "SELECT pg_total_relation_size('metric_points') + pg_total_relation_size('metric_blocks')"
        return int(conn.execute(text(query)).scalar_one())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="an empty database's URL (default: SQLite in a temporary folder)")
    parser.add_argument("--points", type=int, default=400_000, help="points per metric (default 400000)")
    args = parser.parse_args()
    settings = Settings.make(data_dir=Path(tempfile.mkdtemp()), db_url=args.db)
    admin.init(settings, "alice")
    engine = make_engine(settings.db_url)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        folder = session.scalars(select(Folder)).first()
        assert folder is not None
        run = Run(id=RUN, folder_id=folder.id, owner_id=folder.owner_id, name="r", status="Running", labels=[])
        run.description, run.hparams, run.meta, run.platform, run.uploaded = "", {}, {}, {}, now()
        session.add(run)
        session.flush()
        run_pk = run.pk
    before, per = stored_bytes(engine), 10_000
    for at in range(0, args.points, per):
        steps = list(range(at, at + per))
        batch = MetricBatch(
            type="train",
            start=at,
            end=at + per,
            step=steps,
            epoch=[1.0] * per,
            time=[1.7e9 + s for s in steps],
            metrics={"loss": [0.5 + s * 1e-7 for s in steps], "lr": [1e-3] * per},
        )
        with sessions() as session, session.begin():
            ingest.store_metrics(session, run_pk, RUN, batch, max_points=2 * per)
    grown = stored_bytes(engine) - before
    print(f"{engine.dialect.name}: {grown / (2 * args.points):.1f} bytes per stored point")
    engine.dispose()


if __name__ == "__main__":
    main()
