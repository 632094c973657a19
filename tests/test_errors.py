"""The helpers of glimmer/errors.py that word refusals."""

from glimmer.errors import option_and_keyword


def test_an_option_is_named_as_the_command_line_and_llm_spell_it():
    """A refusal raised from `glimmer serve` or from LLM(...) names the option in both forms, one way everywhere: they
    were written four ways (`--mmproj (mmproj=)`, `--mmproj (LLM(..., mmproj=...))`, ...)."""
    assert option_and_keyword("--device", "cuda", '"cuda"') == '--device cuda / device="cuda"'
    assert option_and_keyword("--kv-cache-memory", "SIZE") == "--kv-cache-memory SIZE / kv_cache_memory="
    assert option_and_keyword("--mmproj") == "--mmproj / mmproj="
    assert option_and_keyword("--allow-pickle", keyword_value="True") == "--allow-pickle / allow_pickle=True"
