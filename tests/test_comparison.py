"""A learner's function run next to the reference: values, errors and stubs compared, every difference named."""

from __future__ import annotations

import pytest
import torch

from course_utils.exercises import comparison, verdicts


def _parse_int(text):
    if not isinstance(text, str):
        raise TypeError("text must be a string")
    return int(text)


INT_CASES = [
    comparison.Case("plain", ("12",)),
    comparison.Case("negative", ("-3",)),
    comparison.Case("a word", ("seven",)),
    comparison.Case("not a string", (None,)),
]


def test_agreeing_functions_have_no_differences():
    assert comparison.compare_with_reference(lambda t: _parse_int(t), _parse_int, INT_CASES) == []


def test_a_wrong_value_is_reported_with_both_outcomes():
    differences = comparison.compare_with_reference(lambda t: abs(_parse_int(t)), _parse_int, INT_CASES)
    assert [str(d) for d in differences] == ["negative: the reference returns -3, yours returns 3"]


def test_raising_where_the_reference_returns_and_the_reverse_are_differences():
    def learner(text):
        if text == "12":
            raise KeyError("oops")
        return 0

    labels = {d.label: d for d in comparison.compare_with_reference(learner, _parse_int, INT_CASES)}
    assert set(labels) == {"plain", "negative", "a word", "not a string"}
    assert labels["plain"].yours == "raises KeyError: 'oops'"
    assert labels["a word"].reference.startswith("raises ValueError") and labels["a word"].yours == "returns 0"


def test_refusing_with_another_bad_input_error_passes_unless_the_kind_is_demanded():
    def learner(text):
        if text is None:
            raise ValueError("no text")
        return int(text)

    assert comparison.compare_with_reference(learner, _parse_int, INT_CASES) == []
    differences = comparison.compare_with_reference(learner, _parse_int, INT_CASES, errors="kind")
    assert [d.label for d in differences] == ["not a string"]


def test_refusing_with_an_error_outside_the_bad_input_family_is_a_difference():
    def learner(text):
        if text is None:
            raise RuntimeError("no text")
        return int(text)

    differences = comparison.compare_with_reference(learner, _parse_int, INT_CASES)
    assert [d.label for d in differences] == ["not a string"]


def test_an_unknown_errors_rule_is_refused():
    with pytest.raises(ValueError, match="errors must be"):
        comparison.compare_with_reference(_parse_int, _parse_int, INT_CASES, errors="exact")


def _stub_body(text):
    """A learner copy's function: only the docstring and the stub."""
    # YOUR CODE HERE
    ...


def _raises_not_implemented(text):
    raise NotImplementedError()


def _forgets_one_return(text):
    if text is None:
        raise TypeError("text must be a string")
    if text.startswith("-"):
        int(text)
    else:
        return int(text)


@pytest.mark.parametrize("stub", [None, ..., _stub_body, _raises_not_implemented], ids=repr)
def test_a_stub_reads_not_answered_yet_and_the_reference_is_handed_back(stub, capsys):
    assert not comparison.check_against_reference("t.1", stub, _parse_int, INT_CASES, hint="parse it")
    out = capsys.readouterr().out
    assert "not answered yet" in out and "differs" not in out
    assert verdicts.hand_back("t.1", False, stub, _parse_int, "reference") is _parse_int
    assert "continues with the package's reference" in capsys.readouterr().out


def test_a_function_that_forgets_one_return_is_wrong_not_unanswered(capsys):
    assert not comparison.check_against_reference("t.1", _forgets_one_return, _parse_int, INT_CASES, hint="h")
    out = capsys.readouterr().out
    assert "not answered" not in out and "negative: the reference returns -3, yours returns None" in out


def test_a_right_function_is_handed_back_itself(capsys):
    assert comparison.check_against_reference("t.1", _parse_int, _parse_int, INT_CASES, hint="h")
    assert verdicts.hand_back("t.1", True, _parse_int, int, "int") is _parse_int
    assert "continues with yours" in capsys.readouterr().out


def test_a_subclass_of_a_builtin_error_is_matched_by_the_builtin():
    from course_utils.lesson.formatting import GSM8KFormatError

    def reference(text):
        raise GSM8KFormatError("bad")

    def learner(text):
        raise ValueError("also bad")

    assert comparison.compare_with_reference(learner, reference, INT_CASES[:1]) == []


def test_reference_args_give_the_reference_its_own_form_of_the_case():
    case = comparison.Case("sum", ((1, 2, 3),), reference_args=(1, 2, 3))
    assert comparison.compare_with_reference(sum, lambda *numbers: sum(numbers), [case]) == []
    assert comparison.compare_with_reference(len, lambda *numbers: sum(numbers), [case]) != []


