"""Images through the upload protocol: every PNG stored once, an upload cut off completes, bad PNGs refused."""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from ember import track
from ember.track import images as images_mod
from ember.track.client import Client, Credentials, UploadError, upload_run
from ember.track.retry import Retry
from tests.server.conftest import Server, make_server

FAST = Retry(deadline_s=0.3, base_s=0.01, max_backoff_s=0.05)


def _run_with_images(store: Path, count: int = 3) -> Any:
    run = track.create_run(name="gan", home=store)
    run.log("train", {"loss": 1.0}, step=0)
    for step in range(count):
        run.log_image("samples/fake", np.full((4, 5, 3), step * 40, np.uint8), step=step * 10)
    run.log_image("real", np.zeros((2, 3), np.uint8), step=0)
    run.finish()
    return run


def test_images_upload_whole_and_uploading_twice_adds_nothing(server: Server, tmp_path: Path) -> None:
    run = _run_with_images(tmp_path / "store")
    client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client, retry=FAST)
    first = upload_run(run.path, folder="gan", make_folder=True, client=client)
    listed = server.req("GET", f"/runs/{run.id}/images").json()["images"]
    assert [(i["name"], i["step"], i["width"], i["height"]) for i in listed] == [
        ("real", 0, 3, 2),
        ("samples/fake", 0, 5, 4),
        ("samples/fake", 10, 5, 4),
        ("samples/fake", 20, 5, 4),
    ]
    for line in run.images():
        got = server.req("GET", f"/runs/{run.id}/images/{line['step']}/{line['name']}")
        assert got.status_code == 200 and got.headers["content-type"] == "image/png"
        assert got.headers["x-content-type-options"] == "nosniff"
        assert got.content == (run.path / line["file"]).read_bytes()
    assert first["cursors"]["images.jsonl"] == (run.path / "images.jsonl").stat().st_size
    upload_run(run.path, folder="gan", client=client)
    assert len(server.req("GET", f"/runs/{run.id}/images").json()["images"]) == 4


def test_an_upload_cut_after_the_server_stored_a_batch_completes_with_each_image_once(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images_mod, "BATCH_PNG_BYTES", 1)  # one image a request
    run = _run_with_images(tmp_path / "store")

    class LosesSecondAnswer(Client):
        posts = 0

        def call(self, method: str, path: str, **kwargs: Any) -> Any:
            answer = super().call(method, path, **kwargs)
            if path.endswith("/images"):
                LosesSecondAnswer.posts += 1
                if LosesSecondAnswer.posts == 2:
                    raise ConnectionError("the answer was lost")
            return answer

    cut = LosesSecondAnswer(Credentials("http://testserver", server.keys["alice"]), http=server.client, retry=FAST)
    with pytest.raises(ConnectionError):
        upload_run(run.path, folder="gan", make_folder=True, client=cut)
    assert len(server.req("GET", f"/runs/{run.id}/images").json()["images"]) == 2
    client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client, retry=FAST)
    upload_run(run.path, folder="gan", client=client)
    assert len(server.req("GET", f"/runs/{run.id}/images").json()["images"]) == 4
    # the same range again (a retry whose answer was lost) changes nothing; a gap is a 409
    body = {"start": 0, "end": 10, "images": []}
    assert server.req("POST", f"/runs/{run.id}/images", json=body).status_code == 200
    size = (run.path / "images.jsonl").stat().st_size
    gap = {"start": size + 5, "end": size + 10, "images": []}
    assert server.req("POST", f"/runs/{run.id}/images", json=gap).status_code == 409


@pytest.mark.parametrize(
    ("png", "code"),
    [
        (base64.b64encode(b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>").decode(), 422),
        ("not base64!", 422),
    ],
)
def test_only_png_is_accepted(server: Server, tmp_path: Path, png: str, code: int) -> None:
    run = _run_with_images(tmp_path / "store", count=0)
    client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client, retry=FAST)
    upload_run(run.path, folder="gan", make_folder=True, client=client)
    size = (run.path / "images.jsonl").stat().st_size
    body = {"start": size, "end": size + 10, "images": [{"name": "x", "step": 1, "time": 1.0, "png": png}]}
    assert server.req("POST", f"/runs/{run.id}/images", json=body).status_code == code
    assert server.req("GET", f"/runs/{run.id}/images/1/x").status_code == 404


def test_another_user_sees_no_image_of_a_private_run(server: Server, tmp_path: Path) -> None:
    run = _run_with_images(tmp_path / "store", count=1)
    client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client, retry=FAST)
    upload_run(run.path, folder="gan", make_folder=True, client=client)
    assert server.req("GET", f"/runs/{run.id}/images", user="bob").status_code == 404
    assert server.req("GET", f"/runs/{run.id}/images/0/real", user="bob").status_code == 404
    assert (
        server.req("POST", f"/runs/{run.id}/images", user="bob", json={"start": 0, "end": 0, "images": []}).status_code
        == 404
    )


