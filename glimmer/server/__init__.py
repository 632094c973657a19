"""The OpenAI-compatible HTTP server (FastAPI + uvicorn).

`app.create_app(engine, settings)` builds the app; the request path is `schemas` (validation) →
`chat_prompt` (protocol rendering) → the engine → `choice_stream` (protocol parsing) → `chat` /
`completions` (response shapes, SSE via `streaming`). Nothing is imported here, so that importing a
submodule (the CLI reads `settings`) stays cheap.
"""
