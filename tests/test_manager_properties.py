"""Random allocate/append/fork/free/swap sequences never break the manager's invariants."""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv import AllocStatus, BlockSpaceManager, PagedKVError

from invariants import check_manager_invariants

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=12)  # few distinct ids: prefix hits happen


class ManagerMachine(RuleBasedStateMachine):
    caching = False
    unnamed_first = False

    @initialize(block_size=st.sampled_from([1, 2, 4]), gpu=st.integers(1, 12), cpu=st.integers(0, 6))
    def setup(self, block_size, gpu, cpu):
        self.m = BlockSpaceManager(block_size, gpu, cpu, watermark=0.0, enable_prefix_caching=self.caching,
                                   unnamed_blocks_first=self.unnamed_first)
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
        status = self.m.can_allocate(tokens)
        _, ok = self.attempt(lambda: self.m.allocate(self.next_id, tokens))
        assert ok == (status is AllocStatus.OK)  # watermark 0: can_allocate agrees with allocate
        if ok:
            self.tokens[self.next_id] = list(tokens)
        self.next_id += 1

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), tokens=TOKENS)
    def append(self, data, tokens):
        seq = self.pick(data)
        can = self.m.get_device(seq) == "gpu" and self.m.can_append_slots(seq, len(tokens))
        _, ok = self.attempt(lambda: self.m.append_slots(seq, tokens))
        assert ok == can
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
            can = self.m.can_swap_out(seq)
            assert self.attempt(lambda: self.m.swap_out(seq))[1] == can
        else:
            can = self.m.can_swap_in(seq)
            assert self.attempt(lambda: self.m.swap_in(seq))[1] == can

    @rule(data=st.data())
    def bad_call(self, data):
        """Nonsense must be refused, with the manager left exactly as it was."""
        seq = data.draw(st.sampled_from(sorted(self.tokens) or [0]))
        calls = [
            lambda: self.m.append_slots(seq, [1.5]), lambda: self.m.append_slots(seq, [2**63]),
            lambda: self.m.allocate(self.next_id, "text"), lambda: self.m.allocate(self.next_id, []),
            lambda: self.m.allocate(["unhashable"], [1]), lambda: self.m.fork(seq, seq),
            lambda: self.m.free("nobody"), lambda: self.m.can_allocate(-1), lambda: self.m.refcount(10**6),
        ]
        _, ok = self.attempt(data.draw(st.sampled_from(calls)))
        assert not ok

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


class UnnamedFirstManagerMachine(ManagerMachine):
    caching = True
    unnamed_first = True


TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestCachingManagerMachine = CachingManagerMachine.TestCase
TestCachingManagerMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestUnnamedFirstManagerMachine = UnnamedFirstManagerMachine.TestCase
TestUnnamedFirstManagerMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
