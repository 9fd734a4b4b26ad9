"""Sampling parameters, the sampler, and the dense references (generate_dense with SamplingParams,
beam_search_dense) on the shipped tiny Llama.

The sampler is checked against its definition (frequencies, top-k and top-p supports computed directly), the
references against each other and against a brute-force beam search over full forward passes (no cache).
"""

import math
from dataclasses import replace

import pytest
import torch

from pagedkv import (
    BeamSearchParams,
    LlamaForCausalLM,
    PagedKVError,
    SamplingParams,
    beam_search_dense,
    generate_dense,
    load_tiny,
)
from pagedkv.sampling import beam_search_score, sample


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def prompt(tiny):
    return tiny[1].encode("The list ")


# ------------------------------------------------------------------------------------------------- params
@pytest.mark.parametrize("kwargs", [dict(n=0), dict(temperature=-0.1), dict(top_p=0), dict(top_p=1.5),
                                    dict(top_k=-1), dict(seed=1.5), dict(seed="7"), dict(seed=True),
                                    dict(max_tokens=0), dict(temperature=math.nan), dict(stop_token_ids=[-1]),
                                    dict(stop_token_ids="ab"), dict(ignore_eos=1), dict(n=True)])
def test_bad_sampling_params_are_refused_at_construction(kwargs):
    with pytest.raises(PagedKVError) as error:
        SamplingParams(**kwargs)
    assert isinstance(error.value, ValueError) and next(iter(kwargs)) in str(error.value)


@pytest.mark.parametrize("kwargs", [dict(beam_width=0, max_tokens=4), dict(beam_width=2, max_tokens=0),
                                    dict(beam_width=2.0, max_tokens=4), dict(beam_width=2, max_tokens=4,
                                                                             length_penalty=math.inf)])
def test_bad_beam_search_params_are_refused(kwargs):
    with pytest.raises(PagedKVError):
        BeamSearchParams(**kwargs)


def test_stop_ids_outside_the_vocabulary_are_refused(tiny, prompt):
    with pytest.raises(PagedKVError, match="vocabulary"):
        generate_dense(tiny[0], prompt, SamplingParams(stop_token_ids=[256]))


# ------------------------------------------------------------------------------------------------ sampler
def test_the_draw_follows_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])
    params = SamplingParams(temperature=0.7)
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([sample(logits, params, generator) for _ in range(20_000)]), minlength=5)
    expected = torch.softmax(logits / 0.7, dim=-1) * 20_000
    assert ((counts - expected).abs() <= 4 * expected.sqrt() + 5).all(), (counts, expected)


def test_top_k_and_top_p_keep_exactly_their_sets():
    logits = torch.tensor([3.0, 2.5, 2.0, 1.0, 0.0, -1.0])
    probs = torch.softmax(logits, dim=-1)
    generator = torch.Generator().manual_seed(1)
    for k in (1, 2, 4):
        seen = {sample(logits, SamplingParams(top_k=k), generator) for _ in range(400)}
        assert seen == set(range(k))
    for p in (0.3, 0.6, 0.9, 0.99):
        # the nucleus by definition: the fewest most likely tokens whose probabilities reach p
        size = int((probs.cumsum(0) < p).sum()) + 1
        seen = {sample(logits, SamplingParams(top_p=p), generator) for _ in range(800)}
        assert seen == set(range(size)), (p, seen)


def test_temperature_zero_is_greedy(tiny, prompt):
    out = generate_dense(tiny[0], prompt, SamplingParams(temperature=0, max_tokens=20, n=2))
    greedy = generate_dense(tiny[0], prompt, 20)
    assert [o.token_ids for o in out.outputs] == [greedy, greedy]
    assert out.outputs[0].finish_reason == "length" and out.outputs[0].cumulative_logprob < 0


def test_a_seed_makes_each_sample_reproducible_and_independent_of_n(tiny, prompt):
    model = tiny[0]
    four = generate_dense(model, prompt, SamplingParams(n=4, seed=7, temperature=0.9, top_p=0.95, max_tokens=24))
    again = generate_dense(model, prompt, SamplingParams(n=4, seed=7, temperature=0.9, top_p=0.95, max_tokens=24))
    one = generate_dense(model, prompt, SamplingParams(n=1, seed=7, temperature=0.9, top_p=0.95, max_tokens=24))
    other = generate_dense(model, prompt, SamplingParams(n=1, seed=8, temperature=0.9, top_p=0.95, max_tokens=24))
    assert [o.token_ids for o in four.outputs] == [o.token_ids for o in again.outputs]
    assert four.outputs[0].token_ids == one.outputs[0].token_ids  # sample 0 does not depend on n
    assert len({tuple(o.token_ids) for o in four.outputs}) == 4  # four different samples
    assert other.outputs[0].token_ids != one.outputs[0].token_ids
    assert [o.index for o in four.outputs] == [0, 1, 2, 3]


