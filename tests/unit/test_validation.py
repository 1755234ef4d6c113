"""Reply validation rejects each kind of bad reply with a reason naming the client."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from pflower.strategies.base.validation import InvalidReply, validate_reply

EXPECTED = {"w": ((2, 2), np.dtype("float32")), "b": ((2,), np.dtype("float32"))}


def reply(arrays=None, **metrics):
    arrays = {"w": np.ones((2, 2), np.float32), "b": np.zeros(2, np.float32)} if arrays is None else arrays
    m = {"num-examples": 10, "client-id": 3, "test_size": 5, "test_before_correct": 2, **metrics}
    content = RecordDict({"metrics": MetricRecord({k: v for k, v in m.items() if v is not None})})
    content["arrays"] = ArrayRecord(array_dict={k: Array(v) for k, v in arrays.items()})
    return content


def check(content, **kw):
    args = dict(node_id=7, expected_client=3, expected_arrays=EXPECTED, expected_train_size=10, expected_test_size=5)
    args.update(kw)
    return validate_reply(content, **args)


def test_good_reply_parses():
    upd = check(reply())
    assert upd.client_id == 3 and upd.num_examples == 10 and set(upd.arrays) == {"w", "b"} and upd.bytes_up > 0


@pytest.mark.parametrize(
    "content, match",
    [
        (reply(arrays={"w": np.ones((2, 2), np.float32)}), "missing"),
        (
            reply(
                arrays={"w": np.ones((2, 2), np.float32), "b": np.zeros(2, np.float32), "x": np.zeros(1, np.float32)}
            ),
            "unexpected",
        ),
        (reply(arrays={"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32)}), "shape"),
        (reply(arrays={"w": np.ones((2, 2), np.float64), "b": np.zeros(2, np.float32)}), "dtype"),
        (reply(arrays={"w": np.full((2, 2), np.nan, np.float32), "b": np.zeros(2, np.float32)}), "NaN"),
        (reply(arrays={"w": np.full((2, 2), np.inf, np.float32), "b": np.zeros(2, np.float32)}), "NaN or infinite"),
        (reply(**{"num-examples": 0}), "positive"),
        (reply(**{"num-examples": -4}), "positive"),
        (reply(**{"num-examples": 2.5}), "positive integer"),
        (reply(**{"num-examples": 10_000}), "forged"),
        (reply(**{"num-examples": None}), "num-examples"),
        (reply(**{"client-id": 4}), "expected 3"),
        (reply(test_size=99), "test_size"),
        (reply(test_before_correct=float("nan")), "finite"),
    ],
)
def test_bad_replies_are_rejected(content, match):
    with pytest.raises(InvalidReply, match=match):
        check(content)


def test_two_metric_records_are_rejected():
    content = reply()
    content["other"] = MetricRecord({"x": 1.0})
    with pytest.raises(InvalidReply, match="exactly one MetricRecord"):
        check(content)
