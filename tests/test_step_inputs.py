"""interpreter/session/step_inputs.py: host ints take a short way in, with the same values
and the same refusals as the numpy way."""

import io

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.interpreter.errors import SessionError
from mlxgraph.interpreter.session.step_inputs import _as_array, host_positions


def _fail(reason):
    return SessionError(reason)


def _numpy_way(value, dtype):
    arr = mx.array(np.asarray(value))
    return arr if dtype is None or arr.dtype == dtype else arr.astype(dtype)


@pytest.mark.parametrize("value", [[7], [0, 1, 2], [2**31 - 1], [-2**31, 5]])
def test_host_ints_go_straight_in(value):
    got = _as_array(value, mx.int32)
    dot = io.StringIO()
    mx.export_to_dot(dot, got)
    assert "label" not in dot.getvalue()     # an array made from the ints: no cast node
    want = _numpy_way(value, mx.int32)
    assert got.dtype == want.dtype == mx.int32 and got.tolist() == want.tolist() == value


@pytest.mark.parametrize("value, dtype", [
    ([2**31], mx.int32), ([-2**31 - 1], mx.int32),    # int32 does not hold them
    ([True, 2], mx.int32), ([1.0], mx.int32), ([np.int64(3)], mx.int32), ([], mx.int32),
    ([3, 4], mx.int64), ([3, 4], None), ((3, 4), mx.int32), ([[3, 4]], mx.int32),
])
def test_anything_else_takes_the_numpy_way(value, dtype):
    got, want = _as_array(value, dtype), _numpy_way(value, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(np.array(got), np.array(want))


def test_positions_lists_are_checked_as_before():
    assert host_positions([4, 5], 4, _fail) == [4, 5]
    assert host_positions(range(4, 6), 4, _fail) == [4, 5]
    assert host_positions(np.array([4, 5]), 4, _fail) == [4, 5]
    given = [4]
    assert host_positions(given, 4, _fail) is not given   # a copy: the caller's list is theirs
    for bad in ([5], [4, 6], [3, 4], []):
        with pytest.raises(SessionError):
            host_positions(bad, 4, _fail)
    for bad in ([4.0], [True], [4, 5.0], [np.float32(4)]):
        with pytest.raises(SessionError, match="positions must be integers"):
            host_positions(bad, 4, _fail)
