"""Secrets: sealed to the node's key, masked in its log, never written anywhere else.

Units for the seal (RFC 7748 vector, an openssl key, tampering), the log mask (a value split
across reads) and the caller's side (--secret, --secret-file, --env, a missing name); then the
leak test on the local provider: a unique value, every command with and without --json, and a
grep of the state store, every file under GPUCLOUD_HOME (channel objects, user-data, the log
mirror, the node's folder), the GitHub step summary and every command's output: 0 hits, while the
job printed the value's SHA-256 correctly.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpucloud.errors import UserError
from gpucloud.run.secrets import SecretDelivery
from gpucloud.spec.load import SpecError, parse_spec
from gpucloud.spec.secrets import SecretValues, parse_env, resolve
from gpucloud.vm.agent import sealed
from gpucloud.vm.agent.mask import Masker
from tests.support.cli import cli
from tests.support.local_runs import run_id_of, write_job
from tests.support.node_keys import OneNodeChannel, openssl_node_key

REPO = Path(__file__).resolve().parents[2]
JOB = "name: sec\nresources: {cloud: local}\nrun: 'true'\nsecrets: [HF_TOKEN]\nenv: {EPOCHS: 1}\n"


def test_x25519_rfc7748_vector() -> None:
    k = bytes.fromhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4")
    u = bytes.fromhex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c")
    assert sealed.x25519(k, u).hex() == "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"


def test_seal_opens_only_with_the_claimed_key(tmp_path: Path) -> None:
    pub, seed = openssl_node_key(tmp_path)
    other_pub, other_seed = openssl_node_key(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path)
    assert sealed.ed25519_public_to_x25519(base64.b64decode(pub)) == sealed.x25519_public(
        sealed.ed25519_seed_to_x25519(seed)
    )
    value = b"hf_" + secrets.token_hex(40).encode()
    blob = sealed.seal(pub, value)
    assert value not in blob and sealed.open_sealed(seed, blob) == value
    with pytest.raises(sealed.SealError):
        sealed.open_sealed(other_seed, blob)
    with pytest.raises(sealed.SealError):
        sealed.open_sealed(seed, blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(sealed.SealError):
        sealed.open_sealed(seed, blob[:60])
    assert sealed.open_sealed(other_seed, sealed.seal(other_pub, b"")) == b""


def test_mask_catches_a_value_split_across_reads() -> None:
    m = Masker([b"s3cr3t-value", b"abc"])
    out = m.feed(b"token=s3cr") + m.feed(b"3t-val") + m.feed(b"ue done ab") + m.feed(b"c! abx") + m.flush()
    assert out == b"token=*** done ***! abx"
    assert Masker([]).feed(b"plain") == b"plain"


def test_resolve_takes_values_from_flags_files_and_env(tmp_path: Path) -> None:
    spec = parse_spec(JOB, "job.yaml")
    with pytest.raises(UserError) as exc:
        resolve(spec, environ={})
    assert "HF_TOKEN" in exc.value.message and "nothing was launched" in exc.value.message
    got, values = resolve(spec, environ={"HF_TOKEN": "from-env"})
    assert dict(values) == {"HF_TOKEN": "from-env"} and got.secrets == ["HF_TOKEN"]
    f = tmp_path / "s.env"
    f.write_text("# comment\nexport HF_TOKEN='from-file'\nWANDB_API_KEY=\"w\"\n")
    got, values = resolve(
        spec, secrets=["EXTRA=x"], secret_files=[str(f)], env=["EPOCHS=5", "NEW=1"], environ={"HF_TOKEN": "env"}
    )
    assert dict(values) == {"HF_TOKEN": "from-file", "WANDB_API_KEY": "w", "EXTRA": "x"}
    assert got.secrets == ["HF_TOKEN", "WANDB_API_KEY", "EXTRA"] and got.env == {"EPOCHS": "5", "NEW": "1"}
    assert "from-file" not in repr(values) and "from-file" not in got.model_dump_json()
    with pytest.raises(UserError, match="is a secret"):
        resolve(spec, env=["HF_TOKEN=x"], environ={"HF_TOKEN": "v"})
    with pytest.raises(UserError, match="env too"):
        resolve(spec, secrets=["EPOCHS=2"], environ={"HF_TOKEN": "v"})
    with pytest.raises(UserError, match="NAME=VALUE"):
        parse_env(["EPOCHS"])
    with pytest.raises(UserError, match="reserved"):
        parse_env(["GPUCLOUD_X=1"])
    assert repr(SecretValues({"A": "zzz"})) == "SecretValues(['A'])"


def test_a_secret_in_env_too_is_refused_at_load() -> None:
    with pytest.raises(SpecError, match="secrets"):
        parse_spec(JOB.replace("EPOCHS: 1", "HF_TOKEN: x"), "job.yaml")


@pytest.mark.slow
def test_missing_secret_fails_before_launch(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_job(tmp_path / "job", {"name": "nosecret", "run": "true", "secrets": ["NOPE_TOKEN"]})
    env = {k: v for k, v in os.environ.items() if k != "NOPE_TOKEN"}
    proc = cli("run", str(job), env=env, cwd=tmp_path, timeout=None)
    assert proc.returncode == 2 and "NOPE_TOKEN" in proc.stderr and "Traceback" not in proc.stderr
    assert not (gpucloud_home / "local").exists()


@pytest.mark.slow
def test_secret_leaks_nowhere(tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    value = "hf_" + secrets.token_hex(24)
    other = "wk_" + secrets.token_hex(24)
    digest = hashlib.sha256(value.encode()).hexdigest()
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("HF_TOKEN", value)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    (tmp_path / "w.env").write_text(f"WANDB_API_KEY={other}\n")
    # The job prints the hash, the values themselves (masked), and a value split across two writes.
    run = (
        'printf %s "$HF_TOKEN" | sha256sum; echo "raw=$HF_TOKEN w=$WANDB_API_KEY"; '
        'printf %s "${HF_TOKEN:0:10}"; sleep 0.3; printf "%s\\n" "${HF_TOKEN:10}"; echo "E=$EPOCHS"'
    )
    job = write_job(tmp_path / "job", {"name": "leak", "run": run, "secrets": ["HF_TOKEN"], "env": {"EPOCHS": 1}})
    outputs: list[str] = []
    secret_file = str(tmp_path / "w.env")
    proc = cli("run", str(job), "--secret-file", secret_file, "--env", "EPOCHS=7", cwd=tmp_path, timeout=120)
    outputs += [proc.stdout, proc.stderr]
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc.stderr)
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert digest in log and "raw=*** w=***" in log and "E=7" in log
    proc = cli("run", str(job), "--json", "--secret", f"WANDB_API_KEY={other}", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    outputs += [proc.stdout, proc.stderr]
    for args in (
        ["status", run_id],
        ["ls"],
        ["logs", run_id],
        ["collect", run_id],
        ["plan", str(job)],
        ["validate", str(job)],
        ["render", str(job)],
        ["cost", run_id],
    ):
        for extra in ([], ["--json"]):
            if extra and args[0] in ("logs", "render", "cost"):
                continue
            p = cli(*args, *extra, cwd=tmp_path, timeout=60)
            outputs += [p.stdout, p.stderr]
    places = [p for p in gpucloud_home.rglob("*") if p.is_file()]
    places += [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "w.env"]
    assert summary in places and any(p.suffix in (".db", ".sqlite", ".sqlite3") for p in places)
    hits = [str(p) for p in places for v in (value, other) if v.encode() in p.read_bytes()]
    hits += [f"output {i}" for i, text in enumerate(outputs) for v in (value, other) if v in text]
    assert hits == []
    assert digest in "".join(outputs)


@pytest.mark.slow
def test_detached_run_gets_its_secrets_before_the_cli_returns(
    tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = "dt_" + secrets.token_hex(24)
    monkeypatch.setenv("DT_TOKEN", value)
    job = write_job(
        tmp_path / "job", {"name": "dsec", "run": 'printf %s "$DT_TOKEN" | sha256sum', "secrets": ["DT_TOKEN"]}
    )
    proc = cli("run", str(job), "--detach", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc.stderr)
    logs = cli("logs", run_id, "--follow", cwd=tmp_path, timeout=120)
    assert hashlib.sha256(value.encode()).hexdigest() in logs.stdout, logs.stdout + logs.stderr
    hits = [str(p) for p in gpucloud_home.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
    assert hits == [] and value not in proc.stdout + proc.stderr + logs.stdout + logs.stderr


def test_a_watcher_seals_to_a_claimed_node_its_dead_launcher_never_sealed_to(tmp_path: Path) -> None:
    """`watch` adopting an attempt: a node whose key is claimed and whose sealed object is there
    keeps it (not written again); one claimed with no object yet (its launcher died before the
    seal) gets its secrets from the watcher instead of waiting until its deadline."""
    pub, seed = openssl_node_key(tmp_path)
    channel = OneNodeChannel(pub)
    launch = SimpleNamespace(channel=channel, deadline=0)
    delivery = SecretDelivery("run-1", 1, {"TOKEN": "from-watcher"})
    delivery.adopt(launch)
    assert not delivery.done()
    assert delivery.step(launch) == [] and delivery.done()
    doc = json.loads(sealed.open_sealed(seed, channel.objects["runs/run-1/node-0/secrets.sealed"]))
    assert doc["env"] == {"TOKEN": "from-watcher"}
    channel.objects["runs/run-1/node-0/secrets.sealed"] = b"sealed by the launcher"
    again = SecretDelivery("run-1", 1, {"TOKEN": "from-watcher"})
    again.adopt(launch)
    assert again.done() and again.step(launch) == []
    assert channel.objects["runs/run-1/node-0/secrets.sealed"] == b"sealed by the launcher"
