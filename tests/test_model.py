"""The small Llama against Hugging Face transformers (code nobody here wrote), on random weights, offline."""

import json

import pytest
import torch

from pagedkv import PagedKVError
from pagedkv.model import ContiguousKVCache, LlamaConfig, LlamaForCausalLM, generate_dense, load_tiny

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rope_theta=500.0, rms_norm_eps=1e-5)


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SHAPE, attn_implementation="eager", bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def ours(hf_model):
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    model.load_state_dict(hf_model.state_dict())  # Hugging Face's keys load as they are
    return model.eval()


def test_state_dict_keys_are_hugging_faces(hf_model, ours):
    assert list(ours.state_dict()) == list(hf_model.state_dict())


def test_logits_equal_hugging_face(hf_model, ours):
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs, mine = hf_model(ids).logits, ours(ids)
    torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-5)


def test_dense_decoding_with_a_cache_equals_a_full_forward(ours):
    ids = list(range(5, 25))
    cache = ContiguousKVCache()
    with torch.no_grad():
        full = ours(torch.tensor(ids))
        step = torch.cat([ours(torch.tensor(ids[:12]), torch.arange(12), cache),
                          *[ours(torch.tensor([t]), torch.tensor([12 + i]), cache) for i, t in enumerate(ids[12:])]])
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)
    assert cache.num_tokens() == 20


def test_greedy_tokens_equal_hugging_face_generate(hf_model, ours):
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    with torch.no_grad():
        theirs = hf_model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):]
    assert generate_dense(ours, prompt, 24) == theirs.tolist()


def test_from_pretrained_reads_hugging_faces_save_pretrained(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    model = LlamaForCausalLM.from_pretrained(tmp_path)
    assert model.config == LlamaConfig(**SHAPE)
    ids = torch.tensor([1, 2, 3, 4])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf_model(ids[None]).logits[0], atol=2e-5, rtol=1e-5)


def test_our_save_pretrained_loads_in_hugging_face(ours, tmp_path):
    ours.save_pretrained(tmp_path)
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits[0], ours(ids[0]), atol=2e-5, rtol=1e-5)


def test_from_pretrained_refuses_what_it_cannot_load(tmp_path, ours):
    with pytest.raises(PagedKVError, match="config.json"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    ours.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2", "architectures": ["GPT2"]}))
    with pytest.raises(PagedKVError, match="Llama models only"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 32}))
    with pytest.raises(PagedKVError, match="does not match"):
        LlamaForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("change, match", [
    ({"num_attention_heads": 3}, "multiple of num_attention_heads"), ({"num_key_value_heads": 3}, "GQA"),
    ({"hidden_size": 0}, ">= 1"), ({"vocab_size": 96.0}, "integer"),
])
def test_bad_configs(change, match):
    with pytest.raises(PagedKVError, match=match):
        LlamaConfig(**{**SHAPE, **change})


def test_bad_prompts(ours):
    for prompt, match in (([], "empty"), ([96], "outside the vocabulary"), ([-1], "outside"), (["a"], "integers")):
        with pytest.raises(PagedKVError, match=match):
            generate_dense(ours, prompt, 3)
    with pytest.raises(PagedKVError, match=">= 1"):
        generate_dense(ours, [1], 0)


def test_tiny_model_loads_offline_and_writes_words():
    model, tokenizer = load_tiny()
    assert tokenizer.decode(tokenizer.encode("naïve café")) == "naïve café"
    first = generate_dense(model, tokenizer.encode("The "), 60)
    assert first == generate_dense(model, tokenizer.encode("The "), 60)  # deterministic
    text = tokenizer.decode(first)
    words = text.split()
    assert len(words) >= 6 and sum(w.strip('.,:;"()').isalpha() for w in words) >= 0.6 * len(words), text
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


@pytest.mark.parametrize("tied", [True, False])
def test_a_loaded_model_holds_its_weights_once(ours, tied):
    """Issue #46: a model was built with random weights on the CPU, then the file's weights copied in, so SmolLM2's
    540 MB were held twice while loading (1.5 GB peak RSS). The loaded parameters are the given tensors."""
    config = LlamaConfig(**{**ours.config.__dict__, "tie_word_embeddings": tied})
    state = {k: v.clone() for k, v in ours.state_dict().items()}
    model = LlamaForCausalLM._from_state(config, state, "a test")
    params = dict(model.named_parameters(remove_duplicate=False))
    assert all(params[k].data_ptr() == v.data_ptr() for k, v in state.items() if not (tied and k == "lm_head.weight"))
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert not any(p.is_meta for p in model.parameters())
    if tied == ours.config.tie_word_embeddings:  # the same model: the same logits
        tokens = torch.tensor([1, 2, 3])
        assert torch.equal(model(tokens), ours(tokens))
