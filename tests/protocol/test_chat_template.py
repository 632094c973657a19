"""ChatTemplate / render_chat: HF apply_chat_template semantics in a sandbox (P-TMPL-2, P-TMPL-3)."""

import dataclasses
import datetime
import decimal
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glimmer.errors import GlimmerError, RequestError
from glimmer.protocol import (
    DEFAULT_SPECIAL_TOKENS,
    ChatTemplate,
    ChatTemplateError,
    builtin_template_source,
    chat_template,
    compiled_template,
    render_chat,
)
from glimmer.protocol.chat_template import check_chat_template

transformers_templates = pytest.importorskip("transformers.utils.chat_template_utils")

USER = [{"role": "user", "content": "hi"}]


def reference_render(template: str, messages, *, tools=None, add_generation_prompt=True, **kwargs) -> str:
    """transformers 5.23's own rendering, the oracle (special tokens passed as kwargs, as it does)."""
    rendered, _ = transformers_templates.render_jinja_template(
        [messages],
        tools=tools,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **{**DEFAULT_SPECIAL_TOKENS, **kwargs},
    )
    return rendered[0]


# Templates exercising the environment's settings and helpers one by one.
ENVIRONMENT_TEMPLATES = {
    "trim_and_lstrip_blocks": "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n"
    "    {% endif %}\n{% endfor %}",
    "loop_controls": "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
    "{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}{% endfor %}",
    "tojson_keeps_html_and_unicode": "{{ tools | tojson }}|{{ messages | tojson(indent=2) }}",
    "tojson_options": "{{ {'b': 1, 'a': [1, 2]} | tojson(separators=(',', ':'), sort_keys=true) }}",
    "namespace_and_dict": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% endfor %}{{ ns.n }}{{ dict(a=1) | tojson }}",
    "generation_block": "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% endfor %}",
    "special_tokens_and_defaults": "{{ bos_token }}{{ eos_token }}{{ pad_token }}|{{ documents }}|"
    "{{ tools }}|"
    "{{ add_generation_prompt }}",
    "reasoning_aliases": "{% for m in messages %}{{ m.reasoning_content }}/{{ m.thinking }}/"
    "{{ m.reasoning }};"
    "{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(ENVIRONMENT_TEMPLATES))
def test_renders_exactly_as_transformers_apply_chat_template(name):
    """P-TMPL-2: trim/lstrip blocks, loop controls, HF tojson, namespaces, {% generation %}, tokens."""
    template = ENVIRONMENT_TEMPLATES[name]
    messages = [
        {"role": "system", "content": "sys <b>&amp;</b> é"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "a", "reasoning": "why"},
        {"role": "assistant", "content": "b", "thinking": "how"},
    ]
    tools = [
        {"type": "function", "function": {"name": "f", "description": "<tag> & 'quote' ü", "parameters": {}}}
    ]
    assert render_chat(messages, tools=tools, template=template) == reference_render(
        template, messages, tools=tools
    )


def test_tojson_does_not_escape_html_like_jinjas_builtin_filter():
    """P-TMPL-2 / §2.1: HF tojson is json.dumps(ensure_ascii=False), unsorted, no HTML escaping."""
    rendered = render_chat([], tools=[{"z": "<a href='x'>&</a>", "a": "ü"}], template="{{ tools | tojson }}")
    assert rendered == json.dumps([{"z": "<a href='x'>&</a>", "a": "ü"}], ensure_ascii=False)


def test_raise_exception_becomes_chat_template_error_carrying_the_template_message():
    """P-TMPL-2: template errors reach the client (HTTP 400) with the template's own message."""
    with pytest.raises(ChatTemplateError) as caught:
        render_chat(USER, template="{{ raise_exception('Only user and assistant roles are supported!') }}")
    assert caught.value.template_message == "Only user and assistant roles are supported!"
    assert "Only user and assistant roles are supported!" in str(caught.value)
    assert isinstance(caught.value, GlimmerError) and isinstance(caught.value, ValueError)


