"""Streaming cost of the output parser: is `OutputParser.feed` O(len(chunk))? (protocol.md P-STREAM-5)

Feeds a composed 200,000-character turn (reasoning, a tool call whose string value is a long source file,
then a long answer) in 4-character chunks and prints:

- the mean time per chunk over the first and the last 10% of chunks, and their ratio (a parser that
  re-scans what it has already seen gets slower as the turn grows; target ratio < 1.5);
- the overall throughput in MB/s of decoded text (target > 5 MB/s).

Timings are the best of several runs (least disturbed by other processes); CPU time is reported next to wall
time because the machine may be shared.

Run: python bench/protocol_stream.py [--chars N] [--chunk N] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import time

from glimmer.cli import count, positive_count
from glimmer.protocol import OutputParser, ParsedOutput, parse_output

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "files.write",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    }
]

_PROSE = (
    "The user wants the report rewritten so that totals are computed per region; first check which "
    "columns exist, then decide whether the fiscal year starts in April or in January. "
)
_CODE = (
    "def total(rows: list[dict]) -> float:\n"
    "    # sum amounts where 0 < amount < limit and region != 'test'\n"
    "    return sum(r['amount'] for r in rows if 0 < r['amount'] < LIMIT)\n\n"
)
_ANSWER = "Totals are now grouped by region, and the fiscal year starts in April as the ledger shows. "
_CODE_HEAD = "def total"  # what the tool call's file starts with, checked after parsing
# a turn is a third reasoning, a third the file, a third the answer: a shorter one's file cannot hold its head
MIN_CHARS = 3 * len(_CODE_HEAD)


def composed_turn(total_chars: int) -> str:
    """A realistic turn of about `total_chars` characters: reasoning, one tool call, an answer."""
    share = total_chars // 3
    reasoning = (_PROSE * (share // len(_PROSE) + 1))[:share]
    code = (_CODE * (share // len(_CODE) + 1))[:share]
    answer = (_ANSWER * (share // len(_ANSWER) + 1))[:share]
    return (
        f" to=self<|message|>{reasoning}<|eom|>"
        "<|start|>assistant to=files.write<|message|><atem:function_calls>\n"
        '<atem:invoke name="files.write">\n'
        '<atem:parameter name="path">report.py</atem:parameter>\n'
        f'<atem:parameter name="content">{code}</atem:parameter>\n'
        "</atem:invoke>\n</atem:function_calls><|eom|>"
        f"<|start|>assistant to=user<|message|>{answer}<|eot|>"
    )


def streamed(text: str, chunk_chars: int) -> ParsedOutput:
    parser = OutputParser(TOOLS)
    deltas = [parser.feed(text[start:start + chunk_chars]) for start in range(0, len(text), chunk_chars)]
    deltas.append(parser.finish())
    return ParsedOutput.from_deltas(deltas)


def timed_run(chunks: list[str]) -> tuple[float, float, float, float]:
    """Wall seconds of the first 10% of chunks, the last 10%, all of them; CPU seconds of all of them."""
    tenth = max(1, len(chunks) // 10)
    parser = OutputParser(TOOLS)
    feed = parser.feed
    clock = time.perf_counter
    cpu_started = time.process_time()
    started = clock()
    for chunk in chunks[:tenth]:
        feed(chunk)
    first_done = clock()
    for chunk in chunks[tenth:-tenth]:
        feed(chunk)
    last_started = clock()
    for chunk in chunks[-tenth:]:
        feed(chunk)
    parser.finish()
    finished = clock()
    cpu_seconds = time.process_time() - cpu_started
    return first_done - started, finished - last_started, finished - started, cpu_seconds


def main() -> None:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # a turn shorter than MIN_CHARS ended in the tool call check's AssertionError
    arguments.add_argument("--chars", type=count(MIN_CHARS, "a turn length"), default=200_000)
    arguments.add_argument("--chunk", type=positive_count, default=4)
    arguments.add_argument("--repeat", type=positive_count, default=7)
    options = arguments.parse_args()

    text = composed_turn(options.chars)
    one_shot = parse_output(text, TOOLS)
    result = streamed(text, options.chunk)
    same = (
        result.reasoning == one_shot.reasoning
        and result.content == one_shot.content
        and [(call.name, call.arguments) for call in result.tool_calls]
        == [(call.name, call.arguments) for call in one_shot.tool_calls]
    )
    assert same, "streaming and one-shot results differ"
    assert json.loads(result.tool_calls[0].arguments)["content"].startswith(_CODE_HEAD)

    chunks = [text[start:start + options.chunk] for start in range(0, len(text), options.chunk)]
    tenth = max(1, len(chunks) // 10)
    # Best of several runs: the minimum is the least disturbed by other processes on the machine.
    runs = [timed_run(chunks) for _ in range(options.repeat)]
    first = min(run[0] for run in runs) / tenth
    last = min(run[1] for run in runs) / tenth
    wall = min(run[2] for run in runs)
    cpu = min(run[3] for run in runs)
    megabytes = len(text.encode("utf-8")) / 1e6
    print(f"turn: {len(text):,} characters in {len(chunks):,} chunks of {options.chunk}")
    print(f"per-chunk time, first 10%: {first * 1e6:.3f} us")
    print(f"per-chunk time, last 10%:  {last * 1e6:.3f} us")
    print(f"ratio last/first: {last / first:.2f} (target < 1.5)")
    print(f"throughput: {megabytes / wall:.2f} MB/s wall, {megabytes / cpu:.2f} MB/s CPU "
          f"(best of {options.repeat}; target > 5 MB/s)")


if __name__ == "__main__":
    main()