def test_ember_ui_in_process_upload_stores_the_images_an_http_upload_stores(server: Server, tmp_path: Path) -> None:
    """The server's receiver in process (ember ui's later index passes) stores what the route stores."""
    from sqlalchemy import select

    from ember.server.services.upload import Uploads
    from ember.server.storage.models import User

    run = _run_with_images(tmp_path / "store", count=2)
    app = server.client.app
    with app.state.sessions() as session, session.begin():
        user = session.scalar(select(User).where(User.name == "alice"))
        assert user is not None
        uploads = Uploads(session, user, app.state.settings, in_process=True, own_store=True)
        upload_run(run.path, "direct", True, "new", uploads, artifacts=False)
        upload_run(run.path, "direct", True, "new", uploads, artifacts=False)
    listed = server.req("GET", f"/runs/{run.id}/images").json()["images"]
    assert [(i["name"], i["step"]) for i in listed] == [("real", 0), ("samples/fake", 0), ("samples/fake", 10)]
    got = server.req("GET", f"/runs/{run.id}/images/10/samples/fake")
    assert got.content == (run.path / "images/samples/fake/10.png").read_bytes()


def _upload(server: Server, run: Any) -> Any:
    client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client, retry=FAST)
    return upload_run(run.path, folder="gan", make_folder=True, client=client)


def test_a_run_past_the_servers_image_limit_is_refused_whole_and_the_rest_of_it_uploads(
    tmp_path: Path, db_url: str
) -> None:
    server = make_server(tmp_path, db_url, max_run_images=3)
    with server.client:
        parent = track.create_run(name="data", home=tmp_path / "store")
        parent.finish()
        run = track.create_run(name="gan", home=tmp_path / "store")
        run.mark_input(parent)
        run.log("train", {"loss": 1.0}, step=0)
        for step in range(4):  # 4 images in one batch
            run.log_image("samples/fake", np.full((4, 5, 3), step * 40, np.uint8), step=step)
        run.finish()
        with pytest.raises(UploadError, match=r"4 images, over the server's limit of 3 per run.*--max-run-images"):
            _upload(server, run)
        assert server.req("GET", f"/runs/{run.id}/images").json()["images"] == []  # nothing of the batch
        assert server.req("GET", f"/runs/{run.id}/metrics", params={"type": "train"}).json()["points"]
        cursors = server.req("GET", f"/runs/{run.id}").json()["cursors"]
        assert cursors.get("images.jsonl", 0) == 0 and cursors["lineage.jsonl"] > 0
        app = server.client.app  # an admin raises the limit: the same upload now completes
        app.state.settings = dataclasses.replace(app.state.settings, max_run_images=4)
        _upload(server, run)
        assert len(server.req("GET", f"/runs/{run.id}/images").json()["images"]) == 4
    server.client.app.state.engine.dispose()


def test_run_images_count_in_the_owners_storage_quota(tmp_path: Path, db_url: str) -> None:
    from ember.server.services.blobs import usage
    from ember.server.storage.models import User

    first = _run_with_images(tmp_path / "store", count=1)
    sizes = [len((first.path / line["file"]).read_bytes()) for line in first.images()]
    server = make_server(tmp_path, db_url, quota_bytes=sum(sizes) + 10)
    with server.client:
        _upload(server, first)
        with server.client.app.state.sessions() as session:
            alice = session.scalar(select(User.id).where(User.name == "alice"))
            assert usage(session, alice) == sum(sizes)
        second = _run_with_images(tmp_path / "store", count=1)
        with pytest.raises(UploadError, match=r"over the quota of \d+ bytes per user.*--quota-mb"):
            _upload(server, second)
        assert server.req("GET", f"/runs/{second.id}/images").json()["images"] == []
        assert server.req("DELETE", f"/runs/{first.id}?purge=true").status_code == 200  # frees its images' bytes
        _upload(server, second)
        assert len(server.req("GET", f"/runs/{second.id}/images").json()["images"]) == 2
    server.client.app.state.engine.dispose()
