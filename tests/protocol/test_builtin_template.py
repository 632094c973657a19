"""Glimmer's own chat template implements every rule of protocol.md §2.1 (P-TMPL-4).

Each test renders with `render_chat` and checks the exact text the rule prescribes; `render` also checks
that transformers' `apply_chat_template` machinery renders the same template identically, so tiny
checkpoints behave the same under HF.
"""

import datetime
import json

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from glimmer.protocol import DEFAULT_SPECIAL_TOKENS, ChatTemplateError, builtin_template_source, render_chat

transformers_templates = pytest.importorskip("transformers.utils.chat_template_utils")

TEMPLATE = builtin_template_source()
BOS = "<|begin_of_text|>"
DATE = "2026-03-04"
IDENTITY = "You are Glimmer, a careful and helpful AI assistant."
NO_TOOLS_RECIPIENTS = '# Valid recipients: "self", "user".'


def render(messages, *, tools=None, add_generation_prompt=False, **kwargs) -> str:
    kwargs.setdefault("current_date", DATE)
    ours = render_chat(
        messages, tools=tools, template=TEMPLATE, add_generation_prompt=add_generation_prompt, **kwargs
    )
    reference, _ = transformers_templates.render_jinja_template(
        [messages],
        tools=tools,
        chat_template=TEMPLATE,
        add_generation_prompt=add_generation_prompt,
        **{**DEFAULT_SPECIAL_TOKENS, **kwargs},
    )
    assert ours == reference[0]
    return ours


def synthesized_system(
    strength="high", *, date=DATE, cutoff="2026-01-04", tool_block=None, recipients=NO_TOOLS_RECIPIENTS
) -> str:
    block = f"\n\n{tool_block}" if tool_block is not None else ""
    return (
        f"<|start|>system<|message|>{IDENTITY}\nKnowledge cutoff: {cutoff}.\nCurrent date: {date}.\n\n"
        f"Reasoning strength: {strength}.{block}\n\n{recipients}<|eot|>"
    )


def after_system(rendered: str) -> str:
    """The rendered text after the bos and the first system message."""
    assert rendered.startswith(BOS)
    return rendered[rendered.index("<|eot|>") + len("<|eot|>") :]


def tool_block_of(rendered: str) -> str:
    start = rendered.index("Reasoning strength: ")
    start = rendered.index("\n\n", start) + 2
    return rendered[start : rendered.index("\n\n# Valid recipients")]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calendar.lookup",
            "description": "Events <b>on</b> a day ü",
            "parameters": {"type": "object", "properties": {"day": {"type": "string"}}},
        },
    },
    {"name": "lookup", "description": "Bare tool", "parameters": {"type": "object", "properties": {}}},
    {"type": "function", "function": {"name": "calendar.add", "description": "", "parameters": {}}},
]


# -- message shape, bos, generation prompt -----------------------------------------------------------------


def test_output_starts_with_one_bos_and_messages_have_the_framing_shape():
    """§2.1: bos first; a message is <|start|>ROLE[ to=R]<|message|>BODY then <|eot|> or <|eom|>.

    P-TMPL-5: exactly one bos, at position 0."""
    rendered = render([{"role": "user", "content": "hi"}])
    assert rendered == BOS + synthesized_system() + "<|start|>user<|message|>hi<|eot|>"
    assert rendered.count(BOS) == 1


def test_generation_prompt_is_exactly_start_assistant():
    """P-TMPL-8: the prompt ends `<|start|>assistant`: no space, no recipient."""
    rendered = render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert rendered.endswith("<|eot|><|start|>assistant")


# -- system block ------------------------------------------------------------------------------------------


def test_without_system_message_a_system_block_is_synthesized_first():
    """§2.1: identity, knowledge cutoff (default 2026-01-04), current date, blank line, strength,
    recipients."""
    rendered = render(
        [{"role": "user", "content": "hi"}], knowledge_cutoff="2025-06-30", current_date="2026-12-24"
    )
    assert rendered.startswith(BOS + synthesized_system(date="2026-12-24", cutoff="2025-06-30"))


def test_current_date_defaults_to_the_clock():
    """§2.1: without `current_date` the date line comes from strftime_now (clock-dependent unless pinned)."""
    before = datetime.date.today().isoformat()
    rendered = render_chat([{"role": "user", "content": "hi"}], template=TEMPLATE)
    after = datetime.date.today().isoformat()
    assert f"\nCurrent date: {before}." in rendered or f"\nCurrent date: {after}." in rendered


