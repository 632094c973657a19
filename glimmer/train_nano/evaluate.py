"""`python -m glimmer.train_nano.evaluate [MODEL]`: the nano model on held-out conversations, through the engine.

The conversations come from the training generator with another seed and declare only held-out tool names
(`names.is_held_out`), none of which training ever declared. Each is cut after its last user message;
the model answers greedily through `glimmer.LLM` (the engine, the chat template, the protocol parser). Per
turn it reports:

- **well-formed**: the turn ended with a stop token, the protocol parser logged no defect (ill-formed
  header, prose or broken ATEM in a tool channel, unresolved tool name, unterminated invoke), and every
  message is `[<|start|>assistant] to=R<|message|>BODY<|eom|>|<|eot|>`, the last ending the turn;
- **right call** (turns that need a tool): exactly the expected calls by name, arguments valid under the
  tool's JSON schema (and, stricter, equal to the expected ones);
- **no call** (plain answers and refusals): an answer and no call;
- **answer uses the result**: after the tool result, the answer contains every value of the result. The
  history before it is the model's own call when that was right, else the expected one.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from glimmer.captured_warnings import captured_warnings
from glimmer.protocol import ParsedOutput, normalize_messages, normalize_tools, parse_output
from glimmer.train_nano.corpus import Conversation, TurnExpectation
from glimmer.train_nano.dataset import conversation_at

EVAL_SEED = 7919  # the training corpus uses the recipe's seed (0)
# 20 turns: 13 single calls, 1 parallel call, 3 plain answers, 3 refusals
KIND_CYCLE = ("call",) * 13 + ("pair",) + ("plain",) * 3 + ("refusal",) * 3
MAX_TOKENS = 400
_MESSAGE = re.compile(r"(?:<\|start\|>assistant)? to=[^\s<]{1,64}<\|message\|>(?:(?!<\|).)*(?:<\|eom\|>|<\|eot\|>)",
                      re.DOTALL)


PINNED_DATE = "2026-06-01"  # one date for every prompt (P-TMPL-3), so prompts share their system prefix in the cache


def held_out_conversations(count: int, seed: int = EVAL_SEED) -> list[Conversation]:
    conversations = [conversation_at(seed, i, held_out=True, last_kind=KIND_CYCLE[i % len(KIND_CYCLE)])
                     for i in range(count)]
    for conversation in conversations:
        conversation.template_kwargs = {**conversation.template_kwargs, "current_date": PINNED_DATE}
    return conversations


def protocol_warnings() -> AbstractContextManager[list[str]]:
    """The warnings the protocol parser logs inside the block (each one is a defect of the parsed text)."""
    return captured_warnings("glimmer.protocol", at_warning_level=True)


def framing_is_well_formed(text: str) -> bool:
    """Messages back to back, each `[<|start|>assistant] to=R<|message|>BODY` + <|eom|>/<|eot|>; the last <|eot|>."""
    position = 0
    while position < len(text):
        match = _MESSAGE.match(text, position)
        if match is None or (position > 0 and not match.group().startswith("<|start|>")):
            return False
        position = match.end()
    return text.endswith("<|eot|>")


@dataclass
class TurnResult:
    well_formed: bool
    parsed: ParsedOutput
    warnings: list[str]


def parse_turn(text: str, finish_reason: str | None, tools: list[dict[str, Any]] | None) -> TurnResult:
    with protocol_warnings() as warnings:
        parsed = parse_output(text, tools)
    well_formed = (finish_reason == "stop" and not warnings and framing_is_well_formed(text)
                   and bool(parsed.content or parsed.tool_calls))
    return TurnResult(well_formed, parsed, list(warnings))


def _schema_of(tools: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((t["function"]["parameters"] for t in tools if t["function"]["name"] == name), None)


def calls_verdict(parsed: ParsedOutput, expected: TurnExpectation, tools: list[dict[str, Any]]) -> tuple[bool, bool]:
    """(right tools with schema-valid arguments, and also exactly the expected arguments)."""
    import jsonschema

    if [c.name for c in parsed.tool_calls] != [name for name, _ in expected.calls]:
        return False, False
    valid = exact = True
    for call, (name, arguments) in zip(parsed.tool_calls, expected.calls, strict=True):
        try:
            got = json.loads(call.arguments)
            jsonschema.validate(got, _schema_of(tools, name))
        except (json.JSONDecodeError, jsonschema.ValidationError):
            valid = exact = False
            continue
        exact = exact and got == arguments
    return valid, exact


@dataclass
class Tally:
    hits: int = 0
    total: int = 0

    def add(self, hit: bool) -> None:
        self.hits += int(hit)
        self.total += 1

    def __str__(self) -> str:
        if not self.total:  # no conversation of its kind among --prompts (a few prompts may hold none)
            return f"{'—':>6s}  (0/0: none among these conversations)"
        return f"{100 * self.hits / self.total:5.1f}%  ({self.hits}/{self.total})"


@dataclass
class Report:
    well_formed: Tally = field(default_factory=Tally)
    right_call: Tally = field(default_factory=Tally)
    exact_arguments: Tally = field(default_factory=Tally)
    no_call: Tally = field(default_factory=Tally)
    answer_uses_result: Tally = field(default_factory=Tally)
    # right calls by the number of tools the conversation declares (the harder the more there are)
    right_call_by_tools: dict[int, Tally] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"turns well-formed (protocol parser)          {self.well_formed}",
            f"right tool, arguments valid (jsonschema)     {self.right_call}",
            f"  … and arguments exactly as expected        {self.exact_arguments}",
            *(f"  right tool, {count} declared tool{'s' if count > 1 else ''}".ljust(45) + str(tally)
              for count, tally in sorted(self.right_call_by_tools.items())),
            f"plain answers and refusals without a call    {self.no_call}",
            f"answers after a tool result use its values   {self.answer_uses_result}",
        ]


def prompt_text(llm: Any, conversation: Conversation, messages: list[dict[str, Any]]) -> str:
    """The prompt the server would build for `messages` of `conversation` (its tools, strength and date)."""
    engine = llm.engine
    return engine.chat_template.render(
        normalize_messages(messages), tools=normalize_tools(conversation.tools) if conversation.tools else None,
        special_tokens=engine.tokenizer.special_tokens, reasoning_strength=conversation.reasoning_strength,
        chat_template_kwargs=conversation.template_kwargs)


def _history_after_calls(conversation: Conversation, first: TurnResult, right: bool) -> list[dict[str, Any]]:
    """The conversation through the tool results: the model's own call message when it was right."""
    gold = conversation.messages
    call_index = conversation.last_user_index + 1
    messages = [dict(m) for m in gold[: call_index + 1 + len(conversation.last_turn.calls)]]
    if right:
        own_calls = [{"id": gold_call["id"], "type": "function",
                      "function": {"name": call.name, "arguments": json.loads(call.arguments)}}
                     for call, gold_call in zip(first.parsed.tool_calls, gold[call_index]["tool_calls"], strict=True)]
        messages[call_index] = {"role": "assistant", "content": None, "reasoning_content": first.parsed.reasoning,
                                "tool_calls": own_calls}
    return messages


