"""PagedKVCache keeps every sequence's contents exactly, whatever happens to the others.

K/V of a token are a function of its whole prefix (as in a real model, which is what makes prefix caching
correct), different in every column; every pool (GPU and CPU, keys and values) is checked, named blocks that
wait free in the queue too, and attention is compared with a dense softmax.
"""

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv import AllocStatus, PagedKVCache, PagedKVError
from pagedkv.prefix import hash_block_tokens

from invariants import check_manager_invariants

H, D = 2, 3
PRIME = 1_000_003


def kv_for(tokens):
    """Keys and values of every position: a rolling hash of the whole prefix, a distinct value per column."""
    rows, h = [], 17
    for t in tokens:
        h = (h * 31 + t + 1) % PRIME  # depends on every earlier token and on their order
        # column c of head h: its own multiplier, and its own offset beyond the hash's range, so never equal
        rows.append([[(h * (head * D + col + 1)) % 9973 + 10007 * (head * D + col) for col in range(D)]
                     for head in range(H)])
    k = torch.tensor(rows, dtype=torch.float32).view(-1, H, D)
    return k / 97, (k + 500) / -89


def dense_attention(query, keys, values):
    """softmax(q k^T / sqrt(d)) v for one sequence, head by head, in float64: the textbook formula."""
    scores = torch.einsum("hd,thd->ht", query.double(), keys.double()) / D ** 0.5
    return torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), values.double()).float()


