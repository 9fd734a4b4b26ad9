"""Random allocate/append/fork/free/swap sequences never break the manager's invariants."""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv import BlockSpaceManager, PagedKVError

from invariants import check_manager_invariants

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=12)  # few distinct ids: prefix hits happen


class ManagerMachine(RuleBasedStateMachine):
    caching = False

    @initialize(block_size=st.sampled_from([1, 2, 4]), gpu=st.integers(1, 12), cpu=st.integers(0, 6))
    def setup(self, block_size, gpu, cpu):
        self.m = BlockSpaceManager(block_size, gpu, cpu, watermark=0.0, enable_prefix_caching=self.caching)
        self.tokens = {}  # seq_id -> the tokens we gave it
        self.next_id = 0

    def attempt(self, call):
        """Run call; if it raises, it must be a PagedKVError and change nothing."""
        before = self.m.snapshot()
        try:
            return call(), True
        except PagedKVError:
            assert self.m.snapshot() == before
            return None, False

    def pick(self, data):
        return data.draw(st.sampled_from(sorted(self.tokens)))

    @rule(tokens=TOKENS)
    def allocate(self, tokens):
        _, ok = self.attempt(lambda: self.m.allocate(self.next_id, tokens))
        if ok:
            self.tokens[self.next_id] = list(tokens)
        self.next_id += 1

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), tokens=TOKENS)
    def append(self, data, tokens):
        seq = self.pick(data)
        _, ok = self.attempt(lambda: self.m.append_slots(seq, tokens))
        if ok:
            self.tokens[seq] += tokens

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = self.pick(data)
        self.m.fork(parent, self.next_id)
        self.tokens[self.next_id] = list(self.tokens[parent])
        self.next_id += 1

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = self.pick(data)
        self.m.free(seq)
        del self.tokens[seq]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def swap(self, data):
        seq = self.pick(data)
        if self.m.get_device(seq) == "gpu":
            self.attempt(lambda: self.m.swap_out(seq))
        else:
            self.attempt(lambda: self.m.swap_in(seq))

    @invariant()
    def invariants_hold(self):
        if hasattr(self, "m"):
            check_manager_invariants(self.m)
            for seq, tokens in self.tokens.items():
                assert self.m.get_token_ids(seq) == tokens

    def teardown(self):
        if hasattr(self, "m"):
            for seq in list(self.tokens):
                self.m.free(seq)
            # nothing leaks: every block of both pools is free again
            assert self.m.num_free_gpu_blocks == self.m.num_total_gpu_blocks
            assert self.m.num_free_cpu_blocks == self.m.num_total_cpu_blocks


class CachingManagerMachine(ManagerMachine):
    caching = True


TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestCachingManagerMachine = CachingManagerMachine.TestCase
TestCachingManagerMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
