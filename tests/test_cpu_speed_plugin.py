"""course_utils.cpu_speed as one plug-in: installed for a block, everything put back however the block ends.

A tiny random Qwen2 model (from config) trains a real ``GRPOTrainer`` for a step or two, so each test takes
seconds. Checked: what is patched inside the block and restored after it ends, raises or is interrupted; the
switch; the version gate; ``parts=``; and that importing the package patches nothing.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings

import pytest
import torch
import trl.trainer.utils as trl_utils
from peft import LoraConfig, get_peft_model
from transformers import AttentionInterface, AttentionMaskInterface

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.cpu_speed import lean_decoder, versions
from course_utils.cpu_speed.adapters import base_layer
from course_utils.cpu_speed.attention import GROUPED_SDPA
from course_utils.cpu_speed.packed_linear import StackedLinear
from course_utils.cpu_speed.probe import lean_layer_mismatch
from course_utils.lesson.models import build_tiny_random_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.fixture(scope="module")
def tokenizer(offline_model_and_tokenizer):
    return offline_model_and_tokenizer[1]


@pytest.fixture(autouse=True)
def speedups_on(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "ci")
    monkeypatch.delenv(cpu_speed.ENV_VAR, raising=False)
    monkeypatch.setattr(cpu_speed, "_WARNED", set())
    yield
    assert cpu_speed.installed() == (), "a test left the plug-in installed"


def grpo_trainer(tokenizer, tmp_path, reward, steps=1, **settings):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = build_tiny_random_model(num_layers=2)
    prompts = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(4)]
    data = Dataset.from_list([{"prompt": p, "answer": "2"} for p in prompts])
    config = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        gradient_checkpointing=False,  # as the course's CPU profiles (make_grpo_config)
        seed=0,
    )
    for name, value in settings.items():  # GRPOConfig settings a test changes
        setattr(config, name, value)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, layers_to_transform=[1], task_type="CAUSAL_LM")
    return GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=lora,
    )


def snapshot(model):
    """Everything the plug-in may patch, as it is now."""
    modules = list(model.modules())
    return {
        "instance forwards": [type(m).__name__ for m in modules if "forward" in m.__dict__],
        "instance generate": [type(m).__name__ for m in modules if "generate" in m.__dict__],
        "hooks": sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in modules),
        "compact rule": trl_utils._use_triton,
        "log-prob function": trl_utils._ChunkedLogProbFunction,
        "attention registry": GROUPED_SDPA in AttentionInterface._global_mapping,
        "mask registry": GROUPED_SDPA in AttentionMaskInterface._global_mapping,
        "multinomial": torch.multinomial,
        "installed": cpu_speed.installed(),
    }


def length_reward(completions, **_):
    return [float(len(c[0]["content"])) for c in completions]


def assert_restored(trainer, before):
    assert snapshot(trainer.model) == before
    names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    assert "_ReleaseFreedMemoryEachStep" not in names


def test_training_ends_with_everything_put_back_and_it_ran_installed(tokenizer, tmp_path):
    seen = []

    def watching(completions, **kwargs):
        seen.append(snapshot(trainer.model))
        return length_reward(completions)

    trainer = grpo_trainer(tokenizer, tmp_path, watching, steps=2)
    before = snapshot(trainer.model)
    assert before["installed"] == () and not before["instance generate"]
    with cpu_speed.enabled(trainer) as speedups:
        assert speedups.active == cpu_speed.PARTS
        names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
        assert "_ReleaseFreedMemoryEachStep" in names
        trainer.train()
    assert trainer.state.global_step == 2
    during = seen[0]
    assert set(during["installed"]) == set(cpu_speed.PARTS)
    assert during["compact rule"] is not before["compact rule"]
    assert during["log-prob function"] is not before["log-prob function"]
    assert during["instance generate"], "the trainer's model samples through group generation"
    assert_restored(trainer, before)


def test_an_error_in_training_puts_everything_back(tokenizer, tmp_path):
    def failing(completions, **_):
        raise RuntimeError("reward failed")

    trainer = grpo_trainer(tokenizer, tmp_path, failing)
    before = snapshot(trainer.model)
    with pytest.raises(RuntimeError, match="reward failed"), cpu_speed.enabled(trainer):
        trainer.train()
    assert_restored(trainer, before)


def test_an_interrupt_mid_step_puts_everything_back_and_the_next_run_trains(tokenizer, tmp_path):
    calls = []

    def interrupted_once(completions, **_):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return length_reward(completions)

    trainer = grpo_trainer(tokenizer, tmp_path, interrupted_once)
    before = snapshot(trainer.model)
    with pytest.raises(KeyboardInterrupt), cpu_speed.enabled(trainer):
        trainer.train()
    assert_restored(trainer, before)
    handle = cpu_speed.enabled(trainer)  # the handle form, in the same process, after the interrupt
    handle.__enter__()
    try:
        assert handle.active == cpu_speed.PARTS
        trainer.train()
    finally:
        handle.remove()
    assert trainer.state.global_step == 1 and len(calls) >= 2
    assert_restored(trainer, before)


def test_entering_twice_installs_once_and_remove_is_idempotent(tokenizer, tmp_path):
    trainer = grpo_trainer(tokenizer, tmp_path, length_reward)
    before = snapshot(trainer.model)
    handle = cpu_speed.enabled(trainer)
    with handle, handle:
        assert sorted(cpu_speed.installed()) == sorted(cpu_speed.PARTS)
        with cpu_speed.enabled(trainer) as second:  # another handle on the same model: nothing twice
            assert second.active == ()
            assert sorted(cpu_speed.installed()) == sorted(cpu_speed.PARTS)
    handle.remove()
    assert_restored(trainer, before)


def test_an_sft_trainer_gets_only_the_freed_memory_reuse(tokenizer, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    data = Dataset.from_list([{"text": "2 + 2 = 4"}] * 2)
    config = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, max_steps=1, report_to=[])
    trainer = SFTTrainer(model=build_tiny_random_model(), args=config, train_dataset=data, processing_class=tokenizer)
    with cpu_speed.enabled(trainer) as speedups:
        assert speedups.active == ("reuse_freed_memory",)
    assert cpu_speed.installed() == ()


# --- The switch ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "false", "OFF", "No"])
def test_the_environment_switch_turns_it_off(tokenizer, tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv(cpu_speed.ENV_VAR, value)
    assert not cpu_speed.switched_on()
    trainer = grpo_trainer(tokenizer, tmp_path, length_reward)
    with cpu_speed.enabled(trainer) as speedups:
        assert speedups.active == () and cpu_speed.installed() == ()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "off" in out and cpu_speed.ENV_VAR in out


def test_the_profile_field_and_device_turn_it_off(tokenizer, tmp_path, monkeypatch):
    assert cpu_speed.switched_on("ci") and cpu_speed.switched_on("cpu")
    assert not cpu_speed.switched_on("gpu") and not cpu_speed.switched_on("colab-t4")
    off = get_profile("ci").override(cpu_speedups=False)
    assert not cpu_speed.switched_on(off)
    trainer = grpo_trainer(tokenizer, tmp_path, length_reward)
    with cpu_speed.enabled(trainer, profile=off) as speedups:
        assert speedups.active == ()
    monkeypatch.setenv(cpu_speed.ENV_VAR, "1")  # on where the profile allows: not over the profile
    assert not cpu_speed.switched_on(off) and cpu_speed.switched_on("ci")


def test_a_bad_switch_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(cpu_speed.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match=rf"{cpu_speed.ENV_VAR}='maybe'.*0, false, off, no"):
        cpu_speed.switched_on()


def test_for_generation_restores_the_model_and_is_a_no_op_when_off(monkeypatch):
    model = build_tiny_random_model()
    ids = torch.tensor([[1, 2, 3]] * 2)
    with cpu_speed.for_generation(model):
        assert "generate" in model.__dict__ and cpu_speed.installed() == ("for_generation",)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False)
    assert out.shape == (2, 5) and "generate" not in model.__dict__ and cpu_speed.installed() == ()
    monkeypatch.setenv(cpu_speed.ENV_VAR, "0")
    with cpu_speed.for_generation(model):
        assert "generate" not in model.__dict__


# --- A part that fails to install ----------------------------------------------------------------------

RENAMED = "module 'trl.trainer.utils' has no attribute '_ChunkedLogProbFunction'"


@contextlib.contextmanager
def failing_install():
    """A part whose install raises, as one would after a library renamed what it patches."""
    raise AttributeError(RENAMED)
    yield  # pragma: no cover


def one_line_said(capsys) -> str:
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("CPU speed-ups")]
    return line


def test_a_part_that_fails_to_install_leaves_plain_trl_and_says_so_in_one_line(tokenizer, tmp_path, monkeypatch,
                                                                                capsys):
    seen = []

    def watching(completions, **kwargs):
        seen.append(snapshot(trainer.model))
        return length_reward(completions)

    trainer = grpo_trainer(tokenizer, tmp_path, watching)
    before = snapshot(trainer.model)
    broken = cpu_speed.PARTS[3]  # installed after three others, which must come out again
    monkeypatch.setitem(cpu_speed._CONTEXTS, broken, lambda trainer, model: failing_install())
    with cpu_speed.enabled(trainer) as speedups:
        assert speedups.active == () and cpu_speed.installed() == ()
        trainer.train()
    assert seen and all(state == before for state in seen), "training ran as plain TRL"
    assert_restored(trainer, before)
    line = one_line_said(capsys)
    assert line.startswith("CPU speed-ups: off, training runs as plain TRL: the part " + broken)
    assert f"AttributeError: {RENAMED}" in line and "report" in line and "/issues" in line
    assert all(f"{name} " in line for name in versions.TESTED), line  # the versions to report with it


def test_for_generation_that_fails_to_install_generates_plainly_and_says_so(monkeypatch, capsys):
    model = build_tiny_random_model()
    ids = torch.tensor([[1, 2, 3]] * 2)
    monkeypatch.setattr(cpu_speed, "_group_generation", lambda model: failing_install())
    with cpu_speed.for_generation(model):
        assert "generate" not in model.__dict__ and cpu_speed.installed() == ()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False)
    assert out.shape == (2, 5)
    assert "the part group_generation failed to install" in one_line_said(capsys)


# --- The version gate, the probe and parts= ----------------------------------------------------------


def test_untested_versions_warn_once_naming_them_and_train_as_plain_trl(tokenizer, tmp_path, monkeypatch):
    installed = {**versions.installed_versions(), "trl": "1.99.0", "torch": "2.99.1"}
    monkeypatch.setattr(versions, "installed_versions", lambda: installed)
    trainer = grpo_trainer(tokenizer, tmp_path, length_reward)
    with pytest.warns(UserWarning) as caught, cpu_speed.enabled(trainer) as speedups:
        assert speedups.active == () and cpu_speed.installed() == ()
    message = str(caught[0].message)
    assert "trl 1.99.0 (tested: trl>=1.16,<1.17)" in message and "torch 2.99.1" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second time: no warning
        with cpu_speed.enabled(trainer) as speedups:
            assert speedups.active == ()


def test_the_tested_versions_pass_the_gate_and_a_missing_internal_fails_it(monkeypatch):
    assert versions.gate() is None, "the installed versions are the tested ones (constraints.txt)"
    monkeypatch.delattr(trl_utils, "_use_triton")
    assert "trl.trainer.utils._use_triton" in versions.gate()


def test_a_probe_mismatch_warns_and_falls_back_to_plain_trl(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_speed, "lean_layer_mismatch", lambda model: "q_norm not reproduced")
    trainer = grpo_trainer(tokenizer, tmp_path, length_reward)
    with pytest.warns(UserWarning, match="q_norm not reproduced"), cpu_speed.enabled(trainer) as speedups:
        assert speedups.active == ()
    with cpu_speed.enabled(trainer, parts=["score_completions_only"]) as speedups:  # the probe is not needed
        assert speedups.active == ("score_completions_only",)


def test_parts_choose_some_and_unknown_names_are_refused(tokenizer, tmp_path):
    trainer = grpo_trainer(tokenizer, tmp_path, length_reward)
    with pytest.raises(ValueError, match=r"Unknown CPU speed-up part.*'group_generatoin'"):
        cpu_speed.enabled(trainer, parts=["group_generatoin"])
    with cpu_speed.enabled(trainer, parts=["keep_logit_tiles", "score_completions_only"]) as speedups:
        assert speedups.active == ("score_completions_only", "keep_logit_tiles")
        assert "generate" not in trainer.model.__dict__


def test_importing_the_package_patches_nothing():
    code = (
        "import torch; multinomial = torch.multinomial\n"
        "import course_utils.cpu_speed as c\n"
        "from transformers import AttentionInterface, AttentionMaskInterface\n"
        "from course_utils.cpu_speed.attention import GROUPED_SDPA\n"
        "assert GROUPED_SDPA not in AttentionInterface._global_mapping\n"
        "assert GROUPED_SDPA not in AttentionMaskInterface._global_mapping\n"
        "assert torch.multinomial is multinomial and c.installed() == ()\n"
        "print('clean')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "clean" in result.stdout, result.stderr


def test_gradient_checkpointing_leaves_out_the_parts_that_rewrite_the_training_pass(tokenizer, tmp_path, capsys):
    """TRL's GRPOConfig turns gradient checkpointing on by default: a learner's own config may have it."""
    checkpointed = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}}
    trainer = grpo_trainer(tokenizer, tmp_path, length_reward, **checkpointed)
    with cpu_speed.enabled(trainer) as speedups:
        said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("CPU speed-ups:")]
        assert speedups.active == tuple(p for p in cpu_speed.PARTS if p not in cpu_speed.NOT_WITH_CHECKPOINTING)
        trainer.train()
    assert len(said) == 1 and said[0].startswith("CPU speed-ups: on (")
    line = said[0]
    assert all(part in line for part in cpu_speed.NOT_WITH_CHECKPOINTING) and "gradient_checkpointing=False" in line
    with cpu_speed.enabled(trainer, parts=["score_shared_prefix_once"]) as speedups:
        said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("CPU speed-ups:")]
    assert speedups.active == () and said[-1].startswith("CPU speed-ups: off (score_shared_prefix_once left out")


def test_an_adapter_added_after_a_first_probe_is_probed_again(monkeypatch):
    """The probe's answer is kept per model and what it depends on: adapters added later are checked too."""
    # a rewrite that leaves the adapters out of the merged weights: right without adapters, wrong with them
    monkeypatch.setattr(lean_decoder, "merged_stack", lambda group: StackedLinear([base_layer(m) for m in group]))
    probes = []
    monkeypatch.setattr(cpu_speed, "lean_layer_mismatch", lambda m: probes.append(m) or lean_layer_mismatch(m))
    model = build_tiny_random_model(num_layers=2)
    for _ in range(2):
        with cpu_speed.for_generation(model):
            assert cpu_speed.installed() == ("for_generation",)
    assert len(probes) == 1, "probed once while nothing changed"
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))  # adapters injected into model
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)
    with pytest.warns(UserWarning, match="differs from the layer's own forward"), cpu_speed.for_generation(model):
        assert cpu_speed.installed() == ()
    assert len(probes) == 2
