"""The input checks every step gets from the adapter (runtime/guards.py) and the capped error text."""
import numpy as np
import pytest
import torch

from triton_omni.runtime.errors import MAX_MESSAGE_CHARS, InvalidInput, error_message
from triton_omni.runtime.guards import InputGuard
from triton_omni.runtime.spec import DEFAULT_MAX_BYTES, DEFAULT_MAX_ITEMS, TensorSpec

INPUTS = (TensorSpec("codes", "TYPE_INT64", (8, -1)),
          TensorSpec("text", "TYPE_STRING", (1,), optional=True),
          TensorSpec("latents", "TYPE_FP32", (-1, -1), optional=True, max_dims=(4, None)))


def refused(guard, tensors) -> str:
    with pytest.raises(InvalidInput) as e:
        guard.check(tensors)
    return str(e.value)


def test_within_bounds_passes_numpy_and_torch():
    guard = InputGuard(INPUTS, {"codes": (None, 100)})
    guard.check({"codes": np.zeros((8, 100), np.int64), "latents": torch.zeros(4, 7)})


def test_a_step_bound_a_spec_bound_and_the_default_each_refuse_naming_the_input():
    guard = InputGuard(INPUTS, {"codes": (None, 100)})
    assert refused(guard, {"codes": np.zeros((8, 101), np.int64)}) == \
        "field 'codes': dimension 1 has 101 entries; at most 100 are accepted"
    assert "field 'latents': dimension 0 has 5 entries" in refused(
        guard, {"codes": np.zeros((8, 1), np.int64), "latents": torch.zeros(5, 1)})
    huge = torch.empty(2, DEFAULT_MAX_ITEMS // 2 + 1, device="meta")     # the shape alone is checked
    assert f"at most {DEFAULT_MAX_ITEMS} are accepted" in refused(
        guard, {"codes": np.zeros((8, 1), np.int64), "latents": huge})


def test_missing_required_input_and_wrong_rank_and_oversized_strings():
    guard = InputGuard(INPUTS, {})
    assert refused(guard, {}) == "field 'codes': required input is missing"
    assert refused(guard, {"codes": np.zeros((8,), np.int64)}) == \
        "field 'codes': expected 2 dimensions, got shape [8]"
    text = np.array([b"x" * (DEFAULT_MAX_BYTES + 1)], dtype=np.object_)
    assert "field 'text':" in refused(guard, {"codes": np.zeros((8, 1), np.int64), "text": text})


def test_limits_must_name_declared_inputs_and_match_their_rank():
    with pytest.raises(ValueError, match="does not declare"):
        InputGuard(INPUTS, {"nope": (1,)})
    with pytest.raises(ValueError, match="a bound for 1 dimensions"):
        InputGuard(INPUTS, {"codes": (5,)})


def test_error_text_is_capped():
    msg = error_message(InvalidInput("ids", f"bad ids {list(range(10**6))}"), internal=False)
    assert len(msg) < MAX_MESSAGE_CHARS + 60 and msg.startswith("field 'ids': bad ids [0, 1, 2")
    assert msg.endswith("more characters)")
