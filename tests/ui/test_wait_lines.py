"""While a run waits (a machine boots, a stage installs the stack), a progress line comes at least
every WAIT_LINE_S and says what is awaited; the job's own output counts as progress."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucloud.ui import progress as progress_mod
from gpucloud.ui.progress import Progress, awaited


def test_a_wait_line_every_30_seconds_saying_what_is_awaited(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    p = Progress(plain=True)
    booting = awaited(None)
    assert booting is not None and "boot" in booting
    said = []
    for _ in range(25):  # 2 minutes of polls, 5 s apart
        clock[0] += 5
        p.tick(booting)
        said += [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert len(said) == 4, said  # at 30, 60, 90 and 120 s
    assert all("still waiting for the machine to boot" in line for line in said), said
    assert said[-1].endswith("(2m00s)") and said[0].endswith("(30.0s)"), said
    p.log(b"epoch 1\n")  # the job's output is progress: no wait line right after it
    clock[0] += 20
    p.tick(booting)
    assert "still waiting" not in capsys.readouterr().err


def test_what_is_awaited_follows_the_node_stages() -> None:
    assert awaited({"state": "running", "stages": {"boot": {"start": 1, "end": 2}, "stack": {"start": 2}}}) == (
        "the driver/CUDA/framework install (stage stack)"
    )
    assert awaited({"state": "running", "stages": {"run": {"start": 5}}}) is None  # the job speaks for itself
    assert awaited({"state": "running", "stages": {"weird": {"start": 5}}}) == "stage weird"


def test_a_run_whose_stage_takes_long_prints_wait_lines(
    tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpucloud.run import lifecycle
    from gpucloud.spec.load import parse_spec

    monkeypatch.setattr(progress_mod, "WAIT_LINE_S", 1.0)
    monkeypatch.setenv("CI", "true")
    spec = parse_spec(
        "name: slow\nresources: {cloud: local}\nsetup: sleep 4\nrun: echo done\nmax_duration: 5m\n",
        "slow.yaml",
        base_dir=tmp_path,
    )
    result = lifecycle.run_job(
        spec,
        cloud=None,
        region=None,
        spot=None,
        detach=False,
        assume_yes=True,
        json_out=False,
        wait_teardown=True,
    )
    err = capsys.readouterr().err
    assert result.exit_code == 0, err
    assert "still waiting for the job's setup commands (stage setup)" in err, err


def test_a_blocking_call_gets_wait_lines_from_a_thread(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    monkeypatch.setattr(progress_mod, "WAIT_LINE_S", 0.3)
    p = Progress(plain=True)
    with p.waiting("the cloud to create the machine(s)"):
        time.sleep(2.5)  # a provider call that does not return for a while
    said = [line for line in capsys.readouterr().err.splitlines() if "still waiting for the cloud" in line]
    assert len(said) >= 2, said
    time.sleep(1.2)
    assert "still waiting" not in capsys.readouterr().err  # the thread ended with the call
