import math

import numpy as np
import pytest

from serve_app.quantile import quantile

SAMPLES = [[7.0], [5, 1, 3, 2, 4], [0.2, 9.5, 3.3, 3.3, 1.0, 40.0, 2.2]]


@pytest.mark.parametrize("values", SAMPLES)
@pytest.mark.parametrize("q", [0.0, 0.1, 0.5, 0.9, 0.99, 1.0])
def test_matches_numpy_percentile_as_vllm_bench_serve_uses_it(values, q):
    assert quantile(values, q) == pytest.approx(np.percentile(values, 100 * q))


def test_empty_is_nan_and_q_out_of_range_is_refused():
    assert math.isnan(quantile([], 0.5))
    with pytest.raises(ValueError):
        quantile([1.0], 1.5)