@pytest.mark.parametrize("strength", ["low", "medium", "high", "xhigh"])
def test_each_card_reasoning_strength_is_written_in_the_strength_line(strength):
    rendered = render([{"role": "user", "content": "hi"}], reasoning_strength=strength)
    assert rendered.startswith(BOS + synthesized_system(strength))


@pytest.mark.parametrize("strength", [None, ""])
def test_unset_or_empty_reasoning_strength_means_high(strength):
    kwargs = {} if strength is None else {"reasoning_strength": strength}
    assert "Reasoning strength: high." in render([{"role": "user", "content": "hi"}], **kwargs)


def test_reasoning_strength_is_inserted_verbatim_unvalidated():
    """§2.1: the template does not validate (P-EFF-3 validates in the server)."""
    assert "Reasoning strength: Max Effort!." in render(
        [{"role": "user", "content": "hi"}], reasoning_strength="Max Effort!"
    )


def test_each_system_message_renders_its_own_block_without_cutoff_or_date():
    rendered = render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        reasoning_strength="low",
    )
    assert rendered == (
        BOS
        + "<|start|>system<|message|>Be brief.\n\nReasoning strength: low.\n\n"
        + NO_TOOLS_RECIPIENTS
        + "<|eot|><|start|>user<|message|>hi<|eot|>"
    )


def test_two_system_messages_repeat_the_tools():
    rendered = render([{"role": "system", "content": "A"}, {"role": "system", "content": "B"}], tools=TOOLS)
    assert rendered.count("// Function schemas") == 2
    assert rendered.count('# Valid recipients: "self", "calendar.*", "lookup.*", "user".') == 2
    assert "Knowledge cutoff" not in rendered


def test_system_parts_are_rendered_like_user_parts():
    rendered = render(
        [
            {
                "role": "system",
                "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}],
            }
        ]
    )
    assert rendered.startswith(BOS + "<|start|>system<|message|>Part one. Part two.\n\nReasoning strength")


@pytest.mark.parametrize(
    ("system", "rewritten"),
    [
        ("Use reasoning effort: low.", "Use reasoning strength: low."),
        ("Reasoning effort: low.", "Reasoning strength: low."),
        ("Reasoning Effort: Low.", "Reasoning Strength: Low."),
        ("REASONING EFFORT: LOW.", "REASONING STRENGTH: LOW."),
        ("Reasoning strength: medium.", "Reasoning strength: medium."),
        ("rEaSoNiNg StReNgTh is up to you", "rEaSoNiNg StReNgTh is up to you"),
    ],
)
def test_system_text_about_reasoning_suppresses_the_kwarg_line(system, rewritten):
    """§2.1 suppression (v2): "reasoning effort" becomes "reasoning strength" (four casings); a system text
    mentioning reasoning strength in any case wins over the kwarg line (P-EFF-4: never edited away)."""
    rendered = render([{"role": "system", "content": system}], reasoning_strength="xhigh")
    assert rendered == BOS + f"<|start|>system<|message|>{rewritten}\n\n{NO_TOOLS_RECIPIENTS}<|eot|>"


def test_unrecognized_casing_of_reasoning_effort_is_not_rewritten_and_does_not_suppress():
    rendered = render([{"role": "system", "content": "rEaSoNiNg EfFoRt: low"}], reasoning_strength="xhigh")
    assert "rEaSoNiNg EfFoRt: low\n\nReasoning strength: xhigh." in rendered


def test_suppressed_strength_line_keeps_the_tool_block():
    rendered = render([{"role": "system", "content": "Reasoning strength: low."}], tools=TOOLS)
    assert rendered.startswith(
        BOS + "<|start|>system<|message|>Reasoning strength: low.\n\nTools are available"
    )
    assert rendered.count("Reasoning strength") == 1


# -- tool block and recipients -------------------------------------------------------------------------------


