"""The job-file fuzzer (tests/support/job_fuzzer.py): about 300 valid job files mutated into hostile shapes,
each through `validate`, `plan --json` and `render` in this process; no exit 70, no traceback, only
the documented exit codes. bench/fuzz_job_files.py runs 3,000+ with full-size bombs (BENCHMARKS.md)."""

from __future__ import annotations

import random
from pathlib import Path

import yaml

from tests.support import job_fuzzer

COUNT = 300


def test_hostile_job_files_give_documented_exits_only(tmp_path: Path) -> None:
    outcome = job_fuzzer.fuzz(COUNT, tmp_path, seed=2026, light=True)
    assert outcome.files == COUNT
    assert not outcome.failures, "\n\n".join(outcome.failures[:5])
    codes = {code for (_command, code) in outcome.codes}
    assert 0 in codes and 2 in codes  # both valid and refused files were generated
    assert sum(n for (command, _), n in outcome.codes.items() if command == "plan") == COUNT


def test_the_generator_is_deterministic_and_covers_its_shapes() -> None:
    first = list(job_fuzzer.generate(150, seed=5))
    assert first == list(job_fuzzer.generate(150, seed=5))
    assert first != list(job_fuzzer.generate(150, seed=6))
    texts = "\n".join(text for _, _, text in first)
    for shape in ("*a", "!!python/", "nan", "[[[[", "<<: *b", "::error::"):
        assert shape in texts, shape


def test_the_seeds_are_valid_job_files() -> None:
    seeds = job_fuzzer.seeds()
    assert len(seeds) >= 10 and any(p.name.startswith("readme") for p, _ in seeds)
    for _place, text in seeds:
        assert isinstance(yaml.safe_load(text), dict)


def test_the_once_crashing_memory_pair_is_in_the_generator_space() -> None:
    rng = random.Random(0)
    values = [job_fuzzer.hostile_value(rng) for _ in range(2000)]
    assert any(isinstance(v, list) and any(isinstance(i, list) for i in v) for v in values)
