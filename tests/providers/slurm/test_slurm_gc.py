"""`gpucloud gc` on a Slurm cluster touches only the caller's own gpucloud jobs and folders, and says
what it could not cancel: the provider's scripts run for real (`cluster: local`, bash) against
fake squeue/scancel that are stricter than Slurm where it matters (the squeue here can ignore
`-u` and list everyone's jobs, as an admin's does without it), and every Slurm answer is parsed
without a traceback whatever bytes it holds. The same attacks against the real slurmctld with a
second Unix user are in test_slurm_e2e.py."""

from __future__ import annotations

import os
import stat
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpucloud.contract.provider import RunHandle, parse_expiry_tag
from gpucloud.contract.tags import GcIncomplete, is_run_id, parse_run_tags
from gpucloud.providers.slurm import cluster as slurm_cluster
from gpucloud.providers.slurm import sweep
from gpucloud.providers.slurm.provider import SlurmProvider

ME = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
OLD = "2020-01-01T00:00:00Z"
RUN = "train-20200101-000000-beef"

FAKE_SQUEUE = r"""#!/bin/bash
# squeue -h [-u USER] [-j ID] -o FMT over $FAKE_SLURM/jobs (id|user|comment per line).
user="" job="" fmt=""
while [ $# -gt 0 ]; do
  case $1 in -u) user=$2; shift ;; -j) job=$2; shift ;; -o) fmt=$2; shift ;; esac; shift
done
[ -n "$FAKE_IGNORE_U" ] && user=""
[ -n "$FAKE_SQUEUE_FAIL" ] && [ "$fmt" = %i ] &&
  { echo "squeue: error: Unable to contact slurm controller" >&2; exit 1; }
while IFS='|' read -r i u k; do
  [ -n "$user" ] && [ "$u" != "$user" ] && continue
  [ -n "$job" ] && [ "$i" != "$job" ] && continue
  case $fmt in %i) echo "$i" ;; *) echo "$i|$u|$k" ;; esac
done <"$FAKE_SLURM/jobs"
"""

FAKE_SCANCEL = r"""#!/bin/bash
# scancel [-u USER] IDS: logs the call; FAKE_SCANCEL_FAIL fails it, FAKE_STUCK leaves the jobs queued.
echo "$*" >>"$FAKE_SLURM/scancel.log"
[ -n "$FAKE_SCANCEL_FAIL" ] && { echo "scancel: error: Access/permission denied" >&2; exit 1; }
[ -n "$FAKE_STUCK" ] && exit 0
user=""; [ "$1" = -u ] && { user=$2; shift 2; }
for id in "$@"; do
  grep -v "^$id|" "$FAKE_SLURM/jobs" >"$FAKE_SLURM/jobs.new"; mv "$FAKE_SLURM/jobs.new" "$FAKE_SLURM/jobs"
done
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpucloud_home: Path) -> Path:
    """A `cluster: local` with fake squeue/scancel first on PATH, a remote root, and one recorded run on it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("squeue", FAKE_SQUEUE), ("scancel", FAKE_SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "jobs").write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(tmp_path))
    monkeypatch.setenv("GPUCLOUD_REMOTE_ROOT", str(tmp_path / "home" / "remote"))
    from gpucloud.state import runs_db

    monkeypatch.setattr(runs_db.Store, "list_runs", lambda self: [SimpleNamespace(cloud="slurm", region="local/k80")])
    return tmp_path


def jobs(fake: Path, *lines: str) -> None:
    (fake / "jobs").write_text("".join(f"{line}\n" for line in lines))


def queued(fake: Path) -> list[str]:
    return [line.split("|")[0] for line in (fake / "jobs").read_text().splitlines()]


def precious(fake: Path) -> list[Path]:
    """What a comment `gpucloud-run=../../precious` pointed the old rm -rf at."""
    folders = [fake / "home" / "precious", fake / "home" / "remote" / "precious"]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "thesis.tex").write_text("years of work")
    return folders