def test_tool_block_lists_namespaces_then_function_schemas_as_hf_json_lines():
    """§2.1: one metadata line per namespace (first-seen order, descriptions from the kwarg), one JSON line
    per tool; wrapped and bare tools alike; HF tojson (unicode and HTML kept as is)."""
    rendered = render(
        [{"role": "user", "content": "hi"}],
        tools=TOOLS,
        tool_namespace_descriptions={"calendar": "Your <calendar> ü"},
    )
    block = tool_block_of(rendered)
    lines = block.split("\n")
    metadata = lines.index("// Tool namespaces")
    schemas = lines.index("// Function schemas")
    assert lines[metadata + 1 : schemas] == [
        '{"name": "calendar", "description": "Your <calendar> ü"}',
        '{"name": "lookup", "description": ""}',
    ]
    assert lines[schemas + 1 : schemas + 4] == [
        json.dumps(
            {
                "name": "calendar.lookup",
                "description": "Events <b>on</b> a day ü",
                "parameters": TOOLS[0]["function"]["parameters"],
            },
            ensure_ascii=False,
        ),
        '{"name": "lookup", "description": "Bare tool", "parameters": {"type": "object", "properties": {}}}',
        '{"name": "calendar.add", "description": "", "parameters": {}}',
    ]


def test_tool_block_holds_the_atem_instructions_and_a_worked_example():
    block = tool_block_of(render([{"role": "user", "content": "hi"}], tools=TOOLS))
    instructions = block[: block.index("// Tool namespaces")]
    assert '<atem:invoke name="$FUNCTION_NAME">' in instructions
    assert "lists and objects as JSON" in instructions and "Whitespace" in instructions
    example = block[block.index("A worked example") :]
    assert 'to=demo.report\n\n<atem:function_calls>\n<atem:invoke name="demo.report">\n' in example
    assert example.endswith("</atem:parameter>\n</atem:invoke>\n</atem:function_calls>")


def test_synthesized_system_block_places_the_tool_block_between_strength_and_recipients():
    rendered = render([{"role": "user", "content": "hi"}], tools=TOOLS)
    block = tool_block_of(rendered)
    recipients = '# Valid recipients: "self", "calendar.*", "lookup.*", "user".'
    assert rendered.startswith(BOS + synthesized_system(tool_block=block, recipients=recipients))


def test_recipients_line_lists_namespaces_in_first_seen_order_and_bare_tools_as_name_star():
    """§2.1: a bare tool `lookup` appears as "lookup.*" (hence the model's `to=lookup.lookup`)."""
    tools = [{"name": "zeta.run"}, {"name": "lookup"}, {"name": "zeta.stop"}, {"name": "alpha"}]
    tools = [{**tool, "description": "", "parameters": {}} for tool in tools]
    rendered = render([{"role": "user", "content": "hi"}], tools=tools)
    assert '# Valid recipients: "self", "zeta.*", "lookup.*", "alpha.*", "user".<|eot|>' in rendered


@pytest.mark.parametrize("missing", ["description", "parameters"])
def test_tools_lacking_description_or_parameters_fail_to_render(missing):
    """§2.1: as under HF; normalize_tools fills them in beforehand (P-TMPL-6)."""
    tool = {"name": "f", "description": "d", "parameters": {}}
    del tool[missing]
    with pytest.raises(ChatTemplateError):
        render_chat([{"role": "user", "content": "hi"}], tools=[tool], template=TEMPLATE)


# -- user and tool messages ----------------------------------------------------------------------------------


def test_user_content_parts_render_text_patch_and_video_placeholders():
    """§2.1, P-TOK-4: image → <|patch|>, video → <|video|>, other part types (image_url too) → nothing."""
    content = [
        {"type": "text", "text": "Look: "},
        {"type": "image"},
        {"type": "image_url", "image_url": {}},
        {"type": "video"},
        {"type": "audio"},
        {"type": "text", "text": " done"},
    ]
    rendered = after_system(render([{"role": "user", "content": content}]))
    assert rendered == "<|start|>user<|message|>Look: <|patch|><|video|> done<|eot|>"
    assert "<|image|>" not in rendered


def test_null_user_content_renders_empty():
    assert after_system(render([{"role": "user", "content": None}])) == "<|start|>user<|message|><|eot|>"


def tool_result(**fields):
    return {"role": "tool", "content": "42", **fields}


def call(call_id, name, arguments=None):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments or {}}}


def test_tool_message_is_named_by_its_name_field():
    rendered = after_system(render([tool_result(name="calc", tool_call_id="c1")]))
    assert rendered == ('<|start|>tool calc<|message|><tool_output name="calc">\n42\n</tool_output><|eot|>')


