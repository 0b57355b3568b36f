"""`ember ui`: the console over a local store, on loopback, without login (issue 9, items 1 and 4)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ember import track
from tests.console._data import make_store, write_runs
from tests.console.conftest import Checked
from tests.console.conftest import new_page as new_context_page
from tests.server.conftest import free_port


def new_page(browser: Any, ui: dict[str, Any], **context: Any) -> Checked:
    """A fresh browser that opened the link `ember ui` printed (its token sets the cookie)."""
    p = new_context_page(browser, ui["url"], **context)
    enter(p, ui)
    return p


def enter(p: Checked, ui: dict[str, Any]) -> None:
    p.page.goto(ui["entry"])
    p.settle()  # the page's own requests end before the test navigates on
    assert "token" not in p.page.url and "/ui/folders" in p.page.url, p.page.url


def start_ui(argv: list[str], log: Path, timeout: float = 90.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``argv`` (an `ember ui` command line) and wait until it answers; the process and the link it printed."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    port = argv[argv.index("--port") + 1]
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"ember ui did not answer in {timeout} s: {log.read_text()}"
        try:
            httpx.get(f"http://127.0.0.1:{port}/ui/login", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    entry = re.search(r"http://127\.0\.0\.1:\d+/ui/\?token=\S+", log.read_text())
    assert entry, log.read_text()
    return proc, entry.group(0)


def ui_argv(store: Path, port: int, *more: str) -> list[str]:
    return [sys.executable, "-m", "ember.server.cli", "ui", "--store", str(store), "--port", str(port), *more]


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`ember ui --store DIR` in its own process, over two finished runs."""
    tmp = tmp_path_factory.mktemp("ui")
    runs = make_store(tmp / "store")
    port = free_port()
    proc, entry = start_ui(ui_argv(tmp / "store", port), tmp / "ui.log")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    with httpx.Client() as http:  # the store is indexed in the background: wait until it is
        http.get(entry)
        while "Reading the store" in http.get(f"{url}/ui/runs").text and time.monotonic() < deadline:
            time.sleep(0.2)
    try:
        yield {"url": url, "entry": entry, "runs": runs, "store": tmp / "store"}
    finally:
        proc.terminate()
        proc.wait(60)


def wait_listed(p: Checked, path: str, text: str, timeout: float = 60.0) -> None:
    """Open ``path`` until a run link reads ``text``: `ember ui` indexes what changed every second."""
    deadline = time.monotonic() + timeout
    p.goto(path)
    while p.page.locator("a.run-link", has_text=text).count() == 0 and time.monotonic() < deadline:
        p.page.wait_for_timeout(250)
        p.goto(path)
    assert p.page.locator("a.run-link", has_text=text).count() > 0, (path, text)


def wait_points(p: Checked, chart: str, points: str, timeout: float = 60.0) -> None:
    """Reload a run page until ``chart`` shows ``points`` points (what the index has read so far)."""
    deadline = time.monotonic() + timeout
    p.page.wait_for_selector(f"{chart}[data-drawn]")
    while p.page.get_attribute(chart, "data-points") != points and time.monotonic() < deadline:
        p.page.wait_for_timeout(250)
        p.page.reload()
        p.page.wait_for_selector(f"{chart}[data-drawn]")
    assert p.page.get_attribute(chart, "data-points") == points


