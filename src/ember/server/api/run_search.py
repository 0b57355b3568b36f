"""The runs table's query string, read once for the API's ``GET /search/runs`` and the console's runs page.

Both list the runs a caller may view a page at a time (:func:`ember.server.services.listing.list_runs`),
with the same parameters; each adds how its filters are written (the API: ``filter`` and repeated
``where``; the page: one ``where`` field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query
from sqlalchemy.orm import Session

from ember.server.services import listing, naming
from ember.server.storage.models import User


@dataclass(frozen=True)
class RunSearch:
    """A runs table's folder, name part, label, status, sort and page (see :func:`run_search`)."""

    folder: str
    q: str
    label: str
    status: str
    sort: str
    page: int
    per_page: int

    def path(self, user: User) -> str | None:
        """The folder as an absolute path (a relative one is under the caller's home), or None for all."""
        return naming.folder_path(self.folder, home=f"/{user.name}") if self.folder else None

    def runs(self, session: Session, user: User, filters: list[str]) -> listing.RunPage:
        """The page of runs the caller may view that pass ``filters`` (each in the filter language)."""
        return listing.list_runs(
            session,
            user,
            folder=self.path(user),
            q=self.q,
            label=self.label,
            status=self.status,
            filters=filters,
            sort=self.sort,
            page=self.page,
            per_page=self.per_page,
        )


_SORT = "name|status|start|duration|folder|hp:K|m:T/N (last value), m:T/N.best|.min|.max; -K descending"


def run_search(
    folder: Annotated[str, Query(max_length=1024, description="only under this folder")] = "",
    q: Annotated[str, Query(max_length=200, description="part of the name")] = "",
    label: Annotated[str, Query(max_length=200)] = "",
    status: Annotated[str, Query(max_length=16)] = "",
    sort: Annotated[str, Query(max_length=300, description=_SORT)] = "-start",
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    per_page: Annotated[int, Query(ge=1, le=500)] = 50,
) -> RunSearch:
    """The query parameters of a runs table (a FastAPI dependency: :data:`RunSearchQuery`)."""
    return RunSearch(folder, q, label, status, sort, page, per_page)


RunSearchQuery = Annotated[RunSearch, Depends(run_search)]
"""An endpoint parameter: the runs table's query string."""
