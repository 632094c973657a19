"""Media given to the Python API: `multi_modal_data` takes what `LLM.chat` takes for an item, paths and data: URLs."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from glimmer import LLM, SamplingParams
from glimmer.errors import RequestError

PROMPT = "<|begin_of_text|>Describe <|patch|> briefly."


@pytest.fixture(scope="module")
def llm(make_tiny):
    return LLM(str(make_tiny("canonical", vision=True, seed=17)), progress=False, kv_cache_memory=16 << 20,
               max_model_len=512)


def _png(height: int, width: int) -> bytes:
    encoded = io.BytesIO()
    Image.fromarray((np.random.RandomState(3).rand(height, width, 3) * 255).astype("uint8")).save(encoded, "PNG")
    return encoded.getvalue()


def test_generate_takes_a_data_url_where_it_takes_a_path(llm, tmp_path):
    """README: the image of multi_modal_data is what LLM.chat takes; a data URL was opened as a file of that name."""
    path = tmp_path / "image.png"
    path.write_bytes(_png(60, 90))
    url = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
    params = SamplingParams(temperature=0, max_tokens=3)
    from_path, from_url = (llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": item}}, params)[0]
                           for item in (str(path), url))
    assert from_url.prompt_token_ids == from_path.prompt_token_ids
    assert from_url.outputs[0].token_ids == from_path.outputs[0].token_ids


def test_a_bad_data_url_in_generate_is_refused_without_echoing_it(llm):
    url = "data:image/png;base64," + "A" * 5000 + "!"
    with pytest.raises(RequestError) as raised:
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": url}}, SamplingParams(max_tokens=2))
    assert str(raised.value) == "image 0: data URL is not valid base64"
    assert raised.value.param == "prompt"