def test_an_admins_gc_cancels_only_its_own_jobs(fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root (or any caller) whose squeue lists everyone's jobs: a stranger's job, even one with a
    well-formed gpucloud comment, is named and left alone; a hostile run id is never a path."""
    monkeypatch.setenv("FAKE_IGNORE_U", "1")
    keep = precious(fake_slurm)
    jobs(
        fake_slurm,
        f"101|mallory|gpucloud-run=../../precious,gpucloud-expires={OLD}",
        f"102|mallory|gpucloud-run={RUN},gpucloud-expires={OLD}",
        f"103|{ME}|gpucloud-run={RUN},gpucloud-expires={OLD}",
        f"104|{ME}|gpucloud-run=../../precious,gpucloud-expires={OLD}",
        f"105|{ME}|an ordinary job of mine",
    )
    lines = SlurmProvider().gc(datetime.now(UTC), dry_run=False)
    text = "\n".join(lines)
    assert queued(fake_slurm) == ["101", "102", "104", "105"], text
    assert all((p / "thesis.tex").is_file() for p in keep)
    assert f"job 103 of run {RUN} past its expiry (cancelled)" in text
    assert "job 101 belongs to mallory" in text and "job 102 belongs to mallory" in text
    assert "job 104: its comment is not a gpucloud-run tag as gpucloud writes it, left alone" in text
    assert "105" not in text
    assert (fake_slurm / "scancel.log").read_text().split() == ["-u", ME, "103"]


def test_gc_says_what_it_could_not_cancel(fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scancel refused, or the job still queued after the grace: named, GcIncomplete (exit 75),
    and the run's folder is kept while its job may still write there."""
    folder = fake_slurm / "home" / "remote" / "work" / RUN
    folder.mkdir(parents=True)
    jobs(fake_slurm, f"103|{ME}|gpucloud-run={RUN},gpucloud-expires={OLD}")
    monkeypatch.setattr(sweep, "GC_GRACE_S", 1)
    monkeypatch.setenv("FAKE_SCANCEL_FAIL", "1")
    with pytest.raises(GcIncomplete) as err:
        SlurmProvider().gc(datetime.now(UTC), dry_run=False)
    assert err.value.exit_code == 75
    assert "(NOT cancelled: scancel failed: scancel: error: Access/permission denied" in "\n".join(err.value.lines)
    monkeypatch.delenv("FAKE_SCANCEL_FAIL")
    monkeypatch.setenv("FAKE_STUCK", "1")
    with pytest.raises(GcIncomplete) as err:
        SlurmProvider().gc(datetime.now(UTC), dry_run=False)
    assert "job(s) 103 still in the queue 1s after scancel; folders kept" in err.value.message
    assert folder.is_dir() and queued(fake_slurm) == ["103"]
    monkeypatch.delenv("FAKE_STUCK")
    monkeypatch.setenv("FAKE_SQUEUE_FAIL", "1")  # the controller does not answer: nothing removed blind
    with pytest.raises(GcIncomplete) as err:
        SlurmProvider().gc(datetime.now(UTC), dry_run=False)
    assert "squeue could not list the jobs: squeue: error: Unable to contact slurm controller" in err.value.message
    assert folder.is_dir() and queued(fake_slurm) == ["103"]


def test_cancel_removes_only_the_runs_own_folders(fake_slurm: Path) -> None:
    """A run's folders go; a run id with `..`, or a folder reached through a link, is refused."""
    remote = fake_slurm / "home" / "remote"
    (remote / "work" / RUN).mkdir(parents=True)
    (remote / "channel" / "runs" / RUN).mkdir(parents=True)
    prov = SlurmProvider()
    handle = RunHandle(run_id=RUN, cloud="slurm", region="local/k80")
    assert prov._cancel(handle, remove=True, grace=1) == []
    assert not (remote / "work" / RUN).exists() and not (remote / "channel" / "runs" / RUN).exists()
    keep = precious(fake_slurm)
    bad = RunHandle(run_id="../../precious", cloud="slurm", region="local/k80")
    assert prov._cancel(bad, remove=True, grace=1) == [
        "work/../../precious not removed: it is not the run's own folder under the remote root (a link, or `..`)"
    ]
    elsewhere = fake_slurm / "elsewhere"
    (elsewhere / RUN).mkdir(parents=True)
    (elsewhere / RUN / "data").write_text("not gpucloud's")
    (remote / "channel" / "runs").rmdir()
    (remote / "channel" / "runs").symlink_to(elsewhere)
    problems = prov._cancel(handle, remove=True, grace=1)
    assert problems == [
        f"channel/runs/{RUN} not removed: it is not the run's own folder under the remote root (a link, or `..`)"
    ]
    assert (elsewhere / RUN / "data").is_file() and all((p / "thesis.tex").is_file() for p in keep)


def test_run_and_expiry_tags_are_read_strictly() -> None:
    from gpucloud.run.result import new_run_id

    assert is_run_id(new_run_id("a")) and is_run_id(new_run_id("x" * 40)) and is_run_id(RUN)
    for bad in ("../../precious", f"{RUN}/..", f"{RUN}\n", "old-run", f"-{RUN}", RUN.upper(), "", None, 5):
        assert not is_run_id(bad), bad
    assert parse_expiry_tag(OLD) == datetime(2020, 1, 1, tzinfo=UTC)
    for bad in ("2020-01-01", "2020-01-01T00:00:00+00:00", "2020-13-01T00:00:00Z", f"{OLD}\n", "٢٠٢٠-01-01T00:00:00Z"):
        assert parse_expiry_tag(bad) is None, bad
    assert parse_run_tags(f"gpucloud-run={RUN},gpucloud-expires={OLD}") == (RUN, datetime(2020, 1, 1, tzinfo=UTC))
    for bad in (
        f"gpucloud-run={RUN},gpucloud-expires={OLD},x=y",
        f"gpucloud-expires={OLD},gpucloud-run={RUN}",
        f"gpucloud-run=../{RUN},gpucloud-expires={OLD}",
        f" gpucloud-run={RUN},gpucloud-expires={OLD}",
    ):
        assert parse_run_tags(bad) is None, bad


def test_squeue_listing_with_odd_bytes_never_raises() -> None:
    now = datetime.now(UTC)
    text = (
        f"@me {ME}\n"
        f"12|{ME}|gpucloud-run={RUN},gpucloud-expires={OLD}\n"
        "garbage without bars gpucloud\n"
        f"1\x1b]0;x\x07|{ME}|gpucloud-run={RUN},gpucloud-expires={OLD}\n"
        f"13|{ME}|gpucloud-run=caf\ufffd-20200101-000000-beef,gpucloud-expires={OLD}\n"
        f"14|{ME}|gpucloud-run={RUN},gpucloud-expires=2020-01-"  # cut at the output cap
    )
    expired, notes = sweep.parse_listing(text, now)
    assert [(e.job_id, e.run_id) for e in expired] == [("12", RUN)]
    assert len(notes) == 4 and not any("\x1b" in n or "\x07" in n for n in notes), notes
    assert sweep.parse_listing("", now)[0] == [] and sweep.parse_listing("@me \n1|x|gpucloud", now)[0] == []


def test_slurm_output_parses_with_odd_bytes_or_cut_short() -> None:
    """Whatever scontrol/sinfo print (non-UTF-8, controls, a record cut at the output cap, values
    that are not numbers), the parse gives what it can read and never raises."""
    good = "PartitionName=k80 State=UP MaxTime=60 Default=YES\n"
    odd = [
        "PartitionName=caf\ufffd State=UP MaxTime=1:xx:00\n",
        "PartitionName=p2 State=UP MaxTime=\ufffd\ufffd-1\n",
        "PartitionName=p3 MaxTime=99999999999999999999999-00:00:00 State=UP\n",
        "PartitionName=p4 State=UP MaxTime=6",
    ]
    nodes = "@nodes\nn1|k80|gpu:k80:x(S:0)|gpu:k80:\ufffd|idle|\nn2|k80|gpu:k80:2|gpu:k80:1(IDX:0)|mix|\nn3|k80\n"
    notes: list[str] = []
    parts = slurm_cluster.parse_plan(good + "".join(odd) + nodes, notes)
    assert [p.name for p in parts] == ["k80", "p4"] and len(notes) == 3, notes
    assert "slurm: partition caf\ufffd left out: its time limit 1:xx:00 cannot be read" in notes
    k80 = parts[0]
    assert k80.max_minutes == 60 and k80.nodes["n2"] == {"k80": 2} and k80.free["n2"] == {"k80": 1}
    job = (
        "@base /r/channel/runs/x/node-0 3\n@job 12\n"
        "JobId=12 JobState=PEND\ufffdING Reason=Priority Restarts=x ExitCode=0:\ufffd Partition=k80\n@queue\n1\n12\n"
    )
    state = slurm_cluster.parse_job(job)
    assert state is not None and state.job_id == "12" and state.restarts == 0 and state.position == 2
    for text in ("@job \n", "@job 12", "@job 12\nJobId=12 Restarts=99999999999999999999999999", "\x00" * 100):
        slurm_cluster.parse_job(text)


def test_remote_scripts_keep_files_private(fake_slurm: Path) -> None:
    """Everything the provider writes through the login node is the user's alone (umask 077)."""
    from gpucloud.providers.slurm.login import Login, script

    login = Login("local")
    root = Path(login.root())
    login.run(script('mkdir -p "$R/work/$RUN" && echo x >"$R/work/$RUN/f"', RUN=RUN))
    for path in (root, root / "work", root / "work" / RUN, root / "work" / RUN / "f"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
