"""Fixtures shared by several test files."""
import pytest


@pytest.fixture(scope="session")
def smollm2_loaded():
    """SmolLM2-135M (model, tokenizer), loaded once per session: test_smollm2.py and test_offload.py read it and
    never change its weights."""
    pytest.importorskip("gguf")
    from pagedkv.model import load_smollm2
    return load_smollm2()
