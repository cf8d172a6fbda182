"""A job file cannot reach the caller's credentials by itself (spec/reach.py, docs/SECURITY.md "A job
file from someone else"): a cloud or CI credential named in `secrets:`, and a local input outside
the job file's folder (symlinks followed) or in a credentials place, are refused by validate, plan,
render and run (exit 2, file:line, the field, why, the flag) before anything is created, unless the
caller passes --allow-secret / --allow-input. Run in-process (typer's runner)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucloud.cli.app import app
from gpucloud.spec.reach import CREDENTIAL_SECRETS

HEAD = "name: r\nresources: {cloud: local}\nrun: 'true'\n"
COMMANDS = (["validate"], ["plan", "--json"], ["render"], ["run", "--yes"])


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    assert "Traceback" not in res.output
    return res.exit_code, res.output


def job(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(HEAD + body)
    return path


def nothing_created(home: Path) -> bool:
    """No run was recorded and no channel object written under GPUCLOUD_HOME."""
    return not any(p.name in ("runs", "channel") and p.is_dir() and any(p.iterdir()) for p in home.rglob("*"))


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_credential_secret_is_refused_before_anything_is_created(
    tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ci-secret-key")
    path = job(tmp_path / "pr", "secrets: [HF_TOKEN, AWS_SECRET_ACCESS_KEY]\n")
    code, out = invoke(*command, str(path))
    assert code == 2, out
    assert f"{path}:4: secrets: AWS_SECRET_ACCESS_KEY holds a cloud account's keys" in out
    assert "--allow-secret AWS_SECRET_ACCESS_KEY" in out and "pull request" in out
    assert "ci-secret-key" not in out
    assert nothing_created(gpucloud_home)


def test_allow_secret_lets_the_caller_pass_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = job(tmp_path / "mine", "secrets: [GITHUB_TOKEN]\n")
    assert invoke("validate", str(path))[0] == 2
    assert invoke("validate", "--allow-secret", "GITHUB_TOKEN", str(path))[0] == 0
    monkeypatch.setenv("GITHUB_TOKEN", "x")
    assert invoke("plan", "--json", "--allow-secret", "GITHUB_TOKEN", str(path))[0] == 0


def test_every_listed_credential_is_refused_and_has_a_reason(tmp_path: Path) -> None:
    names = sorted(CREDENTIAL_SECRETS)
    for must in ("AWS_ACCESS_KEY_ID", "AZURE_CLIENT_SECRET", "GOOGLE_APPLICATION_CREDENTIALS", "CI_JOB_TOKEN"):
        assert must in names
    path = job(tmp_path / "all", "secrets: [" + ", ".join(names) + "]\n")
    code, out = invoke("validate", str(path))
    assert code == 2 and out.count("--allow-secret") == len(names), out
    assert all(CREDENTIAL_SECRETS[n] for n in names)


def _hostile_inputs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """input -> (source as written, words of the refusal)."""
    home = Path(os.environ["HOME"])
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("[default]\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "pr" / "data").mkdir(parents=True)
    (tmp_path / "pr" / "data" / "to-aws").symlink_to(home / ".aws")
    (tmp_path / "pr" / "creds").symlink_to(home / ".aws" / "credentials")
    return {
        "environ": ("/proc/self/environ", "inside /proc, which holds credentials"),
        "abs": (str(tmp_path / "outside"), "outside the job file's folder"),
        "dotdot": ("../outside", "outside the job file's folder"),
        "link": ("creds", f"inside {home / '.aws'}"),
        "dirlink": ("data/to-aws", f"is {home / '.aws'} (symlinks followed), which holds credentials"),
        "store": (os.environ["GPUCLOUD_HOME"], "which holds credentials"),
    }


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_local_inputs_outside_the_folder_or_in_credentials_are_refused(
    tmp_path: Path, gpucloud_home: Path, command: list[str]
) -> None:
    cases = _hostile_inputs(tmp_path)
    body = "inputs:\n" + "".join(f"  {name}: '{src}'\n" for name, (src, _) in cases.items())
    path = job(tmp_path / "pr", body)
    code, out = invoke(*command, str(path))
    assert code == 2, out
    for n, (name, (_src, words)) in enumerate(cases.items()):
        assert f"{path}:{5 + n}: inputs.{name}: the local source" in out, name
        assert words in out, (name, out)
    assert out.count("--allow-input") % len(cases) == 0  # --json repeats each in its error document
    assert nothing_created(gpucloud_home)


def test_a_folder_holding_a_credentials_place_is_refused(tmp_path: Path) -> None:
    """A job file in the home folder uploading `.` would carry ~/.ssh."""
    home = Path(os.environ["HOME"])
    (home / ".ssh").mkdir()
    (home / "proj").mkdir()
    code, out = invoke("validate", str(job(home, "workdir: proj\ninputs: {all: .}\n")))
    assert code == 2 and f"which holds {home / '.ssh'}, a place with credentials" in out, out


def test_allow_input_and_inputs_inside_the_folder(tmp_path: Path) -> None:
    for folder in (tmp_path / "outside", tmp_path / "pr" / "data"):
        folder.mkdir(parents=True)
        (folder / "f.txt").write_text("x")
    path = job(tmp_path / "pr", "inputs:\n  a: ./data\n  b: ../outside\n")
    code, out = invoke("validate", str(path))
    assert code == 2 and "inputs.a" not in out and "inputs.b" in out
    assert invoke("validate", "--allow-input", str(tmp_path / "outside"), str(path))[0] == 0
    assert invoke("plan", "--json", "--allow-input", str(tmp_path), str(path))[0] == 0
    assert invoke("render", "--allow-input", str(tmp_path / "outside" / "x"), str(path))[0] == 2  # narrower


def test_a_workdir_in_a_credentials_place_is_refused(tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])
    (home / ".aws").mkdir()
    (tmp_path / "pr").mkdir()
    (tmp_path / "pr" / "up").symlink_to(home / ".aws")
    for workdir in (str(home / ".aws"), "up"):
        path = job(tmp_path / "pr", f"workdir: '{workdir}'\n")
        code, out = invoke("validate", str(path))
        assert code == 2 and f"{path}:4: workdir:" in out and "--allow-input" in out, out
        allowed = invoke("validate", "--allow-input", str(home / ".aws"), str(path))
        assert allowed[0] == 0, allowed[1]
    assert invoke("validate", str(job(tmp_path / "pr" / "jobs", "workdir: ..\n")))[0] == 0  # a monorepo


def test_a_workdir_holding_a_credentials_place_is_packed_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`workdir: .` in a folder that holds GPUCLOUD_HOME (its state store, run keys) is fine: the
    upload leaves that folder out, as it leaves out every credentials place inside a workdir."""
    import tarfile

    from gpucloud.channel.workdir import pack_workdir
    from gpucloud.spec.reach import credential_places

    store = tmp_path / "proj" / "gpucloud-home"
    store.mkdir(parents=True)
    monkeypatch.setenv("GPUCLOUD_HOME", str(store))
    (store / "state.db").write_text("runs")
    (store.parent / "code.py").write_text("print(2)")
    path = job(store.parent, "workdir: .\n")
    code, out = invoke("validate", str(path))
    assert code == 0, out
    with tarfile.open(pack_workdir(store.parent, skip=credential_places())) as tar:
        names = tar.getnames()
    assert "code.py" in names and not any(n.endswith("state.db") for n in names), names
