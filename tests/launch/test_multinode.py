"""Two ``ember run`` agents on loopback ("two machines") meeting at a c10d rendezvous.

They train the job that one agent with 2 processes trains (within 1e-6), track one run and
write each checkpoint once; a rendezvous that misses a machine times out naming the endpoint,
the machines seen and the timeout; machines launched with different configs are named.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import ember.cli
from tests.dist import free_port
from tests.launch.common import JOB, assert_same_training, checkpoints, ember_run, finish, reports, runs

pytestmark = pytest.mark.multiprocess


def two_machines(tmp_path: Path, job_args: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())) -> list[str]:
    """Start agents A and B (``--nnodes 2 --nproc 1``), each in its own folder; return their outputs."""
    endpoint = f"127.0.0.1:{free_port()}"
    options = ("--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", endpoint, "--rdzv-id", "job21")
    procs = [ember_run(tmp_path / name, tmp_path / "out", *options, job_args=args)
             for name, args in zip("AB", job_args, strict=True)]  # fmt: skip
    outputs = [finish(p) for p in procs]
    return [f"rc={p.returncode}\n{output}" for p, output in zip(procs, outputs, strict=True)]


def test_two_agents_train_what_one_agent_with_two_processes_trains(tmp_path: Path, reference: dict[str, Any]) -> None:
    outputs = two_machines(tmp_path)
    assert all(o.startswith("rc=0") for o in outputs), "\n".join(o[-4000:] for o in outputs)
    got = reports(tmp_path / "out")
    assert {r["world_size"] for r in got.values()} == {2}
    assert {Path(r["cwd"]).name for r in got.values()} == {"A", "B"}  # one process on each machine
    assert_same_training(got, reference["reports"])

    # Only rank 0 writes: its machine holds the run and every checkpoint, the other machine nothing.
    writer = Path(got[0]["cwd"])
    other = tmp_path / ("B" if writer.name == "A" else "A")
    assert checkpoints(writer / "ckpt") == reference["checkpoints"]
    assert checkpoints(other / "ckpt") == [] and not (other / ".ember").exists()
    tracked = runs(writer / ".ember")
    assert len(tracked) == 1 and tracked[0]["status"] == "Complete"


def test_a_rendezvous_missing_a_machine_times_out_naming_endpoint_machines_and_timeout(tmp_path: Path) -> None:
    port = free_port()
    proc = ember_run(tmp_path / "A", tmp_path / "out", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
                     "--rdzv-id", "lonely", "--rdzv-conf", "join_timeout=3")  # fmt: skip
    output = finish(proc, timeout=60)
    assert proc.returncode == 2, output
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"ember: error: ember run: the rendezvous at 127.0.0.1:{port} (--rdzv-id lonely)"), last
    assert "did not complete within 3 s: it needs 2 machine(s) (--nnodes) and 1 came: " in last
    assert re.search(r"1 came: \S+ \(pid \d+\) \(this machine\)\.", last), last
    assert "--rdzv-conf join_timeout=SECONDS" in last


def test_machines_launched_with_different_configs_are_named_at_launch(tmp_path: Path) -> None:
    outputs = two_machines(tmp_path, (("--set", "gradient_accumulation=2"), ("--set", "lr=0.1")))
    for output in outputs:
        assert output.startswith("rc=1"), output[-4000:]
        assert "LaunchError: the config is not the same on every process of this job" in output
        # which agent gets rank 0 is the rendezvous's choice: either way both keys are named
        named = r"rank 1 on host \S+ differs from rank 0 on host \S+ in gradient_accumulation: [12] on rank 0, "
        named += r"[12] on rank 1; lr: .+? on rank 0, .+? on rank 1"
        assert re.search(named, output), output[-4000:]
    assert not (tmp_path / "out" / "rank0.json").exists()  # nothing trained


@pytest.mark.parametrize("endpoint", ["127.0.0.1", "127.0.0.1:", ":29400", "node0:http"])
def test_an_rdzv_endpoint_that_is_not_host_port_is_one_error(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = ember.cli.main(["run", str(JOB), "--nnodes", "2", "--rdzv-endpoint", endpoint])
    assert code == 2
    assert f"--rdzv-endpoint {endpoint!r} is not HOST:PORT" in capsys.readouterr().err


def test_several_machines_without_an_rdzv_endpoint_is_one_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PET_MASTER_ADDR", raising=False)
    assert ember.cli.main(["run", str(JOB), "--nnodes", "2"]) == 2
    assert "--nnodes 2 needs --rdzv-endpoint HOST:PORT" in capsys.readouterr().err


def test_ember_run_in_a_pod_of_a_bigger_kubernetes_job_refuses_to_train_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PET_NNODES", "2")  # what a TrainJob or PyTorchJob pod has; torchrun would read it
    assert ember.cli.main(["run", str(JOB), "--nproc", "1"]) == 2
    assert "--nnodes 1, but PET_NNODES=2 (set by a Kubernetes operator)" in capsys.readouterr().err