def test_a_stop_token_ends_a_sample_and_is_kept(tiny, prompt):
    model = tiny[0]
    greedy = generate_dense(model, prompt, 30)
    stop = greedy[5]
    out = generate_dense(model, prompt, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop]))
    cut = greedy.index(stop) + 1
    assert out.outputs[0].token_ids == greedy[:cut] and out.outputs[0].finish_reason == "stop"


def test_cumulative_logprob_is_the_raw_log_probability_of_the_tokens(tiny, prompt):
    model = tiny[0]
    out = generate_dense(model, prompt, SamplingParams(seed=3, temperature=1.3, max_tokens=6)).outputs[0]
    ids = torch.tensor(prompt + out.token_ids)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).float(), dim=-1)
    expected = sum(float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(out.token_ids))
    assert out.cumulative_logprob == pytest.approx(expected, abs=1e-3)


# ------------------------------------------------------------------------------------------- beam search
def brute_force_beam_search(model, prompt, params, eos=None):
    """vLLM 0.33's beam search, recomputing every beam's logits from scratch (a full forward pass, no cache)."""
    beams, completed = [([], 0.0)], []
    for _ in range(params.max_tokens):
        if not beams:
            break
        candidates = []
        for tokens, score in beams:
            with torch.no_grad():
                logits = model(torch.tensor(prompt + tokens))[-1]
            top = torch.topk(torch.log_softmax(logits.float(), -1), 2 * params.beam_width)
            for token, lp in zip(top.indices.tolist(), top.values.tolist()):
                (completed if token == eos else candidates).append((tokens + [token], score + lp))

        def key(beam):
            return beam_search_score(len(beam[0]), beam[1], params.length_penalty)
        beams = sorted(candidates, key=key, reverse=True)[:params.beam_width]
    return sorted(completed + beams, key=key, reverse=True)[:params.beam_width]


@pytest.mark.parametrize("width, length_penalty", [(1, 1.0), (3, 1.0), (4, 0.5)])
def test_beam_search_dense_equals_a_brute_force_search(tiny, prompt, width, length_penalty):
    params = BeamSearchParams(beam_width=width, max_tokens=6, length_penalty=length_penalty)
    out = beam_search_dense(tiny[0], prompt, params)
    expected = brute_force_beam_search(tiny[0], prompt, params)
    assert [o.token_ids for o in out.outputs] == [tokens for tokens, _ in expected]
    for o, (_, score) in zip(out.outputs, expected):
        assert o.cumulative_logprob == pytest.approx(score, abs=1e-3)
    scores = [beam_search_score(len(o.token_ids), o.cumulative_logprob, length_penalty) for o in out.outputs]
    assert scores == sorted(scores, reverse=True)  # best first


def test_beam_width_one_is_greedy(tiny, prompt):
    out = beam_search_dense(tiny[0], prompt, BeamSearchParams(beam_width=1, max_tokens=12))
    assert out.outputs[0].token_ids == generate_dense(tiny[0], prompt, 12)


def test_beams_that_end_in_eos_are_complete(tiny, prompt):
    """A model with an EOS: a beam that proposes it is set aside as complete, finish_reason "stop"."""
    eos = generate_dense(tiny[0], prompt, 3)[1]  # a token the greedy path meets early becomes the EOS
    model = LlamaForCausalLM(replace(tiny[0].config, eos_token_id=eos))
    model.load_state_dict(tiny[0].state_dict())
    model.eval()
    params = BeamSearchParams(beam_width=3, max_tokens=5)
    out = beam_search_dense(model, prompt, params)
    assert any(o.finish_reason == "stop" and o.token_ids[-1] == eos for o in out.outputs)
    expected = brute_force_beam_search(model, prompt, params, eos=eos)
    assert [o.token_ids for o in out.outputs] == [tokens for tokens, _ in expected]
    ignored = beam_search_dense(model, prompt, BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True))
    assert all(o.finish_reason == "length" and len(o.token_ids) == 5 for o in ignored.outputs)
