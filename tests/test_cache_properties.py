"""PagedKVCache keeps every live sequence's contents exactly, whatever happens to the others."""

import hypothesis.strategies as st
import torch
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv import PagedKVCache, PagedKVError

from invariants import check_manager_invariants

H, D = 1, 2


def kv_for(prefix):
    """K/V of each token is a function of the prefix up to it, as in a real model (prefix caching relies on it)."""
    rows = [[float(sum(prefix[: i + 1]) * 31 + len(prefix[: i + 1]))] * D for i in range(len(prefix))]
    k = torch.tensor(rows, dtype=torch.float32).view(-1, H, D)
    return k, k * -2


class CacheMachine(RuleBasedStateMachine):
    @initialize(caching=st.booleans(), block_size=st.sampled_from([1, 2, 3]), gpu=st.integers(2, 10),
                cpu=st.integers(0, 5))
    def setup(self, caching, block_size, gpu, cpu):
        self.c = PagedKVCache(gpu, block_size, H, D, num_cpu_blocks=cpu, enable_prefix_caching=caching,
                              watermark=0.0)
        self.written = {}  # seq -> token ids (and so its K/V)
        self.next_id = 0

    def attempt(self, call):
        before = self.c.snapshot(), self.c.key_cache.clone()
        try:
            call()
            return True
        except PagedKVError:
            assert self.c.snapshot() == before[0] and torch.equal(self.c.key_cache, before[1])
            return False

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=8))
    def add(self, tokens):
        if self.attempt(lambda: self.c.add_sequence(self.next_id, *kv_for(tokens), token_ids=tokens)):
            self.written[self.next_id] = list(tokens)
        self.next_id += 1

    @precondition(lambda self: self.written)
    @rule(data=st.data(), new=st.lists(st.integers(0, 2), min_size=1, max_size=4))
    def append(self, data, new):
        seq = data.draw(st.sampled_from(sorted(self.written)))
        full = self.written[seq] + new
        k, v = kv_for(full)
        if self.attempt(lambda: self.c.append(seq, k[-len(new):], v[-len(new):], token_id=new)):
            self.written[seq] = full

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
        on_gpu = self.c.manager.get_device(seq) == "gpu"
        self.attempt(lambda: self.c.swap_out(seq) if on_gpu else self.c.swap_in(seq))

    @invariant()
    def contents_preserved(self):
        if not hasattr(self, "c"):
            return
        check_manager_invariants(self.c.manager)
        for seq, tokens in self.written.items():
            if self.c.manager.get_device(seq) == "gpu":
                k, v = self.c.gather(seq)
                ek, ev = kv_for(tokens)
                assert torch.equal(k, ek) and torch.equal(v, ev), seq

    def teardown(self):
        if hasattr(self, "c"):
            for seq in list(self.written):
                self.c.free(seq)
            m = self.c.manager
            assert m.num_free_gpu_blocks == m.num_total_gpu_blocks
            assert m.num_free_cpu_blocks == m.num_total_cpu_blocks


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=120, stateful_step_count=25, deadline=None)
