"""Token spellings and length bounds of the Muse Glimmer turn protocol (protocol.md §1, §4).

Only the *strings* live here. Token ids differ between tokenizers and are resolved by the engine at load
time (P-TOK-1); this package works on decoded text with special tokens kept (P-TOK-3).
"""

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|finetune_right_pad|>"

START = "<|start|>"
"""Opens a header: `<|start|>ROLE[ to=RECIPIENT]<|message|>`."""
MESSAGE = "<|message|>"
"""Ends a header and starts the body."""
EOM = "<|eom|>"
"""Ends a message; the turn continues. Never a stop token (P-TOK-2)."""
EOT = "<|eot|>"
"""Ends the turn."""

IMAGE_PLACEHOLDER = "<|patch|>"
"""What the template writes for an image part (P-TOK-4); the processor expands it."""
VIDEO_PLACEHOLDER = "<|video|>"
"""What the template writes for a video part (P-TOK-4)."""

FRAMING_MARKERS = (START, MESSAGE, EOM, EOT, EOS, BOS)
"""The markers the output parser treats as structure (P-STREAM-3). Other special tokens are text."""

TERMINATORS = (EOM, EOT, EOS)
"""Markers that end a message body. `<|eot|>` and eos also end the turn."""

GENERATION_PROMPT = "<|start|>assistant"
"""The prompt always ends here, so the model's first header is bare (P-TMPL-8, P-HDR-1)."""

HEADER_SPAN = 128
"""A header's text (between `<|start|>` and `<|message|>`) is at most this many characters (P-HDR-3)."""
RECIPIENT_MAX = 64
"""A recipient, and a declared tool name, is 1..RECIPIENT_MAX characters (P-HDR-2, P-REQ-8)."""
HOLD_MAX = 256
"""Undecided reasoning or content text never exceeds this many characters (P-STREAM-4)."""
