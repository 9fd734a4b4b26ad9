"""A real chat model: SmolLM2-135M-Instruct from its GGUF file, checked against Hugging Face transformers.

transformers loads the same file (``gguf_file=``) with its own dequantization, Q/K un-permutation and tokenizer
conversion, none of it written here. Our weights must equal its weights, our tokenizer its tokenizer, and our
dense and paged greedy decoding its ``generate``, token for token. Small random Llamas written to GGUF with
llama.cpp's own writer check every quantization type the same way.
"""

import numpy as np
import pytest
import torch

from pagedkv import LLMEngine, ModelFileError, PagedKVError
from pagedkv.model import LlamaForCausalLM, generate_dense, smollm2_path

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
             "Who wrote Hamlet?"]
TEXTS = ["Hello world", "  leading spaces,\ttabs\n\nand newlines ", "café naïve 日本語 🎉 ünïcödé",
         "def f(x):\n    return x ** 2  # 2024-11-23", "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
         "12345 67.89 -3e10 0x1F", "don't I'll we've THEY'RE", "", "<|im_end", "a" * 300]


@pytest.fixture(scope="module")
def smollm2(smollm2_loaded):
    return smollm2_loaded  # one load per session (tests/conftest.py), shared with test_offload.py


@pytest.fixture(scope="module")
def hf():
    path = smollm2_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def chats(smollm2):
    _, tokenizer = smollm2
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def hf_answers(hf, chats):
    """transformers' greedy answers (at most 24 tokens; EOS included when it comes, as vLLM returns it)."""
    model, _ = hf
    answers = []
    for ids in chats:
        out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
        answers.append(out[:out.index(2) + 1] if 2 in out else out)
    return answers


def test_config_is_smollm2s(smollm2):
    model, tokenizer = smollm2
    c = model.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (30, 9, 3, 64)
    assert (c.vocab_size, c.hidden_size, c.tie_word_embeddings, c.eos_token_id) == (49152, 576, True, 2)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: one tensor, two names
    assert tokenizer.eos_token_id == 2 and tokenizer.decode([2]) == "<|im_end|>"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_weights_equal_transformers(smollm2, hf):
    ours, theirs = smollm2[0].state_dict(), hf[0].state_dict()
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name].float()), name


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_equals_transformers(smollm2, hf, text):
    ours, theirs = smollm2[1], hf[1]
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == theirs.decode(ids) == text


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour\nplease."}],
])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_transformers(smollm2, hf, messages, add_generation_prompt):
    ours = smollm2[1].apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf[1].apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
    assert ours == list(theirs)


def test_dense_greedy_equals_transformers_generate(smollm2, chats, hf_answers):
    model, tokenizer = smollm2
    answers = [generate_dense(model, ids, 24) for ids in chats]
    assert answers == hf_answers
    assert tokenizer.decode(answers[0]) == "The capital of France is Paris.<|im_end|>"


def test_greedy_stops_after_eos_unless_ignored(smollm2, chats, hf_answers):
    model, _ = smollm2
    assert hf_answers[0][-1] == 2 and len(hf_answers[0]) < 24  # the first answer ends early, with its EOS
    assert generate_dense(model, chats[0], 24) == hf_answers[0]
    longer = generate_dense(model, chats[0], len(hf_answers[0]) + 2, ignore_eos=True)
    assert longer[:len(hf_answers[0])] == hf_answers[0] and len(longer) == len(hf_answers[0]) + 2


@pytest.mark.parametrize("settings", [
    dict(num_gpu_blocks=64, block_size=16),  # roomy
    dict(num_gpu_blocks=12, block_size=8),  # tight: two chats of 5 blocks admitted, then outgrow it
    dict(num_gpu_blocks=12, block_size=8, preemption_mode="swap", num_cpu_blocks=32),
    dict(num_gpu_blocks=64, block_size=16, enable_prefix_caching=True),  # the system prompt is shared
], ids=["roomy", "tight-recompute", "tight-swap", "prefix-caching"])
def test_paged_engine_equals_transformers(smollm2, chats, hf_answers, settings):
    engine = LLMEngine(smollm2[0], **settings)
    assert engine.generate(chats, 24) == hf_answers
    if settings["num_gpu_blocks"] == 12:
        assert engine.stats.num_preemptions > 0
    if settings.get("enable_prefix_caching"):  # 31 tokens of template and system prompt: one block in each
        assert engine.stats.num_prefix_cached_tokens >= 16 * (len(chats) - 1)