def test_local_console_needs_no_login_and_shows_everything(browser: Any, ui: dict[str, Any]) -> None:
    p = new_page(browser, ui)
    p.goto("/ui/")
    assert "/ui/folders" in p.page.url and p.page.locator("#logout").count() == 0
    p.check("local-folders")
    p.goto("/ui/runs")
    assert sorted(p.page.locator("a.run-link").all_inner_texts()) == ["tiny-0", "tiny-1"]
    p.page.fill("input[name=where]", "hp:lr>0.08")
    p.page.click("#filters button[type=submit]")
    p.settle()
    assert p.page.locator("a.run-link").all_inner_texts() == ["tiny-0"]
    p.check("local-runs")
    p.page.click("a.run-link")
    p.page.wait_for_selector("#chart-train-loss[data-drawn]")
    p.settle()
    assert p.page.get_attribute("#chart-train-loss", "data-points") == "30"
    p.check("local-run")
    p.page.click("#lineage-depth a[data-depth='all']")  # ember ui's index walks lineage as the server does
    p.settle()
    assert p.page.get_attribute("#lineage", "data-depth") == "all"
    assert p.page.get_attribute("#lineage a.node-link[data-kind=artifact]", "data-level") == "1"
    p.page.click("#lineage a.node-link[data-kind=artifact]")
    p.settle()
    assert "/ui/artifacts/" in p.page.url and "model.pt" in p.page.inner_text("#files")
    p.check("local-artifact")
    p.goto("/ui/runs")
    for box in p.page.locator("input[name=ids]").all():
        box.check()
    p.page.click("#compare")
    p.page.wait_for_selector("body[data-compare-ready='1'] #compare-grid .chart[data-drawn]")
    assert p.page.get_attribute("#compare-grid .chart[data-metric='train/loss']", "data-traces") == "2"
    p.check("local-compare")
    p.page.context.close()


def test_a_running_run_appears_and_its_chart_follows_it(browser: Any, ui: dict[str, Any]) -> None:
    run = track.create_run(name="live", home=ui["store"])
    for step in range(5):
        run.log("train", {"loss": 1.0 / (step + 1)}, step=step)
    run.flush()
    p = new_page(browser, ui)
    wait_listed(p, "/ui/runs?q=live", "live")
    p.page.click("a.run-link")
    wait_points(p, "#chart-train-loss", "5")
    assert p.page.locator("#live").count() == 1
    for step in range(5, 12):
        run.log("train", {"loss": 1.0 / (step + 1)}, step=step)
    run.finish()
    deadline = time.monotonic() + 20  # the page polls every 5 s while the run is Running
    while time.monotonic() < deadline and p.page.inner_text("#run-status") != "Complete":
        p.page.wait_for_timeout(250)
    assert p.page.inner_text("#run-status") == "Complete"
    assert p.page.get_attribute("#chart-train-loss", "data-points") == "12"
    p.check()
    p.page.context.close()


