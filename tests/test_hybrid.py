"""Hybrid KV caches: sliding-window layers beside full-attention ones (issue #35).

The model against Hugging Face's Ministral (Llama's layers with per-layer windows, code nobody here wrote).
"""

import dataclasses

import pytest
import torch

from pagedkv import PagedKVError
from pagedkv.model import LlamaConfig, LlamaForCausalLM, generate_dense, load_tiny

transformers = pytest.importorskip("transformers")

WINDOW = 8
LAYER_TYPES = ("sliding_attention", "full_attention") * 2


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def hybrid(tiny):
    """The shipped tiny Llama with an 8-token window on layers 0 and 2."""
    config = dataclasses.replace(tiny[0].config, sliding_window=WINDOW, layer_types=LAYER_TYPES)
    model = LlamaForCausalLM(config)
    model.load_state_dict(tiny[0].state_dict())
    return model.eval()


@pytest.fixture(scope="module")
def ministral(hybrid):
    hf = {k: v for k, v in hybrid.config.to_hf_dict().items() if k not in ("architectures", "model_type", "rope_theta")}
    model = transformers.MinistralForCausalLM(transformers.MinistralConfig(**hf, attn_implementation="sdpa"))
    model.load_state_dict(hybrid.state_dict())
    return model.eval()


def test_config_writes_hugging_faces_names(hybrid):
    hf = hybrid.config.to_hf_dict()
    assert (hf["model_type"], hf["sliding_window"], hf["layer_types"]) == ("ministral", WINDOW, list(LAYER_TYPES))
    assert LlamaConfig.from_hf_dict(hf) == hybrid.config
    assert [hybrid.config.layer_window(i) for i in range(4)] == [WINDOW, None, WINDOW, None]
    plain = load_tiny()[0].config.to_hf_dict()  # today's Llama files do not change
    assert plain["model_type"] == "llama" and "layer_types" not in plain


def test_logits_equal_ministral(hybrid, ministral, tiny):
    ids = torch.tensor([tiny[1].encode("The quick brown fox jumps over the lazy dog, again and again.")])
    with torch.no_grad():
        theirs, mine, full = ministral(ids).logits, hybrid(ids), tiny[0](ids)
    torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-5)
    assert not torch.allclose(mine, full, atol=1e-3)  # the window changes the answer: the test can fail


def test_greedy_tokens_equal_ministral_generate(hybrid, ministral, tiny):
    prompt = tiny[1].encode("The list of ")
    with torch.no_grad():
        theirs = ministral.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)[0, len(prompt):]
    assert generate_dense(hybrid, prompt, 30) == theirs.tolist()


@pytest.mark.parametrize("change, field", [
    ({"sliding_window": 0}, "sliding_window"), ({"sliding_window": 4.0}, "sliding_window"),
    ({"sliding_window": True}, "sliding_window"),
    ({"layer_types": ("full_attention",) * 3}, "layer_types"),
    ({"layer_types": ("sliding_attention", "local", "full_attention", "full_attention")}, "layer_types"),
    ({"layer_types": "full_attention"}, "layer_types"),
    ({"sliding_window": None, "layer_types": LAYER_TYPES}, "sliding_window"),
])
def test_bad_layer_settings_name_the_field(tiny, change, field):
    with pytest.raises(PagedKVError, match=field):
        dataclasses.replace(tiny[0].config, **{"sliding_window": WINDOW, "layer_types": LAYER_TYPES, **change})
