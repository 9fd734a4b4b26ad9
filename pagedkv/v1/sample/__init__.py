"""Sampling beside the plain sampler (``pagedkv.sampling``): the rejection sampler that verifies drafts."""

from .rejection_sampler import RejectionSampler, rejection_sample

__all__ = ["RejectionSampler", "rejection_sample"]
