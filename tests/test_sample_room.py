"""The bundled sample serves an offline room: every profile fits it, shrunk and said; the `cpu` warm start runs.

With no ``GSM8K_DIR`` and the Hub offline, ``load_gsm8k`` reads ``data/gsm8k_sample.jsonl`` (48 train problems). A
profile that wants more (the `cpu` lab: 256 prompts + 32 warm-start examples, from a problem list made on GSM8K)
shrinks to it in one printed line; real data too small for a profile stays an error.
"""

from __future__ import annotations

import pytest

from course_utils.core.profiles import PROFILES, get_profile
from course_utils.lesson.data import from_bundled_sample, load_gsm8k
from course_utils.training.grpo_prompts import fit_to_data, training_dataset
from course_utils.training.run import load_model_for_training
from course_utils.training.warm_start import warm_start, warm_start_dataset


@pytest.fixture
def sample_room(monkeypatch, tmp_path):
    """No GSM8K folder, the Hub offline: the bundled sample is the data; outputs in a private folder."""
    monkeypatch.setenv("GSM8K_DIR", "")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "outputs"))
    with pytest.warns(UserWarning, match="bundled"):
        return load_gsm8k("train", formatted=True, verbose=False)


def test_the_sample_is_recognised_and_real_data_is_not(sample_room, gsm8k_dir):
    assert from_bundled_sample(sample_room) and from_bundled_sample(sample_room.select(range(3)))
    assert not from_bundled_sample(load_gsm8k("train", gsm8k_dir, limit=5, verbose=False))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_fits_the_sample_and_says_so(name, sample_room, capsys):
    profile = get_profile(name)
    fitted = fit_to_data(profile, sample_room)
    assert fitted.warm_start_examples + fitted.train_size <= len(sample_room)
    assert fitted.problem_list is None
    said = capsys.readouterr().out
    wanted = profile.train_size + profile.warm_start_examples
    if wanted > len(sample_room) or profile.problem_list:
        assert said.count("\n") == 1 and "The bundled sample has 48 train problems" in said and "GSM8K_DIR" in said
    else:
        assert fitted == profile and said == ""


def test_real_data_keeps_the_profile_as_it_is(gsm8k_dir, capsys):
    profile = get_profile("cpu")
    assert fit_to_data(profile, load_gsm8k("train", gsm8k_dir, limit=40, verbose=False)) == profile
    assert capsys.readouterr().out == ""


def test_the_cpu_warm_start_runs_on_the_sample_and_grpo_gets_the_other_problems(sample_room, capsys):
    profile = get_profile("cpu")
    examples = warm_start_dataset(profile)
    prompts = training_dataset(profile, tokenizer=load_model_for_training(profile)[1])
    said = capsys.readouterr().out
    assert "The bundled sample has 48 train problems" in said and f"from list {profile.problem_list!r}" in said
    warm_questions = {row["prompt"][-1]["content"] for row in examples}
    assert len(examples) == 16 and len(prompts) > 0
    assert not warm_questions & {row["prompt"][-1]["content"] for row in prompts}, "no warm-start problem is a prompt"


@pytest.mark.long  # two SFT steps of the cpu lab (about 30 s): make test-slow
def test_the_cpu_warm_start_trains_on_the_sample(sample_room, capsys):
    profile = get_profile("cpu")
    model, tokenizer = load_model_for_training(profile)
    warm_start(model, tokenizer, profile)
    assert "warm start: 16 examples, 2 steps" in capsys.readouterr().out