def test_syntax_error_is_a_chat_template_error_with_the_line():
    with pytest.raises(ChatTemplateError, match="line 2"):
        ChatTemplate("ok\n{% if %}")


def test_python_errors_inside_the_template_become_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="TypeError"):
        render_chat(USER, template="{{ 'a' + 1 }}")


@pytest.mark.parametrize("depth", [100, 3000])
def test_a_source_past_the_compilers_recursion_limit_is_a_chat_template_error(depth):
    """P-TMPL-2: any template that fails to compile is a ChatTemplateError (HTTP 400 on the server), not a crash."""
    with pytest.raises(ChatTemplateError, match="RecursionError"):
        ChatTemplate("{{ " + "[" * depth + "1" + "]" * depth + " }}")


class _StrictTokenizer:
    """The probe's needs of a tokenizer; like the engine's, it cannot encode a lone surrogate (TypeError)."""

    special_tokens = {"bos_token": "<|begin_of_text|>"}
    bos_token = prompt_bos_token = "<|begin_of_text|>"
    prompt_bos_token_id = 1

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        text.encode("utf-8")  # UnicodeEncodeError on a lone surrogate
        return [1] + [2] * (len(text) - len(self.bos_token))


def test_a_template_writing_a_lone_surrogate_fails_its_check_as_a_chat_template_error_not_a_tokenizer_crash():
    """A jinja string escape writes a lone surrogate, which no tokenizer takes (the engine's raised a TypeError inside
    the check a request's or LLM.chat's own template passes). A message's lone surrogate is left to the engine, which
    refuses it naming `prompt`."""
    template = ChatTemplate('{{ bos_token }}ok{{ "\\ud800" }}<|start|>assistant')
    with pytest.raises(ChatTemplateError, match=r"lone surrogate \('\\ud800' at character 19\)"):
        check_chat_template(template, _StrictTokenizer())
    check_chat_template(ChatTemplate('{{ bos_token }}{{ "\\u00e9" }}<|start|>assistant'), _StrictTokenizer())


@pytest.mark.parametrize(
    "escape",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
        "{{ namespace(_hidden=1) }}",
        "{{ dict(_x=1) }}",
        "{% set x = messages.append(1) %}",
        "{{ messages[0].update({'role': 'x'}) }}",
    ],
)
def test_template_is_sandboxed_untrusted_code(escape):
    """P-TMPL-2: the template cannot reach Python internals nor modify its inputs."""
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError):
        render_chat(messages, template=escape)
    assert messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "probe", ["{{ raise_exception.__globals__ }}", "{{ strftime_now.__code__ }}", "{{ messages.__class__ }}"]
)
def test_unsafe_attributes_render_as_undefined(probe):
    assert render_chat(USER, template=probe) == ""


def test_strftime_now_formats_the_local_clock():
    before = datetime.datetime.now().strftime("%Y-%m-%d")
    rendered = render_chat([], template="{{ strftime_now('%Y-%m-%d') }}")
    after = datetime.datetime.now().strftime("%Y-%m-%d")
    assert rendered in (before, after)


def test_template_sees_plain_copies_of_rich_inputs():
    """Inputs are rebuilt from JSON types, so a template reaches no methods of caller objects."""

    class Opaque:
        pass

    class Name(str):
        def shout(self):  # pragma: no cover - must be unreachable from the template
            return "LEAK"

    messages = [{"role": "user", "content": Name("hi"), "extra": Opaque()}]
    assert (
        render_chat(messages, template="{{ messages[0].content }}|{{ messages[0].extra }}") == "hi|<Opaque>"
    )
    with pytest.raises(ChatTemplateError):
        render_chat(messages, template="{{ messages[0].content.shout() }}")


class _Text(str):
    def __str__(self):  # the copy is the string's own characters, never what a subclass says it is
        return "SUBCLASS"


class _Number(int):
    pass


class _Mapping(dict):
    def items(self):  # read as a Mapping: its own items, in order
        return reversed(list(super().items()))


class _List(list):
    pass


