"""The pinned runs compute on one torch thread, server side included (Velo's CVAE trains on the
server): a test that left the process at another thread count must not change their sums."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
