"""The request fields that ask for structured output → one `StructuredOutputsParams` (and the field to blame).

OpenAI's `response_format` (`json_object`, `json_schema`), vLLM's `structured_outputs` (json / regex / choice /
grammar / json_object) and vLLM's older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` all say
the same thing; a request may use one of them. Which part of the output they constrain is the endpoint's
business: the answer of a chat turn, the raw text of a completion.
"""

from __future__ import annotations

from typing import Any

from glimmer.engine.sampling_params import StructuredOutputsParams
from glimmer.errors import RequestError, UnsupportedArgumentError
from glimmer.server.schemas import ChatCompletionRequest, CompletionRequest, StructuredOutputsFields

_GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                  "guided_grammar": "grammar"}


def requested_structured_outputs(request: ChatCompletionRequest | CompletionRequest
                                 ) -> tuple[StructuredOutputsParams | None, str]:
    """(the constraint or None, the request field it came from); RequestError when fields conflict or are bad."""
    found: list[tuple[StructuredOutputsParams, str]] = []
    if request.response_format is not None:
        params = StructuredOutputsParams.from_response_format(request.response_format)
        if params is not None:
            found.append((params, "response_format.json_schema.schema" if params.json is not None
                          else "response_format"))
    if request.structured_outputs is not None:
        found.append(_from_fields(request.structured_outputs))
    for field, kind in _GUIDED_FIELDS.items():
        value = getattr(request, field)
        if value is not None:
            found.append((_params(field, **{kind: value}), field))
    if len(found) > 1:
        fields = ", ".join(param.split(".")[0] for _, param in found)
        raise RequestError(f"{found[1][1]}: give one structured-output constraint, not several ({fields})",
                           param=found[1][1])
    return found[0] if found else (None, "")


def _from_fields(fields: StructuredOutputsFields) -> tuple[StructuredOutputsParams, str]:
    try:
        params = _params("structured_outputs", **fields.constraints())
    except UnsupportedArgumentError as error:  # one of vLLM's other fields, at a value that would change the output
        param = f"structured_outputs.{error.param}"
        raise RequestError(f"{param}: {str(error).split(': ', 1)[-1]}", param=param) from None
    return params, f"structured_outputs.{params.kind}"


def _params(param: str, **values: Any) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**values)
    except RequestError as error:
        if param == "structured_outputs":
            raise
        # a guided_* field: name it rather than the engine's structured_outputs
        raise RequestError(f"{param}: {str(error).split(': ', 1)[-1]}", param=param) from None