def test_a_run_whose_process_was_sigkilled_shows_as_crashed(browser: Any, ui: dict[str, Any]) -> None:
    """A real training process killed with SIGKILL leaves run.json saying Running: the console says Crashed."""
    script = Path(__file__).resolve().parents[1] / "track" / "scripts" / "worker.py"
    env = {**os.environ, "EMBER_HOME": str(ui["store"]), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, str(script), "killnow", "40"], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(2)]  # "PATH ...", "LOGGED"
    assert lines[1].strip() == "LOGGED", lines
    run_path = Path(lines[0].split(" ", 1)[1].strip())
    p = new_page(browser, ui)
    try:
        wait_listed(p, "/ui/runs?status=Running", "worker-killnow")  # alive: Running
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        assert json.loads((run_path / "run.json").read_text())["status"] == "Running"  # what the files say
        p.goto("/ui/runs?status=Crashed")
        assert p.page.locator("a.run-link").all_inner_texts() == ["worker-killnow"]
        assert p.page.inner_text("#runs-table tbody tr .status") == "Crashed"
        p.goto("/ui/runs?status=Running")
        assert p.page.locator("a.run-link", has_text="worker-killnow").count() == 0
        p.goto("/ui/runs?q=worker-killnow")
        p.page.click("a.run-link")
        wait_points(p, "#chart-train-loss", "40")
        assert p.page.inner_text("#run-status") == "Crashed" and p.page.locator("#live").count() == 0
        p.check("local-crashed-run")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        p.page.context.close()
    listed = subprocess.run(
        [sys.executable, "-m", "ember.track.cli", "runs", "ls", "--store", str(ui["store"])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert any("worker-killnow" in line and "Crashed" in line for line in listed.splitlines()), listed


PHONE = {"width": 390, "height": 844}


def _overflow(p: Checked) -> int:
    """How many CSS pixels the page is wider than the phone's screen (0 when nothing scrolls sideways).

    Measured against the screen's width, not ``innerWidth``: a mobile browser widens its layout
    viewport (zooming out) to fit a page that overflows, so ``innerWidth`` would grow with it.
    """
    width, inner = p.page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
    return int(max(width, inner) - PHONE["width"])


def test_on_a_phone_no_page_is_wider_than_the_screen(browser: Any, ui: dict[str, Any]) -> None:
    ctx = browser.new_context(viewport=PHONE, device_scale_factor=3, is_mobile=True, has_touch=True)
    p = Checked(ctx.new_page(), ui["url"])
    enter(p, ui)
    for path in ("/ui/folders?path=/local", "/ui/runs", "/ui/runs?sort=-hp:lr"):
        p.goto(path)
        assert _overflow(p) <= 1, (path, _overflow(p))
        p.check(f"phone-{path.split('/')[2].split('?')[0]}")
    p.goto("/ui/runs?q=tiny-0")
    p.page.click("a.run-link")
    p.page.wait_for_selector("#chart-train-loss[data-drawn]")
    p.settle()
    assert _overflow(p) <= 1, ("run page", _overflow(p))
    p.check("phone-run")
    p.page.click("#lineage a.node-link[data-kind=artifact]")
    p.settle()
    assert _overflow(p) <= 1, ("artifact page", _overflow(p))
    p.check("phone-artifact")
    p.goto("/ui/runs")
    for box in p.page.locator("input[name=ids]").all()[:2]:
        box.check()
    p.page.click("#compare")
    p.page.wait_for_selector("body[data-compare-ready='1'] #compare-grid .chart[data-drawn]")
    assert _overflow(p) <= 1, ("compare page", _overflow(p))
    p.check("phone-compare")
    ctx.close()


def test_a_damaged_run_is_listed_with_its_reason_and_a_folder_reads_in_pages(browser: Any, ui: dict[str, Any]) -> None:
    """A run folder ember could not have written shows as Damaged, with the reason, in the runs table and on its
    page (issue 18, item 2); a folder of more runs than a page is read a page at a time (item 13)."""
    paged = write_runs(ui["store"], 5, folder="paged", first=900)
    broken = write_runs(ui["store"], 1, first=950)[0]
    (broken / "run.json").write_text('{"id": "12')  # cut short: nothing of it can be read
    p = new_page(browser, ui)
    wait_listed(p, "/ui/runs?status=Damaged", broken.name)  # listed under its folder's name
    assert "is not valid JSON" in p.page.inner_text("#runs-table tbody tr .reason")
    wait_listed(p, "/ui/runs", "r00904")
    assert p.page.locator(
        "#runs-table .status.damaged"
    ).count() == 1 and "1 run folder is damaged" in p.page.inner_text("#indexing")
    p.check("local-runs-damaged")
    p.page.click(f"a.run-link:has-text('{broken.name}')")
    p.settle()
    assert p.page.inner_text("#run-status") == "Damaged" and "is not valid JSON" in p.page.inner_text("#run-reason")
    p.check("local-run-damaged")
    p.goto("/ui/folders?path=/local/paged&per_page=2")
    p.check("local-folder-pages")
    seen = p.page.locator("a.run-link").all_inner_texts()
    while p.page.locator("#next-page").count():
        p.page.click("#next-page")
        p.settle()
        seen += p.page.locator("a.run-link").all_inner_texts()
    assert seen == [path.name.split("_")[0] for path in reversed(paged)]
    p.check()
    p.page.context.close()


def test_a_damaged_metrics_line_is_skipped_with_a_warning_on_the_run_page(browser: Any, ui: dict[str, Any]) -> None:
    """One line of a metrics file that is not a metric point: the run keeps its status and every other
    point, and its page says which line was skipped (issue 19; before: Damaged, most points hidden)."""
    path = write_runs(ui["store"], 1, folder="skipped", points=30, first=970)[0]
    lines = (path / "metrics" / "train.jsonl").read_text().splitlines(keepends=True)
    lines[3] = '{"step": 3, "time": 1.7e9, "metrics": [1, 2]\n'  # cut short by hand
    (path / "metrics" / "train.jsonl").write_text("".join(lines))
    p = new_page(browser, ui)
    wait_listed(p, "/ui/runs?folder=/local/skipped", "r00970")
    assert p.page.inner_text("#runs-table tbody tr .status") == "Complete"
    p.page.click("a.run-link")
    wait_points(p, "#chart-train-loss", "29")
    note = p.page.inner_text("#run-skipped")
    assert "metrics/train.jsonl: the line at byte" in note and "is not JSON" in note and "skipped" in note
    p.check("local-run-skipped-line")
    p.page.context.close()


def _names(p: Checked) -> list[str]:
    return p.page.locator("a.run-link").all_inner_texts()


def test_ember_ui_starts_again_on_the_same_data_folder(browser: Any, tmp_path: Path) -> None:
    """`ember ui --data DIR` stopped with SIGTERM and started again on the same DIR and port: the page works
    and lists the runs, one added while it was stopped too, each read once (before: the second start failed
    with "the server already has users")."""
    store, data, port = tmp_path / "store", tmp_path / "data", free_port()
    write_runs(store, 3, points=5)
    argv = ui_argv(store, port, "--data", str(data))
    proc, entry = start_ui(argv, tmp_path / "first.log")
    p = new_context_page(browser, f"http://127.0.0.1:{port}")
    try:
        enter(p, {"entry": entry})
        wait_listed(p, "/ui/runs", "r00000")
        assert sorted(_names(p)) == ["r00000", "r00001", "r00002"]
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert (data / "ui.db").is_file()  # kept: --data is the user's folder
        write_runs(store, 1, first=7, points=5)  # while it is stopped
        proc, entry = start_ui(argv, tmp_path / "second.log")  # before: exited, "already has users"
        enter(p, {"entry": entry})  # a new launch, a new token: the link it printed
        wait_listed(p, "/ui/runs", "r00007")
        p.page.reload()
        p.settle()
        assert sorted(_names(p)) == ["r00000", "r00001", "r00002", "r00007"]
        p.check("local-restarted")
        p.page.click("a.run-link:has-text('r00001')")
        wait_points(p, "#chart-train-loss", "5")  # read again from its cursors: no point twice
        p.check()
    finally:
        p.page.context.close()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)


# `ember ui` whose index stops after ``after`` runs until the file ``gate`` exists: the store is being read
# for as long as the test needs, whatever the machine's speed. One run a pass, as test_index.py does.
GATED = """
import sys
from pathlib import Path
from ember.server.cli import main
from ember.server.local import index
gate, after = Path(sys.argv[1]), int(sys.argv[2])
index.PASS_S = index.BATCH_S = 0.0
step = index.StoreIndex.step
def gated(self):
    while self.progress().indexed >= after and not gate.exists() and not self._stop.wait(0.05):
        pass
    return step(self)
index.StoreIndex.step = gated
sys.exit(main(sys.argv[3:]))
"""


def test_the_first_page_answers_while_the_store_is_read_and_says_how_far_it_has_got(
    browser: Any, tmp_path: Path
) -> None:
    """While the index reads a store of 40 runs (held after 3), pages answer, list the newest runs read so
    far and say "Reading the store: 3 of 40 runs"; once it is done a reload lists all 40, the note gone."""
    store, gate, port = tmp_path / "store", tmp_path / "gate", free_port()
    write_runs(store, 40)
    argv = [sys.executable, "-c", GATED, str(gate), "3", *ui_argv(store, port)[3:]]
    proc, entry = start_ui(argv, tmp_path / "ui.log")
    p = new_context_page(browser, f"http://127.0.0.1:{port}")
    try:
        enter(p, {"entry": entry})
        assert p.goto("/ui/runs").ok  # answered although the index cannot finish
        note = p.page.locator("#indexing")
        deadline = time.monotonic() + 15  # until the index has read its 3 runs (and listed the 40)
        while (note.count() == 0 or note.get_attribute("data-indexed") != "3") and time.monotonic() < deadline:
            p.page.wait_for_timeout(250)
            p.page.reload()
        assert note.is_visible(), "no note while the store is read"
        assert "Reading the store: 3 of 40 runs so far, newest first" in note.inner_text()
        assert note.get_attribute("data-runs") == "40"
        assert _names(p) == ["r00039", "r00038", "r00037"]  # the newest, read first
        p.check("local-indexing")
        gate.touch()
        deadline = time.monotonic() + 30
        while note.count() and time.monotonic() < deadline:  # the page says: reload to see more
            p.page.wait_for_timeout(250)
            p.page.reload()
        assert note.count() == 0 and len(_names(p)) == 40
        p.check("local-indexed")
    finally:
        p.page.context.close()
        proc.terminate()
        proc.wait(60)


# `ember ui` whose reading of one run's metrics waits until the file ``gate`` exists: the run of a million
# points whose reading takes long, for as long as the test needs, whatever the machine's speed.
SLOW_RUN = """
import sys
from pathlib import Path
from ember.server.cli import main
from ember.server.local import index
from ember.track import client
gate, slow = Path(sys.argv[1]), sys.argv[2]
index.BIG_BYTES = 8000  # the slow run is "big": its points are read after the others'
send = client._send_metrics
def gated(receiver, run_id, file, cursor):
    while file.parent.parent.name.startswith(slow) and not gate.exists():
        gate.parent.joinpath("waiting").touch()
        __import__("time").sleep(0.05)
    return send(receiver, run_id, file, cursor)
client._send_metrics = gated
sys.exit(main(sys.argv[3:]))
"""


def test_every_run_is_listed_before_the_points_of_a_big_one_are_read_and_a_busy_port_fails_at_once(
    browser: Any, tmp_path: Path
) -> None:
    """The newest run's metrics take long to read (held until the test lets go): the other runs are listed
    and counted meanwhile, its own row too, its chart fills in once read (before: the newest run was read
    whole first and the folder said "(0)" until it was). A second `ember ui` on the same port exits at
    once with the error and prints no link (before: it printed the link and lingered)."""
    store, gate, port = tmp_path / "store", tmp_path / "gate", free_port()
    big = write_runs(store, 7, points=30)[-1]  # r00006 is the newest: read first
    with open(big / "metrics" / "train.jsonl", "a") as f:  # and the biggest: its points last
        f.writelines(
            json.dumps({"step": s, "time": 1.7e9 + s, "metrics": {"loss": 0.5}}) + "\n" for s in range(30, 200)
        )
    argv = [sys.executable, "-c", SLOW_RUN, str(gate), "r00006", *ui_argv(store, port)[3:]]
    proc, entry = start_ui(argv, tmp_path / "ui.log")
    p = new_context_page(browser, f"http://127.0.0.1:{port}")
    try:
        enter(p, {"entry": entry})
        deadline = time.monotonic() + 30
        while (len(_names(p)) < 7 or not (tmp_path / "waiting").exists()) and time.monotonic() < deadline:
            p.page.wait_for_timeout(250)
            p.goto("/ui/folders?path=/local/default")
        assert (tmp_path / "waiting").exists(), "the big run's metrics were not being read"
        assert len(_names(p)) == 7, _names(p)  # before: none while the big run was read
        assert "(7 in this folder, newest first)" in p.page.inner_text("h2:has-text('Runs')")
        note = p.page.locator("#indexing")
        assert (note.get_attribute("data-indexed"), note.get_attribute("data-reading")) == ("7", "1")
        assert "Every run is listed; reading the metrics of 1 run" in note.inner_text()
        p.check("local-listed-before-points")
        p.goto("/ui/runs?folder=/local/default")
        assert "(7)" in p.page.inner_text("h1")
        p.page.click("a.run-link:has-text('r00005')")
        wait_points(p, "#chart-train-loss", "30")  # a small run's points are read meanwhile

        second = subprocess.run(ui_argv(store, port), capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second
        assert f"cannot listen on 127.0.0.1:{port}" in second.stderr and "token=" not in second.stdout, second

        gate.touch()
        deadline = time.monotonic() + 30
        p.goto("/ui/runs?folder=/local/default")
        while p.page.locator("#indexing").count() and time.monotonic() < deadline:
            p.page.wait_for_timeout(250)
            p.page.reload()
        assert p.page.locator("#indexing").count() == 0  # every run read: the note is gone
        p.page.click("a.run-link:has-text('r00006')")
        wait_points(p, "#chart-train-loss", "200")
        p.check()
    finally:
        gate.touch()  # the index thread lets go: the process stops at once
        p.page.context.close()
        proc.terminate()
        proc.wait(60)
