"""The generation fields of ``SamplingParams`` from the wire to the replica's typed values: what
proto3 can leave unset (an absent ``top_k``, ``top_p`` 0) is unset for the engine to fill in from
the checkpoint; the rest is as sent; bad values are INVALID_ARGUMENT before anything runs."""

from __future__ import annotations

import pytest

from protos import session_router_pb2 as pb
from replica.api import InvalidRequestError, SamplingParams
from replica.generation import GenerationDefaults
from router.client import generate_request
from router.gateway.convert import sampling_from_proto


def test_unset_fields_take_the_models_defaults():
    wire = generate_request(text="hi", max_new_tokens=5).sampling
    ours = sampling_from_proto(pb.SamplingParams.FromString(wire.SerializeToString()))
    assert (ours.top_p, ours.top_k, ours.stop, ours.ignore_eos) == (None, None, (), False)
    model = GenerationDefaults(eos_token_ids=(7, 9), top_p=0.8, top_k=20, temperature=0.6)
    resolved = model.apply(ours, context_tokens=3)
    assert (resolved.max_new_tokens, resolved.temperature, resolved.top_p, resolved.top_k) == (
        5, 0.0, 0.8, 20)  # fmt: skip
    assert resolved.eos_token_ids == (7, 9)


def test_set_fields_are_carried_as_sent():
    wire = generate_request(
        text="hi",
        max_new_tokens=3,
        temperature=0.5,
        top_p=0.75,  # exact in float32, as the wire carries it
        seed=4,
        stop_token_ids=[2],
        stop=["\n\n", "User:"],
        top_k=0,
        ignore_eos=True,
    ).sampling
    ours = sampling_from_proto(pb.SamplingParams.FromString(wire.SerializeToString()))
    assert ours == SamplingParams(3, 0.5, 0.75, 4, (2,), 0, ("\n\n", "User:"), True)
    resolved = GenerationDefaults(eos_token_ids=(7,), top_k=20).apply(ours, context_tokens=3)
    assert resolved.top_k == 0 and resolved.eos_token_ids == ()  # off, and ignore_eos


@pytest.mark.parametrize(
    "fields",
    [{"stop": [""]}, {"stop": ["x"] * 17}, {"stop": ["y" * 257]}, {"top_p": 2.0}],
)
def test_bad_values_are_refused(fields):
    with pytest.raises(InvalidRequestError):
        sampling_from_proto(pb.SamplingParams(**fields))