def test_differences_inside_containers_name_the_place():
    (difference,) = comparison.compare_with_reference(
        lambda: {"prompt": [{"role": "user"}], "answer": "1,080"},
        lambda: {"prompt": [{"role": "user"}], "answer": "1080"},
        [comparison.Case("row 3", ())],
    )
    assert difference.label == "row 3, at ['answer']"
    assert (difference.reference, difference.yours) == ("returns '1080'", "returns '1,080'")


@pytest.mark.parametrize(
    ("expected", "got", "same"),
    [
        (torch.tensor([1.0, 2.0]), [1.0, 2.0], False),  # the next cells call tensor methods on it
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7]), True),
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]), False),
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0, 3.0]), False),
        (torch.tensor([1.0]), "one", False),
        (0.5, 0.5000001, True),
        (0.5, True, False),
        ("72", 72, False),
        ((1, "a"), [1, "a"], True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
    ],
)
def test_same_values(expected, got, same):
    assert comparison.same_values(expected, got) is same


def test_check_against_reference_prints_the_verdict(capsys, monkeypatch):
    monkeypatch.setattr(verdicts, "_FAILED_TRIES", {})
    assert comparison.check_against_reference("x", _parse_int, _parse_int, INT_CASES, hint="h")
    assert "same result as the reference on all 4 cases" in capsys.readouterr().out
    assert not comparison.check_against_reference("x", lambda t: 0, _parse_int, INT_CASES, hint="use int()", show=1)
    out = capsys.readouterr().out
    assert "differs from the reference on 4 of 4 cases" in out and "... and 3 more" in out and "use int()" not in out
    assert not comparison.check_against_reference("x", lambda t: 0, _parse_int, INT_CASES, hint="use int()", show=1)
    assert "Hint: use int()" in capsys.readouterr().out
    assert not comparison.check_against_reference("x", None, _parse_int, INT_CASES, hint="h")
    assert "not answered" in capsys.readouterr().out
    assert not comparison.check_against_reference("x", "int", _parse_int, INT_CASES, hint="h")


def test_the_packages_own_function_is_not_an_answer(capsys):
    import functools

    from course_utils.training.grpo_config import check_generation_batch

    for borrowed in (check_generation_batch, functools.partial(check_generation_batch, 8)):
        assert not comparison.check_against_reference("04.4", borrowed, check_generation_batch, [], hint="h")
        assert "the package's own course_utils.training.grpo_config.check_generation_batch" in capsys.readouterr().out



# --- each function on its own copy; an answer that changes its input in place is wrong ---------------------------


def _sorted_copy(values):
    return sorted(values)


def _sorts_in_place(values):
    values.sort()
    return values


def _edits_messages_in_place(messages):
    for message in messages:
        message["content"] = message["content"].strip()
    return [message["content"] for message in messages]


def test_an_answer_that_changes_its_input_in_place_is_a_difference_though_its_value_is_right():
    cases = [comparison.Case("unsorted", ([3, 1, 2],))]
    (difference,) = comparison.compare_with_reference(_sorts_in_place, _sorted_copy, cases)
    assert difference.yours.startswith("changes its input in place, at [0][0]"), str(difference)
    assert cases[0].args == ([3, 1, 2],), "the case itself is never handed to either function"


def test_the_place_changed_is_named_inside_nested_messages():
    messages = [{"role": "assistant", "content": " 72 "}]
    (difference,) = comparison.compare_with_reference(
        _edits_messages_in_place, lambda m: [x["content"].strip() for x in m], [comparison.Case("padded", (messages,))])
    assert "at [0][0]['content']" in str(difference), str(difference)
    assert messages[0]["content"] == " 72 "


def test_keeps_inputs_false_lets_a_map_function_fill_in_its_row():
    cases = [comparison.Case("unsorted", ([3, 1, 2],))]
    assert comparison.compare_with_reference(_sorts_in_place, _sorted_copy, cases, keeps_inputs=False) == []


def test_call_on_copy_says_where_a_function_changed_its_keyword_arguments():
    kwargs = {"completions": [[{"role": "assistant", "content": "b"}], [{"role": "assistant", "content": "a"}]]}

    def sorts(completions, **rest):
        completions.sort(key=lambda c: c[0]["content"])
        return [0.0] * len(completions)

    assert comparison.call_on_copy(sorts, kwargs) == ([0.0, 0.0], "['completions'][0][0]['content']")
    assert kwargs["completions"][0][0]["content"] == "b"
    assert comparison.call_on_copy(lambda completions: [1.0], kwargs) == ([1.0], None)
