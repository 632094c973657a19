"""Glimmer's own chat template, for the tiny checkpoints Glimmer writes (P-TMPL-4).

Glimmer never invents a prompt format for a real model: it renders with the template that came with the
checkpoint or from the operator. The checkpoints Glimmer creates itself (tests, demos) carry this template
as `chat_template.jinja`; it implements every rule of protocol.md §2.1 in the project's own words, so tests
exercise the same rules as the reference template.
"""

from importlib import resources

BUILTIN_TEMPLATE_FILE = "glimmer_chat_template.jinja"


def builtin_template_source() -> str:
    """The text of `glimmer/protocol/templates/glimmer_chat_template.jinja`."""
    return resources.files("glimmer.protocol").joinpath("templates", BUILTIN_TEMPLATE_FILE).read_text("utf-8")
