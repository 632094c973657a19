"""No ATEM markup of a cut tag or an interrupted call reaches reasoning or content (issue 8).

P-CHAN-2 keeps complete quoted ATEM in a reply verbatim; P-CHAN-7 drops what an interrupted call leaves in the
next body, now wherever it stands in that body; a tag cut short by the end of a body is never shown.
Every shape is parsed in all chunkings (P-STREAM-1), and streaming never retracts (P-STREAM-2).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_support import CALENDAR_TOOLS, atem, calls, parse_all_ways, tool_message
from test_output_streaming import feed_seconds

from glimmer.protocol import OutputParser
from glimmer.protocol.atem_markup import HELD_AT_ONCE_MAX, NAME_CHARACTERS, AtemMarkupFilter, could_become_tag
from glimmer.protocol.tokens import HOLD_MAX

TOOLS = CALENDAR_TOOLS
OPEN_INVOKE = '<atem:function_calls>\n<atem:invoke name="calendar.lookup">\n<atem:parameter name="day">'
TAGS = ('<atem:function_calls>', '<atem:invoke name="calendar.lookup">', '<atem:parameter name="limit">',
        '</atem:parameter>', '</atem:invoke>', '</atem:function_calls>')


def no_markup(text: str | None) -> bool:
    return text is None or ("<atem:" not in text and "</atem:" not in text)


# -- leak 1: a generation that ends inside an ATEM tag in the answer channel --------------------------------


@pytest.mark.parametrize("cut", ['<atem:', '<atem:invoke name="calendar.look', '<atem:parameter name="day"',
                                 '</atem:param', '<atem:function_calls', '</atem:'])
@pytest.mark.parametrize("end", ["", "<|eot|>", "<|eom|>"])
def test_an_answer_ending_inside_an_atem_tag_never_shows_it(cut, end):
    """P-CHAN-2, P-STREAM-6: the fragment of a call that never happened is not text."""
    result = parse_all_ways(" to=user<|message|>Let me check. " + cut + end, TOOLS)
    assert result.content == "Let me check. "
    assert result.tool_calls == []


def test_the_same_holds_for_reasoning_and_text_before_any_header():
    assert parse_all_ways(" to=self<|message|>I will call <atem:invoke name=\"x").reasoning == "I will call "
    assert parse_all_ways("Sure <atem:function_calls>\n<atem:inv").content == "Sure <atem:function_calls>\n"


@pytest.mark.parametrize("tail", ["<", "a <", "x </", "</at", "1 <at"])
def test_a_fragment_too_short_to_name_atem_is_text(tail):
    """P-STREAM-6: held text that did not prove to be markup is delivered."""
    assert parse_all_ways(" to=user<|message|>" + tail).content == tail


def test_a_complete_quoted_tag_is_still_verbatim():
    """P-CHAN-2 is unchanged: a tag that completes was a quote; only the undecided tail was held."""
    quoted = 'Write <atem:invoke name="calendar.lookup"> to call it.'
    assert parse_all_ways(" to=user<|message|>" + quoted + "<|eot|>", TOOLS).content == quoted
    parser = OutputParser(TOOLS)
    shown = parser.feed(' to=user<|message|>Write <atem:invoke name="cal').content
    assert shown == "Write "  # held while undecided (P-STREAM-3) ...
    assert parser.feed('endar.lookup"> to call').content == '<atem:invoke name="calendar.lookup"> to call'


# -- leak 2: a parameter value holding header-like text, then more prose ----------------------------------


@pytest.mark.parametrize("switch", [" to=user<|message|>", "<|start|>assistant to=user<|message|>",
                                    "<|start|>assistant<|message|>"])
def test_prose_after_a_header_inside_a_value_shows_without_the_calls_markup(switch):
    """P-CHAN-7, P-ATEM-5: the header ends the tool channel mid-invoke; what the model writes after it is
    the rest of its call: prose flows, every ATEM tag of the broken call is dropped."""
    body = (OPEN_INVOKE + "Friday" + switch + "and more prose</atem:parameter>\n"
            '<atem:parameter name="limit">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls>')
    result = parse_all_ways(tool_message("calendar.lookup", body, first=True) + "<|eot|>", TOOLS)
    assert result.content == "and more prose3"
    assert result.tool_calls == []


def test_a_later_message_after_the_residue_body_is_untouched():
    """The watch ends with the first body that showed text; P-CHAN-2 applies again after it."""
    body = OPEN_INVOKE + "x to=user<|message|>First.</atem:parameter></atem:invoke><|eom|>"
    quoted = "<|start|>assistant to=user<|message|>Quote: </atem:invoke>"
    result = parse_all_ways(tool_message("calendar.lookup", body, first=True) + quoted, TOOLS)
    assert result.content == "First.Quote: </atem:invoke>"


def test_calls_after_an_interrupted_one_still_parse():
    body = OPEN_INVOKE + "x to=user<|message|>Checking.<|eom|>"
    second = tool_message("calendar.lookup", atem("calendar.lookup", {"day": "Sat"}), first=False)
    result = parse_all_ways(tool_message("calendar.lookup", body, first=True) + second + "<|eot|>", TOOLS)
    assert result.content == "Checking."
    assert calls(result) == [("calendar.lookup", {"day": "Sat"})]


# -- the filter on its own --------------------------------------------------------------------------------


def test_held_fragments_stay_under_hold_max():
    """P-STREAM-4."""
    assert HELD_AT_ONCE_MAX <= HOLD_MAX
    assert could_become_tag('<atem:parameter name="' + "k" * NAME_CHARACTERS + '"')
    assert not could_become_tag('<atem:parameter name="' + "k" * (NAME_CHARACTERS + 1))
    assert not could_become_tag("<b>") and not could_become_tag('<atem:invoke name="x">')


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.one_of(st.sampled_from(TAGS), st.sampled_from([" ", "\n", "prose", "3", "<", "a<b"])),
                       max_size=12),
       cut=st.integers(min_value=0, max_value=len('<atem:invoke name="calendar.lookup"')),
       sizes=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=20))
def test_in_residue_mode_no_tag_survives_any_chunking(pieces, cut, sizes):
    """P-STREAM-1, P-STREAM-2: one decision per text whatever the chunking; no markup ever shows."""
    text = "".join(pieces) + '<atem:invoke name="calendar.lookup"'[:cut]
    outputs = []
    for chunking in ([len(text) or 1], sizes):
        markup = AtemMarkupFilter()
        markup.start_residue()
        shown, position, index = [], 0, 0
        while position < len(text):
            size = chunking[index % len(chunking)]
            shown.extend(markup.accept(text[position:position + size]))
            position += size
            index += 1
        shown.append(markup.end_body())
        outputs.append("".join(shown))
    assert outputs[0] == outputs[1]
    assert no_markup(outputs[0])


RESIDUE_PREFIX = tool_message("calendar.lookup", OPEN_INVOKE + "x to=user<|message|>", first=True)


@pytest.mark.parametrize("unit", ["Prose of a reply.\n ", '</atem:parameter>\n<atem:parameter name="k">v',
                                  "a < b <atem:inv c "])
def test_the_residue_filter_keeps_feeding_linear(unit):
    """P-STREAM-5: 4x the text costs about 4x the time (sizes large enough to time reliably)."""
    assert feed_seconds(RESIDUE_PREFIX, unit, 4000) / feed_seconds(RESIDUE_PREFIX, unit, 1000) < 8
