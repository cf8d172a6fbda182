"""Warnings, notes and error paragraphs wrap to the output width (80 columns in a pipe or with
COLUMNS=80, COLUMNS when set) by one function (gpucloud/prose.py), without losing or cutting a
word: paths, URLs and `commands` stay whole, and --json documents are never wrapped. Through the
real CLI with stdout and stderr piped, as in a CI log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.prose import fill
from tests.support.cli import clean_env, cli
from tests.support.text import flat, messages

REPO = Path(__file__).resolve().parents[2]


def over(text: str, width: int) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]


K80_JOB = "name: k80\nresources:\n  gpu: K80:1\nrun: python3 train.py\n"


@pytest.mark.parametrize("columns", [80, 60])
def test_a_long_error_paragraph_wraps_to_the_width_and_loses_no_word(tmp_path: Path, columns: int) -> None:
    out = cli("catalog", "--gpu", "K8O", cwd=tmp_path, env=clean_env(columns))
    assert out.returncode == 2 and len(out.stderr.splitlines()) >= 3, out.stderr
    assert not over(out.stderr, columns), over(out.stderr, columns)
    doc = json.loads(cli("catalog", "--gpu", "K8O", "--json", cwd=tmp_path, env=clean_env(columns)).stdout)["error"]
    # The same words as the JSON document's message and hint, in the same order: nothing cut.
    assert flat(out.stderr) == flat(f"error: {doc['message']}\n{doc['hint']}")
    assert "\n" not in doc["message"] and "\n" not in doc["hint"]  # JSON is never wrapped


def test_a_long_plan_error_wraps_around_its_one_long_path(tmp_path: Path) -> None:
    spec = tmp_path / "k80.yaml"
    spec.write_text(K80_JOB)
    out = cli("plan", spec.name, cwd=tmp_path, env=clean_env())
    assert out.returncode == 2 and len(out.stderr.splitlines()) > 6, out.stderr
    assert [line.strip() for line in over(out.stderr, 80)] in ([], [f"{spec}:"]), out.stderr  # only the path
    doc = json.loads(cli("plan", spec.name, "--json", cwd=tmp_path, env=clean_env()).stdout)["error"]
    assert flat(out.stderr) == flat(f"error: {doc['message']}\n{doc['hint']}")


def test_a_long_run_time_warning_wraps_to_80_columns(tmp_path: Path) -> None:
    spec = tmp_path / "many.yaml"
    spec.write_text(
        "name: many\nresources: {cloud: local}\nrun: 'mkdir -p out; for i in 1 2 3; do echo $i > out/f$i; done'\n"
        "artifacts: [out/]\nmax_duration: 5m\n"
    )
    out = cli(
        "run",
        str(spec),
        cwd=tmp_path,
        env=clean_env(GPUCLOUD_ARTIFACTS_MAX_FILES="1", GPUCLOUD_HOME=str(tmp_path / "home")),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("warning: artifacts not extracted"))
    assert lines[start + 1].startswith("  "), lines  # it did wrap: the message is longer than 80
    assert len(lines[start]) <= 80 and len(lines[start + 1]) <= 80, lines
    assert (
        "warning: artifacts not extracted: more than 1 files (cap GPUCLOUD_ARTIFACTS_MAX_FILES); "
        "nothing of this archive was kept (raise the cap to take it, docs/SECURITY.md)" in messages(out.stderr)
    )
    # Every other stderr line fits too, but for one that is a single path longer than the rest allows.
    wide = [line for line in over(out.stderr, 80) if not any(len(word) > 40 for word in line.split())]
    assert not wide, wide


def test_a_long_path_in_an_error_is_never_cut(tmp_path: Path) -> None:
    deep = tmp_path / ("a-folder-with-a-long-name-" * 3) / "jobs"
    deep.mkdir(parents=True)
    spec = deep / "k80.yaml"
    spec.write_text(K80_JOB)
    out = cli("plan", str(spec), cwd=tmp_path, env=clean_env())
    assert out.returncode == 2
    assert str(spec) in out.stderr  # whole, on one line, even though it is longer than 80 columns
    assert not [line for line in over(out.stderr, 80) if str(spec) not in line]


def test_fill_keeps_words_commands_and_items_whole() -> None:
    url = "https://learn.microsoft.com/azure/virtual-machines/sizes/retirement/nc-series-retirement"
    text = fill(f"warning: see {url} and run `gpucloud catalog refresh --cloud aws --region us-east-1` now", 40)
    assert url in text.splitlines()[1] and "`gpucloud catalog refresh --cloud aws --region us-east-1`" in text
    items = fill("no cloud is usable:\n  - AWS: a reason long enough to wrap onto a second line here", 40)
    assert items.splitlines()[2].startswith("    ") and flat(items).endswith("second line here")
    command = "    mv /a/very/long/path/that/never/ends /a/very/long/path/that/never/ends.damaged"
    assert fill(f"Move it aside:\n{command}", 40).splitlines()[1] == command  # copied, so never wrapped
