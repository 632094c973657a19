"""The held-out evaluation: what counts as a well-formed turn and a right call, and a run on the embedded model."""

from __future__ import annotations

import pytest

from glimmer import LLM
from glimmer.default_model import default_model_dir
from glimmer.protocol import ParsedOutput, ToolCall
from glimmer.train_nano.corpus import TurnExpectation
from glimmer.train_nano.evaluate import (
    KIND_CYCLE,
    calls_verdict,
    evaluate,
    framing_is_well_formed,
    held_out_conversations,
    parse_turn,
)
from glimmer.train_nano.names import is_held_out

CALL = (' to=self<|message|>Look it up.<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>\n'
        '<atem:invoke name="get_weather">\n<atem:parameter name="city">Oslo</atem:parameter>\n</atem:invoke>\n'
        '</atem:function_calls><|eot|>')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]


@pytest.mark.parametrize("text", [CALL, " to=user<|message|>Hello!<|eot|>",
                                  " to=self<|message|>a<|eom|><|start|>assistant to=user<|message|>b<|eot|>"])
def test_framed_turns_are_well_formed(text):
    assert framing_is_well_formed(text)
    assert parse_turn(text, "stop", TOOLS).well_formed


@pytest.mark.parametrize("text", [
    " to=user<|message|>Hello!",  # never ended
    " to=user<|message|>Hello!<|eom|>",  # the turn does not end
    "Hello!<|eot|>",  # no header
    " to=user<|message|>a<|eom|> to=user<|message|>b<|eot|>",  # a headerless switch
    " to=self<|message|>a<|eom|><|start|>user<|message|>b<|eot|>",  # another role
])
def test_unframed_turns_are_not(text):
    assert not parse_turn(text, "stop", TOOLS).well_formed


def test_a_truncated_turn_is_not_well_formed():
    assert not parse_turn(CALL, "length", TOOLS).well_formed


def test_a_call_is_right_when_names_match_and_arguments_validate():
    expected = TurnExpectation("call", [("get_weather", {"city": "Oslo"})])
    assert calls_verdict(parse_turn(CALL, "stop", TOOLS).parsed, expected, TOOLS) == (True, True)
    other_city = ParsedOutput(None, None, [ToolCall("c", "get_weather", '{"city": "Bergen"}')])
    assert calls_verdict(other_city, expected, TOOLS) == (True, False)
    wrong_type = ParsedOutput(None, None, [ToolCall("c", "get_weather", '{"city": "Oslo", "days": "two"}')])
    assert calls_verdict(wrong_type, expected, TOOLS) == (False, False)
    wrong_tool = ParsedOutput(None, None, [ToolCall("c", "get_time", '{"city": "Oslo"}')])
    assert calls_verdict(wrong_tool, expected, TOOLS) == (False, False)


def test_the_evaluation_set_declares_only_held_out_names_and_mixes_every_kind():
    conversations = held_out_conversations(len(KIND_CYCLE))
    assert {c.last_turn.kind for c in conversations} == {"call", "plain", "refusal"}
    assert any(len(c.last_turn.calls) == 2 for c in conversations)  # a parallel call
    assert all(is_held_out(t["function"]["name"]) for c in conversations for t in c.tools or [])


def test_the_embedded_model_speaks_the_protocol_on_a_few_held_out_turns(same_cpu_kernels):
    """Framing, declared names (an undeclared one is a parser warning, so ill-formed), the right one of several
    declared tools, no call where none fits and answers from the result. The rates over 500 conversations are
    measured by `python -m glimmer.train_nano.evaluate` (README), not here."""
    llm = LLM(str(default_model_dir()), progress=False)
    conversations = [c for c in held_out_conversations(20) if c.last_turn.kind != "call"][:2]
    conversations += [c for c in held_out_conversations(40) if c.last_turn.kind == "call" and len(c.tools) >= 4][:3]
    report = evaluate(llm, conversations, max_tokens=300)
    assert report.well_formed.hits == report.well_formed.total == 8, report.failures
    assert report.right_call.hits == report.right_call.total == 3, report.failures
    assert report.no_call.hits == report.no_call.total == 2, report.failures
    assert report.answer_uses_result.hits == report.answer_uses_result.total == 3, report.failures


@pytest.mark.parametrize("module", ["glimmer.train_nano.__main__", "glimmer.train_nano.evaluate"])
def test_every_option_of_the_retraining_commands_has_help(module):
    """`--seed`, `--conversations`, `--prompts`, `--device`, ... printed no help in `--help`."""
    import importlib

    parser = importlib.import_module(module).build_parser()
    missing = [action.dest for action in parser._actions if not action.help]
    assert missing == []


def test_a_share_of_no_conversations_prints_no_nan():
    """`--prompts 12` held no plain answer, and the report printed `nan%  (0/0)`."""
    from glimmer.train_nano.evaluate import Tally

    assert "nan" not in str(Tally()) and "(0/0" in str(Tally())
    tally = Tally()
    tally.add(True)
    tally.add(False)
    assert str(tally) == " 50.0%  (1/2)"


def test_the_evaluation_without_jsonschema_names_the_extra_before_generating(monkeypatch, capsys):
    """Without jsonschema the evaluation generated its first pass (minutes on a CPU), then failed with a
    ModuleNotFoundError traceback."""
    import sys

    from glimmer.engine import llm as llm_module
    from glimmer.train_nano import evaluate

    monkeypatch.setitem(sys.modules, "jsonschema", None)
    monkeypatch.setattr(llm_module, "LLM", lambda *args, **kwargs: pytest.fail("loaded the model"))
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["--prompts", "2"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "jsonschema" in err and 'pip install -e ".[train]"' in err


@pytest.mark.parametrize(("argv", "words"), [(["/no/such/model"], "CheckpointError: model '/no/such/model'"),
                                             (["--device", "cdua"], "device='cdua'")])
def test_a_wrong_model_or_device_of_the_evaluation_is_one_line(capsys, argv, words):
    from glimmer.train_nano import evaluate

    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.strip().splitlines() == [err.strip()]
    assert err.startswith("python -m glimmer.train_nano.evaluate: error: ") and words in err


@pytest.mark.parametrize(("argv", "words"), [(["--prompts", "-3"], "--prompts -3: give 1 or more"),
                                             (["--prompts", "0"], "--prompts 0: give 1 or more"),
                                             (["--show-failures", "-1"], "--show-failures -1: give 0 or more")])
def test_a_count_of_the_evaluation_below_its_least_is_one_line_before_loading(monkeypatch, capsys, argv, words):
    """--prompts -3 reported '-3 held-out conversations' over empty tallies, and --show-failures -1 printed every
    failure but the last (a slice)."""
    from glimmer.engine import llm as llm_module
    from glimmer.train_nano import evaluate

    monkeypatch.setattr(llm_module, "LLM", lambda *args, **kwargs: pytest.fail("loaded the model"))
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err == f"python -m glimmer.train_nano.evaluate: error: {words}\n"