class CacheMachine(RuleBasedStateMachine):
    @initialize(caching=st.booleans(), block_size=st.sampled_from([1, 2, 3]), gpu=st.integers(2, 10),
                cpu=st.integers(0, 5))
    def setup(self, caching, block_size, gpu, cpu):
        self.c = PagedKVCache(gpu, block_size, H, D, num_cpu_blocks=cpu, enable_prefix_caching=caching,
                              watermark=0.0)
        self.written = {}  # seq -> token ids (and so its K/V)
        self.prefix_of = {}  # chained block hash -> the tokens up to the end of that block
        self.next_id = 0

    # -------------------------------------------------------------- helpers
    def state(self):
        pools = [t.clone() for pool in self.c.engine.pools.values() for t in pool]
        return self.c.snapshot(), pools

    def attempt(self, call):
        """Run call; a failure must be a PagedKVError that changed nothing, in any pool."""
        before = self.state()
        try:
            call()
            return True
        except PagedKVError:
            after = self.state()
            assert after[0] == before[0] and all(torch.equal(a, b) for a, b in zip(after[1], before[1]))
            return False

    def remember_blocks(self, tokens):
        bs, parent = self.c.block_size, None
        for i in range(len(tokens) // bs):
            parent = hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs])
            self.prefix_of[parent] = tokens[:(i + 1) * bs]

    # ---------------------------------------------------------------- rules
    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=8))
    def add(self, tokens):
        status = self.c.manager.can_allocate(tokens)
        ok = self.attempt(lambda: self.c.add_sequence(self.next_id, *kv_for(tokens), token_ids=tokens))
        assert ok == (status is AllocStatus.OK)  # watermark 0: OK exactly when allocate succeeds
        if ok:
            self.written[self.next_id] = list(tokens)
            self.remember_blocks(tokens)
        self.next_id += 1

    @precondition(lambda self: self.written)
    @rule(data=st.data(), new=st.lists(st.integers(0, 2), min_size=1, max_size=4))
    def append(self, data, new):
        seq = data.draw(st.sampled_from(sorted(self.written)))
        full = self.written[seq] + new
        k, v = kv_for(full)
        on_gpu = self.c.manager.get_device(seq) == "gpu"
        can = on_gpu and self.c.manager.can_append_slots(seq, len(new))
        ok = self.attempt(lambda: self.c.append(seq, k[-len(new):], v[-len(new):], token_id=new))
        assert ok == can
        if ok:
            self.written[seq] = full
            self.remember_blocks(full)

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.written)))
        self.c.fork(parent, self.next_id)
        self.written[self.next_id] = list(self.written[parent])
        self.next_id += 1

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.written)))
        self.c.free(seq)
        del self.written[seq]

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def swap(self, data):
        seq = data.draw(st.sampled_from(sorted(self.written)))
        manager = self.c.manager
        if manager.get_device(seq) == "gpu":
            can = manager.can_swap_out(seq)
            assert self.attempt(lambda: self.c.swap_out(seq)) == can
        else:
            can = manager.can_swap_in(seq)  # watermark 0: the free blocks are the only condition
            assert self.attempt(lambda: self.c.swap_in(seq)) == can

    @rule(data=st.data())
    def bad_call(self, data):
        """Nonsense that must be refused without a trace: a wrong token, a wrong shape, an unknown id."""
        seq = data.draw(st.sampled_from(sorted(self.written) or [0]))
        calls = [
            lambda: self.c.append(seq, *[t[:1] for t in kv_for([0])], token_id=[1.5]),
            lambda: self.c.append(seq, torch.ones(1, H + 1, D), torch.ones(1, H + 1, D), token_id=[0]),
            lambda: self.c.add_sequence(self.next_id, *kv_for([0, 1]), token_ids=[0, 2**63]),
            lambda: self.c.add_sequence(["unhashable"], *kv_for([0]), token_ids=[0]),
            lambda: self.c.free("nobody"),
        ]
        call = data.draw(st.sampled_from(calls))
        assert not self.attempt(call)

    # ----------------------------------------------------------- invariants
    @invariant()
    def contents_preserved(self):
        if not hasattr(self, "c"):
            return
        manager, engine = self.c.manager, self.c.engine
        check_manager_invariants(manager)
        for seq, tokens in self.written.items():
            table, device = manager.get_block_table(seq), manager.get_device(seq)
            keys, values = engine.read_blocks(table, len(tokens), pool=device)  # the CPU pool too
            expected_k, expected_v = kv_for(tokens)
            assert torch.equal(keys, expected_k) and torch.equal(values, expected_v), (seq, device)

    @invariant()
    def named_blocks_hold_their_tokens(self):
        """Every block the prefix cache names, in use or waiting free in the queue, holds that prefix's K/V."""
        if not hasattr(self, "c") or not self.c.manager.prefix_cache:
            return
        bs = self.c.block_size
        for block_id, block_hash in self.c.manager.prefix_cache.block_to_hash.items():
            k, v = kv_for(self.prefix_of[block_hash])
            assert torch.equal(self.c.key_cache[block_id], k[-bs:]), block_id
            assert torch.equal(self.c.value_cache[block_id], v[-bs:]), block_id

    @invariant()
    def attention_is_softmax_attention(self):
        on_gpu = [s for s in sorted(self.written) if self.c.manager.get_device(s) == "gpu"] if hasattr(self, "c") \
            else []
        if not on_gpu:
            return
        query = torch.linspace(-1, 1, len(on_gpu) * H * D).view(len(on_gpu), H, D)
        got = self.c.attention(query, on_gpu, backend="cpu")
        for row, seq in enumerate(on_gpu):
            expected = dense_attention(query[row], *kv_for(self.written[seq]))
            torch.testing.assert_close(got[row], expected, rtol=1e-5, atol=1e-5)

    def teardown(self):
        if hasattr(self, "c"):
            for seq in list(self.written):
                self.c.free(seq)
            m = self.c.manager
            assert m.num_free_gpu_blocks == m.num_total_gpu_blocks
            assert m.num_free_cpu_blocks == m.num_total_cpu_blocks
            check_manager_invariants(m)


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)


@pytest.mark.parametrize("tokens", [[0, 1, 2], [2, 1, 0], [0, 0, 3]])
def test_kv_depends_on_the_whole_prefix_and_differs_per_column(tokens):
    k, v = kv_for(tokens)
    assert len({tuple(row.flatten().tolist()) for row in k}) == len(tokens)  # every position differs
    assert all(len(set(k[i, h].tolist())) == D for i in range(len(tokens)) for h in range(H))
    other = kv_for([9] + tokens[1:])[0]
    assert not torch.equal(k[-1], other[-1])  # the first token changes the last position's K
