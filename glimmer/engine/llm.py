"""The offline Python API, shaped like vLLM's: `LLM(model=...)`, `llm.generate(prompts, SamplingParams(...))`.

Generation of many prompts runs on the same continuous-batching engine as the server.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as SequenceABC
from typing import Any

from tqdm.auto import tqdm

from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.engine.outputs import CompletionOutput, RequestOutput
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import RequestError

PromptType = str | list[int] | dict[str, Any]


class LLM:
    """Load a Muse Glimmer checkpoint and generate from it.

    model: a checkpoint directory or a Hugging Face Hub id. dtype: "float32" | "bfloat16" | "float16"
    (default bfloat16 on CUDA, float32 on CPU). device: "cpu" | "cuda" (default: cuda if available).
    Other keyword arguments are `EngineConfig` fields (max_model_len, max_num_seqs,
    max_num_batched_tokens, kv_cache_memory, block_size, enable_prefix_caching, seed, chat_template).
    """

    def __init__(self, model: str, *, dtype: str | None = None, device: str | None = None, **engine_options: Any):
        self.engine = LLMEngine(EngineConfig(model=str(model), dtype=dtype, device=device, **engine_options))
        self._ids = itertools.count()

    def get_tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a text prompt. BOS is added, unless the text already starts with it (a prompt
        rendered by the chat template does: a second BOS silently alters the output, P-TMPL-5)."""
        tokenizer = self.engine.tokenizer
        has_bos = tokenizer.bos_token is not None and text.startswith(tokenizer.bos_token)
        return tokenizer.encode(text, add_special_tokens=not has_bos)

    def _normalize_prompts(self, prompts: PromptType | SequenceABC[PromptType]) -> list[tuple[str | None, list[int]]]:
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        if not isinstance(prompts, SequenceABC) or isinstance(prompts, str):
            raise RequestError("prompts must be a string, a list of token ids, a prompt dict, or a list of them",
                               param="prompts")
        out: list[tuple[str | None, list[int]]] = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                out.append((prompt, self.encode_prompt(prompt)))
            elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                out.append((None, list(prompt)))
            elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
                out.append((prompt.get("prompt"), list(prompt["prompt_token_ids"])))
            elif isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
                if prompt.get("multi_modal_data"):
                    raise RequestError("multi_modal_data needs a checkpoint with a vision tower and is handled "
                                       "by the multimodal prompt path", param=f"prompts[{i}].multi_modal_data")
                out.append((prompt["prompt"], self.encode_prompt(prompt["prompt"])))
            else:
                raise RequestError(f"prompts[{i}] is not a string, a list of token ids or a prompt dict",
                                   param=f"prompts[{i}]")
        return out

    def generate(
        self,
        prompts: PromptType | SequenceABC[PromptType],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate completions for every prompt, batched continuously; outputs keep the prompts' order."""
        normalized = self._normalize_prompts(prompts)
        if sampling_params is None:
            params_list = [SamplingParams()] * len(normalized)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(normalized)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(normalized):
                raise RequestError(
                    f"got {len(params_list)} SamplingParams for {len(normalized)} prompts", param="sampling_params"
                )
        return self._run(normalized, params_list, use_tqdm)

    def _run(
        self, prompts: list[tuple[str | None, list[int]]], params_list: list[SamplingParams], use_tqdm: bool
    ) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        order = []
        for (text, ids), params in zip(prompts, params_list, strict=True):
            request_id = f"llm-{next(self._ids)}"
            self.engine.add_request(request_id, ids, params)
            order.append(request_id)
            results[request_id] = RequestOutput(
                request_id=request_id,
                prompt=text,
                prompt_token_ids=ids,
                outputs=[CompletionOutput(index=i, text="", token_ids=[], finish_reason=None,
                                          logprobs=[] if params.logprobs is not None else None)
                         for i in range(params.n)],
            )
        try:
            with tqdm(total=len(order), desc="Generating", disable=not use_tqdm) as bar:
                while self.engine.has_unfinished_requests:
                    for delta in self.engine.step():
                        request = results[delta.request_id]
                        out = request.outputs[delta.index]
                        out.token_ids.extend(delta.token_ids)
                        out.text += delta.text
                        if out.logprobs is not None:
                            out.logprobs.extend(delta.logprobs)
                        request.num_cached_tokens = delta.num_cached_tokens
                        if delta.finish_reason is not None:
                            out.finish_reason = delta.finish_reason
                            out.stop_reason = delta.stop_reason
                            if request.finished:
                                bar.update(1)
        except BaseException:
            for request_id in order:
                self.engine.abort(request_id)
            raise
        return [results[r] for r in order]