def test_tool_message_without_name_takes_the_last_earlier_call_with_its_id():
    messages = [
        {"role": "assistant", "tool_calls": [call("c1", "first.fn")]},
        {"role": "assistant", "tool_calls": [call("c1", "second.fn"), call("c2", "other")]},
        tool_result(tool_call_id="c1"),
        {"role": "assistant", "tool_calls": [call("c1", "later.fn")]},
    ]
    rendered = after_system(render(messages))
    assert '<|start|>tool second.fn<|message|><tool_output name="second.fn">\n42\n' in rendered


def test_tool_messages_without_name_take_their_calls_ids_of_any_spelling():
    ids = ["_private", "__class__", "a b", "", "1"]
    messages = [{"role": "assistant", "tool_calls": [call(call_id, f"fn{n}") for n, call_id in enumerate(ids)]},
                *(tool_result(tool_call_id=call_id) for call_id in ids), tool_result(tool_call_id=1)]
    rendered = after_system(render(messages))
    assert [f'<|start|>tool fn{n}<|message|>' in rendered for n in range(len(ids))] == [True] * len(ids)
    assert rendered.endswith('<|start|>tool 1<|message|><tool_output name="1">\n42\n</tool_output><|eot|>')


def test_tool_messages_without_name_render_in_work_linear_in_the_conversation(monkeypatch):
    """An agent's tool results name their call by `tool_call_id` alone, as OpenAI clients send them; looking each
    one up in every earlier message made rendering quadratic (662 ms for 200 calls, 18 ms with names)."""
    lookups = []
    for method in ("getattr", "getitem", "call"):
        original = getattr(ImmutableSandboxedEnvironment, method)
        monkeypatch.setattr(ImmutableSandboxedEnvironment, method,
                            lambda *args, _original=original, **kwargs: lookups.append(1) or _original(*args, **kwargs))

    def work(calls: int) -> int:
        messages = [{"role": "user", "content": "go"}]
        for n in range(calls):
            messages += [{"role": "assistant", "tool_calls": [call(f"c{n}", "read")]},
                         tool_result(tool_call_id=f"c{n}")]
        lookups.clear()
        rendered = render_chat(messages, template=TEMPLATE, current_date=DATE)
        assert rendered.count("<|start|>tool read<|message|>") == calls
        return len(lookups)

    assert work(160) < 2.2 * work(80)


def test_tool_message_falls_back_to_the_raw_call_id_then_to_empty():
    assert '<|start|>tool c9<|message|><tool_output name="c9">' in render([tool_result(tool_call_id="c9")])
    assert '<|start|>tool <|message|><tool_output name="">\n42\n</tool_output><|eot|>' in render(
        [tool_result()]
    )


# -- assistant messages ------------------------------------------------------------------------------------


def test_assistant_reasoning_comes_first_as_a_self_message_ending_eom():
    messages = [{"role": "assistant", "reasoning_content": "Think.", "content": "Answer."}]
    assert after_system(render(messages)) == (
        "<|start|>assistant to=self<|message|>Think.<|eom|>"
        "<|start|>assistant to=user<|message|>Answer.<|eot|>"
    )


def test_reasoning_field_alias_is_rendered_like_reasoning_content():
    """P-TMPL-6 fills reasoning_content; transformers also aliases `reasoning` for templates."""
    messages = [{"role": "assistant", "reasoning": "Think.", "content": "A."}]
    assert "<|start|>assistant to=self<|message|>Think.<|eom|>" in render(messages)


def test_history_reasoning_is_never_stripped():
    messages = [
        {"role": "assistant", "reasoning_content": "R1", "content": "A1"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "reasoning_content": "R2", "content": "A2"},
    ]
    rendered = render(messages)
    assert "to=self<|message|>R1<|eom|>" in rendered and "to=self<|message|>R2<|eom|>" in rendered


def test_tool_calls_render_one_tool_message_each_and_drop_the_content():
    messages = [
        {
            "role": "assistant",
            "content": "dropped",
            "tool_calls": [call("a", "calendar.lookup", {"day": "Fri"}), call("b", "lookup", {"query": "x"})],
        },
        {"role": "tool", "tool_call_id": "a", "content": "r"},
    ]
    rendered = after_system(render(messages))
    assert rendered.startswith(
        "<|start|>assistant to=calendar.lookup<|message|><atem:function_calls>\n"
        '<atem:invoke name="calendar.lookup">\n<atem:parameter name="day">Fri</atem:parameter>\n'
        "</atem:invoke>\n</atem:function_calls><|eom|>"
        "<|start|>assistant to=lookup<|message|><atem:function_calls>\n"
        '<atem:invoke name="lookup">\n<atem:parameter name="query">x</atem:parameter>\n'
        "</atem:invoke>\n</atem:function_calls><|eot|><|start|>tool calendar.lookup"
    )
    assert "dropped" not in rendered


