"""What `tool_choice` means for one request (P-REQ-3, P-REQ-4, P-REQ-5), and the turn grammar it implies.

`auto` (the default with tools) leaves the turn free (P-REQ-3), unless a tool is declared `strict`: then the turn
may still answer or call, but a call's arguments follow its tool's schema, as OpenAI's strict mode promises;
`none` hides the tools (P-REQ-3); `required` and a named function force the turn into a call, by grammar over the
channel structure (turn_grammar.py), never by a JSON grammar (P-REQ-5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from glimmer.errors import RequestError, ToolChoiceUnsatisfiedError
from glimmer.protocol.turn_grammar import TurnConstraint


@dataclass
class ToolPlan:
    """What `tool_choice` means for one request.

    render_tools: declared in the prompt (None hides them: `none`, P-REQ-3).
    parser_tools: what the output parser resolves calls against (None: no calls, P-NAME-4).
    required_names: for `required` / named, the tools a valid call must name (P-REQ-4); else None.
    strict: a tool is declared with `"strict": true`, so calls are grammar-constrained under `auto` too.
    """

    render_tools: list[dict[str, Any]] | None
    parser_tools: list[dict[str, Any]] | None
    required_names: list[str] | None
    strict: bool = False

    def turn_constraint(self, answer: Mapping[str, Any] | None, *, parallel_calls: bool = True,
                        thinking_token_budget: int | None = None) -> TurnConstraint | None:
        """The grammar constraint of the turn, or None when nothing constrains it.

        answer: the answer body's grammar object (structured outputs), or None for a free answer.
        """
        if answer is None and self.required_names is None and thinking_token_budget is None and not self.strict:
            return None
        tools = self.parser_tools or []
        if self.required_names is not None:
            tools = [tool for tool in tools if tool["function"]["name"] in self.required_names]
        return TurnConstraint(answer=answer, call_tools=tools, must_call=self.required_names is not None,
                              parallel_calls=parallel_calls, thinking_token_budget=thinking_token_budget)

    def unsatisfied(self, valid_call_names: list[str], finish_reason: str | None, *, where: str,
                    limit_field: str = "max_tokens",
                    context_full_at: int | None = None) -> ToolChoiceUnsatisfiedError | None:
        """The error for a reply (`where`: "choice 0", say) that a required or named choice needed a call in, when
        it holds no valid call of an allowed tool (P-REQ-4), else None. The turn grammar makes every call valid, so
        a reply without one was cut short (finish_reason "length") before its call was written: the message says
        so and names `limit_field`, the request's token limit, to raise, or, where the reply filled the context
        (`context_full_at`: the max_model_len it reached, which no token limit extends), to shorten the conversation.
        A call cut short after it was written is kept (P-ATEM-5) and satisfies the choice; its finish_reason stays
        "length" (P-API-2)."""
        if self.required_names is None or not set(self.required_names).isdisjoint(valid_call_names):
            return None
        what = f"a call of {self.required_names[0]!r}" if len(self.required_names) == 1 else "a tool call"
        if finish_reason == "length" and context_full_at is not None:
            return ToolChoiceUnsatisfiedError(
                f"tool_choice asked for {what}, but {where} reached the end of the context (max_model_len="
                f"{context_full_at}) before a complete call; shorten the conversation so that the reasoning and the "
                "call fit")
        if finish_reason == "length":
            return ToolChoiceUnsatisfiedError(
                f"tool_choice asked for {what}, but {where} was cut short by {limit_field} (finish_reason \"length\") "
                f"before a complete call; raise {limit_field} so that the reasoning and the call fit")
        return ToolChoiceUnsatisfiedError(
            f"tool_choice asked for {what}, but {where} ended ({finish_reason}) without a valid one; retry")


def plan_tools(tools: list[dict[str, Any]], tool_choice: Any) -> ToolPlan:
    """tools: normalized; tool_choice: None, 'none', 'auto', 'required' or {"type": "function", "function":
    {"name": NAME}}. Raises RequestError for a choice that needs tools the request does not declare."""
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none" or (choice == "auto" and not tools):
        return ToolPlan(None, None, None)
    if choice == "auto":
        return ToolPlan(tools, tools, None, strict=any(tool["function"].get("strict") is True for tool in tools))
    names = [tool["function"]["name"] for tool in tools]
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if choice.get("type") == "function" and isinstance(function, Mapping) else None
        if not isinstance(name, str):
            raise RequestError('tool_choice: must be "none", "auto", "required" or {"type": "function", '
                               '"function": {"name": NAME}}', param="tool_choice")
        if not tools:
            raise RequestError("tool_choice: a required or named tool choice needs `tools`", param="tool_choice")
        if name not in names:
            raise RequestError(f"tool_choice: function {name!r} is not among the declared tools "
                               f"({', '.join(names)})", param="tool_choice")
        return ToolPlan(tools, tools, [name])
    if choice != "required":
        raise RequestError(f'tool_choice: {choice!r} is not "none", "auto", "required" or a named function',
                           param="tool_choice")
    if not tools:
        raise RequestError("tool_choice: a required or named tool choice needs `tools`", param="tool_choice")
    return ToolPlan(tools, tools, names)