@dataclasses.dataclass
class _Point:
    x: object
    y: object


class _Opaque:
    pass


_CONTROL = ["<|start|>", "<|message|>", "<|eot|>"]
_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=6),
    st.sampled_from(_CONTROL), st.builds(_Text, st.text(max_size=4)), st.builds(_Number, st.integers()),
    st.just(_Opaque()), st.just(datetime.date(2026, 1, 1)))
_KEYS = st.one_of(st.text(max_size=4), st.sampled_from(_CONTROL), st.builds(_Text, st.text(max_size=3)),
                  st.integers(), st.none(), st.booleans(), st.floats(allow_nan=False), st.tuples(st.integers()))
_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(_KEYS, inner, max_size=4),
    st.builds(_Mapping, st.dictionaries(_KEYS, inner, max_size=3)), st.builds(_List, st.lists(inner, max_size=3)),
    st.builds(_Point, inner, inner)), max_leaves=24)


def _typed(value):
    """`value` with the exact type of every part spelled out (floats by repr: NaN is not equal to itself)."""
    if type(value) in (dict, _Mapping):
        return type(value).__name__, [(_typed(key), _typed(item)) for key, item in value.items()]
    if type(value) in (list, tuple, _List):
        return type(value).__name__, [_typed(item) for item in value]
    return type(value).__name__, repr(value)


@settings(max_examples=400, deadline=None)
@given(value=_VALUES)
def test_the_fast_copy_of_json_types_is_the_general_copy(value):
    """`_plain` copies exact dicts, lists, strings and scalars by their exact type, the rest through `_plain_any`
    (subclasses, tuples, non-str keys, dataclasses, objects): the copy, its types and the strings passed to `text`,
    in order (the control-token placeholders are numbered by it), are those of the general copy alone."""
    def copy(plain):
        seen = []

        def text(string):
            seen.append(string)
            return f"[{string}]"

        original = chat_template._plain
        chat_template._plain = plain
        try:
            return _typed(plain(value, text)), seen
        finally:
            chat_template._plain = original

    assert copy(chat_template._plain) == copy(chat_template._plain_any)


def test_empty_tools_are_passed_as_none():
    """P-TMPL-3: `tools` is null when there are none."""
    assert render_chat(USER, tools=[], template="{{ tools is none }}") == "True"
    assert render_chat(USER, tools=None, template="{{ tools is none }}") == "True"


def test_fixed_variables_and_kwargs_reach_the_template():
    """P-TMPL-3: messages, tools, add_generation_prompt, bos/eos tokens, reasoning_strength, then kwargs."""
    template = (
        "{{ messages | length }} {{ tools | length }} {{ add_generation_prompt }} {{ bos_token }} "
        "{{ eos_token }} {{ reasoning_strength }} {{ current_date }} {{ knowledge_cutoff }}"
    )
    rendered = render_chat(
        USER,
        tools=[{"name": "f"}],
        template=template,
        add_generation_prompt=False,
        reasoning_strength="low",
        current_date="2026-02-03",
        knowledge_cutoff="2025-01-01",
    )
    assert rendered == "1 1 False <|begin_of_text|> <|end_of_text|> low 2026-02-03 2025-01-01"


def test_reasoning_strength_is_not_passed_when_unset():
    """P-EFF-1: with no strength resolved, the template's own default applies."""
    assert render_chat(USER, template="{{ reasoning_strength is defined }}") == "False"


def test_special_tokens_come_from_the_caller():
    rendered = render_chat(
        USER, template="{{ bos_token }}|{{ eos_token is defined }}", special_tokens={"bos_token": "<s>"}
    )
    assert rendered == "<s>|False"


@pytest.mark.parametrize(
    "name",
    [
        "messages",
        "tools",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "additional_special_tokens",
    ],
)
def test_kwargs_replacing_fixed_variables_are_request_errors_naming_them(name):
    """P-TMPL-3: chat_template_kwargs may not replace messages, tools, add_generation_prompt or tokens."""
    with pytest.raises(RequestError) as caught:
        render_chat(USER, template="x", chat_template_kwargs={name: "hijack"})
    assert repr(name) in str(caught.value)
    assert caught.value.param == "chat_template_kwargs"