def evaluate(llm: Any, conversations: list[Conversation], *, max_tokens: int = MAX_TOKENS) -> Report:
    from glimmer.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    report = Report()
    firsts = llm.generate([prompt_text(llm, c, c.messages[: c.last_user_index + 1]) for c in conversations],
                          params)
    seconds: list[tuple[Conversation, list[dict[str, Any]]]] = []
    for conversation, output in zip(conversations, firsts, strict=True):
        expected = conversation.last_turn
        turn = parse_turn(output.text, output.finish_reason, conversation.tools)
        report.well_formed.add(turn.well_formed)
        if expected.kind == "call":
            valid, exact = calls_verdict(turn.parsed, expected, conversation.tools or [])
            report.right_call.add(valid)
            report.right_call_by_tools.setdefault(len(conversation.tools or []), Tally()).add(valid)
            report.exact_arguments.add(exact)
            seconds.append((conversation, _history_after_calls(conversation, turn, valid)))
            if not valid:
                report.failures.append(f"call: expected {expected.calls}, got {output.text!r}")
        else:
            ok = not turn.parsed.tool_calls and bool(turn.parsed.content)
            report.no_call.add(ok)
            if not ok:
                report.failures.append(f"{expected.kind}: got {output.text!r}")
        if not turn.well_formed:
            report.failures.append(f"ill-formed ({turn.warnings}): {output.text!r}")
    answers = llm.generate([prompt_text(llm, c, messages) for c, messages in seconds], params)
    for (conversation, _), output in zip(seconds, answers, strict=True):
        turn = parse_turn(output.text, output.finish_reason, conversation.tools)
        report.well_formed.add(turn.well_formed)
        content = turn.parsed.content or ""
        uses = not turn.parsed.tool_calls and all(v in content for v in conversation.last_turn.answer_values)
        report.answer_uses_result.add(uses)
        if not uses:
            report.failures.append(f"answer: expected {conversation.last_turn.answer_values}, got {output.text!r}")
        if not turn.well_formed:
            report.failures.append(f"ill-formed ({turn.warnings}): {output.text!r}")
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m glimmer.train_nano.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None, help="checkpoint directory (default: the embedded model)")
    parser.add_argument("--prompts", type=int, default=500, help="held-out conversations to answer (default 500)")
    parser.add_argument("--seed", type=int, default=EVAL_SEED,
                        help=f"seed of the held-out conversations (default {EVAL_SEED}, not the training corpus's)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="default bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--show-failures", type=int, default=5,
                        help="failed turns to print with what the model wrote (default 5)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # a count below these was taken: --prompts -3 reported "-3 held-out conversations", --show-failures -1 all
    # failures but the last (a slice)
    for option, value, least in (("--prompts", args.prompts, 1), ("--show-failures", args.show_failures, 0)):
        if value < least:
            parser.exit(2, f"{parser.prog}: error: {option} {value}: give {'1' if least else '0'} or more\n")
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    from glimmer.default_model import default_model_dir
    from glimmer.engine.llm import LLM
    from glimmer.errors import GlimmerError

    try:  # calls_verdict needs it only after the first pass of generation: minutes on a CPU
        import jsonschema  # noqa: F401
    except ImportError:
        parser.exit(2, f"{parser.prog}: error: the evaluation checks call arguments with jsonschema, which is not "
                       "installed; pip install -e \".[train]\" (or pip install jsonschema)\n")
    model = args.model or str(default_model_dir())
    try:
        llm = LLM(model, device=args.device, dtype=args.dtype, progress=False)
    except GlimmerError as error:  # a wrong path or device: one line, as the glimmer command prints it
        parser.exit(2, f"{parser.prog}: error: {type(error).__name__}: {error}\n")
    started = time.perf_counter()
    report = evaluate(llm, held_out_conversations(args.prompts, args.seed))
    print(f"{model}: {args.prompts} held-out conversations (seed {args.seed}, unseen tool names), greedy, "
          f"{llm.engine.device} {llm.engine.dtype}, {time.perf_counter() - started:.0f} s")
    for line in report.lines():
        print(line)
    for failure in report.failures[: args.show_failures]:
        print("failure:", failure[:600])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