@pytest.mark.parametrize(
    ("next_message", "last_end"),
    [
        ({"role": "assistant", "content": "more"}, "<|eom|>"),
        ({"role": "tool", "tool_call_id": "a", "content": "r"}, "<|eot|>"),
        (None, "<|eot|>"),
    ],
)
def test_last_tool_call_ends_eom_only_when_an_assistant_message_follows(next_message, last_end):
    messages = [{"role": "assistant", "tool_calls": [call("a", "f")]}]
    if next_message is not None:
        messages.append(next_message)
    rendered = render(messages)
    assert f"</atem:function_calls>{last_end}" in rendered


def test_an_assistant_message_without_tool_calls_goes_to_its_recipient():
    messages = [{"role": "assistant", "recipient": "calendar.lookup", "content": "raw body"}]
    assert after_system(render(messages)) == "<|start|>assistant to=calendar.lookup<|message|>raw body<|eom|>"


@pytest.mark.parametrize(
    ("recipient", "end_turn", "terminator"),
    [
        (None, None, "<|eot|>"),
        ("user", None, "<|eot|>"),
        ("fn", None, "<|eom|>"),
        ("user", True, "<|eot|>"),
        ("user", False, "<|eom|>"),
        ("user", 0, "<|eom|>"),
        ("user", "", "<|eom|>"),
        ("user", "false", "<|eot|>"),
        ("fn", True, "<|eot|>"),
    ],
)
def test_end_turn_decides_the_terminator_of_an_assistant_message(recipient, end_turn, terminator):
    """§2.1: truthy end_turn → <|eot|>, falsy → <|eom|>; null means "true iff the recipient is user"."""
    message = {"role": "assistant", "content": "x"}
    if recipient is not None:
        message["recipient"] = recipient
    if end_turn is not None:
        message["end_turn"] = end_turn
    expected_recipient = recipient or "user"
    assert (
        after_system(render([message]))
        == f"<|start|>assistant to={expected_recipient}<|message|>x{terminator}"
    )


def test_history_atem_values_render_by_type():
    """§2.1: booleans true/false, None null, mappings and lists via tojson, others as their string form."""
    arguments = {
        "s": '  raw <b> "q"\n',
        "t": True,
        "f": False,
        "n": None,
        "i": 3,
        "x": 2.0,
        "o": {"k": "ü", "l": [1, None]},
        "a": ["x", 1.5],
        "st": "true",
    }
    rendered = render([{"role": "assistant", "tool_calls": [call("c", "f", arguments)]}])
    parameters = rendered[
        rendered.index('<atem:invoke name="f">\n') + len('<atem:invoke name="f">\n') : rendered.index(
            "</atem:invoke>"
        )
    ]
    assert parameters == (
        '<atem:parameter name="s">  raw <b> "q"\n</atem:parameter>\n'
        '<atem:parameter name="t">true</atem:parameter>\n'
        '<atem:parameter name="f">false</atem:parameter>\n'
        '<atem:parameter name="n">null</atem:parameter>\n'
        '<atem:parameter name="i">3</atem:parameter>\n'
        '<atem:parameter name="x">2.0</atem:parameter>\n'
        '<atem:parameter name="o">{"k": "ü", "l": [1, null]}</atem:parameter>\n'
        '<atem:parameter name="a">["x", 1.5]</atem:parameter>\n'
        '<atem:parameter name="st">true</atem:parameter>\n'
    )


def test_tool_call_arguments_as_a_json_string_are_a_template_error():
    """§2.1: non-mapping arguments raise (normalize_messages decodes them first, P-TMPL-6)."""
    with pytest.raises(ChatTemplateError, match="arguments must be an object"):
        render_chat([{"role": "assistant", "tool_calls": [call("c", "f", '{"a": 1}')]}], template=TEMPLATE)


@pytest.mark.parametrize("role", ["developer", "function", "critic"])
def test_other_roles_render_nothing(role):
    rendered = render([{"role": role, "content": "invisible"}, {"role": "user", "content": "hi"}])
    assert "invisible" not in rendered
    assert after_system(rendered) == "<|start|>user<|message|>hi<|eot|>"
