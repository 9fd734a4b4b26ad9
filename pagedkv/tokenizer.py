"""Layer 11a — a chat model's tokenizer, built from its GGUF metadata: byte-level BPE and a chat template.

A GGUF file carries its tokenizer: the vocabulary (``tokenizer.ggml.tokens``), the BPE merges, which ids
are control tokens (``<|im_start|>``, ``<|im_end|>``...) and the Jinja chat template. Hugging Face's
``tokenizers`` library (the Rust BPE every Hugging Face model uses) does the splitting and merging; this
class only assembles it the way ``transformers`` does from the same file
(``transformers/integrations/gguf/gguf_tokenizer_mapping.py``: a GPT-2 byte-level BPE, control tokens
kept whole), so ids agree with ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``.

In vLLM the tokenizer lives outside the engine (``vllm/transformers_utils/tokenizer.py``): the engine sees
token ids only, exactly as pagedkv's does.
"""

from __future__ import annotations

from .errors import PagedKVValueError
from .validate import check_token_ids

CONTROL = 3  # llama.cpp's token type for control tokens (gguf.TokenType.CONTROL)


class ChatTokenizer:
    """``encode``, ``decode``, ``apply_chat_template`` and ``eos_token_id``, from a GGUF file's metadata."""

    def __init__(self, metadata: dict):
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        kind = metadata.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise PagedKVValueError(f"this GGUF file's tokenizer is {kind!r}; pagedkv builds byte-level BPE "
                                    "('gpt2') tokenizers only, as SmolLM2 and Llama 3 use.")
        tokens = metadata["tokenizer.ggml.tokens"]
        merges = [tuple(merge.split(" ")) for merge in metadata["tokenizer.ggml.merges"]]
        bpe = models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges, fuse_unk=False)
        self._tokenizer = Tokenizer(bpe)
        self._tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self._tokenizer.decoder = decoders.ByteLevel()
        types = metadata.get("tokenizer.ggml.token_type", [])
        self.special_tokens = [t for t, kind in zip(tokens, types) if kind == CONTROL]
        self._tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                            for t in self.special_tokens])
        self.vocab_size = len(tokens)
        self.eos_token_id = metadata.get("tokenizer.ggml.eos_token_id")
        self.bos_token_id = metadata.get("tokenizer.ggml.bos_token_id")
        self.chat_template = metadata.get("tokenizer.chat_template")

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no special tokens are added, but ``<|im_end|>`` written in it is one id."""
        if not isinstance(text, str):
            raise PagedKVValueError(f"encode takes a str, got {type(text).__name__}.")
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        tokens = check_token_ids("token_ids", token_ids, allow_empty=True)
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise PagedKVValueError(f"token ids {bad[:5]} are outside the vocabulary (0..{self.vocab_size - 1}).")
        return self._tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def token(self, token_id: int) -> str:
        """One id as the vocabulary spells it (``Ġ`` is a space in byte-level BPE)."""
        return self._tokenizer.id_to_token(token_id)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        """The conversation as the model was trained to read it (its own Jinja template), as token ids.

        ``messages``: a list of ``{"role": "system" | "user" | "assistant", "content": str}``. SmolLM2's
        template adds a default system prompt when the first message is not one: the same prefix for every
        conversation, which the prefix cache serves (notebook 12).
        """
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def render_chat(self, messages, add_generation_prompt: bool = True) -> str:
        """The template's text, before tokenizing (``apply_chat_template(..., tokenize=False)``)."""
        _check_messages(messages)
        if not self.chat_template:
            raise PagedKVValueError("this tokenizer has no chat template; encode the prompt text yourself.")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise PagedKVValueError(f"the chat template refused the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders
        env.globals["raise_exception"] = raise_exception
        token = self._tokenizer.id_to_token
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=token(self.bos_token_id) if self.bos_token_id is not None else "",
            eos_token=token(self.eos_token_id) if self.eos_token_id is not None else "")

    def __repr__(self) -> str:
        return f"ChatTokenizer(vocab_size={self.vocab_size}, eos_token_id={self.eos_token_id})"


def _check_messages(messages) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise PagedKVValueError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts, "
                                f"got {messages!r}.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"} \
                or not all(isinstance(message[k], str) for k in ("role", "content")):
            raise PagedKVValueError(f"messages[{i}] is {message!r}; each message is a dict with exactly the str "
                                    "keys 'role' (system, user or assistant) and 'content', e.g. "
                                    "{'role': 'user', 'content': 'Hello'}.")