def test_speculative_decoding_equals_transformers(smollm2, chats, hf_answers):
    """Issue #47: n-gram drafts verified in the same forward, a tight pool (it preempts), answers unchanged; a chat
    that asks for its own text back has drafts accepted."""
    model, tokenizer = smollm2
    echo = tokenizer.apply_chat_template([{"role": "user", "content": "Repeat exactly: the quick brown fox jumps "
                                           "over the lazy dog near the river bank."}])
    engine = LLMEngine(model, version="v1", num_gpu_blocks=12, block_size=8, speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    assert engine.generate(chats[:2] + [echo], 24) == hf_answers[:2] + [generate_dense(model, echo, 24)]
    assert engine.stats.num_preemptions > 0
    assert engine.stats.num_accepted_tokens > 0 and engine.stats.acceptance_rate_per_pos[0] > 0


# ------------------------------------------------------------------- every quantization, vs transformers
def write_tiny_llama_gguf(path, qtype: str, tied: bool, seed: int = 0) -> None:
    """A random small Llama in GGUF, written as llama.cpp's converter does (Q/K rows permuted)."""
    rng = np.random.default_rng(seed)
    layers, hidden, inter, heads, kv_heads, vocab = 2, 64, 96, 4, 2, 96
    head_dim = hidden // heads

    def permute(w, n_head):  # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    tokens = ["<|endoftext|>", "<|im_end|>"] + [chr(ord("!") + i) for i in range(vocab - 2)]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3] + [1] * (vocab - 2))
    writer.add_token_merges([])
    writer.add_eos_token_id(1)

    def add(name, shape, quantize=True):
        w = (rng.standard_normal(shape) * (0.2 if len(shape) > 1 else 0.05) + (len(shape) == 1)).astype(np.float32)
        if name.endswith("attn_q.weight"):
            w = permute(w, heads)
        elif name.endswith("attn_k.weight"):
            w = permute(w, kv_heads)
        kind = gguf.GGMLQuantizationType[qtype if quantize and len(shape) > 1 else "F32"]
        writer.add_tensor(name, gguf.quants.quantize(w, kind) if kind.name != "F32" else w, raw_dtype=kind)

    add("token_embd.weight", (vocab, hidden))
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (hidden,))
        add(f"blk.{i}.ffn_norm.weight", (hidden,))
        for name, shape in (("attn_q", (heads * head_dim, hidden)), ("attn_k", (kv_heads * head_dim, hidden)),
                            ("attn_v", (kv_heads * head_dim, hidden)), ("attn_output", (hidden, heads * head_dim)),
                            ("ffn_gate", (inter, hidden)), ("ffn_up", (inter, hidden)), ("ffn_down", (hidden, inter))):
            add(f"blk.{i}.{name}.weight", shape)
    add("output_norm.weight", (hidden,))
    if not tied:
        add("output.weight", (vocab, hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("qtype,tied", [("F32", False), ("F16", True), ("BF16", False), ("Q8_0", True),
                                        ("Q4_0", False), ("Q4_1", True), ("Q5_0", False), ("Q5_1", True)])
def test_every_quantization_loads_as_transformers_does(tmp_path, qtype, tied):
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_tiny_llama_gguf(path, qtype, tied)
    ours = LlamaForCausalLM.from_gguf(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    assert ours.config.tie_word_embeddings is tied
    for name, tensor in ours.state_dict().items():
        assert torch.allclose(tensor, theirs.state_dict()[name].float(), atol=1e-6), name
    ids = torch.arange(3, 40)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(ids[None]).logits[0], atol=2e-4, rtol=1e-4)
    prompt = list(range(5, 25))
    assert generate_dense(ours, prompt, 12, ignore_eos=True) == theirs.generate(
        torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, 20:].tolist()


# ------------------------------------------------------------------------------------------ bad input
def test_bad_gguf_files_say_what_is_wrong(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    good = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(good, "Q8_0", tied=True)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    other = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(other), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    for path, words in [(tmp_path / "missing.gguf", "does not exist"), (text, "not a GGUF file"),
                        (cut, "truncated"), (other, "'gpt2' model"), (42, "str or a Path")]:
        with pytest.raises(ModelFileError, match=words) as error:
            LlamaForCausalLM.from_gguf(path)
        assert isinstance(error.value, ValueError) and str(path) in str(error.value)


def test_unsupported_tensor_type_is_refused_by_name(tmp_path):
    path = tmp_path / "q2k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", 1), ("context_length", 8), ("embedding_length", 256),
                       ("feed_forward_length", 256), ("attention.head_count", 4)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tensor("token_embd.weight", np.zeros((2, 84), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    with pytest.raises(ModelFileError, match=r"tensor types \['Q2_K'\] are not supported"):
        LlamaForCausalLM.from_gguf(path)


@pytest.mark.parametrize("messages", [
    "hello", [], [{"role": "user"}], [{"role": "user", "content": 3}], [("user", "hi")],
    [{"role": "user", "content": "hi", "name": "x"}], None,
])
def test_bad_messages_are_refused(smollm2, messages):
    with pytest.raises(PagedKVError, match="messages"):
        smollm2[1].apply_chat_template(messages)


def test_tokenizer_bad_input(smollm2):
    tokenizer = smollm2[1]
    for call in (lambda: tokenizer.encode(None), lambda: tokenizer.decode([49152]), lambda: tokenizer.decode("ab")):
        with pytest.raises(PagedKVError):
            call()
