"""training.tool_lab: the tool tokenizer, the warm start's traces, the tool run's config, the completion budget in
TRL's tool loop, and a whole ci tool lab with tools= whose call and failure frequencies are read from its log."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import get_json_schema
from trl.chat_template_utils import parse_response, qwen2_5_chat_template, supports_tool_calling

from course_utils.core.profiles import get_profile
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.offline_model import materialize_offline_model
from course_utils.lesson.tiny_qwen import save_tiny_qwen
from course_utils.lesson.tool_use import calculator, tool_use_reward
from course_utils.training import tool_lab
from course_utils.training.run_logs import load_log_history
from course_utils.training.tool_lab import (
    TRACE_MAX_TOKENS,
    completion_budget,
    make_tool_grpo_config,
    plain_trace_example,
    run_tool_lab,
    share_over_budget,
    tool_reward_funcs,
    tool_run_dir,
    tool_run_profile,
    tool_tokenizer,
    tool_training_dataset,
    trace_completion_tokens,
    trace_dataset,
    trace_rows,
    trace_tokens,
)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return AutoTokenizer.from_pretrained(materialize_offline_model())


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    return save_tiny_qwen(tmp_path_factory.mktemp("tiny") / "qwen")


def test_smollm2s_own_template_renders_no_tool_turns_and_the_tool_tokenizer_says_so(smollm2_tokenizer):
    assert not supports_tool_calling(smollm2_tokenizer)
    with pytest.raises(ValueError, match="does not render tool calls"):
        tool_tokenizer(smollm2_tokenizer, get_profile("ci").override(tool_chat_template="own"))


def test_the_cpu_profiles_put_trls_qwen25_template_on_smollm2(smollm2_tokenizer):
    own_template = smollm2_tokenizer.chat_template
    tokenizer = tool_tokenizer(smollm2_tokenizer, "cpu")
    assert tokenizer.chat_template == qwen2_5_chat_template and supports_tool_calling(tokenizer)
    assert tokenizer.eos_token == "<|im_end|>" and smollm2_tokenizer.chat_template == own_template  # a copy
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>")
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "48/2"}}\n</tool_call><|im_end|>'
    header = tokenizer("<|im_start|>assistant\n")["input_ids"]
    parsed = parse_response(
        tokenizer, tokenizer(call)["input_ids"], prefix=header
    )  # TRL's parser, set by the tokenizer
    assert parsed["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "48/2"}}


@pytest.mark.parametrize("name", ["colab-t4", "gpu"])
def test_gpu_profiles_keep_qwen25s_own_template(name, tiny_qwen):
    qwen = AutoTokenizer.from_pretrained(tiny_qwen)  # Qwen2.5-Instruct's template, as the Hub's model carries it
    assert get_profile(name).tool_chat_template == "own"
    assert tool_tokenizer(qwen, name).chat_template == qwen.chat_template


@pytest.mark.parametrize(
    "tokenizer, changes, error, message",
    [("tokenizer", {"tool_chat_template": "qwen"}, ValueError, "expected one of"),
     ("not a tokenizer", {}, TypeError, "transformers tokenizer"), (None, {}, TypeError, "transformers tokenizer")],
)  # fmt: skip
def test_the_tool_tokenizer_refuses_bad_input(smollm2_tokenizer, tokenizer, changes, error, message):
    given = smollm2_tokenizer if tokenizer == "tokenizer" else tokenizer
    with pytest.raises(error, match=message):
        tool_tokenizer(given, get_profile("ci").override(**changes))


def test_the_traces_hold_prompt_calls_and_the_tools_schema(gsm8k_env, smollm2_tokenizer):
    tokenizer = tool_tokenizer(smollm2_tokenizer, "cpu")
    profile = get_profile("ci").override(tool_warm_start_examples=3)
    dataset = trace_dataset(profile, tokenizer)
    assert dataset.column_names == ["prompt", "completion", "tools"] and len(dataset) == 3
    assert json.loads(dataset[0]["tools"])[0]["function"]["name"] == "calculator"
    assert all(any(m["role"] == "tool" for m in row["completion"]) for row in dataset)
    assert all(trace_tokens(tokenizer, row) <= TRACE_MAX_TOKENS for row in dataset)
    rows = trace_rows(profile, tokenizer)
    assert rows == sorted(rows) and rows[-1] < 7473


def test_the_warm_start_on_traces_learns_the_assistants_turns_only(gsm8k_env, smollm2_tokenizer, tmp_path, monkeypatch):
    """SFT's completion mask covers the tool's answers too; the warm start on traces sets ``assistant_only_loss``, so
    the calculator's results carry no loss (as GRPO's ``tool_mask`` leaves them out) and the calls do."""
    from course_utils.lesson.models import build_tiny_random_model
    from course_utils.training.warm_start import has_tool_turns, warm_start_settings, warm_start_trainer

    tokenizer = tool_tokenizer(smollm2_tokenizer, "cpu")
    profile = get_profile("ci").override(tool_warm_start_examples=2)
    traces = trace_dataset(profile, tokenizer)
    assert has_tool_turns(traces.to_list()) and warm_start_settings(profile, traces)["assistant_only_loss"]
    assert not has_tool_turns([{"completion": [{"role": "assistant", "content": "<answer>\n3\n</answer>"}]}])
    model = build_tiny_random_model(vocab_size=len(tokenizer), hidden_size=16, num_layers=1)
    monkeypatch.chdir(tmp_path)  # the trainer's output folder (nothing is saved)
    trainer = warm_start_trainer(model, tokenizer, profile, traces)
    row = trainer.train_dataset[0]
    pairs = list(zip(row["input_ids"], row["labels"], strict=True))
    learned = tokenizer.decode([token for token, label in pairs if label != -100])
    left_out = tokenizer.decode([token for token, label in pairs if label == -100])
    results = [m["content"] for m in traces[0]["completion"] if m["role"] == "tool"]
    assert results and "<tool_call>" in learned and "<answer>" in learned and "<tool_response>" not in learned
    assert all(f"<tool_response>\n{result}\n</tool_response>" in left_out for result in results), left_out


@pytest.mark.parametrize(
    "lengths, budget, share",
    [([10, 20, 30, 40], 25, 0.5), ([10], 10, 0.0), ([11], 10, 1.0), ((n for n in [5, 50]), 5, 0.5)],
)
def test_the_share_over_budget_counts_the_lengths_a_budget_would_cut(lengths, budget, share):
    assert share_over_budget(lengths, budget) == share


@pytest.mark.parametrize(
    "lengths, budget, error",
    [([], 10, ValueError), ([10], 0, ValueError), ([10], 2.5, ValueError), ([10], True, ValueError),
     ([-1], 10, ValueError), ([1.5], 10, ValueError), ("123", 10, TypeError), ({"a": 1}, 10, TypeError)],
)  # fmt: skip
def test_the_share_over_budget_refuses_bad_input(lengths, budget, error):
    with pytest.raises(error):
        share_over_budget(lengths, budget)


TRACE = {
    "prompt": [{"role": "system", "content": "Answer in XML."}, {"role": "user", "content": "Half of 48, plus 48?"}],
    "completion": [
        {"role": "assistant", "content": "<reasoning>\nHalf is 48/2 = ", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "48/2"}}}]},
        {"role": "tool", "name": "calculator", "content": "24"},
        {"role": "assistant", "content": "24. Then 24+48 = 72.\n</reasoning>\n<answer>\n72\n</answer>"},
    ],
    "tools": json.dumps([get_json_schema(calculator)]),
}  # fmt: skip


def test_a_traces_completion_counts_its_calls_and_the_tools_answers_as_trl_does(smollm2_tokenizer):
    """Everything after the prompt's assistant header to the last end of turn: the budget TRL's tool loop fills."""
    tokenizer = tool_tokenizer(smollm2_tokenizer, "cpu")
    tokens = trace_completion_tokens(tokenizer, TRACE)
    prompt = tokenizer.apply_chat_template(TRACE["prompt"], tools=[calculator], add_generation_prompt=True,
                                           return_dict=True)["input_ids"]  # fmt: skip
    whole = tokenizer.apply_chat_template([*TRACE["prompt"], *TRACE["completion"]], tools=[calculator],
                                          return_dict=True)["input_ids"]  # fmt: skip
    assert tokens == len(whole) - len(prompt) - 1  # the template's newline after the last end of turn is not generated
    assert tokenizer.decode(whole[len(prompt) : len(prompt) + tokens]).endswith("</answer><|im_end|>")
    plain = plain_trace_example(TRACE)
    assert 0 < trace_completion_tokens(tokenizer, plain) < tokens - 40  # no call (~33 tokens), no tool turn (~24)
    with pytest.raises(TypeError, match="warm-start example"):
        trace_completion_tokens(tokenizer, {"prompt": TRACE["prompt"]})


def test_the_plain_trace_is_the_same_text_with_each_result_written_instead_of_called():
    plain = plain_trace_example(TRACE)
    assert set(plain) == {"prompt", "completion"} and plain["prompt"] == TRACE["prompt"]  # no tools block
    assert plain["completion"] == [{"role": "assistant", "content": "<reasoning>\nHalf is 48/2 = 24. Then 24+48 = 72."
                                    "\n</reasoning>\n<answer>\n72\n</answer>"}]  # fmt: skip
    with pytest.raises(TypeError, match="warm-start trace"):
        plain_trace_example({"prompt": []})


@pytest.mark.parametrize("name", ["cpu", "cpu-long"])
def test_the_profiles_completion_budget_holds_its_warm_start_traces(gsm8k_env, smollm2_tokenizer, name):
    """The budget is set from the traces: at least 90% of them fit, or GRPO cuts what the warm start taught."""
    profile = get_profile(name)
    tokenizer = tool_tokenizer(smollm2_tokenizer, profile)
    lengths = [trace_completion_tokens(tokenizer, row) for row in trace_dataset(profile, tokenizer)]
    assert share_over_budget(lengths, tool_run_profile(profile).max_completion_length) <= 0.1, sorted(lengths)


def test_the_tool_run_trains_on_notebook_04s_problem_list_and_no_trace_is_one_of_them(gsm8k_env, smollm2_tokenizer,
                                                                                      capsys):
    """The list's problems are ones a warm start solves sometimes: right answers, and the tool reward with them,
    occur in 16 steps. The traces walk back from the end of the split past them, and say how many they passed."""
    tokenizer = tool_tokenizer(smollm2_tokenizer, "cpu")
    raw = load_gsm8k("train", verbose=False)
    traces = trace_rows("cpu", tokenizer)
    assert "of GRPO's problems passed over" in capsys.readouterr().out
    listed = tool_lab.listed_rows(get_profile("cpu"), raw)
    assert listed and not listed & set(traces)
    dataset = tool_training_dataset("cpu", tokenizer, traces[0])
    questions = {raw[i]["question"] for i in listed}
    assert len(dataset) == get_profile("cpu").train_size and set(dataset["question"]) <= questions
    assert tool_lab.listed_rows(get_profile("ci"), raw) == set()  # no list: the rows before the traces


def test_the_same_recipe_without_the_tool_has_its_own_folder_and_refuses_a_non_bool(gsm8k_env):
    assert tool_run_dir("ci", with_tool=False).name == "tools-ci-no-tool" and tool_run_dir("ci").name == "tools-ci"
    with pytest.raises(TypeError, match="with_tool"):
        run_tool_lab("ci", with_tool="no")


def test_trace_rows_refuse_a_profile_without_traces_or_with_too_many(gsm8k_env, smollm2_tokenizer):
    tokenizer = tool_tokenizer(smollm2_tokenizer, "cpu")
    with pytest.raises(ValueError, match="no traces"):
        trace_rows(get_profile("cpu").override(tool_warm_start_examples=0), tokenizer)
    with pytest.raises(ValueError, match=r"Only \d+ train rows"):
        trace_rows(get_profile("ci").override(tool_warm_start_examples=10_000, tool_max_solution_steps=1), tokenizer)


@pytest.mark.parametrize("name", ["ci", "cpu", "colab-t4"])  # gpu's bf16 config builds only beside a GPU
def test_the_tool_config_adds_the_tool_loop_and_the_tool_reward(name, tmp_path):
    profile = get_profile(name)
    config = make_tool_grpo_config(profile, tmp_path)
    run = tool_run_profile(profile)
    assert config.max_tool_calling_iterations == profile.max_tool_calling_iterations
    assert config.max_completion_length == run.max_completion_length and config.max_steps == run.max_steps
    assert len(config.reward_weights) == len(tool_reward_funcs()) and tool_reward_funcs()[-1] is tool_use_reward
    assert run.name == f"{name}-tools" and run.problem_list is None


def test_the_tool_run_takes_its_own_rate_where_the_profile_names_one():
    cpu, ci = get_profile("cpu"), get_profile("ci")
    assert tool_run_profile(cpu).learning_rate == cpu.tool_learning_rate != cpu.learning_rate
    assert ci.tool_learning_rate is None and tool_run_profile(ci).learning_rate == ci.learning_rate


def test_a_round_after_a_tool_answer_asks_only_for_the_budget_left(tiny_qwen):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    prompt = tokenizer("<|im_start|>user\nHi<|im_end|>\n", add_special_tokens=False)["input_ids"] + header
    asked = []
    original = model.generate

    def counting(*args, **kwargs):
        asked.append(kwargs.get("max_new_tokens"))
        return original(*args, **kwargs)

    model.generate = counting
    settings = {"do_sample": False}
    with completion_budget(model, tokenizer, max_completion_length=20):
        first = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)))
        later = prompt + [11] * 15  # 15 tokens of completion already written
        model.generate(input_ids=torch.tensor([later]), attention_mask=torch.ones(1, len(later)), **settings)
    assert asked[0] is None and asked[1] == 5 and first.shape[1] > len(prompt)
    assert model.generate is counting  # put back


def test_a_ci_tool_lab_trains_with_tools_and_logs_call_and_failure_frequencies(gsm8k_env, capsys):
    from course_utils import cpu_speed
    from course_utils.training.tool_lab import run_tool_lab

    result = run_tool_lab("ci", speedups=cpu_speed)
    said = capsys.readouterr().out
    assert "CPU speed-ups: on" in said and "group_generation" in said and "Warm-start traces" in said
    logged = [row for row in load_log_history(result.run_dir / "log_history.csv") if "tools/call_frequency" in row]
    assert len(logged) == result.trainer.state.global_step == get_profile("ci").max_steps
    for row in logged:
        assert row["tools/call_frequency"] >= 0.0 and 0.0 <= row["tools/failure_frequency"] <= 1.0
        assert "rewards/tool_use_reward/mean" in row
    saved = AutoTokenizer.from_pretrained(result.final_dir)
    assert saved.chat_template == qwen2_5_chat_template  # the tool model carries its template
    assert "calculator" in saved.apply_chat_template([{"role": "user", "content": "Q"}], tools=[calculator],
                                                     tokenize=False)  # fmt: skip


@pytest.mark.parametrize("name", ["ci", "cpu", "cpu-long"])
def test_the_warm_start_on_traces_keeps_its_own_recipe(name):
    """The traces keep their own number of passes (three: one left most completions unformatted), whatever notebook
    04's profile says (ci's warm start trains one)."""
    from course_utils.training.tool_lab import TOOL_WARM_START_EPOCHS, tool_warm_start_profile

    profile = get_profile(name)
    warm = tool_warm_start_profile(profile)
    assert warm.warm_start_examples == profile.tool_warm_start_examples
    assert warm.warm_start_epochs == TOOL_WARM_START_EPOCHS == 3.0
    assert warm.warm_start_learning_rate == profile.warm_start_learning_rate
