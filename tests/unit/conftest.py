from __future__ import annotations

import pytest

from ..conftest import model_path


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path("smollm2-135m-instruct"))


@pytest.fixture(scope="session", params=["smollm2-135m-instruct", "tiny-qwen2-random", "tiny-llama-localtok"])
def any_tokenizer(request):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path(request.param))