@pytest.mark.parametrize("name", ["continue_final_message", "chat_template"])
def test_apply_chat_template_arguments_as_kwargs_are_request_errors_not_ignored(name):
    """vLLM's LLM.chat reads these from chat_template_kwargs; a template never sees them, so a prompt rendered as if
    they were not given (a new turn instead of the final message continued) would be a silent wrong answer."""
    with pytest.raises(RequestError) as caught:
        render_chat(USER, template="x", chat_template_kwargs={name: True})
    assert repr(name) in str(caught.value) and "apply_chat_template" in str(caught.value)
    assert caught.value.param == "chat_template_kwargs"


@pytest.mark.parametrize(("kwargs", "where"), [
    ({"current_date": datetime.date(2026, 1, 2)}, "chat_template_kwargs.current_date"),
    ({"tool_namespace_descriptions": {"calendar": [decimal.Decimal("1.5")]}},
     "chat_template_kwargs.tool_namespace_descriptions.calendar[0]"),
])
def test_kwargs_a_template_cannot_read_are_request_errors_naming_them(kwargs, where):
    """A `datetime.date` (or another non-JSON value) reaches the template as its `<date>` placeholder, as under
    transformers: `current_date=datetime.date.today()` rendered "Current date: <date>." and the model was told no
    date; it is refused naming the kwarg and the string to pass."""
    with pytest.raises(RequestError) as caught:
        render_chat(USER, template=builtin_template_source(), chat_template_kwargs=kwargs)
    assert caught.value.param == "chat_template_kwargs"
    assert where in str(caught.value)
    assert "'2026-01-02'" in str(caught.value) or "'1.5'" in str(caught.value)


@pytest.mark.parametrize(("kwargs", "where"), [
    ({"knowledge_cutoff": float("nan")}, "chat_template_kwargs.knowledge_cutoff"),
    ({"tool_namespace_descriptions": {"calendar": [1.0, float("inf")]}},
     "chat_template_kwargs.tool_namespace_descriptions.calendar[1]"),
])
def test_non_finite_kwargs_are_request_errors_naming_them(kwargs, where):
    """P-TMPL-3: a kwarg of NaN or an infinity (a request body's `NaN`, `Infinity` or `1e400`) was rendered into the
    prompt as "Knowledge cutoff: nan."; it is refused naming the kwarg, as other values no JSON value are."""
    with pytest.raises(RequestError, match="no JSON value") as caught:
        render_chat(USER, template=builtin_template_source(), chat_template_kwargs=kwargs)
    assert caught.value.param == "chat_template_kwargs"
    assert where in str(caught.value)


CALENDAR_TOOL = [{"type": "function", "function": {"name": "calendar.add", "description": "", "parameters": {}}}]


@pytest.mark.parametrize(("kwargs", "where", "kind"), [
    ({"tool_namespace_descriptions": "calendar: the user's calendar"}, "tool_namespace_descriptions", "a string"),
    ({"tool_namespace_descriptions": "other"}, "tool_namespace_descriptions", "a string"),
    ({"tool_namespace_descriptions": ["calendar"]}, "tool_namespace_descriptions", "a list"),
    ({"tool_namespace_descriptions": None}, "tool_namespace_descriptions", "null"),
    ({"tool_namespace_descriptions": {"calendar": 5}}, "tool_namespace_descriptions.calendar", "a number"),
    ({"current_date": True}, "current_date", "a boolean"),
    ({"knowledge_cutoff": ["2026-01-04"]}, "knowledge_cutoff", "a list"),
])
def test_mistyped_kwargs_of_the_builtin_template_are_request_errors_naming_them_and_the_type(kwargs, where, kind):
    """P-TMPL-3: a `tool_namespace_descriptions` string, list or null failed inside the template ("Object of type
    Undefined is not JSON serializable", a 400 naming `messages`) or was silently ignored, and `current_date: true`
    rendered "Current date: True."; each is refused naming the kwarg, its type and the type expected."""
    with pytest.raises(RequestError) as caught:
        render_chat(USER, tools=CALENDAR_TOOL, template=builtin_template_source(), chat_template_kwargs=kwargs)
    name = where.split(".")[0]
    assert caught.value.param == f"chat_template_kwargs.{name}"
    assert f"chat_template_kwargs.{where} is {kind}; it must be " in str(caught.value)
    # a number is taken (written as text); the refusal said a string alone would do
    expected = ("an object mapping each tool namespace" if name == "tool_namespace_descriptions"
                else "a string or a number (or null for the template's default)")
    assert f"must be {expected}" in str(caught.value)


