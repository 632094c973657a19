"""resolve_reasoning_strength: the one rule from request fields to the template kwarg (P-EFF-1..4)."""

import pytest

from glimmer.errors import ConfigError, RequestError
from glimmer.protocol import (
    REASONING_EFFORTS,
    REASONING_STRENGTHS,
    builtin_template_source,
    render_chat,
    resolve_reasoning_strength,
    strength_for_effort,
)


@pytest.mark.parametrize(
    ("effort", "strength"),
    [
        ("none", "low"),
        ("minimal", "low"),
        ("low", "low"),
        ("medium", "medium"),
        ("high", "high"),
        ("xhigh", "xhigh"),
        ("NONE", "low"),
        ("High", "high"),
        ("XHigh", "xhigh"),
    ],
)
def test_reasoning_effort_maps_to_a_strength_case_insensitively(effort, strength):
    """P-EFF-2: none and minimal → low; low/medium/high/xhigh unchanged."""
    assert resolve_reasoning_strength(reasoning_effort=effort) == strength
    assert strength_for_effort(effort) == strength


@pytest.mark.parametrize("effort", ["max", "off", "", "ultra", 3, True])
def test_unknown_reasoning_effort_is_a_request_error_naming_the_accepted_values(effort):
    with pytest.raises(RequestError) as caught:
        resolve_reasoning_strength(reasoning_effort=effort)
    assert caught.value.param == "reasoning_effort"
    for accepted in REASONING_EFFORTS:
        assert accepted in str(caught.value)


@pytest.mark.parametrize("strength", ["low", "MEDIUM", "High", "xhigh"])
def test_explicit_reasoning_strength_is_passed_lower_case(strength):
    """P-EFF-3."""
    assert resolve_reasoning_strength(reasoning_strength=strength) == strength.lower()


@pytest.mark.parametrize("strength", ["none", "minimal", "max", "", 2])
def test_reasoning_strength_outside_the_card_vocabulary_is_a_request_error(strength):
    with pytest.raises(RequestError) as caught:
        resolve_reasoning_strength(reasoning_strength=strength)
    assert caught.value.param == "reasoning_strength"
    for accepted in REASONING_STRENGTHS:
        assert accepted in str(caught.value)


def test_reasoning_strength_beats_reasoning_effort_beats_enable_thinking_beats_the_default():
    """P-EFF-1 precedence."""
    assert (
        resolve_reasoning_strength(
            reasoning_strength="medium", reasoning_effort="high", enable_thinking=False, default="xhigh"
        )
        == "medium"
    )
    assert (
        resolve_reasoning_strength(reasoning_effort="high", enable_thinking=False, default="xhigh") == "high"
    )
    assert resolve_reasoning_strength(enable_thinking=False, default="xhigh") == "low"
    assert resolve_reasoning_strength(default="xhigh") == "xhigh"


def test_nothing_requested_passes_nothing_so_the_template_default_applies():
    """P-EFF-1: else nothing is passed and the template default `high` applies."""
    assert resolve_reasoning_strength() is None
    assert resolve_reasoning_strength(enable_thinking=True) is None
    rendered = render_chat(
        [{"role": "user", "content": "hi"}],
        template=builtin_template_source(),
        current_date="2026-01-01",
        reasoning_strength=resolve_reasoning_strength(),
    )
    assert "Reasoning strength: high." in rendered


def test_chat_template_kwargs_carry_each_knob_too():
    assert resolve_reasoning_strength(chat_template_kwargs={"reasoning_strength": "Medium"}) == "medium"
    assert resolve_reasoning_strength(chat_template_kwargs={"reasoning_effort": "minimal"}) == "low"
    assert resolve_reasoning_strength(chat_template_kwargs={"enable_thinking": False}) == "low"
    assert (
        resolve_reasoning_strength(
            reasoning_effort="high", chat_template_kwargs={"reasoning_strength": "medium"}
        )
        == "medium"
    )


def test_enable_thinking_false_counts_as_effort_none_never_as_strength_none():
    """P-EFF-2: there is no true off; `think=false` must not send strength `none`."""
    assert resolve_reasoning_strength(enable_thinking=False) == "low"


def test_the_same_knob_given_twice_with_different_values_is_a_request_error():
    with pytest.raises(RequestError) as caught:
        resolve_reasoning_strength(
            reasoning_strength="low", chat_template_kwargs={"reasoning_strength": "high"}
        )
    assert caught.value.param == "reasoning_strength"
    assert (
        resolve_reasoning_strength(
            reasoning_strength="low", chat_template_kwargs={"reasoning_strength": "LOW"}
        )
        == "low"
    )


def test_non_boolean_enable_thinking_is_a_request_error():
    with pytest.raises(RequestError) as caught:
        resolve_reasoning_strength(enable_thinking="no")
    assert caught.value.param == "enable_thinking"


def test_an_unsupported_server_default_is_a_config_error():
    with pytest.raises(ConfigError):
        resolve_reasoning_strength(default="turbo")


def test_system_prompt_mentioning_reasoning_wins_over_the_resolved_strength():
    """P-EFF-4: the system prompt is not edited to defeat the template's suppression rule."""
    messages = [{"role": "system", "content": "Reasoning effort: low."}, {"role": "user", "content": "hi"}]
    strength = resolve_reasoning_strength(reasoning_effort="xhigh")
    rendered = render_chat(messages, template=builtin_template_source(), reasoning_strength=strength)
    assert "Reasoning strength: low." in rendered
    assert "xhigh" not in rendered


@pytest.mark.parametrize(("name", "value"), [("reasoning_effort", "max"), ("reasoning_effort", 5),
                                             ("reasoning_strength", "none"), ("enable_thinking", "false")])
def test_a_bad_knob_inside_chat_template_kwargs_is_named_where_it_was_sent(name, value):
    """A knob sent only in chat_template_kwargs was refused naming the top-level field (`reasoning_effort='max' is not
    supported`, param `reasoning_effort`), which the client never sent; the error names chat_template_kwargs.NAME."""
    with pytest.raises(RequestError) as caught:
        resolve_reasoning_strength(chat_template_kwargs={name: value})
    assert caught.value.param == f"chat_template_kwargs.{name}"
    assert str(caught.value).startswith(f"chat_template_kwargs.{name}")
