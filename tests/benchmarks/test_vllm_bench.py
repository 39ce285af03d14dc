"""benchmarks/vllm.py: the worker cores of an unused-cost leg, read from vLLM's own log."""

from __future__ import annotations

import pytest

from bench_helpers import load_benchmark

LOG = """(EngineCore pid=31413) INFO 12-04 08:58:24 [ompmultiprocessing.py:185] OpenMP thread binding info:
(EngineCore pid=31413) INFO 12-04 08:58:24 [ompmultiprocessing.py:185] \tlocal_world_size=1, reserve_cpu_num=%d
(EngineCore pid=31413) INFO 12-04 08:58:24 [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=%s
"""


class Server:
    def __init__(self, text: str):
        self.text = text

    def log(self) -> str:
        return self.text


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("openai")
    return load_benchmark("vllm")


def test_the_worker_cores_come_from_the_binding_line(bench):
    assert bench.worker_cores(Server(LOG % (2, "[0, 1]"))) == [0, 1]     # a connector's reservation on 2 cores
    assert bench.worker_cores(Server(LOG % (1, "[0]"))) == [0]
    assert bench.worker_cores(Server("no binding logged")) is None