def test_a_namespace_description_keyed_by_a_dotted_name_is_refused_not_ignored():
    """A namespace is a tool's name up to its first dot (§2.1): a description under "calendar.add" matched no namespace
    and was silently left out of the prompt; it is refused naming the namespace to describe."""
    with pytest.raises(RequestError) as caught:
        render_chat(USER, tools=CALENDAR_TOOL, template=builtin_template_source(),
                    chat_template_kwargs={"tool_namespace_descriptions": {"calendar.add": "Adds an event"}})
    assert caught.value.param == "chat_template_kwargs.tool_namespace_descriptions"
    assert "'calendar.add', which is no namespace" in str(caught.value)
    assert "describe the namespace 'calendar' instead" in str(caught.value)


def test_kwargs_of_the_builtin_template_of_the_right_type_render_as_under_transformers():
    kwargs = {"tool_namespace_descriptions": {"calendar": "The user's calendar"}, "current_date": "2026-01-01",
              "knowledge_cutoff": 2024}  # a number is written as text, as by transformers
    template = builtin_template_source()
    assert render_chat(USER, tools=CALENDAR_TOOL, template=template, chat_template_kwargs=kwargs) == reference_render(
        template, USER, tools=CALENDAR_TOOL, **kwargs)


def test_token_variables_cannot_be_replaced_by_keyword_either():
    with pytest.raises(RequestError, match="bos_token"):
        render_chat(USER, template="x", bos_token="<s><s>")


def test_explicit_reasoning_strength_replaces_the_one_in_chat_template_kwargs():
    """P-EFF-1: the server resolves the strength from chat_template_kwargs and passes the checked value."""
    rendered = render_chat(
        USER,
        template="{{ reasoning_strength }}|{{ current_date }}",
        reasoning_strength="low",
        chat_template_kwargs={"reasoning_strength": "LOW", "current_date": "2026-01-02"},
    )
    assert rendered == "low|2026-01-02"


def test_kwarg_replacing_a_caller_supplied_token_variable_is_refused():
    with pytest.raises(RequestError, match="image_token"):
        render_chat(
            USER,
            template="x",
            special_tokens={"bos_token": "<s>", "image_token": "<|patch|>"},
            image_token="<img>",
        )


@pytest.mark.parametrize("messages", ["hello", [["role", "user"]], None, [{"role": "user"}, "x"]])
def test_messages_that_are_not_a_list_of_objects_are_request_errors(messages):
    with pytest.raises(RequestError) as caught:
        render_chat(messages, template="x")
    assert caught.value.param == "messages"


def test_compiled_template_exposes_the_source_sha256_for_logging():
    """P-TMPL-1: the source and sha256 of the template in use are logged."""
    source = builtin_template_source()
    template = ChatTemplate(source)
    assert template.sha256 == hashlib.sha256(source.encode("utf-8")).hexdigest()
    assert template.source == source


def test_render_chat_compiles_each_source_once():
    source = "{{ messages[0].content }}"
    assert compiled_template(source) is compiled_template(source)
    assert render_chat(USER, template=source) == "hi"


def test_chat_template_is_reusable_across_renders():
    template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert template.render(USER) == "hi"
    assert template.render([{"role": "user", "content": "again"}]) == "again"
